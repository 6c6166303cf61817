/* tests/unit/test_lora.c - LoRA adapters (engine/lora.h) served beside the
 * base model: the loader's refusals, the CPU backend's deltas against the
 * same adapter merged into the weights (an independent path: one product
 * with W + s B A, summed in the model maker), batch invariance next to
 * base rows and other adapters, and the prefix cache's domains. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "engine.h"
#include "file.h"
#include "kv_cache.h"
#include "lora.h"
#include "mklora.h"
#include "mkmodel.h"
#include "model.h"
#include "safetensors.h"
#include "test_util.h"

static char tmpdir[1024], base_dir[1100], bf16_dir[1100];
static char ad_dir[1100], ad2_dir[1100], qv_dir[1100], merged_dir[1100], merged2_dir[1100],
    qv_merged_dir[1100], bf16_ad_dir[1100], down_dir[1100], down_merged_dir[1100], ad_gguf[1100],
    ad_gguf_bf16[1100], bf16_ad_peft[1100];

#define MAX_OUT 24

struct result {
    uint64_t id;
    int n_tokens;
    int32_t tokens[MAX_OUT];
    float logprobs[MAX_OUT];
    enum engine_finish finish;
    struct engine_usage usage;
};

static void make_adapter(const char *base, const char *out, unsigned targets, int rank, int rslora,
                         int bf16, uint64_t seed)
{
    /* out ending in .gguf: llama.cpp's adapter file, the same values */
    struct mk_lora_opts o;
    mk_lora_opts_init(&o);
    o.base_dir = base;
    o.out_dir = out;
    o.targets = targets;
    o.rank = rank;
    o.rslora = rslora;
    o.bf16 = bf16;
    o.seed = seed;
    o.std = 0.05f; /* big enough that greedy tokens change */
    struct rl_err err = {0};
    if (mk_lora_write(&o, &err))
        fail_msg("mk_lora_write: %s", err.msg);
}

static void merge(const char *base, const char *ad, const char *out)
{
    struct rl_err err = {0};
    if (mk_lora_merge(base, ad, out, &err))
        fail_msg("mk_lora_merge: %s", err.msg);
}

static int setup(void **state)
{
    (void)state;
    snprintf(base_dir, sizeof base_dir, "%s/models/tiny-qwen3-a", tu_data_dir());
    if (tu_tmpdir(tmpdir, sizeof tmpdir, "test-lora"))
        return -1;
    snprintf(bf16_dir, sizeof bf16_dir, "%s/bf16", tmpdir);
    snprintf(ad_dir, sizeof ad_dir, "%s/ad", tmpdir);
    snprintf(ad2_dir, sizeof ad2_dir, "%s/ad2", tmpdir);
    snprintf(qv_dir, sizeof qv_dir, "%s/qv", tmpdir);
    snprintf(merged_dir, sizeof merged_dir, "%s/merged", tmpdir);
    snprintf(merged2_dir, sizeof merged2_dir, "%s/merged2", tmpdir);
    snprintf(qv_merged_dir, sizeof qv_merged_dir, "%s/qv-merged", tmpdir);
    snprintf(bf16_ad_dir, sizeof bf16_ad_dir, "%s/bf16-ad", tmpdir);
    snprintf(down_dir, sizeof down_dir, "%s/down", tmpdir);
    snprintf(ad_gguf, sizeof ad_gguf, "%s/ad.gguf", tmpdir);
    snprintf(ad_gguf_bf16, sizeof ad_gguf_bf16, "%s/gg/bf16-ad.gguf", tmpdir);
    snprintf(bf16_ad_peft, sizeof bf16_ad_peft, "%s/bf16-ad-peft", tmpdir);
    snprintf(down_merged_dir, sizeof down_merged_dir, "%s/down-merged", tmpdir);
    struct mk_opts mo;
    mk_opts_init(&mo);
    mo.from_dir = base_dir;
    mo.out_dir = bf16_dir;
    mo.dtype = MK_BF16;
    struct rl_err err = {0};
    if (mk_write(&mo, NULL, &err)) {
        fprintf(stderr, "cannot make the BF16 copy: %s\n", err.msg);
        return -1;
    }
    make_adapter(base_dir, ad_dir, 0, 8, 0, 0, 1);
    make_adapter(base_dir, ad_gguf, 0, 8, 0, 0, 1);           /* ad_dir's values, as GGUF */
    make_adapter(base_dir, ad_gguf_bf16, 1u << LORA_O | 1u << LORA_UP, 8, 0, 1, 6);
    make_adapter(base_dir, bf16_ad_peft, 1u << LORA_O | 1u << LORA_UP, 8, 0, 1, 6);
    make_adapter(base_dir, ad2_dir, 0, 16, 0, 0, 2);
    /* two projections only, rsLoRA, BF16 tensors */
    make_adapter(base_dir, qv_dir, 1u << LORA_Q | 1u << LORA_V, 4, 1, 1, 3);
    make_adapter(bf16_dir, bf16_ad_dir, 0, 8, 0, 1, 4);
    merge(base_dir, ad_dir, merged_dir);
    merge(base_dir, ad2_dir, merged2_dir);
    merge(base_dir, qv_dir, qv_merged_dir);
    /* on the BF16 copy, down only: the step keeps its fused gate/up and
     * SwiGLU, whose output exists only as bf16 rows */
    make_adapter(bf16_dir, down_dir, 1u << LORA_DOWN | 1u << LORA_V, 8, 0, 0, 5);
    merge(bf16_dir, down_dir, down_merged_dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(tmpdir);
    return 0;
}

static struct engine *open_engine(const char *dir, int max_batch)
{
    struct engine_options o;
    engine_options_default(&o);
    o.n_threads = 2;
    o.kv_blocks = 256;
    o.max_batch = max_batch;
    o.token_budget = 256;
    struct engine *e = NULL;
    struct rl_err err = {0};
    if (engine_create(&e, dir, &o, &err))
        fail_msg("engine_create %s: %s", dir, err.msg);
    return e;
}

static void add_lora(struct engine *e, const char *name, const char *dir)
{
    struct rl_err err = {0};
    if (engine_lora_add(e, name, dir, &err))
        fail_msg("engine_lora_add %s: %s", name, err.msg);
}

static void step_once(struct engine *e)
{
    struct rl_err err = {0};
    const struct engine_event *ev;
    int n;
    if (engine_step(e, &ev, &n, &err))
        fail_msg("engine_step: %s", err.msg);
    for (int i = 0; i < n; i++) {
        struct result *r = ev[i].user;
        for (int k = 0; k < ev[i].n_tokens && r->n_tokens < MAX_OUT; k++) {
            r->tokens[r->n_tokens] = ev[i].tokens[k];
            r->logprobs[r->n_tokens++] = ev[i].logprobs ? ev[i].logprobs[k] : 0;
        }
        r->finish = ev[i].finish;
        r->usage = ev[i].usage;
    }
}

static void drain(struct engine *e)
{
    for (int guard = 0; engine_n_active(e) > 0; guard++) {
        assert_true(guard < 100000);
        step_once(e);
    }
}

static void prompt(int32_t *ids, int n, int seed)
{
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)((seed * 131 + i * 37) % 200 + 10);
}

static void submit(struct engine *e, const int32_t *ids, int n, const char *lora, int max_tokens,
                   struct result *r)
{
    struct engine_request q;
    engine_request_init(&q);
    q.prompt_ids = ids;
    q.n_prompt = n;
    q.temperature = 0;
    q.ignore_eos = true;
    q.max_tokens = max_tokens;
    q.n_logprobs = 0;
    q.lora = lora;
    memset(r, 0, sizeof *r);
    q.user = r;
    struct rl_err err = {0};
    if (engine_submit(e, &q, &r->id, &err))
        fail_msg("engine_submit: %s", err.msg);
}

static void run_one(struct engine *e, const int32_t *ids, int n, const char *lora, int max_tokens,
                    struct result *r)
{
    submit(e, ids, n, lora, max_tokens, r);
    drain(e);
    assert_int_equal(r->n_tokens, max_tokens);
}

static void assert_bits(const struct result *a, const struct result *b)
{
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_memory_equal(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof a->tokens[0]);
    assert_memory_equal(a->logprobs, b->logprobs, (size_t)a->n_tokens * sizeof a->logprobs[0]);
}

/* ---- the backend's deltas against the merged weights, every position ---- */

/* logits of every position of ids, through a backend of dir with, when
 * ad is set, the adapter in slot 1 for the sequence */
static float *forward_all(const char *dir, const char *ad, const int32_t *ids, int n, int *vocab)
{
    struct model *m = NULL;
    struct backend *be = NULL;
    struct lora_adapter *a = NULL;
    struct rl_err err = {0};
    if (model_load(&m, dir, &err))
        fail_msg("model_load: %s", err.msg);
    const struct model_config *cfg = model_get_config(m);
    struct be_options bo = {.n_threads = 2};
    assert_int_equal(be_create(&be, "cpu", &bo, &err), 0);
    if (be->ops->load(be->ctx, cfg, model_get_weights(m), 64, &err) ||
        be->ops->kv_init(be->ctx, 16, 16, &err))
        fail_msg("backend: %s", err.msg);
    if (ad && (lora_load(&a, ad, cfg, &err) || be->ops->lora_set(be->ctx, 1, a, &err)))
        fail_msg("adapter: %s", err.msg);
    *vocab = cfg->vocab;
    float *logits = malloc((size_t)n * (size_t)cfg->vocab * sizeof *logits);
    int32_t table[16];
    for (int i = 0; i < 16; i++)
        table[i] = i;
    /* a prefill of all but the last 3, then three decode steps */
    int pre = n - 3;
    struct be_seq s = {.n_past = 0, .n_new = pre, .block_table = table, .logits_from = 0,
                       .lora = ad ? 1 : 0};
    struct be_batch b = {1, &s, pre, ids, pre, logits};
    if (be->ops->forward(be->ctx, &b, &err))
        fail_msg("forward: %s", err.msg);
    for (int t = pre; t < n; t++) {
        s.n_past = t;
        s.n_new = 1;
        b.n_tokens = b.n_logits = 1;
        b.tokens = ids + t;
        b.logits = logits + (size_t)t * (size_t)cfg->vocab;
        if (be->ops->forward(be->ctx, &b, &err))
            fail_msg("forward: %s", err.msg);
    }
    be_free(be);
    lora_free(a);
    model_free(m);
    return logits;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fabs((double)a[i] - b[i]) > d ? fabs((double)a[i] - b[i]) : d;
    return d;
}

/* tol: F32 weights, the two paths differ only in the order of f32 sums;
 * BF16, the merged weights are rounded to bf16 once more */
static void check_against_merged(const char *bdir, const char *ad, const char *merged, double tol)
{
    int32_t ids[20];
    prompt(ids, 20, 7);
    int V;
    float *served = forward_all(bdir, ad, ids, 20, &V);
    float *ref = forward_all(merged, NULL, ids, 20, &V);
    float *base = forward_all(bdir, NULL, ids, 20, &V);
    size_t n = (size_t)20 * (size_t)V;
    double d = max_diff(served, ref, n), moved = max_diff(base, ref, n);
    /* the adapter moves the logits by far more than the two paths differ */
    print_message("adapter moves logits by %.4g; served vs merged %.3g\n", moved, d);
    assert_true(moved > 0.05);
    assert_true(d < tol);
    assert_true(d < moved / 20);
    free(served);
    free(ref);
    free(base);
}

static void test_served_equals_merged(void **state)
{
    (void)state;
    check_against_merged(base_dir, ad_dir, merged_dir, 2e-4);
    check_against_merged(base_dir, ad2_dir, merged2_dir, 2e-4);  /* another rank */
    check_against_merged(base_dir, qv_dir, qv_merged_dir, 2e-4); /* q and v only, rsLoRA, BF16 tensors */
    check_against_merged(bf16_dir, down_dir, down_merged_dir, 0.1); /* v and down on BF16 weights */
}

/* A GGUF adapter (llama.cpp's convert_lora_to_gguf layout) holding the
 * same values as a PEFT one serves the very same logits, bit for bit. */
static void test_gguf_adapter(void **state)
{
    (void)state;
    int32_t ids[20];
    prompt(ids, 20, 5);
    int V;
    for (int k = 0; k < 2; k++) {
        const char *g = k ? ad_gguf_bf16 : ad_gguf, *pe = k ? bf16_ad_peft : ad_dir;
        float *fg = forward_all(base_dir, g, ids, 20, &V);
        float *fp = forward_all(base_dir, pe, ids, 20, &V);
        float *fb = forward_all(base_dir, NULL, ids, 20, &V);
        size_t n = (size_t)20 * (size_t)V;
        assert_memory_equal(fg, fp, n * sizeof *fg);
        assert_true(max_diff(fg, fb, n) > 0.05);
        free(fg), free(fp), free(fb);
    }
    /* through the engine by name, and refused where it is not one */
    struct engine *e = open_engine(base_dir, 4);
    add_lora(e, "g", ad_gguf);
    struct rl_err err = {0};
    char model_gguf[1200];
    snprintf(model_gguf, sizeof model_gguf, "%s/model-q8.gguf", tmpdir);
    struct mk_opts mo;
    mk_opts_init(&mo);
    mo.out_dir = model_gguf;
    mo.dtype = MK_Q8_0;
    assert_int_equal(mk_write(&mo, NULL, &err), 0);
    assert_true(engine_lora_add(e, "m", model_gguf, &err) < 0);
    assert_non_null(strstr(err.msg, "not a LoRA adapter"));
    engine_free(e);
}

/* ---- through the engine ---- */

static void test_engine_tokens(void **state)
{
    (void)state;
    int32_t ids[30];
    prompt(ids, 30, 3);
    static struct result base, with_a, with_b, ref_a, ref_b, again;
    struct engine *e = open_engine(base_dir, 8);
    add_lora(e, "a", ad_dir);
    add_lora(e, "b", ad2_dir);
    assert_int_equal(engine_lora_count(e), 2);
    assert_string_equal(engine_lora_name(e, 0), "a");
    assert_string_equal(engine_lora_name(e, 1), "b");
    assert_int_equal(engine_lora_rank(e, 1), 16);
    assert_null(engine_lora_name(e, 2));
    run_one(e, ids, 30, NULL, 16, &base);
    run_one(e, ids, 30, "a", 16, &with_a);
    run_one(e, ids, 30, "b", 16, &with_b);
    run_one(e, ids, 30, "", 16, &again); /* "" is the base too */
    assert_bits(&again, &base);
    engine_free(e);
    e = open_engine(merged_dir, 8);
    run_one(e, ids, 30, NULL, 16, &ref_a);
    engine_free(e);
    e = open_engine(merged2_dir, 8);
    run_one(e, ids, 30, NULL, 16, &ref_b);
    engine_free(e);
    /* the merged model's tokens, and logprobs within the two paths' rounding */
    assert_memory_equal(with_a.tokens, ref_a.tokens, sizeof ref_a.tokens[0] * 16);
    assert_memory_equal(with_b.tokens, ref_b.tokens, sizeof ref_b.tokens[0] * 16);
    for (int i = 0; i < 16; i++) {
        assert_true(fabsf(with_a.logprobs[i] - ref_a.logprobs[i]) < 1e-3f);
        assert_true(fabsf(with_b.logprobs[i] - ref_b.logprobs[i]) < 1e-3f);
    }
    /* and not the base's */
    assert_true(memcmp(with_a.tokens, base.tokens, sizeof base.tokens[0] * 16) ||
                memcmp(with_a.logprobs, base.logprobs, sizeof base.logprobs[0] * 16));
    assert_true(memcmp(with_a.tokens, with_b.tokens, sizeof base.tokens[0] * 16));
}

/* An adapter that is part of the model (engine_options.model_lora: an
 * Ollama model's ADAPTER layer): every request without an adapter of its
 * own gets it, with the same bits as the adapter named per request; one
 * naming another adapter gets that one instead. */
static void test_model_adapter(void **state)
{
    (void)state;
    int32_t ids[30];
    prompt(ids, 30, 4);
    static struct result named, implied, other, other_ref;
    struct engine *e = open_engine(base_dir, 4);
    add_lora(e, "a", ad_gguf);
    add_lora(e, "b", ad2_dir);
    run_one(e, ids, 30, "a", 12, &named);
    run_one(e, ids, 30, "b", 12, &other_ref);
    engine_free(e);
    struct engine_options o;
    engine_options_default(&o);
    o.n_threads = 2;
    o.kv_blocks = 256;
    o.max_batch = 4;
    o.token_budget = 256;
    char path[1100];
    snprintf(path, sizeof path, "%s", ad_gguf);
    o.model_lora = path;
    struct rl_err err = {0};
    if (engine_create(&e, base_dir, &o, &err))
        fail_msg("engine_create: %s", err.msg);
    memset(path, 0, sizeof path); /* loaded at create: the string need not live on */
    assert_int_equal(engine_lora_count(e), 0); /* not an adapter clients name */
    run_one(e, ids, 30, NULL, 12, &implied);
    assert_bits(&implied, &named);
    add_lora(e, "b", ad2_dir);
    run_one(e, ids, 30, "b", 12, &other);
    assert_bits(&other, &other_ref);
    run_one(e, ids, 30, NULL, 12, &implied); /* its own domain: the prompt's blocks hit */
    assert_int_equal(implied.usage.cached_prompt_tokens, 16);
    engine_free(e);
    o.model_lora = tmpdir; /* no adapter there: engine_create says so */
    assert_true(engine_create(&e, base_dir, &o, &err) < 0);
    assert_non_null(strstr(err.msg, "the model's adapter"));
}

/* A row's bits do not depend on its neighbours: base rows beside adapter
 * rows (which switch the step's gate/up product to its unfused form) and
 * adapters beside other adapters, prefill and decode mixed. On the F32
 * model and on the BF16 copy, whose packed products fuse SwiGLU. */
static void check_batch_invariance(const char *dir, const char *ad1, const char *ad2)
{
    int32_t p1[40], p2[25], p3[33];
    prompt(p1, 40, 1);
    prompt(p2, 25, 2);
    prompt(p3, 33, 3);
    static struct result a1, b1, c1, a2, b2, c2, a3, b3;
    struct engine *e = open_engine(dir, 8);
    add_lora(e, "x", ad1);
    if (ad2)
        add_lora(e, "y", ad2);
    const char *y = ad2 ? "y" : "x";
    run_one(e, p1, 40, NULL, 12, &a1);
    run_one(e, p2, 25, "x", 12, &b1);
    run_one(e, p3, 33, y, 12, &c1);
    engine_free(e);
    e = open_engine(dir, 8); /* a cold cache: the prompts run again */
    add_lora(e, "x", ad1);
    if (ad2)
        add_lora(e, "y", ad2);
    submit(e, p1, 40, NULL, 12, &a2);
    submit(e, p2, 25, "x", 12, &b2);
    submit(e, p3, 33, y, 12, &c2);
    drain(e);
    assert_bits(&a1, &a2);
    assert_bits(&b1, &b2);
    assert_bits(&c1, &c2);
    /* the base request joins while the others decode */
    submit(e, p2, 25, "x", 12, &b3);
    drain(e);
    assert_bits(&b1, &b3);
    submit(e, p2, 25, "x", 12, &b3);
    step_once(e);
    submit(e, p1, 40, NULL, 12, &a3);
    drain(e);
    assert_bits(&a1, &a3);
    engine_free(e);
}

static void test_batch_invariance(void **state)
{
    (void)state;
    check_batch_invariance(base_dir, ad_dir, ad2_dir);
    check_batch_invariance(bf16_dir, bf16_ad_dir, NULL);
}

/* An adapter's KV is not the base's: no prefix-cache hit across them,
 * hits within each. */
static void test_prefix_cache_domains(void **state)
{
    (void)state;
    int32_t ids[48];
    prompt(ids, 48, 9);
    static struct result r;
    struct engine *e = open_engine(base_dir, 4);
    add_lora(e, "a", ad_dir);
    add_lora(e, "b", ad2_dir);
    run_one(e, ids, 48, NULL, 2, &r);
    assert_int_equal(r.usage.cached_prompt_tokens, 0);
    run_one(e, ids, 48, "a", 2, &r);
    assert_int_equal(r.usage.cached_prompt_tokens, 0);
    run_one(e, ids, 48, "b", 2, &r);
    assert_int_equal(r.usage.cached_prompt_tokens, 0);
    run_one(e, ids, 48, "a", 2, &r);
    assert_int_equal(r.usage.cached_prompt_tokens, 32); /* its own two full blocks */
    run_one(e, ids, 48, NULL, 2, &r);
    assert_int_equal(r.usage.cached_prompt_tokens, 32);
    engine_free(e);
    /* the domains are a function of the name and the tenant's salt */
    assert_int_equal(kv_salt_lora(77, NULL), 77);
    assert_int_equal(kv_salt_lora(77, ""), 77);
    assert_true(kv_salt_lora(0, "a") != 0);
    assert_true(kv_salt_lora(0, "a") != kv_salt_lora(0, "b"));
    assert_true(kv_salt_lora(0, "a") != kv_salt_lora(5, "a"));
    assert_true(kv_salt_lora(0, "a") == kv_salt_lora(0, "a"));
}

/* Dropping an adapter waits for its requests, frees its slot for its name
 * only, and a reload under the name serves the new weights without a
 * prefix-cache hit on the old ones' KV. */
static void test_drop_and_reload(void **state)
{
    (void)state;
    int32_t ids[48];
    prompt(ids, 48, 11);
    static struct result ra, r2, r, rb, rb2;
    struct engine *ref = open_engine(base_dir, 4);
    add_lora(ref, "a", ad_dir);
    add_lora(ref, "b", ad2_dir);
    run_one(ref, ids, 48, "a", 4, &ra);
    run_one(ref, ids, 48, "b", 4, &r2);
    engine_free(ref);

    struct engine *e = open_engine(base_dir, 4);
    struct rl_err err = {0};
    add_lora(e, "a", ad_dir);
    add_lora(e, "keep", ad2_dir);
    submit(e, ids, 48, "a", 6, &r);
    step_once(e);
    assert_int_equal(engine_lora_drop(e, "a", &err), -RL_EBUSY); /* it runs */
    assert_true(engine_lora_loaded(e, 0));
    drain(e);
    assert_int_equal(r.n_tokens, 6);
    run_one(e, ids, 48, "keep", 2, &rb); /* keep's blocks are cached now */
    assert_int_equal(engine_lora_drop(e, "a", &err), 0);
    assert_false(engine_lora_loaded(e, 0));
    assert_int_equal(engine_lora_count(e), 2); /* the index and name stay */
    assert_string_equal(engine_lora_name(e, 0), "a");
    assert_int_equal(engine_lora_rank(e, 0), 0);
    assert_int_equal(engine_lora_drop(e, "a", &err), -RL_ENOTFOUND);
    struct engine_request q;
    engine_request_init(&q);
    q.prompt_ids = ids;
    q.n_prompt = 48;
    q.lora = "a";
    assert_true(engine_submit(e, &q, NULL, &err) < 0); /* no longer served */
    assert_int_equal(err.code, EV_CODE_BAD_VALUE);
    /* back under its name with ad2's weights: ad2's answer, none of the
     * old KV (a hit would give a's tokens), and the same index */
    add_lora(e, "a", ad2_dir);
    assert_int_equal(engine_lora_count(e), 2);
    assert_true(engine_lora_loaded(e, 0));
    run_one(e, ids, 48, "a", 4, &r);
    assert_int_equal(r.usage.cached_prompt_tokens, 0);
    assert_memory_equal(r.tokens, r2.tokens, 4 * sizeof r.tokens[0]);
    /* and once more with a's own */
    assert_int_equal(engine_lora_drop(e, "a", &err), 0);
    add_lora(e, "a", ad_dir);
    run_one(e, ids, 48, "a", 4, &r);
    assert_int_equal(r.usage.cached_prompt_tokens, 0);
    assert_memory_equal(r.tokens, ra.tokens, 4 * sizeof r.tokens[0]);
    /* read elsewhere (any thread), installed here: the same adapter */
    struct lora_adapter *pre = NULL;
    assert_int_equal(lora_load(&pre, ad_dir, engine_model_config(e), &err), 0);
    assert_true(engine_lora_add_loaded(e, "keep", pre, &err) < 0); /* taken: still ours */
    assert_int_equal(engine_lora_add_loaded(e, "pre", pre, &err), 0); /* the engine's now */
    run_one(e, ids, 48, "pre", 4, &r);
    assert_memory_equal(r.tokens, ra.tokens, 4 * sizeof r.tokens[0]);
    /* the others were served throughout; their idle cache went too */
    run_one(e, ids, 48, "keep", 2, &rb2);
    assert_memory_equal(rb2.tokens, rb.tokens, 2 * sizeof rb.tokens[0]);
    engine_free(e);

    /* the cache's own part: idle cached blocks go, held ones stay */
    struct kv_cache *kv = NULL;
    assert_int_equal(kv_cache_create(&kv, 8, 4, &err), 0);
    struct kv_seq *s1 = NULL, *s2 = NULL;
    int32_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 1}, u[5] = {9, 9, 9, 9, 1};
    int c = -1;
    assert_int_equal(kv_seq_create(kv, &s1, &err), 0);
    assert_int_equal(kv_seq_create(kv, &s2, &err), 0);
    assert_int_equal(kv_seq_append(s1, t, 8, &err), 0);
    assert_int_equal(kv_seq_commit(s1, 8, &err), 0);
    assert_int_equal(kv_seq_append(s2, u, 4, &err), 0);
    assert_int_equal(kv_seq_commit(s2, 4, &err), 0);
    kv_seq_free(s1);
    kv_probe_prefix(kv, t, 9, &c);
    assert_int_equal(c, 8);
    assert_int_equal(kv_drop_evictable(kv), 2);
    kv_probe_prefix(kv, t, 9, &c);
    assert_int_equal(c, 0);
    kv_probe_prefix(kv, u, 5, &c);
    assert_int_equal(c, 4); /* s2 holds it */
    assert_int_equal(kv_free_blocks(kv), 7);
    assert_int_equal(kv_check(kv, &err), 0);
    kv_seq_free(s2);
    kv_cache_free(kv);
}

/* ---- refusals ---- */

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct rl_err err = {0};
    if (file_mkdir_p(dir, &err) || file_write_text(path, text, &err))
        fail_msg("%s", err.msg);
}

static void expect_load_error(const char *dir, const char *needle)
{
    struct model *m = NULL;
    struct lora_adapter *a = NULL;
    struct rl_err err = {0};
    assert_int_equal(model_load(&m, base_dir, &err), 0);
    int rc = lora_load(&a, dir, model_get_config(m), &err);
    if (rc >= 0)
        fail_msg("%s loaded; expected an error with \"%s\"", dir, needle);
    assert_null(a);
    if (!strstr(err.msg, needle))
        fail_msg("expected \"%s\" in: %s", needle, err.msg);
    model_free(m);
}

static void test_refusals(void **state)
{
    (void)state;
    char d[1200], path[1300];
    snprintf(d, sizeof d, "%s/nowhere", tmpdir);
    expect_load_error(d, "adapter_config.json");
    /* what cannot be served right is refused by name */
    const char *cfgs[][2] = {
        {"{\"peft_type\":\"LORA\",\"r\":8,\"lora_alpha\":16,\"use_dora\":true}", "use_dora"},
        {"{\"peft_type\":\"LORA\",\"r\":8,\"bias\":\"all\"}", "bias"},
        {"{\"peft_type\":\"LORA\",\"r\":8,\"alpha_pattern\":{\"q_proj\":4}}", "alpha_pattern"},
        {"{\"peft_type\":\"LORA\",\"r\":8,\"modules_to_save\":[\"lm_head\"]}", "modules_to_save"},
        {"{\"peft_type\":\"PREFIX_TUNING\",\"r\":8}", "peft_type"},
        {"{\"peft_type\":\"LORA\",\"r\":0}", "\"r\""},
        {"{\"peft_type\":\"LORA\",\"r\":8,\"lora_alpha\":-1}", "lora_alpha"},
        {"[1]", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        snprintf(d, sizeof d, "%s/bad%zu", tmpdir, i);
        assert_int_equal(tu_copy_dir(ad_dir, d), 0);
        write_file(d, "adapter_config.json", cfgs[i][0]);
        expect_load_error(d, cfgs[i][1]);
    }
    /* an adapter for another shape: the pair and the shape it must have */
    struct mk_opts mo;
    mk_opts_init(&mo);
    snprintf(d, sizeof d, "%s/other-base", tmpdir);
    mo.out_dir = d;
    mo.dtype = MK_F32;
    mo.hidden = 96;
    struct rl_err err = {0};
    assert_int_equal(mk_write(&mo, NULL, &err), 0);
    char od[1200];
    snprintf(od, sizeof od, "%s/other-ad", tmpdir);
    make_adapter(d, od, 0, 4, 0, 0, 1);
    expect_load_error(od, "lora_A must be (r, ");
    /* a tensor of something else (an embedding adapter) */
    snprintf(d, sizeof d, "%s/emb-ad", tmpdir);
    assert_int_equal(tu_copy_dir(ad_dir, d), 0);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", d);
    struct st_writer *w;
    assert_int_equal(st_writer_create(&w, &err), 0);
    float v[8] = {0};
    int64_t shape[2] = {2, 4};
    assert_int_equal(st_writer_add(w, "base_model.model.model.embed_tokens.lora_embedding_A", ST_F32,
                                   2, shape, v, &err), 0);
    assert_int_equal(st_writer_write(w, path, &err), 0);
    st_writer_free(w);
    expect_load_error(d, "embed_tokens.lora_embedding_A");
    /* half a pair */
    snprintf(d, sizeof d, "%s/half-ad", tmpdir);
    assert_int_equal(tu_copy_dir(ad_dir, d), 0);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", d);
    assert_int_equal(st_writer_create(&w, &err), 0);
    int64_t ashape[2] = {2, 128};
    float av[256] = {0};
    assert_int_equal(st_writer_add(w, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                                   ST_F32, 2, ashape, av, &err), 0);
    assert_int_equal(st_writer_write(w, path, &err), 0);
    st_writer_free(w);
    expect_load_error(d, "no lora_B");

    /* the engine's own checks */
    struct engine *e = open_engine(base_dir, 4);
    assert_true(engine_lora_add(e, "a b", ad_dir, &err) < 0);
    assert_non_null(strstr(err.msg, "[A-Za-z0-9._:/-]"));
    add_lora(e, "a", ad_dir);
    assert_true(engine_lora_add(e, "a", ad2_dir, &err) < 0);
    assert_non_null(strstr(err.msg, "already served"));
    assert_true(engine_lora_add(e, engine_served_name(e), ad2_dir, &err) < 0);
    assert_true(engine_lora_add(e, "c", od, &err) < 0);
    assert_non_null(strstr(err.msg, "adapter c"));
    assert_int_equal(engine_lora_count(e), 1);
    int32_t ids[8];
    prompt(ids, 8, 1);
    struct engine_request q;
    engine_request_init(&q);
    q.prompt_ids = ids;
    q.n_prompt = 8;
    q.lora = "zzz";
    assert_true(engine_submit(e, &q, NULL, &err) < 0);
    assert_int_equal(err.code, EV_CODE_BAD_VALUE);
    assert_non_null(strstr(err.msg, "zzz"));
    engine_free(e);
    /* a backend without adapters says so */
    struct engine_options o;
    engine_options_default(&o);
    o.backend = "sim";
    o.kv_blocks = 64;
    assert_int_equal(engine_create(&e, base_dir, &o, &err), 0);
    assert_true(engine_lora_add(e, "a", ad_dir, &err) < 0);
    assert_non_null(strstr(err.msg, "serves no LoRA adapters"));
    engine_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_served_equals_merged),
        cmocka_unit_test(test_gguf_adapter),
        cmocka_unit_test(test_engine_tokens),
        cmocka_unit_test(test_model_adapter),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_prefix_cache_domains),
        cmocka_unit_test(test_drop_and_reload),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
