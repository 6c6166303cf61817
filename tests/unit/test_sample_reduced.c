/* tests/unit/test_sample_reduced.c - sampling from a reduced candidate set
 * (engine/sample.h sample_next_reduced, issue 25 point 4) against the full
 * row's sampler, the reference, bit for bit: for every setting in the
 * table, two states with the same seed and prompt walk the same sequence of
 * rows; one samples each full row, the other the row's 64-entry set (as
 * the CUDA backend will hand it over) and the full row only when the set
 * says it cannot prove the answer. Tokens must agree at every step, the
 * streams must stay in step (the next raw number equal), and each case
 * says whether the set must have been used always, never, or at least once
 * - so the fast path is shown both taken and refused where it must be. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sample.h"

enum rows { R_UNIFORM, R_PEAKED, R_TIES, R_NEGINF };
enum masks { M_NONE, M_HALF, M_FEW };
enum expect { E_ALWAYS, E_NEVER, E_SOME };

struct rcase {
    const char *what;
    int n_vocab;
    enum rows rows;
    enum masks masks;
    int device_mask; /* the set built after the mask (CUDA masks on the device first) */
    struct sample_params p;
    int n_prompt;    /* prompt tokens: the row's best ids, so penalties bite */
    enum expect expect;
};

static uint32_t lcg(uint32_t *x)
{
    *x = *x * 1664525u + 1013904223u;
    return *x >> 8;
}

/* Row rs of a case: deterministic, different each step. Peaked rows keep
 * their shape within a seed (rs / 1000) and move a little per step, so the
 * prompt's tokens - the first row's best - stay among the set's members
 * and penalties push them down, as a repetitive generation does. */
static void make_row(float *l, int n, enum rows kind, uint32_t rs)
{
    uint32_t x = (kind == R_PEAKED ? rs / 1000 : rs) * 2654435761u + 17, y = rs * 40503u + 5;
    for (int i = 0; i < n; i++) {
        float u = (float)lcg(&x) / (float)(1u << 24);
        switch (kind) {
        case R_UNIFORM: l[i] = -5 + 10 * u; break;
        case R_PEAKED: l[i] = -2 + 4 * u + 0.05f * (float)lcg(&y) / (float)(1u << 24); break;
        case R_TIES: l[i] = (float)(int)(8 * u); break; /* 8 values: huge ties */
        case R_NEGINF: l[i] = u < 0.5f ? -INFINITY : -3 + 6 * u; break;
        }
    }
    if (kind == R_PEAKED) /* a dozen strong tokens, as a trained model's rows look */
        for (int j = 0; j < 12; j++)
            l[lcg(&x) % (uint32_t)n] = 8 + 4 * (float)lcg(&y) / (float)(1u << 24);
}

static void make_mask(uint32_t *m, int n, enum masks kind, uint32_t seed, const float *row)
{
    int W = (n + 31) / 32;
    uint32_t x = seed * 7919u + 3;
    for (int w = 0; w < W; w++)
        m[w] = kind == M_HALF ? (lcg(&x) << 8) ^ lcg(&x) : 0;
    if (kind == M_FEW) { /* a handful of allowed tokens, usually outside any top 64 */
        for (int j = 0; j < 5; j++) {
            int id = (int)(lcg(&x) % (uint32_t)n);
            m[id >> 5] |= 1u << (id & 31);
        }
        if (seed % 3 == 0) { /* sometimes the row's best too */
            int best = 0;
            for (int i = 1; i < n; i++)
                if (row[i] > row[best])
                    best = i;
            m[best >> 5] |= 1u << (best & 31);
        }
    }
}

static void run_case(const struct rcase *c)
{
    const int n = c->n_vocab, W = (n + 31) / 32;
    float *row = malloc(sizeof *row * (size_t)n), *dev = malloc(sizeof *dev * (size_t)n);
    uint32_t *mask = malloc(sizeof *mask * (size_t)W);
    struct sample_cands *cs = malloc(sizeof *cs);
    assert_non_null(row);
    assert_non_null(dev);
    assert_non_null(mask);
    assert_non_null(cs);
    int n_reduced = 0, n_full = 0;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        /* the prompt: the first row's best ids, so penalties lower set members */
        int32_t prompt[64];
        make_row(row, n, c->rows, (uint32_t)seed * 1000);
        sample_cands_from_row(row, n, cs);
        int np = c->n_prompt < cs->n ? c->n_prompt : cs->n;
        for (int j = 0; j < np; j++)
            prompt[j] = cs->c[j].id;
        struct sample_state *ref = NULL, *red = NULL;
        struct rl_err err = {0};
        assert_int_equal(sample_state_create(&ref, seed * 77, prompt, np, &err), 0);
        assert_int_equal(sample_state_create(&red, seed * 77, prompt, np, &err), 0);
        for (int step = 0; step < 12; step++) {
            uint32_t rs = (uint32_t)(seed * 1000 + (uint64_t)step);
            make_row(row, n, c->rows, rs);
            const uint32_t *mk = NULL;
            if (c->masks != M_NONE) {
                make_mask(mask, n, c->masks, rs, row);
                mk = mask;
            }
            memcpy(dev, row, sizeof *row * (size_t)n);
            if (mk && c->device_mask)
                for (int i = 0; i < n; i++)
                    if (!(mask[i >> 5] >> (i & 31) & 1u))
                        dev[i] = -INFINITY;
            sample_cands_from_row(dev, n, cs);

            struct sample_out a, b;
            struct rl_err ea = {0}, eb = {0};
            int ra = sample_next_masked(ref, &c->p, row, n, mk, &a, &ea);
            int rb = sample_next_reduced(red, &c->p, cs, n, mk, &b, &eb);
            assert_true(rb == 0 || rb == 1);
            if (rb == 1) {
                n_full++;
                rb = sample_next_masked(red, &c->p, dev, n, mk, &b, &eb);
            } else {
                n_reduced++;
            }
            if (ra != rb)
                fail_msg("%s seed %d step %d: full rc %d (%s), reduced rc %d (%s)", c->what, (int)seed, step, ra,
                         ea.msg, rb, eb.msg);
            if (ra)
                break; /* both failed alike (a mask that allows nothing finite) */
            if (a.token != b.token)
                fail_msg("%s seed %d step %d: full picked %d, reduced %d", c->what, (int)seed, step, a.token,
                         b.token);
        }
        /* the streams are in step: the same next raw number */
        double ua = sample_rng_uniform(ref), ub = sample_rng_uniform(red);
        if (ua != ub)
            fail_msg("%s seed %d: streams diverged", c->what, (int)seed);
        sample_state_free(ref);
        sample_state_free(red);
    }
    if (c->expect == E_ALWAYS && n_full)
        fail_msg("%s: %d rows fell back to the full row, expected none", c->what, n_full);
    if (c->expect == E_NEVER && n_reduced)
        fail_msg("%s: %d rows sampled from the set, expected none", c->what, n_reduced);
    if (c->expect == E_SOME && !n_reduced)
        fail_msg("%s: the set was never used", c->what);
    print_message("  %-44s %3d from the set, %3d full rows\n", c->what, n_reduced, n_full);
    free(row);
    free(dev);
    free(mask);
    free(cs);
}

#pragma GCC diagnostic ignored "-Woverride-init" /* P(): defaults, then the case's own */
#define P(...) ((struct sample_params){.temperature = 1, .top_p = 1, .repetition_penalty = 1, __VA_ARGS__})

static const struct rcase cases[] = {
    {"greedy", 151936, R_UNIFORM, M_NONE, 0, P(.temperature = 0), 0, E_ALWAYS},
    {"greedy ties", 4096, R_TIES, M_NONE, 0, P(.temperature = 0), 0, E_ALWAYS},
    {"greedy, lowering penalties", 4096, R_PEAKED, M_NONE, 0,
     P(.temperature = 0, .repetition_penalty = 1.3f, .frequency_penalty = 0.5f, .presence_penalty = 0.4f), 8, E_SOME},
    {"top_k 20 top_p 0.95 T 0.6 (Qwen3)", 151936, R_PEAKED, M_NONE, 0,
     P(.temperature = 0.6f, .top_k = 20, .top_p = 0.95f), 0, E_ALWAYS},
    {"top_k 20 T 0.7 uniform", 151936, R_UNIFORM, M_NONE, 0, P(.temperature = 0.7f, .top_k = 20), 0, E_ALWAYS},
    {"top_k 64 T 1.3", 8192, R_UNIFORM, M_NONE, 0, P(.temperature = 1.3f, .top_k = 64), 0, E_ALWAYS},
    {"top_k 1", 8192, R_UNIFORM, M_NONE, 0, P(.top_k = 1), 0, E_ALWAYS},
    {"top_k 64 ties", 4096, R_TIES, M_NONE, 0, P(.top_k = 64, .top_p = 0.5f), 0, E_ALWAYS},
    {"top_k 65: full row", 8192, R_UNIFORM, M_NONE, 0, P(.top_k = 65), 0, E_NEVER},
    {"top_k 40 min_p 0.1 top_p 0.8", 8192, R_PEAKED, M_NONE, 0,
     P(.top_k = 40, .min_p = 0.1f, .top_p = 0.8f), 0, E_ALWAYS},
    {"top_k 30, lowering penalties", 8192, R_PEAKED, M_NONE, 0,
     P(.top_k = 30, .repetition_penalty = 1.5f, .frequency_penalty = 1, .presence_penalty = 1), 64, E_SOME},
    {"min_p 0.05 peaked", 151936, R_PEAKED, M_NONE, 0, P(.min_p = 0.05f), 0, E_ALWAYS},
    {"min_p 0.05 top_p 0.9 peaked", 151936, R_PEAKED, M_NONE, 0, P(.min_p = 0.05f, .top_p = 0.9f), 0, E_ALWAYS},
    {"min_p 0.2 top_p 0.7 T 0.8 ties: full row", 4096, R_TIES, M_NONE, 0,
     P(.temperature = 0.8f, .min_p = 0.2f, .top_p = 0.7f), 0, E_NEVER},
    {"min_p 0.05 uniform: full row", 8192, R_UNIFORM, M_NONE, 0, P(.min_p = 0.05f), 0, E_NEVER},
    {"top_p 0.9 alone: full row", 8192, R_PEAKED, M_NONE, 0, P(.top_p = 0.9f), 0, E_NEVER},
    {"raising penalties: full row", 8192, R_PEAKED, M_NONE, 0, P(.top_k = 20, .repetition_penalty = 0.8f), 8,
     E_NEVER},
    {"negative presence: full row", 8192, R_PEAKED, M_NONE, 0, P(.temperature = 0, .presence_penalty = -1), 8,
     E_NEVER},
    {"logprobs: full row", 8192, R_PEAKED, M_NONE, 0, P(.top_k = 20, .logprobs = 1, .n_logprobs = 5), 0, E_NEVER},
    {"-inf entries, top_k 50", 4096, R_NEGINF, M_NONE, 0, P(.top_k = 50), 0, E_ALWAYS},
    {"half mask, host, top_k 20", 8192, R_UNIFORM, M_HALF, 0, P(.top_k = 20), 0, E_SOME},
    {"half mask, device, top_k 20", 8192, R_UNIFORM, M_HALF, 1, P(.top_k = 20), 0, E_ALWAYS},
    {"few allowed, host, greedy", 8192, R_UNIFORM, M_FEW, 0, P(.temperature = 0), 0, E_SOME},
    {"few allowed, device, top_k 20", 8192, R_UNIFORM, M_FEW, 1, P(.top_k = 20), 0, E_ALWAYS},
    {"few allowed, device, min_p 0.1", 8192, R_UNIFORM, M_FEW, 1, P(.min_p = 0.1f), 0, E_ALWAYS},
    {"whole row in the set (vocab 50), top_p", 50, R_UNIFORM, M_NONE, 0, P(.top_p = 0.7f), 0, E_ALWAYS},
    {"whole row, raising penalties", 64, R_PEAKED, M_NONE, 0, P(.top_k = 10, .repetition_penalty = 0.7f), 10,
     E_ALWAYS},
};

static void test_reduced_vs_full(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i]);
}

static void test_bad_rows(void **state)
{
    (void)state;
    enum { N = 1000 };
    float row[N];
    struct sample_cands cs;
    struct sample_out out;
    struct rl_err err = {0};
    struct sample_params p = P(.top_k = 10);
    struct sample_state *st = NULL;
    assert_int_equal(sample_state_create(&st, 1, NULL, 0, &err), 0);
    for (int i = 0; i < N; i++)
        row[i] = (float)(i % 17);
    row[500] = NAN;
    sample_cands_from_row(row, N, &cs);
    assert_int_equal(cs.n_bad, 1);
    assert_int_equal(cs.n, SAMPLE_CANDS);
    /* ranked, ties to the lower id */
    assert_true(cs.c[0].z == 16 && cs.c[0].id == 16);
    assert_true(cs.c[1].z == 16 && cs.c[1].id == 33);
    /* a NaN: the full row must say so */
    assert_int_equal(sample_next_reduced(st, &p, &cs, N, NULL, &out, &err), 1);
    row[500] = INFINITY;
    sample_cands_from_row(row, N, &cs);
    assert_int_equal(cs.n_bad, 1);
    assert_int_equal(sample_next_reduced(st, &p, &cs, N, NULL, &out, &err), 1);
    /* a malformed set is an error, not a crash */
    cs.n = 0;
    assert_int_equal(sample_next_reduced(st, &p, &cs, N, NULL, &out, &err), -RL_EINVAL);
    assert_true(sample_params_reducible(&p));
    p.top_k = 0;
    assert_false(sample_params_reducible(&p));
    p.min_p = 0.1f;
    assert_true(sample_params_reducible(&p));
    p.logprobs = 1;
    assert_false(sample_params_reducible(&p));
    sample_state_free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reduced_vs_full),
        cmocka_unit_test(test_bad_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
