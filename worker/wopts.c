/* worker/wopts.c - from a loaded struct cfg (common/config.h) to the
 * worker's flat struct wopts.
 *
 * cfg_load does the work (defaults < file < flags, bounds, cross-option
 * checks, --help and --print-config from the one table); this file only
 * copies the result into fixed-size fields, so nothing in the worker keeps
 * pointers into a cfg. The worker keeps the loaded cfg itself for SIGHUP:
 * wopts_reload applies the table's live options to it (cfg_apply_live)
 * and copies again, so which options reload is said once, in the table.
 * Called from main() at start and from the loop on SIGHUP; main thread
 * only. */
#include "wopts.h"

#include <stdio.h>
#include <string.h>

#include "config.h"
#include "listen.h"

static void copy(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src ? src : "");
}

static int from_cfg(struct wopts *o, const struct cfg *c, struct rl_err *err)
{
    memset(o, 0, sizeof *o);
    copy(o->redis, sizeof o->redis, c->redis);
    copy(o->redis_user, sizeof o->redis_user, c->redis_user);
    copy(o->redis_password_file, sizeof o->redis_password_file, c->redis_password_file);
    o->redis_connect_timeout_ms = c->redis_connect_timeout_ms;
    o->redis_io_timeout_ms = c->redis_io_timeout_ms;
    o->redis_backoff_max_ms = c->redis_backoff_max_ms;
    copy(o->prefix, sizeof o->prefix, c->prefix);
    copy(o->group, sizeof o->group, "workers");
    cfg_worker_name(c, o->name, sizeof o->name);
    o->pools[0] = 0;
    for (int i = 0; i < c->pools.n; i++) {
        size_t used = strlen(o->pools);
        if (used + strlen(c->pools.v[i]) + 2 > sizeof o->pools)
            return rl_errf(err, RL_EINVAL, "pools: the list is too long");
        snprintf(o->pools + used, sizeof o->pools - used, "%s%s", i ? "," : "", c->pools.v[i]);
    }
    copy(o->model, sizeof o->model, c->model);
    copy(o->served_name, sizeof o->served_name, c->served_model_name);
    o->pool_scope_model = !strcmp(c->pool_scope, "model");
    copy(o->backend, sizeof o->backend, c->backend);
    copy(o->sim_profile, sizeof o->sim_profile, c->sim_profile);
    copy(o->sim_model, sizeof o->sim_model, c->sim_model);
    copy(o->log_level, sizeof o->log_level, c->log_level);
    /* refused at start, not found out when the listener fails (which only
     * costs the metrics: worker/main.c) */
    if (strlen(c->metrics_bind) >= sizeof o->metrics_addr || listen_family(c->metrics_bind) < 0)
        return rl_errf(err, RL_EINVAL, "metrics_bind: \"%.64s\" is not an IPv4 or IPv6 address",
                       c->metrics_bind);
    copy(o->metrics_addr, sizeof o->metrics_addr, c->metrics_bind);
    o->device = c->device;
    o->threads = c->threads;
    o->mmap_weights = c->mmap_weights;
    copy(o->quantize, sizeof o->quantize, c->quantize);
    o->kv_mb = c->kv_budget_mb;
    o->kv_reserve_mb = c->kv_reserve_mb;
    o->kv_prefault = c->kv_prefault;
    o->max_batch = c->max_batch;
    o->token_budget = c->max_batch_tokens;
    o->prefill_chunk = c->prefill_chunk;
    copy(o->speculative, sizeof o->speculative, c->speculative);
    o->spec_tokens = c->spec_tokens;
    o->spec_max_rows = c->spec_max_rows;
    o->max_compiling = c->max_compiling > 0 ? c->max_compiling : 2 * c->max_batch;
    o->grammar_compile_threads = c->grammar_compile_threads;
    o->grammar_cache_mb = c->grammar_cache_mb;
    o->read_block_ms = c->block_ms;
    o->claim_idle_ms = c->claim_idle_ms;
    o->claim_interval_ms = c->claim_interval_ms;
    o->lease_renew_ms = c->lease_renew_ms;
    o->max_deliveries = c->max_deliveries;
    o->cache_ttl_s = c->result_cache ? c->cache_ttl_s : 0;
    o->heartbeat_ms = c->heartbeat_interval_ms;
    o->heartbeat_ttl_s = c->heartbeat_ttl_s;
    o->metrics_port = c->http_port;
    o->drain_timeout_s = c->drain_timeout_s;
    o->dead_maxlen = (int)cfg_dead_maxlen(c); /* dead_max_mb's cap too */
    o->max_job_kb = c->max_job_kb;
    o->default_max_tokens = c->default_max_tokens;
    o->max_max_tokens = 1 << 20;
    o->default_stream_ttl_s = c->stream_ttl_s;
    o->max_stream_ttl_s = c->max_stream_ttl_s;
    o->publish = c->publish_channel;
    o->coalesce_ms = c->coalesce_ms;
    o->publish_buffer_kb = c->publish_buffer_kb;
    o->publish_overlap = c->publish_overlap;
    return 0;
}

void wopts_default(struct wopts *o)
{
    struct cfg c;
    memset(o, 0, sizeof *o);
    if (cfg_defaults(&c, NULL) == 0)
        from_cfg(o, &c, NULL);
    cfg_free(&c);
}

int wopts_parse_args(struct wopts *o, struct cfg *keep, int argc, char **argv,
                     struct rl_err *err)
{
    struct cfg c;
    enum cfg_action act = CFG_RUN;
    int rc = cfg_load(&c, argc, argv, CFG_WORKER, &act, err);
    if (rc == 0 && act == CFG_HELP)
        cfg_print_help(stdout, "redlm-worker", CFG_WORKER);
    else if (rc == 0 && act == CFG_PRINT_CONFIG)
        cfg_write_sample(stdout);
    else if (rc == 0)
        rc = from_cfg(o, &c, err);
    if (rc == 0 && act == CFG_RUN && keep) {
        *keep = c; /* the caller's now */
        return 0;
    }
    cfg_free(&c);
    if (rc)
        return rc;
    return act == CFG_RUN ? 0 : 1;
}

int wopts_reload(struct wopts *o, struct cfg *keep, int argc, char **argv, struct rl_err *err)
{
    struct cfg fresh;
    enum cfg_action act = CFG_RUN;
    int rc = cfg_load(&fresh, argc, argv, CFG_WORKER, &act, err);
    if (rc)
        return rc;
    rc = cfg_apply_live(keep, &fresh, CFG_WORKER, err);
    cfg_free(&fresh);
    struct wopts n;
    if (!rc && !(rc = from_cfg(&n, keep, err)))
        *o = n;
    return rc;
}

int wopts_pools(const struct wopts *o, char bufs[WOPTS_MAX_POOLS][64], struct rl_err *err)
{
    int n = 0;
    const char *s = o->pools;
    while (*s) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == 0 || len >= 64)
            return rl_errf(err, RL_EINVAL, "pools: bad pool name in \"%s\"", o->pools);
        if (memchr(s, '@', len)) /* lora@<name>: an adapter's stream (worker/main.c) */
            return rl_errf(err, RL_EINVAL, "pools: \"%.*s\": '@' is kept for the LoRA "
                           "adapters' streams", (int)len, s);
        if (n == WOPTS_MAX_POOLS)
            return rl_errf(err, RL_EINVAL, "pools: more than %d pools", WOPTS_MAX_POOLS);
        memcpy(bufs[n], s, len);
        bufs[n][len] = 0;
        n++;
        s += len;
        if (*s == ',')
            s++;
    }
    if (n == 0)
        return rl_errf(err, RL_EINVAL, "pools: no pool given");
    return n;
}
