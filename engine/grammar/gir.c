/* engine/grammar/gir.c - the grammar IR builder and the automaton builder.
 *
 * Builder: expressions live in one growable array and refer to each other
 * by index, so a grammar is a plain value that is freed in one go.
 *
 * gir_build(), in order:
 *   1. every referenced rule must be defined;
 *   2. each rule body -> Thompson NFA (byte-set, rule-call and epsilon
 *      edges; counted repetition is expanded into copies, bounded by
 *      GIR_MAX_NFA) -> subset construction into DFA states that keep, per
 *      state, a 256-entry byte table and a list of rule calls (rule, return
 *      state). Calls are determinised per rule like bytes are;
 *   3. productivity / liveness fixpoint: a state is live when the rule can
 *      still be finished from it; dead transitions and calls of rules that
 *      match nothing are removed, so a matcher can never walk into a state
 *      it cannot leave. A root that matches nothing is refused ("no string
 *      satisfies");
 *   4. left recursion (a rule that can call itself before consuming a
 *      byte) is refused: the matcher's closure would not terminate;
 * (Tokens that leave a rule are settled by the matcher against the rule's
 * callers, grammar.c, so no FOLLOW sets are needed.)
 * Nothing here recurses on the C stack except over an expression tree,
 * whose depth the parsers bound. Runs at compile time only, on the caller's
 * thread. */
#include "gir.h"

#include <stdlib.h>
#include <string.h>

#include "event.h"

#define GROW(ptr, n, cap, oomflag)                                              \
    do {                                                                        \
        if ((n) >= (cap)) {                                                     \
            int nc_ = (cap) ? (cap) * 2 : 64;                                   \
            void *np_ = realloc((ptr), (size_t)nc_ * sizeof(*(ptr)));           \
            if (!np_) { (oomflag) = true; break; }                              \
            (ptr) = np_;                                                        \
            (cap) = nc_;                                                        \
        }                                                                       \
    } while (0)

static int add_ex(struct gir *g, struct gx x)
{
    if (g->oom)
        return 0;
    bool oom = false;
    GROW(g->ex, g->n_ex, g->cap_ex, oom);
    if (oom) { g->oom = true; return 0; }
    g->ex[g->n_ex] = x;
    return g->n_ex++;
}

void gir_init(struct gir *g)
{
    memset(g, 0, sizeof *g);
    add_ex(g, (struct gx){.kind = GX_NOTHING});
    add_ex(g, (struct gx){.kind = GX_EMPTY});
}

void gir_fini(struct gir *g)
{
    for (int i = 0; i < g->n_rules; i++)
        free(g->rules[i].name);
    free(g->ex); free(g->kids); free(g->sets); free(g->rules);
    memset(g, 0, sizeof *g);
}

int gir_bytes(struct gir *g, const uint32_t set[8])
{
    bool any = false;
    for (int i = 0; i < 8; i++)
        any |= set[i] != 0;
    if (!any)
        return 0;
    if (g->oom)
        return 0;
    bool oom = false;
    GROW(g->sets, g->n_sets, g->cap_sets, oom);
    if (oom) { g->oom = true; return 0; }
    memcpy(g->sets[g->n_sets], set, 32);
    return add_ex(g, (struct gx){.kind = GX_BYTES, .a = g->n_sets++});
}

int gir_byte(struct gir *g, uint8_t c)
{
    uint32_t s[8] = {0};
    s[c >> 5] |= 1u << (c & 31);
    return gir_bytes(g, s);
}

static int add_list(struct gir *g, int kind, const int *kids, int n)
{
    if (g->oom)
        return 0;
    int off = g->n_kids;
    for (int i = 0; i < n; i++) {
        bool oom = false;
        GROW(g->kids, g->n_kids, g->cap_kids, oom);
        if (oom) { g->oom = true; return 0; }
        g->kids[g->n_kids++] = kids[i];
    }
    return add_ex(g, (struct gx){.kind = kind, .n = n, .kids = off});
}

int gir_seq(struct gir *g, const int *kids, int n)
{
    for (int i = 0; i < n; i++)
        if (kids[i] == 0)
            return 0; /* nothing in a sequence: nothing */
    if (n == 0)
        return 1;
    if (n == 1)
        return kids[0];
    return add_list(g, GX_SEQ, kids, n);
}

int gir_alt(struct gir *g, const int *kids, int n)
{
    if (n == 0)
        return 0;
    if (n == 1)
        return kids[0];
    return add_list(g, GX_ALT, kids, n);
}

int gir_rep(struct gir *g, int e, int min, int max)
{
    if (max == 0 || e == 1)
        return 1;
    if (min == 1 && max == 1)
        return e;
    if (e == 0)
        return min == 0 ? 1 : 0;
    return add_ex(g, (struct gx){.kind = GX_REP, .a = min, .b = max, .kids = e});
}

int gir_ref(struct gir *g, int rule)
{
    return add_ex(g, (struct gx){.kind = GX_REF, .a = rule});
}

int gir_lit(struct gir *g, const char *s, size_t len)
{
    int k[64];
    int acc = 1;
    size_t i = 0;
    while (i < len) {
        int n = 0;
        for (; n < 64 && i < len; n++, i++)
            k[n] = gir_byte(g, (uint8_t)s[i]);
        int part = gir_seq(g, k, n);
        int two[2] = {acc, part};
        acc = acc == 1 ? part : gir_seq(g, two, 2);
    }
    return acc;
}

/* UTF-8 of a code point range: split by encoded length, then by the
 * leading bytes, as RE2 does (each piece a sequence of byte ranges). */
static int range_bytes(struct gir *g, uint8_t lo, uint8_t hi)
{
    uint32_t s[8] = {0};
    for (int c = lo; c <= hi; c++)
        s[c >> 5] |= 1u << (c & 31);
    return gir_bytes(g, s);
}

static void enc(uint32_t c, uint8_t *b, int n)
{
    if (n == 1) { b[0] = (uint8_t)c; return; }
    for (int i = n - 1; i > 0; i--) { b[i] = (uint8_t)(0x80 | (c & 0x3f)); c >>= 6; }
    b[0] = (uint8_t)((n == 2 ? 0xc0 : n == 3 ? 0xe0 : 0xf0) | c);
}

/* lo..hi of one encoded length n, as alternatives. */
static int split_same(struct gir *g, uint32_t lo, uint32_t hi, int n)
{
    if (n == 1)
        return range_bytes(g, (uint8_t)lo, (uint8_t)hi);
    /* split so that all but the first byte span full continuation ranges */
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                int a = split_same(g, lo, lo | m, n);
                int b = split_same(g, (lo | m) + 1, hi, n);
                int k[2] = {a, b};
                return gir_alt(g, k, 2);
            }
            if ((hi & m) != m) {
                int a = split_same(g, lo, (hi & ~m) - 1, n);
                int b = split_same(g, hi & ~m, hi, n);
                int k[2] = {a, b};
                return gir_alt(g, k, 2);
            }
        }
    }
    uint8_t a[4], b[4];
    enc(lo, a, n);
    enc(hi, b, n);
    int k[4];
    for (int i = 0; i < n; i++)
        k[i] = range_bytes(g, a[i], b[i]);
    return gir_seq(g, k, n);
}

int gir_cprange(struct gir *g, uint32_t lo, uint32_t hi)
{
    if (hi > 0x10ffff)
        hi = 0x10ffff;
    if (lo > hi)
        return 0;
    if (lo <= 0xdfff && hi >= 0xd800) { /* no surrogates in UTF-8 */
        int k[2] = {lo < 0xd800 ? gir_cprange(g, lo, 0xd7ff) : 0,
                    hi > 0xdfff ? gir_cprange(g, 0xe000, hi) : 0};
        int alts[2], n = 0;
        for (int i = 0; i < 2; i++)
            if (k[i]) alts[n++] = k[i];
        return gir_alt(g, alts, n);
    }
    static const uint32_t top[4] = {0x7f, 0x7ff, 0xffff, 0x10ffff};
    int alts[4], n = 0;
    uint32_t start = 0;
    for (int len = 1; len <= 4; len++) {
        uint32_t a = lo > start ? lo : start, b = hi < top[len - 1] ? hi : top[len - 1];
        if (a <= b)
            alts[n++] = split_same(g, a, b, len);
        start = top[len - 1] + 1;
    }
    return gir_alt(g, alts, n);
}

static int cmp_range(const void *a, const void *b)
{
    const struct gir_range *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

int gir_ranges_norm(struct gir_range *r, int n)
{
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[i].lo <= r[m - 1].hi + 1) { if (r[i].hi > r[m - 1].hi) r[m - 1].hi = r[i].hi; }
        else r[m++] = r[i];
    }
    return m;
}

int gir_ranges_neg(struct gir_range *r, int n, struct gir_range *out)
{
    n = gir_ranges_norm(r, n);
    int k = 0;
    uint32_t next = 0;
    for (int i = 0; i < n; i++) {
        if (r[i].lo > next) out[k++] = (struct gir_range){next, r[i].lo - 1};
        next = r[i].hi + 1;
    }
    if (next <= 0x10ffff) out[k++] = (struct gir_range){next, 0x10ffff};
    return k;
}

int gir_rule(struct gir *g, const char *name, size_t len, int line, int col)
{
    for (int i = 0; i < g->n_rules; i++)
        if (strlen(g->rules[i].name) == len && !memcmp(g->rules[i].name, name, len))
            return i;
    if (g->oom)
        return -1;
    bool oom = false;
    GROW(g->rules, g->n_rules, g->cap_rules, oom);
    char *nm = oom ? NULL : strndup(name, len);
    if (!nm) { g->oom = true; return -1; }
    g->rules[g->n_rules] = (struct gir_rule){.name = nm, .expr = -1, .line = line, .col = col};
    return g->n_rules++;
}

/* ---- NFA ---- */
enum { N_EPS, N_BYTES, N_REF, N_MATCH };
struct nnode { int kind, arg, out1, out2; };
struct nfa { struct nnode *n; int len, cap; bool oom, big; };

static int nnew(struct nfa *f, int kind, int arg)
{
    if (f->len >= GIR_MAX_NFA) { f->big = true; return 0; }
    bool oom = false;
    GROW(f->n, f->len, f->cap, oom);
    if (oom) { f->oom = true; return 0; }
    f->n[f->len] = (struct nnode){kind, arg, -1, -1};
    return f->len++;
}

/* Emits e between fresh states; *in gets the entry, *out the exit (an
 * N_EPS with a free out1). Returns false on failure. */
static bool emit(const struct gir *g, struct nfa *f, int e, int *in, int *out)
{
    const struct gx *x = &g->ex[e];
    int a, b;
    switch (x->kind) {
    case GX_NOTHING: /* an entry with no way out */
        *in = nnew(f, N_EPS, 0);
        *out = nnew(f, N_EPS, 0);
        break;
    case GX_EMPTY:
        *in = *out = nnew(f, N_EPS, 0);
        break;
    case GX_BYTES:
    case GX_REF:
        *in = nnew(f, x->kind == GX_BYTES ? N_BYTES : N_REF, x->a);
        *out = nnew(f, N_EPS, 0);
        if (!f->oom && !f->big)
            f->n[*in].out1 = *out;
        break;
    case GX_SEQ: {
        int cur_out = -1;
        for (int i = 0; i < x->n; i++) {
            if (!emit(g, f, g->kids[x->kids + i], &a, &b))
                return false;
            if (i == 0) *in = a;
            else f->n[cur_out].out1 = a;
            cur_out = b;
        }
        *out = cur_out;
        break;
    }
    case GX_ALT: {
        /* a chain of binary splits */
        int join = nnew(f, N_EPS, 0), prev = -1;
        for (int i = 0; i < x->n; i++) {
            int s = nnew(f, N_EPS, 0);
            if (!emit(g, f, g->kids[x->kids + i], &a, &b))
                return false;
            f->n[s].out1 = a;
            f->n[b].out1 = join;
            if (i == 0) *in = s;
            else f->n[prev].out2 = s;
            prev = s;
        }
        *out = join;
        break;
    }
    case GX_REP: {
        int start = nnew(f, N_EPS, 0), cur = start;
        if (f->oom || f->big) return false;
        for (int i = 0; i < x->a; i++) {
            if (!emit(g, f, x->kids, &a, &b)) return false;
            f->n[cur].out1 = a;
            cur = b;
        }
        if (x->b < 0) { /* loop: cur -> (body -> cur) | exit */
            int loop = nnew(f, N_EPS, 0), exit = nnew(f, N_EPS, 0);
            if (!emit(g, f, x->kids, &a, &b)) return false;
            f->n[cur].out1 = loop;
            f->n[loop].out1 = a;
            f->n[loop].out2 = exit;
            f->n[b].out1 = loop;
            cur = exit;
        } else {
            int exit = nnew(f, N_EPS, 0);
            for (int i = x->a; i < x->b; i++) {
                int split = nnew(f, N_EPS, 0);
                if (!emit(g, f, x->kids, &a, &b)) return false;
                f->n[cur].out1 = split;
                f->n[split].out1 = a;
                f->n[split].out2 = exit;
                cur = b;
            }
            f->n[cur].out1 = exit;
            cur = exit;
        }
        *in = start;
        *out = cur;
        break;
    }
    }
    return !f->oom && !f->big;
}

/* ---- subset construction ---- */
struct dset { int *v; int n; uint64_t h; };
struct dfab {
    const uint32_t (*sets_in)[8]; /* the gir's byte sets */
    struct gpda *p; int cap_st, cap_refs;
    struct dset *sets; int cap_sets;
    int *tab; int tab_cap; /* open addressing, state ids + 1 */
    bool oom, big;
};

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Epsilon closure of v (n), sorted and unique, in a malloc'd array. */
static int *closure(const struct nfa *f, const int *v, int n, int *n_out, char *mark, int *stack)
{
    int *out = stack + f->len; /* scratch: the second half of stack */
    int no = 0, sp = 0;
    for (int i = 0; i < n; i++)
        if (!mark[v[i]]) { mark[v[i]] = 1; stack[sp++] = v[i]; }
    while (sp) {
        int s = stack[--sp];
        out[no++] = s;
        if (f->n[s].kind == N_EPS) {
            int o[2] = {f->n[s].out1, f->n[s].out2};
            for (int k = 0; k < 2; k++)
                if (o[k] >= 0 && !mark[o[k]]) { mark[o[k]] = 1; stack[sp++] = o[k]; }
        }
    }
    for (int i = 0; i < no; i++) mark[out[i]] = 0;
    qsort(out, (size_t)no, sizeof(int), cmp_int);
    /* keep only the states that matter: byte, ref and match nodes */
    int m = 0;
    for (int i = 0; i < no; i++)
        if (f->n[out[i]].kind != N_EPS) out[m++] = out[i];
    *n_out = m;
    int *res = malloc(sizeof(int) * (size_t)(m ? m : 1));
    if (res) memcpy(res, out, sizeof(int) * (size_t)m);
    return res;
}

static uint64_t hash_set(const int *v, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) { h ^= (uint64_t)(unsigned)v[i]; h *= 1099511628211ull; }
    return h ^ (uint64_t)n;
}

/* Interns the set (takes ownership of v), returns its state id or -1. */
static int intern(struct dfab *d, int *v, int n, int rule)
{
    uint64_t h = hash_set(v, n);
    struct gpda *p = d->p;
    if (p->n_st * 2 >= d->tab_cap) {
        int nc = d->tab_cap ? d->tab_cap * 2 : 1024;
        int *nt = calloc((size_t)nc, sizeof(int));
        if (!nt) { d->oom = true; free(v); return -1; }
        for (int i = 0; i < p->n_st; i++) {
            size_t j = d->sets[i].h & (size_t)(nc - 1);
            while (nt[j]) j = (j + 1) & (size_t)(nc - 1);
            nt[j] = i + 1;
        }
        free(d->tab);
        d->tab = nt;
        d->tab_cap = nc;
    }
    size_t j = h & (size_t)(d->tab_cap - 1);
    while (d->tab[j]) {
        int id = d->tab[j] - 1;
        if (d->sets[id].h == h && d->sets[id].n == n && p->st[id].rule == rule &&
            !memcmp(d->sets[id].v, v, sizeof(int) * (size_t)n)) {
            free(v);
            return id;
        }
        j = (j + 1) & (size_t)(d->tab_cap - 1);
    }
    if (p->n_st >= GIR_MAX_STATES) { d->big = true; free(v); return -1; }
    if (p->n_st >= d->cap_st) {
        int nc = d->cap_st ? d->cap_st * 2 : 256;
        void *a = realloc(p->st, sizeof(struct gstate) * (size_t)nc);
        if (!a) { d->oom = true; free(v); return -1; }
        p->st = a;
        void *b = realloc(d->sets, sizeof(struct dset) * (size_t)nc);
        if (!b) { d->oom = true; free(v); return -1; }
        d->sets = b;
        d->cap_st = nc;
    }
    int id = p->n_st++;
    d->sets[id] = (struct dset){v, n, h};
    struct gstate *s = &p->st[id];
    memset(s, 0, sizeof *s);
    memset(s->next, 0xff, sizeof s->next);
    s->rule = rule;
    s->ref_off = -1;
    d->tab[j] = id + 1;
    return id;
}

static int add_ref(struct dfab *d, struct gref r)
{
    struct gpda *p = d->p;
    if (p->n_refs >= d->cap_refs) {
        int nc = d->cap_refs ? d->cap_refs * 2 : 256;
        void *a = realloc(p->refs, sizeof(struct gref) * (size_t)nc);
        if (!a) { d->oom = true; return -1; }
        p->refs = a;
        d->cap_refs = nc;
    }
    p->refs[p->n_refs] = r;
    return p->n_refs++;
}

/* Determinises the NFA of one rule from its entry; states are appended. */
static int determinise(struct dfab *d, const struct nfa *f, int entry, int rule)
{
    char *mark = calloc((size_t)f->len, 1);
    int *stack = malloc(sizeof(int) * 2 * (size_t)f->len);
    int *tmp = malloc(sizeof(int) * 2 * (size_t)f->len), *prev = NULL;
    int n_prev = -1, t_prev = -1;
    int first = d->p->n_st, ret = -1;
    if (!mark || !stack || !tmp) { d->oom = true; goto out; }
    prev = tmp + f->len; /* not before the check: NULL + len is undefined */
    int n;
    int *v = closure(f, &entry, 1, &n, mark, stack);
    if (!v) { d->oom = true; goto out; }
    ret = intern(d, v, n, rule);
    if (ret < 0) goto out;
    for (int s = first; s < d->p->n_st; s++) {
        const struct dset *ds = &d->sets[s];
        n_prev = -1;
        /* bytes: group by target set; one closure per distinct byte column */
        for (int c = 0; c < 256; c++) {
            int m = 0;
            for (int i = 0; i < ds->n; i++) {
                const struct nnode *nn = &f->n[ds->v[i]];
                if (nn->kind == N_BYTES) {
                    if (d->sets_in[nn->arg][c >> 5] >> (c & 31) & 1)
                        tmp[m++] = nn->out1;
                }
            }
            if (!m) continue;
            /* same as the previous byte's column? reuse its target */
            if (m == n_prev && !memcmp(tmp, prev, sizeof(int) * (size_t)m)) {
                d->p->st[s].next[c] = t_prev;
                d->p->st[s].has_byte = 1;
                continue;
            }
            int *cv = closure(f, tmp, m, &n, mark, stack);
            if (!cv) { d->oom = true; ret = -1; goto out; }
            int t = intern(d, cv, n, rule);
            if (t < 0) { ret = -1; goto out; }
            d->p->st[s].next[c] = t;
            d->p->st[s].has_byte = 1;
            ds = &d->sets[s];
            memcpy(prev, tmp, sizeof(int) * (size_t)m);
            n_prev = m;
            t_prev = t;
        }
        /* calls: group by rule */
        int off = -1, cnt = 0;
        for (int i = 0; i < ds->n; i++) {
            const struct nnode *nn = &f->n[ds->v[i]];
            if (nn->kind == N_MATCH) d->p->st[s].final = 1;
            if (nn->kind != N_REF) continue;
            bool seen = false;
            for (int j = 0; j < i; j++)
                if (f->n[ds->v[j]].kind == N_REF && f->n[ds->v[j]].arg == nn->arg) seen = true;
            if (seen) continue;
            int m = 0;
            for (int j = i; j < ds->n; j++)
                if (f->n[ds->v[j]].kind == N_REF && f->n[ds->v[j]].arg == nn->arg)
                    tmp[m++] = f->n[ds->v[j]].out1;
            int *cv = closure(f, tmp, m, &n, mark, stack);
            if (!cv) { d->oom = true; ret = -1; goto out; }
            int t = intern(d, cv, n, rule);
            if (t < 0) { ret = -1; goto out; }
            int r = add_ref(d, (struct gref){nn->arg, t, 0});
            if (r < 0) { ret = -1; goto out; }
            if (off < 0) off = r;
            cnt++;
            ds = &d->sets[s];
        }
        d->p->st[s].ref_off = off < 0 ? 0 : off;
        d->p->st[s].n_ref = (uint16_t)cnt;
    }
out:
    free(mark); free(stack); free(tmp);
    return ret;
}

void gpda_fini(struct gpda *p)
{
    free(p->st); free(p->refs); free(p->rule_start);
    memset(p, 0, sizeof *p);
}

int gir_build(const struct gir *g, int root, struct gpda *out, struct rl_err *err)
{
    memset(out, 0, sizeof *out);
    if (g->oom)
        return rl_errf(err, RL_ENOMEM, "grammar: out of memory");
    if (g->n_rules > GIR_MAX_RULES)
        return rl_errf(err, EV_CODE_BAD_PARAM, "grammar has %d rules; the limit is %d",
                       g->n_rules, GIR_MAX_RULES);
    for (int i = 0; i < g->n_rules; i++)
        if (g->rules[i].expr < 0)
            return rl_errf(err, EV_CODE_BAD_PARAM, "%d:%d: rule '%s' is used but not defined",
                           g->rules[i].line, g->rules[i].col, g->rules[i].name);
    struct gpda *p = out;
    struct dfab d = {.p = p};
    struct nfa f = {0};
    int rc = 0;
    p->n_rules = g->n_rules;
    p->root = root;
    p->rule_start = malloc(sizeof(int32_t) * (size_t)g->n_rules);
    char *prod = calloc((size_t)g->n_rules, 1);
    if (!p->rule_start || !prod) { rc = rl_errf(err, RL_ENOMEM, "grammar: out of memory"); goto done; }
    d.sets_in = (const uint32_t (*)[8])g->sets;
    for (int r = 0; r < g->n_rules; r++) {
        f.len = 0;
        int in, o;
        bool ok = emit(g, &f, g->rules[r].expr, &in, &o);
        if (ok) {
            int m = nnew(&f, N_MATCH, 0);
            if (!f.oom && !f.big) f.n[o].out1 = m;
        }
        if (f.big) { rc = rl_errf(err, EV_CODE_BAD_PARAM, "rule '%s' is too large (over %d automaton states)", g->rules[r].name, GIR_MAX_NFA); goto done; }
        if (f.oom || !ok) { rc = rl_errf(err, RL_ENOMEM, "grammar: out of memory"); goto done; }
        int s = determinise(&d, &f, in, r);
        if (d.big) { rc = rl_errf(err, EV_CODE_BAD_PARAM, "%s is too large (over %d automaton states)", g->what ? g->what : "grammar", GIR_MAX_STATES); goto done; }
        if (s < 0) { rc = rl_errf(err, RL_ENOMEM, "grammar: out of memory"); goto done; }
        p->rule_start[r] = s;
    }
    /* liveness */
    char *live = calloc((size_t)p->n_st, 1);
    if (!live) { rc = rl_errf(err, RL_ENOMEM, "grammar: out of memory"); goto done; }
    for (bool ch = true; ch;) {
        ch = false;
        for (int s = 0; s < p->n_st; s++) {
            if (live[s]) continue;
            const struct gstate *st = &p->st[s];
            bool l = st->final;
            for (int c = 0; c < 256 && !l; c++)
                l = st->next[c] >= 0 && live[st->next[c]];
            for (int i = 0; i < st->n_ref && !l; i++) {
                const struct gref *r = &p->refs[st->ref_off + i];
                l = live[p->rule_start[r->rule]] && live[r->ret];
            }
            if (l) { live[s] = 1; ch = true; }
        }
    }
    for (int r = 0; r < g->n_rules; r++)
        prod[r] = live[p->rule_start[r]];
    if (!prod[root]) {
        free(live);
        rc = rl_errf(err, EV_CODE_BAD_PARAM, "no string satisfies this %s",
                     g->what ? g->what : "grammar");
        goto done;
    }
    /* trim: drop dead moves and calls */
    for (int s = 0; s < p->n_st; s++) {
        struct gstate *st = &p->st[s];
        st->has_byte = 0;
        for (int c = 0; c < 256; c++) {
            if (st->next[c] >= 0 && !live[st->next[c]]) st->next[c] = -1;
            if (st->next[c] >= 0) st->has_byte = 1;
        }
        int k = 0;
        for (int i = 0; i < st->n_ref; i++) {
            struct gref r = p->refs[st->ref_off + i];
            if (prod[r.rule] && live[r.ret]) p->refs[st->ref_off + k++] = r;
        }
        st->n_ref = (uint16_t)k;
    }
    free(live);
    /* tail calls: the return state is a bare final state */
    for (int i = 0; i < p->n_refs; i++) {
        const struct gstate *rs = &p->st[p->refs[i].ret];
        p->refs[i].tail = rs->final && !rs->has_byte && rs->n_ref == 0;
    }
    /* nullable: the rule can end from this state without a byte */
    char *ends = calloc((size_t)p->n_st, 1);
    if (!ends) { rc = rl_errf(err, RL_ENOMEM, "grammar: out of memory"); goto done; }
    for (bool ch = true; ch;) {
        ch = false;
        for (int s = 0; s < p->n_st; s++) {
            const struct gstate *st = &p->st[s];
            if (ends[s]) continue;
            bool e = st->final;
            for (int i = 0; i < st->n_ref && !e; i++) {
                const struct gref *r = &p->refs[st->ref_off + i];
                e = ends[p->rule_start[r->rule]] && ends[r->ret];
            }
            if (e) { ends[s] = 1; ch = true; }
        }
    }
    /* left recursion: rule A calls B at a point reached from A's start
     * without a byte. Edges through nullable calls; a DFS with an explicit
     * stack finds a cycle. */
    {
        int nr = g->n_rules;
        char *adj = calloc((size_t)nr * (size_t)nr, 1);
        int *wl = malloc(sizeof(int) * (size_t)p->n_st);
        char *seen = calloc((size_t)p->n_st, 1);
        char *color = calloc((size_t)nr, 1);
        int *stk = malloc(sizeof(int) * (size_t)nr * 2);
        if (!adj || !wl || !seen || !color || !stk) {
            free(adj); free(wl); free(seen); free(color); free(stk); free(ends);
            rc = rl_errf(err, RL_ENOMEM, "grammar: out of memory");
            goto done;
        }
        for (int a = 0; a < nr && !rc; a++) {
            int n = 0;
            wl[n++] = p->rule_start[a];
            seen[p->rule_start[a]] = 1;
            for (int k = 0; k < n; k++) {
                const struct gstate *st = &p->st[wl[k]];
                for (int i = 0; i < st->n_ref; i++) {
                    const struct gref *r = &p->refs[st->ref_off + i];
                    adj[(size_t)a * nr + r->rule] = 1;
                    if (ends[p->rule_start[r->rule]] && !seen[r->ret]) { seen[r->ret] = 1; wl[n++] = r->ret; }
                }
            }
            for (int k = 0; k < n; k++) seen[wl[k]] = 0;
        }
        /* iterative DFS: color 1 = on stack, 2 = done */
        for (int s0 = 0; s0 < nr && !rc; s0++) {
            if (color[s0]) continue;
            int sp = 0;
            stk[sp++] = s0; stk[sp++] = 0;
            color[s0] = 1;
            while (sp && !rc) {
                int v = stk[sp - 2], j = stk[sp - 1];
                if (j >= nr) { color[v] = 2; sp -= 2; continue; }
                stk[sp - 1] = j + 1;
                if (!adj[(size_t)v * nr + j]) continue;
                if (color[j] == 1)
                    rc = rl_errf(err, EV_CODE_BAD_PARAM, "%d:%d: rule '%s' is left-recursive (it can call itself before matching a character)",
                                 g->rules[j].line, g->rules[j].col, g->rules[j].name);
                else if (!color[j]) { color[j] = 1; stk[sp++] = j; stk[sp++] = 0; }
            }
        }
        free(adj); free(wl); free(seen); free(color); free(stk);
    }
    free(ends);
done:
    for (int i = 0; i < p->n_st && d.sets; i++)
        free(d.sets[i].v);
    free(d.sets); free(d.tab); free(f.n); free(prod);
    if (rc)
        gpda_fini(p);
    return rc;
}
