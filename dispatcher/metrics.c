/* dispatcher/metrics.c - the dispatcher's counters as Prometheus text
 * (disp_metrics_text, for the HTTP front door's /metrics) and as the
 * heartbeat JSON of <prefix>dispatcher:<name> (format in the notes on the
 * key namespace). Both read struct dmetrics under its mutex, so they may
 * run on any thread; the main loop holds the mutex only to bump counters. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "disp.h"
#include "text.h"

void dm_init(struct dmetrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

/* One labelled family: a counter or gauge per pool. */
static void per_pool(struct text *t, const struct disp *d, const char *name, const char *type,
                     const char *help, const int64_t *v)
{
    text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    for (int p = 0; p < d->n_pools; p++)
        text_printf(t, "%s{pool=\"%s\"} %lld\n", name, d->pools[p].name, (long long)v[p]);
}

char *disp_metrics_text(struct disp *d)
{
    struct text t = {0};
    struct dmetrics *m = &d->m;
    pthread_mutex_lock(&m->mu);
    per_pool(&t, d, "redlm_dispatcher_routed_total", "counter",
             "requests forwarded to each pool", m->routed);
    per_pool(&t, d, "redlm_dispatcher_auto_routed_total", "counter",
             "of those, auto requests placed by a think rule or the ratio", m->auto_routed);
    per_pool(&t, d, "redlm_dispatcher_pool_waiting", "gauge",
             "jobs in the pool stream no worker has taken yet", m->pool_waiting);
    text_printf(&t, "# HELP redlm_dispatcher_pool_wait_seconds age of the oldest job no worker "
            "has taken yet\n# TYPE redlm_dispatcher_pool_wait_seconds gauge\n");
    for (int p = 0; p < d->n_pools; p++)
        text_printf(&t, "redlm_dispatcher_pool_wait_seconds{pool=\"%s\"} %.3f\n", d->pools[p].name,
                    (double)m->pool_wait_ms[p] / 1000.0);
    text_printf(&t, "# HELP redlm_dispatcher_think_ratio configured share of auto requests sent to think\n"
            "# TYPE redlm_dispatcher_think_ratio gauge\nredlm_dispatcher_think_ratio %.6f\n",
        m->ratio);
    text_printf(&t, "# HELP redlm_dispatcher_think_ratio_effective the share in use (adaptive routing "
            "moves it)\n# TYPE redlm_dispatcher_think_ratio_effective gauge\n"
            "redlm_dispatcher_think_ratio_effective %.6f\n", m->ratio_effective);
    text_printf(&t, "# HELP redlm_dispatcher_cache_hits_total requests answered from the result "
            "cache without a worker\n# TYPE redlm_dispatcher_cache_hits_total counter\n"
            "redlm_dispatcher_cache_hits_total %lld\n", (long long)m->cache_hits);
    text_printf(&t, "# HELP redlm_dispatcher_cache_misses_total cacheable requests the result "
            "cache did not have\n# TYPE redlm_dispatcher_cache_misses_total counter\n"
            "redlm_dispatcher_cache_misses_total %lld\n", (long long)m->cache_misses);
    text_printf(&t, "# HELP redlm_dispatcher_invalid_total requests refused as invalid (error event + "
            "dead letter)\n# TYPE redlm_dispatcher_invalid_total counter\n"
            "redlm_dispatcher_invalid_total %lld\n", (long long)m->invalid);
    text_printf(&t, "# HELP redlm_dispatcher_overloaded_total requests refused with OVERLOADED\n"
            "# TYPE redlm_dispatcher_overloaded_total counter\n"
            "redlm_dispatcher_overloaded_total %lld\n", (long long)m->overloaded);
    text_printf(&t, "# HELP redlm_dispatcher_reclaimed_total requests claimed from a dispatcher "
            "that stopped answering\n# TYPE redlm_dispatcher_reclaimed_total counter\n"
            "redlm_dispatcher_reclaimed_total %lld\n", (long long)m->reclaimed);
    text_printf(&t, "# HELP redlm_dispatcher_requests_per_second requests routed per second, "
            "smoothed\n# TYPE redlm_dispatcher_requests_per_second gauge\n"
            "redlm_dispatcher_requests_per_second %.2f\n", m->requests_per_s);
    /* prefix-affine pulling (issue 27, affinity.c) */
    text_printf(&t, "# HELP redlm_dispatcher_affinity_offers_total jobs offered to the worker "
            "holding the longest prefix of their prompt\n# TYPE redlm_dispatcher_affinity_offers_total "
            "counter\nredlm_dispatcher_affinity_offers_total %lld\n", (long long)m->aff_offers);
    text_printf(&t, "# HELP redlm_dispatcher_affinity_hits_total offers their worker took "
            "(offers - fallbacks - takeovers - still waiting)\n# TYPE redlm_dispatcher_affinity_hits_total "
            "counter\nredlm_dispatcher_affinity_hits_total %lld\n",
            (long long)(m->aff_offers - m->aff_fallbacks - m->aff_takeovers));
    text_printf(&t, "# HELP redlm_dispatcher_affinity_fallbacks_total offers not taken within "
            "the affinity wait, moved to the pool\n# TYPE redlm_dispatcher_affinity_fallbacks_total "
            "counter\nredlm_dispatcher_affinity_fallbacks_total %lld\n", (long long)m->aff_fallbacks);
    text_printf(&t, "# HELP redlm_dispatcher_affinity_takeovers_total offers taken by a worker "
            "that then stopped renewing them, moved to the pool to be resumed\n"
            "# TYPE redlm_dispatcher_affinity_takeovers_total counter\n"
            "redlm_dispatcher_affinity_takeovers_total %lld\n", (long long)m->aff_takeovers);
    text_printf(&t, "# HELP redlm_dispatcher_affinity_no_match_total jobs sent to the pool: no "
            "worker holds more of their prefix than another\n"
            "# TYPE redlm_dispatcher_affinity_no_match_total counter\n"
            "redlm_dispatcher_affinity_no_match_total %lld\n", (long long)m->aff_no_match);
    text_printf(&t, "# HELP redlm_dispatcher_affinity_deep_total jobs sent to the pool: the "
            "holder's offers were deeper than the pool's queue\n"
            "# TYPE redlm_dispatcher_affinity_deep_total counter\n"
            "redlm_dispatcher_affinity_deep_total %lld\n", (long long)m->aff_deep);
    int64_t ft = m->fleet_hit_tokens + m->fleet_miss_tokens;
    text_printf(&t, "# HELP redlm_fleet_prefix_hit_ratio prompt tokens the live workers served "
            "from their prefix caches / prompt tokens, since they started\n"
            "# TYPE redlm_fleet_prefix_hit_ratio gauge\nredlm_fleet_prefix_hit_ratio %.6f\n",
            ft ? (double)m->fleet_hit_tokens / (double)ft : 0.0);
    text_printf(&t, "# HELP redlm_dispatcher_ready 1 once connected and routing\n"
            "# TYPE redlm_dispatcher_ready gauge\nredlm_dispatcher_ready %d\n", m->ready ? 1 : 0);
    pthread_mutex_unlock(&m->mu);
    if (t.oom) {
        free(t.p);
        return NULL;
    }
    return t.p;
}

bool disp_ready(struct disp *d)
{
    pthread_mutex_lock(&d->m.mu);
    bool r = d->m.ready;
    pthread_mutex_unlock(&d->m.mu);
    return r;
}

char *dm_heartbeat_json(struct disp *d)
{
    struct dmetrics *m = &d->m;
    int64_t now = rl_wall_ms();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", d->name);
    cJSON_AddNumberToObject(o, "pid", (double)getpid());
    cJSON_AddNumberToObject(o, "time_ms", (double)now);
    cJSON_AddNumberToObject(o, "uptime_s", (double)((now - d->t_start_ms) / 1000));
    cJSON *routed = cJSON_AddObjectToObject(o, "routed");
    cJSON *auto_routed = cJSON_AddObjectToObject(o, "auto_routed");
    cJSON *waiting = NULL, *wait_ms = NULL;
    pthread_mutex_lock(&m->mu);
    for (int p = 0; p < d->n_pools; p++) {
        cJSON_AddNumberToObject(routed, d->pools[p].name, (double)m->routed[p]);
        cJSON_AddNumberToObject(auto_routed, d->pools[p].name, (double)m->auto_routed[p]);
    }
    cJSON_AddNumberToObject(o, "think_ratio", m->ratio);
    cJSON_AddNumberToObject(o, "think_ratio_effective", m->ratio_effective);
    cJSON_AddBoolToObject(o, "adaptive", m->adaptive);
    cJSON_AddNumberToObject(o, "cache_hits", (double)m->cache_hits);
    cJSON_AddNumberToObject(o, "cache_misses", (double)m->cache_misses);
    cJSON_AddNumberToObject(o, "invalid", (double)m->invalid);
    cJSON_AddNumberToObject(o, "overloaded", (double)m->overloaded);
    cJSON_AddNumberToObject(o, "requests_per_s", (double)(int64_t)(m->requests_per_s * 10) / 10.0);
    cJSON *aff = cJSON_AddObjectToObject(o, "affinity");
    cJSON_AddNumberToObject(aff, "offers", (double)m->aff_offers);
    cJSON_AddNumberToObject(aff, "hits", (double)(m->aff_offers - m->aff_fallbacks - m->aff_takeovers));
    cJSON_AddNumberToObject(aff, "fallbacks", (double)m->aff_fallbacks);
    cJSON_AddNumberToObject(aff, "takeovers", (double)m->aff_takeovers);
    cJSON_AddNumberToObject(aff, "no_match", (double)m->aff_no_match);
    cJSON_AddNumberToObject(aff, "deep", (double)m->aff_deep);
    cJSON_AddNumberToObject(aff, "fleet_prefix_hit_tokens", (double)m->fleet_hit_tokens);
    cJSON_AddNumberToObject(aff, "fleet_prefix_miss_tokens", (double)m->fleet_miss_tokens);
    waiting = cJSON_AddObjectToObject(o, "pool_waiting");
    wait_ms = cJSON_AddObjectToObject(o, "pool_wait_ms");
    for (int p = 0; p < d->n_pools; p++) {
        cJSON_AddNumberToObject(waiting, d->pools[p].name, (double)m->pool_waiting[p]);
        cJSON_AddNumberToObject(wait_ms, d->pools[p].name, (double)m->pool_wait_ms[p]);
    }
    pthread_mutex_unlock(&m->mu);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
