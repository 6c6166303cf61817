/* tests/unit/test_loadstats.c - the statistics of `redlm bench`
 * (worker/cli/loadstats.c): percentiles and summaries against values
 * numpy.percentile gives, fixed-width buckets, length distributions, and
 * the Poisson arrival generator's mean, variance and count. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/cli/loadstats.h"

static void test_rng_literal(void **state)
{
    (void)state;
    /* splitmix64's published first outputs for seed 0 */
    struct lst_rng r;
    lst_rng_seed(&r, 0);
    assert_true(lst_rng_next(&r) == 0xe220a8397b1dcdafull);
    assert_true(lst_rng_next(&r) == 0x6e789e6aa1b965f4ull);
    lst_rng_seed(&r, 7);
    for (int i = 0; i < 10000; i++) {
        double u = lst_rng_unit(&r);
        assert_true(u >= 0 && u < 1);
        int64_t k = lst_rng_range(&r, -3, 3);
        assert_true(k >= -3 && k <= 3);
    }
    assert_true(lst_seed_mix(1, 2, 3) != lst_seed_mix(1, 3, 2));
    assert_true(lst_seed_mix(1, 2, 3) == lst_seed_mix(1, 2, 3));
}

static const struct {
    double v[8];
    int n;
    double p, want; /* numpy.percentile(v[:n], p) */
} pct_cases[] = {
    {{1, 2, 3, 4, 5, 6, 7, 8}, 8, 50, 4.5},
    {{1, 2, 3, 4, 5, 6, 7, 8}, 8, 90, 7.3},
    {{1, 2, 3, 4, 5, 6, 7, 8}, 8, 99, 7.93},
    {{1, 2, 3, 4, 5, 6, 7, 8}, 8, 0, 1},
    {{1, 2, 3, 4, 5, 6, 7, 8}, 8, 100, 8},
    {{42}, 1, 50, 42},
    {{42}, 1, 99, 42},
    {{1, 2}, 2, 50, 1.5},
    {{1, 2}, 2, 90, 1.9},
    {{0, 10, 20, 30, 1000}, 5, 50, 20},
    {{0, 10, 20, 30, 1000}, 5, 90, 612},
    {{0, 10, 20, 30, 1000}, 5, 99, 961.2},
    {{5, 5, 5, 5}, 4, 99, 5},
};

static void test_percentile_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof pct_cases / sizeof pct_cases[0]; i++) {
        double got = lst_percentile(pct_cases[i].v, pct_cases[i].n, pct_cases[i].p);
        if (fabs(got - pct_cases[i].want) > 1e-9)
            fail_msg("case %zu: p%g = %.12g, want %.12g", i, pct_cases[i].p, got, pct_cases[i].want);
    }
}

static void test_summarize(void **state)
{
    (void)state;
    double v[] = {30, 1000, 0, 20, 10}; /* unsorted on purpose */
    struct lst_summary s;
    lst_summarize(v, 5, &s);
    assert_int_equal(s.n, 5);
    assert_true(v[0] == 0 && v[4] == 1000); /* sorted in place */
    assert_true(fabs(s.mean - 212) < 1e-9);
    assert_true(s.min == 0 && s.max == 1000);
    assert_true(fabs(s.p50 - 20) < 1e-9);
    assert_true(fabs(s.p90 - 612) < 1e-9);
    assert_true(fabs(s.p99 - 961.2) < 1e-9);
    assert_true(s.p50 <= s.p90 && s.p90 <= s.p99);
    lst_summarize(NULL, 0, &s);
    assert_int_equal(s.n, 0);
    assert_true(s.mean == 0 && s.p99 == 0);
}

static void test_buckets(void **state)
{
    (void)state;
    struct lst_buckets b;
    struct rl_err err;
    assert_int_equal(lst_buckets_init(&b, 0, 10, &err), -RL_EINVAL);
    assert_int_equal(lst_buckets_init(&b, 1.0, 10, &err), 0);
    assert_int_equal(b.n, 0);
    static const struct {
        double x, w;
    } adds[] = {{0.0, 1}, {0.5, 2}, {1.0, 4}, {2.999, 8}, {-1, 16}, {1e9, 32}, {9.5, 64}};
    for (size_t i = 0; i < sizeof adds / sizeof adds[0]; i++)
        assert_int_equal(lst_buckets_add(&b, adds[i].x, adds[i].w, &err), 0);
    static const double want[10] = {19, 4, 8, 0, 0, 0, 0, 0, 0, 96};
    assert_int_equal(b.n, 10);
    for (int i = 0; i < 10; i++)
        assert_true(b.sum[i] == want[i]);
    lst_buckets_free(&b);

    /* a histogram: values in 0.25-wide bins, growing past the first allocation */
    assert_int_equal(lst_buckets_init(&b, 0.25, 1000, &err), 0);
    static const double xs[] = {0.1, 0.2, 0.3, 0.74, 0.75, 100.0};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++)
        assert_int_equal(lst_buckets_add(&b, xs[i], 1, &err), 0);
    assert_int_equal(b.n, 401);
    assert_true(b.sum[0] == 2 && b.sum[1] == 1 && b.sum[2] == 1 && b.sum[3] == 1);
    assert_true(b.sum[400] == 1);
    double total = 0;
    for (int i = 0; i < b.n; i++)
        total += b.sum[i];
    assert_true(total == 6);
    lst_buckets_free(&b);
}

static const struct {
    const char *s;
    int rc, lo, hi;
} dist_cases[] = {
    {"32", 0, 32, 32},      {"16..64", 0, 16, 64}, {"1..1", 0, 1, 1},
    {"5..3", -RL_EINVAL, 0, 0}, {"abc", -RL_EINVAL, 0, 0}, {"0", -RL_EINVAL, 0, 0},
    {"1..", -RL_EINVAL, 0, 0},  {"..4", -RL_EINVAL, 0, 0}, {"4..9999999", -RL_EINVAL, 0, 0},
    {"", -RL_EINVAL, 0, 0},     {"3x", -RL_EINVAL, 0, 0},
};

static void test_dist(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof dist_cases / sizeof dist_cases[0]; i++) {
        struct lst_dist d = {0, 0};
        struct rl_err err = {0};
        int rc = lst_dist_parse(dist_cases[i].s, 1, 100000, &d, "--x", &err);
        if (rc != dist_cases[i].rc)
            fail_msg("\"%s\": rc %d, want %d", dist_cases[i].s, rc, dist_cases[i].rc);
        if (rc == 0)
            assert_true(d.lo == dist_cases[i].lo && d.hi == dist_cases[i].hi);
        else
            assert_true(strstr(err.msg, "--x") != NULL);
    }
    struct lst_dist d = {3, 6};
    struct lst_rng r;
    lst_rng_seed(&r, 11);
    int seen[7] = {0};
    for (int i = 0; i < 4000; i++) {
        int x = lst_dist_draw(&d, &r);
        assert_true(x >= 3 && x <= 6);
        seen[x]++;
    }
    for (int x = 3; x <= 6; x++) /* uniform: about 1000 each */
        assert_true(seen[x] > 850 && seen[x] < 1150);
    d.lo = d.hi = 9;
    assert_int_equal(lst_dist_draw(&d, &r), 9);
}

/* A Poisson process of rate 50/s: gaps have mean 1/50 and variance
 * 1/50^2, and about 50 arrivals fall in each second. 100000 gaps put the
 * mean's standard error at 0.3%, so 1.5% is five of them (the seed is
 * fixed, so this cannot flake; it fails if the generator is wrong). */
static void test_poisson_mean(void **state)
{
    (void)state;
    enum { N = 100000 };
    const double rate = 50;
    double *t = malloc(N * sizeof *t);
    assert_non_null(t);
    struct lst_rng r;
    lst_rng_seed(&r, 2026);
    lst_poisson_arrivals(&r, rate, N, t);
    double sum = 0, sq = 0, prev = 0;
    for (int i = 0; i < N; i++) {
        double g = t[i] - prev;
        assert_true(g > 0);
        prev = t[i];
        sum += g;
        sq += g * g;
    }
    double mean = sum / N, var = sq / N - mean * mean;
    assert_true(fabs(mean - 1 / rate) < 0.015 / rate);
    assert_true(fabs(var - 1 / (rate * rate)) < 0.05 / (rate * rate));
    /* arrivals in [0, 1000 s): 50000 expected, sd sqrt(50000) = 224 */
    int in = 0;
    for (int i = 0; i < N && t[i] < 1000; i++)
        in++;
    assert_true(in > 50000 - 1200 && in < 50000 + 1200);
    /* the same seed gives the same arrivals */
    double t2[4];
    lst_rng_seed(&r, 2026);
    lst_poisson_arrivals(&r, rate, 4, t2);
    assert_memory_equal(t, t2, sizeof t2);
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng_literal),     cmocka_unit_test(test_percentile_cases),
        cmocka_unit_test(test_summarize),       cmocka_unit_test(test_buckets),
        cmocka_unit_test(test_dist),            cmocka_unit_test(test_poisson_mean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
