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
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "listen.h"
#include "affinity.h"
#include "base64.h"
#include "worker.h"
#include "text.h"
#include "vbuckets.h"

/* Bucket bounds, in the spirit of vLLM's: latency up to 2560 s so that a
 * queue backed up for minutes still lands in a finite bucket, inter-token
 * gaps from 10 ms, and lengths in 1-2-5 steps up to the longest context. */
static const double wm_le_latency[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                       0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 60, 80, 160,
                                       640, 2560};
static const double wm_le_request[] = {0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30,
                                       40, 50, 60, 120, 240, 480, 960, 1920, 7680};
static const double wm_le_token[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                     0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80};
static const double wm_le_len[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000,
                                   10000, 20000, 50000, 100000, 200000};
#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))
_Static_assert(N_OF(wm_le_latency) <= WM_MAX_BUCKETS && N_OF(wm_le_request) <= WM_MAX_BUCKETS &&
               N_OF(wm_le_token) <= WM_MAX_BUCKETS && N_OF(wm_le_len) <= WM_MAX_BUCKETS,
               "WM_MAX_BUCKETS too small");

struct wmetrics_server {
    struct MHD_Daemon *d;
};

static void hist_init(struct whist *h, const double *le, int n_le)
{
    h->le = le;
    h->n_le = n_le;
}

void wm_init(struct wmetrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->queue_wait, wm_le_latency, N_OF(wm_le_latency));
    hist_init(&m->ttft, wm_le_latency, N_OF(wm_le_latency));
    hist_init(&m->prefill, wm_le_latency, N_OF(wm_le_latency));
    hist_init(&m->inter_token, wm_le_token, N_OF(wm_le_token));
    hist_init(&m->e2e, wm_le_request, N_OF(wm_le_request));
    hist_init(&m->decode, wm_le_request, N_OF(wm_le_request));
    hist_init(&m->prompt_len, wm_le_len, N_OF(wm_le_len));
    hist_init(&m->gen_len, wm_le_len, N_OF(wm_le_len));
    hist_init(&m->v_queue, wm_le_request, N_OF(wm_le_request));
    hist_init(&m->v_prefill, wm_le_request, N_OF(wm_le_request));
    hist_init(&m->v_decode, wm_le_request, N_OF(wm_le_request));
    snprintf(m->model_name, sizeof m->model_name, "unknown");
}

/* The label value is the last path component (trailing slashes dropped),
 * with '"', '\' and newlines escaped as the text format requires. */
void wm_set_model(struct wmetrics *m, const char *model)
{
    size_t n = strlen(model);
    while (n > 1 && model[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && model[b - 1] != '/')
        b--;
    size_t o = 0;
    for (size_t i = b; i < n && o + 3 < sizeof m->model_name; i++) {
        char c = model[i];
        if (c == '"' || c == '\\' || c == '\n') {
            m->model_name[o++] = '\\';
            c = c == '\n' ? 'n' : c;
        }
        m->model_name[o++] = c;
    }
    m->model_name[o] = 0;
    if (!o)
        snprintf(m->model_name, sizeof m->model_name, "unknown");
}

void wm_observe(struct whist *h, double v)
{
    for (int i = 0; i < h->n_le; i++)
        if (v <= h->le[i]) {
            h->bucket[i]++;
            break;
        }
    h->count++;
    h->sum += v;
}

void wm_error(struct wmetrics *m, enum ev_code code)
{
    pthread_mutex_lock(&m->mu);
    if (code > 0 && code < EV_CODE_COUNT)
        m->errors[code]++;
    pthread_mutex_unlock(&m->mu);
}

static void put_head(struct text *t, const char *name, const char *type, const char *help)
{
    text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void put_hist(struct text *t, const char *mn, const char *name, const char *help,
                     const struct whist *h)
{
    put_head(t, name, "histogram", help);
    int64_t cum = 0;
    for (int i = 0; i < h->n_le; i++) {
        cum += h->bucket[i];
        text_printf(t, "%s_bucket{model_name=\"%s\",le=\"%g\"} %lld\n", name, mn, h->le[i],
                    (long long)cum);
    }
    text_printf(t, "%s_bucket{model_name=\"%s\",le=\"+Inf\"} %lld\n", name, mn, (long long)h->count);
    text_printf(t, "%s_sum{model_name=\"%s\"} %.6f\n%s_count{model_name=\"%s\"} %lld\n", name, mn,
                h->sum, name, mn, (long long)h->count);
}

/* One unlabelled-but-for-model_name sample with its HELP and TYPE. */
static void put_one(struct text *t, const char *mn, const char *name, const char *type,
                    const char *help, double v)
{
    put_head(t, name, type, help);
    text_printf(t, "%s{model_name=\"%s\"} %.17g\n", name, mn, v);
}

/* The families with one sample each (or one histogram), in page order:
 * the field of struct wmetrics each reads and what kind of value it is.
 * One row a line, as common/event.c's table of codes, so a row reads whole. */
enum wm_kind { WM_HIST, WM_I64, WM_INT, WM_DBL, WM_BOOL };
#define WM_F(f) offsetof(struct wmetrics, f)
static const struct {
    const char *name, *type, *help;
    size_t off;
    enum wm_kind kind;
} wm_families[] = {
    {"redlm_queue_wait_seconds", "histogram", "time from the job's XADD to its admission into the engine", WM_F(queue_wait), WM_HIST},
    {"redlm_ttft_seconds", "histogram", "time from the job's XADD to its first token", WM_F(ttft), WM_HIST},
    {"redlm_inter_token_latency_seconds", "histogram", "time between two successive tokens of one job", WM_F(inter_token), WM_HIST},
    {"redlm_e2e_request_latency_seconds", "histogram", "time from the job's XADD to its done event", WM_F(e2e), WM_HIST},
    {"redlm_request_prefill_time_seconds", "histogram", "time from admission to the first token (prompt processing)", WM_F(prefill), WM_HIST},
    {"redlm_request_decode_time_seconds", "histogram", "time from the first token to the done event", WM_F(decode), WM_HIST},
    {"redlm_request_prompt_tokens", "histogram", "prompt length of finished jobs, tokens", WM_F(prompt_len), WM_HIST},
    {"redlm_request_generation_tokens", "histogram", "tokens generated by finished jobs", WM_F(gen_len), WM_HIST},
    {"redlm_prompt_tokens_total", "counter", "prompt tokens of finished jobs (cached ones included)", WM_F(prompt_tokens), WM_I64},
    {"redlm_generation_tokens_total", "counter", "tokens generated", WM_F(tokens_out), WM_I64},
    {"redlm_jobs_done_total", "counter", "jobs finished by the engine", WM_F(jobs_done), WM_I64},
    {"redlm_preemptions_total", "counter", "sequences the scheduler preempted to free KV blocks (their work is recomputed)", WM_F(preemptions), WM_I64},
    {"redlm_running", "gauge", "sequences running in the engine", WM_F(running), WM_INT},
    {"redlm_waiting", "gauge", "sequences waiting for admission in the engine", WM_F(waiting), WM_INT},
    {"redlm_compiling", "gauge", "requests waiting for their constraint (response_format, grammar, tool_choice) to compile on the engine's compile threads", WM_F(compiling), WM_INT},
    {"redlm_grammar_cache_bytes", "gauge", "memory held by the compiled constraints the engine caches (bounded by grammar_cache_mb)", WM_F(grammar_cache_bytes), WM_I64},
    {"redlm_kv_blocks", "gauge", "KV cache blocks in the pool", WM_F(kv_blocks), WM_INT},
    {"redlm_kv_used_blocks", "gauge", "KV cache blocks referenced by a sequence", WM_F(kv_used), WM_INT},
    {"redlm_prefix_cache_hit_tokens_total", "counter", "prompt tokens the prefix cache supplied", WM_F(prefix_hit_tokens), WM_I64},
    {"redlm_prefix_cache_miss_tokens_total", "counter", "prompt tokens the prefix cache did not have", WM_F(prefix_miss_tokens), WM_I64},
    {"redlm_affinity_taken_total", "counter", "jobs taken from this worker's offer streams (prefix-affine pulling)", WM_F(affinity_taken), WM_I64},
    {"redlm_handed_off_total", "counter", "jobs for LoRA adapters this worker lacks, moved to the adapters' streams", WM_F(handed_off), WM_I64},
    {"redlm_foreign_taken_total", "counter", "jobs taken from pool shards other than this worker's home shard (Redis Cluster)", WM_F(foreign_taken), WM_I64},
    {"redlm_foreign_looks_total", "counter", "looks at pool shards other than this worker's home shard for jobs waiting there (Redis Cluster, a busy worker)", WM_F(foreign_looks), WM_I64},
    {"redlm_foreign_looks_drained_total", "counter", "of those looks, the ones that found nothing waiting (each slows that shard's next look)", WM_F(foreign_looks_drained), WM_I64},
    {"redlm_spec_drafted_tokens_total", "counter", "draft tokens verified (speculative decoding)", WM_F(spec_drafted), WM_I64},
    {"redlm_spec_accepted_tokens_total", "counter", "draft tokens kept as output", WM_F(spec_accepted), WM_I64},
    {"redlm_result_cache_hits_total", "counter", "jobs answered from the result cache", WM_F(cache_hits), WM_I64},
    {"redlm_result_cache_misses_total", "counter", "cacheable jobs the result cache did not have", WM_F(cache_misses), WM_I64},
    {"redlm_reclaimed_total", "counter", "jobs claimed from a worker that stopped answering", WM_F(reclaimed), WM_I64},
    {"redlm_jobs_fenced_total", "counter", "jobs this worker stopped because another worker had taken them over (fence.h)", WM_F(fenced), WM_I64},
    {"redlm_redis_reconnects_total", "counter", "reconnections to Redis", WM_F(redis_reconnects), WM_I64},
    {"redlm_redis_oom", "gauge", "1 while Redis refuses writes for memory (maxmemory, noeviction): no job is admitted, events are held back", WM_F(redis_oom), WM_BOOL},
    {"redlm_reclaiming", "gauge", "1 while, after memory pressure or a job given up, the worker reads no new job and claims the jobs handed back first", WM_F(reclaiming), WM_BOOL},
    {"redlm_redis_oom_total", "counter", "times Redis began refusing writes for memory", WM_F(redis_oom_total), WM_I64},
    {"redlm_publish_buffered_events", "gauge", "events waiting in outboxes for Redis to store them", WM_F(events_buffered), WM_I64},
    {"redlm_jobs_given_up_total", "counter", "jobs left pending for another delivery because Redis would not store their events (publish_buffer_kb or deadline)", WM_F(jobs_given_up), WM_I64},
    {"redlm_tokens_per_second", "gauge", "generation rate, tokens per second, smoothed over about two seconds", WM_F(tokens_per_s), WM_DBL},
};
#undef WM_F

/* The text format: every family has HELP and TYPE, every sample the
 * model_name label (vLLM's convention, so one dashboard serves several
 * models), units are seconds and tokens. Rendered under m->mu. */
static char *render(struct worker *w)
{
    struct text t = {0};
    struct wmetrics *m = &w->m;
    pthread_mutex_lock(&m->mu);
    const char *mn = m->model_name;
    for (int i = 0; i < N_OF(wm_families); i++) {
        const char *f = (const char *)m + wm_families[i].off;
        double v = 0;
        switch (wm_families[i].kind) {
        case WM_HIST:
            put_hist(&t, mn, wm_families[i].name, wm_families[i].help,
                     (const struct whist *)f);
            continue;
        case WM_I64: v = (double)*(const int64_t *)f; break;
        case WM_INT: v = *(const int *)f; break;
        case WM_DBL: v = *(const double *)f; break;
        case WM_BOOL: v = *(const bool *)f; break;
        }
        put_one(&t, mn, wm_families[i].name, wm_families[i].type, wm_families[i].help, v);
    }
    put_one(&t, mn, "redlm_kv_usage_ratio", "gauge", "share of KV cache blocks in use (0-1)",
            m->kv_blocks ? (double)m->kv_used / m->kv_blocks : 0.0);
    put_head(&t, "redlm_requests_finished_total", "counter",
             "jobs the engine finished, by finish reason");
    for (int f = 0; f <= EV_FINISH_ERROR; f++)
        text_printf(&t, "redlm_requests_finished_total{model_name=\"%s\",finished_reason=\"%s\"} %lld\n",
                    mn, ev_finish_name((enum ev_finish)f), (long long)m->finished[f]);
    /* adapters are loaded before this page is served and never change,
     * so their names are read without the engine's owner thread */
    if (w->n_loras > 0) {
        put_head(&t, "redlm_lora_requests_total", "counter",
                 "jobs the engine finished with each LoRA adapter (lora_modules)");
        for (int i = 0; i < w->n_loras; i++)
            text_printf(&t, "redlm_lora_requests_total{model_name=\"%s\",lora_name=\"%s\"} %lld\n", mn,
                        engine_lora_name(w->eng, i), (long long)m->lora_jobs[i]);
    }
    put_head(&t, "redlm_errors_total", "counter", "error events sent, by code");
    for (int c = 1; c < EV_CODE_COUNT; c++)
        if (m->errors[c])
            text_printf(&t, "redlm_errors_total{model_name=\"%s\",code=\"%s\"} %lld\n", mn,
                        ev_code_name((enum ev_code)c), (long long)m->errors[c]);
    pthread_mutex_unlock(&m->mu);
    if (t.oom) {
        free(t.p);
        return NULL;
    }
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
        bool oom = w->m.redis_oom;
        pthread_mutex_unlock(&w->m.mu);
        status = ok && !oom ? 200 : 503;
        /* out of memory: the worker is alive but can take no work */
        body = strdup(!ok ? "unavailable\n" : oom ? "redis out of memory: not admitting\n" : "ok\n");
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
    int fam = listen_family(w->opt.metrics_addr);
    if (fam < 0)
        return rl_errf(err, RL_EINVAL, "metrics_bind: \"%s\" is not an IPv4 or IPv6 address",
                       w->opt.metrics_addr);
    /* our own socket: a taken port is an error naming it (listen.h) */
    int fd, rc = listen_tcp(w->opt.metrics_addr, w->opt.metrics_port, 64, "http_port", &fd, err);
    if (rc)
        return rl_err_wrap(err, "metrics");
    struct wmetrics_server *s = calloc(1, sizeof *s);
    if (!s) {
        close(fd);
        return rl_errf(err, RL_ENOMEM, "metrics: out of memory");
    }
    s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | (fam == 1 ? MHD_USE_IPv6 : 0),
                            (uint16_t)w->opt.metrics_port, NULL,
                            NULL, handle, w, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_END);
    if (!s->d) {
        close(fd);
        free(s);
        return rl_errf(err, RL_EIO, "metrics: cannot start the HTTP server on %s:%d",
                       w->opt.metrics_addr, w->opt.metrics_port);
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

/* h's cumulative counts at vLLM's bounds (n of them), with its count and
 * sum, as key_buckets, key_count, key_sum: the front door sums them over
 * the fleet into vllm:time_to_first_token_seconds,
 * vllm:e2e_request_latency_seconds, vllm:time_per_output_token_seconds,
 * vllm:request_prompt_tokens, vllm:request_generation_tokens,
 * vllm:request_queue_time_seconds, vllm:request_prefill_time_seconds and
 * vllm:request_decode_time_seconds (dispatcher/fleet.c). vLLM's bounds are among h's (wm_le_latency,
 * wm_le_request, wm_le_token, wm_le_len), so the counts are exact; an
 * observation above h's last bound is in the count only, as on /metrics. */
static void hb_hist(cJSON *o, const char *key, const struct whist *h, const double *vb, int n)
{
    char k[32];
    snprintf(k, sizeof k, "%s_buckets", key);
    cJSON *a = cJSON_AddArrayToObject(o, k);
    int64_t cum = 0;
    int j = 0;
    for (int i = 0; i < n && a; i++) {
        while (j < h->n_le && h->le[j] <= vb[i] * (1 + 1e-9))
            cum += h->bucket[j++];
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)cum));
    }
    snprintf(k, sizeof k, "%s_count", key);
    cJSON_AddNumberToObject(o, k, (double)h->count);
    snprintf(k, sizeof k, "%s_sum", key);
    cJSON_AddNumberToObject(o, k, h->sum);
}

char *wm_heartbeat_json(struct worker *w)
{
    struct engine_stats st;
    engine_get_stats(w->eng, &st);
    cJSON *o = cJSON_CreateObject();
    cJSON *pools = cJSON_AddArrayToObject(o, "pools");
    for (int p = 0; p < w->n_cfg_pools; p++)
        cJSON_AddItemToArray(pools, cJSON_CreateString(w->pools[p]));
    cJSON_AddStringToObject(o, "name", w->opt.name);
    cJSON_AddNumberToObject(o, "running", st.n_running);
    cJSON_AddNumberToObject(o, "waiting", st.n_waiting);
    cJSON_AddNumberToObject(o, "compiling", st.n_compiling); /* no slot yet (engine.h) */
    cJSON_AddNumberToObject(o, "held", w->n_jobs);
    cJSON_AddNumberToObject(o, "kv_free_blocks", st.kv_free + st.kv_cached);
    cJSON_AddNumberToObject(o, "kv_blocks", st.kv_blocks);
    /* referenced by a sequence: the fleet's vllm:kv_cache_usage_perc
     * (dispatcher/fleet.c) is the sum of these over the sum of kv_blocks */
    cJSON_AddNumberToObject(o, "kv_used", st.kv_used);
    cJSON_AddNumberToObject(o, "preemptions", (double)st.n_preemptions);
    cJSON_AddNumberToObject(o, "tokens_per_s", (double)(int64_t)(w->tok_rate * 10) / 10.0);
    cJSON_AddNumberToObject(o, "time_ms", (double)rl_wall_ms());
    cJSON_AddNumberToObject(o, "uptime_s", (double)((rl_wall_ms() - w->t_start_ms) / 1000));
    /* the served name, what jobs and HTTP requests select it by; the
     * dispatcher builds its model table from these (schemas/README.md) */
    cJSON_AddStringToObject(o, "model", w->model.name);
    cJSON_AddStringToObject(o, "model_dir", w->model.dir);
    cJSON_AddNumberToObject(o, "model_created", (double)w->model.created);
    cJSON_AddStringToObject(o, "model_owned_by", w->model.owned_by);
    /* what its weights are: Ollama's /api/tags and /api/show details */
    char ql[24];
    model_quant_label(engine_model(w->eng), ql, sizeof ql);
    cJSON_AddStringToObject(o, "model_format", model_get_gguf(engine_model(w->eng)) ? "gguf" : "safetensors");
    cJSON_AddStringToObject(o, "model_quantization", ql);
    cJSON_AddNumberToObject(o, "model_parameters", (double)model_n_params(engine_model_config(w->eng)));
    cJSON_AddStringToObject(o, "pool_scope", w->opt.pool_scope_model ? "model" : "shared");
    /* the LoRA adapters it serves beside model (lora_modules): more model
     * names, which the dispatcher routes to this model's pools */
    if (w->n_loras > 0) {
        cJSON *la = cJSON_AddArrayToObject(o, "lora_adapters");
        for (int i = 0; la && i < w->n_loras; i++) {
            if (w_lora_gone(w, i)) /* unloaded at runtime: not served */
                continue;
            /* loaded since start, its stream not laid out yet (loop.c): not
             * announced until it is, so the dispatcher sends its jobs to a
             * stream someone reads, never to pools where a worker without
             * it finds no stream to hand them on to */
            if (w->relayout && i >= w->n_lora_specs)
                continue;
            cJSON *a = cJSON_CreateObject();
            if (!a)
                break;
            cJSON_AddStringToObject(a, "name", engine_lora_name(w->eng, i));
            cJSON_AddNumberToObject(a, "rank", engine_lora_rank(w->eng, i));
            /* loaded by the fleet's wish (lorart.c): from this lora_path */
            if (w_lorart_path(w, i))
                cJSON_AddStringToObject(a, "lora_path", w_lorart_path(w, i));
            /* read from its own stream (main.c make_pool_keys): one loaded
             * since start has it once the streams are laid out again */
            if (i < w->n_lora_streams)
                cJSON_AddTrueToObject(a, "stream");
            cJSON_AddItemToArray(la, a);
        }
    }
    w_lorart_heartbeat(w, o);
    /* the shards it reads per pool (issue 27; 1 on a single instance): the
     * dispatcher warns when its own pool_shards differs */
    cJSON_AddNumberToObject(o, "pool_shards", w->n_shards > 0 ? w->n_shards : 1);
    /* its home shard on a cluster (-1: none; foreign_taken below) */
    cJSON_AddNumberToObject(o, "home_shard", w->home_lane);
    /* the longest sequence (prompt + output) it takes: /v1/models' max_model_len */
    cJSON_AddNumberToObject(o, "max_model_len", st.max_context);
    /* counters since start, for redlm stats/top: totals and hit rates */
    pthread_mutex_lock(&w->m.mu);
    cJSON_AddNumberToObject(o, "jobs_done", (double)w->m.jobs_done);
    cJSON_AddNumberToObject(o, "tokens_out", (double)w->m.tokens_out);
    cJSON_AddNumberToObject(o, "cache_hits", (double)w->m.cache_hits);
    cJSON_AddNumberToObject(o, "cache_misses", (double)w->m.cache_misses);
    cJSON_AddNumberToObject(o, "prefix_hit_tokens", (double)w->m.prefix_hit_tokens);
    cJSON_AddNumberToObject(o, "prefix_miss_tokens", (double)w->m.prefix_miss_tokens);
    cJSON_AddNumberToObject(o, "reclaimed", (double)w->m.reclaimed);
    cJSON_AddNumberToObject(o, "fenced", (double)w->m.fenced);
    cJSON_AddNumberToObject(o, "affinity_taken", (double)w->m.affinity_taken);
    cJSON_AddNumberToObject(o, "handed_off", (double)w->m.handed_off);
    cJSON_AddNumberToObject(o, "foreign_taken", (double)w->m.foreign_taken);
    cJSON_AddNumberToObject(o, "foreign_looks", (double)w->m.foreign_looks);
    cJSON_AddNumberToObject(o, "foreign_looks_drained", (double)w->m.foreign_looks_drained);
    /* memory pressure: Redis refuses this very SET while it lasts, so the
     * first heartbeat after it says it happened (the dispatcher and redlm
     * top see redis_oom_total grow); /healthz and /metrics say it now */
    cJSON_AddBoolToObject(o, "redis_oom", w->m.redis_oom);
    cJSON_AddNumberToObject(o, "redis_oom_total", (double)w->m.redis_oom_total);
    cJSON_AddNumberToObject(o, "jobs_given_up", (double)w->m.jobs_given_up);
    cJSON_AddBoolToObject(o, "reclaiming", w->m.reclaiming);
    hb_hist(o, "ttft", &w->m.ttft, vb_ttft, VB_N_TTFT);
    hb_hist(o, "e2e", &w->m.e2e, vb_e2e, VB_N_E2E);
    /* vllm:time_per_output_token_seconds is, as in vLLM v1, one observation
     * per gap between two tokens of a job (inter_token, loop.c), not one
     * per job; the lengths are one per finished job */
    hb_hist(o, "tpot", &w->m.inter_token, vb_tpot, VB_N_TPOT);
    hb_hist(o, "prompt_len", &w->m.prompt_len, vb_len, VB_N_LEN);
    hb_hist(o, "gen_len", &w->m.gen_len, vb_len, VB_N_LEN);
    /* queue, prefill and decode times, one each per finished job, so that
     * they count the same jobs as e2e and their sums add up to about its sum */
    hb_hist(o, "queue_time", &w->m.v_queue, vb_e2e, VB_N_E2E);
    hb_hist(o, "prefill_time", &w->m.v_prefill, vb_e2e, VB_N_E2E);
    hb_hist(o, "decode_time", &w->m.v_decode, vb_e2e, VB_N_E2E);
    bool draining = w->m.draining;
    pthread_mutex_unlock(&w->m.mu);
    /* prefix-affine pulling (issue 27): the filter of the block hashes our
     * KV cache holds (loop.c keeps it fresh) and where offers go; a
     * draining worker takes no offers */
    if (w->affinity && w->aff_bits && !draining) {
        cJSON *a = cJSON_AddObjectToObject(o, "affinity");
        char *b = b64_encode(w->aff_bits, w->aff_bytes);
        cJSON *offer = a ? cJSON_AddArrayToObject(a, "offer") : NULL;
        if (a && b && offer) {
            cJSON_AddNumberToObject(a, "block_size", st.block_size);
            cJSON_AddNumberToObject(a, "k", AFF_K);
            cJSON_AddNumberToObject(a, "step_ms", (double)(int64_t)(w->step_ms + 0.5));
            cJSON_AddStringToObject(a, "filter", b);
            for (int p = w->n_base_pools; p < w->n_pools; p++)
                cJSON_AddItemToArray(offer, cJSON_CreateString(w->pool_keys[p]));
        }
        free(b);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
