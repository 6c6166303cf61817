/* engine/mklora.h - LoRA adapters for tests and benchmarks: a random PEFT
 * adapter for a given base checkpoint, and the base with an adapter merged
 * into its weights (the reference an adapter served beside the base must
 * equal, and what a user who wants one fine-tune at full speed runs).
 *
 * The adapter is what PEFT's save_pretrained writes for Qwen3ForCausalLM
 * (engine/lora.h says which files and names), with random A and B: PEFT
 * initialises B to zero, which would make every adapter the base. */
#ifndef RL_MKLORA_H
#define RL_MKLORA_H

#include <stdint.h>

#include "err.h"

struct mk_lora_opts {
    const char *base_dir;   /* the base checkpoint (its config.json gives the shapes) */
    const char *out_dir;    /* created (with parents) if missing; ending in ".gguf":
                             * one GGUF adapter file (llama.cpp's layout, the same
                             * values; no rslora) instead of PEFT's two files */
    int rank;               /* r, 1..LORA_MAX_RANK */
    double alpha;           /* lora_alpha; 0 = 2 * rank */
    int rslora;             /* use_rslora: scale alpha / sqrt(r) */
    unsigned targets;       /* bit p = lora_proj p gets a pair; 0 = all seven */
    uint64_t seed;
    float std;              /* of A's and B's entries; 0 = 0.02 */
    int bf16;               /* tensors BF16 (as PEFT saves a BF16 model's); 0 = F32 */
};

/* Defaults: rank 8, alpha 16, every projection, seed 0, std 0.02, F32. */
void mk_lora_opts_init(struct mk_lora_opts *o);

/* Writes out_dir/adapter_config.json and out_dir/adapter_model.safetensors. */
int mk_lora_write(const struct mk_lora_opts *o, struct rl_err *err);

/* Writes base_dir's checkpoint with the adapter in adapter_dir merged into
 * its projections (W + scale B A, summed in f32 and stored in W's dtype)
 * into out_dir: one model.safetensors, the base's config, generation config
 * and tokenizer files. Safetensors bases with F32/BF16/F16 projections. */
int mk_lora_merge(const char *base_dir, const char *adapter_dir, const char *out_dir,
                  struct rl_err *err);

#endif
