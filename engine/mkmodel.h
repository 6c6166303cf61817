/* engine/mkmodel.h - writes Hugging Face Qwen3 checkpoints with random
 * weights (or converts an existing one to another dtype), for tests and
 * benchmarks that need a model of a given shape without downloading one.
 *
 * The output directory gets config.json, model.safetensors (or shards plus
 * model.safetensors.index.json) with the exact HF Qwen3 tensor names, and
 * the tokenizer files when a tokenizer directory is given. */
#ifndef RL_MKMODEL_H
#define RL_MKMODEL_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

enum mk_dtype {
    MK_F32 = 0, /* every tensor F32, torch_dtype "float32" */
    MK_BF16,    /* every tensor BF16, torch_dtype "bfloat16" */
    MK_FP8,     /* the 7 projections per layer F8_E4M3 + 128x128 block weight_scale_inv;
                 * embeddings, norms, lm_head BF16 (as Qwen/Qwen3-*-FP8) */
    MK_AWQ,     /* the 7 projections AutoAWQ INT4 GEMM (qweight, qzeros, scales; group
                 * awq_group); embeddings, norms, lm_head F16, torch_dtype "float16"
                 * (as Qwen/Qwen3-*-AWQ) */
    MK_Q8_0,    /* one GGUF file: every matrix Q8_0, norms F32 (llama.cpp's Q8_0) */
    MK_Q4_K_M,  /* one GGUF file in llama.cpp's Q4_K_M layout: matrices Q4_K, except
                 * Q6_K for attn_v and ffn_down in the layers llama.cpp gives more bits
                 * (the first and last eighth and every third between) and for
                 * output (or, tied, token_embd); norms F32 */
    MK_Q5_K_M,  /* the same with Q5_K for Q4_K (llama.cpp's Q5_K_M) */
    MK_Q6_K,    /* every matrix Q6_K (llama.cpp's Q6_K) */
    /* the other GGUF mixes (mk_gguf_mix): the base type everywhere, output
     * (or, tied, token_embd) Q6_K as llama.cpp gives it; Q2_K and Q3_K_M
     * keep attn_v and ffn_down of the use_more_bits layers one step up
     * (Q3_K, Q4_K), as llama.cpp does in its own way */
    MK_Q4_0,
    MK_Q4_1,
    MK_Q5_0,
    MK_Q5_1,
    MK_Q2_K,
    MK_Q3_K_M,
    MK_IQ4_NL,
    MK_IQ4_XS,
    MK_N        /* not a dtype: the count */
};

/* The --dtype spelling of d ("bf16", "q4_k_m", ...); "?" when out of range. */
const char *mk_dtype_name(enum mk_dtype d);
/* The dtype spelt s (mk_dtype_name's words); 0, or -1 when s names none. */
int mk_dtype_parse(const char *s, enum mk_dtype *out);
/* 1 when d writes one GGUF file (MK_Q8_0 and after). */
int mk_dtype_is_gguf(enum mk_dtype d);

struct mk_opts {
    const char *out_dir;       /* created (with parents) if missing; for the GGUF dtypes
                                * the file is out_dir/model.gguf, or out_dir itself
                                * when it ends in ".gguf" */
    const char *from_dir;      /* non-NULL: convert this checkpoint to `dtype` instead of
                                * making random weights; the shape fields are ignored */
    const char *tokenizer_dir; /* copy tokenizer.json + tokenizer_config.json from here
                                * (GGUF: their vocab, merges, token types, special ids
                                * and chat template go into the metadata, as llama.cpp's
                                * converter writes them); NULL: from from_dir when
                                * converting, else none */
    int hidden;                /* hidden_size */
    int intermediate;          /* intermediate_size */
    int n_layers;              /* num_hidden_layers */
    int n_heads;               /* num_attention_heads */
    int n_kv_heads;            /* num_key_value_heads, divides n_heads */
    int head_dim;
    int vocab;                 /* vocab_size */
    int tied;                  /* tie_word_embeddings: no lm_head.weight */
    enum mk_dtype dtype;
    uint64_t seed;             /* same seed + shape = same weights, whatever the dtype */
    double yarn_factor;        /* > 0: rope_scaling yarn with this factor; 0: null */
    int bos_id, eos_id;        /* < 0: 151643/151645, or vocab-2/vocab-1 when the vocab is smaller */
    int n_shards;              /* > 1: split into about this many shards */
    uint64_t shard_size;       /* > 0: start a new shard before one would exceed this many bytes */
    int pattern;               /* fill each tensor by repeating a 65521-element random pattern:
                                * much faster for huge checkpoints, still seed-deterministic */
    int scale_bf16;            /* FP8: weight_scale_inv as BF16 (Qwen's dense FP8 releases) instead of F32 */
    int awq_group;             /* AWQ: group size along the input features; 0 = 128 */
    float weight_std;          /* std of the random matrices; 0 = 0.02 (tests that want
                                * confident logits from a tiny model raise it) */
    int embedding;             /* Qwen3-Embedding's layout (Qwen3Model saved bare): names
                                * without "model.", no lm_head.weight even untied (the
                                * 4B/8B releases); safetensors dtypes only. Converting,
                                * the source's lm_head.weight is left out */
};

/* What mk_write produced. */
struct mk_result {
    int64_t n_params;  /* elements of all tensors except the FP8 scales */
    uint64_t n_bytes;  /* total size of the .safetensors (or .gguf) files */
    int n_files;       /* number of .safetensors (or .gguf) files */
};

/* Fills *o with the `tiny` shape, BF16, seed 0, one file, no output dir. */
void mk_opts_init(struct mk_opts *o);

/* Sets the shape fields (hidden .. tied) from a preset: "tiny", "qwen3-0.6b",
 * "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b".
 * Returns 0, or -RL_EINVAL naming the unknown preset. */
int mk_opts_preset(struct mk_opts *o, const char *shape, struct rl_err *err);

/* The file a GGUF dtype writes for out (see mk_opts.out_dir) into buf. */
void mk_gguf_path(const char *out, char *buf, size_t size);

/* Writes the checkpoint described by *o. Validates every option before
 * touching the disk. *res (may be NULL) gets the summary. Returns 0 or a
 * negative code: RL_EINVAL for bad options, RL_EIO for file errors, the
 * reader's codes for a bad --from checkpoint. */
int mk_write(const struct mk_opts *o, struct mk_result *res, struct rl_err *err);

/* Rounds f to the nearest OCP FP8 E4M3 (fn) value, ties to even,
 * saturating at +-448; NaN gives 0x7f. */
uint8_t mk_f32_to_e4m3(float f);

#endif
