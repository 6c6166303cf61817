/* engine/cpu/machine.c - measures read bandwidth and compute peaks on the
 * threads of a pool (see machine.h).
 *
 * These are the roofline denominators of bench_kernels: "decode runs at X%
 * of bandwidth" only means something against a bandwidth measured the same
 * way on the same threads. Every figure is the best of a few passes, timed
 * by the owner thread around one cpu_pool_run(), so pool wake-up (a few us)
 * is included but negligible next to the 0.1 s+ passes.
 *
 * The SIMD loops are compiled per function through target attributes, like
 * the kernels, and only run after cpu_isa_detect() allows them. */
#include "cpu/machine.h"
#include "clock.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define T2 __attribute__((target("avx2,fma")))
#endif

/* Passes per figure, best taken: short passes, many of them, so a shared
 * machine still yields some undisturbed ones. */
#define N_PASSES 10

/* Results land here so the compiler cannot drop the loops. */
static volatile uint64_t sink_u64;
static volatile float sink_f32;

/* ------------------------------------------------------------- bandwidth */

struct bw_job {
    const uint8_t *buf;
    size_t bytes;       /* multiple of 256 * nth */
    enum cpu_isa isa;
    int touch;          /* 1: write the buffer (first touch) instead */
    int streams;        /* 1 or 4, see read512 */
};

#if defined(__x86_64__)
/* Byte i + 1 KB of each of four read streams, asked for ahead of use. */
static inline void prefetch4(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2,
                             const uint8_t *p3, size_t i)
{
    _mm_prefetch((const char *)p0 + i + 1024, _MM_HINT_T0);
    _mm_prefetch((const char *)p1 + i + 1024, _MM_HINT_T0);
    _mm_prefetch((const char *)p2 + i + 1024, _MM_HINT_T0);
    _mm_prefetch((const char *)p3 + i + 1024, _MM_HINT_T0);
}

/* Two read patterns, because which one saturates DRAM depends on the core:
 * one sequential stream (the hardware prefetcher's best case), and four
 * interleaved streams with software prefetch (more misses in flight, like
 * the 16-row matrix-vector kernel). The figure reported is the better. */
T512 static uint64_t read512(const uint8_t *p, size_t n, int streams)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    if (streams == 1) {
        for (size_t i = 0; i < n; i += 256) {
            a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p + i)));
            a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p + i + 64)));
            a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(p + i + 128)));
            a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(p + i + 192)));
        }
    } else {
        size_t q = n / 4; /* n is a multiple of 256, so q of 64 */
        const uint8_t *p0 = p, *p1 = p + q, *p2 = p + 2 * q, *p3 = p + 3 * q;
        for (size_t i = 0; i < q; i += 64) {
            prefetch4(p0, p1, p2, p3, i);
            a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p0 + i)));
            a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p1 + i)));
            a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(p2 + i)));
            a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(p3 + i)));
        }
    }
    __m512i s = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
    return (uint64_t)_mm512_reduce_add_epi64(s);
}

T2 static uint64_t read256(const uint8_t *p, size_t n, int streams)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    if (streams == 1) {
        for (size_t i = 0; i < n; i += 128) {
            a0 = _mm256_add_epi64(a0, _mm256_load_si256((const void *)(p + i)));
            a1 = _mm256_add_epi64(a1, _mm256_load_si256((const void *)(p + i + 32)));
            a2 = _mm256_add_epi64(a2, _mm256_load_si256((const void *)(p + i + 64)));
            a3 = _mm256_add_epi64(a3, _mm256_load_si256((const void *)(p + i + 96)));
        }
    } else {
        size_t q = n / 4;
        const uint8_t *p0 = p, *p1 = p + q, *p2 = p + 2 * q, *p3 = p + 3 * q;
        for (size_t i = 0; i < q; i += 64) {
            prefetch4(p0, p1, p2, p3, i);
            a0 = _mm256_add_epi64(a0, _mm256_add_epi64(_mm256_load_si256((const void *)(p0 + i)),
                                                       _mm256_load_si256((const void *)(p0 + i + 32))));
            a1 = _mm256_add_epi64(a1, _mm256_add_epi64(_mm256_load_si256((const void *)(p1 + i)),
                                                       _mm256_load_si256((const void *)(p1 + i + 32))));
            a2 = _mm256_add_epi64(a2, _mm256_add_epi64(_mm256_load_si256((const void *)(p2 + i)),
                                                       _mm256_load_si256((const void *)(p2 + i + 32))));
            a3 = _mm256_add_epi64(a3, _mm256_add_epi64(_mm256_load_si256((const void *)(p3 + i)),
                                                       _mm256_load_si256((const void *)(p3 + i + 32))));
        }
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t t[4];
    _mm256_storeu_si256((void *)t, s);
    return t[0] + t[1] + t[2] + t[3];
}
#endif

static uint64_t read_scalar(const uint8_t *p, size_t n)
{
    const uint64_t *q = (const uint64_t *)(const void *)p;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i < n / 8; i += 4) {
        a0 += q[i];
        a1 += q[i + 1];
        a2 += q[i + 2];
        a3 += q[i + 3];
    }
    return a0 + a1 + a2 + a3;
}

static void bw_fn(void *arg, int ith, int nth)
{
    struct bw_job *j = arg;
    size_t share = j->bytes / (size_t)nth;
    const uint8_t *p = j->buf + share * (size_t)ith;
    if (j->touch) {
        memset((void *)(uintptr_t)p, ith + 1, share);
        return;
    }
    uint64_t s;
#if defined(__x86_64__)
    if (j->isa == CPU_ISA_AVX512BF16)
        s = read512(p, share, j->streams);
    else if (j->isa == CPU_ISA_AVX2)
        s = read256(p, share, j->streams);
    else
#endif
        s = read_scalar(p, share);
    sink_u64 = s;
}

double cpu_measure_read_bw(struct cpu_pool *p, size_t bytes)
{
    int nth = cpu_pool_n_threads(p);
    if (bytes == 0)
        bytes = (size_t)1 << 30;
    size_t unit = (size_t)4096 * (size_t)nth;
    bytes = bytes / unit * unit;
    if (bytes == 0)
        bytes = unit;
    uint8_t *buf = aligned_alloc(4096, bytes);
    if (!buf)
        return -1.0;
    /* Huge pages where the kernel allows them (THP "madvise" mode): fewer
     * TLB misses and faster first touch; the backend's weights want it too. */
    madvise(buf, bytes, MADV_HUGEPAGE);
    struct bw_job j = {.buf = buf, .bytes = bytes, .isa = cpu_isa_detect(), .touch = 1};
    cpu_pool_run(p, bw_fn, &j); /* fault the pages in on their threads */
    j.touch = 0;
    double best = 0;
    for (int i = 0; i < 2 * N_PASSES; i++) {
        j.streams = i % 2 ? 4 : 1;
        double t0 = rl_mono_s();
        cpu_pool_run(p, bw_fn, &j);
        double gbs = (double)bytes / (rl_mono_s() - t0) * 1e-9;
        if (gbs > best)
            best = gbs;
    }
    free(buf);
    return best;
}

/* ------------------------------------------------------------------ peaks */

struct peak_job {
    enum cpu_isa isa;
    int bf16;           /* 1: vdpbf16ps, 0: f32 FMA */
    long iters;
};

/* Operands come through volatiles so the compiler cannot fold them. */
static volatile float src_a = 1.0f, src_b = 0.0f;

#if defined(__x86_64__)
/* A SIMD peak loop, NAME(iters) under TARGET: INIT declares the operands
 * a and b, N accumulators of vector type VT start from src_a, iters rounds
 * of c[i] = STEP(c[i]) run over all of them (independent chains,
 * unrolled), and REDUCE folds their sum to the float returned. */
#define DEFINE_PEAK(TARGET, NAME, VT, N, SET1, ADD, REDUCE, INIT, STEP)       \
    TARGET static float NAME(long iters)                                      \
    {                                                                         \
        INIT;                                                                 \
        VT c[N];                                                              \
        for (int i = 0; i < N; i++)                                           \
            c[i] = SET1(src_a);                                               \
        for (long it = 0; it < iters; it++) {                                 \
            _Pragma("GCC unroll 16") for (int i = 0; i < N; i++) c[i] = STEP; \
        }                                                                     \
        VT s = c[0];                                                          \
        for (int i = 1; i < N; i++)                                           \
            s = ADD(s, c[i]);                                                 \
        return REDUCE(s);                                                     \
    }

T2 static inline float sum_256(__m256 s)
{
    float t[8];
    _mm256_storeu_ps(t, s);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

/* Sixteen independent accumulators cover latency x throughput (about 6 x 2
 * on current cores) with room to spare. */
DEFINE_PEAK(T512, peak_bf16_512, __m512, 16, _mm512_set1_ps, _mm512_add_ps, _mm512_reduce_add_ps,
            __m512bh a = (__m512bh)_mm512_set1_epi16((short)0x3f80); /* bf16 1.0 */
            __m512bh b = (__m512bh)_mm512_set1_epi16((short)(src_b != 0.0f ? 0x3f80 : 0)),
            _mm512_dpbf16_ps(c[i], a, b))
DEFINE_PEAK(T512, peak_f32_512, __m512, 16, _mm512_set1_ps, _mm512_add_ps, _mm512_reduce_add_ps,
            __m512 a = _mm512_set1_ps(src_a); __m512 b = _mm512_set1_ps(src_b),
            _mm512_fmadd_ps(a, b, c[i]))
/* Twelve accumulators: AVX2 has only sixteen registers. */
DEFINE_PEAK(T2, peak_f32_256, __m256, 12, _mm256_set1_ps, _mm256_add_ps, sum_256,
            __m256 a = _mm256_set1_ps(src_a); __m256 b = _mm256_set1_ps(src_b),
            _mm256_fmadd_ps(a, b, c[i]))
#endif

static float peak_f32_scalar(long iters)
{
    float a = src_a, b = src_b, c[8];
    for (int i = 0; i < 8; i++)
        c[i] = a;
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < 8; i++)
            c[i] = c[i] * b + a;
    return c[0] + c[1] + c[2] + c[3] + c[4] + c[5] + c[6] + c[7];
}

/* flop per inner iteration of each loop above */
static double peak_flop_per_iter(enum cpu_isa isa, int bf16)
{
    if (bf16)
        return 16.0 * 64.0;
    if (isa == CPU_ISA_AVX512BF16)
        return 16.0 * 32.0;
    if (isa == CPU_ISA_AVX2)
        return 12.0 * 16.0;
    return 8.0 * 2.0;
}

static void peak_fn(void *arg, int ith, int nth)
{
    struct peak_job *j = arg;
    float r;
#if defined(__x86_64__)
    if (j->bf16)
        r = peak_bf16_512(j->iters);
    else if (j->isa == CPU_ISA_AVX512BF16)
        r = peak_f32_512(j->iters);
    else if (j->isa == CPU_ISA_AVX2)
        r = peak_f32_256(j->iters);
    else
#endif
        r = peak_f32_scalar(j->iters);
    sink_f32 = r;
}

static double measure_peak(struct cpu_pool *p, enum cpu_isa isa, int bf16)
{
    struct peak_job j = {.isa = isa, .bf16 = bf16, .iters = 1000};
    double fpi = peak_flop_per_iter(isa, bf16);
    /* Calibrate to 20-40 ms per pass: long enough for timer noise and
     * frequency ramps not to matter, short enough for many passes. */
    for (;;) {
        double dt = 1e30; /* best of three: a preempted pass must not stop
                           * the calibration early */
        for (int r = 0; r < 3; r++) {
            double t0 = rl_mono_s();
            cpu_pool_run(p, peak_fn, &j);
            double d = rl_mono_s() - t0;
            if (d < dt)
                dt = d;
        }
        if (dt > 0.01 || j.iters > (1L << 40))
            break;
        j.iters *= 2;
    }
    j.iters *= 2;
    double best = 0;
    for (int i = 0; i < N_PASSES; i++) {
        double t0 = rl_mono_s();
        cpu_pool_run(p, peak_fn, &j);
        double dt = rl_mono_s() - t0;
        double g = fpi * (double)j.iters * cpu_pool_n_threads(p) / dt * 1e-9;
        if (g > best)
            best = g;
    }
    return best;
}

double cpu_measure_bf16_peak(struct cpu_pool *p, const struct cpu_kernels *k)
{
    enum cpu_isa isa = k ? k->isa : cpu_isa_detect();
    if (isa != CPU_ISA_AVX512BF16 || cpu_isa_detect() < CPU_ISA_AVX512BF16)
        return 0.0;
    return measure_peak(p, isa, 1);
}

double cpu_measure_f32_peak(struct cpu_pool *p, const struct cpu_kernels *k)
{
    enum cpu_isa isa = k ? k->isa : cpu_isa_detect();
    if (isa > cpu_isa_detect())
        return 0.0;
    return measure_peak(p, isa, 0);
}
