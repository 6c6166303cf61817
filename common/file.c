/* common/file.c - whole files read and written (file.h).
 *
 * file_read grows its buffer by doubling from 64 KB and never past max + 1
 * bytes, so a file larger than max is refused after reading max + 1 of it,
 * whatever its size (a FIFO or /proc file has none to stat). A file_out
 * writes with write(2) directly: each call of a checkpoint writer is
 * megabytes, which stdio's buffer would only copy again. */
#include "file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define READ_FIRST (64u << 10)
#define FILL_CHUNK (8u << 20) /* large enough that writes are disk-bound */
#define WRITE_MAX (1u << 30)  /* Linux writes at most ~2 GB a call: stay below */

int file_read(const char *path, size_t max, char **out, size_t *len, struct rl_err *err)
{
    *out = NULL;
    if (len)
        *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) /* ENOTDIR: a part of the path is a file (dir/x of a GGUF file) */
        return rl_errf(err, errno == ENOENT || errno == ENOTDIR ? RL_ENOTFOUND : RL_EIO, "%s: %s",
                       path, strerror(errno));
    int rc = 0;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            if (max && n > max) {
                rc = rl_errf(err, RL_EFORMAT, "%s: larger than %zu bytes", path, max);
                break;
            }
            size_t c2 = cap ? cap * 2 : READ_FIRST;
            if (max && c2 > max + 1)
                c2 = max + 1;
            char *b = c2 > cap ? realloc(buf, c2 + 1) : NULL;
            if (!b) {
                rc = rl_errf(err, RL_ENOMEM, "%s: out of memory", path);
                break;
            }
            buf = b;
            cap = c2;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = rl_errf(err, RL_EIO, "%s: %s", path, strerror(errno));
            break;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    if (!buf && !(buf = malloc(1)))
        return rl_errf(err, RL_ENOMEM, "%s: out of memory", path);
    buf[n] = 0;
    *out = buf;
    if (len)
        *len = n;
    return 0;
}

int file_read_json(const char *path, size_t max, struct cJSON **out, struct rl_err *err)
{
    *out = NULL;
    char *text;
    size_t n;
    int rc = file_read(path, max, &text, &n, err);
    if (rc)
        return rc;
    cJSON *j = cJSON_ParseWithLength(text, n);
    free(text);
    if (!cJSON_IsObject(j)) {
        rc = rl_errf(err, RL_EFORMAT, "%s: %s", path, j ? "not a JSON object" : "not valid JSON");
        cJSON_Delete(j);
        return rc;
    }
    *out = j;
    return 0;
}

struct file_out {
    int fd;
    char *path; /* the final name */
    char *tmp;  /* "<path>.tmp", written until the commit */
    void *stage; /* FILL_CHUNK bytes for fill callbacks, made on first use */
};

static void out_free(struct file_out *f)
{
    free(f->stage);
    free(f->tmp);
    free(f->path);
    free(f);
}

int file_out_open(struct file_out **out, const char *path, struct rl_err *err)
{
    *out = NULL;
    struct file_out *f = calloc(1, sizeof *f);
    size_t n = strlen(path);
    if (f) {
        f->path = strdup(path);
        f->tmp = malloc(n + 5);
    }
    if (!f || !f->path || !f->tmp) {
        if (f)
            out_free(f);
        return rl_errf(err, RL_ENOMEM, "%s: out of memory", path);
    }
    memcpy(f->tmp, path, n);
    memcpy(f->tmp + n, ".tmp", 5);
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        int rc = rl_errf(err, RL_EIO, "%s: %s", f->tmp, strerror(errno));
        out_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

int file_out_write(struct file_out *f, const void *buf, size_t n, struct rl_err *err)
{
    const char *p = buf;
    while (n) {
        ssize_t r = write(f->fd, p, n < WRITE_MAX ? n : WRITE_MAX);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return rl_errf(err, RL_EIO, "%s: write: %s", f->tmp, strerror(errno));
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

int file_out_fill(struct file_out *f, uint64_t n, file_fill_fn fill, void *ctx,
                  struct rl_err *err)
{
    if (n && !f->stage && !(f->stage = malloc(FILL_CHUNK)))
        return rl_errf(err, RL_ENOMEM, "%s: out of memory", f->path);
    for (uint64_t off = 0; off < n;) {
        size_t k = n - off < FILL_CHUNK ? (size_t)(n - off) : FILL_CHUNK;
        int rc = fill(ctx, off, f->stage, k, err);
        if (rc)
            return rc;
        if ((rc = file_out_write(f, f->stage, k, err)))
            return rc;
        off += k;
    }
    return 0;
}

int file_out_commit(struct file_out *f, struct rl_err *err)
{
    int rc = 0;
    if (close(f->fd))
        rc = rl_errf(err, RL_EIO, "%s: write: %s", f->tmp, strerror(errno));
    else if (rename(f->tmp, f->path))
        rc = rl_errf(err, RL_EIO, "%s: rename: %s", f->path, strerror(errno));
    if (rc)
        unlink(f->tmp);
    out_free(f);
    return rc;
}

void file_out_abort(struct file_out *f)
{
    if (!f)
        return;
    close(f->fd);
    unlink(f->tmp);
    out_free(f);
}

int file_mkdir_p(const char *dir, struct rl_err *err)
{
    char buf[4096];
    if ((size_t)snprintf(buf, sizeof buf, "%s", dir) >= sizeof buf)
        return rl_errf(err, RL_EINVAL, "%s: path too long", dir);
    for (char *s = buf + 1;; s++) {
        if (*s == '/' || !*s) {
            char c = *s;
            *s = 0;
            if (mkdir(buf, 0755) && errno != EEXIST)
                return rl_errf(err, RL_EIO, "%s: mkdir: %s", buf, strerror(errno));
            *s = c;
            if (!c)
                break;
        }
    }
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode))
        return rl_errf(err, RL_EIO, "%s: not a directory", dir);
    return 0;
}

int file_write_text(const char *path, const char *text, struct rl_err *err)
{
    struct file_out *f;
    int rc = file_out_open(&f, path, err);
    if (rc)
        return rc;
    if ((rc = file_out_write(f, text, strlen(text), err)) ||
        (rc = file_out_write(f, "\n", 1, err))) {
        file_out_abort(f);
        return rc;
    }
    return file_out_commit(f, err);
}

int file_write_json(const char *path, const cJSON *j, struct rl_err *err)
{
    char *s = cJSON_Print(j);
    if (!s)
        return rl_errf(err, RL_ENOMEM, "%s: out of memory", path);
    int rc = file_write_text(path, s, err);
    free(s);
    return rc;
}

int file_copy(const char *dir, const char *out, const char *name, int must,
                     struct rl_err *err)
{
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/%s", dir, name);
    snprintf(dst, sizeof dst, "%s/%s", out, name);
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) {
        if (errno == ENOENT && !must)
            return 0;
        return rl_errf(err, errno == ENOENT ? RL_ENOTFOUND : RL_EIO, "%s: %s", src, strerror(errno));
    }
    struct file_out *f;
    int rc = file_out_open(&f, dst, err);
    char buf[65536];
    while (!rc) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            rc = rl_errf(err, RL_EIO, "%s: %s", src, strerror(errno));
        else if (r == 0)
            break;
        else
            rc = file_out_write(f, buf, (size_t)r, err);
    }
    close(in);
    if (f && rc)
        file_out_abort(f);
    else if (f)
        rc = file_out_commit(f, err);
    return rc;
}
