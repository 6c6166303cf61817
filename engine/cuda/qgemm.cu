/* engine/cuda/qgemm.cu - products with quantized weights (GGUF's twelve
 * block formats, engine/quant.h; AWQ INT4) on the device, in their own
 * bytes.
 *
 * Layouts are the CPU's NATIVE rows (engine/cpu/qgemm.h): GGUF's blocks
 * row after row, exactly as the file holds them, and AWQ converted at
 * upload into rows of (f16 scale, zero, G/2 bytes of nibbles) per group
 * (cpu_q_awq_convert), since AutoAWQ's transposed int32 packing is no use
 * to a row kernel. Every kernel reads weights through dq8(), which turns
 * 8 consecutive elements of a row into floats following the formats'
 * definitions (engine/quant.c), so all paths agree on what a weight is.
 *
 *   Decode (M <= 8, cu_qgemm_skinny): a warp per output row; each lane
 *     dequantizes 8 weights at a time (a warp covers 256 consecutive
 *     elements per step, one K-quant super-block) and multiplies them with
 *     the BF16 activations of every row of the batch. Memory-bound like the
 *     FP8 skinny kernel it is modelled on.
 *   Prefill (gemm.cu, M > 8): rows of the matrix are dequantized in chunks
 *     into a BF16 scratch panel reserved at load (cu_qgemm_dequant) and
 *     multiplied by cuBLASLt on tensor cores; the dequantization reads each
 *     weight once per step, next to an M-row product.
 *   Embedding rows (cu_q_embed) dequantize to f32.
 * Activations are BF16 as for every non-F32 matrix of this backend; no
 * activation quantization (the GPU has the bandwidth to keep them). */
#include "ops.cuh"

extern "C" {
#include "cpu/qgemm.h"
#include "quant.h"
}

__device__ __forceinline__ float q_h2f(const uint8_t *p)
{
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    return __half2float(__ushort_as_half(h));
}

/* The 6-bit scale and min of sub-block j of a Q4_K / Q5_K block
 * (quant_k_scale_min). */
__device__ __forceinline__ void q_k_sm(const uint8_t *q, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* IQ4_NL's and IQ4_XS's levels (QUANT_IQ4_VALUES) */
__constant__ int8_t q_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

/* The 32-element formats: byte offsets of qs and of qh (the fifth bits);
 * element c of a block is the low nibble of qs[c] (c < 16) or the high
 * nibble of qs[c - 16]. */
template <int DT> __device__ __forceinline__ void dq8_32(const uint8_t *b, int c, float w[8])
{
    const int qo = DT == MODEL_Q4_1 ? 4 : DT == MODEL_Q5_0 ? 6 : DT == MODEL_Q5_1 ? 8 : 2;
    const int ho = DT == MODEL_Q5_0 ? 2 : 4;
    float d = q_h2f(b), m = DT == MODEL_Q4_1 || DT == MODEL_Q5_1 ? q_h2f(b + 2) : 0.0f;
    const uint8_t *qs = b + qo + (c & 15);
    uint32_t h = 0;
    if (DT == MODEL_Q5_0 || DT == MODEL_Q5_1)
        h = (uint32_t)b[ho] | (uint32_t)b[ho + 1] << 8 | (uint32_t)b[ho + 2] << 16 | (uint32_t)b[ho + 3] << 24;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int q = c < 16 ? qs[i] & 0xF : qs[i] >> 4;
        if (DT == MODEL_IQ4_NL) {
            w[i] = d * (float)q_iq4_values[q];
            continue;
        }
        if (DT == MODEL_Q5_0 || DT == MODEL_Q5_1)
            q |= (int)((h >> (c + i)) & 1) << 4;
        if (DT == MODEL_Q4_0)
            w[i] = (float)(q - 8) * d;
        else if (DT == MODEL_Q5_0)
            w[i] = (float)(q - 16) * d;
        else
            w[i] = (float)q * d + m;
    }
}

/* Elements e .. e + 7 (e % 8 == 0) of one row of format DT into w. G: the
 * AWQ group. */
template <int DT> __device__ __forceinline__ void dq8(const uint8_t *row, int G, int e, float w[8])
{
    if (DT == MODEL_Q8_0) {
        const uint8_t *b = row + (size_t)(e / 32) * 34;
        float d = q_h2f(b);
        const int8_t *q = (const int8_t *)(b + 2 + e % 32);
#pragma unroll
        for (int i = 0; i < 8; i++)
            w[i] = d * (float)q[i];
    } else if (DT == MODEL_Q4_K || DT == MODEL_Q5_K) {
        const int bb = DT == MODEL_Q4_K ? 144 : 176;
        const uint8_t *b = row + (size_t)(e / 256) * bb;
        int c = e % 256, j = c / 32, l = c % 32, sc, mn;
        q_k_sm(b + 4, j, &sc, &mn);
        float d1 = q_h2f(b) * (float)sc, m1 = q_h2f(b + 2) * (float)mn;
        const uint8_t *qs = b + (DT == MODEL_Q4_K ? 16 : 48) + 32 * (j / 2) + l;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int v = j % 2 ? qs[i] >> 4 : qs[i] & 0xF;
            if (DT == MODEL_Q5_K)
                v += ((b[16 + l + i] >> j) & 1) << 4;
            w[i] = d1 * (float)v - m1;
        }
    } else if (DT == MODEL_Q6_K) {
        const uint8_t *b = row + (size_t)(e / 256) * 210;
        int c = e % 256, h = c / 128, k = (c % 128) / 32, l = c % 32;
        const uint8_t *ql = b + 64 * h + l + 32 * (k & 1), *qh = b + 128 + 32 * h + l;
        float d = q_h2f(b + 208) * (float)(int8_t)b[192 + 8 * h + l / 16 + 2 * k];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int lo = k >= 2 ? ql[i] >> 4 : ql[i] & 0xF;
            int q = (lo | (((qh[i] >> (2 * k)) & 3) << 4)) - 32;
            w[i] = d * (float)q;
        }
    } else if (DT == MODEL_Q4_0 || DT == MODEL_Q4_1 || DT == MODEL_Q5_0 || DT == MODEL_Q5_1 ||
               DT == MODEL_IQ4_NL) {
        const int bb = DT == MODEL_Q4_1 ? 20 : DT == MODEL_Q5_0 ? 22 : DT == MODEL_Q5_1 ? 24 : 18;
        dq8_32<DT>(row + (size_t)(e / 32) * bb, e % 32, w);
    } else if (DT == MODEL_Q2_K || DT == MODEL_Q3_K) {
        /* 8 elements share h, k and a sub-block of 16 (quant.h) */
        const uint8_t *b = row + (size_t)(e / 256) * (DT == MODEL_Q2_K ? 84 : 110);
        int c = e % 256, h = c / 128, k = (c % 128) / 32, l = c % 32;
        const uint8_t *qs = b + (DT == MODEL_Q2_K ? 16 : 32) + 32 * h + l;
        if (DT == MODEL_Q2_K) {
            int sc = b[c / 16];
            float dl = q_h2f(b + 80) * (float)(sc & 0xF), ml = q_h2f(b + 82) * (float)(sc >> 4);
#pragma unroll
            for (int i = 0; i < 8; i++)
                w[i] = dl * (float)((qs[i] >> (2 * k)) & 3) - ml;
        } else {
            const uint8_t *sc = b + 96, *hm = b + l;
            int s = c / 16, lo = s < 8 ? sc[s] & 0xF : sc[s - 8] >> 4;
            float dl = q_h2f(b + 108) * (float)((lo | ((sc[8 + s % 4] >> (2 * (s / 4))) & 3) << 4) - 32);
#pragma unroll
            for (int i = 0; i < 8; i++)
                w[i] = dl * (float)(((qs[i] >> (2 * k)) & 3) - ((hm[i] >> (4 * h + k)) & 1 ? 0 : 4));
        }
    } else if (DT == MODEL_IQ4_XS) {
        const uint8_t *b = row + (size_t)(e / 256) * 136;
        int c = e % 256, j = c / 32, l = c % 32;
        int sh = b[2] | b[3] << 8;
        int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) | ((sh >> (2 * j)) & 3) << 4;
        float dl = q_h2f(b) * (float)(ls - 32);
        const uint8_t *qs = b + 8 + 16 * j + (l & 15);
#pragma unroll
        for (int i = 0; i < 8; i++)
            w[i] = dl * (float)q_iq4_values[l < 16 ? qs[i] & 0xF : qs[i] >> 4];
    } else { /* AWQ rows */
        const uint8_t *g = row + (size_t)(e / G) * (size_t)(4 + G / 2);
        float s = q_h2f(g);
        int z = g[2];
        const uint8_t *p = g + 4 + (e % G) / 2;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[2 * i] = (float)((p[i] & 0xF) - z) * s;
            w[2 * i + 1] = (float)((p[i] >> 4) - z) * s;
        }
    }
}

#define Q_SKINNY_MAX_M 8

/* acc[m] += w . x[m][e .. e + 7] for the M activation rows. */
__device__ __forceinline__ void q_skinny_step(const float w[8], const __nv_bfloat16 *__restrict__ X, int K, int e,
                                              int M, float *acc)
{
#pragma unroll
    for (int m = 0; m < Q_SKINNY_MAX_M; m++) {
        if (m < M) {
            uint4 xv = *(const uint4 *)(X + (size_t)m * (size_t)K + e);
            const __nv_bfloat16 *a = (const __nv_bfloat16 *)&xv;
            float t = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++)
                t += w[i] * __bfloat162float(a[i]);
            acc[m] += t;
        }
    }
}

template <int DT>
__global__ void q_skinny_kernel(const uint8_t *__restrict__ W, size_t rb, int G, int N, int K,
                                const __nv_bfloat16 *__restrict__ X, int M, float *__restrict__ Y, int ldy)
{
    int lane = threadIdx.x & 31, n = cu_skinny_row(N);
    if (n < 0)
        return;
    float acc[Q_SKINNY_MAX_M] = {};
    const uint8_t *row = W + (size_t)n * rb;
    int e = lane * 8;
    /* four steps' weights dequantized before any is used, so that their
     * loads are in flight together (one step's bytes, ~150-270 a warp, are
     * too few to cover the memory's latency); same sums in the same order */
    for (; e + 3 * 256 < K; e += 4 * 256) {
        float w[4][8];
#pragma unroll
        for (int u = 0; u < 4; u++)
            dq8<DT>(row, G, e + u * 256, w[u]);
#pragma unroll
        for (int u = 0; u < 4; u++)
            q_skinny_step(w[u], X, K, e + u * 256, M, acc);
    }
    for (; e < K; e += 256) {
        float w[8];
        dq8<DT>(row, G, e, w);
        q_skinny_step(w, X, K, e, M, acc);
    }
    cu_skinny_store<Q_SKINNY_MAX_M>(acc, M, Y, ldy, n);
}

/* Rows r0 .. r0 + nrows - 1 into out (nrows, K) bf16: a thread per 8. */
template <int DT>
__global__ void q_dequant_kernel(const uint8_t *__restrict__ W, size_t rb, int G, int K, int r0, int nrows,
                                 __nv_bfloat16 *__restrict__ out)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, per = (size_t)K / 8;
    if (i >= (size_t)nrows * per)
        return;
    int r = (int)(i / per), e = (int)(i % per) * 8;
    float w[8];
    dq8<DT>(W + (size_t)(r0 + r) * rb, G, e, w);
    __align__(16) __nv_bfloat16 o[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
        o[k] = __float2bfloat16_rn(w[k]);
    *(uint4 *)(out + (size_t)r * (size_t)K + e) = *(const uint4 *)o;
}

template <int DT>
__global__ void q_embed_kernel(const uint8_t *__restrict__ W, size_t rb, int G, int K,
                               const int32_t *__restrict__ tokens, float *__restrict__ x)
{
    const uint8_t *row = W + (size_t)tokens[blockIdx.x] * rb;
    float *o = x + (size_t)blockIdx.x * (size_t)K;
    for (int e = threadIdx.x * 8; e < K; e += blockDim.x * 8) {
        float w[8];
        dq8<DT>(row, G, e, w);
#pragma unroll
        for (int k = 0; k < 8; k++)
            o[e + k] = w[k];
    }
}

/* ---- launchers ---- */

static size_t q_rb(const struct cu_mat *m) { return cpu_q_row_bytes(m->dt, m->cols, m->group); }

#define Q_DISPATCH(dt, LAUNCH)                                                                     \
    switch (dt) {                                                                                  \
    case MODEL_Q8_0: LAUNCH(MODEL_Q8_0); break;                                                    \
    case MODEL_Q4_K: LAUNCH(MODEL_Q4_K); break;                                                    \
    case MODEL_Q5_K: LAUNCH(MODEL_Q5_K); break;                                                    \
    case MODEL_Q6_K: LAUNCH(MODEL_Q6_K); break;                                                    \
    case MODEL_AWQ4: LAUNCH(MODEL_AWQ4); break;                                                    \
    case MODEL_Q4_0: LAUNCH(MODEL_Q4_0); break;                                                    \
    case MODEL_Q4_1: LAUNCH(MODEL_Q4_1); break;                                                    \
    case MODEL_Q5_0: LAUNCH(MODEL_Q5_0); break;                                                    \
    case MODEL_Q5_1: LAUNCH(MODEL_Q5_1); break;                                                    \
    case MODEL_IQ4_NL: LAUNCH(MODEL_IQ4_NL); break;                                                \
    case MODEL_Q2_K: LAUNCH(MODEL_Q2_K); break;                                                    \
    case MODEL_Q3_K: LAUNCH(MODEL_Q3_K); break;                                                    \
    case MODEL_IQ4_XS: LAUNCH(MODEL_IQ4_XS); break;                                                \
    default: return rl_errf(err, RL_EINTERNAL, "quantized gemm: %s is not a quantized format",    \
                            model_dtype_name(dt));                                                 \
    }

int cu_qgemm_skinny(const struct cu_mat *m, int M, const void *x, float *y, int ldy, cudaStream_t st,
                    struct rl_err *err)
{
    if (M > Q_SKINNY_MAX_M)
        return rl_errf(err, RL_EINTERNAL, "quantized skinny gemm: M = %d > %d", M, Q_SKINNY_MAX_M);
    const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
    size_t rb = q_rb(m);
#define L(D)                                                                                       \
    q_skinny_kernel<D><<<cu_blocks((size_t)m->rows, 8), 256, 0, st>>>((const uint8_t *)m->w, rb, m->group, \
                                                                     m->rows, m->cols, xb, M, y, ldy)
    Q_DISPATCH(m->dt, L)
#undef L
    LAUNCH_CHECK(err, "q_skinny_kernel");
    return 0;
}

int cu_qgemm_dequant(const struct cu_mat *m, int r0, int nrows, void *out, cudaStream_t st, struct rl_err *err)
{
    size_t rb = q_rb(m), n = (size_t)nrows * (size_t)(m->cols / 8);
    __nv_bfloat16 *o = (__nv_bfloat16 *)out;
#define L(D)                                                                                       \
    q_dequant_kernel<D><<<cu_blocks(n, 256), 256, 0, st>>>((const uint8_t *)m->w, rb, m->group, m->cols, r0, \
                                                           nrows, o)
    Q_DISPATCH(m->dt, L)
#undef L
    LAUNCH_CHECK(err, "q_dequant_kernel");
    return 0;
}

int cu_q_embed(const struct cu_mat *e, const int32_t *tokens, int n, float *x, cudaStream_t st,
               struct rl_err *err)
{
    if (n <= 0)
        return 0;
    size_t rb = q_rb(e);
#define L(D) q_embed_kernel<D><<<n, 128, 0, st>>>((const uint8_t *)e->w, rb, e->group, e->cols, tokens, x)
    Q_DISPATCH(e->dt, L)
#undef L
    LAUNCH_CHECK(err, "q_embed_kernel");
    return 0;
}

/* ---- test entry point ---- */

extern "C" {
#include "cuda_backend.h"
}

extern "C" int cuda_test_qgemm(int M, int N, int K, enum model_dtype dt, int group, const void *w,
                               const float *x, float *y, struct rl_err *err)
{
    struct cudaDeviceProp p;
    CU_CHECK(err, cudaGetDeviceProperties(&p, 0));
    if (!cpu_q_supported(dt, N, K, group) || K % 8)
        return rl_errf(err, RL_EINVAL, "cuda_test_qgemm: %s %dx%d (group %d) is not a supported shape",
                       model_dtype_name(dt), N, K, group);
    struct cu_gemm *g = NULL;
    struct cu_mat m;
    memset(&m, 0, sizeof m);
    m.dt = dt;
    m.rows = N;
    m.cols = K;
    m.group = dt == MODEL_AWQ4 ? group : 0;
    void *dx = NULL, *dxa = NULL, *dy = NULL;
    int rc;
    if ((rc = cu_test_up(&m.w, w, cpu_q_row_bytes(dt, K, m.group) * (size_t)N, err)) ||
        (rc = cu_test_up(&dx, x, (size_t)M * (size_t)K * 4, err)) ||
        (rc = cu_test_up(&dxa, NULL, (size_t)M * (size_t)K * 2, err)) ||
        (rc = cu_test_up(&dy, NULL, (size_t)(M + 16) * (size_t)N * 4, err)) ||
        (rc = cu_cast((const float *)dx, (size_t)M * (size_t)K, dxa, CU_ACT_BF16, 0, err)) ||
        (rc = cu_gemm_create(&g, M + 16, K, p.major, 0, err)))
        goto out;
    /* a small scratch, so the prefill path runs in several chunks */
    if ((rc = cu_gemm_reserve_dequant(g, (size_t)64 * (size_t)K * 2, err)))
        goto out;
    if ((rc = cu_gemm_run(g, &m, M, dxa, (float *)dy, N, err)))
        goto out;
    CU_CHECK_GOTO(err, rc, out, cudaMemcpy(y, dy, (size_t)M * (size_t)N * 4, cudaMemcpyDeviceToHost));
out:
    cu_gemm_free(g);
    cudaFree(m.w), cudaFree(dx), cudaFree(dxa), cudaFree(dy);
    return rc;
}
