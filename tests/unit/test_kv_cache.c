/* tests/unit/test_kv_cache.c - block allocator, prefix cache, eviction. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv_cache.h"

#define BS 16

static struct kv_cache *mk(int n_blocks)
{
    struct kv_cache *kv = NULL;
    struct rl_err err = {0};
    assert_int_equal(kv_cache_create(&kv, n_blocks, BS, &err), 0);
    return kv;
}

static void check(const struct kv_cache *kv)
{
    struct rl_err err = {0};
    int rc = kv_check(kv, &err);
    if (rc)
        fail_msg("kv_check: %s", err.msg);
}

/* Tokens base, base+1, ... */
static void fill(int32_t *t, int n, int32_t base)
{
    for (int i = 0; i < n; i++)
        t[i] = base + i;
}

/* A sequence that has matched, appended and committed the whole prompt, as
 * a finished prefill leaves it. Returns the tokens it had cached. */
static struct kv_seq *prefill(struct kv_cache *kv, const int32_t *p, int n,
                              int *n_cached)
{
    struct kv_seq *s = NULL;
    struct rl_err err = {0};
    int c = -1;
    assert_int_equal(kv_seq_create(kv, &s, &err), 0);
    assert_int_equal(kv_seq_match_prefix(s, p, n, &c, &err), 0);
    assert_int_equal(kv_seq_append(s, p + c, n - c, &err), 0);
    assert_int_equal(kv_seq_commit(s, n, &err), 0);
    if (n_cached)
        *n_cached = c;
    return s;
}

static void test_alloc_free_refcounts(void **state)
{
    (void)state;
    struct kv_cache *kv = mk(8);
    struct kv_seq *s = NULL;
    struct rl_err err = {0};
    int32_t t[64];
    fill(t, 64, 100);
    assert_int_equal(kv_free_blocks(kv), 8);
    assert_int_equal(kv_seq_create(kv, &s, &err), 0);
    assert_int_equal(kv_blocks_needed(kv, s, 40), 3);
    assert_int_equal(kv_blocks_needed(kv, NULL, 16), 1);
    assert_int_equal(kv_blocks_needed(kv, NULL, 17), 2);
    assert_int_equal(kv_seq_append(s, t, 40, &err), 0);
    assert_int_equal(kv_seq_n_blocks(s), 3);
    assert_int_equal(kv_seq_n_tokens(s), 40);
    assert_int_equal(kv_seq_n_computed(s), 0);
    const int32_t *bt = kv_seq_block_table(s);
    assert_int_equal(bt[0], 0);
    assert_int_equal(bt[1], 1);
    assert_int_equal(bt[2], 2);
    for (int b = 0; b < 3; b++)
        assert_int_equal(kv_block_refcount(kv, b), 1);
    assert_int_equal(kv_block_refcount(kv, 3), 0);
    assert_int_equal(kv_block_refcount(kv, 8), -1);
    assert_int_equal(kv_free_blocks(kv), 5);
    /* 8 more tokens fit the last block; the 9th needs a new one */
    assert_int_equal(kv_blocks_needed(kv, s, 8), 0);
    assert_int_equal(kv_blocks_needed(kv, s, 9), 1);
    for (int i = 0; i < 8; i++) /* one-token appends, as decode does */
        assert_int_equal(kv_seq_append(s, t + 40 + i, 1, &err), 0);
    assert_int_equal(kv_seq_n_blocks(s), 3);
    assert_int_equal(kv_seq_append(s, t + 48, 1, &err), 0);
    assert_int_equal(kv_seq_n_blocks(s), 4);
    assert_memory_equal(kv_seq_tokens(s), t, 49 * sizeof(int32_t));
    check(kv);
    /* uncommitted blocks are not cached: all four go back to free */
    kv_seq_free(s);
    assert_int_equal(kv_free_blocks(kv), 8);
    struct kv_stats st;
    kv_get_stats(kv, &st);
    assert_int_equal(st.n_free, 8);
    assert_int_equal(st.n_evictable, 0);
    assert_int_equal(st.n_used, 0);
    check(kv);
    /* bad arguments change nothing */
    assert_int_equal(kv_seq_create(kv, &s, &err), 0);
    int32_t bad = -5;
    assert_int_equal(kv_seq_append(s, &bad, 1, &err), -RL_EINVAL);
    assert_int_equal(err.code, RL_EINVAL);
    assert_int_equal(kv_seq_commit(s, 1, &err), -RL_EINVAL);
    assert_int_equal(kv_seq_n_tokens(s), 0);
    kv_seq_free(s);
    struct kv_cache *kv2 = NULL;
    assert_int_equal(kv_cache_create(&kv2, 0, BS, &err), -RL_EINVAL);
    assert_null(kv2);
    kv_cache_free(kv);
}

static void test_shared_system_prompt(void **state)
{
    (void)state;
    struct kv_cache *kv = mk(16);
    int32_t a[50], b[50];
    fill(a, 50, 1000);
    memcpy(b, a, 40 * sizeof(int32_t));  /* same first 40 tokens */
    fill(b + 40, 10, 5000);
    int c = -1;
    struct kv_seq *sa = prefill(kv, a, 40, &c);
    assert_int_equal(c, 0);
    const int32_t *ta = kv_seq_block_table(sa);
    assert_true(kv_block_is_cached(kv, ta[0]));
    assert_true(kv_block_is_cached(kv, ta[1]));
    assert_false(kv_block_is_cached(kv, ta[2])); /* 8 of 16 slots: partial */

    int probe_cached = -1;
    /* 50 tokens = 4 blocks, 2 of them found (held, not evictable): 2 new */
    assert_int_equal(kv_probe_prefix(kv, b, 50, &probe_cached), 2);
    assert_int_equal(probe_cached, 32);

    struct kv_seq *sb = prefill(kv, b, 50, &c);
    assert_int_equal(c, 32);
    const int32_t *tb = kv_seq_block_table(sb);
    assert_int_equal(tb[0], ta[0]);
    assert_int_equal(tb[1], ta[1]);
    assert_int_not_equal(tb[2], ta[2]);
    assert_int_equal(kv_block_refcount(kv, ta[0]), 2);
    assert_int_equal(kv_block_refcount(kv, ta[1]), 2);
    assert_int_equal(kv_block_refcount(kv, ta[2]), 1);
    assert_int_equal(kv_seq_n_blocks(sb), 4);
    assert_int_equal(kv_seq_n_computed(sb), 50);
    assert_memory_equal(kv_seq_tokens(sb), b, sizeof b);

    struct kv_stats st;
    kv_get_stats(kv, &st);
    assert_int_equal(st.hit_blocks, 2);
    assert_int_equal(st.hit_tokens, 32);
    assert_int_equal(st.miss_tokens, 40 + 18);
    assert_int_equal(st.miss_blocks, 3 + 2);
    assert_int_equal(st.n_used, 3 + 2);
    check(kv);

    /* freeing A keeps the shared blocks alive for B */
    int32_t a0 = ta[0], a1 = ta[1];
    kv_seq_free(sa);
    assert_int_equal(kv_block_refcount(kv, a0), 1);
    assert_int_equal(kv_block_refcount(kv, a1), 1);
    kv_seq_free(sb);
    /* b's three full blocks stay cached and evictable, the partial is free */
    kv_get_stats(kv, &st);
    assert_int_equal(st.n_evictable, 3);
    assert_int_equal(st.n_used, 0);
    assert_int_equal(kv_free_blocks(kv), 16);
    check(kv);

    /* a third request with the whole of b as a prefix hits 3 blocks, and the
     * evictable hits count against admission */
    int32_t c3[60];
    memcpy(c3, b, sizeof b);
    fill(c3 + 50, 10, 7);
    assert_int_equal(kv_probe_prefix(kv, c3, 60, &probe_cached), 4 - 3 + 3);
    assert_int_equal(probe_cached, 48);
    kv_reset_stats(kv);
    kv_get_stats(kv, &st);
    assert_int_equal(st.hit_tokens, 0);
    kv_cache_free(kv);
}

static void test_partial_last_block_never_shared(void **state)
{
    (void)state;
    struct kv_cache *kv = mk(16);
    int32_t p[40];
    fill(p, 40, 1);
    int c = -1;
    struct kv_seq *sa = prefill(kv, p, 40, NULL);
    /* identical 40-token prompt: the partial third block is not reused */
    struct kv_seq *sb = prefill(kv, p, 40, &c);
    assert_int_equal(c, 32);
    assert_int_not_equal(kv_seq_block_table(sb)[2], kv_seq_block_table(sa)[2]);
    assert_int_equal(kv_block_refcount(kv, kv_seq_block_table(sa)[2]), 1);
    kv_seq_free(sb);

    /* a prompt that is exactly two cached blocks: the second is not reused,
     * so the last token is recomputed and yields logits */
    struct kv_seq *sc = NULL;
    struct rl_err err = {0};
    assert_int_equal(kv_seq_create(kv, &sc, &err), 0);
    assert_int_equal(kv_seq_match_prefix(sc, p, 32, &c, &err), 0);
    assert_int_equal(c, 16);
    assert_int_equal(kv_seq_n_blocks(sc), 1);
    assert_int_equal(kv_seq_append(sc, p + 16, 16, &err), 0);
    int32_t own = kv_seq_block_table(sc)[1];
    assert_int_not_equal(own, kv_seq_block_table(sa)[1]);
    /* committing it finds A's equal block: the table switches to it and the
     * private copy goes back to the free list */
    struct kv_stats st;
    kv_get_stats(kv, &st);
    int free_before = st.n_free;
    assert_int_equal(kv_seq_commit(sc, 32, &err), 0);
    assert_int_equal(kv_seq_block_table(sc)[1], kv_seq_block_table(sa)[1]);
    assert_int_equal(kv_block_refcount(kv, own), 0);
    assert_false(kv_block_is_cached(kv, own));
    kv_get_stats(kv, &st);
    assert_int_equal(st.dedup_blocks, 1);
    assert_int_equal(st.n_free, free_before + 1);
    assert_int_equal(kv_block_refcount(kv, kv_seq_block_table(sa)[1]), 2);
    check(kv);

    /* a one-token prompt or an empty one never matches anything */
    struct kv_seq *sd = NULL;
    assert_int_equal(kv_seq_create(kv, &sd, &err), 0);
    assert_int_equal(kv_seq_match_prefix(sd, p, 1, &c, &err), 0);
    assert_int_equal(c, 0);
    /* and matching twice is refused */
    assert_int_equal(kv_seq_append(sd, p, 1, &err), 0);
    assert_int_equal(kv_seq_match_prefix(sd, p, 40, &c, &err), -RL_EINVAL);
    kv_seq_free(sd);
    kv_seq_free(sc);
    kv_seq_free(sa);
    check(kv);
    kv_cache_free(kv);
}

/* A 17-token prompt whose first block is 16 tokens from base: matching it
 * hits that one block if it is cached. */
static int hits_one(struct kv_cache *kv, int32_t base)
{
    int32_t t[17];
    fill(t, 17, base);
    int c = -1;
    kv_probe_prefix(kv, t, 17, &c);
    return c == 16;
}

static void test_eviction_lru(void **state)
{
    (void)state;
    struct kv_cache *kv = mk(4);
    struct rl_err err = {0};
    int32_t t[17];
    int32_t base[3] = {100, 200, 300};
    int32_t blk[3];
    for (int i = 0; i < 3; i++) {
        fill(t, 16, base[i]);
        struct kv_seq *s = prefill(kv, t, 16, NULL);
        blk[i] = kv_seq_block_table(s)[0];
        kv_seq_free(s); /* freed A, B, C: A is the least recently used */
    }
    struct kv_stats st;
    kv_get_stats(kv, &st);
    assert_int_equal(st.n_free, 1);
    assert_int_equal(st.n_evictable, 3);
    assert_int_equal(kv_free_blocks(kv), 4);
    for (int i = 0; i < 3; i++)
        assert_true(hits_one(kv, base[i]));

    /* touch A: it becomes the most recent, so B is now the oldest */
    fill(t, 17, base[0]);
    struct kv_seq *s = prefill(kv, t, 17, NULL);
    assert_int_equal(kv_seq_block_table(s)[0], blk[0]);
    kv_seq_free(s); /* its second block was never full: back to free */

    struct kv_seq *w = NULL;
    int32_t fresh[64];
    fill(fresh, 64, 9000);
    assert_int_equal(kv_seq_create(kv, &w, &err), 0);
    /* the first block comes from the free list: nothing evicted */
    assert_int_equal(kv_seq_append(w, fresh, 16, &err), 0);
    kv_get_stats(kv, &st);
    assert_int_equal(st.evictions, 0);
    for (int i = 0; i < 3; i++)
        assert_true(hits_one(kv, base[i]));
    /* the second evicts B, the third C, A survives */
    assert_int_equal(kv_seq_append(w, fresh + 16, 1, &err), 0);
    assert_int_equal(kv_seq_block_table(w)[1], blk[1]);
    assert_false(hits_one(kv, base[1]));
    assert_true(hits_one(kv, base[0]));
    assert_true(hits_one(kv, base[2]));
    assert_int_equal(kv_seq_append(w, fresh + 17, 16, &err), 0);
    assert_int_equal(kv_seq_block_table(w)[2], blk[2]);
    assert_false(hits_one(kv, base[2]));
    assert_true(hits_one(kv, base[0]));
    kv_get_stats(kv, &st);
    assert_int_equal(st.evictions, 2);
    check(kv);
    /* pool exhausted except A's evictable block, then nothing */
    assert_int_equal(kv_free_blocks(kv), 1);
    assert_int_equal(kv_seq_append(w, fresh + 33, 31, &err), 0);
    assert_false(hits_one(kv, base[0]));
    assert_int_equal(kv_free_blocks(kv), 0);
    assert_int_equal(kv_seq_append(w, fresh + 63, 1, &err), -RL_EFULL);
    assert_int_equal(err.code, RL_EFULL);
    assert_int_equal(kv_seq_n_tokens(w), 64);
    kv_seq_free(w);
    check(kv);
    kv_cache_free(kv);
}

static uint64_t const_hash(uint64_t parent, const int32_t *tokens, int n)
{
    (void)parent;
    (void)tokens;
    (void)n;
    return 42;
}

static void test_collisions_harmless(void **state)
{
    (void)state;
    struct kv_cache *kv = mk(32);
    struct rl_err err = {0};
    assert_int_equal(kv_set_hash_fn(kv, const_hash, &err), 0);
    /* A = X Y (+1); every block of every prompt now hashes to 42 */
    int32_t a[33], b[33], c[33], d[33];
    fill(a, 33, 0);
    fill(b, 33, 0);
    fill(b, 16, 500);                 /* B = Z Y: Y after another parent */
    fill(c, 33, 0);
    fill(c + 16, 17, 800);            /* C = X W */
    fill(d, 33, 0);                   /* D = X Y, a true hit */
    struct kv_seq *sa = prefill(kv, a, 33, NULL);
    assert_int_equal(kv_set_hash_fn(kv, NULL, &err), -RL_EINVAL);
    int n = -1;
    assert_int_equal(kv_probe_prefix(kv, b, 33, &n), 3);
    assert_int_equal(n, 0);
    struct kv_seq *sb = prefill(kv, b, 33, &n);
    assert_int_equal(n, 0);
    /* B's Y block sits under B's Z, not under X: C must still miss it */
    struct kv_seq *sc = prefill(kv, c, 33, &n);
    assert_int_equal(n, 16);
    assert_int_equal(kv_seq_block_table(sc)[0], kv_seq_block_table(sa)[0]);
    struct kv_seq *sd = prefill(kv, d, 33, &n);
    assert_int_equal(n, 32);
    assert_int_equal(kv_seq_block_table(sd)[1], kv_seq_block_table(sa)[1]);
    assert_int_not_equal(kv_seq_block_table(sd)[1], kv_seq_block_table(sb)[1]);
    check(kv);

    kv_seq_free(sa);
    kv_seq_free(sb);
    kv_seq_free(sc);
    kv_seq_free(sd);
    check(kv);
    /* with every block hashing alike, a prompt of new tokens still misses */
    int32_t e[33];
    fill(e, 33, 30000);
    assert_int_equal(kv_probe_prefix(kv, e, 33, &n), 3);
    assert_int_equal(n, 0);
    kv_cache_free(kv);
}

static void test_resume_after_preemption(void **state)
{
    (void)state;
    struct kv_cache *kv = mk(16);
    struct rl_err err = {0};
    int32_t p[80];
    fill(p, 80, 3);
    struct kv_seq *s = prefill(kv, p, 40, NULL);
    /* decode 30 tokens one at a time: append, compute, commit */
    for (int i = 40; i < 70; i++) {
        assert_int_equal(kv_seq_append(s, p + i, 1, &err), 0);
        assert_int_equal(kv_seq_commit(s, i + 1, &err), 0);
    }
    assert_int_equal(kv_seq_n_blocks(s), 5);
    kv_seq_free(s); /* preempted */
    int n = -1;
    s = prefill(kv, p, 70, &n);
    assert_int_equal(n, 64); /* 4 full blocks back; only 6 tokens recomputed */
    kv_seq_free(s);
    check(kv);
    kv_cache_free(kv);
}

static void test_admission(void **state)
{
    (void)state;
    struct kv_cache *kv = mk(4);
    struct rl_err err = {0};
    int32_t p[80];
    fill(p, 80, 1);
    int n = -1;
    assert_int_equal(kv_probe_prefix(kv, p, 70, &n), 5);
    assert_int_equal(n, 0);
    assert_false(kv_can_allocate(kv, 5));
    assert_true(kv_can_allocate(kv, 4));
    struct kv_seq *s = NULL;
    assert_int_equal(kv_seq_create(kv, &s, &err), 0);
    assert_int_equal(kv_seq_match_prefix(s, p, 70, &n, &err), 0);
    assert_int_equal(kv_seq_append(s, p, 70, &err), -RL_EFULL);
    assert_non_null(strstr(err.msg, "5 blocks"));
    assert_int_equal(kv_seq_n_tokens(s), 0);
    assert_int_equal(kv_free_blocks(kv), 4);
    assert_int_equal(kv_seq_append(s, p, 64, &err), 0);
    assert_int_equal(kv_free_blocks(kv), 0);
    assert_false(kv_can_allocate(kv, 1));
    assert_true(kv_can_allocate(kv, 0));
    kv_seq_free(s);
    check(kv);
    kv_cache_free(kv);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void test_hash(void **state)
{
    (void)state;
    int32_t t[16], u[16];
    fill(t, 16, 7);
    memcpy(u, t, sizeof t);
    uint64_t h = kv_hash_block(0, t, 16);
    assert_true(h == kv_hash_block(0, u, 16));
    u[15]++;
    assert_true(h != kv_hash_block(0, u, 16));
    assert_true(h != kv_hash_block(1, t, 16));
    assert_true(h != kv_hash_block(0, t, 15));
    /* no collisions among 20000 blocks differing in one token (a weak hash
     * such as a plain sum would collide at once), nor in the low 20 bits
     * beyond what chance allows; buckets use the low bits */
    enum { N = 20000 };
    static uint64_t hs[N];
    for (int i = 0; i < N; i++) {
        fill(t, 16, 0);
        t[i % 16] = i + 1;
        hs[i] = kv_hash_block(0, t, 16);
    }
    qsort(hs, N, sizeof hs[0], cmp_u64);
    int dup = 0;
    for (int i = 1; i < N; i++)
        dup += hs[i] == hs[i - 1];
    for (int i = 0; i < N; i++)
        hs[i] &= (1u << 20) - 1;
    qsort(hs, N, sizeof hs[0], cmp_u64);
    int low = 0;
    for (int i = 1; i < N; i++)
        low += hs[i] == hs[i - 1];
    /* expected about N^2 / 2^21 = 190 low-bit pairs for a random function */
    assert_true(low < 400);
    assert_int_equal(dup, 0);
}

/* Salted sequences (kv_seq_set_salt) share cached blocks only with their
 * own salt: one tenant's prompt is never a hit for another. */
static void test_salt_isolates(void **state)
{
    (void)state;
    struct kv_cache *kv = NULL;
    struct rl_err err = {0};
    assert_int_equal(kv_cache_create(&kv, 16, 4, &err), 0);
    int32_t p[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    struct kv_seq *a = NULL, *b = NULL, *c = NULL;
    int n = -1;
    assert_int_equal(kv_seq_create(kv, &a, &err), 0);
    kv_seq_set_salt(a, 7);
    assert_int_equal(kv_seq_match_prefix(a, p, 9, &n, &err), 0);
    assert_int_equal(kv_seq_append(a, p, 9, &err), 0);
    assert_int_equal(kv_seq_commit(a, 9, &err), 0);
    kv_seq_free(a);
    /* another salt (and the shared domain) find nothing */
    assert_int_equal(kv_probe_prefix(kv, p, 9, &n), 3);
    assert_int_equal(n, 0);
    assert_int_equal(kv_seq_create(kv, &b, &err), 0);
    kv_seq_set_salt(b, 8);
    assert_int_equal(kv_seq_match_prefix(b, p, 9, &n, &err), 0);
    assert_int_equal(n, 0);
    kv_seq_free(b);
    /* the same salt finds both full blocks */
    kv_probe_prefix_salted(kv, 7, p, 9, &n);
    assert_int_equal(n, 8);
    assert_int_equal(kv_seq_create(kv, &c, &err), 0);
    kv_seq_set_salt(c, 7);
    assert_int_equal(kv_seq_match_prefix(c, p, 9, &n, &err), 0);
    assert_int_equal(n, 8);
    kv_seq_free(c);
    kv_cache_free(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_salt_isolates),
        cmocka_unit_test(test_alloc_free_refcounts),
        cmocka_unit_test(test_shared_system_prompt),
        cmocka_unit_test(test_partial_last_block_never_shared),
        cmocka_unit_test(test_eviction_lru),
        cmocka_unit_test(test_collisions_harmless),
        cmocka_unit_test(test_resume_after_preemption),
        cmocka_unit_test(test_admission),
        cmocka_unit_test(test_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
