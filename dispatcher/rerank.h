/* dispatcher/rerank.h - the rerank and score endpoints' wire formats on one
 * side, redlm rerank jobs (task "rerank", schemas/README.md "Rerank jobs")
 * and their done events on the other:
 *
 *   POST /v1/rerank, /rerank, /v2/rerank   Jina's and Cohere's rerank API,
 *                         as vLLM serves it: a query and documents; the
 *                         results sorted by relevance, cut to top_n
 *   POST /v1/score, /score  vLLM's score API: text_1 (one query, or one per
 *                         document) against text_2; the scores in input order
 *
 * Pure conversion, as openai.c and embed.c: no I/O, no clock, no
 * randomness. The caller (http.c) passes the request id, the creation time
 * and the deadline, so the unit tests (tests/unit/test_rerank.c) and the
 * fuzzer (tests/fuzz/fuzz_rerank.c) drive every function here.
 *
 * Request side: rr_parse() turns a body into one rerank job per document
 * (per pair on the score API), in document order, in the oai_request that
 * http.c already queues and reads for several choices (n_jobs, jobs[], ids
 * "<id>-<i>", one job: id <id>); each job is checked by job_parse() before
 * anything is queued.
 *
 * Response side: an rr_resp is fed the events of the jobs' streams one
 * after the other (each job's stream holds one done event carrying its
 * score), answering OAI_NEXT after each job but the last, and OAI_END after
 * that one; then rr_resp_body() builds the one response object. There is
 * no stream. */
#ifndef RL_RERANK_H
#define RL_RERANK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "openai.h"

enum rr_api {
    RR_RERANK = 0, /* POST /v1/rerank, /rerank, /v2/rerank */
    RR_SCORE,      /* POST /v1/score, /score */
};

/* The most documents (score: pairs) one request may hold: Cohere's
 * recommended most per call (1,000), rounded up. Each is one job, queued at
 * once and run by the workers side by side; a web backend reranks its
 * retriever's top k, which is tens to hundreds, and a list longer than this
 * is better split by the caller than held in one request's memory. */
#define RR_DOCUMENTS_MAX 1024

/* What the response side needs of the request, beside the oai_request. */
struct rr_request {
    enum rr_api api;
    int n_docs;            /* the jobs (oai_request.n_jobs, or 1) */
    int top_n;             /* rerank: the results kept, 1..n_docs (top_n, or all) */
    bool return_documents; /* rerank: each result carries {"text": its document} */
    /* (n_docs) rerank with return_documents: each document's text,
     * malloc'd (rr_request_clear frees them); NULL otherwise */
    char **docs;
};
void rr_request_clear(struct rr_request *c);

/* Parses one body of api (len bytes, need not be NUL-terminated); lim as
 * for oai_parse_request (model, refuse_unknown, job limits,
 * client_lease_ms), id the job id (several documents: "<id>-<i>"),
 * deadline_ms > 0 written as each job's deadline_ms. Returns 0 and fills
 * *out (oai_request_clear frees it; out->stream is false) and *c
 * (rr_request_clear), or -RL_EINVAL with *e filled (400 naming the member
 * in param, 404 for another model, 413 for a body over the limit), or
 * -RL_ENOMEM (e: 500). Nothing is allocated on failure. */
int rr_parse(enum rr_api api, const char *body, size_t len, const struct oai_limits *lim,
             const char *id, int64_t deadline_ms, struct oai_request *out, struct rr_request *c,
             struct oai_error *e);

struct rr_resp;

/* id: the response's id; model: the name to echo; created: Unix seconds
 * (the score API's); both strings copied. c is borrowed: its documents are
 * read by rr_resp_body, so c must outlive r. Returns 0 or -RL_ENOMEM. */
int rr_resp_create(struct rr_resp **out, const struct rr_request *c, const char *id,
                   const char *model, int64_t created, struct rl_err *err);
void rr_resp_free(struct rr_resp *r);

/* Feeds the next event of the current job's stream. Returns OAI_MORE
 * (nothing yet: a delta, which a rerank job should not write, is skipped),
 * OAI_NEXT (this job is done, read the next job's stream from its start),
 * OAI_END (the last job is done), OAI_FAILED with *e (an error event, its
 * param renamed to this API's member and its message led by the document's
 * index when there are several; a done without a score in [0, 1]: 502
 * BAD_EVENT), or -RL_ENOMEM. After OAI_END or OAI_FAILED it answers the
 * same again. */
int rr_resp_feed(struct rr_resp *r, const char *event, size_t len, struct oai_error *e);

/* After OAI_END: the response object, compact JSON, malloc'd; NULL when out
 * of memory or before the end. Rerank: {"id", "model", "usage":
 * {"total_tokens"}, "results": [{"index", "relevance_score", "document"?}]}
 * by relevance_score descending (ties: the lower index first), top_n of
 * them; score: {"id", "object": "list", "created", "model", "data":
 * [{"index", "object": "score", "score"}], "usage": {"prompt_tokens",
 * "total_tokens"}} in input order. */
char *rr_resp_body(const struct rr_resp *r);

/* Prompt tokens summed over the jobs, after OAI_END; 0 before. */
int64_t rr_resp_total_tokens(const struct rr_resp *r);

#endif
