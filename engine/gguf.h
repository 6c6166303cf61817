/* engine/gguf.h - read-only access to GGUF (version 3) files, and a writer.
 *
 * GGUF is llama.cpp's single-file format: a header of typed key/value
 * metadata (the model's hyperparameters, its tokenizer, its chat template)
 * and a table of tensors (name, dims, ggml type, offset), then the aligned
 * data. A file is memory-mapped; tensor data is never copied. Every
 * structural problem (bad magic, a version other than 3, a count or length
 * that runs past the file, a string that is not there, an unknown value
 * type, a nested array, a tensor with an unknown ggml type, dims that do not
 * split into whole blocks, data out of bounds, misaligned or overlapping,
 * a name or key given twice) is an RL_EFORMAT error naming the file and,
 * where there is one, the key or the tensor and its type.
 *
 * Dims follow ggml: ne[0] is the innermost (contiguous) dimension, so a
 * (rows, cols) matrix has ne[0] = cols, ne[1] = rows. */
#ifndef RL_GGUF_H
#define RL_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

/* Metadata value types (the file's numbering). */
enum gguf_vtype {
    GGUF_VT_UINT8 = 0,
    GGUF_VT_INT8 = 1,
    GGUF_VT_UINT16 = 2,
    GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4,
    GGUF_VT_INT32 = 5,
    GGUF_VT_FLOAT32 = 6,
    GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8,
    GGUF_VT_ARRAY = 9,
    GGUF_VT_UINT64 = 10,
    GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12,
};

/* The ggml tensor types redlm reads (the file's numbering); any other type
 * id ggml defines is parsed (its name shown in errors) but not sized. */
enum gguf_ttype {
    GGUF_T_F32 = 0,
    GGUF_T_F16 = 1,
    GGUF_T_Q4_0 = 2,
    GGUF_T_Q4_1 = 3,
    GGUF_T_Q5_0 = 6,
    GGUF_T_Q5_1 = 7,
    GGUF_T_Q8_0 = 8,
    GGUF_T_Q2_K = 10,
    GGUF_T_Q3_K = 11,
    GGUF_T_Q4_K = 12,
    GGUF_T_Q5_K = 13,
    GGUF_T_Q6_K = 14,
    GGUF_T_IQ4_NL = 20,
    GGUF_T_IQ4_XS = 23,
    GGUF_T_BF16 = 30,
};

struct gguf_tensor {
    const char *name;    /* owned by the gguf_file */
    uint32_t type;       /* ggml type id as stored (enum gguf_ttype for ours) */
    int n_dims;          /* 1 .. GGUF_MAX_DIMS */
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] innermost; unused dims are 1 */
    const void *data;    /* into the mapping; valid until gguf_close() */
    size_t n_bytes;      /* 0 for a type redlm does not size */
};

struct gguf_file; /* opaque: the mapping, its metadata and tensors */

/* Maps and parses path. *out is owned by the caller (gguf_close). */
int gguf_open(struct gguf_file **out, const char *path, struct rl_err *err);
/* Parses a whole file image in memory (tests, the fuzz target); buf must
 * outlive *out. name is used in messages. */
int gguf_parse_buffer(struct gguf_file **out, const void *buf, size_t len, const char *name,
                      struct rl_err *err);
void gguf_close(struct gguf_file *f);
const char *gguf_path(const struct gguf_file *f);

/* 1 when the first four bytes of path are "GGUF" (a readable regular file). */
int gguf_is_gguf(const char *path);

/* Where a model path names a GGUF file: path itself when it is a regular
 * file starting with "GGUF" (whatever its name: the Ollama store's blobs
 * have none), or the one *.gguf file of a directory that has no
 * config.json. Returns 1 with the file in out, 0 when path is not a GGUF
 * model, or -RL_EINVAL (naming them) when a directory holds several. */
int gguf_locate(const char *path, char *out, size_t size, struct rl_err *err);

/* "F32", "Q4_K", ... for any ggml type id; "type N" (static buffer of the
 * caller, 16 bytes) for an unknown one. */
const char *gguf_type_name(uint32_t type, char buf[16]);

/* ---- tensors ---- */
int gguf_n_tensors(const struct gguf_file *f);
const struct gguf_tensor *gguf_get_tensor(const struct gguf_file *f, int i);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);
/* The loader's bookkeeping, as st_mark_used / st_first_unused. */
void gguf_mark_used(struct gguf_file *f, const struct gguf_tensor *t);
const struct gguf_tensor *gguf_first_unused(const struct gguf_file *f);

/* ---- metadata ----
 * Getters take the key; a missing key gives -RL_ENOTFOUND (message names
 * the file and key), a value of another type -RL_EFORMAT naming both types.
 * Integer getters accept any integer type whose value fits. */
int gguf_has_key(const struct gguf_file *f, const char *key);
int gguf_get_int(const struct gguf_file *f, const char *key, int64_t *out, struct rl_err *err);
/* FLOAT32, FLOAT64 or an integer. */
int gguf_get_float(const struct gguf_file *f, const char *key, double *out, struct rl_err *err);
int gguf_get_bool(const struct gguf_file *f, const char *key, int *out, struct rl_err *err);
/* A string: *s points into the mapping and is NOT NUL-terminated. */
int gguf_get_str(const struct gguf_file *f, const char *key, const char **s, size_t *len,
                 struct rl_err *err);
/* An array: its element type and length. */
int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype *type, uint64_t *n,
                 struct rl_err *err);
/* Element i of an array of strings (not NUL-terminated), or of integers;
 * the array must have that element type and i must be in range. */
int gguf_arr_str(const struct gguf_file *f, const char *key, uint64_t i, const char **s,
                 size_t *len, struct rl_err *err);
int gguf_arr_int(const struct gguf_file *f, const char *key, uint64_t i, int64_t *out,
                 struct rl_err *err);

/* ---- writing (the model maker and tests) ---- */

struct gguf_writer;

/* Produces bytes [off, off + n) of a tensor's data, called with increasing
 * contiguous ranges, once per byte (same contract as st_fill_fn). */
typedef int (*gguf_fill_fn)(void *ctx, uint64_t off, void *buf, size_t n, struct rl_err *err);

int gguf_writer_create(struct gguf_writer **out, struct rl_err *err);
void gguf_writer_free(struct gguf_writer *w);
/* Metadata, written in the order added; strings are copied. */
int gguf_writer_str(struct gguf_writer *w, const char *key, const char *v, size_t len);
int gguf_writer_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_writer_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_bool(struct gguf_writer *w, const char *key, int v);
/* An array of n strings (v[i] of lens[i] bytes, or NUL-terminated when lens
 * is NULL), or of n int32. Copied. */
int gguf_writer_arr_str(struct gguf_writer *w, const char *key, const char *const *v,
                        const size_t *lens, uint64_t n);
int gguf_writer_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
/* A tensor of ggml type `type` (one of enum gguf_ttype) and dims ne[0..n_dims);
 * its bytes come from data (kept until gguf_writer_write returns) or from
 * fill. Errors are reported by gguf_writer_write (the setters only record
 * the first failure), so a caller can add everything and check once. */
int gguf_writer_tensor(struct gguf_writer *w, const char *name, uint32_t type, int n_dims,
                       const int64_t *ne, const void *data, gguf_fill_fn fill, void *ctx);
/* Writes the file (under a temporary name, renamed into place). Returns 0
 * or the first error, naming the key or tensor. */
int gguf_writer_write(struct gguf_writer *w, const char *path, struct rl_err *err);

#endif
