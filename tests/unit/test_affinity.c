/* tests/unit/test_affinity.c - the block-hash filter of prefix-affine
 * pulling (common/affinity.h): what is added is found, the leading run is
 * counted, sizes are powers of two, base64 round-trips and refuses what is
 * not base64; and the hashes a worker's KV cache registers are the ones the
 * dispatcher chains (kv_each_cached against kv_hash_block). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "affinity.h"
#include "base64.h"
#include "kv_cache.h"

static void test_size(void **state)
{
    (void)state;
    assert_int_equal(aff_size(0), AFF_MIN_BYTES);
    assert_int_equal(aff_size(2048), 2048);
    assert_int_equal(aff_size(3000), 2048);
    assert_int_equal(aff_size(1u << 30), AFF_MAX_BYTES);
}

static void test_filter(void **state)
{
    (void)state;
    uint8_t bits[2048] = {0};
    uint64_t h[64];
    for (int i = 0; i < 64; i++) {
        h[i] = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        aff_add(bits, sizeof bits, h[i]);
    }
    for (int i = 0; i < 64; i++)
        assert_true(aff_has(bits, sizeof bits, h[i]));
    assert_int_equal(aff_prefix_len(bits, sizeof bits, h, 64), 64);
    int fp = 0;
    for (uint64_t x = 1; x <= 10000; x++)
        fp += aff_has(bits, sizeof bits, x * 0xd1b54a32d192ed03ull);
    assert_true(fp < 20); /* 64 hashes x 3 bits in 16384: ~0.0002 */
    uint64_t run[4] = {h[0], h[1], 12345, h[3]};
    assert_int_equal(aff_prefix_len(bits, sizeof bits, run, 4), 2);
}

static void test_b64(void **state)
{
    (void)state;
    uint8_t b[256], back[256];
    for (int i = 0; i < 256; i++)
        b[i] = (uint8_t)(i * 37 + 11);
    for (size_t n = 0; n < 8; n++) {
        char *s = b64_encode(b, n + 64);
        assert_non_null(s);
        assert_int_equal(strlen(s), (n + 64 + 2) / 3 * 4);
        assert_int_equal(b64_decode(s, strlen(s), back, sizeof back), (long)(n + 64));
        assert_memory_equal(b, back, n + 64);
        assert_true(b64_decode(s, strlen(s), back, n + 63) < 0); /* too long for cap */
        free(s);
    }
    assert_true(b64_decode("ab!d", 4, back, sizeof back) < 0);
    assert_true(b64_decode("abc", 3, back, sizeof back) < 0);
    assert_true(b64_decode("a=bc", 4, back, sizeof back) < 0);
}

static void collect(void *ctx, uint64_t h)
{
    aff_add(ctx, 1024, h);
}

/* The worker's side (kv_each_cached over committed blocks) and the
 * dispatcher's (kv_hash_block chained from the salt) agree. */
static void test_kv_agrees(void **state)
{
    (void)state;
    struct kv_cache *kv;
    struct kv_seq *seq;
    struct rl_err err;
    assert_int_equal(kv_cache_create(&kv, 64, 16, &err), 0);
    assert_int_equal(kv_seq_create(kv, &seq, &err), 0);
    kv_seq_set_salt(seq, 77);
    int32_t tok[70];
    for (int i = 0; i < 70; i++)
        tok[i] = 100 + i * 3;
    assert_int_equal(kv_seq_append(seq, tok, 70, &err), 0);
    assert_int_equal(kv_seq_commit(seq, 70, &err), 0);
    uint8_t bits[1024] = {0};
    kv_each_cached(kv, collect, bits);
    uint64_t h[4], x = 77;
    for (int b = 0; b < 4; b++)
        h[b] = x = kv_hash_block(x, tok + b * 16, 16);
    assert_int_equal(aff_prefix_len(bits, sizeof bits, h, 4), 4);
    uint64_t other = kv_hash_block(0, tok, 16); /* another salt: not held */
    assert_false(aff_has(bits, sizeof bits, other));
    kv_seq_free(seq);
    kv_cache_free(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size),
        cmocka_unit_test(test_filter),
        cmocka_unit_test(test_b64),
        cmocka_unit_test(test_kv_agrees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
