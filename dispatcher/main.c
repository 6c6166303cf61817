/* dispatcher/main.c - redlm-dispatcher: options, Redis, the tokenizer of
 * the result-cache fast path, signals and systemd, then the routing loop
 * (loop.c) until SIGTERM.
 *
 *   redlm-dispatcher -c config/redlm.conf
 *   redlm-dispatcher --redis 127.0.0.1:6379 --think-ratio 0.3 --max-waiting 500
 *
 * It runs without a config file (every option has a default and a flag).
 * Several copies may run: each is one consumer of the group "dispatchers"
 * on <prefix>requests, named by the name option or, when that is empty,
 * host-pid. With the model option set it loads only the model's tokenizer
 * (no weights) to compute result-cache keys exactly as the worker does,
 * and answers cached requests itself; without it that fast path is off.
 *
 * Signals only set the two flags below (the only globals: a handler can
 * reach nothing else). SIGTERM/SIGINT: finish the round in hand, then exit
 * 0 (what was read but not handled stays pending for another dispatcher).
 * SIGHUP: the loop (loop.c, d_reload) re-reads the config file and flags
 * and applies the options the table marks live (ratio, rules, adaptive
 * bounds, limits, timers, log level). READY=1 goes
 * to systemd once Redis is reached and the groups exist; WATCHDOG=1 at
 * half of WATCHDOG_USEC when asked. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "rcluster.h"
#include "disp.h"
#include "fleet.h"
#include "http.h"
#include "modelid.h"
#include "modelref.h"
#include "signals.h"
#include "tokenizer.h"


static int setup(struct disp *d, struct rl_err *err)
{
    int rc;
    if (d->cfg.name[0]) {
        snprintf(d->name, sizeof d->name, "%s", d->cfg.name);
    } else {
        char host[64] = "";
        if (gethostname(host, sizeof host) || !host[0])
            snprintf(host, sizeof host, "dispatcher");
        host[sizeof host - 1] = 0;
        snprintf(d->name, sizeof d->name, "%s-%d", host, (int)getpid());
    }
    if (d->cfg.pools.n > D_MAX_POOLS)
        return rl_errf(err, RL_EINVAL, "pools: more than %d pools", D_MAX_POOLS);
    d->n_pools = d->n_shared = d->cfg.pools.n;
    for (int p = 0; p < d->n_pools; p++) {
        if (strchr(d->cfg.pools.v[p], '@')) /* lora@<name>: an adapter's stream (models.c) */
            return rl_errf(err, RL_EINVAL, "pools: \"%.64s\": '@' is kept for the LoRA "
                           "adapters' streams", d->cfg.pools.v[p]);
        snprintf(d->pools[p].name, sizeof d->pools[p].name, "%s", d->cfg.pools.v[p]);
    }
    if (d->cfg.tenants.n > D_MAX_INTAKE - 1)
        return rl_errf(err, RL_EINVAL, "tenants: %d listed; at most %d", d->cfg.tenants.n,
                       D_MAX_INTAKE - 1);
    for (int i = 0; i < d->cfg.tenants.n; i++)
        if (!job_tenant_ok(d->cfg.tenants.v[i]))
            return rl_errf(err, RL_EINVAL, "tenants: \"%.64s\" must be 1-%d characters of "
                           "[A-Za-z0-9_-]", d->cfg.tenants.v[i], JOB_TENANT_MAX);
    d_make_keys(d, false);
    strcpy(d->claim_cursor, "0-0");
    cfg_job_opts(&d->cfg, &d->jopts);
    if ((rc = d_make_router(d, err)))
        return rc;
    if (route_think_pool(d->router) < 0)
        RL_LOG(&d->log, RL_LOG_WARN, "no pool named \"think\": every auto request goes to %s",
               route_pool_name(d->router, route_fast_pool(d->router)));

    if (d->cfg.served_model_name[0] && !modelref_name_ok(d->cfg.served_model_name))
        return rl_errf(err, RL_EINVAL,
                       "served_model_name \"%.200s\" must be 1-%d of [A-Za-z0-9._:/-], not "
                       "starting with '/' or '.'", d->cfg.served_model_name, MODELREF_NAME_MAX);
    if (d->cfg.model[0]) {
        struct modelref ref;
        if ((rc = modelref_resolve_ex(d->cfg.model, MODELREF_ADAPTER, &ref, err)))
            return rl_err_wrap(err, "the result-cache fast path");
        if ((rc = tok_load(&d->tok, ref.dir, err)))
            return rl_err_wrap(err, "model %s (for the result-cache fast path)", d->cfg.model);
        if ((rc = modelid_of(&ref, d->model_id, err)))
            return rc;
        snprintf(d->fast_name, sizeof d->fast_name, "%s", ref.name);
        RL_LOG(&d->log, RL_LOG_INFO, "result-cache fast path on for model %s: tokenizer of %s, "
               "model id %.12s", d->fast_name, ref.dir, d->model_id);
    } else {
        RL_LOG(&d->log, RL_LOG_INFO, "result-cache fast path off: no model configured (--model "
               "DIR loads its tokenizer); cached requests go to the workers");
    }

    struct rconn_opts ro;
    cfg_rconn_opts(&d->cfg, &ro);
    ro.client_name = d->name;
    if ((rc = rconn_create(&d->rc, &ro, err)))
        return rc;
    return rconn_batch_create(&d->batch, err);
}

/* The HTTP front door's hooks (http.h): typed wrappers, since calling
 * through a cast function pointer is undefined. */
static char *http_metrics(void *ctx) { return disp_metrics_text(ctx); }
static bool http_ready(void *ctx) { return disp_ready(ctx); }
static char *http_models(void *ctx) { return disp_models_json(ctx); }
static int http_fleet(void *ctx, struct vm_fleet *rows, int max)
{
    return fleet_rows(((struct disp *)ctx)->fleet, rows, max);
}

void d_make_keys(struct disp *d, bool cluster)
{
    char pfx[D_KEY_MAX], rest[D_KEY_MAX];
    snprintf(pfx, sizeof pfx, "%.128s", d->cfg.prefix);
    for (int p = 0; p < d->n_shared; p++) {
        snprintf(rest, sizeof rest, "jobs:%.64s", d->pools[p].name);
        rcl_queue_key(d->pools[p].key, sizeof d->pools[p].key, cluster, pfx, rest);
    }
    rcl_queue_key(d->req_key, sizeof d->req_key, cluster, pfx, "requests");
    /* the shared intake stream, then one per tenant (option tenants) */
    d->n_intake = 1 + d->cfg.tenants.n;
    for (int i = 0; i < d->n_intake; i++) {
        struct dintake *in = &d->intake[i];
        if (i == 0) {
            snprintf(in->key, sizeof in->key, "%s", d->req_key);
            in->tenant[0] = 0;
        } else {
            snprintf(rest, sizeof rest, "requests:%.32s", d->cfg.tenants.v[i - 1]);
            rcl_queue_key(in->key, sizeof in->key, cluster, pfx, rest);
            snprintf(in->tenant, sizeof in->tenant, "%.32s", d->cfg.tenants.v[i - 1]);
        }
        if (!in->claim_cursor[0])
            strcpy(in->claim_cursor, "0-0");
        d->intake_keys[i] = in->key;
    }
    rcl_queue_key(d->dead_key, sizeof d->dead_key, cluster, pfx, "dead");
    d->keys_cluster = cluster;
    d->n_shards = cluster ? d->cfg.pool_shards : 1;
    for (int s = 1; s < d->n_shards; s++)
        d->shard_n[s] = rcl_shard_n(pfx, strlen(pfx), s, d->n_shards);
}

int main(int argc, char **argv)
{
    struct dhttp *http = NULL; /* the OpenAI-compatible API, when the option http is set */
    struct dhttp *ops = NULL;  /* /healthz and /metrics on 127.0.0.1:http_port */
    struct disp *d = calloc(1, sizeof *d);
    struct rl_err err = {0};
    int status = 1;
    if (!d) {
        fprintf(stderr, "redlm-dispatcher: out of memory\n");
        return 1;
    }
    dm_init(&d->m);
    pthread_mutex_init(&d->models_mu, NULL);
    if (!(d->fleet = fleet_create())) {
        fprintf(stderr, "redlm-dispatcher: out of memory\n");
        free(d);
        return 1;
    }
    d->log = (struct rl_log){.level = RL_LOG_INFO, .ident = "dispatcher"};
    d->argc = argc;
    d->argv = argv;
    d->t_start_ms = rl_wall_ms();
    enum cfg_action act;
    if (cfg_load(&d->cfg, argc, argv, CFG_DISPATCHER, &act, &err)) {
        fprintf(stderr, "redlm-dispatcher: %s\n", err.msg);
        goto out;
    }
    if (act == CFG_HELP) {
        cfg_print_help(stdout, "redlm-dispatcher", CFG_DISPATCHER);
        status = 0;
        goto out;
    }
    if (act == CFG_PRINT_CONFIG) {
        cfg_write_sample(stdout);
        status = 0;
        goto out;
    }
    int lvl = rl_log_parse_level(d->cfg.log_level);
    if (lvl >= 0)
        d->log.level = lvl;

    volatile sig_atomic_t *stop, *reload;
    rl_signals_install(&stop, &reload);

    if (setup(d, &err)) {
        RL_LOG(&d->log, RL_LOG_ERROR, "%s", err.msg);
        goto out;
    }
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0)
        d->watchdog_usec = usec;
    RL_LOG(&d->log, RL_LOG_INFO, "starting: redis %s, pools %d, default %s, think_ratio %.3f%s, "
           "max_waiting %d", d->cfg.redis, d->n_pools, d->cfg.default_pool, d->cfg.think_ratio,
           d->cfg.adaptive ? " (adaptive)" : "", d->cfg.max_waiting);
    struct dhttp_hooks hooks = {http_metrics, http_ready, http_models, d, d->tok, http_fleet};
    if (dhttp_start(&http, &d->cfg, &d->log, &hooks, &err) ||
        dhttp_start_ops(&ops, &d->cfg, &d->log, &hooks, http, &err)) {
        RL_LOG(&d->log, RL_LOG_ERROR, "%s", err.msg);
        goto out;
    }
    if (d_run(d, stop, reload) == 0)
        status = 0;
    RL_LOG(&d->log, RL_LOG_INFO, "exiting (%d)", status);
out:
    /* after the loop: streams whose jobs are with workers finish within
     * drain_timeout_s; the rest are cancelled */
    dhttp_stop(ops); /* first: it borrows the front door */
    dhttp_stop(http);
    route_free(d->router);
    d_models_free(d);
    fleet_free(d->fleet);
    da_free(d);
    pthread_mutex_destroy(&d->models_mu);
    rconn_batch_free(d->batch);
    for (int i = 0; i < d->n_fwd_gc; i++)
        free(d->fwd_gc[i]);
    free(d->fwd_gc);
    rconn_free(d->rc);
    tok_free(d->tok);
    cfg_free(&d->cfg);
    pthread_mutex_destroy(&d->m.mu);
    free(d);
    return status;
}
