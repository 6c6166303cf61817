/* engine/cpu/kernels_avx2.c - the AVX2 + FMA + F16C table.
 *
 * Same design as kernels_avx512.c at half the width, compiled through
 * function target attributes so the build stays generic x86-64: every
 * output (m, n) owns one 8-lane f32 accumulator that walks k in steps of 8
 * (bf16 widened by a zero-extend and a 16-bit shift, halves by vcvtph2ps),
 * then one zero-padded step for the K tail, then red8()'s fixed tree. The
 * 2x4 register tile (M > 1), the 8-row matrix-vector path (M = 1) and the
 * edge tiles all run that same per-pair recipe, so results are batch
 * invariant (kernels.h) whichever of them the shared driver
 * (gemm_driver.h) hands an output to.
 *
 * red8() folds eight accumulators at once and performs, for each of them,
 * exactly s1[l] = v[l] + v[l+4], s2[l] = s1[l] + s1[l+2], out = s2[0] + s2[1],
 * whatever slot it sits in. */
#include "cpu/gemm_driver.h"
#include "cpu/kernels.h"

#include <stddef.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define T2 __attribute__((target("avx2,fma,f16c")))
#define AI __attribute__((always_inline)) inline

/* Output position 4j+q of red8() holds accumulator slot j+2q. */
T2 static AI __m256 red8(const __m256 a[8])
{
    __m256 b[4], c[2];
    for (int i = 0; i < 4; i++)
        b[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x31));
    for (int i = 0; i < 2; i++) {
        __m256d p = _mm256_castps_pd(b[2 * i]), q = _mm256_castps_pd(b[2 * i + 1]);
        c[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(p, q)),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(p, q)));
    }
    return _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], 0x88),
                         _mm256_shuffle_ps(c[0], c[1], 0xdd));
}

T2 static AI __m256 ld_bf16(const uint16_t *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

T2 static AI __m256 ld_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const void *)p));
}

/* Tails: copy the last n < 8 elements into a zeroed block first; AVX2 has
 * no 16-bit masked load, and the copy costs nothing next to K/8 steps. */
T2 static AI __m256 ld_bf16_t(const uint16_t *p, int n)
{
    uint16_t b[8] = {0};
    memcpy(b, p, (size_t)n * sizeof *p);
    return ld_bf16(b);
}

T2 static AI __m256 ld_f16_t(const uint16_t *p, int n)
{
    uint16_t b[8] = {0};
    memcpy(b, p, (size_t)n * sizeof *p);
    return ld_f16(b);
}

T2 static AI __m256 ld_f32_t(const float *p, int n)
{
    float b[8] = {0};
    memcpy(b, p, (size_t)n * sizeof *p);
    return _mm256_loadu_ps(b);
}

#define BF_LX(p) ld_bf16(p)
#define BF_LXT(p, n) ld_bf16_t(p, n)
#define BF_LW BF_LX
#define BF_LWT BF_LXT
#define F32_LX(p) _mm256_loadu_ps(p)
#define F32_LXT(p, n) ld_f32_t(p, n)
#define F32_LW F32_LX
#define F32_LWT F32_LXT
#define F16_LX F32_LX
#define F16_LXT F32_LXT
#define F16_LW(p) ld_f16(p)
#define F16_LWT(p, n) ld_f16_t(p, n)

/* Every accumulator of a tile or row to +0. */
#define ACC_ZERO(acc) _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps()

/* P##_tile(MR <= 2, NR <= 4): slot m + 2n, so red8's 128-bit lane m is
 * y[m][0..3]. P##_row8: one x row against eight w rows, slot n/4 + 2(n%4),
 * so red8's output is y[0..7] in order. gemm_driver.h stamps P##_tile_any
 * and P##_gemm over them: full tiles of 2 x 4, rows of 8. */
#define DEFINE_GEMM(P, XT, WT)                                                \
    T2 static AI void P##_tile(const int MR, const int NR, int K,             \
                               const XT *x, int ldx, const WT *w, float *y,   \
                               int ldy)                                       \
    {                                                                         \
        __m256 acc[8];                                                        \
        ACC_ZERO(acc);                                                        \
        int k = 0;                                                            \
        for (; k + 8 <= K; k += 8) {                                          \
            __m256 wv[4];                                                     \
            _Pragma("GCC unroll 4") for (int n = 0; n < NR; n++) wv[n] =      \
                P##_LW(w + (size_t)n * K + k);                                \
            _Pragma("GCC unroll 2") for (int m = 0; m < MR; m++)              \
            {                                                                 \
                __m256 xv = P##_LX(x + (size_t)m * ldx + k);                  \
                _Pragma("GCC unroll 4") for (int n = 0; n < NR; n++)          \
                    acc[m + 2 * n] = _mm256_fmadd_ps(xv, wv[n], acc[m + 2 * n]); \
            }                                                                 \
        }                                                                     \
        if (k < K) {                                                          \
            __m256 wv[4];                                                     \
            _Pragma("GCC unroll 4") for (int n = 0; n < NR; n++) wv[n] =      \
                P##_LWT(w + (size_t)n * K + k, K - k);                        \
            _Pragma("GCC unroll 2") for (int m = 0; m < MR; m++)              \
            {                                                                 \
                __m256 xv = P##_LXT(x + (size_t)m * ldx + k, K - k);          \
                _Pragma("GCC unroll 4") for (int n = 0; n < NR; n++)          \
                    acc[m + 2 * n] = _mm256_fmadd_ps(xv, wv[n], acc[m + 2 * n]); \
            }                                                                 \
        }                                                                     \
        __m256 r = red8(acc);                                                 \
        __m128 r0 = _mm256_castps256_ps128(r), r1 = _mm256_extractf128_ps(r, 1); \
        if (NR == 4) {                                                        \
            _mm_storeu_ps(y, r0);                                             \
            if (MR == 2)                                                      \
                _mm_storeu_ps(y + ldy, r1);                                   \
        } else {                                                              \
            float t[8];                                                       \
            _mm256_storeu_ps(t, r);                                           \
            for (int m = 0; m < MR; m++)                                      \
                for (int n = 0; n < NR; n++)                                  \
                    y[(size_t)m * ldy + n] = t[4 * m + n];                    \
        }                                                                     \
    }                                                                         \
                                                                              \
    T2 static void P##_row8(int K, const XT *x, const WT *w, float *y)        \
    {                                                                         \
        __m256 acc[8];                                                        \
        ACC_ZERO(acc);                                                        \
        int k = 0;                                                            \
        for (; k + 8 <= K; k += 8) {                                          \
            __m256 xv = P##_LX(x + k);                                        \
            _Pragma("GCC unroll 8") for (int n = 0; n < 8; n++)               \
                acc[n / 4 + 2 * (n % 4)] = _mm256_fmadd_ps(                   \
                    xv, P##_LW(w + (size_t)n * K + k), acc[n / 4 + 2 * (n % 4)]); \
        }                                                                     \
        if (k < K) {                                                          \
            __m256 xv = P##_LXT(x + k, K - k);                                \
            _Pragma("GCC unroll 8") for (int n = 0; n < 8; n++)               \
                acc[n / 4 + 2 * (n % 4)] = _mm256_fmadd_ps(                   \
                    xv, P##_LWT(w + (size_t)n * K + k, K - k),                \
                    acc[n / 4 + 2 * (n % 4)]);                                \
        }                                                                     \
        _mm256_storeu_ps(y, red8(acc));                                       \
    }                                                                         \
                                                                              \
    CPU_GEMM_DRIVER(T2, P, XT, WT, 2, 8)

DEFINE_GEMM(BF, uint16_t, uint16_t)
DEFINE_GEMM(F32, float, float)
DEFINE_GEMM(F16, float, uint16_t)

/* ---- conversions and attention helpers ---------------------------------- */

/* Same bits as cpu_f32_to_bf16(): RNE by integer add, NaN quietened. */
T2 static AI __m256i cvt8_bf16(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i q = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    return _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan));
}

T2 static void av2_f32_to_bf16(const float *x, uint16_t *y, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = cvt8_bf16(_mm256_loadu_ps(x + i));
        __m256i b = cvt8_bf16(_mm256_loadu_ps(x + i + 8));
        /* packus works per 128-bit lane; the permute restores order. */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
        _mm256_storeu_si256((void *)(y + i), p);
    }
    for (; i < n; i++)
        y[i] = cpu_f32_to_bf16(x[i]);
}

T2 static void av2_bf16_to_f32(const uint16_t *x, float *y, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, ld_bf16(x + i));
    for (; i < n; i++)
        y[i] = cpu_bf16_to_f32(x[i]);
}

T2 static AI float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* dot (two chains of 8 lanes, then the zero-padded tail into the first)
 * and axpy over a row of AT elements against f32: the same loops for f32
 * and bf16 rows, only the loads of the row differ (LD a full vector of 8,
 * LDT(p, n) the last n < 8, SC one element as a float). */
#define F32_LD(p) _mm256_loadu_ps(p)
#define F32_SC(v) (v)
#define DEFINE_DOT_AXPY(DOT, AXPY, AT, LD, LDT, SC)                           \
    T2 static float DOT(const AT *a, const float *b, int n)                   \
    {                                                                         \
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();            \
        int i = 0;                                                            \
        for (; i + 16 <= n; i += 16) {                                        \
            s0 = _mm256_fmadd_ps(LD(a + i), _mm256_loadu_ps(b + i), s0);      \
            s1 = _mm256_fmadd_ps(LD(a + i + 8), _mm256_loadu_ps(b + i + 8), s1); \
        }                                                                     \
        for (; i < n; i += 8) {                                               \
            int r = n - i < 8 ? n - i : 8;                                    \
            s0 = _mm256_fmadd_ps(LDT(a + i, r), ld_f32_t(b + i, r), s0);      \
        }                                                                     \
        return hsum8(_mm256_add_ps(s0, s1));                                  \
    }                                                                         \
                                                                              \
    T2 static void AXPY(float a, const AT *x, float *y, int n)                \
    {                                                                         \
        __m256 av = _mm256_set1_ps(a);                                        \
        int i = 0;                                                            \
        for (; i + 8 <= n; i += 8)                                            \
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, LD(x + i), _mm256_loadu_ps(y + i))); \
        for (; i < n; i++)                                                    \
            y[i] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(SC(x[i])), \
                                              _mm_set_ss(y[i])));             \
    }

DEFINE_DOT_AXPY(av2_dot_f32, av2_axpy_f32, float, F32_LD, ld_f32_t, F32_SC)
DEFINE_DOT_AXPY(av2_dot_bf16_f32, av2_axpy_bf16, uint16_t, ld_bf16, ld_bf16_t, cpu_bf16_to_f32)

/* kernels.h lora_up: 32 columns in four registers while the r rows go by,
 * then 8, then the tail through a zero-padded copy */
T2 static void av2_lora_up(int r, const float *t, const float *w, size_t ldw, float *y, int n)
{
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < r; k++) {
            const float *wr = w + (size_t)k * ldw + i;
            __m256 tk = _mm256_set1_ps(t[k]);
            a0 = _mm256_fmadd_ps(tk, _mm256_loadu_ps(wr), a0);
            a1 = _mm256_fmadd_ps(tk, _mm256_loadu_ps(wr + 8), a1);
            a2 = _mm256_fmadd_ps(tk, _mm256_loadu_ps(wr + 16), a2);
            a3 = _mm256_fmadd_ps(tk, _mm256_loadu_ps(wr + 24), a3);
        }
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), a0));
        _mm256_storeu_ps(y + i + 8, _mm256_add_ps(_mm256_loadu_ps(y + i + 8), a1));
        _mm256_storeu_ps(y + i + 16, _mm256_add_ps(_mm256_loadu_ps(y + i + 16), a2));
        _mm256_storeu_ps(y + i + 24, _mm256_add_ps(_mm256_loadu_ps(y + i + 24), a3));
    }
    for (; i < n; i += 8) {
        int m = n - i < 8 ? n - i : 8;
        __m256 a = _mm256_setzero_ps();
        for (int k = 0; k < r; k++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(t[k]), ld_f32_t(w + (size_t)k * ldw + i, m), a);
        float out[8];
        _mm256_storeu_ps(out, _mm256_add_ps(ld_f32_t(y + i, m), a));
        memcpy(y + i, out, (size_t)m * sizeof *out);
    }
}

static const struct cpu_kernels av2_table = {
    .isa = CPU_ISA_AVX2,
    .gemm_f32 = F32_gemm,
    .gemm_bf16 = BF_gemm,
    .gemm_f16 = F16_gemm,
    .f32_to_bf16 = av2_f32_to_bf16,
    .bf16_to_f32 = av2_bf16_to_f32,
    .dot_f32 = av2_dot_f32,
    .lora_up = av2_lora_up,
    .dot_bf16_f32 = av2_dot_bf16_f32,
    .axpy_f32 = av2_axpy_f32,
    .axpy_bf16 = av2_axpy_bf16,
    .gemm_q = cpu_gemm_q_avx2,
};

const struct cpu_kernels *cpu_kernels_avx2(void)
{
    return &av2_table;
}

#else /* !__x86_64__ */

const struct cpu_kernels *cpu_kernels_avx2(void)
{
    return NULL;
}

#endif
