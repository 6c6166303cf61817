/* common/text.h - a growable, NUL-terminated text buffer: the one the
 * engine's event text, the worker's and dispatcher's /metrics pages and the
 * `redlm stats` screen are built in.
 *
 * A plain record the caller owns: start it zeroed (struct text t = {0}),
 * read t.p / t.n, release it with text_free (or take t.p and free() it).
 * After a failed allocation the buffer keeps what it had and `oom` stays
 * set, so a caller can append many pieces and check once at the end. */
#ifndef RL_TEXT_H
#define RL_TEXT_H

#include <stdbool.h>
#include <stddef.h>

struct text {
    char *p;    /* (cap) bytes, p[n] == 0 once anything was added; NULL before */
    size_t n;   /* bytes in use, without the NUL */
    size_t cap;
    bool oom;   /* an append failed for lack of memory */
};

/* Makes room for extra more bytes (and the NUL) without adding any, for a
 * caller about to write into p + n itself. Returns 0, or -RL_ENOMEM (and
 * sets oom). After it p is never NULL and p[n] == 0 (reserving 0 bytes of
 * an empty buffer gives ""). */
int text_reserve(struct text *t, size_t extra);

/* Appends n bytes of s. Returns 0, or -RL_ENOMEM (and sets oom). */
int text_add(struct text *t, const void *s, size_t n);

/* Appends printf-formatted text; a failure sets oom. */
__attribute__((format(printf, 2, 3))) void text_printf(struct text *t, const char *fmt, ...);

/* Empties the buffer, keeping its memory (oom is cleared too). */
void text_clear(struct text *t);

/* Frees the memory and zeroes the record. */
void text_free(struct text *t);

#endif
