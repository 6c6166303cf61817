/* engine/cuda/act.cu - elementwise ops: SwiGLU over the fused gate/up
 * output, dtype casts for matrix inputs, the greedy argmax behind the
 * on-device sampling hook, and the random fills the benchmark uses for its
 * device-generated weights. SwiGLU matches the CPU: g / (1 + exp(-g)) * u
 * with the accurate expf (no fast-math in this build). */
#include "ops.cuh"

template <typename OT>
__global__ void swiglu_kernel(const float *__restrict__ gu, int M, int I, OT *__restrict__ h)
{
    size_t n = (size_t)M * (size_t)I;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t m = e / (size_t)I, i = e % (size_t)I;
        float g = gu[m * 2 * (size_t)I + i], u = gu[m * 2 * (size_t)I + (size_t)I + i];
        h[e] = cu_from<OT>(g / (1.0f + expf(-g)) * u);
    }
}

static unsigned grid_for(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b > 65535 ? 65535 : b < 1 ? 1 : b);
}

int cu_swiglu(const float *gu, int M, int inter, void *h, enum cu_act ht, cudaStream_t st, struct rl_err *err)
{
    if (M <= 0)
        return 0;
    unsigned g = grid_for((size_t)M * (size_t)inter);
    switch (ht) {
    case CU_ACT_F32: swiglu_kernel<float><<<g, 256, 0, st>>>(gu, M, inter, (float *)h); break;
    case CU_ACT_BF16: swiglu_kernel<__nv_bfloat16><<<g, 256, 0, st>>>(gu, M, inter, (__nv_bfloat16 *)h); break;
    case CU_ACT_F16: swiglu_kernel<__half><<<g, 256, 0, st>>>(gu, M, inter, (__half *)h); break;
    }
    LAUNCH_CHECK(err, "swiglu_kernel");
    return 0;
}

template <typename OT> __global__ void cast_kernel(const float *__restrict__ x, size_t n, OT *__restrict__ y)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        y[e] = cu_from<OT>(x[e]);
}

int cu_cast(const float *x, size_t n, void *y, enum cu_act yt, cudaStream_t st, struct rl_err *err)
{
    if (!n)
        return 0;
    unsigned g = grid_for(n);
    switch (yt) {
    case CU_ACT_F32: cast_kernel<float><<<g, 256, 0, st>>>(x, n, (float *)y); break;
    case CU_ACT_BF16: cast_kernel<__nv_bfloat16><<<g, 256, 0, st>>>(x, n, (__nv_bfloat16 *)y); break;
    case CU_ACT_F16: cast_kernel<__half><<<g, 256, 0, st>>>(x, n, (__half *)y); break;
    }
    LAUNCH_CHECK(err, "cast_kernel");
    return 0;
}

/* (best, bid) across the 32 lanes of a warp: the largest value, the lowest
 * index among equal ones, in every lane. */
__device__ __forceinline__ void warp_argmax(float &best, int &bid)
{
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bid, o);
        if (ov > best || (ov == best && oi < bid)) {
            best = ov;
            bid = oi;
        }
    }
}

/* One block per row; ties go to the lower id, NaN never wins. */
__global__ void argmax_kernel(const float *__restrict__ logits, int V, int32_t *__restrict__ ids)
{
    __shared__ float bv[32];
    __shared__ int bi[32];
    const float *r = logits + (size_t)blockIdx.x * (size_t)V;
    float best = -INFINITY;
    int bid = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float v = r[i];
        if (v > best) { /* strided ascending scan: the first max a thread sees is its lowest */
            best = v;
            bid = i;
        }
    }
    warp_argmax(best, bid);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        bv[warp] = best;
        bi[warp] = bid;
    }
    __syncthreads();
    if (warp == 0) {
        best = lane < nw ? bv[lane] : -INFINITY;
        bid = lane < nw ? bi[lane] : 0x7fffffff;
        warp_argmax(best, bid);
        if (lane == 0)
            ids[blockIdx.x] = bid == 0x7fffffff ? 0 : bid;
    }
}

int cu_argmax(const float *logits, int n, int vocab, int32_t *ids, cudaStream_t st, struct rl_err *err)
{
    if (n <= 0)
        return 0;
    argmax_kernel<<<n, 1024, 0, st>>>(logits, vocab, ids);
    LAUNCH_CHECK(err, "argmax_kernel");
    return 0;
}

/* splitmix64 of (seed, index): reproducible whatever the launch shape. */
__device__ __forceinline__ float rand_uniform(uint64_t seed, size_t i)
{
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; /* [-1, 1) */
}

__global__ void fill_random_kernel(void *p, size_t n, int dt, float amp, uint64_t seed)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        float v = rand_uniform(seed, e) * amp;
        switch (dt) {
        case MODEL_F32: ((float *)p)[e] = v; break;
        case MODEL_BF16: ((__nv_bfloat16 *)p)[e] = __float2bfloat16_rn(v); break;
        case MODEL_F16: ((__half *)p)[e] = __float2half_rn(v); break;
        default: ((uint8_t *)p)[e] = (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); break;
        }
    }
}

int cu_fill_random(void *p, size_t n, enum model_dtype dt, float amp, uint64_t seed, cudaStream_t st,
                   struct rl_err *err)
{
    if (!n)
        return 0;
    fill_random_kernel<<<grid_for(n), 256, 0, st>>>(p, n, (int)dt, amp, seed);
    LAUNCH_CHECK(err, "fill_random_kernel");
    return 0;
}

__global__ void fill_const_kernel(float *p, size_t n, float v)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        p[e] = v;
}

int cu_fill_const(float *p, size_t n, float v, cudaStream_t st, struct rl_err *err)
{
    if (!n)
        return 0;
    fill_const_kernel<<<grid_for(n), 256, 0, st>>>(p, n, v);
    LAUNCH_CHECK(err, "fill_const_kernel");
    return 0;
}

__global__ void widen_bf16_kernel(const __nv_bfloat16 *__restrict__ x, size_t n, float *__restrict__ y)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        y[e] = __bfloat162float(x[e]);
}

int cu_widen_bf16(const void *x, size_t n, float *y, cudaStream_t st, struct rl_err *err)
{
    if (!n)
        return 0;
    widen_bf16_kernel<<<grid_for(n), 256, 0, st>>>((const __nv_bfloat16 *)x, n, y);
    LAUNCH_CHECK(err, "widen_bf16_kernel");
    return 0;
}

/* ---- test entry point ---- */

extern "C" {
#include "cuda_backend.h"
}

extern "C" int cuda_test_swiglu(int M, int inter, const float *gu, float *h, struct rl_err *err)
{
    void *dg = NULL, *dh = NULL;
    size_t n = (size_t)M * (size_t)inter;
    int rc;
    if (!(rc = cu_test_up(&dg, gu, n * 2 * 4, err)) && !(rc = cu_test_up(&dh, NULL, n * 4, err)) &&
        !(rc = cu_swiglu((const float *)dg, M, inter, dh, CU_ACT_F32, 0, err))) {
        cudaError_t e = cudaMemcpy(h, dh, n * 4, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess)
            rc = rl_errf(err, RL_EBACKEND, "cudaMemcpy(swiglu out): %s", cudaGetErrorString(e));
    }
    cudaFree(dg);
    cudaFree(dh);
    return rc;
}
