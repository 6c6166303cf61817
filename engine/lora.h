/* engine/lora.h - LoRA adapters as PEFT saves them, for serving many
 * fine-tunes of one base model from one copy of its weights.
 *
 * A LoRA adapter adds to a linear layer y = W x the low-rank term
 * scale * B (A x), with A (r, in) and B (out, r), r a few to a few hundred.
 * Serving it beside the base (instead of merging it into a copy of the
 * weights) keeps one set of weights for any number of fine-tunes, and a
 * batch may mix requests of different adapters and of none: the base
 * product runs once for all rows, each row's delta with its own adapter.
 *
 * What loads: a directory with adapter_config.json (peft_type "LORA") and
 * adapter_model.safetensors (F32/BF16/F16), tensors named as PEFT saves
 * them for Qwen3ForCausalLM (or, given a file, llama.cpp's GGUF adapter:
 * adapter.type "lora", adapter.lora.alpha, "blk.<l>.attn_q.weight.lora_a"
 * ... in F32/F16/BF16/Q8_0, scale alpha / r, or 1 without an alpha):
 *   base_model.model.model.layers.<l>.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight
 *   base_model.model.model.layers.<l>.mlp.{gate,up,down}_proj.lora_{A,B}.weight
 * Any subset of layers and of those seven projections (target_modules,
 * layers_to_transform, rank_pattern: the rank is each pair's own). The
 * scale is lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
 * Refused with a sentence naming the field: DoRA, biases, alpha_pattern,
 * modules_to_save, embedding or lm_head LoRA, fan_in_fan_out, any tensor
 * whose shape does not fit the model.
 *
 * The matrices are kept in f32 (A as (r, in), B transposed to (r, out) so
 * that a row's delta is r axpys over contiguous memory), scale folded into
 * B. An adapter is immutable once loaded and may be read from any thread. */
#ifndef RL_LORA_H
#define RL_LORA_H

#include <stddef.h>

#include "err.h"
#include "model.h"

/* The projections an adapter may touch, in the order a layer runs them. */
enum lora_proj {
    LORA_Q = 0, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_N_PROJ
};

/* Adapters one engine serves at most. */
#define LORA_MAX_ADAPTERS 64
/* The largest rank taken (PEFT's published adapters stay far below). */
#define LORA_MAX_RANK 512

struct lora_adapter; /* opaque, immutable after lora_load */

/* One projection's pair: a (rank, in) and bt (rank, out), bt = scale * B^T. */
struct lora_pair {
    int rank, in, out;
    const float *a;
    const float *bt;
};

/* Loads the adapter in dir (a PEFT directory, or a GGUF adapter file) for
 * a model of shape cfg. The caller owns *out
 * and frees it with lora_free. Errors: RL_EIO (files), RL_EFORMAT (what the
 * files say, named), RL_ENOMEM. */
int lora_load(struct lora_adapter **out, const char *dir, const struct model_config *cfg,
              struct rl_err *err);
void lora_free(struct lora_adapter *a);

/* Layer l's pair for projection p, or NULL when the adapter leaves it. */
const struct lora_pair *lora_get(const struct lora_adapter *a, int layer, enum lora_proj p);
/* The largest rank of any pair, and the bytes the matrices take. */
int lora_max_rank(const struct lora_adapter *a);
size_t lora_bytes(const struct lora_adapter *a);
/* "q_proj" ... "down_proj". */
const char *lora_proj_name(enum lora_proj p);
/* The module PEFT names it under: "self_attn" (q/k/v/o) or "mlp". */
const char *lora_proj_block(enum lora_proj p);
/* Its tensor in a GGUF model: "attn_q" ... "ffn_down". */
const char *lora_proj_gguf_name(enum lora_proj p);
/* Its input and output features in a model of shape cfg. */
void lora_proj_shape(const struct model_config *cfg, enum lora_proj p, int *in, int *out);

#endif
