/* dispatcher/models.c - which models are served, and where each one's jobs
 * go.
 *
 * Workers announce their served name in their heartbeat
 * (<prefix>worker:<name>, with "model", "model_created",
 * "model_owned_by", "pools" and "pool_scope") and list themselves in the
 * sorted set <prefix>workers. Every heartbeat interval the dispatcher reads
 * that set and MGETs the heartbeats: the live ones (the key has a TTL) make
 * the model table, so a request is never routed to a model whose last
 * worker died more than heartbeat_ttl_s ago. (Reading a set of known names
 * costs one round trip whatever else is in Redis; SCANning the key space
 * would walk every out: stream and cache entry.)
 *
 * Where a model's jobs go (schemas/README.md has the key layout):
 *   - workers with pool_scope = shared read <prefix>jobs:<pool>; all such
 *     models are one destination, the configured pools and d->router,
 *     exactly as a single-model deployment always worked;
 *   - workers with pool_scope = model read <prefix>jobs:<model>:<pool>;
 *     each such model gets those streams (appended to d->pools, with the
 *     workers group made at once so their queue state can be read) and a
 *     router of its own, kept across refreshes while its pools stay the
 *     same, so its think/fast split holds its within-one guarantee per
 *     model.
 * The dispatcher's served_model_name, when set, is one more entry (alias)
 * that always exists and means the shared pools.
 *
 * LoRA adapters (heartbeat lora_adapters, worker option lora_modules) are
 * model names too: d->loras, each with the served name of the model its
 * workers serve it beside (its parent). A job naming one goes where its
 * parent's jobs go, by the parent's router, and keeps the adapter's name
 * as its model (the worker picks the adapter by it); /v1/models lists it
 * with "parent", as vLLM does. A name that is a model's own means the
 * model. Every worker of a model is expected to serve the same adapters
 * (as vLLM's replicas do): a worker without one answers MODEL_NOT_FOUND.
 *
 * Main thread only, except models_json (the HTTP threads' copy, under
 * models_mu). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "rcluster.h"
#include "disp.h"
#include "registry.h"
#include "fleet.h"


static struct dmodel *find(struct dmodel *ms, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(ms[i].name, name))
            return &ms[i];
    return NULL;
}

#define D_REST_MAX 300 /* jobs:<model>:lora@<adapter>, 267 at most */

/* d->pools index of the stream <prefix><rest> (the pool called name),
 * appended (and its workers group made) when new; -1 when the table is
 * full. */
static int stream_slot(struct disp *d, const char *rest, const char *name)
{
    char key[D_KEY_MAX];
    char pfx[72];
    snprintf(pfx, sizeof pfx, "%.64s", d->cfg.prefix);
    rcl_queue_key(key, sizeof key, rconn_is_cluster(d->rc), pfx, rest);
    for (int p = d->n_shared; p < d->n_pools; p++)
        if (!strcmp(d->pools[p].key, key))
            return p;
    if (d->n_pools == D_MAX_POOLS) {
        /* asked again at every refresh: said once */
        if (!d->pools_warned)
            RL_LOG(&d->log, RL_LOG_ERROR, "%s: more than %d pools and adapter streams in all; "
                   "%s not routed (an adapter's jobs go to its parent's pools)", name,
                   D_MAX_POOLS, key);
        d->pools_warned = true;
        return -1;
    }
    struct dpool *p = &d->pools[d->n_pools];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->key, sizeof p->key, "%s", key);
    struct rl_err err;
    for (int s = 0; s < d->n_shards || s == 0; s++) { /* every shard on a cluster (issue 27) */
        char sk[D_KEY_MAX + 72];
        if (d->n_shards <= 1 || rcl_shard_key_n(sk, sizeof sk, key, s, d->shard_n[s]) < 0)
            snprintf(sk, sizeof sk, "%s", key);
        if (rconn_xgroup_create(d->rc, sk, "workers", "0", &err))
            RL_LOG(&d->log, RL_LOG_DEBUG, "XGROUP CREATE %s: %s", sk, err.msg);
    }
    return d->n_pools++;
}

/* A scoped model's own pool. */
static int pool_slot(struct disp *d, const char *model, const char *pool)
{
    char rest[D_REST_MAX], name[D_KEY_MAX];
    if (rcl_pool_rest(rest, sizeof rest, model, pool) < 0)
        return -1;
    snprintf(name, sizeof name, "%.128s:%.64s", model, pool);
    return stream_slot(d, rest, name);
}

/* A LoRA adapter's stream: lora@<name> beside its parent's pools, scoped
 * or shared (the worker reads it by the same names: common/rcluster.h). */
static int lora_slot(struct disp *d, const struct dmodel *parent, const char *lora)
{
    char rest[D_REST_MAX], name[D_KEY_MAX], pool[MODELREF_NAME_MAX + 8];
    const char *model = parent->scoped ? parent->name : NULL;
    if (rcl_lora_pool(pool, sizeof pool, lora) < 0 ||
        rcl_pool_rest(rest, sizeof rest, model, pool) < 0)
        return -1;
    if (model)
        snprintf(name, sizeof name, "%.128s:%s", model, pool);
    else
        snprintf(name, sizeof name, "%s", pool);
    return stream_slot(d, rest, name);
}

/* (Re)makes m's router over its pools (names in pools, n of them). */
static int make_router(struct disp *d, struct dmodel *m, char pools[][JOB_POOL_MAX + 1], int n,
                       struct rl_err *err)
{
    const char *names[D_MAX_POOLS];
    for (int i = 0; i < n; i++)
        names[i] = pools[i];
    return d_router_replace(d, names, n, &m->router, err);
}

/* adds the LoRA adapters of one heartbeat (arr) of a worker serving
 * parent to the table being built (loras, *n), each name once: the first
 * heartbeat naming it decides its parent, another parent is warned about */
static void add_loras(struct disp *d, struct dlora *loras, int *n, const char *parent,
                      const cJSON *arr)
{
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(x, "name");
        const cJSON *rank = cJSON_GetObjectItemCaseSensitive(x, "rank");
        bool reads = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, "stream"));
        if (!cJSON_IsString(name) || !modelref_name_ok(name->valuestring))
            continue;
        struct dlora *l = NULL;
        for (int k = 0; k < *n && !l; k++)
            if (!strcmp(loras[k].name, name->valuestring))
                l = &loras[k];
        if (l) {
            l->holders += !strcmp(l->parent, parent);
            l->readers += reads && !strcmp(l->parent, parent);
            if (strcmp(l->parent, parent) && !d->loras_warned) {
                RL_LOG(&d->log, RL_LOG_WARN, "models: LoRA adapter %s is served by workers of "
                       "%s and of %s; its jobs go to %s's", l->name, l->parent, parent, l->parent);
                d->loras_warned = true;
            }
            continue;
        }
        if (*n == D_MAX_LORAS) {
            if (!d->loras_warned)
                RL_LOG(&d->log, RL_LOG_WARN, "models: more than %d LoRA adapters served; %s "
                       "left out", D_MAX_LORAS, name->valuestring);
            d->loras_warned = true;
            return;
        }
        l = &loras[(*n)++];
        l->holders = 1;
        l->readers = reads;
        l->pool = -1;
        snprintf(l->name, sizeof l->name, "%s", name->valuestring);
        snprintf(l->parent, sizeof l->parent, "%s", parent);
        l->rank = cJSON_IsNumber(rank) ? (int)rank->valuedouble : 0;
    }
}

/* What a worker's heartbeat says its weights are (metrics.c). */
static void weights_of(struct dmodel *m, const cJSON *hb)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(hb, "model_format");
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(hb, "model_quantization");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(hb, "model_parameters");
    snprintf(m->format, sizeof m->format, "%.15s", cJSON_IsString(f) ? f->valuestring : "");
    snprintf(m->quant, sizeof m->quant, "%.23s", cJSON_IsString(q) ? q->valuestring : "");
    m->params = cJSON_IsNumber(p) && p->valuedouble > 0 && p->valuedouble < 1e15 ? (int64_t)p->valuedouble : 0;
}

/* Ollama's details of m (its /api/tags and /api/show): the parameter
 * count as Ollama writes it ("14.8B", "596.05M"). */
static void add_details(cJSON *o, const struct dmodel *m)
{
    if (!m->quant[0])
        return;
    cJSON *d = cJSON_AddObjectToObject(o, "details");
    char ps[32] = "";
    double p = (double)m->params;
    if (p >= 1e9)
        snprintf(ps, sizeof ps, "%.1fB", p / 1e9);
    else if (p >= 1e6)
        snprintf(ps, sizeof ps, "%.2fM", p / 1e6);
    else if (p > 0)
        snprintf(ps, sizeof ps, "%.2fK", p / 1e3);
    cJSON_AddStringToObject(d, "format", m->format);
    cJSON_AddStringToObject(d, "parameter_size", ps);
    cJSON_AddStringToObject(d, "quantization_level", m->quant);
}

static void publish_json(struct disp *d)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < d->n_models; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o)
            break;
        cJSON_AddStringToObject(o, "id", d->models[i].name);
        cJSON_AddStringToObject(o, "object", "model");
        cJSON_AddNumberToObject(o, "created", (double)d->models[i].created);
        cJSON_AddStringToObject(o, "owned_by", d->models[i].owned_by);
        if (d->models[i].max_model_len) /* vLLM's: the context its workers take */
            cJSON_AddNumberToObject(o, "max_model_len", (double)d->models[i].max_model_len);
        add_details(o, &d->models[i]);
        cJSON_AddItemToArray(a, o);
    }
    /* LoRA adapters as vLLM lists them: a model whose parent is the base
     * model's served name, with the base's card otherwise */
    for (int i = 0; a && i < d->n_loras; i++) {
        const struct dlora *l = &d->loras[i];
        const struct dmodel *m = find(d->models, d->n_models, l->parent);
        cJSON *o = m ? cJSON_CreateObject() : NULL;
        if (!o)
            continue;
        cJSON_AddStringToObject(o, "id", l->name);
        cJSON_AddStringToObject(o, "object", "model");
        cJSON_AddNumberToObject(o, "created", (double)m->created);
        cJSON_AddStringToObject(o, "owned_by", m->owned_by);
        cJSON_AddStringToObject(o, "parent", l->parent);
        if (m->max_model_len)
            cJSON_AddNumberToObject(o, "max_model_len", (double)m->max_model_len);
        add_details(o, m);
        cJSON_AddItemToArray(a, o);
    }
    char *s = a ? cJSON_PrintUnformatted(a) : NULL;
    cJSON_Delete(a);
    if (!s)
        return;
    pthread_mutex_lock(&d->models_mu);
    free(d->models_json);
    d->models_json = s;
    pthread_mutex_unlock(&d->models_mu);
}

/* Adds the pool names of one heartbeat (arr) to a scoped model's list
 * (pools, *n of them), each once. */
static void add_pools(char pools[][JOB_POOL_MAX + 1], int *n, const cJSON *arr)
{
    const cJSON *p;
    cJSON_ArrayForEach(p, arr) {
        if (!cJSON_IsString(p) || !p->valuestring[0] || strlen(p->valuestring) > JOB_POOL_MAX)
            continue;
        bool have = false;
        for (int k = 0; k < *n && !have; k++)
            have = !strcmp(pools[k], p->valuestring);
        if (!have && *n < D_MAX_POOLS)
            snprintf(pools[(*n)++], JOB_POOL_MAX + 1, "%s", p->valuestring);
    }
}

/* The model_name under which /metrics counts a worker's figures: the name
 * clients ask for. With served_model_name set, the shared pools' workers
 * answer to it (and the front door counts their requests under it), so
 * their figures go there too; else the worker's served name. */
static const char *fleet_label(const struct disp *d, const cJSON *hb)
{
    const cJSON *scope = cJSON_GetObjectItemCaseSensitive(hb, "pool_scope");
    bool scoped = cJSON_IsString(scope) && !strcmp(scope->valuestring, "model");
    if (d->cfg.served_model_name[0] && !scoped)
        return d->cfg.served_model_name;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(hb, "model");
    return cJSON_IsString(name) ? name->valuestring : "";
}

void d_models_refresh(struct disp *d)
{
    struct rl_err err;
    struct rconn_reply *names = NULL, *hbs = NULL;
    d->models_t_ms = rl_wall_ms();
    if (reg_read_heartbeats(d->rc, d->cfg.prefix, D_MAX_WORKERS, &names, &hbs, &err)) {
        RL_LOG(&d->log, RL_LOG_DEBUG, "models: %s", err.msg);
        return;
    }

    /* the new table, built beside the old so routers and split states of
     * models that stay are carried over */
    struct dmodel fresh[D_MAX_MODELS];
    struct dlora *loras = calloc(D_MAX_LORAS, sizeof *loras); /* 66 KB: not on the stack */
    int n_loras = 0;
    if (!loras) {
        rconn_reply_free(names);
        rconn_reply_free(hbs);
        return; /* the old table stays */
    }
    fleet_begin(d->fleet);
    char pools[D_MAX_MODELS][D_MAX_POOLS][JOB_POOL_MAX + 1];
    int n_pools[D_MAX_MODELS] = {0};
    int n = 0;
    memset(fresh, 0, sizeof fresh);
    if (d->cfg.served_model_name[0]) {
        struct dmodel *m = &fresh[n++];
        snprintf(m->name, sizeof m->name, "%s", d->cfg.served_model_name);
        snprintf(m->owned_by, sizeof m->owned_by, "redlm");
        m->created = d->t_start_ms / 1000;
        m->alias = true;
    }
    for (size_t i = 0; hbs && i < hbs->n_elem; i++) {
        const struct rconn_reply *r = &hbs->elem[i];
        if (r->type != RCONN_STRING)
            continue; /* expired: that worker is gone */
        cJSON *hb = cJSON_ParseWithLength(r->str, r->len);
        if (hb && fleet_observe(d->fleet, names->elem[i].str ? names->elem[i].str : "",
                                fleet_label(d, hb), hb) && !d->fleet_warned) {
            RL_LOG(&d->log, RL_LOG_WARN, "metrics: more than %d workers; the fleet's figures "
                   "leave some out", FLEET_WORKERS);
            d->fleet_warned = true;
        }
        /* pool shards (issue 27): a worker reading other shards than we
         * write to leaves jobs nobody reads, or never gets some */
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(hb, "pool_shards");
        if (cJSON_IsNumber(ps) && (int)ps->valuedouble != d->n_shards && d->keys_cluster &&
            !d->shards_warned) {
            RL_LOG(&d->log, RL_LOG_ERROR, "worker %s reads %d shards per pool, this dispatcher "
                   "writes to %d: give workers and dispatchers the same pool_shards, or jobs "
                   "wait in shards no worker reads", names->elem[i].str ? names->elem[i].str : "?",
                   (int)ps->valuedouble, d->n_shards);
            d->shards_warned = true;
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(hb, "model");
        if (!cJSON_IsString(name) || !modelref_name_ok(name->valuestring)) {
            cJSON_Delete(hb); /* a worker from before served names: the shared pools */
            continue;
        }
        const cJSON *scope = cJSON_GetObjectItemCaseSensitive(hb, "pool_scope");
        bool scoped = cJSON_IsString(scope) && !strcmp(scope->valuestring, "model");
        struct dmodel *m = find(fresh, n, name->valuestring);
        if (!m && n < D_MAX_MODELS) {
            m = &fresh[n++];
            snprintf(m->name, sizeof m->name, "%s", name->valuestring);
            const cJSON *ob = cJSON_GetObjectItemCaseSensitive(hb, "model_owned_by");
            const cJSON *cr = cJSON_GetObjectItemCaseSensitive(hb, "model_created");
            snprintf(m->owned_by, sizeof m->owned_by, "%.128s",
                     cJSON_IsString(ob) ? ob->valuestring : "redlm");
            m->created = cJSON_IsNumber(cr) ? (int64_t)cr->valuedouble : 0;
            m->scoped = scoped;
            weights_of(m, hb);
        } else if (!m) {
            RL_LOG(&d->log, RL_LOG_WARN, "models: more than %d models served; %s left out",
                   D_MAX_MODELS, name->valuestring);
        } else if (!m->alias && m->scoped != scoped) {
            RL_LOG(&d->log, RL_LOG_WARN, "models: workers of %s disagree on pool_scope; "
                   "routing to its own pools", m->name);
            m->scoped = true;
        }
        if (m && !m->alias && scoped)
            add_pools(pools[m - fresh], &n_pools[m - fresh],
                      cJSON_GetObjectItemCaseSensitive(hb, "pools"));
        if (m) {
            m->n_workers++;
            add_loras(d, loras, &n_loras, m->name,
                      cJSON_GetObjectItemCaseSensitive(hb, "lora_adapters"));
        }
        /* the longest sequence every worker of the model takes; the alias
         * (served_model_name) means the shared pools' workers */
        const cJSON *ml = cJSON_GetObjectItemCaseSensitive(hb, "max_model_len");
        int64_t len = cJSON_IsNumber(ml) && ml->valuedouble > 0 && ml->valuedouble < 1e12
                          ? (int64_t)ml->valuedouble : 0;
        if (len && m && (!m->max_model_len || len < m->max_model_len))
            m->max_model_len = len;
        if (len && !scoped && n && fresh[0].alias &&
            (!fresh[0].max_model_len || len < fresh[0].max_model_len))
            fresh[0].max_model_len = len;
        if (!scoped && n && fresh[0].alias && !fresh[0].quant[0])
            weights_of(&fresh[0], hb);
        cJSON_Delete(hb);
    }
    fleet_end(d->fleet);
    /* streams and routers of the scoped models */
    for (int i = 0; i < n; i++) {
        struct dmodel *m = &fresh[i];
        if (!m->scoped)
            continue;
        char sig[sizeof m->pool_sig] = "";
        for (int k = 0; k < n_pools[i]; k++) {
            int slot = pool_slot(d, m->name, pools[i][k]);
            if (slot < 0) {
                n_pools[i] = k;
                break;
            }
            m->pool_idx[k] = slot;
            size_t used = strlen(sig);
            snprintf(sig + used, sizeof sig - used, "%.64s,", pools[i][k]);
        }
        m->n_pools = n_pools[i];
        snprintf(m->pool_sig, sizeof m->pool_sig, "%s", sig);
        struct dmodel *old = find(d->models, d->n_models, m->name);
        if (old && old->router && !strcmp(old->pool_sig, m->pool_sig)) {
            m->router = old->router; /* keeps its split state */
            old->router = NULL;
        } else if (m->n_pools == 0 || make_router(d, m, pools[i], m->n_pools, &err)) {
            RL_LOG(&d->log, RL_LOG_ERROR, "model %s: cannot route: %s", m->name,
                   m->n_pools ? err.msg : "its workers announce no pools");
            m->scoped = false; /* left out below */
            m->name[0] = 0;
        }
    }
    /* news against the old table, before it goes: a model is announced
     * once when it comes and once when it leaves, not at every refresh */
    for (int i = 0; i < n; i++)
        if (fresh[i].name[0] && !find(d->models, d->n_models, fresh[i].name))
            RL_LOG(&d->log, RL_LOG_INFO, "model %s served (%s)", fresh[i].name,
                   fresh[i].alias ? "served_model_name: the shared pools"
                   : fresh[i].scoped ? "its own pools" : "the shared pools");
    for (int i = 0; i < d->n_models; i++) {
        struct dmodel *now = find(fresh, n, d->models[i].name);
        if (!now || !now->name[0])
            RL_LOG(&d->log, RL_LOG_INFO, "model %s no longer served (no live worker "
                   "announces it)", d->models[i].name);
    }
    for (int i = 0; i < d->n_models; i++)
        route_free(d->models[i].router);
    d->n_models = 0;
    for (int i = 0; i < n; i++)
        if (fresh[i].name[0])
            d->models[d->n_models++] = fresh[i];
    /* the adapters whose parent stays served and whose name is no model's
     * own (a model's name means that model) */
    int n_kept = 0;
    for (int i = 0; i < n_loras; i++) {
        const struct dlora *l = &loras[i];
        if (!find(d->models, d->n_models, l->parent))
            continue;
        if (find(d->models, d->n_models, l->name)) {
            if (!d->loras_warned)
                RL_LOG(&d->log, RL_LOG_WARN, "models: LoRA adapter %s of %s has the name of a "
                       "served model; that name means the model", l->name, l->parent);
            d->loras_warned = true;
            continue;
        }
        const struct dlora *was = NULL;
        for (int k = 0; k < d->n_loras && !was; k++)
            if (!strcmp(d->loras[k].name, l->name))
                was = &d->loras[k];
        if (!was)
            RL_LOG(&d->log, RL_LOG_INFO, "model %s served (LoRA adapter of %s, rank %d)", l->name,
                   l->parent, l->rank);
        struct dlora *k = &loras[n_kept++];
        *k = *l;
        const struct dmodel *pm = find(d->models, d->n_models, l->parent);
        k->of = pm->n_workers;
        /* its stream, once a holder reads it: where its jobs go while some
         * worker of its parent lacks it (d_lora_pool) */
        k->pool = k->readers > 0 ? lora_slot(d, pm, k->name) : -1;
        bool news = !was || was->holders != k->holders || was->of != k->of ||
                    (was->readers > 0) != (k->readers > 0);
        if (k->holders < k->of && k->pool >= 0 && news)
            RL_LOG(&d->log, RL_LOG_INFO, "LoRA adapter %s is served by %d of the %d live workers of "
                   "%s: its jobs go to %s, which %d of them read", k->name, k->holders, k->of,
                   k->parent, d->pools[k->pool].key, k->readers);
        /* none reads a stream of it (workers from before adapter streams,
         * past their 64 streams, or between a SIGHUP and their new
         * layout): its jobs go to the parent's pools, where a worker
         * without it answers MODEL_NOT_FOUND. Said whenever the share
         * changes */
        else if (k->holders < k->of && news)
            RL_LOG(&d->log, RL_LOG_WARN, "LoRA adapter %s is served by %d of the %d live workers of "
                   "%s, none reading its stream: its jobs that one of the others takes fail with "
                   "MODEL_NOT_FOUND; upgrade those workers, give them fewer adapters (64 streams "
                   "a read), or give every worker of %s the same lora_modules", k->name,
                   k->holders, k->of, k->parent, k->parent);
        else if (was && was->holders < was->of && k->holders == k->of)
            RL_LOG(&d->log, RL_LOG_INFO, "LoRA adapter %s: every live worker of %s serves it now",
                   k->name, k->parent);
    }
    for (int k = 0; k < d->n_loras; k++) {
        bool still = false;
        for (int i = 0; i < n_kept && !still; i++)
            still = !strcmp(loras[i].name, d->loras[k].name);
        if (!still)
            RL_LOG(&d->log, RL_LOG_INFO, "model %s no longer served (no live worker announces "
                   "the adapter)", d->loras[k].name);
    }
    memcpy(d->loras, loras, (size_t)n_kept * sizeof *loras);
    d->n_loras = n_kept;
    free(loras);
    int n_shared_names = 0;
    for (int i = 0; i < d->n_models; i++)
        n_shared_names += !d->models[i].scoped && !d->models[i].alias;
    if (n_shared_names > 1 && !d->shared_warned) {
        /* a job naming one of them may be taken by a worker of another,
         * which refuses it (MODEL_NOT_FOUND) */
        RL_LOG(&d->log, RL_LOG_WARN, "models: %d served names share the pools %sjobs:<pool>; "
               "give each model's workers pool_scope = model", n_shared_names, d->cfg.prefix);
        d->shared_warned = true;
    }
    publish_json(d);
    rconn_reply_free(names);
    rconn_reply_free(hbs);
}

void d_models_reroute(struct disp *d)
{
    for (int i = 0; i < d->n_models; i++)
        d->models[i].pool_sig[0] = 0; /* rebuilt with the new rules at the next refresh */
    d_models_refresh(d);
}

void d_models_free(struct disp *d)
{
    for (int i = 0; i < d->n_models; i++)
        route_free(d->models[i].router);
    d->n_models = 0;
    free(d->models_json);
    d->models_json = NULL;
}

/* "a, b, c" of the served names, for messages. */
static void served_list(const struct disp *d, char *buf, size_t size)
{
    buf[0] = 0;
    for (int i = 0; i < d->n_models; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, "%s%s", i ? ", " : "", d->models[i].name);
    }
    for (int i = 0; i < d->n_loras; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, ", %s (LoRA of %s)", d->loras[i].name,
                 d->loras[i].parent);
    }
}

int d_lora_pool(const struct disp *d, const char *name)
{
    for (int i = 0; i < d->n_loras; i++) {
        const struct dlora *l = &d->loras[i];
        if (!strcmp(l->name, name))
            return l->holders < l->of ? l->pool : -1;
    }
    return -1;
}

/* The parent of the LoRA adapter named name, or NULL when it is none. */
static struct dmodel *lora_parent(struct disp *d, const char *name)
{
    for (int i = 0; i < d->n_loras; i++)
        if (!strcmp(d->loras[i].name, name))
            return find(d->models, d->n_models, d->loras[i].parent);
    return NULL;
}

int d_model_pick(struct disp *d, const struct job *j, struct dmodel **out, bool *lora,
                 enum ev_code *code, char *msg, size_t size)
{
    *out = NULL;
    *lora = false;
    char list[768];
    if (j->model[0]) {
        struct dmodel *m = find(d->models, d->n_models, j->model), *p = NULL;
        if (!m && !(p = lora_parent(d, j->model)) && rl_wall_ms() - d->models_t_ms >= 100) {
            d_models_refresh(d); /* a worker that came up since the last heartbeat */
            if (!(m = find(d->models, d->n_models, j->model)))
                p = lora_parent(d, j->model);
        }
        if (m) {
            *out = m;
            return 0;
        }
        if (p) { /* an adapter: its base model's pools and router */
            *out = p;
            *lora = true;
            return 0;
        }
        served_list(d, list, sizeof list);
        *code = EV_CODE_MODEL_NOT_FOUND;
        if (d->n_models)
            snprintf(msg, size, "model: \"%s\" is not served; served: %s", j->model, list);
        else
            snprintf(msg, size, "model: \"%s\" is not served; no live worker announces a model",
                     j->model);
        return -RL_EINVAL;
    }
    /* no model named: the one destination there is. The shared pools count
     * once, however many names their workers give */
    int n_dest = 0;
    struct dmodel *one = NULL, *shared = NULL;
    for (int i = 0; i < d->n_models; i++) {
        if (d->models[i].scoped) {
            n_dest++;
            one = &d->models[i];
        } else if (!shared) {
            shared = &d->models[i];
            n_dest++;
        }
    }
    if (n_dest <= 1) {
        *out = one ? one : shared; /* NULL: nothing announced, the shared pools */
        return 0;
    }
    served_list(d, list, sizeof list);
    *code = EV_CODE_MODEL_REQUIRED;
    snprintf(msg, size, "model: several models are served (%s); the job must name one", list);
    return -RL_EINVAL;
}

char *disp_models_json(struct disp *d)
{
    pthread_mutex_lock(&d->models_mu);
    char *s = strdup(d->models_json ? d->models_json : "[]");
    pthread_mutex_unlock(&d->models_mu);
    return s;
}
