/* tests/unit/test_engine.c - the batching engine on the real tiny model
 * (tests/data/models/tiny-qwen3-a): greedy
 * output against reference.json, prefix-cache reuse, eviction, preemption
 * with identical output, stop strings split over tokens, the thinking
 * budget, cancellation, deadlines, batch invariance over random mixes of
 * 16 requests, and chunk sizes 1/7/64. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"
#include "engine.h"
#include "event.h"
#include "cpu/kernels.h"
#include "mkmodel.h"
#include "tokenizer.h"

static char model_dir[1024];  /* the model open_engine() opens */
static char f32_dir[1024];    /* the tiny reference model (F32) */
static char q8_dir[1100];     /* random-weight checkpoints in GGUF Q8_0 (the tiny */
static char emb_dir[1100];    /* the tiny model in Qwen3-Embedding's layout (bare */
static char emb_only_dir[1100]; /* names), and an untied one without lm_head */
static char q4km_dir[1100];   /* shape) and Q4_K_M (256-wide dims), made in setup */
static char bf16_dir[1100];   /* its BF16 copy, made in setup: on AVX-512 its
                                 KV cache is bf16 in the packed layouts, so
                                 the invariance tests also cover that path */
static char tmpdir[64];
static cJSON *reference;

/* ---- a run: requests in, complete outputs out ---- */

#define MAX_OUT 512

struct result {
    int32_t tokens[MAX_OUT];
    float logprobs[MAX_OUT];
    struct engine_logprob top[MAX_OUT][4];
    int n_tokens, n_top;
    char reasoning[8192], content[8192];
    size_t n_reasoning, n_content;
    int max_tokens_in_event;
    enum engine_finish finish;
    struct engine_usage usage;
    uint64_t id;
    int n_events;
    int refused;          /* engine_event.refused of an ERROR end */
    char error[256];
    float emb[256];       /* an embed request's vector (engine_event.embedding) */
    int n_emb;
    float scores[ENGINE_MAX_SCORE]; /* a score request's logits (engine_event.scores) */
    int n_scores;
    char stop[64];        /* engine_event.stop of the final event, "" for NULL */
    int n_stop_events;    /* events that carried a stop (only the final may) */
};

static int n_threads = 1; /* for open_engine; test_thread_counts changes it */
/* speculation for open_engine (the speculation tests set them) */
static enum spec_mode spec_mode_on;
static spec_draft_fn spec_source;
static void *spec_source_user;
static int spec_k;
static int spec_rows; /* engine_options.spec_max_rows */
static const char *engine_isa; /* for open_engine; NULL = auto */
static const char *engine_backend; /* for open_engine; NULL = cpu */

static struct engine *open_engine(int kv_blocks, int max_batch, int chunk)
{
    struct engine_options o;
    engine_options_default(&o);
    o.speculative = spec_mode_on;
    o.spec_draft = spec_source;
    o.spec_draft_user = spec_source_user;
    o.spec_tokens = spec_k;
    o.spec_max_rows = spec_rows;
    o.isa = engine_isa;
    if (engine_backend)
        o.backend = engine_backend;
    o.n_threads = n_threads;
    o.kv_blocks = kv_blocks;
    o.max_batch = max_batch;
    o.token_budget = 256;
    o.prefill_chunk = chunk;
    struct engine *e = NULL;
    struct rl_err err = {0};
    if (engine_create(&e, model_dir, &o, &err))
        fail_msg("engine_create: %s", err.msg);
    return e;
}

static void on_event(const struct engine_event *ev)
{
    struct result *r = ev->user;
    assert_non_null(r);
    assert_int_equal(ev->id, r->id);
    assert_int_equal(r->finish, ENGINE_FINISH_NONE); /* nothing after the end */
    if (ev->n_tokens > r->max_tokens_in_event)
        r->max_tokens_in_event = ev->n_tokens;
    for (int i = 0; i < ev->n_tokens; i++) {
        /* test_deadline runs to its deadline, not to a length: a fast
         * engine passes MAX_OUT there. Count every token, keep the first
         * MAX_OUT (the tests that compare tokens stop well before). */
        if (r->n_tokens >= MAX_OUT) {
            r->n_tokens++;
            continue;
        }
        r->tokens[r->n_tokens] = ev->tokens[i];
        r->logprobs[r->n_tokens] = ev->logprobs ? ev->logprobs[i] : 0;
        for (int j = 0; j < ev->n_top && j < 4; j++)
            r->top[r->n_tokens][j] = ev->top[(size_t)i * (size_t)ev->n_top + (size_t)j];
        r->n_tokens++;
    }
    r->n_top = ev->n_top;
    assert_true(r->n_reasoning + ev->n_reasoning < sizeof r->reasoning);
    memcpy(r->reasoning + r->n_reasoning, ev->reasoning, ev->n_reasoning);
    r->n_reasoning += ev->n_reasoning;
    assert_true(r->n_content + ev->n_content < sizeof r->content);
    memcpy(r->content + r->n_content, ev->content, ev->n_content);
    r->n_content += ev->n_content;
    r->usage = ev->usage;
    r->finish = ev->finish;
    if (ev->stop) {
        assert_int_equal(ev->finish, ENGINE_FINISH_STOP);
        snprintf(r->stop, sizeof r->stop, "%s", ev->stop);
        r->n_stop_events++;
    }
    if (ev->scores) {
        assert_int_not_equal(ev->finish, ENGINE_FINISH_NONE);
        memcpy(r->scores, ev->scores, (size_t)ev->n_scores * sizeof *r->scores);
        r->n_scores = ev->n_scores;
    }
    if (ev->embedding) {
        assert_int_not_equal(ev->finish, ENGINE_FINISH_NONE); /* on the final event only */
        assert_true(ev->n_embedding <= 256);
        memcpy(r->emb, ev->embedding, (size_t)ev->n_embedding * sizeof *r->emb);
        r->n_emb = ev->n_embedding;
    }
    if (ev->finish == ENGINE_FINISH_ERROR) {
        r->refused = ev->refused;
        snprintf(r->error, sizeof r->error, "%s", ev->error ? ev->error : "");
    }
    r->n_events++;
}

static void drain(struct engine *e)
{
    struct rl_err err = {0};
    for (int guard = 0; engine_n_active(e) > 0; guard++) {
        assert_true(guard < 100000);
        const struct engine_event *ev;
        int n;
        if (engine_step(e, &ev, &n, &err))
            fail_msg("engine_step: %s", err.msg);
        for (int i = 0; i < n; i++)
            on_event(&ev[i]);
    }
}

static void submit(struct engine *e, struct engine_request *q, struct result *r)
{
    struct rl_err err = {0};
    memset(r, 0, sizeof *r);
    q->user = r;
    if (engine_submit(e, q, &r->id, &err))
        fail_msg("engine_submit: %s", err.msg);
}

static void greedy_req(struct engine_request *q, const int32_t *ids, int n, int max_tokens)
{
    engine_request_init(q);
    q->prompt_ids = ids;
    q->n_prompt = n;
    q->temperature = 0;
    q->ignore_eos = true;
    q->max_tokens = max_tokens;
    q->n_logprobs = 0;
}

static void assert_same(const struct result *a, const struct result *b)
{
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_memory_equal(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof a->tokens[0]);
    /* bit-identical, not approximately equal */
    assert_memory_equal(a->logprobs, b->logprobs, (size_t)a->n_tokens * sizeof(float));
    assert_int_equal(a->n_top, b->n_top);
    for (int i = 0; i < a->n_tokens; i++)
        for (int j = 0; j < a->n_top && j < 4; j++) {
            assert_int_equal(a->top[i][j].id, b->top[i][j].id);
            assert_memory_equal(&a->top[i][j].logprob, &b->top[i][j].logprob, sizeof(float));
        }
    assert_int_equal(a->finish, b->finish);
}

static int ids_from_json(const cJSON *a, int32_t *out, int cap)
{
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a) {
        if (n < cap)
            out[n] = it->valueint;
        n++;
    }
    return n;
}

/* ---- tests ---- */

static void test_reference_greedy(void **state)
{
    (void)state;
    struct engine *e = open_engine(512, 16, 0);
    const cJSON *prompts = cJSON_GetObjectItem(reference, "prompts");
    int np = cJSON_GetArraySize(prompts);
    assert_true(np > 0 && np <= 8);
    static int32_t ids[8][512];
    static int32_t want[8][64];
    int n_ids[8], n_want[8];
    struct engine_request q[8];
    static struct result r[8];
    for (int i = 0; i < np; i++) {
        const cJSON *p = cJSON_GetArrayItem(prompts, i);
        n_ids[i] = ids_from_json(cJSON_GetObjectItem(p, "ids"), ids[i], 512);
        n_want[i] = ids_from_json(cJSON_GetObjectItem(p, "greedy"), want[i], 64);
        greedy_req(&q[i], ids[i], n_ids[i], 32);
        submit(e, &q[i], &r[i]);
    }
    drain(e);
    for (int i = 0; i < np; i++) {
        assert_int_equal(r[i].n_tokens, n_want[i]);
        assert_memory_equal(r[i].tokens, want[i], (size_t)n_want[i] * sizeof(int32_t));
        assert_int_equal(r[i].finish, ENGINE_FINISH_LENGTH);
        assert_int_equal(r[i].usage.prompt_tokens, n_ids[i]);
        assert_int_equal(r[i].usage.completion_tokens, 32);
    }
    engine_free(e);
}

static void make_prompt(int32_t *ids, int n, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        ids[i] = (int32_t)((seed >> 8) % 700) + 10;
    }
}

/* A second request with the same 40-token system prompt reuses its two
 * full blocks: 32 cached prompt tokens, and the same output as without. */
static void test_prefix_cache_reuse(void **state)
{
    (void)state;
    int32_t a[60], b[60];
    make_prompt(a, 40, 7);
    memcpy(b, a, 40 * sizeof *a);
    make_prompt(a + 40, 20, 100);
    make_prompt(b + 40, 20, 200);
    struct engine *e = open_engine(256, 8, 0);
    struct engine_request q;
    static struct result ra, rb, rb_cold;
    greedy_req(&q, a, 60, 16);
    submit(e, &q, &ra);
    drain(e);
    assert_int_equal(ra.usage.cached_prompt_tokens, 0);
    struct engine_stats st0, st1;
    engine_get_stats(e, &st0);
    greedy_req(&q, b, 60, 16);
    submit(e, &q, &rb);
    drain(e);
    engine_get_stats(e, &st1);
    assert_int_equal(rb.usage.cached_prompt_tokens, 32);
    assert_int_equal(st1.prefix_hit_tokens - st0.prefix_hit_tokens, 32);
    assert_int_equal(st1.prefix_hit_blocks - st0.prefix_hit_blocks, 2);
    engine_free(e);

    e = open_engine(256, 8, 0);
    submit(e, &q, &rb_cold);
    drain(e);
    assert_int_equal(rb_cold.usage.cached_prompt_tokens, 0);
    assert_same(&rb, &rb_cold);
    engine_free(e);
}

/* A pool too small to keep every prompt cached evicts LRU blocks; outputs
 * do not change, and a prompt run again after eviction is recomputed. */
static void test_eviction_under_pressure(void **state)
{
    (void)state;
    struct engine *e = open_engine(12, 4, 0); /* 192 token slots */
    static int32_t p[6][64];
    static struct result r[6], again;
    struct engine_request q;
    for (int i = 0; i < 6; i++) {
        make_prompt(p[i], 64, 1000 + (uint32_t)i);
        greedy_req(&q, p[i], 64, 8);
        submit(e, &q, &r[i]);
        drain(e);
    }
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_true(st.evictions > 0);
    assert_int_equal(st.kv_used, 0);
    greedy_req(&q, p[0], 64, 8);
    submit(e, &q, &again);
    drain(e);
    assert_int_equal(again.usage.cached_prompt_tokens, 0); /* evicted long ago */
    assert_same(&r[0], &again);
    engine_free(e);
}

static void sampled_req(struct engine_request *q, const int32_t *ids, int n, int max_tokens,
                        uint32_t k)
{
    engine_request_init(q);
    q->prompt_ids = ids;
    q->n_prompt = n;
    q->max_tokens = max_tokens;
    q->ignore_eos = true;
    q->n_logprobs = (int)(k % 4);
    q->has_seed = true;
    q->seed = 1234 + k;
    switch (k % 4) {
    case 0: q->temperature = 0; break;
    case 1: q->temperature = 0.8f; q->top_k = 40; q->top_p = 0.9f; break;
    case 2: q->temperature = 1.0f; q->min_p = 0.05f; q->repetition_penalty = 1.1f; break;
    default:
        q->temperature = 0.7f;
        q->presence_penalty = 0.5f;
        q->frequency_penalty = 0.3f;
        break;
    }
}

/* Four requests growing in a pool that cannot hold them all: the newest
 * are preempted and recomputed, and every output equals its solo run. */
static void test_preemption_identical(void **state)
{
    (void)state;
    static int32_t p[4][24];
    static struct result solo[4], mixed[4];
    struct engine_request q[4];
    for (int i = 0; i < 4; i++) {
        make_prompt(p[i], 20 + i, 50 + (uint32_t)i);
        sampled_req(&q[i], p[i], 20 + i, 60, (uint32_t)i);
        struct engine *e = open_engine(64, 4, 0);
        submit(e, &q[i], &solo[i]);
        drain(e);
        engine_free(e);
    }
    /* 4 x (24 + 60) tokens need 24 blocks at the end; 10 are there */
    struct engine *e = open_engine(10, 4, 0);
    for (int i = 0; i < 4; i++)
        submit(e, &q[i], &mixed[i]);
    drain(e);
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_true(st.n_preemptions > 0);
    for (int i = 0; i < 4; i++)
        assert_same(&solo[i], &mixed[i]);
    engine_free(e);
}

/* Resumption (engine_request.n_resumed): a request cut after k tokens and
 * submitted again as prompt + those k tokens continues token for token
 * (and logprob for logprob) as the uninterrupted run, for greedy, seeded
 * top-k/top-p, min-p with the repetition penalty, and the frequency and
 * presence penalties, at several cut points. Without n_resumed the
 * penalised and sampled tails differ: the test would catch its loss. */
static void test_resume_exact(void **state)
{
    (void)state;
    enum { N_OUT = 40 };
    static int32_t p[4][24 + N_OUT];
    static struct result whole[4], tail, plain;
    struct engine_request q;
    struct engine *e = open_engine(64, 4, 0);
    int n_differs = 0;
    for (int i = 0; i < 4; i++) {
        make_prompt(p[i], 20, 70 + (uint32_t)i);
        sampled_req(&q, p[i], 20, N_OUT, (uint32_t)i);
        submit(e, &q, &whole[i]);
        drain(e);
        assert_int_equal(whole[i].n_tokens, N_OUT);
        static const int cuts[] = {1, 7, 23, N_OUT - 1};
        for (int c = 0; c < 4; c++) {
            int k = cuts[c];
            memcpy(p[i] + 20, whole[i].tokens, (size_t)k * sizeof(int32_t));
            sampled_req(&q, p[i], 20 + k, N_OUT - k, (uint32_t)i);
            q.n_resumed = k;
            submit(e, &q, &tail);
            drain(e);
            assert_int_equal(tail.n_tokens, N_OUT - k);
            assert_memory_equal(tail.tokens, whole[i].tokens + k,
                                (size_t)(N_OUT - k) * sizeof(int32_t));
            assert_memory_equal(tail.logprobs, whole[i].logprobs + k,
                                (size_t)(N_OUT - k) * sizeof(float));
            q.n_resumed = 0; /* the old way: earlier output as plain prompt */
            submit(e, &q, &plain);
            drain(e);
            n_differs += memcmp(plain.tokens, whole[i].tokens + k,
                                (size_t)(N_OUT - k) * sizeof(int32_t)) != 0;
        }
    }
    assert_true(n_differs > 0);
    /* n_resumed must leave at least one real prompt token */
    struct rl_err err = {0};
    sampled_req(&q, p[0], 20, 8, 1);
    q.n_resumed = 20;
    uint64_t id;
    assert_int_equal(engine_submit(e, &q, &id, &err), -EV_CODE_BAD_VALUE);
    assert_int_equal(err.code, EV_CODE_BAD_VALUE);
    assert_non_null(strstr(err.msg, "n_resumed"));
    engine_free(e);
}

/* A stop string that spans two tokens of what the model says anyway ends
 * the output just before it, and is not emitted. */
static void test_stop_string_split(void **state)
{
    (void)state;
    struct engine *e = open_engine(256, 4, 0);
    const struct tokenizer *tok = engine_get_tokenizer(e);
    assert_non_null(tok);
    const cJSON *prompts = cJSON_GetObjectItem(reference, "prompts");
    int32_t ids[512];
    int n = ids_from_json(cJSON_GetObjectItem(cJSON_GetArrayItem(prompts, 4), "ids"), ids, 512);
    struct engine_request q;
    static struct result base, cut;
    greedy_req(&q, ids, n, 48);
    submit(e, &q, &base);
    drain(e);
    assert_true(base.n_content > 8);
    assert_string_equal(base.stop, ""); /* no stop strings: none matched */
    /* find a token boundary, past the first few bytes, with printable text
     * on both sides and where the stop string occurs for the first time */
    char stop[16] = "";
    size_t pos = 0, want = 0;
    for (int i = 0; i + 1 < base.n_tokens && !stop[0]; i++) {
        size_t la, lb;
        const char *ta = tok_token_bytes(tok, base.tokens[i], &la);
        const char *tb = tok_token_bytes(tok, base.tokens[i + 1], &lb);
        if (!ta || tok_is_special(tok, base.tokens[i]))
            continue;
        pos += la;
        if (!tb || tok_is_special(tok, base.tokens[i + 1]) || la < 2 || lb < 1 || pos < 10 ||
            pos + 1 > base.n_content)
            continue;
        int ok = 1;
        for (size_t k = la - 2; k < la; k++)
            ok &= ta[k] >= 0x21 && ta[k] < 0x7f;
        ok &= tb[0] >= 0x21 && tb[0] < 0x7f;
        char cand[4] = {ta[la - 2], ta[la - 1], tb[0], 0};
        char *hit = memmem(base.content, base.n_content, cand, 3);
        if (ok && hit && (size_t)(hit - base.content) == pos - 2) {
            memcpy(stop, cand, 4);
            want = pos - 2;
        }
    }
    if (!stop[0])
        skip();
    const char *stops[] = {"never-said-this", stop};
    q.stop = stops;
    q.n_stop = 2;
    submit(e, &q, &cut);
    drain(e);
    assert_int_equal(cut.finish, ENGINE_FINISH_STOP);
    /* the final event names the string that matched, once */
    assert_string_equal(cut.stop, stop);
    assert_int_equal(cut.n_stop_events, 1);
    assert_int_equal(cut.n_content, want);
    assert_memory_equal(cut.content, base.content, want);
    assert_true(cut.n_tokens <= base.n_tokens);
    assert_memory_equal(cut.tokens, base.tokens, (size_t)cut.n_tokens * sizeof(int32_t));
    engine_free(e);
}

/* Inside <think> with a budget of 5: the engine forces Qwen3's early-stop
 * phrase right after the 5th reasoning token; the answer follows. */
static void test_thinking_budget(void **state)
{
    (void)state;
    struct engine *e = open_engine(256, 4, 0);
    const struct tokenizer *tok = engine_get_tokenizer(e);
    int32_t think = tok_find(tok, "<think>", 7), end = tok_find(tok, "</think>", 8);
    assert_true(think > 0 && end > 0);
    int32_t ids[12];
    make_prompt(ids, 11, 99);
    ids[11] = think;
    struct engine_request q;
    static struct result r;
    greedy_req(&q, ids, 12, 120);
    q.max_thinking_tokens = 5;
    submit(e, &q, &r);
    drain(e);
    struct tok_ids force = {0};
    struct rl_err err = {0};
    const char *txt = ENGINE_THINK_STOP_TEXT;
    assert_int_equal(tok_encode(tok, txt, strlen(txt), TOK_ENCODE_NO_SPECIAL, &force, &err), 0);
    int close_at = -1;
    for (int i = 0; i < r.n_tokens && close_at < 0; i++)
        if (r.tokens[i] == end)
            close_at = i;
    /* the model did not close on its own within the budget */
    assert_true(close_at >= 5);
    assert_true(r.n_tokens >= 5 + (int)force.n);
    assert_memory_equal(r.tokens + 5, force.ids, force.n * sizeof(int32_t));
    int n_reason = 0;
    for (size_t i = 0; i < force.n; i++)
        if (force.ids[i] == end)
            n_reason = 5 + (int)i + 1;
    assert_int_equal(r.usage.reasoning_tokens, n_reason);
    assert_int_equal(r.usage.completion_tokens, r.n_tokens);
    const char *phrase = "Considering the limited time by the user";
    assert_non_null(memmem(r.reasoning, r.n_reasoning, phrase, strlen(phrase)));
    assert_null(memmem(r.content, r.n_content, "Considering", 11));
    assert_true(r.n_content > 0);
    tok_ids_free(&force);
    engine_free(e);
}

/* Stop strings see the think tags as text (tags are never output): a stop
 * string spanning </think> ends the request there, "</think>" alone ends
 * it with its reasoning, and one that never matches leaves both channels
 * exactly as without it. The thinking budget forces known text around the
 * tag: "... directly now.\n</think>\n\n". */
static void test_stop_string_spans_think_tag(void **state)
{
    (void)state;
    struct engine *e = open_engine(256, 4, 0);
    const struct tokenizer *tok = engine_get_tokenizer(e);
    int32_t think = tok_find(tok, "<think>", 7);
    int32_t ids[12];
    make_prompt(ids, 11, 99);
    ids[11] = think;
    struct engine_request q;
    static struct result base, r;
    greedy_req(&q, ids, 12, 60);
    q.max_thinking_tokens = 5;
    submit(e, &q, &base);
    drain(e);
    const char *tail = "directly now.\n";
    char *at = memmem(base.reasoning, base.n_reasoning, tail, strlen(tail));
    assert_non_null(at);
    size_t cut = (size_t)(at - base.reasoning) + strlen("directly ");
    assert_true(base.n_content > 0);

    const char *cases[][2] = {
        /* stop strings          reasoning kept up to */
        {"now.\n</think>\n", "cut"},
        {"</think>", "all"},
        {"never-said-this", "same"},
        {"\n</think>\n\n", "before-newline"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *stops[] = {cases[c][0]};
        q.stop = stops;
        q.n_stop = 1;
        submit(e, &q, &r);
        drain(e);
        if (!strcmp(cases[c][1], "same")) {
            assert_int_equal(r.n_reasoning, base.n_reasoning);
            assert_memory_equal(r.reasoning, base.reasoning, base.n_reasoning);
            assert_int_equal(r.n_content, base.n_content);
            assert_memory_equal(r.content, base.content, base.n_content);
            continue;
        }
        size_t want = !strcmp(cases[c][1], "cut") ? cut
                    : !strcmp(cases[c][1], "all") ? (size_t)(at - base.reasoning) + strlen(tail)
                    : (size_t)(at - base.reasoning) + strlen(tail) - 1;
        assert_int_equal(r.finish, ENGINE_FINISH_STOP);
        assert_int_equal(r.n_reasoning, want);
        assert_memory_equal(r.reasoning, base.reasoning, want);
        assert_int_equal(r.n_content, 0);
    }
    engine_free(e);
}

/* Cancelling frees the request's blocks before engine_cancel returns. */
static void test_cancel_frees_blocks(void **state)
{
    (void)state;
    struct engine *e = open_engine(64, 4, 0);
    int32_t a[40], b[40];
    make_prompt(a, 40, 1);
    make_prompt(b, 40, 2);
    struct engine_request q;
    static struct result ra, rb;
    greedy_req(&q, a, 40, 200);
    submit(e, &q, &ra);
    greedy_req(&q, b, 40, 200);
    submit(e, &q, &rb);
    struct rl_err err = {0};
    for (int i = 0; i < 4; i++) {
        const struct engine_event *ev;
        int n;
        assert_int_equal(engine_step(e, &ev, &n, &err), 0);
        for (int k = 0; k < n; k++)
            on_event(&ev[k]);
    }
    struct engine_stats st0, st1;
    engine_get_stats(e, &st0);
    assert_int_equal(st0.n_running, 2);
    assert_int_equal(engine_cancel(e, ra.id, &err), 0);
    engine_get_stats(e, &st1);
    assert_int_equal(st1.n_running, 1);
    assert_true(st1.kv_used < st0.kv_used);
    assert_int_equal(st1.kv_used, st0.kv_used - 3); /* 40 + 4 tokens: 3 blocks */
    assert_int_equal(engine_cancel(e, ra.id, &err), -RL_ENOTFOUND);
    assert_int_equal(engine_cancel(e, rb.id, &err), 0);
    drain(e);
    assert_int_equal(ra.finish, ENGINE_FINISH_CANCELLED);
    assert_int_equal(rb.finish, ENGINE_FINISH_CANCELLED);
    assert_int_equal(ra.n_tokens, 4);
    engine_get_stats(e, &st1);
    assert_int_equal(st1.kv_used, 0);
    engine_free(e);
}

static void test_deadline(void **state)
{
    (void)state;
    struct engine *e = open_engine(256, 4, 0);
    int32_t a[16];
    make_prompt(a, 16, 3);
    struct engine_request q;
    static struct result past, soon;
    greedy_req(&q, a, 16, 0); /* no max_tokens: up to the context */
    q.deadline = engine_now() - 1;
    submit(e, &q, &past);
    q.deadline = engine_now() + 0.05;
    submit(e, &q, &soon);
    drain(e);
    assert_int_equal(past.finish, ENGINE_FINISH_DEADLINE);
    assert_int_equal(past.n_tokens, 0);
    assert_int_equal(soon.finish, ENGINE_FINISH_DEADLINE);
    assert_true(soon.n_tokens > 0);
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.kv_used, 0);
    engine_free(e);
}

/* ---- batch invariance ---- */

#define N_MIX 16

static int32_t mix_ids[N_MIX][96];
static int mix_n[N_MIX];
static struct engine_request mix_q[N_MIX];
static struct result mix_solo[N_MIX];

static void mix_setup(void)
{
    int32_t sys[48];
    make_prompt(sys, 48, 4242);
    for (int i = 0; i < N_MIX; i++) {
        int n = 5 + (i * 37) % 80;
        if (i % 3 == 0 && n > 50) { /* some share a system prompt */
            memcpy(mix_ids[i], sys, 48 * sizeof(int32_t));
            make_prompt(mix_ids[i] + 48, n - 48, 300 + (uint32_t)i);
        } else {
            make_prompt(mix_ids[i], n, 300 + (uint32_t)i);
        }
        mix_n[i] = n;
        sampled_req(&mix_q[i], mix_ids[i], n, 12 + i % 5 * 6, (uint32_t)i);
        mix_q[i].priority = i % 3 - 1;
    }
}

/* Runs the requests q[0..N_MIX) on e into got: a random subset at once,
 * the rest arriving while it runs, in random order drawn from *rng. */
static void run_mix(struct engine *e, struct engine_request *q, struct result *got,
                    uint32_t *rng)
{
    int order[N_MIX];
    for (int i = 0; i < N_MIX; i++)
        order[i] = i;
    for (int i = N_MIX - 1; i > 0; i--) {
        *rng = *rng * 1664525u + 1013904223u;
        int j = (int)((*rng >> 8) % (uint32_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    struct rl_err err = {0};
    *rng = *rng * 1664525u + 1013904223u;
    int next = 0, first = 4 + (int)((*rng >> 8) % 12);
    for (; next < first; next++)
        submit(e, &q[order[next]], &got[order[next]]);
    while (engine_n_active(e) > 0 || next < N_MIX) {
        if (next < N_MIX) {
            submit(e, &q[order[next]], &got[order[next]]);
            next++;
        }
        const struct engine_event *ev;
        int n;
        assert_int_equal(engine_step(e, &ev, &n, &err), 0);
        for (int k = 0; k < n; k++)
            on_event(&ev[k]);
    }
}

static void test_batch_invariance(void **state)
{
    (void)state;
    mix_setup();
    for (int i = 0; i < N_MIX; i++) {
        struct engine *e = open_engine(128, 16, 0);
        submit(e, &mix_q[i], &mix_solo[i]);
        drain(e);
        engine_free(e);
    }
    /* random mixes: a random subset submitted at once, the rest arriving
     * while it runs, in random order */
    uint32_t rng = 77;
    for (int round = 0; round < 3; round++) {
        static struct result got[N_MIX];
        struct engine *e = open_engine(round == 2 ? 40 : 256, 16, round == 1 ? 7 : 0);
        run_mix(e, mix_q, got, &rng);
        if (round == 2) {
            struct engine_stats st;
            engine_get_stats(e, &st);
            assert_true(st.n_preemptions > 0); /* the small pool preempted */
        }
        for (int i = 0; i < N_MIX; i++)
            assert_same(&mix_solo[i], &got[i]);
        engine_free(e);
    }
}

static void test_chunk_sizes(void **state)
{
    (void)state;
    mix_setup();
    static struct result ref[N_MIX], got[N_MIX];
    int chunks[] = {64, 1, 7};
    for (int c = 0; c < 3; c++) {
        struct engine *e = open_engine(256, 16, chunks[c]);
        for (int i = 0; i < N_MIX; i++)
            submit(e, &mix_q[i], c ? &got[i] : &ref[i]);
        drain(e);
        for (int i = 0; c && i < N_MIX; i++)
            assert_same(&ref[i], &got[i]);
        engine_free(e);
    }
}

/* The same outputs, bit for bit, on 2 and 3 threads as on one: the
 * products' rows are shared out differently (decode on packed BF16: each
 * thread's share of tiles, and what the others take from its end), and
 * 3 threads on this 2-core machine lose their cores now and then. */
static void test_thread_counts(void **state)
{
    (void)state;
    mix_setup();
    static struct result ref[N_MIX], got[N_MIX];
    for (int t = 1; t <= 3; t++) {
        n_threads = t;
        struct engine *e = open_engine(256, 16, 0);
        for (int i = 0; i < N_MIX; i++)
            submit(e, &mix_q[i], t > 1 ? &got[i] : &ref[i]);
        drain(e);
        for (int i = 0; t > 1 && i < N_MIX; i++)
            assert_same(&ref[i], &got[i]);
        engine_free(e);
    }
    n_threads = 1;
}

/* ---- speculative decoding ---- */

/* Bad speculation options fail engine_create with a message naming them. */
static void test_spec_options(void **state)
{
    (void)state;
    struct engine_options o;
    struct engine *e = NULL;
    struct rl_err err = {0};
    const struct { int tokens, rows, mode; const char *word; } bad[] = {
        {17, 0, SPEC_NGRAM, "spec_tokens"},
        {-1, 0, SPEC_NGRAM, "spec_tokens"},
        {4, -1, SPEC_NGRAM, "spec_max_rows"},
        {4, 0, 7, "speculative"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        engine_options_default(&o);
        o.speculative = (enum spec_mode)bad[i].mode;
        o.spec_tokens = bad[i].tokens;
        o.spec_max_rows = bad[i].rows;
        assert_int_equal(engine_create(&e, model_dir, &o, &err), -RL_EINVAL);
        assert_null(e);
        assert_non_null(strstr(err.msg, bad[i].word));
    }
}

/* A mix of 16 requests with everything that sees the token sequence:
 * greedy and seeded sampling with penalties (mix_setup), thinking budgets,
 * stop strings taken from what the plain run says, eos stops. */
static struct engine_request spec_q[N_MIX];
static int32_t spec_ids[N_MIX][100];
static char spec_stop[N_MIX][8];
static const char *spec_stops[N_MIX][1];
static struct result spec_plain[N_MIX];

/* The oracle: drafts are the plain run's next tokens, every m-th one
 * (counted along the output) corrupted when m > 0. */
struct oracle {
    struct result *got;        /* the run's results: the request's index */
    const struct result *ref;  /* the plain outputs */
    int m;
};

static int oracle_draft(void *src, void *req_user, const int32_t *tokens, int n_tokens,
                        int n_prompt, int32_t *out, int max_n)
{
    (void)tokens;
    struct oracle *o = src;
    const struct result *ref = &o->ref[(struct result *)req_user - o->got];
    int at = n_tokens - n_prompt, n = 0;
    for (; n < max_n && at + n < ref->n_tokens; n++) {
        out[n] = ref->tokens[at + n];
        if (o->m > 0 && (at + n) % o->m == o->m - 1)
            out[n] = out[n] == 11 ? 12 : 11;
    }
    return n;
}

static void spec_mix_setup(struct engine *plain_e)
{
    mix_setup();
    const struct tokenizer *tok = engine_get_tokenizer(plain_e);
    int32_t think = tok_find(tok, "<think>", 7);
    assert_true(think > 0);
    for (int i = 0; i < N_MIX; i++) {
        spec_q[i] = mix_q[i];
        memcpy(spec_ids[i], mix_ids[i], (size_t)mix_n[i] * sizeof(int32_t));
        spec_q[i].prompt_ids = spec_ids[i];
        spec_q[i].max_tokens += 20;
        if (i % 4 == 1) { /* inside <think> with a budget */
            spec_ids[i][mix_n[i]] = think;
            spec_q[i].n_prompt = mix_n[i] + 1;
            spec_q[i].max_thinking_tokens = 2 + i % 5;
        }
        if (i % 5 == 3)
            spec_q[i].ignore_eos = false;
    }
    /* stop strings: three printable bytes from the middle of what the
     * plain run says (the first time they occur) */
    for (int i = 0; i < N_MIX; i++)
        submit(plain_e, &spec_q[i], &spec_plain[i]);
    drain(plain_e);
    for (int i = 2; i < N_MIX; i += 5) {
        const struct result *r = &spec_plain[i];
        for (size_t at = r->n_content / 3; at + 3 < r->n_content; at++) {
            const char *c = r->content + at;
            if (c[0] < 0x21 || c[0] > 0x7e || c[1] < 0x21 || c[1] > 0x7e || c[2] < 0x21 ||
                c[2] > 0x7e)
                continue;
            memcpy(spec_stop[i], c, 3);
            spec_stop[i][3] = 0;
            if (memmem(r->content, r->n_content, spec_stop[i], 3) == c)
                break;
            spec_stop[i][0] = 0;
        }
        if (spec_stop[i][0]) {
            spec_stops[i][0] = spec_stop[i];
            spec_q[i].stop = spec_stops[i];
            spec_q[i].n_stop = 1;
        }
    }
}

/* With speculation on, every request's tokens, logprobs, top
 * alternatives, text and finish are those of plain decoding: drafts that
 * are always right, right but every 2nd or 3rd token wrong, from prompt
 * lookup; in a roomy pool, with 7-token prefill chunks, and in a pool so
 * small that requests are preempted with drafts in flight. */
static void spec_identical_on(const char *isa)
{
    engine_isa = isa;
    spec_mode_on = SPEC_OFF;
    struct engine *pe = open_engine(256, 16, 0);
    spec_mix_setup(pe);
    struct engine_stats pst;
    engine_get_stats(pe, &pst);
    engine_free(pe);
    int n_stop = 0, n_think = 0;
    for (int i = 0; i < N_MIX; i++) {
        n_stop += spec_q[i].n_stop;
        n_think += spec_q[i].max_thinking_tokens >= 0;
    }
    assert_true(n_stop >= 2);
    assert_true(n_think >= 3);
    /* the reference: plain decoding of the final mix (stops included) */
    pe = open_engine(256, 16, 0);
    for (int i = 0; i < N_MIX; i++)
        submit(pe, &spec_q[i], &spec_plain[i]);
    drain(pe);
    int plain_events = 0, n_stopped = 0;
    for (int i = 0; i < N_MIX; i++) {
        plain_events += spec_plain[i].n_events;
        n_stopped += spec_plain[i].finish == ENGINE_FINISH_STOP;
        assert_int_equal(spec_plain[i].usage.spec_drafted, 0);
    }
    assert_true(n_stopped >= 2);
    engine_free(pe);

    static struct result got[N_MIX];
    struct oracle orc = {got, spec_plain, 0};
    /* rows 0: the CPU's default cap on a step's tokens with drafts (8) */
    const struct { int source; int m; int kv_blocks, chunk, rows; } runs[] = {
        {1, 0, 256, 0, 256}, {1, 2, 256, 7, 256}, {1, 3, 40, 0, 256}, {1, 0, 36, 5, 256},
        {1, 0, 256, 0, 0}, {0, 0, 256, 0, 256}, {0, 0, 40, 7, 256},
    };
    for (size_t c = 0; c < sizeof runs / sizeof runs[0]; c++) {
        spec_mode_on = SPEC_NGRAM;
        spec_source = runs[c].source ? oracle_draft : NULL;
        spec_source_user = &orc;
        orc.m = runs[c].m;
        spec_rows = runs[c].rows;
        struct engine *e = open_engine(runs[c].kv_blocks, 16, runs[c].chunk);
        uint32_t rng = 91 + (uint32_t)c;
        run_mix(e, spec_q, got, &rng);
        struct engine_stats st;
        engine_get_stats(e, &st);
        int events = 0, drafted = 0, accepted = 0;
        for (int i = 0; i < N_MIX; i++) {
            assert_same(&spec_plain[i], &got[i]);
            assert_int_equal(got[i].usage.completion_tokens, spec_plain[i].usage.completion_tokens);
            assert_int_equal(got[i].usage.reasoning_tokens, spec_plain[i].usage.reasoning_tokens);
            assert_int_equal(got[i].n_content, spec_plain[i].n_content);
            assert_memory_equal(got[i].content, spec_plain[i].content, got[i].n_content);
            assert_int_equal(got[i].n_reasoning, spec_plain[i].n_reasoning);
            assert_memory_equal(got[i].reasoning, spec_plain[i].reasoning, got[i].n_reasoning);
            events += got[i].n_events;
            drafted += got[i].usage.spec_drafted;
            accepted += got[i].usage.spec_accepted;
            assert_true(got[i].usage.spec_accepted <= got[i].usage.spec_drafted);
        }
        assert_int_equal(st.spec_drafted, drafted);
        assert_int_equal(st.spec_accepted, accepted);
        if (runs[c].kv_blocks < 64)
            assert_true(st.n_preemptions > 0);
        if (runs[c].source) {
            assert_true(drafted > 0);
            assert_true(accepted > 0);
            /* several tokens per event: fewer events than plain decoding */
            assert_true(events < plain_events);
            if (runs[c].m == 0 && runs[c].kv_blocks >= 64)
                assert_true(accepted * 10 >= drafted * 8);
        }
        engine_free(e);
    }
    spec_mode_on = SPEC_OFF;
    spec_source = NULL;
    spec_rows = 0;
    engine_isa = NULL;
}

/* Issue 25: the engine on a backend that hands back candidate sets instead
 * of rows (engine/rowsets.h: CUDA's way, on the CPU, rows not sent are
 * NaN): the batch-invariance mix (greedy, top_k/top_p, min_p with a
 * repetition penalty, presence/frequency penalties, logprobs on some) and
 * the speculation mix (drafts, stops, thinking budgets) give exactly the
 * plain engine's outputs, with rows served from sets and some fetched. */
static void test_reduced_rows(void **state)
{
    (void)state;
    mix_setup();
    static struct result plain[N_MIX], got[N_MIX];
    static struct engine_request q[N_MIX];
    for (int i = 0; i < N_MIX; i++) { /* logprobs (whole rows) on a quarter only */
        q[i] = mix_q[i];
        if (i % 4 != 1)
            q[i].n_logprobs = -1;
        if (i % 8 == 3) /* a floor under most of the row: the set cannot tell, the row comes over */
            q[i].min_p = 0.001f;
        if (i % 8 == 7) /* penalties pushing the set's members below its last one */
            q[i].top_k = 64;
    }
    for (int round = 0; round < 2; round++) {
        engine_backend = round ? "cpu-rowsets" : NULL;
        struct engine *e = open_engine(256, 16, 0);
        uint32_t rng = 5;
        run_mix(e, q, round ? got : plain, &rng);
        if (round) {
            struct engine_stats st;
            engine_get_stats(e, &st);
            printf("  reduced rows: %lld rows from sets, %lld fetched whole\n", (long long)st.rows_from_sets,
                   (long long)st.rows_fetched);
            assert_true(st.rows_from_sets > 0);
            assert_true(st.rows_fetched > 0);
        }
        engine_free(e);
    }
    for (int i = 0; i < N_MIX; i++)
        assert_same(&plain[i], &got[i]);
    /* drafts verified from sets: the speculation mix on the wrapper */
    engine_backend = "cpu-rowsets";
    spec_identical_on(NULL);
    engine_backend = NULL;
}

/* ... on every kernel path this CPU has */
static void test_spec_identical(void **state)
{
    (void)state;
    const char *isas[] = {"avx512bf16", "avx2", "scalar"};
    for (int i = 0; i < 3; i++) {
        if (cpu_isa_parse(isas[i]) > (int)cpu_isa_detect()) {
            printf("  (skipping %s: this CPU lacks it)\n", isas[i]);
            continue;
        }
        spec_identical_on(isas[i]);
    }
}

/* Prompt lookup on a prompt that repeats itself drafts tokens, and a
 * request with no_speculative drafts none; outputs equal plain decoding. */
static void test_spec_ngram_repeat(void **state)
{
    (void)state;
    int32_t ids[90];
    make_prompt(ids, 30, 5);
    memcpy(ids + 30, ids, 30 * sizeof(int32_t));
    memcpy(ids + 60, ids, 30 * sizeof(int32_t));
    struct engine_request q;
    static struct result plain, on, off;
    greedy_req(&q, ids, 75, 40);
    spec_mode_on = SPEC_OFF;
    struct engine *e = open_engine(256, 4, 0);
    submit(e, &q, &plain);
    drain(e);
    engine_free(e);
    spec_mode_on = SPEC_NGRAM;
    spec_k = 3;
    e = open_engine(256, 4, 0);
    submit(e, &q, &on);
    q.no_speculative = true;
    submit(e, &q, &off);
    drain(e);
    engine_free(e);
    spec_mode_on = SPEC_OFF;
    spec_k = 0;
    assert_same(&plain, &on);
    assert_same(&plain, &off);
    assert_true(on.usage.spec_drafted > 0);
    assert_int_equal(off.usage.spec_drafted, 0);
    assert_int_equal(off.usage.spec_accepted, 0);
}

/* The invariance tests again on the BF16 copy. */
static void on_bf16(void (*test)(void **), void **state)
{
    strcpy(model_dir, bf16_dir);
    test(state);
    strcpy(model_dir, f32_dir);
}

/* ... and on quantized weights (engine/cpu/qgemm.h: per-row activation
 * quantization, one integer-then-f32 recipe per output). */
static void on_dir(const char *dir, void (*test)(void **), void **state)
{
    strcpy(model_dir, dir);
    test(state);
    strcpy(model_dir, f32_dir);
}

static void test_batch_invariance_quant(void **state)
{
    on_dir(q8_dir, test_batch_invariance, state);
    on_dir(q4km_dir, test_batch_invariance, state);
}
static void test_chunk_sizes_quant(void **state)
{
    on_dir(q8_dir, test_chunk_sizes, state);
    on_dir(q4km_dir, test_chunk_sizes, state);
}
static void test_preemption_identical_quant(void **state)
{
    on_dir(q8_dir, test_preemption_identical, state);
    on_dir(q4km_dir, test_preemption_identical, state);
}
static void test_spec_identical_quant(void **state)
{
    on_dir(q8_dir, test_spec_identical, state);
    on_dir(q4km_dir, test_spec_identical, state);
}
static void test_thread_counts_quant(void **state)
{
    on_dir(q8_dir, test_thread_counts, state);
    on_dir(q4km_dir, test_thread_counts, state);
}

static void test_batch_invariance_bf16(void **state) { on_bf16(test_batch_invariance, state); }
static void test_chunk_sizes_bf16(void **state) { on_bf16(test_chunk_sizes, state); }
static void test_preemption_identical_bf16(void **state) { on_bf16(test_preemption_identical, state); }
static void test_spec_identical_bf16(void **state) { on_bf16(test_spec_identical, state); }
static void test_thread_counts_bf16(void **state) { on_bf16(test_thread_counts, state); }

/* engine_check / engine_submit refusals: every one comes back as a
 * protocol code in err.code (and -code), never as text in the message;
 * the walk over schemas/errors.json below checks that each code the
 * engine gives is a row of that table, one name per value. */
static void embed_req(struct engine_request *q, const int32_t *ids, int n, int dims)
{
    engine_request_init(q);
    q->prompt_ids = ids;
    q->n_prompt = n;
    q->embed = true;
    q->embed_dims = dims;
}

static double norm_of(const float *v, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)v[i] * v[i];
    return sqrt(ss);
}

/* Embedding requests: one unit vector of the hidden size and no token;
 * bit for bit the same alone, beside generating requests, from a prefix
 * cache hit and in other prefill chunks; dimensions are the renormalised
 * prefix; the context check counts the prompt alone. */
static void test_embed(void **state)
{
    (void)state;
    int32_t a[40], b[40];
    make_prompt(a, 40, 11);
    memcpy(b, a, 20 * sizeof *a);
    make_prompt(b + 20, 20, 12);
    static struct result alone, alone_b, in_mix, cut, gen1, gen2, chunked;
    struct engine_request q;
    struct engine *e = open_engine(256, 8, 0);
    embed_req(&q, a, 40, 0);
    submit(e, &q, &alone);
    drain(e);
    assert_int_equal(alone.finish, ENGINE_FINISH_STOP);
    assert_int_equal(alone.n_tokens, 0);
    assert_int_equal(alone.n_content + alone.n_reasoning, 0);
    assert_int_equal(alone.n_emb, 128);
    assert_true(fabs(norm_of(alone.emb, 128) - 1.0) < 1e-5);
    assert_int_equal(alone.usage.prompt_tokens, 40);
    assert_int_equal(alone.usage.completion_tokens, 0);
    embed_req(&q, b, 40, 0);
    submit(e, &q, &alone_b);
    drain(e);
    assert_int_equal(alone_b.usage.cached_prompt_tokens, 16); /* a's first block */
    double dot = 0;
    for (int i = 0; i < 128; i++)
        dot += (double)alone.emb[i] * alone_b.emb[i];
    assert_true(dot < 0.9999); /* another text, another vector */

    /* beside two generating requests, a's whole prompt cached now */
    greedy_req(&q, b, 30, 12);
    submit(e, &q, &gen1);
    greedy_req(&q, a, 25, 12);
    submit(e, &q, &gen2);
    embed_req(&q, a, 40, 0);
    submit(e, &q, &in_mix);
    embed_req(&q, a, 40, 32);
    submit(e, &q, &cut);
    drain(e);
    assert_int_equal(gen1.n_tokens, 12);
    assert_int_equal(gen2.n_tokens, 12);
    assert_int_equal(in_mix.n_emb, 128);
    assert_true(in_mix.usage.cached_prompt_tokens > 0);
    assert_memory_equal(in_mix.emb, alone.emb, 128 * sizeof(float));
    assert_int_equal(cut.n_emb, 32);
    double n32 = norm_of(alone.emb, 32);
    for (int i = 0; i < 32; i++)
        assert_true(fabs(cut.emb[i] - alone.emb[i] / n32) < 1e-6);
    /* raw: the hidden state itself, the unit vector times its norm */
    static struct result raw, raw32;
    embed_req(&q, a, 40, 0);
    q.embed_raw = true;
    submit(e, &q, &raw);
    embed_req(&q, a, 40, 32);
    q.embed_raw = true;
    submit(e, &q, &raw32);
    drain(e);
    double nr = norm_of(raw.emb, 128);
    assert_true(fabs(nr - 1.0) > 1e-3); /* the final norm's output is not unit length */
    for (int i = 0; i < 128; i++)
        assert_true(fabs(raw.emb[i] / nr - alone.emb[i]) < 1e-5);
    assert_memory_equal(raw32.emb, raw.emb, 32 * sizeof(float)); /* cut, not rescaled */
    engine_free(e);

    e = open_engine(256, 8, 8); /* 8-token prefill chunks, a cold cache */
    embed_req(&q, a, 40, 0);
    submit(e, &q, &chunked);
    drain(e);
    assert_memory_equal(chunked.emb, alone.emb, 128 * sizeof(float));
    engine_free(e);

    /* the context check is the prompt's own: 63 tokens fit a 64-token
     * context whatever max_tokens says, 64 do not (room for one token, as
     * for every prompt) */
    e = open_engine(4, 4, 0);
    int32_t c[65];
    make_prompt(c, 65, 13);
    struct rl_err err = {0};
    uint64_t id;
    static struct result full;
    embed_req(&q, c, 63, 0);
    q.max_tokens = 100;
    submit(e, &q, &full);
    drain(e);
    assert_int_equal(full.finish, ENGINE_FINISH_STOP);
    assert_int_equal(full.n_emb, 128);
    embed_req(&q, c, 64, 0);
    assert_int_not_equal(engine_submit(e, &q, &id, &err), 0);
    assert_int_equal(err.code, EV_CODE_PROMPT_TOO_LONG);
    /* truncate: the first 62 tokens and the last, what ran is counted */
    static struct result cut64, kept;
    embed_req(&q, c, 65, 0);
    q.embed_truncate = true;
    submit(e, &q, &cut64);
    int32_t c2[63];
    memcpy(c2, c, 62 * sizeof *c);
    c2[62] = c[64];
    embed_req(&q, c2, 63, 0);
    submit(e, &q, &kept);
    drain(e);
    assert_int_equal(cut64.finish, ENGINE_FINISH_STOP);
    assert_int_equal(cut64.usage.prompt_tokens, 63);
    assert_memory_equal(cut64.emb, kept.emb, 128 * sizeof(float));
    embed_req(&q, c, 8, 129);
    assert_int_not_equal(engine_submit(e, &q, &id, &err), 0);
    assert_int_equal(err.code, EV_CODE_BAD_VALUE);
    embed_req(&q, c, 8, 0);
    q.constraint = ENGINE_CONSTRAINT_JSON_OBJECT;
    assert_int_not_equal(engine_submit(e, &q, &id, &err), 0);
    assert_int_equal(err.code, EV_CODE_BAD_PARAM);
    engine_free(e);
}

/* The same through the row-set backend: an embedding's row is wanted as
 * its argmax (no logits leave the device), its vector is still the
 * hidden state */
static void test_embed_rowsets(void **state)
{
    engine_backend = "cpu-rowsets";
    test_embed(state);
    engine_backend = NULL;
}

/* Checkpoints in Qwen3-Embedding's layout: bare names load as the same
 * model (the same vector, bit for bit, and the same tokens); an untied one
 * without lm_head.weight serves embeddings and refuses to generate. */
static void test_embedding_checkpoints(void **state)
{
    (void)state;
    int32_t a[30];
    make_prompt(a, 30, 21);
    static struct result want, got, gen_want, gen_got, only;
    struct engine_request q;
    struct engine *e = open_engine(64, 4, 0); /* the tiny model, as released */
    embed_req(&q, a, 30, 0);
    submit(e, &q, &want);
    greedy_req(&q, a, 30, 8);
    submit(e, &q, &gen_want);
    drain(e);
    engine_free(e);
    char keep[1024];
    strcpy(keep, model_dir);
    strcpy(model_dir, emb_dir);
    e = open_engine(64, 4, 0);
    embed_req(&q, a, 30, 0);
    submit(e, &q, &got);
    greedy_req(&q, a, 30, 8);
    submit(e, &q, &gen_got);
    drain(e);
    engine_free(e);
    assert_int_equal(got.n_emb, 128);
    assert_memory_equal(got.emb, want.emb, 128 * sizeof(float));
    assert_same(&gen_got, &gen_want); /* tied: it still generates */

    strcpy(model_dir, emb_only_dir);
    e = open_engine(64, 4, 0);
    struct rl_err err = {0};
    uint64_t id;
    greedy_req(&q, a, 30, 8);
    assert_int_not_equal(engine_submit(e, &q, &id, &err), 0);
    assert_int_equal(err.code, EV_CODE_BAD_PARAM);
    assert_non_null(strstr(err.msg, "embed"));
    embed_req(&q, a, 30, 0);
    submit(e, &q, &only);
    drain(e);
    assert_int_equal(only.finish, ENGINE_FINISH_STOP);
    assert_true(fabs(norm_of(only.emb, only.n_emb) - 1.0) < 1e-5);
    engine_free(e);
    strcpy(model_dir, keep);
}

/* Score requests: the raw logits of the ids asked for at the prompt's last
 * position, the independent reference's within 1e-3, for every reference
 * prompt at once beside a generating request; no token; refusals. */
static void test_score(void **state)
{
    (void)state;
    struct engine *e = open_engine(512, 16, 0);
    const cJSON *prompts = cJSON_GetObjectItem(reference, "prompts");
    int np = cJSON_GetArraySize(prompts);
    static int32_t ids[8][512];
    static struct result r[8], gen;
    const int32_t sid[4] = {0, 5, 100, 767};
    struct engine_request q;
    for (int i = 0; i < np; i++) {
        int n = ids_from_json(cJSON_GetObjectItem(cJSON_GetArrayItem(prompts, i), "ids"), ids[i], 512);
        engine_request_init(&q);
        q.prompt_ids = ids[i];
        q.n_prompt = n;
        q.score_ids = sid;
        q.n_score = 4;
        submit(e, &q, &r[i]);
        if (i == 1) {
            greedy_req(&q, ids[i], n, 6); /* a generating request beside them */
            submit(e, &q, &gen);
        }
    }
    drain(e);
    for (int i = 0; i < np; i++) {
        const cJSON *p = cJSON_GetArrayItem(prompts, i);
        const cJSON *pos = cJSON_GetObjectItem(p, "positions");
        int k = cJSON_GetArraySize(pos) - 1, n = r[i].usage.prompt_tokens;
        assert_int_equal(cJSON_GetArrayItem(pos, k)->valueint, n - 1);
        const cJSON *row = cJSON_GetArrayItem(cJSON_GetObjectItem(p, "logits"), k);
        assert_int_equal(r[i].finish, ENGINE_FINISH_STOP);
        assert_int_equal(r[i].n_tokens, 0);
        assert_int_equal(r[i].n_scores, 4);
        for (int j = 0; j < 4; j++)
            assert_true(fabs(r[i].scores[j] - cJSON_GetArrayItem(row, sid[j])->valuedouble) < 1e-3);
    }
    assert_int_equal(gen.n_tokens, 6);
    struct rl_err err = {0};
    uint64_t id;
    const int32_t bad_id[1] = {768};
    engine_request_init(&q);
    q.prompt_ids = ids[0];
    q.n_prompt = 1;
    q.score_ids = bad_id;
    q.n_score = 1;
    assert_int_not_equal(engine_submit(e, &q, &id, &err), 0);
    assert_int_equal(err.code, EV_CODE_INVALID_TOKEN);
    q.score_ids = sid;
    q.n_score = ENGINE_MAX_SCORE + 1;
    assert_int_not_equal(engine_submit(e, &q, &id, &err), 0);
    assert_int_equal(err.code, EV_CODE_BAD_PARAM);
    q.n_score = 2;
    q.embed = true;
    assert_int_not_equal(engine_submit(e, &q, &id, &err), 0);
    assert_int_equal(err.code, EV_CODE_BAD_PARAM);
    engine_free(e);
}

static void test_score_rowsets(void **state)
{
    engine_backend = "cpu-rowsets"; /* a score row is wanted whole */
    test_score(state);
    engine_backend = NULL;
}

static void test_submit_errors(void **state)
{
    (void)state;
    struct engine *e = open_engine(4, 4, 0); /* 64-token context */
    int32_t ids[80], bad_stop[1] = {99999};
    const char *empty_stop[1] = {""};
    make_prompt(ids, 80, 5);
    cJSON *not_messages = cJSON_CreateNumber(3);
    struct {
        int n_prompt, max_tokens;
        int mutate; /* what else is wrong with the request */
        enum ev_code code;
    } cases[] = {
        {80, 4, 0, EV_CODE_PROMPT_TOO_LONG},  /* the prompt alone is too long */
        {61, 4, 0, EV_CODE_PROMPT_TOO_LONG},  /* prompt + max_tokens is: one check */
        {64, 0, 0, EV_CODE_PROMPT_TOO_LONG},  /* no room for one token */
        {0, 4, 0, EV_CODE_MISSING_PROMPT},
        {3, 4, 1, EV_CODE_MISSING_PROMPT},    /* neither ids nor messages */
        {3, 4, 2, EV_CODE_INVALID_TOKEN},     /* a prompt id past the vocabulary */
        {3, 4, 3, EV_CODE_OUT_OF_RANGE},      /* top_p 1.5 */
        {3, 4, 4, EV_CODE_OUT_OF_RANGE},      /* logprobs 21 */
        {3, 4, 5, EV_CODE_INVALID_TOKEN},     /* a stop id past the vocabulary */
        {3, 4, 6, EV_CODE_OUT_OF_RANGE},      /* an empty stop string */
        {3, 4, 7, EV_CODE_BAD_VALUE},         /* n_stop without the list */
        {3, 4, 8, EV_CODE_TEMPLATE_ERROR},    /* messages that are no array */
    };
    int seen[EV_CODE_COUNT] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct engine_request q;
        greedy_req(&q, ids, cases[i].n_prompt, cases[i].max_tokens);
        ids[0] = cases[i].mutate == 2 ? 99999 : 5;
        switch (cases[i].mutate) {
        case 1: q.prompt_ids = NULL; break;
        case 3: q.top_p = 1.5f; break;
        case 4: q.n_logprobs = 21; break;
        case 5: q.stop_ids = bad_stop; q.n_stop_ids = 1; break;
        case 6: q.stop = empty_stop; q.n_stop = 1; break;
        case 7: q.n_stop = 1; break;
        case 8: q.prompt_ids = NULL; q.messages = not_messages; break;
        }
        struct rl_err err = {0};
        uint64_t id = 7;
        assert_int_equal(engine_check(e, &q, &err), -(int)cases[i].code);
        assert_int_equal(err.code, cases[i].code);
        assert_true(err.msg[0] != 0);
        memset(&err, 0, sizeof err);
        assert_int_equal(engine_submit(e, &q, &id, &err), -(int)cases[i].code);
        assert_int_equal(err.code, cases[i].code);
        assert_int_equal(id, 0);
        /* the sentence is a sentence: no code name leads it */
        assert_null(strstr(err.msg, ev_code_name(cases[i].code)));
        seen[cases[i].code]++;
    }
    ids[0] = 5;
    cJSON_Delete(not_messages);
    assert_int_equal(engine_n_active(e), 0);
    /* the boundary fits: 60 + 4 = 64 */
    struct engine_request q;
    struct rl_err err = {0};
    greedy_req(&q, ids, 60, 4);
    assert_int_equal(engine_check(e, &q, &err), 0);
    assert_int_equal(engine_n_active(e), 0); /* a check changes nothing */

    /* the walk: errors.json row i is code i, and every code the engine
     * gave is one of its rows */
    char *text = tu_slurp("schemas/errors.json", NULL);
    if (!text)
        fail_msg("schemas/errors.json: cannot read (run from the repository root)");
    cJSON *root = cJSON_Parse(text);
    cJSON *codes = cJSON_GetObjectItemCaseSensitive(root, "codes");
    assert_int_equal(cJSON_GetArraySize(codes), EV_CODE_COUNT - 1);
    int n_given = 0;
    for (int i = 1; i < EV_CODE_COUNT; i++) {
        const char *name = cJSON_GetStringValue(
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(codes, i - 1), "code"));
        assert_non_null(name);
        assert_int_equal(ev_code_from_name(name), i);
        n_given += seen[i] > 0;
    }
    assert_int_equal(n_given, 6); /* PROMPT_TOO_LONG MISSING_PROMPT INVALID_TOKEN
                                     OUT_OF_RANGE BAD_VALUE TEMPLATE_ERROR */
    cJSON_Delete(root);
    free(text);

    /* the context limit ends a long generation with "length" */
    static struct result r;
    greedy_req(&q, ids, 3, 0);
    submit(e, &q, &r);
    drain(e);
    assert_int_equal(r.finish, ENGINE_FINISH_LENGTH);
    assert_int_equal(r.n_tokens + 3, 64);
    engine_free(e);
}

/* The checkpoint's generation_config.json fills unset sampling fields
 * (the card fills what it lacks); a field given wins; a bad value fails
 * engine_create naming the file. Also the served name's default. */
static void test_generation_config(void **state)
{
    (void)state;
    char dir[100], path[200];
    snprintf(dir, sizeof dir, "%s/gen", tmpdir);
    assert_int_equal(tu_copy_dir(f32_dir, dir), 0);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"temperature\": 1.3, \"top_k\": 7, \"do_sample\": false}", f);
    fclose(f);
    char saved[1024];
    strcpy(saved, model_dir);
    snprintf(model_dir, sizeof model_dir, "%s", dir);
    struct engine *e = open_engine(256, 4, 0);
    assert_string_equal(engine_served_name(e), "gen");
    int32_t ids[8];
    make_prompt(ids, 8, 21);
    static struct result unset, spelt, other;
    struct engine_request q;
    greedy_req(&q, ids, 8, 16);
    q.temperature = -1; /* unset: 1.3 from the file */
    q.has_seed = true;
    q.seed = 5;
    submit(e, &q, &unset);
    drain(e);
    q.temperature = 1.3f;
    q.top_p = 0.95f; /* the thinking card's, the file has none */
    q.top_k = 7;
    q.min_p = 0;
    submit(e, &q, &spelt);
    drain(e);
    assert_same(&unset, &spelt);
    q.top_k = 0; /* given: wins over the file */
    submit(e, &q, &other);
    drain(e);
    assert_true(memcmp(other.tokens, unset.tokens, sizeof unset.tokens[0] * 16) != 0);
    engine_free(e);

    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"temperature\": \"hot\"}", f);
    fclose(f);
    struct engine_options o;
    engine_options_default(&o);
    o.kv_blocks = 16;
    o.served_name = "named";
    struct rl_err err = {0};
    assert_int_equal(engine_create(&e, dir, &o, &err), -RL_EFORMAT);
    assert_non_null(strstr(err.msg, "generation_config.json"));
    assert_non_null(strstr(err.msg, "temperature"));
    remove(path);
    assert_int_equal(engine_create(&e, dir, &o, &err), 0);
    assert_string_equal(engine_served_name(e), "named");
    engine_free(e);
    strcpy(model_dir, saved);
}

/* Mode defaults only fill what is unset; eos stops unless ignore_eos. */
static void test_eos_and_defaults(void **state)
{
    (void)state;
    struct engine *e = open_engine(256, 4, 0);
    int32_t ids[8];
    make_prompt(ids, 8, 11);
    struct engine_request q;
    static struct result r;
    greedy_req(&q, ids, 8, 8);
    q.ignore_eos = false;
    int32_t stop_id;
    /* stop on whatever greedy says first, as an extra stop id */
    static struct result base;
    submit(e, &q, &base);
    drain(e);
    stop_id = base.tokens[2];
    q.stop_ids = &stop_id;
    q.n_stop_ids = 1;
    submit(e, &q, &r);
    drain(e);
    assert_int_equal(r.finish, ENGINE_FINISH_STOP);
    int first = 0;
    while (base.tokens[first] != stop_id)
        first++;
    assert_int_equal(r.n_tokens, first + 1);

    /* min_tokens (issue 29): the stop id cannot come before min_tokens
     * tokens, so the run goes past where it stopped */
    static struct result rm;
    q.min_tokens = first + 2 < 8 ? first + 2 : 8;
    submit(e, &q, &rm);
    drain(e);
    assert_true(rm.n_tokens >= q.min_tokens);
    for (int i = 0; i < first; i++)
        assert_int_equal(rm.tokens[i], base.tokens[i]);
    for (int i = 0; i < q.min_tokens; i++)
        assert_int_not_equal(rm.tokens[i], stop_id);
    q.min_tokens = 0;
    q.stop_ids = NULL;
    q.n_stop_ids = 0;

    /* logit_bias: -100 on the greedy first token changes it; +100 on
     * another forces that one at every step */
    static struct result rb, rf;
    int32_t bid = base.tokens[0];
    float minus = -100.0f, plus = 100.0f;
    q.bias_ids = &bid;
    q.bias = &minus;
    q.n_bias = 1;
    submit(e, &q, &rb);
    drain(e);
    assert_int_not_equal(rb.tokens[0], bid);
    for (int i = 0; i < rb.n_tokens; i++)
        assert_int_not_equal(rb.tokens[i], bid);
    int32_t fid = 5;
    q.bias_ids = &fid;
    q.bias = &plus;
    submit(e, &q, &rf);
    drain(e);
    assert_int_equal(rf.n_tokens, 8);
    for (int i = 0; i < rf.n_tokens; i++)
        assert_int_equal(rf.tokens[i], fid);
    /* an id outside the vocabulary is refused */
    struct rl_err err = {0};
    uint64_t id;
    int32_t far = 1 << 30;
    q.bias_ids = &far;
    assert_int_not_equal(engine_submit(e, &q, &id, &err), 0);
    assert_non_null(strstr(err.msg, "logit_bias"));
    engine_free(e);
}

/* Chat messages go through the template and the tokenizer; the result is
 * the same as submitting those ids. */
/* engine_options.progress_every reaches the backend: the CPU backend
 * reports load progress at most once per progress_every bytes (checked
 * after each matrix) and at the end, so 64 KiB steps over the tiny model's
 * 3.5 MB give a call for nearly every matrix where the 64 MiB default
 * gives a first and a last one. */
struct progress_log {
    int n;
    size_t done, total;
};

static void count_progress(void *user, size_t done, size_t total)
{
    struct progress_log *l = user;
    assert_true(done >= l->done && done <= total); /* monotone, within the total */
    l->n++;
    l->done = done;
    l->total = total;
}

/* ---- constraints compile off the stepping thread ---- */

/* A gate on the compile thread (engine_options.grammar_compile_hook): each
 * compile announces itself and waits until the test opens the gate, so the
 * test sees what the engine does while a compile is under way without
 * reading a clock. */
struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, opened; /* compiles that reached the gate; that may pass */
};

static void gate_hook(void *user)
{
    struct gate *g = user;
    pthread_mutex_lock(&g->mu);
    int me = g->entered++;
    pthread_cond_broadcast(&g->cv);
    while (g->opened <= me)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* Fails (instead of hanging) when no compile comes to the gate: an engine
 * that compiled on the caller's thread never calls the hook. */
static void gate_wait_entered(struct gate *g, int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 60;
    pthread_mutex_lock(&g->mu);
    int rc = 0;
    while (g->entered < n && rc == 0)
        rc = pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    int entered = g->entered;
    pthread_mutex_unlock(&g->mu);
    if (entered < n)
        fail_msg("%d compiles reached the compile thread's gate in 60 s; %d expected", entered, n);
}

static int gate_entered(struct gate *g)
{
    pthread_mutex_lock(&g->mu);
    int n = g->entered;
    pthread_mutex_unlock(&g->mu);
    return n;
}

static void gate_open(struct gate *g, int n)
{
    pthread_mutex_lock(&g->mu);
    g->opened = n;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static struct engine *open_gated_engine_bytes(struct gate *g, bool sync, int compile_threads,
                                              int max_batch, size_t cache_bytes)
{
    struct engine_options o;
    engine_options_default(&o);
    o.n_threads = 1;
    o.kv_blocks = 64;
    o.max_batch = max_batch;
    o.token_budget = 256;
    o.grammar_compile_hook = gate_hook;
    o.grammar_compile_user = g;
    o.grammar_sync_compile = sync;
    o.grammar_compile_threads = compile_threads;
    o.grammar_cache_bytes = cache_bytes;
    struct engine *e = NULL;
    struct rl_err err = {0};
    if (engine_create(&e, model_dir, &o, &err))
        fail_msg("engine_create: %s", err.msg);
    return e;
}

static struct engine *open_gated_engine(struct gate *g, bool sync, int compile_threads,
                                        int max_batch)
{
    return open_gated_engine_bytes(g, sync, compile_threads, max_batch, 0);
}

static const char SMALL_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0,"
    "\"maximum\":9}},\"required\":[\"a\"],\"additionalProperties\":false}";

static void constrained_req(struct engine_request *q, const int32_t *ids, int n,
                            enum engine_constraint kind, const char *src)
{
    greedy_req(q, ids, n, 40);
    q->ignore_eos = false;
    q->mode = ENGINE_MODE_NO_THINK;
    q->constraint = kind;
    q->constraint_src = src;
    q->constraint_len = strlen(src);
}

static int step_once(struct engine *e)
{
    const struct engine_event *ev;
    int n;
    struct rl_err err = {0};
    if (engine_step(e, &ev, &n, &err))
        fail_msg("engine_step: %s", err.msg);
    for (int i = 0; i < n; i++)
        on_event(&ev[i]);
    return n;
}

static int n_compiling(const struct engine *e)
{
    struct engine_stats st;
    engine_get_stats(e, &st);
    return st.n_compiling;
}

/* A running request keeps stepping while another's schema compiles; the
 * constrained one waits, then runs to a document of its schema. */
static void test_compile_off_the_step(void **state)
{
    (void)state;
    static struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    g.entered = g.opened = 0;
    struct engine *e = open_gated_engine(&g, false, 1, 8);
    int32_t ids[12];
    make_prompt(ids, 12, 3);
    struct engine_request qa, qb;
    static struct result ra, rb;
    greedy_req(&qa, ids, 12, 30);
    submit(e, &qa, &ra);
    while (ra.n_tokens == 0)
        step_once(e);
    constrained_req(&qb, ids, 12, ENGINE_CONSTRAINT_JSON_SCHEMA, SMALL_SCHEMA);
    submit(e, &qb, &rb);
    assert_int_equal(n_compiling(e), 1);
    gate_wait_entered(&g, 1); /* the compile is under way, held */
    for (int i = 0; i < 5; i++) {
        int before = ra.n_tokens;
        step_once(e);
        assert_int_equal(ra.n_tokens, before + 1); /* A steps on */
        assert_int_equal(rb.n_events, 0);          /* B waits */
        assert_int_equal(n_compiling(e), 1);
    }
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.n_slots_used, 1); /* B holds no slot */
    assert_int_equal(st.n_running + st.n_waiting, 1); /* and is not scheduled */
    gate_open(&g, 1);
    drain(e);
    assert_int_equal(n_compiling(e), 0);
    assert_int_equal(ra.finish, ENGINE_FINISH_LENGTH);
    assert_int_equal(ra.n_tokens, 30);
    assert_true(rb.finish == ENGINE_FINISH_STOP || rb.finish == ENGINE_FINISH_LENGTH);
    assert_true(rb.n_tokens > 0);
    if (rb.finish == ENGINE_FINISH_STOP) { /* a whole document of the schema */
        rb.content[rb.n_content] = 0;
        cJSON *doc = cJSON_Parse(rb.content);
        assert_non_null(doc);
        cJSON *a = cJSON_GetObjectItemCaseSensitive(doc, "a");
        assert_true(cJSON_IsNumber(a) && a->valuedouble >= 0 && a->valuedouble <= 9);
        assert_int_equal(cJSON_GetArraySize(doc), 1);
        cJSON_Delete(doc);
    }
    /* compiled once, then cached: the same schema again does not wait */
    submit(e, &qb, &rb);
    assert_int_equal(n_compiling(e), 0);
    drain(e);
    assert_int_equal(gate_entered(&g), 1);
    engine_free(e);
}

/* What happens to a request while its constraint compiles: a cancel and a
 * deadline end it at once; the same text asked twice compiles once (and
 * is cached though its requests are gone); a refusal comes as an ERROR
 * event with the refusal's code, and engine_check never compiles. With
 * grammar_sync_compile the refusal comes from engine_submit itself. */
static void test_compile_waiting_requests(void **state)
{
    (void)state;
    static struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    g.entered = g.opened = 0;
    struct engine *e = open_gated_engine(&g, false, 1, 8);
    int32_t ids[8];
    make_prompt(ids, 8, 4);
    struct engine_request qc, qd, qf;
    static struct result rc, rd, rf, rg;
    struct rl_err err = {0};

    /* two requests, one text: one compile; one cancelled while it runs */
    constrained_req(&qc, ids, 8, ENGINE_CONSTRAINT_JSON_SCHEMA, SMALL_SCHEMA);
    submit(e, &qc, &rc);
    constrained_req(&qd, ids, 8, ENGINE_CONSTRAINT_JSON_SCHEMA, SMALL_SCHEMA);
    submit(e, &qd, &rd);
    assert_int_equal(n_compiling(e), 2);
    gate_wait_entered(&g, 1);
    assert_int_equal(engine_cancel(e, rc.id, &err), 0);
    step_once(e);
    assert_int_equal(rc.finish, ENGINE_FINISH_CANCELLED);
    assert_int_equal(rc.n_tokens, 0);
    assert_int_equal(n_compiling(e), 1);
    /* a deadline passes while the compile is held */
    constrained_req(&qf, ids, 8, ENGINE_CONSTRAINT_GRAMMAR, "root ::= \"x\"+");
    qf.deadline = engine_now() + 0.02;
    submit(e, &qf, &rf);
    while (rf.finish == ENGINE_FINISH_NONE)
        step_once(e); /* each waits ENGINE_COMPILE_WAIT_MS at most: no spin */
    assert_int_equal(rf.finish, ENGINE_FINISH_DEADLINE);
    assert_int_equal(rd.n_events, 0);
    gate_open(&g, 100);
    drain(e);
    assert_true(rd.finish == ENGINE_FINISH_STOP || rd.finish == ENGINE_FINISH_LENGTH);
    /* the schema once, the grammar once: the grammar's compile runs on
     * though its request is gone (cached for the next), so wait for it */
    gate_wait_entered(&g, 2);
    assert_int_equal(gate_entered(&g), 2);

    /* a grammar the compiler refuses: engine_check and engine_submit take
     * it, its request ends with the refusal's code */
    struct engine_request qg;
    constrained_req(&qg, ids, 8, ENGINE_CONSTRAINT_GRAMMAR, "root ::= \"a\" (b");
    assert_int_equal(engine_check(e, &qg, &err), 0);
    submit(e, &qg, &rg);
    drain(e);
    assert_int_equal(rg.finish, ENGINE_FINISH_ERROR);
    assert_int_equal(rg.refused, EV_CODE_BAD_PARAM);
    assert_non_null(strstr(rg.error, "1:"));
    assert_int_equal(rg.n_tokens, 0);
    engine_free(e);

    /* ... and that same grammar refused by engine_submit itself */
    e = open_gated_engine(&g, true, 1, 8);
    uint64_t id = 9;
    memset(&err, 0, sizeof err);
    assert_int_equal(engine_submit(e, &qg, &id, &err), -(int)EV_CODE_BAD_PARAM);
    assert_int_equal(err.code, EV_CODE_BAD_PARAM);
    assert_non_null(strstr(err.msg, "1:"));
    assert_int_equal(id, 0);
    assert_int_equal(engine_n_active(e), 0);
    engine_free(e);
}

/* A compiling request holds no batch slot: with max_batch 2, two plain
 * requests run while a third compiles; its compile, finished into the
 * full batch, waits in the scheduler (never a third running sequence)
 * and runs when a slot frees. */
static void test_compile_into_a_full_batch(void **state)
{
    (void)state;
    static struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    g.entered = g.opened = 0;
    struct engine *e = open_gated_engine(&g, false, 1, 2);
    int32_t ids[8];
    make_prompt(ids, 8, 6);
    struct engine_request qa, qb, qc;
    static struct result ra, rb, rc;
    constrained_req(&qc, ids, 8, ENGINE_CONSTRAINT_JSON_SCHEMA, SMALL_SCHEMA);
    submit(e, &qc, &rc);
    gate_wait_entered(&g, 1);
    greedy_req(&qa, ids, 8, 40);
    submit(e, &qa, &ra);
    greedy_req(&qb, ids, 8, 60);
    submit(e, &qb, &rb);
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.n_slots_used, 2);
    assert_int_equal(st.n_compiling, 1);
    while (ra.n_tokens == 0 || rb.n_tokens == 0) /* both run while C compiles */
        step_once(e);
    assert_int_equal(rc.n_events, 0);
    assert_int_equal(n_compiling(e), 1);
    gate_open(&g, 1);
    while (n_compiling(e) > 0) /* attached at a step once compiled */
        step_once(e);
    engine_get_stats(e, &st);
    if (ra.finish == ENGINE_FINISH_NONE) { /* still a full batch: C queues */
        assert_int_equal(st.n_slots_used, 3);
        assert_int_equal(st.n_running, 2);
        assert_int_equal(st.n_waiting, 1);
        assert_int_equal(rc.n_events, 0);
    }
    while (engine_n_active(e) > 0) {
        step_once(e);
        engine_get_stats(e, &st);
        assert_true(st.n_running <= 2);
        if (rc.n_events > 0 && rc.finish == ENGINE_FINISH_NONE) /* C runs after A */
            assert_int_equal(ra.finish, ENGINE_FINISH_LENGTH);
    }
    assert_int_equal(ra.n_tokens, 40);
    assert_int_equal(rb.n_tokens, 60);
    assert_true(rc.finish == ENGINE_FINISH_STOP || rc.finish == ENGINE_FINISH_LENGTH);
    assert_true(rc.n_tokens > 0);
    engine_free(e);
}

/* Queued compiles go by their requests' priority: with one compile thread
 * held on X, Y (priority 0) and then Z (priority 5) queue; Z's compile
 * comes next and Z runs while Y's waits at the gate. */
static void test_compile_by_priority(void **state)
{
    (void)state;
    static struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    g.entered = g.opened = 0;
    struct engine *e = open_gated_engine(&g, false, 1, 8);
    int32_t ids[8];
    make_prompt(ids, 8, 8);
    struct engine_request qx, qy, qz;
    static struct result rx, ry, rz;
    constrained_req(&qx, ids, 8, ENGINE_CONSTRAINT_JSON_SCHEMA, SMALL_SCHEMA);
    submit(e, &qx, &rx);
    gate_wait_entered(&g, 1); /* X compiling, held */
    constrained_req(&qy, ids, 8, ENGINE_CONSTRAINT_GRAMMAR, "root ::= \"y\"+");
    submit(e, &qy, &ry);
    constrained_req(&qz, ids, 8, ENGINE_CONSTRAINT_GRAMMAR, "root ::= \"z\"+");
    qz.priority = 5;
    submit(e, &qz, &rz);
    gate_open(&g, 2);         /* X's and the next compile pass */
    gate_wait_entered(&g, 3); /* the third is at the gate: the second is done */
    for (int guard = 0; rz.n_tokens == 0; guard++) {
        assert_true(guard < 10000);
        step_once(e);
    }
    assert_int_equal(ry.n_events, 0); /* Y's compile is the one held */
    assert_int_equal(n_compiling(e), 1);
    gate_open(&g, 3);
    drain(e);
    assert_true(ry.finish == ENGINE_FINISH_STOP || ry.finish == ENGINE_FINISH_LENGTH);
    rz.content[rz.n_content] = 0;
    assert_true(rz.n_content > 0 && strspn(rz.content, "z") == rz.n_content);
    engine_free(e);
}

/* The compile cache is bounded in bytes too: with room for one grammar, A,
 * B, A compiles A twice; with the default room, once. engine_stats says
 * what the cache holds. */
static void test_compile_cache_bytes(void **state)
{
    (void)state;
    static struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    int32_t ids[8];
    make_prompt(ids, 8, 7);
    const char *src[3] = {SMALL_SCHEMA, "root ::= \"y\"+", SMALL_SCHEMA};
    enum engine_constraint kind[3] = {ENGINE_CONSTRAINT_JSON_SCHEMA, ENGINE_CONSTRAINT_GRAMMAR,
                                      ENGINE_CONSTRAINT_JSON_SCHEMA};
    for (int room = 0; room < 2; room++) {
        g.entered = 0;
        g.opened = 100;
        struct engine *e = open_gated_engine_bytes(&g, false, 1, 8, room ? 0 : 1);
        struct engine_stats st;
        size_t first = 0;
        for (int i = 0; i < 3; i++) {
            struct engine_request q;
            static struct result r;
            constrained_req(&q, ids, 8, kind[i], src[i]);
            submit(e, &q, &r);
            drain(e);
            assert_true(r.finish == ENGINE_FINISH_STOP || r.finish == ENGINE_FINISH_LENGTH);
            engine_get_stats(e, &st);
            if (i == 0)
                first = st.grammar_cache_bytes;
            assert_true(st.grammar_cache_bytes > 0);
        }
        assert_int_equal(gate_entered(&g), room ? 2 : 3);
        if (room) /* both kept */
            assert_true(st.grammar_cache_bytes > first);
        else /* A alone again, compiled and walked as the first time */
            assert_int_equal(st.grammar_cache_bytes, first);
        engine_free(e);
    }
}

/* Several compile threads: two new schemas compile at once (both reach
 * the gate before either may pass), while a third waits its turn. */
static void test_compile_in_parallel(void **state)
{
    (void)state;
    static struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    g.entered = g.opened = 0;
    struct engine *e = open_gated_engine(&g, false, 2, 8);
    int32_t ids[8];
    make_prompt(ids, 8, 5);
    const char *src[3] = {SMALL_SCHEMA, "root ::= \"y\"+", "root ::= \"z\"{1,3}"};
    enum engine_constraint kind[3] = {ENGINE_CONSTRAINT_JSON_SCHEMA, ENGINE_CONSTRAINT_GRAMMAR,
                                      ENGINE_CONSTRAINT_GRAMMAR};
    struct engine_request q[3];
    static struct result r[3];
    for (int i = 0; i < 3; i++) {
        constrained_req(&q[i], ids, 8, kind[i], src[i]);
        submit(e, &q[i], &r[i]);
    }
    gate_wait_entered(&g, 2); /* two at once */
    step_once(e);
    assert_int_equal(gate_entered(&g), 2); /* the third waits for a thread */
    assert_int_equal(n_compiling(e), 3);
    gate_open(&g, 3);
    drain(e);
    assert_int_equal(gate_entered(&g), 3);
    for (int i = 0; i < 3; i++)
        assert_true(r[i].finish == ENGINE_FINISH_STOP || r[i].finish == ENGINE_FINISH_LENGTH);
    r[1].content[r[1].n_content] = 0;
    assert_true(r[1].n_content > 0 && strspn(r[1].content, "y") == r[1].n_content);
    engine_free(e);
}

static void test_progress_every(void **state)
{
    (void)state;
    struct progress_log logs[2] = {{0}, {0}};
    size_t every[2] = {0, 64 << 10};
    for (int i = 0; i < 2; i++) {
        struct engine_options o;
        engine_options_default(&o);
        o.kv_blocks = 16;
        o.progress = count_progress;
        o.progress_user = &logs[i];
        o.progress_every = every[i];
        struct engine *e = NULL;
        struct rl_err err = {0};
        if (engine_create(&e, model_dir, &o, &err))
            fail_msg("engine_create: %s", err.msg);
        engine_free(e);
        assert_true(logs[i].total > (size_t)(2 << 20));
        assert_int_equal(logs[i].done, logs[i].total); /* the last call says "all" */
    }
    assert_true(logs[0].n <= 3);
    assert_true(logs[1].n >= 10); /* 25 today: nearly one per matrix */
}

static void test_chat_messages(void **state)
{
    (void)state;
    struct engine *e = open_engine(256, 4, 0);
    const struct tokenizer *tok = engine_get_tokenizer(e);
    cJSON *msgs = cJSON_Parse("[{\"role\": \"system\", \"content\": \"Be brief.\"},"
                              " {\"role\": \"user\", \"content\": \"The cat sat\"}]");
    assert_non_null(msgs);
    struct chat_template_opts co = {.add_generation_prompt = true, .disable_thinking = true};
    char *text;
    size_t len;
    struct rl_err err = {0};
    assert_int_equal(chat_render(msgs, NULL, &co, &text, &len, &err), 0);
    struct tok_ids ids = {0};
    assert_int_equal(tok_encode(tok, text, len, 0, &ids, &err), 0);
    free(text);
    struct engine_request q;
    static struct result by_msgs, by_ids;
    greedy_req(&q, NULL, 0, 10);
    q.messages = msgs;
    q.mode = ENGINE_MODE_NO_THINK;
    submit(e, &q, &by_msgs);
    greedy_req(&q, ids.ids, (int)ids.n, 10);
    submit(e, &q, &by_ids);
    drain(e);
    assert_int_equal(by_msgs.usage.prompt_tokens, (int)ids.n);
    assert_same(&by_msgs, &by_ids);
    tok_ids_free(&ids);
    cJSON_Delete(msgs);
    engine_free(e);
}

static int setup(void **state)
{
    (void)state;
    snprintf(model_dir, sizeof model_dir, "%s/models/tiny-qwen3-a", tu_data_dir());
    strcpy(f32_dir, model_dir);
    if (tu_tmpdir(tmpdir, sizeof tmpdir, "test-engine"))
        return -1;
    snprintf(bf16_dir, sizeof bf16_dir, "%s/bf16", tmpdir);
    struct mk_opts mo;
    mk_opts_init(&mo);
    mo.from_dir = f32_dir;
    mo.out_dir = bf16_dir;
    mo.dtype = MK_BF16;
    struct rl_err err = {0};
    if (mk_write(&mo, NULL, &err)) {
        fprintf(stderr, "cannot make the BF16 copy: %s\n", err.msg);
        return -1;
    }
    /* Qwen3-Embedding's layout: the tiny model's own weights under bare
     * names; and an untied random one with no lm_head at all */
    snprintf(emb_dir, sizeof emb_dir, "%s/emb", tmpdir);
    snprintf(emb_only_dir, sizeof emb_only_dir, "%s/emb-only", tmpdir);
    mk_opts_init(&mo);
    mo.from_dir = f32_dir;
    mo.out_dir = emb_dir;
    mo.dtype = MK_F32;
    mo.embedding = 1;
    if (mk_write(&mo, NULL, &err)) {
        fprintf(stderr, "cannot make the embedding-layout copy: %s\n", err.msg);
        return -1;
    }
    mk_opts_init(&mo);
    mo.out_dir = emb_only_dir;
    mo.tokenizer_dir = f32_dir;
    mo.dtype = MK_F32;
    mo.tied = 0;
    mo.embedding = 1;
    if (mk_write(&mo, NULL, &err)) {
        fprintf(stderr, "cannot make the embeddings-only checkpoint: %s\n", err.msg);
        return -1;
    }
    /* the quantized ones: random weights (the model maker converts only to
     * f32 / bf16 / fp8), shapes whose dims fit the formats' blocks */
    snprintf(q8_dir, sizeof q8_dir, "%s/q8_0", tmpdir);
    snprintf(q4km_dir, sizeof q4km_dir, "%s/q4km", tmpdir);
    for (int i = 0; i < 2; i++) {
        mk_opts_init(&mo);
        mo.out_dir = i ? q4km_dir : q8_dir;
        mo.dtype = i ? MK_Q4_K_M : MK_Q8_0;
        mo.tokenizer_dir = f32_dir; /* into the GGUF metadata: stop strings, thinking */
        mo.seed = 5;
        if (i)
            mo.hidden = 256, mo.intermediate = 512, mo.n_layers = 3, mo.head_dim = 64;
        if (mk_write(&mo, NULL, &err)) {
            fprintf(stderr, "cannot make the quantized checkpoint: %s\n", err.msg);
            return -1;
        }
    }
    char path[1100];
    snprintf(path, sizeof path, "%s/reference.json", model_dir);
    char *txt = tu_slurp(path, NULL);
    if (!txt) {
        fprintf(stderr, "cannot read %s\n", path);
        return -1;
    }
    reference = cJSON_Parse(txt);
    free(txt);
    return reference ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    int rc = tu_rmtree(tmpdir);
    cJSON_Delete(reference);
    return rc;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_greedy),
        cmocka_unit_test(test_reduced_rows),
        cmocka_unit_test(test_prefix_cache_reuse),
        cmocka_unit_test(test_eviction_under_pressure),
        cmocka_unit_test(test_preemption_identical),
        cmocka_unit_test(test_resume_exact),
        cmocka_unit_test(test_stop_string_split),
        cmocka_unit_test(test_stop_string_spans_think_tag),
        cmocka_unit_test(test_thinking_budget),
        cmocka_unit_test(test_cancel_frees_blocks),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_chunk_sizes),
        cmocka_unit_test(test_batch_invariance_bf16),
        cmocka_unit_test(test_chunk_sizes_bf16),
        cmocka_unit_test(test_preemption_identical_bf16),
        cmocka_unit_test(test_thread_counts),
        cmocka_unit_test(test_thread_counts_bf16),
        cmocka_unit_test(test_spec_options),
        cmocka_unit_test(test_spec_identical),
        cmocka_unit_test(test_spec_identical_bf16),
        cmocka_unit_test(test_spec_ngram_repeat),
        cmocka_unit_test(test_batch_invariance_quant),
        cmocka_unit_test(test_chunk_sizes_quant),
        cmocka_unit_test(test_preemption_identical_quant),
        cmocka_unit_test(test_spec_identical_quant),
        cmocka_unit_test(test_thread_counts_quant),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_embed_rowsets),
        cmocka_unit_test(test_embedding_checkpoints),
        cmocka_unit_test(test_score),
        cmocka_unit_test(test_score_rowsets),
        cmocka_unit_test(test_submit_errors),
        cmocka_unit_test(test_eos_and_defaults),
        cmocka_unit_test(test_generation_config),
        cmocka_unit_test(test_chat_messages),
        cmocka_unit_test(test_progress_every),
        cmocka_unit_test(test_compile_off_the_step),
        cmocka_unit_test(test_compile_waiting_requests),
        cmocka_unit_test(test_compile_into_a_full_batch),
        cmocka_unit_test(test_compile_by_priority),
        cmocka_unit_test(test_compile_cache_bytes),
        cmocka_unit_test(test_compile_in_parallel),
    };
    /* TEST_FILTER=test_compile* runs only those (a sanitizer run that must
     * skip the CPU pool's tests: tests/README.md) */
    if (getenv("TEST_FILTER"))
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
