/* engine/sim/sim.h - the sim backend: a modelled GPU without weights.
 *
 * A third implementation of engine/backend.h. Its forward() computes no
 * matrix: it sleeps for the time a named device would take for the step
 * (the roofline model below) and writes logits that make the engine's own
 * seeded sampler pick deterministic ids, so everything above the forward
 * pass - scheduler, paged KV cache, prefix cache, sampling, stop checks,
 * worker, protocol - runs for real. Dozens of sim workers fit on one small
 * machine; docs in engine/sim/README.md. */
#ifndef RL_SIM_H
#define RL_SIM_H

#include <stddef.h>

#include "backend.h"
#include "err.h"
#include "model.h"

/* A device, by its published (datasheet) figures. */
struct sim_profile {
    const char *name;     /* "h200", "h100", "a100", "l40s" */
    double mem_bytes;     /* device memory */
    double bw;            /* memory bandwidth, bytes/s */
    double bf16_flops;    /* dense BF16 tensor peak, FLOP/s */
    double fp8_flops;     /* dense FP8 tensor peak; 0 = none (BF16 math) */
};

/* The model's calibration constants (one set for every profile; README),
 * fitted to redlm's CUDA backend on an H200 (BENCHMARKS.md, issue 25:
 * Qwen3-14B shapes, decode at batch 1 / 64 / 256 and contexts 512 / 8k,
 * prefill of 2,048 tokens; every fitted BF16 figure within 5 % of the
 * measured one, every FP8 figure within 11 %). FP8 checkpoints have their
 * own two: their block-scaled products (activations quantized to e4m3 on
 * the way in) reach less of the bandwidth and of the FP8 peak than BF16
 * products reach of theirs, and one set fitted both 1.1-1.5x too fast. */
#define SIM_BW_EFF 0.74       /* share of bandwidth the weights' products attain */
#define SIM_KV_EFF 0.30       /* share of bandwidth the decode attention's KV reads attain */
#define SIM_FLOP_EFF 0.48     /* share of the tensor peak a prefill attains */
#define SIM_FP8_BW_EFF 0.52   /* ... an FP8 checkpoint's layer products (lm_head stays BF16) */
#define SIM_FP8_FLOP_EFF 0.28 /* ... of the FP8 peak, an FP8 checkpoint's prefill */
#define SIM_LAUNCH_S 100e-6   /* fixed per step: graph launch, logits copy, sync */
#define SIM_LAYER_S 52e-6     /* per layer and step: the small kernels (norms, rope,
                                 attention and its merge), a few us each */
#define SIM_MEM_UTIL 0.90     /* device memory given to weights + KV */

/* Fills *out with profile name (NULL = "h200"); -RL_EINVAL names the known ones. */
int sim_profile_get(const char *name, struct sim_profile *out, struct rl_err *err);

/* The model shape spec names: a built-in ("qwen3-0.6b" ... "qwen3-32b",
 * "qwen3-14b-fp8", ...), a config.json path, or a directory holding one. */
int sim_model_config(const char *spec, struct model_config *cfg, struct rl_err *err);

/* A weightless model (model_create_shape) of spec's shape, or of
 * dir/config.json when spec is NULL or "". dir is the model directory the
 * engine takes its tokenizer from. The caller owns *out (model_free). */
int sim_model_load(struct model **out, const char *dir, const char *spec, struct rl_err *err);

/* Bytes of the weights as stored (embedding and lm_head included), and
 * as one decode step reads them (lm_head, not the embedding). */
double sim_weight_bytes(const struct model_config *cfg, int read_per_step);
/* KV bytes one token takes over all layers (bf16 K and V). */
double sim_kv_token_bytes(const struct model_config *cfg);
/* The KV capacity: SIM_MEM_UTIL of device memory minus the weights (0 when
 * the weights do not fit). */
double sim_kv_capacity(const struct sim_profile *p, const struct model_config *cfg);

/* The modelled step time in seconds:
 *   max(weights read / bw', FLOPs / peak') + KV bytes read / bw''
 *   + SIM_LAUNCH_S + n_layers * SIM_LAYER_S
 * with bw' = bw * SIM_BW_EFF, bw'' = bw * SIM_KV_EFF and peak' = peak *
 * SIM_FLOP_EFF (an FP8 checkpoint: its layer matrices at bw *
 * SIM_FP8_BW_EFF, its FLOPs at the FP8 peak * SIM_FP8_FLOP_EFF where the
 * part has one). n_tokens are
 * computed, n_logits of them go through lm_head, attn_pairs is the sum over
 * new tokens of the positions they attend to, kv_tokens the tokens whose K
 * and V the step reads (each sequence's whole context once). */
double sim_step_seconds(const struct sim_profile *p, const struct model_config *cfg,
                        double n_tokens, double n_logits, double attn_pairs, double kv_tokens);

/* The model's tokens/s for the figures bench_cuda measures: n_seqs
 * sequences decoding at context ctx (a step each), and a prompt of len
 * tokens prefilled in chunks of chunk tokens. */
double sim_decode_tok_s(const struct sim_profile *p, const struct model_config *cfg, int n_seqs,
                        int ctx);
double sim_prefill_tok_s(const struct sim_profile *p, const struct model_config *cfg, int len,
                         int chunk);

int sim_backend_create(struct backend **out, const struct be_options *opt, struct rl_err *err);

#endif
