/* common/text.c - see text.h. Doubling growth keeps appends amortised
 * O(1); the buffer is always NUL-terminated so p can be printed as is. */
#include "text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

int text_reserve(struct text *t, size_t extra)
{
    if (t->n + extra + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 64;
        while (cap < t->n + extra + 1)
            cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p) {
            t->oom = true;
            return -RL_ENOMEM;
        }
        t->p = p;
        t->cap = cap;
    }
    /* a string of its n bytes also when nothing was added ("reserve 0" is
     * how a caller asks for "" rather than NULL) */
    t->p[t->n] = 0;
    return 0;
}

int text_add(struct text *t, const void *s, size_t n)
{
    int rc = text_reserve(t, n);
    if (rc)
        return rc;
    if (n)
        memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
    return 0;
}

void text_printf(struct text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0 || text_reserve(t, (size_t)k)) {
        t->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(t->p + t->n, t->cap - t->n, fmt, ap);
    va_end(ap);
    t->n += (size_t)k;
}

void text_clear(struct text *t)
{
    t->n = 0;
    t->oom = false;
    if (t->p)
        t->p[0] = 0;
}

void text_free(struct text *t)
{
    free(t->p);
    *t = (struct text){0};
}
