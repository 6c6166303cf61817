/* tests/unit/test_util.h - helpers every unit test binary shares: where the
 * repository's fixtures live, reading a whole file, and the reference
 * files' JSON. Header-only (static) because each test is its own binary. */
#ifndef RL_TEST_UTIL_H
#define RL_TEST_UTIL_H

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file.h"

/* The repository's root, found from the test binary's own path
 * (<root>/<build dir>/<tests|fuzz>/<binary>), so a test reads its fixtures
 * wherever the clone sits and whatever the working directory. Falls back to
 * "." (a run from the root) when /proc is not there. */
static inline const char *tu_repo_dir(void)
{
    /* small enough that callers' "%s/models/..." buffers (512 bytes)
     * always fit; a deeper clone falls back to "." */
    static char root[256];
    if (root[0])
        return root;
    ssize_t n = readlink("/proc/self/exe", root, sizeof root - 1);
    if (n <= 0 || n >= (ssize_t)sizeof root - 1) {
        strcpy(root, ".");
        return root;
    }
    root[n] = 0;
    for (int up = 0; up < 3; up++) {
        char *slash = strrchr(root, '/');
        if (!slash || slash == root) {
            strcpy(root, ".");
            return root;
        }
        *slash = 0;
    }
    return root;
}

/* <root>/<rel>, in one of four rotating static buffers (so a call may hold
 * a few at once): for the repository's own files a test compares against
 * (schemas/, config/). */
static inline const char *tu_repo_file(const char *rel)
{
    static char buf[4][512];
    static int next;
    char *p = buf[next++ & 3];
    snprintf(p, sizeof buf[0], "%s/%s", tu_repo_dir(), rel);
    return p;
}

/* <root>/tests/data: the fixtures (tiny reference model, tokenizer and
 * template cases); tests/data/README.md says where each came from. */
static inline const char *tu_data_dir(void)
{
    static char dir[300];
    if (!dir[0])
        snprintf(dir, sizeof dir, "%s/tests/data", tu_repo_dir());
    return dir;
}

/* <root>/engine/tokenizers/qwen3: the real Qwen3 tokenizer files. */
static inline const char *tu_qwen3_tokenizer_dir(void)
{
    static char dir[300];
    if (!dir[0])
        snprintf(dir, sizeof dir, "%s/engine/tokenizers/qwen3", tu_repo_dir());
    return dir;
}

/* A fresh, empty directory for one test binary's files:
 * $TMPDIR (else /tmp) / redlm-<tag>.XXXXXX, its name written into buf.
 * 0, or -1 when it cannot be made or the name does not fit. */
static inline int tu_tmpdir(char *buf, size_t cap, const char *tag)
{
    const char *base = getenv("TMPDIR");
    if (!base || !base[0])
        base = "/tmp";
    int n = snprintf(buf, cap, "%s/redlm-%s.XXXXXX", base, tag);
    if (n < 0 || (size_t)n >= cap || !mkdtemp(buf)) {
        if (cap)
            buf[0] = 0;
        return -1;
    }
    return 0;
}

static inline int tu_rmtree_one(const char *path, const struct stat *st, int kind,
                                struct FTW *ftw)
{
    (void)st, (void)ftw;
    return kind == FTW_DP ? rmdir(path) : unlink(path);
}

/* Removes dir and everything below it, without a shell (a name with a
 * quote in it stays harmless) and without following links out of it.
 * 0, or -1 when something could not be removed; "" or NULL (a setup that
 * failed before its directory existed) is 0. */
static inline int tu_rmtree(const char *dir)
{
    if (!dir || !dir[0])
        return 0;
    return nftw(dir, tu_rmtree_one, 16, FTW_DEPTH | FTW_PHYS) ? -1 : 0;
}

/* mkdir -p path (mode 0755), without a shell. 0, or -1. */
static inline int tu_mkdirs(const char *path)
{
    char p[1024];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p)
        return -1;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        if (mkdir(p, 0755) && errno != EEXIST)
            return -1;
        *s = '/';
    }
    return mkdir(p, 0755) && errno != EEXIST ? -1 : 0;
}

/* A fresh copy of the regular files directly in src (a checkpoint
 * directory is flat) into dst, which is removed first and made. 0, or -1. */
static inline int tu_copy_dir(const char *src, const char *dst)
{
    if (tu_rmtree(dst) && errno != ENOENT)
        return -1;
    DIR *d = opendir(src);
    if (!d || tu_mkdirs(dst)) {
        if (d)
            closedir(d);
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        char from[1024], to[1024];
        struct stat st;
        if (snprintf(from, sizeof from, "%.700s/%.255s", src, e->d_name) >= (int)sizeof from ||
            snprintf(to, sizeof to, "%.700s/%.255s", dst, e->d_name) >= (int)sizeof to ||
            strlen(src) > 700 || strlen(dst) > 700) {
            rc = -1;
            continue;
        }
        if (stat(from, &st) || !S_ISREG(st.st_mode))
            continue;
        char *b;
        size_t n;
        FILE *f = NULL;
        if (file_read(from, 0, &b, &n, NULL)) {
            rc = -1;
            continue;
        }
        if (!(f = fopen(to, "wb")) || fwrite(b, 1, n, f) != n)
            rc = -1;
        if (f && fclose(f))
            rc = -1;
        free(b);
    }
    closedir(d);
    return rc;
}

/* The whole file, NUL-terminated, malloc'd (caller frees); NULL when it
 * cannot be read. *len (if non-NULL) gets its length. (common/file.h's
 * reader, which test_file checks, without its error.) */
static inline char *tu_slurp(const char *path, size_t *len)
{
    char *b;
    return file_read(path, 0, &b, len, NULL) ? NULL : b;
}

/* The ids of a JSON array of numbers (a reference file's "ids" or
 * "greedy") into out, at most cap of them; returns how many the array
 * holds. */
static inline int tu_ids_from_json(const cJSON *a, int32_t *out, int cap)
{
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a)
    {
        if (n < cap)
            out[n] = it->valueint;
        n++;
    }
    return n;
}

/* The file at path parsed as JSON (the caller cJSON_Deletes it); NULL,
 * said on stderr, when it cannot be read or is not JSON. */
static inline cJSON *tu_read_json(const char *path)
{
    char *txt = tu_slurp(path, NULL);
    if (!txt) {
        fprintf(stderr, "cannot read %s\n", path);
        return NULL;
    }
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!j)
        fprintf(stderr, "%s: not JSON\n", path);
    return j;
}

#endif
