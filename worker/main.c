/* worker/main.c - redlm-worker: options, model, Redis connections,
 * signals, systemd, then the pull loop (loop.c) until SIGTERM.
 *
 *   redlm-worker -c config/redlm.conf
 *   redlm-worker --redis 127.0.0.1:6379 --model DIR --pools fast,think --name gpu0
 *
 * Start-up order: options (file, then flags), the model (minutes for a
 * large one; Redis is not needed yet), the two Redis connections (the
 * worker starts even while Redis is down: rconn reconnects with backoff),
 * the metrics endpoint, then READY=1 to systemd. WATCHDOG=1 pings go out
 * from the loop at half of WATCHDOG_USEC when systemd asks for them.
 *
 * Signals only set flags (the two volatile sig_atomic_t below are this
 * program's only globals: a signal handler can reach nothing else); the
 * loop reads them once per iteration. SIGTERM/SIGINT drain: no new jobs,
 * running ones finish within drain_timeout_s, then exit 0 (whatever is
 * left stays pending in Redis and another worker resumes it). SIGHUP
 * re-reads the config file and the same flags and applies what can change
 * live. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "modelid.h"
#include "signals.h"
#include "worker.h"


static void fill_job_opts(struct worker *w)
{
    job_opts_default(&w->jopts);
    w->jopts.max_job_bytes = (size_t)w->opt.max_job_kb * 1024;
    w->jopts.default_max_tokens = w->opt.default_max_tokens;
    w->jopts.max_max_tokens = w->opt.max_max_tokens;
    w->jopts.default_stream_ttl_s = w->opt.default_stream_ttl_s;
    w->jopts.max_stream_ttl_s = w->opt.max_stream_ttl_s;
}

void w_reload(struct worker *w)
{
    struct wopts n;
    struct rl_err err;
    wopts_default(&n);
    if (wopts_parse_args(&n, w->argc, w->argv, &err) < 0) {
        RL_LOG(&w->log, RL_LOG_ERROR, "SIGHUP: keeping the old settings: %s", err.msg);
        return;
    }
    /* what can change under running jobs; the model, the Redis address,
     * pools, name and engine sizes need a restart */
    w->opt.read_block_ms = n.read_block_ms;
    w->opt.claim_idle_ms = n.claim_idle_ms;
    w->opt.claim_interval_ms = n.claim_interval_ms;
    w->opt.lease_renew_ms = n.lease_renew_ms;
    w->opt.max_deliveries = n.max_deliveries;
    w->opt.cache_ttl_s = n.cache_ttl_s;
    w->opt.heartbeat_ms = n.heartbeat_ms;
    w->opt.heartbeat_ttl_s = n.heartbeat_ttl_s;
    w->opt.drain_timeout_s = n.drain_timeout_s;
    w->opt.dead_maxlen = n.dead_maxlen;
    w->opt.max_job_kb = n.max_job_kb;
    w->opt.default_max_tokens = n.default_max_tokens;
    w->opt.max_max_tokens = n.max_max_tokens;
    w->opt.default_stream_ttl_s = n.default_stream_ttl_s;
    w->opt.max_stream_ttl_s = n.max_stream_ttl_s;
    w->opt.publish = n.publish;
    int lvl = rl_log_parse_level(n.log_level);
    if (lvl >= 0) {
        w->log.level = lvl;
        memcpy(w->opt.log_level, n.log_level, sizeof n.log_level);
    }
    fill_job_opts(w);
    RL_LOG(&w->log, RL_LOG_INFO, "SIGHUP: settings reloaded");
}

/* Weight-loading progress (be_progress_fn) into the log at info level:
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

static int setup(struct worker *w, struct rl_err *err)
{
    int rc;
    if (!w->opt.model[0])
        return rl_errf(err, RL_EINVAL, "no model: give --model DIR or model = \"DIR\"");
    char pools[WOPTS_MAX_POOLS][64];
    int n = wopts_pools(&w->opt, pools, err);
    if (n < 0)
        return n;
    w->n_pools = n;
    for (int p = 0; p < n; p++) {
        memcpy(w->pools[p], pools[p], sizeof pools[p]);
        snprintf(w->pool_keys[p], W_KEY_MAX, "%.64sjobs:%.64s", w->opt.prefix, pools[p]);
        w->pool_names[p] = w->pools[p];
        w->pool_key_ptrs[p] = w->pool_keys[p];
    }
    fill_job_opts(w);

    struct engine_options eo;
    engine_options_default(&eo);
    eo.backend = w->opt.backend;
    eo.sim_profile = w->opt.sim_profile;
    eo.sim_model = w->opt.sim_model[0] ? w->opt.sim_model : NULL;
    eo.n_threads = w->opt.threads;
    eo.kv_bytes = (size_t)w->opt.kv_mb << 20;
    eo.kv_prefault = w->opt.kv_prefault;
    eo.max_batch = w->opt.max_batch;
    eo.token_budget = w->opt.token_budget;
    eo.prefill_chunk = w->opt.prefill_chunk;
    struct load_progress lp = {w, rl_wall_ms(), 1};
    eo.progress = on_load_progress;
    eo.progress_user = &lp;
    RL_LOG(&w->log, RL_LOG_INFO, "loading %s on %s", w->opt.model, w->opt.backend);
    if ((rc = engine_create(&w->eng, w->opt.model, &eo, err)))
        return rc;
    if ((rc = modelid_compute(w->opt.model, w->model_id, err)))
        return rc;

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
    if ((rc = rconn_create(&w->rc_read, &ro, err)))
        return rc;
    if ((rc = rconn_batch_create(&w->batch, err)))
        return rc;
    /* a busy port costs the metrics, not the jobs */
    struct rl_err merr;
    if (wm_start(w, &merr))
        RL_LOG(&w->log, RL_LOG_ERROR, "%s; running without /metrics", merr.msg);
    return 0;
}

int main(int argc, char **argv)
{
    struct worker *w = calloc(1, sizeof *w);
    struct rl_err err = {0};
    int status = 1;
    if (!w) {
        fprintf(stderr, "redlm-worker: out of memory\n");
        return 1;
    }
    wm_init(&w->m);
    w->log = (struct rl_log){.level = RL_LOG_INFO, .ident = "worker"};
    w->argc = argc; /* cfg_load skips argv[0] itself */
    w->argv = argv;
    w->t_start_ms = rl_wall_ms();
    wopts_default(&w->opt);
    int rc = wopts_parse_args(&w->opt, w->argc, w->argv, &err);
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

    volatile sig_atomic_t *stop, *reload;
    rl_signals_install(&stop, &reload);

    if (setup(w, &err)) {
        RL_LOG(&w->log, RL_LOG_ERROR, "%s", err.msg);
        goto out;
    }
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0)
        w->watchdog_usec = usec;
    pthread_mutex_lock(&w->m.mu);
    w->m.ready = true;
    pthread_mutex_unlock(&w->m.mu);
    sd_notify(0, "READY=1");
    RL_LOG(&w->log, RL_LOG_INFO, "ready: %s as %s, pools %s, redis %s", w->opt.model, w->opt.name,
           w->opt.pools, w->opt.redis);
    if (w_run(w, stop, reload, &err) == 0)
        status = 0;
    RL_LOG(&w->log, RL_LOG_INFO, "exiting (%d)", status);
out:
    wm_stop(w);
    for (int i = 0; i < w->n_jobs; i++)
        w_job_free(w->jobs[i]);
    free(w->jobs);
    rconn_batch_free(w->batch);
    rconn_free(w->rc);
    rconn_free(w->rc_read);
    engine_free(w->eng);
    free(w);
    return status;
}
