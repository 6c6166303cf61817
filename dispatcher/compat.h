/* dispatcher/compat.h - the other wire formats clients speak, over the same
 * jobs: OpenAI's Responses API (POST /v1/responses), Ollama's API
 * (POST /api/chat, POST /api/generate) and Anthropic's Messages API
 * (POST /v1/messages; its conversions are anthropic.c's).
 *
 * Pure conversion, as openai.c: no I/O, no clock, no randomness; the
 * caller (http.c) passes the id, the times and the deadline in.
 *
 * Request side: cpt_parse() rewrites the body into the Chat Completions
 * request it stands for and hands that to oai_parse_request() (or, for an
 * Ollama raw generate, oai_parse_completion()), so every field is checked
 * by the one parser and the job is the one job_parse accepts. Errors name
 * the field of the body the client sent where the rewrite knows it
 * ("input[2].type"), else the chat field it became.
 *
 * Response side: a cpt_resp is fed the events of redlm:out:<id> as
 * oai_resp is. Responses: server-sent events with the Responses API's
 * names (`event: response.output_text.delta` + `data: {...}` with type and
 * sequence_number), or one `response` object. Ollama: NDJSON lines
 * ({"model","created_at","message":{...},"done":false} ... the final one
 * with done, done_reason and the counts), or one object. */
#ifndef RL_COMPAT_H
#define RL_COMPAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "openai.h"

enum cpt_api {
    CPT_RESPONSES = 0,   /* POST /v1/responses */
    CPT_OLLAMA_CHAT,     /* POST /api/chat */
    CPT_OLLAMA_GENERATE, /* POST /api/generate */
    CPT_ANTHROPIC,       /* POST /v1/messages */
    CPT_ANTHROPIC_COUNT, /* POST /v1/messages/count_tokens: parsed only (the
                            job it would be, to render and count) */
};

/* What the response side needs of the request, beside the oai_request. */
struct cpt_request {
    enum cpt_api api;
    /* Responses: the request's fields echoed in the response object
     * (instructions, tools, tool_choice, text, reasoning, temperature,
     * top_p, max_output_tokens, metadata), compact JSON object, malloc'd
     * (NULL for Ollama) */
    char *echo;
    /* Ollama generate with an empty prompt: no job, the answer is the
     * "model loaded" object at once (what Ollama does to preload) */
    bool load_only;
    /* Anthropic: thinking.display "omitted" */
    bool omit_thinking;
    /* Responses: the conversation up to this request as input items (the
     * stored context it continues, then its own input), compact JSON
     * array, malloc'd: what rstore.h keeps. NULL for the other APIs. */
    char *input;
    /* Responses: the previous_response_id it continues ("" for none) */
    char previous_id[129];
    /* Responses: the conversation it runs in ("" for none): its items are
     * the context given to cpt_parse_responses, and the caller adds the
     * request's input and output to it at the end (convo.h) */
    char conversation[129];
    /* Responses: store (true unless the request said false); the caller
     * clears it when it keeps no responses, before cpt_resp_create */
    bool store;
    /* Responses: background (its client reads it later: GET
     * /v1/responses/{id}); always with store */
    bool background;
    /* Responses, background: its client cancelled it (the answer says
     * "cancelled" before the job's end says so) */
    bool cancelled;
};
void cpt_request_clear(struct cpt_request *c);

/* Parses one body of api (len bytes). id becomes the job id. Returns 0 and
 * fills *out (oai_request_clear) and *c (cpt_request_clear), or
 * -RL_EINVAL with *e filled (400; 404 for another model; 413), or
 * -RL_ENOMEM (e: 500). On failure out->stream still says whether the
 * client wanted a stream. A previous_response_id is not found here (400
 * `previous_response_not_found`): cpt_parse_responses continues one. */
int cpt_parse(enum cpt_api api, const char *body, size_t len, const struct oai_limits *lim,
              const char *id, int64_t deadline_ms, struct oai_request *out,
              struct cpt_request *c, struct oai_error *e);

/* A Responses body whose previous_response_id names a stored response:
 * prior is that response's conversation (rst_context: a JSON array of
 * input items), which goes before the input, after the instructions.
 * prior NULL: as cpt_parse. */
int cpt_parse_responses(const char *body, size_t len, const char *prior,
                        const struct oai_limits *lim, const char *id, int64_t deadline_ms,
                        struct oai_request *out, struct cpt_request *c, struct oai_error *e);

/* What the front door must know of a Responses body before it parses it:
 * whether it continues a stored response (read from Redis first, for
 * cpt_parse_responses) and whether it runs in the background (its job then
 * carries no client lease and no deadline: nobody waits for it). */
struct cpt_peek {
    bool continues;         /* previous_response_id is a string */
    char previous_id[129];  /* that string; "" when longer (it names no response) */
    bool background;        /* background: true */
    bool in_conversation;   /* conversation is a string or {"id": string} */
    char conversation[129]; /* that id; "" when longer (it names none) */
};
void cpt_responses_peek(const char *body, size_t len, struct cpt_peek *out);

struct cpt_resp;

/* id: the response id; model: the name to echo; created_ms: Unix
 * milliseconds. c's echo is copied. Returns 0 or -RL_ENOMEM. */
int cpt_resp_create(struct cpt_resp **out, const struct cpt_request *c, const char *id,
                    const char *model, int64_t created_ms, bool stream, struct rl_err *err);
void cpt_resp_free(struct cpt_resp *r);

/* Responses, stream: the events numbered up to after are not written (a
 * stream resumed where its client left it: starting_after). The numbers
 * are the same on every replay of the same job events. */
void cpt_resp_resume(struct cpt_resp *r, int64_t after);

/* As oai_resp_feed: the bytes of a stream are appended to *out; returns an
 * enum oai_feed or -RL_ENOMEM. */
int cpt_resp_feed(struct cpt_resp *r, const char *event, size_t len, struct text *out,
                  struct oai_error *e);

/* A stream that fails after its first bytes: Responses `event: error`
 * (type error, code, message, param); Ollama {"error": "..."} as the last
 * line. */
int cpt_stream_error(const struct cpt_resp *r, const struct oai_error *e, struct text *out);

/* Bytes that change nothing for a streaming client, for a silence that
 * must be broken (a proxy's idle timeout, probing a half-closed client):
 * Responses an SSE comment; Ollama a line with empty content and done
 * false, since NDJSON has no comments and its readers parse every line. */
int cpt_keepalive(const struct cpt_resp *r, struct text *out);

/* Non-stream, after OAI_END: the response object, malloc'd; NULL when out
 * of memory. */
char *cpt_resp_body(const struct cpt_resp *r);

/* Responses with store, after OAI_END: the response object as the client
 * gets it (store: true), to keep (rstore.h); malloc'd. NULL otherwise, or
 * when out of memory. */
char *cpt_resp_stored(const struct cpt_resp *r);

/* Responses: the response object as it stands, malloc'd: a background
 * one "queued" before its first event, "in_progress" while it runs (the
 * output items come with the end), then completed, incomplete, cancelled
 * (background), or "failed" with its error. NULL for the other APIs or
 * when out of memory. */
char *cpt_resp_object(const struct cpt_resp *r);

/* prompt + completion tokens after OAI_END, else 0. */
int64_t cpt_resp_total_tokens(const struct cpt_resp *r);

/* The error body of api: Responses the OpenAI error object
 * (oai_error_json); Ollama {"error": "message"}; Anthropic its error
 * object (ant_error_json). malloc'd, NULL when out of
 * memory. */
char *cpt_error_json(enum cpt_api api, const struct oai_error *e);

/* Ollama's "model loaded" answer to an empty generate: compact JSON,
 * malloc'd. */
char *cpt_ollama_loaded(const char *model, int64_t created_ms);

/* created_ms as Ollama's created_at, "2026-12-04T18:14:52.123Z". */
void cpt_iso_time(int64_t ms, char out[32]);

#endif
