/* engine/kv_cache.c - block allocator, block tables and prefix hashes.
 *
 * Every block is in exactly one of three states, and the state decides the
 * list it sits on:
 *   FREE       ref == 0, not cached: on the free stack;
 *   EVICTABLE  ref == 0, cached:     on the LRU list (head = oldest);
 *   USED       ref  > 0:             on no list (cached or not).
 * A cached block is also in the hash table (bucket chains through hnext) and
 * keeps a copy of its block_size token ids in btok, so a lookup compares the
 * tokens and the parent link, never trusting the hash alone.
 *
 * The parent link is (parent block id, parent generation). A block's
 * generation goes up each time it leaves the hash table (eviction), so a
 * child whose parent was evicted and whose id was reused for other tokens
 * can no longer be reached: chains are matched exactly, link by link.
 *
 * Allocation order: the free stack first (never disturbs the cache), then
 * the LRU head. A sequence releases its blocks last to first, so within one
 * sequence the tail of its prefix is evicted before the head, which keeps
 * the surviving part of a chain a usable prefix. In fact a child is always
 * older in the LRU than its parent: whoever holds a block holds its parent
 * (block_table[i - 1]) and releases it later, so LRU eviction never strands
 * a cached child under an evicted parent; the generation check is there so
 * that correctness does not hang on that argument.
 *
 * Invariant kept by kv_seq_commit(): all of a sequence's committed full
 * blocks are cached, so block_table[i - 1] is always the registered parent
 * of block i. That is why a commit that finds an equal block already cached
 * swaps to it instead of keeping an unregistered duplicate.
 *
 * Who calls it: the scheduler and engine, on the engine's owner thread. Cost
 * per appended token is O(1) amortised; a commit hashes each completed block
 * once; a match hashes each prompt block once. */
#include "kv_cache.h"

#include <stdlib.h>
#include <string.h>

enum { BLK_FREE = 0, BLK_EVICTABLE = 1, BLK_USED = 2 };

struct kv_block {
    uint64_t hash;        /* chained hash, valid when cached */
    int32_t ref;          /* sequences holding this block */
    uint32_t gen;         /* bumped on every removal from the hash table */
    int32_t parent;       /* cached parent block, -1 for a first block */
    uint32_t parent_gen;  /* parent's gen when this block was registered */
    int32_t hnext;        /* next block in the same hash bucket, -1 = end */
    int32_t prev, next;   /* LRU links while EVICTABLE, -1 = end */
    uint8_t state;        /* BLK_* */
    uint8_t cached;       /* registered in the hash table */
};

struct kv_cache {
    int n_blocks;
    int block_size;
    struct kv_block *blk;   /* (n_blocks) */
    int32_t *btok;          /* (n_blocks, block_size) token ids of cached
                               blocks */
    int32_t *free_stack;    /* (n_blocks) ids of FREE blocks, top at n_free-1 */
    int n_free;
    int32_t lru_head, lru_tail; /* EVICTABLE blocks, oldest at head */
    int n_evictable;
    int32_t *bucket;        /* (bucket_mask + 1) first block of each chain */
    uint64_t bucket_mask;
    int n_cached;           /* blocks in the hash table */
    kv_hash_fn hash_fn;
    struct kv_stats st;     /* counters only; occupancy filled on read */
};

struct kv_seq {
    struct kv_cache *kv;
    int32_t *table;     /* (cap_blocks) block ids, n_blocks used */
    uint64_t *hash;     /* (cap_blocks) chained hash of committed blocks */
    int n_blocks, cap_blocks;
    int32_t *tokens;    /* (cap_tokens) token ids, n_tokens used */
    int n_tokens, cap_tokens;
    int n_computed;     /* tokens with KV in the pool */
    int n_committed;    /* leading blocks registered in the cache */
    uint64_t salt;      /* the first block's parent hash (kv_seq_set_salt) */
};

/* ---- hashing ---- */

#define P1 11400714785074694791ULL
#define P2 14029467366897019727ULL
#define P3 1609587929392839161ULL
#define P4 9650029242287828579ULL
#define P5 2870177450012600261ULL

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t xx_round(uint64_t acc, uint64_t in)
{
    acc += in * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}

static uint64_t xx_merge(uint64_t acc, uint64_t v)
{
    acc ^= xx_round(0, v);
    return acc * P1 + P4;
}

/* Two token ids as one little-endian 64-bit lane, read without relying on
 * the host byte order, so hashes agree across machines. */
static uint64_t lane(const int32_t *t)
{
    return (uint64_t)(uint32_t)t[0] | ((uint64_t)(uint32_t)t[1] << 32);
}

uint64_t kv_hash_block(uint64_t parent, const int32_t *tokens, int n_tokens)
{
    /* XXH64's structure over 4-byte words: four accumulators over 32-byte
     * stripes, merge, tail, avalanche. A full avalanche matters because the
     * bucket index takes the low bits. */
    uint64_t seed = parent, h;
    int i = 0;
    if (n_tokens >= 8) {
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        for (; i + 8 <= n_tokens; i += 8) {
            v1 = xx_round(v1, lane(tokens + i));
            v2 = xx_round(v2, lane(tokens + i + 2));
            v3 = xx_round(v3, lane(tokens + i + 4));
            v4 = xx_round(v4, lane(tokens + i + 6));
        }
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xx_merge(h, v1);
        h = xx_merge(h, v2);
        h = xx_merge(h, v3);
        h = xx_merge(h, v4);
    } else {
        h = seed + P5;
    }
    h += (uint64_t)n_tokens * 4;
    for (; i + 2 <= n_tokens; i += 2) {
        h ^= xx_round(0, lane(tokens + i));
        h = rotl64(h, 27) * P1 + P4;
    }
    if (i < n_tokens) {
        h ^= (uint64_t)(uint32_t)tokens[i] * P1;
        h = rotl64(h, 23) * P2 + P3;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

/* ---- lists ---- */

static void lru_push_tail(struct kv_cache *kv, int32_t b)
{
    struct kv_block *k = &kv->blk[b];
    k->prev = kv->lru_tail;
    k->next = -1;
    if (kv->lru_tail >= 0)
        kv->blk[kv->lru_tail].next = b;
    else
        kv->lru_head = b;
    kv->lru_tail = b;
    k->state = BLK_EVICTABLE;
    kv->n_evictable++;
}

static void lru_remove(struct kv_cache *kv, int32_t b)
{
    struct kv_block *k = &kv->blk[b];
    if (k->prev >= 0)
        kv->blk[k->prev].next = k->next;
    else
        kv->lru_head = k->next;
    if (k->next >= 0)
        kv->blk[k->next].prev = k->prev;
    else
        kv->lru_tail = k->prev;
    k->prev = k->next = -1;
    kv->n_evictable--;
}

/* ---- hash table ---- */

static void table_insert(struct kv_cache *kv, int32_t b, uint64_t h,
                         int32_t parent, const int32_t *tokens)
{
    struct kv_block *k = &kv->blk[b];
    uint64_t i = h & kv->bucket_mask;
    k->hash = h;
    k->parent = parent;
    k->parent_gen = parent >= 0 ? kv->blk[parent].gen : 0;
    k->cached = 1;
    memcpy(kv->btok + (size_t)b * kv->block_size, tokens,
           sizeof(int32_t) * (size_t)kv->block_size);
    k->hnext = kv->bucket[i];
    kv->bucket[i] = b;
    kv->n_cached++;
}

static void table_remove(struct kv_cache *kv, int32_t b)
{
    struct kv_block *k = &kv->blk[b];
    int32_t *link = &kv->bucket[k->hash & kv->bucket_mask];
    while (*link != b) {
        if (*link < 0)
            abort(); /* a cached block missing from its bucket */
        link = &kv->blk[*link].hnext;
    }
    *link = k->hnext;
    k->hnext = -1;
    k->cached = 0;
    k->gen++; /* children registered under the old identity become stale */
    kv->n_cached--;
}

/* The cached block with hash h, these tokens, and parent `parent` at its
 * present generation; -1 when there is none. */
static int32_t table_find(const struct kv_cache *kv, uint64_t h,
                          int32_t parent, const int32_t *tokens)
{
    uint32_t pgen = parent >= 0 ? kv->blk[parent].gen : 0;
    size_t bytes = sizeof(int32_t) * (size_t)kv->block_size;
    for (int32_t b = kv->bucket[h & kv->bucket_mask]; b >= 0;
         b = kv->blk[b].hnext) {
        const struct kv_block *k = &kv->blk[b];
        if (k->hash == h && k->parent == parent && k->parent_gen == pgen &&
            memcmp(kv->btok + (size_t)b * kv->block_size, tokens, bytes) == 0)
            return b;
    }
    return -1;
}

/* ---- references ---- */

static void block_acquire(struct kv_cache *kv, int32_t b)
{
    struct kv_block *k = &kv->blk[b];
    if (k->state == BLK_EVICTABLE)
        lru_remove(kv, b);
    k->state = BLK_USED;
    k->ref++;
}

static void block_release(struct kv_cache *kv, int32_t b)
{
    struct kv_block *k = &kv->blk[b];
    if (k->ref <= 0)
        abort(); /* released more often than acquired */
    if (--k->ref > 0)
        return;
    if (k->cached) {
        lru_push_tail(kv, b);
    } else {
        k->state = BLK_FREE;
        kv->free_stack[kv->n_free++] = b;
    }
}

/* Takes one block for a fresh write; the caller checked capacity. */
static int32_t block_alloc(struct kv_cache *kv)
{
    int32_t b;
    if (kv->n_free > 0) {
        b = kv->free_stack[--kv->n_free];
    } else {
        b = kv->lru_head;
        if (b < 0)
            abort(); /* capacity was checked */
        lru_remove(kv, b);
        table_remove(kv, b);
        kv->st.evictions++;
    }
    kv->blk[b].state = BLK_USED;
    kv->blk[b].ref = 1;
    return b;
}

/* ---- the pool ---- */

int kv_cache_create(struct kv_cache **out, int n_blocks, int block_size,
                    struct rl_err *err)
{
    *out = NULL;
    if (block_size <= 0)
        block_size = KV_DEFAULT_BLOCK_SIZE;
    if (n_blocks <= 0 || n_blocks > (1 << 28))
        return rl_errf(err, RL_EINVAL, "kv_cache: n_blocks %d out of range "
                       "1..%d", n_blocks, 1 << 28);
    if (block_size > 4096)
        return rl_errf(err, RL_EINVAL, "kv_cache: block_size %d above 4096",
                       block_size);
    struct kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv)
        goto oom;
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    uint64_t nb = 1;
    while (nb < (uint64_t)n_blocks * 2) /* load factor <= 1/2 */
        nb <<= 1;
    kv->bucket_mask = nb - 1;
    kv->blk = calloc((size_t)n_blocks, sizeof *kv->blk);
    kv->btok = malloc(sizeof(int32_t) * (size_t)n_blocks * (size_t)block_size);
    kv->free_stack = malloc(sizeof(int32_t) * (size_t)n_blocks);
    kv->bucket = malloc(sizeof(int32_t) * (size_t)nb);
    if (!kv->blk || !kv->btok || !kv->free_stack || !kv->bucket)
        goto oom;
    for (uint64_t i = 0; i < nb; i++)
        kv->bucket[i] = -1;
    /* pushed in reverse so blocks are handed out 0, 1, 2, ... */
    for (int i = 0; i < n_blocks; i++) {
        struct kv_block *k = &kv->blk[i];
        k->parent = k->hnext = k->prev = k->next = -1;
        kv->free_stack[n_blocks - 1 - i] = i;
    }
    kv->n_free = n_blocks;
    kv->lru_head = kv->lru_tail = -1;
    kv->hash_fn = kv_hash_block;
    *out = kv;
    return 0;
oom:
    kv_cache_free(kv);
    return rl_errf(err, RL_ENOMEM, "kv_cache: out of memory for %d blocks of "
                   "%d tokens", n_blocks, block_size);
}

void kv_cache_free(struct kv_cache *kv)
{
    if (!kv)
        return;
    free(kv->blk);
    free(kv->btok);
    free(kv->free_stack);
    free(kv->bucket);
    free(kv);
}

int kv_block_size(const struct kv_cache *kv) { return kv->block_size; }
int kv_n_blocks(const struct kv_cache *kv) { return kv->n_blocks; }
int kv_free_blocks(const struct kv_cache *kv)
{
    return kv->n_free + kv->n_evictable;
}

int kv_blocks_needed(const struct kv_cache *kv, const struct kv_seq *seq,
                     int n_tokens)
{
    if (n_tokens <= 0)
        return 0;
    int64_t have = seq ? seq->n_tokens : 0;
    int64_t nblk = seq ? seq->n_blocks : 0;
    int64_t want = (have + n_tokens + kv->block_size - 1) / kv->block_size;
    return want > nblk ? (int)(want - nblk) : 0;
}

bool kv_can_allocate(const struct kv_cache *kv, int n_blocks)
{
    return n_blocks <= kv_free_blocks(kv);
}

/* Walks the prompt's full blocks through the table, at most
 * (n_tokens - 1) / block_size of them; calls back nothing, returns the
 * matched count and, in *n_evictable, how many of them are unreferenced. */
static int match_walk(const struct kv_cache *kv, uint64_t salt, const int32_t *tokens,
                      int n_tokens, int32_t *ids, uint64_t *hashes,
                      int *n_evictable)
{
    int bs = kv->block_size, n = 0, ev = 0;
    int max = n_tokens > 0 ? (n_tokens - 1) / bs : 0;
    int32_t parent = -1;
    uint64_t h = salt;
    for (; n < max; n++) {
        const int32_t *t = tokens + (size_t)n * bs;
        h = kv->hash_fn(h, t, bs);
        int32_t b = table_find(kv, h, parent, t);
        if (b < 0)
            break;
        if (kv->blk[b].state == BLK_EVICTABLE)
            ev++;
        if (ids)
            ids[n] = b;
        if (hashes)
            hashes[n] = h;
        parent = b;
    }
    if (n_evictable)
        *n_evictable = ev;
    return n;
}

int kv_probe_prefix(const struct kv_cache *kv, const int32_t *tokens,
                    int n_tokens, int *n_cached)
{
    return kv_probe_prefix_salted(kv, 0, tokens, n_tokens, n_cached);
}

int kv_probe_prefix_salted(const struct kv_cache *kv, uint64_t salt, const int32_t *tokens,
                           int n_tokens, int *n_cached)
{
    int ev = 0;
    int m = n_tokens > 0 ? match_walk(kv, salt, tokens, n_tokens, NULL, NULL, &ev) : 0;
    if (n_cached)
        *n_cached = m * kv->block_size;
    int total = n_tokens > 0 ? (n_tokens + kv->block_size - 1) / kv->block_size
                             : 0;
    return total - m + ev;
}

void kv_get_stats(const struct kv_cache *kv, struct kv_stats *st)
{
    *st = kv->st;
    st->n_blocks = kv->n_blocks;
    st->n_free = kv->n_free;
    st->n_evictable = kv->n_evictable;
    st->n_used = kv->n_blocks - kv->n_free - kv->n_evictable;
}

int kv_drop_evictable(struct kv_cache *kv)
{
    int n = 0;
    for (int32_t b; (b = kv->lru_head) >= 0; n++) {
        lru_remove(kv, b);
        table_remove(kv, b);
        kv->blk[b].state = BLK_FREE;
        kv->free_stack[kv->n_free++] = b;
    }
    return n;
}

void kv_reset_stats(struct kv_cache *kv)
{
    memset(&kv->st, 0, sizeof kv->st);
}

int kv_set_hash_fn(struct kv_cache *kv, kv_hash_fn fn, struct rl_err *err)
{
    if (kv->n_cached)
        return rl_errf(err, RL_EINVAL, "kv_set_hash_fn: %d blocks already "
                       "cached under the old hash", kv->n_cached);
    kv->hash_fn = fn ? fn : kv_hash_block;
    return 0;
}

void kv_each_cached(const struct kv_cache *kv, void (*fn)(void *ctx, uint64_t hash), void *ctx)
{
    for (int i = 0; i < kv->n_blocks; i++)
        if (kv->blk[i].cached)
            fn(ctx, kv->blk[i].hash);
}

int kv_block_refcount(const struct kv_cache *kv, int32_t block)
{
    if (block < 0 || block >= kv->n_blocks)
        return -1;
    return kv->blk[block].ref;
}

bool kv_block_is_cached(const struct kv_cache *kv, int32_t block)
{
    return block >= 0 && block < kv->n_blocks && kv->blk[block].cached;
}

int kv_check(const struct kv_cache *kv, struct rl_err *err)
{
    int n_used = 0, n_free_state = 0, n_ev_state = 0, n_cached = 0;
    for (int b = 0; b < kv->n_blocks; b++) {
        const struct kv_block *k = &kv->blk[b];
        if (k->ref < 0)
            return rl_errf(err, RL_EINTERNAL, "block %d: ref %d", b, k->ref);
        int want = k->ref > 0 ? BLK_USED : k->cached ? BLK_EVICTABLE : BLK_FREE;
        if (k->state != want)
            return rl_errf(err, RL_EINTERNAL, "block %d: state %d, want %d "
                           "(ref %d, cached %d)", b, k->state, want, k->ref,
                           k->cached);
        n_used += want == BLK_USED;
        n_free_state += want == BLK_FREE;
        n_ev_state += want == BLK_EVICTABLE;
        n_cached += k->cached;
        if (k->cached) {
            int32_t c = kv->bucket[k->hash & kv->bucket_mask];
            while (c >= 0 && c != b)
                c = kv->blk[c].hnext;
            if (c != b)
                return rl_errf(err, RL_EINTERNAL, "block %d: cached but not "
                               "in its bucket", b);
        }
    }
    if (n_free_state != kv->n_free || n_ev_state != kv->n_evictable ||
        n_cached != kv->n_cached)
        return rl_errf(err, RL_EINTERNAL, "counts: free %d/%d evictable %d/%d "
                       "cached %d/%d", n_free_state, kv->n_free, n_ev_state,
                       kv->n_evictable, n_cached, kv->n_cached);
    for (int i = 0; i < kv->n_free; i++) {
        int32_t b = kv->free_stack[i];
        if (b < 0 || b >= kv->n_blocks || kv->blk[b].state != BLK_FREE)
            return rl_errf(err, RL_EINTERNAL, "free stack[%d] = %d is not free",
                           i, b);
    }
    int n = 0;
    for (int32_t b = kv->lru_head, prev = -1; b >= 0; prev = b,
         b = kv->blk[b].next) {
        if (kv->blk[b].state != BLK_EVICTABLE || kv->blk[b].prev != prev ||
            ++n > kv->n_evictable)
            return rl_errf(err, RL_EINTERNAL, "LRU list broken at block %d", b);
    }
    if (n != kv->n_evictable)
        return rl_errf(err, RL_EINTERNAL, "LRU list has %d blocks, count %d",
                       n, kv->n_evictable);
    (void)n_used;
    return 0;
}

/* ---- sequences ---- */

int kv_seq_create(struct kv_cache *kv, struct kv_seq **out, struct rl_err *err)
{
    struct kv_seq *s = calloc(1, sizeof *s);
    *out = NULL;
    if (!s)
        return rl_errf(err, RL_ENOMEM, "kv_seq_create: out of memory");
    s->kv = kv;
    *out = s;
    return 0;
}

void kv_seq_set_salt(struct kv_seq *seq, uint64_t salt)
{
    seq->salt = salt;
}

uint64_t kv_salt_lora(uint64_t salt, const char *lora)
{
    if (!lora || !lora[0])
        return salt;
    /* FNV-1a over the name from the domain's salt, then a final mix so
     * that neighbouring names do not give neighbouring salts */
    uint64_t h = salt ^ 0x9e3779b97f4a7c15ull;
    for (const char *p = lora; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h ? h : 1;
}

void kv_seq_free(struct kv_seq *seq)
{
    if (!seq)
        return;
    for (int i = seq->n_blocks - 1; i >= 0; i--)
        block_release(seq->kv, seq->table[i]);
    free(seq->table);
    free(seq->hash);
    free(seq->tokens);
    free(seq);
}

/* Makes room for n_tokens tokens and n_blocks blocks in total. Doubling keeps
 * appends O(1) amortised; a failure leaves the sequence as it was. */
static int seq_reserve(struct kv_seq *s, int n_tokens, int n_blocks,
                       struct rl_err *err)
{
    if (n_tokens > s->cap_tokens) {
        int cap = s->cap_tokens ? s->cap_tokens : 64;
        while (cap < n_tokens)
            cap = cap > (1 << 29) ? n_tokens : cap * 2;
        int32_t *t = realloc(s->tokens, sizeof(int32_t) * (size_t)cap);
        if (!t)
            return rl_errf(err, RL_ENOMEM, "kv_seq: out of memory for %d "
                           "tokens", cap);
        s->tokens = t;
        s->cap_tokens = cap;
    }
    if (n_blocks > s->cap_blocks) {
        int cap = s->cap_blocks ? s->cap_blocks : 8;
        while (cap < n_blocks)
            cap *= 2;
        int32_t *t = realloc(s->table, sizeof(int32_t) * (size_t)cap);
        if (!t)
            return rl_errf(err, RL_ENOMEM, "kv_seq: out of memory for %d "
                           "blocks", cap);
        s->table = t;
        uint64_t *h = realloc(s->hash, sizeof(uint64_t) * (size_t)cap);
        if (!h)
            return rl_errf(err, RL_ENOMEM, "kv_seq: out of memory for %d "
                           "blocks", cap);
        s->hash = h;
        s->cap_blocks = cap;
    }
    return 0;
}

static int check_tokens(const int32_t *tokens, int n, const char *fn,
                        struct rl_err *err)
{
    if (n < 0 || (n > 0 && !tokens))
        return rl_errf(err, RL_EINVAL, "%s: n_tokens %d", fn, n);
    if (n > (1 << 30))
        return rl_errf(err, RL_EINVAL, "%s: n_tokens %d too large", fn, n);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0)
            return rl_errf(err, RL_EINVAL, "%s: token %d is %d", fn, i,
                           (int)tokens[i]);
    return 0;
}

int kv_seq_match_prefix(struct kv_seq *seq, const int32_t *tokens,
                        int n_tokens, int *n_cached, struct rl_err *err)
{
    struct kv_cache *kv = seq->kv;
    int rc, bs = kv->block_size;
    *n_cached = 0;
    if (seq->n_tokens || seq->n_blocks)
        return rl_errf(err, RL_EINVAL, "kv_seq_match_prefix: sequence already "
                       "holds %d tokens", seq->n_tokens);
    if ((rc = check_tokens(tokens, n_tokens, "kv_seq_match_prefix", err)))
        return rc;
    int total = (int)(((int64_t)n_tokens + bs - 1) / bs);
    if ((rc = seq_reserve(seq, n_tokens, total, err)))
        return rc;
    int m = match_walk(kv, seq->salt, tokens, n_tokens, seq->table, seq->hash, NULL);
    for (int i = 0; i < m; i++)
        block_acquire(kv, seq->table[i]);
    memcpy(seq->tokens, tokens, sizeof(int32_t) * (size_t)m * bs);
    seq->n_blocks = seq->n_committed = m;
    seq->n_tokens = seq->n_computed = m * bs;
    kv->st.hit_blocks += m;
    kv->st.hit_tokens += (int64_t)m * bs;
    kv->st.miss_blocks += total - m;
    kv->st.miss_tokens += n_tokens - (int64_t)m * bs;
    *n_cached = m * bs;
    return 0;
}

int kv_seq_append(struct kv_seq *seq, const int32_t *tokens, int n_tokens,
                  struct rl_err *err)
{
    struct kv_cache *kv = seq->kv;
    int rc;
    if ((rc = check_tokens(tokens, n_tokens, "kv_seq_append", err)))
        return rc;
    if ((int64_t)seq->n_tokens + n_tokens > INT32_MAX / 2)
        return rl_errf(err, RL_EINVAL, "kv_seq_append: %d + %d tokens too "
                       "many", seq->n_tokens, n_tokens);
    int need = kv_blocks_needed(kv, seq, n_tokens);
    if (!kv_can_allocate(kv, need))
        return rl_errf(err, RL_EFULL, "kv_seq_append: %d tokens need %d "
                       "blocks, %d can be had", n_tokens, need,
                       kv_free_blocks(kv));
    if ((rc = seq_reserve(seq, seq->n_tokens + n_tokens,
                          seq->n_blocks + need, err)))
        return rc;
    for (int i = 0; i < need; i++)
        seq->table[seq->n_blocks++] = block_alloc(kv);
    memcpy(seq->tokens + seq->n_tokens, tokens,
           sizeof(int32_t) * (size_t)n_tokens);
    seq->n_tokens += n_tokens;
    return 0;
}

int kv_seq_commit(struct kv_seq *seq, int n_computed, struct rl_err *err)
{
    struct kv_cache *kv = seq->kv;
    int bs = kv->block_size;
    if (n_computed < seq->n_computed || n_computed > seq->n_tokens)
        return rl_errf(err, RL_EINVAL, "kv_seq_commit: n_computed %d outside "
                       "%d..%d", n_computed, seq->n_computed, seq->n_tokens);
    seq->n_computed = n_computed;
    for (int i = seq->n_committed; (int64_t)(i + 1) * bs <= n_computed; i++) {
        const int32_t *t = seq->tokens + (size_t)i * bs;
        int32_t parent = i ? seq->table[i - 1] : -1;
        uint64_t h = kv->hash_fn(i ? seq->hash[i - 1] : seq->salt, t, bs);
        int32_t b = table_find(kv, h, parent, t);
        if (b >= 0) {
            /* Same tokens after the same cached parent: the KV is the same
             * function of the same inputs, so share the cached block and give
             * back the private copy (never shared: it was not cached). */
            block_acquire(kv, b);
            block_release(kv, seq->table[i]);
            seq->table[i] = b;
            kv->st.dedup_blocks++;
        } else {
            table_insert(kv, seq->table[i], h, parent, t);
        }
        seq->hash[i] = h;
        seq->n_committed = i + 1;
    }
    return 0;
}

int kv_seq_truncate(struct kv_seq *seq, int n_tokens, struct rl_err *err)
{
    if (n_tokens < seq->n_computed || n_tokens > seq->n_tokens)
        return rl_errf(err, RL_EINVAL, "kv_seq_truncate: %d tokens outside %d..%d",
                       n_tokens, seq->n_computed, seq->n_tokens);
    int bs = seq->kv->block_size;
    int keep = (n_tokens + bs - 1) / bs;
    /* blocks past `keep` hold only uncomputed tokens: never committed, so
     * private to this sequence, and they go straight back to the free list */
    for (int i = seq->n_blocks - 1; i >= keep; i--)
        block_release(seq->kv, seq->table[i]);
    if (seq->n_blocks > keep)
        seq->n_blocks = keep;
    seq->n_tokens = n_tokens;
    return 0;
}

const int32_t *kv_seq_block_table(const struct kv_seq *seq) { return seq->table; }
int kv_seq_n_blocks(const struct kv_seq *seq) { return seq->n_blocks; }
const int32_t *kv_seq_tokens(const struct kv_seq *seq) { return seq->tokens; }
int kv_seq_n_tokens(const struct kv_seq *seq) { return seq->n_tokens; }
int kv_seq_n_computed(const struct kv_seq *seq) { return seq->n_computed; }
