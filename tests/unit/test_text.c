/* tests/unit/test_text.c - the shared text buffer (common/text.c): appends
 * and printf keep it NUL-terminated across growth, reserve makes room
 * without adding, clear keeps the memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "text.h"

static void test_add_printf_clear(void **state)
{
    (void)state;
    struct text t = {0};
    assert_int_equal(text_add(&t, "", 0), 0);
    assert_non_null(t.p);
    assert_string_equal(t.p, "");
    assert_int_equal(text_add(&t, "ab\0cd", 5), 0); /* bytes, not a C string */
    assert_int_equal(t.n, 5);
    assert_memory_equal(t.p, "ab\0cd", 6);
    text_clear(&t);
    static const struct {
        const char *fmt;
        int arg;
        const char *want;
    } cases[] = {
        {"%d", 42, "42"},
        {" [%05d]", 7, "42 [00007]"},
    };
    for (size_t i = 0; i < 2; i++) {
        text_printf(&t, cases[i].fmt, cases[i].arg);
        assert_string_equal(t.p, cases[i].want);
    }
    /* past several doublings, one piece at a time and in one call */
    char big[5000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    text_printf(&t, "%s|", big);
    assert_int_equal(t.n, 10 + 4999 + 1);
    assert_int_equal(t.p[t.n], 0);
    assert_int_equal(t.p[t.n - 1], '|');
    assert_false(t.oom);
    size_t cap = t.cap;
    text_clear(&t);
    assert_int_equal(t.n, 0);
    assert_int_equal(t.cap, cap);
    assert_string_equal(t.p, "");
    text_free(&t);
    assert_null(t.p);
    assert_int_equal(t.cap, 0);
}

static void test_reserve(void **state)
{
    (void)state;
    struct text t = {0};
    assert_int_equal(text_reserve(&t, 0), 0);
    assert_non_null(t.p);
    assert_string_equal(t.p, ""); /* a string, not fresh heap (fuzz_compat found it) */
    assert_int_equal(text_reserve(&t, 1000), 0);
    assert_true(t.cap >= 1001);
    assert_int_equal(t.n, 0);
    memcpy(t.p, "hello", 5); /* the caller writes, then counts */
    t.n = 5;
    assert_int_equal(text_add(&t, "!", 1), 0);
    assert_string_equal(t.p, "hello!");
    /* n cut back by hand: reserving gives the string of the n bytes kept */
    t.n = 2;
    assert_int_equal(text_reserve(&t, 0), 0);
    assert_string_equal(t.p, "he");
    text_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_printf_clear),
        cmocka_unit_test(test_reserve),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
