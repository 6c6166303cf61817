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
    int per_row; /* items per (row, projection) */
    int n_items;
    _Atomic int next;
};

/* t = A x, LORA_RANKS_PER_ITEM entries of one (row, projection) an item */
static void phase_a(void *arg, int ith, int nth)
{
    (void)ith, (void)nth;
    struct lora_job *j = arg;
    int it;
    while ((it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n_items) {
        int c = it % j->per_row, rp = it / j->per_row, p = rp % j->n_proj, i = rp / j->n_proj;
        const struct lora_pair *pr = lora_get(j->rows->a[i], j->layer, j->projs[p]);
        if (!pr)
            continue;
        int k0 = c * LORA_RANKS_PER_ITEM, k1 = k0 + LORA_RANKS_PER_ITEM;
        k1 = k1 < pr->rank ? k1 : pr->rank;
        const float *xr = j->x + (size_t)j->rows->t[i] * (size_t)j->ldx;
        float *t = j->tmp + (size_t)rp * (size_t)j->rows->max_rank;
        for (int k = k0; k < k1; k++)
            t[k] = j->k->dot_f32(pr->a + (size_t)k * (size_t)pr->in, xr, pr->in);
    }
}

/* y += sum_k t[k] Bt[k], LORA_COLS_PER_ITEM columns of one (row,
 * projection) an item, k ascending whatever the split */
static void phase_b(void *arg, int ith, int nth)
{
    (void)ith, (void)nth;
    struct lora_job *j = arg;
    int it;
    while ((it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n_items) {
        int c = it % j->per_row, rp = it / j->per_row, p = rp % j->n_proj, i = rp / j->n_proj;
        const struct lora_pair *pr = lora_get(j->rows->a[i], j->layer, j->projs[p]);
        int o0 = c * LORA_COLS_PER_ITEM;
        if (!pr || o0 >= pr->out)
            continue;
        int o1 = o0 + LORA_COLS_PER_ITEM < pr->out ? o0 + LORA_COLS_PER_ITEM : pr->out;
        const float *t = j->tmp + (size_t)rp * (size_t)j->rows->max_rank;
        float *yr = j->y[p] + (size_t)j->rows->t[i] * (size_t)j->ldy[p];
        for (int k = 0; k < pr->rank; k++)
            j->k->axpy_f32(t[k], pr->bt + (size_t)k * (size_t)pr->out + o0, yr + o0, o1 - o0);
    }
}

static void run_phase(struct cpu_pool *pool, cpu_pool_fn fn, struct lora_job *j)
{
    atomic_store_explicit(&j->next, 0, memory_order_relaxed);
    if (j->n_items <= 1) /* not worth waking the pool */
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
    for (int i = 0; i < rows->n; i++)
        for (int p = 0; p < n_proj; p++) {
            const struct lora_pair *pr = lora_get(rows->a[i], layer, projs[p]);
            if (pr) {
                any = 1;
                max_out = pr->out > max_out ? pr->out : max_out;
            }
        }
    if (!any)
        return;
    struct lora_job j = {k, rows, layer, n_proj, projs, x, ldx, y, ldy, tmp, 0, 0, 0};
    j.per_row = (rows->max_rank + LORA_RANKS_PER_ITEM - 1) / LORA_RANKS_PER_ITEM;
    j.n_items = rows->n * n_proj * j.per_row;
    run_phase(pool, phase_a, &j);
    j.per_row = (max_out + LORA_COLS_PER_ITEM - 1) / LORA_COLS_PER_ITEM;
    j.n_items = rows->n * n_proj * j.per_row;
    run_phase(pool, phase_b, &j);
}
