/* worker/metrics.c - /healthz and Prometheus /metrics on a loopback port
 * (libmicrohttpd), and the heartbeat value.
 *
 * The main thread updates struct wmetrics under its mutex (a few counter
 * bumps per step, and a snapshot of the engine's stats per iteration);
 * libmicrohttpd's own thread renders the text under the same mutex. The
 * lock is held for microseconds on either side, so a scrape never slows a
 * step. /healthz answers 200 "ok" once the model is loaded and Redis is
 * reachable, 503 otherwise (and while draining), so a load balancer or
 * systemd health check sees an outage. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker.h"
#include "text.h"

/* histogram bucket upper bounds in ms */
static const double wm_bounds[WM_BUCKETS] = {1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000};

struct wmetrics_server {
    struct MHD_Daemon *d;
};

void wm_init(struct wmetrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

/* Caller holds m->mu. */
void wm_observe(struct whist *h, double ms)
{
    for (int i = 0; i < WM_BUCKETS; i++)
        if (ms <= wm_bounds[i]) {
            h->bucket[i]++;
            break;
        }
    h->count++;
    h->sum_ms += ms;
}

void wm_error(struct wmetrics *m, enum ev_code code)
{
    pthread_mutex_lock(&m->mu);
    if (code > 0 && code < EV_CODE_COUNT)
        m->errors[code]++;
    pthread_mutex_unlock(&m->mu);
}

static void put_hist(struct text *t, const char *name, const char *help, const struct whist *h)
{
    text_printf(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    int64_t cum = 0;
    for (int i = 0; i < WM_BUCKETS; i++) {
        cum += h->bucket[i];
        text_printf(t, "%s_bucket{le=\"%g\"} %lld\n", name, wm_bounds[i] / 1000.0, (long long)cum);
    }
    text_printf(t, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.6f\n%s_count %lld\n", name,
        (long long)h->count, name, h->sum_ms / 1000.0, name, (long long)h->count);
}

static char *render(struct worker *w)
{
    struct text t = {0};
    struct wmetrics *m = &w->m;
    pthread_mutex_lock(&m->mu);
    put_hist(&t, "redlm_queue_wait_seconds", "time from XADD of the job to its admission",
             &m->queue_wait);
    put_hist(&t, "redlm_ttft_seconds", "time from XADD of the job to its first token", &m->ttft);
    put_hist(&t, "redlm_tpot_seconds", "time per output token after the first", &m->tpot);
    text_printf(&t, "# TYPE redlm_tokens_total counter\nredlm_tokens_total %lld\n",
        (long long)m->tokens_out);
    text_printf(&t, "# TYPE redlm_jobs_done_total counter\nredlm_jobs_done_total %lld\n",
        (long long)m->jobs_done);
    text_printf(&t, "# TYPE redlm_running gauge\nredlm_running %d\n", m->running);
    text_printf(&t, "# TYPE redlm_waiting gauge\nredlm_waiting %d\n", m->waiting);
    text_printf(&t, "# TYPE redlm_kv_blocks gauge\nredlm_kv_blocks %d\n", m->kv_blocks);
    text_printf(&t, "# TYPE redlm_kv_used_blocks gauge\nredlm_kv_used_blocks %d\n", m->kv_used);
    text_printf(&t, "# TYPE redlm_kv_usage_ratio gauge\nredlm_kv_usage_ratio %.4f\n",
        m->kv_blocks ? (double)m->kv_used / m->kv_blocks : 0.0);
    text_printf(&t, "# TYPE redlm_prefix_cache_hit_tokens_total counter\n"
            "redlm_prefix_cache_hit_tokens_total %lld\n", (long long)m->prefix_hit_tokens);
    text_printf(&t, "# TYPE redlm_prefix_cache_miss_tokens_total counter\n"
            "redlm_prefix_cache_miss_tokens_total %lld\n", (long long)m->prefix_miss_tokens);
    text_printf(&t, "# TYPE redlm_result_cache_hits_total counter\nredlm_result_cache_hits_total %lld\n",
        (long long)m->cache_hits);
    text_printf(&t, "# TYPE redlm_result_cache_misses_total counter\n"
            "redlm_result_cache_misses_total %lld\n", (long long)m->cache_misses);
    text_printf(&t, "# TYPE redlm_reclaimed_total counter\nredlm_reclaimed_total %lld\n",
        (long long)m->reclaimed);
    text_printf(&t, "# TYPE redlm_redis_reconnects_total counter\nredlm_redis_reconnects_total %lld\n",
        (long long)m->redis_reconnects);
    text_printf(&t, "# TYPE redlm_tokens_per_second gauge\nredlm_tokens_per_second %.2f\n",
        m->tokens_per_s);
    text_printf(&t, "# TYPE redlm_errors_total counter\n");
    for (int c = 1; c < EV_CODE_COUNT; c++)
        if (m->errors[c])
            text_printf(&t, "redlm_errors_total{code=\"%s\"} %lld\n", ev_code_name((enum ev_code)c),
                (long long)m->errors[c]);
    pthread_mutex_unlock(&m->mu);
    return t.p;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    struct worker *w = cls;
    int status = 200;
    char *body = NULL;
    const char *ctype = "text/plain; charset=utf-8";
    if (strcmp(method, "GET")) {
        status = 405;
        body = strdup("GET only\n");
    } else if (!strcmp(url, "/healthz")) {
        pthread_mutex_lock(&w->m.mu);
        bool ok = w->m.ready && w->m.redis_up && !w->m.draining;
        pthread_mutex_unlock(&w->m.mu);
        status = ok ? 200 : 503;
        body = strdup(ok ? "ok\n" : "unavailable\n");
    } else if (!strcmp(url, "/metrics")) {
        body = render(w);
        ctype = "text/plain; version=0.0.4";
    } else {
        status = 404;
        body = strdup("not found\n");
    }
    if (!body)
        return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

int wm_start(struct worker *w, struct rl_err *err)
{
    if (w->opt.metrics_port <= 0)
        return 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)w->opt.metrics_port)};
    if (inet_pton(AF_INET, w->opt.metrics_addr, &sa.sin_addr) != 1)
        return rl_errf(err, RL_EINVAL, "metrics_addr: \"%s\" is not an IPv4 address",
                       w->opt.metrics_addr);
    struct wmetrics_server *s = calloc(1, sizeof *s);
    if (!s)
        return rl_errf(err, RL_ENOMEM, "metrics: out of memory");
    s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, (uint16_t)w->opt.metrics_port, NULL,
                            NULL, handle, w, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_END);
    if (!s->d) {
        free(s);
        return rl_errf(err, RL_EIO, "metrics: cannot listen on %s:%d", w->opt.metrics_addr,
                       w->opt.metrics_port);
    }
    w->http = s;
    return 0;
}

void wm_stop(struct worker *w)
{
    if (!w->http)
        return;
    MHD_stop_daemon(w->http->d);
    free(w->http);
    w->http = NULL;
}

char *wm_heartbeat_json(struct worker *w)
{
    struct engine_stats st;
    engine_get_stats(w->eng, &st);
    cJSON *o = cJSON_CreateObject();
    cJSON *pools = cJSON_AddArrayToObject(o, "pools");
    for (int p = 0; p < w->n_pools; p++)
        cJSON_AddItemToArray(pools, cJSON_CreateString(w->pools[p]));
    cJSON_AddStringToObject(o, "name", w->opt.name);
    cJSON_AddNumberToObject(o, "running", st.n_running);
    cJSON_AddNumberToObject(o, "waiting", st.n_waiting);
    cJSON_AddNumberToObject(o, "held", w->n_jobs);
    cJSON_AddNumberToObject(o, "kv_free_blocks", st.kv_free + st.kv_cached);
    cJSON_AddNumberToObject(o, "kv_blocks", st.kv_blocks);
    cJSON_AddNumberToObject(o, "tokens_per_s", (double)(int64_t)(w->tok_rate * 10) / 10.0);
    cJSON_AddNumberToObject(o, "time_ms", (double)rl_wall_ms());
    cJSON_AddNumberToObject(o, "uptime_s", (double)((rl_wall_ms() - w->t_start_ms) / 1000));
    /* the served name, what jobs and HTTP requests select it by; the
     * dispatcher builds its model table from these (schemas/README.md) */
    cJSON_AddStringToObject(o, "model", w->model.name);
    cJSON_AddStringToObject(o, "model_dir", w->model.dir);
    cJSON_AddNumberToObject(o, "model_created", (double)w->model.created);
    cJSON_AddStringToObject(o, "model_owned_by", w->model.owned_by);
    cJSON_AddStringToObject(o, "pool_scope", w->opt.pool_scope_model ? "model" : "shared");
    /* counters since start, for redlm stats/top: totals and hit rates */
    pthread_mutex_lock(&w->m.mu);
    cJSON_AddNumberToObject(o, "jobs_done", (double)w->m.jobs_done);
    cJSON_AddNumberToObject(o, "tokens_out", (double)w->m.tokens_out);
    cJSON_AddNumberToObject(o, "cache_hits", (double)w->m.cache_hits);
    cJSON_AddNumberToObject(o, "cache_misses", (double)w->m.cache_misses);
    cJSON_AddNumberToObject(o, "prefix_hit_tokens", (double)w->m.prefix_hit_tokens);
    cJSON_AddNumberToObject(o, "prefix_miss_tokens", (double)w->m.prefix_miss_tokens);
    cJSON_AddNumberToObject(o, "reclaimed", (double)w->m.reclaimed);
    pthread_mutex_unlock(&w->m.mu);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
