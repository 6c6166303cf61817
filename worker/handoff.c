/* worker/handoff.c - a job for a LoRA adapter this worker lacks, handed
 * to the adapter's own stream instead of failing.
 *
 * The dispatcher sends an adapter's jobs to its stream (jobs:lora@<name>,
 * read only by workers started with it) while some worker of its parent
 * lacks it, and to the pools while every worker holds it. Jobs queued in
 * the pools in the second case are still there when a worker without the
 * adapter joins (a scale-out on a machine set up with the base model
 * only), and that worker, with room to spare, would take them first. So a
 * worker that reads such a job asks the registry whether a live worker of
 * its model reads the adapter's stream (heartbeat lora_adapters[].stream),
 * and if one does, moves the job there: one script, in the slot of the
 * stream it came from (the adapter's stream of the same shard), XADDs the
 * entry's fields there and acknowledges it here, so it is in one place or
 * the other, never both and never neither. The moved entry keeps what the
 * job is known by (req, sha, tenant: its identity; entry0: its derived
 * seed and queue time), as a dispatcher's move of an offer does.
 *
 * A job taken over (a dead worker's, reclaimed) may have a holder record
 * (own:<id>) naming the entry it came from: on a single instance the same
 * script points it at the new entry, which says "moved": "pending" and
 * its deliveries, so the holder that takes it resumes it from its stream
 * (as from a dispatcher's move of a taken offer) and the fencing sees one
 * job that moved. On a cluster the record is in another slot: such a job
 * is answered MODEL_NOT_FOUND, as is every job where nobody reads the
 * adapter's stream or the move fails (an ACL without XADD on jobs:*).
 *
 * Main thread only. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "qack.h"
#include "registry.h"
#include "worker.h"

#define HAND_ASK_MS 1000 /* how long the registry's answer for one adapter holds */
#define HAND_MAX_WORKERS 1000

const char w_handoff_lua[] =
    "local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)[1]\n"
    "if not p or p[2] ~= ARGV[3] then return 0 end\n"
    "local nid = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 4))\n"
    "if KEYS[3] and redis.call('HGET', KEYS[3], 'entry') == ARGV[2] then\n"
    "  redis.call('HSET', KEYS[3], 'entry', nid)\n"
    "end\n"
    "(function()\n" QACK_LUA_BODY "end)()\n"
    "return 1\n";

struct ask {
    const struct worker *w;
    const char *name;
    bool yes;
};

/* Does a heartbeat say its worker serves this worker's model and reads
 * adapter name's stream? */
static void reads_stream(void *ctx, const char *who, const cJSON *hb)
{
    (void)who;
    struct ask *q = ctx;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(hb, "model");
    const cJSON *scope = cJSON_GetObjectItemCaseSensitive(hb, "pool_scope");
    bool same = cJSON_IsString(model) && !strcmp(model->valuestring, q->w->model.name) &&
                cJSON_IsString(scope) &&
                !strcmp(scope->valuestring, q->w->opt.pool_scope_model ? "model" : "shared");
    const cJSON *a, *list = same ? cJSON_GetObjectItemCaseSensitive(hb, "lora_adapters") : NULL;
    cJSON_ArrayForEach(a, list) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(a, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, q->name) &&
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "stream")))
            q->yes = true;
    }
}

/* Whether some live worker reads adapter name's stream, from the registry
 * (two round trips), or from the last answer for it within HAND_ASK_MS: a
 * burst of such jobs asks once. */
static bool read_elsewhere(struct worker *w, const char *name)
{
    int64_t now = rl_wall_ms();
    if (!strcmp(w->hand_name, name) && now - w->hand_t_ms < HAND_ASK_MS)
        return w->hand_read;
    struct ask q = {w, name, false};
    struct rl_err err;
    if (reg_each_heartbeat(w->rc, w->opt.prefix, HAND_MAX_WORKERS, reads_stream, &q, &err)) {
        RL_LOG(&w->log, RL_LOG_DEBUG, "registry: %s", err.msg);
        return false; /* not cached: asked again with the next such job */
    }
    snprintf(w->hand_name, sizeof w->hand_name, "%s", name);
    w->hand_read = q.yes;
    w->hand_t_ms = now;
    return q.yes;
}

bool w_handoff_try(struct worker *w, struct wjob *j, int pool, const char *raw, size_t raw_len)
{
    if (!raw || !j->id[0] || !read_elsewhere(w, j->job->model))
        return false;
    /* the adapter's stream in the slot of the one the job came from: the
     * same shard on a cluster (offer streams exist on one instance only) */
    char lname[MODELREF_NAME_MAX + 8], base[W_KEY_MAX], key[W_KEY_MAX];
    rcl_lora_pool(lname, sizeof lname, j->job->model);
    bool cluster = w_cluster(w);
    w_queue_key(w, lname, cluster, base);
    int s = pool < w_n_queue_streams(w) ? pool / w->n_base_pools : 0;
    if (s == 0 || rcl_shard_key_n(key, sizeof key, base, s, w->shard_n[s]) < 0)
        memcpy(key, base, sizeof key);
    /* read from the adapter's own stream by a worker that no longer serves
     * it (unloaded at runtime, lorart.c): the fleet is unloading it, and
     * moving it back where it came from would only go round */
    if (pool < w->n_pools && !strcmp(key, w->pool_keys[pool]))
        return false;
    char *text = malloc(raw_len + 1), *to = strdup(key);
    if (!text || !to) {
        free(text);
        free(to);
        return false;
    }
    memcpy(text, raw, raw_len);
    text[raw_len] = 0;
    free(j->raw);
    j->raw = text;
    j->raw_len = raw_len;
    j->hand_key = to;
    j->state = WJ_HANDING;
    return true;
}
