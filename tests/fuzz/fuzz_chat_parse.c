/* tests/fuzz/fuzz_chat_parse.c - libFuzzer target for the streaming parser
 * of Qwen3's output (engine/chat_parse.c), tool-call streaming above all.
 *
 * The input's first byte picks the split (the text is fed in pieces of
 * 1 + (byte & 15) bytes) and, with bit 7, puts "<tool_call>{\"name\":
 * \"f\", \"arguments\": " before the rest, so most inputs reach the
 * argument scan. Checks, besides the sanitizers' own: the events of the
 * split feed equal those of one feed (types, texts, names, arguments); a
 * TOOL_DELTA is non-empty and NUL-free, the first of a call names it and
 * none comes outside a call; a call's fragments concatenate exactly to its
 * TOOL_CALL's arguments.
 *
 *   make fuzz && build-fuzz/fuzz/fuzz_chat_parse -max_total_time=60 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct acc {
    char *log; /* every event, serialized */
    size_t n, cap;
    char *frag; /* the open call's fragments */
    size_t nf, capf;
    int open;
    int last; /* the type of the last logged text event + 1, 0 after others */
};

static void put(char **b, size_t *n, size_t *cap, const char *s, size_t len)
{
    if (*n + len + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *n + len + 1)
            c *= 2;
        char *q = realloc(*b, c);
        if (!q)
            abort();
        *b = q;
        *cap = c;
    }
    memcpy(*b + *n, s, len);
    *n += len;
    (*b)[*n] = 0;
}

static void take(struct acc *a, const struct chat_event *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct chat_event *e = &ev[i];
        char head[8];
        snprintf(head, sizeof head, "%d[", (int)e->type);
        if (e->type == CHAT_EVENT_TOOL_DELTA) {
            size_t fl = strlen(e->arguments);
            if (fl == 0 || fl != e->len)
                abort();
            if (e->name) {
                if (a->open)
                    abort();
                a->open = 1;
                a->nf = 0;
            } else if (!a->open) {
                abort();
            }
            put(&a->frag, &a->nf, &a->capf, e->arguments, fl);
            continue; /* fragments may be grouped differently per split */
        }
        if ((e->type == CHAT_EVENT_CONTENT || e->type == CHAT_EVENT_REASONING) &&
            a->last == (int)e->type + 1) { /* text continues over feeds */
            a->n--; /* over the "]" */
            put(&a->log, &a->n, &a->cap, e->text, e->len);
            put(&a->log, &a->n, &a->cap, "]", 1);
            continue;
        }
        a->last = e->type == CHAT_EVENT_CONTENT || e->type == CHAT_EVENT_REASONING ? (int)e->type + 1 : 0;
        if (e->type == CHAT_EVENT_TOOL_CALL || e->type == CHAT_EVENT_TOOL_ERROR) {
            if ((int)e->streamed != a->open)
                abort();
            if (e->type == CHAT_EVENT_TOOL_CALL && a->open &&
                (a->nf != strlen(e->arguments) || memcmp(a->frag ? a->frag : "", e->arguments, a->nf)))
                abort();
            a->open = 0;
        }
        put(&a->log, &a->n, &a->cap, head, strlen(head));
        put(&a->log, &a->n, &a->cap, e->text, e->len);
        if (e->name)
            put(&a->log, &a->n, &a->cap, e->name, strlen(e->name));
        if (e->arguments)
            put(&a->log, &a->n, &a->cap, e->arguments, strlen(e->arguments));
        put(&a->log, &a->n, &a->cap, "]", 1);
    }
}

static void run(const char *text, size_t len, size_t step, struct acc *a)
{
    struct chat_parser *p;
    if (chat_parser_create(&p, NULL, NULL))
        abort();
    const struct chat_event *ev;
    size_t n;
    for (size_t at = 0; at < len; at += step) {
        size_t k = len - at < step ? len - at : step;
        if (chat_parser_feed(p, text + at, k, &ev, &n, NULL))
            abort();
        take(a, ev, n);
    }
    if (chat_parser_finish(p, &ev, &n, NULL))
        abort();
    take(a, ev, n);
    if (a->open)
        abort(); /* every streamed call ends as a TOOL_CALL or TOOL_ERROR */
    chat_parser_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const char pre[] = "<tool_call>{\"name\": \"f\", \"arguments\": ";
    size_t pl = data[0] & 128 ? sizeof pre - 1 : 0;
    char *text = malloc(pl + size);
    if (!text)
        return 0;
    memcpy(text, pre, pl);
    memcpy(text + pl, data + 1, size - 1);
    size_t len = pl + size - 1;
    struct acc whole = {0}, split = {0};
    run(text, len, len ? len : 1, &whole);
    run(text, len, 1 + (data[0] & 15), &split);
    if (whole.n != split.n || (whole.n && memcmp(whole.log, split.log, whole.n)))
        abort();
    free(whole.log);
    free(whole.frag);
    free(split.log);
    free(split.frag);
    free(text);
    return 0;
}
