/* engine/kv_cache.h - paged KV-cache bookkeeping with automatic prefix caching.
 *
 * No tensors live here: the backend owns the pool memory (backend.h, "KV
 * layout contract"); this module only decides which block ids each sequence
 * uses. Token t of a sequence lives in block kv_seq_block_table(seq)[t /
 * block_size], slot t % block_size.
 *
 * Life of a sequence, as the scheduler drives it:
 *
 *   kv_seq_create(kv, &seq, err);
 *   kv_seq_match_prefix(seq, prompt, n_prompt, &n_cached, err);
 *                           // reuses cached full blocks; n_cached tokens
 *                           // (a multiple of block_size, < n_prompt) need
 *                           // no prefill
 *   loop:
 *     kv_seq_append(seq, chunk, n_chunk, err);   // reserves slots, may
 *                                                // fail with -RL_EFULL
 *     be_seq.n_past = kv_seq_n_computed(seq);
 *     be_seq.n_new  = n_chunk;
 *     be_seq.block_table = kv_seq_block_table(seq);
 *     ... forward ...
 *     kv_seq_commit(seq, kv_seq_n_tokens(seq), err);  // KV is now real
 *     (decode: append the sampled token, forward it next step, commit)
 *   kv_seq_free(seq);       // finish, cancel or preempt
 *
 * Prefix caching (as vLLM's automatic prefix caching): a block that is full
 * and whose KV has been committed is registered under a 64-bit hash chained
 * over its parent's hash and its block_size token ids. A hit is accepted
 * only when the stored tokens match AND its recorded parent is exactly the
 * block matched one level up (block id plus a generation that changes on
 * eviction), so even a forced hash collision can never hand a sequence KV
 * computed for a different prefix.
 *
 * Copy-on-write is never needed: only full, committed blocks are shared, and
 * kv_seq_match_prefix() never reuses the block holding the prompt's last
 * token (it matches at most (n_prompt - 1) / block_size blocks), so the
 * final token is always recomputed and its logits come out of the forward
 * pass. A partly filled block is private to its sequence.
 *
 * Threading: one thread (the engine's owner thread) uses a kv_cache and all
 * of its sequences. */
#ifndef RL_KV_CACHE_H
#define RL_KV_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "err.h"

#define KV_DEFAULT_BLOCK_SIZE 16

struct kv_cache;   /* the pool: free list, refcounts, hash table, LRU */
struct kv_seq;     /* one sequence's block table and token ids */

/* Counters since creation or the last kv_reset_stats(), plus the pool's
 * present occupancy. Hits and misses are counted by kv_seq_match_prefix():
 * a prompt of n tokens with h matched blocks adds h*block_size hit tokens,
 * n - h*block_size miss tokens, h hit blocks and ceil(n / block_size) - h
 * miss blocks. */
struct kv_stats {
    int64_t hit_tokens;    /* prompt tokens whose KV came from the cache */
    int64_t miss_tokens;   /* prompt tokens that must be computed */
    int64_t hit_blocks;    /* blocks reused by kv_seq_match_prefix() */
    int64_t miss_blocks;   /* prompt blocks not found */
    int64_t evictions;     /* cached blocks dropped to satisfy allocation */
    int64_t dedup_blocks;  /* committed blocks swapped for an equal cached
                              one (two sequences computed the same prefix) */
    int32_t n_blocks;      /* pool size */
    int32_t n_free;        /* never cached (or evicted) and unreferenced */
    int32_t n_evictable;   /* unreferenced but still cached (in the LRU) */
    int32_t n_used;        /* referenced by at least one sequence */
};

/* The chained block hash: parent is the previous block's hash (0 for a
 * sequence's first block), tokens its n token ids. */
typedef uint64_t (*kv_hash_fn)(uint64_t parent, const int32_t *tokens,
                               int n_tokens);

/* Creates a pool of n_blocks blocks of block_size tokens (block_size <= 0
 * means KV_DEFAULT_BLOCK_SIZE). The caller owns *out and frees it with
 * kv_cache_free() after freeing every sequence. Returns 0, -RL_EINVAL or
 * -RL_ENOMEM. */
int kv_cache_create(struct kv_cache **out, int n_blocks, int block_size,
                    struct rl_err *err);
void kv_cache_free(struct kv_cache *kv);

int kv_block_size(const struct kv_cache *kv);
int kv_n_blocks(const struct kv_cache *kv);

/* Blocks an allocation can take now: free plus evictable. */
int kv_free_blocks(const struct kv_cache *kv);

/* New blocks kv_seq_append(seq, ..., n_tokens) would allocate; seq NULL
 * stands for an empty sequence (ceil(n_tokens / block_size)). */
int kv_blocks_needed(const struct kv_cache *kv, const struct kv_seq *seq,
                     int n_tokens);

/* True when n_blocks blocks can be allocated now (evicting if need be). */
bool kv_can_allocate(const struct kv_cache *kv, int n_blocks);

/* Admission question for a new request, asked without changing anything:
 * stores in *n_cached (if non-NULL) the tokens kv_seq_match_prefix() would
 * reuse now, and returns how many blocks from kv_free_blocks() admitting the
 * whole prompt would consume (new blocks plus evictable blocks the match
 * would pin). Admit when kv_can_allocate(kv, returned value). Counters are
 * not touched. */
int kv_probe_prefix(const struct kv_cache *kv, const int32_t *tokens,
                    int n_tokens, int *n_cached);
/* The same for a sequence whose blocks are hashed under salt
 * (kv_seq_set_salt); kv_probe_prefix is salt 0. */
int kv_probe_prefix_salted(const struct kv_cache *kv, uint64_t salt, const int32_t *tokens,
                           int n_tokens, int *n_cached);

void kv_get_stats(const struct kv_cache *kv, struct kv_stats *st);
/* Forgets every cached block no sequence holds (they become free), and
 * returns how many: for when what a salt stands for changes (an adapter
 * reloaded under its name). Blocks in use stay cached. */
int kv_drop_evictable(struct kv_cache *kv);
void kv_reset_stats(struct kv_cache *kv);

/* The default block hash: XXH64-style over the token ids as little-endian
 * 32-bit words, seeded with the parent's hash. Stable across runs and
 * machines (nothing random in it), so it could key a persistent cache. */
uint64_t kv_hash_block(uint64_t parent, const int32_t *tokens, int n_tokens);

/* Test hook: replaces the block hash (NULL restores kv_hash_block). Only
 * while nothing is cached: returns -RL_EINVAL otherwise. */
int kv_set_hash_fn(struct kv_cache *kv, kv_hash_fn fn, struct rl_err *err);

/* Introspection for tests and debugging: a block's refcount, -1 when the
 * id is out of range. */
int kv_block_refcount(const struct kv_cache *kv, int32_t block);

/* True when block holds a registered (prefix-cached) full block. */
bool kv_block_is_cached(const struct kv_cache *kv, int32_t block);

/* Calls fn(ctx, hash) for the chained hash of every registered (prefix-
 * cached) block, in use or evictable: what a prompt could hit now. The
 * worker turns these into the filter it publishes for prefix-affine
 * pulling (issue 27, common/affinity.h). O(n_blocks). */
void kv_each_cached(const struct kv_cache *kv, void (*fn)(void *ctx, uint64_t hash), void *ctx);

/* Walks every structure and checks the invariants (list membership versus
 * refcounts, counts, hash chains). Returns 0 or -RL_EINTERNAL naming the
 * first broken one. O(n_blocks); for tests. */
int kv_check(const struct kv_cache *kv, struct rl_err *err);

/* ---- sequences ---- */

/* Creates an empty sequence on kv. The caller owns *out and frees it with
 * kv_seq_free() before kv_cache_free(). Returns 0 or -RL_ENOMEM. */
int kv_seq_create(struct kv_cache *kv, struct kv_seq **out,
                  struct rl_err *err);

/* Isolates the sequence's prefix cache: its blocks are hashed from salt
 * instead of 0 (the first block's parent hash), so it matches, and is
 * matched by, only sequences of the same salt. The worker gives every
 * tenant its own (engine_request.cache_salt), so one tenant can never
 * learn from cached_prompt_tokens or timings what another one sent
 * (vLLM's cache_salt). Call before kv_seq_match_prefix; 0 = shared. */
void kv_seq_set_salt(struct kv_seq *seq, uint64_t salt);

/* The salt of a request of adapter `lora` (engine/lora.h) in domain salt:
 * a LoRA changes every layer's keys and values, so its blocks must never
 * match the base model's or another adapter's. salt itself for NULL or ""
 * (the base model); never 0 otherwise. A function of the name, so that
 * the dispatcher, which hashes prompts to find the worker holding them
 * (dispatcher/affinity.c), gets the engine's hashes. */
uint64_t kv_salt_lora(uint64_t salt, const char *lora);

/* Releases every block the sequence holds (last block first, so the tail of
 * a prompt is evicted before its head) and frees it. Committed full blocks
 * stay cached until evicted, so a preempted request that is later resumed
 * with kv_seq_match_prefix(prompt + output so far) recomputes only what was
 * evicted meanwhile. NULL is a no-op. */
void kv_seq_free(struct kv_seq *seq);

/* On an empty sequence: finds the longest chain of cached full blocks that
 * matches the start of tokens, takes a reference on each and makes them the
 * sequence's first blocks. At most (n_tokens - 1) / block_size blocks are
 * matched so at least the last token is left to compute. Sets *n_cached to
 * the tokens now present and computed (a multiple of block_size); the
 * caller appends tokens + *n_cached next. Updates the hit/miss counters.
 * Returns 0, -RL_EINVAL (sequence not empty, bad token) or -RL_ENOMEM. */
int kv_seq_match_prefix(struct kv_seq *seq, const int32_t *tokens,
                        int n_tokens, int *n_cached, struct rl_err *err);

/* Appends n_tokens token ids, allocating blocks only when the last one is
 * full (free blocks first, then the least recently used cached block).
 * The new tokens are not computed until kv_seq_commit(). Returns 0,
 * -RL_EFULL when kv_blocks_needed() exceeds kv_free_blocks() (nothing
 * changed), -RL_EINVAL or -RL_ENOMEM. Token storage grows by doubling, so
 * appending one token is O(1) amortised with no allocation per token. */
int kv_seq_append(struct kv_seq *seq, const int32_t *tokens, int n_tokens,
                  struct rl_err *err);

/* Records that the backend has written the KV of the first n_computed
 * tokens (kv_seq_n_computed() <= n_computed <= kv_seq_n_tokens()). Every
 * block this completes is registered in the prefix cache; if an equal
 * block is already cached (another sequence computed the same prefix) the
 * sequence switches to that one and releases its own copy, so the block
 * table may change - read it again before the next forward. */
int kv_seq_commit(struct kv_seq *seq, int n_computed, struct rl_err *err);

/* Drops the appended tokens past n_tokens (kv_seq_n_computed() <= n_tokens
 * <= kv_seq_n_tokens()) and releases the blocks that then hold none: the
 * rollback of rejected speculative tokens, whose KV was written but never
 * committed, is a length change. Returns 0 or -RL_EINVAL. */
int kv_seq_truncate(struct kv_seq *seq, int n_tokens, struct rl_err *err);

/* The block table: kv_seq_n_blocks() ids, owned by the sequence, valid until
 * the next append, commit or free. Pass it as be_seq.block_table. */
const int32_t *kv_seq_block_table(const struct kv_seq *seq);
int kv_seq_n_blocks(const struct kv_seq *seq);
/* Token ids appended so far (kv_seq_n_tokens() of them), owned by seq. */
const int32_t *kv_seq_tokens(const struct kv_seq *seq);
int kv_seq_n_tokens(const struct kv_seq *seq);
/* Tokens whose KV is in the pool: be_seq.n_past. */
int kv_seq_n_computed(const struct kv_seq *seq);

#endif
