/* engine/cuda/gemm.cu - every projection of the forward pass: y = x . W^T
 * with W in its checkpoint dtype, never widened in device memory.
 *
 * Orientation: W is HF row-major (N, K), x row-major (M, K), y row-major
 * (M, ldy). In cuBLAS's column-major terms that is D (N x M, ld ldy) =
 * op(A) B with A = W seen as a K x N column-major matrix (transa = T) and
 * B = x seen as K x M (transb = N): the "TN" form, which is also the only
 * one Hopper's FP8 tensor-core path takes.
 *
 * BF16, F16 and F32 go to cuBLASLt with f32 accumulation and f32 output
 * (CUBLAS_COMPUTE_32F: no TF32 for F32 weights, so an F32 checkpoint gives
 * reference-grade logits). For BF16/F16 at M <= 8 (decode) we also have a
 * skinny kernel of our own: cuBLASLt's GEMV-shaped products reached only
 * 2.5-2.9 TB/s of an H200's 4.8 on Qwen3-14B's 5120-wide matrices, and a
 * decode step is nothing but those. Which one runs is measured, not
 * guessed: cu_gemm_tune() times both on the model's own matrices at load
 * and keeps, per shape, the largest M up to which ours wins.
 * FP8 E4M3 with 128x128 block scales:
 *   - M <= 8 (decode): our kernel, a warp per output row streaming 16 weight
 *     bytes per lane, dequantizing with the block scale on the fly, BF16
 *     activations. Memory-bound, which is all decode needs.
 *   - larger M on sm_90: cuBLASLt's block-scaled FP8 matmul (A scale mode
 *     BLK128x128_32F on the weight, B scale mode VEC128_32F on activations
 *     quantized here per 1x128 group). Scale layouts, as cuBLASLt and
 *     PyTorch's _scaled_mm define them: weight scales (ceil(N/128),
 *     ceil(K/128) padded to 4) row-major; activation scales (ceil(K/128), M)
 *     with M fastest.
 *   - otherwise (sm_80, no cuBLASLt algorithm, odd shapes): our tiled
 *     kernel, SIMT, correct but slow.
 *
 * Plans (descriptors + heuristic result) are cached per shape so a decode
 * step does no heuristic query after the first; cuBLASLt calls are graph-
 * capturable as long as the workspace stays fixed, which it does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.cuh"

extern "C" {
#include "quant.h"
}

#define GEMM_WORKSPACE (32u << 20)
#define GEMM_PLANS 96
#define SKINNY_PICKS 32 /* distinct BF16/F16 shapes a model has: 5 in Qwen3 */

/* What cu_gemm_tune measured for one shape: our skinny kernel runs for
 * M <= own_max_m (0: cuBLASLt always). */
struct skinny_pick {
    int dt, N, K, own_max_m;
    float lt_us[4], own_us[4]; /* per call at M = 1, 2, 4, 8: the report */
};

struct gemm_plan {
    int used;
    int kind; /* 0 plain, 1 FP8 block-scaled */
    int dt, M, N, K, ldy, align;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    int ok; /* 0: cuBLASLt has no algorithm for this shape */
};

struct cu_gemm {
    cublasLtHandle_t lt;
    cudaStream_t st;
    void *ws;
    int cc_major;
    enum cu_gemm_path force;
    int max_m, max_k;
    uint8_t *q8;   /* (max_m, max_k) e4m3 activations */
    float *q8s;    /* (ceil(max_k/128), max_m) their scales */
    struct gemm_plan plans[GEMM_PLANS];
    int next_evict;
    int lt_fp8; /* -1 not tried, 0 unavailable, 1 used */
    void *qpanel;        /* quantized prefill: dequantized rows, bf16 */
    size_t qpanel_bytes;
    struct skinny_pick picks[SKINNY_PICKS];
    int n_picks;
};

/* ---- kernels ---- */

/* FP8 x BF16 for M <= 8 (decode): a warp per output row, each lane taking
 * 16 weight bytes at a time, four pieces in flight (2 KB per warp; with two,
 * the H200 run moved 1.7-3.4 TB/s) so the loads, not their latency, set
 * the pace. 16 bytes never cross a scale
 * block (blocks are 128 wide), so a piece's 16 products are summed first
 * and scaled once; bytes become floats two at a time (cvt e4m3x2 -> f16x2,
 * exact). Weights stream past L1 (__ldcs): the activations stay there. */
#define SKINNY_MAX_M 8
template <int MM>
__device__ __forceinline__ void fp8_piece(uint4 wv, float s, const __nv_bfloat16 *__restrict__ X, int K, int k,
                                          float *acc)
{
    float wf[16];
    const __nv_fp8x2_storage_t *w2 = (const __nv_fp8x2_storage_t *)&wv;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(w2[j], __NV_E4M3);
        float2 f = __half22float2(*(const __half2 *)&hr);
        wf[2 * j] = f.x, wf[2 * j + 1] = f.y;
    }
#pragma unroll
    for (int m = 0; m < MM; m++) {
        const uint4 *xp = (const uint4 *)(X + (size_t)m * (size_t)K + k);
        uint4 x0 = xp[0], x1 = xp[1];
        const __nv_bfloat162 *a = (const __nv_bfloat162 *)&x0, *b = (const __nv_bfloat162 *)&x1;
        float t = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 fa = __bfloat1622float2(a[j]), fb = __bfloat1622float2(b[j]);
            t += wf[2 * j] * fa.x + wf[2 * j + 1] * fa.y;
            t += wf[8 + 2 * j] * fb.x + wf[8 + 2 * j + 1] * fb.y;
        }
        acc[m] += t * s;
    }
}

template <int MM>
__global__ void __launch_bounds__(256) fp8_skinny_kernel(const uint8_t *__restrict__ W, const float *__restrict__ S,
                                                         int sld, int br, int bc, int N, int K,
                                                         const __nv_bfloat16 *__restrict__ X, float *__restrict__ Y,
                                                         int ldy)
{
    int lane = threadIdx.x & 31, n = cu_skinny_row(N);
    if (n < 0)
        return;
    float acc[MM] = {};
    const uint8_t *wr = W + (size_t)n * (size_t)K;
    const float *sr = S + (size_t)(n / br) * (size_t)sld;
    int k = lane * 16;
    for (; k + 3 * 512 < K; k += 4 * 512) {
        uint4 w0 = __ldcs((const uint4 *)(wr + k));
        uint4 w1 = __ldcs((const uint4 *)(wr + k + 512));
        uint4 w2 = __ldcs((const uint4 *)(wr + k + 1024));
        uint4 w3 = __ldcs((const uint4 *)(wr + k + 1536));
        fp8_piece<MM>(w0, sr[k / bc], X, K, k, acc);
        fp8_piece<MM>(w1, sr[(k + 512) / bc], X, K, k + 512, acc);
        fp8_piece<MM>(w2, sr[(k + 1024) / bc], X, K, k + 1024, acc);
        fp8_piece<MM>(w3, sr[(k + 1536) / bc], X, K, k + 1536, acc);
    }
    for (; k < K; k += 512)
        fp8_piece<MM>(__ldcs((const uint4 *)(wr + k)), sr[k / bc], X, K, k, acc);
    cu_skinny_store<MM>(acc, MM, Y, ldy, n);
}

/* BF16 / F16 weights x activations of the same type for M <= 8: a warp per
 * output row, each lane loading 16 bytes (8 weights) at a time, four of
 * them in flight (2 KB per warp, 16 KB per block), so that enough loads
 * are outstanding per SM to reach HBM's bandwidth rather than its latency.
 * The weights stream past L1 (__ldcs); the activations, read by every
 * warp, stay in it. f32 accumulation, like cuBLASLt's compute type. */
__device__ __forceinline__ float2 half2_to_f2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 half2_to_f2(__half2 v) { return __half22float2(v); }

template <int MM, typename T2>
__device__ __forceinline__ void half_piece(uint4 wv, const uint4 *__restrict__ xp, int K8, float *acc)
{
    const T2 *w2 = (const T2 *)&wv;
    float2 wf[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        wf[j] = half2_to_f2(w2[j]);
#pragma unroll
    for (int m = 0; m < MM; m++) {
        uint4 xv = xp[(size_t)m * (size_t)K8];
        const T2 *x2 = (const T2 *)&xv;
        float t = acc[m];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 xf = half2_to_f2(x2[j]);
            t = fmaf(wf[j].x, xf.x, t);
            t = fmaf(wf[j].y, xf.y, t);
        }
        acc[m] = t;
    }
}

template <int MM, typename T2>
__global__ void __launch_bounds__(256) half_skinny_kernel(const uint4 *__restrict__ W, int N, int K8,
                                                          const uint4 *__restrict__ X, float *__restrict__ Y,
                                                          int ldy)
{
    int n = cu_skinny_row(N);
    if (n < 0)
        return;
    float acc[MM] = {};
    const uint4 *wr = W + (size_t)n * (size_t)K8;
    int k = threadIdx.x & 31;
    for (; k + 96 < K8; k += 128) {
        uint4 w0 = __ldcs(wr + k), w1 = __ldcs(wr + k + 32), w2 = __ldcs(wr + k + 64), w3 = __ldcs(wr + k + 96);
        half_piece<MM, T2>(w0, X + k, K8, acc);
        half_piece<MM, T2>(w1, X + k + 32, K8, acc);
        half_piece<MM, T2>(w2, X + k + 64, K8, acc);
        half_piece<MM, T2>(w3, X + k + 96, K8, acc);
    }
    for (; k < K8; k += 32)
        half_piece<MM, T2>(__ldcs(wr + k), X + k, K8, acc);
    cu_skinny_store<MM>(acc, MM, Y, ldy, n);
}

/* FP8 x BF16, any M: 64x64 output tile, K in steps of 32, 4x4 per thread. */
#define TB_M 64
#define TB_N 64
#define TB_K 32
__global__ void __launch_bounds__(256) fp8_tiled_kernel(const uint8_t *__restrict__ W,
                                                        const float *__restrict__ S, int sld, int br,
                                                        int bc, int N, int K,
                                                        const __nv_bfloat16 *__restrict__ X, int M,
                                                        float *__restrict__ Y, int ldy)
{
    __shared__ float As[TB_K][TB_M + 4];
    __shared__ float Bs[TB_K][TB_N + 4];
    int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    int m0 = blockIdx.y * TB_M, n0 = blockIdx.x * TB_N;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += TB_K) {
#pragma unroll
        for (int i = 0; i < (TB_M * TB_K) / 256; i++) {
            int e = tid + i * 256, r = e / TB_K, kk = e % TB_K;
            int m = m0 + r, n = n0 + r, k = k0 + kk;
            As[kk][r] = (m < M && k < K) ? __bfloat162float(X[(size_t)m * (size_t)K + k]) : 0.0f;
            Bs[kk][r] = (n < N && k < K)
                            ? cu_fp8(W[(size_t)n * (size_t)K + k]) * S[(size_t)(n / br) * (size_t)sld + k / bc]
                            : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < TB_K; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = As[kk][ty * 4 + i];
                b[i] = Bs[kk][tx * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int m = m0 + ty * 4 + i;
        if (m >= M)
            continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int n = n0 + tx * 4 + j;
            if (n < N)
                Y[(size_t)m * (size_t)ldy + n] = acc[i][j];
        }
    }
}

/* BF16 activations -> E4M3 per 1x128 group: warp per (row, group). Rows
 * M..Mp-1 (the padding cuBLASLt computes too) are zeros with scale 1. */
__global__ void quant_fp8_kernel(const __nv_bfloat16 *__restrict__ X, int M, int Mp, int K,
                                 uint8_t *__restrict__ Q, float *__restrict__ Sc)
{
    int nkb = (K + 127) / 128;
    long gw = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (gw >= (long)Mp * nkb)
        return;
    int m = (int)(gw / nkb), kb = (int)(gw % nkb);
    float v[4];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int k = kb * 128 + lane * 4 + j;
        v[j] = (m < M && k < K) ? __bfloat162float(X[(size_t)m * (size_t)K + k]) : 0.0f;
        amax = fmaxf(amax, fabsf(v[j]));
    }
    amax = cu_warp_max(amax);
    float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    float inv = 1.0f / scale;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int k = kb * 128 + lane * 4 + j;
        if (k < K)
            Q[(size_t)m * (size_t)K + k] =
                (uint8_t)__nv_cvt_float_to_fp8(v[j] * inv, __NV_SATFINITE, __NV_E4M3);
    }
    if (lane == 0)
        Sc[(size_t)kb * (size_t)Mp + m] = scale;
}

/* ---- launchers ---- */

static cudaDataType_t lt_type(enum model_dtype dt)
{
    switch (dt) {
    case MODEL_F32: return CUDA_R_32F;
    case MODEL_F16: return CUDA_R_16F;
    case MODEL_F8_E4M3: return CUDA_R_8F_E4M3;
    default: return CUDA_R_16BF;
    }
}

static int ptr_align(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    int a = 256;
    while (a > 1 && (u % (uintptr_t)a))
        a >>= 1;
    return a;
}

static void plan_release(struct gemm_plan *p)
{
    if (!p->used)
        return;
    if (p->desc)
        cublasLtMatmulDescDestroy(p->desc);
    if (p->a)
        cublasLtMatrixLayoutDestroy(p->a);
    if (p->b)
        cublasLtMatrixLayoutDestroy(p->b);
    if (p->d)
        cublasLtMatrixLayoutDestroy(p->d);
    memset(p, 0, sizeof *p);
}

/* Finds or builds the plan for this shape. For FP8 the scale pointers are
 * set per call by the caller (they differ per matrix). */
static int plan_get(struct cu_gemm *g, int kind, enum model_dtype dt, int M, int N, int K, int ldy,
                    int align, const float *a_scale, const float *b_scale, struct gemm_plan **out,
                    struct rl_err *err)
{
    for (int i = 0; i < GEMM_PLANS; i++) {
        struct gemm_plan *p = &g->plans[i];
        if (p->used && p->kind == kind && p->dt == (int)dt && p->M == M && p->N == N && p->K == K &&
            p->ldy == ldy && p->align == align) {
            *out = p;
            return 0;
        }
    }
    int slot = -1;
    for (int i = 0; i < GEMM_PLANS && slot < 0; i++)
        if (!g->plans[i].used)
            slot = i;
    if (slot < 0) { /* full: evict round-robin; prefill shapes come and go */
        slot = g->next_evict;
        g->next_evict = (g->next_evict + 1) % GEMM_PLANS;
        plan_release(&g->plans[slot]);
    }
    struct gemm_plan *p = &g->plans[slot];
    memset(p, 0, sizeof *p);
    int rc = 0;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cudaDataType_t at = lt_type(dt);
    cudaDataType_t bt = kind == 1 ? CUDA_R_8F_E4M3 : at;
    size_t ws = GEMM_WORKSPACE;
    uint32_t al = (uint32_t)align;
    int n_res = 0;
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    BLAS_CHECK_GOTO(err, rc, fail, cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    BLAS_CHECK_GOTO(err, rc, fail,
                    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    BLAS_CHECK_GOTO(err, rc, fail,
                    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (kind == 1) {
        int32_t am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        BLAS_CHECK_GOTO(err, rc, fail,
                        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am));
        BLAS_CHECK_GOTO(err, rc, fail,
                        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm));
        BLAS_CHECK_GOTO(err, rc, fail,
                        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                       &a_scale, sizeof a_scale));
        BLAS_CHECK_GOTO(err, rc, fail,
                        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                       &b_scale, sizeof b_scale));
    }
    BLAS_CHECK_GOTO(err, rc, fail, cublasLtMatrixLayoutCreate(&p->a, at, (uint64_t)K, (uint64_t)N, K));
    BLAS_CHECK_GOTO(err, rc, fail, cublasLtMatrixLayoutCreate(&p->b, bt, (uint64_t)K, (uint64_t)M, K));
    BLAS_CHECK_GOTO(err, rc, fail, cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, (uint64_t)N, (uint64_t)M, ldy));
    BLAS_CHECK_GOTO(err, rc, fail, cublasLtMatmulPreferenceCreate(&pref));
    BLAS_CHECK_GOTO(err, rc, fail,
                    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    /* The heuristic otherwise assumes 256-byte aligned operands; part
     * outputs (y + column offset) can be less aligned. */
    BLAS_CHECK_GOTO(err, rc, fail,
                    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
    BLAS_CHECK_GOTO(err, rc, fail,
                    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al));
    BLAS_CHECK_GOTO(err, rc, fail,
                    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
    BLAS_CHECK_GOTO(err, rc, fail,
                    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
    {
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(g->lt, p->desc, p->a, p->b, p->d, p->d, pref, 1,
                                                          &res, &n_res);
        /* NOT_SUPPORTED here means "no algorithm", a result we cache. */
        if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED) {
            rc = rl_errf(err, RL_EBACKEND, "cublasLtMatmulAlgoGetHeuristic (M=%d N=%d K=%d %s): %s (%d)", M,
                         N, K, model_dtype_name(dt), cublasLtGetStatusString(s), (int)s);
            goto fail;
        }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    p->used = 1;
    p->kind = kind;
    p->dt = (int)dt;
    p->M = M, p->N = N, p->K = K, p->ldy = ldy, p->align = align;
    p->ok = n_res > 0;
    if (p->ok)
        p->algo = res.algo;
    *out = p;
    return 0;
fail:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    p->used = 1; /* so plan_release frees what was made */
    plan_release(p);
    return rc;
}

static int lt_run(struct cu_gemm *g, struct gemm_plan *p, const void *w, const void *x, float *y,
                  struct rl_err *err)
{
    float alpha = 1.0f, beta = 0.0f;
    BLAS_CHECK(err, cublasLtMatmul(g->lt, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->d, y, p->d,
                                   &p->algo, g->ws, GEMM_WORKSPACE, g->st));
    return 0;
}

static int fp8_own(struct cu_gemm *g, const struct cu_mat *m, int M, const void *x, float *y, int ldy,
                   struct rl_err *err)
{
    const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
    if (M <= SKINNY_MAX_M) {
        dim3 grid(cu_blocks((size_t)m->rows, 8));
#define SK(MM)                                                                                             \
    fp8_skinny_kernel<MM><<<grid, 256, 0, g->st>>>((const uint8_t *)m->w, m->scale, m->scale_ld, m->br, m->bc, \
                                                   m->rows, m->cols, xb, y, ldy)
        switch (M) {
        case 1: SK(1); break;
        case 2: SK(2); break;
        case 3: SK(3); break;
        case 4: SK(4); break;
        case 5: SK(5); break;
        case 6: SK(6); break;
        case 7: SK(7); break;
        default: SK(8); break;
        }
#undef SK
        LAUNCH_CHECK(err, "fp8_skinny_kernel");
        return 0;
    }
    dim3 grid(cu_blocks((size_t)m->rows, TB_N), cu_blocks((size_t)M, TB_M));
    fp8_tiled_kernel<<<grid, 256, 0, g->st>>>((const uint8_t *)m->w, m->scale, m->scale_ld, m->br, m->bc,
                                              m->rows, m->cols, xb, M, y, ldy);
    LAUNCH_CHECK(err, "fp8_tiled_kernel");
    return 0;
}

/* Our BF16/F16 kernel takes whole 16-byte pieces: K a multiple of 8 and
 * 16-byte aligned rows and activations. */
static int half_own_ok(const struct cu_mat *m, int M, const void *x)
{
    return M >= 1 && M <= SKINNY_MAX_M && (m->dt == MODEL_BF16 || m->dt == MODEL_F16) && m->cols % 8 == 0 &&
           ptr_align(m->w) >= 16 && ptr_align(x) >= 16;
}

static int half_own(struct cu_gemm *g, const struct cu_mat *m, int M, const void *x, float *y, int ldy,
                    struct rl_err *err)
{
    dim3 grid(cu_blocks((size_t)m->rows, 8));
    const uint4 *W = (const uint4 *)m->w, *X = (const uint4 *)x;
    int K8 = m->cols / 8;
#define HK(MM, T2) half_skinny_kernel<MM, T2><<<grid, 256, 0, g->st>>>(W, m->rows, K8, X, y, ldy)
#define HKT(T2)                                                                                            \
    switch (M) {                                                                                           \
    case 1: HK(1, T2); break;                                                                              \
    case 2: HK(2, T2); break;                                                                              \
    case 3: HK(3, T2); break;                                                                              \
    case 4: HK(4, T2); break;                                                                              \
    case 5: HK(5, T2); break;                                                                              \
    case 6: HK(6, T2); break;                                                                              \
    case 7: HK(7, T2); break;                                                                              \
    default: HK(8, T2); break;                                                                             \
    }
    if (m->dt == MODEL_BF16) {
        HKT(__nv_bfloat162)
    } else {
        HKT(__half2)
    }
#undef HKT
#undef HK
    LAUNCH_CHECK(err, "half_skinny_kernel");
    return 0;
}

static const struct skinny_pick *pick_find(const struct cu_gemm *g, const struct cu_mat *m)
{
    for (int i = 0; i < g->n_picks; i++)
        if (g->picks[i].dt == (int)m->dt && g->picks[i].N == m->rows && g->picks[i].K == m->cols)
            return &g->picks[i];
    return NULL;
}

static int fp8_lt(struct cu_gemm *g, const struct cu_mat *m, int M, const void *x, float *y, int ldy,
                  int *done, struct rl_err *err)
{
    *done = 0;
    int Mp = (M + 15) / 16 * 16, K = m->cols;
    if (Mp > g->max_m || K > g->max_k)
        return rl_errf(err, RL_EINTERNAL, "fp8 gemm: %d x %d beyond the scratch (%d x %d)", Mp, K, g->max_m,
                       g->max_k);
    int align = ptr_align(y) < ptr_align(m->w) ? ptr_align(y) : ptr_align(m->w);
    struct gemm_plan *p;
    int rc = plan_get(g, 1, m->dt, Mp, m->rows, K, ldy, align, m->scale, g->q8s, &p, err);
    if (rc)
        return rc;
    if (!p->ok) {
        if (g->lt_fp8 < 0)
            g->lt_fp8 = 0;
        return 0;
    }
    long groups = (long)Mp * ((K + 127) / 128);
    quant_fp8_kernel<<<cu_blocks((size_t)groups, 8), 256, 0, g->st>>>((const __nv_bfloat16 *)x, M, Mp, K,
                                                                        g->q8, g->q8s);
    LAUNCH_CHECK(err, "quant_fp8_kernel");
    const float *as = m->scale, *bs = g->q8s;
    BLAS_CHECK(err, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &as, sizeof as));
    BLAS_CHECK(err, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bs, sizeof bs));
    if ((rc = lt_run(g, p, m->w, g->q8, y, err)))
        return rc;
    g->lt_fp8 = 1;
    *done = 1;
    return 0;
}

/* ---- entry points ---- */

int cu_gemm_create(struct cu_gemm **out, int max_m, int max_k, int cc_major, cudaStream_t st,
                   struct rl_err *err)
{
    *out = NULL;
    struct cu_gemm *g = (struct cu_gemm *)calloc(1, sizeof *g);
    if (!g)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    int rc = 0;
    g->st = st;
    g->cc_major = cc_major;
    g->lt_fp8 = -1;
    g->max_m = (max_m + 15) / 16 * 16;
    g->max_k = max_k;
    BLAS_CHECK_GOTO(err, rc, fail, cublasLtCreate(&g->lt));
    CU_CHECK_GOTO(err, rc, fail, cudaMalloc(&g->ws, GEMM_WORKSPACE));
    CU_CHECK_GOTO(err, rc, fail, cudaMalloc((void **)&g->q8, (size_t)g->max_m * (size_t)max_k));
    CU_CHECK_GOTO(err, rc, fail,
                  cudaMalloc((void **)&g->q8s, (size_t)g->max_m * (size_t)((max_k + 127) / 128) * 4));
    *out = g;
    return 0;
fail:
    cu_gemm_free(g);
    return rc;
}

void cu_gemm_free(struct cu_gemm *g)
{
    if (!g)
        return;
    for (int i = 0; i < GEMM_PLANS; i++)
        plan_release(&g->plans[i]);
    if (g->lt)
        cublasLtDestroy(g->lt);
    cudaFree(g->ws);
    cudaFree(g->q8);
    cudaFree(g->q8s);
    cudaFree(g->qpanel);
    free(g);
}

int cu_gemm_reserve_dequant(struct cu_gemm *g, size_t bytes, struct rl_err *err)
{
    if (bytes <= g->qpanel_bytes)
        return 0;
    cudaFree(g->qpanel);
    g->qpanel = NULL;
    g->qpanel_bytes = 0;
    CU_CHECK(err, cudaMalloc(&g->qpanel, bytes));
    g->qpanel_bytes = bytes;
    return 0;
}

/* Quantized weights: the skinny kernel for decode; above, chunks of rows
 * dequantized into the BF16 panel, each a cuBLASLt product into its
 * columns of y. */
static int q_run(struct cu_gemm *g, const struct cu_mat *m, int M, const void *x, float *y, int ldy,
                 struct rl_err *err)
{
    if (M <= SKINNY_MAX_M)
        return cu_qgemm_skinny(m, M, x, y, ldy, g->st, err);
    int chunk = (int)(g->qpanel_bytes / ((size_t)m->cols * 2)) / 16 * 16;
    if (chunk < 16)
        return rl_errf(err, RL_EINTERNAL, "quantized gemm %dx%d: no dequantization panel reserved", m->rows,
                       m->cols);
    for (int r0 = 0; r0 < m->rows; r0 += chunk) {
        int n = m->rows - r0 < chunk ? m->rows - r0 : chunk;
        struct cu_mat t;
        memset(&t, 0, sizeof t);
        t.dt = MODEL_BF16;
        t.rows = n;
        t.cols = m->cols;
        t.w = g->qpanel;
        int rc = cu_qgemm_dequant(m, r0, n, g->qpanel, g->st, err);
        if (!rc)
            rc = cu_gemm_run(g, &t, M, x, y + r0, ldy, err);
        if (rc)
            return rc;
    }
    return 0;
}

void cu_gemm_force(struct cu_gemm *g, enum cu_gemm_path p) { g->force = p; }

const char *cu_gemm_fp8_path(const struct cu_gemm *g)
{
    if (g->cc_major < 9)
        return "fp8 via own dequant kernels (no FP8 tensor cores before sm_90)";
    return g->lt_fp8 == 1   ? "fp8: own kernel M<=8, cuBLASLt block-scaled above"
           : g->lt_fp8 == 0 ? "fp8: own kernels (cuBLASLt offered no block-scaled algorithm)"
                            : "fp8: own kernel M<=8, cuBLASLt block-scaled above (untried)";
}

int cu_gemm_run(struct cu_gemm *g, const struct cu_mat *m, int M, const void *x, float *y, int ldy,
                struct rl_err *err)
{
    if (M <= 0)
        return 0;
    if (quant_is_quantized(m->dt))
        return q_run(g, m, M, x, y, ldy, err);
    if (m->dt == MODEL_F8_E4M3) {
        int lt_ok = g->cc_major >= 9 && m->br == 128 && m->bc == 128 && m->cols % 128 == 0 &&
                    m->rows % 16 == 0 && ldy % 16 == 0;
        int want_lt = g->force == CU_GEMM_LT || (g->force == CU_GEMM_AUTO && M > SKINNY_MAX_M);
        if (g->force == CU_GEMM_LT && !lt_ok)
            return rl_errf(err, RL_EUNSUPPORTED, "fp8 gemm %dx%d: cuBLASLt block-scaled path needs sm_90 and "
                           "128-multiple shapes", m->rows, m->cols);
        if (want_lt && lt_ok) {
            int done, rc = fp8_lt(g, m, M, x, y, ldy, &done, err);
            if (rc || done)
                return rc;
            if (g->force == CU_GEMM_LT)
                return rl_errf(err, RL_EUNSUPPORTED, "cuBLASLt has no block-scaled FP8 algorithm for %dx%dx%d",
                               M, m->rows, m->cols);
        }
        return fp8_own(g, m, M, x, y, ldy, err);
    }
    if (g->force != CU_GEMM_LT && half_own_ok(m, M, x)) {
        const struct skinny_pick *pk = g->force == CU_GEMM_OWN ? NULL : pick_find(g, m);
        if (g->force == CU_GEMM_OWN || (pk && M <= pk->own_max_m))
            return half_own(g, m, M, x, y, ldy, err);
    }
    int align = ptr_align(y);
    if (ptr_align(x) < align)
        align = ptr_align(x);
    if (ptr_align(m->w) < align)
        align = ptr_align(m->w);
    struct gemm_plan *p;
    int rc = plan_get(g, 0, m->dt, M, m->rows, m->cols, ldy, align, NULL, NULL, &p, err);
    if (rc)
        return rc;
    if (!p->ok)
        return rl_errf(err, RL_EUNSUPPORTED, "cuBLASLt has no algorithm for %s %dx%dx%d (ldy %d, align %d)",
                       model_dtype_name(m->dt), M, m->rows, m->cols, ldy, align);
    return lt_run(g, p, m->w, x, y, err);
}

int cu_linear_run(struct cu_gemm *g, const struct cu_linear *l, int M, const void *x, float *y,
                  struct rl_err *err)
{
    for (int i = 0; i < l->n; i++) {
        int rc = cu_gemm_run(g, &l->m[i], M, x, y + l->off[i], l->rows, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- choosing the decode kernel by measurement ---- */

/* Microseconds per product: reps passes over ms (n matrices of one shape),
 * M rows, path forced. The caller warmed both paths up (plans made). */
static int time_products(struct cu_gemm *g, const struct cu_mat *const *ms, int n, int M, const void *x, float *y,
                         int reps, enum cu_gemm_path path, float *us, struct rl_err *err)
{
    cudaEvent_t e0 = NULL, e1 = NULL;
    float t = 0;
    int rc = 0;
    enum cu_gemm_path was = g->force;
    g->force = path;
    CU_CHECK_GOTO(err, rc, out, cudaEventCreate(&e0));
    CU_CHECK_GOTO(err, rc, out, cudaEventCreate(&e1));
    for (int i = 0; i < n && !rc; i++) /* warm-up: plans, first-touch */
        rc = cu_gemm_run(g, ms[i], M, x, y, ms[i]->rows, err);
    if (rc)
        goto out;
    CU_CHECK_GOTO(err, rc, out, cudaEventRecord(e0, g->st));
    for (int r = 0; r < reps && !rc; r++)
        for (int i = 0; i < n && !rc; i++)
            rc = cu_gemm_run(g, ms[i], M, x, y, ms[i]->rows, err);
    if (rc)
        goto out;
    CU_CHECK_GOTO(err, rc, out, cudaEventRecord(e1, g->st));
    CU_CHECK_GOTO(err, rc, out, cudaEventSynchronize(e1));
    CU_CHECK_GOTO(err, rc, out, cudaEventElapsedTime(&t, e0, e1));
    *us = t * 1e3f / (float)(reps * n);
out:
    g->force = was;
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    return rc;
}

int cu_gemm_tune(struct cu_gemm *g, const struct cu_mat *const *ms, int n, struct rl_err *err)
{
    if (n < 1 || g->force != CU_GEMM_AUTO || g->n_picks == SKINNY_PICKS)
        return 0;
    const struct cu_mat *m0 = ms[0];
    if ((m0->dt != MODEL_BF16 && m0->dt != MODEL_F16) || m0->cols % 8 || pick_find(g, m0))
        return 0;
    for (int i = 1; i < n; i++)
        if (ms[i]->dt != m0->dt || ms[i]->rows != m0->rows || ms[i]->cols != m0->cols)
            return rl_errf(err, RL_EINVAL, "gemm tune: matrices of different shapes");
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CU_CHECK(err, cudaStreamIsCapturing(g->st, &cs));
    if (cs != cudaStreamCaptureStatusNone)
        return 0; /* no timing inside a capture: cuBLASLt for this shape */
    struct skinny_pick pk;
    memset(&pk, 0, sizeof pk);
    pk.dt = (int)m0->dt, pk.N = m0->rows, pk.K = m0->cols;
    void *x = NULL;
    float *y = NULL;
    int rc = 0;
    /* the model's own matrices, one pass over all of them per rep, so the
     * weights come from HBM as in a step, not from L2 */
    int reps = n >= 8 ? 2 : 16 / n + 1;
    static const int Ms[4] = {1, 2, 4, 8};
    CU_CHECK_GOTO(err, rc, out, cudaMalloc(&x, (size_t)SKINNY_MAX_M * (size_t)m0->cols * 2));
    CU_CHECK_GOTO(err, rc, out, cudaMalloc((void **)&y, (size_t)SKINNY_MAX_M * (size_t)m0->rows * 4));
    if ((rc = cu_fill_random(x, (size_t)SKINNY_MAX_M * (size_t)m0->cols, m0->dt, 1.0f, 11, g->st, err)))
        goto out;
    for (int i = 0; i < 4; i++) {
        if ((rc = time_products(g, ms, n, Ms[i], x, y, reps, CU_GEMM_LT, &pk.lt_us[i], err)) ||
            (rc = time_products(g, ms, n, Ms[i], x, y, reps, CU_GEMM_OWN, &pk.own_us[i], err)))
            goto out;
    }
    /* ours for every M up to the last measured one of an unbroken run of
     * wins from M = 1 */
    for (int i = 0; i < 4 && pk.own_us[i] < pk.lt_us[i]; i++)
        pk.own_max_m = Ms[i];
    g->picks[g->n_picks++] = pk;
out:
    cudaFree(x);
    cudaFree(y);
    return rc;
}

int cu_gemm_tune_report(const struct cu_gemm *g, char *buf, size_t cap)
{
    size_t at = 0;
    int w = snprintf(buf, cap, "[");
    at = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < g->n_picks && at < cap; i++) {
        const struct skinny_pick *p = &g->picks[i];
        double bytes = (double)p->N * p->K * 2;
        w = snprintf(buf + at, cap - at,
                     "%s{\"dtype\":\"%s\",\"N\":%d,\"K\":%d,\"own_max_m\":%d,\"M\":[1,2,4,8],"
                     "\"cublaslt_us\":[%.2f,%.2f,%.2f,%.2f],\"own_us\":[%.2f,%.2f,%.2f,%.2f],"
                     "\"cublaslt_gb_s_m1\":%.0f,\"own_gb_s_m1\":%.0f}",
                     i ? "," : "", model_dtype_name((enum model_dtype)p->dt), p->N, p->K, p->own_max_m,
                     p->lt_us[0], p->lt_us[1], p->lt_us[2], p->lt_us[3], p->own_us[0], p->own_us[1], p->own_us[2],
                     p->own_us[3], bytes / (p->lt_us[0] * 1e3 + 1e-9), bytes / (p->own_us[0] * 1e3 + 1e-9));
        at += w > 0 ? (size_t)w : 0;
    }
    if (at < cap)
        at += (size_t)snprintf(buf + at, cap - at, "]");
    return g->n_picks;
}

int cu_gemm_n_own(const struct cu_gemm *g, int *n_tuned)
{
    int k = 0;
    *n_tuned = g->n_picks;
    for (int i = 0; i < g->n_picks; i++)
        k += g->picks[i].own_max_m > 0;
    return k;
}

/* ---- test entry point ---- */

extern "C" {
#include "cuda_backend.h"
}

extern "C" int cuda_test_gemm(int M, int N, int K, enum model_dtype dt, const void *w, const float *scale, int br,
                              int bc, const float *x, float *y, int path, struct rl_err *err)
{
    struct cudaDeviceProp p;
    CU_CHECK(err, cudaGetDeviceProperties(&p, 0));
    struct cu_gemm *g = NULL;
    struct cu_mat m;
    memset(&m, 0, sizeof m);
    m.dt = dt;
    m.rows = N;
    m.cols = K;
    size_t es = dt == MODEL_F32 ? 4 : dt == MODEL_F8_E4M3 ? 1 : 2;
    void *dx = NULL, *dxa = NULL, *dy = NULL;
    float *hs = NULL;
    int rc;
    if ((rc = cu_test_up(&m.w, w, (size_t)N * (size_t)K * es, err)))
        goto out;
    if (dt == MODEL_F8_E4M3) {
        m.br = br, m.bc = bc;
        int nkb = (K + bc - 1) / bc, nrb = (N + br - 1) / br;
        m.scale_ld = (nkb + 3) / 4 * 4;
        hs = (float *)calloc((size_t)nrb * (size_t)m.scale_ld, 4);
        if (!hs) {
            rc = rl_errf(err, RL_ENOMEM, "out of memory");
            goto out;
        }
        for (int r = 0; r < nrb; r++)
            memcpy(hs + (size_t)r * (size_t)m.scale_ld, scale + (size_t)r * (size_t)nkb, (size_t)nkb * 4);
        if ((rc = cu_test_up((void **)&m.scale, hs, (size_t)nrb * (size_t)m.scale_ld * 4, err)))
            goto out;
    }
    if ((rc = cu_test_up(&dx, x, (size_t)M * (size_t)K * 4, err)) ||
        (rc = cu_test_up(&dxa, NULL, (size_t)M * (size_t)K * 4, err)) ||
        (rc = cu_test_up(&dy, NULL, (size_t)(M + 16) * (size_t)N * 4, err)) ||
        (rc = cu_cast((const float *)dx, (size_t)M * (size_t)K, dxa, cu_act_for(dt), 0, err)) ||
        (rc = cu_gemm_create(&g, M + 16, K, p.major, 0, err)))
        goto out;
    cu_gemm_force(g, (enum cu_gemm_path)path);
    if ((rc = cu_gemm_run(g, &m, M, dxa, (float *)dy, N, err)))
        goto out;
    CU_CHECK_GOTO(err, rc, out, cudaMemcpy(y, dy, (size_t)M * (size_t)N * 4, cudaMemcpyDeviceToHost));
out:
    cu_gemm_free(g);
    cudaFree(m.w), cudaFree(m.scale), cudaFree(dx), cudaFree(dxa), cudaFree(dy);
    free(hs);
    return rc;
}
