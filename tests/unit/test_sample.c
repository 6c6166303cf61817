/* tests/unit/test_sample.c - greedy, temperature, filters, penalties, seeds,
 * logprobs. Statistical checks use fixed seeds, so they are deterministic;
 * their bounds are loose enough that any correct sampler passes with
 * another seed too (chi-square at p = 0.001). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sample.h"

#define QWEN_VOCAB 151936

static struct sample_state *mk(uint64_t seed, const int32_t *prompt, int n)
{
    struct sample_state *st = NULL;
    struct rl_err err = {0};
    assert_int_equal(sample_state_create(&st, seed, prompt, n, &err), 0);
    return st;
}

static int32_t next(struct sample_state *st, const struct sample_params *p,
                    float *logits, int n_vocab)
{
    struct sample_out out;
    struct rl_err err = {0};
    int rc = sample_next(st, p, logits, n_vocab, &out, &err);
    if (rc)
        fail_msg("sample_next: %s", err.msg);
    assert_true(out.token >= 0 && out.token < n_vocab);
    return out.token;
}

/* Deterministic pseudo-random logits in [lo, hi). */
static void rand_logits(float *l, int n, uint32_t seed, float lo, float hi)
{
    uint32_t x = seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        l[i] = lo + (hi - lo) * (float)(x >> 8) / (float)(1u << 24);
    }
}

/* Draws n tokens and counts them per id (counts has n_vocab entries). No
 * penalties are set, so observing the draws changes nothing. */
static void histogram(const struct sample_params *p, float *logits,
                      int n_vocab, int n, uint64_t seed, int *counts)
{
    struct sample_state *st = mk(seed, NULL, 0);
    memset(counts, 0, sizeof(int) * (size_t)n_vocab);
    for (int i = 0; i < n; i++)
        counts[next(st, p, logits, n_vocab)]++;
    sample_state_free(st);
}

/* Pearson chi-square of counts against probabilities; probs of 0 must have
 * counts of 0 (checked), and are left out of the statistic. */
static double chi2(const int *counts, const double *probs, int k, int n)
{
    double c = 0;
    for (int i = 0; i < k; i++) {
        if (probs[i] == 0) {
            assert_int_equal(counts[i], 0);
            continue;
        }
        double e = probs[i] * n;
        c += (counts[i] - e) * (counts[i] - e) / e;
    }
    return c;
}

/* 99.9% quantiles of chi-square for 1..5 degrees of freedom. */
static const double CHI2_999[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52};

static void test_greedy_and_ties(void **state)
{
    (void)state;
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0;
    struct sample_state *st = mk(1, NULL, 0);
    float a[] = {1, 3, 3, 2};
    assert_int_equal(next(st, &p, a, 4), 1);
    float b[] = {-INFINITY, -2, -2, -5};
    assert_int_equal(next(st, &p, b, 4), 1);
    float c[8] = {0};
    assert_int_equal(next(st, &p, c, 8), 0);
    float d[] = {0, 0, 7, 6.5f, 7};
    assert_int_equal(next(st, &p, d, 5), 2);
    /* greedy ignores the random filters and the stream */
    p.top_k = 1;
    p.top_p = 0.1f;
    p.min_p = 0.9f;
    assert_int_equal(next(st, &p, d, 5), 2);
    /* a large row */
    float *big = malloc(sizeof(float) * QWEN_VOCAB);
    rand_logits(big, QWEN_VOCAB, 7, -5, 5);
    big[123456] = 9;
    big[99] = 9;
    assert_int_equal(next(st, &p, big, QWEN_VOCAB), 99);
    /* top_k 1 at a positive temperature is greedy too, tie rule included */
    p.temperature = 0.8f;
    p.top_p = 1;
    p.min_p = 0;
    assert_int_equal(next(st, &p, big, QWEN_VOCAB), 99);
    /* a row with no finite value is refused */
    float bad[] = {-INFINITY, -INFINITY};
    struct sample_out out;
    struct rl_err err = {0};
    assert_int_equal(sample_next(st, &p, bad, 2, &out, &err), -RL_EINVAL);
    free(big);
    sample_state_free(st);
}

static void test_temperature_distribution(void **state)
{
    (void)state;
    const double q[4] = {0.1, 0.2, 0.3, 0.4};
    float l[4];
    for (int i = 0; i < 4; i++)
        l[i] = (float)log(q[i]) + 3.0f; /* a shift changes nothing */
    struct sample_params p;
    sample_params_default(&p);
    int counts[4];
    const int n = 20000;
    for (int t = 0; t < 3; t++) {
        double temp[] = {1.0, 2.0, 0.5};
        p.temperature = (float)temp[t];
        double pr[4], z = 0;
        for (int i = 0; i < 4; i++)
            z += pr[i] = pow(q[i], 1.0 / temp[t]);
        for (int i = 0; i < 4; i++)
            pr[i] /= z;
        histogram(&p, l, 4, n, 1234 + t, counts);
        double c = chi2(counts, pr, 4, n);
        if (c > CHI2_999[3])
            fail_msg("temperature %g: chi2 %.2f, counts %d %d %d %d",
                     temp[t], c, counts[0], counts[1], counts[2], counts[3]);
    }
    /* and a wrong distribution is rejected by the same check: T=1 counts
     * against T=2 probabilities */
    p.temperature = 1;
    histogram(&p, l, 4, n, 99, counts);
    double pr2[4], z = 0;
    for (int i = 0; i < 4; i++)
        z += pr2[i] = sqrt(q[i]);
    for (int i = 0; i < 4; i++)
        pr2[i] /= z;
    assert_true(chi2(counts, pr2, 4, n) > CHI2_999[3]);
}

static void test_filters_small(void **state)
{
    (void)state;
    /* probabilities 0.5 0.3 0.15 0.05 */
    const double q[4] = {0.5, 0.3, 0.15, 0.05};
    float l[4];
    for (int i = 0; i < 4; i++)
        l[i] = (float)log(q[i]);
    struct sample_params p;
    sample_params_default(&p);
    int counts[4];
    const int n = 20000;
    struct { int top_k; float top_p, min_p; double pr[4]; } cases[] = {
        {2, 1, 0, {0.625, 0.375, 0, 0}},
        {3, 1, 0, {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}},
        {0, 0.75f, 0, {0.625, 0.375, 0, 0}},
        {0, 0.85f, 0, {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}},
        {0, 0.3f, 0, {1, 0, 0, 0}},
        {0, 1, 0.5f, {0.625, 0.375, 0, 0}},   /* keeps p >= 0.25 */
        {0, 1, 0.2f, {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}},
        {0, 1, 0.05f, {0.5, 0.3, 0.15, 0.05}},
        /* min_p then top_k then top_p over the renormalised rest */
        {3, 0.6f, 0, {0.625, 0.375, 0, 0}},  /* 0.53 < 0.6 */
        {2, 0.6f, 0, {1, 0, 0, 0}},          /* 0.625 >= 0.6 */
        {4, 1, 0.35f, {0.625, 0.375, 0, 0}},  /* keeps p >= 0.175 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        p.top_k = cases[c].top_k;
        p.top_p = cases[c].top_p;
        p.min_p = cases[c].min_p;
        histogram(&p, l, 4, n, 77 + c, counts);
        int k = 0;
        for (int i = 0; i < 4; i++)
            k += cases[c].pr[i] > 0;
        double x = chi2(counts, cases[c].pr, 4, n);
        if (k > 1 && x > CHI2_999[k - 1])
            fail_msg("case %zu: chi2 %.2f", c, x);
    }
    /* ties at the top_k boundary go to the lower id */
    float t[] = {1, 5, 5, 5, 0};
    p.top_k = 2;
    p.top_p = 1;
    p.min_p = 0;
    int tc[5];
    histogram(&p, t, 5, 2000, 5, tc);
    assert_int_equal(tc[0] + tc[3] + tc[4], 0);
    assert_true(tc[1] > 0 && tc[2] > 0);
    /* and at the top_p boundary: four equal tokens, top_p 0.5 keeps two */
    float e[] = {2, 2, 2, 2};
    p.top_k = 0;
    p.top_p = 0.5f;
    histogram(&p, e, 4, 2000, 6, tc);
    assert_int_equal(tc[2] + tc[3], 0);
    assert_true(tc[0] > 0 && tc[1] > 0);
}

static int cmp_desc(const void *a, const void *b)
{
    const float *x = *(const float *const *)a, *y = *(const float *const *)b;
    if (*x != *y)
        return *x > *y ? -1 : 1;
    return x < y ? -1 : x > y; /* equal logits: lower id first */
}

/* The exact nucleus by a full sort: the rank of the last token kept. */
static int ref_nucleus(const float *l, int n, float temp, float top_p,
                       const float **order)
{
    for (int i = 0; i < n; i++)
        order[i] = &l[i];
    qsort(order, (size_t)n, sizeof *order, cmp_desc);
    double z = 0, m = *order[0];
    for (int i = 0; i < n; i++)
        z += exp((*order[i] - m) / temp);
    double cum = 0;
    for (int i = 0; i < n; i++) {
        cum += exp((*order[i] - m) / temp);
        if (cum >= top_p * z)
            return i + 1;
    }
    return n;
}

static void test_filters_large_vocab(void **state)
{
    (void)state;
    float *l = malloc(sizeof(float) * QWEN_VOCAB);
    const float **order = malloc(sizeof *order * QWEN_VOCAB);
    int *counts = malloc(sizeof(int) * QWEN_VOCAB);
    uint8_t *in = malloc(QWEN_VOCAB);
    struct sample_params p;
    sample_params_default(&p);

    /* top_k over a flat-ish row: support is exactly the 20 best */
    rand_logits(l, QWEN_VOCAB, 3, 0, 4);
    p.top_k = 20;
    histogram(&p, l, QWEN_VOCAB, 1500, 11, counts);
    ref_nucleus(l, QWEN_VOCAB, 1, 1, order);
    memset(in, 0, QWEN_VOCAB);
    for (int i = 0; i < 20; i++)
        in[order[i] - l] = 1;
    int seen = 0;
    for (int i = 0; i < QWEN_VOCAB; i++) {
        if (!in[i])
            assert_int_equal(counts[i], 0);
        else
            seen += counts[i] > 0;
    }
    assert_int_equal(seen, 20);

    /* top_p alone, on a peaked row and on a flat one */
    for (int r = 0; r < 2; r++) {
        rand_logits(l, QWEN_VOCAB, 5 + r, -4, 0);
        if (r == 0)
            for (int i = 0; i < 60; i++)
                l[(i * 2477) % QWEN_VOCAB] = 10 + 0.05f * (float)i;
        p.top_k = 0;
        p.temperature = 0.7f;
        p.top_p = r == 0 ? 0.9f : 0.95f;
        int kept = ref_nucleus(l, QWEN_VOCAB, p.temperature, p.top_p, order);
        memset(in, 0, QWEN_VOCAB);
        for (int i = 0; i < kept; i++)
            in[order[i] - l] = 1;
        int draws = r == 0 ? 1500 : 300;
        histogram(&p, l, QWEN_VOCAB, draws, 21 + r, counts);
        for (int i = 0; i < QWEN_VOCAB; i++)
            if (!in[i] && counts[i])
                fail_msg("row %d: token %d outside the nucleus of %d drawn",
                         r, i, kept);
        if (r == 0) { /* the nucleus is part of the 60 peaks */
            assert_true(kept < 60 && kept > 10);
            int s = 0;
            for (int i = 0; i < kept; i++)
                s += counts[order[i] - l] > 0;
            assert_true(s >= kept - 2);
        } else {
            assert_true(kept > QWEN_VOCAB / 2);
        }
    }

    /* min_p on a large row: nothing below min_p * p_max */
    rand_logits(l, QWEN_VOCAB, 9, -6, 0);
    for (int i = 0; i < 30; i++)
        l[i * 1000] = 4 - 0.1f * (float)i;
    p.temperature = 1;
    p.top_p = 1;
    p.min_p = 0.1f;
    histogram(&p, l, QWEN_VOCAB, 600, 31, counts);
    float thr = 4 + logf(0.1f);
    int kinds = 0;
    for (int i = 0; i < QWEN_VOCAB; i++) {
        if (l[i] < thr)
            assert_int_equal(counts[i], 0);
        kinds += counts[i] > 0;
    }
    assert_true(kinds >= 20);
    free(l);
    free(order);
    free(counts);
    free(in);
}

static void test_penalties_table(void **state)
{
    (void)state;
    int32_t prompt[] = {1, 1};
    struct sample_state *st = mk(1, prompt, 2);
    struct rl_err err = {0};
    assert_int_equal(sample_observe(st, 2, &err), 0);
    assert_int_equal(sample_observe(st, 2, &err), 0);
    assert_int_equal(sample_observe(st, 3, &err), 0);
    assert_int_equal(sample_observe(st, 9, &err), 0); /* beyond the row */
    assert_int_equal(sample_observe(st, -1, &err), -RL_EINVAL);
    assert_int_equal(sample_output_count(st, 2), 2);
    assert_int_equal(sample_output_count(st, 1), 0);
    struct sample_params p;
    sample_params_default(&p);
    p.repetition_penalty = 2;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    struct { float in, want; } t[5] = {
        {1.0f, 1.0f},   /* never seen */
        {2.0f, 1.0f},   /* prompt only: 2 / 2, no frequency or presence */
        {-1.0f, -3.25f},/* output x2: -1 * 2 - 0.5 * 2 - 0.25 */
        {0.5f, -0.5f},  /* output x1: 0.5 / 2 - 0.5 - 0.25 */
        {3.0f, 3.0f},
    };
    float l[5];
    for (int i = 0; i < 5; i++)
        l[i] = t[i].in;
    sample_apply_penalties(st, &p, l, 5);
    for (int i = 0; i < 5; i++)
        assert_float_equal(l[i], t[i].want, 0);
    /* each penalty alone */
    struct { float rep, freq, pres; float want[5]; } one[] = {
        {1.5f, 0, 0, {1, 2 / 1.5f, -1.5f, 0.5f / 1.5f, 3}},
        {1, 1, 0, {1, 2, -3, -0.5f, 3}},
        {1, 0, -1, {1, 2, 0, 1.5f, 3}},   /* negative presence rewards */
        {1, 0, 0, {1, 2, -1, 0.5f, 3}},
    };
    for (size_t c = 0; c < sizeof one / sizeof one[0]; c++) {
        p.repetition_penalty = one[c].rep;
        p.frequency_penalty = one[c].freq;
        p.presence_penalty = one[c].pres;
        for (int i = 0; i < 5; i++)
            l[i] = t[i].in;
        sample_apply_penalties(st, &p, l, 5);
        for (int i = 0; i < 5; i++)
            assert_float_equal(l[i], one[c].want[i], 0);
    }
    /* greedy decisions follow the penalised row, and the row comes back
     * unchanged; the sampled token is observed */
    p.repetition_penalty = 1;
    p.frequency_penalty = 0;
    p.presence_penalty = 9;
    p.temperature = 0;
    float g[5] = {0, 0, 9, 8.5f, 1}, g0[5];
    memcpy(g0, g, sizeof g);
    assert_int_equal(next(st, &p, g, 5), 4); /* 2 and 3 lose 9 */
    assert_memory_equal(g, g0, sizeof g);
    assert_int_equal(sample_output_count(st, 4), 1);
    p.presence_penalty = 0;
    assert_int_equal(next(st, &p, g, 5), 2);
    sample_state_free(st);
}

static void test_seeded_determinism(void **state)
{
    (void)state;
    enum { V = 5000, N = 200 };
    float *l = malloc(sizeof(float) * V);
    rand_logits(l, V, 1, 0, 3);
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.frequency_penalty = 0.3f; /* the history feeds back into the row */
    int32_t prompt[] = {5, 6, 7};
    struct sample_state *a = mk(42, prompt, 3), *b = mk(42, prompt, 3);
    struct sample_state *c = mk(43, prompt, 3), *noise = mk(7, NULL, 0);
    int32_t sa[N], sb[N], sc[N];
    struct sample_params q = p;
    q.top_k = 3;
    for (int i = 0; i < N; i++) {
        sa[i] = next(a, &p, l, V);
        /* other requests run between a's and b's steps */
        next(noise, &q, l, V);
        sb[i] = next(b, &p, l, V);
        sc[i] = next(c, &p, l, V);
    }
    assert_memory_equal(sa, sb, sizeof sa);
    int same = 0;
    for (int i = 0; i < N; i++)
        same += sa[i] == sc[i];
    assert_true(same < N / 4);
    sample_state_free(a);
    sample_state_free(b);
    sample_state_free(c);
    sample_state_free(noise);

    /* one draw per token, greedy included: a greedy first step then a
     * random one gives the same second token as two random steps */
    a = mk(9, NULL, 0);
    b = mk(9, NULL, 0);
    p.frequency_penalty = 0;
    q = p;
    q.temperature = 0;
    next(a, &q, l, V);
    next(b, &p, l, V);
    assert_int_equal(next(a, &p, l, V), next(b, &p, l, V));
    /* and the stream itself: splitmix64-seeded, reproducible, in [0, 1) */
    sample_state_free(a);
    sample_state_free(b);
    a = mk(0, NULL, 0);
    b = mk(0, NULL, 0);
    double sum = 0;
    for (int i = 0; i < 10000; i++) {
        double u = sample_rng_uniform(a);
        assert_true(u >= 0 && u < 1);
        assert_true(u == sample_rng_uniform(b));
        sum += u;
    }
    assert_true(fabs(sum / 10000 - 0.5) < 0.02);
    /* sample_skip(n) is n draws, no more, no less: a resumed request's
     * stream stands where the interrupted one left it */
    for (int i = 0; i < 37; i++)
        (void)sample_rng_uniform(a);
    sample_skip(b, 37);
    sample_skip(b, 0);
    sample_skip(b, -5);
    for (int i = 0; i < 100; i++)
        assert_true(sample_rng_uniform(a) == sample_rng_uniform(b));
    sample_state_free(a);
    sample_state_free(b);
    free(l);
}

static void test_logprobs(void **state)
{
    (void)state;
    struct sample_params p;
    sample_params_default(&p);
    p.logprobs = 1;
    p.n_logprobs = 5;
    p.temperature = 0;
    p.presence_penalty = 100; /* penalties must not show in raw logprobs */
    struct sample_state *st = mk(3, NULL, 0);
    struct rl_err err = {0};
    float l[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
    struct sample_out out;
    assert_int_equal(sample_next(st, &p, l, 5, &out, &err), 0);
    assert_int_equal(out.token, 1);
    assert_int_equal(out.n_top, 5);
    double s = 0;
    for (int i = 0; i < 5; i++) {
        s += exp(out.top[i].logprob);
        if (i)
            assert_true(out.top[i].logprob <= out.top[i - 1].logprob);
    }
    assert_float_equal(s, 1.0, 1e-6);
    int32_t order[5] = {1, 3, 4, 0, 2};
    for (int i = 0; i < 5; i++)
        assert_int_equal(out.top[i].id, order[i]);
    double lse = log(exp(0.5) + 2 * exp(2.0) + exp(-1.0) + exp(1.0));
    assert_float_equal(out.logprob, 2.0 - lse, 1e-6);
    assert_float_equal(out.top[0].logprob, out.logprob, 0);
    /* token 1 is now penalised by 100: greedy picks 3, raw logprob is the
     * same as before */
    assert_int_equal(sample_next(st, &p, l, 5, &out, &err), 0);
    assert_int_equal(out.token, 3);
    assert_float_equal(out.logprob, 2.0 - lse, 1e-6);

    /* large row: top 20 match a full sort, logsumexp matches */
    float *big = malloc(sizeof(float) * QWEN_VOCAB);
    const float **ord = malloc(sizeof *ord * QWEN_VOCAB);
    rand_logits(big, QWEN_VOCAB, 17, -10, 10);
    p.n_logprobs = 20;
    p.presence_penalty = 0;
    p.temperature = 1;
    assert_int_equal(sample_next(st, &p, big, QWEN_VOCAB, &out, &err), 0);
    ref_nucleus(big, QWEN_VOCAB, 1, 1, ord);
    double m = *ord[0], z = 0;
    for (int i = 0; i < QWEN_VOCAB; i++)
        z += exp(big[i] - m);
    double blse = m + log(z);
    assert_int_equal(out.n_top, 20);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(out.top[i].id, ord[i] - big);
        assert_float_equal(out.top[i].logprob, *ord[i] - blse, 1e-5);
    }
    assert_float_equal(out.logprob, big[out.token] - blse, 1e-5);
    /* logprobs off: nothing filled */
    p.logprobs = 0;
    assert_int_equal(sample_next(st, &p, big, QWEN_VOCAB, &out, &err), 0);
    assert_int_equal(out.n_top, 0);
    assert_float_equal(out.logprob, 0, 0);
    /* n_logprobs above the vocabulary is capped */
    p.logprobs = 1;
    p.n_logprobs = 20;
    assert_int_equal(sample_next(st, &p, l, 5, &out, &err), 0);
    assert_int_equal(out.n_top, 5);
    free(big);
    free(ord);
    sample_state_free(st);
}

static void test_params_check(void **state)
{
    (void)state;
    struct sample_params p;
    struct rl_err err = {0};
    sample_params_default(&p);
    assert_int_equal(sample_params_check(&p, &err), 0);
#define BAD(stmt, name)                                                        \
    do {                                                                       \
        sample_params_default(&p);                                             \
        stmt;                                                                  \
        memset(&err, 0, sizeof err);                                           \
        assert_int_equal(sample_params_check(&p, &err), -RL_EINVAL);           \
        assert_non_null(strstr(err.msg, name));                                \
    } while (0)
    BAD(p.temperature = -1, "temperature");
    BAD(p.temperature = NAN, "temperature");
    BAD(p.top_k = -1, "top_k");
    BAD(p.top_p = 0, "top_p");
    BAD(p.top_p = 1.5f, "top_p");
    BAD(p.min_p = -0.1f, "min_p");
    BAD(p.repetition_penalty = 0, "repetition_penalty");
    BAD(p.n_logprobs = 21, "n_logprobs");
    BAD(p.frequency_penalty = INFINITY, "frequency_penalty");
#undef BAD
    struct sample_state *st = NULL;
    int32_t neg = -3;
    assert_int_equal(sample_state_create(&st, 0, &neg, 1, &err), -RL_EINVAL);
    assert_null(st);
}

/* logit_bias and the ban (issue 29): -100 removes the greedy token, +100
 * forces a weak one, the ban wins over everything, the row comes back
 * unchanged, and the reduced path declines so the full row decides. */
static void test_logit_bias_and_ban(void **state)
{
    (void)state;
    enum { V = 1000 };
    float *l = malloc(sizeof *l * V), *copy = malloc(sizeof *copy * V);
    rand_logits(l, V, 7, -5, 5);
    l[42] = 9.0f; /* the greedy token */
    memcpy(copy, l, sizeof *l * V);
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0;
    struct sample_state *st = mk(1, NULL, 0);
    assert_int_equal(next(st, &p, l, V), 42);

    int32_t ban42[] = {42};
    float minus[] = {-100.0f};
    p.bias_ids = ban42;
    p.bias = minus;
    p.n_bias = 1;
    int32_t second = next(st, &p, l, V);
    assert_int_not_equal(second, 42);
    assert_memory_equal(l, copy, sizeof *l * V);

    int32_t weak[] = {7, 7}; /* a repeated id adds twice */
    float plus[] = {60.0f, 40.0f};
    l[7] = -4.0f;
    memcpy(copy, l, sizeof *l * V);
    p.bias_ids = weak;
    p.bias = plus;
    p.n_bias = 2;
    assert_int_equal(next(st, &p, l, V), 7);
    p.n_bias = 1; /* +60 alone: -4 + 60 = 56 still beats 9 */
    assert_int_equal(next(st, &p, l, V), 7);
    assert_memory_equal(l, copy, sizeof *l * V);

    /* random sampling at temperature 1: +100 makes the token certain */
    p.temperature = 1.0f;
    p.n_bias = 2;
    for (int i = 0; i < 20; i++)
        assert_int_equal(next(st, &p, l, V), 7);

    /* the ban beats the bias, and the greedy choice moves on */
    p.temperature = 0;
    p.ban_ids = weak;
    p.n_ban = 1;
    assert_int_equal(next(st, &p, l, V), 42);
    assert_memory_equal(l, copy, sizeof *l * V);
    p.n_bias = 0;
    p.ban_ids = ban42;
    assert_int_equal(next(st, &p, l, V), second);

    /* the reduced path declines with a bias or a ban, and the params say
     * so up front */
    struct sample_cands cs;
    sample_cands_from_row(l, V, &cs);
    struct sample_out out;
    struct rl_err err = {0};
    assert_false(sample_params_reducible(&p));
    assert_int_equal(sample_next_reduced(st, &p, &cs, V, NULL, &out, &err), 1);
    p.n_ban = 0;
    p.bias_ids = weak;
    p.bias = plus;
    p.n_bias = 1;
    assert_false(sample_params_reducible(&p));
    assert_int_equal(sample_next_reduced(st, &p, &cs, V, NULL, &out, &err), 1);
    p.n_bias = 0;
    assert_true(sample_params_reducible(&p));
    assert_int_equal(sample_next_reduced(st, &p, &cs, V, NULL, &out, &err), 0);
    assert_int_equal(out.token, 42);

    /* bad values are refused before anything is drawn */
    float huge[] = {101.0f};
    p.bias = huge;
    p.n_bias = 1;
    assert_int_equal(sample_next(st, &p, l, V, &out, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "logit_bias"));
    int32_t neg[] = {-1};
    p.n_bias = 0;
    p.ban_ids = neg;
    p.n_ban = 1;
    assert_int_equal(sample_params_check(&p, &err), -RL_EINVAL);
    sample_state_free(st);
    free(l);
    free(copy);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_ties),
        cmocka_unit_test(test_temperature_distribution),
        cmocka_unit_test(test_filters_small),
        cmocka_unit_test(test_filters_large_vocab),
        cmocka_unit_test(test_penalties_table),
        cmocka_unit_test(test_seeded_determinism),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_params_check),
        cmocka_unit_test(test_logit_bias_and_ban),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
