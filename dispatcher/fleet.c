/* dispatcher/fleet.c - the fleet's figures from the workers' heartbeats
 * (fleet.h). */
#include "fleet.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rconn.h"

/* The counters a worker reports as totals since its start. */
enum { C_QUERIES, C_HITS, C_PREEMPT, N_COUNTERS };

struct fworker {
    char name[RCONN_NAME_MAX];
    char model[JOB_MODEL_MAX + 1];
    int64_t running, waiting, kv_blocks, kv_used;
    int64_t c[N_COUNTERS];
    bool seen; /* in this reading */
    bool live; /* seen in the last reading; a gone one keeps its counters
                  (a heartbeat that expired and came back counts on) */
};

/* What workers of a model that left or restarted had counted. */
struct fretired {
    char model[JOB_MODEL_MAX + 1];
    int64_t c[N_COUNTERS];
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
    if (v <= 0)
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
        for (int c = 0; c < N_COUNTERS; c++)
            retire(f, f->w[i].model, c, f->w[i].c[c]);
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
        for (int c = 0; c < N_COUNTERS; c++) {
            retire(f, w->model, c, w->c[c]);
            w->c[c] = 0;
        }
        snprintf(w->model, sizeof w->model, "%s", model);
    }
    int64_t now[N_COUNTERS];
    int64_t hit = num(hb, "prefix_hit_tokens");
    now[C_HITS] = hit;
    now[C_QUERIES] = hit + num(hb, "prefix_miss_tokens");
    now[C_PREEMPT] = num(hb, "preemptions");
    for (int c = 0; c < N_COUNTERS; c++) {
        if (now[c] < w->c[c]) /* it restarted: what it had counted stays counted */
            retire(f, w->model, c, w->c[c]);
        w->c[c] = now[c];
    }
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
    }
    for (int i = 0; i < f->n_r; i++) {
        struct vm_fleet *r = row_of(rows, &n, f->r[i].model);
        if (!r)
            continue;
        r->prefix_queries += f->r[i].c[C_QUERIES];
        r->prefix_hits += f->r[i].c[C_HITS];
        r->preemptions += f->r[i].c[C_PREEMPT];
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
