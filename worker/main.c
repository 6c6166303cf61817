/* worker/main.c - redlm-worker: options, model, Redis connections,
 * signals, systemd, then the pull loop (loop.c) until SIGTERM.
 *
 *   redlm-worker -c config/redlm.conf
 *   redlm-worker --redis 127.0.0.1:6379 --model DIR --pools fast,think --name gpu0
 *
 * Start-up order: options (file, then flags), the model (minutes for a
 * large one; Redis is not needed yet), the two Redis connections (the
 * worker starts even while Redis is down: rconn reconnects with backoff),
 * the metrics endpoint, then a PING until Redis answers, and only then
 * READY=1 to systemd and the "ready:" log line. WATCHDOG=1 pings go out
 * from the loop at half of WATCHDOG_USEC when systemd asks for them.
 *
 * Signals only set flags (the two volatile sig_atomic_t below are this
 * program's only globals: a signal handler can reach nothing else); the
 * loop reads them once per iteration. SIGTERM/SIGINT drain: no new jobs,
 * running ones finish within drain_timeout_s, then exit 0 (whatever is
 * left stays pending in Redis and another worker resumes it). SIGHUP:
 * the loop re-reads the config file and the same flags and applies the
 * options the table in common/config.c marks live (wopts_reload). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "rcluster.h"
#include "modelid.h"
#include "modelref.h"
#include "signals.h"
#include "affinity.h"
#include "registry.h"
#include "worker.h"


/* Weight-loading progress (engine_progress_fn) into the log at info level:
 * a line per tenth of the weights, and the loaded size with the time. */
struct load_progress {
    struct worker *w;
    int64_t t0_ms;
    int next_tenth;
};

static void on_load_progress(void *user, size_t done, size_t total)
{
    struct load_progress *p = user;
    int tenth = total ? (int)((double)done * 10.0 / (double)total) : 10;
    if (tenth < p->next_tenth)
        return;
    p->next_tenth = tenth + 1;
    int gb = total >= 1000000000u;
    double unit = gb ? 1e9 : 1e6;
    const char *u = gb ? "GB" : "MB";
    if (done >= total)
        RL_LOG(&p->w->log, RL_LOG_INFO, "loaded %s: %.1f %s in %.1f s", p->w->opt.model,
               (double)total / unit, u, (double)(rl_wall_ms() - p->t0_ms) / 1000.0);
    else
        RL_LOG(&p->w->log, RL_LOG_INFO, "loading %s: %.1f/%.1f %s  %d%%", p->w->opt.model,
               (double)done / unit, (double)total / unit, u, tenth * 10);
}

/* How many live workers of the fleet (their heartbeats, through the
 * registry, as the dispatcher finds them; ours left out: a restart's last
 * heartbeat may still be there) have each shard as home, for the same
 * number of shards. Returns how many were counted, or -1 when the
 * registry cannot be read (an ACL from before). At most 1,024 looked at:
 * once, at start. */
static int home_counts(struct worker *w, int *counts)
{
    struct rconn_reply *names = NULL, *hbs = NULL;
    struct rl_err err;
    if (reg_read_heartbeats(w->rc, w->opt.prefix, 1024, &names, &hbs, &err))
        return -1;
    int seen = 0;
    for (size_t i = 0; hbs && i < hbs->n_elem; i++) {
        const struct rconn_reply *nm = &names->elem[i], *hb = &hbs->elem[i];
        if (nm->type != RCONN_STRING || !strcmp(nm->str, w->opt.name) || hb->type != RCONN_STRING)
            continue; /* ours, or expired: that worker is gone */
        cJSON *o = cJSON_ParseWithLength(hb->str, hb->len);
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "home_shard");
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, "pool_shards");
        if (cJSON_IsNumber(h) && cJSON_IsNumber(k) && k->valueint == w->n_lanes &&
            h->valueint >= 0 && h->valueint < w->n_lanes) {
            counts[h->valueint]++;
            seen++;
        }
        cJSON_Delete(o);
    }
    rconn_reply_free(names);
    rconn_reply_free(hbs);
    return seen;
}

/* The home shard (issue 27 point 4, schemas/README.md "Home shards"):
 * home_shard, or one of the shards that the fewest live workers have as
 * home (home_counts), so that a worker restarted after a crash fills the
 * shard it left; among those, the next of the fleet's count
 * {<prefix>}homes picks, so that workers started together (each seeing
 * none of the others yet) take the shards in turn. A registry or count
 * refused (an ACL from before) leaves all shards or a hash of our name,
 * which spread too, only less evenly. Lane l reads every pool's shard l,
 * so the home is a lane. No home on a single instance, with one shard, or
 * when foreign_room_pct is 0 (every shard read alike). */
static void pick_home(struct worker *w)
{
    w->home_lane = -1;
    if (w->n_lanes < 2 || w->cfg.foreign_room_pct <= 0)
        return;
    struct engine_stats st;
    engine_get_stats(w->eng, &st);
    w->foreign_room = (st.max_batch * w->cfg.foreign_room_pct + 99) / 100;
    if (w->cfg.home_shard >= 0) {
        w->home_lane = w->cfg.home_shard % w->n_lanes;
        RL_LOG(&w->log, RL_LOG_INFO, "home shard %d (home_shard)", w->home_lane);
        return;
    }
    int counts[RCL_MAX_SHARDS] = {0}, cand[RCL_MAX_SHARDS], n_cand = 0;
    int seen = home_counts(w, counts), least = seen > 0 ? seen : 0;
    for (int l = 0; l < w->n_lanes; l++)
        least = counts[l] < least ? counts[l] : least;
    for (int l = 0; l < w->n_lanes; l++)
        if (counts[l] == least)
            cand[n_cand++] = l;
    char key[W_KEY_MAX], pfx[72];
    snprintf(pfx, sizeof pfx, "%.64s", w->opt.prefix);
    rcl_queue_key(key, sizeof key, true, pfx, "homes");
    const char *argv[2] = {"INCR", key};
    struct rconn_reply *r = NULL;
    struct rl_err err;
    long long pick;
    if (rconn_command(w->rc, 2, argv, NULL, &r, &err) == 0 && r->type == RCONN_INTEGER) {
        pick = r->integer - 1;
    } else {
        uint32_t h = 2166136261u;
        for (const char *p = w->opt.name; *p; p++)
            h = (h ^ (uint8_t)*p) * 16777619u;
        pick = h;
        RL_LOG(&w->log, RL_LOG_WARN, "home shard by name: INCR %s refused: %s", key,
               r && r->str ? r->str : err.msg);
    }
    rconn_reply_free(r);
    w->home_lane = cand[pick % n_cand];
    RL_LOG(&w->log, RL_LOG_INFO, "home shard %d (%d of %d live workers' homes there%s)",
           w->home_lane, least, seen > 0 ? seen : 0, seen < 0 ? ": registry not readable" : "");
}

void w_queue_key(const struct worker *w, const char *pool, bool cluster, char out[W_KEY_MAX])
{
    char rest[W_KEY_MAX], pfx[72];
    snprintf(pfx, sizeof pfx, "%.64s", w->opt.prefix);
    /* names are bounded (MODELREF_NAME_MAX, pools 63): both fit */
    rcl_pool_rest(rest, sizeof rest, w->opt.pool_scope_model ? w->model.name : NULL, pool);
    rcl_queue_key(out, W_KEY_MAX, cluster, pfx, rest);
}

/* The pool stream keys (schemas/README.md: the key layout); a cluster's
 * share the prefix as hash tag, so they are known only once Redis has
 * answered. On a cluster each pool has pool_shards shard keys (issue 27,
 * rcl_shard_key): shard s of pool p is stream p + s * n_base_pools, with
 * the pool's name, so that everything the worker does per pool stream
 * (group creation, leases, claims, acks) covers the shards as it covers
 * the pools; loop.c keeps a standing read per shard. Returns 0, or
 * -RL_EINVAL when the streams would not fit one read (64 keys). */
static int make_pool_keys(struct worker *w, bool cluster, struct rl_err *err)
{
    int c = w->n_cfg_pools;
    int k = cluster ? w->cfg.pool_shards : 1;
    if (k < 1)
        k = 1;
    if (c * k > 64)
        return rl_errf(err, RL_EINVAL, "pool_shards: %d pools x %d shards = %d streams; one "
                       "read takes 64 at most", c, k, c * k);
    /* the adapters' streams, as many as one read (64 keys) and the offer
     * streams leave room for; the others are served from the pools, as
     * every adapter was before they had streams */
    int room = 64 / k - c;
    if (w->affinity && !cluster && room > W_MAX_STREAMS - 2 * c)
        room = W_MAX_STREAMS - 2 * c;
    int n_ls = w->n_lora_specs < room ? w->n_lora_specs : room;
    if (n_ls < w->n_lora_specs && n_ls != w->n_lora_streams)
        RL_LOG(&w->log, RL_LOG_WARN, "lora_modules: streams for the first %d of %d adapters "
               "only (%d pools x %d shards; one read takes 64 streams): the others' jobs go to "
               "the pools, which workers without them read too", n_ls, w->n_lora_specs, c, k);
    w->n_lora_streams = n_ls;
    int n = w->n_base_pools = c + n_ls;
    for (int p = c; p < n; p++)
        snprintf(w->pools[p], sizeof w->pools[p], "lora@%.58s", w->lora_stream[p - c]);
    /* the shards' tags are the same for every pool: searched once (rcl_shard_n) */
    long *sn = w->shard_n;
    memset(w->shard_n, 0, sizeof w->shard_n);
    char pfx[72];
    snprintf(pfx, sizeof pfx, "%.64s", w->opt.prefix);
    for (int s = 1; s < k; s++)
        if ((sn[s] = rcl_shard_n(pfx, strlen(pfx), s, k)) < 0)
            return rl_errf(err, RL_EINVAL, "pool_shards: prefix \"%s\" cannot be a hash tag", pfx);
    for (int p = 0; p < n; p++) {
        /* an adapter's stream by its whole name (pools[p] may be cut) */
        char lname[MODELREF_NAME_MAX + 8];
        if (p >= c)
            rcl_lora_pool(lname, sizeof lname, w->lora_stream[p - c]);
        w->pool_names[p] = w->pools[p];
        w->pool_key_ptrs[p] = w->pool_keys[p];
        w_queue_key(w, p >= c ? lname : w->pools[p], cluster, w->pool_keys[p]);
        for (int s = 1; s < k; s++) {
            int i = p + s * n;
            memcpy(w->pools[i], w->pools[p], sizeof w->pools[p]);
            w->pool_names[i] = w->pools[i];
            w->pool_key_ptrs[i] = w->pool_keys[i];
            if (rcl_shard_key_n(w->pool_keys[i], W_KEY_MAX, w->pool_keys[p], s, sn[s]) < 0)
                return rl_errf(err, RL_EINVAL, "pool %s: shard key too long", w->pools[p]);
        }
    }
    w->n_shards = k;
    /* prefix-affine pulling (issue 27): our offer streams after the pools.
     * Off on a cluster: the dispatcher's move of a dead worker's offered
     * job rewrites its holder record, in another slot than the queue's */
    if (cluster && w->affinity) {
        w->affinity = false;
        RL_LOG(&w->log, RL_LOG_INFO, "affinity: off on a Redis Cluster");
    }
    w->n_pools = n * k;
    if (k > 1)
        RL_LOG(&w->log, RL_LOG_INFO, "pools: %d shards each on the cluster (pool_shards)", k);
    if (!w->affinity)
        return 0;
    /* offers for the configured pools only: an adapter's job goes to its
     * stream when not every worker holds it, else to the pools (and may be
     * offered there) */
    for (int p = 0; p < c; p++) {
        memcpy(w->pools[n + p], w->pools[p], sizeof w->pools[p]);
        w->pool_names[n + p] = w->pools[n + p];
        w->pool_key_ptrs[n + p] = w->pool_keys[n + p];
        snprintf(w->pool_keys[n + p], W_KEY_MAX, "%.250s:w:%.120s", w->pool_keys[p], w->opt.name);
    }
    w->n_pools = n + c;
    return 0;
}

void w_relayout(struct worker *w)
{
    w->relayout = false;
    int n_old = w->n_pools, had = w->n_lora_streams;
    char (*old)[W_KEY_MAX] = malloc((size_t)n_old * sizeof *old);
    if (!old) {
        RL_LOG(&w->log, RL_LOG_ERROR, "adapters' streams: out of memory; they are served "
               "from the pools until a restart");
        return;
    }
    signed char scan[W_MAX_STREAMS];
    char cursor[W_MAX_STREAMS][RCONN_ID_MAX];
    memcpy(old, w->pool_keys, (size_t)n_old * sizeof *old);
    memcpy(scan, w->reclaim_scan, sizeof scan);
    memcpy(cursor, w->claim_cursor, sizeof cursor);
    for (int i = w->n_lora_specs; i < w->n_loras && i < W_MAX_STREAMS; i++)
        snprintf(w->lora_stream[i], sizeof w->lora_stream[i], "%s", engine_lora_name(w->eng, i));
    w->n_lora_specs = w->n_loras < W_MAX_STREAMS ? w->n_loras : W_MAX_STREAMS;
    struct rl_err err;
    if (make_pool_keys(w, w_cluster(w), &err)) /* only grows: the old layout fitted */
        RL_LOG(&w->log, RL_LOG_ERROR, "adapters' streams: %s", err.msg);
    /* every old stream is still there (streams are only added) */
    int map[W_MAX_STREAMS];
    for (int i = 0; i < n_old; i++) {
        map[i] = -1;
        for (int k = 0; k < w->n_pools && map[i] < 0; k++)
            if (!strcmp(old[i], w->pool_keys[k]))
                map[i] = k;
    }
    for (int k = 0; k < w->n_pools; k++) {
        w->reclaim_scan[k] = 0;
        snprintf(w->claim_cursor[k], RCONN_ID_MAX, "0-0");
    }
    for (int i = 0; i < n_old; i++)
        if (map[i] >= 0) {
            w->reclaim_scan[map[i]] = scan[i];
            memcpy(w->claim_cursor[map[i]], cursor[i], RCONN_ID_MAX);
        }
    for (int i = 0; i < w->n_jobs; i++) {
        struct wjob *j = w->jobs[i];
        if (j->pool >= 0 && j->pool < n_old && map[j->pool] >= 0)
            j->pool = map[j->pool];
    }
    free(old);
    w->groups_ok = false;
    RL_LOG(&w->log, RL_LOG_INFO, "LoRA adapters: %d read from streams of their own now (%d "
           "before)", w->n_lora_streams, had);
}

int w_lora_find(const struct worker *w, const char *name)
{
    int i = engine_lora_index(w->eng, name);
    return i >= 0 && !w_lora_gone(w, i) ? i : -1;
}

/* lora_modules, parsed and checked against each other and the served name
 * before anything is loaded: *out (n of them, malloc'd; NULL for none). */
static int lora_specs(struct worker *w, struct modelref_lora **out, int *n, struct rl_err *err)
{
    const struct cfg_strlist *l = &w->cfg.lora_modules;
    *out = NULL;
    *n = 0;
    if (l->n == 0)
        return 0;
    if (l->n > LORA_MAX_ADAPTERS - 1) /* the engine keeps the last slot for a model's own */
        return rl_errf(err, RL_EINVAL, "lora_modules: %d adapters; a worker serves at most %d",
                       l->n, LORA_MAX_ADAPTERS - 1);
    /* an adapter is a delta to the base weights it was trained on, not to
     * a fine-tune of them */
    if (w->model.adapter[0])
        return rl_errf(err, RL_EINVAL,
                       "lora_modules: %s is an Ollama model with an ADAPTER of its own; serve "
                       "other adapters beside its base model instead", w->model.name);
    struct modelref_lora *s = calloc((size_t)l->n, sizeof *s);
    if (!s)
        return rl_errf(err, RL_ENOMEM, "lora_modules: out of memory");
    int rc = 0;
    for (int i = 0; i < l->n && !rc; i++)
        rc = modelref_lora_parse(l->v[i], &s[i], err);
    if (!rc)
        rc = modelref_lora_check(s, l->n, w->model.name, err);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    *n = l->n;
    return 0;
}

int w_lora_prepare(const struct worker *w, const char *dir, char id[SHA256_HEX_LEN + 1],
                   struct lora_adapter **out, struct rl_err *err)
{
    *out = NULL;
    int rc = modelid_lora(w->model_id, dir, id, err);
    if (!rc)
        rc = lora_load(out, dir, engine_model_config(w->eng), err);
    return rc;
}

int w_lora_install(struct worker *w, const char *name, const char *dir,
                   const char id[SHA256_HEX_LEN + 1], struct lora_adapter *a, struct rl_err *err)
{
    char *d = strdup(dir);
    if (!d)
        return rl_errf(err, RL_ENOMEM, "lora %s: out of memory", name);
    int rc = engine_lora_add_loaded(w->eng, name, a, err);
    if (rc) {
        free(d);
        return rl_err_wrap(err, "lora %s (%s)", name, dir);
    }
    /* a name dropped before comes back to its index (engine.h) */
    int i = engine_lora_index(w->eng, name);
    memcpy(w->lora_id[i], id, SHA256_HEX_LEN + 1);
    free(w->lora_dir[i]);
    w->lora_dir[i] = d;
    w_lorart_forget(w, i); /* served as lora_modules's until lorart.c says otherwise */
    if (i == w->n_loras) {
        pthread_mutex_lock(&w->m.mu);
        w->n_loras = i + 1;
        pthread_mutex_unlock(&w->m.mu);
    }
    return i;
}

int w_lora_load(struct worker *w, const char *name, const char *dir, struct rl_err *err)
{
    int64_t t0 = rl_wall_ms();
    char id[SHA256_HEX_LEN + 1];
    struct lora_adapter *a = NULL;
    if (w_lora_prepare(w, dir, id, &a, err))
        return rl_err_wrap(err, "lora %s (%s)", name, dir);
    int i = w_lora_install(w, name, dir, id, a, err);
    if (i < 0) {
        lora_free(a);
        return i;
    }
    RL_LOG(&w->log, RL_LOG_INFO, "LoRA adapter \"%s\": %s, rank %d, loaded in %.1f s", name, dir,
           engine_lora_rank(w->eng, i), (double)(rl_wall_ms() - t0) / 1000.0);
    return i;
}

static int lora_add_one(struct worker *w, const struct modelref_lora *s, struct rl_err *err)
{
    int i = w_lora_load(w, s->name, s->dir, err);
    return i < 0 ? i : 0;
}

/* Loads the adapters into the engine (after its weights) and computes each
 * one's result-cache identity. A failure names the adapter: the worker
 * does not start with part of what it was asked to serve. */
static int lora_load_all(struct worker *w, const struct modelref_lora *s, int n,
                         struct rl_err *err)
{
    for (int i = 0; i < n; i++) {
        int rc = lora_add_one(w, &s[i], err);
        if (rc)
            return rc;
    }
    return 0;
}

void w_lora_reload(struct worker *w)
{
    struct modelref_lora *s = NULL;
    int n = 0;
    struct rl_err err = {0};
    if (lora_specs(w, &s, &n, &err)) {
        RL_LOG(&w->log, RL_LOG_ERROR, "SIGHUP: lora_modules: %s; the adapters served stay", err.msg);
        return;
    }
    for (int k = 0; k < n; k++) {
        int i = w_lora_find(w, s[k].name);
        if (i >= 0 && strcmp(w->lora_dir[i], s[k].dir))
            RL_LOG(&w->log, RL_LOG_WARN, "SIGHUP: lora %s now names %s; %s stays served until a "
                   "restart (jobs may be running with it)", s[k].name, s[k].dir, w->lora_dir[i]);
        else if (i < 0 && lora_add_one(w, &s[k], &err))
            RL_LOG(&w->log, RL_LOG_ERROR, "SIGHUP: %s; not served", err.msg);
    }
    if (w->n_loras > w->n_lora_specs && w->n_lora_specs < W_MAX_STREAMS)
        w->relayout = true; /* their streams (loop.c, once no read is out) */
    for (int i = 0; i < w->n_loras; i++) {
        bool listed = w_lorart_path(w, i) || w_lora_gone(w, i); /* not lora_modules's */
        for (int k = 0; k < n && !listed; k++)
            listed = !strcmp(s[k].name, engine_lora_name(w->eng, i));
        if (!listed)
            RL_LOG(&w->log, RL_LOG_WARN, "SIGHUP: lora %s left lora_modules; it stays served until "
                   "a restart (jobs may be running with it)", engine_lora_name(w->eng, i));
    }
    free(s);
}

static int setup_rest(struct worker *w, const struct modelref_lora *loras, int n_loras,
                      struct rl_err *err);

static int setup(struct worker *w, struct rl_err *err)
{
    int rc;
    if (!w->opt.model[0])
        return rl_errf(err, RL_EINVAL, "no model: give --model DIR or model = \"DIR\"");
    if ((rc = modelref_resolve_ex(w->opt.model, MODELREF_ADAPTER, &w->model, err)))
        return rc;
    if (strlen(w->opt.served_name) > MODELREF_NAME_MAX)
        return rl_errf(err, RL_EINVAL, "served_model_name: longer than %d characters",
                       MODELREF_NAME_MAX);
    if (w->opt.served_name[0])
        snprintf(w->model.name, sizeof w->model.name, "%.128s", w->opt.served_name);
    if (!modelref_name_ok(w->model.name))
        return rl_errf(err, RL_EINVAL,
                       "served_model_name \"%.200s\" must be 1-%d of [A-Za-z0-9._:/-], not "
                       "starting with '/' or '.'", w->model.name, MODELREF_NAME_MAX);
    struct modelref_lora *loras = NULL;
    int n_loras = 0;
    if ((rc = lora_specs(w, &loras, &n_loras, err)))
        return rc;
    rc = setup_rest(w, loras, n_loras, err);
    free(loras);
    return rc;
}

/* setup() once the adapters' specs are known to be well formed. */
static int setup_rest(struct worker *w, const struct modelref_lora *loras, int n_loras,
                      struct rl_err *err)
{
    int rc;
    char pools[WOPTS_MAX_POOLS][64];
    int n = wopts_pools(&w->opt, pools, err);
    if (n < 0)
        return n;
    w->n_pools = w->n_base_pools = w->n_cfg_pools = n;
    w->n_lora_specs = n_loras < W_MAX_STREAMS ? n_loras : W_MAX_STREAMS;
    for (int i = 0; i < w->n_lora_specs; i++)
        snprintf(w->lora_stream[i], sizeof w->lora_stream[i], "%s", loras[i].name);
    w->affinity = w->cfg.affinity;
    if (w->affinity) {
        w->aff_bytes = aff_size((size_t)w->cfg.affinity_filter_bytes);
        w->aff_bits = calloc(1, w->aff_bytes);
        w->aff_scratch = calloc(1, w->aff_bytes);
        if (!w->aff_bits || !w->aff_scratch)
            return rl_errf(err, RL_ENOMEM, "affinity filter: out of memory");
    }
    for (int p = 0; p < n; p++) {
        memcpy(w->pools[p], pools[p], sizeof pools[p]);
        w->pool_names[p] = w->pools[p];
        w->pool_key_ptrs[p] = w->pool_keys[p];
    }
    if ((rc = make_pool_keys(w, false, err)))
        return rc;
    cfg_job_opts(&w->cfg, &w->jopts);

    struct engine_options eo;
    engine_options_default(&eo);
    eo.backend = w->opt.backend;
    eo.sim_profile = w->opt.sim_profile;
    eo.sim_model = w->opt.sim_model[0] ? w->opt.sim_model : NULL;
    eo.n_threads = w->opt.threads;
    eo.device = w->opt.device;
    eo.mmap_weights = w->opt.mmap_weights;
    eo.quantize = w->opt.quantize;
    eo.kv_bytes = (size_t)w->opt.kv_mb << 20;
    eo.kv_reserve_bytes = (size_t)w->opt.kv_reserve_mb << 20;
    eo.kv_prefault = w->opt.kv_prefault;
    eo.max_batch = w->opt.max_batch;
    eo.token_budget = w->opt.token_budget;
    eo.prefill_chunk = w->opt.prefill_chunk;
    if (spec_mode_parse(w->opt.speculative, &eo.speculative))
        return rl_errf(err, RL_EINVAL, "speculative: unknown mode \"%s\"", w->opt.speculative);
    eo.spec_tokens = w->opt.spec_tokens;
    eo.spec_max_rows = w->opt.spec_max_rows;
    eo.grammar_compile_threads = w->opt.grammar_compile_threads;
    eo.grammar_cache_bytes = (size_t)w->opt.grammar_cache_mb << 20;
    struct load_progress lp = {w, rl_wall_ms(), 1};
    eo.progress = on_load_progress;
    eo.progress_user = &lp;
    if (strcmp(w->model.dir, w->opt.model))
        RL_LOG(&w->log, RL_LOG_INFO, "model %s: %s", w->opt.model, w->model.dir);
    RL_LOG(&w->log, RL_LOG_INFO, "loading %s on %s, serving it as \"%s\"", w->model.dir,
           w->opt.backend, w->model.name);
    /* an Ollama model's ADAPTER layer is part of the model */
    eo.model_lora = w->model.adapter[0] ? w->model.adapter : NULL;
    if (eo.model_lora)
        RL_LOG(&w->log, RL_LOG_INFO, "the model's own LoRA adapter (its Ollama ADAPTER layer): %s",
               eo.model_lora);
    if ((rc = engine_create(&w->eng, w->model.dir, &eo, err)))
        return rc;
    {
        /* what the pool holds, once: on a GPU the KV tokens decide the batch */
        struct engine_stats es;
        engine_get_stats(w->eng, &es);
        RL_LOG(&w->log, RL_LOG_INFO, "KV cache: %ld tokens (%d blocks of %d, sized by %s), max_context %d",
               (long)es.kv_blocks * es.block_size, es.kv_blocks, es.block_size, es.kv_sizing, es.max_context);
    }
    if (engine_embed_only(w->eng))
        RL_LOG(&w->log, RL_LOG_INFO, "%s has no lm_head.weight (an embedding checkpoint): it serves "
               "embedding jobs (task embed) only", w->model.dir);
    if ((rc = modelid_of(&w->model, w->model_id, err)))
        return rc;
    if ((rc = lora_load_all(w, loras, n_loras, err)))
        return rc;
    /* the worker still serves token-id jobs without one, so this is a
     * warning, but said once here rather than as a dead letter per job */
    /* rerank jobs' answer tokens (Qwen3-Reranker's "yes" and "no") */
    const struct tokenizer *tk = engine_get_tokenizer(w->eng);
    w->rerank_ids[0] = tk ? tok_find(tk, "yes", 3) : -1;
    w->rerank_ids[1] = tk ? tok_find(tk, "no", 2) : -1;
    if (!engine_get_tokenizer(w->eng))
        RL_LOG(&w->log, RL_LOG_WARN,
               "%s has no tokenizer.json: only prompt_ids jobs will work; jobs with messages or "
               "a prompt string will be refused with BAD_VALUE", w->opt.model);

    struct rconn_opts ro;
    rconn_opts_default(&ro);
    ro.addr = w->opt.redis;
    ro.user = w->opt.redis_user;
    ro.password_file = w->opt.redis_password_file;
    ro.client_name = w->opt.name;
    ro.connect_timeout_ms = w->opt.redis_connect_timeout_ms;
    ro.io_timeout_ms = w->opt.redis_io_timeout_ms;
    ro.backoff_max_ms = w->opt.redis_backoff_max_ms;
    if (ro.backoff_min_ms > ro.backoff_max_ms)
        ro.backoff_min_ms = ro.backoff_max_ms;
    if ((rc = rconn_create(&w->rc, &ro, err)))
        return rc;
    if ((rc = rconn_create(&w->lane[0].rc, &ro, err)))
        return rc;
    w->rc_opts = ro;
    w->n_lanes = 1;
    if ((rc = rconn_batch_create(&w->batch, err)))
        return rc;
    /* a busy port costs the metrics, not the jobs */
    struct rl_err merr;
    if (wm_start(w, &merr))
        RL_LOG(&w->log, RL_LOG_ERROR, "%s; running without /metrics", merr.msg);
    return 0;
}

/* READY=1 tells systemd (and whoever waits on the unit) that the worker
 * serves; with Redis unreachable it does not, so the worker waits here
 * until a PING is answered, saying once in the log what it waits for and
 * keeping the watchdog fed. Returns 0 once Redis answered, 1 when a
 * SIGTERM came first. */
static int wait_for_redis(struct worker *w, volatile sig_atomic_t *stop)
{
    bool said = false;
    int64_t next_wd = 0;
    while (!*stop) {
        struct rl_err err;
        const char *ping[1] = {"PING"};
        if (rconn_command(w->rc, 1, ping, NULL, NULL, &err) == 0) {
            if (said)
                RL_LOG(&w->log, RL_LOG_INFO, "redis %s answered", w->opt.redis);
            return 0;
        }
        if (!said) {
            RL_LOG(&w->log, RL_LOG_WARN, "redis %s: %s; not ready until it answers",
                   w->opt.redis, err.msg);
            said = true;
        }
        int64_t now = rl_mono_ms();
        if (w->watchdog_usec && now >= next_wd) {
            sd_notify(0, "WATCHDOG=1");
            next_wd = now + (int64_t)(w->watchdog_usec / 2000);
        }
        int64_t ms = rconn_retry_in_ms(w->rc);
        ms = ms < 5 ? 5 : ms > 100 ? 100 : ms;
        struct timespec ts = {0, (long)ms * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 1;
}

int main(int argc, char **argv)
{
    struct worker *w = calloc(1, sizeof *w);
    struct rl_err err = {0};
    int status = 1;
    if (!w || w_lorart_create(w)) {
        fprintf(stderr, "redlm-worker: out of memory\n");
        free(w);
        return 1;
    }
    wm_init(&w->m);
    w->home_lane = -1; /* pick_home, once the lanes are known */
    w->log = (struct rl_log){.level = RL_LOG_INFO, .ident = "worker"};
    w->argc = argc; /* cfg_load skips argv[0] itself */
    w->argv = argv;
    w->t_start_ms = rl_wall_ms();
    wopts_default(&w->opt);
    int rc = wopts_parse_args(&w->opt, &w->cfg, w->argc, w->argv, &err);
    if (rc == 1) {
        status = 0;
        goto out;
    }
    if (rc < 0) {
        fprintf(stderr, "redlm-worker: %s\n", err.msg);
        goto out;
    }
    int lvl = rl_log_parse_level(w->opt.log_level);
    if (lvl < 0) {
        fprintf(stderr, "redlm-worker: log_level: \"%s\" is not error, warn, info or debug\n",
                w->opt.log_level);
        goto out;
    }
    w->log.level = lvl;
    wm_set_model(&w->m, w->opt.model);

    volatile sig_atomic_t *stop, *reload;
    rl_signals_install(&stop, &reload);

    if (setup(w, &err)) {
        RL_LOG(&w->log, RL_LOG_ERROR, "%s", err.msg);
        goto out;
    }
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0)
        w->watchdog_usec = usec;
    if (wait_for_redis(w, stop)) {
        RL_LOG(&w->log, RL_LOG_INFO, "stopped before redis %s answered", w->opt.redis);
        status = 0;
        goto out;
    }
    if (w_cluster(w) && make_pool_keys(w, true, &err)) {
        RL_LOG(&w->log, RL_LOG_ERROR, "%s", err.msg);
        goto out;
    }
    /* a standing read per shard on a cluster (loop.c), each on its own
     * connection: a blocked read holds its connection */
    for (; w->n_lanes < w->n_shards; w->n_lanes++)
        if (rconn_create(&w->lane[w->n_lanes].rc, &w->rc_opts, &err)) {
            RL_LOG(&w->log, RL_LOG_ERROR, "%s", err.msg);
            goto out;
        }
    pick_home(w);
    w_lorart_start(w); /* the fleet's runtime adapters, before the first job */
    fence_holder(w->holder, w->opt.name, (long long)w->t_start_ms);
    /* a failed load is retried after a reconnect; bodies go by EVAL meanwhile */
    if (fence_load(&w->fence, w->rc, &err))
        RL_LOG(&w->log, RL_LOG_WARN, "fencing scripts not loaded yet: %s", err.msg);
    pthread_mutex_lock(&w->m.mu);
    w->m.ready = true;
    pthread_mutex_unlock(&w->m.mu);
    sd_notify(0, "READY=1");
    RL_LOG(&w->log, RL_LOG_INFO, "ready: %s as %s, pools %s, redis %s answered", w->opt.model,
           w->opt.name, w->opt.pools, w->opt.redis);
    if (w_run(w, stop, reload, &err) == 0)
        status = 0;
    RL_LOG(&w->log, RL_LOG_INFO, "exiting (%d)", status);
out:
    wm_stop(w);
    for (int i = 0; i < w->n_jobs; i++)
        w_job_free(w->jobs[i]);
    free(w->jobs);
    free(w->aff_bits);
    free(w->aff_scratch);
    rconn_batch_free(w->batch);
    rconn_free(w->rc);
    for (int i = 0; i < w->n_lanes; i++)
        rconn_free(w->lane[i].rc);
    engine_free(w->eng);
    for (int i = 0; i < w->n_loras; i++)
        free(w->lora_dir[i]);
    w_lorart_free(w);
    cfg_free(&w->cfg);
    free(w);
    return status;
}
