/* tests/unit/test_util.h - helpers every unit test binary shares: where the
 * shared data lives, and reading a whole file. Header-only (static) because
 * each test is its own binary. */
#ifndef RL_TEST_UTIL_H
#define RL_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>

/* ../shared as CI lays it beside the clone; REDLM_SHARED overrides. */
static inline const char *tu_shared_dir(void)
{
    const char *s = getenv("REDLM_SHARED");
    return s && *s ? s : "../shared";
}

/* The whole file, NUL-terminated, malloc'd (caller frees); NULL when it
 * cannot be read. *len (if non-NULL) gets its length. */
static inline char *tu_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *b = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
        b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = 0;
        if (len)
            *len = (size_t)n;
    }
    return b;
}

#endif
