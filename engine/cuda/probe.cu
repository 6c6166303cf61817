/* engine/cuda/probe.cu - device discovery and the two ceilings the
 * benchmark compares against: copy bandwidth (for decode, which streams
 * the weights once per token) and cuBLASLt GEMM rate (for prefill). Both
 * time with CUDA events on a private stream, after a warm-up. */
#include <stdio.h>
#include <string.h>

#include "ops.cuh"

extern "C" {
#include "cuda_backend.h"
}

extern "C" int cuda_device_count(char *why, size_t why_len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why && why_len)
            snprintf(why, why_len, "%s (cudaError %d)", cudaGetErrorString(e), (int)e);
        return 0;
    }
    if (n == 0 && why && why_len)
        snprintf(why, why_len, "the driver reports no CUDA device");
    return n;
}

extern "C" int cuda_device_info(int device, char *name, size_t name_len, size_t *mem_bytes, int *sm_count,
                                struct rl_err *err)
{
    struct cudaDeviceProp p;
    CU_CHECK(err, cudaGetDeviceProperties(&p, device));
    if (name && name_len)
        snprintf(name, name_len, "%s", p.name);
    if (mem_bytes)
        *mem_bytes = p.totalGlobalMem;
    if (sm_count)
        *sm_count = p.multiProcessorCount;
    return 0;
}

/* Two events around a timed stretch of work on one stream. */
struct probe_timer {
    cudaEvent_t e0, e1; /* NULL until created */
};

/* Creates the events and records the start on st. */
static int timer_start(struct probe_timer *t, cudaStream_t st, struct rl_err *err)
{
    CU_CHECK(err, cudaEventCreate(&t->e0));
    CU_CHECK(err, cudaEventCreate(&t->e1));
    CU_CHECK(err, cudaEventRecord(t->e0, st));
    return 0;
}

/* Records the end on st, waits for it, and gives the time between in ms. */
static int timer_stop(struct probe_timer *t, cudaStream_t st, float *ms, struct rl_err *err)
{
    CU_CHECK(err, cudaEventRecord(t->e1, st));
    CU_CHECK(err, cudaEventSynchronize(t->e1));
    CU_CHECK(err, cudaEventElapsedTime(ms, t->e0, t->e1));
    return 0;
}

static void timer_free(struct probe_timer *t)
{
    if (t->e0)
        cudaEventDestroy(t->e0);
    if (t->e1)
        cudaEventDestroy(t->e1);
}

extern "C" int cuda_measure_bandwidth(int device, double *bytes_per_s, struct rl_err *err)
{
    size_t n = (size_t)2 << 30; /* 2 GiB each way: far beyond L2 */
    void *a = NULL, *b = NULL;
    cudaStream_t st = NULL;
    struct probe_timer tm = {NULL, NULL};
    int rc = 0;
    float ms = 0;
    const int reps = 10;
    CU_CHECK_GOTO(err, rc, out, cudaSetDevice(device));
    CU_CHECK_GOTO(err, rc, out, cudaStreamCreate(&st));
    CU_CHECK_GOTO(err, rc, out, cudaMalloc(&a, n));
    CU_CHECK_GOTO(err, rc, out, cudaMalloc(&b, n));
    CU_CHECK_GOTO(err, rc, out, cudaMemsetAsync(a, 1, n, st));
    CU_CHECK_GOTO(err, rc, out, cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st)); /* warm-up */
    if ((rc = timer_start(&tm, st, err)))
        goto out;
    for (int i = 0; i < reps; i++)
        CU_CHECK_GOTO(err, rc, out, cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, n, cudaMemcpyDeviceToDevice, st));
    if ((rc = timer_stop(&tm, st, &ms, err)))
        goto out;
    *bytes_per_s = 2.0 * (double)n * reps / (ms / 1e3);
out:
    timer_free(&tm);
    cudaFree(a);
    cudaFree(b);
    if (st)
        cudaStreamDestroy(st);
    return rc;
}

extern "C" int cuda_measure_gemm(int device, enum model_dtype dt, int M, int N, int K, double *flops,
                                 struct rl_err *err)
{
    if (dt != MODEL_BF16 && dt != MODEL_F8_E4M3)
        return rl_errf(err, RL_EINVAL, "cuda_measure_gemm: bf16 or fp8");
    struct cu_gemm *g = NULL;
    struct cu_mat m;
    memset(&m, 0, sizeof m);
    void *x = NULL;
    float *y = NULL;
    cudaStream_t st = NULL;
    struct probe_timer tm = {NULL, NULL};
    int rc = 0, reps = 20;
    float ms = 0;
    struct cudaDeviceProp p;
    CU_CHECK_GOTO(err, rc, out, cudaSetDevice(device));
    CU_CHECK_GOTO(err, rc, out, cudaGetDeviceProperties(&p, device));
    CU_CHECK_GOTO(err, rc, out, cudaStreamCreate(&st));
    m.dt = dt;
    m.rows = N;
    m.cols = K;
    m.br = m.bc = 128;
    m.scale_ld = ((K + 127) / 128 + 3) / 4 * 4;
    CU_CHECK_GOTO(err, rc, out, cudaMalloc(&m.w, (size_t)N * (size_t)K * (dt == MODEL_BF16 ? 2 : 1)));
    CU_CHECK_GOTO(err, rc, out, cudaMalloc((void **)&m.scale, (size_t)((N + 127) / 128) * (size_t)m.scale_ld * 4));
    CU_CHECK_GOTO(err, rc, out, cudaMalloc(&x, (size_t)M * (size_t)K * 2));
    CU_CHECK_GOTO(err, rc, out, cudaMalloc((void **)&y, (size_t)(M + 16) * (size_t)N * 4));
    if ((rc = cu_fill_random(m.w, (size_t)N * (size_t)K, dt, dt == MODEL_BF16 ? 0.05f : 1.0f, 1, st, err)) ||
        (rc = cu_fill_const(m.scale, (size_t)((N + 127) / 128) * (size_t)m.scale_ld, 0.01f, st, err)) ||
        (rc = cu_fill_random(x, (size_t)M * (size_t)K, MODEL_BF16, 1.0f, 2, st, err)))
        goto out;
    if ((rc = cu_gemm_create(&g, M + 16, K, p.major, st, err)))
        goto out;
    if (dt == MODEL_F8_E4M3)
        cu_gemm_force(g, CU_GEMM_LT);
    if ((rc = cu_gemm_run(g, &m, M, x, y, N, err)))
        goto out;
    if ((rc = timer_start(&tm, st, err)))
        goto out;
    for (int i = 0; i < reps; i++)
        if ((rc = cu_gemm_run(g, &m, M, x, y, N, err)))
            goto out;
    if ((rc = timer_stop(&tm, st, &ms, err)))
        goto out;
    *flops = 2.0 * M * (double)N * K * reps / (ms / 1e3);
out:
    timer_free(&tm);
    cu_gemm_free(g);
    cudaFree(m.w);
    cudaFree(m.scale);
    cudaFree(x);
    cudaFree(y);
    if (st)
        cudaStreamDestroy(st);
    return rc;
}
