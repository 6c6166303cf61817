/* engine/cuda/cuda_backend.h - the CUDA backend's plain C surface beyond
 * engine/backend.h: switches the tests and the benchmark need, device
 * probes, and per-op entry points that run one kernel family on host arrays
 * (tests/backend checks each against a CPU reference). No CUDA types here,
 * so C code compiles against it without nvcc; everything is only built
 * with `make CUDA=1`.
 *
 * Functions taking a `struct backend *` require one made by
 * be_create(..., "cuda", ...) and return -RL_EINVAL otherwise. The op entry
 * points allocate, run on the current device, synchronise and free; they
 * are for tests, not for speed. */
#ifndef RL_CUDA_BACKEND_H
#define RL_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "err.h"
#include "model.h"

/* Number of usable CUDA devices; 0 with the reason in why (no driver, no
 * device) - tests print it and skip. */
int cuda_device_count(char *why, size_t why_len);

/* Decode steps (every sequence n_new == 1) run as CUDA graphs captured per
 * batch-size bucket (1, 2, 4, ... 512); on by default. */
int cuda_backend_set_graphs(struct backend *be, int on);

/* Matrix products: 0 auto, 1 cuBLASLt only (block-scaled for FP8), 2 our
 * kernels only (FP8 at every batch, BF16/F16 at batches <= 8). Auto: FP8
 * by batch size, BF16/F16 decode products by what was measured at load
 * (cuda_backend_gemm_report). */
int cuda_backend_set_gemm_path(struct backend *be, int path);
/* The load-time measurements of the BF16/F16 decode products (cuBLASLt
 * against ours, per shape and batch 1/2/4/8) as a JSON array in buf;
 * returns the number of shapes, or -RL_EINVAL. */
int cuda_backend_gemm_report(struct backend *be, char *buf, size_t cap);

/* Decode attention's kernel form: 0 plain (the default), 1 a key row's
 * loads issued at once (BF16 KV, head_dim <= 128). Same results; which is
 * faster is for bench_cuda to show on a device (issue 25). */
int cuda_backend_set_attn_variant(struct backend *be, int variant);

/* On-device sampling hook. When on, forward() leaves batch->logits alone
 * and instead keeps the greedy token (argmax, lower id on ties) of each
 * logits row; cuda_backend_sampled() returns them, n_logits ids owned by
 * the backend and valid until the next forward(). This is where top-k/
 * top-p/min-p/penalty sampling on the device will plug in: the engine then
 * reads ids instead of (n_logits, vocab) floats. */
int cuda_backend_set_device_argmax(struct backend *be, int on);
const int32_t *cuda_backend_sampled(struct backend *be);

/* Benchmark only: time each op of eager steps (graphs off) with CUDA
 * events. cuda_backend_profile() fills ms[i] with the milliseconds spent in
 * op kind i since the last reset and names[i] with its name; returns the
 * number of kinds (at most 16). */
int cuda_backend_set_profile(struct backend *be, int on, struct rl_err *err);
int cuda_backend_profile(struct backend *be, double *ms, const char **names, int reset);

/* Benchmark only: load() for a config without a checkpoint. Matrices get
 * uniform random values in dtype wdt (BF16 or FP8 E4M3 with 128x128 block
 * scales; embed/lm_head BF16 for FP8 as Qwen3-FP8 ships them), norm weights
 * 1. Speed does not depend on weight values, so this measures what a real
 * checkpoint of the same shape would, without writing 28 GB first. */
int cuda_backend_load_random(struct backend *be, const struct model_config *cfg, enum model_dtype wdt,
                             int max_tokens, uint64_t seed, struct rl_err *err);

/* Page-locked host memory (faster logits copies); NULL on failure. */
void *cuda_host_alloc(size_t bytes);
void cuda_host_free(void *p);

/* ---- probes for the benchmark's ceilings ---- */

/* Device name and memory in bytes. */
int cuda_device_info(int device, char *name, size_t name_len, size_t *mem_bytes, int *sm_count,
                     struct rl_err *err);
/* Device-to-device copy bandwidth, bytes read + written per second. */
int cuda_measure_bandwidth(int device, double *bytes_per_s, struct rl_err *err);
/* cuBLASLt BF16 (dt MODEL_BF16) or block-scaled FP8 rate for y = x W^T
 * with x (M, K), W (N, K), in FLOP/s. */
int cuda_measure_gemm(int device, enum model_dtype dt, int M, int N, int K, double *flops,
                      struct rl_err *err);

/* ---- per-op entry points (tests) ---- */

/* y (M, N) = x (M, K) . W^T, W (N, K) as a checkpoint stores it (F32,
 * BF16, F16, or FP8 bytes with scale (ceil(N/br), ceil(K/bc)) row-major),
 * x f32 rounded to the matrix's activation type. path as in
 * cuda_backend_set_gemm_path. */
int cuda_test_gemm(int M, int N, int K, enum model_dtype dt, const void *w, const float *scale, int br,
                   int bc, const float *x, float *y, int path, struct rl_err *err);
/* The same for a quantized matrix (any GGUF block format of quant.h in its
 * blocks, or AWQ4 in the CPU's converted rows, engine/cpu/qgemm.h; group
 * for AWQ4): the skinny kernel for M <= 8, dequantized BF16 panels through
 * cuBLASLt above; x rounded to bf16. */
int cuda_test_qgemm(int M, int N, int K, enum model_dtype dt, int group, const void *w, const float *x,
                    float *y, struct rl_err *err);
/* y = rmsnorm(x (+ add)) per row, f32 out; when add is set x is updated. */
int cuda_test_rmsnorm(int n, int dim, float *x, const float *add, const float *w, float eps, float *y,
                      struct rl_err *err);
/* h (M, inter) = silu(gu[:, :inter]) * gu[:, inter:] */
int cuda_test_swiglu(int M, int inter, const float *gu, float *h, struct rl_err *err);
/* The fused q/k norm + rotary + KV write for T tokens. k_pool, v_pool:
 * (n_blocks, n_kv, bs, hd) f32 in/out (kv_bf16 rounds through BF16);
 * q_out (T, n_heads, hd) f32. */
int cuda_test_rope(int T, int n_heads, int n_kv, int hd, const float *qkv, const float *q_norm,
                   const float *k_norm, float eps, const float *inv_freq, float mscale, const int32_t *pos,
                   const int32_t *slot, int kv_bf16, int n_blocks, int bs, float *q_out, float *k_pool,
                   float *v_pool, struct rl_err *err);
/* Paged attention for a batch over given pools ((n_blocks, n_kv, bs, hd)
 * f32, rounded to BF16 when kv_bf16): q (n_tokens, n_heads, hd) f32, the
 * keys of every position < n_past + n_new already in the pools; out same
 * shape as q. mode 0: decode kernel for n_new == 1 sequences, prefill
 * kernel otherwise; 1: decode kernel for every token; 2: prefill kernel for
 * every sequence (tensor cores where they apply); 3: the SIMT prefill
 * kernel for every sequence; 4: as 1 with the decode kernel's preloading
 * variant (cuda_backend_set_attn_variant). nsplit 0 = automatic. */
int cuda_test_attention(int kv_bf16, int n_heads, int n_kv, int hd, int bs, int n_blocks, const float *k_pool,
                        const float *v_pool, int n_seqs, const struct be_seq *seqs, const float *q, float *out,
                        int mode, int nsplit, struct rl_err *err);

/* The rows the host samples from (issue 25, topk.cu): out[r] = logits row
 * r's best entry (argmax_only, n = 1) or its SAMPLE_CANDS best, ranked as
 * engine/sample.h's sample_cands_from_row() ranks them, with the NaN / +inf
 * count; n_rows rows of vocab floats. */
struct sample_cands;
int cuda_test_row_cands(const float *logits, int n_rows, int vocab, int argmax_only, struct sample_cands *out,
                        struct rl_err *err);

#endif
