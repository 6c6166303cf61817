/* tests/unit/test_kv_fit.c - the CUDA backend's KV sizing (engine/cuda/
 * kv_fit.h) on fake devices: a 141 GB H200 and a 24 GB card under a
 * Qwen3-14B-shaped BF16 pool, and a card too small for one step, which must
 * be a clear error naming the device and the reserve. No GPU needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cuda/kv_fit.h"

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

/* Qwen3-14B: 40 layers, 8 KV heads of 128, BF16 K and V: 160 KiB a token. */
static size_t q14_block(int bs) { return 2 * (size_t)40 * 8 * 128 * (size_t)bs * 2; }

struct fit_case {
    const char *what;
    size_t total, free, pending, reserve;
    int block_size;
    long min_tokens;
    int rc;          /* 0 or -RL_ENOMEM */
    long tokens_min, tokens_max; /* expected range when rc == 0 */
};

static void test_cases(void **state)
{
    (void)state;
    /* H200: 143,771 MiB; 14B BF16 weights ~28 GiB + 2 GiB activations/workspace */
    size_t h200 = (size_t)143771 * MIB;
    const struct fit_case cases[] = {
        /* ~111 GiB of KV at 160 KiB/token: ~730k tokens, not the 1 GiB fallback's 6.5k */
        {"h200 14b", h200, h200 - 30 * GIB, 256 * MIB, 1024 * MIB, 16, 512, 0, 700000, 740000},
        /* 24 GB card, 8B-ish weights leave 6 GiB: ~36k tokens with a 512 MiB reserve */
        {"24gb", 24 * GIB, 6 * GIB, 128 * MIB, 512 * MIB, 16, 512, 0, 34000, 37000},
        /* too small: 700 MiB free, 512 reserve, 128 pending -> 60 MiB = 384 tokens < 512 */
        {"too small", 8 * GIB, 700 * MIB, 128 * MIB, 512 * MIB, 16, 512, -RL_ENOMEM, 0, 0},
        /* reserve larger than what is free: nothing, an error, no wrap-around */
        {"reserve > free", 24 * GIB, 1 * GIB, 0, 4 * GIB, 16, 1, -RL_ENOMEM, 0, 0},
        /* exactly one spare + one block */
        {"one block", GIB, 2 * q14_block(16), 0, 0, 16, 16, 0, 16, 16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct fit_case *c = &cases[i];
        struct kv_fit_in in = {"Fake GPU", c->total, c->free, c->pending, c->reserve, q14_block(c->block_size),
                               c->block_size, 1, c->min_tokens};
        struct kv_fit_out out;
        struct rl_err err = {0};
        int rc = kv_fit_compute(&in, &out, &err);
        if (rc != c->rc)
            fail_msg("%s: rc %d, want %d (%s)", c->what, rc, c->rc, err.msg);
        if (rc) {
            assert_non_null(strstr(err.msg, "Fake GPU"));
            assert_non_null(strstr(err.msg, "kv_reserve_mb"));
            assert_int_equal(out.n_blocks, 0);
            continue;
        }
        if (out.tokens < c->tokens_min || out.tokens > c->tokens_max)
            fail_msg("%s: %ld tokens, want %ld..%ld", c->what, out.tokens, c->tokens_min, c->tokens_max);
        assert_int_equal(out.tokens, (long)out.n_blocks * c->block_size);
        assert_true(out.bytes == (size_t)out.n_blocks * in.block_bytes);
        /* the pool plus its spare block, the pending and the reserve fit in what is free */
        assert_true(out.bytes + in.block_bytes + c->pending + c->reserve <= c->free);
        /* and one block more would not */
        assert_true(out.bytes + 2 * in.block_bytes + c->pending + c->reserve > c->free);
    }
}

static void test_bad_input(void **state)
{
    (void)state;
    struct kv_fit_in in = {NULL, GIB, GIB, 0, 0, 0, 16, 1, 1};
    struct kv_fit_out out;
    struct rl_err err = {0};
    assert_int_equal(kv_fit_compute(&in, &out, &err), -RL_EINVAL);
    in.block_bytes = 1024;
    in.block_size = 0;
    assert_int_equal(kv_fit_compute(&in, &out, &err), -RL_EINVAL);
    /* a huge device with a tiny block: capped to the engine's int */
    in.block_size = 1;
    in.block_bytes = 1;
    in.free_bytes = in.total_bytes = (size_t)1 << 40;
    assert_int_equal(kv_fit_compute(&in, &out, &err), 0);
    assert_int_equal(out.n_blocks, (1 << 30) - 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
