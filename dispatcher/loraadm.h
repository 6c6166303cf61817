/* dispatcher/loraadm.h - vLLM's runtime LoRA API, for a whole fleet:
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
#ifndef RL_LORAADM_H
#define RL_LORAADM_H

#include <stddef.h>

#include "openai.h"
#include "rconn.h"

struct dla_opts {
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

/* One call of either route on body (len bytes). Returns 0 with *ok (a
 * malloc'd text/plain answer, the caller frees it) or > 0 with *e filled
 * (an HTTP status >= 400 and its OpenAI error), never both. */
int dla_load(struct rconn *c, const struct dla_opts *o, const char *body, size_t len, char **ok,
             struct oai_error *e);
int dla_unload(struct rconn *c, const struct dla_opts *o, const char *body, size_t len, char **ok,
               struct oai_error *e);

#endif
