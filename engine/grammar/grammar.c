/* engine/grammar/grammar.c - the token trie, the byte-level matcher and
 * the per-step token mask.
 *
 * Matcher state. A grammar is a set of rule DFAs that call each other
 * (gir.h). A configuration is (state, frame): the DFA state the next byte
 * is read from and the call stack under it, a frame being a node (return
 * state, parent frame) in an append-only arena. Ambiguity (anyOf of two
 * schemas that start alike, a call that may or may not happen) keeps
 * several configurations at once, at most MAX_CFG. The closure of a set
 * follows calls (push the return state; a call in tail position pushes
 * nothing) and rule ends (pop) until only configurations that read a byte
 * remain; it ends because left recursion was refused at build time, and
 * stacks deeper than MAX_STACK are cut. One token = its bytes, one step
 * each. The history keeps every token's configuration set and arena size,
 * so rollback is exact.
 *
 * Mask. The vocabulary is sorted by bytes (struct gram_vocab), so tokens
 * that share a prefix are neighbours and a walk over them in order reuses
 * the parse of the shared prefix (an implicit trie; dead prefixes skip
 * their whole range by binary search). For every state a configuration
 * can stop in, the tokens are classified once, walking from (state,
 * BOTTOM): accepted (some path reads the whole token without leaving the
 * state's rule: true in every context), rejected (every path dies, where
 * a path that leaves the rule goes on in every caller of the rule, a
 * superset of the real stacks), or uncertain (only paths through an
 * assumed caller read it: the answer depends on the stack). Per step the mask is the union of the accepted sets of
 * the current states plus the uncertain tokens that a walk from the real
 * configurations accepts (XGrammar's context-independent / -dependent
 * split). The classification is done at compile time, breadth-first from
 * the start, for up to GRAM_EAGER states and GRAM_EAGER_MS, and on first
 * use (lock-free publish) for the rest: which states are eager changes
 * only timing, never a mask.
 *
 * Memory. A classified state costs up to a vocabulary bitmask (19 KB for
 * Qwen3's), and a grammar near the state limit has tens of thousands of
 * states: a client whose output walks through them could make one grammar
 * hold hundreds of MB. So a grammar publishes classifications only up to
 * GRAM_MASK_BYTES; a state first met beyond that is classified for the
 * step that needs it and dropped (a few ms a step for a state of a long
 * string: what its first visit costs anyway, now at every visit, for that
 * grammar alone). gram_bytes says what a grammar holds, so its owner can
 * bound a cache of them by bytes.
 *
 * Threads: gram_vocab and gram are shared read-only (a lazily classified
 * state is published with a compare-and-swap); a gram_match belongs to
 * one thread. */
#include "grammar.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "event.h"
#include "gir.h"

#define MAX_CFG 64      /* configurations kept at once */
#define MAX_ITEMS 512   /* closure size of one set */
#define MAX_STACK 1000  /* call depth */
#define GRAM_EAGER 3000 /* states classified at compile time, at most */
#define GRAM_EAGER_MS 150 /* ... and for at most this much of the compiling
                             thread's CPU time: a schema with long counted
                             repetitions (maxLength: 5000) has a state per
                             position; the rest wait for first use */
#define GRAM_MASK_BYTES ((size_t)64 << 20) /* classifications kept per grammar:
                                        about 3,400 of Qwen3's dense masks,
                                        every position of a 3,000-character
                                        maxLength string */
#define BOTTOM (-2)     /* the frame under the classified state */
#define BOTTOM_ESC (-4) /* under it after leaving its rule: any caller */
#define ROOTF (-1)      /* under the root rule: the document */

struct gram_vocab {
    int n_vocab, n_words;
    int n_tok;        /* tokens in the trie (non-special, non-empty) */
    int32_t *ids;     /* (n_tok) trie order -> token id */
    uint32_t *off;    /* (n_tok) byte offset in blob */
    uint16_t *len;    /* (n_tok) */
    uint16_t *lcp;    /* (n_tok) common prefix with the previous */
    int32_t *order;   /* (n_vocab) token id -> trie order, -1 none */
    char *blob;
    int max_len;
    int32_t *eos; int n_eos;
};

struct smask {
    int n_acc;        /* accepted tokens */
    int32_t *acc;     /* their ids, or NULL when bits holds them */
    uint32_t *bits;   /* (n_words) or NULL */
    int n_unc;        /* uncertain tokens, in trie order */
    int32_t *unc;     /* trie indices */
    uint16_t *unc_lcp;/* common prefix with the previous in unc */
};

struct gram {
    atomic_int refs;
    const struct gram_vocab *v;
    struct gpda p;
    _Atomic(struct smask *) *sm; /* (p.n_st) */
    int32_t *call_off, *call_ret; /* (n_rules + 1), (n_refs): the return
                                     states of every call of each rule */
    size_t fixed_bytes;           /* the automaton and the arrays above */
    atomic_size_t mask_bytes;     /* the classifications published in sm */
    atomic_size_t mask_budget;    /* mask_bytes at most (GRAM_MASK_BYTES) */
};

struct cfg { int32_t st, par; };
struct node { int32_t st, par, depth, esc; /* esc: the chain ends in BOTTOM_ESC */ };

/* Scratch of a walk: per depth, the closure items (a stack in one pool). */
struct walker {
    const struct gpda *p;
    struct node *nd; int n_nd, cap_nd; /* the frame arena */
    struct cfg *pool; int cap_pool;
    int *off, *n;            /* (max_len + 2) items of depth d */
    int *nd_mark;            /* (max_len + 2) arena size after depth d */
    uint8_t *esc_any;        /* (max_len + 2) a cap dropped configurations */
    const int32_t *call_off; /* (n_rules + 1) callers of rule r: */
    const int32_t *call_ret; /*   call_ret[call_off[r] .. call_off[r+1]) */
    uint8_t *end;            /* (max_len + 2) the root may end here */
    int depth_cap;
    bool oom;
};

struct hent { int cfg_off, n_cfg, n_nd; uint8_t complete, done, eos; };

struct gram_match {
    struct gram *g;
    struct walker w;
    struct cfg *hc; int n_hc, cap_hc;   /* history configurations */
    struct hent *h; int n_h, cap_h;     /* one per position; h[0] = start */
    struct cfg tmp[MAX_CFG];
};

/* ------------------------------------------------------------------ */
/* vocabulary                                                          */

/* lcp[i] = the common prefix of tokens i-1 and i (trie order). */
static void set_lcps(struct gram_vocab *v, int n)
{
    for (int i = 0; i < n; i++) {
        int l = 0;
        if (i > 0) {
            const char *a = v->blob + v->off[i - 1], *b = v->blob + v->off[i];
            int m = v->len[i - 1] < v->len[i] ? v->len[i - 1] : v->len[i];
            while (l < m && a[l] == b[l]) l++;
        }
        v->lcp[i] = (uint16_t)l;
    }
}

static int cmp_tok(const void *a, const void *b, void *u)
{
    const struct gram_vocab *v = u;
    int x = *(const int *)a, y = *(const int *)b;
    size_t lx = v->len[x], ly = v->len[y];
    int c = memcmp(v->blob + v->off[x], v->blob + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    return (lx > ly) - (lx < ly);
}

int gram_vocab_create(struct gram_vocab **out, int n_vocab,
                      const char *(*token_bytes)(void *user, int32_t id, size_t *len,
                                                 int *is_special),
                      void *user, const int32_t *eos_ids, int n_eos, struct rl_err *err)
{
    *out = NULL;
    if (n_vocab <= 0 || !token_bytes || n_eos < 0 || (n_eos && !eos_ids))
        return rl_errf(err, RL_EINVAL, "gram_vocab_create: bad arguments");
    struct gram_vocab *v = calloc(1, sizeof *v);
    if (!v) return rl_errf(err, RL_ENOMEM, "gram_vocab_create: out of memory");
    v->n_vocab = n_vocab;
    v->n_words = gram_mask_words_n(n_vocab);
    size_t total = 0;
    int n = 0;
    for (int32_t id = 0; id < n_vocab; id++) {
        size_t len = 0;
        int sp = 0;
        const char *b = token_bytes(user, id, &len, &sp);
        if (b && !sp && len > 0 && len < 65535) { total += len; n++; }
    }
    v->ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    v->off = malloc(sizeof(uint32_t) * (size_t)(n ? n : 1));
    v->len = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    v->lcp = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    v->order = malloc(sizeof(int32_t) * (size_t)n_vocab);
    v->blob = malloc(total ? total : 1);
    v->eos = malloc(sizeof(int32_t) * (size_t)(n_eos ? n_eos : 1));
    int *idx = malloc(sizeof(int) * (size_t)(n ? n : 1));
    uint32_t *off0 = malloc(sizeof(uint32_t) * (size_t)(n ? n : 1));
    uint16_t *len0 = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    int32_t *id0 = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!v->ids || !v->off || !v->len || !v->lcp || !v->order || !v->blob || !v->eos || !idx ||
        !off0 || !len0 || !id0) {
        free(idx); free(off0); free(len0); free(id0);
        gram_vocab_free(v);
        return rl_errf(err, RL_ENOMEM, "gram_vocab_create: out of memory");
    }
    size_t pos = 0;
    int k = 0;
    for (int32_t id = 0; id < n_vocab; id++) {
        v->order[id] = -1;
        size_t len = 0;
        int sp = 0;
        const char *b = token_bytes(user, id, &len, &sp);
        if (!(b && !sp && len > 0 && len < 65535)) continue;
        memcpy(v->blob + pos, b, len);
        off0[k] = (uint32_t)pos; len0[k] = (uint16_t)len; id0[k] = id;
        idx[k] = k;
        pos += len;
        k++;
    }
    /* sort through the unsorted arrays, then lay them out in order */
    struct gram_vocab tv = {.off = off0, .len = len0, .blob = v->blob};
    qsort_r(idx, (size_t)n, sizeof(int), cmp_tok, &tv);
    for (int i = 0; i < n; i++) {
        int j = idx[i];
        v->ids[i] = id0[j]; v->off[i] = off0[j]; v->len[i] = len0[j];
        v->order[id0[j]] = i;
        if (v->len[i] > v->max_len) v->max_len = v->len[i];
    }
    free(idx); free(off0); free(len0); free(id0);
    v->n_tok = n;
    for (int i = 0; i < n_eos; i++) {
        if (eos_ids[i] < 0 || eos_ids[i] >= n_vocab) {
            gram_vocab_free(v);
            return rl_errf(err, RL_EINVAL, "gram_vocab_create: eos id %d outside the vocabulary", eos_ids[i]);
        }
        v->eos[i] = eos_ids[i];
        if (v->order[eos_ids[i]] >= 0) { /* an eos is never a document byte */
            /* leave it in the trie order table but mark it: remove from order */
            v->order[eos_ids[i]] = -1;
        }
    }
    v->n_eos = n_eos;
    /* eos tokens that are plain text would otherwise be allowed as text:
     * drop them from the trie */
    if (n_eos) {
        int m = 0;
        for (int i = 0; i < n; i++) {
            bool is_eos = false;
            for (int e = 0; e < n_eos; e++) is_eos |= v->ids[i] == v->eos[e];
            if (is_eos) continue;
            v->ids[m] = v->ids[i]; v->off[m] = v->off[i]; v->len[m] = v->len[i];
            v->order[v->ids[m]] = m;
            m++;
        }
        v->n_tok = m;
    }
    set_lcps(v, v->n_tok);
    *out = v;
    return 0;
}

void gram_vocab_free(struct gram_vocab *v)
{
    if (!v) return;
    free(v->ids); free(v->off); free(v->len); free(v->lcp); free(v->order); free(v->blob);
    free(v->eos);
    free(v);
}

int gram_vocab_n(const struct gram_vocab *v) { return v->n_vocab; }

/* ------------------------------------------------------------------ */
/* walker                                                              */

static int walker_init(struct walker *w, const struct gram *g)
{
    memset(w, 0, sizeof *w);
    const struct gpda *p = &g->p;
    int max_len = g->v->max_len;
    w->p = p;
    w->call_off = g->call_off;
    w->call_ret = g->call_ret;
    w->depth_cap = max_len + 2;
    size_t D = (size_t)w->depth_cap;
    w->off = calloc(D, sizeof(int));
    w->n = calloc(D, sizeof(int));
    w->nd_mark = calloc(D, sizeof(int));
    w->esc_any = calloc(D, 1);
    w->end = calloc(D, 1);
    w->cap_pool = 4096;
    w->pool = malloc(sizeof(struct cfg) * (size_t)w->cap_pool);
    w->cap_nd = 1024;
    w->nd = malloc(sizeof(struct node) * (size_t)w->cap_nd);
    if (!w->off || !w->n || !w->nd_mark || !w->esc_any || !w->end || !w->pool || !w->nd)
        return -1;
    return 0;
}

static void walker_fini(struct walker *w)
{
    free(w->off); free(w->n); free(w->nd_mark); free(w->esc_any); free(w->end);
    free(w->pool); free(w->nd);
    memset(w, 0, sizeof *w);
}

static int push_node(struct walker *w, int32_t st, int32_t par)
{
    int depth = par >= 0 ? w->nd[par].depth + 1 : 1;
    if (depth > MAX_STACK) return -3;
    if (w->n_nd >= w->cap_nd) {
        int nc = w->cap_nd * 2;
        void *a = realloc(w->nd, sizeof(struct node) * (size_t)nc);
        if (!a) { w->oom = true; return -3; }
        w->nd = a;
        w->cap_nd = nc;
    }
    int esc = par >= 0 ? w->nd[par].esc : par == BOTTOM_ESC;
    w->nd[w->n_nd] = (struct node){st, par, depth, esc};
    return w->n_nd++;
}

/* Closure of in[0..n) into the pool at depth d (items at w->off[d]). Sets
 * w->n[d], w->end[d]; sets w->esc_any[d] when a cap dropped items. */
static void closure_at(struct walker *w, int d, const struct cfg *in, int n)
{
    const struct gpda *p = w->p;
    int base = d ? w->off[d - 1] + w->n[d - 1] : 0;
    if (base + MAX_ITEMS > w->cap_pool) {
        int nc = w->cap_pool;
        while (base + MAX_ITEMS > nc) nc *= 2;
        void *a = realloc(w->pool, sizeof(struct cfg) * (size_t)nc);
        if (!a) { w->oom = true; w->n[d] = 0; return; }
        w->pool = a;
        w->cap_pool = nc;
    }
    struct cfg *it = w->pool + base;
    int m = 0;
    bool end = false;
    /* the common case: one configuration that only reads bytes */
    if (n == 1 && !p->st[in[0].st].n_ref && !p->st[in[0].st].final) {
        it[0] = in[0];
        w->off[d] = base;
        w->n[d] = 1;
        w->end[d] = 0;
        w->nd_mark[d] = w->n_nd;
        return;
    }
    for (int i = 0; i < n && m < MAX_ITEMS; i++) {
        bool dup = false;
        for (int j = 0; j < m; j++) dup |= it[j].st == in[i].st && it[j].par == in[i].par;
        if (!dup) it[m++] = in[i];
    }
    for (int k = 0; k < m; k++) {
        struct cfg c = it[k];
        const struct gstate *s = &p->st[c.st];
        struct cfg add[1];
        for (int i = 0; i <= s->n_ref; i++) {
            if (i < s->n_ref) {
                const struct gref *r = &p->refs[s->ref_off + i];
                int par = c.par;
                if (!r->tail) {
                    par = push_node(w, r->ret, c.par);
                    if (par == -3) continue;
                }
                add[0] = (struct cfg){p->rule_start[r->rule], par};
            } else {
                if (!s->final) break;
                if (c.par == ROOTF) { end = true; break; }
                if (c.par == BOTTOM || c.par == BOTTOM_ESC) {
                    /* left the classified state's rule: continue in every
                     * place that calls it (a superset of the real stack) */
                    for (int j = w->call_off[s->rule]; j < w->call_off[s->rule + 1]; j++) {
                        struct cfg a = {w->call_ret[j], BOTTOM_ESC};
                        bool dup = false;
                        for (int q = 0; q < m && !dup; q++) dup = it[q].st == a.st && it[q].par == a.par;
                        if (dup) continue;
                        if (m < MAX_ITEMS) it[m++] = a;
                        else w->esc_any[d] = 1;
                    }
                    break;
                }
                add[0] = (struct cfg){w->nd[c.par].st, w->nd[c.par].par};
            }
            bool dup = false;
            for (int j = 0; j < m && !dup; j++) dup = it[j].st == add[0].st && it[j].par == add[0].par;
            if (!dup && m < MAX_ITEMS) it[m++] = add[0];
            else if (!dup) w->esc_any[d] = 1;
        }
    }
    w->off[d] = base;
    w->n[d] = m;
    w->end[d] = end;
    w->nd_mark[d] = w->n_nd;
}

/* The configurations that reading byte b from the items of depth d gives
 * (before their closure), into nx (MAX_CFG). */
static int step_raw(const struct walker *w, int d, uint8_t b, struct cfg *nx)
{
    const struct gpda *p = w->p;
    int k = 0;
    const struct cfg *it = w->pool + w->off[d];
    for (int i = 0; i < w->n[d]; i++) {
        int t = p->st[it[i].st].next[b];
        if (t < 0) continue;
        bool dup = false;
        for (int j = 0; j < k && !dup; j++) dup = nx[j].st == t && nx[j].par == it[i].par;
        if (dup) continue;
        if (k == MAX_CFG) return -k; /* over the cap: the first MAX_CFG kept */
        nx[k++] = (struct cfg){t, it[i].par};
    }
    return k;
}

/* From the items of depth d, reads byte b into depth d + 1. Returns the
 * number of configurations there (0 = dead). */
static int step_at(struct walker *w, int d, uint8_t b)
{
    struct cfg nx[MAX_CFG];
    int k = step_raw(w, d, b, nx);
    w->esc_any[d + 1] = w->esc_any[d] || k < 0;
    if (k < 0) k = -k;
    if (!k) { w->n[d + 1] = 0; w->off[d + 1] = w->off[d] + w->n[d]; w->end[d + 1] = 0;
              w->nd_mark[d + 1] = w->n_nd; return 0; }
    closure_at(w, d + 1, nx, k);
    return k;
}

/* Growable int arrays for the classification. */
struct ivec { int32_t *v; int n, cap; };
static bool ivec_push(struct ivec *a, int32_t x)
{
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 256;
        void *p = realloc(a->v, sizeof(int32_t) * (size_t)nc);
        if (!p) return false;
        a->v = p;
        a->cap = nc;
    }
    a->v[a->n++] = x;
    return true;
}

/* The end (exclusive) of the run of tokens from i on that share token i's
 * first k bytes. */
static int run_end(const struct gram_vocab *v, int i, int k)
{
    const char *pre = v->blob + v->off[i];
    int lo = i + 1, hi = v->n_tok;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (v->len[mid] >= k && !memcmp(v->blob + v->off[mid], pre, (size_t)k)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Classifies every token from (state, BOTTOM). */
static struct smask *classify(struct walker *w, const struct gram_vocab *v, int state)
{
    struct ivec acc = {0}, unc = {0};
    struct smask *sm = calloc(1, sizeof *sm);
    if (!sm) return NULL;
    int nd0 = w->n_nd;
    struct cfg init = {state, BOTTOM};
    w->esc_any[0] = 0;
    closure_at(w, 0, &init, 1);
    int valid = 0; /* depths 0..valid computed for the previous token */
    bool ok = true;
    for (int i = 0; i < v->n_tok && ok;) {
        int len = v->len[i];
        const uint8_t *b = (const uint8_t *)v->blob + v->off[i];
        int d = v->lcp[i] < valid ? v->lcp[i] : valid;
        w->n_nd = w->nd_mark[d];
        while (d < len && w->n[d] > 0) {
            step_at(w, d, b[d]);
            d++;
        }
        valid = d;
        if (d == len && w->n[d] > 0) {
            /* read whole: accepted if a path stayed in (or returned to)
             * the state's own stack, uncertain if only paths through an
             * assumed caller did */
            const struct cfg *it = w->pool + w->off[d];
            bool mine = false;
            for (int q = 0; q < w->n[d] && !mine; q++)
                mine = it[q].par == BOTTOM || (it[q].par >= 0 && !w->nd[it[q].par].esc);
            ok = mine ? ivec_push(&acc, v->ids[i]) : ivec_push(&unc, i);
            i++;
            continue;
        }
        /* dead at depth d (its bytes 0..d-1 read, byte d-1 killed it) in
         * every context: rejected, unless a cap dropped paths */
        int e = d >= 1 ? run_end(v, i, d) : i + 1;
        if (w->esc_any[d])
            for (int j = i; j < e && ok; j++) ok = ivec_push(&unc, j);
        i = e;
        if (d >= 1) valid = d; /* the next token differs within 0..d-1 */
    }
    w->n_nd = nd0;
    if (!ok || w->oom) { free(acc.v); free(unc.v); free(sm); return NULL; }
    sm->n_acc = acc.n;
    if (acc.n > v->n_words / 4) {
        sm->bits = calloc((size_t)v->n_words, sizeof(uint32_t));
        if (!sm->bits) { free(acc.v); free(unc.v); free(sm); return NULL; }
        for (int i = 0; i < acc.n; i++) sm->bits[acc.v[i] >> 5] |= 1u << (acc.v[i] & 31);
        free(acc.v);
    } else {
        sm->acc = acc.v;
    }
    sm->n_unc = unc.n;
    sm->unc = unc.v;
    if (unc.n) {
        sm->unc_lcp = malloc(sizeof(uint16_t) * (size_t)unc.n);
        if (!sm->unc_lcp) { free(sm->acc); free(sm->bits); free(unc.v); free(sm); return NULL; }
        for (int k = 0; k < unc.n; k++) {
            int l = 0;
            if (k) {
                int a = unc.v[k - 1], c = unc.v[k];
                int m = v->len[a] < v->len[c] ? v->len[a] : v->len[c];
                const char *x = v->blob + v->off[a], *y = v->blob + v->off[c];
                while (l < m && x[l] == y[l]) l++;
            }
            sm->unc_lcp[k] = (uint16_t)l;
        }
    }
    return sm;
}

static void smask_free(struct smask *sm)
{
    if (!sm) return;
    free(sm->acc); free(sm->bits); free(sm->unc); free(sm->unc_lcp);
    free(sm);
}

static size_t smask_bytes(const struct gram_vocab *v, const struct smask *sm)
{
    return sizeof *sm + (sm->bits ? (size_t)v->n_words * 4 : (size_t)sm->n_acc * 4) +
           (size_t)sm->n_unc * 6;
}

/* The classification of state, computing and publishing it on first use.
 * Past the grammar's GRAM_MASK_BYTES it is computed and not published:
 * *transient is then true and the caller frees it (smask_free). */
static struct smask *get_smask(struct gram *g, struct walker *w, int state, bool *transient)
{
    *transient = false;
    struct smask *sm = atomic_load_explicit(&g->sm[state], memory_order_acquire);
    if (sm) return sm;
    struct smask *mine = classify(w, g->v, state);
    if (!mine) return NULL;
    size_t b = smask_bytes(g->v, mine);
    /* reserved before the publish, so racing threads cannot pass the bound
     * together; given back by the thread that loses the race */
    if (atomic_fetch_add(&g->mask_bytes, b) + b >
        atomic_load_explicit(&g->mask_budget, memory_order_relaxed)) {
        atomic_fetch_sub(&g->mask_bytes, b);
        *transient = true;
        return mine;
    }
    struct smask *expect = NULL;
    if (atomic_compare_exchange_strong(&g->sm[state], &expect, mine))
        return mine;
    atomic_fetch_sub(&g->mask_bytes, b);
    smask_free(mine);
    return expect;
}

/* ------------------------------------------------------------------ */
/* grams                                                               */

static int gram_from_gir(struct gram **out, const struct gram_vocab *v, struct gir *ir, int root,
                         struct rl_err *err)
{
    struct gram *g = calloc(1, sizeof *g);
    if (!g) return rl_errf(err, RL_ENOMEM, "grammar: out of memory");
    int rc = gir_build(ir, root, &g->p, err);
    if (rc) { free(g); return rc; }
    atomic_init(&g->refs, 1);
    atomic_init(&g->mask_bytes, 0);
    atomic_init(&g->mask_budget, GRAM_MASK_BYTES);
    g->v = v;
    g->sm = calloc((size_t)g->p.n_st, sizeof(*g->sm));
    g->call_off = calloc((size_t)g->p.n_rules + 1, sizeof(int32_t));
    g->call_ret = malloc(sizeof(int32_t) * (size_t)(g->p.n_refs + 1));
    g->fixed_bytes = sizeof *g + (size_t)g->p.n_st * (sizeof(struct gstate) + sizeof(*g->sm)) +
                     (size_t)g->p.n_refs * (sizeof(struct gref) + 4) +
                     (size_t)g->p.n_rules * 8 + 8;
    if (!g->sm || !g->call_off || !g->call_ret) {
        gram_unref(g);
        return rl_errf(err, RL_ENOMEM, "grammar: out of memory");
    }
    /* callers by rule: only the refs of states that survived the trim */
    for (int s = 0; s < g->p.n_st; s++)
        for (int i = 0; i < g->p.st[s].n_ref; i++) g->call_off[g->p.refs[g->p.st[s].ref_off + i].rule + 1]++;
    for (int r = 0; r < g->p.n_rules; r++) g->call_off[r + 1] += g->call_off[r];
    {
        int32_t *fill = calloc((size_t)g->p.n_rules + 1, sizeof(int32_t));
        if (!fill) { gram_unref(g); return rl_errf(err, RL_ENOMEM, "grammar: out of memory"); }
        for (int s = 0; s < g->p.n_st; s++)
            for (int i = 0; i < g->p.st[s].n_ref; i++) {
                const struct gref *r = &g->p.refs[g->p.st[s].ref_off + i];
                g->call_ret[g->call_off[r->rule] + fill[r->rule]++] = r->ret;
            }
        free(fill);
    }
    /* classify the states a configuration can stop in: byte targets and
     * the root's start, breadth-first from the root, up to GRAM_EAGER */
    struct walker w;
    char *seen = calloc((size_t)g->p.n_st, 1);
    int *q = malloc(sizeof(int) * (size_t)g->p.n_st);
    if (!seen || !q || walker_init(&w, g)) {
        free(seen); free(q); walker_fini(&w); gram_unref(g);
        return rl_errf(err, RL_ENOMEM, "grammar: out of memory");
    }
    int qh = 0, qt = 0, done = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    int s0 = g->p.rule_start[root];
    seen[s0] = 1; q[qt++] = s0;
    while (qh < qt) {
        int s = q[qh++];
        if (s == s0 || true) {
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
            double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
            if (done < GRAM_EAGER && ms < GRAM_EAGER_MS) {
                bool transient;
                struct smask *sm = get_smask(g, &w, s, &transient);
                if (!sm) {
                    free(seen); free(q); walker_fini(&w); gram_unref(g);
                    return rl_errf(err, RL_ENOMEM, "grammar: out of memory");
                }
                if (transient) { /* the grammar's mask memory is spent */
                    smask_free(sm);
                    done = GRAM_EAGER;
                }
                done++;
            }
        }
        const struct gstate *st = &g->p.st[s];
        for (int c = 0; c < 256; c++) {
            int t = st->next[c];
            if (t >= 0 && !seen[t]) { seen[t] = 1; q[qt++] = t; }
        }
        /* byte targets inside called rules and after returns */
        for (int i = 0; i < st->n_ref; i++) {
            const struct gref *r = &g->p.refs[st->ref_off + i];
            int rs = g->p.rule_start[r->rule];
            /* rule starts and return states are not stop states
             * themselves, but their byte targets are */
            int pend[2] = {rs, r->ret};
            for (int k = 0; k < 2; k++) {
                const struct gstate *x = &g->p.st[pend[k]];
                for (int c = 0; c < 256; c++) {
                    int t = x->next[c];
                    if (t >= 0 && !seen[t]) { seen[t] = 1; q[qt++] = t; }
                }
                if (!seen[pend[k]] && (x->n_ref || x->final)) {
                    /* walk through it for its callees, without classifying */
                    seen[pend[k]] = 2;
                    q[qt++] = pend[k];
                }
            }
        }
    }
    (void)done;
    free(seen); free(q); walker_fini(&w);
    *out = g;
    return 0;
}

struct gram *gram_ref(struct gram *g)
{
    atomic_fetch_add(&g->refs, 1);
    return g;
}

void gram_unref(struct gram *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    for (int i = 0; g->sm && i < g->p.n_st; i++)
        smask_free(atomic_load(&g->sm[i]));
    free(g->sm);
    free(g->call_off); free(g->call_ret);
    gpda_fini(&g->p);
    free(g);
}

void gram_set_mask_budget(struct gram *g, size_t bytes)
{
    atomic_store(&g->mask_budget, bytes);
}

size_t gram_bytes(const struct gram *g)
{
    return g->fixed_bytes + atomic_load_explicit(&g->mask_bytes, memory_order_relaxed);
}

uint64_t gram_hash(const char *kind, const char *src, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *k = kind ? kind : ""; *k; k++) { h ^= (uint8_t)*k; h *= 1099511628211ull; }
    h ^= 0xff; h *= 1099511628211ull;
    for (size_t i = 0; i < len; i++) { h ^= (uint8_t)src[i]; h *= 1099511628211ull; }
    return h;
}

static int compile_text(struct gram **out, const struct gram_vocab *v, const char *src, size_t len,
                        const char *what, struct rl_err *err)
{
    struct gir ir;
    gir_init(&ir);
    ir.what = what;
    int root = -1;
    int rc = gir_parse_ebnf(&ir, src, len, &root, err);
    if (!rc) rc = gram_from_gir(out, v, &ir, root, err);
    gir_fini(&ir);
    return rc;
}

int gram_compile_ebnf(struct gram **out, const struct gram_vocab *v, const char *src, size_t len,
                      struct rl_err *err)
{
    *out = NULL;
    if (!v || (!src && len))
        return rl_errf(err, RL_EINVAL, "gram_compile_ebnf: bad arguments");
    if (len > GRAM_MAX_SOURCE)
        return rl_errf(err, EV_CODE_BAD_PARAM, "grammar is %zu bytes; the limit is %d", len, GRAM_MAX_SOURCE);
    return compile_text(out, v, src, len, "grammar", err);
}

/* Schema texts become EBNF (schema.c); a failure of that EBNF is ours. */
static int compile_generated(struct gram **out, const struct gram_vocab *v, int rc, char *ebnf,
                             const char *what, struct rl_err *err)
{
    if (rc) return rc;
    struct rl_err e2 = {0};
    rc = compile_text(out, v, ebnf, strlen(ebnf), what, &e2);
    free(ebnf);
    if (rc && e2.code != EV_CODE_BAD_PARAM)
        return rl_errf(err, e2.code, "%s", e2.msg);
    if (rc && !strncmp(e2.msg, "grammar ", 8) && e2.msg[8] >= '0' && e2.msg[8] <= '9') /* a parse error of generated text: a bug */
        return rl_errf(err, RL_EINTERNAL, "%s: generated grammar: %s", what, e2.msg);
    if (rc)
        return rl_errf(err, e2.code, "%s", e2.msg);
    return 0;
}

int gram_compile_json_schema(struct gram **out, const struct gram_vocab *v, const char *schema_json,
                             size_t len, struct rl_err *err)
{
    *out = NULL;
    if (!v || !schema_json)
        return rl_errf(err, RL_EINVAL, "gram_compile_json_schema: bad arguments");
    char *ebnf = NULL;
    int rc = gschema_to_ebnf(schema_json, len, &ebnf, err);
    return compile_generated(out, v, rc, ebnf, "schema", err);
}

int gram_compile_json_object(struct gram **out, const struct gram_vocab *v, struct rl_err *err)
{
    *out = NULL;
    char *ebnf = NULL;
    int rc = gschema_object_ebnf(&ebnf, err);
    return compile_generated(out, v, rc, ebnf, "schema", err);
}

int gram_compile_tool_call(struct gram **out, const struct gram_vocab *v, const char *tools_json,
                           size_t len, const char *name, struct rl_err *err)
{
    *out = NULL;
    if (!v || !tools_json)
        return rl_errf(err, RL_EINVAL, "gram_compile_tool_call: bad arguments");
    char *ebnf = NULL;
    int rc = gschema_tool_ebnf(tools_json, len, name, &ebnf, err);
    return compile_generated(out, v, rc, ebnf, "tools", err);
}

/* ------------------------------------------------------------------ */
/* matcher                                                             */

/* Appends a history entry for the configurations nx (closure computed at
 * depth 0 of the walker for the flags). */
static int hist_push(struct gram_match *m, const struct cfg *nx, int k, bool eos)
{
    if (m->n_h == m->cap_h) {
        int nc = m->cap_h ? m->cap_h * 2 : 64;
        void *a = realloc(m->h, sizeof(struct hent) * (size_t)nc);
        if (!a) return -RL_ENOMEM;
        m->h = a; m->cap_h = nc;
    }
    while (m->n_hc + k > m->cap_hc) {
        int nc = m->cap_hc ? m->cap_hc * 2 : 256;
        void *a = realloc(m->hc, sizeof(struct cfg) * (size_t)nc);
        if (!a) return -RL_ENOMEM;
        m->hc = a; m->cap_hc = nc;
    }
    if (k) memcpy(m->hc + m->n_hc, nx, sizeof(struct cfg) * (size_t)k);
    struct hent e = {m->n_hc, k, 0, 0, 0, eos};
    m->n_hc += k;
    if (!eos) {
        int mark = m->w.n_nd;
        closure_at(&m->w, 0, nx, k);
        e.complete = m->w.end[0];
        bool any = false;
        for (int i = 0; i < m->w.n[0] && !any; i++) any = m->g->p.st[m->w.pool[i].st].has_byte;
        e.done = e.complete && !any;
        m->w.n_nd = mark; /* closure frames are scratch */
    } else {
        e.complete = e.done = 1;
    }
    e.n_nd = m->w.n_nd;
    m->h[m->n_h++] = e;
    return 0;
}

int gram_match_create(struct gram_match **out, struct gram *g, struct rl_err *err)
{
    *out = NULL;
    struct gram_match *m = calloc(1, sizeof *m);
    if (!m) return rl_errf(err, RL_ENOMEM, "gram_match_create: out of memory");
    if (walker_init(&m->w, g)) {
        walker_fini(&m->w); free(m);
        return rl_errf(err, RL_ENOMEM, "gram_match_create: out of memory");
    }
    m->g = gram_ref(g);
    struct cfg c0 = {g->p.rule_start[g->p.root], ROOTF};
    if (hist_push(m, &c0, 1, false)) {
        gram_match_free(m);
        return rl_errf(err, RL_ENOMEM, "gram_match_create: out of memory");
    }
    *out = m;
    return 0;
}

void gram_match_free(struct gram_match *m)
{
    if (!m) return;
    walker_fini(&m->w);
    free(m->hc); free(m->h);
    gram_unref(m->g);
    free(m);
}

static const struct hent *top(const struct gram_match *m) { return &m->h[m->n_h - 1]; }

int gram_match_mask(struct gram_match *m, uint32_t *mask)
{
    const struct gram_vocab *v = m->g->v;
    const struct hent *e = top(m);
    memset(mask, 0, sizeof(uint32_t) * (size_t)v->n_words);
    if (e->complete)
        for (int i = 0; i < v->n_eos; i++) mask[v->eos[i] >> 5] |= 1u << (v->eos[i] & 31);
    if (e->eos) return 0;
    const struct cfg *cur = m->hc + e->cfg_off;
    int n = e->n_cfg;
    struct walker *w = &m->w;
    int mark = w->n_nd;
    struct smask *sms[MAX_CFG];
    bool transient[MAX_CFG];
    int ns = 0;
    for (int i = 0; i < n; i++) {
        bool dup = false;
        for (int j = 0; j < i; j++) dup |= cur[j].st == cur[i].st;
        if (dup) continue;
        struct smask *sm = get_smask(m->g, w, cur[i].st, &transient[ns]);
        if (!sm) continue; /* out of memory: fewer tokens, never wrong ones */
        sms[ns++] = sm;
        if (sm->bits) {
            for (int k = 0; k < v->n_words; k++) mask[k] |= sm->bits[k];
        } else {
            for (int k = 0; k < sm->n_acc; k++) mask[sm->acc[k] >> 5] |= 1u << (sm->acc[k] & 31);
        }
    }
    /* the uncertain ones: walk them from the real configurations */
    bool closed = false;
    for (int s = 0; s < ns; s++) {
        const struct smask *sm = sms[s];
        int valid = 0, run_lcp = 0x7fffffff;
        for (int k = 0; k < sm->n_unc; k++) {
            int t = sm->unc[k];
            int32_t id = v->ids[t];
            if (k) run_lcp = sm->unc_lcp[k] < run_lcp ? sm->unc_lcp[k] : run_lcp;
            if (mask[id >> 5] >> (id & 31) & 1) continue;
            if (!closed) { w->esc_any[0] = 0; closure_at(w, 0, cur, n); closed = true; }
            int d = run_lcp < valid ? run_lcp : valid;
            run_lcp = 0x7fffffff;
            w->n_nd = w->nd_mark[d];
            int len = v->len[t];
            const uint8_t *b = (const uint8_t *)v->blob + v->off[t];
            while (d < len && w->n[d] > 0) { step_at(w, d, b[d]); d++; }
            valid = d;
            if (d == len && w->n[d] > 0) mask[id >> 5] |= 1u << (id & 31);
        }
        /* the next list starts from scratch: its lcps are its own */
        if (closed) { w->n_nd = w->nd_mark[0]; }
    }
    w->n_nd = mark;
    for (int s = 0; s < ns; s++)
        if (transient[s]) smask_free(sms[s]);
    return 0;
}

int gram_match_accept(struct gram_match *m, int32_t id, struct rl_err *err)
{
    const struct gram_vocab *v = m->g->v;
    const struct hent *e = top(m);
    if (id < 0 || id >= v->n_vocab)
        return rl_errf(err, RL_EINVAL, "grammar: token %d is outside the vocabulary", id);
    if (e->eos)
        return rl_errf(err, RL_EINVAL, "grammar: token %d after the end of the document", id);
    for (int i = 0; i < v->n_eos; i++)
        if (v->eos[i] == id) {
            if (!e->complete)
                return rl_errf(err, RL_EINVAL, "grammar: end of text before the document is complete");
            if (hist_push(m, NULL, 0, true)) return rl_errf(err, RL_ENOMEM, "grammar: out of memory");
            return 0;
        }
    int t = v->order[id];
    if (t < 0)
        return rl_errf(err, RL_EINVAL, "grammar: token %d (special) is not allowed in the document", id);
    struct walker *w = &m->w;
    int mark = w->n_nd;
    w->esc_any[0] = 0;
    closure_at(w, 0, m->hc + e->cfg_off, e->n_cfg);
    int len = v->len[t];
    const uint8_t *b = (const uint8_t *)v->blob + v->off[t];
    int d = 0;
    while (d < len - 1 && w->n[d] > 0) { step_at(w, d, b[d]); d++; }
    /* the last byte by hand: the new state is the configurations it gives,
     * before their closure (what the per-state classes are keyed by);
     * frames made on the way stay in the arena */
    int k = d == len - 1 && w->n[d] > 0 && !w->oom ? step_raw(w, d, b[d], m->tmp) : 0;
    if (!k) {
        w->n_nd = mark;
        return rl_errf(err, RL_EINVAL, "grammar: token %d does not continue the document here", id);
    }
    int rc = hist_push(m, m->tmp, k, false);
    if (rc) { w->n_nd = mark; return rl_errf(err, RL_ENOMEM, "grammar: out of memory"); }
    return 0;
}

int gram_match_rollback(struct gram_match *m, int n_tokens)
{
    if (n_tokens < 0 || n_tokens >= m->n_h) return -RL_EINVAL;
    m->n_h -= n_tokens;
    const struct hent *e = top(m);
    m->n_hc = e->cfg_off + e->n_cfg;
    m->w.n_nd = e->n_nd;
    return 0;
}

bool gram_match_complete(const struct gram_match *m) { return top(m)->complete; }
bool gram_match_done(const struct gram_match *m) { return top(m)->done; }
