/* dispatcher/http.h - the OpenAI-compatible HTTP front door.
 *
 *   POST /v1/chat/completions   stream true (server-sent events) or false
 *   POST /v1/completions        the legacy text API, the same way
 *   GET  /v1/models, /v1/models/<name>  (served_model_name, or the models
 *                                        live workers serve: hooks->models_json)
 *   POST /v1/responses          the Responses API (compat.c)
 *   POST /api/chat, /api/generate, /api/show; GET /api/tags, /api/ps,
 *        /api/version         Ollama's API (compat.c)
 *   POST /v1/embeddings; POST /api/embed, /api/embeddings
 *                               embedding jobs, OpenAI's and Ollama's (embed.c)
 *   POST /tokenize, /detokenize  vLLM's, with hooks->tok
 *   GET  /healthz (= /health, GET/POST /ping), /version, /metrics (behind the
 *        key when keys are on; with vLLM's request metrics: vmetrics.h)
 *   OPTIONS                     CORS preflight, when http_cors_origins is set
 *
 * It needs only Redis: a request becomes a job XADDed to
 * <prefix>requests (the dispatcher routes it like any other), and its
 * answer is read from <prefix>out:<id>. It knows nothing of the
 * dispatcher's insides; main() passes the hooks below. Started from the
 * dispatcher's main when the option `http` is a port (0 = off). */
#ifndef RL_DHTTP_H
#define RL_DHTTP_H

#include <stdbool.h>

#include "config.h"
#include "err.h"
#include "log.h"

struct tokenizer;
struct vm_fleet;

struct dhttp;

/* What the front door asks of its host. Both functions are called from the
 * HTTP connection threads, concurrently, so they must be thread-safe. */
struct dhttp_hooks {
    /* More Prometheus text for /metrics (the dispatcher's own), malloc'd,
     * freed by the caller with free(); NULL = none. The hook may be NULL. */
    char *(*metrics_text)(void *ctx);
    /* /healthz answers 503 while this is false. NULL = always ready. */
    bool (*ready)(void *ctx);
    /* The served models as a JSON array of OpenAI model objects, malloc'd
     * (freed by the caller). Used when served_model_name is empty: then
     * /v1/models lists them and a request must name one of them. NULL
     * hook = none served. */
    char *(*models_json)(void *ctx);
    void *ctx;
    /* The tokenizer of the dispatcher's model option (borrowed, read-only
     * after start, so the threads share it; outlives the front door), or
     * NULL: POST /tokenize and /detokenize use it, and answer 404 without. */
    const struct tokenizer *tok;
    /* The fleet's figures per served model (vmetrics.h), summed over the
     * live workers' heartbeats: fills up to max rows, returns how many.
     * /metrics merges them into vLLM's families. NULL hook = none. */
    int (*fleet)(void *ctx, struct vm_fleet *rows, int max);
};

/* Starts listening on cfg->http_bind:cfg->http with the options of cfg
 * (copied: cfg may change or go after the call). log and hooks->ctx are
 * borrowed and must outlive the front door. cfg->http == 0: *out = NULL
 * and 0 (off). The keys file, when set, must load (its errors name file
 * and line). Returns 0 or -RL_EINVAL / -RL_EIO (cannot listen) /
 * -RL_ENOMEM. */
int dhttp_start(struct dhttp **out, const struct cfg *cfg, const struct rl_log *log,
                const struct dhttp_hooks *hooks, struct rl_err *err);

/* The loopback ops listener of the option http_port: /healthz, /health
 * and /metrics on 127.0.0.1:cfg->http_port, no API key asked, with or
 * without the front door. front (borrowed, may be NULL) is the front door
 * whose counters its /metrics shows beside the dispatcher's; stop this
 * one first. http_port 0, or the front door's own port: *out = NULL and 0.
 * Returns 0 or -RL_EIO (cannot listen) / -RL_ENOMEM. */
int dhttp_start_ops(struct dhttp **out, const struct cfg *cfg, const struct rl_log *log,
                    const struct dhttp_hooks *hooks, struct dhttp *front, struct rl_err *err);

/* Stops accepting connections, lets the requests in flight finish for up
 * to cfg->drain_timeout_s, then closes the rest (their jobs are
 * cancelled) and frees everything. NULL is fine. */
void dhttp_stop(struct dhttp *h);

#endif
