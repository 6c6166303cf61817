/* tests/unit/test_spec.c - the draft side of speculative decoding: prompt
 * lookup (longest suffix first, latest match, capped length) over literal
 * cases, the adaptive size and its back-off, and mode names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "spec.h"

static void test_ngram_cases(void **state)
{
    (void)state;
    static const struct {
        const char *what;
        int32_t tokens[16];
        int n, max_n;
        int32_t want[8];
        int n_want;
    } cases[] = {
        {"no repeat", {1, 2, 3, 4}, 4, 4, {0}, 0},
        {"1-gram", {5, 6, 7, 5}, 4, 4, {6, 7, 5}, 3},
        {"capped", {5, 6, 7, 5}, 4, 2, {6, 7}, 2},
        /* the 2-gram (8 9) beats the later 1-gram 9 */
        {"longest first", {8, 9, 1, 2, 9, 3, 8, 9}, 8, 3, {1, 2, 9}, 3},
        /* of two matches of the same length, the latest */
        {"latest", {1, 2, 7, 1, 2, 8, 1, 2}, 8, 1, {8}, 1},
        {"4-gram", {1, 2, 3, 4, 9, 1, 2, 3, 4}, 9, 4, {9, 1, 2, 3}, 4},
        {"overlapping", {4, 4, 4}, 3, 4, {4}, 1},
        {"one token", {4}, 1, 4, {0}, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t out[8] = {0};
        int n = spec_ngram_propose(cases[i].tokens, cases[i].n, 1, 4, out, cases[i].max_n);
        if (n != cases[i].n_want ||
            memcmp(out, cases[i].want, (size_t)n * sizeof(int32_t)))
            fail_msg("%s: got %d tokens (%d %d ...)", cases[i].what, n, out[0], out[1]);
    }
}

/* Starts at 1 (p = 0.4); full acceptance grows it to k; the size follows
 * p (p^i >= 0.2); misses shrink it and then pause, the pause doubling
 * while misses go on; a hit resets it. */
static void test_adapt(void **state)
{
    (void)state;
    struct spec_adapt a;
    spec_adapt_init(&a, 4);
    assert_int_equal(spec_adapt_want(&a), 1);
    spec_adapt_update(&a, 1, 1); /* p = 1.64 / 2.6 = 0.63: ^3 = 0.25, ^4 = 0.16 */
    assert_int_equal(spec_adapt_want(&a), 3);
    spec_adapt_update(&a, 3, 3); /* p = 4.31 / 5.08 = 0.85 */
    assert_int_equal(spec_adapt_want(&a), 4);
    spec_adapt_update(&a, 4, 0); /* p = 3.45 / 5.06 = 0.68: ^4 = 0.22 */
    assert_int_equal(spec_adapt_want(&a), 4);
    spec_adapt_update(&a, 4, 0); /* p = 2.76 / 5.05 = 0.55: ^2 = 0.30, ^3 = 0.16 */
    assert_int_equal(spec_adapt_want(&a), 2);
    spec_adapt_update(&a, 2, 0); /* third miss in a row: a pause of 8 */
    int paused = 0;
    while (spec_adapt_want(&a) == 0)
        paused++;
    assert_int_equal(paused, 8);
    assert_int_equal(a.k_cur > 0 ? a.k_cur : 1, 1);
    spec_adapt_update(&a, 1, 0); /* the probe misses: 16 */
    paused = 0;
    while (spec_adapt_want(&a) == 0)
        paused++;
    assert_int_equal(paused, 16);
    for (int i = 0; i < 20; i++) { /* never beyond 256 */
        spec_adapt_update(&a, 1, 0);
        while (spec_adapt_want(&a) == 0)
            ;
    }
    assert_int_equal(a.backoff, 256);
    spec_adapt_update(&a, 1, 1);
    assert_int_equal(a.backoff, 8);
    /* steady acceptance of 3 in 4 draft tokens keeps drafts of 4 */
    struct spec_adapt s;
    spec_adapt_init(&s, 4);
    for (int i = 0; i < 30; i++) {
        int d = spec_adapt_want(&s);
        spec_adapt_update(&s, d, i % 4 == 3 ? 0 : d);
    }
    assert_int_equal(spec_adapt_want(&s), 4);
    /* a request whose drafts never hold: two single-token drafts
     * (p = 0.25, then 0.17 < 0.2), then pauses of 8, 16, 32 with one
     * probe between: 5 draft rows over its first 64 decode steps */
    struct spec_adapt z;
    spec_adapt_init(&z, 4);
    int rows = 0;
    for (int step = 0; step < 64; step++) {
        int d = spec_adapt_want(&z);
        rows += d;
        spec_adapt_update(&z, d, 0);
    }
    assert_int_equal(rows, 5);
    struct spec_adapt one;
    spec_adapt_init(&one, 1);
    assert_int_equal(spec_adapt_want(&one), 1);
    struct spec_adapt off;
    spec_adapt_init(&off, 0);
    assert_int_equal(spec_adapt_want(&off), 0);
}

static void test_mode_names(void **state)
{
    (void)state;
    enum spec_mode m = SPEC_NGRAM;
    assert_int_equal(spec_mode_parse("off", &m), 0);
    assert_int_equal(m, SPEC_OFF);
    assert_int_equal(spec_mode_parse("ngram", &m), 0);
    assert_int_equal(m, SPEC_NGRAM);
    assert_int_equal(spec_mode_parse("eagle", &m), -1);
    assert_string_equal(spec_mode_name(SPEC_NGRAM), "ngram");
    assert_string_equal(spec_mode_name(SPEC_OFF), "off");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram_cases),
        cmocka_unit_test(test_adapt),
        cmocka_unit_test(test_mode_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
