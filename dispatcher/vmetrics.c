/* dispatcher/vmetrics.c - vLLM-named request metrics (vmetrics.h).
 * Buckets are vLLM's own (vllm/v1/metrics/loggers.py), so the quantiles a
 * dashboard computes mean the same thing. */
#include "vmetrics.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job.h"
#include "vbuckets.h"

/* vLLM's bounds, shared with the workers' heartbeats (common/vbuckets.h) */
#define ttft_b vb_ttft
#define e2e_b vb_e2e
#define N_TTFT ((size_t)VB_N_TTFT)
#define N_E2E ((size_t)VB_N_E2E)
#define N_TPOT ((size_t)VB_N_TPOT)
#define N_LEN ((size_t)VB_N_LEN)

enum { F_STOP, F_LENGTH, F_ABORT, N_FINISH };
static const char *const finish_names[N_FINISH] = {"stop", "length", "abort"};

struct hist {
    int64_t n;
    double sum;
};

struct vm_model {
    char name[JOB_MODEL_MAX + 1];
    int64_t running, waiting;
    int64_t ttft[N_TTFT + 1], e2e[N_E2E + 1]; /* per bucket; the last: +Inf */
    struct hist ttft_h, e2e_h;
    /* tpot: never observed here (the front door sees no token gaps), so
     * its fallback is an empty histogram; lengths: per ended request */
    int64_t tpot[N_TPOT + 1], plen[N_LEN + 1], glen[N_LEN + 1];
    struct hist tpot_h, plen_h, glen_h;
    /* queue/prefill/decode times: the front door sees no admission, so
     * these are never observed here (empty fallback, as tpot) */
    int64_t qt[N_E2E + 1];
    struct hist qt_h;
    int64_t prompt, generation, success[N_FINISH];
};

struct vmetrics {
    pthread_mutex_t mu;
    int n;
    struct vm_model m[VM_MODELS + 1]; /* the last: "other" */
};

struct vmetrics *vm_create(void)
{
    struct vmetrics *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    pthread_mutex_init(&m->mu, NULL);
    snprintf(m->m[VM_MODELS].name, sizeof m->m[VM_MODELS].name, "other");
    return m;
}

void vm_free(struct vmetrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* The model's record (mu held). */
static struct vm_model *model_of(struct vmetrics *m, const char *name)
{
    name = name ? name : "";
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->m[i].name, name))
            return &m->m[i];
    if (m->n == VM_MODELS || strlen(name) > JOB_MODEL_MAX)
        return &m->m[VM_MODELS];
    struct vm_model *x = &m->m[m->n++];
    snprintf(x->name, sizeof x->name, "%s", name);
    return x;
}

void vm_move(struct vmetrics *m, const char *model, enum vm_state from, enum vm_state to)
{
    if (!m || from == to)
        return;
    pthread_mutex_lock(&m->mu);
    struct vm_model *x = model_of(m, model);
    if (from == VM_WAITING)
        x->waiting--;
    else if (from == VM_RUNNING)
        x->running--;
    if (to == VM_WAITING)
        x->waiting++;
    else if (to == VM_RUNNING)
        x->running++;
    pthread_mutex_unlock(&m->mu);
}

static void observe(int64_t *buckets, const double *bounds, size_t n, struct hist *h, double v)
{
    size_t i = 0;
    while (i < n && v > bounds[i])
        i++;
    buckets[i]++;
    h->n++;
    h->sum += v;
}

void vm_first_token(struct vmetrics *m, const char *model, double s)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    struct vm_model *x = model_of(m, model);
    observe(x->ttft, ttft_b, N_TTFT, &x->ttft_h, s);
    pthread_mutex_unlock(&m->mu);
}

void vm_done(struct vmetrics *m, const char *model, double e2e_s, int64_t prompt_tokens,
             int64_t generation_tokens, const char *finish_reason)
{
    if (!m)
        return;
    int f = finish_reason && !strcmp(finish_reason, "stop")     ? F_STOP
            : finish_reason && !strcmp(finish_reason, "length") ? F_LENGTH
                                                                : F_ABORT;
    pthread_mutex_lock(&m->mu);
    struct vm_model *x = model_of(m, model);
    observe(x->e2e, e2e_b, N_E2E, &x->e2e_h, e2e_s);
    x->prompt += prompt_tokens > 0 ? prompt_tokens : 0;
    x->generation += generation_tokens > 0 ? generation_tokens : 0;
    observe(x->plen, vb_len, N_LEN, &x->plen_h, (double)(prompt_tokens > 0 ? prompt_tokens : 0));
    observe(x->glen, vb_len, N_LEN, &x->glen_h,
            (double)(generation_tokens > 0 ? generation_tokens : 0));
    x->success[f]++;
    pthread_mutex_unlock(&m->mu);
}

/* A label value as Prometheus text wants it: \ " and newline escaped. */
static void label(const char *s, char out[2 * JOB_MODEL_MAX + 8])
{
    size_t n = 0;
    for (; *s && n < 2 * JOB_MODEL_MAX; s++) {
        if (*s == '\\' || *s == '"')
            out[n++] = '\\';
        out[n++] = *s == '\n' ? 'n' : *s;
    }
    out[n] = 0;
}

static void put_hist(struct text *b, const char *name, const char *lab, const int64_t *bk,
                     const double *bounds, size_t n, const struct hist *h)
{
    int64_t cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += bk[i];
        text_printf(b, "%s_bucket{le=\"%g\",model_name=\"%s\"} %lld\n", name, bounds[i], lab,
                    (long long)cum);
    }
    text_printf(b,
                "%s_bucket{le=\"+Inf\",model_name=\"%s\"} %lld\n%s_sum{model_name=\"%s\"} %.6f\n"
                "%s_count{model_name=\"%s\"} %lld\n",
                name, lab, (long long)h->n, name, lab, h->sum, name, lab, (long long)h->n);
}

/* The same from cumulative counts (the fleet's sums). */
static void put_cum(struct text *b, const char *name, const char *lab, const int64_t *cum,
                    const double *bounds, size_t n, int64_t count, double sum)
{
    for (size_t i = 0; i < n; i++)
        text_printf(b, "%s_bucket{le=\"%g\",model_name=\"%s\"} %lld\n", name, bounds[i], lab,
                    (long long)cum[i]);
    text_printf(b,
                "%s_bucket{le=\"+Inf\",model_name=\"%s\"} %lld\n%s_sum{model_name=\"%s\"} %.6f\n"
                "%s_count{model_name=\"%s\"} %lld\n",
                name, lab, (long long)count, name, lab, sum, name, lab, (long long)count);
}

/* A page row: the front door's record of a model merged with the fleet's. */
struct row {
    struct vm_model v;
    const struct vm_fleet *f; /* NULL: no live worker announces it */
};

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* The families of one value a model, in the page's order. */
enum { G_RUNNING, G_WAITING, G_KV, G_PREFIX_QUERIES, G_PREFIX_HITS, G_PREEMPTIONS, G_PROMPT,
       G_GENERATION };
static const struct gauge {
    const char *name, *type, *help;
} gauges[] = {
    [G_RUNNING] = {"vllm:num_requests_running", "gauge",
                   "Requests running: the larger of the front door's count (first token came, "
                   "not ended) and the fleet's (sequences running in the workers' engines)."},
    [G_WAITING] = {"vllm:num_requests_waiting", "gauge",
                   "Requests waiting: the larger of the front door's count (queued, no token yet) "
                   "and the fleet's (sequences waiting in the workers' engines)."},
    [G_KV] = {"vllm:kv_cache_usage_perc", "gauge",
              "KV cache usage of the live workers: blocks referenced by a sequence over the "
              "blocks of their pools (1 = full)."},
    [G_PREFIX_QUERIES] = {"vllm:prefix_cache_queries_total", "counter",
                          "Prompt tokens the workers looked up in their prefix caches."},
    [G_PREFIX_HITS] = {"vllm:prefix_cache_hits_total", "counter",
                       "Of those, tokens found in the prefix cache."},
    [G_PREEMPTIONS] = {"vllm:num_preemptions_total", "counter",
                       "Sequences the workers' schedulers preempted to free KV blocks."},
    [G_PROMPT] = {"vllm:prompt_tokens_total", "counter", "Prompt tokens of ended requests."},
    [G_GENERATION] = {"vllm:generation_tokens_total", "counter",
                      "Generated tokens of ended requests."},
};

static int64_t gauge_value(const struct row *r, size_t k)
{
    const struct vm_fleet *f = r->f;
    switch (k) {
    case G_RUNNING: return max64(r->v.running, f ? f->running : 0);
    case G_WAITING: return max64(r->v.waiting, f ? f->waiting : 0);
    case G_PREFIX_QUERIES: return f ? f->prefix_queries : 0;
    case G_PREFIX_HITS: return f ? f->prefix_hits : 0;
    case G_PREEMPTIONS: return f ? f->preemptions : 0;
    case G_PROMPT: return r->v.prompt;
    case G_GENERATION: return r->v.generation;
    }
    return 0;
}

static double kv_usage(const struct vm_fleet *f)
{
    return f && f->kv_blocks > 0 ? (double)f->kv_used / (double)f->kv_blocks : 0.0;
}

/* A histogram family: the workers' sums where a worker of the model
 * reports them (vm_fleet.hist), else the front door's own, which is empty
 * for what the front door never sees (token gaps, admission). Its fields
 * by offset: in vm_fleet the cumulative counts, count and sum; in
 * vm_model the per-bucket counts and the struct hist. */
static const struct hist_family {
    const char *name, *help;
    const double *bounds;
    size_t n;
    size_t f_cum, f_n, f_sum, v_bk, v_h;
} hists[] = {
#define FLEET_OF(x) offsetof(struct vm_fleet, x), offsetof(struct vm_fleet, x##_n), \
                    offsetof(struct vm_fleet, x##_sum)
#define OWN_OF(x) offsetof(struct vm_model, x), offsetof(struct vm_model, x##_h)
#define SUMS_OR_OURS "(the workers' sums, or the front door's where no worker reports them)."
#define SUMS_ONLY "(the workers' sums; empty where no worker reports them)."
    {"vllm:time_to_first_token_seconds",
     "Seconds from a request's queueing to its first event " SUMS_OR_OURS, ttft_b, N_TTFT,
     FLEET_OF(ttft), OWN_OF(ttft)},
    {"vllm:e2e_request_latency_seconds",
     "Seconds from a request's queueing to its end " SUMS_OR_OURS, e2e_b, N_E2E, FLEET_OF(e2e),
     OWN_OF(e2e)},
    {"vllm:time_per_output_token_seconds",
     "Seconds between two successive tokens of a request, one observation per gap " SUMS_ONLY,
     vb_tpot, N_TPOT, FLEET_OF(tpot), OWN_OF(tpot)},
    {"vllm:request_prompt_tokens", "Prompt tokens per ended request " SUMS_OR_OURS, vb_len,
     N_LEN, FLEET_OF(plen), OWN_OF(plen)},
    {"vllm:request_generation_tokens", "Generated tokens per ended request " SUMS_OR_OURS,
     vb_len, N_LEN, FLEET_OF(glen), OWN_OF(glen)},
    {"vllm:request_queue_time_seconds",
     "Seconds from the job's XADD to its admission into the engine, one per finished job "
     SUMS_ONLY, e2e_b, N_E2E, FLEET_OF(qt), OWN_OF(qt)},
    {"vllm:request_prefill_time_seconds",
     "Seconds from admission to the first token, one per finished job " SUMS_ONLY, e2e_b, N_E2E,
     FLEET_OF(pt), OWN_OF(qt)},
    {"vllm:request_decode_time_seconds",
     "Seconds from the first token to the job's end, one per finished job " SUMS_ONLY, e2e_b,
     N_E2E, FLEET_OF(dt), OWN_OF(qt)},
#undef FLEET_OF
#undef OWN_OF
#undef SUMS_OR_OURS
#undef SUMS_ONLY
};

static void put_family(struct text *b, const struct hist_family *h, const struct row *rows,
                       int n)
{
    char lab[2 * JOB_MODEL_MAX + 8];
    text_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", h->name, h->help, h->name);
    for (int i = 0; i < n; i++) {
        /* the fields by offset from their struct (offsetof's own use) */
        const char *f = (const char *)rows[i].f, *v = (const char *)&rows[i].v;
        label(rows[i].v.name, lab);
        if (f && rows[i].f->hist) {
            int64_t count;
            double sum;
            memcpy(&count, f + h->f_n, sizeof count);
            memcpy(&sum, f + h->f_sum, sizeof sum);
            put_cum(b, h->name, lab, (const int64_t *)(const void *)(f + h->f_cum), h->bounds,
                    h->n, count, sum);
        } else {
            put_hist(b, h->name, lab, (const int64_t *)(const void *)(v + h->v_bk), h->bounds,
                     h->n, (const struct hist *)(const void *)(v + h->v_h));
        }
    }
}

void vm_render(struct vmetrics *m, const struct vm_fleet *fleet, int n_fleet, struct text *b)
{
    if (!m)
        return;
    if (n_fleet < 0 || !fleet)
        n_fleet = 0;
    struct row *rows = calloc((size_t)(VM_MODELS + 1 + n_fleet), sizeof *rows);
    if (!rows)
        return;
    pthread_mutex_lock(&m->mu);
    int n = m->n;
    for (int i = 0; i < n; i++)
        rows[i].v = m->m[i];
    struct vm_model other = m->m[VM_MODELS];
    pthread_mutex_unlock(&m->mu);
    /* "other" only once it counted something */
    if (other.ttft_h.n || other.e2e_h.n || other.running || other.waiting)
        rows[n++].v = other;
    /* the fleet's models: beside the front door's record of the same name,
     * or a row of their own (jobs that never came through the front door) */
    for (int k = 0; k < n_fleet; k++) {
        int i = 0;
        while (i < n && strcmp(rows[i].v.name, fleet[k].model))
            i++;
        if (i == n)
            snprintf(rows[n++].v.name, sizeof rows[i].v.name, "%s", fleet[k].model);
        rows[i].f = &fleet[k];
    }
    int total = n;
    char lab[2 * JOB_MODEL_MAX + 8];
    for (size_t k = 0; k < sizeof gauges / sizeof gauges[0]; k++) {
        if (k == G_PROMPT) /* the histograms, before the token counters */
            for (size_t h = 0; h < sizeof hists / sizeof hists[0]; h++)
                put_family(b, &hists[h], rows, total);
        const struct gauge *g = &gauges[k];
        text_printf(b, "# HELP %s %s\n# TYPE %s %s\n", g->name, g->help, g->name, g->type);
        for (int i = 0; i < total; i++) {
            label(rows[i].v.name, lab);
            if (k == G_KV)
                text_printf(b, "%s{model_name=\"%s\"} %.6f\n", g->name, lab, kv_usage(rows[i].f));
            else
                text_printf(b, "%s{model_name=\"%s\"} %lld\n", g->name, lab,
                            (long long)gauge_value(&rows[i], k));
        }
    }
    text_printf(b, "# HELP vllm:request_success_total Ended requests by finish reason (abort: "
                   "cancelled, past its deadline, or failed).\n"
                   "# TYPE vllm:request_success_total counter\n");
    for (int i = 0; i < total; i++) {
        label(rows[i].v.name, lab);
        for (int f = 0; f < N_FINISH; f++)
            text_printf(
                b, "vllm:request_success_total{finished_reason=\"%s\",model_name=\"%s\"} %lld\n",
                finish_names[f], lab, (long long)rows[i].v.success[f]);
    }
    free(rows);
}
