/* engine/safetensors.h - read-only access to safetensors checkpoints.
 *
 * A checkpoint is one `model.safetensors` or several shards listed by
 * `model.safetensors.index.json`. Files are memory-mapped; tensor data is
 * never copied. Every structural problem (truncated file, header length
 * beyond the file, bad JSON, offsets out of range or overlapping, shape x
 * dtype size != byte length, a tensor named twice, an index naming a missing
 * shard or tensor) is an RL_EFORMAT error whose message names the file and,
 * where there is one, the tensor. */
#ifndef RL_SAFETENSORS_H
#define RL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

enum st_dtype {
    ST_F32 = 0,
    ST_F16,
    ST_BF16,
    ST_F8_E4M3,
    ST_F64,
    ST_I64,
    ST_I32,
    ST_I16,
    ST_I8,
    ST_U8,
    ST_BOOL,
    ST_N_DTYPES
};

#define ST_MAX_DIMS 8

struct st_tensor {
    const char *name;          /* owned by the st_file */
    enum st_dtype dtype;
    int n_dims;                /* 0 (scalar) .. ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS];
    const void *data;          /* into the mapping; valid until st_close() */
    size_t n_bytes;
    const char *file;          /* path of the shard holding it, owned by st_file */
};

struct st_file; /* opaque: the set of mapped shards and their tensors */

/* Opens `path`: a directory (index.json if present, else model.safetensors)
 * or a single .safetensors file. On success *out is owned by the caller and
 * released with st_close(). */
int st_open(struct st_file **out, const char *path, struct rl_err *err);
void st_close(struct st_file *f);

/* Lookup by exact name; NULL when absent. */
const struct st_tensor *st_find(const struct st_file *f, const char *name);
int st_n_tensors(const struct st_file *f);
const struct st_tensor *st_get(const struct st_file *f, int i);

/* Marks a tensor as used; st_first_unused() then reports tensors nobody
 * asked for, so a loader can reject unexpected tensors. */
void st_mark_used(struct st_file *f, const struct st_tensor *t);
const struct st_tensor *st_first_unused(const struct st_file *f);

/* Bytes per element (F8 = 1); 0 for an invalid dtype. */
size_t st_dtype_size(enum st_dtype dt);
const char *st_dtype_name(enum st_dtype dt);
/* "BF16" -> ST_BF16; returns 0, or -1 for a name outside the enum. */
int st_dtype_from_name(const char *s, enum st_dtype *out);

/* Asks the kernel to read every shard ahead (MADV_WILLNEED), for a loader
 * about to touch all weights. Returns 0, or -RL_EIO if a hint failed
 * (harmless: the data is still readable). */
int st_prefetch(const struct st_file *f);

/* Parses one file image already in memory (for the fuzz target and tests):
 * `buf` holds the whole file, `name` is used in error messages. The parsed
 * tensors point into buf, which must outlive *out. */
int st_parse_buffer(struct st_file **out, const void *buf, size_t len,
                    const char *name, struct rl_err *err);

/* ---- writing (the model maker and tests) ---- */

struct st_writer; /* opaque: collects tensors, then writes one file */

int st_writer_create(struct st_writer **out, struct rl_err *err);
/* Adds a tensor; `data` is copied only at write time, so it must stay valid
 * until st_writer_write() returns. `name` is copied now. */
int st_writer_add(struct st_writer *w, const char *name, enum st_dtype dt,
                  int n_dims, const int64_t *shape, const void *data,
                  struct rl_err *err);
/* Writes the file (header with an optional __metadata__ {"format":"pt"}),
 * tensors in the order added, 8-byte aligned header as the format asks. */
int st_writer_write(struct st_writer *w, const char *path, struct rl_err *err);

/* Produces bytes [off, off + n) of a tensor into buf. st_writer_write calls
 * it with increasing, contiguous ranges (n <= 8 MiB), once per byte, so a
 * generator may keep sequential state in ctx. Returns 0 or a negative code
 * with err filled (the writer prefixes the file and tensor). */
typedef int (*st_fill_fn)(void *ctx, uint64_t off, void *buf, size_t n, struct rl_err *err);

/* Like st_writer_add, but the data is produced at write time by `fill`, so
 * a tensor never has to exist in memory whole. ctx must stay valid until
 * st_writer_write() returns. */
int st_writer_add_fill(struct st_writer *w, const char *name, enum st_dtype dt, int n_dims,
                       const int64_t *shape, st_fill_fn fill, void *ctx, struct rl_err *err);
void st_writer_free(struct st_writer *w);

#endif
