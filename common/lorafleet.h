/* common/lorafleet.h - LoRA adapters loaded and unloaded at runtime across a
 * fleet: what vLLM's runtime LoRA API does to one server, done to every
 * worker of a model. The front door serves it (dispatcher/http.c), and so
 * does `redlm lora` for deployments without one:
 *
 *   POST /v1/load_lora_adapter    {"lora_name", "lora_path"[, "model"]}
 *   POST /v1/unload_lora_adapter  {"lora_name"[, "model"]}
 *
 * (on the front door when runtime_lora is on). A load is the fleet's wish,
 * written to <prefix>loras:<model> (field lora_name, value lora_path;
 * HSETNX, so two loads of one name cannot both win), which every worker of
 * the model reads with its heartbeat and at start (worker/lorart.c): live
 * workers load it now, workers that start later load it before their
 * first job. The call returns when every live worker of the model has
 * said, in its heartbeat, that it serves the adapter from that path
 * (lora_adapters[].lora_path) or why it cannot (lora_failed[]):
 *
 *   200  "Success: LoRA adapter 'NAME' added successfully." (vLLM's text),
 *        with the workers that failed or did not answer in time named
 *        after it when only part of the fleet serves it (its jobs go to
 *        those that do: dispatcher/models.c);
 *   400  a bad body, a name already served, or every worker failed (the
 *        wish is withdrawn; the workers' reasons in the message);
 *   503  no live worker serves the model (withdrawn);
 *   504  no worker answered in time (withdrawn).
 *
 * "model" picks the base model when several are served (else it is the
 * only one). An unload deletes the wish and returns once no live worker
 * serves the adapter any more (the jobs that run with it finish first on
 * each worker; new ones get MODEL_NOT_FOUND): 200 "Success: LoRA adapter
 * 'NAME' removed successfully.", 404 for a name no wish holds, 400 for an
 * adapter of the workers' lora_modules (their operator's to remove).
 *
 * The caller gives a connection and the served models (the dispatcher's
 * model table as JSON, parents named); each call blocks its thread for as
 * long as it waits (runtime_lora_timeout_s at most), polling the
 * registry. Other dispatchers route the adapter once their own table
 * follows the heartbeats (their models refresh). */
#ifndef RL_LORAFLEET_H
#define RL_LORAFLEET_H

#include <stddef.h>

#include "err.h"
#include "rconn.h"

struct lfl_opts {
    const char *prefix;       /* the key prefix, "redlm:" */
    /* the served models as this front door routes them now (a JSON array,
     * malloc'd, the caller of the hook frees it; NULL = none): read before
     * and, once the workers are done, until it agrees, so that a request
     * for the adapter sent after a 200 is routed (or refused) at once */
    char *(*models_json)(void *ctx);
    void *ctx;
    int timeout_ms;           /* how long to wait for the workers */
    int poll_ms;              /* how often to look at their heartbeats */
};

/* The wish's key, <prefix>loras:<model> (the prefix's first 64 bytes, the
 * name's 128), as the front door writes it and the workers of model read
 * it (worker/lorart.c); the length, or -1 when it does not fit (it fits
 * 200 bytes). */
int lfl_wish_key(char *buf, size_t cap, const char *prefix, const char *model);

/* An answer that is not a success: an HTTP status (>= 400; 5xx are the
 * fleet's or Redis's fault), an error code and the field at fault ("" for
 * none), as the front door's OpenAI error body carries them. */
struct lfl_error {
    int status;
    char code[48];
    char param[48];
    char message[RL_ERR_MSG_MAX];
};

/* One call of either route on body (len bytes, a JSON object as vLLM's
 * routes take). Returns 0 with *ok (a malloc'd one-line text answer, the
 * caller frees it) or > 0 (the status) with *e filled, never both. */
int lfl_load(struct rconn *c, const struct lfl_opts *o, const char *body, size_t len, char **ok,
             struct lfl_error *e);
int lfl_unload(struct rconn *c, const struct lfl_opts *o, const char *body, size_t len, char **ok,
               struct lfl_error *e);

/* What the fleet serves and wishes, for `redlm lora list`: *out (the
 * caller frees it) is {"models": [{"model", "wished": {name: lora_path},
 * "workers": [{"name", "adapters": [heartbeat's lora_adapters],
 * "failed": [heartbeat's lora_failed]}]}]}, one entry per model a live
 * worker serves. Returns 0 or a negative rl_code (err filled). */
struct cJSON;
int lfl_list(struct rconn *c, const char *prefix, struct cJSON **out, struct rl_err *err);

#endif
