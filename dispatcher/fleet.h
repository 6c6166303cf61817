/* dispatcher/fleet.h - the fleet's figures for the front door's /metrics,
 * summed per served model over the live workers' heartbeats
 * (<prefix>worker:<name>: running, waiting, kv_blocks, kv_used,
 * prefix_hit_tokens, prefix_miss_tokens, preemptions, and the latency
 * histograms ttft_, e2e_, tpot_, prompt_len_, gen_len_, queue_time_,
 * prefill_time_, decode_time_ buckets/count/sum
 * at vLLM's bounds, common/vbuckets.h).
 *
 * models.c reads every live heartbeat once per heartbeat interval; it
 * calls fleet_begin, fleet_observe for each, then fleet_end, which makes
 * the rows the HTTP threads read with fleet_rows. Gauges are the live
 * workers' sums. Counters never go down, as Prometheus wants: a worker
 * that leaves (its heartbeat expired) keeps its last totals in the sums,
 * and counts on from them if it comes back under the same name; one that
 * restarts (any counter went down: all of them, so a histogram's buckets
 * stay consistent) leaves its old totals in its model's
 * retired sums. Gone workers are remembered until FLEET_WORKERS names
 * are known; then a new one takes a gone one's place, whose totals move
 * to the retired sums.
 *
 * fleet_begin/observe/end: one thread (the dispatcher's main loop);
 * fleet_rows: any thread (one mutex, held for a copy). */
#ifndef RL_FLEET_H
#define RL_FLEET_H

#include <cjson/cJSON.h>

#include "vmetrics.h"

#define FLEET_WORKERS 1024 /* workers told apart; more are left out (logged by the caller) */

struct fleet;

/* Returns NULL when out of memory. */
struct fleet *fleet_create(void);
void fleet_free(struct fleet *f);

/* Starts one reading of the heartbeats. */
void fleet_begin(struct fleet *f);

/* One live worker's heartbeat (hb, borrowed), named worker, counted under
 * the model_name label model (the caller's choice: the name clients ask
 * for). A heartbeat without the numbers (an older worker) counts as
 * zeros. Returns 0, or -1 when FLEET_WORKERS workers are live already
 * (this one left out). */
int fleet_observe(struct fleet *f, const char *worker, const char *model, const cJSON *hb);

/* Ends the reading: workers not observed since fleet_begin are gone (their
 * gauges drop out, their counters stay); the rows are remade. */
void fleet_end(struct fleet *f);

/* Copies up to max rows (one per served model, VM_MODELS at most) into
 * rows; returns how many. Thread-safe. */
int fleet_rows(struct fleet *f, struct vm_fleet *rows, int max);

#endif
