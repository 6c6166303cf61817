/* common/vbuckets.h - vLLM's bucket bounds (vllm/v1/metrics/loggers.py)
 * for vllm:time_to_first_token_seconds, vllm:e2e_request_latency_seconds,
 * vllm:time_per_output_token_seconds, vllm:request_prompt_tokens and
 * vllm:request_generation_tokens, in one place because two programs use them: the workers publish their
 * cumulative counts at these bounds in the heartbeat (worker/metrics.c),
 * the front door sums and renders them (dispatcher/fleet.c, vmetrics.c).
 * A heartbeat's arrays have exactly VB_N_TTFT, VB_N_E2E, VB_N_TPOT and
 * VB_N_LEN entries. vLLM's length buckets are 1-2-5 steps up to the
 * model's max_model_len; ours are a fixed list up to 100000, so that every
 * worker of a model publishes the same bounds whatever its context. */
#ifndef RL_VBUCKETS_H
#define RL_VBUCKETS_H

#define VB_N_TTFT 22
#define VB_N_E2E 21

static const double vb_ttft[VB_N_TTFT] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double vb_e2e[VB_N_E2E] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,
                                        5.0,  10.0, 15.0, 20.0, 30.0,  40.0,  50.0,
                                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
#define VB_N_TPOT 19
#define VB_N_LEN 16

static const double vb_tpot[VB_N_TPOT] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                          0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                          7.5,  10.0,  20.0, 40.0,  80.0};
static const double vb_len[VB_N_LEN] = {1,    2,    5,    10,    20,    50,    100,   200,
                                        500,  1000, 2000, 5000,  10000, 20000, 50000, 100000};

#endif
