/* engine/cuda/ops.cuh - the launchers each op family offers the backend.
 *
 * Everything here takes device pointers and the one stream, enqueues work
 * and returns 0 or a negative RL_E* code with the error filled; nothing
 * synchronises. Shapes are row-major unless a comment says otherwise. This
 * header is internal to engine/cuda/ (C++ only); the plain C surface is
 * engine/backend.h and engine/cuda/cuda_backend.h. */
#ifndef RL_CUDA_OPS_CUH
#define RL_CUDA_OPS_CUH

#include "common.cuh"

/* ---- prof.cu: per-op timing of eager steps (the benchmark's breakdown) ---- */

enum { CU_PROF_EMBED, CU_PROF_QKV, CU_PROF_ROPE, CU_PROF_ATTN, CU_PROF_O, CU_PROF_NORM, CU_PROF_GU,
       CU_PROF_SWIGLU, CU_PROF_DOWN, CU_PROF_LMHEAD, CU_PROF_SAMPLE, CU_PROF_KINDS };
struct cu_prof; /* opaque: a ring of CUDA events and per-kind totals */
int cu_prof_create(struct cu_prof **out, struct rl_err *err);
void cu_prof_free(struct cu_prof *p);
/* NULL p: every call does nothing, so the forward pass calls them always. */
void cu_prof_begin(struct cu_prof *p, cudaStream_t st);
void cu_prof_mark(struct cu_prof *p, int kind, cudaStream_t st);
void cu_prof_collect(struct cu_prof *p); /* after the stream synchronised */
void cu_prof_read(struct cu_prof *p, double *ms, int reset);
const char *cu_prof_kind_name(int k);

/* ---- gemm.cu: matrix products against checkpoint weights ---- */

/* A weight matrix on the device, in its checkpoint dtype. */
struct cu_mat {
    enum model_dtype dt;
    int rows, cols;   /* HF layout: rows = out features, cols = in features */
    void *w;          /* (rows, cols) row-major */
    float *scale;     /* FP8 only: (ceil(rows/br), scale_ld) f32, else NULL */
    int br, bc;       /* FP8 block shape (128x128 in Qwen3-FP8) */
    int scale_ld;     /* floats per scale row: ceil(cols/bc) rounded up to 4,
                         the padding cuBLASLt's 128x128 mode expects */
    int group;        /* AWQ4: the group along cols; w holds the CPU's NATIVE
                         rows (engine/cpu/qgemm.h: GGUF blocks as they are,
                         AWQ converted to rows), qgemm.cu */
};

/* Up to three matrices over the same input whose outputs sit side by side:
 * output column off[i] + r is row r of m[i]. When the parts could be stacked
 * into one matrix at load (always, except FP8 parts whose rows are not a
 * multiple of the scale block) n == 1. */
struct cu_linear {
    int n;
    struct cu_mat m[3];
    int off[3];
    int rows; /* total output columns */
};

enum cu_gemm_path { CU_GEMM_AUTO = 0, CU_GEMM_LT = 1, CU_GEMM_OWN = 2 };

struct cu_gemm; /* opaque: cuBLASLt handle, workspace, plan cache, FP8 scratch */

/* max_m: most rows one call takes (already padded by the caller for the
 * 16-row rounding the FP8 path uses), max_k: widest input. */
int cu_gemm_create(struct cu_gemm **out, int max_m, int max_k, int cc_major, cudaStream_t st,
                   struct rl_err *err);
void cu_gemm_free(struct cu_gemm *g);
/* Force cuBLASLt or our kernels: for FP8 at every M, for BF16/F16 at
 * M <= 8 (F32 and larger BF16/F16 products always use cuBLASLt). AUTO:
 * FP8 by M, BF16/F16 by what cu_gemm_tune measured. */
void cu_gemm_force(struct cu_gemm *g, enum cu_gemm_path p);
/* Times cuBLASLt against our skinny kernel at M = 1, 2, 4, 8 over the n
 * matrices ms (one BF16/F16 shape: a model's every layer's copy, so the
 * weights stream from HBM) and remembers, for that shape, up to which M
 * ours is faster. Once per shape, outside graph capture, with the path on
 * AUTO; anything else is a no-op. Synchronises the stream. */
int cu_gemm_tune(struct cu_gemm *g, const struct cu_mat *const *ms, int n, struct rl_err *err);
/* The measurements as a JSON array into buf (cap bytes); returns the
 * number of shapes tuned. cu_gemm_n_own: how many of them run ours at
 * M = 1, and in *n_tuned how many were tuned. */
int cu_gemm_tune_report(const struct cu_gemm *g, char *buf, size_t cap);
int cu_gemm_n_own(const struct cu_gemm *g, int *n_tuned);
const char *cu_gemm_fp8_path(const struct cu_gemm *g);
/* y[:, 0:m->rows] (M rows, leading dim ldy, f32) = x (M, cols) . W^T.
 * x has element type cu_act_for(m->dt). y must have room for M rounded up
 * to 16 rows (the FP8 cuBLASLt path writes the padding rows). */
int cu_gemm_run(struct cu_gemm *g, const struct cu_mat *m, int M, const void *x, float *y, int ldy,
                struct rl_err *err);
int cu_linear_run(struct cu_gemm *g, const struct cu_linear *l, int M, const void *x, float *y,
                  struct rl_err *err);
/* Quantized matrices (qgemm.cu) take the prefill path (M > 8) through a
 * BF16 panel of dequantized rows: reserves it (bytes, at least 16 rows of
 * the widest matrix) once at load; cu_gemm_run fails on such a product
 * without it. */
int cu_gemm_reserve_dequant(struct cu_gemm *g, size_t bytes, struct rl_err *err);

/* ---- qgemm.cu: quantized weights (the GGUF block formats of quant.h, AWQ) ---- */

/* y = x . W^T for M <= 8, BF16 x, W a quantized cu_mat. */
int cu_qgemm_skinny(const struct cu_mat *m, int M, const void *x, float *y, int ldy, cudaStream_t st,
                    struct rl_err *err);
/* Rows [r0, r0 + nrows) of m dequantized into out (nrows, m->cols) bf16. */
int cu_qgemm_dequant(const struct cu_mat *m, int r0, int nrows, void *out, cudaStream_t st, struct rl_err *err);
/* cu_embed for a quantized embedding. */
int cu_q_embed(const struct cu_mat *e, const int32_t *tokens, int n, float *x, cudaStream_t st,
               struct rl_err *err);

/* ---- norm.cu: embedding gather, RMSNorm with the residual add ---- */

/* x (n, hidden) f32 = rows tokens[i] of e (F32/BF16/F16/FP8). */
int cu_embed(const struct cu_mat *e, const int32_t *tokens, int n, float *x, cudaStream_t st,
             struct rl_err *err);
/* For i < n, with r = rows ? rows[i] : i: when add is set x[r] += add[r]
 * (the residual update, written back); then y[i] = w * x[r] / rms(x[r]).
 * x, add: (*, dim) f32; y: (n, dim) of type yt. */
int cu_rmsnorm(float *x, const float *add, const int32_t *rows, int n, int dim, const float *w,
               float eps, void *y, enum cu_act yt, cudaStream_t st, struct rl_err *err);

/* ---- lora.cu: LoRA deltas per row (engine/lora.h) ---- */

#define CU_LORA_PROJ 7          /* enum lora_proj's projections */
#define CU_LORA_MAX_RANK 512    /* LORA_MAX_RANK */

/* One table entry: slot s, layer l, projection p at
 * [(s * n_layers + l) * CU_LORA_PROJ + p]; rank 0 = no pair. a (rank, in),
 * bt (rank, out) = scale * B^T, device f32. */
struct cu_lora_ent {
    const float *a, *bt;
    int rank, in, out, pad;
};

/* y rows t < T of projections p0 .. p0 + n_proj - 1 (at most 3, reading the
 * same input x) get their adapter's delta: slot[t] names it (0 = none);
 * projection j's outputs start at column col[j] of y (ldy). tmp: (T, 3,
 * CU_LORA_MAX_RANK) f32 scratch. max_out: the widest projection's outputs. */
struct cu_lora_call {
    const void *x;
    enum cu_act xt;
    int ldx, T;
    const int32_t *slot;
    const struct cu_lora_ent *tab;
    int n_layers, layer, p0, n_proj, max_out;
    float *tmp, *y;
    int ldy, col[3];
};
int cu_lora_apply(const struct cu_lora_call *a, cudaStream_t st, struct rl_err *err);

/* ---- act.cu: SwiGLU, casts, greedy argmax ---- */

/* gu (M, 2*inter) f32 = [gate | up]; h (M, inter) = silu(gate) * up. */
int cu_swiglu(const float *gu, int M, int inter, void *h, enum cu_act ht, cudaStream_t st,
              struct rl_err *err);
int cu_cast(const float *x, size_t n, void *y, enum cu_act yt, cudaStream_t st, struct rl_err *err);
/* ids[i] = argmax of logits row i (n rows of vocab), lower id on ties. */
int cu_argmax(const float *logits, int n, int vocab, int32_t *ids, cudaStream_t st,
              struct rl_err *err);
/* Fills n elements of dt (BF16, F16, F32 or FP8 bytes) with uniform
 * values in [-amp, amp] from (seed, index); FP8 bytes never encode NaN. */
int cu_fill_random(void *p, size_t n, enum model_dtype dt, float amp, uint64_t seed,
                   cudaStream_t st, struct rl_err *err);
int cu_fill_const(float *p, size_t n, float v, cudaStream_t st, struct rl_err *err);
/* y (n) f32 = x (n) bf16 (tests read BF16 pools back with it). */
int cu_widen_bf16(const void *x, size_t n, float *y, cudaStream_t st, struct rl_err *err);

/* ---- mask.cu: constrained decoding ---- */

/* For each i < n_masked whose rows[i] (a logits row of the step) lies in
 * [row0, row0 + n_rows): the entries of logits row rows[i] - row0 (rows of
 * vocab floats) whose bit in masks[i] ((vocab + 31) / 32 words, bit id % 32
 * of word id / 32) is clear become -inf. rows and masks on the device. */
int cu_mask_logits(float *logits, int vocab, int row0, int n_rows, const int32_t *rows,
                   const uint32_t *masks, int n_masked, cudaStream_t st, struct rl_err *err);

/* ---- topk.cu: the rows the host samples from (issue 25) ---- */

struct sample_cands; /* engine/sample.h */

/* For each i < n_rows: out[rows[i]] = the sample_cands of logits row
 * rows[i] (rows of vocab floats): its best entry (argmax_only) or its
 * SAMPLE_CANDS best, ranked as the host ranks, NaN / +inf counted and left
 * out. rows and out on the device. */
int cu_row_cands(const float *logits, int vocab, const int32_t *rows, int n_rows, int argmax_only,
                 struct sample_cands *out, cudaStream_t st, struct rl_err *err);

/* ---- rope.cu: q/k RMSNorm + rotary + paged KV write, KV block copy ---- */

/* KV pool of one layer: (n_blocks, n_kv, block_size, head_dim), f32 or
 * bf16. Physical slot s = block * block_size + offset. */
struct cu_kv_layer {
    void *k, *v;
    int bf16;
    int n_kv, head_dim, block_size;
};

/* qkv (T, (n_heads + 2 n_kv) head_dim) f32 as the fused projection wrote
 * it. Per token: q heads and k heads RMSNorm'd (q_norm/k_norm, (head_dim))
 * and rotated (NEOX, cos/sin = cos/sin(pos * inv_freq) * mscale); q goes to
 * q_out (T, n_heads, head_dim) in the KV element type; k and v go to
 * slot[t] of the cache. */
int cu_qk_rope_write(const float *qkv, int T, int n_heads, const float *q_norm,
                     const float *k_norm, float eps, const float *inv_freq, float mscale,
                     const int32_t *pos, const int32_t *slot, void *q_out,
                     const struct cu_kv_layer *kv, cudaStream_t st, struct rl_err *err);
/* Copies slots [0, n_tokens) of block src to block dst in every layer.
 * layer_elems: elements between consecutive layers of k (and of v). */
int cu_kv_copy(void *k, void *v, int bf16, int n_layers, size_t layer_elems, int n_kv, int bs,
               int hd, int dst, int src, int n_tokens, cudaStream_t st, struct rl_err *err);

/* ---- attn.cu: paged attention ---- */

#define CU_ATTN_MAXG 8       /* query heads per KV head one block serves */
#define CU_ATTN_TILE_ROWS 32 /* prefill: (token, head) rows per block */

/* Step metadata on the device (see backend.cu for how it is packed). */
struct cu_attn_meta {
    const int32_t *tok_seq, *tok_pos; /* (T) */
    const int32_t *dec_tok;           /* (n_dec) tokens served by the decode kernel */
    const int32_t *tile_seq, *tile_r0;  /* (n_tiles) prefill tiles */
    const int32_t *seq_tok0, *seq_nnew, *seq_npast, *seq_bt_off; /* (n_seqs) */
    const int32_t *bt;                /* block tables, seq s at bt + seq_bt_off[s] */
};

int cu_attn_init(struct rl_err *err);
/* Whether the tensor-core tile kernel takes this KV cache (bf16, head_dim
 * 64 or 128); the backend then also sends large decode batches through it. */
int cu_attn_tc(int kv_bf16, int head_dim);
/* Head dims the kernels are built for. */
int cu_attn_supports(int head_dim, int group);
/* Split count for n_items decode queries: enough blocks to fill the GPU,
 * none shorter than 64 keys for max_len, n_items * splits <= cap. */
int cu_attn_splits(int n_items, int n_kv, int sm_count, int max_len, int cap);
/* One query token per item (keys 0..pos), GQA group per block, the keys
 * split nsplit ways and merged. q: (T, n_heads, hd) in the KV type; out:
 * (T, n_heads, hd) f32. part_ml (cap, n_heads, 2), part_acc (cap, n_heads,
 * hd) with cap >= n_dec * nsplit; unused when nsplit == 1. variant: the
 * kernel's form (same results): PRELOAD issues a key row's loads at once
 * (BF16 cache, head_dim <= 128; plain otherwise). */
enum { CU_ATTN_DEC_PLAIN = 0, CU_ATTN_DEC_PRELOAD = 1 };
int cu_attn_decode(const void *q, const struct cu_kv_layer *kv, const struct cu_attn_meta *m,
                   int n_dec, int n_heads, int nsplit, int variant, float *part_ml, float *part_acc, float *out,
                   cudaStream_t st, struct rl_err *err);
/* Causal attention for whole tiles of a sequence's new tokens: on the
 * tensor cores for a bf16 KV cache and head_dim 64 or 128, else SIMT. */
int cu_attn_prefill(const void *q, const struct cu_kv_layer *kv, const struct cu_attn_meta *m,
                    int n_tiles, int n_heads, float *out, cudaStream_t st, struct rl_err *err);
/* The same with the path chosen: simt 1 forces the SIMT kernel (tests). */
int cu_attn_prefill_path(const void *q, const struct cu_kv_layer *kv, const struct cu_attn_meta *m,
                         int n_tiles, int n_heads, float *out, int simt, cudaStream_t st, struct rl_err *err);

#endif
