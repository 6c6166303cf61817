/* dispatcher/vmetrics.h - the front door's request metrics under vLLM's
 * names and buckets, so a vLLM Grafana dashboard reads them unchanged:
 *
 *   vllm:num_requests_running{model_name}   gauge: first event seen, not ended
 *   vllm:num_requests_waiting{model_name}   gauge: queued, no event yet
 *   vllm:time_to_first_token_seconds         histogram: XADD -> first event
 *   vllm:e2e_request_latency_seconds         histogram: XADD -> done
 *   vllm:time_per_output_token_seconds       histogram: gap between two tokens
 *                                            (the fleet's only; else empty)
 *   vllm:request_prompt_tokens               histogram: prompt tokens per request
 *   vllm:request_generation_tokens           histogram: generated tokens per request
 *   vllm:request_queue_time_seconds          histogram: XADD -> admission
 *   vllm:request_prefill_time_seconds        histogram: admission -> first token
 *   vllm:request_decode_time_seconds         histogram: first token -> end
 *                                            (these three: the fleet's only; else empty)
 *   vllm:prompt_tokens_total                 counter
 *   vllm:generation_tokens_total             counter
 *   vllm:request_success_total{finished_reason="stop|length|abort"}
 *
 * They count what the front door sees: requests over HTTP (every API),
 * not jobs submitted to Redis directly. Thread-safe (one mutex); no I/O.
 * At most VM_MODELS model names are told apart; more are "other".
 *
 * Beside them, the fleet's figures, summed over the live workers'
 * heartbeats (struct vm_fleet, made by fleet.c), which count every job
 * whichever way it came (HTTP or straight to Redis):
 *
 *   vllm:kv_cache_usage_perc{model_name}      gauge: used / total KV blocks, 0..1
 *   vllm:prefix_cache_queries_total{model_name}  counter: prompt tokens looked up
 *   vllm:prefix_cache_hits_total{model_name}  counter: of those, found cached
 *   vllm:num_preemptions_total{model_name}    counter
 *
 * and the two gauges above are the larger of the front door's count and
 * the fleet's (the engines' running and waiting sequences): the fleet's
 * sees jobs that skipped the front door, the front door's sees requests
 * still queued in Redis streams and is current between heartbeats; taking
 * the larger never counts a request twice. The histograms are the
 * fleet's (the workers' heartbeats, vLLM's buckets) for a model where
 * some worker reports them, else the front door's own (older workers):
 * never both, as an HTTP request is a worker's job too. */
#ifndef RL_VMETRICS_H
#define RL_VMETRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "job.h"
#include "openai.h"
#include "vbuckets.h"

#define VM_MODELS 16

struct vmetrics;

/* Returns NULL when out of memory. */
struct vmetrics *vm_create(void);
void vm_free(struct vmetrics *m);

/* A request's state for the gauges. */
enum vm_state { VM_NONE = 0, VM_WAITING, VM_RUNNING };

/* Moves one request of model from state `from` to `to` (the gauges). */
void vm_move(struct vmetrics *m, const char *model, enum vm_state from, enum vm_state to);

/* The first event of a request, seconds after its XADD. */
void vm_first_token(struct vmetrics *m, const char *model, double s);

/* A request's done event: e2e seconds, its usage and finish_reason
 * (redlm's: stop, length; cancelled, deadline and error count as abort). */
void vm_done(struct vmetrics *m, const char *model, double e2e_s, int64_t prompt_tokens,
             int64_t generation_tokens, const char *finish_reason);

/* One served model's figures summed over its live workers' heartbeats.
 * The counters never go down: those of a worker that left or restarted
 * are kept (fleet.c). */
struct vm_fleet {
    char model[JOB_MODEL_MAX + 1]; /* the heartbeat's served name */
    int n_workers;                 /* live workers announcing it */
    int64_t running, waiting;      /* sequences in their engines */
    int64_t kv_blocks, kv_used;    /* KV pool blocks; of them referenced by a sequence */
    int64_t prefix_queries;        /* prompt tokens looked up in the prefix cache */
    int64_t prefix_hits;           /* of those, found there */
    int64_t preemptions;           /* sequences preempted to free KV blocks */
    /* The workers' histograms (heartbeat ttft_*, e2e_*, ...): cumulative
     * counts at vLLM's bounds (common/vbuckets.h), counts, sums in seconds;
     * hist: some worker of the model reports them (else all 0, and the
     * page shows the front door's own) */
    bool hist;
    int64_t ttft[VB_N_TTFT], ttft_n;
    double ttft_sum;
    int64_t e2e[VB_N_E2E], e2e_n;
    double e2e_sum;
    /* heartbeat tpot_* (one per token gap), prompt_len_*, gen_len_* (one
     * per finished job; sums in tokens) */
    int64_t tpot[VB_N_TPOT], tpot_n;
    double tpot_sum;
    int64_t plen[VB_N_LEN], plen_n;
    double plen_sum;
    int64_t glen[VB_N_LEN], glen_n;
    double glen_sum;
    /* heartbeat queue_time_*, prefill_time_*, decode_time_* (one each per
     * finished job, at e2e's bounds; together about e2e) */
    int64_t qt[VB_N_E2E], qt_n;
    double qt_sum;
    int64_t pt[VB_N_E2E], pt_n;
    double pt_sum;
    int64_t dt[VB_N_E2E], dt_n;
    double dt_sum;
};

/* Appends the families (Prometheus text with HELP and TYPE) to b: the
 * front door's, merged with the fleet's rows (n_fleet of them, borrowed;
 * fleet may be NULL when n_fleet is 0). */
void vm_render(struct vmetrics *m, const struct vm_fleet *fleet, int n_fleet, struct text *b);

#endif
