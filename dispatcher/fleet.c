/* dispatcher/fleet.c - the fleet's figures from the workers' heartbeats
 * (fleet.h). */
#include "fleet.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rconn.h"
#include "vbuckets.h"

/* The counters a worker reports as totals since its start: the prefix
 * cache's, preemptions, and its eight histograms: TTFT, e2e, time per
 * output token, prompt and generation lengths, queue, prefill and decode
 * times (cumulative counts at vLLM's
 * bounds, the count, the sum in millionths). */
enum {
    C_QUERIES,
    C_HITS,
    C_PREEMPT,
    C_TTFT,                       /* VB_N_TTFT buckets */
    C_TTFT_N = C_TTFT + VB_N_TTFT,
    C_TTFT_US,
    C_E2E,                        /* VB_N_E2E buckets */
    C_E2E_N = C_E2E + VB_N_E2E,
    C_E2E_US,
    C_TPOT,                       /* VB_N_TPOT buckets */
    C_TPOT_N = C_TPOT + VB_N_TPOT,
    C_TPOT_US,
    C_PLEN,                       /* VB_N_LEN buckets; the sum in millionths of a token */
    C_PLEN_N = C_PLEN + VB_N_LEN,
    C_PLEN_US,
    C_GLEN,                       /* VB_N_LEN buckets */
    C_GLEN_N = C_GLEN + VB_N_LEN,
    C_GLEN_US,
    C_QT,                         /* VB_N_E2E buckets: queue, prefill, decode times */
    C_QT_N = C_QT + VB_N_E2E,
    C_QT_US,
    C_PT,
    C_PT_N = C_PT + VB_N_E2E,
    C_PT_US,
    C_DT,
    C_DT_N = C_DT + VB_N_E2E,
    C_DT_US,
    N_COUNTERS
};

struct fworker {
    char name[RCONN_NAME_MAX];
    char model[JOB_MODEL_MAX + 1];
    int64_t running, waiting, kv_blocks, kv_used;
    int64_t c[N_COUNTERS];
    bool hist; /* its heartbeat carries the histograms (a newer worker) */
    bool seen; /* in this reading */
    bool live; /* seen in the last reading; a gone one keeps its counters
                  (a heartbeat that expired and came back counts on) */
};

/* What workers of a model that left or restarted had counted. */
struct fretired {
    char model[JOB_MODEL_MAX + 1];
    int64_t c[N_COUNTERS];
    bool hist; /* some of them reported histograms */
};

struct fleet {
    struct fworker *w; /* FLEET_WORKERS of them */
    int n_w;
    struct fretired r[VM_MODELS];
    int n_r;
    pthread_mutex_t mu; /* guards rows and n_rows, the HTTP threads' copy */
    struct vm_fleet rows[VM_MODELS];
    int n_rows;
};

struct fleet *fleet_create(void)
{
    struct fleet *f = calloc(1, sizeof *f);
    if (!f || !(f->w = calloc(FLEET_WORKERS, sizeof *f->w))) {
        free(f);
        return NULL;
    }
    pthread_mutex_init(&f->mu, NULL);
    return f;
}

void fleet_free(struct fleet *f)
{
    if (!f)
        return;
    pthread_mutex_destroy(&f->mu);
    free(f->w);
    free(f);
}

void fleet_begin(struct fleet *f)
{
    for (int i = 0; i < f->n_w; i++)
        f->w[i].seen = false;
}

/* A non-negative integer field of the heartbeat; 0 when absent or odd. */
static int64_t num(const cJSON *hb, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(hb, key);
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 1e15
               ? (int64_t)v->valuedouble : 0;
}

/* Counter c's total of a worker that stopped counting from it (it left,
 * restarted, or serves another model now) goes to its model's sums. At
 * most VM_MODELS models keep theirs; past that they are dropped. */
static void retire(struct fleet *f, const char *model, int c, int64_t v)
{
    /* C_TTFT_N comes only from a worker that reported histograms (retire_all)
     * and marks the model's retired sums as holding them, even at 0 */
    if (v <= 0 && c != C_TTFT_N)
        return;
    int i = 0;
    while (i < f->n_r && strcmp(f->r[i].model, model))
        i++;
    if (i == f->n_r) {
        if (f->n_r == VM_MODELS)
            return;
        memset(&f->r[i], 0, sizeof f->r[i]);
        snprintf(f->r[i].model, sizeof f->r[i].model, "%s", model);
        f->n_r++;
    }
    f->r[i].c[c] += v;
    if (c == C_TTFT_N)
        f->r[i].hist = true;
}

/* A worker's totals go to its model's retired sums (it left, restarted,
 * or serves another model now). */
static void retire_all(struct fleet *f, struct fworker *w)
{
    for (int c = 0; c < N_COUNTERS; c++)
        if (c != C_TTFT_N || w->hist)
            retire(f, w->model, c, w->c[c]);
    memset(w->c, 0, sizeof w->c);
}

/* A histogram of the heartbeat (key_buckets: n cumulative counts at vLLM's
 * bounds, key_sum seconds, key_count) into c[0..n-1], c[n] (count) and
 * c[n+1] (sum, us). Returns false, c zeroed, when absent or inconsistent
 * (an older worker, or a bad heartbeat: counted as none). */
static bool hist_of(const cJSON *hb, const char *key, int n, int64_t *c)
{
    char k[32];
    memset(c, 0, sizeof c[0] * (size_t)(n + 2));
    snprintf(k, sizeof k, "%s_buckets", key);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(hb, k);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return false;
    snprintf(k, sizeof k, "%s_count", key);
    const cJSON *cnt = cJSON_GetObjectItemCaseSensitive(hb, k);
    snprintf(k, sizeof k, "%s_sum", key);
    const cJSON *sum = cJSON_GetObjectItemCaseSensitive(hb, k);
    if (!cJSON_IsNumber(cnt) || !cJSON_IsNumber(sum) || cnt->valuedouble < 0 ||
        cnt->valuedouble >= 1e15 || !(sum->valuedouble >= 0) || sum->valuedouble >= 1e9)
        goto bad;
    c[n] = (int64_t)cnt->valuedouble;
    c[n + 1] = (int64_t)(sum->valuedouble * 1e6 + 0.5);
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, a) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= 1e15)
            goto bad;
        c[i] = (int64_t)v->valuedouble;
        if ((i > 0 && c[i] < c[i - 1]) || c[i] > c[n]) /* cumulative, at most the count */
            goto bad;
        i++;
    }
    return true;
bad:
    memset(c, 0, sizeof c[0] * (size_t)(n + 2));
    return false;
}

int fleet_observe(struct fleet *f, const char *worker, const char *model, const cJSON *hb)
{
    if (strlen(model) > JOB_MODEL_MAX)
        model = "";
    int i = 0;
    while (i < f->n_w && strcmp(f->w[i].name, worker))
        i++;
    if (i == f->n_w && f->n_w == FLEET_WORKERS) {
        /* full: the slot of a worker gone before this reading (its
         * counters kept in the sums) */
        for (i = 0; i < f->n_w && (f->w[i].live || f->w[i].seen); i++)
            ;
        if (i == f->n_w)
            return -1;
        retire_all(f, &f->w[i]);
        f->w[i].name[0] = 0;
    }
    if (i == f->n_w || !f->w[i].name[0]) {
        if (i == f->n_w)
            f->n_w++;
        memset(&f->w[i], 0, sizeof f->w[i]);
        snprintf(f->w[i].name, sizeof f->w[i].name, "%s", worker);
        snprintf(f->w[i].model, sizeof f->w[i].model, "%s", model);
    }
    struct fworker *w = &f->w[i];
    if (strcmp(w->model, model)) { /* reloaded with another model */
        retire_all(f, w);
        snprintf(w->model, sizeof w->model, "%s", model);
    }
    int64_t now[N_COUNTERS];
    int64_t hit = num(hb, "prefix_hit_tokens");
    now[C_HITS] = hit;
    now[C_QUERIES] = hit + num(hb, "prefix_miss_tokens");
    now[C_PREEMPT] = num(hb, "preemptions");
    bool hist = hist_of(hb, "ttft", VB_N_TTFT, &now[C_TTFT]);
    hist = hist_of(hb, "e2e", VB_N_E2E, &now[C_E2E]) && hist;
    hist = hist_of(hb, "tpot", VB_N_TPOT, &now[C_TPOT]) && hist;
    hist = hist_of(hb, "prompt_len", VB_N_LEN, &now[C_PLEN]) && hist;
    hist = hist_of(hb, "gen_len", VB_N_LEN, &now[C_GLEN]) && hist;
    hist = hist_of(hb, "queue_time", VB_N_E2E, &now[C_QT]) && hist;
    hist = hist_of(hb, "prefill_time", VB_N_E2E, &now[C_PT]) && hist;
    hist = hist_of(hb, "decode_time", VB_N_E2E, &now[C_DT]) && hist;
    /* all or none: a row's histograms count the same jobs (a worker from
     * before tpot/prompt_len/gen_len or queue/prefill/decode_time counts as
     * reporting none) */
    if (!hist)
        memset(&now[C_TTFT], 0, sizeof now[0] * (size_t)(N_COUNTERS - C_TTFT));
    /* any total that fell: it restarted, and what it had counted stays
     * counted, all of it (a histogram's buckets must stay consistent) */
    bool fell = false;
    for (int c = 0; c < N_COUNTERS; c++)
        fell = fell || now[c] < w->c[c];
    if (fell)
        retire_all(f, w);
    memcpy(w->c, now, sizeof now);
    w->hist = hist;
    w->running = num(hb, "running");
    w->waiting = num(hb, "waiting");
    w->kv_blocks = num(hb, "kv_blocks");
    w->kv_used = num(hb, "kv_used");
    w->seen = true;
    return 0;
}

/* rows' entry for model, added when new; NULL when VM_MODELS are there. */
static struct vm_fleet *row_of(struct vm_fleet *rows, int *n, const char *model)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp(rows[i].model, model))
            return &rows[i];
    if (*n == VM_MODELS)
        return NULL;
    struct vm_fleet *r = &rows[(*n)++];
    memset(r, 0, sizeof *r);
    snprintf(r->model, sizeof r->model, "%s", model);
    return r;
}

/* Adds a worker's (or the retired) histogram totals to a row. */
static void add_hist(struct vm_fleet *r, const int64_t *c, bool hist)
{
    r->hist = r->hist || hist;
    for (int i = 0; i < VB_N_TTFT; i++)
        r->ttft[i] += c[C_TTFT + i];
    r->ttft_n += c[C_TTFT_N];
    r->ttft_sum += (double)c[C_TTFT_US] / 1e6;
    for (int i = 0; i < VB_N_E2E; i++)
        r->e2e[i] += c[C_E2E + i];
    r->e2e_n += c[C_E2E_N];
    r->e2e_sum += (double)c[C_E2E_US] / 1e6;
    for (int i = 0; i < VB_N_TPOT; i++)
        r->tpot[i] += c[C_TPOT + i];
    r->tpot_n += c[C_TPOT_N];
    r->tpot_sum += (double)c[C_TPOT_US] / 1e6;
    for (int i = 0; i < VB_N_LEN; i++) {
        r->plen[i] += c[C_PLEN + i];
        r->glen[i] += c[C_GLEN + i];
    }
    r->plen_n += c[C_PLEN_N];
    r->plen_sum += (double)c[C_PLEN_US] / 1e6;
    r->glen_n += c[C_GLEN_N];
    r->glen_sum += (double)c[C_GLEN_US] / 1e6;
    for (int i = 0; i < VB_N_E2E; i++) {
        r->qt[i] += c[C_QT + i];
        r->pt[i] += c[C_PT + i];
        r->dt[i] += c[C_DT + i];
    }
    r->qt_n += c[C_QT_N];
    r->qt_sum += (double)c[C_QT_US] / 1e6;
    r->pt_n += c[C_PT_N];
    r->pt_sum += (double)c[C_PT_US] / 1e6;
    r->dt_n += c[C_DT_N];
    r->dt_sum += (double)c[C_DT_US] / 1e6;
}

void fleet_end(struct fleet *f)
{
    struct vm_fleet rows[VM_MODELS];
    int n = 0;
    for (int i = 0; i < f->n_w; i++) {
        struct fworker *w = &f->w[i];
        w->live = w->seen;
        struct vm_fleet *r = row_of(rows, &n, w->model);
        if (!r)
            continue;
        if (w->live) { /* a gone worker's gauges no longer hold */
            r->n_workers++;
            r->running += w->running;
            r->waiting += w->waiting;
            r->kv_blocks += w->kv_blocks;
            r->kv_used += w->kv_used;
        }
        r->prefix_queries += w->c[C_QUERIES];
        r->prefix_hits += w->c[C_HITS];
        r->preemptions += w->c[C_PREEMPT];
        add_hist(r, w->c, w->hist);
    }
    for (int i = 0; i < f->n_r; i++) {
        struct vm_fleet *r = row_of(rows, &n, f->r[i].model);
        if (!r)
            continue;
        r->prefix_queries += f->r[i].c[C_QUERIES];
        r->prefix_hits += f->r[i].c[C_HITS];
        r->preemptions += f->r[i].c[C_PREEMPT];
        add_hist(r, f->r[i].c, f->r[i].hist);
    }
    pthread_mutex_lock(&f->mu);
    memcpy(f->rows, rows, sizeof rows[0] * (size_t)n);
    f->n_rows = n;
    pthread_mutex_unlock(&f->mu);
}

int fleet_rows(struct fleet *f, struct vm_fleet *rows, int max)
{
    if (!f || max <= 0)
        return 0;
    pthread_mutex_lock(&f->mu);
    int n = f->n_rows < max ? f->n_rows : max;
    memcpy(rows, f->rows, sizeof rows[0] * (size_t)n);
    pthread_mutex_unlock(&f->mu);
    return n;
}
