/* engine/sample.c - penalties, temperature, min-p / top-k / top-p, draws.
 *
 * Runs once per generated token per sequence on the engine's owner thread,
 * over a 151936-entry row, so the work is a handful of linear passes and
 * never a full sort:
 *   - greedy: one pass (argmax, ties to the lower id);
 *   - top_k: one pass with a k-entry min-heap whose root is the weakest
 *     survivor (most tokens cost one compare), then a sort of k entries;
 *   - top_p without top_k: one pass for the normaliser Z, then a histogram
 *     of the survivors' probabilities in 1024 log-spaced buckets above the
 *     floor tau = (1 - top_p) Z / n_vocab. Tokens under tau can never be in
 *     the nucleus (all of them together weigh at most (1 - top_p) Z, and
 *     they all rank below every token above tau), so only the one bucket
 *     where the mass crosses top_p Z is sorted. The nucleus is then "every
 *     token ranked at or above the cut token", ranking by (probability
 *     desc, id asc), and the final draw walks the row testing that.
 * All ranking uses that one total order, so ties are decided by id and the
 * result never depends on memory layout or qsort's stability.
 *
 * The row is scratch: penalties are applied in place and undone from a
 * saved copy before returning. Raw log-probabilities (before penalties) are
 * computed first, when asked for, with a double-precision log-sum-exp.
 *
 * A GPU backend may hand over a row's 64 best entries instead of the row
 * (sample_next_reduced, issue 25): the same selection code runs on that
 * set - draw_ranked() for top_k, draw_sparse() over the members in id order
 * for min_p - after a check that no token outside the set could have been
 * picked, so the result is bit for bit the full row's; otherwise it says so
 * and the caller samples the whole row.
 *
 * The state's token map is open addressing from token id to a dense index;
 * the dense arrays (id, output count, in-prompt flag) are what the penalty
 * loop walks, so its cost is the number of distinct tokens seen, not the
 * vocabulary. */
#include "sample.h"
#include "xoshiro.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define N_BUCKETS 1024

struct cand {
    float z;      /* the (penalised) logit: the ranking key */
    float w;      /* expf(z), filled once selected */
    int32_t id;
};

struct sample_state {
    uint64_t rng[4];        /* xoshiro256** state */
    /* token map */
    int32_t *slot;          /* (1 << slot_bits) dense index, -1 = empty */
    int slot_bits;
    int32_t *key;           /* (cap) token id */
    int32_t *count;         /* (cap) occurrences in the output */
    uint8_t *in_prompt;     /* (cap) token occurs in the prompt */
    float *saved;           /* (cap) logits before penalties, for restore */
    int n_saved;            /* entries of saved valid in this call */
    int n, cap;
    /* scratch, grown on demand */
    struct cand *cand;      /* (n_cand_cap) heap / boundary bucket */
    int n_cand_cap;
    float *bsaved;          /* (n_bsaved_cap) logits before bias / ban */
    int n_bsaved_cap;
    double *bmass;          /* (N_BUCKETS) probability mass per bucket */
    int32_t *bcount;        /* (N_BUCKETS) tokens per bucket */
};

/* ---- RNG ---- */

double sample_rng_uniform(struct sample_state *st)
{
    return (double)(xo_next(st->rng) >> 11) * 0x1.0p-53;
}

void sample_skip(struct sample_state *st, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        (void)xo_next(st->rng);
}

/* ---- token map ---- */

static uint32_t slot_of(const struct sample_state *st, int32_t tok)
{
    return (uint32_t)(((uint64_t)(uint32_t)tok * 0x9e3779b97f4a7c15ULL) >>
                      (64 - st->slot_bits));
}

static int map_find(const struct sample_state *st, int32_t tok)
{
    if (!st->slot)
        return -1;
    uint32_t mask = (1u << st->slot_bits) - 1;
    for (uint32_t i = slot_of(st, tok);; i = (i + 1) & mask) {
        int32_t d = st->slot[i];
        if (d < 0 || st->key[d] == tok)
            return d;
    }
}

/* Room for `want` distinct tokens; keeps the table at most half full. */
static int map_reserve(struct sample_state *st, int want, struct rl_err *err)
{
    if (want > st->cap) {
        int cap = st->cap ? st->cap : 64;
        while (cap < want)
            cap *= 2;
        int32_t *k = realloc(st->key, sizeof *k * (size_t)cap);
        if (k)
            st->key = k;
        int32_t *c = realloc(st->count, sizeof *c * (size_t)cap);
        if (c)
            st->count = c;
        uint8_t *p = realloc(st->in_prompt, (size_t)cap);
        if (p)
            st->in_prompt = p;
        float *s = realloc(st->saved, sizeof *s * (size_t)cap);
        if (s)
            st->saved = s;
        if (!k || !c || !p || !s)
            return rl_errf(err, RL_ENOMEM, "sample: out of memory for %d "
                           "tokens", cap);
        st->cap = cap;
    }
    if (!st->slot || want * 2 > (1 << st->slot_bits)) {
        int bits = st->slot_bits ? st->slot_bits : 7;
        while (want * 2 > (1 << bits))
            bits++;
        int32_t *slot = malloc(sizeof *slot << bits);
        if (!slot)
            return rl_errf(err, RL_ENOMEM, "sample: out of memory for the "
                           "token map");
        memset(slot, 0xff, sizeof *slot << bits);
        free(st->slot);
        st->slot = slot;
        st->slot_bits = bits;
        uint32_t mask = (1u << bits) - 1;
        for (int d = 0; d < st->n; d++) {
            uint32_t i = slot_of(st, st->key[d]);
            while (st->slot[i] >= 0)
                i = (i + 1) & mask;
            st->slot[i] = d;
        }
    }
    return 0;
}

/* Dense index of tok, inserting it; the caller reserved room. */
static int map_insert(struct sample_state *st, int32_t tok)
{
    uint32_t mask = (1u << st->slot_bits) - 1;
    uint32_t i = slot_of(st, tok);
    for (; st->slot[i] >= 0; i = (i + 1) & mask)
        if (st->key[st->slot[i]] == tok)
            return st->slot[i];
    int d = st->n++;
    st->slot[i] = d;
    st->key[d] = tok;
    st->count[d] = 0;
    st->in_prompt[d] = 0;
    return d;
}

/* ---- state ---- */

void sample_params_default(struct sample_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
}

int sample_params_check(const struct sample_params *p, struct rl_err *err)
{
    if (!(p->temperature >= 0 && isfinite(p->temperature)))
        return rl_errf(err, RL_EINVAL, "temperature %g: must be >= 0",
                       (double)p->temperature);
    if (p->top_k < 0)
        return rl_errf(err, RL_EINVAL, "top_k %d: must be >= 0 (0 = off)",
                       p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return rl_errf(err, RL_EINVAL, "top_p %g: must be in (0, 1]",
                       (double)p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return rl_errf(err, RL_EINVAL, "min_p %g: must be in [0, 1]",
                       (double)p->min_p);
    if (!isfinite(p->presence_penalty))
        return rl_errf(err, RL_EINVAL, "presence_penalty is not finite");
    if (!isfinite(p->frequency_penalty))
        return rl_errf(err, RL_EINVAL, "frequency_penalty is not finite");
    if (!(p->repetition_penalty > 0 && isfinite(p->repetition_penalty)))
        return rl_errf(err, RL_EINVAL, "repetition_penalty %g: must be > 0",
                       (double)p->repetition_penalty);
    if (p->n_logprobs < 0 || p->n_logprobs > SAMPLE_MAX_LOGPROBS)
        return rl_errf(err, RL_EINVAL, "n_logprobs %d: must be in 0..%d",
                       p->n_logprobs, SAMPLE_MAX_LOGPROBS);
    if (p->n_bias < 0 || (p->n_bias && (!p->bias_ids || !p->bias)))
        return rl_errf(err, RL_EINVAL, "logit_bias: a malformed list");
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] < 0 || !(p->bias[i] >= -100 && p->bias[i] <= 100))
            return rl_errf(err, RL_EINVAL, "logit_bias: token %d, bias %g: ids must be >= 0 "
                           "and biases in [-100, 100]", (int)p->bias_ids[i], (double)p->bias[i]);
    if (p->n_ban < 0 || (p->n_ban && !p->ban_ids))
        return rl_errf(err, RL_EINVAL, "sample: a malformed ban list");
    for (int i = 0; i < p->n_ban; i++)
        if (p->ban_ids[i] < 0)
            return rl_errf(err, RL_EINVAL, "sample: banned token %d", (int)p->ban_ids[i]);
    return 0;
}

int sample_state_create(struct sample_state **out, uint64_t seed,
                        const int32_t *prompt, int n_prompt,
                        struct rl_err *err)
{
    *out = NULL;
    if (n_prompt < 0 || (n_prompt > 0 && !prompt))
        return rl_errf(err, RL_EINVAL, "sample_state_create: n_prompt %d",
                       n_prompt);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0)
            return rl_errf(err, RL_EINVAL, "sample_state_create: prompt "
                           "token %d is %d", i, (int)prompt[i]);
    struct sample_state *st = calloc(1, sizeof *st);
    if (!st)
        return rl_errf(err, RL_ENOMEM, "sample_state_create: out of memory");
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        st->rng[i] = xo_splitmix64(&x);
    int rc = map_reserve(st, 64, err);
    for (int i = 0; i < n_prompt && !rc; i++) {
        if (map_find(st, prompt[i]) >= 0)
            continue;
        if ((rc = map_reserve(st, st->n + 1, err)))
            break;
        st->in_prompt[map_insert(st, prompt[i])] = 1;
    }
    if (rc) {
        sample_state_free(st);
        return rc;
    }
    *out = st;
    return 0;
}

void sample_state_free(struct sample_state *st)
{
    if (!st)
        return;
    free(st->slot);
    free(st->key);
    free(st->count);
    free(st->in_prompt);
    free(st->saved);
    free(st->bsaved);
    free(st->cand);
    free(st->bmass);
    free(st->bcount);
    free(st);
}

int sample_observe(struct sample_state *st, int32_t token, struct rl_err *err)
{
    if (token < 0)
        return rl_errf(err, RL_EINVAL, "sample_observe: token %d",
                       (int)token);
    int rc = map_reserve(st, st->n + 1, err);
    if (rc)
        return rc;
    st->count[map_insert(st, token)]++;
    return 0;
}

int sample_output_count(const struct sample_state *st, int32_t token)
{
    int d = map_find(st, token);
    return d >= 0 ? st->count[d] : 0;
}

/* ---- selection helpers ---- */

/* The one ranking: higher z first, then lower id. */
static int better(float za, int32_t ia, float zb, int32_t ib)
{
    return za > zb || (za == zb && ia < ib);
}

static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (better(x->z, x->id, y->z, y->id))
        return -1;
    return better(y->z, y->id, x->z, x->id) ? 1 : 0;
}

static int cand_reserve(struct sample_state *st, int n, struct rl_err *err)
{
    if (n <= st->n_cand_cap)
        return 0;
    int cap = st->n_cand_cap ? st->n_cand_cap : 64;
    while (cap < n)
        cap *= 2;
    struct cand *c = realloc(st->cand, sizeof *c * (size_t)cap);
    if (!c)
        return rl_errf(err, RL_ENOMEM, "sample: out of memory for %d "
                       "candidates", cap);
    st->cand = c;
    st->n_cand_cap = cap;
    return 0;
}

/* Min-heap on the ranking: h[0] is the weakest kept candidate. */
static void heap_sift_down(struct cand *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && better(h[m].z, h[m].id, h[l].z, h[l].id))
            m = l;
        if (r < n && better(h[m].z, h[m].id, h[r].z, h[r].id))
            m = r;
        if (m == i)
            return;
        struct cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static void heap_sift_up(struct cand *h, int i)
{
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!better(h[p].z, h[p].id, h[i].z, h[i].id))
            return;
        struct cand t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

/* ---- the pipeline ---- */

/* Bucket of logit l in [llo, max]: monotone in l, so buckets keep the
 * ranking. */
static int bucket_of(float l, float llo, float scale)
{
    int b = (int)((l - llo) * scale);
    return b < 0 ? 0 : b >= N_BUCKETS ? N_BUCKETS - 1 : b;
}

static void apply_penalties(struct sample_state *st,
                            const struct sample_params *p, float *logits,
                            int n_vocab)
{
    float rep = p->repetition_penalty;
    st->n_saved = 0;
    if (rep == 1.0f && p->frequency_penalty == 0 && p->presence_penalty == 0)
        return; /* the common case costs nothing per seen token */
    st->n_saved = st->n;
    for (int d = 0; d < st->n; d++) {
        int32_t t = st->key[d];
        if (t >= n_vocab)
            continue; /* an id beyond this row (padded vocab): nothing to do */
        float l = logits[t];
        st->saved[d] = l;
        if (rep != 1.0f)
            l = l > 0 ? l / rep : l * rep;
        if (st->count[d] > 0) {
            l -= p->frequency_penalty * (float)st->count[d];
            l -= p->presence_penalty;
        }
        logits[t] = l;
    }
}

void sample_apply_penalties(struct sample_state *st,
                            const struct sample_params *p, float *logits,
                            int n_vocab)
{
    apply_penalties(st, p, logits, n_vocab);
}

static void restore_logits(const struct sample_state *st, float *logits,
                           int n_vocab)
{
    for (int d = 0; d < st->n_saved; d++)
        if (st->key[d] < n_vocab)
            logits[st->key[d]] = st->saved[d];
}

/* Room to save every entry the bias and the ban touch. */
static int bias_reserve(struct sample_state *st, const struct sample_params *p,
                        struct rl_err *err)
{
    int n = p->n_bias + p->n_ban;
    if (n <= st->n_bsaved_cap)
        return 0;
    float *b = realloc(st->bsaved, sizeof *b * (size_t)n);
    if (!b)
        return rl_errf(err, RL_ENOMEM, "sample: out of memory for %d biased tokens", n);
    st->bsaved = b;
    st->n_bsaved_cap = n;
    return 0;
}

/* logit_bias, then the ban, after the penalties; every touched entry is
 * saved first (in order, so undo_bias in reverse order restores even a
 * repeated id). The caller reserved room (bias_reserve). */
static void apply_bias(struct sample_state *st, const struct sample_params *p, float *logits,
                       int n_vocab)
{
    int k = 0;
    for (int i = 0; i < p->n_bias; i++, k++) {
        int32_t t = p->bias_ids[i];
        if (t >= n_vocab)
            continue;
        st->bsaved[k] = logits[t];
        logits[t] += p->bias[i];
    }
    for (int i = 0; i < p->n_ban; i++, k++) {
        int32_t t = p->ban_ids[i];
        if (t >= n_vocab)
            continue;
        st->bsaved[k] = logits[t];
        logits[t] = -INFINITY;
    }
}

static void undo_bias(const struct sample_state *st, const struct sample_params *p,
                      float *logits, int n_vocab)
{
    int k = p->n_bias + p->n_ban;
    for (int i = p->n_ban - 1; i >= 0; i--)
        if (p->ban_ids[i] < n_vocab)
            logits[p->ban_ids[i]] = st->bsaved[--k];
        else
            --k;
    for (int i = p->n_bias - 1; i >= 0; i--)
        if (p->bias_ids[i] < n_vocab)
            logits[p->bias_ids[i]] = st->bsaved[--k];
        else
            --k;
}

/* Raw log-softmax facts: the log-sum-exp and the top n entries. */
static double raw_logprobs(const float *logits, int n_vocab, int n_top,
                           struct sample_out *out)
{
    float m = -INFINITY;
    int n = 0;
    struct sample_logprob *top = out->top;
    for (int i = 0; i < n_vocab; i++) {
        float l = logits[i];
        if (l > m)
            m = l;
        if (n_top == 0 || (n == n_top && !better(l, i, top[n - 1].logprob,
                                                 top[n - 1].id)))
            continue;
        /* insertion into the small sorted list (logprob holds the logit) */
        int j = n < n_top ? n++ : n - 1;
        while (j > 0 && better(l, i, top[j - 1].logprob, top[j - 1].id)) {
            top[j] = top[j - 1];
            j--;
        }
        top[j].id = i;
        top[j].logprob = l;
    }
    double s = 0;
    for (int i = 0; i < n_vocab; i++)
        s += expf(logits[i] - m);
    double lse = m + log(s);
    for (int j = 0; j < n; j++)
        top[j].logprob = (float)(top[j].logprob - lse);
    out->n_top = n;
    return lse;
}

/* The draw over a ranked candidate list h (n entries, best first, .z the
 * penalised logit): weights, the top_p cut within the list, one number
 * from the stream. Shared by the full row's top_k path and the reduced
 * sampler, so both do the very same float operations. */
static void draw_ranked(struct sample_state *st, const struct sample_params *p, struct cand *h, int n,
                        float m, int32_t *tok)
{
    const float invT = 1.0f / p->temperature;
    double Z = 0;
    for (int j = 0; j < n; j++)
        Z += h[j].w = expf((h[j].z - m) * invT);
    if (p->top_p < 1) {
        double cum = 0, goal = (double)p->top_p * Z;
        int j = 0;
        while (j < n && (cum += h[j].w, ++j, cum < goal))
            ;
        n = j;
        Z = cum;
    }
    double target = sample_rng_uniform(st) * Z, cum = 0;
    for (int j = 0; j < n; j++) {
        cum += h[j].w;
        if (target < cum) {
            *tok = h[j].id;
            return;
        }
    }
    *tok = h[n - 1].id; /* rounding left target at the very end */
}

/* The draw without top_k over the tokens (ID(j), vals[j]) for j < n, ids
 * ascending: the whole row (ids NULL: ID(j) = j, n = n_vocab), or the part
 * of it that can pass min_p when every other token provably cannot (the
 * reduced sampler). Tokens under lmin are skipped either way, so the two
 * sum the same terms in the same order. n_vocab enters top_p's floor. */
static int draw_sparse(struct sample_state *st, const struct sample_params *p, const float *vals,
                       const int32_t *ids, int n_in, int n_vocab, float m, float lmin, int32_t *tok,
                       struct rl_err *err)
{
#define ID(j) (ids ? ids[j] : (int32_t)(j))
    const float invT = 1.0f / p->temperature;
    int rc;
    double Z = 0;
    for (int j = 0; j < n_in; j++)
        if (vals[j] >= lmin)
            Z += expf((vals[j] - m) * invT);
    /* the cut: include token i iff it ranks at or above (cut_l, cut_id) */
    float cut_l = lmin;
    int32_t cut_id = n_vocab; /* "at or above lmin, any id" */
    double Zf = Z;
    if (p->top_p < 1) {
        if (!st->bmass) {
            st->bmass = malloc(sizeof *st->bmass * N_BUCKETS);
            st->bcount = malloc(sizeof *st->bcount * N_BUCKETS);
            if (!st->bmass || !st->bcount) {
                free(st->bmass);
                free(st->bcount);
                st->bmass = NULL;
                st->bcount = NULL;
                return rl_errf(err, RL_ENOMEM, "sample: out of memory for "
                               "top_p buckets");
            }
        }
        /* the floor tau in logit space; tau < 1 because Z <= n_vocab, so
         * llo < m and the bucket scale is positive */
        float llo = m + p->temperature *
                    (float)log((1.0 - (double)p->top_p) * Z / n_vocab);
        if (llo < lmin)
            llo = lmin;
        if (!(llo < m))
            llo = m - 1e-3f * (fabsf(m) + 1); /* tau rounded up to 1 */
        const float scale = N_BUCKETS / (m - llo);
        memset(st->bmass, 0, sizeof *st->bmass * N_BUCKETS);
        memset(st->bcount, 0, sizeof *st->bcount * N_BUCKETS);
        for (int j = 0; j < n_in; j++) {
            if (!(vals[j] >= llo))
                continue;
            int b = bucket_of(vals[j], llo, scale);
            st->bmass[b] += expf((vals[j] - m) * invT);
            st->bcount[b]++;
        }
        double goal = (double)p->top_p * Z, cum = 0;
        int bstar = N_BUCKETS - 1;
        for (; bstar >= 0; bstar--) {
            if (cum + st->bmass[bstar] >= goal)
                break; /* nonempty: goal > 0, and cum < goal so far */
            cum += st->bmass[bstar];
        }
        /* bstar < 0: rounding left the buckets' total under the goal
         * (top_p within an ulp of 1), so nothing is cut */
        if (bstar >= 0) {
            if ((rc = cand_reserve(st, st->bcount[bstar], err)))
                return rc;
            struct cand *c = st->cand;
            int n = 0;
            for (int j = 0; j < n_in; j++) {
                if (!(vals[j] >= llo) ||
                    bucket_of(vals[j], llo, scale) != bstar)
                    continue;
                c[n].z = vals[j];
                c[n].w = expf((vals[j] - m) * invT);
                c[n++].id = ID(j);
            }
            qsort(c, (size_t)n, sizeof *c, cand_cmp);
            int j = 0;
            while (j < n && (cum += c[j].w, ++j, cum < goal))
                ;
            cut_l = c[j - 1].z;
            cut_id = c[j - 1].id;
            Zf = cum;
        }
    }
    double target = sample_rng_uniform(st) * Zf, cum = 0;
    int32_t last = -1;
    for (int j = 0; j < n_in; j++) {
        float l = vals[j];
        int32_t i = ID(j);
        if (!(l >= lmin) || !(l > cut_l || (l == cut_l && i <= cut_id)))
            continue;
        cum += expf((l - m) * invT);
        last = i;
        if (target < cum) {
            *tok = i;
            return 0;
        }
    }
    *tok = last; /* rounding: the total fell just short of target */
    return 0;
#undef ID
}

/* min_p's floor in logit space: p_i >= min_p * p_max <=> l_i >= m + T ln(min_p). */
static float min_p_floor(const struct sample_params *p, float m)
{
    return p->min_p > 0 ? m + p->temperature * logf(p->min_p) : -INFINITY;
}

/* Random draw over the processed row. m: max of the penalised logits.
 * Ranking and filtering compare logits (the temperature is a monotone
 * map), so a weight expf((l - m) / T) is computed only where it is summed.
 * Draws exactly one number from the stream, after every allocation. */
static int sample_random(struct sample_state *st, const struct sample_params *p,
                         const float *logits, int n_vocab, float m,
                         int32_t *tok, struct rl_err *err)
{
    const float lmin = min_p_floor(p, m);
    const int k = p->top_k > 0 && p->top_k < n_vocab ? p->top_k : 0;
    int rc;

    if (k) {
        if ((rc = cand_reserve(st, k, err)))
            return rc;
        struct cand *h = st->cand; /* .z holds the logit while selecting */
        int n = 0, i = 0;
        for (; i < n_vocab && n < k; i++) {
            if (!(logits[i] >= lmin))
                continue;
            h[n].z = logits[i];
            h[n].id = i;
            heap_sift_up(h, n++);
        }
        for (; i < n_vocab; i++) {
            /* ids rise, so an equal logit never beats the root: one compare
             * rejects almost every token */
            if (logits[i] > h[0].z && logits[i] >= lmin) {
                h[0].z = logits[i];
                h[0].id = i;
                heap_sift_down(h, n, 0);
            }
        }
        qsort(h, (size_t)n, sizeof *h, cand_cmp);
        draw_ranked(st, p, h, n, m, tok);
        return 0;
    }
    return draw_sparse(st, p, logits, NULL, n_vocab, n_vocab, m, lmin, tok, err);
}

/* Disallowed tokens (bit clear) to -inf, after the raw logprobs and the
 * penalties: the sampler then sees exactly the unconstrained row over the
 * allowed tokens. Whole words of allowed tokens cost one compare. */
static void apply_mask(float *logits, int n_vocab, const uint32_t *mask)
{
    int n_words = (n_vocab + 31) / 32;
    for (int w = 0; w < n_words; w++) {
        uint32_t m = mask[w];
        if (m == 0xffffffffu)
            continue;
        int base = w * 32, end = base + 32 < n_vocab ? base + 32 : n_vocab;
        for (int i = base; i < end; i++)
            if (!(m >> (i - base) & 1u))
                logits[i] = -INFINITY;
    }
}

int sample_next(struct sample_state *st, const struct sample_params *p,
                float *logits, int n_vocab, struct sample_out *out,
                struct rl_err *err)
{
    return sample_next_masked(st, p, logits, n_vocab, NULL, out, err);
}

int sample_next_masked(struct sample_state *st, const struct sample_params *p,
                       float *logits, int n_vocab, const uint32_t *mask,
                       struct sample_out *out, struct rl_err *err)
{
    int rc;
    memset(out, 0, offsetof(struct sample_out, top));
    if ((rc = sample_params_check(p, err)))
        return rc;
    if (n_vocab <= 0 || !logits)
        return rl_errf(err, RL_EINVAL, "sample_next: n_vocab %d", n_vocab);
    /* everything that can fail for memory happens before the draw */
    if ((rc = map_reserve(st, st->n + 1, err)) || (rc = bias_reserve(st, p, err)))
        return rc;

    double lse = 0;
    if (p->logprobs) {
        int n_top = p->n_logprobs < n_vocab ? p->n_logprobs : n_vocab;
        lse = raw_logprobs(logits, n_vocab, n_top, out);
    }

    apply_penalties(st, p, logits, n_vocab);
    apply_bias(st, p, logits, n_vocab);
    if (mask)
        apply_mask(logits, n_vocab, mask);
    float m = -INFINITY;
    int32_t arg = -1;
    int n_nan = 0; /* a NaN never compares greater: the argmax would skip it in silence */
    for (int i = 0; i < n_vocab; i++)
        if (logits[i] > m) { /* strict: ties keep the lower id */
            m = logits[i];
            arg = i;
        } else if (logits[i] != logits[i]) {
            n_nan++;
        }
    if (n_nan || m == INFINITY) {
        undo_bias(st, p, logits, n_vocab);
        restore_logits(st, logits, n_vocab);
        return rl_errf(err, RL_EINVAL, "the model's logits are not finite (%d of %d NaN%s): its "
                       "weights, or the forward pass, produce NaN or infinity; check the "
                       "checkpoint", n_nan, n_vocab, m == INFINITY ? ", +inf among them" : "");
    }
    if (!isfinite(m)) {
        undo_bias(st, p, logits, n_vocab);
        restore_logits(st, logits, n_vocab);
        return rl_errf(err, RL_EINVAL, "sample_next: no finite maximum in "
                       "the logits row (max %g)%s", (double)m,
                       mask ? "; the mask allows no token with one" : "");
    }
    int32_t tok = arg;
    if (p->temperature == 0) {
        (void)sample_rng_uniform(st); /* one draw per token, always */
    } else if ((rc = sample_random(st, p, logits, n_vocab, m, &tok, err))) {
        undo_bias(st, p, logits, n_vocab);
        restore_logits(st, logits, n_vocab);
        return rc;
    }
    undo_bias(st, p, logits, n_vocab);
    restore_logits(st, logits, n_vocab);

    out->token = tok;
    if (p->logprobs)
        out->logprob = (float)((double)logits[tok] - lse);
    st->count[map_insert(st, tok)]++;
    return 0;
}

/* ---- the reduced candidate set (sample.h) ---- */

void sample_cands_from_row(const float *logits, int n_vocab, struct sample_cands *cs)
{
    struct cand h[SAMPLE_CANDS];
    int n = 0, bad = 0;
    for (int i = 0; i < n_vocab; i++) {
        float l = logits[i];
        if (l != l || l == INFINITY) {
            bad++;
            continue;
        }
        if (n < SAMPLE_CANDS) {
            h[n].z = l;
            h[n].id = i;
            heap_sift_up(h, n++);
        } else if (l > h[0].z) { /* ids rise: an equal logit ranks below */
            h[0].z = l;
            h[0].id = i;
            heap_sift_down(h, n, 0);
        }
    }
    qsort(h, (size_t)n, sizeof *h, cand_cmp);
    memset(cs, 0, sizeof *cs);
    cs->n = n;
    cs->n_bad = bad;
    for (int j = 0; j < n; j++) {
        cs->c[j].z = h[j].z;
        cs->c[j].id = h[j].id;
    }
}

static int penalties_can_raise(const struct sample_params *p)
{
    return p->repetition_penalty < 1.0f || p->frequency_penalty < 0 || p->presence_penalty < 0;
}

int sample_params_reducible(const struct sample_params *p)
{
    if (p->logprobs || penalties_can_raise(p) || p->n_bias || p->n_ban)
        return 0;
    return p->temperature == 0 || (p->top_k > 0 && p->top_k <= SAMPLE_CANDS) || p->min_p > 0;
}

/* The penalised value of a member: apply_penalties' very operations. */
static float penalised(const struct sample_state *st, const struct sample_params *p, float l, int32_t id)
{
    float rep = p->repetition_penalty;
    if (rep == 1.0f && p->frequency_penalty == 0 && p->presence_penalty == 0)
        return l;
    int d = map_find(st, id);
    if (d < 0)
        return l;
    if (rep != 1.0f)
        l = l > 0 ? l / rep : l * rep;
    if (st->count[d] > 0) {
        l -= p->frequency_penalty * (float)st->count[d];
        l -= p->presence_penalty;
    }
    return l;
}

static int cand_id_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

int sample_next_reduced(struct sample_state *st, const struct sample_params *p,
                        const struct sample_cands *cs, int n_vocab, const uint32_t *mask,
                        struct sample_out *out, struct rl_err *err)
{
    int rc;
    memset(out, 0, offsetof(struct sample_out, top));
    if ((rc = sample_params_check(p, err)))
        return rc;
    if (n_vocab <= 0 || !cs || cs->n < 1 || cs->n > SAMPLE_CANDS || cs->n > n_vocab)
        return rl_errf(err, RL_EINVAL, "sample_next_reduced: %d candidates of %d", cs ? cs->n : -1, n_vocab);
    /* the whole row is in the set: nothing outside to reason about */
    const int whole = cs->n == n_vocab;
    if (p->logprobs || cs->n_bad || p->n_bias || p->n_ban || (!whole && penalties_can_raise(p)))
        return 1;
    const int n = cs->n;
    const float bz = cs->c[n - 1].z; /* the boundary: everything outside ranks below (bz, bid) */
    const int32_t bid = cs->c[n - 1].id;
    struct cand v[SAMPLE_CANDS];
    int n_above = 0, best = -1;
    for (int j = 0; j < n; j++) {
        int32_t id = cs->c[j].id;
        float l = penalised(st, p, cs->c[j].z, id);
        if (mask && !(mask[id >> 5] >> (id & 31) & 1u))
            l = -INFINITY;
        v[j].z = l;
        v[j].id = id;
        v[j].w = 0;
        if (l != l || l == INFINITY)
            return 1; /* the full row's error says it */
        if (whole || l > bz || (l == bz && id <= bid))
            n_above++;
        if (best < 0 || better(l, id, v[best].z, v[best].id))
            best = j;
    }
    /* the best member must beat everything outside; an all -inf row is
     * the full row's error */
    if (!n_above || !(v[best].z > -INFINITY))
        return 1;
    const float m = v[best].z;
    int32_t tok = v[best].id;
    if (p->temperature > 0) {
        const float lmin = min_p_floor(p, m);
        const int k = p->top_k > 0 && p->top_k < n_vocab ? p->top_k : 0;
        if (k) {
            if (k > n_above)
                return 1;
        } else if (!whole && !(lmin > bz)) {
            return 1;
        }
        /* proven: everything that can fail for memory, then the draw */
        if ((rc = map_reserve(st, st->n + 1, err)))
            return rc;
        if (k) {
            int nk = 0;
            for (int j = 0; j < n; j++)
                if (v[j].z >= lmin)
                    v[nk++] = v[j];
            qsort(v, (size_t)nk, sizeof *v, cand_cmp);
            draw_ranked(st, p, v, nk < k ? nk : k, m, &tok);
        } else {
            qsort(v, (size_t)n, sizeof *v, cand_id_cmp);
            float vals[SAMPLE_CANDS];
            int32_t ids[SAMPLE_CANDS];
            for (int j = 0; j < n; j++) {
                vals[j] = v[j].z;
                ids[j] = v[j].id;
            }
            if ((rc = draw_sparse(st, p, vals, ids, n, n_vocab, m, lmin, &tok, err)))
                return rc;
        }
    } else {
        if ((rc = map_reserve(st, st->n + 1, err)))
            return rc;
        (void)sample_rng_uniform(st); /* one draw per token, always */
    }
    out->token = tok;
    st->count[map_insert(st, tok)]++;
    return 0;
}
