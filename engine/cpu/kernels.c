/* engine/cpu/kernels.c - ISA detection, the dispatch table, and the portable
 * scalar kernels.
 *
 * The scalar table is the reference every SIMD table is tested against and
 * the fallback for CPUs (or targets) with nothing better; it is plain C11
 * with no intrinsics and no assumption about the host.
 *
 * Reduction order (the batch invariance contract of kernels.h): each output
 * (m, n) keeps eight f32 partial sums, lane j taking k = j, j+8, j+16, ...;
 * a K tail shorter than eight adds to lanes 0..tail-1 only. The lanes are
 * then folded by one fixed tree, (l + l+4), (l + l+2), (0 + 1). Nothing
 * depends on M, n0/n1 or on neighbouring outputs, so the scalar table is
 * batch invariant by construction. Eight lanes rather than one serial sum
 * also cut the rounding error on K = 3072 by about sqrt(8).
 *
 * Detection: cpu_isa_detect() asks cpuid for the instruction sets and xgetbv
 * for the OS having enabled the register state (a hypervisor may hide the
 * AVX-512 state even where the CPU has it). Called from any thread; results
 * are not cached, the caller keeps the table it gets. */
#include "cpu/kernels.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

/* ---------------------------------------------------------------- values */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t cpu_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    /* A NaN must stay a NaN: plain rounding could carry its payload into
     * the exponent and give infinity. Set the quiet bit instead. */
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Round to nearest, ties to even: add 0x7fff plus the lowest kept bit. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float cpu_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

float cpu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) /* inf / NaN: keep the payload */
        return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign);
        /* Subnormal half: man * 2^-24, exact in f32. */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

/* ------------------------------------------------------------- reductions */

#define SC_LANES 8

static float sc_fold(const float s[SC_LANES])
{
    float a0 = s[0] + s[4], a1 = s[1] + s[5], a2 = s[2] + s[6], a3 = s[3] + s[7];
    float b0 = a0 + a2, b1 = a1 + a3;
    return b0 + b1;
}

/* The three gemm flavours share one loop; only the element loads differ. */
#define SC_GEMM_BODY(LOADX, LOADW)                                           \
    for (int m = 0; m < M; m++) {                                            \
        for (int n = n0; n < n1; n++) {                                      \
            float s[SC_LANES] = {0};                                         \
            int k = 0;                                                       \
            for (; k + SC_LANES <= K; k += SC_LANES)                         \
                for (int j = 0; j < SC_LANES; j++)                           \
                    s[j] += LOADX(m, k + j) * LOADW(n, k + j);               \
            for (int j = 0; k + j < K; j++)                                  \
                s[j] += LOADX(m, k + j) * LOADW(n, k + j);                   \
            y[(size_t)m * ldy + n] = sc_fold(s);                             \
        }                                                                    \
    }

#define SC_XF32(m, k) (x[(size_t)(m) * ldx + (k)])
#define SC_XBF16(m, k) (cpu_bf16_to_f32(x[(size_t)(m) * ldx + (k)]))
#define SC_WF32(n, k) (w[(size_t)(n) * K + (k)])
#define SC_WBF16(n, k) (cpu_bf16_to_f32(w[(size_t)(n) * K + (k)]))
#define SC_WF16(n, k) (cpu_f16_to_f32(w[(size_t)(n) * K + (k)]))

static void sc_gemm_f32(int M, int n0, int n1, int K, const float *x, int ldx,
                        const float *w, float *y, int ldy)
{
    SC_GEMM_BODY(SC_XF32, SC_WF32)
}

static void sc_gemm_bf16(int M, int n0, int n1, int K, const uint16_t *x,
                         int ldx, const uint16_t *w, float *y, int ldy)
{
    SC_GEMM_BODY(SC_XBF16, SC_WBF16)
}

static void sc_gemm_f16(int M, int n0, int n1, int K, const float *x, int ldx,
                        const uint16_t *w, float *y, int ldy)
{
    SC_GEMM_BODY(SC_XF32, SC_WF16)
}

static void sc_f32_to_bf16(const float *x, uint16_t *y, int n)
{
    for (int i = 0; i < n; i++)
        y[i] = cpu_f32_to_bf16(x[i]);
}

static void sc_bf16_to_f32(const uint16_t *x, float *y, int n)
{
    for (int i = 0; i < n; i++)
        y[i] = cpu_bf16_to_f32(x[i]);
}

static float sc_dot_f32(const float *a, const float *b, int n)
{
    float s[SC_LANES] = {0};
    int k = 0;
    for (; k + SC_LANES <= n; k += SC_LANES)
        for (int j = 0; j < SC_LANES; j++)
            s[j] += a[k + j] * b[k + j];
    for (int j = 0; k + j < n; j++)
        s[j] += a[k + j] * b[k + j];
    return sc_fold(s);
}

static float sc_dot_bf16_f32(const uint16_t *a, const float *b, int n)
{
    float s[SC_LANES] = {0};
    int k = 0;
    for (; k + SC_LANES <= n; k += SC_LANES)
        for (int j = 0; j < SC_LANES; j++)
            s[j] += cpu_bf16_to_f32(a[k + j]) * b[k + j];
    for (int j = 0; k + j < n; j++)
        s[j] += cpu_bf16_to_f32(a[k + j]) * b[k + j];
    return sc_fold(s);
}

static void sc_axpy_f32(float a, const float *x, float *y, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

static void sc_axpy_bf16(float a, const uint16_t *x, float *y, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += a * cpu_bf16_to_f32(x[i]);
}

static void sc_lora_up(int r, const float *t, const float *w, size_t ldw, float *y, int n)
{
    for (int i = 0; i < n; i++) {
        float s = 0;
        for (int k = 0; k < r; k++)
            s += t[k] * w[(size_t)k * ldw + (size_t)i];
        y[i] += s;
    }
}

void cpu_pack_bf16(const uint16_t *w, int N, int K, uint16_t *out)
{
    size_t kp = (size_t)K / 2;
    for (int p = 0; p < N / 16; p++) {
        uint16_t *o = out + (size_t)p * kp * 32;
        for (int c = 0; c < 16; c++) {
            const uint16_t *r = w + ((size_t)p * 16 + (size_t)c) * (size_t)K;
            for (size_t i = 0; i < kp; i++) {
                o[i * 32 + (size_t)c * 2] = r[2 * i];
                o[i * 32 + (size_t)c * 2 + 1] = r[2 * i + 1];
            }
        }
    }
}

static const struct cpu_kernels sc_table = {
    .isa = CPU_ISA_SCALAR,
    .gemm_f32 = sc_gemm_f32,
    .gemm_bf16 = sc_gemm_bf16,
    .gemm_f16 = sc_gemm_f16,
    .f32_to_bf16 = sc_f32_to_bf16,
    .bf16_to_f32 = sc_bf16_to_f32,
    .dot_f32 = sc_dot_f32,
    .lora_up = sc_lora_up,
    .dot_bf16_f32 = sc_dot_bf16_f32,
    .axpy_f32 = sc_axpy_f32,
    .axpy_bf16 = sc_axpy_bf16,
    .gemm_q = cpu_gemm_q_scalar,
};

const struct cpu_kernels *cpu_kernels_scalar(void)
{
    return &sc_table;
}

/* -------------------------------------------------------------- detection */

#if defined(__x86_64__)
static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

enum cpu_isa cpu_isa_detect(void)
{
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return CPU_ISA_SCALAR;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1,
        f16c = (c >> 29) & 1;
    if (!osxsave || !avx)
        return CPU_ISA_SCALAR;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) /* XMM and YMM state */
        return CPU_ISA_SCALAR;
    if (__get_cpuid_max(0, NULL) < 7)
        return CPU_ISA_SCALAR;
    __cpuid_count(7, 0, a, b, c, d);
    int avx2 = (b >> 5) & 1, f512 = (b >> 16) & 1, dq = (b >> 17) & 1,
        bw = (b >> 30) & 1, vl = (b >> 31) & 1, vnni = (c >> 11) & 1;
    __cpuid_count(7, 1, a, b, c, d);
    int bf16 = (a >> 5) & 1;
    /* opmask, ZMM_Hi256, Hi16_ZMM state */
    int os512 = (xcr0 & 0xe0) == 0xe0;
    if (f512 && dq && bw && vl && bf16 && vnni && os512 && fma && f16c && avx2)
        return CPU_ISA_AVX512BF16;
    if (avx2 && fma && f16c)
        return CPU_ISA_AVX2;
#endif
    return CPU_ISA_SCALAR;
}

int cpu_isa_parse(const char *s)
{
    static const char *const names[CPU_ISA_N] = {"scalar", "avx2",
                                                 "avx512bf16"};
    if (!s)
        return -1;
    if (strcmp(s, "auto") == 0)
        return (int)cpu_isa_detect();
    for (int i = 0; i < CPU_ISA_N; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

const char *cpu_isa_name(enum cpu_isa isa)
{
    switch (isa) {
    case CPU_ISA_SCALAR: return "scalar";
    case CPU_ISA_AVX2: return "avx2";
    case CPU_ISA_AVX512BF16: return "avx512bf16";
    default: return "unknown";
    }
}

const struct cpu_kernels *cpu_kernels_get(enum cpu_isa isa)
{
    if ((int)isa < 0 || isa >= CPU_ISA_N || isa > cpu_isa_detect())
        return NULL;
    switch (isa) {
    case CPU_ISA_SCALAR: return cpu_kernels_scalar();
    case CPU_ISA_AVX2: return cpu_kernels_avx2();
    case CPU_ISA_AVX512BF16: return cpu_kernels_avx512bf16();
    default: return NULL;
    }
}
