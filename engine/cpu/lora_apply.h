/* engine/cpu/lora_apply.h - the CPU backend's LoRA deltas (engine/lora.h).
 *
 * After a base product y = W x over a whole batch, the rows of sequences
 * that run with an adapter get y += Bt^T (A x): first the rank-wide
 * products t = A x (dots over the input), then r axpys of t's entries over
 * Bt's rows (contiguous, the scale folded in at load). Both phases share
 * their work out over the pool in small items; each value is computed in
 * one fixed order that depends only on the row, so a row's result is the
 * same alone or in any batch (kernels.h's batch invariance) and rows
 * without an adapter are never touched.
 *
 * One call serves the projections that read the same input (q, k and v;
 * gate and up), so that they cost one pass of each phase between them. */
#ifndef RL_CPU_LORA_APPLY_H
#define RL_CPU_LORA_APPLY_H

#include <stdint.h>

#include "cpu/kernels.h"
#include "cpu/pool.h"
#include "lora.h"

/* The rows of a step that run with an adapter. */
struct cpu_lora_rows {
    int n;                                 /* rows with an adapter */
    const int32_t *t;                      /* (n) their token rows in the batch */
    const struct lora_adapter *const *a;   /* (n) each row's adapter */
    int max_rank;                          /* of those adapters */
};

/* For p < n_proj: y[p][t * ldy[p] + o] += delta of projection projs[p] of
 * layer for x's row t (x + t * ldx, f32), for every row t of rows. tmp
 * holds rows->n * n_proj * rows->max_rank floats. n_proj <= 3. */
void cpu_lora_apply(struct cpu_pool *pool, const struct cpu_kernels *k, const struct cpu_lora_rows *rows,
                    int layer, int n_proj, const enum lora_proj *projs, const float *x, int ldx,
                    float *const *y, const int *ldy, float *tmp);

#endif
