/* common/job.h - a job as the protocol defines it (schemas/job.schema.json):
 * parse and validate the `job` field of a redlm:jobs:<pool> entry, write it
 * back, and compute its result-cache key.
 *
 * Validation is complete before anything is returned: a job either parses
 * into a struct job whose every field is within bounds, or fails with one
 * stable protocol code (enum ev_code, common/event.h) and the path of the
 * field at fault ("temperature", "messages[2].role", "stop[1]"), which the
 * worker copies into an error event and a dead letter. */
#ifndef RL_JOB_H
#define RL_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "event.h"
#include "sha256.h"

struct cJSON;

#define JOB_ID_MAX 128        /* characters of [A-Za-z0-9_.:-] */
#define JOB_POOL_MAX 64       /* characters of [A-Za-z0-9_-] */
#define JOB_MODEL_MAX 128     /* = MODELREF_NAME_MAX: a served name (common/modelref.h) */
#define JOB_STOP_MAX 16       /* stop strings per job */
#define JOB_STOP_LEN_MAX 256  /* bytes per stop string */
#define JOB_LOGPROBS_MAX 20   /* top alternatives per token */
#define JOB_STOP_IDS_MAX 64   /* stop_token_ids per job */
#define JOB_LOGIT_BIAS_MAX 1024 /* logit_bias entries per job (OpenAI: 300) */
#define JOB_MAX_TOKENS_MAX (1 << 20)
#define JOB_MESSAGES_MAX 4096
#define JOB_TOOLS_MAX 256
#define JOB_CACHE_KEY_LEN SHA256_HEX_LEN
/* Bytes of a constraint's source text (the schema as compact JSON, the
 * grammar, the tools of a forced tool call) at most: the grammar
 * compiler's own limit (engine/grammar/grammar.h GRAM_MAX_SOURCE), checked
 * here already so the dispatcher refuses a huge schema before routing it. */
#define JOB_CONSTRAINT_MAX (256 * 1024)
/* JSON nesting of a job at most: cJSON gives up at 1000 with no word of
 * where; we say which member is too deep (BAD_PARAM for a constraint). */
#define JOB_DEPTH_MAX 256

enum job_input {
    JOB_INPUT_MESSAGES = 1, /* messages (+ tools): rendered by the chat template */
    JOB_INPUT_PROMPT,       /* raw text, tokenized as is */
    JOB_INPUT_IDS,          /* token ids, used as is */
    JOB_INPUT_RERANK,       /* query + document (+ instruction): rendered by
                               Qwen3-Reranker's template (task rerank) */
};

enum job_mode {
    JOB_MODE_POOL = 0, /* not given: the pool's own (think on "think", else no_think) */
    JOB_MODE_THINK,
    JOB_MODE_NO_THINK,
    JOB_MODE_AUTO,     /* "auto": the dispatcher chooses (rules, think_ratio); a
                          worker treats it as JOB_MODE_POOL */
};

/* What a job's output must match (response_format, grammar, tool_choice;
 * at most one of them constrains). The values are engine.h's enum
 * engine_constraint. */
enum job_constraint {
    JOB_CONSTRAINT_NONE = 0,
    JOB_CONSTRAINT_JSON_OBJECT, /* response_format {"type": "json_object"} */
    JOB_CONSTRAINT_JSON_SCHEMA, /* response_format {"type": "json_schema", ...} */
    JOB_CONSTRAINT_GRAMMAR,     /* grammar: schemas/grammar.md's syntax */
    JOB_CONSTRAINT_TOOL_CALL,   /* tool_choice "required" or a named function */
};

/* Bits of struct job.given: which optional fields the job spelt out, so
 * job_to_json writes back only what was given. (The sampling fields also
 * say it in their value: < 0 is "not given", see struct job.) */
enum job_field_bit {
    JOB_F_ID = 1u << 0, JOB_F_MODE = 1u << 1, JOB_F_MAX_TOKENS = 1u << 2,
    JOB_F_TEMPERATURE = 1u << 3, JOB_F_TOP_P = 1u << 4, JOB_F_TOP_K = 1u << 5,
    JOB_F_MIN_P = 1u << 6, JOB_F_PRESENCE = 1u << 7, JOB_F_FREQUENCY = 1u << 8,
    JOB_F_REPETITION = 1u << 9, JOB_F_SEED = 1u << 10, JOB_F_STOP = 1u << 11,
    JOB_F_IGNORE_EOS = 1u << 12, JOB_F_MAX_THINKING = 1u << 13,
    JOB_F_LOGPROBS = 1u << 14, JOB_F_PRIORITY = 1u << 15, JOB_F_DEADLINE = 1u << 16,
    JOB_F_CACHE = 1u << 17, JOB_F_STREAM_TTL = 1u << 18, JOB_F_METADATA = 1u << 19,
    JOB_F_POOL = 1u << 20, JOB_F_TOOLS = 1u << 21, JOB_F_SPECULATIVE = 1u << 22,
    JOB_F_MODEL = 1u << 23, JOB_F_CLIENT_LEASE = 1u << 24, JOB_F_MIN_TOKENS = 1u << 25,
    JOB_F_STOP_IDS = 1u << 26, JOB_F_LOGIT_BIAS = 1u << 27, JOB_F_SKIP_SPECIAL = 1u << 28,
    JOB_F_TASK = 1u << 29, JOB_F_DIMENSIONS = 1u << 30, JOB_F_TRUNCATE = 1u << 31,
};
/* What a job asks the model for. */
enum job_task {
    JOB_TASK_GENERATE = 0, /* tokens (the default) */
    JOB_TASK_EMBED,        /* "embed": one vector for the prompt and no tokens
                              (schemas/README.md, "Embeddings"); only prompt or
                              prompt_ids, and none of the generation fields */
    JOB_TASK_RERANK,       /* "rerank": the relevance of a document to a query,
                              Qwen3-Reranker's P("yes") (schemas/README.md,
                              "Rerank jobs"); query and document instead of a
                              prompt, none of the generation fields */
};
/* The largest `dimensions` a job may ask for (Qwen3-32B's hidden size is
 * 5120; the worker refuses more than its model has). */
#define JOB_DIMENSIONS_MAX 16384

/* A validated job. Owned by whoever called job_parse; job_free releases it
 * and everything it points to. Absent fields hold the protocol's defaults,
 * except the four sampling fields: those hold -1 ("unset") and the engine
 * applies the model's defaults to them (engine/engine.h, the one owner:
 * generation_config.json, else Qwen3's per-mode card values). */
struct job {
    char id[JOB_ID_MAX + 1];  /* client-chosen, or generated (id_generated) */
    bool id_generated;
    char pool[JOB_POOL_MAX + 1]; /* optional routing hint for the dispatcher; "" if absent */
    char model[JOB_MODEL_MAX + 1]; /* the served model it asks for; "" = whichever is
                                      served (the dispatcher refuses it when several are) */
    unsigned given;           /* enum job_field_bit mask */

    enum job_input input;
    struct cJSON *messages;   /* JOB_INPUT_MESSAGES: validated array, owned */
    struct cJSON *tools;      /* array or NULL; only with messages; owned */
    char *prompt;             /* JOB_INPUT_PROMPT: NUL-terminated UTF-8, owned */
    size_t prompt_len;        /* bytes, without the NUL */
    int32_t *prompt_ids;      /* JOB_INPUT_IDS: (n_prompt_ids), owned */
    int n_prompt_ids;

    enum job_task task;       /* default JOB_TASK_GENERATE */
    int dimensions;           /* JOB_TASK_EMBED: the vector's first this many
                                 values, normalised again (Matryoshka
                                 truncation); 0 = all of them */
    char *query;              /* JOB_TASK_RERANK: NUL-terminated UTF-8, owned; */
    char *document;           /* plain text, never control tokens; instruction */
    char *instruction;        /* NULL = the worker's default */
    bool truncate;            /* JOB_TASK_EMBED: a prompt longer than the
                                 context keeps its first tokens and its last
                                 (the pooled one) instead of PROMPT_TOO_LONG;
                                 default false */
    bool continue_final;      /* "continue_final_message" (vLLM's): the last
                                 message, an assistant's, is continued, not
                                 answered (a prefill); messages only, no
                                 constraint */
    bool no_normalize;        /* JOB_TASK_EMBED: "normalize": false, the
                                 pooled vector as the model gives it (cut to
                                 dimensions) instead of unit length */
    enum job_mode mode;
    int max_tokens;           /* 1..JOB_MAX_TOKENS_MAX; default from job_opts */
    double temperature;       /* 0..2; 0 = greedy. -1 = unset */
    double top_p;             /* (0, 1]; -1 = unset */
    int top_k;                /* 0 (off) .. 1e6; -1 = unset */
    double min_p;             /* [0, 1]; -1 = unset */
    double presence_penalty;  /* [-2, 2]; default 0 */
    double frequency_penalty; /* [-2, 2]; default 0 */
    double repetition_penalty;/* (0, 2]; default 1 */
    bool has_seed;
    uint64_t seed;            /* 0 .. 2^53-1 (exact in JSON) when has_seed */
    char **stop;              /* (n_stop) NUL-terminated UTF-8, owned */
    int n_stop;
    bool ignore_eos;          /* default false */
    int min_tokens;           /* vLLM's: no eos / stop id before this many; default 0 */
    bool skip_special;        /* vLLM's skip_special_tokens: special tokens' text is
                                 left out of the output; default true */
    int32_t *stop_ids;        /* (n_stop_ids) vLLM's stop_token_ids, owned */
    int n_stop_ids;
    int32_t *bias_ids;        /* (n_bias) OpenAI's logit_bias: bias[i] is added */
    float *bias;              /* to token bias_ids[i]'s logit; owned, in the */
    int n_bias;               /* object's order */
    int max_thinking_tokens;  /* -1 = no limit but max_tokens; else 0..max */
    int logprobs;             /* -1 off; else chosen token + this many top alternatives */
    int priority;             /* -1000..1000, higher first; default 0 */
    int64_t deadline_ms;      /* Unix time in ms after which the job ends; 0 = none */
    bool cache;               /* may use / fill the result cache; default true */
    bool speculative;         /* false: plain decoding even on a worker that
                                 speculates; default true. Not in the cache
                                 key: the tokens are the same either way */
    int stream_ttl_s;         /* redlm:out:<id> expires this long after done */
    int client_lease_ms;      /* > 0: the front end that queued the job keeps
                                 <prefix>lease:<id> alive (renewing it well within
                                 this many ms) while its client waits; a worker
                                 cancels the job once the key has been missing this
                                 long (the front end died). 0 = no lease */
    struct cJSON *metadata;   /* object or NULL, passed through untouched; owned */

    /* structured output: the members as given (owned, NULL when absent),
     * written back by job_to_json, and what they ask for */
    struct cJSON *response_format; /* {"type": "text" | "json_object" | "json_schema"} */
    struct cJSON *tool_choice;     /* "none" | "auto" | "required" | {"type": "function",
                                      "function": {"name"}} */
    char *grammar;                 /* NUL-terminated, owned */
    enum job_constraint constraint;
    char *constraint_src;          /* owned: JSON_SCHEMA the schema as compact JSON,
                                      GRAMMAR the grammar, TOOL_CALL the tools array as
                                      compact JSON; NULL otherwise. At most
                                      JOB_CONSTRAINT_MAX bytes */
    char tool_name[65];            /* TOOL_CALL: the function forced; "" = any tool */
};

/* What the parser needs from its caller: limits from the config, and the
 * id to give a job that has none. */
struct job_opts {
    size_t max_job_bytes;     /* JOB_TOO_LARGE above this */
    int default_max_tokens;
    int max_max_tokens;       /* OUT_OF_RANGE above this (<= JOB_MAX_TOKENS_MAX) */
    int default_stream_ttl_s;
    int max_stream_ttl_s;
    int max_prompt_ids;
    /* id for a job without one: the dispatcher passes "r" + the
     * redlm:requests entry ID, which the client got back from its XADD and
     * so can find redlm:out:<id>. NULL: 32 random hex digits. */
    const char *fallback_id;
};

/* The defaults the config table also documents. */
void job_opts_default(struct job_opts *o);

/* Why a job was refused: the protocol code and the field path ("" when
 * the job as a whole is at fault). The sentence is in struct rl_err. */
#define JOB_FIELD_MAX 96
struct job_fault {
    enum ev_code code;
    char field[JOB_FIELD_MAX];
};

/* Parses and validates one job. text need not be NUL-terminated. On
 * success returns 0 and *out is a new job (job_free). On a bad job returns
 * -RL_EINVAL, fills *fault (code + field) and err (a sentence naming the
 * field: "temperature: 2.5 is out of range [0, 2]"); *out stays NULL.
 * -RL_ENOMEM is the only other failure (fault->code = EV_CODE_INTERNAL). */
int job_parse(const char *text, size_t len, const struct job_opts *opts, struct job **out,
              struct job_fault *fault, struct rl_err *err);

void job_free(struct job *j);

/* The text checks job_parse runs before parsing, for other JSON documents
 * that reach us from clients (the HTTP front door's request bodies):
 * strict UTF-8 (BAD_UTF8) and the RFC 8259 lexical rules cJSON is lenient
 * about (INVALID_JSON: raw control characters, "01", "1."). what names the
 * document in the sentence ("body: not valid JSON (at byte 7 of 20)").
 * Returns 0, or -RL_EINVAL with fault->code and err filled. */
int job_check_text(const char *text, size_t len, const char *what, struct job_fault *fault,
                   struct rl_err *err);

/* Checks the pool the job is meant for: the stream's pool must be in
 * pools (n_pools entries), and a job that names a pool must name that one.
 * Returns 0, or -RL_EINVAL with fault UNKNOWN_POOL. */
int job_check_pool(const struct job *j, const char *stream_pool, const char *const *pools,
                   int n_pools, struct job_fault *fault, struct rl_err *err);

/* The effective mode on pool (JOB_MODE_THINK or JOB_MODE_NO_THINK); an
 * absent or auto mode is the pool's own: think on "think", else no_think. */
enum job_mode job_mode_on(const struct job *j, const char *pool);

/* Writes the job back as compact JSON: id always (so a generated id
 * survives re-dispatch), the prompt, and every field that was given.
 * job_parse(job_to_json(j)) yields an equal job. *out is malloc'd. */
int job_to_json(const struct job *j, char **out, struct rl_err *err);

/* The id to answer a job that failed validation on, so its client still
 * gets the error event on redlm:out:<id>: the job's own `id` when raw is a
 * JSON object naming a valid one (1-128 of [A-Za-z0-9_.:-]); when it names
 * none at all, fallback (NULL: none). "" when there is nowhere to answer
 * (not JSON, an invalid id, no id and no fallback). */
void job_guess_id(const char *raw, size_t len, const char *fallback, char out[JOB_ID_MAX + 1]);

/* A job's identity (schemas/README.md, "Job identity"): the lower-case hex
 * SHA-256 of the `job` field's bytes exactly as its client sent them. Two
 * submissions under one id are the same job when these are equal. */
#define JOB_SHA_LEN SHA256_HEX_LEN
void job_sha256(const char *raw, size_t len, char out[JOB_SHA_LEN + 1]);

/* Tenants (dispatcher option `tenants`): the ids of jobs read from
 * <prefix>requests:<tenant> live in that tenant's namespace, "<tenant>:"
 * followed by the id, so one tenant's jobs never name another's streams.
 * JOB_TENANT_MAX characters of [A-Za-z0-9_-]. */
#define JOB_TENANT_MAX 32
/* true when name is a valid tenant name. */
bool job_tenant_ok(const char *name);
/* id in tenant's namespace into out: id itself when it starts with
 * "<tenant>:" already, else "<tenant>:<id>". Returns 0, or -1 (out "")
 * when the result would be longer than JOB_ID_MAX. */
int job_tenant_id(const char *tenant, const char *id, char out[JOB_ID_MAX + 1]);

/* Greedy (temperature 0 or top_k 1) or seeded: the same prompt gives the
 * same tokens, so the result may be cached. */
bool job_is_deterministic(const struct job *j);

/* The result-cache key: lower-case hex SHA-256 over a versioned, length-
 * prefixed binary encoding of model_id (whatever identifies the weights and
 * tokenizer, e.g. a hash of config.json + file sizes), the rendered prompt
 * ids (after the chat template, so mode and tools are inside them), and
 * every parameter that changes the output: max_tokens, temperature, top_p,
 * top_k, min_p (unset ones as unset: their defaults come from the model,
 * which model_id covers, and the mode), the three penalties, seed (or its
 * absence), stop, ignore_eos, max_thinking_tokens, logprobs, min_tokens,
 * stop_token_ids, logit_bias, skip_special_tokens, and the
 * effective mode (job_mode_on: for prompt and prompt_ids input it is in
 * no id), and the constraint (kind, source text, forced tool name). Not: id, priority, deadline, cache, stream_ttl_s, metadata.
 * Returns 0 or -RL_EINVAL. */
int job_cache_key(const struct job *j, enum job_mode mode, const char *model_id,
                  const int32_t *ids, int n_ids, char out[JOB_CACHE_KEY_LEN + 1],
                  struct rl_err *err);

#endif
