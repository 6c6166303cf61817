/* common/file.h - whole files: one read into memory, one written so that it
 * appears complete or not at all.
 *
 * Reading: config.json, tokenizer.json, a safetensors index, an Ollama
 * manifest, generation_config.json are all read whole, each with a size
 * past which it is refused rather than read (a 30 GB "config.json" given by
 * mistake is an error, not an allocation). file_read is the one reader;
 * file_read_json also parses and wants a JSON object.
 *
 * Writing: the model maker (`redlm mkmodel`, random or converted) writes checkpoints of tens of
 * GB. A file_out writes "<path>.tmp" and renames it over path only once
 * every byte is written, so an interrupted or failed write never leaves a
 * truncated checkpoint under the real name (a loader would mmap it and
 * fail far from the cause). Tensors that exist only as a generator (random
 * weights, a conversion) are written through a fill callback and a staging
 * buffer, never whole in memory.
 *
 * Every function returns 0 or a negative RL_E* code and fills err with a
 * message that names the path. Not thread-safe per file_out; any thread. */
#ifndef RL_FILE_H
#define RL_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct cJSON;

/* Reads the whole file at path. *out: malloc'd, NUL-terminated (text can
 * be parsed in place), owned by the caller; *len (when len is not NULL)
 * without the NUL. max: the largest size accepted, 0 for none. Returns 0,
 * -RL_ENOTFOUND (no such file, or a part of its path is not a folder),
 * -RL_EIO (cannot open or read it), -RL_EFORMAT (larger than max) or
 * -RL_ENOMEM; *out is NULL on failure. */
int file_read(const char *path, size_t max, char **out, size_t *len, struct rl_err *err);

/* file_read, parsed: *out is a JSON object the caller frees with
 * cJSON_Delete. -RL_EFORMAT when the text is not JSON or not an object. */
int file_read_json(const char *path, size_t max, struct cJSON **out, struct rl_err *err);

/* A file being written (opaque): "<path>.tmp" until file_out_commit. */
struct file_out;

/* Writes bytes [off, off + n) of some content into buf. */
typedef int (*file_fill_fn)(void *ctx, uint64_t off, void *buf, size_t n, struct rl_err *err);

/* Creates (truncates) "<path>.tmp". *out belongs to the caller until
 * file_out_commit or file_out_abort takes it back. */
int file_out_open(struct file_out **out, const char *path, struct rl_err *err);

/* Appends n bytes of buf. */
int file_out_write(struct file_out *f, const void *buf, size_t n, struct rl_err *err);

/* Appends n bytes made by fill, a staging buffer's worth at a time. fill's
 * own error comes back as it is (the caller adds what was being filled). */
int file_out_fill(struct file_out *f, uint64_t n, file_fill_fn fill, void *ctx,
                  struct rl_err *err);

/* Closes the file and renames it to its path. f is freed whatever the
 * result; on failure the temporary file is removed. */
int file_out_commit(struct file_out *f, struct rl_err *err);

/* Closes and removes the temporary file, and frees f. NULL is a no-op. */
void file_out_abort(struct file_out *f);

/* Creates dir and its missing parents (mkdir -p); an existing directory is
 * fine, an existing non-directory is RL_EIO. */
int file_mkdir_p(const char *dir, struct rl_err *err);
/* Writes text and a newline to path (through a file_out: all or nothing). */
int file_write_text(const char *path, const char *text, struct rl_err *err);
/* Writes j indented, as file_write_text. */
int file_write_json(const char *path, const struct cJSON *j, struct rl_err *err);
/* Copies dir/name to out/name; a missing source is fine (0) unless `must`
 * (RL_ENOTFOUND). */
int file_copy(const char *dir, const char *out, const char *name, int must, struct rl_err *err);

#endif
