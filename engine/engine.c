/* engine/engine.c - the facade: one engine_step() = schedule -> forward ->
 * sample -> events.
 *
 * Owns the model, the backend (weights, activations, KV pool memory), the
 * KV bookkeeping (kv_cache.h), the scheduler (sched.h), the tokenizer when
 * the model directory has one, and every live request. A request lives in
 * `reqs` from engine_submit() until the step after its final event: the
 * event of step N points into the request's buffers, so it can only be
 * freed at the start of step N+1.
 *
 * Per request, per sampled row: sample_next() (one RNG draw), then accept()
 * for the token: usage counters, the <think> state, stop token ids, the
 * incremental detokenizer, stop strings, limits; then, if the request is
 * inside <think> and over its thinking budget, the think-stop text's tokens
 * are accepted the same way (sample_observe, and the draw each would have
 * taken is skipped, so that draw n is always output token n's and a
 * resumed request knows where its stream stands) and all of
 * them go to the scheduler at once, to be computed as one chunk next step.
 * The decision to force depends only on the request's own history, so
 * forcing is as batch-invariant as sampling.
 *
 * Stop strings are matched on decoded text held back per channel
 * (reasoning or content): after each token, the longest tail of the held
 * text that is a prefix of some stop string stays held, everything before
 * it is emitted. A match finishes the request and drops the stop string
 * and whatever follows it. The <think> and </think> tags are tokens of
 * their own and never output text, but a stop string may contain them (as
 * in servers that match on the raw text, stop: ["</think>"] ends a request
 * with its reasoning): with stop strings, a tag's text goes into the held
 * text too, marked (tag_at, tag_len), so a match can span it; the marked
 * bytes are skipped on output, text before them goes to the channel before
 * the switch. One tag is held at a time: a second tag while one is still
 * held flushes the first.
 *
 * Speculation: after a request's rows are processed, if its next step is
 * a plain decode (one known token to compute), the draft source proposes
 * up to spec_adapt_want() tokens, capped so that they cannot pass
 * max_tokens or the context limit, and they go to the scheduler
 * (sched_seq_set_draft), which may shorten them to fit budget and blocks.
 * The step then hands back 1 + n_draft rows for the request; row r is
 * processed exactly like a plain row (process_row: one RNG draw, accept())
 * and the next row is looked at only while the sampled token equals draft
 * r, the request goes on, and nothing was forced. The accepted drafts'
 * KV is kept (sched_seq_resolve_draft), the rest rolled back. Since
 * process_row sees exactly the rows plain decoding would have computed
 * (the backend computes each row independently of the chunk it is in) in
 * the same order, the output is bit-identical; the bench and
 * test_engine's speculation tests check that.
 *
 * Constraints (engine.h's essay; constrain.h owns the cache and masks):
 * a constrained request holds a gram_match and a mask buffer. doc_started
 * says whether the matcher is live: from the start in NO_THINK mode, else
 * from the first </think> accepted (sampled or forced). Which mask a row
 * gets is decided from the request's state before the row is sampled:
 * the matcher's (filled by the helper thread during the forward pass, or
 * before it with grammar_inline_masks, or in process_row when neither
 * did), the open mask, or the think mask. Only sampled
 * tokens go into the matcher - forced think-stop text precedes the
 * document - and a matcher that is done (EOS accepted) finishes the
 * request also under ignore_eos.
 *
 * Threading: everything runs on the owner thread, except the constraint
 * masks of the next rows, which a helper fills during forward()
 * (constrain.h); the backend parallelises inside forward(). */
#include "engine.h"
#include "clock.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "chat.h"
#include "constrain.h"
#include "file.h"
#include "grammar/grammar.h"
#include "kv_cache.h"
#include "lora.h"
#include "model.h"
#include "modelref.h"
#include "sample.h"
#include "sched.h"
#include "sim/sim.h"
#include "tokenizer.h"
#include "text.h"

/* engine.h speaks plain values; these hold them equal to what they stand for */
_Static_assert(ENGINE_MAX_LOGPROBS == SAMPLE_MAX_LOGPROBS, "logprob limits");
_Static_assert((int)ENGINE_CONSTRAINT_JSON_OBJECT == (int)CONS_JSON_OBJECT &&
               (int)ENGINE_CONSTRAINT_JSON_SCHEMA == (int)CONS_JSON_SCHEMA &&
               (int)ENGINE_CONSTRAINT_GRAMMAR == (int)CONS_GRAMMAR &&
               (int)ENGINE_CONSTRAINT_TOOL_CALL == (int)CONS_TOOL_CALL, "constraint kinds");
_Static_assert((int)ENGINE_KV_AUTO == (int)BE_KV_AUTO && (int)ENGINE_KV_F32 == (int)BE_KV_F32 &&
               (int)ENGINE_KV_BF16 == (int)BE_KV_BF16, "kv dtypes");

/* The sampling defaults of one checkpoint: what its generation_config.json
 * gives (has_* set), the rest from Qwen3's card per mode (sampling_defaults). */
struct gen_defaults {
    bool has_temperature, has_top_p, has_top_k, has_min_p;
    float temperature, top_p, min_p;
    int top_k;
};

struct eng_req {
    uint64_t id;
    void *user;
    bool embed;                  /* engine_request.embed */
    int embed_dims;              /* its dimensions (0 = hidden size) */
    bool embed_raw;              /* not scaled to unit length */
    float *emb;                  /* (n_emb) the vector, once computed */
    int n_emb;
    int n_score;                 /* engine_request.n_score: a score request */
    int32_t score_ids[ENGINE_MAX_SCORE];
    float scores[ENGINE_MAX_SCORE]; /* filled at its row, which finishes it "stop" */
    struct sched_seq *seq;       /* NULL once finished */
    struct sample_state *ss;
    struct sample_params sp;
    int n_prompt;
    int max_tokens;              /* <= 0: none */
    int context_limit;           /* prompt + output at most */
    int max_think;               /* < 0: no budget */
    bool ignore_eos;
    int32_t *stop_ids;           /* (n_stop_ids) defaults + request's */
    int n_stop_ids;
    int min_tokens;              /* sp bans stop_ids while fewer came */
    int32_t *bias_ids;           /* (sp.n_bias) sp.bias_ids points here */
    float *bias;                 /* (sp.n_bias) sp.bias points here */
    char **stop;                 /* (n_stop) stop strings */
    int n_stop;
    bool in_think, forced;
    bool drop_tail;              /* a stop string matched: nothing after it */
    const char *stop_hit;        /* that string (one of stop), NULL before */
    struct engine_usage usage;
    struct tok_stream *ts;       /* NULL without a tokenizer */
    struct text hold;          /* text held back for stop matching */
    size_t tag_at, tag_len;      /* hold[tag_at, +tag_len) is a held think tag
                                    (never output); tag_len 0: none */

    /* this step's event */
    int32_t *ev_tok;             /* (cap_ev) */
    float *ev_lp;                /* (cap_ev) */
    struct engine_logprob *ev_top; /* (cap_ev, n_top) */
    int n_ev, cap_ev, n_top;
    struct text ev_reason, ev_content;

    /* speculation */
    bool spec;                   /* drafts for this request */
    struct spec_adapt adapt;
    int32_t draft[SPEC_MAX_TOKENS]; /* (n_draft) the proposal in flight */
    int n_draft;

    /* structured output (NULL gm: free text) */
    struct cons_job *cjob;       /* its constraint compiling (a compile
                                    thread): the request waits outside the
                                    scheduler until attach_compiled */
    int32_t *wait_ids;           /* (n_wait_ids) the prompt, for sched_add then */
    int n_wait_ids, n_resumed;
    bool think;                  /* ENGINE_MODE_THINK */
    int priority;
    double deadline;
    uint64_t cache_salt;         /* with the adapter's mixed in (kv_salt_lora) */
    int lora;                    /* be_seq.lora: 0 base, k = loras[k - 1] */
    int refused;                 /* engine_event.refused */
    struct gram_match *gm;       /* the document so far */
    uint32_t *mask;              /* (cons_mask_words) the matcher's next mask */
    bool mask_ready;             /* mask is that of gm's current state */
    bool doc_started;            /* the matcher is live (see the essay) */

    enum engine_finish finish;
    int err_code;
    char err_msg[RL_ERR_MSG_MAX];
    bool reported;               /* final event delivered: free next step */
};

struct engine {
    const char *kv_sizing;       /* engine_stats.kv_sizing */
    bool logits_pinned;          /* logits came from be->ops->host_alloc */
    int64_t rows_from_sets, rows_fetched; /* engine_stats */
    struct model *model;
    struct backend *be;
    struct kv_cache *kv;
    struct sched *sched;
    struct tokenizer *tok;       /* NULL: ids only */
    const struct model_config *cfg;
    struct engine_options opt;
    int block_size, n_blocks, max_context;
    struct gen_defaults gen;     /* from dir/generation_config.json */
    char served_name[256];
    struct eng_lora {            /* engine_lora_add; slot k is loras[k - 1] */
        char name[129];
        struct lora_adapter *a;  /* NULL once dropped (engine_lora_drop): the
                                    slot and its index keep the name */
    } loras[LORA_MAX_ADAPTERS];
    int n_loras;
    struct lora_adapter *model_lora; /* engine_options.model_lora, in the last slot */

    int32_t default_stop[4];     /* eos ids: <|im_end|>, <|endoftext|>, ... */
    int n_default_stop;
    int32_t think_open, think_close; /* -1 without a tokenizer */
    int32_t *force_ids;          /* (n_force) the think-stop text */
    int n_force;

    struct eng_req **reqs;       /* (cap_reqs) live, submission order */
    int n_reqs, cap_reqs;
    uint64_t next_id;

    float *logits;               /* (max_batch, vocab); the backend's host_alloc
                                    (page-locked) when it has one */
    uint8_t *wants;              /* (logits rows) enum be_row_want per row */
    const struct sample_cands *cands; /* the last forward's sets (backend-owned), or NULL */
    struct be_seq *bseqs;        /* (max_batch) */
    int32_t *btokens;            /* (token_budget) */
    struct engine_event *events; /* (cap_events) */
    int cap_events;

    int64_t n_steps, n_generated;
    int64_t spec_drafted, spec_accepted;

    struct cons *cons;           /* NULL without a tokenizer */
    struct gram_match **mask_m;  /* (max_batch) this step's helper batch */
    uint32_t **mask_out;         /* (max_batch) */
    const uint32_t **row_masks;  /* (logits rows) be_batch.masks */
};

double engine_now(void)
{
    return rl_mono_s();
}

void engine_options_default(struct engine_options *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "cpu";
    o->block_size = KV_DEFAULT_BLOCK_SIZE;
    o->max_batch = 16;
    o->token_budget = 512;
    o->kv_reserve_bytes = (size_t)1 << 30; /* as kv_reserve_mb's default */
}

void engine_request_init(struct engine_request *r)
{
    memset(r, 0, sizeof *r);
    r->mode = ENGINE_MODE_THINK;
    r->temperature = -1;
    r->top_p = -1;
    r->top_k = -1;
    r->min_p = -1;
    r->repetition_penalty = 1;
    r->n_logprobs = -1;
    r->max_thinking_tokens = -1;
}

const char *engine_finish_name(enum engine_finish f)
{
    switch (f) {
    case ENGINE_FINISH_STOP: return "stop";
    case ENGINE_FINISH_LENGTH: return "length";
    case ENGINE_FINISH_CANCELLED: return "cancelled";
    case ENGINE_FINISH_DEADLINE: return "deadline";
    case ENGINE_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

static void add_default_stop(struct engine *e, int32_t id)
{
    if (id < 0 || id >= e->cfg->vocab)
        return;
    for (int i = 0; i < e->n_default_stop; i++)
        if (e->default_stop[i] == id)
            return;
    if (e->n_default_stop < 4)
        e->default_stop[e->n_default_stop++] = id;
}

static int32_t tok_id(const struct tokenizer *t, const char *s)
{
    return t ? tok_find(t, s, strlen(s)) : -1;
}

/* One number of generation_config.json within [lo, hi]; absent or null
 * leaves *has false. */
static int gen_number(const cJSON *root, const char *path, const char *name, double lo,
                      double hi, bool *has, double *out, struct rl_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    *has = false;
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return rl_errf(err, RL_EFORMAT, "%s: %s must be a number in [%g, %g]", path, name, lo,
                       hi);
    *has = true;
    *out = v->valuedouble;
    return 0;
}

/* Reads the sampling defaults of dir/generation_config.json, when there is
 * one: temperature, top_p, top_k, min_p (other keys, do_sample included,
 * are not sampling defaults of ours and are ignored). */
static int load_gen_defaults(const char *dir, struct gen_defaults *g, struct rl_err *err)
{
    memset(g, 0, sizeof *g);
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    cJSON *root;
    int rc = file_read_json(path, 65535, &root, err);
    if (rc)
        return rc == -RL_ENOTFOUND ? 0 : rc; /* none: no defaults of the model's */
    double t = 0, p = 0, k = 0, m = 0;
    rc = gen_number(root, path, "temperature", 0, 2, &g->has_temperature, &t, err);
    if (!rc)
        rc = gen_number(root, path, "top_p", 1e-9, 1, &g->has_top_p, &p, err);
    if (!rc)
        rc = gen_number(root, path, "top_k", 0, 1000000, &g->has_top_k, &k, err);
    if (!rc)
        rc = gen_number(root, path, "min_p", 0, 1, &g->has_min_p, &m, err);
    cJSON_Delete(root);
    if (!rc && g->has_top_k && k != floor(k))
        rc = rl_errf(err, RL_EFORMAT, "%s: top_k must be an integer", path);
    g->temperature = (float)t;
    g->top_p = (float)p;
    g->top_k = (int)k;
    g->min_p = (float)m;
    return rc;
}

/* The served name when none is given: the directory's last component. */
static void default_served_name(const char *dir, char *out, size_t size)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    snprintf(out, size, "%.*s", (int)(n - b), dir + b);
}

static int lora_into_slot(struct engine *e, int slot, const char *path, struct lora_adapter **out,
                          struct rl_err *err);

int engine_create(struct engine **out, const char *dir,
                  const struct engine_options *o, struct rl_err *err)
{
    *out = NULL;
    struct engine_options opt;
    if (o)
        opt = *o;
    else
        engine_options_default(&opt);
    if (!opt.backend)
        opt.backend = "cpu";
    if (opt.block_size <= 0)
        opt.block_size = KV_DEFAULT_BLOCK_SIZE;
    if (opt.max_batch <= 0)
        opt.max_batch = 16;
    if (opt.token_budget <= 0)
        opt.token_budget = 512;
    if (opt.token_budget < opt.max_batch)
        return rl_errf(err, RL_EINVAL,
                       "engine: token_budget %d is below max_batch %d (every running "
                       "sequence needs a token per step)", opt.token_budget, opt.max_batch);
    if (opt.prefill_chunk <= 0 || opt.prefill_chunk > opt.token_budget)
        opt.prefill_chunk = opt.token_budget;
    if (opt.kv_blocks < 0 || opt.max_context < 0)
        return rl_errf(err, RL_EINVAL, "engine: negative kv_blocks or max_context");
    if (opt.spec_tokens == 0)
        opt.spec_tokens = SPEC_DEFAULT_TOKENS;
    if (opt.spec_tokens < 0 || opt.spec_tokens > SPEC_MAX_TOKENS)
        return rl_errf(err, RL_EINVAL, "engine: spec_tokens %d is outside 1..%d",
                       opt.spec_tokens, SPEC_MAX_TOKENS);
    if (opt.speculative != SPEC_OFF && opt.speculative != SPEC_NGRAM)
        return rl_errf(err, RL_EINVAL, "engine: unknown speculative mode %d",
                       (int)opt.speculative);
    if (opt.spec_max_rows < 0)
        return rl_errf(err, RL_EINVAL, "engine: negative spec_max_rows");
    if (!opt.spec_max_rows) /* where a step stops being memory-bound (BENCHMARKS.md) */
        opt.spec_max_rows = strcmp(opt.backend, "cpu") ? 64 : 8; /* sim models a GPU */

    struct engine *e = calloc(1, sizeof *e);
    if (!e)
        return rl_errf(err, RL_ENOMEM, "engine: out of memory");
    e->opt = opt;
    e->next_id = 1;
    e->think_open = e->think_close = -1;
    if (opt.served_name && opt.served_name[0])
        snprintf(e->served_name, sizeof e->served_name, "%s", opt.served_name);
    else
        default_served_name(dir, e->served_name, sizeof e->served_name);
    e->opt.served_name = NULL; /* the copy above is what lives on */
    int rc = load_gen_defaults(dir, &e->gen, err);
    if (rc)
        goto fail;
    /* the sim backend models a device and reads no weight (engine/sim/) */
    rc = !strcmp(opt.backend, "sim") ? sim_model_load(&e->model, dir, opt.sim_model, err)
                                     : model_load(&e->model, dir, err);
    if (rc)
        goto fail;
    e->cfg = model_get_config(e->model);
    /* every backend option the engine was given reaches the backend */
    struct be_options bo = {.n_threads = opt.n_threads, .isa = opt.isa,
                            .kv_dtype = (enum be_kv_dtype)opt.kv_dtype,
                            .device = opt.device, .mmap_weights = opt.mmap_weights,
                            .quantize = opt.quantize,
                            .kv_prefault = opt.kv_prefault, .progress = opt.progress,
                            .progress_user = opt.progress_user,
                            .progress_every = opt.progress_every,
                            .sim_profile = opt.sim_profile,
                            .kv_reserve_bytes = opt.kv_reserve_bytes};
    if ((rc = be_create(&e->be, opt.backend, &bo, err)))
        goto fail;
    if ((rc = e->be->ops->load(e->be->ctx, e->cfg, model_get_weights(e->model),
                               opt.token_budget, err)))
        goto fail;
    e->block_size = opt.block_size;
    e->n_blocks = opt.kv_blocks;
    e->kv_sizing = "kv_blocks";
    if (!e->n_blocks) {
        size_t cap = e->be->ops->kv_capacity ? e->be->ops->kv_capacity(e->be->ctx) : 0;
        size_t bytes = opt.kv_bytes ? opt.kv_bytes : cap ? cap : (size_t)1 << 30;
        e->kv_sizing = opt.kv_bytes ? "budget" : cap ? "device" : "default";
        size_t per = e->be->ops->kv_block_bytes(e->be->ctx, e->block_size);
        size_t nb = per ? bytes / per : 0;
        e->n_blocks = nb > (1u << 30) ? (1 << 30) : (int)nb;
        if (e->n_blocks < 1) {
            rc = rl_errf(err, RL_EINVAL,
                         "engine: a KV budget of %zu bytes holds no block of %zu bytes",
                         bytes, per);
            goto fail;
        }
    }
    if ((rc = e->be->ops->kv_init(e->be->ctx, e->n_blocks, e->block_size, err)))
        goto fail;
    if (opt.model_lora && opt.model_lora[0]) {
        if (!e->be->ops->lora_set) {
            rc = rl_errf(err, RL_EUNSUPPORTED, "model adapter %s: the %s backend serves no LoRA adapters",
                         opt.model_lora, e->be->ops->name);
            goto fail;
        }
        if ((rc = lora_into_slot(e, LORA_MAX_ADAPTERS, opt.model_lora, &e->model_lora, err))) {
            rl_err_wrap(err, "the model's adapter %s", opt.model_lora);
            goto fail;
        }
    }
    e->opt.model_lora = NULL; /* loaded: the caller's string need not live on */
    if ((rc = kv_cache_create(&e->kv, e->n_blocks, e->block_size, err)))
        goto fail;
    struct sched_options so = {opt.max_batch, opt.token_budget, opt.prefill_chunk,
                               opt.spec_max_rows};
    if ((rc = sched_create(&e->sched, e->kv, &so, err)))
        goto fail;
    long ctx = e->cfg->max_pos > 0 ? e->cfg->max_pos : (1 << 30);
    if (opt.max_context && opt.max_context < ctx)
        ctx = opt.max_context;
    /* a sequence alone must always fit the pool, or preemption could never
     * make room for it */
    if ((long)e->n_blocks * e->block_size < ctx)
        ctx = (long)e->n_blocks * e->block_size;
    e->max_context = (int)ctx;

    /* dir/tokenizer.json, or a GGUF model's own metadata */
    if (tok_available(dir) && (rc = tok_load(&e->tok, dir, err))) {
        rl_err_wrap(err, "engine: %s", dir);
        goto fail;
    }
    add_default_stop(e, tok_id(e->tok, "<|im_end|>"));
    add_default_stop(e, tok_id(e->tok, "<|endoftext|>"));
    if (e->tok)
        add_default_stop(e, tok_eos_id(e->tok));
    add_default_stop(e, e->cfg->eos_id);
    e->think_open = tok_id(e->tok, "<think>");
    e->think_close = tok_id(e->tok, "</think>");
    if (e->tok) {
        const char *txt = opt.think_stop_text ? opt.think_stop_text : ENGINE_THINK_STOP_TEXT;
        struct tok_ids ids = {0};
        if ((rc = tok_encode(e->tok, txt, strlen(txt), TOK_ENCODE_NO_SPECIAL, &ids, err)))
            goto fail;
        e->force_ids = ids.ids;
        e->n_force = (int)ids.n;
    }

    /* rows of logits one step can ask for: one per sequence, plus the
     * draft rows when speculating (all within the token budget) */
    long rows = opt.max_batch;
    if (opt.speculative != SPEC_OFF) {
        rows = (long)opt.max_batch * (1 + opt.spec_tokens);
        if (rows > opt.token_budget)
            rows = opt.token_budget;
    }
    if (e->tok && (rc = cons_create(&e->cons, e->tok, e->cfg->vocab, e->default_stop,
                                    e->n_default_stop, e->think_open, e->think_close,
                                    opt.grammar_cache, opt.grammar_cache_bytes,
                                    opt.grammar_compile_threads, err)))
        goto fail;
    if (e->cons)
        cons_set_compile_hook(e->cons, opt.grammar_compile_hook, opt.grammar_compile_user);
    e->mask_m = calloc((size_t)opt.max_batch, sizeof *e->mask_m);
    e->mask_out = calloc((size_t)opt.max_batch, sizeof *e->mask_out);
    e->row_masks = calloc((size_t)rows, sizeof *e->row_masks);
    {
        size_t lb = (size_t)rows * (size_t)e->cfg->vocab * sizeof(float);
        e->logits = e->be->ops->host_alloc ? e->be->ops->host_alloc(e->be->ctx, lb) : NULL;
        if (!e->logits) /* none, or the driver refused page-locked memory: pageable */
            e->logits = malloc(lb);
        else
            e->logits_pinned = true;
    }
    e->wants = calloc((size_t)rows, 1);
    e->bseqs = calloc((size_t)opt.max_batch, sizeof *e->bseqs);
    e->btokens = malloc((size_t)opt.token_budget * sizeof *e->btokens);
    if (!e->logits || !e->wants || !e->bseqs || !e->btokens || !e->mask_m || !e->mask_out || !e->row_masks) {
        rc = rl_errf(err, RL_ENOMEM, "engine: out of memory for step buffers");
        goto fail;
    }
    *out = e;
    return 0;
fail:
    engine_free(e);
    return rc;
}

static void req_free(struct eng_req *r)
{
    if (!r)
        return;
    sample_state_free(r->ss);
    tok_stream_free(r->ts);
    free(r->emb);
    free(r->wait_ids);
    gram_match_free(r->gm);
    free(r->mask);
    free(r->stop_ids);
    free(r->bias_ids);
    free(r->bias);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->hold.p);
    free(r->ev_tok);
    free(r->ev_lp);
    free(r->ev_top);
    free(r->ev_reason.p);
    free(r->ev_content.p);
    free(r);
}

void engine_free(struct engine *e)
{
    if (!e)
        return;
    if (e->cons)
        cons_masks_join(e->cons);
    for (int i = 0; i < e->n_reqs; i++) {
        cons_job_release(e->cons, e->reqs[i]->cjob);
        req_free(e->reqs[i]);
    }
    free(e->reqs);
    cons_free(e->cons); /* after the requests' matchers */
    free(e->mask_m);
    free(e->mask_out);
    free(e->row_masks);
    sched_free(e->sched); /* before the kv_cache: it frees its kv_seqs */
    kv_cache_free(e->kv);
    if (e->tok)
        tok_free(e->tok);
    free(e->force_ids);
    if (e->logits_pinned) /* the backend's memory: before the backend goes */
        e->be->ops->host_free(e->be->ctx, e->logits);
    else
        free(e->logits);
    free(e->wants);
    be_free(e->be);
    for (int i = 0; i < e->n_loras; i++) /* after the backend that read them */
        lora_free(e->loras[i].a);
    lora_free(e->model_lora);
    model_free(e->model);
    free(e->bseqs);
    free(e->btokens);
    free(e->events);
    free(e);
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A refusal: err->code is the protocol code (engine.h, engine_check). */
static int refuse(struct rl_err *err, enum ev_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(struct rl_err *err, enum ev_code code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = (int)code;
    }
    return -(int)code;
}

/* A failure below (err filled with an rl_code) as the protocol code. */
static int recode(struct rl_err *err, enum ev_code code)
{
    if (err)
        err->code = (int)code;
    return -(int)code;
}

/* The one owner of sampling defaults (the rule is engine.h's): what the
 * request gives, else generation_config.json, else Qwen3's card per mode. */
static void sampling_defaults(const struct engine *e, const struct engine_request *r,
                              struct sample_params *sp)
{
    const struct gen_defaults *g = &e->gen;
    bool think = r->mode != ENGINE_MODE_NO_THINK;
    sample_params_default(sp);
    sp->temperature = r->temperature >= 0 ? r->temperature
                      : g->has_temperature ? g->temperature
                      : think              ? 0.6f
                                           : 0.7f;
    sp->top_p = r->top_p > 0 ? r->top_p : g->has_top_p ? g->top_p : think ? 0.95f : 0.8f;
    sp->top_k = r->top_k >= 0 ? r->top_k : g->has_top_k ? g->top_k : 20;
    sp->min_p = r->min_p >= 0 ? r->min_p : g->has_min_p ? g->min_p : 0.0f;
    sp->presence_penalty = r->presence_penalty;
    sp->frequency_penalty = r->frequency_penalty;
    sp->repetition_penalty = r->repetition_penalty > 0 ? r->repetition_penalty : 1.0f;
    sp->logprobs = r->n_logprobs >= 0;
    sp->n_logprobs = r->n_logprobs > 0 ? r->n_logprobs : 0;
}

/* The tokens r's sequence may hold at most, prompt and output. */
static int request_limit(const struct engine *e, const struct engine_request *r)
{
    return r->context_limit > 0 && r->context_limit < e->max_context ? r->context_limit
                                                                     : e->max_context;
}

int engine_lora_index(const struct engine *e, const char *name)
{
    for (int i = 0; i < e->n_loras; i++)
        if (!strcmp(e->loras[i].name, name))
            return i;
    return -1;
}

/* The be_seq.lora slot of adapter `name`, -1 when none is loaded so. */
static int lora_slot(const struct engine *e, const char *name)
{
    int i = engine_lora_index(e, name);
    return i >= 0 && e->loras[i].a ? i + 1 : -1;
}

/* Every check of a request whose prompt is the n_prompt ids at prompt;
 * fills *sp (seed aside) and *limit. Nothing of the engine changes. */
static int check_request(const struct engine *e, const struct engine_request *r,
                         const int32_t *prompt, int n_prompt, struct sample_params *sp,
                         int *limit, struct rl_err *err)
{
    if (n_prompt < 1)
        return refuse(err, EV_CODE_MISSING_PROMPT, "the request has no prompt tokens");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->cfg->vocab)
            return refuse(err, EV_CODE_INVALID_TOKEN,
                          "prompt_ids[%d]: %d is outside the vocabulary [0, %d)", i,
                          (int)prompt[i], (int)e->cfg->vocab);
    /* the one context check: the prompt and every token asked for (at
     * least one; a one-pass request asks for none, and its prompt leaves room
     * for one as any prompt does: the scheduler's rule) must fit */
    *limit = request_limit(e, r);
    bool one_pass = r->embed || r->n_score > 0; /* no token asked for */
    int64_t need = (int64_t)n_prompt + (!one_pass && r->max_tokens > 0 ? r->max_tokens : 1);
    if (need > *limit) {
        if (r->max_tokens > 0)
            return refuse(err, EV_CODE_PROMPT_TOO_LONG,
                          "prompt has %d tokens and max_tokens is %d; the context is %d",
                          n_prompt, r->max_tokens, *limit);
        return refuse(err, EV_CODE_PROMPT_TOO_LONG,
                      "prompt has %d tokens; the context is %d", n_prompt, *limit);
    }
    if (r->lora && r->lora[0] && lora_slot(e, r->lora) < 0)
        return refuse(err, EV_CODE_BAD_VALUE, "adapter \"%.128s\" is not loaded here", r->lora);
    if (!r->embed && e->cfg->embed_only)
        return refuse(err, EV_CODE_BAD_PARAM,
                      "this model is an embedding checkpoint (no lm_head.weight): it serves "
                      "task embed only");
    if (r->n_score < 0 || r->n_score > ENGINE_MAX_SCORE || (r->n_score && !r->score_ids) ||
        (r->n_score && r->embed))
        return refuse(err, EV_CODE_BAD_PARAM,
                      "score: 1 to %d token ids, not with an embedding", ENGINE_MAX_SCORE);
    if (one_pass && (r->constraint != ENGINE_CONSTRAINT_NONE || r->n_resumed))
        return refuse(err, EV_CODE_BAD_PARAM, "%s: takes no constraint and no resumption",
                      r->embed ? "task embed" : "score");
    for (int i = 0; i < r->n_score; i++)
        if (r->score_ids[i] < 0 || r->score_ids[i] >= e->cfg->vocab)
            return refuse(err, EV_CODE_INVALID_TOKEN,
                          "score id %d is outside the vocabulary [0, %d)", (int)r->score_ids[i],
                          (int)e->cfg->vocab);
    if (r->embed) {
        if (!e->be->ops->hidden)
            return refuse(err, EV_CODE_BAD_PARAM,
                          "task embed: the %s backend cannot compute embeddings",
                          e->be->ops->name);
        if (r->embed_dims < 0 || r->embed_dims > e->cfg->hidden)
            return refuse(err, EV_CODE_BAD_VALUE,
                          "dimensions: %d is more than the model's %d", r->embed_dims,
                          e->cfg->hidden);
    }
    if (r->n_resumed < 0 || r->n_resumed >= n_prompt || (r->n_resumed && !r->prompt_ids))
        return refuse(err, EV_CODE_BAD_VALUE,
                      "n_resumed: %d must be in [0, %d) and needs prompt_ids", r->n_resumed,
                      n_prompt);
    if (r->n_logprobs > SAMPLE_MAX_LOGPROBS)
        return refuse(err, EV_CODE_OUT_OF_RANGE, "logprobs: %d is above %d", r->n_logprobs,
                      SAMPLE_MAX_LOGPROBS);
    if (r->n_stop < 0 || r->n_stop_ids < 0 || (r->n_stop && !r->stop) ||
        (r->n_stop_ids && !r->stop_ids))
        return refuse(err, EV_CODE_BAD_VALUE, "stop: a malformed stop list");
    if (r->n_stop && !e->tok)
        return refuse(err, EV_CODE_BAD_VALUE,
                      "stop: stop strings need a tokenizer.json in the model directory");
    if (r->max_thinking_tokens >= 0 && !e->tok)
        return refuse(err, EV_CODE_BAD_VALUE,
                      "max_thinking_tokens: a thinking budget needs a tokenizer.json");
    for (int i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || !r->stop[i][0])
            return refuse(err, EV_CODE_OUT_OF_RANGE, "stop[%d]: an empty stop string", i);
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= e->cfg->vocab)
            return refuse(err, EV_CODE_INVALID_TOKEN,
                          "stop id %d is outside the vocabulary [0, %d)", (int)r->stop_ids[i],
                          (int)e->cfg->vocab);
    if (r->min_tokens < 0 || r->n_bias < 0 || (r->n_bias && (!r->bias_ids || !r->bias)))
        return refuse(err, EV_CODE_BAD_VALUE, "min_tokens / logit_bias: malformed");
    for (int i = 0; i < r->n_bias; i++) {
        if (r->bias_ids[i] < 0 || r->bias_ids[i] >= e->cfg->vocab)
            return refuse(err, EV_CODE_INVALID_TOKEN,
                          "logit_bias: token %d is outside the vocabulary [0, %d)",
                          (int)r->bias_ids[i], (int)e->cfg->vocab);
        if (!(r->bias[i] >= -100 && r->bias[i] <= 100))
            return refuse(err, EV_CODE_OUT_OF_RANGE, "logit_bias: %g is outside [-100, 100]",
                          (double)r->bias[i]);
    }
    sampling_defaults(e, r, sp);
    if (sample_params_check(sp, err))
        return recode(err, EV_CODE_OUT_OF_RANGE);
    return 0;
}

static int req_constrain(struct engine *e, struct eng_req *q, struct gram *g,
                         const int32_t *prompt, int n_prompt, struct rl_err *err);

/* Fills a new eng_req for a checked request; nothing of the engine
 * changes. g: its compiled constraint, or NULL (none, or still compiling:
 * req_constrain then). */
static int req_build(struct engine *e, const struct engine_request *r, uint64_t id,
                     const int32_t *prompt, int n_prompt, const struct sample_params *checked,
                     int limit, struct gram *g, struct eng_req **out, struct rl_err *err)
{
    bool constrained = r->constraint != ENGINE_CONSTRAINT_NONE;
    *out = NULL;
    struct sample_params sp = *checked;
    sp.seed = r->has_seed ? r->seed : splitmix64(id);
    int rc;
    struct eng_req *q = calloc(1, sizeof *q);
    if (!q)
        return refuse(err, EV_CODE_ENGINE_ERROR, "engine: out of memory");
    q->id = id;
    q->user = r->user;
    q->sp = sp;
    q->n_prompt = n_prompt;
    q->max_tokens = r->max_tokens;
    q->context_limit = limit;
    q->max_think = r->max_thinking_tokens;
    q->ignore_eos = r->ignore_eos;
    q->n_top = sp.logprobs ? sp.n_logprobs : 0;
    int n_ids = r->n_stop_ids + (r->ignore_eos ? 0 : e->n_default_stop);
    q->stop_ids = malloc(((size_t)n_ids + 1) * sizeof *q->stop_ids);
    q->stop = calloc((size_t)r->n_stop + 1, sizeof *q->stop);
    if (!q->stop_ids || !q->stop)
        goto oom;
    if (!r->ignore_eos)
        for (int i = 0; i < e->n_default_stop; i++)
            q->stop_ids[q->n_stop_ids++] = e->default_stop[i];
    for (int i = 0; i < r->n_stop_ids; i++)
        q->stop_ids[q->n_stop_ids++] = r->stop_ids[i];
    for (int i = 0; i < r->n_stop; i++) {
        if (!(q->stop[i] = strdup(r->stop[i])))
            goto oom;
        q->n_stop++;
    }
    if (r->n_bias) {
        q->bias_ids = malloc((size_t)r->n_bias * sizeof *q->bias_ids);
        q->bias = malloc((size_t)r->n_bias * sizeof *q->bias);
        if (!q->bias_ids || !q->bias)
            goto oom;
        memcpy(q->bias_ids, r->bias_ids, (size_t)r->n_bias * sizeof *q->bias_ids);
        memcpy(q->bias, r->bias, (size_t)r->n_bias * sizeof *q->bias);
    }
    q->sp.bias_ids = q->bias_ids;
    q->sp.bias = q->bias;
    q->sp.n_bias = r->n_bias;
    /* min_tokens: the stop ids are banned until enough tokens came (accept
     * lifts it); a constraint's grammar decides where its document ends,
     * so there it does not apply (engine.h). A resumed request's earlier
     * output counts: the caller shrinks min_tokens as it does max_tokens */
    q->min_tokens = constrained ? 0 : r->min_tokens;
    q->sp.ban_ids = q->min_tokens > 0 ? q->stop_ids : NULL;
    q->sp.n_ban = q->min_tokens > 0 ? q->n_stop_ids : 0;
    /* a prompt whose last think tag is <think> (thinking templates that open
     * it themselves) starts the output inside the reasoning */
    for (int i = n_prompt - 1; i >= 0 && e->think_open >= 0; i--) {
        if (prompt[i] == e->think_close)
            break;
        if (prompt[i] == e->think_open) {
            q->in_think = true;
            break;
        }
    }
    q->think = r->mode == ENGINE_MODE_THINK;
    q->n_resumed = r->n_resumed;
    if (r->embed || r->n_score) { /* no token will be sampled or decoded */
        q->embed = r->embed;
        q->embed_dims = r->embed_dims > 0 ? r->embed_dims : e->cfg->hidden;
        q->embed_raw = r->embed_raw;
        q->n_score = r->n_score;
        if (r->n_score)
            memcpy(q->score_ids, r->score_ids, (size_t)r->n_score * sizeof *q->score_ids);
        *out = q;
        return 0;
    }
    if (g && (rc = req_constrain(e, q, g, prompt, n_prompt, err))) {
        req_free(q);
        return rc;
    }
    /* a constrained request decodes plainly (engine.h) */
    q->spec = e->opt.speculative != SPEC_OFF && !r->no_speculative && !constrained;
    spec_adapt_init(&q->adapt, q->spec ? e->opt.spec_tokens : 0);
    /* a resumed request: the earlier output counts as output for the
     * penalties, and its draws are spent, so draw n stays output token n */
    int n_real = n_prompt - r->n_resumed;
    if ((rc = sample_state_create(&q->ss, sp.seed, prompt, n_real, err)))
        goto fail;
    for (int i = n_real; i < n_prompt; i++)
        if ((rc = sample_observe(q->ss, prompt[i], err)))
            goto fail;
    sample_skip(q->ss, r->n_resumed);
    if (e->tok && (rc = tok_stream_create(&q->ts, e->tok, r->keep_special ? 0u
                                                           : TOK_DECODE_SKIP_SPECIAL, err)))
        goto fail;
    *out = q;
    return 0;
oom:
    req_free(q);
    return refuse(err, EV_CODE_ENGINE_ERROR, "engine: out of memory");
fail:
    req_free(q);
    rl_err_wrap(err, "engine");
    return recode(err, EV_CODE_ENGINE_ERROR);
}

/* Gives q its matcher over g. A resumed request's output so far goes into
 * the matcher, the reasoning skipped; tokens the matcher refuses between
 * </think> and the document's first token are the think-stop text's
 * forced tail, which precedes the document. Refusal: BAD_VALUE (output
 * that does not continue the document). */
static int req_constrain(struct engine *e, struct eng_req *q, struct gram *g,
                         const int32_t *prompt, int n_prompt, struct rl_err *err)
{
    int rc = gram_match_create(&q->gm, g, err);
    if (rc) {
        rl_err_wrap(err, "engine");
        return recode(err, EV_CODE_ENGINE_ERROR);
    }
    if (!(q->mask = malloc((size_t)cons_mask_words(e->cons) * sizeof *q->mask)))
        return refuse(err, EV_CODE_ENGINE_ERROR, "engine: out of memory");
    q->doc_started = !(q->think && e->think_close >= 0);
    bool in_doc = false;
    for (int i = n_prompt - q->n_resumed; i < n_prompt; i++) {
        if (!q->doc_started) {
            q->doc_started = prompt[i] == e->think_close;
            continue;
        }
        struct rl_err me = {0};
        if (gram_match_accept(q->gm, prompt[i], &me) == 0)
            in_doc = true;
        else if (in_doc)
            return refuse(err, EV_CODE_BAD_VALUE, "n_resumed: output token %d (id %d) does "
                          "not continue the constraint's document", i - (n_prompt - q->n_resumed),
                          (int)prompt[i]);
    }
    return 0;
}

/* An embedding whose prompt is longer than the context and whose sender
 * asked for truncation (Ollama's /api/embed does by default): the first
 * tokens that fit, and the last one, the pooled token (<|endoftext|> for
 * text), so the vector still comes from where the model was taught to
 * sum a text up. */
static int embed_cut(const struct engine *e, const struct engine_request *r, const int32_t **ids,
                     int *n, int32_t **rendered, struct rl_err *err)
{
    int limit = request_limit(e, r);
    if (*n + 1 <= limit || limit < 3)
        return 0; /* fits, or nothing sensible to keep: the usual check says */
    int keep = limit - 1;
    int32_t *v = malloc((size_t)keep * sizeof *v);
    if (!v)
        return refuse(err, EV_CODE_ENGINE_ERROR, "engine: out of memory");
    memcpy(v, *ids, (size_t)(keep - 1) * sizeof *v);
    v[keep - 1] = (*ids)[*n - 1];
    *ids = *rendered = v;
    *n = keep;
    return 0;
}

/* The prompt of r as ids: r->prompt_ids (cut when an embedding asks for
 * it), or the messages rendered with the template and tokenized into
 * *rendered (malloc'd, caller frees). */
static int request_prompt(struct engine *e, const struct engine_request *r,
                          const int32_t **ids, int *n, int32_t **rendered, struct rl_err *err)
{
    *rendered = NULL;
    *ids = r->prompt_ids;
    *n = r->n_prompt;
    if (r->prompt_ids && r->embed && r->embed_truncate)
        return embed_cut(e, r, ids, n, rendered, err);
    if (r->prompt_ids)
        return 0;
    if (!r->messages)
        return refuse(err, EV_CODE_MISSING_PROMPT, "neither prompt_ids nor messages");
    if (!e->tok)
        return refuse(err, EV_CODE_BAD_VALUE,
                      "messages: chat messages need a tokenizer.json in the model directory");
    struct chat_template_opts co = {
        .add_generation_prompt = true,
        .disable_thinking = r->mode == ENGINE_MODE_NO_THINK,
    };
    struct tok_ids v = {0};
    int rc = chat_tokenize(e->tok, r->messages, r->tools, &co, &v, err);
    if (rc) {
        tok_ids_free(&v);
        return recode(err, rc == -RL_EINVAL ? EV_CODE_TEMPLATE_ERROR : EV_CODE_ENGINE_ERROR);
    }
    if (v.n > (size_t)INT32_MAX / 2) {
        tok_ids_free(&v);
        return refuse(err, EV_CODE_PROMPT_TOO_LONG, "the rendered prompt is too long");
    }
    *ids = *rendered = v.ids;
    *n = (int)v.n;
    return 0;
}

/* What r's constraint compiles from: *src and *len, the tools array printed
 * into *printed (caller frees) when it must be. Refusals: BAD_PARAM,
 * BAD_VALUE. *kind CONS_NONE: no constraint. */
static int constraint_text(struct engine *e, const struct engine_request *r,
                           enum cons_kind *kind, const char **src, size_t *len, char **printed,
                           struct rl_err *err)
{
    *kind = CONS_NONE;
    *src = NULL;
    *len = 0;
    *printed = NULL;
    if (r->constraint == ENGINE_CONSTRAINT_NONE)
        return 0;
    if ((int)r->constraint < 0 || r->constraint > ENGINE_CONSTRAINT_TOOL_CALL)
        return refuse(err, EV_CODE_BAD_VALUE, "constraint: no kind %d", (int)r->constraint);
    if (!e->cons)
        return refuse(err, EV_CODE_BAD_VALUE,
                      "structured output needs a tokenizer.json in the model directory");
    *src = r->constraint_src;
    *len = r->constraint_len;
    if (r->constraint == ENGINE_CONSTRAINT_TOOL_CALL && !*src) {
        if (!r->tools)
            return refuse(err, EV_CODE_BAD_PARAM, "tool_choice: a forced tool call needs tools");
        if (!(*printed = cJSON_PrintUnformatted(r->tools)))
            return refuse(err, EV_CODE_ENGINE_ERROR, "engine: out of memory");
        *src = *printed;
        *len = strlen(*printed);
    }
    if (!*src && (r->constraint == ENGINE_CONSTRAINT_JSON_SCHEMA ||
                  r->constraint == ENGINE_CONSTRAINT_GRAMMAR))
        return refuse(err, EV_CODE_BAD_PARAM, "constraint: a schema or grammar needs its text");
    *kind = (enum cons_kind)r->constraint;
    return 0;
}

/* A compiler's failure (in err) as a refusal: BAD_PARAM (its message)
 * when the constraint is at fault, ENGINE_ERROR otherwise. */
static int compile_refusal(struct rl_err *err)
{
    return recode(err, err->code == EV_CODE_BAD_PARAM ? EV_CODE_BAD_PARAM : EV_CODE_ENGINE_ERROR);
}

/* The compiled constraint of r: *g (borrowed from the engine's cache), or
 * *job, its compile under way on a compile thread (the caller's
 * reference), or neither (no constraint). With grammar_sync_compile it is
 * compiled here. */
static int request_constraint(struct engine *e, const struct engine_request *r,
                              struct gram **g, struct cons_job **job, struct rl_err *err)
{
    *g = NULL;
    *job = NULL;
    enum cons_kind kind;
    const char *src;
    size_t len;
    char *printed;
    int rc = constraint_text(e, r, &kind, &src, &len, &printed, err);
    if (rc || kind == CONS_NONE)
        return rc;
    struct rl_err ce = {0};
    if (e->opt.grammar_sync_compile)
        rc = cons_get(e->cons, kind, src, len, r->tool_name, g, &ce);
    else
        rc = cons_request(e->cons, kind, src, len, r->tool_name, r->priority, g, job, &ce);
    free(printed);
    if (!rc)
        return 0;
    rc = compile_refusal(&ce);
    if (err)
        *err = ce;
    return rc;
}

int engine_check(struct engine *e, const struct engine_request *r, struct rl_err *err)
{
    const int32_t *ids;
    int32_t *rendered;
    int n, limit;
    struct sample_params sp;
    int rc = request_prompt(e, r, &ids, &n, &rendered, err);
    if (!rc)
        rc = check_request(e, r, ids, n, &sp, &limit, err);
    if (!rc) { /* the constraint's text, not its compile (engine.h) */
        enum cons_kind kind;
        const char *src;
        size_t len;
        char *printed;
        rc = constraint_text(e, r, &kind, &src, &len, &printed, err);
        free(printed);
    }
    free(rendered);
    return rc;
}

int engine_submit(struct engine *e, const struct engine_request *r, uint64_t *id,
                  struct rl_err *err)
{
    if (id)
        *id = 0;
    if (e->n_reqs == e->cap_reqs) {
        int cap = e->cap_reqs ? e->cap_reqs * 2 : 32;
        struct eng_req **g = realloc(e->reqs, (size_t)cap * sizeof *g);
        if (!g)
            return refuse(err, EV_CODE_ENGINE_ERROR, "engine: out of memory");
        e->reqs = g;
        e->cap_reqs = cap;
    }
    const int32_t *ids;
    int32_t *rendered;
    int n, limit;
    struct sample_params sp;
    struct gram *g = NULL;
    struct cons_job *job = NULL;
    int rc = request_prompt(e, r, &ids, &n, &rendered, err);
    if (!rc)
        rc = check_request(e, r, ids, n, &sp, &limit, err);
    if (!rc)
        rc = request_constraint(e, r, &g, &job, err);
    struct eng_req *q = NULL;
    if (!rc)
        rc = req_build(e, r, e->next_id, ids, n, &sp, limit, g, &q, err);
    uint64_t salt = kv_salt_lora(r->cache_salt, r->lora);
    if (!rc)
        q->lora = r->lora && r->lora[0] ? lora_slot(e, r->lora) : e->model_lora ? LORA_MAX_ADAPTERS : 0;
    if (!rc && job) {
        /* it waits outside the scheduler for its compile (attach_compiled) */
        q->cjob = job;
        job = NULL;
        q->priority = r->priority;
        q->deadline = r->deadline;
        q->cache_salt = salt;
        q->n_wait_ids = n;
        if (!(q->wait_ids = malloc((size_t)n * sizeof *q->wait_ids))) {
            cons_job_release(e->cons, q->cjob);
            req_free(q);
            rc = refuse(err, EV_CODE_ENGINE_ERROR, "engine: out of memory");
        } else {
            memcpy(q->wait_ids, ids, (size_t)n * sizeof *ids);
        }
    } else if (!rc && sched_add(e->sched, ids, n, r->priority, r->deadline, q, &q->seq, err)) {
        req_free(q);
        rc = recode(err, EV_CODE_ENGINE_ERROR);
    } else if (!rc) {
        q->cache_salt = salt;
        sched_seq_set_cache_salt(q->seq, salt);
    }
    cons_job_release(e->cons, job); /* the request was refused after all */
    free(rendered);
    if (rc)
        return rc;
    q->usage.prompt_tokens = n;
    e->reqs[e->n_reqs++] = q;
    if (id)
        *id = q->id;
    e->next_id++;
    return 0;
}

/* ---- per-token processing ---- */

static int emit_text(struct eng_req *q, const char *s, size_t n)
{
    return text_add(q->in_think ? &q->ev_reason : &q->ev_content, s, n);
}

/* Emits the first n held bytes and drops them from the hold. Bytes before
 * a held tag belong to the channel before the switch (q->in_think already
 * tells the one after); the tag's own bytes are skipped. */
static int emit_held(struct eng_req *q, size_t n)
{
    if (!n)
        return 0;
    int rc;
    if (q->tag_len) {
        size_t ts = q->tag_at, te = q->tag_at + q->tag_len;
        struct text *before = q->in_think ? &q->ev_content : &q->ev_reason;
        rc = text_add(before, q->hold.p, n < ts ? n : ts);
        if (!rc && n > te)
            rc = emit_text(q, q->hold.p + te, n - te);
        if (n >= te) {
            q->tag_len = 0;
        } else if (n > ts) {
            q->tag_len = te - n;
            q->tag_at = 0;
        } else {
            q->tag_at = ts - n;
        }
    } else {
        rc = emit_text(q, q->hold.p, n);
    }
    memmove(q->hold.p, q->hold.p + n, q->hold.n - n);
    q->hold.n -= n;
    q->hold.p[q->hold.n] = 0;
    return rc;
}

/* Emits everything held back (channel switch or finish). */
static int flush_hold(struct eng_req *q)
{
    int rc = emit_held(q, q->hold.n);
    q->tag_len = 0;
    return rc;
}

/* q waits for its compile no more (attached, or finished meanwhile). */
static void stop_waiting(struct engine *e, struct eng_req *q)
{
    cons_job_release(e->cons, q->cjob);
    q->cjob = NULL;
    free(q->wait_ids);
    q->wait_ids = NULL;
}

static void finish_req(struct engine *e, struct eng_req *q, enum engine_finish why)
{
    if (q->finish != ENGINE_FINISH_NONE)
        return;
    q->finish = why;
    if (!q->drop_tail) {
        /* what is held back is no stop string: it is output */
        if (q->ts) {
            const char *t;
            size_t n;
            if (tok_stream_finish(q->ts, &t, &n, NULL) == 0)
                text_add(&q->hold, t, n);
        }
        flush_hold(q);
    }
    if (q->seq) {
        q->usage.cached_prompt_tokens = sched_seq_n_cached_prompt(q->seq) > 0
                                            ? sched_seq_n_cached_prompt(q->seq) : 0;
        sched_remove(e->sched, q->seq);
        q->seq = NULL;
    }
    if (q->cjob) /* finished while its constraint compiled */
        stop_waiting(e, q);
}

static void fail_req(struct engine *e, struct eng_req *q, const struct rl_err *err)
{
    q->err_code = err && err->code ? err->code : RL_EINTERNAL;
    snprintf(q->err_msg, sizeof q->err_msg, "%s", err && err->code ? err->msg : "internal error");
    q->drop_tail = true;
    finish_req(e, q, ENGINE_FINISH_ERROR);
}

/* Feeds decoded text through the stop-string matcher. Returns 1 when a
 * stop string matched (the request is finished), 0, or a negative code. */
static int feed_text(struct engine *e, struct eng_req *q, const char *t, size_t n)
{
    if (!q->n_stop)
        return emit_text(q, t, n);
    int rc = text_add(&q->hold, t, n);
    if (rc)
        return rc;
    size_t best = (size_t)-1;
    for (int i = 0; i < q->n_stop; i++) {
        const char *m = memmem(q->hold.p, q->hold.n, q->stop[i], strlen(q->stop[i]));
        if (m && (size_t)(m - q->hold.p) < best) {
            best = (size_t)(m - q->hold.p);
            q->stop_hit = q->stop[i]; /* the earliest match; the first listed on a tie */
        }
    }
    if (best != (size_t)-1) {
        q->hold.n = best; /* the match and all after it are dropped */
        if (q->tag_len && q->tag_at >= best)
            q->tag_len = 0;
        else if (q->tag_len && q->tag_at + q->tag_len > best)
            q->tag_len = best - q->tag_at;
        flush_hold(q);
        q->drop_tail = true;
        finish_req(e, q, ENGINE_FINISH_STOP);
        return 1;
    }
    /* keep the longest tail that could still grow into a stop string; it
     * starts with a stop string's first byte, a UTF-8 lead byte, so what
     * is emitted always ends on a character boundary */
    size_t keep = 0;
    for (int i = 0; i < q->n_stop; i++) {
        size_t ls = strlen(q->stop[i]);
        size_t k = ls - 1 < q->hold.n ? ls - 1 : q->hold.n;
        for (; k > keep; k--)
            if (!memcmp(q->hold.p + q->hold.n - k, q->stop[i], k))
                break;
        if (k > keep)
            keep = k;
    }
    return emit_held(q, q->hold.n - keep);
}

static int ev_reserve(struct eng_req *q, int n)
{
    if (q->n_ev + n <= q->cap_ev)
        return 0;
    int cap = q->cap_ev ? q->cap_ev : 8;
    while (cap < q->n_ev + n)
        cap *= 2;
    int32_t *t = realloc(q->ev_tok, (size_t)cap * sizeof *t);
    if (t)
        q->ev_tok = t;
    float *l = realloc(q->ev_lp, (size_t)cap * sizeof *l);
    if (l)
        q->ev_lp = l;
    if (!t || !l)
        return -RL_ENOMEM;
    if (q->n_top) {
        struct engine_logprob *p =
            realloc(q->ev_top, (size_t)cap * (size_t)q->n_top * sizeof *p);
        if (!p)
            return -RL_ENOMEM;
        q->ev_top = p;
    }
    q->cap_ev = cap;
    return 0;
}

/* Takes one output token (sampled: so != NULL; forced: NULL). Returns 1
 * when the request finished on it, 0 when it goes on, or a negative code
 * (the request is then failed by the caller). */
static int accept(struct engine *e, struct eng_req *q, int32_t tok,
                  const struct sample_out *so, struct rl_err *err)
{
    if (ev_reserve(q, 1))
        return rl_errf(err, RL_ENOMEM, "engine: out of memory for events");
    int k = q->n_ev++;
    q->ev_tok[k] = tok;
    q->ev_lp[k] = so ? so->logprob : 0.0f;
    for (int j = 0; j < q->n_top; j++) {
        struct engine_logprob z = {-1, 0.0f};
        if (so && j < so->n_top)
            z = (struct engine_logprob){so->top[j].id, so->top[j].logprob};
        q->ev_top[(size_t)k * (size_t)q->n_top + (size_t)j] = z;
    }
    q->usage.completion_tokens++;
    e->n_generated++;
    if (q->sp.n_ban && q->usage.completion_tokens >= q->min_tokens)
        q->sp.ban_ids = NULL, q->sp.n_ban = 0; /* min_tokens reached */
    bool is_open = tok == e->think_open, is_close = tok == e->think_close;
    if (q->in_think || is_open)
        q->usage.reasoning_tokens++;

    for (int i = 0; i < q->n_stop_ids; i++)
        if (q->stop_ids[i] == tok) {
            finish_req(e, q, ENGINE_FINISH_STOP);
            return 1;
        }
    int rc = 0;
    size_t tlen;
    if (is_open || is_close) {
        /* tags switch channels and are never text themselves, but stop
         * strings see them (the essay at the top) */
        const char *tt = q->n_stop && q->ts ? tok_token_bytes(e->tok, tok, &tlen) : NULL;
        if ((!tt || q->tag_len) && (rc = flush_hold(q)))
            return rl_errf(err, RL_ENOMEM, "engine: out of memory for text");
        q->in_think = is_open;
        if (is_close && q->gm)
            q->doc_started = true; /* the document follows the reasoning */
        if (tt) {
            q->tag_at = q->hold.n;
            q->tag_len = tlen;
            rc = feed_text(e, q, tt, tlen);
            if (rc < 0)
                return rl_errf(err, RL_ENOMEM, "engine: out of memory for text");
            if (rc == 1)
                return 1;
        }
    } else if (q->ts && tok_token_bytes(e->tok, tok, &tlen)) {
        /* (ids past the tokenizer's table - padding rows of the embedding -
         * are output without text) */
        const char *t;
        size_t n;
        if ((rc = tok_stream_push(q->ts, tok, &t, &n, err)))
            return rc;
        rc = feed_text(e, q, t, n);
        if (rc < 0)
            return rl_errf(err, RL_ENOMEM, "engine: out of memory for text");
        if (rc == 1)
            return 1;
    }
    if ((q->max_tokens > 0 && q->usage.completion_tokens >= q->max_tokens) ||
        sched_seq_n_tokens(q->seq) + 1 >= q->context_limit) {
        finish_req(e, q, ENGINE_FINISH_LENGTH);
        return 1;
    }
    if ((rc = sched_push_tokens(q->seq, &tok, 1, err)))
        return rc;
    return 0;
}

/* One sampled row for request q. Returns true when the request goes on
 * with nothing but the sampled token (*tok) new: not finished, failed or
 * given forced text - the case in which a draft's next row still counts. */
static bool process_row(struct engine *e, struct eng_req *q, float *row, const struct sample_cands *cs,
                        int row_index, int32_t *tok)
{
    struct rl_err err = {0};
    struct sample_out so;
    /* the constraint's mask for this row, from the state before it */
    const uint32_t *mask = NULL;
    bool in_doc = q->gm && q->doc_started;
    if (in_doc) {
        if (!q->mask_ready) /* no helper filled it (inline masks, a retry) */
            gram_match_mask(q->gm, q->mask);
        mask = q->mask;
    } else if (q->gm) {
        mask = q->in_think ? cons_think_mask(e->cons) : cons_open_mask(e->cons);
    }
    q->mask_ready = false;
    int rc;
    if (cs) {
        /* the backend's set for this row (issue 25): the same token as the
         * whole row gives, or 1 = it cannot tell and the row comes over */
        rc = sample_next_reduced(q->ss, &q->sp, cs, e->cfg->vocab, mask, &so, &err);
        e->rows_from_sets += rc == 0;
        if (rc == 1) {
            e->rows_fetched++;
            if (!(rc = e->be->ops->fetch_row(e->be->ctx, row_index, row, &err)))
                rc = sample_next_masked(q->ss, &q->sp, row, e->cfg->vocab, mask, &so, &err);
        }
    } else {
        rc = sample_next_masked(q->ss, &q->sp, row, e->cfg->vocab, mask, &so, &err);
    }
    bool forced = q->forced;
    if (!rc && in_doc)
        rc = gram_match_accept(q->gm, so.token, &err);
    if (!rc) {
        *tok = so.token;
        rc = accept(e, q, so.token, &so, &err);
    }
    /* the document is over (EOS taken; under ignore_eos too) */
    if (rc == 0 && in_doc && gram_match_done(q->gm)) {
        finish_req(e, q, ENGINE_FINISH_STOP);
        rc = 1;
    }
    /* the thinking budget: Qwen3's recipe appends the early-stop phrase
     * itself; the tokens go to the scheduler as one chunk */
    if (rc == 0 && q->in_think && q->max_think >= 0 && !q->forced &&
        q->usage.reasoning_tokens >= q->max_think) {
        q->forced = true;
        for (int i = 0; i < e->n_force && rc == 0; i++) {
            if ((rc = sample_observe(q->ss, e->force_ids[i], &err)))
                break;
            sample_skip(q->ss, 1); /* its draw: draw n stays output token n */
            rc = accept(e, q, e->force_ids[i], NULL, &err);
        }
    }
    if (rc < 0)
        fail_req(e, q, &err);
    return rc == 0 && q->forced == forced;
}

/* An embed request's row: the backend's final-normed hidden state of its
 * last prompt token, cut to its dimensions and scaled to unit length
 * (what Qwen3-Embedding's last-token pooling and normalisation give; raw:
 * not scaled); the request is then done. */
static void embed_row(struct engine *e, struct eng_req *q, int row)
{
    struct rl_err err = {0};
    int h = e->cfg->hidden;
    float *v = malloc((size_t)h * sizeof *v);
    if (!v) {
        rl_errf(&err, RL_ENOMEM, "engine: out of memory for an embedding");
        fail_req(e, q, &err);
        return;
    }
    int rc = e->be->ops->hidden(e->be->ctx, row, v, &err);
    double ss = 0;
    for (int i = 0; !rc && i < q->embed_dims; i++)
        ss += (double)v[i] * v[i];
    if (!rc && !(ss > 0 && ss < INFINITY))
        rc = rl_errf(&err, RL_EBACKEND, "engine: the hidden state has norm %g", sqrt(ss));
    if (rc) {
        free(v);
        fail_req(e, q, &err);
        return;
    }
    if (!q->embed_raw) {
        double inv = 1.0 / sqrt(ss);
        for (int i = 0; i < q->embed_dims; i++)
            v[i] = (float)(v[i] * inv);
    }
    q->emb = v;
    q->n_emb = q->embed_dims;
    finish_req(e, q, ENGINE_FINISH_STOP);
}

/* A score request's row: the logits it asked for (the row came whole:
 * engine_step wants it so), and the request is done. */
static void score_row(struct engine *e, struct eng_req *q, const float *row)
{
    for (int i = 0; i < q->n_score; i++)
        q->scores[i] = row[q->score_ids[i]];
    finish_req(e, q, ENGINE_FINISH_STOP);
}

/* The rows of request q this step: 1 + n_draft, row r predicting the token
 * after draft r - 1. Processes them in order while the drafts hold (the
 * essay at the top), keeps the accepted drafts' KV and proposes the next
 * draft. A one-pass request's one row is its answer. */
static void process_rows(struct engine *e, struct eng_req *q, float *rows, int row0, int n_draft)
{
    if (q->embed) {
        embed_row(e, q, row0);
        return;
    }
    if (q->n_score) {
        score_row(e, q, rows);
        return;
    }
    size_t v = (size_t)e->cfg->vocab;
    int n_acc = 0;
    bool goes_on = true;
    for (int r = 0; r <= n_draft && goes_on; r++) {
        int32_t tok = -1;
        const struct sample_cands *cs =
            e->cands && e->wants[row0 + r] != BE_ROW_FULL ? &e->cands[row0 + r] : NULL;
        goes_on = process_row(e, q, rows + (size_t)r * v, cs, row0 + r, &tok);
        if (r == n_draft || tok != q->draft[r])
            break;
        if (goes_on)
            n_acc++;
    }
    q->n_draft = 0;
    if (n_draft > 0) {
        q->usage.spec_drafted += n_draft;
        q->usage.spec_accepted += n_acc;
        e->spec_drafted += n_draft;
        e->spec_accepted += n_acc;
    }
    if (!q->seq) /* finished (or failed) on one of the rows */
        return;
    struct rl_err err = {0};
    if (n_draft > 0) {
        spec_adapt_update(&q->adapt, n_draft, n_acc);
        if (sched_seq_resolve_draft(q->seq, n_acc, &err)) {
            fail_req(e, q, &err);
            return;
        }
    }
    /* the next draft, when the next step is a plain decode */
    int n = sched_seq_n_tokens(q->seq);
    if (!q->spec || !goes_on || n - sched_seq_n_computed(q->seq) != 1)
        return;
    int want = spec_adapt_want(&q->adapt);
    /* verifying d drafts yields up to d + 1 tokens: never past the limits */
    if (q->max_tokens > 0 && want > q->max_tokens - q->usage.completion_tokens - 1)
        want = q->max_tokens - q->usage.completion_tokens - 1;
    if (want > q->context_limit - n - 1)
        want = q->context_limit - n - 1;
    if (want <= 0)
        return;
    const int32_t *toks = sched_seq_tokens(q->seq);
    int got = e->opt.spec_draft
                  ? e->opt.spec_draft(e->opt.spec_draft_user, q->user, toks, n, q->n_prompt,
                                      q->draft, want)
                  : spec_ngram_propose(toks, n, 1, 4, q->draft, want);
    if (got > want)
        got = want;
    for (int i = 0; i < got; i++)
        if (q->draft[i] < 0 || q->draft[i] >= e->cfg->vocab) {
            got = i; /* a source's bad id ends its draft */
            break;
        }
    if (got <= 0)
        return;
    if (sched_seq_set_draft(q->seq, q->draft, got, &err)) {
        fail_req(e, q, &err);
        return;
    }
    q->n_draft = got;
}

static void reset_event(struct eng_req *q)
{
    q->n_ev = 0;
    text_clear(&q->ev_reason);
    text_clear(&q->ev_content);
}

static int collect_events(struct engine *e, const struct engine_event **events,
                          int *n_events, struct rl_err *err)
{
    if (e->cap_events < e->n_reqs) {
        int cap = e->n_reqs * 2;
        struct engine_event *g = realloc(e->events, (size_t)cap * sizeof *g);
        if (!g)
            return rl_errf(err, RL_ENOMEM, "engine: out of memory for events");
        e->events = g;
        e->cap_events = cap;
    }
    int n = 0;
    for (int i = 0; i < e->n_reqs; i++) {
        struct eng_req *q = e->reqs[i];
        bool final = q->finish != ENGINE_FINISH_NONE && !q->reported;
        if (!final && !q->n_ev && !q->ev_reason.n && !q->ev_content.n)
            continue;
        struct engine_event *ev = &e->events[n++];
        memset(ev, 0, sizeof *ev);
        ev->id = q->id;
        ev->user = q->user;
        ev->n_tokens = q->n_ev;
        ev->tokens = q->ev_tok;
        ev->logprobs = q->sp.logprobs ? q->ev_lp : NULL;
        ev->n_top = q->n_top;
        ev->top = q->n_top ? q->ev_top : NULL;
        ev->reasoning = q->ev_reason.p ? q->ev_reason.p : "";
        ev->n_reasoning = q->ev_reason.n;
        ev->content = q->ev_content.p ? q->ev_content.p : "";
        ev->n_content = q->ev_content.n;
        ev->finish = q->finish;
        if (q->seq) {
            int c = sched_seq_n_cached_prompt(q->seq);
            q->usage.cached_prompt_tokens = c > 0 ? c : 0;
        }
        ev->usage = q->usage;
        if (final && q->emb) {
            ev->embedding = q->emb;
            ev->n_embedding = q->n_emb;
        }
        if (final && q->n_score && q->finish == ENGINE_FINISH_STOP) {
            ev->scores = q->scores;
            ev->n_scores = q->n_score;
        }
        if (final && q->finish == ENGINE_FINISH_STOP)
            ev->stop = q->stop_hit;
        if (q->finish == ENGINE_FINISH_ERROR) {
            ev->error_code = q->err_code;
            ev->error = q->err_msg;
            ev->refused = q->refused;
        }
        if (final)
            q->reported = true;
    }
    *events = e->events;
    *n_events = n;
    return 0;
}

/* Requests whose constraint finished compiling join the scheduler; those
 * the compiler refused finish with ERROR and their refusal code; those
 * past their deadline meanwhile finish "deadline". Returns how many still
 * wait. */
static int attach_compiled(struct engine *e, double now)
{
    int waiting = 0;
    for (int i = 0; i < e->n_reqs; i++) {
        struct eng_req *q = e->reqs[i];
        if (!q->cjob || q->finish != ENGINE_FINISH_NONE)
            continue;
        struct gram *g;
        struct rl_err ce = {0};
        int rc = cons_job_poll(e->cons, q->cjob, &g, &ce);
        if (rc == 0 && q->deadline > 0 && now >= q->deadline) {
            finish_req(e, q, ENGINE_FINISH_DEADLINE);
            continue;
        }
        if (rc == 0) {
            waiting++;
            continue;
        }
        if (rc > 0)
            rc = req_constrain(e, q, g, q->wait_ids, q->n_wait_ids, &ce);
        else
            compile_refusal(&ce);
        if (rc) {
            /* refused as engine_submit would have refused it: its code
             * goes with the error event (engine_event.refused) */
            q->refused = ce.code;
            q->err_code = ce.code;
            snprintf(q->err_msg, sizeof q->err_msg, "%s", ce.msg);
            q->drop_tail = true;
            finish_req(e, q, ENGINE_FINISH_ERROR);
            continue;
        }
        if (sched_add(e->sched, q->wait_ids, q->n_wait_ids, q->priority, q->deadline, q, &q->seq,
                      &ce)) {
            q->seq = NULL;
            fail_req(e, q, &ce); /* as engine_submit's own sched_add failure */
            continue;
        }
        sched_seq_set_cache_salt(q->seq, q->cache_salt);
        stop_waiting(e, q);
    }
    return waiting;
}

/* Whether a step would hand back nothing: no sequence to run, no final
 * event due. */
static bool nothing_to_step(const struct engine *e)
{
    struct sched_stats ss;
    sched_get_stats(e->sched, &ss);
    if (ss.n_running || ss.n_waiting)
        return false;
    for (int i = 0; i < e->n_reqs; i++)
        if (e->reqs[i]->finish != ENGINE_FINISH_NONE && !e->reqs[i]->reported)
            return false;
    return true;
}

int engine_step(struct engine *e, const struct engine_event **events, int *n_events,
                struct rl_err *err)
{
    *events = NULL;
    *n_events = 0;
    /* requests whose final event went out last step can go now */
    int k = 0;
    for (int i = 0; i < e->n_reqs; i++) {
        struct eng_req *q = e->reqs[i];
        if (q->reported) {
            req_free(q);
            continue;
        }
        e->reqs[k++] = q;
    }
    e->n_reqs = k;
    for (int i = 0; i < e->n_reqs; i++)
        if (e->reqs[i]->finish == ENGINE_FINISH_NONE)
            reset_event(e->reqs[i]); /* cancelled ones keep theirs */
    if (e->cons) {
        /* only compiles to wait for: wait for one (bounded, so that the
         * caller still reads its queue and answers cancels), not spin */
        if (attach_compiled(e, engine_now()) > 0 && nothing_to_step(e) &&
            cons_wait(e->cons, ENGINE_COMPILE_WAIT_MS))
            attach_compiled(e, engine_now());
    }

    struct sched_plan plan;
    int rc = sched_schedule(e->sched, engine_now(), &plan, err);
    if (rc)
        return rc;
    for (int i = 0; i < plan.n_expired; i++) {
        struct sched_seq *s = plan.expired[i];
        if (!s)
            continue;
        struct eng_req *q = sched_seq_user(s);
        finish_req(e, q, ENGINE_FINISH_DEADLINE); /* removes s */
    }

    if (plan.n_items > 0) {
        struct be_batch b = {0};
        int nt = 0;
        for (int i = 0; i < plan.n_items; i++) {
            const struct sched_item *it = &plan.items[i];
            e->bseqs[i] = (struct be_seq){
                .n_past = it->n_past,
                .n_new = it->n_new,
                .block_table = it->block_table,
                .logits_from = !it->want_logits ? it->n_new
                               : it->n_new - 1 - it->n_draft,
                .lora = ((const struct eng_req *)it->user)->lora,
            };
            memcpy(e->btokens + nt, it->tokens, (size_t)it->n_new * sizeof *e->btokens);
            nt += it->n_new;
        }
        b.n_seqs = plan.n_items;
        b.seqs = e->bseqs;
        b.n_tokens = nt;
        b.tokens = e->btokens;
        b.n_logits = plan.n_logits;
        b.logits = e->logits;
        /* the constrained rows' masks: on the helper while forward runs,
         * or (grammar_inline_masks) here, before it, and then handed to the
         * backend too (be_batch.masks) */
        int n_mask = 0, n_rowmask = 0;
        bool inline_masks = e->opt.grammar_inline_masks;
        for (int i = 0, row = 0; i < plan.n_items && e->cons; i++) {
            const struct sched_item *it = &plan.items[i];
            if (!it->want_logits)
                continue;
            struct eng_req *q = it->user;
            const uint32_t *m = NULL;
            if (q->gm && q->doc_started && !q->mask_ready) {
                if (inline_masks) {
                    gram_match_mask(q->gm, q->mask);
                } else {
                    e->mask_m[n_mask] = q->gm;
                    e->mask_out[n_mask++] = q->mask;
                }
                q->mask_ready = true; /* helper's: read only after the join */
            }
            if (q->gm && (inline_masks || !q->doc_started) && !q->sp.logprobs)
                m = q->doc_started ? q->mask
                    : q->in_think  ? cons_think_mask(e->cons) : cons_open_mask(e->cons);
            for (int r = 0; r <= it->n_draft; r++, row++) {
                e->row_masks[row] = r == 0 ? m : NULL;
                n_rowmask += m && r == 0;
            }
        }
        struct rl_err ferr = {0};
        rc = 0;
        if (e->be->ops->set_masks)
            rc = e->be->ops->set_masks(e->be->ctx, n_rowmask ? e->row_masks : NULL, plan.n_logits,
                                       &ferr);
        /* what each row needs to come back as (issue 25): a backend that
         * can keep rows on the device sends greedy rows' best entry and
         * the other reducible rows' 64 best, whole rows only for the rest */
        const struct be_ops *bo = e->be->ops;
        bool row_wants = bo->set_row_wants && bo->row_cands && bo->fetch_row;
        e->cands = NULL;
        if (row_wants && !rc) {
            for (int i = 0, row = 0; i < plan.n_items; i++) {
                const struct sched_item *it = &plan.items[i];
                if (!it->want_logits)
                    continue;
                const struct eng_req *q = it->user;
                const struct sample_params *sp = &q->sp;
                /* an embedding reads the hidden state, not the logits: the
                 * cheapest row there is */
                uint8_t w = q->embed     ? BE_ROW_ARGMAX
                            : q->n_score ? BE_ROW_FULL /* it reads its ids' entries */
                            : !sample_params_reducible(sp) ? BE_ROW_FULL
                            : sp->temperature == 0 && sp->repetition_penalty == 1.0f &&
                                      sp->frequency_penalty == 0 && sp->presence_penalty == 0
                                ? BE_ROW_ARGMAX
                                : BE_ROW_CANDS;
                for (int r = 0; r <= it->n_draft; r++, row++)
                    /* a grammar's mask the device did not apply (the helper's,
                     * computed during forward, or a draft row's) usually
                     * rules the set out: the whole row, at once */
                    e->wants[row] = q->gm && !e->row_masks[row] ? BE_ROW_FULL : w;
            }
            rc = bo->set_row_wants(e->be->ctx, e->wants, plan.n_logits, &ferr);
        }
        if (n_mask)
            cons_masks_start(e->cons, e->mask_m, e->mask_out, n_mask);
        if (!rc)
            rc = e->be->ops->forward(e->be->ctx, &b, &ferr);
        if (!rc && row_wants)
            e->cands = bo->row_cands(e->be->ctx);
        if (n_mask)
            cons_masks_join(e->cons);
        if (rc) {
            /* the planned requests fail; the others are unaffected */
            void *users[plan.n_items];
            int n_users = plan.n_items;
            for (int i = 0; i < n_users; i++)
                users[i] = plan.items[i].user;
            sched_abort(e->sched);
            for (int i = 0; i < n_users; i++)
                fail_req(e, users[i], &ferr);
        } else {
            /* commit before sampling: finishing a request removes its
             * sequence, which the scheduler allows only after the commit */
            struct eng_req *rows[plan.n_items];
            int n_drafts[plan.n_items];
            int n_rows = 0;
            for (int i = 0; i < plan.n_items; i++)
                if (plan.items[i].want_logits) {
                    n_drafts[n_rows] = plan.items[i].n_draft;
                    rows[n_rows++] = plan.items[i].user;
                }
            /* drafts the scheduler did not take are dropped */
            for (int i = 0; i < e->n_reqs; i++)
                e->reqs[i]->n_draft = 0;
            for (int r = 0; r < n_rows; r++)
                rows[r]->n_draft = n_drafts[r];
            if ((rc = sched_commit(e->sched, err)))
                return rc;
            size_t at = 0;
            for (int r = 0; r < n_rows; r++) {
                process_rows(e, rows[r], e->logits + at * (size_t)e->cfg->vocab, (int)at, n_drafts[r]);
                at += 1 + (size_t)n_drafts[r];
            }
        }
        e->n_steps++;
    }
    return collect_events(e, events, n_events, err);
}

int engine_cancel(struct engine *e, uint64_t id, struct rl_err *err)
{
    for (int i = 0; i < e->n_reqs; i++) {
        struct eng_req *q = e->reqs[i];
        if (q->id == id && q->finish == ENGINE_FINISH_NONE) {
            reset_event(q);
            q->drop_tail = true; /* the caller gave up on the text */
            finish_req(e, q, ENGINE_FINISH_CANCELLED);
            return 0;
        }
    }
    return rl_errf(err, RL_ENOTFOUND, "engine: no running request %llu",
                   (unsigned long long)id);
}

int engine_n_active(const struct engine *e)
{
    int n = 0;
    for (int i = 0; i < e->n_reqs; i++)
        n += e->reqs[i]->finish == ENGINE_FINISH_NONE || !e->reqs[i]->reported;
    return n;
}

int engine_can_admit(const struct engine *e, int n_prompt_tokens)
{
    return sched_can_admit(e->sched, n_prompt_tokens);
}

void engine_each_cached_block(const struct engine *e, void (*fn)(void *ctx, uint64_t hash),
                              void *ctx)
{
    kv_each_cached(e->kv, fn, ctx);
}

void engine_get_stats(const struct engine *e, struct engine_stats *st)
{
    memset(st, 0, sizeof *st);
    struct sched_stats ss;
    sched_get_stats(e->sched, &ss);
    struct kv_stats ks;
    kv_get_stats(e->kv, &ks);
    st->n_running = ss.n_running;
    st->n_waiting = ss.n_waiting;
    st->grammar_cache_bytes = e->cons ? cons_cache_bytes(e->cons) : 0;
    for (int i = 0; i < e->n_reqs; i++) {
        const struct eng_req *q = e->reqs[i];
        if (q->finish != ENGINE_FINISH_NONE)
            continue;
        if (q->cjob)
            st->n_compiling++;
        else
            st->n_slots_used++;
    }
    st->kv_blocks = ks.n_blocks;
    st->kv_used = ks.n_used;
    st->kv_cached = ks.n_evictable;
    st->kv_free = ks.n_free;
    st->kv_usage = ks.n_blocks ? (double)ks.n_used / ks.n_blocks : 0;
    st->prefix_hit_tokens = ks.hit_tokens;
    st->prefix_miss_tokens = ks.miss_tokens;
    st->prefix_hit_blocks = ks.hit_blocks;
    st->evictions = ks.evictions;
    st->n_preemptions = ss.n_preemptions;
    st->n_steps = e->n_steps;
    st->n_generated = e->n_generated;
    st->spec_drafted = e->spec_drafted;
    st->spec_accepted = e->spec_accepted;
    st->block_size = e->block_size;
    st->max_context = e->max_context;
    st->kv_sizing = e->kv_sizing;
    st->rows_from_sets = e->rows_from_sets;
    st->rows_fetched = e->rows_fetched;
    st->max_batch = e->opt.max_batch;
    st->token_budget = e->opt.token_budget;
}

int engine_n_vocab(const struct engine *e) { return e->cfg->vocab; }
int engine_n_context(const struct engine *e) { return e->max_context; }
const char *engine_served_name(const struct engine *e) { return e->served_name; }
int engine_eos_id(const struct engine *e) { return e->cfg->eos_id; }
bool engine_embed_only(const struct engine *e) { return e->cfg->embed_only != 0; }

/* Loads the adapter at path into backend slot `slot`; *out owns it. */
static int lora_into_slot(struct engine *e, int slot, const char *path, struct lora_adapter **out,
                          struct rl_err *err)
{
    *out = NULL;
    struct lora_adapter *a = NULL;
    int rc = lora_load(&a, path, e->cfg, err);
    if (!rc && (rc = e->be->ops->lora_set(e->be->ctx, slot, a, err)))
        lora_free(a);
    if (!rc)
        *out = a;
    return rc;
}

/* Whether name may be added now: its index when a dropped adapter had it
 * (*i, else -1), or the refusal. */
static int lora_name_check(const struct engine *e, const char *name, int *i, struct rl_err *err)
{
    *i = -1;
    if (!e->be->ops->lora_set)
        return refuse(err, EV_CODE_BAD_PARAM, "adapter %s: the %s backend serves no LoRA adapters",
                      name ? name : "?", e->be->ops->name);
    /* spelled as served names are: they travel in job and heartbeat
     * fields and Redis key names */
    if (!name || !modelref_name_ok(name))
        return refuse(err, EV_CODE_BAD_PARAM,
                      "adapter name \"%.128s\": 1-128 of [A-Za-z0-9._:/-], not starting with '/' "
                      "or '.'", name ? name : "");
    if (!strcmp(name, e->served_name) || lora_slot(e, name) > 0)
        return refuse(err, EV_CODE_BAD_PARAM, "adapter name \"%s\" is already served", name);
    /* a dropped adapter's name comes back to its own slot */
    *i = engine_lora_index(e, name);
    if (*i < 0 && e->n_loras == LORA_MAX_ADAPTERS - 1) /* the last slot is model_lora's */
        return rl_errf(err, RL_EFULL, "adapter %s: %d adapters are served already", name,
                       LORA_MAX_ADAPTERS - 1);
    return 0;
}

int engine_lora_add(struct engine *e, const char *name, const char *dir, struct rl_err *err)
{
    int i, rc = lora_name_check(e, name, &i, err); /* before the slow part */
    if (rc)
        return rc;
    struct lora_adapter *a = NULL;
    if (lora_load(&a, dir, e->cfg, err))
        return rl_err_wrap(err, "adapter %s", name);
    if ((rc = engine_lora_add_loaded(e, name, a, err)))
        lora_free(a);
    return rc;
}

int engine_lora_add_loaded(struct engine *e, const char *name, struct lora_adapter *a,
                           struct rl_err *err)
{
    int i, rc = lora_name_check(e, name, &i, err);
    if (rc)
        return rc;
    if (e->be->ops->lora_set(e->be->ctx, (i < 0 ? e->n_loras : i) + 1, a, err))
        return rl_err_wrap(err, "adapter %s", name);
    if (i >= 0) {
        /* the prefix cache is salted by the adapter's name (kv_salt_lora,
         * which the dispatcher's affinity hashes share), and the name may
         * now stand for other weights: the idle cached blocks go, every
         * adapter's alike (the drop waited for this one's sequences, so
         * none of its blocks is in use) */
        e->loras[i].a = a;
        kv_drop_evictable(e->kv);
        return 0;
    }
    struct eng_lora *l = &e->loras[e->n_loras++];
    snprintf(l->name, sizeof l->name, "%s", name);
    l->a = a;
    return 0;
}

const struct model_config *engine_model_config(const struct engine *e) { return e->cfg; }

const struct model *engine_model(const struct engine *e) { return e->model; }

int engine_lora_drop(struct engine *e, const char *name, struct rl_err *err)
{
    int slot = lora_slot(e, name);
    if (slot < 0)
        return rl_errf(err, RL_ENOTFOUND, "adapter %s: not loaded", name);
    for (int k = 0; k < e->n_reqs; k++)
        if (e->reqs[k]->lora == slot && e->reqs[k]->finish == ENGINE_FINISH_NONE)
            return rl_errf(err, RL_EBUSY, "adapter %s: requests run with it", name);
    int rc = e->be->ops->lora_set(e->be->ctx, slot, NULL, err);
    if (rc)
        return rl_err_wrap(err, "adapter %s", name);
    lora_free(e->loras[slot - 1].a); /* after the backend let go of it */
    e->loras[slot - 1].a = NULL;
    return 0;
}

bool engine_lora_loaded(const struct engine *e, int i)
{
    return i >= 0 && i < e->n_loras && e->loras[i].a;
}

int engine_lora_count(const struct engine *e) { return e->n_loras; }

const char *engine_lora_name(const struct engine *e, int i)
{
    return i >= 0 && i < e->n_loras ? e->loras[i].name : NULL;
}

int engine_lora_rank(const struct engine *e, int i)
{
    return i >= 0 && i < e->n_loras ? lora_max_rank(e->loras[i].a) : 0;
}
const struct tokenizer *engine_get_tokenizer(const struct engine *e) { return e->tok; }
