/* engine/model.h - a Qwen3 dense checkpoint: its config and weight table.
 *
 * model_load() reads a Hugging Face Qwen3 directory (config.json and the
 * safetensors shards: BF16/F16/F32, block FP8, or AutoAWQ INT4) or a GGUF
 * file (llama.cpp's "qwen3" architecture: F32/F16/BF16/Q8_0/Q4_K/Q5_K/Q6_K
 * tensors, the config from its metadata), checks every tensor against the
 * config (name, shape, dtype) and fills public records that backends
 * consume. Weights are not copied: tensors point into the read-only mapping
 * owned by the model. */
#ifndef RL_MODEL_H
#define RL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* The quantized formats (MODEL_Q8_0 and after) are defined in engine/quant.h. */
enum model_dtype {
    MODEL_F32 = 0,
    MODEL_BF16,
    MODEL_F16,
    MODEL_F8_E4M3,
    MODEL_Q8_0,   /* GGUF Q8_0 blocks of 32 */
    MODEL_Q4_K,   /* GGUF Q4_K super-blocks of 256 */
    MODEL_Q5_K,   /* GGUF Q5_K super-blocks of 256 */
    MODEL_Q6_K,   /* GGUF Q6_K super-blocks of 256 */
    MODEL_AWQ4,   /* AutoAWQ INT4, GEMM layout, f16 scales per group */
    MODEL_Q4_0,   /* GGUF Q4_0 blocks of 32 */
    MODEL_Q4_1,   /* GGUF Q4_1 blocks of 32 */
    MODEL_Q5_0,   /* GGUF Q5_0 blocks of 32 */
    MODEL_Q5_1,   /* GGUF Q5_1 blocks of 32 */
    MODEL_Q2_K,   /* GGUF Q2_K super-blocks of 256 */
    MODEL_Q3_K,   /* GGUF Q3_K super-blocks of 256 */
    MODEL_IQ4_NL, /* GGUF IQ4_NL blocks of 32 */
    MODEL_IQ4_XS, /* GGUF IQ4_XS super-blocks of 256 */
};

struct model_config {
    int hidden;            /* hidden_size */
    int intermediate;      /* intermediate_size */
    int n_layers;          /* num_hidden_layers */
    int n_heads;           /* num_attention_heads */
    int n_kv_heads;        /* num_key_value_heads */
    int head_dim;          /* head_dim (default hidden / n_heads) */
    int vocab;             /* vocab_size */
    int max_pos;           /* max_position_embeddings (after YaRN scaling) */
    float rms_eps;         /* rms_norm_eps */
    float rope_theta;      /* rope_theta */
    int tied;              /* tie_word_embeddings */
    /* rope_scaling {"rope_type": "yarn", ...}; yarn_factor 0 = none */
    float yarn_factor;
    int yarn_orig_max_pos; /* original_max_position_embeddings */
    float yarn_beta_fast, yarn_beta_slow;
    float yarn_attn_factor; /* multiplies cos/sin; 0.1 ln(factor) + 1 unless given */
    /* quantization_config {"quant_method": "fp8", "weight_block_size": [128,128]} */
    int fp8_block_rows, fp8_block_cols; /* 0 when not an FP8 checkpoint */
    /* quantization_config {"quant_method": "awq", "bits": 4, "group_size": 128,
     * "version": "gemm"}: the projections are MODEL_AWQ4 */
    int awq_group;         /* 0 when not an AWQ checkpoint */
    enum model_dtype dtype; /* torch_dtype, the dtype of unquantized tensors */
    int bos_id, eos_id;    /* -1 when absent */
    /* An embedding checkpoint (Qwen3-Embedding-4B/8B: Qwen3Model's weights,
     * named without "model.", and no lm_head.weight though untied): it
     * serves embeddings only. tied is then set, so that the backends use
     * the embedding matrix where the vocabulary product was (the forward
     * pass stays one; its logits mean nothing and nobody samples them) */
    int embed_only;
};

/* A weight as the checkpoint stores it. Matrices are row-major (rows = out
 * features, cols = in features), exactly the Hugging Face layout. */
struct model_tensor {
    enum model_dtype dtype;
    int64_t rows, cols;          /* vectors: rows = 1 */
    const void *data;            /* host mapping, owned by struct model */
    const float *scale_f32;      /* FP8 only, else NULL: weight_scale_inv as f32,
                                    (ceil(rows/br), ceil(cols/bc)), owned by model */
    const char *name;            /* checkpoint name, for messages */
    /* AWQ4 only, else NULL / 0 (layout in engine/quant.h): data is qweight
     * int32 (cols, rows / 8); owned like data. */
    const int32_t *awq_qzeros;   /* (cols / awq_group, rows / 8) packed zeros */
    const uint16_t *awq_scales;  /* (cols / awq_group, rows) f16 */
    int awq_group;               /* group size along cols (128 for Qwen3-*-AWQ) */
};

struct model_layer {
    struct model_tensor attn_norm;  /* (1, hidden) input_layernorm */
    struct model_tensor wq;         /* (n_heads*head_dim, hidden) */
    struct model_tensor wk;         /* (n_kv_heads*head_dim, hidden) */
    struct model_tensor wv;         /* (n_kv_heads*head_dim, hidden) */
    struct model_tensor wo;         /* (hidden, n_heads*head_dim) */
    struct model_tensor q_norm;     /* (1, head_dim) */
    struct model_tensor k_norm;     /* (1, head_dim) */
    struct model_tensor mlp_norm;   /* (1, hidden) post_attention_layernorm */
    struct model_tensor w_gate;     /* (intermediate, hidden) */
    struct model_tensor w_up;       /* (intermediate, hidden) */
    struct model_tensor w_down;     /* (hidden, intermediate) */
};

struct model_weights {
    struct model_tensor embed;      /* (vocab, hidden) */
    struct model_tensor final_norm; /* (1, hidden) */
    struct model_tensor lm_head;    /* (vocab, hidden); == embed when tied */
    int n_layers;
    struct model_layer *layers;     /* (n_layers), owned by struct model */
};

struct model; /* opaque: config, weights and the mappings behind them */

/* Loads DIR: a Hugging Face checkpoint directory, a GGUF file (any name:
 * the magic decides), or a directory holding one .gguf file and no
 * config.json. The caller owns *out (model_free). Errors name the file and
 * the field or tensor (and, for a tensor type redlm does not read, the
 * type). */
int model_load(struct model **out, const char *dir, struct rl_err *err);
void model_free(struct model *m);
/* A model of cfg's shape with no weights: every tensor has its dtype and
 * dimensions (so model_weight_bytes_per_token() is right) and data NULL.
 * For the sim backend (engine/sim/), which models a device's timing and
 * never reads a weight. dir is what model_get_dir() returns. */
int model_create_shape(struct model **out, const struct model_config *cfg, const char *dir,
                       struct rl_err *err);

const struct model_config *model_get_config(const struct model *m);
const struct model_weights *model_get_weights(const struct model *m);
const char *model_get_dir(const struct model *m);
/* Bytes of weights one decode step reads (all matrices + lm_head), for
 * roofline figures. */
size_t model_weight_bytes_per_token(const struct model *m);

/* Rotary frequencies for cfg: inv_freq (head_dim / 2) and the factor that
 * multiplies cos/sin (1, or YaRN's attention factor). The one definition
 * both backends use: transformers' default rope and _compute_yarn_parameters,
 * in doubles, rounded to float once. */
void model_rope_inv_freq(const struct model_config *cfg, float *inv_freq, float *mscale);

/* The largest config.json read (a real one is ~1 KB; a bigger file is a
 * wrong path, refused before it is read whole). */
#define MODEL_CONFIG_MAX (16u << 20)

/* Parses config.json text alone (tests, the model maker). */
int model_parse_config(struct model_config *cfg, const char *json,
                       const char *path, struct rl_err *err);

const char *model_dtype_name(enum model_dtype dt);

/* The GGUF file the model was loaded from, or NULL for a safetensors
 * checkpoint (its tokenizer lives in the metadata: tok_load reads it). */
const char *model_get_gguf(const struct model *m);

/* What the weights are, as Ollama's /api/show names it, into buf (at
 * least 16 bytes): for a GGUF file llama.cpp's name of its
 * general.file_type ("Q4_K_M", "Q8_0", "IQ4_XS", ...), else the type of
 * its first layer's ffn_up; for safetensors "FP8", "AWQ" or the torch
 * dtype ("BF16", "F16", "F32"). */
void model_quant_label(const struct model *m, char *buf, size_t n);
/* The parameters a checkpoint of shape c holds (every matrix and norm;
 * the embedding once when tied). */
int64_t model_n_params(const struct model_config *c);

#endif
