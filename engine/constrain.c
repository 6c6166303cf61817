/* engine/constrain.c - the engine's side of structured output: vocabulary,
 * compile cache, think-mode masks, the mask helper thread.
 *
 * Cache: a small array searched linearly (a few dozen entries; one lookup
 * per request, next to a prompt's worth of forward passes), each entry the
 * gram_hash of (kind, key) plus the key itself, so that a hash collision
 * is a miss, never another schema's grammar. The key is the source text;
 * for a tool call the tool name, a newline, then the tools' text. When
 * full, the least recently used entry goes (its gram lives on in the
 * matchers that still hold it). Refusals are not cached: a bad schema is
 * the client's to fix, and compiling it again costs the client's time.
 *
 * Helper thread: engine_step starts one per step that has constrained
 * rows, before the forward pass, and joins it before sampling, so mask
 * time hides behind the forward pass; a mask depends only on the matcher's
 * state after the tokens accepted so far, which the forward pass does not
 * change. pthread_create per step (tens of microseconds) against a decode
 * step of milliseconds; a pool would save nothing measurable.
 *
 * Threading: everything here runs on the engine's owner thread except the
 * helper's loop, which touches only the matchers and masks it was handed. */
#include "constrain.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"
#include "grammar/grammar.h"
#include "tokenizer.h"

struct cons_entry {
    uint64_t hash;
    enum cons_kind kind;
    char *key;                 /* (key_len) owned */
    size_t key_len;
    struct gram *g;            /* one reference, the cache's */
    uint64_t used;             /* cons.clock at the last hit */
};

struct cons {
    const struct tokenizer *tok;
    int n_vocab, n_words;
    int32_t eos[8];
    int n_eos;
    int32_t think_open, think_close;
    struct gram_vocab *vocab;  /* NULL until the first cons_get */
    struct cons_entry *ent;    /* (cap) */
    int n, cap;
    uint64_t clock;
    uint32_t *open_mask;       /* (n_words) only <think> */
    uint32_t *think_mask;      /* (n_words) all but eos */

    /* the helper's batch */
    pthread_t th;
    bool running;
    struct gram_match *const *bm;
    uint32_t *const *bmask;
    int bn;
};

static void set_bit(uint32_t *m, int32_t id, bool on)
{
    if (on)
        m[id / 32] |= 1u << (id % 32);
    else
        m[id / 32] &= ~(1u << (id % 32));
}

int cons_create(struct cons **out, const struct tokenizer *tok, int n_vocab,
                const int32_t *eos_ids, int n_eos, int32_t think_open, int32_t think_close,
                int cache_cap,
                struct rl_err *err)
{
    *out = NULL;
    if (!tok || n_vocab <= 0 || n_eos < 0 || n_eos > 8)
        return rl_errf(err, RL_EINVAL, "constrain: need a tokenizer, a vocabulary and <= 8 eos ids");
    struct cons *c = calloc(1, sizeof *c);
    if (!c)
        return rl_errf(err, RL_ENOMEM, "constrain: out of memory");
    c->tok = tok;
    c->n_vocab = n_vocab;
    c->n_words = gram_mask_words_n(n_vocab);
    c->n_eos = n_eos;
    c->think_open = think_open;
    c->think_close = think_close;
    memcpy(c->eos, eos_ids, (size_t)n_eos * sizeof *eos_ids);
    c->cap = cache_cap > 0 ? cache_cap : CONS_CACHE_DEFAULT;
    c->ent = calloc((size_t)c->cap, sizeof *c->ent);
    c->open_mask = calloc((size_t)c->n_words, sizeof *c->open_mask);
    c->think_mask = malloc((size_t)c->n_words * sizeof *c->think_mask);
    if (!c->ent || !c->open_mask || !c->think_mask) {
        cons_free(c);
        return rl_errf(err, RL_ENOMEM, "constrain: out of memory");
    }
    memset(c->think_mask, 0xff, (size_t)c->n_words * sizeof *c->think_mask);
    for (int32_t id = n_vocab; id < c->n_words * 32; id++)
        set_bit(c->think_mask, id, false); /* past the row: never a token */
    for (int i = 0; i < n_eos; i++)
        if (eos_ids[i] >= 0 && eos_ids[i] < n_vocab)
            set_bit(c->think_mask, eos_ids[i], false);
    if (think_open >= 0 && think_open < n_vocab)
        set_bit(c->open_mask, think_open, true);
    *out = c;
    return 0;
}

void cons_free(struct cons *c)
{
    if (!c)
        return;
    cons_masks_join(c);
    for (int i = 0; i < c->n; i++) {
        gram_unref(c->ent[i].g);
        free(c->ent[i].key);
    }
    free(c->ent);
    gram_vocab_free(c->vocab); /* after every gram made from it */
    free(c->open_mask);
    free(c->think_mask);
    free(c);
}

static const char *token_bytes(void *user, int32_t id, size_t *len, int *is_special)
{
    const struct cons *c = user;
    *is_special = tok_is_special(c->tok, id) || id == c->think_open || id == c->think_close;
    return tok_token_bytes(c->tok, id, len);
}

static const char *kind_name(enum cons_kind k)
{
    switch (k) {
    case CONS_JSON_OBJECT: return "json_object";
    case CONS_JSON_SCHEMA: return "json_schema";
    case CONS_GRAMMAR: return "ebnf";
    case CONS_TOOL_CALL: return "tool_call";
    default: return "none";
    }
}

static int compile(struct cons *c, enum cons_kind kind, const char *src, size_t len,
                   const char *tool_name, struct gram **g, struct rl_err *err)
{
    switch (kind) {
    case CONS_JSON_OBJECT: return gram_compile_json_object(g, c->vocab, err);
    case CONS_JSON_SCHEMA: return gram_compile_json_schema(g, c->vocab, src, len, err);
    case CONS_GRAMMAR: return gram_compile_ebnf(g, c->vocab, src, len, err);
    case CONS_TOOL_CALL:
        return gram_compile_tool_call(g, c->vocab, src, len,
                                      tool_name && tool_name[0] ? tool_name : NULL, err);
    default: return rl_errf(err, RL_EINVAL, "constrain: no constraint kind %d", (int)kind);
    }
}

int cons_get(struct cons *c, enum cons_kind kind, const char *src, size_t len,
             const char *tool_name, struct gram **out, struct rl_err *err)
{
    *out = NULL;
    int rc;
    if (!src)
        len = 0;
    if (!c->vocab && (rc = gram_vocab_create(&c->vocab, c->n_vocab, token_bytes, c,
                                             c->eos, c->n_eos, err)))
        return rc;
    /* the key: the source, or for a tool call "name\n" + the tools */
    size_t nl = kind == CONS_TOOL_CALL && tool_name ? strlen(tool_name) : 0;
    size_t key_len = kind == CONS_TOOL_CALL ? nl + 1 + len : len;
    char *key = malloc(key_len + 1);
    if (!key)
        return rl_errf(err, RL_ENOMEM, "constrain: out of memory");
    if (kind == CONS_TOOL_CALL) {
        memcpy(key, tool_name ? tool_name : "", nl);
        key[nl] = '\n';
        if (len)
            memcpy(key + nl + 1, src, len);
    } else if (len) {
        memcpy(key, src, len);
    }
    key[key_len] = 0;
    uint64_t h = gram_hash(kind_name(kind), key, key_len);
    c->clock++;
    for (int i = 0; i < c->n; i++) {
        struct cons_entry *e = &c->ent[i];
        if (e->hash == h && e->kind == kind && e->key_len == key_len &&
            !memcmp(e->key, key, key_len)) {
            e->used = c->clock;
            *out = e->g;
            free(key);
            return 0;
        }
    }
    struct gram *g = NULL;
    if ((rc = compile(c, kind, src, len, tool_name, &g, err))) {
        free(key);
        return rc;
    }
    int at = c->n;
    if (c->n == c->cap) { /* evict the least recently used */
        at = 0;
        for (int i = 1; i < c->n; i++)
            if (c->ent[i].used < c->ent[at].used)
                at = i;
        gram_unref(c->ent[at].g);
        free(c->ent[at].key);
    } else {
        c->n++;
    }
    c->ent[at] = (struct cons_entry){h, kind, key, key_len, g, c->clock};
    *out = g;
    return 0;
}

int cons_mask_words(const struct cons *c) { return c->n_words; }
const uint32_t *cons_open_mask(const struct cons *c) { return c->open_mask; }
const uint32_t *cons_think_mask(const struct cons *c) { return c->think_mask; }

static void *masks_main(void *arg)
{
    struct cons *c = arg;
    for (int i = 0; i < c->bn; i++)
        gram_match_mask(c->bm[i], c->bmask[i]);
    return NULL;
}

void cons_masks_start(struct cons *c, struct gram_match *const *m, uint32_t *const *masks,
                      int n)
{
    cons_masks_join(c);
    c->bm = m;
    c->bmask = masks;
    c->bn = n;
    if (n <= 0)
        return;
    if (pthread_create(&c->th, NULL, masks_main, c) == 0)
        c->running = true;
    else
        masks_main(c); /* no thread: the same work, here */
}

void cons_masks_join(struct cons *c)
{
    if (c->running) {
        pthread_join(c->th, NULL);
        c->running = false;
    }
    c->bn = 0;
}
