/* engine/cpu/lora_apply.c - see lora_apply.h. */
#include "cpu/lora_apply.h"

#include <stdatomic.h>
#include <stddef.h>

/* Ranks of one phase-A item, columns of one phase-B item: small enough
 * that a decode row's few hundred columns still spread over the threads,
 * big enough that an item outweighs taking it off the counter. */
#define LORA_RANKS_PER_ITEM 8
#define LORA_COLS_PER_ITEM 256

struct lora_job {
    const struct cpu_kernels *k;
    const struct cpu_lora_rows *rows;
    int layer, n_proj;
    const enum lora_proj *projs;
    const float *x;
    int ldx;
    float *const *y;
    const int *ldy;
    float *tmp;
    int per_row; /* items per (group of rows, projection) */
    int n_items;
    _Atomic int next;
};

/* Rows of one item: rows of one sequence, one adapter, in a prefill; the
 * item's slice of A or B^T stays in L1 while they all use it. */
#define LORA_ROWS_PER_ITEM 8

/* An item's group, projection and chunk. */
static void item_at(const struct lora_job *j, int it, int *g, int *p, int *c)
{
    *c = it % j->per_row;
    *p = it / j->per_row % j->n_proj;
    *g = it / j->per_row / j->n_proj;
}

/* t = A x: LORA_RANKS_PER_ITEM entries of one projection for a group of
 * rows an item, as a product (gemm_f32: independent accumulators for the
 * ranks, where a dot per entry waits on its one chain) over each run of
 * consecutive rows of one adapter; a value's bits do not depend on the
 * run it is computed in (kernels.h) */
static void phase_a(void *arg, int ith, int nth)
{
    (void)ith, (void)nth;
    struct lora_job *j = arg;
    int it, g, p, c;
    size_t ld = (size_t)j->n_proj * (size_t)j->rows->max_rank;
    while ((it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n_items) {
        item_at(j, it, &g, &p, &c);
        int i1 = (g + 1) * LORA_ROWS_PER_ITEM < j->rows->n ? (g + 1) * LORA_ROWS_PER_ITEM : j->rows->n;
        for (int i = g * LORA_ROWS_PER_ITEM, n; i < i1; i += n) {
            const struct lora_pair *pr = lora_get(j->rows->a[i], j->layer, j->projs[p]);
            for (n = 1; i + n < i1 && j->rows->a[i + n] == j->rows->a[i] &&
                        j->rows->t[i + n] == j->rows->t[i] + n;)
                n++;
            int k0 = c * LORA_RANKS_PER_ITEM;
            if (!pr || k0 >= pr->rank)
                continue;
            int k1 = k0 + LORA_RANKS_PER_ITEM < pr->rank ? k0 + LORA_RANKS_PER_ITEM : pr->rank;
            j->k->gemm_f32(n, k0, k1, pr->in, j->x + (size_t)j->rows->t[i] * (size_t)j->ldx, j->ldx,
                           pr->a, j->tmp + (size_t)i * ld + (size_t)p * (size_t)j->rows->max_rank,
                           (int)ld);
        }
    }
}

/* y += sum_k t[k] Bt[k] (kernels.h lora_up): LORA_COLS_PER_ITEM columns of one projection for
 * a group of rows an item, k ascending whatever the split */
static void phase_b(void *arg, int ith, int nth)
{
    (void)ith, (void)nth;
    struct lora_job *j = arg;
    int it, g, p, c;
    while ((it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n_items) {
        item_at(j, it, &g, &p, &c);
        int i1 = (g + 1) * LORA_ROWS_PER_ITEM < j->rows->n ? (g + 1) * LORA_ROWS_PER_ITEM : j->rows->n;
        int o0 = c * LORA_COLS_PER_ITEM;
        for (int i = g * LORA_ROWS_PER_ITEM; i < i1; i++) {
            const struct lora_pair *pr = lora_get(j->rows->a[i], j->layer, j->projs[p]);
            if (!pr || o0 >= pr->out)
                continue;
            int o1 = o0 + LORA_COLS_PER_ITEM < pr->out ? o0 + LORA_COLS_PER_ITEM : pr->out;
            const float *t = j->tmp + ((size_t)i * (size_t)j->n_proj + (size_t)p) * (size_t)j->rows->max_rank;
            float *yr = j->y[p] + (size_t)j->rows->t[i] * (size_t)j->ldy[p];
            j->k->lora_up(pr->rank, t, pr->bt + o0, (size_t)pr->out, yr + o0, o1 - o0);
        }
    }
}

/* Below this many multiply-adds a phase runs on the calling thread: a
 * decode row's phase is ~50k of them, a few microseconds, about what
 * waking the pool and meeting at its barrier costs. */
#define LORA_INLINE_MACS 200000

static void run_phase(struct cpu_pool *pool, cpu_pool_fn fn, struct lora_job *j, long macs)
{
    atomic_store_explicit(&j->next, 0, memory_order_relaxed);
    if (j->n_items <= 1 || macs < LORA_INLINE_MACS)
        fn(j, 0, 1);
    else
        cpu_pool_run_dyn(pool, fn, j);
}

void cpu_lora_apply(struct cpu_pool *pool, const struct cpu_kernels *k, const struct cpu_lora_rows *rows,
                    int layer, int n_proj, const enum lora_proj *projs, const float *x, int ldx,
                    float *const *y, const int *ldy, float *tmp)
{
    if (rows->n == 0)
        return;
    int any = 0, max_out = 0;
    long macs_a = 0, macs_b = 0;
    for (int i = 0; i < rows->n; i++)
        for (int p = 0; p < n_proj; p++) {
            const struct lora_pair *pr = lora_get(rows->a[i], layer, projs[p]);
            if (pr) {
                any = 1;
                max_out = pr->out > max_out ? pr->out : max_out;
                macs_a += (long)pr->rank * pr->in;
                macs_b += (long)pr->rank * pr->out;
            }
        }
    if (!any)
        return;
    struct lora_job j = {k, rows, layer, n_proj, projs, x, ldx, y, ldy, tmp, 0, 0, 0};
    int groups = (rows->n + LORA_ROWS_PER_ITEM - 1) / LORA_ROWS_PER_ITEM;
    j.per_row = (rows->max_rank + LORA_RANKS_PER_ITEM - 1) / LORA_RANKS_PER_ITEM;
    j.n_items = groups * n_proj * j.per_row;
    run_phase(pool, phase_a, &j, macs_a);
    j.per_row = (max_out + LORA_COLS_PER_ITEM - 1) / LORA_COLS_PER_ITEM;
    j.n_items = groups * n_proj * j.per_row;
    run_phase(pool, phase_b, &j, macs_b);
}
