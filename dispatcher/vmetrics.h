/* dispatcher/vmetrics.h - the front door's request metrics under vLLM's
 * names and buckets, so a vLLM Grafana dashboard reads them unchanged:
 *
 *   vllm:num_requests_running{model_name}   gauge: first event seen, not ended
 *   vllm:num_requests_waiting{model_name}   gauge: queued, no event yet
 *   vllm:time_to_first_token_seconds         histogram: XADD -> first event
 *   vllm:e2e_request_latency_seconds         histogram: XADD -> done
 *   vllm:prompt_tokens_total                 counter
 *   vllm:generation_tokens_total             counter
 *   vllm:request_success_total{finished_reason="stop|length|abort"}
 *
 * They count what the front door sees: requests over HTTP (every API),
 * not jobs submitted to Redis directly. Thread-safe (one mutex); no I/O.
 * At most VM_MODELS model names are told apart; more are "other". */
#ifndef RL_VMETRICS_H
#define RL_VMETRICS_H

#include <stdint.h>

#include "openai.h"

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

/* Appends the families (Prometheus text with HELP and TYPE) to b. */
void vm_render(struct vmetrics *m, struct oai_buf *b);

#endif
