/* tests/bench/qgemm_ab.c - one quantized product, two builds of the
 * AVX-512 kernels in one process: cpu_gemm_q_avx512 from the library this
 * is linked with ("old", e.g. a base commit's) against new_gemm_q_avx512,
 * the working tree's engine/cpu/qgemm_avx512.c compiled under that name
 * ("new"). Run by tests/bench/qgemm_ab.sh, which builds both.
 *
 *   qgemm_ab FORMAT N K M THREADS     FORMAT: q8_0 q4_k q5_k q6_k awq
 *
 * Random codes packed into panels (AWQ: group 128); M <= 16 rotates
 * through copies of the matrix filling 600 MB, so decode-shaped products
 * stream from DRAM. Alternating rounds, best of 15 per side, one line:
 * time and GB/s of each, the speed ratio, and whether new's bits equal
 * old's and the scalar table's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <math.h>
#include "clock.h"
#include "cpu/pool.h"
#include "cpu/qgemm.h"
#include "quant.h"
#include "err.h"
#include "dtype.h"
void new_gemm_q_avx512(int M, int n0, int n1, const struct cpu_qmat *w, const void *xq, size_t ldxq, float *y, int ldy);

struct job { int v, M, N; struct cpu_qmat q; const void *xq; size_t ldxq; float *y; };
static void fn(void *arg, int ith, int nth)
{
    struct job *j = arg;
    int per = (j->N / nth + 15) / 16 * 16;
    int n0 = per * ith, n1 = n0 + per < j->N ? n0 + per : j->N;
    if (n0 >= n1) return;
    if (j->v) new_gemm_q_avx512(j->M, n0, n1, &j->q, j->xq, j->ldxq, j->y, j->N);
    else cpu_gemm_q_avx512(j->M, n0, n1, &j->q, j->xq, j->ldxq, j->y, j->N);
}

int main(int argc, char **argv)
{
    const char *fmt = argc > 1 ? argv[1] : "q8_0";
    int N = argc > 2 ? atoi(argv[2]) : 3072, K = argc > 3 ? atoi(argv[3]) : 1024, M = argc > 4 ? atoi(argv[4]) : 1;
    int nth = argc > 5 ? atoi(argv[5]) : 2;
    enum model_dtype dt = !strcmp(fmt, "q8_0") ? MODEL_Q8_0 : !strcmp(fmt, "q4_k") ? MODEL_Q4_K : !strcmp(fmt, "q5_k") ? MODEL_Q5_K : !strcmp(fmt, "q6_k") ? MODEL_Q6_K : MODEL_AWQ4;
    int G = dt == MODEL_AWQ4 ? 128 : 0;
    struct rl_err err; struct cpu_pool *pool; cpu_pool_create(&pool, nth, &err);
    size_t rb = cpu_q_row_bytes(dt, K, G), ps = cpu_q_panel_bytes(dt, K, G);
    size_t mb = (ps * (N / 16) + 4095) / 4096 * 4096;
    size_t copies = M <= 16 ? (600u << 20) / mb : 1; if (!copies) copies = 1;
    uint8_t *nat = malloc(rb * N), *W = aligned_alloc(4096, mb * copies);
    float *row = malloc(K * 4);
    uint32_t s = 1;
    for (int r = 0; r < N; r++) {
        for (int c = 0; c < K; c++) { s = s * 1664525u + 1013904223u; row[c] = (float)((int)(s >> 9 & 0xffff) - 32768) / 32768.0f; }
        if (dt == MODEL_AWQ4) {
            for (int g = 0; g < K / G; g++) {
                uint8_t *gr = nat + (size_t)r * rb + (size_t)g * (size_t)(4 + G / 2);
                uint16_t sc = 0x2000; memcpy(gr, &sc, 2); gr[2] = 8, gr[3] = 0;
                for (int i = 0; i < G / 2; i++) gr[4 + i] = (uint8_t)(row[g * G + 2 * i] * 7 + 8) | (uint8_t)((int)(row[g * G + 2 * i + 1] * 7 + 8) << 4);
            }
        } else quant_quantize_row(dt, row, nat + (size_t)r * rb, K);
    }
    cpu_q_pack(dt, N, K, G, nat, W);
    for (size_t c = 1; c < copies; c++) memcpy(W + c * mb, W, mb);
    enum cpu_xq f = cpu_xq_for(dt);
    size_t ldxq = cpu_xq_row_bytes(f, K);
    void *xq = aligned_alloc(64, ldxq * M + 64);
    float *x = malloc((size_t)K * 4);
    for (int m = 0; m < M; m++) { for (int c = 0; c < K; c++) x[c] = sinf(c * 0.1f + m); cpu_xq_quantize(f, x, K, (char *)xq + ldxq * m); }
    float *y0 = calloc((size_t)N * M, 4), *y1 = calloc((size_t)N * M, 4);
    struct job j = {0, M, N, {dt, N, K, G, CPU_QL_PANELS, W}, xq, ldxq, y0};
    cpu_pool_run(pool, fn, &j); j.v = 1; j.y = y1; cpu_pool_run(pool, fn, &j);
    /* also the scalar reference on native rows */
    float *y2 = calloc((size_t)N * M, 4);
    struct cpu_qmat qn = {dt, N, K, G, CPU_QL_NATIVE, nat};
    if (dt != MODEL_AWQ4 || 1) cpu_gemm_q_scalar(M, 0, N, &qn, xq, ldxq, y2, N);
    long bad = memcmp(y0, y1, (size_t)N * M * 4) != 0, bad2 = memcmp(y2, y1, (size_t)N * M * 4) != 0;
    double best[2] = {1e30, 1e30}; size_t c = 0;
    for (int r = 0; r < 15; r++) for (int v = 0; v < 2; v++) {
        j.v = v; double t0 = rl_mono_s(); int calls = 0;
        do { j.q.w = W + mb * c; c = (c + 1) % copies; cpu_pool_run(pool, fn, &j); calls++; } while (rl_mono_s() - t0 < 0.04);
        double t = (rl_mono_s() - t0) / calls; if (t < best[v]) best[v] = t;
    }
    printf("%-5s N %6d K %5d M %3d: old %8.1f us %5.1f GB/s  new %8.1f us %5.1f GB/s  new/old speed %.2fx  %s %s\n", fmt, N, K, M,
           best[0] * 1e6, mb / best[0] * 1e-9, best[1] * 1e6, mb / best[1] * 1e-9, best[0] / best[1], bad ? "DIFF-vs-old" : "same-as-old", bad2 ? "DIFF-vs-scalar" : "same-as-scalar");
    return 0;
}
