/* worker/cache.c - the result cache: the complete event list of a
 * deterministic job, stored under
 *   <prefix>cache:<sha256(model identity, rendered prompt ids, every
 *                          parameter that changes the output)>
 * (job_cache_key in common/job.c) with a TTL, and replayed for the next
 * identical job without touching the engine.
 *
 * What is deterministic: greedy (temperature 0 or top_k 1) or seeded
 * jobs (job_is_deterministic). Only jobs that ran to "stop" or "length"
 * on this worker from seq 0 are stored: a cancelled, timed-out, failed or
 * resumed job is not the full answer. The value is a JSON array of the
 * events exactly as published; a replay sends them again with the same
 * seq numbers, and changes only the done event: cached becomes true, the
 * timings are this job's, and the metadata is this job's own.
 *
 * The model identity is common/modelid.c's SHA-256 over config.json,
 * tokenizer.json, tokenizer_config.json and the names and sizes of the
 * *.safetensors files, so a new checkpoint in the same directory never
 * answers from an old entry; the dispatcher computes the same identity
 * for its fast path (dispatcher/loop.c). A job for a LoRA adapter is keyed
 * by the adapter's identity instead (modelid_lora: base identity and the
 * adapter's files), which the dispatcher does not know: its fast path
 * leaves adapter requests to the worker. Main thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker.h"
#include "cache.h"

int w_cache_key(struct worker *w, struct wjob *j, struct rl_err *err)
{
    j->cache_fill = false;
    if (w->opt.cache_ttl_s <= 0 || !j->job || !j->job->cache || !job_is_deterministic(j->job))
        return 0;
    char hex[JOB_CACHE_KEY_LEN + 1], id[SHA256_HEX_LEN + JOB_TENANT_MAX + 16];
    /* an adapter's answers are its own: its identity (the base's and the
     * adapter's files, modelid_lora) stands for the model's */
    const char *mid = j->lora >= 0 ? w->lora_id[j->lora] : w->model_id;
    /* a tenant's entries are its own: the key covers the tenant too */
    if (j->tenant[0])
        snprintf(id, sizeof id, "%s/tenant:%s", mid, j->tenant);
    else
        snprintf(id, sizeof id, "%s", mid);
    int rc = job_cache_key(j->job, job_mode_on(j->job, w->pools[j->pool]), id, j->ids, j->n_ids, hex, err);
    if (rc)
        return rc;
    snprintf(j->cache_key, sizeof j->cache_key, "%scache:%s", w->opt.prefix, hex);
    j->cache_fill = true;
    return 0;
}

int w_cache_build(struct wjob *j, struct rl_err *err)
{
    size_t n = 3;
    for (int i = 0; i < j->n_hist; i++)
        n += strlen(j->hist[i]) + 1;
    char *v = malloc(n);
    if (!v)
        return rl_errf(err, RL_ENOMEM, "cache: out of memory");
    char *p = v;
    *p++ = '[';
    for (int i = 0; i < j->n_hist; i++) {
        size_t l = strlen(j->hist[i]);
        if (i)
            *p++ = ',';
        memcpy(p, j->hist[i], l);
        p += l;
    }
    *p++ = ']';
    *p = 0;
    j->cache_value = v;
    return 0;
}

int w_cache_replay(struct worker *w, struct wjob *j, const char *value, size_t len,
                   struct rl_err *err)
{
    char **ev;
    int n;
    int rc = cache_replay_events(value, len, j->cache_key, j->t_enqueued, rl_wall_ms(),
                                 j->job->metadata, &ev, &n, err);
    if (rc)
        return rc;
    for (int i = 0; i < n && !rc; i++) {
        ev_seq_take(&j->seq);
        rc = w_push_event(j, ev[i]);
        ev[i] = NULL;
    }
    cache_events_free(ev, n);
    return rc;
}
