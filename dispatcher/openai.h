/* dispatcher/openai.h - the OpenAI Chat Completions wire format on one side,
 * redlm jobs and events on the other; and the API-key table.
 *
 * Pure conversion: no I/O, no clock, no randomness. The caller (http.c)
 * passes the request id, the creation time and the deadline in, so the
 * unit tests (tests/unit/test_openai.c) and the fuzzer
 * (tests/fuzz/fuzz_openai.c) drive every function here directly.
 *
 * Request side: oai_parse_request() turns a POST /v1/chat/completions body
 * into the job JSON that goes to redlm:requests, or into an oai_error (the
 * HTTP status and the OpenAI error object). The job is validated with
 * job_parse(), the same code the dispatcher and the worker run, so a bad
 * request is refused with a 400 before it is queued, naming the field.
 *
 * POST /v1/completions bodies go the same way (oai_parse_completion), and
 * their answers are text_completion objects and chunks.
 *
 * Response side: an oai_resp is fed the events of redlm:out:<id> one at a
 * time. In stream mode each event turns at once into the server-sent-event
 * bytes it stands for, appended to a caller's buffer; nothing is held back.
 * In non-stream mode it accumulates the text and builds one
 * chat.completion object at the end. */
#ifndef RL_OPENAI_H
#define RL_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "job.h"
#include "text.h" /* the buffers SSE, bodies and /metrics pages are built in */

typedef struct cJSON cJSON;

/* What a request may ask for; from the dispatcher's options. */
struct oai_limits {
    size_t max_body_bytes;      /* 413 above (max_body_kb) */
    int max_messages;           /* 400 above (max_messages) */
    int max_tokens;             /* the largest max_tokens / max_completion_tokens (http_max_tokens) */
    const char *model;          /* the one served model name (served_model_name); borrowed.
                                   NULL: any name, copied into the job's `model` (the host
                                   checks it against the models workers serve) */
    /* with model set: a request naming another model may mean one of its
     * LoRA adapters (served_models lists them): the name is copied into the
     * job's `model` as with model NULL, for the host to check, instead of
     * being refused here */
    bool adapters;
    const struct job_opts *job; /* job_parse limits; NULL: job_opts_default() */
    /* The mode of a chat request that chooses none (no mode,
     * chat_template_kwargs.enable_thinking, reasoning_effort, nor a /think
     * or /no_think soft switch in its last user message): JOB_MODE_THINK
     * or JOB_MODE_NO_THINK is written into the job; JOB_MODE_POOL or
     * JOB_MODE_AUTO writes none, leaving it to the router (rules,
     * think_ratio). From http_default_mode. */
    enum job_mode default_mode;
    /* > 0: written as the job's client_lease_ms (the host renews the
     * lease key while its client waits: http_client_lease_ms) */
    int client_lease_ms;
    /* > 0: written as the job's stream_ttl_s (a background response's
     * events live as long as its record, which is read back from them) */
    int stream_ttl_s;
    /* What to do with a member the API does not know, or a value it
     * accepts but does not apply (stream_options.continuous_usage_stats,
     * chat_template_kwargs other than enable_thinking, ...):
     * false: accept it and name it in oai_request.ignored (vLLM's way);
     * true: 400 (UNKNOWN_FIELD / BAD_VALUE). From http_unknown_fields. */
    bool refuse_unknown;
};
/* 4 MiB body, 1024 messages, 32768 tokens, model "redlm", job NULL,
 * default_mode JOB_MODE_POOL (none written), refuse_unknown true (the
 * front door's default, http_unknown_fields = ignore, turns it off). */
void oai_limits_default(struct oai_limits *l);

/* An error as the client sees it: the HTTP status and the fields of the
 * OpenAI error object {"error": {"message", "type", "param", "code"}}. */
#define OAI_CODE_MAX 48
struct oai_error {
    int status;                  /* 400, 401, 404, 405, 413, 429, 500, 502, 503, 504 */
    const char *type;            /* static: "invalid_request_error", "server_error", ... */
    char code[OAI_CODE_MAX];     /* "" is written as null */
    char param[JOB_FIELD_MAX];   /* "" is written as null */
    char message[RL_ERR_MSG_MAX];
    int retry_after_s;           /* > 0: the response carries Retry-After */
};

/* Fills *e; code and param may be NULL. */
void oai_error_set(struct oai_error *e, int status, const char *type, const char *code,
                   const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error":{...}} as compact JSON, malloc'd; NULL when out of memory. */
char *oai_error_json(const struct oai_error *e);
/* The status and error object for an error event of the queue: code is the
 * event's code (UNKNOWN_FIELD ... OVERLOADED), retry_after_ms the event's
 * retry_after_ms (0 if absent). Validation codes give 400 (JOB_TOO_LARGE
 * 413, PROMPT_TOO_LONG 400 with code context_length_exceeded), OVERLOADED
 * 503 with Retry-After, DEADLINE_EXCEEDED 504, the rest 500. */
void oai_error_from_event(const char *code, const char *message, int64_t retry_after_ms,
                          struct oai_error *e);

/* The endpoint a request came to. */
enum oai_api {
    OAI_API_CHAT = 0,    /* POST /v1/chat/completions */
    OAI_API_COMPLETIONS, /* POST /v1/completions (the legacy text API) */
};

#define OAI_IGNORED_MAX 256

/* A parsed request. */
struct oai_request {
    enum oai_api api;
    bool stream;
    bool include_usage;   /* stream_options.include_usage */
    bool logprobs;        /* choices[].logprobs wanted */
    int top_logprobs;     /* alternatives per token, 0..20 */
    char model[JOB_MODEL_MAX + 1]; /* the request's model when lim->model is NULL, or when it
                                      is not lim->model and lim->adapters; else "" */
    char *job;            /* the job JSON for redlm:requests, NUL-terminated, malloc'd */
    size_t job_len;
    /* the members (and values) accepted but not applied, ", "-separated
     * in body order ("frobnicate, chat_template_kwargs.x"),
     * cut at the size with ", ..."; "" when none (lim->refuse_unknown
     * refuses them instead) */
    char ignored[OAI_IGNORED_MAX];
    /* several choices (n > 1 and/or batched completions prompts, issue
     * 29): one job per choice, choice i = prompt i / n_per_prompt, sample
     * i % n_per_prompt, job id "<id>-<i>"; job is jobs[0]. n_jobs 0 or 1:
     * one job, id <id>, jobs NULL */
    int n_jobs, n_per_prompt;
    char **jobs;          /* (n_jobs) job texts, malloc'd */
    size_t *job_lens;     /* (n_jobs) */
    char **echo;          /* completions' echo: (n_jobs) the prompt text to put
                             before each choice's text; NULL when not asked */
};
/* The most choices one request may ask for (n times prompts). */
#define OAI_CHOICES_MAX 64
void oai_request_clear(struct oai_request *r);

/* Parses and checks one request body (len bytes, need not be
 * NUL-terminated). id becomes the job id (and the completion id);
 * deadline_ms > 0 is written as the job's deadline_ms. Returns 0 and fills
 * *out (oai_request_clear frees it), or -RL_EINVAL with *e filled (400,
 * 404 for another model, 413 for a body over the limit), or -RL_ENOMEM
 * (e: 500). Nothing is allocated on failure. */
int oai_parse_request(const char *body, size_t len, const struct oai_limits *lim, const char *id,
                      int64_t deadline_ms, struct oai_request *out, struct oai_error *e);

/* The same for a POST /v1/completions body: prompt (a string, token ids,
 * or a list of those: one choice per prompt) instead of messages; logprobs
 * is the number of alternatives (0..20); echo with text prompts and
 * without logprobs; suffix only "" (400 otherwise: Qwen3 has no
 * fill-in-the-middle training), best_of only 1 (or n); the job's mode is
 * no_think (raw text is continued as it is). */
int oai_parse_completion(const char *body, size_t len, const struct oai_limits *lim,
                         const char *id, int64_t deadline_ms, struct oai_request *out,
                         struct oai_error *e);

/* Shared by the other request parsers (compat.c, embed.c), so every API
 * checks a body and treats unknown members alike. */

/* The body as a JSON object: its size (413 past lim->max_body_bytes), its
 * text (job_check_text, as a job's strings are checked), its syntax, an
 * object. *buf (the NUL-terminated copy) and *root are the caller's to
 * free (free, cJSON_Delete), whatever the result. Returns 0, -RL_EINVAL
 * with *e filled, or -RL_ENOMEM (*e untouched). */
int oai_parse_body(const char *body, size_t len, const struct oai_limits *lim, char **buf,
                   cJSON **root, struct oai_error *e);

/* A member (or value) accepted but not applied: named in out->ignored
 * (", "-separated, cut with ", ..."), or, with lim->refuse_unknown, a 400
 * of code naming it in param, its message "<name>: <why>". Returns 0 or
 * -RL_EINVAL. */
int oai_not_applied(const struct oai_limits *lim, struct oai_request *out, const char *name,
                    const char *code, const char *why, struct oai_error *e);

/* Helpers the other wire formats (compat.c, embed.c) share with this one.
 * oai_bad_request: fills *e as a 400 invalid_request_error (code and
 * param may be NULL) and returns -RL_EINVAL. */
int oai_bad_request(struct oai_error *e, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A JSON number with an integral, finite value. */
bool oai_is_integer(const cJSON *v);
/* Member k of o as a string (NULL when absent or not one), and as a
 * count (a number in [0, 9e15), else 0: the usage of an event). */
const char *oai_str_member(const cJSON *o, const char *k);
int64_t oai_int_member(const cJSON *o, const char *k);

/* A body member a table-driven parser knows (embed.c, rerank.c): its
 * name, the parser's tag for it, and the APIs that take it (a bit per
 * API, the parser's own numbering). */
struct oai_member {
    const char *name;
    int tag;
    unsigned apis;
};
/* Walks root's members in body order, so the first bad one is the one
 * reported: one the table lacks for api_bit goes to oai_not_applied (the
 * http_unknown_fields policy), or, when the table's last entry has a NULL
 * name, to take with that entry's tag (a door that passes the others on
 * to openai.c); one given twice is DUPLICATE_FIELD, null is absent (as
 * OpenAI reads it), any other goes to take(ctx, tag, name, value).
 * Returns 0 or take's / the refusal's code with *e filled. */
int oai_walk_members(const cJSON *root, const struct oai_member *table, int n, unsigned api_bit,
                     const struct oai_limits *lim, struct oai_request *out, struct oai_error *e,
                     int (*take)(void *ctx, int tag, const char *name, const cJSON *v),
                     void *ctx);
/* One event of a one-pass job's stream (an embedding or rerank job: one
 * done event and nothing else). *next_seq is the seq expected, moved past
 * a valid event. Returns OAI_END with *done the parsed done event (the
 * caller frees it with cJSON_Delete), OAI_MORE for a delta (none is
 * expected: skipped), or OAI_FAILED with *e: the error event's (its
 * status, code, message and param, oai_error_from_event), or 502
 * BAD_EVENT for a malformed event (what names the job in the sentence:
 * "input 3"). */
int oai_onepass_event(const char *event, size_t len, int64_t *next_seq, const char *what,
                      cJSON **done, struct oai_error *e);

/* A request's model member: the one served name (lim->model; another is
 * a 404 model_not_found), or any name, into out for the jobs to carry (the
 * dispatcher routes by it; http.c checks a worker serves it). ollama_tag:
 * a trailing ":latest" is dropped first (Ollama's clients add it to a name
 * without a tag). Returns 0 with out "" when one model is served, or
 * -RL_EINVAL with *e filled (400 BAD_TYPE, 404). */
int oai_model_name(const cJSON *v, const struct oai_limits *lim, bool ollama_tag,
                   char out[JOB_MODEL_MAX + 1], struct oai_error *e);
/* A job_parse fault on a job the front door built, where no API's words
 * are needed: a member of its own making at fault (id, deadline_ms, or
 * own when not NULL) is its bug, a 500; a job over the size limit is a
 * 413. Returns true with *e filled so; false for a fault the caller
 * names in its API's words. */
bool oai_fault_settled(const struct job_fault *f, const struct rl_err *jerr, const char *own,
                       struct oai_error *e);
/* The end of every job a one-pass endpoint builds (j: its own members
 * already in): mode no_think (an embedding or a score has no thinking to
 * route for: the fast pool, and the think ratio's count is left alone),
 * the deadline (deadline_ms > 0) and the client lease, printed, then
 * checked by job_parse, the code the dispatcher and the worker run. j is
 * consumed. Returns 0 with *text malloc'd; job_parse's refusal with
 * *fault and *jerr filled; or -RL_ENOMEM. */
int oai_seal_job(cJSON *j, const struct oai_limits *lim, int64_t deadline_ms, char **text,
                 struct job_fault *fault, struct rl_err *jerr);
/* Lays n jobs out in *out as several choices are (out->job alone, id id,
 * for one; out->jobs with ids "<id>-<i>" and job = jobs[0] for several),
 * so http.c queues and reads them alike: build(ctx, i, jid, &text) makes
 * job i. Returns 0 or build's code (what was built stays in *out, for
 * oai_request_clear). */
int oai_lay_out_jobs(struct oai_request *out, int n, const char *id,
                     int (*build)(void *ctx, int i, const char *jid, char **text), void *ctx);

/* ---- responses ---- */

struct oai_resp;

enum oai_feed {
    OAI_MORE = 0, /* keep reading events */
    OAI_END,      /* done seen: the response is complete */
    OAI_FAILED,   /* an error event or a broken stream: *e says what */
    OAI_NEXT,     /* (several choices) the current choice's job is done and
                     the next choice's job follows: read from the start of
                     its stream (oai_request.jobs[i], id "<id>-<i>") */
};

/* id: the completion id; model: the name to echo; created: Unix seconds.
 * Strings are copied. Returns 0 or -RL_ENOMEM. */
int oai_resp_create(struct oai_resp **out, const char *id, const char *model, int64_t created,
                    const struct oai_request *req, struct rl_err *err);
void oai_resp_free(struct oai_resp *r);

/* Feeds the next event (the `event` field of the next entry of
 * redlm:out:<id>). In stream mode the SSE bytes it produces ("data:
 * {chunk}\n\n" lines; after done also the usage chunk and "data: [DONE]")
 * are appended to *sse; in non-stream mode nothing is. Returns an enum
 * oai_feed, or -RL_ENOMEM. After OAI_END or OAI_FAILED further events are
 * ignored (OAI_END / OAI_FAILED again). */
int oai_resp_feed(struct oai_resp *r, const char *event, size_t len, struct text *sse,
                  struct oai_error *e);

/* Gives each tool call of the array (a done event's tool_calls, OpenAI
 * shape) an id unique to the request: "call_<the id's random part>_<i>".
 * The worker numbers calls call_1, call_2 in each job, which repeat from
 * request to request and confuse clients that key on them. */
void oai_tool_call_ids(cJSON *tool_calls, const char *request_id);
/* The id oai_tool_call_ids gives call i, into out (JOB_ID_MAX + 32 bytes
 * suffice): a call streamed before done gets the same id there. */
void oai_tool_call_id(char *out, size_t n, const char *request_id, int i);

/* The tool calls of one stream whose arguments went out in fragments
 * (worker delta events' delta.tool_calls, schemas/README.md "Streamed
 * tool calls"), shared by the chat and Responses streams. */
struct oai_tc_stream {
    struct text *args; /* (n) the arguments sent so far, per index */
    int n;                /* calls opened */
};
/* One delta.tool_calls entry: *index and *frag (the fragment, "" if none),
 * *opens when it opens call *index (it names it: *name). Returns 1 when
 * the entry is to be passed on, 0 when it is to be dropped (an index out
 * of order, no name on a new call), -RL_ENOMEM. */
int oai_tc_entry(struct oai_tc_stream *s, const cJSON *entry, int *index, bool *opens,
                 const char **name, const char **frag);
/* At done, for call i with final arguments `final`: what is left to send
 * after the fragments (NULL when call i was not streamed, or "" when all
 * was sent). A stream whose fragments are not a prefix of final (cannot
 * happen with a conforming worker) gets NULL too, and the full call. */
const char *oai_tc_rest(const struct oai_tc_stream *s, int i, const char *final);
/* Each entry of a delta's tool_calls array through oai_tc_entry, the ones
 * to pass on given to fn (its ctx, the call's index, whether the entry
 * opens it and then its name, the fragment, "" if none). Returns 0, fn's
 * first non-zero return, or -RL_ENOMEM. */
typedef int (*oai_tc_fn)(void *ctx, int index, bool opens, const char *name, const char *frag);
int oai_tc_each(struct oai_tc_stream *s, const cJSON *tool_calls, oai_tc_fn fn, void *ctx);
void oai_tc_free(struct oai_tc_stream *s);

/* Stream mode, after OAI_FAILED once bytes were sent: the error as one
 * SSE event ({"error": {...}}) followed by "data: [DONE]". */
int oai_sse_error(const struct oai_error *e, struct text *sse);

/* Non-stream mode, after OAI_END: the chat.completion object (for
 * completions: the text_completion object), malloc'd compact JSON; NULL
 * when out of memory. */
char *oai_resp_completion(const struct oai_resp *r);

/* Tokens the request used, after OAI_END (for the tokens-per-minute limit):
 * prompt + completion. 0 before. */
int64_t oai_resp_total_tokens(const struct oai_resp *r);

/* ---- API keys ----
 *
 * The keys file (option api_keys_file): one key per line,
 *     KEY TENANT [RPM [TPM]]
 * KEY: 8-256 printable ASCII characters without spaces (the value of
 * "Authorization: Bearer KEY"); TENANT: 1-64 of [A-Za-z0-9_.-], several
 * keys may share one and then share its limits; RPM: requests per minute,
 * TPM: prompt + completion tokens per minute, 0 or absent = no limit.
 * Blank lines and lines starting with # are ignored. Only SHA-256 digests
 * of the keys are kept in memory, and a key is found by comparing every
 * digest in full (no early exit), so neither memory dumps nor response
 * times give a key away. */
#define OAI_TENANT_MAX 64
struct oai_key {
    uint8_t digest[32];               /* SHA-256 of the key */
    char tenant[OAI_TENANT_MAX + 1];
    int64_t rpm, tpm;                 /* 0 = no limit */
};
struct oai_keys {
    int n;
    struct oai_key *v; /* (n) */
};
/* Parses a keys file's text; errors read "PATH:LINE: reason". Returns 0
 * and fills *out (oai_keys_free), or -RL_EINVAL / -RL_ENOMEM. */
int oai_keys_parse(const char *text, size_t len, const char *path, struct oai_keys *out,
                   struct rl_err *err);
void oai_keys_free(struct oai_keys *k);
/* The entry for the value of an Authorization header ("Bearer KEY"), or
 * NULL for a missing, malformed or unknown key. */
const struct oai_key *oai_keys_find(const struct oai_keys *k, const char *authorization);
/* The same for the key itself (an x-api-key header's value; spaces around
 * it ignored), NULL for NULL. */
const struct oai_key *oai_keys_lookup(const struct oai_keys *k, const char *key);

#endif
