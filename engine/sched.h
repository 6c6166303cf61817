/* engine/sched.h - the continuous-batching scheduler: who runs, how many
 * tokens each gets. Policy only: it drives kv_cache bookkeeping (blocks,
 * prefix matches) but never touches a tensor or a logit.
 *
 * There is no prefill phase and no decode phase (vLLM's V1 scheduler): every
 * sequence has tokens known (prompt, then generated or forced tokens) and
 * tokens computed (whose KV is in the pool); a step gives each running
 * sequence some of the difference, within a token budget per step and a
 * chunk limit per sequence, decodes first so a long prompt never stalls
 * them. A sequence whose scheduled tokens reach the end of what is known
 * wants logits; the engine samples from them and pushes the new token back.
 *
 * The life of a sequence, as the engine drives it:
 *
 *   sched_add(s, prompt, n, priority, deadline, user, &q, err);  // waiting
 *   loop:
 *     sched_schedule(s, now, &plan, err);  // admits, preempts, plans
 *     ... plan.expired[]: past their deadline, blocks already freed:
 *         finish them and sched_remove() ...
 *     ... forward plan.items[] as one be_batch ...
 *     sched_commit(s, err);                // the KV of the plan is real
 *     sched_push_tokens(q, &tok, 1, err);  // for items with want_logits
 *   sched_remove(s, q);                    // finished or cancelled
 *
 * Order: priority higher first, then arrival (FIFO within one priority).
 * Admission takes the head of the waiting queue only while the blocks for
 * its whole known token list (minus what the prefix cache already holds)
 * can be had on top of what running prefills still need, and the number of
 * running sequences stays below max_seqs; the queue head blocks those
 * behind it, so order is never violated.
 *
 * Preemption: when a running sequence needs a block and none is free, the
 * lowest-priority, newest running sequence gives up all its blocks and goes
 * back to the waiting queue at its original place. The same happens when
 * the head of the waiting queue cannot be admitted (blocks or max_seqs)
 * while a running sequence of strictly lower priority holds room: a
 * high-priority request never waits behind low-priority work. Its committed full
 * blocks stay in the prefix cache, so re-admission (kv_seq_match_prefix
 * over prompt + tokens generated so far) usually recomputes only the tail.
 * Recompute is exact on a batch-invariant backend, so nothing is lost.
 *
 * Threading: one thread (the engine's owner) uses a sched and its kv_cache. */
#ifndef RL_SCHED_H
#define RL_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "err.h"
#include "kv_cache.h"

struct sched_options {
    int max_seqs;      /* running sequences at most; <= 0 means 16 */
    int token_budget;  /* tokens in one step over all sequences; <= 0: 512.
                          The backend must be loaded for this many. */
    int prefill_chunk; /* tokens of one sequence in one step; <= 0 means
                          token_budget */
    int draft_rows;    /* drafts go in only while the step has fewer tokens
                          than this (beyond it a step is compute-bound and
                          a draft row costs more than it can win); <= 0:
                          token_budget */
};

struct sched;      /* the queues and the plan buffers */
struct sched_seq;  /* one request's known tokens and its kv_seq */

enum sched_state {
    SCHED_WAITING = 0, /* queued (new, or preempted) */
    SCHED_RUNNING,     /* holds blocks, scheduled every step it can be */
    SCHED_EXPIRED,     /* past its deadline; blocks freed; awaits remove */
};

/* One sequence's share of the step. */
struct sched_item {
    struct sched_seq *seq;
    void *user;                 /* as given to sched_add */
    int32_t n_past;             /* tokens already computed: be_seq.n_past */
    int32_t n_new;              /* tokens to compute now, >= 1 */
    const int32_t *tokens;      /* (n_new) owned by seq, valid until the next
                                   sched_push_tokens on it */
    const int32_t *block_table; /* owned by the kv_seq, valid until
                                   sched_commit */
    bool want_logits;           /* the chunk reaches the last known token:
                                   sample from its last row (from its last
                                   1 + n_draft rows with a draft) */
    int32_t n_draft;            /* speculative tokens at the end of tokens
                                   (sched_seq_set_draft), 0 none; the rows
                                   of the last known token and of each
                                   draft all want logits */
};

/* The outcome of sched_schedule(), owned by the sched and valid until the
 * next sched_schedule(). */
struct sched_plan {
    int n_items;
    const struct sched_item *items; /* (n_items) in priority order */
    int n_tokens;                   /* sum of n_new */
    int n_logits;                   /* rows wanting logits: 1 + n_draft
                                       per item with want_logits */
    int n_expired;
    struct sched_seq *const *expired; /* (n_expired) newly SCHED_EXPIRED */
    int n_preempted;                  /* preemptions during this call */
    int n_admitted;                   /* admissions during this call */
};

struct sched_stats {
    int n_running, n_waiting;
    int64_t n_preemptions;   /* since creation */
    int64_t n_admissions;    /* including re-admissions after preemption */
};

/* Creates a scheduler over kv (not owned; it must outlive the sched). The
 * caller owns *out (sched_free). Returns 0, -RL_EINVAL or -RL_ENOMEM. */
int sched_create(struct sched **out, struct kv_cache *kv,
                 const struct sched_options *opt, struct rl_err *err);
/* Frees every sequence still held (and their blocks), then the sched. */
void sched_free(struct sched *s);

/* Queues a sequence with a copy of prompt (n_prompt >= 1 ids, each >= 0).
 * deadline is an absolute time in the clock the caller passes to
 * sched_schedule (seconds), <= 0 for none. *out stays valid until
 * sched_remove. Returns 0, -RL_EINVAL (empty prompt, a prompt that could not
 * fit in the whole pool) or -RL_ENOMEM. */
int sched_add(struct sched *s, const int32_t *prompt, int n_prompt,
              int priority, double deadline, void *user,
              struct sched_seq **out, struct rl_err *err);

/* Appends n known tokens (a sampled token, or forced text) to a sequence;
 * they are computed in later steps. Allowed in any state. Returns 0,
 * -RL_EINVAL or -RL_ENOMEM. */
int sched_push_tokens(struct sched_seq *q, const int32_t *tokens, int n,
                      struct rl_err *err);

/* Speculation. Proposes n draft tokens to follow the known ones; the next
 * schedule appends as many as its budget and free blocks allow (never
 * preempting for them) to the sequence's decode and reports them as
 * sched_item.n_draft. Any sched_push_tokens drops the draft; preemption
 * too. Returns 0, -RL_EINVAL or -RL_ENOMEM. */
int sched_seq_set_draft(struct sched_seq *q, const int32_t *draft, int n,
                        struct rl_err *err);

/* After sched_commit of a step whose item had n_draft > 0, and after
 * pushing the tokens the engine accepted: keeps the first n_accepted
 * drafts' KV as computed (they must equal the tokens pushed) and rolls
 * the rest back. Unresolved drafts are rolled back at the next schedule.
 * Returns 0, -RL_EINVAL or -RL_EINTERNAL (accepted tokens differ). */
int sched_seq_resolve_draft(struct sched_seq *q, int n_accepted, struct rl_err *err);

/* Drops a sequence at once, whatever its state: its blocks go back to the
 * pool (committed full blocks stay cached) before this returns. q is
 * invalid afterwards. Must not be called between sched_schedule and
 * sched_commit for a sequence in the plan (the engine finishes requests
 * after the commit). NULL is a no-op. */
void sched_remove(struct sched *s, struct sched_seq *q);

/* Plans one step at time now: expires sequences past their deadline,
 * admits waiting ones, reserves blocks for every item (preempting if need
 * be) and fills *plan. An empty plan (n_items 0) means nothing can run.
 * Returns 0 or a negative code (-RL_ENOMEM; the sched stays consistent). */
int sched_schedule(struct sched *s, double now, struct sched_plan *plan,
                   struct rl_err *err);

/* After the backend computed the plan: marks the planned tokens computed
 * (and registers full blocks in the prefix cache). If the forward failed,
 * call sched_abort instead. */
int sched_commit(struct sched *s, struct rl_err *err);

/* After a failed forward: forgets the planned tokens (the sequences will
 * recompute them next step). */
void sched_abort(struct sched *s);

/* How many more requests of n_prompt_tokens each could be admitted now,
 * after those already waiting, without preempting anyone: bounded by free
 * sequence slots and by free blocks (counting one block of growth each).
 * A question for the worker's queue reader; changes nothing. */
int sched_can_admit(const struct sched *s, int n_prompt_tokens);

void sched_get_stats(const struct sched *s, struct sched_stats *st);

/* ---- one sequence ---- */
enum sched_state sched_seq_state(const struct sched_seq *q);
void *sched_seq_user(const struct sched_seq *q);
/* Known tokens: the prompt followed by everything pushed. Owned by q. */
const int32_t *sched_seq_tokens(const struct sched_seq *q);
int sched_seq_n_tokens(const struct sched_seq *q);
int sched_seq_n_prompt(const struct sched_seq *q);
/* Tokens whose KV is in the pool now (0 while waiting). */
int sched_seq_n_computed(const struct sched_seq *q);
/* Prompt tokens the prefix cache supplied at first admission, -1 before it. */
int sched_seq_n_cached_prompt(const struct sched_seq *q);
int sched_seq_n_preemptions(const struct sched_seq *q);

/* The prefix-cache domain of a waiting sequence (kv_seq_set_salt): set
 * right after sched_add, kept across preemptions. 0 = shared. */
void sched_seq_set_cache_salt(struct sched_seq *q, uint64_t salt);

#endif
