/* engine/engine.h - the continuous-batching engine: the facade the worker
 * drives.
 *
 *   struct engine_options o; engine_options_default(&o);
 *   engine_create(&e, "/models/Qwen3-0.6B", &o, err);
 *   struct engine_request r; engine_request_init(&r);
 *   r.prompt_ids = ids; r.n_prompt = n; r.max_tokens = 64;
 *   engine_submit(e, &r, &id, err);
 *   while (engine_n_active(e) > 0) {
 *       engine_step(e, &ev, &n_ev, err);   // one batched forward
 *       for each ev[i]: stream ev[i].content, check ev[i].finish
 *   }
 *   engine_free(e);
 *
 * One step = schedule (sched.h) -> one be_batch over every running
 * sequence -> backend forward -> sample each sequence that produced a row
 * -> stop checks -> events. The backend parallelises inside a step.
 *
 * Batch invariance: on the CPU backend a request's tokens and logprobs are
 * bit-identical alone or in any batch, with or without prefix-cache hits,
 * preemption or any prefill chunk size: the backend computes each row
 * independently of its neighbours, each request owns its RNG stream (one
 * draw per output token: a sampled one draws, a forced one skips a draw)
 * and sampling state, and a preempted request
 * recomputes prompt + generated tokens before it samples again.
 *
 * Text: when the model directory has a tokenizer.json, generated ids are
 * decoded incrementally (UTF-8 safe: a character split over tokens comes
 * out whole, later), split into reasoning (inside <think>...</think>) and
 * content, and matched against stop strings across token boundaries; text
 * that could still be the start of a stop string is held back, and the
 * stop string itself is never emitted. Without a tokenizer the engine works
 * on ids alone (no text, no stop strings, no chat messages).
 *
 * Speculative decoding (spec.h; options.speculative): a request's decode
 * step may carry draft tokens (prompt lookup, or options.spec_draft) as
 * extra rows. Each row is sampled exactly as plain decoding samples that
 * position - same row bits, same RNG draw - and the draft is kept while it
 * equals the sampled token; the first difference is itself the next
 * token. So tokens, logprobs, stops, penalties and budgets are those of
 * plain decoding; only the number of steps changes.
 *
 * The one request contract: engine_submit() is the only validator of a
 * request and the only place its defaults are applied. A request carries
 * "unset" for every sampling field its sender did not give; the engine
 * fills those from the checkpoint's generation_config.json where it has
 * them, else from Qwen3's per-mode card values (engine_request below). A
 * refusal comes back as a protocol code (enum ev_code, common/event.h,
 * the table of schemas/errors.json) in rl_err.code, never as text.
 *
 * Structured output (engine_request.constraint): the request's answer must
 * match a JSON Schema, be a JSON object, match a raw grammar, or be one
 * <tool_call> block for the given tools (engine/grammar/grammar.h compiles
 * them; compiled forms are cached in the engine by gram_hash, bounded by
 * options.grammar_cache). Every step, the tokens that would leave the
 * document are masked to -inf after the raw logprobs and the penalties
 * and before sampling (sample_next_masked), so over the allowed tokens
 * sampling, seeds, logprobs (still the raw model's) and batch invariance
 * are exactly those of free decoding. EOS is allowed exactly where the
 * document is complete; max_tokens reached mid-document finishes "length".
 * In THINK mode the answer is <think> free reasoning </think> and then the
 * document: before the reasoning only <think> is allowed, inside it every
 * token but the eos ids, and the matcher starts at the first sampled token
 * after </think> (the thinking budget's forced text included). The next
 * step's masks are computed on a helper thread while the backend runs the
 * forward pass (options.grammar_inline_masks: on the owner thread before
 * it, for comparison; those masks, and think mode's fixed ones, also go to
 * the backend, be_batch.masks, which CUDA applies on the device). Speculative decoding is off for a constrained
 * request (its drafts would need the matcher's rollback for every
 * rejected token; plain decoding keeps the two features apart).
 * A constraint the cache lacks is compiled on one of the engine's compile
 * threads (options.grammar_compile_threads):
 * engine_submit takes the request at once, and it waits, holding neither
 * a batch slot nor KV, outside the scheduler until its grammar is ready,
 * while the other requests go on stepping (a schema can take hundreds of
 * milliseconds to compile: on the stepping thread it would stall every
 * running request that long; holding a slot, a burst of new schemas
 * would keep plain requests out for as long). engine_stats counts such
 * requests apart (n_compiling), so the caller bounds how many it lets
 * wait. A constraint the compiler refuses then
 * finishes its request with an ERROR event whose `refused` field carries
 * the code engine_submit would have returned (BAD_PARAM, with the
 * compiler's message). options.grammar_sync_compile compiles inside
 * engine_submit instead (benchmarks).
 *
 * One-pass requests (engine_request.embed, .score_ids): the prompt runs
 * through the model once, scheduled, chunked, prefix-cached and batched
 * like any other, and the request finishes "stop" at its last prompt
 * position with no token sampled: an embedding takes the final-normed
 * hidden state there (be_ops.hidden; Qwen3-Embedding's last-token
 * pooling), a score request the logits of the ids it names (a classifier
 * read off the vocabulary product: Qwen3-Reranker's "yes" and "no"). Both
 * are bit-identical alone or in any batch on the CPU backend, as tokens
 * are.
 *
 * This header is the engine's whole face: opaque handles and plain C
 * values (no backend, model or sampler types), as llama.h is llama.cpp's.
 *
 * Threading: one owner thread calls every function on an engine. */
#ifndef RL_ENGINE_H
#define RL_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "event.h"
#include "spec.h"

struct engine;    /* model, backend, KV pool, scheduler, requests */
struct tokenizer; /* tokenizer.h */
struct cJSON;     /* chat messages and tools, as cJSON trees */
struct lora_adapter; /* lora.h */
struct model_config; /* model.h */

/* Qwen3's own early-stop phrase for an exhausted thinking budget. */
#define ENGINE_THINK_STOP_TEXT                                                       \
    "\n\nConsidering the limited time by the user, I have to give the solution "   \
    "based on the thinking directly now.\n</think>\n\n"

/* KV cache element type; the values are backend.h's enum be_kv_dtype. */
enum engine_kv_dtype {
    ENGINE_KV_AUTO = 0,       /* f32 for f32 checkpoints, else bf16 */
    ENGINE_KV_F32,
    ENGINE_KV_BF16,
};

/* Weight loading progress: bytes taken so far and in all, on the loading
 * thread, at most once per progress_every bytes and once at the end. */
typedef void (*engine_progress_fn)(void *user, size_t done, size_t total);

/* The most token ids one score request reads (engine_request.score_ids). */
#define ENGINE_MAX_SCORE 16
/* The largest n_logprobs a request may ask for (sample.h's limit). */
#define ENGINE_MAX_LOGPROBS 20

struct engine_options {
    const char *backend;      /* "cpu" (default), "cuda", "sim", or "cpu-rowsets"
                                 (tests: engine/rowsets.h) */
    const char *sim_profile;  /* sim: device profile; NULL = "h200" */
    const char *sim_model;    /* sim: model shape (a built-in name or a
                                 config.json); NULL = dir's config.json.
                                 dir then only gives the tokenizer */
    int n_threads;            /* CPU: backend threads; 0 = all cores */
    const char *isa;          /* CPU kernel path; NULL = auto */
    int device;               /* CUDA: device ordinal among those visible */
    int mmap_weights;         /* CPU: 1 = run on the checkpoint's file
                                 mapping (no copy); 0 = copy into 2 MiB
                                 pages at load (faster decode) */
    const char *quantize;     /* CPU: be_options.quantize ("q8_0" or
                                 "none"); NULL = none */
    enum engine_kv_dtype kv_dtype;
    size_t kv_bytes;          /* KV pool budget in bytes (used when
                                 kv_blocks is 0); 0 = 1 GiB */
    int kv_blocks;            /* KV pool size in blocks; 0 = from kv_bytes */
    size_t kv_reserve_bytes;  /* CUDA: device memory left free when the pool
                                 is sized from the device (kv_bytes 0);
                                 be_options.kv_reserve_bytes; default
                                 1 GiB */
    int block_size;           /* tokens per block; 0 = 16 */
    int max_batch;            /* running sequences at most; 0 = 16 */
    int token_budget;         /* tokens per step; 0 = 512 */
    int prefill_chunk;        /* prompt tokens of one sequence per step;
                                 0 = token_budget */
    int max_context;          /* tokens per sequence; 0 = the model's
                                 max_position_embeddings (always capped by
                                 what the pool holds) */
    const char *think_stop_text; /* forced when the thinking budget runs
                                    out; NULL = ENGINE_THINK_STOP_TEXT */
    int kv_prefault;          /* commit the KV pool's memory at create
                                 (be_options.kv_prefault); 0 = lazily */
    engine_progress_fn progress; /* weight loading progress; NULL none */
    void *progress_user;
    enum spec_mode speculative; /* SPEC_OFF (default) or SPEC_NGRAM */
    int spec_tokens;          /* draft tokens per step at most, 1..
                                 SPEC_MAX_TOKENS; 0 = SPEC_DEFAULT_TOKENS */
    int spec_max_rows;        /* drafts only while a step has fewer tokens:
                                 past it a step is compute-bound and a
                                 draft row costs more than it wins; 0 =
                                 the backend's (cpu 8, cuda 64) */
    spec_draft_fn spec_draft; /* replaces the n-gram lookup when set and
                                 speculative is on (benchmark oracles,
                                 tests); NULL = spec_ngram_propose */
    void *spec_draft_user;
    size_t progress_every;    /* bytes between progress calls; 0 = 64 MiB */
    const char *model_lora;   /* a LoRA adapter that is part of the model
                                 (an Ollama model's ADAPTER layer, a GGUF
                                 adapter file or PEFT directory, lora.h):
                                 applied to every request that names no
                                 adapter of its own, its KV in the model's
                                 own prefix-cache domain; NULL = none.
                                 Needs a backend with adapters */
    const char *served_name;  /* the name the model is served under
                                 (engine_served_name); NULL = the model
                                 directory's last component */
    int grammar_cache;        /* compiled constraints kept; 0 = 64 */
    size_t grammar_cache_bytes; /* ... holding at most this much memory
                                  (grammar.h gram_bytes); 0 = 512 MiB */
    bool grammar_inline_masks; /* compute constraint masks on the owner
                                  thread before the forward pass instead of
                                  on a helper during it (benchmarks) */
    bool grammar_sync_compile; /* compile a constraint inside engine_submit
                                  (refusals from it) instead of on the
                                  compile threads (benchmarks) */
    int grammar_compile_threads; /* constraints compiled at once; 0 = a
                                  quarter of the cores, 1 to 4 */
    void (*grammar_compile_hook)(void *user); /* runs on a compile thread
                                  before each compile (tests); NULL none */
    void *grammar_compile_user;
};

/* How long engine_step waits for a compile when nothing else can run,
 * before it returns so that the caller can read its queue. */
#define ENGINE_COMPILE_WAIT_MS 10

void engine_options_default(struct engine_options *o);

/* What the answer must match (engine_request.constraint). */
enum engine_constraint {
    ENGINE_CONSTRAINT_NONE = 0,
    ENGINE_CONSTRAINT_JSON_OBJECT, /* any JSON object */
    ENGINE_CONSTRAINT_JSON_SCHEMA, /* constraint_src: a JSON Schema (text) */
    ENGINE_CONSTRAINT_GRAMMAR,     /* constraint_src: schemas/grammar.md syntax */
    ENGINE_CONSTRAINT_TOOL_CALL,   /* one <tool_call> of tools (constraint_src
                                      the tools array as JSON text, or NULL to
                                      use r->tools); tool_name NULL = any */
};

enum engine_mode {
    ENGINE_MODE_THINK = 0,    /* Qwen3 thinking (the model's default) */
    ENGINE_MODE_NO_THINK,     /* /no_think: the template closes <think> */
};

/* A request. The four sampling fields marked "unset" take, in this order:
 * the checkpoint's generation_config.json value for that field (the same
 * for both modes, as Hugging Face's generate() and vLLM use it), else
 * Qwen3's model-card value for the mode (thinking: temperature 0.6, top_p
 * 0.95, top_k 20, min_p 0; non-thinking: 0.7, 0.8, 20, 0). A value the
 * request gives always wins. engine_request_init() sets every field to
 * unset/off. engine_submit() copies everything it keeps: the caller's
 * arrays and strings need not outlive the call. */
struct engine_request {
    const int32_t *prompt_ids;  /* (n_prompt) token ids, or NULL to use */
    int n_prompt;
    const struct cJSON *messages; /* ... chat messages (OpenAI format, chat.h)
                                   rendered with Qwen3's template plus the
                                   generation prompt; mode NO_THINK renders
                                   enable_thinking=false. Needs a tokenizer */
    const struct cJSON *tools;  /* optional tool list for the template */
    enum engine_mode mode;

    float temperature;          /* < 0 unset; 0 greedy */
    float top_p;                /* <= 0 unset */
    int top_k;                  /* < 0 unset; 0 off */
    float min_p;                /* < 0 unset */
    float presence_penalty;     /* 0 off */
    float frequency_penalty;    /* 0 off */
    float repetition_penalty;   /* 1 off (<= 0 also off) */
    bool has_seed;              /* false: seed derived from the request id */
    uint64_t seed;
    int n_logprobs;             /* < 0: none; 0: the chosen token's; k: also
                                   the top k (<= ENGINE_MAX_LOGPROBS) */

    int max_tokens;             /* generated tokens at most; <= 0: up to the
                                   context limit. n_prompt + max_tokens must
                                   fit the context (PROMPT_TOO_LONG) */
    const int32_t *stop_ids;    /* (n_stop_ids) extra stop token ids */
    int n_stop_ids;
    int min_tokens;             /* vLLM's: the stop ids (eos and stop_ids)
                                   cannot be sampled before this many
                                   tokens came (0 off). Not applied inside
                                   a constraint (its grammar decides the
                                   end); stop strings still apply */
    bool keep_special;          /* vLLM's skip_special_tokens false: special
                                   tokens' text is output (stop ids and the
                                   think tags are never text) */
    const int32_t *bias_ids;    /* (n_bias) OpenAI's logit_bias: bias[i] is */
    const float *bias;          /* added to logit bias_ids[i] before */
    int n_bias;                 /* sampling ([-100, 100]; -100 bans) */
    const char *const *stop;    /* (n_stop) stop strings, not emitted */
    int n_stop;
    bool ignore_eos;            /* do not stop at <|im_end|>/<|endoftext|>/
                                   eos (stop_ids still apply) */
    int context_limit;          /* prompt + output at most; 0 = engine's */
    int max_thinking_tokens;    /* < 0: no budget. After this many tokens
                                   inside <think>, the engine forces the
                                   think-stop text and the answer follows */

    bool no_speculative;        /* true: plain decoding for this request
                                   even when the engine speculates */

    enum engine_constraint constraint; /* NONE: free text. Needs a tokenizer */
    const char *constraint_src; /* (constraint_len) bytes, see the enum */
    size_t constraint_len;
    const char *tool_name;      /* TOOL_CALL: the forced function, or NULL */

    int n_resumed;              /* resumption: the last n_resumed tokens of
                                   the prompt (< n_prompt; 0 = none) are
                                   output an earlier run of this request
                                   already produced. The penalties count
                                   them as output, not prompt, and the RNG
                                   stream starts at draw n_resumed (one
                                   draw per output token), so the request
                                   continues as if never interrupted.
                                   usage still counts them in
                                   prompt_tokens; max_tokens and the
                                   thinking budget are the caller's to
                                   shrink. Needs prompt_ids */

    int priority;               /* higher runs first; FIFO within one.
                                   A new constraint's compile is queued
                                   by it too */
    double deadline;            /* absolute, on engine_now()'s clock; <= 0
                                   none. Past it: finish "deadline" */
    void *user;                 /* opaque, handed back in events */
    bool embed;                 /* an embedding instead of tokens: the
                                   prompt runs through the model once and
                                   the request finishes "stop" with the
                                   final-normed hidden state of its last
                                   token, L2-normalised, in its final
                                   event (engine_event.embedding); no
                                   token is generated, the sampling
                                   fields are not used. No constraint,
                                   n_resumed or speculation. Needs a
                                   backend with `hidden` (BAD_PARAM) */
    int embed_dims;             /* embed: the first this many values,
                                   normalised again (Matryoshka); 0 = the
                                   model's hidden size; more: BAD_VALUE */
    bool embed_raw;             /* embed: the vector as the model gives it
                                   (cut to embed_dims), not scaled to unit
                                   length (vLLM's normalize false, Ollama's
                                   legacy /api/embeddings) */
    bool embed_truncate;        /* embed with prompt_ids: a prompt longer
                                   than the context keeps its first tokens
                                   that fit and its last one (the pooled
                                   token) instead of PROMPT_TOO_LONG;
                                   usage.prompt_tokens counts what ran */
    const int32_t *score_ids;   /* (n_score) score instead of tokens: the
                                   prompt runs through the model once and
                                   the request finishes "stop" with the raw
                                   logits of these ids at its last position
                                   in its final event (engine_event.scores;
                                   a classifier read off the vocabulary
                                   product, as Qwen3-Reranker's "yes" and
                                   "no"); no token sampled, the sampling
                                   fields unused. Not with embed, a
                                   constraint or n_resumed (BAD_PARAM) */
    int n_score;                /* 0 = none; at most ENGINE_MAX_SCORE */
    uint64_t cache_salt;        /* prefix-cache domain (kv_seq_set_salt): only
                                   requests of equal salt share cached
                                   prompt blocks, so one tenant cannot read
                                   another's prompts from cache hits or
                                   timings; 0 = the shared domain */
    const char *lora;           /* NULL or "": the base model; else the name
                                   of an adapter given to engine_lora_add,
                                   whose delta applies to this request's
                                   every row (unknown: BAD_VALUE). Its
                                   prefix-cache domain is its own: the
                                   blocks are hashed from
                                   kv_salt_lora(cache_salt, lora) */
};

void engine_request_init(struct engine_request *r);

enum engine_finish {
    ENGINE_FINISH_NONE = 0,   /* still running */
    ENGINE_FINISH_STOP,       /* stop token or stop string */
    ENGINE_FINISH_LENGTH,     /* max_tokens or the context limit */
    ENGINE_FINISH_CANCELLED,  /* engine_cancel() */
    ENGINE_FINISH_DEADLINE,   /* past its deadline */
    ENGINE_FINISH_ERROR,      /* see engine_event.error_code / error */
};

/* "stop", "length", "cancelled", "deadline", "error" (NULL for NONE). */
const char *engine_finish_name(enum engine_finish f);

struct engine_usage {
    int prompt_tokens;
    int completion_tokens;     /* generated plus forced tokens */
    int reasoning_tokens;      /* of those, inside <think>...</think> */
    int cached_prompt_tokens;  /* prompt tokens the prefix cache supplied */
    int spec_drafted;          /* draft tokens verified (speculation) */
    int spec_accepted;         /* of those, kept as output */
};

/* One alternative token and its raw logprob (-1, 0 for a padding slot). */
struct engine_logprob {
    int32_t id;
    float logprob;
};

/* What happened to one request in one step. Everything it points to is
 * owned by the engine and valid until the next engine_step() or
 * engine_free(). */
struct engine_event {
    uint64_t id;
    void *user;
    int n_tokens;                     /* new token ids this step */
    const int32_t *tokens;            /* (n_tokens) */
    const float *logprobs;            /* (n_tokens) raw logprob of each
                                         token, NULL when n_logprobs < 0;
                                         0 for forced tokens */
    int n_top;                        /* top alternatives per token */
    const struct engine_logprob *top; /* (n_tokens, n_top), or NULL */
    const char *reasoning;            /* UTF-8 delta inside <think>, NUL-
                                         terminated, "" when none */
    size_t n_reasoning;
    const char *content;              /* UTF-8 delta of the answer */
    size_t n_content;
    enum engine_finish finish;        /* NONE while running */
    struct engine_usage usage;        /* totals so far; final at finish */
    int error_code;                   /* an enum rl_code (RL_EBACKEND, ...)
                                         when finish is ERROR */
    const char *error;                /* a sentence, when finish is ERROR */
    const float *embedding;           /* an embed request's final event:
                                         (n_embedding) the unit vector
                                         (embed_raw: as the model gave it);
                                         NULL otherwise. Owned by the
                                         engine, valid until the next
                                         engine_step */
    int n_embedding;
    const float *scores;              /* a score request's final event:
                                         (n_scores) the logits asked for,
                                         in its order; NULL otherwise.
                                         Owned by the engine, valid until
                                         the next engine_step */
    int n_scores;
    const char *stop;                 /* the final event of a request that
                                         finished STOP at a stop string:
                                         that string (one of the request's
                                         stop, as given); NULL when it
                                         stopped otherwise (eos, a stop id)
                                         or is not final. Owned by the
                                         engine, valid until the next
                                         engine_step */
    int refused;                      /* when finish is ERROR because the
                                         request was refused after
                                         engine_submit took it (its
                                         constraint did not compile): the
                                         enum ev_code engine_submit would
                                         have returned; 0 otherwise */
};

struct engine_stats {
    int n_running, n_waiting;   /* sequences in the scheduler */
    size_t grammar_cache_bytes; /* memory of the compiled constraints
                                   cached (grammar_cache_bytes bounds it) */
    int n_compiling;            /* requests waiting for their constraint's
                                   compile (outside the scheduler, holding
                                   no slot and no KV) */
    int n_slots_used;           /* requests submitted, not yet finished and
                                   not compiling: the batch slots in use or
                                   queued for (the scheduler runs max_batch
                                   of them; more wait there when compiles
                                   finish into a full batch).
                                   engine_n_active() is another count: it
                                   adds the compiling and finished ones
                                   whose final event is still due */
    int kv_blocks;              /* pool size */
    int kv_used;                /* referenced by a sequence */
    int kv_cached;              /* unreferenced but holding a cached prefix */
    int kv_free;                /* neither */
    double kv_usage;            /* kv_used / kv_blocks */
    int64_t prefix_hit_tokens, prefix_miss_tokens;
    int64_t prefix_hit_blocks, evictions;
    int64_t n_preemptions;
    int64_t n_steps;
    int64_t n_generated;        /* tokens generated (and forced) */
    int64_t spec_drafted;       /* draft tokens verified, all requests */
    int64_t spec_accepted;      /* of those, kept */
    int block_size, max_context, max_batch, token_budget;
    const char *kv_sizing;      /* where the pool's size came from: "kv_blocks",
                                   "budget" (kv_bytes), "device" (the
                                   backend's kv_capacity) or "default" (1 GiB);
                                   static string */
    int64_t rows_from_sets;     /* sampled rows served by the backend's
                                   candidate sets (be_ops.set_row_wants) */
    int64_t rows_fetched;       /* of the rows asked as sets, those whose set
                                   could not prove the answer: fetched whole */
};

/* Loads the model in dir onto backend o->backend, sizes the KV pool and
 * loads dir/tokenizer.json when present. The caller owns *out
 * (engine_free). Errors name the file, option or backend at fault. */
int engine_create(struct engine **out, const char *dir,
                  const struct engine_options *o, struct rl_err *err);
void engine_free(struct engine *e);

/* Checks a request the way engine_submit() does, without queueing it or
 * changing anything: the one validator, also for callers that want to
 * refuse a request before doing other work for it. Returns 0, or -code
 * with err->code = code, an enum ev_code:
 *   MISSING_PROMPT   neither prompt_ids nor messages, or no prompt tokens
 *   INVALID_TOKEN    a prompt or stop id outside the vocabulary
 *   PROMPT_TOO_LONG  n_prompt + max_tokens (+ 1 when max_tokens <= 0) is
 *                    over the context limit
 *   OUT_OF_RANGE     a sampling value or n_logprobs outside its bounds
 *   BAD_VALUE        a malformed stop list; text features (stop strings,
 *                    a thinking budget, messages) without a tokenizer
 *   TEMPLATE_ERROR   messages the chat template cannot render
 *   BAD_PARAM        a constraint without its text; one that cannot be
 *                    compiled only with grammar_sync_compile (else it
 *                    comes as the request's ERROR event, `refused`
 *                    BAD_PARAM: a check never compiles). BAD_VALUE for a
 *                    constraint without a tokenizer
 *   ENGINE_ERROR     out of memory
 * and a sentence in err->msg. */
int engine_check(struct engine *e, const struct engine_request *r, struct rl_err *err);

/* Validates (engine_check) and queues a request; *id (if non-NULL) gets
 * its id (>= 1). Returns 0 or what engine_check returns. */
int engine_submit(struct engine *e, const struct engine_request *r,
                  uint64_t *id, struct rl_err *err);

/* Runs one iteration. *events (n_events of them) are owned by the engine
 * and valid until the next engine_step(). A step with nothing to run
 * returns at once with what finished meanwhile (cancels, deadlines); one
 * whose only requests wait for their constraint's compile waits up to
 * ENGINE_COMPILE_WAIT_MS for it first.
 * A backend failure finishes the requests of that step with ERROR events
 * and still returns 0; a negative return means the engine itself failed
 * (out of memory, a broken invariant). */
int engine_step(struct engine *e, const struct engine_event **events,
                int *n_events, struct rl_err *err);

/* Finishes request id at once: its slot and KV blocks are released before
 * this returns; its "cancelled" event comes with the next engine_step().
 * Returns 0, or -RL_ENOTFOUND when id is unknown or already finished. */
int engine_cancel(struct engine *e, uint64_t id, struct rl_err *err);

/* Requests the caller must keep stepping for: submitted and not yet
 * finished, plus finished ones whose final event the next engine_step()
 * delivers (a cancel's). engine_stats.n_slots_used counts only the first
 * kind: the batch slots in use. */
int engine_n_active(const struct engine *e);

/* How many more requests of n_prompt_tokens the engine could admit now
 * (sched_can_admit): the worker passes the rendered prompt's length. */
int engine_can_admit(const struct engine *e, int n_prompt_tokens);

void engine_get_stats(const struct engine *e, struct engine_stats *st);

/* kv_each_cached over the engine's KV pool: the chained hash of every
 * prefix-cached block (issue 27's affinity filter). Owner thread only. */
void engine_each_cached_block(const struct engine *e, void (*fn)(void *ctx, uint64_t hash),
                              void *ctx);

/* What callers need of the model, as plain values. */
int engine_n_vocab(const struct engine *e);       /* token ids are [0, n) */
int engine_n_context(const struct engine *e);     /* tokens per sequence at
                                                     most (engine_stats.max_context) */
const char *engine_served_name(const struct engine *e); /* owned by the engine */
/* true for an embedding checkpoint without a vocabulary product
 * (model.h embed_only): it takes embed requests only */
bool engine_embed_only(const struct engine *e);

/* LoRA adapters (engine/lora.h): loads the PEFT adapter in dir and serves
 * it as `name` (1-128 of [A-Za-z0-9._:/-], not the served name), for
 * requests whose engine_request.lora names it. Before or between steps.
 * Adapter i keeps its index and name for the engine's life: a dropped
 * adapter added again (the same name, any dir) comes back to index i, and
 * then the idle blocks of the prefix cache are dropped, whose salt
 * (kv_salt_lora) knows the name only. Errors: BAD_PARAM when the backend
 * has no adapters (lora_set) or the name is taken or malformed, RL_EFULL
 * past LORA_MAX_ADAPTERS - 1 names (the last slot is
 * engine_options.model_lora's), and lora_load's. */
int engine_lora_add(struct engine *e, const char *name, const char *dir, struct rl_err *err);
/* The same for an adapter already loaded (lora_load, with
 * engine_model_config's shape: the slow part, which any thread may do
 * while the engine steps): only the backend's slot is filled here. On
 * success the engine owns a; on failure the caller still does. */
int engine_lora_add_loaded(struct engine *e, const char *name, struct lora_adapter *a,
                           struct rl_err *err);
/* The model's shape (immutable for the engine's life: any thread may read
 * it, as lora_load does). */
const struct model_config *engine_model_config(const struct engine *e);
/* The model itself (immutable too): model_quant_label and the like. */
const struct model *engine_model(const struct engine *e);
/* Stops serving adapter `name` and frees its weights (on the backend's
 * device too): RL_EBUSY while a request not finished uses it (the caller
 * stops submitting them and tries again between steps), RL_ENOTFOUND when
 * it is not loaded. Its index stays, engine_lora_loaded false. */
int engine_lora_drop(struct engine *e, const char *name, struct rl_err *err);
/* Adapters' indexes are [0, count), dropped ones included; the index of
 * adapter `name`, loaded or dropped, -1 when the engine never had it. */
int engine_lora_count(const struct engine *e);
int engine_lora_index(const struct engine *e, const char *name);
bool engine_lora_loaded(const struct engine *e, int i);
/* Adapter i's name (owned by the engine), i < engine_lora_count; NULL past. */
const char *engine_lora_name(const struct engine *e, int i);
/* Adapter i's largest rank, 0 past the count and for a dropped one. */
int engine_lora_rank(const struct engine *e, int i);
int engine_eos_id(const struct engine *e);        /* config.json's eos_token_id,
                                                     -1 when it names none */
/* The tokenizer, or NULL when the model directory has none. */
const struct tokenizer *engine_get_tokenizer(const struct engine *e);

/* Seconds on the engine's clock (CLOCK_MONOTONIC), for deadlines. */
double engine_now(void);

#endif
