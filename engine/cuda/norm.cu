/* engine/cuda/norm.cu - the embedding gather and RMSNorm, the latter fused
 * with the residual add that precedes it (x += projection output; normed
 * copy written in the dtype the next matrix product takes), so the f32
 * residual stream is read and written once per norm. A block per row; the
 * row is walked twice (sum of squares, then scale) and the second walk hits
 * L1/L2. Arithmetic matches the CPU backend: y = w * (x * r) with
 * r = 1 / sqrt(mean(x^2) + eps), f32 (the CPU accumulates in double; the
 * difference is far below the BF16 rounding that follows). */
#include "ops.cuh"

template <typename ET>
__global__ void embed_kernel(const ET *__restrict__ E, const float *__restrict__ S, int sld, int br, int bc,
                             int H, const int32_t *__restrict__ tokens, float *__restrict__ x)
{
    int t = blockIdx.x;
    size_t row = (size_t)tokens[t];
    const ET *e = E + row * (size_t)H;
    float *o = x + (size_t)t * (size_t)H;
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        o[i] = cu_f(e[i]);
}

__global__ void embed_fp8_kernel(const uint8_t *__restrict__ E, const float *__restrict__ S, int sld, int br,
                                 int bc, int H, const int32_t *__restrict__ tokens, float *__restrict__ x)
{
    int t = blockIdx.x;
    size_t row = (size_t)tokens[t];
    const uint8_t *e = E + row * (size_t)H;
    const float *s = S + (row / (size_t)br) * (size_t)sld;
    float *o = x + (size_t)t * (size_t)H;
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        o[i] = cu_fp8(e[i]) * s[i / bc];
}

int cu_embed(const struct cu_mat *e, const int32_t *tokens, int n, float *x, cudaStream_t st,
             struct rl_err *err)
{
    if (n <= 0)
        return 0;
    int H = e->cols;
    switch (e->dt) {
    case MODEL_F32:
        embed_kernel<float><<<n, 256, 0, st>>>((const float *)e->w, NULL, 0, 1, 1, H, tokens, x);
        break;
    case MODEL_BF16:
        embed_kernel<__nv_bfloat16><<<n, 256, 0, st>>>((const __nv_bfloat16 *)e->w, NULL, 0, 1, 1, H, tokens, x);
        break;
    case MODEL_F16:
        embed_kernel<__half><<<n, 256, 0, st>>>((const __half *)e->w, NULL, 0, 1, 1, H, tokens, x);
        break;
    case MODEL_F8_E4M3:
        embed_fp8_kernel<<<n, 256, 0, st>>>((const uint8_t *)e->w, e->scale, e->scale_ld, e->br, e->bc, H,
                                            tokens, x);
        break;
    default: /* quantized: qgemm.cu */
        return cu_q_embed(e, tokens, n, x, st, err);
    }
    LAUNCH_CHECK(err, "embed_kernel");
    return 0;
}

template <typename OT>
__global__ void rmsnorm_kernel(float *__restrict__ x, const float *__restrict__ add,
                               const int32_t *__restrict__ rows, int dim, const float *__restrict__ w,
                               float eps, OT *__restrict__ y)
{
    __shared__ float red[32];
    int i = blockIdx.x;
    int r = rows ? rows[i] : i;
    float *xr = x + (size_t)r * (size_t)dim;
    float ss = 0.0f;
    if (add) {
        const float *ar = add + (size_t)r * (size_t)dim;
        for (int d = threadIdx.x; d < dim; d += blockDim.x) {
            float v = xr[d] + ar[d];
            xr[d] = v; /* each element is read back by the thread that wrote it */
            ss += v * v;
        }
    } else {
        for (int d = threadIdx.x; d < dim; d += blockDim.x) {
            float v = xr[d];
            ss += v * v;
        }
    }
    ss = cu_block_sum(ss, red);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    OT *yr = y + (size_t)i * (size_t)dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x)
        yr[d] = cu_from<OT>(w[d] * (xr[d] * inv));
}

int cu_rmsnorm(float *x, const float *add, const int32_t *rows, int n, int dim, const float *w, float eps,
               void *y, enum cu_act yt, cudaStream_t st, struct rl_err *err)
{
    if (n <= 0)
        return 0;
    int threads = dim >= 1024 ? 512 : dim >= 256 ? 256 : 128;
    switch (yt) {
    case CU_ACT_F32:
        rmsnorm_kernel<float><<<n, threads, 0, st>>>(x, add, rows, dim, w, eps, (float *)y);
        break;
    case CU_ACT_BF16:
        rmsnorm_kernel<__nv_bfloat16><<<n, threads, 0, st>>>(x, add, rows, dim, w, eps, (__nv_bfloat16 *)y);
        break;
    case CU_ACT_F16:
        rmsnorm_kernel<__half><<<n, threads, 0, st>>>(x, add, rows, dim, w, eps, (__half *)y);
        break;
    }
    LAUNCH_CHECK(err, "rmsnorm_kernel");
    return 0;
}

/* ---- test entry point ---- */

extern "C" {
#include "cuda_backend.h"
}

extern "C" int cuda_test_rmsnorm(int n, int dim, float *x, const float *add, const float *w, float eps, float *y,
                                 struct rl_err *err)
{
    void *dx = NULL, *da = NULL, *dw = NULL, *dy = NULL;
    size_t b = (size_t)n * (size_t)dim * 4;
    int rc;
    if (!(rc = cu_test_up(&dx, x, b, err)) && !(rc = cu_test_up(&da, add, add ? b : 0, err)) &&
        !(rc = cu_test_up(&dw, w, (size_t)dim * 4, err)) && !(rc = cu_test_up(&dy, NULL, b, err)) &&
        !(rc = cu_rmsnorm((float *)dx, add ? (const float *)da : NULL, NULL, n, dim, (const float *)dw, eps, dy,
                          CU_ACT_F32, 0, err))) {
        cudaError_t e = cudaMemcpy(y, dy, b, cudaMemcpyDeviceToHost);
        if (e == cudaSuccess)
            e = cudaMemcpy(x, dx, b, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess)
            rc = rl_errf(err, RL_EBACKEND, "cudaMemcpy(rmsnorm out): %s", cudaGetErrorString(e));
    }
    cudaFree(dx), cudaFree(da), cudaFree(dw), cudaFree(dy);
    return rc;
}
