/* engine/sched.c - continuous-batching policy over the paged KV cache.
 *
 * Two queues, each an array kept sorted by (priority desc, arrival asc):
 * `running` (sequences holding a kv_seq) and `waiting` (new or preempted).
 * Arrays, not lists, because both are short (max_seqs, the queue depth the
 * worker allows) and one sorted insert per admission or preemption is
 * cheaper than chasing pointers every step.
 *
 * A step (sched_schedule):
 *   1. sequences past their deadline leave either queue, blocks freed;
 *   2. running decodes (one pending token) are planned first, in order,
 *      then running prefills (chunks of at most prefill_chunk), all within
 *      token_budget: a long prompt can never stall the decodes;
 *   3. waiting sequences are admitted from the head while the blocks their
 *      whole known token list needs (after prefix hits) fit next to what
 *      running prefills still need, and take what budget is left; a head
 *      that does not fit (blocks or max_seqs) preempts running sequences
 *      of strictly lower priority, tail first, until it does;
 *   4. speculative drafts (sched_seq_set_draft) extend planned decodes
 *      with what budget is left, while the step stays under draft_rows
 *      tokens, and only with blocks that are free after
 *      what running prefills still need: a draft never preempts anyone and
 *      never delays a prompt, it only fills a step that has room.
 * Planning an item appends its tokens to the kv_seq, which reserves the
 * slots; when a block cannot be had, the tail of `running` (lowest
 * priority, newest) is preempted - unplanned if it was already in the plan
 * - until it can, and if the tail is the requester itself, it goes.
 *
 * Invariant between steps: for a running sequence, kv_seq_n_tokens ==
 * kv_seq_n_computed (every appended token was committed), so "pending" is
 * n_tokens - kv_seq_n_tokens. During a plan (schedule..commit) the planned
 * tokens are appended but not yet computed; sched_abort() undoes a failed
 * step by preempting the planned sequences (a recompute is exact anyway).
 *
 * Drafts: a decode item carrying n_draft speculative tokens appends them
 * to the kv_seq with its real token. sched_commit() commits only the real
 * token and leaves the drafts appended but uncommitted (so no block that
 * holds a draft is ever registered in the prefix cache); the engine then
 * pushes the tokens it accepted and calls sched_seq_resolve_draft(), which
 * truncates the kv_seq to the accepted drafts (kv_seq_truncate: a length
 * change, private tail blocks freed) and commits those. A sequence left
 * unresolved is resolved with nothing accepted at the next schedule.
 *
 * Called by engine.c on its owner thread only. */
#include "sched.h"

#include <stdlib.h>
#include <string.h>

struct sched_seq {
    struct sched *s;
    int32_t *tokens; /* (cap) prompt then pushed tokens, n_tokens valid */
    int n_tokens, cap, n_prompt;
    int priority;
    double deadline;  /* <= 0: none */
    void *user;
    uint64_t arrival; /* FIFO order within a priority, kept on preemption */
    enum sched_state state;
    struct kv_seq *kv; /* while running */
    int n_cached_prompt;
    int n_preempt;
    int item;          /* index into s->items while planned, else -1 */
    int n_draft;       /* speculative tokens stored at tokens[n_tokens..] for
                          the next decode; 0 none */
    int n_unverified;  /* drafts appended to kv and computed, awaiting
                          sched_seq_resolve_draft */
    uint64_t cache_salt; /* its prefix-cache domain (kv_seq_set_salt); 0 = shared */
};

struct sched {
    struct kv_cache *kv;
    struct sched_options opt;
    struct sched_seq **running, **waiting; /* (max_seqs) and (cap_waiting) */
    int n_running, n_waiting, cap_waiting;
    uint64_t next_arrival;
    struct sched_item *items; /* (2 * max_seqs): live items plus the holes
                                 that preempting planned sequences leaves
                                 until compaction; victims were running at
                                 the start of the step, so at most max_seqs */
    int n_items;
    struct sched_seq **expired; /* (cap_expired) */
    int n_expired, cap_expired;
    bool planned;             /* between schedule and commit/abort */
    int64_t n_preemptions, n_admissions;
};

static bool seq_before(const struct sched_seq *a, const struct sched_seq *b)
{
    return a->priority > b->priority ||
           (a->priority == b->priority && a->arrival < b->arrival);
}

/* Inserts q into a sorted array of n entries (room for one more). */
static void sorted_insert(struct sched_seq **arr, int *n, struct sched_seq *q)
{
    int i = *n;
    while (i > 0 && seq_before(q, arr[i - 1])) {
        arr[i] = arr[i - 1];
        i--;
    }
    arr[i] = q;
    (*n)++;
}

static void array_remove(struct sched_seq **arr, int *n, struct sched_seq *q)
{
    for (int i = 0; i < *n; i++)
        if (arr[i] == q) {
            memmove(&arr[i], &arr[i + 1], (size_t)(*n - i - 1) * sizeof *arr);
            (*n)--;
            return;
        }
}

static int grow_waiting(struct sched *s, struct rl_err *err)
{
    /* room for every live sequence, so preempt() never has to allocate */
    int want = s->n_waiting + s->n_running + 1;
    if (want <= s->cap_waiting)
        return 0;
    int cap = s->cap_waiting ? s->cap_waiting * 2 : 64;
    while (cap < want)
        cap *= 2;
    struct sched_seq **w = realloc(s->waiting, (size_t)cap * sizeof *w);
    if (!w)
        return rl_errf(err, RL_ENOMEM, "sched: out of memory for the waiting queue");
    s->waiting = w;
    s->cap_waiting = cap;
    return 0;
}

int sched_create(struct sched **out, struct kv_cache *kv,
                 const struct sched_options *opt, struct rl_err *err)
{
    *out = NULL;
    if (!kv)
        return rl_errf(err, RL_EINVAL, "sched_create: no kv_cache");
    struct sched_options o = opt ? *opt : (struct sched_options){0};
    if (o.max_seqs <= 0)
        o.max_seqs = 16;
    if (o.token_budget <= 0)
        o.token_budget = 512;
    if (o.prefill_chunk <= 0 || o.prefill_chunk > o.token_budget)
        o.prefill_chunk = o.token_budget;
    if (o.draft_rows <= 0 || o.draft_rows > o.token_budget)
        o.draft_rows = o.token_budget;
    struct sched *s = calloc(1, sizeof *s);
    if (!s)
        return rl_errf(err, RL_ENOMEM, "sched_create: out of memory");
    s->kv = kv;
    s->opt = o;
    s->running = calloc((size_t)o.max_seqs, sizeof *s->running);
    s->items = calloc(2 * (size_t)o.max_seqs, sizeof *s->items);
    if (!s->running || !s->items || grow_waiting(s, err)) {
        sched_free(s);
        return rl_errf(err, RL_ENOMEM, "sched_create: out of memory");
    }
    *out = s;
    return 0;
}

static void seq_destroy(struct sched_seq *q)
{
    kv_seq_free(q->kv);
    free(q->tokens);
    free(q);
}

void sched_free(struct sched *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_running; i++)
        seq_destroy(s->running[i]);
    for (int i = 0; i < s->n_waiting; i++)
        seq_destroy(s->waiting[i]);
    for (int i = 0; i < s->n_expired; i++)
        if (s->expired[i]) /* expired but not yet removed */
            seq_destroy(s->expired[i]);
    free(s->running);
    free(s->waiting);
    free(s->items);
    free(s->expired);
    free(s);
}

static int seq_reserve(struct sched_seq *q, int n, struct rl_err *err)
{
    if (q->n_tokens + n <= q->cap)
        return 0;
    int cap = q->cap ? q->cap : 64;
    while (cap < q->n_tokens + n)
        cap *= 2;
    int32_t *t = realloc(q->tokens, (size_t)cap * sizeof *t);
    if (!t)
        return rl_errf(err, RL_ENOMEM, "sched: out of memory for %d tokens", cap);
    q->tokens = t;
    q->cap = cap;
    return 0;
}

int sched_add(struct sched *s, const int32_t *prompt, int n_prompt,
              int priority, double deadline, void *user,
              struct sched_seq **out, struct rl_err *err)
{
    *out = NULL;
    if (!prompt || n_prompt < 1)
        return rl_errf(err, RL_EINVAL, "sched_add: empty prompt");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0)
            return rl_errf(err, RL_EINVAL, "sched_add: token %d is negative (%d)", i,
                           prompt[i]);
    /* one token of room: the prompt must leave space for its first output */
    int need = kv_blocks_needed(s->kv, NULL, n_prompt + 1);
    if (need > kv_n_blocks(s->kv))
        return rl_errf(err, RL_EINVAL,
                       "sched_add: a prompt of %d tokens needs %d blocks; the pool has %d",
                       n_prompt, need, kv_n_blocks(s->kv));
    int rc = grow_waiting(s, err);
    if (rc)
        return rc;
    struct sched_seq *q = calloc(1, sizeof *q);
    if (!q)
        return rl_errf(err, RL_ENOMEM, "sched_add: out of memory");
    if ((rc = seq_reserve(q, n_prompt + 1, err))) {
        free(q);
        return rc;
    }
    memcpy(q->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    q->s = s;
    q->n_tokens = q->n_prompt = n_prompt;
    q->priority = priority;
    q->deadline = deadline;
    q->user = user;
    q->arrival = s->next_arrival++;
    q->state = SCHED_WAITING;
    q->n_cached_prompt = -1;
    q->item = -1;
    sorted_insert(s->waiting, &s->n_waiting, q);
    *out = q;
    return 0;
}

int sched_push_tokens(struct sched_seq *q, const int32_t *tokens, int n,
                      struct rl_err *err)
{
    if (n < 0 || (n > 0 && !tokens))
        return rl_errf(err, RL_EINVAL, "sched_push_tokens: bad count %d", n);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0)
            return rl_errf(err, RL_EINVAL, "sched_push_tokens: negative token %d",
                           tokens[i]);
    int rc = seq_reserve(q, n, err);
    if (rc)
        return rc;
    memcpy(q->tokens + q->n_tokens, tokens, (size_t)n * sizeof *tokens);
    q->n_tokens += n;
    q->n_draft = 0; /* a draft follows the known tokens it was made for */
    return 0;
}

int sched_seq_set_draft(struct sched_seq *q, const int32_t *draft, int n,
                        struct rl_err *err)
{
    if (n < 0 || (n > 0 && !draft))
        return rl_errf(err, RL_EINVAL, "sched_seq_set_draft: bad count %d", n);
    for (int i = 0; i < n; i++)
        if (draft[i] < 0)
            return rl_errf(err, RL_EINVAL, "sched_seq_set_draft: negative token %d",
                           draft[i]);
    int rc = seq_reserve(q, n, err);
    if (rc)
        return rc;
    memcpy(q->tokens + q->n_tokens, draft, (size_t)n * sizeof *draft);
    q->n_draft = n;
    return 0;
}

int sched_seq_resolve_draft(struct sched_seq *q, int n_accepted, struct rl_err *err)
{
    if (q->n_unverified == 0 && n_accepted == 0)
        return 0;
    if (!q->kv || n_accepted < 0 || n_accepted > q->n_unverified)
        return rl_errf(err, RL_EINVAL, "sched_seq_resolve_draft: %d accepted of %d",
                       n_accepted, q->n_unverified);
    int c = kv_seq_n_computed(q->kv);
    const int32_t *kt = kv_seq_tokens(q->kv);
    /* an accepted draft is one the engine pushed as known: its KV, computed
     * for that very token after the same prefix, is then real */
    if (c + n_accepted > q->n_tokens ||
        memcmp(kt + c, q->tokens + c, (size_t)n_accepted * sizeof *kt))
        return rl_errf(err, RL_EINTERNAL,
                       "sched_seq_resolve_draft: accepted tokens differ from the draft");
    q->n_unverified = 0;
    int rc = kv_seq_truncate(q->kv, c + n_accepted, err);
    if (!rc)
        rc = kv_seq_commit(q->kv, c + n_accepted, err);
    return rc;
}

/* Running -> waiting: all blocks go back (full committed ones stay cached). */
static void preempt(struct sched *s, struct sched_seq *q)
{
    if (q->item >= 0) {
        s->items[q->item].seq = NULL; /* unplanned; compacted later */
        q->item = -1;
    }
    array_remove(s->running, &s->n_running, q);
    kv_seq_free(q->kv);
    q->kv = NULL;
    q->n_draft = q->n_unverified = 0;
    q->state = SCHED_WAITING;
    q->n_preempt++;
    s->n_preemptions++;
    /* grow_waiting() at sched_add keeps room for every live sequence */
    sorted_insert(s->waiting, &s->n_waiting, q);
}

void sched_remove(struct sched *s, struct sched_seq *q)
{
    if (!q)
        return;
    if (q->state == SCHED_RUNNING)
        array_remove(s->running, &s->n_running, q);
    else if (q->state == SCHED_WAITING)
        array_remove(s->waiting, &s->n_waiting, q);
    for (int i = 0; i < s->n_expired; i++) /* the plan no longer names it */
        if (s->expired[i] == q)
            s->expired[i] = NULL;
    seq_destroy(q);
}

static int add_expired(struct sched *s, struct sched_seq *q, struct rl_err *err)
{
    if (s->n_expired == s->cap_expired) {
        int cap = s->cap_expired ? s->cap_expired * 2 : 16;
        struct sched_seq **e = realloc(s->expired, (size_t)cap * sizeof *e);
        if (!e)
            return rl_errf(err, RL_ENOMEM, "sched: out of memory");
        s->expired = e;
        s->cap_expired = cap;
    }
    s->expired[s->n_expired++] = q;
    return 0;
}

static int expire(struct sched *s, double now, struct rl_err *err)
{
    for (int pass = 0; pass < 2; pass++) {
        struct sched_seq **arr = pass ? s->waiting : s->running;
        int *n = pass ? &s->n_waiting : &s->n_running;
        for (int i = 0; i < *n;) {
            struct sched_seq *q = arr[i];
            if (q->deadline > 0 && now >= q->deadline) {
                int rc = add_expired(s, q, err);
                if (rc)
                    return rc;
                memmove(&arr[i], &arr[i + 1], (size_t)(*n - i - 1) * sizeof *arr);
                (*n)--;
                kv_seq_free(q->kv);
                q->kv = NULL;
                q->state = SCHED_EXPIRED;
            } else {
                i++;
            }
        }
    }
    return 0;
}

/* Plans n tokens of running sequence q, preempting from the tail of
 * `running` until its blocks can be had. Returns 0 planned, 1 when q
 * itself was preempted, or a negative code. */
static int plan_tokens(struct sched *s, struct sched_seq *q, int n, int *budget,
                       struct rl_err *err)
{
    while (kv_blocks_needed(s->kv, q->kv, n) > kv_free_blocks(s->kv)) {
        struct sched_seq *victim = s->running[s->n_running - 1];
        if (victim->item >= 0)
            *budget += s->items[victim->item].n_new;
        preempt(s, victim);
        if (victim == q)
            return 1;
    }
    int appended = kv_seq_n_tokens(q->kv);
    int rc = kv_seq_append(q->kv, q->tokens + appended, n, err);
    if (rc)
        return rc;
    struct sched_item *it = &s->items[s->n_items];
    memset(it, 0, sizeof *it);
    it->seq = q;
    it->n_new = n;
    q->item = s->n_items++;
    *budget -= n;
    return 0;
}

static int pending(const struct sched_seq *q)
{
    return q->n_tokens - kv_seq_n_tokens(q->kv);
}

/* Preempts the tail of `running` (lowest priority, newest) for q, a waiting
 * sequence that cannot be admitted, when the tail's priority is strictly
 * lower. Keeps *reserved (blocks running sequences still need) and *budget
 * (a planned victim's tokens come back) true. Returns whether it did. */
static bool make_room(struct sched *s, const struct sched_seq *q, int *reserved, int *budget)
{
    if (s->n_running == 0)
        return false;
    struct sched_seq *victim = s->running[s->n_running - 1];
    if (victim->priority >= q->priority)
        return false;
    if (victim->item >= 0)
        *budget += s->items[victim->item].n_new;
    *reserved -= kv_blocks_needed(s->kv, victim->kv, pending(victim));
    preempt(s, victim);
    return true;
}

int sched_schedule(struct sched *s, double now, struct sched_plan *plan,
                   struct rl_err *err)
{
    memset(plan, 0, sizeof *plan);
    if (s->planned)
        sched_abort(s);
    s->n_items = 0;
    s->n_expired = 0;
    int64_t pre0 = s->n_preemptions, adm0 = s->n_admissions;
    int rc;
    for (int i = 0; i < s->n_running; i++) /* drafts the engine left open */
        if (s->running[i]->n_unverified &&
            (rc = sched_seq_resolve_draft(s->running[i], 0, err)))
            return rc;
    if ((rc = expire(s, now, err)))
        return rc;
    s->planned = true;

    int budget = s->opt.token_budget;
    /* pass 0: decodes; pass 1: prefill chunks (and forced text) */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < s->n_running && budget > 0; i++) {
            struct sched_seq *q = s->running[i];
            int p = pending(q);
            if (q->item >= 0 || p <= 0 || (pass == 0) != (p == 1))
                continue;
            int n = p < budget ? p : budget;
            if (n > s->opt.prefill_chunk)
                n = s->opt.prefill_chunk;
            rc = plan_tokens(s, q, n, &budget, err);
            if (rc < 0)
                return rc;
            if (rc == 1) /* q was the tail: everything after it is gone too */
                break;
        }
    }

    /* blocks the running sequences still need for their known tokens */
    int reserved = 0;
    for (int i = 0; i < s->n_running; i++)
        reserved += kv_blocks_needed(s->kv, s->running[i]->kv, pending(s->running[i]));

    while (s->n_waiting > 0 && budget > 0) {
        struct sched_seq *q = s->waiting[0];
        int n_cached = 0;
        int need = kv_probe_prefix_salted(s->kv, q->cache_salt, q->tokens, q->n_tokens,
                                          &n_cached);
        if (s->n_running >= s->opt.max_seqs || !kv_can_allocate(s->kv, need + reserved)) {
            /* No room: a strictly lower-priority running sequence makes
             * way (vLLM's priority policy). Equal priorities never preempt
             * each other, so FIFO requests cannot thrash. */
            if (!make_room(s, q, &reserved, &budget))
                break;
            continue; /* the probe changes: freed blocks may hold its prefix */
        }
        if ((rc = kv_seq_create(s->kv, &q->kv, err)))
            return rc;
        kv_seq_set_salt(q->kv, q->cache_salt);
        if ((rc = kv_seq_match_prefix(q->kv, q->tokens, q->n_tokens, &n_cached, err))) {
            kv_seq_free(q->kv);
            q->kv = NULL;
            return rc;
        }
        memmove(&s->waiting[0], &s->waiting[1], (size_t)(s->n_waiting - 1) * sizeof *s->waiting);
        s->n_waiting--;
        if (q->n_cached_prompt < 0)
            q->n_cached_prompt = n_cached < q->n_prompt ? n_cached : q->n_prompt;
        q->state = SCHED_RUNNING;
        q->item = -1;
        sorted_insert(s->running, &s->n_running, q);
        s->n_admissions++;
        int p = pending(q);
        int n = p < budget ? p : budget;
        if (n > s->opt.prefill_chunk)
            n = s->opt.prefill_chunk;
        /* admission checked the blocks, so this cannot preempt anyone; but
         * if the accounting and the pool ever disagree, wait a step instead */
        if (kv_blocks_needed(s->kv, q->kv, n) <= kv_free_blocks(s->kv)) {
            if ((rc = plan_tokens(s, q, n, &budget, err)) < 0)
                return rc;
        }
        reserved += kv_blocks_needed(s->kv, q->kv, pending(q));
    }

    /* drafts: planned decodes grow by their speculative tokens with what
     * budget is left, up to draft_rows tokens in the step, shared out one
     * token at a time in plan order (so a short room is split, not taken
     * by the first), and only with blocks nobody else is owed */
    int rows = s->opt.token_budget - budget;
    int room = s->opt.draft_rows - rows < budget ? s->opt.draft_rows - rows : budget;
    for (bool more = true; room > 0 && more;) {
        more = false;
        for (int i = 0; i < s->n_items && room > 0; i++) {
            struct sched_item *it = &s->items[i];
            struct sched_seq *q = it->seq;
            if (!q || it->n_draft >= q->n_draft || it->n_new != 1 || pending(q) != 0)
                continue;
            it->n_draft++; /* a share for now; appended below */
            room--;
            more = true;
        }
    }
    for (int i = 0; i < s->n_items; i++) {
        struct sched_item *it = &s->items[i];
        struct sched_seq *q = it->seq;
        int d = it->n_draft;
        it->n_draft = 0;
        if (!q || d <= 0)
            continue;
        while (d > 0 && kv_blocks_needed(s->kv, q->kv, d) > kv_free_blocks(s->kv) - reserved)
            d--;
        if (d <= 0)
            continue;
        if ((rc = kv_seq_append(q->kv, q->tokens + q->n_tokens, d, err)))
            return rc;
        it->n_new += d;
        it->n_draft = d;
        budget -= d;
    }

    /* compact (preemption may have unplanned items) and fill the views;
     * block tables are read last, after every append of this step */
    int k = 0;
    for (int i = 0; i < s->n_items; i++) {
        struct sched_item *it = &s->items[i];
        struct sched_seq *q = it->seq;
        if (!q)
            continue;
        q->item = k;
        it->user = q->user;
        it->n_past = kv_seq_n_computed(q->kv);
        it->tokens = q->tokens + it->n_past;
        it->want_logits = it->n_past + it->n_new == q->n_tokens + it->n_draft;
        plan->n_tokens += it->n_new;
        plan->n_logits += it->want_logits ? 1 + it->n_draft : 0;
        s->items[k++] = *it;
    }
    s->n_items = k;
    for (int i = 0; i < k; i++)
        s->items[i].block_table = kv_seq_block_table(s->items[i].seq->kv);
    plan->n_items = k;
    plan->items = s->items;
    plan->n_expired = s->n_expired;
    plan->expired = s->expired;
    plan->n_preempted = (int)(s->n_preemptions - pre0);
    plan->n_admitted = (int)(s->n_admissions - adm0);
    return 0;
}

int sched_commit(struct sched *s, struct rl_err *err)
{
    int rc = 0;
    for (int i = 0; i < s->n_items; i++) {
        struct sched_seq *q = s->items[i].seq;
        q->item = -1;
        /* drafts stay appended, uncommitted, until resolved */
        q->n_unverified = s->items[i].n_draft;
        q->n_draft = 0;
        int r = kv_seq_commit(q->kv, kv_seq_n_tokens(q->kv) - q->n_unverified, err);
        if (r && !rc)
            rc = r;
    }
    s->n_items = 0;
    s->planned = false;
    return rc;
}

void sched_abort(struct sched *s)
{
    for (int i = 0; i < s->n_items; i++) {
        struct sched_seq *q = s->items[i].seq;
        q->item = -1;
        preempt(s, q);
        q->n_preempt--; /* not a policy preemption */
        s->n_preemptions--;
    }
    s->n_items = 0;
    s->planned = false;
}

int sched_can_admit(const struct sched *s, int n_prompt_tokens)
{
    if (n_prompt_tokens < 1)
        n_prompt_tokens = 1;
    int slots = s->opt.max_seqs - s->n_running - s->n_waiting;
    if (slots <= 0)
        return 0;
    int free_blocks = kv_free_blocks(s->kv);
    for (int i = 0; i < s->n_running; i++)
        free_blocks -= kv_blocks_needed(s->kv, s->running[i]->kv, pending(s->running[i]));
    for (int i = 0; i < s->n_waiting; i++)
        free_blocks -= kv_blocks_needed(s->kv, NULL, s->waiting[i]->n_tokens);
    int per = kv_blocks_needed(s->kv, NULL, n_prompt_tokens + 1);
    if (free_blocks < per || per <= 0)
        return 0;
    int n = free_blocks / per;
    return n < slots ? n : slots;
}

void sched_get_stats(const struct sched *s, struct sched_stats *st)
{
    st->n_running = s->n_running;
    st->n_waiting = s->n_waiting;
    st->n_preemptions = s->n_preemptions;
    st->n_admissions = s->n_admissions;
}

enum sched_state sched_seq_state(const struct sched_seq *q) { return q->state; }
void *sched_seq_user(const struct sched_seq *q) { return q->user; }
const int32_t *sched_seq_tokens(const struct sched_seq *q) { return q->tokens; }
int sched_seq_n_tokens(const struct sched_seq *q) { return q->n_tokens; }
int sched_seq_n_prompt(const struct sched_seq *q) { return q->n_prompt; }
int sched_seq_n_computed(const struct sched_seq *q)
{
    return q->kv ? kv_seq_n_computed(q->kv) : 0;
}
int sched_seq_n_cached_prompt(const struct sched_seq *q) { return q->n_cached_prompt; }
int sched_seq_n_preemptions(const struct sched_seq *q) { return q->n_preempt; }

void sched_seq_set_cache_salt(struct sched_seq *q, uint64_t salt)
{
    q->cache_salt = salt;
}
