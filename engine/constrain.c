/* engine/constrain.c - the engine's side of structured output: vocabulary,
 * compile cache, think-mode masks, the mask helper thread.
 *
 * Cache: a small array searched linearly (a few dozen entries; one lookup
 * per request, next to a prompt's worth of forward passes), each entry the
 * gram_hash of (kind, key) plus the key itself, so that a hash collision
 * is a miss, never another schema's grammar. The key is the source text;
 * for a tool call the tool name, a newline, then the tools' text. When
 * full, in entries or in bytes (gram_bytes: a grammar near the state limit
 * holds tens of MB, and its classifications grow as it is used), the least
 * recently used entries go (a gram lives on in the matchers that still
 * hold it); the bytes are counted at every lookup and insert, so a grammar
 * that grew meanwhile is seen. Refusals are not cached: a bad schema is
 * the client's to fix, and compiling it again costs the client's time.
 *
 * Compile threads: a constraint the cache lacks is compiled on a thread of
 * the cons's own (a few, started on the first miss), so that a schema that
 * takes 0.4 s to compile stalls only its own request, not every running one
 * (vLLM's requests wait for their grammar the same way). Jobs live on one
 * list, c->jobs, in arrival order; a free thread takes the queued job of
 * the highest priority (its requests' highest: engine.h), the oldest among
 * equals, as the scheduler admits requests. The owner thread links and
 * unlinks jobs, and moves finished ones into the cache ("adopts" them)
 * whenever it calls in, so that the cache itself stays the owner's alone.
 * A job's state, gram and result are written by the thread and read by
 * the owner under c->mu; its references are the
 * owner's (callers, plus one for the list until it is adopted), so the
 * thread never sees a job freed: none is freed before it is done. The
 * vocabulary is built by whichever thread first needs it, under c->vmu.
 *
 * Helper thread: engine_step starts one per step that has constrained
 * rows, before the forward pass, and joins it before sampling, so mask
 * time hides behind the forward pass; a mask depends only on the matcher's
 * state after the tokens accepted so far, which the forward pass does not
 * change. pthread_create per step (tens of microseconds) against a decode
 * step of milliseconds; a pool would save nothing measurable.
 *
 * Threading: everything here runs on the engine's owner thread except the
 * helper's loop, which touches only the matchers and masks it was handed,
 * and the compile threads', which touches only the jobs (under c->mu) and
 * the vocabulary (under c->vmu). */
#include "constrain.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
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

enum job_state { JOB_QUEUED, JOB_COMPILING, JOB_DONE };

struct cons_job {
    struct cons_job *next;     /* c->jobs; linked and unlinked under c->mu */
    enum job_state state;      /* under c->mu */
    int priority;              /* under c->mu: its requests' highest */
    bool adopted;              /* owner: its result went into the cache */
    int refs;                  /* owner: callers, + 1 for c->jobs until adopted */
    enum cons_kind kind;
    uint64_t hash;
    char *key;                 /* (key_len) the cache key, owned */
    size_t key_len;
    const char *src;           /* (len) inside key */
    size_t len;
    char *tool_name;           /* owned; NULL = any tool */
    struct gram *g;            /* the job's reference, once done */
    int rc;                    /* once done */
    struct rl_err err;
};

struct cons {
    const struct tokenizer *tok;
    int n_vocab, n_words;
    int32_t eos[8];
    int n_eos;
    int32_t think_open, think_close;
    pthread_mutex_t vmu;       /* guards the vocabulary's creation */
    struct gram_vocab *vocab;  /* NULL until the first compile */
    struct cons_entry *ent;    /* (cap + 1): a spare, filled by an insert
                                  before the trim that makes room */
    int n, cap;
    size_t cap_bytes;          /* gram_bytes of the entries, at most */
    uint64_t clock;
    uint32_t *open_mask;       /* (n_words) only <think> */
    uint32_t *think_mask;      /* (n_words) all but eos */

    /* the helper's batch */
    pthread_t th;
    bool running;
    struct gram_match *const *bm;
    uint32_t *const *bmask;
    int bn;

    /* the compile threads */
    pthread_mutex_t mu;
    pthread_cond_t work, done; /* a job queued (or stop); a job done */
    pthread_t cth[CONS_COMPILE_THREADS_MAX];
    int n_cth, want_cth;       /* compile threads running; to start */
    bool stop;                 /* under mu */
    struct cons_job *jobs;     /* under mu: oldest first */
    void (*hook)(void *user);  /* cons_set_compile_hook */
    void *hook_user;
    uint64_t n_done, n_seen;   /* jobs finished (under mu); as cons_wait last saw */
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
                int cache_cap, size_t cache_bytes, int compile_threads, struct rl_err *err)
{
    *out = NULL;
    if (!tok || n_vocab <= 0 || n_eos < 0 || n_eos > 8)
        return rl_errf(err, RL_EINVAL, "constrain: need a tokenizer, a vocabulary and <= 8 eos ids");
    struct cons *c = calloc(1, sizeof *c);
    if (!c)
        return rl_errf(err, RL_ENOMEM, "constrain: out of memory");
    /* first, so that cons_free can always destroy them */
    if (pthread_mutex_init(&c->vmu, NULL) || pthread_mutex_init(&c->mu, NULL) ||
        rl_cond_init_mono(&c->work) || rl_cond_init_mono(&c->done)) {
        free(c);
        return rl_errf(err, RL_ENOMEM, "constrain: cannot make the compile threads' locks");
    }
    c->tok = tok;
    c->n_vocab = n_vocab;
    c->n_words = gram_mask_words_n(n_vocab);
    c->n_eos = n_eos;
    c->think_open = think_open;
    c->think_close = think_close;
    memcpy(c->eos, eos_ids, (size_t)n_eos * sizeof *eos_ids);
    c->cap = cache_cap > 0 ? cache_cap : CONS_CACHE_DEFAULT;
    c->cap_bytes = cache_bytes > 0 ? cache_bytes : CONS_CACHE_BYTES_DEFAULT;
    if (compile_threads <= 0) { /* a quarter of the cores, 1 to 4 */
        long n = sysconf(_SC_NPROCESSORS_ONLN) / 4;
        compile_threads = n < 1 ? 1 : n > 4 ? 4 : (int)n;
    }
    c->want_cth = compile_threads < CONS_COMPILE_THREADS_MAX ? compile_threads
                                                             : CONS_COMPILE_THREADS_MAX;
    c->ent = calloc((size_t)c->cap + 1, sizeof *c->ent);
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

static void job_free(struct cons_job *j)
{
    gram_unref(j->g);
    free(j->key);
    free(j->tool_name);
    free(j);
}

void cons_free(struct cons *c)
{
    if (!c)
        return;
    cons_masks_join(c);
    if (c->n_cth) {
        /* a compile under way runs to its end (the library has no way to
         * cut one short): at most a few hundred milliseconds */
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        pthread_cond_broadcast(&c->work);
        pthread_mutex_unlock(&c->mu);
        for (int i = 0; i < c->n_cth; i++)
            pthread_join(c->cth[i], NULL);
    }
    while (c->jobs) { /* every caller's reference is gone with the engine */
        struct cons_job *j = c->jobs;
        c->jobs = j->next;
        job_free(j);
    }
    for (int i = 0; i < c->n; i++) {
        gram_unref(c->ent[i].g);
        free(c->ent[i].key);
    }
    free(c->ent);
    gram_vocab_free(c->vocab); /* after every gram made from it */
    free(c->open_mask);
    free(c->think_mask);
    pthread_mutex_destroy(&c->vmu);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->work);
    pthread_cond_destroy(&c->done);
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

/* The vocabulary, built on first use by whichever thread needs it. */
static int ensure_vocab(struct cons *c, struct rl_err *err)
{
    int rc = 0;
    pthread_mutex_lock(&c->vmu);
    if (!c->vocab)
        rc = gram_vocab_create(&c->vocab, c->n_vocab, token_bytes, c, c->eos, c->n_eos, err);
    pthread_mutex_unlock(&c->vmu);
    return rc;
}

/* Compiles a constraint, the vocabulary first if no thread built it yet:
 * what cons_get, a compile thread and the no-thread fallback all do. */
static int build(struct cons *c, enum cons_kind kind, const char *src, size_t len,
                 const char *tool_name, struct gram **g, struct rl_err *err)
{
    int rc = ensure_vocab(c, err);
    return rc ? rc : compile(c, kind, src, len, tool_name, g, err);
}

/* The cache key of a constraint (malloc'd, NUL-terminated, caller frees):
 * the source, or for a tool call "name\n" + the tools. *src_at: where the
 * source starts inside it. */
static char *make_key(enum cons_kind kind, const char *src, size_t len, const char *tool_name,
                      size_t *key_len, size_t *src_at)
{
    size_t nl = kind == CONS_TOOL_CALL && tool_name ? strlen(tool_name) : 0;
    *src_at = kind == CONS_TOOL_CALL ? nl + 1 : 0;
    *key_len = *src_at + len;
    char *key = malloc(*key_len + 1);
    if (!key)
        return NULL;
    if (kind == CONS_TOOL_CALL) {
        memcpy(key, tool_name ? tool_name : "", nl);
        key[nl] = '\n';
    }
    if (len)
        memcpy(key + *src_at, src, len);
    key[*key_len] = 0;
    return key;
}

size_t cons_cache_bytes(const struct cons *c)
{
    size_t bytes = 0;
    for (int i = 0; i < c->n; i++)
        bytes += gram_bytes(c->ent[i].g);
    return bytes;
}

static void cache_drop(struct cons *c, int i)
{
    gram_unref(c->ent[i].g);
    free(c->ent[i].key);
    c->ent[i] = c->ent[--c->n];
}

/* Evicts least recently used entries until at most cap are left and
 * their bytes fit cap_bytes; the most recently used one always stays (a
 * grammar larger than the whole budget still serves its retries). */
static void cache_trim(struct cons *c)
{
    size_t bytes = cons_cache_bytes(c);
    while (c->n > 1 && (c->n > c->cap || bytes > c->cap_bytes)) {
        int old = 0;
        for (int i = 1; i < c->n; i++)
            if (c->ent[i].used < c->ent[old].used)
                old = i;
        bytes -= gram_bytes(c->ent[old].g);
        cache_drop(c, old);
    }
}

static struct gram *cache_find(struct cons *c, enum cons_kind kind, uint64_t h, const char *key,
                               size_t key_len)
{
    c->clock++;
    struct gram *g = NULL;
    for (int i = 0; i < c->n && !g; i++) {
        struct cons_entry *e = &c->ent[i];
        if (e->hash == h && e->kind == kind && e->key_len == key_len &&
            !memcmp(e->key, key, key_len)) {
            e->used = c->clock;
            g = e->g;
        }
    }
    cache_trim(c); /* g, just used, stays */
    return g;
}

/* Puts g (the cache takes a reference of its own) under key (taken over),
 * evicting least recently used entries to make room. */
static void cache_put(struct cons *c, enum cons_kind kind, uint64_t h, char *key, size_t key_len,
                      struct gram *g)
{
    c->ent[c->n++] = (struct cons_entry){h, kind, key, key_len, gram_ref(g), ++c->clock};
    cache_trim(c);
}

/* A constraint's cache key (its hash *h, the source at key + *src_at)
 * and what the cache holds under it: *g on a hit, else *key (malloc'd,
 * the caller's). */
static int lookup(struct cons *c, enum cons_kind kind, const char *src, size_t len,
                  const char *tool_name, struct gram **g, char **key, size_t *key_len,
                  size_t *src_at, uint64_t *h, struct rl_err *err)
{
    *key = make_key(kind, src, len, tool_name, key_len, src_at);
    if (!*key)
        return rl_errf(err, RL_ENOMEM, "constrain: out of memory");
    *h = gram_hash(kind_name(kind), *key, *key_len);
    if ((*g = cache_find(c, kind, *h, *key, *key_len))) {
        free(*key);
        *key = NULL;
    }
    return 0;
}

int cons_get(struct cons *c, enum cons_kind kind, const char *src, size_t len,
             const char *tool_name, struct gram **out, struct rl_err *err)
{
    *out = NULL;
    int rc;
    if (!src)
        len = 0;
    size_t key_len, at;
    uint64_t h;
    char *key;
    if ((rc = lookup(c, kind, src, len, tool_name, out, &key, &key_len, &at, &h, err)) || *out)
        return rc;
    struct gram *g = NULL;
    if ((rc = build(c, kind, src, len, tool_name, &g, err))) {
        free(key);
        return rc;
    }
    cache_put(c, kind, h, key, key_len, g);
    gram_unref(g); /* the cache's reference is the one left */
    *out = g;
    return 0;
}

/* Unlinks j from c->jobs and frees it (its last reference went). */
static void job_drop(struct cons *c, struct cons_job *j)
{
    pthread_mutex_lock(&c->mu);
    for (struct cons_job **p = &c->jobs; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    job_free(j);
}

/* Moves every finished job's gram into the cache and drops the list's
 * reference on it. */
static void adopt(struct cons *c)
{
    for (;;) {
        struct cons_job *j;
        pthread_mutex_lock(&c->mu);
        for (j = c->jobs; j && !(j->state == JOB_DONE && !j->adopted); j = j->next)
            ;
        pthread_mutex_unlock(&c->mu);
        if (!j)
            return;
        j->adopted = true;
        if (!j->rc && !cache_find(c, j->kind, j->hash, j->key, j->key_len)) {
            char *key = malloc(j->key_len + 1);
            if (key) {
                memcpy(key, j->key, j->key_len + 1);
                cache_put(c, j->kind, j->hash, key, j->key_len, j->g);
            }
        }
        if (--j->refs == 0)
            job_drop(c, j);
    }
}

static void *compile_main(void *arg)
{
    struct cons *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        struct cons_job *j = NULL;
        while (!c->stop) {
            for (struct cons_job *x = c->jobs; x; x = x->next)
                if (x->state == JOB_QUEUED && (!j || x->priority > j->priority))
                    j = x;
            if (j)
                break;
            pthread_cond_wait(&c->work, &c->mu);
        }
        if (c->stop)
            break;
        j->state = JOB_COMPILING;
        pthread_mutex_unlock(&c->mu);
        struct gram *g = NULL;
        struct rl_err e = {0};
        if (c->hook)
            c->hook(c->hook_user);
        int rc = build(c, j->kind, j->src, j->len, j->tool_name, &g, &e);
        pthread_mutex_lock(&c->mu);
        j->g = g;
        j->rc = rc;
        j->err = e;
        j->state = JOB_DONE;
        c->n_done++;
        pthread_cond_broadcast(&c->done);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int cons_request(struct cons *c, enum cons_kind kind, const char *src, size_t len,
                 const char *tool_name, int priority, struct gram **g, struct cons_job **job,
                 struct rl_err *err)
{
    *g = NULL;
    *job = NULL;
    if (!src)
        len = 0;
    adopt(c);
    size_t key_len, at;
    uint64_t h;
    char *key;
    int rc = lookup(c, kind, src, len, tool_name, g, &key, &key_len, &at, &h, err);
    if (rc || *g)
        return rc;
    /* the same text queued or compiling already (a client's retries, or a
     * burst of one application's requests): one compile for all */
    pthread_mutex_lock(&c->mu);
    for (struct cons_job *j = c->jobs; j; j = j->next)
        if (!j->adopted && j->hash == h && j->kind == kind && j->key_len == key_len &&
            !memcmp(j->key, key, key_len)) {
            j->refs++;
            if (priority > j->priority)
                j->priority = priority;
            *job = j;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    if (*job) {
        free(key);
        return 0;
    }
    struct cons_job *j = calloc(1, sizeof *j);
    if (!j || (tool_name && !(j->tool_name = strdup(tool_name)))) {
        free(j);
        free(key);
        return rl_errf(err, RL_ENOMEM, "constrain: out of memory");
    }
    j->refs = 2; /* the caller's and the list's */
    j->priority = priority;
    j->kind = kind;
    j->hash = h;
    j->key = key;
    j->key_len = key_len;
    j->src = key + at;
    j->len = len;
    while (c->n_cth < c->want_cth && pthread_create(&c->cth[c->n_cth], NULL, compile_main, c) == 0)
        c->n_cth++;
    c->want_cth = c->n_cth; /* what could not start is not tried again */
    if (!c->n_cth) {
        /* no thread to be had: compiled here, as cons_get would */
        j->rc = build(c, kind, j->src, len, j->tool_name, &j->g, &j->err);
        j->state = JOB_DONE;
    }
    pthread_mutex_lock(&c->mu);
    struct cons_job **end = &c->jobs;
    while (*end)
        end = &(*end)->next;
    *end = j;
    if (j->state == JOB_DONE)
        c->n_done++;
    pthread_cond_signal(&c->work);
    pthread_mutex_unlock(&c->mu);
    *job = j;
    return 0;
}

int cons_job_poll(struct cons *c, struct cons_job *job, struct gram **g, struct rl_err *err)
{
    *g = NULL;
    adopt(c);
    if (!job->adopted)
        return 0;
    if (job->rc) {
        if (err)
            *err = job->err;
        return job->rc;
    }
    *g = job->g;
    return 1;
}

void cons_job_release(struct cons *c, struct cons_job *job)
{
    if (job && --job->refs == 0)
        job_drop(c, job);
}

void cons_set_compile_hook(struct cons *c, void (*fn)(void *user), void *user)
{
    c->hook = fn;
    c->hook_user = user;
}

bool cons_wait(struct cons *c, int ms)
{
    struct timespec ts;
    rl_mono_deadline(&ts, ms > 0 ? ms : 0);
    pthread_mutex_lock(&c->mu);
    while (c->n_done == c->n_seen)
        if (pthread_cond_timedwait(&c->done, &c->mu, &ts))
            break;
    bool came = c->n_done != c->n_seen;
    c->n_seen = c->n_done;
    pthread_mutex_unlock(&c->mu);
    return came;
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
