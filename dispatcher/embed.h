/* dispatcher/embed.h - the embedding endpoints' wire formats on one side,
 * redlm embedding jobs (task "embed", schemas/README.md "Embeddings") and
 * their done events on the other:
 *
 *   POST /v1/embeddings   OpenAI's: input a string, a list of strings, a
 *                         list of token ids or a list of those; the vectors
 *                         as float lists or base64 (encoding_format)
 *   POST /api/embed       Ollama's: input a string or a list of strings
 *   POST /api/embeddings  Ollama's older one: one prompt, one vector
 *
 * Pure conversion, as openai.c and compat.c: no I/O, no clock, no
 * randomness. The caller (http.c) passes the request id, the deadline and
 * the time the request took, so the unit tests (tests/unit/test_embed.c)
 * and the fuzzer (tests/fuzz/fuzz_embed.c) drive every function here.
 *
 * Request side: emb_parse() turns a body into one embedding job per input,
 * in input order, in the oai_request that http.c already queues and reads
 * for several choices (n_jobs, jobs[], ids "<id>-<i>", one job: id <id>);
 * each job is checked by job_parse() before anything is queued.
 *
 * Response side: an emb_resp is fed the events of the jobs' streams one
 * after the other (each job's stream holds one done event), answering
 * OAI_NEXT after each job but the last, and OAI_END after that one; then
 * emb_resp_body() builds the one response object. There is no stream. */
#ifndef RL_EMBED_H
#define RL_EMBED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "openai.h"

enum emb_api {
    EMB_OPENAI = 0,    /* POST /v1/embeddings */
    EMB_OLLAMA_EMBED,  /* POST /api/embed */
    EMB_OLLAMA_LEGACY, /* POST /api/embeddings */
};

/* The most inputs one request may hold: OpenAI's own limit, which is also
 * what its clients send at most in one call (the AI SDK's
 * maxEmbeddingsPerCall; LangChain batches 512). Each input is one job,
 * queued at once, and the workers run them side by side. */
#define EMB_INPUTS_MAX 2048

/* What the response side needs of the request, beside the oai_request. */
struct emb_request {
    enum emb_api api;
    bool base64;    /* OpenAI encoding_format "base64": the done event's string as it is */
    int n_inputs;   /* the jobs (oai_request.n_jobs, or 1) */
    /* Ollama with no input (absent, "" for /api/embed and /api/embeddings,
     * [] for /api/embed): no job; the answer is the empty one at once
     * (emb_empty_body), which is what Ollama does to load a model */
    bool load_only;
};

/* Parses one body of api (len bytes, need not be NUL-terminated); lim as
 * for oai_parse_request (model, refuse_unknown, job limits,
 * client_lease_ms), id the job id (several inputs: "<id>-<i>"),
 * deadline_ms > 0 written as each job's deadline_ms. Returns 0 and fills
 * *out (oai_request_clear frees it; out->stream is false) and *c, or
 * -RL_EINVAL with *e filled (400 naming the member in param, 404 for
 * another model, 413 for a body over the limit), or -RL_ENOMEM (e: 500).
 * Nothing is allocated on failure. */
int emb_parse(enum emb_api api, const char *body, size_t len, const struct oai_limits *lim,
              const char *id, int64_t deadline_ms, struct oai_request *out,
              struct emb_request *c, struct oai_error *e);

struct emb_resp;

/* model: the name to echo (copied). Returns 0 or -RL_ENOMEM. */
int emb_resp_create(struct emb_resp **out, const struct emb_request *c, const char *model,
                    struct rl_err *err);
void emb_resp_free(struct emb_resp *r);

/* Feeds the next event of the current job's stream. Returns OAI_MORE
 * (nothing yet: a delta, which an embedding job should not write, is
 * skipped), OAI_NEXT (this job is done, read the next job's stream from
 * its start), OAI_END (the last job is done), OAI_FAILED with *e (an error
 * event, with param renamed to this API's input member; a done without a
 * well-formed embedding of `dimensions` finite float32 values: 502
 * BAD_EVENT), or -RL_ENOMEM. After OAI_END or OAI_FAILED it answers the
 * same again. */
int emb_resp_feed(struct emb_resp *r, const char *event, size_t len, struct oai_error *e);

/* After OAI_END: the response object, compact JSON, malloc'd; NULL when
 * out of memory or before the end. total_ms: how long the request took,
 * Ollama's total_duration (in ns there). Floats are printed with %.9g,
 * which reads back to the very same float32. */
char *emb_resp_body(const struct emb_resp *r, int64_t total_ms);

/* Prompt tokens summed over the jobs, after OAI_END; 0 before. */
int64_t emb_resp_total_tokens(const struct emb_resp *r);

/* The answer to a load_only request: Ollama's {"model", "embeddings": []}
 * or {"embedding": []}. malloc'd; NULL when out of memory. */
char *emb_empty_body(enum emb_api api, const char *model);

/* The error body of api: OpenAI's error object, Ollama's {"error": "..."}.
 * malloc'd; NULL when out of memory. */
char *emb_error_json(enum emb_api api, const struct oai_error *e);

#endif
