/* tests/unit/test_route.c - the dispatcher's routing policy
 * (dispatcher/route.c): the splitter's within-one guarantee over every
 * window, soft switches, think rules, the order of the rules, and the
 * adaptive shift as a pure function. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dispatcher/route.h"
#include "job.h"

/* Over every window [a, a+n) of a run of N auto requests, the think count
 * is within one of n * ratio (exactly: floor or ceil of n * ppm / 1e6, and
 * |count - n * ratio| <= 1 for these ratios, whose ppm is exact). Prefix
 * sums make each window O(1), so all N*(N+1)/2 windows are checked. */
static void test_split_within_one_every_window(void **state)
{
    (void)state;
    static const double ratios[] = {0.0, 1.0, 0.3, 0.5, 0.1, 0.9, 0.25, 0.75, 0.333333,
                                    0.666667, 0.01, 0.99, 0.123457, 0.618034, 0.142857,
                                    0.000001, 0.999999, 0.2, 0.4, 0.6, 0.7, 0.8, 0.05, 0.45};
    enum { N = 1500 };
    static int prefix[N + 1];
    for (size_t r = 0; r < sizeof ratios / sizeof ratios[0]; r++) {
        struct route_split s;
        route_split_init(&s);
        int ppm = route_ratio_ppm(ratios[r]);
        prefix[0] = 0;
        for (int i = 0; i < N; i++)
            prefix[i + 1] = prefix[i] + route_split_next(&s, ppm);
        for (int a = 0; a < N; a++)
            for (int b = a + 1; b <= N; b++) {
                int count = prefix[b] - prefix[a];
                double want = (double)(b - a) * ratios[r];
                if (fabs(count - want) > 1.0)
                    fail_msg("ratio %g: window [%d, %d) has %d think, want %.3f +- 1", ratios[r],
                             a, b, count, want);
                /* the exact form: floor or ceil of n * ppm / 1e6 */
                int64_t lo = (int64_t)(b - a) * ppm / ROUTE_PPM;
                if (count != lo && count != lo + 1)
                    fail_msg("ratio %g: window [%d, %d) has %d, not %lld or %lld", ratios[r], a,
                             b, count, (long long)lo, (long long)lo + 1);
            }
    }
}

/* Many more ratios (every 1/997 step) on shorter runs, still all windows. */
static void test_split_many_ratios(void **state)
{
    (void)state;
    enum { N = 300 };
    int prefix[N + 1];
    for (int k = 0; k <= 997; k++) {
        int ppm = (int)((int64_t)k * ROUTE_PPM / 997);
        struct route_split s;
        route_split_init(&s);
        prefix[0] = 0;
        for (int i = 0; i < N; i++)
            prefix[i + 1] = prefix[i] + route_split_next(&s, ppm);
        for (int a = 0; a < N; a++)
            for (int b = a + 1; b <= N; b++) {
                double want = (double)(b - a) * ppm / ROUTE_PPM;
                int count = prefix[b] - prefix[a];
                if (fabs(count - want) >= 1.0)
                    fail_msg("ppm %d: window [%d, %d) has %d, want %.4f", ppm, a, b, count, want);
            }
    }
}

/* The job of text (the caller job_free()s it); fails the test when it
 * does not parse. */
static struct job *parse_job(const char *text)
{
    struct job *j;
    struct job_fault f;
    struct rl_err err;
    if (job_parse(text, strlen(text), NULL, &j, &f, &err))
        fail_msg("%s: %s", text, err.msg);
    return j;
}

/* A router over fast and think at ratio 0.3 (the caller route_free()s it),
 * and job_text parsed into *j. */
static struct router *router_at_0_3(const char *job_text, struct job **j)
{
    const char *pools[] = {"fast", "think"};
    struct route_opts o = {.pools = pools, .n_pools = 2, .default_pool = "fast", .ratio = 0.3};
    struct router *r;
    assert_int_equal(route_create(&r, &o, NULL), 0);
    *j = parse_job(job_text);
    return r;
}

/* 1000 auto requests at 0.3: 300 +- 1 on think, through route_decide. */
static void test_1000_at_0_3(void **state)
{
    (void)state;
    struct job *j;
    struct router *r = router_at_0_3("{\"prompt_ids\":[1,2,3]}", &j);
    int think = 0;
    for (int i = 0; i < 1000; i++) {
        struct route_decision d;
        assert_int_equal(route_decide(r, j, &d, NULL, NULL), 0);
        assert_true(d.is_auto);
        assert_int_equal(d.reason, ROUTE_BY_RATIO);
        assert_int_equal(d.mode, d.pool == 1 ? JOB_MODE_THINK : JOB_MODE_NO_THINK);
        think += d.pool == 1;
    }
    assert_in_range(think, 299, 301);
    job_free(j);
    route_free(r);
}

static void test_ratio_ppm(void **state)
{
    (void)state;
    static const struct {
        double r;
        int ppm;
    } cases[] = {{0, 0}, {1, ROUTE_PPM}, {0.3, 300000}, {-0.5, 0}, {1.5, ROUTE_PPM},
                 {0.0000004, 0}, {0.0000005, 1}, {NAN, 0}, {0.999999, 999999}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(route_ratio_ppm(cases[i].r), cases[i].ppm);
}

static void test_soft_switch(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        enum route_switch want;
    } cases[] = {
        {"", ROUTE_SWITCH_NONE},
        {"hello", ROUTE_SWITCH_NONE},
        {"/think", ROUTE_SWITCH_THINK},
        {"/no_think", ROUTE_SWITCH_NO_THINK},
        {"How many r's in strawberries? /no_think", ROUTE_SWITCH_NO_THINK},
        {"solve this /think", ROUTE_SWITCH_THINK},
        {"/think then /no_think", ROUTE_SWITCH_NO_THINK},  /* the last one wins */
        {"/no_think then /think", ROUTE_SWITCH_THINK},
        {"/no_think\n/think.", ROUTE_SWITCH_THINK},          /* punctuation ends it */
        {"line\t/no_think!", ROUTE_SWITCH_NO_THINK},
        {"/thinking about it", ROUTE_SWITCH_NONE},           /* not a whole word */
        {"/no_thinker", ROUTE_SWITCH_NONE},
        {"a/think", ROUTE_SWITCH_NONE},                      /* must start a word */
        {"http://x/no_think", ROUTE_SWITCH_NONE},
        {"/Think", ROUTE_SWITCH_NONE},                       /* case matters, as in Qwen3 */
        {"think", ROUTE_SWITCH_NONE},
        {"no_think", ROUTE_SWITCH_NONE},
        {"/ think", ROUTE_SWITCH_NONE},
        {"x /think_more /no_think", ROUTE_SWITCH_NO_THINK},
        {"/think /thinking", ROUTE_SWITCH_THINK},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        enum route_switch got = route_soft_switch(cases[i].text, strlen(cases[i].text));
        if (got != cases[i].want)
            fail_msg("\"%s\": got %d, want %d", cases[i].text, (int)got, (int)cases[i].want);
    }
    assert_int_equal(route_soft_switch(NULL, 0), ROUTE_SWITCH_NONE);
    /* a length cuts the text: "/thinkX" cut after "/think" is a switch */
    assert_int_equal(route_soft_switch("/thinkX", 6), ROUTE_SWITCH_THINK);
}

static void test_user_text(void **state)
{
    (void)state;
    static const struct {
        const char *job;
        const char *want; /* NULL: none */
    } cases[] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"},"
         "{\"role\":\"user\",\"content\":\"c /think\"}]}", "c /think"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"r\"}]}", "q"},
        {"{\"messages\":[{\"role\":\"system\",\"content\":\"/think\"}]}", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"},"
         "{\"type\":\"text\",\"text\":\"y\"}]}]}", "x\ny"},
        {"{\"prompt\":\"raw /think\"}", "raw /think"},
        {"{\"prompt_ids\":[1]}", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct job *j = parse_job(cases[i].job);
        size_t len;
        char *t = route_user_text(j, &len);
        if (!cases[i].want) {
            assert_null(t);
        } else {
            assert_non_null(t);
            assert_string_equal(t, cases[i].want);
            assert_int_equal(len, strlen(cases[i].want));
        }
        free(t);
        job_free(j);
    }
}

/* The order: pool > explicit mode > soft switch > rule > ratio. With the
 * ratio at 0, only the earlier rules can send anything to think. */
static void test_decide_order(void **state)
{
    (void)state;
    const char *pools[] = {"fast", "think", "batch"};
    const char *rules[] = {"(?i)\\bprove\\b", "^\\d{3,}$"};
    struct route_opts o = {.pools = pools, .n_pools = 3, .default_pool = "fast", .rules = rules,
                           .n_rules = 2, .ratio = 0.0};
    struct router *r;
    assert_int_equal(route_create(&r, &o, NULL), 0);
    assert_int_equal(route_think_pool(r), 1);
    assert_int_equal(route_fast_pool(r), 0);
#define U(t) "{\"messages\":[{\"role\":\"user\",\"content\":\"" t "\"}]"
    static const struct {
        const char *job;
        int pool;
        enum job_mode mode;
        enum route_reason reason;
    } cases[] = {
        {U("hi") "}", 0, JOB_MODE_NO_THINK, ROUTE_BY_RATIO},
        {U("hi") ",\"mode\":\"auto\"}", 0, JOB_MODE_NO_THINK, ROUTE_BY_RATIO},
        {U("hi") ",\"mode\":\"think\"}", 1, JOB_MODE_THINK, ROUTE_BY_MODE},
        {U("hi /think") ",\"mode\":\"no_think\"}", 0, JOB_MODE_NO_THINK, ROUTE_BY_MODE},
        {U("hi /think") "}", 1, JOB_MODE_THINK, ROUTE_BY_SWITCH},
        {U("prove it /no_think") "}", 0, JOB_MODE_NO_THINK, ROUTE_BY_SWITCH},
        {U("Prove that 2 is prime") "}", 1, JOB_MODE_THINK, ROUTE_BY_RULE},
        {U("improve this") "}", 0, JOB_MODE_NO_THINK, ROUTE_BY_RATIO},
        {U("12345") "}", 1, JOB_MODE_THINK, ROUTE_BY_RULE},
        {"{\"prompt\":\"prove it\"}", 1, JOB_MODE_THINK, ROUTE_BY_RULE},
        {"{\"prompt\":\"x /think\"}", 0, JOB_MODE_NO_THINK, ROUTE_BY_RATIO}, /* raw text: no switch */
        {U("prove it") ",\"pool\":\"batch\"}", 2, JOB_MODE_NO_THINK, ROUTE_BY_POOL},
        {U("hi") ",\"pool\":\"think\"}", 1, JOB_MODE_THINK, ROUTE_BY_POOL},
        {U("hi") ",\"pool\":\"think\",\"mode\":\"no_think\"}", 1, JOB_MODE_NO_THINK, ROUTE_BY_POOL},
        {"{\"prompt_ids\":[1],\"mode\":\"think\"}", 1, JOB_MODE_THINK, ROUTE_BY_MODE},
    };
#undef U
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct job *j = parse_job(cases[i].job);
        struct route_decision d;
        assert_int_equal(route_decide(r, j, &d, NULL, NULL), 0);
        if (d.pool != cases[i].pool || d.mode != cases[i].mode || d.reason != cases[i].reason)
            fail_msg("%s: pool %d mode %d by %s; want %d %d %s", cases[i].job, d.pool, d.mode,
                     route_reason_name(d.reason), cases[i].pool, cases[i].mode,
                     route_reason_name(cases[i].reason));
        assert_int_equal(d.is_auto, d.reason == ROUTE_BY_RULE || d.reason == ROUTE_BY_RATIO);
        job_free(j);
    }
    /* a pool that does not exist */
    struct job *j;
    struct job_fault f;
    const char *bad = "{\"prompt\":\"x\",\"pool\":\"gpu9\"}";
    assert_int_equal(job_parse(bad, strlen(bad), NULL, &j, &f, NULL), 0);
    struct route_decision d;
    enum ev_code code = EV_CODE_NONE;
    struct rl_err err;
    assert_int_equal(route_decide(r, j, &d, &code, &err), -RL_EINVAL);
    assert_int_equal(code, EV_CODE_UNKNOWN_POOL);
    assert_non_null(strstr(err.msg, "gpu9"));
    job_free(j);
    route_free(r);
}

static void test_bad_rule_and_pools(void **state)
{
    (void)state;
    const char *pools[] = {"fast", "think"};
    const char *rules[] = {"ok", "(unclosed"};
    struct route_opts o = {.pools = pools, .n_pools = 2, .default_pool = "fast", .rules = rules,
                           .n_rules = 2, .ratio = 0.5};
    struct router *r = NULL;
    struct rl_err err;
    assert_int_equal(route_create(&r, &o, &err), -RL_EINVAL);
    assert_null(r);
    assert_non_null(strstr(err.msg, "think_rules[1]"));
    /* no think pool: everything to the fast pool, even at ratio 1 */
    const char *only[] = {"a", "b"};
    struct route_opts o2 = {.pools = only, .n_pools = 2, .default_pool = "b", .ratio = 1.0};
    assert_int_equal(route_create(&r, &o2, NULL), 0);
    assert_int_equal(route_think_pool(r), -1);
    assert_int_equal(route_fast_pool(r), 1);
    struct job *j;
    struct job_fault f;
    assert_int_equal(job_parse("{\"prompt\":\"x\"}", 14, NULL, &j, &f, NULL), 0);
    for (int i = 0; i < 10; i++) {
        struct route_decision d;
        assert_int_equal(route_decide(r, j, &d, NULL, NULL), 0);
        assert_int_equal(d.pool, 1);
    }
    job_free(j);
    route_free(r);
    /* default_pool "think": the fast pool is the first other one */
    const char *p3[] = {"think", "x"};
    struct route_opts o3 = {.pools = p3, .n_pools = 2, .default_pool = "think", .ratio = 0.5};
    assert_int_equal(route_create(&r, &o3, NULL), 0);
    assert_int_equal(route_think_pool(r), 0);
    assert_int_equal(route_fast_pool(r), 1);
    route_free(r);
}

/* The adaptive shift as a table: (configured, min, max, threshold, think
 * wait, fast wait) -> effective ratio. */
static void test_adaptive(void **state)
{
    (void)state;
    static const struct {
        bool on;
        double ratio, lo, hi;
        int64_t thr, think_wait, fast_wait;
        double want;
    } cases[] = {
        {false, 0.3, 0.1, 0.6, 1000, 99999, 0, 0.3},  /* off: never moves */
        {true, 0.3, 0.1, 0.6, 1000, 0, 0, 0.3},       /* nothing waits */
        {true, 0.3, 0.1, 0.6, 1000, 1000, 0, 0.3},    /* at the threshold: not past it */
        {true, 0.3, 0.1, 0.6, 1000, 1001, 0, 0.1},    /* think backed up: to fast */
        {true, 0.3, 0.1, 0.6, 1000, 0, 1001, 0.6},    /* fast backed up: to think */
        {true, 0.3, 0.1, 0.6, 1000, 5000, 5000, 0.3}, /* both: no better place */
        {true, 0.3, 0.1, 0.6, 1000, 900, 500, 0.3},   /* both below */
        {true, 0.05, 0.1, 0.6, 1000, 2000, 0, 0.05},  /* never shifts toward the slow pool */
        {true, 0.8, 0.1, 0.6, 1000, 0, 2000, 0.8},
        {true, 0.3, 0.0, 1.0, 1, 2, 0, 0.0},
        {true, 0.3, 0.0, 1.0, 1, 0, 2, 1.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct route_adapt a = {.adaptive = cases[i].on, .ratio = cases[i].ratio,
                                .min_ratio = cases[i].lo, .max_ratio = cases[i].hi,
                                .threshold_ms = cases[i].thr, .think_wait_ms = cases[i].think_wait,
                                .fast_wait_ms = cases[i].fast_wait};
        double got = route_effective_ratio(&a);
        if (got != cases[i].want)
            fail_msg("case %zu: got %g, want %g", i, got, cases[i].want);
    }
}

/* A ratio change mid-run keeps the accumulator: the run at the new ratio
 * is still within one over its windows. */
static void test_ratio_change(void **state)
{
    (void)state;
    struct job *j;
    struct router *r = router_at_0_3("{\"prompt\":\"x\"}", &j);
    struct route_decision d;
    for (int i = 0; i < 37; i++)
        route_decide(r, j, &d, NULL, NULL);
    route_set_ratio(r, 0.1);
    assert_true(route_get_ratio(r) == 0.1);
    int think = 0;
    for (int i = 0; i < 500; i++) {
        route_decide(r, j, &d, NULL, NULL);
        think += d.pool == 1;
    }
    assert_in_range(think, 49, 51);
    job_free(j);
    route_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_within_one_every_window),
        cmocka_unit_test(test_split_many_ratios),
        cmocka_unit_test(test_1000_at_0_3),
        cmocka_unit_test(test_ratio_ppm),
        cmocka_unit_test(test_soft_switch),
        cmocka_unit_test(test_user_text),
        cmocka_unit_test(test_decide_order),
        cmocka_unit_test(test_bad_rule_and_pools),
        cmocka_unit_test(test_adaptive),
        cmocka_unit_test(test_ratio_change),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
