/* engine/cuda/common.cuh - what every .cu of the CUDA backend shares: the
 * checked-call macros, the scalar conversions and warp reductions the
 * kernels use, and the element types the launchers switch on.
 *
 * Error rule: every CUDA runtime and cuBLASLt call goes through CU_CHECK /
 * BLAS_CHECK (or their _GOTO forms inside functions with a cleanup label),
 * so a failure comes back as RL_EBACKEND with the call text, the file:line
 * and the library's own name for the code. Kernel launches are followed by
 * LAUNCH_CHECK, which reads cudaGetLastError() (launch-configuration errors;
 * faults inside a kernel surface at the next synchronising call, which is
 * checked the same way). */
#ifndef RL_CUDA_COMMON_CUH
#define RL_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "backend.h"
#include "err.h"
#include "model.h"
}

#define CU_CHECK(err, call)                                                                        \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return rl_errf((err), RL_EBACKEND, "%s (%s:%d): %s (cudaError %d)", #call, __FILE__,   \
                           __LINE__, cudaGetErrorString(e_), (int)e_);                             \
    } while (0)

#define CU_CHECK_GOTO(err, rc, label, call)                                                        \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            (rc) = rl_errf((err), RL_EBACKEND, "%s (%s:%d): %s (cudaError %d)", #call, __FILE__,   \
                           __LINE__, cudaGetErrorString(e_), (int)e_);                             \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#define BLAS_CHECK(err, call)                                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return rl_errf((err), RL_EBACKEND, "%s (%s:%d): %s (cublasStatus %d)", #call,          \
                           __FILE__, __LINE__, cublasLtGetStatusString(s_), (int)s_);              \
    } while (0)

#define BLAS_CHECK_GOTO(err, rc, label, call)                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            (rc) = rl_errf((err), RL_EBACKEND, "%s (%s:%d): %s (cublasStatus %d)", #call,          \
                           __FILE__, __LINE__, cublasLtGetStatusString(s_), (int)s_);              \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* After a <<<>>> launch: configuration errors (bad grid, too much shared
 * memory, no kernel image for this device) are reported here. */
#define LAUNCH_CHECK(err, name)                                                                    \
    do {                                                                                           \
        cudaError_t e_ = cudaGetLastError();                                                       \
        if (e_ != cudaSuccess)                                                                     \
            return rl_errf((err), RL_EBACKEND, "launching %s (%s:%d): %s (cudaError %d)", (name),  \
                           __FILE__, __LINE__, cudaGetErrorString(e_), (int)e_);                   \
    } while (0)

/* Element types of activations handed to a matrix product. FP8 matrices
 * take BF16 activations (our kernels dequantize the weight; the cuBLASLt
 * path quantizes the activation per 1x128 group itself). */
enum cu_act { CU_ACT_F32 = 0, CU_ACT_BF16, CU_ACT_F16 };

static inline size_t cu_act_size(enum cu_act a) { return a == CU_ACT_F32 ? 4 : 2; }

static inline enum cu_act cu_act_for(enum model_dtype dt)
{
    return dt == MODEL_F32 ? CU_ACT_F32 : dt == MODEL_F16 ? CU_ACT_F16 : CU_ACT_BF16;
}

/* ---- device scalar helpers ---- */

__device__ __forceinline__ float cu_f(float v) { return v; }
__device__ __forceinline__ float cu_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float cu_f(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T cu_from(float v);
template <> __device__ __forceinline__ float cu_from<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 cu_from<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half cu_from<__half>(float v) { return __float2half_rn(v); }

/* OCP E4M3 ("fn") byte to float: exact through half. */
__device__ __forceinline__ float cu_fp8(uint8_t v)
{
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E4M3);
    return __half2float(__half(h));
}

__device__ __forceinline__ float cu_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float cu_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over a block of blockDim.x threads (a multiple of 32, at most 1024);
 * every thread gets the total. `red` is 32 floats of shared memory. */
__device__ __forceinline__ float cu_block_sum(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cu_warp_sum(v);
    __syncthreads(); /* red may still be read from an earlier call */
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.0f;
    return cu_warp_sum(t);
}

/* The skinny (decode, M <= 8) products share one shape: a warp per output
 * row, each lane accumulating its share of the row for every one of the M
 * activation rows. cu_skinny_row: the row this warp owns, -1 past N.
 * cu_skinny_store: sums each accumulator over the warp and lane 0 writes
 * Y[m][n] for m < M. */
__device__ __forceinline__ int cu_skinny_row(int N)
{
    int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    return n < N ? n : -1;
}

template <int MM>
__device__ __forceinline__ void cu_skinny_store(const float *acc, int M, float *__restrict__ Y, int ldy, int n)
{
#pragma unroll
    for (int m = 0; m < MM; m++) {
        if (m < M) {
            float t = cu_warp_sum(acc[m]);
            if ((threadIdx.x & 31) == 0)
                Y[(size_t)m * (size_t)ldy + n] = t;
        }
    }
}

static inline unsigned cu_blocks(size_t n, unsigned per) { return (unsigned)((n + per - 1) / per); }

/* For the per-op test entry points: cudaMalloc + optional upload. On
 * failure *d may hold an allocation the caller still frees. */
static inline int cu_test_up(void **d, const void *h, size_t bytes, struct rl_err *err)
{
    *d = NULL;
    CU_CHECK(err, cudaMalloc(d, bytes ? bytes : 16));
    if (h)
        CU_CHECK(err, cudaMemcpy(*d, h, bytes, cudaMemcpyHostToDevice));
    return 0;
}

#endif
