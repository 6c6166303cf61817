/* tests/unit/test_sched.c - the scheduler's policy on a bare kv_cache (no
 * model, no tensors): priority and FIFO order, max_seqs, the token budget
 * with decodes first and chunked prefill, preemption of the lowest-
 * priority newest sequence and its re-admission through the prefix cache,
 * deadlines, removal, can_admit, and speculative drafts. A "step" here commits the plan and
 * pushes a made-up token for every item that wants logits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kv_cache.h"
#include "sched.h"

struct rig {
    struct kv_cache *kv;
    struct sched *s;
    struct sched_plan plan;
};

static void rig_open(struct rig *r, int n_blocks, int block_size, int max_seqs, int budget,
                     int chunk)
{
    struct rl_err err = {0};
    memset(r, 0, sizeof *r);
    assert_int_equal(kv_cache_create(&r->kv, n_blocks, block_size, &err), 0);
    struct sched_options o = {max_seqs, budget, chunk, 0};
    assert_int_equal(sched_create(&r->s, r->kv, &o, &err), 0);
}

static void rig_close(struct rig *r)
{
    struct rl_err err = {0};
    sched_free(r->s);
    assert_int_equal(kv_check(r->kv, &err), 0);
    kv_cache_free(r->kv);
}

static struct sched_seq *add(struct rig *r, int n, int prio, uint32_t seed, double deadline)
{
    int32_t ids[512];
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        ids[i] = (int32_t)(seed >> 12) % 1000;
    }
    struct sched_seq *q;
    struct rl_err err = {0};
    assert_int_equal(sched_add(r->s, ids, n, prio, deadline, NULL, &q, &err), 0);
    return q;
}

/* Plans, commits, and pushes token 7 for every item that wants logits. */
static void step(struct rig *r, double now)
{
    struct rl_err err = {0};
    assert_int_equal(sched_schedule(r->s, now, &r->plan, &err), 0);
    assert_int_equal(kv_check(r->kv, &err), 0);
    int n_tokens = 0;
    for (int i = 0; i < r->plan.n_items; i++)
        n_tokens += r->plan.items[i].n_new;
    assert_int_equal(n_tokens, r->plan.n_tokens);
    /* the items must be copied out before the commit: that is the engine's
     * order too (forward reads them, then commit) */
    struct sched_item items[64];
    int n = r->plan.n_items;
    memcpy(items, r->plan.items, (size_t)n * sizeof *items);
    assert_int_equal(sched_commit(r->s, &err), 0);
    for (int i = 0; i < n; i++)
        if (items[i].want_logits) {
            int32_t t = 7;
            assert_int_equal(sched_push_tokens(items[i].seq, &t, 1, &err), 0);
        }
}

static const struct sched_item *item_of(const struct rig *r, const struct sched_seq *q)
{
    for (int i = 0; i < r->plan.n_items; i++)
        if (r->plan.items[i].seq == q)
            return &r->plan.items[i];
    return NULL;
}

static void test_priority_fifo_and_max_seqs(void **state)
{
    (void)state;
    struct rig r;
    rig_open(&r, 64, 4, 2, 64, 0);
    struct sched_seq *a = add(&r, 5, 0, 1, 0);
    struct sched_seq *b = add(&r, 5, 5, 2, 0);
    struct sched_seq *c = add(&r, 5, 0, 3, 0);
    struct sched_seq *d = add(&r, 5, 5, 4, 0);
    step(&r, 0);
    /* higher priority first, FIFO within: b, d; a and c wait */
    assert_int_equal(r.plan.n_items, 2);
    assert_ptr_equal(r.plan.items[0].seq, b);
    assert_ptr_equal(r.plan.items[1].seq, d);
    assert_int_equal(sched_seq_state(a), SCHED_WAITING);
    sched_remove(r.s, d);
    step(&r, 0);
    assert_non_null(item_of(&r, a));
    assert_null(item_of(&r, c));
    assert_int_equal(item_of(&r, b)->n_new, 1); /* b decodes */
    assert_int_equal(item_of(&r, a)->n_new, 5); /* a prefills whole */
    assert_true(item_of(&r, a)->want_logits);
    rig_close(&r);
}

static void test_budget_decodes_first_and_chunks(void **state)
{
    (void)state;
    struct rig r;
    rig_open(&r, 64, 4, 4, 8, 5);
    struct sched_seq *a = add(&r, 3, 0, 1, 0);
    step(&r, 0); /* a prefilled, has a token to decode */
    struct sched_seq *b = add(&r, 20, 9, 2, 0);
    step(&r, 0);
    /* a's decode goes first whatever the priority; b gets min(chunk, rest) */
    assert_int_equal(item_of(&r, a)->n_new, 1);
    assert_int_equal(item_of(&r, b)->n_new, 5);
    assert_false(item_of(&r, b)->want_logits);
    int done = 5;
    while (done < 20) {
        step(&r, 0);
        const struct sched_item *it = item_of(&r, b);
        assert_non_null(it);
        assert_int_equal(it->n_past, done);
        assert_int_equal(it->n_new, 20 - done < 5 ? 20 - done : 5);
        assert_int_equal(it->want_logits, done + it->n_new == 20);
        assert_int_equal(item_of(&r, a)->n_new, 1);
        assert_true(r.plan.n_tokens <= 8);
        done += it->n_new;
    }
    assert_int_equal(sched_seq_n_computed(b), 20);
    rig_close(&r);
}

static void test_preemption_and_resume(void **state)
{
    (void)state;
    struct rig r;
    /* 6 blocks of 4 tokens */
    rig_open(&r, 6, 4, 4, 64, 0);
    struct sched_seq *a = add(&r, 8, 0, 1, 0);
    struct sched_seq *b = add(&r, 8, 0, 2, 0);
    step(&r, 0); /* 2 + 2 blocks; each pushed a token */
    assert_int_equal(r.plan.n_items, 2);
    /* decode until a block is missing: 8 tokens each fill their blocks,
     * then a and b need a 3rd block each (6 total): fine; then a 4th */
    int preempted = 0;
    for (int i = 0; i < 12 && !preempted; i++) {
        step(&r, 0);
        preempted = r.plan.n_preempted;
    }
    assert_true(preempted > 0);
    /* the newest (b) gave way; a kept running */
    assert_int_equal(sched_seq_state(a), SCHED_RUNNING);
    assert_int_equal(sched_seq_state(b), SCHED_WAITING);
    assert_int_equal(sched_seq_n_preemptions(b), 1);
    int n_b = sched_seq_n_tokens(b);
    /* a finishes; b comes back and recomputes only what the cache lost */
    sched_remove(r.s, a);
    step(&r, 0);
    const struct sched_item *it = item_of(&r, b);
    assert_non_null(it);
    assert_true(it->n_past > 0); /* its full blocks were still cached */
    assert_int_equal(it->n_past + it->n_new, n_b);
    assert_true(it->want_logits);
    rig_close(&r);
}

static void test_priority_preempts_lower(void **state)
{
    (void)state;
    struct rig r;
    rig_open(&r, 4, 4, 4, 64, 0);
    struct sched_seq *lo = add(&r, 6, 0, 1, 0);
    struct sched_seq *hi = add(&r, 6, 3, 2, 0);
    step(&r, 0); /* both admitted: 2 blocks each */
    assert_int_equal(r.plan.n_items, 2);
    for (int i = 0; i < 4; i++)
        step(&r, 0);
    /* a third block for either: the low-priority one goes, though older */
    assert_int_equal(sched_seq_state(hi), SCHED_RUNNING);
    assert_int_equal(sched_seq_state(lo), SCHED_WAITING);
    rig_close(&r);
}

/* A waiting request of higher priority takes the room of running lower-
 * priority ones, for blocks and for max_seqs; equal priorities wait. */
static void test_waiting_priority_preempts_running(void **state)
{
    (void)state;
    struct rig r;
    /* 4 blocks of 16 tokens; two low sequences of 20 tokens fill the pool
     * (and decode within their second block) */
    rig_open(&r, 4, 16, 8, 64, 0);
    struct sched_seq *lo1 = add(&r, 20, 0, 1, 0);
    struct sched_seq *lo2 = add(&r, 20, 0, 2, 0);
    step(&r, 0);
    assert_int_equal(r.plan.n_items, 2);
    struct sched_seq *eq = add(&r, 20, 0, 3, 0);
    step(&r, 0);
    assert_int_equal(sched_seq_state(eq), SCHED_WAITING); /* equal: waits */
    assert_int_equal(r.plan.n_preempted, 0);
    struct sched_seq *hi = add(&r, 20, 5, 4, 0);
    step(&r, 0);
    /* hi needs 2 blocks: the newest low one (lo2) gives them up */
    assert_int_equal(sched_seq_state(hi), SCHED_RUNNING);
    assert_non_null(item_of(&r, hi));
    assert_int_equal(item_of(&r, hi)->n_new, 20);
    assert_int_equal(sched_seq_state(lo2), SCHED_WAITING);
    assert_int_equal(sched_seq_state(lo1), SCHED_RUNNING);
    assert_null(item_of(&r, lo2));
    assert_int_equal(r.plan.n_preempted, 1);
    rig_close(&r);

    /* max_seqs: one slot, held by a low one; a high one takes it */
    rig_open(&r, 64, 4, 1, 64, 0);
    struct sched_seq *a = add(&r, 5, -1, 5, 0);
    step(&r, 0);
    struct sched_seq *b = add(&r, 5, 1, 6, 0);
    step(&r, 0);
    assert_int_equal(sched_seq_state(b), SCHED_RUNNING);
    assert_int_equal(sched_seq_state(a), SCHED_WAITING);
    sched_remove(r.s, b);
    step(&r, 0); /* a comes back, its prompt block from the cache */
    assert_int_equal(sched_seq_state(a), SCHED_RUNNING);
    assert_true(item_of(&r, a)->n_past > 0);
    rig_close(&r);
}

static void test_deadline_and_remove(void **state)
{
    (void)state;
    struct rig r;
    rig_open(&r, 16, 4, 4, 64, 0);
    struct sched_seq *a = add(&r, 9, 0, 1, 10.0);
    struct sched_seq *b = add(&r, 9, 0, 2, 0);
    step(&r, 1.0);
    assert_int_equal(r.plan.n_items, 2);
    int free0 = kv_free_blocks(r.kv);
    struct rl_err err = {0};
    assert_int_equal(sched_schedule(r.s, 11.0, &r.plan, &err), 0);
    assert_int_equal(r.plan.n_expired, 1);
    assert_ptr_equal(r.plan.expired[0], a);
    assert_int_equal(sched_seq_state(a), SCHED_EXPIRED);
    assert_int_equal(r.plan.n_items, 1);
    assert_ptr_equal(r.plan.items[0].seq, b);
    assert_int_equal(sched_commit(r.s, &err), 0);
    assert_true(kv_free_blocks(r.kv) >= free0); /* a's blocks came back */
    sched_remove(r.s, a);
    struct kv_stats st;
    kv_get_stats(r.kv, &st);
    int used = st.n_used;
    sched_remove(r.s, b); /* at once */
    kv_get_stats(r.kv, &st);
    assert_true(st.n_used < used);
    assert_int_equal(st.n_used, 0);
    rig_close(&r);
}

static void test_can_admit(void **state)
{
    (void)state;
    struct rig r;
    rig_open(&r, 20, 4, 8, 64, 0);
    /* 7 tokens + 1 of growth = 2 blocks each: 10 fit the pool, 8 slots */
    assert_int_equal(sched_can_admit(r.s, 7), 8);
    assert_int_equal(sched_can_admit(r.s, 30), 2); /* 8 blocks each */
    add(&r, 15, 0, 1, 0); /* waiting: 4 blocks spoken for */
    assert_int_equal(sched_can_admit(r.s, 7), 7);
    assert_int_equal(sched_can_admit(r.s, 30), 2);
    step(&r, 0);
    assert_int_equal(sched_can_admit(r.s, 30), 2);
    assert_int_equal(sched_can_admit(r.s, 100), 0);
    rig_close(&r);
}

static void test_add_errors(void **state)
{
    (void)state;
    struct rig r;
    rig_open(&r, 4, 4, 4, 64, 0);
    struct sched_seq *q;
    struct rl_err err = {0};
    int32_t ids[20] = {0};
    assert_int_equal(sched_add(r.s, ids, 0, 0, 0, NULL, &q, &err), -RL_EINVAL);
    assert_int_equal(sched_add(r.s, ids, 16, 0, 0, NULL, &q, &err), -RL_EINVAL); /* 17 > 16 */
    ids[3] = -1;
    assert_int_equal(sched_add(r.s, ids, 4, 0, 0, NULL, &q, &err), -RL_EINVAL);
    struct sched_stats st;
    sched_get_stats(r.s, &st);
    assert_int_equal(st.n_waiting, 0);
    rig_close(&r);
}

/* A failed forward: abort puts the planned sequences back, nothing leaks,
 * and the next step plans the same tokens again. */
static void test_abort(void **state)
{
    (void)state;
    struct rig r;
    rig_open(&r, 16, 4, 4, 64, 0);
    struct sched_seq *a = add(&r, 9, 0, 1, 0);
    struct rl_err err = {0};
    assert_int_equal(sched_schedule(r.s, 0, &r.plan, &err), 0);
    assert_int_equal(r.plan.n_items, 1);
    sched_abort(r.s);
    assert_int_equal(sched_seq_state(a), SCHED_WAITING);
    assert_int_equal(sched_seq_n_preemptions(a), 0);
    assert_int_equal(kv_check(r.kv, &err), 0);
    step(&r, 0);
    assert_int_equal(item_of(&r, a)->n_new, 9);
    rig_close(&r);
}

/* Drafts: a decode grows by its draft within what budget is left, only
 * with free blocks (never preempting: a full pool shortens the draft);
 * commit keeps drafts uncommitted; resolving keeps the accepted ones'
 * KV and frees the blocks only rejected drafts used; a draft left
 * unresolved is rolled back by the next schedule; a push drops a draft. */
static void test_drafts(void **state)
{
    (void)state;
    struct rig r;
    struct rl_err err = {0};
    rig_open(&r, 4, 4, 4, 8, 0);
    struct sched_seq *a = add(&r, 3, 0, 1, 0), *b = add(&r, 3, 0, 2, 0);
    step(&r, 0); /* both prefill 3 and push a token: 4 known, 3 computed */
    int32_t d[6] = {11, 12, 13, 14, 15, 16};
    assert_int_equal(sched_seq_set_draft(a, d, 6, &err), 0);
    assert_int_equal(sched_schedule(r.s, 0, &r.plan, &err), 0);
    /* budget 8: two decodes, then a's draft takes the 6 left (4 + 6
     * tokens: 3 blocks, a's own and the 2 free ones); b has none */
    const struct sched_item *ia = item_of(&r, a), *ib = item_of(&r, b);
    assert_int_equal(ia->n_draft, 6);
    assert_int_equal(ia->n_new, 7);
    assert_true(ia->want_logits);
    assert_int_equal(ia->tokens[1], 11);
    assert_int_equal(ib->n_draft, 0);
    assert_int_equal(r.plan.n_logits, 7 + 1);
    assert_int_equal(r.plan.n_tokens, 8);
    assert_int_equal(kv_free_blocks(r.kv), 0);
    assert_int_equal(sched_commit(r.s, &err), 0);
    assert_int_equal(sched_seq_n_computed(a), 4); /* the drafts are not */
    /* a accepts 11 and 12, then samples 20 */
    int32_t acc[3] = {11, 12, 20};
    assert_int_equal(sched_push_tokens(a, acc, 3, &err), 0);
    assert_int_equal(sched_seq_resolve_draft(a, 3, &err), -RL_EINTERNAL);
    assert_int_equal(sched_seq_resolve_draft(a, 7, &err), -RL_EINVAL);
    assert_int_equal(sched_seq_resolve_draft(a, 2, &err), 0);
    assert_int_equal(sched_seq_n_computed(a), 6);
    assert_int_equal(kv_free_blocks(r.kv), 1); /* a's third block went back */
    assert_int_equal(kv_check(r.kv, &err), 0);
    int32_t t = 7;
    assert_int_equal(sched_push_tokens(b, &t, 1, &err), 0);
    /* a draft the engine does not resolve is rolled back next schedule */
    assert_int_equal(sched_seq_set_draft(a, d, 1, &err), 0);
    assert_int_equal(sched_schedule(r.s, 0, &r.plan, &err), 0);
    assert_int_equal(item_of(&r, a)->n_draft, 1);
    assert_int_equal(sched_commit(r.s, &err), 0);
    assert_int_equal(sched_push_tokens(a, &t, 1, &err), 0);
    assert_int_equal(sched_push_tokens(b, &t, 1, &err), 0);
    assert_int_equal(sched_seq_set_draft(b, d, 3, &err), 0);
    assert_int_equal(sched_push_tokens(b, &t, 1, &err), 0); /* drops it */
    assert_int_equal(sched_schedule(r.s, 0, &r.plan, &err), 0);
    assert_int_equal(item_of(&r, b)->n_draft, 0);
    assert_int_equal(item_of(&r, b)->n_new, 2);
    assert_int_equal(sched_commit(r.s, &err), 0);
    assert_int_equal(sched_seq_n_computed(a), 8);
    assert_int_equal(kv_check(r.kv, &err), 0);
    /* negative ids are refused */
    int32_t bad = -1;
    assert_int_equal(sched_seq_set_draft(a, &bad, 1, &err), -RL_EINVAL);
    rig_close(&r);

    /* draft_rows 5: two decodes leave room for three draft tokens, shared
     * out a token at a time: two for a, one for b */
    struct rig c;
    assert_int_equal(kv_cache_create(&c.kv, 8, 4, &err), 0);
    struct sched_options o = {4, 16, 0, 5};
    assert_int_equal(sched_create(&c.s, c.kv, &o, &err), 0);
    a = add(&c, 3, 0, 1, 0);
    b = add(&c, 3, 0, 2, 0);
    step(&c, 0);
    assert_int_equal(sched_seq_set_draft(a, d, 4, &err), 0);
    assert_int_equal(sched_seq_set_draft(b, d, 4, &err), 0);
    assert_int_equal(sched_schedule(c.s, 0, &c.plan, &err), 0);
    assert_int_equal(item_of(&c, a)->n_draft, 2);
    assert_int_equal(item_of(&c, b)->n_draft, 1);
    assert_int_equal(c.plan.n_tokens, 5);
    assert_int_equal(c.plan.n_logits, 5);
    assert_int_equal(sched_commit(c.s, &err), 0);
    rig_close(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_priority_fifo_and_max_seqs),
        cmocka_unit_test(test_budget_decodes_first_and_chunks),
        cmocka_unit_test(test_preemption_and_resume),
        cmocka_unit_test(test_priority_preempts_lower),
        cmocka_unit_test(test_waiting_priority_preempts_running),
        cmocka_unit_test(test_deadline_and_remove),
        cmocka_unit_test(test_can_admit),
        cmocka_unit_test(test_add_errors),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_drafts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
