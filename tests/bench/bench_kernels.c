/* tests/bench/bench_kernels.c - CPU kernel speed against this machine's own
 * limits (the roofline from engine/cpu/machine.h).
 *
 *   build/tests/bench_kernels [--threads N] [--isa NAME] [--quick] [--ab]
 *
 * Prints a table to stderr and one JSON object to stdout:
 *   read bandwidth, bf16 and f32 peaks, pool round-trip latency,
 *   decode (M = 1) GB/s and % of bandwidth per Qwen3-0.6B shape,
 *   prefill (M = 512) GFLOP/s and % of the bf16 peak - both for the kernel
 *   the backend runs on BF16 weights (gemm_bf16p on packed panels where the
 *   table has it, else gemm_bf16) - and the same two for gemm_f32 /
 *   gemm_f16 at one shape.
 * --ab instead prints one JSON line per shape and M = 1, 16, 512: the
 *   row-major gemm_bf16 against gemm_bf16p, timed in alternating rounds so
 *   both see the same machine load.
 * --quant instead prints one JSON line per quantized format (Q8_0, Q4_K,
 *   Q6_K, AWQ) and shape, M = 1, 16, 512: gemm_q on the layout the backend
 *   gives the table (panels on AVX-512) against gemm_bf16p on the same
 *   shape, alternating, with the format's GB/s at M = 1 and the ratio of
 *   the times (what decode gains from reading fewer bytes per weight).
 * Decode weights rotate through a buffer far larger than the last-level
 * cache, so every call streams its matrix from DRAM, as a real decode step
 * does. Threads split N in multiples of CPU_GEMM_N_ALIGN, like the backend. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "cpu/kernels.h"
#include "cpu/machine.h"
#include "cpu/pool.h"
#include "cpu/qgemm.h"
#include "dtype.h"
#include "quant.h"

enum dt { DT_BF16, DT_F32, DT_F16, DT_BF16P, DT_Q };

struct gemm_job {
    const struct cpu_kernels *k;
    enum dt dt;
    int M, N, K;
    const void *x;  /* (M, K) bf16 or f32 */
    const void *w;  /* (N, K) */
    float *y;       /* (M, N) */
    struct cpu_qmat q; /* DT_Q: the matrix (q.w follows w) */
    size_t ldxq;       /* DT_Q: bytes per row of x (quantized) */
};

static void gemm_fn(void *arg, int ith, int nth)
{
    struct gemm_job *j = arg;
    int a = CPU_GEMM_N_ALIGN;
    int per = (j->N / nth + a - 1) / a * a;
    int n0 = per * ith, n1 = n0 + per < j->N ? n0 + per : j->N;
    if (ith == nth - 1)
        n1 = j->N;
    if (n0 >= n1)
        return;
    switch (j->dt) {
    case DT_BF16:
        j->k->gemm_bf16(j->M, n0, n1, j->K, j->x, j->K, j->w, j->y, j->N);
        break;
    case DT_F32:
        j->k->gemm_f32(j->M, n0, n1, j->K, j->x, j->K, j->w, j->y, j->N);
        break;
    case DT_F16:
        j->k->gemm_f16(j->M, n0, n1, j->K, j->x, j->K, j->w, j->y, j->N);
        break;
    case DT_BF16P: /* the timing does not depend on what the panels hold */
        j->k->gemm_bf16p(j->M, n0, n1, j->K, j->x, j->K, j->w, j->y, j->N);
        break;
    case DT_Q:
        j->q.w = j->w;
        j->k->gemm_q(j->M, n0, n1, &j->q, j->x, j->ldxq, j->y, j->N);
        break;
    }
}

/* Seconds per call of j: the best of n_trials trials of >= trial_s each.
 * Best-of, because the machine may be shared: a trial that lost a core to
 * another process says nothing about the kernel. When copies > 1, each call
 * takes the next of `copies` matrices of mbytes from wbase, so the weights
 * come from DRAM as in a real decode step. */
static double time_calls(struct cpu_pool *pool, struct gemm_job *j, const uint8_t *wbase,
                         size_t mbytes, size_t copies, int n_trials, double trial_s)
{
    double best = 1e30;
    size_t c = 0;
    for (int r = 0; r < n_trials; r++) {
        long calls = 0;
        double t0 = rl_mono_s(), t;
        do {
            if (copies > 1) {
                j->w = wbase + mbytes * c;
                c = (c + 1) % copies;
            }
            cpu_pool_run(pool, gemm_fn, j);
            calls++;
        } while ((t = rl_mono_s() - t0) < trial_s);
        if (t / calls < best)
            best = t / calls;
    }
    return best;
}

static void nop_fn(void *arg, int ith, int nth)
{
    (void)arg, (void)ith, (void)nth;
}

static void fill_fn(void *arg, int ith, int nth)
{
    struct { uint16_t *p; size_t n; } *f = arg;
    size_t a = f->n * (size_t)ith / (size_t)nth, b = f->n * (size_t)(ith + 1) / (size_t)nth;
    uint32_t s = 0x12345u + (uint32_t)ith * 7919u;
    for (size_t i = a; i < b; i++) {
        s = s * 1664525u + 1013904223u;
        /* bf16 / f16 in about [-1, 1]: sign, small exponent, mantissa */
        f->p[i] = (uint16_t)((s >> 16 & 0x8000u) | 0x3c00u | (s >> 9 & 0x7fu));
    }
}

struct shape {
    const char *name;
    int N, K;
};

static const struct shape shapes[] = {
    {"qkv.k/v", 1024, 1024}, {"q_proj", 2048, 1024}, {"o_proj", 1024, 2048},
    {"gate/up", 3072, 1024}, {"down", 1024, 3072},   {"lm_head", 151936, 1024},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

/* --quant: one matrix of (dt, N, K) with random codes and sane scales, in
 * the layout the table takes (panels where it packs), copied `copies`
 * times from wbuf on; returns its bytes (0: shape not supported). */
static size_t make_q(const struct cpu_kernels *k, enum model_dtype dt, int N, int K, uint8_t *wbuf,
                     size_t wbytes, size_t *copies, enum cpu_qlayout *lay)
{
    int G = dt == MODEL_AWQ4 ? 128 : 0;
    if (!cpu_q_supported(dt, N, K, G))
        return 0;
    size_t rb = cpu_q_row_bytes(dt, K, G);
    uint8_t *nat = malloc(rb * (size_t)N);
    float *row = malloc((size_t)K * 4);
    uint32_t s = 12345;
    for (int r = 0; r < N; r++) {
        for (int c = 0; c < K; c++) {
            s = s * 1664525u + 1013904223u;
            row[c] = (float)((int)(s >> 9 & 0xffff) - 32768) / 32768.0f;
        }
        if (dt == MODEL_AWQ4) { /* rows of the converted layout: f16 scale, zero, codes */
            for (int g = 0; g < K / G; g++) {
                uint8_t *gr = nat + (size_t)r * rb + (size_t)g * (size_t)(4 + G / 2);
                uint16_t sc = 0x2000; /* 2^-7 */
                memcpy(gr, &sc, 2);
                gr[2] = 8, gr[3] = 0;
                for (int i = 0; i < G / 2; i++)
                    gr[4 + i] = (uint8_t)(row[g * G + 2 * i] * 7 + 8) | (uint8_t)((int)(row[g * G + 2 * i + 1] * 7 + 8) << 4);
            }
        } else {
            quant_quantize_row(dt, row, nat + (size_t)r * rb, K);
        }
    }
    size_t mbytes = rb * (size_t)N;
    *lay = CPU_QL_NATIVE;
    if (k->q_panels && cpu_q_can_pack(dt, N, K, G)) {
        mbytes = cpu_q_panel_bytes(dt, K, G) * (size_t)(N / 16);
        cpu_q_pack(dt, N, K, G, nat, wbuf);
        *lay = CPU_QL_PANELS;
    } else {
        memcpy(wbuf, nat, mbytes);
    }
    mbytes = (mbytes + 4095) & ~(size_t)4095;
    *copies = wbytes / mbytes ? wbytes / mbytes : 1;
    for (size_t c = 1; c < *copies; c++)
        memcpy(wbuf + c * mbytes, wbuf, mbytes);
    free(nat), free(row);
    return mbytes;
}

/* Whether format dt is in the comma-separated list (model_dtype_name's
 * words, any case); every format when the list is NULL. */
static int wanted(const char *list, enum model_dtype dt)
{
    if (!list)
        return 1;
    const char *name = model_dtype_name(dt);
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncasecmp(p, name, n))
            return 1;
        p += len + (e ? 1 : 0);
    }
    return 0;
}

static int quant_ab(const struct cpu_kernels *k, struct cpu_pool *pool, uint16_t *wbuf, size_t wbytes,
                    const uint16_t *xb, const float *xf, float *y, const char *formats)
{
    static const enum model_dtype dts[] = {MODEL_Q8_0,   MODEL_Q4_K, MODEL_Q6_K, MODEL_AWQ4, MODEL_Q4_0,
                                           MODEL_Q4_1,   MODEL_Q5_0, MODEL_Q5_1, MODEL_Q5_K, MODEL_Q2_K,
                                           MODEL_Q3_K,   MODEL_IQ4_NL, MODEL_IQ4_XS};
    if (!formats) /* the four the figures were first kept for */
        formats = "Q8_0,Q4_K,Q6_K,AWQ4";
    static const int Ms[] = {1, 16, 512};
    uint8_t *qbuf = aligned_alloc(4096, wbytes);
    void *xq = aligned_alloc(64, cpu_xq_row_bytes(CPU_XQ_32, 3072) * 512);
    if (!qbuf || !xq)
        return 1;
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++)
        for (size_t s = 0; s < N_SHAPES && wanted(formats, dts[d]); s++) {
            int N = shapes[s].N, K = shapes[s].K;
            size_t copies;
            enum cpu_qlayout lay;
            size_t mbytes = make_q(k, dts[d], N, K, qbuf, wbytes, &copies, &lay);
            if (!mbytes)
                continue;
            enum cpu_xq f = cpu_xq_for(dts[d]);
            size_t ldxq = cpu_xq_row_bytes(f, K);
            for (int m = 0; m < 512; m++)
                cpu_xq_quantize(f, xf + (size_t)m * K, K, (char *)xq + (size_t)m * ldxq);
            for (int mi = 0; mi < 3; mi++) {
                int M = Ms[mi];
                if (M == 512 && s + 1 == N_SHAPES)
                    continue; /* prefill computes no logits but the last row's */
                size_t bbytes = (size_t)N * K * 2;
                size_t bcopies = M < 512 && wbytes / bbytes ? wbytes / bbytes : 1;
                double best[2] = {1e30, 1e30};
                for (int r = 0; r < 3; r++)
                    for (int v = 0; v < 2; v++) {
                        struct gemm_job j = {k, v ? DT_Q : DT_BF16P, M, N, K, v ? xq : (const void *)xb,
                                             v ? (const void *)qbuf : (const void *)wbuf, y, {0}, 0};
                        j.q = (struct cpu_qmat){dts[d], N, K, dts[d] == MODEL_AWQ4 ? 128 : 0, lay, qbuf};
                        j.ldxq = ldxq;
                        double t = v ? time_calls(pool, &j, qbuf, mbytes, M < 512 ? copies : 1, 3,
                                                  M < 512 ? 0.01 : 0)
                                     : time_calls(pool, &j, (const uint8_t *)wbuf, bbytes, bcopies, 3,
                                                  M < 512 ? 0.01 : 0);
                        if (t < best[v])
                            best[v] = t;
                    }
                double f2 = 2.0 * M * N * K * 1e-9;
                printf("{\"quant\":\"%s\",\"layout\":\"%s\",\"shape\":\"%s\",\"M\":%d,\"bf16p_us\":%.1f,"
                       "\"q_us\":%.1f,\"q_gbs\":%.1f,\"q_gops\":%.1f,\"bf16p_over_q\":%.2f}\n",
                       model_dtype_name(dts[d]), lay == CPU_QL_PANELS ? "panels" : "native", shapes[s].name,
                       M, best[0] * 1e6, best[1] * 1e6, (double)mbytes * 1e-9 / best[1], f2 / best[1],
                       best[0] / best[1]);
                fflush(stdout);
            }
        }
    free(qbuf), free(xq);
    return 0;
}

int main(int argc, char **argv)
{
    int n_threads = 2, quick = 0, ab = 0, quant = 0;
    const char *isa_name = "auto", *formats = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            n_threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc)
            isa_name = argv[++i];
        else if (strcmp(argv[i], "--ab") == 0)
            ab = 1;
        else if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--quant") == 0)
            quant = 1;
        else if (strcmp(argv[i], "--formats") == 0 && i + 1 < argc)
            formats = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--threads N] [--isa auto|avx512bf16|avx2|scalar] [--quick] [--ab | --quant [--formats Q4_0,IQ4_XS,...]]\n",
                    argv[0]);
            return 2;
        }
    }
    int isa = cpu_isa_parse(isa_name);
    const struct cpu_kernels *k = isa < 0 ? NULL : cpu_kernels_get((enum cpu_isa)isa);
    if (!k) {
        fprintf(stderr, "bench_kernels: ISA %s not available here\n", isa_name);
        return 1;
    }
    struct cpu_pool *pool;
    struct rl_err err;
    if (cpu_pool_create(&pool, n_threads, &err) != 0) {
        fprintf(stderr, "bench_kernels: %s\n", err.msg);
        return 1;
    }
    n_threads = cpu_pool_n_threads(pool);
    int n_trials = quick ? 5 : 25; /* trials per figure, best taken */

    double bw = cpu_measure_read_bw(pool, quick ? (size_t)256 << 20 : (size_t)1 << 30);
    double bf_peak = cpu_measure_bf16_peak(pool, k);
    double f32_peak = cpu_measure_f32_peak(pool, k);
    fprintf(stderr, "isa %s, %d threads\nread bandwidth %.1f GB/s, bf16 peak %.0f GFLOP/s, f32 peak %.0f GFLOP/s\n",
            cpu_isa_name(k->isa), n_threads, bw, bf_peak, f32_peak);

    /* Pool round trip: back to back, and from sleep (after a 2 ms gap). */
    for (int i = 0; i < 1000; i++)
        cpu_pool_run(pool, nop_fn, NULL);
    double pool_us = 1e30, wake_us = 1e30, t0;
    for (int r = 0; r < n_trials; r++) {
        t0 = rl_mono_s();
        for (int i = 0; i < 2000; i++)
            cpu_pool_run(pool, nop_fn, NULL);
        double us = (rl_mono_s() - t0) / 2000 * 1e6;
        if (us < pool_us)
            pool_us = us;
    }
    /* from sleep: after a 2 ms gap the workers are in FUTEX_WAIT; median */
    double wk[25];
    for (int i = 0; i < 25; i++) {
        usleep(2000);
        t0 = rl_mono_s();
        cpu_pool_run(pool, nop_fn, NULL);
        wk[i] = (rl_mono_s() - t0) * 1e6;
    }
    for (int i = 1; i < 25; i++)
        for (int q = i; q > 0 && wk[q] < wk[q - 1]; q--) {
            double tt = wk[q];
            wk[q] = wk[q - 1];
            wk[q - 1] = tt;
        }
    wake_us = wk[12];
    fprintf(stderr, "pool run() round trip %.2f us hot (best), %.1f us from sleep (median)\n", pool_us, wake_us);

    /* Weights buffer: 1 GiB (256 MiB quick) of bf16, many times any cache. */
    size_t wbytes = quick ? (size_t)384 << 20 : (size_t)1 << 30; /* >= lm_head */
    uint16_t *wbuf = aligned_alloc(4096, wbytes);
    size_t mx = (size_t)512 * 3072;
    uint16_t *xb = aligned_alloc(64, mx * 2);
    float *xf = aligned_alloc(64, mx * 4);
    float *y = aligned_alloc(64, (size_t)512 * 151936 * 4 > ((size_t)512 << 20) ? ((size_t)512 << 20) : (size_t)512 * 151936 * 4);
    if (!wbuf || !xb || !xf || !y) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        return 1;
    }
    /* huge pages, as a backend should give its weights (THP madvise mode) */
    madvise(wbuf, wbytes, MADV_HUGEPAGE);
    struct { uint16_t *p; size_t n; } fill = {wbuf, wbytes / 2};
    cpu_pool_run(pool, fill_fn, &fill);
    for (size_t i = 0; i < mx; i++) {
        xf[i] = (float)((int)(i * 2654435761u % 2001) - 1000) / 1000.0f;
        xb[i] = cpu_f32_to_bf16(xf[i]);
    }

    if (quant && k->gemm_bf16p)
        return quant_ab(k, pool, wbuf, wbytes, xb, xf, y, formats);
    if (ab && k->gemm_bf16p) {
        /* --ab: gemm_bf16 against gemm_bf16p (packed panels), interleaved
         * rounds of best-of trials, so both see the same machine load. */
        static const int Ms[] = {1, 16, 512};
        for (size_t s = 0; s + 1 < N_SHAPES; s++)
            for (int mi = 0; mi < 3; mi++) {
                int M = Ms[mi];
                size_t mbytes = (size_t)shapes[s].N * shapes[s].K * 2;
                size_t copies = M < 512 && wbytes / mbytes ? wbytes / mbytes : 1;
                double best[2] = {1e30, 1e30};
                for (int r = 0; r < 3; r++)
                    for (int v = 0; v < 2; v++) {
                        struct gemm_job j = {k, v ? DT_BF16P : DT_BF16, M, shapes[s].N,
                                             shapes[s].K, xb, wbuf, y, {0}, 0};
                        double t = time_calls(pool, &j, (const uint8_t *)wbuf, mbytes, copies,
                                              3, M < 512 ? 0.01 : 0);
                        if (t < best[v])
                            best[v] = t;
                    }
                double f = 2.0 * M * shapes[s].N * shapes[s].K * 1e-9;
                printf("{\"ab\":\"%s\",\"M\":%d,\"old_us\":%.1f,\"packed_us\":%.1f,"
                       "\"old_gflops\":%.1f,\"packed_gflops\":%.1f,\"packed_gbs\":%.1f,\"speedup\":%.2f}\n",
                       shapes[s].name, M, best[0] * 1e6, best[1] * 1e6, f / best[0], f / best[1],
                       (double)mbytes * 1e-9 / best[1], best[0] / best[1]);
                fflush(stdout);
            }
        return 0;
    }

    printf("{\"isa\":\"%s\",\"threads\":%d,\"read_bw_gbs\":%.2f,\"bf16_peak_gflops\":%.1f,"
           "\"f32_peak_gflops\":%.1f,\"pool_rt_us\":%.3f,\"pool_wake_us\":%.2f,\"decode\":[",
           cpu_isa_name(k->isa), n_threads, bw, bf_peak, f32_peak, pool_us, wake_us);

    /* The decode and prefill tables time the kernel the backend runs on
     * BF16 weights: the packed one where the table has it (--ab compares
     * it with the row-major gemm_bf16). */
    enum dt bdt = k->gemm_bf16p ? DT_BF16P : DT_BF16;
    const char *bname = k->gemm_bf16p ? "gemm_bf16p" : "gemm_bf16";
    fprintf(stderr, "\ndecode %s, M=1 (weights from DRAM)\n%-8s %7s %5s %9s %8s %7s\n", bname,
            "shape", "N", "K", "us/call", "GB/s", "%bw");
    for (size_t s = 0; s < N_SHAPES; s++) {
        size_t mbytes = (size_t)shapes[s].N * shapes[s].K * 2;
        size_t copies = wbytes / mbytes ? wbytes / mbytes : 1;
        struct gemm_job j = {k, bdt, 1, shapes[s].N, shapes[s].K, xb, wbuf, y, {0}, 0};
        double t = time_calls(pool, &j, (const uint8_t *)wbuf, mbytes, copies, n_trials,
                              s + 1 == N_SHAPES ? 0 : 0.01);
        long calls = 1;
        double gbs = (double)mbytes * calls / t * 1e-9;
        fprintf(stderr, "%-8s %7d %5d %9.1f %8.1f %6.1f%%\n", shapes[s].name, shapes[s].N,
                shapes[s].K, t / calls * 1e6, gbs, 100 * gbs / bw);
        printf("%s{\"kernel\":\"%s\",\"shape\":\"%s\",\"N\":%d,\"K\":%d,\"us\":%.2f,\"gbs\":%.2f,\"pct_bw\":%.1f}",
               s ? "," : "", bname, shapes[s].name, shapes[s].N, shapes[s].K, t / calls * 1e6, gbs,
               100 * gbs / bw);
    }
    printf("],\"prefill\":[");

    fprintf(stderr, "\nprefill %s, M=512\n%-8s %7s %5s %9s %8s %7s\n", bname, "shape", "N", "K",
            "ms/call", "GFLOP/s", "%peak");
    for (size_t s = 0; s + 1 < N_SHAPES; s++) {
        struct gemm_job j = {k, bdt, 512, shapes[s].N, shapes[s].K, xb, wbuf, y, {0}, 0};
        double t = time_calls(pool, &j, NULL, 0, 1, quick ? 3 : 10, 0);
        long calls = 1;
        double gf = 2.0 * 512 * shapes[s].N * shapes[s].K * calls / t * 1e-9;
        double pk = bf_peak > 0 ? bf_peak : f32_peak;
        fprintf(stderr, "%-8s %7d %5d %9.2f %8.1f %6.1f%%\n", shapes[s].name, shapes[s].N,
                shapes[s].K, t / calls * 1e3, gf, 100 * gf / pk);
        printf("%s{\"kernel\":\"%s\",\"shape\":\"%s\",\"N\":%d,\"K\":%d,\"ms\":%.3f,\"gflops\":%.1f,\"pct_peak\":%.1f}",
               s ? "," : "", bname, shapes[s].name, shapes[s].N, shapes[s].K, t / calls * 1e3, gf,
               100 * gf / pk);
    }
    printf("],\"other\":[");

    /* f32 and f16 weights at the gate/up shape: decode GB/s and prefill. */
    fprintf(stderr, "\nother dtypes, N=3072 K=1024\n%-10s %5s %9s %8s %8s\n", "kernel", "M",
            "us/call", "GB/s", "GFLOP/s");
    static const struct { enum dt dt; const char *name; int esz; } others[] = {
        {DT_F32, "gemm_f32", 4}, {DT_F16, "gemm_f16", 2}};
    int first = 1;
    for (int o = 0; o < 2; o++) {
        for (int M = 1; M <= 512; M += 511) {
            size_t mbytes = (size_t)3072 * 1024 * others[o].esz;
            size_t copies = M == 1 && wbytes / mbytes ? wbytes / mbytes : 1;
            struct gemm_job j = {k, others[o].dt, M, 3072, 1024, xf, NULL, y, {0}, 0};
            j.w = wbuf;
            double t = time_calls(pool, &j, (const uint8_t *)wbuf, mbytes, copies,
                                  quick ? 3 : 10, M == 1 ? 0.01 : 0);
            long calls = 1;
            double us = t / calls * 1e6, gbs = (double)mbytes * calls / t * 1e-9;
            double gf = 2.0 * M * 3072 * 1024 * calls / t * 1e-9;
            fprintf(stderr, "%-10s %5d %9.1f %8.1f %8.1f\n", others[o].name, M, us, gbs, gf);
            printf("%s{\"kernel\":\"%s\",\"M\":%d,\"us\":%.2f,\"gbs\":%.2f,\"gflops\":%.1f}",
                   first ? "" : ",", others[o].name, M, us, gbs, gf);
            first = 0;
        }
    }
    printf("]}\n");

    free(wbuf);
    free(xb);
    free(xf);
    free(y);
    cpu_pool_free(pool);
    return 0;
}
