/* engine/constrain.h - what the engine needs to serve constrained
 * (structured) output over the grammar library (engine/grammar/grammar.h):
 * the tokenizer's vocabulary in the library's form, an in-process cache of
 * compiled constraints keyed by gram_hash, the compile threads that build
 * what the cache lacks while the engine goes on stepping, the two fixed
 * masks of think mode, and the helper thread that fills next-step masks
 * while the backend runs the forward pass.
 *
 * Ownership: the engine owns one struct cons (cons_create / cons_free) and
 * calls it from its owner thread only; a compiled gram handed out is
 * borrowed from the cache until the next call into the cons (a gram_match
 * made from it holds its own reference, so eviction never pulls one from
 * under a running request).
 * A compile job (cons_request) belongs to the callers that asked for it,
 * each holding one reference until cons_job_release; the cons holds one
 * more until the finished compile is in its cache.
 * Errors: 0 or a negative code; a constraint the compiler refuses comes
 * back with err->code = EV_CODE_BAD_PARAM (the library's message), any
 * other failure with an RL_E* code. */
#ifndef RL_CONSTRAIN_H
#define RL_CONSTRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct cons;
struct gram;
struct gram_match;
struct tokenizer;

/* What a request's output must match (engine.h's enum engine_constraint). */
enum cons_kind {
    CONS_NONE = 0,
    CONS_JSON_OBJECT,
    CONS_JSON_SCHEMA,
    CONS_GRAMMAR,
    CONS_TOOL_CALL,
};

#define CONS_CACHE_DEFAULT 64 /* compiled constraints kept */
#define CONS_CACHE_BYTES_DEFAULT ((size_t)512 << 20) /* ... and their gram_bytes */
#define CONS_COMPILE_THREADS_MAX 16

/* tok: the engine's tokenizer (must outlive c); n_vocab: logits per row
 * (the model's vocab, which may pad past the tokenizer's ids); eos_ids:
 * the tokens that end a request (allowed exactly where a document is
 * complete, and held back inside the reasoning); think_open/think_close:
 * the <think> and </think> ids (-1: none), never allowed inside a document
 * (Qwen3 marks them non-special, but the engine treats them as channel
 * switches, not text). cache_cap 0 = CONS_CACHE_DEFAULT; cache_bytes 0 =
 * CONS_CACHE_BYTES_DEFAULT (the most recently used constraint is kept
 * even when it alone is larger). compile_threads:
 * how many compiles run at once (0 = a quarter of the cores, 1 to 4; at
 * most CONS_COMPILE_THREADS_MAX), started on the first miss: a client
 * sending many new schemas at once is served in parallel, not one after
 * another while their requests hold batch slots. The vocabulary trie is built on
 * first use (cons_get), not here: engines that never see a constraint do
 * not pay for it. */
int cons_create(struct cons **out, const struct tokenizer *tok, int n_vocab,
                const int32_t *eos_ids, int n_eos, int32_t think_open, int32_t think_close,
                int cache_cap, size_t cache_bytes, int compile_threads, struct rl_err *err);
void cons_free(struct cons *c);

/* The memory the cached constraints hold now (gram_bytes summed). */
size_t cons_cache_bytes(const struct cons *c);

/* The compiled form of a constraint, from the cache or compiled now.
 * src/len: JSON_SCHEMA the schema text, GRAMMAR the grammar, TOOL_CALL the
 * OpenAI tools array as JSON text (tool_name NULL or "" = any tool),
 * JSON_OBJECT nothing. *out is borrowed (see above). */
int cons_get(struct cons *c, enum cons_kind kind, const char *src, size_t len,
             const char *tool_name, struct gram **out, struct rl_err *err);

/* The compiled form of a constraint without compiling it here: *g
 * (borrowed, as cons_get's) when the cache holds it, else *job, a compile
 * queued for the compile threads (an identical one already queued or
 * compiling is shared), with the caller's reference. Exactly one of *g and
 * *job is set on success. A schema takes from under a millisecond to a few
 * hundred (schemas/grammar.md): compiled on the owner thread it would stall
 * every running request's step for that long. priority: the request's
 * (engine.h); queued compiles go highest first, the oldest among equals,
 * and a shared one takes its highest requester's. */
struct cons_job;
int cons_request(struct cons *c, enum cons_kind kind, const char *src, size_t len,
                 const char *tool_name, int priority, struct gram **g, struct cons_job **job,
                 struct rl_err *err);
/* 0: still compiling. 1: compiled: *g is valid while the caller holds job,
 * and the cache now holds it too. < 0: the compiler refused it
 * (err->code EV_CODE_BAD_PARAM) or failed (an RL_E* code). */
int cons_job_poll(struct cons *c, struct cons_job *job, struct gram **g, struct rl_err *err);
/* Drops the caller's reference (NULL is a no-op). A compile nobody waits
 * for any more is still finished and cached: the next request with the
 * same text, a retry most likely, finds it. */
void cons_job_release(struct cons *c, struct cons_job *job);
/* fn(user) runs on a compile thread before each compile (tests hold a
 * compile there to see what goes on meanwhile); NULL = none. Set it
 * before the first cons_request. */
void cons_set_compile_hook(struct cons *c, void (*fn)(void *user), void *user);
/* Waits until a compile has finished since the last call, or ms pass.
 * true when one has. */
bool cons_wait(struct cons *c, int ms);

/* Mask words per row: (n_vocab + 31) / 32. */
int cons_mask_words(const struct cons *c);
/* Think mode's fixed masks: before the reasoning opens only <think> may
 * come (thinking answers start with it, and a document must follow the
 * reasoning); inside it every token but the eos ids. Owned by c. */
const uint32_t *cons_open_mask(const struct cons *c);
const uint32_t *cons_think_mask(const struct cons *c);

/* Fills masks[i] (cons_mask_words words) from matchers m[i], i < n, on a
 * helper thread; the caller must not touch m[] or masks[] until
 * cons_masks_join(). When no thread can be started the masks are filled
 * here, before return. One batch in flight at a time. */
void cons_masks_start(struct cons *c, struct gram_match *const *m, uint32_t *const *masks,
                      int n);
void cons_masks_join(struct cons *c);

#endif
