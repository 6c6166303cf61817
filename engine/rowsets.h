/* engine/rowsets.h - a backend wrapper that hands back logits rows the way
 * the CUDA backend does since issue 25 (be_ops.set_row_wants): greedy rows
 * as their best entry, other reducible rows as their 64 best (engine/
 * sample.h struct sample_cands), whole rows only where asked, constraint
 * masks applied to the rows first - computed on the host from the inner
 * backend's whole rows. It exists so the engine's reduced path (sets,
 * fallback fetches, masks, drafts) is tested on every machine, without a
 * GPU; it is slower than the inner backend, never faster.
 *
 * be_create(..., "cpu-rowsets", ...) makes one around the CPU backend. The
 * rows it does not hand back whole are overwritten with NaN in
 * batch->logits, so a caller that reads them anyway fails loudly. */
#ifndef RL_ROWSETS_H
#define RL_ROWSETS_H

#include "backend.h"

/* Wraps *inner (taking ownership: freeing the wrapper frees it). On
 * failure inner is freed too. */
int rows_backend_wrap(struct backend **out, struct backend *inner, struct rl_err *err);

#endif
