/* common/event.h - the events a worker writes to redlm:out:<id>, the dead
 * letters it writes to redlm:dead, and the table of stable error codes.
 *
 * Every builder returns a malloc'd, NUL-terminated, compact JSON string that
 * the caller frees with free(); it is exactly the value of the `event` (or
 * `dead`) field of one stream entry, as schemas/event.schema.json and
 * schemas/dead-letter.schema.json describe. Builders never keep pointers to
 * their arguments. */
#ifndef RL_EVENT_H
#define RL_EVENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct cJSON;

/* Stable protocol error codes: the `code` of an error event and the reason
 * of a dead letter. The names are the wire strings (ev_code_name) and never
 * change meaning; schemas/errors.json lists the same table (a unit test
 * keeps the two equal). Append only. */
enum ev_code {
    EV_CODE_NONE = 0,
    EV_CODE_BAD_ENTRY,           /* stream entry has no `job` field */
    EV_CODE_JOB_TOO_LARGE,       /* job text over the size limit */
    EV_CODE_BAD_UTF8,            /* job text is not valid UTF-8 */
    EV_CODE_INVALID_JSON,        /* job text does not parse as JSON */
    EV_CODE_NOT_OBJECT,          /* job is JSON but not an object */
    EV_CODE_UNKNOWN_FIELD,       /* a field the protocol does not define */
    EV_CODE_DUPLICATE_FIELD,     /* the same field twice in one object */
    EV_CODE_BAD_TYPE,            /* a field has the wrong JSON type */
    EV_CODE_OUT_OF_RANGE,        /* a number or length outside its bounds */
    EV_CODE_BAD_VALUE,           /* a string not among the allowed values */
    EV_CODE_BAD_ID,              /* id breaks the 1-128 [A-Za-z0-9_.:-] rule */
    EV_CODE_MISSING_PROMPT,      /* none of messages, prompt, prompt_ids */
    EV_CODE_CONFLICTING_PROMPT,  /* more than one of them */
    EV_CODE_MISSING_FIELD,       /* a required field inside messages/tools */
    EV_CODE_UNKNOWN_POOL,        /* job names a pool this system lacks */
    EV_CODE_PROMPT_TOO_LONG,     /* rendered prompt + max_tokens > context */
    EV_CODE_INVALID_TOKEN,       /* a prompt id outside the vocabulary */
    EV_CODE_TEMPLATE_ERROR,      /* messages cannot be rendered */
    EV_CODE_TOO_MANY_DELIVERIES, /* max_deliveries deliveries in a row without progress */
    EV_CODE_CANCELLED,           /* cancelled (dead-letter / metrics reason) */
    EV_CODE_DEADLINE_EXCEEDED,   /* deadline passed before admission */
    EV_CODE_ENGINE_ERROR,        /* the engine failed on this request */
    EV_CODE_INTERNAL,            /* a bug: broken invariant in the worker */
    EV_CODE_OVERLOADED,          /* the dispatcher refused: the pool's queue is full */
    EV_CODE_MODEL_NOT_FOUND,     /* job names a model nobody serves (or not this worker's) */
    EV_CODE_MODEL_REQUIRED,      /* no model named while several are served */
    EV_CODE_BAD_PARAM,           /* a constraint (response_format, grammar or
                                    tool_choice) that cannot be compiled:
                                    unsupported keyword, unsatisfiable schema,
                                    too large or deep, invalid grammar */
    EV_CODE_ID_CONFLICT,         /* the id is taken by a different job whose
                                    stream still exists (schemas/README.md,
                                    "Job identity") */
    EV_CODE_COUNT
};

/* The wire name ("UNKNOWN_FIELD"); "" for EV_CODE_NONE, "INTERNAL" for
 * out-of-range values. Static storage. */
const char *ev_code_name(enum ev_code code);
/* One sentence saying what the code means, for errors.md and --help. */
const char *ev_code_meaning(enum ev_code code);
/* Looks a wire name up; EV_CODE_NONE when unknown. */
enum ev_code ev_code_from_name(const char *name);

/* seq numbering: starts at 0, +1 per event, never repeats or skips within
 * a request. A resumed request starts at one past the last published seq. */
struct ev_seq {
    int64_t next; /* the seq the next event gets */
};
static inline void ev_seq_init(struct ev_seq *s) { s->next = 0; }
/* Resume after events 0..last_seen were found published (-1: none). */
static inline void ev_seq_resume(struct ev_seq *s, int64_t last_seen) { s->next = last_seen + 1; }
static inline int64_t ev_seq_take(struct ev_seq *s) { return s->next++; }

/* The stream entry ID that event seq is written under: "0-<seq+1>".
 * Explicit, monotone IDs make XADD idempotent: re-sending an event that
 * did land, or a second worker writing a seq already there, fails with
 * Redis's "equal or smaller" error instead of duplicating it. buf needs
 * EV_STREAM_ID_MAX bytes. Returns buf. */
#define EV_STREAM_ID_MAX 32
char *ev_stream_id(int64_t seq, char buf[EV_STREAM_ID_MAX]);

/* One sampled token's log-probability, with optional alternatives, and
 * optionally the bytes of each token (what the tokenizer maps the id to,
 * byte-level decoded; not always valid UTF-8 on its own), written as the
 * `bytes` array of ints so that an OpenAI front door can show the token's
 * text without a tokenizer of its own. */
struct ev_logprob {
    int32_t token_id;
    float logprob;
    int n_top;              /* entries in top_ids/top_logprobs, may be 0 */
    const int32_t *top_ids; /* (n_top) */
    const float *top_logprobs; /* (n_top) */
    const char *bytes;      /* (n_bytes) the token's bytes; NULL: `bytes` left out */
    size_t n_bytes;
    const char *const *top_bytes; /* (n_top) each NULL or (top_n_bytes[k]); NULL: left out */
    const size_t *top_n_bytes;    /* (n_top) */
};

/* A delta: new text since the last event. content and reasoning_content
 * may be NULL (left out of the JSON); lengths are in bytes, the text must
 * be valid UTF-8 (the streaming decoder only emits whole characters).
 * logprobs is NULL or has n_token_ids entries. */
struct ev_delta {
    const char *content;
    size_t content_len;
    const char *reasoning_content;
    size_t reasoning_len;
    const int32_t *token_ids; /* (n_token_ids) */
    int n_token_ids;
    const struct ev_logprob *logprobs; /* (n_token_ids) or NULL */
    /* Tool calls being generated, or NULL (borrowed, copied into the event):
     * an array of {"index", "id"?, "type"?, "function": {"name"?,
     * "arguments"}}, the arguments a fragment; id, type and name on a
     * call's first fragment only (schemas/README.md, "Streamed tool
     * calls"). */
    const struct cJSON *tool_calls;
};

enum ev_finish {
    EV_FINISH_STOP = 0,   /* EOS or a stop string */
    EV_FINISH_LENGTH,     /* max_tokens reached */
    EV_FINISH_CANCELLED,  /* redlm:cancel:<id> was set */
    EV_FINISH_DEADLINE,   /* deadline_ms passed */
    EV_FINISH_ERROR,      /* an error event precedes this done */
};
/* "stop", "length", ...; NULL for values outside the enum. */
const char *ev_finish_name(enum ev_finish f);

struct ev_done {
    enum ev_finish finish_reason;
    int64_t prompt_tokens;
    int64_t completion_tokens;   /* includes reasoning tokens */
    int64_t reasoning_tokens;
    int64_t cached_prompt_tokens; /* prefix-cache hits in the prompt */
    bool cached;                 /* replayed from the result cache */
    int64_t queue_ms, ttft_ms, total_ms;
    bool speculated;             /* the job ran with speculative decoding:
                                    timings then give the counts below */
    int64_t spec_drafted;        /* draft tokens verified */
    int64_t spec_accepted;       /* of those, kept */
    const struct cJSON *tool_calls; /* array or NULL (written as []); borrowed */
    const struct cJSON *metadata;   /* the job's metadata or NULL (left out); borrowed */
    const float *embedding;         /* task "embed": (n_embedding) the vector (unit
                                       length unless the job said normalize false),
                                       written as `embedding` (base64 of its float32
                                       values, little-endian) and `dimensions`;
                                       NULL: left out. Borrowed */
    int n_embedding;
    bool has_score;                 /* task "rerank": `score`, the relevance in [0, 1] */
    double score;
    const char *matched_stop;       /* finish "stop" at one of the job's stop strings:
                                       that string, written as `matched_stop`; NULL:
                                       left out (eos, a stop id, other finishes).
                                       Borrowed */
};

/* Builders. Each returns 0 and sets *out to a malloc'd string, or a
 * negative code (RL_EINVAL for bad arguments, RL_ENOMEM). */
int ev_build_delta(int64_t seq, const struct ev_delta *d, char **out, struct rl_err *err);
int ev_build_done(int64_t seq, const struct ev_done *d, char **out, struct rl_err *err);
/* message: one sentence naming the problem; NULL is replaced by the
 * code's meaning. */
int ev_build_error(int64_t seq, enum ev_code code, const char *message, char **out,
                   struct rl_err *err);

/* ev_build_error with a retry_after_ms field (>= 0): when the client may
 * send the request again. The dispatcher's OVERLOADED answer. */
int ev_build_error_retry(int64_t seq, enum ev_code code, const char *message,
                         int64_t retry_after_ms, char **out, struct rl_err *err);

/* A dead letter: the job as received (kept as a JSON string, since it may
 * not be JSON), why it died, and who killed it. The result is always valid
 * JSON text in UTF-8, whatever bytes the job had: a byte that does not
 * start a well-formed UTF-8 character (or a NUL) becomes U+FFFD, and the
 * job string stops before EV_DEAD_JOB_MAX bytes (never inside a
 * character), so a 10 MB job does not make a 10 MB dead letter. When
 * either happened the letter also says job_bytes (the size received),
 * job_truncated and job_replaced_bytes. message gets the same repair. */
#define EV_DEAD_JOB_MAX 16384
/* A letter's whole text is at most this long: a job whose escaped JSON
 * would make it longer (control characters, quotes) is cut shorter, so the
 * dead-letter stream is bounded in bytes by its length (config
 * dead_max_mb). */
#define EV_DEAD_LETTER_MAX 20480
struct ev_dead {
    const char *job_raw;  /* may be NULL when the entry had no job field */
    size_t job_raw_len;
    const char *job_id;   /* "" or NULL when the job had none usable */
    const char *pool;     /* the pool stream it came from */
    const char *entry_id; /* its stream entry ID */
    enum ev_code code;
    const char *message;
    const char *worker;
    int64_t deliveries;   /* delivery count when it died, 0 if unknown */
    int64_t time_ms;      /* Unix ms when it died */
};
int ev_build_dead(const struct ev_dead *d, char **out, struct rl_err *err);

/* Stamps the first event of a stream (seq 0) with the identity of the job
 * it answers: adds "request": {"entry": entry, "job_sha256": sha}, where
 * entry is the stream entry ID its client's XADD returned and sha the
 * job_sha256 of the job text it sent (schemas/README.md, "Job identity").
 * *json is replaced by a new malloc'd string (the old one freed); on
 * failure it is left as it was. Returns 0, -RL_EFORMAT or -RL_ENOMEM. */
int ev_stamp_request(char **json, const char *entry, const char *sha, struct rl_err *err);

/* What a reader of already-published events (resumption, cache replay,
 * tests) needs back from one event string. */
enum ev_type { EV_TYPE_DELTA = 1, EV_TYPE_DONE, EV_TYPE_ERROR };
struct ev_info {
    enum ev_type type;
    int64_t seq;
    int n_token_ids;     /* delta only */
    int32_t *token_ids;  /* (n_token_ids) malloc'd, owned by the ev_info */
    enum ev_finish finish_reason; /* done only */
    enum ev_code code;            /* error only; EV_CODE_NONE if not ours */
};
/* Parses one event; on success the caller calls ev_info_clear(). Returns
 * -RL_EFORMAT naming what is wrong. */
int ev_parse(const char *json, size_t len, struct ev_info *out, struct rl_err *err);
void ev_info_clear(struct ev_info *info);

#endif
