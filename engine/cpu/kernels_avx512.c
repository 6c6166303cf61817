/* engine/cpu/kernels_avx512.c - the AVX-512 table: BF16 dot products
 * (vdpbf16ps), F16C-style half loads, f32 FMA; and the optional entries the
 * backend's hot paths use: gemm_bf16p on packed panels (the BF16 weights'
 * kernel, documented at its definition below), attention scores / softmax
 * / P x V, rmsnorm and SwiGLU.
 *
 * Everything here is compiled for the target through function attributes,
 * not -march, so the build stays generic x86-64 and cpu_kernels_get() only
 * hands this table out after cpuid says the CPU can run it.
 *
 * GEMM shape: "dot-product style". Every output (m, n) owns one 16-lane f32
 * accumulator. It walks k in fixed vector steps (32 bf16 pairs, or 16 f32 /
 * f16 elements), then one masked step for the K tail (zeros beyond K add
 * nothing), and is folded to a scalar by red16()'s fixed tree. That per-pair
 * recipe is identical in every code path - the 4x4 register tile used for
 * M > 1, the 16-row matrix-vector path used for M = 1, and the edge tiles -
 * which is what makes the kernels batch invariant (kernels.h): only *which*
 * pairs share a loop changes with M, n0/n1, never the arithmetic of a pair.
 *
 * red16() folds sixteen accumulators at once with a transpose-add tree. It
 * performs, for each accumulator, exactly the scalar tree
 *   s1[l] = v[l] + v[l+8], s2[l] = s1[l] + s1[l+4], s3[l] = s2[l] + s2[l+2],
 *   out = s3[0] + s3[1]
 * whichever of the sixteen slots the accumulator sits in (f32 addition is
 * commutative bit for bit), so a lone row and a row in a full tile agree;
 * tests/unit/test_kernels.c checks exactly that.
 *
 * Which outputs share a tile - blocking for M > 1, the matrix-vector path
 * for M = 1, the edge tiles - is decided by the driver both SIMD tables
 * share (gemm_driver.h): here, chunks of x rows whose bf16 panel stays in
 * the 1 MB L2, swept by tiles of four w rows (24 KB at K = 3072, so the
 * tile stays in L1 while every 4-row group of the chunk reuses it).
 *
 * vdpbf16ps treats subnormal bf16 inputs as zero and flushes subnormal
 * results (DAZ/FTZ in the instruction definition), so this table may differ
 * from the scalar one on denormals - kernels.h allows ISAs to differ.
 * The bf16 conversion, by contrast, is done with integer ops so it matches
 * cpu_f32_to_bf16() bit for bit (vcvtneps2bf16 would flush subnormals). */
#include "cpu/gemm_driver.h"
#include "cpu/kernels.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define T512                                                                  \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,"   \
                          "avx2,fma,f16c")))
#define AI __attribute__((always_inline)) inline

/* Output position 4j+q of red16() holds accumulator slot j+4q. */
T512 static AI __m512 red16(const __m512 a[16])
{
    __m512 b[8], c[4], d[2];
    for (int i = 0; i < 8; i++) {
        __m512 lo = _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44);
        __m512 hi = _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xee);
        b[i] = _mm512_add_ps(lo, hi);
    }
    for (int i = 0; i < 4; i++) {
        __m512 lo = _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88);
        __m512 hi = _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xdd);
        c[i] = _mm512_add_ps(lo, hi);
    }
    for (int i = 0; i < 2; i++) {
        __m512d p = _mm512_castps_pd(c[2 * i]), q = _mm512_castps_pd(c[2 * i + 1]);
        d[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(p, q)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(p, q)));
    }
    return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88),
                         _mm512_shuffle_ps(d[0], d[1], 0xdd));
}

/* ---- element types: how a step loads and combines ------------------------ */

/* bf16 x bf16 -> f32, 32 pairs per step */
#define BF_KS 32
#define BF_VX __m512i
#define BF_VW __m512i
#define BF_LX(p) _mm512_loadu_si512((const void *)(p))
#define BF_LXM(msk, p) _mm512_maskz_loadu_epi16((__mmask32)(msk), (const void *)(p))
#define BF_LW BF_LX
#define BF_LWM BF_LXM
#define BF_STEP(acc, xv, wv) _mm512_dpbf16_ps(acc, (__m512bh)(xv), (__m512bh)(wv))

/* f32 x f32, 16 per step */
#define F32_KS 16
#define F32_VX __m512
#define F32_VW __m512
#define F32_LX(p) _mm512_loadu_ps((const void *)(p))
#define F32_LXM(msk, p) _mm512_maskz_loadu_ps((__mmask16)(msk), (const void *)(p))
#define F32_LW F32_LX
#define F32_LWM F32_LXM
#define F32_STEP(acc, xv, wv) _mm512_fmadd_ps(xv, wv, acc)

/* f32 x f16, 16 per step */
#define F16_KS 16
#define F16_VX __m512
#define F16_VW __m512
#define F16_LX F32_LX
#define F16_LXM F32_LXM
#define F16_LW(p) _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(p)))
#define F16_LWM(msk, p)                                                      \
    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)(msk), (const void *)(p)))
#define F16_STEP F32_STEP

/* ---- the three code paths, stamped out per element type ------------------
 *
 * P##_tile(MR, NR): MR <= 4 rows of x against NR <= 4 rows of w, accumulator
 *   slot m + 4n, so red16's 128-bit lane m is y[m][0..3].
 * P##_row16: one row of x against sixteen rows of w, slot n/4 + 4(n%4), so
 *   red16's output is y[0..15] in order. It walks the rows one after the
 *   other, so the weights stream through memory strictly in address order
 *   (the hardware prefetcher's best case; the 16 chains still overlap in
 *   the out-of-order window). Measured on Zen 5 against the alternatives -
 *   all sixteen rows per k-step, with or without software prefetch of the
 *   rows or of the next block - it was as fast or faster, so there is no
 *   software prefetch.
 * gemm_driver.h stamps P##_tile_any (edge tiles, compile-time MR/NR through
 * a switch) and P##_gemm over them: full tiles of 4 x 4, rows of 16. */
#define DEFINE_GEMM(P, XT, WT)                                                \
    T512 static AI void P##_tile(const int MR, const int NR, int K,           \
                                 const XT *x, int ldx, const WT *w, float *y, \
                                 int ldy)                                     \
    {                                                                         \
        __m512 acc[16];                                                       \
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) acc[i] =        \
            _mm512_setzero_ps();                                              \
        int k = 0;                                                            \
        for (; k + P##_KS <= K; k += P##_KS) {                                \
            P##_VW wv[4];                                                     \
            _Pragma("GCC unroll 4") for (int n = 0; n < NR; n++) wv[n] =      \
                P##_LW(w + (size_t)n * K + k);                                \
            _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)              \
            {                                                                 \
                P##_VX xv = P##_LX(x + (size_t)m * ldx + k);                  \
                _Pragma("GCC unroll 4") for (int n = 0; n < NR; n++)          \
                    acc[m + 4 * n] = P##_STEP(acc[m + 4 * n], xv, wv[n]);     \
            }                                                                 \
        }                                                                     \
        if (k < K) {                                                          \
            unsigned msk = (1u << (K - k)) - 1u;                              \
            P##_VW wv[4];                                                     \
            _Pragma("GCC unroll 4") for (int n = 0; n < NR; n++) wv[n] =      \
                P##_LWM(msk, w + (size_t)n * K + k);                          \
            _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)              \
            {                                                                 \
                P##_VX xv = P##_LXM(msk, x + (size_t)m * ldx + k);            \
                _Pragma("GCC unroll 4") for (int n = 0; n < NR; n++)          \
                    acc[m + 4 * n] = P##_STEP(acc[m + 4 * n], xv, wv[n]);     \
            }                                                                 \
        }                                                                     \
        __m512 r = red16(acc);                                                \
        /* Lane m of r is row m: store it with a mask from a base shifted \
         * back by 4m floats, so no shuffle is needed. Masked-off lanes   \
         * are never touched, so the shifted base is never dereferenced. */\
        _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)                  \
            _mm512_mask_storeu_ps(                                            \
                (float *)((uintptr_t)(y + (size_t)m * ldy) - 16u * m),        \
                (__mmask16)(((1u << NR) - 1u) << (4 * m)), r);                \
    }                                                                         \
                                                                              \
    T512 static void P##_row16(int K, const XT *x, const WT *w, float *y)     \
    {                                                                         \
        __m512 acc[16];                                                       \
        for (int n = 0; n < 16; n++) {                                        \
            const WT *wr = w + (size_t)n * K;                                 \
            __m512 a = _mm512_setzero_ps();                                   \
            int k = 0;                                                        \
            for (; k + P##_KS <= K; k += P##_KS)                              \
                a = P##_STEP(a, P##_LX(x + k), P##_LW(wr + k));               \
            if (k < K) {                                                      \
                unsigned msk = (1u << (K - k)) - 1u;                          \
                a = P##_STEP(a, P##_LXM(msk, x + k), P##_LWM(msk, wr + k));   \
            }                                                                 \
            acc[n / 4 + 4 * (n % 4)] = a;                                     \
        }                                                                     \
        _mm512_storeu_ps(y, red16(acc));                                      \
    }                                                                         \
                                                                              \
    CPU_GEMM_DRIVER(T512, P, XT, WT, 4, 16)

DEFINE_GEMM(BF, uint16_t, uint16_t)
DEFINE_GEMM(F32, float, float)
DEFINE_GEMM(F16, float, uint16_t)

/* ---- value helpers shared below ---------------------------------------- */

/* Same bits as cpu_f32_to_bf16(): RNE by integer add, NaN quietened. */
T512 static AI __m256i cvt16_bf16(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q));
}

/* exp(x) for x <= 0 (softmax arguments; larger x would also work up to 88):
 * 2^n * p(r), n = round(x / ln2), r = x - n ln2 in two parts, p the degree-6
 * Taylor/minimax polynomial of Cephes' expf (about 1 ulp on [-ln2/2, ln2/2]).
 * scalef takes 2^n without building exponent bits, and flushes cleanly to 0
 * far below -88. */
T512 static AI __m512 exp16(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 r2 = _mm512_mul_ps(r, r);
    p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* ---- packed BF16 gemm (cpu_pack_bf16 layout) ------------------------------
 *
 * "Outer-product style": accumulator (m, j) holds y[m][n + 16j .. +15], one
 * lane per output. A k step loads NV 64-byte vectors of the panels (the same
 * pair of k for 16 rows each), broadcasts one bf16 pair of each of the MR
 * rows of x, and issues MR x NV vdpbf16ps. No horizontal sums, MR + NV loads
 * per MR x NV dot products, 6 x 4 = 24 accumulators.
 *
 * Reduction order: every output is one f32 chain over the pairs k/2 = 0, 1,
 * ..., K/2-1, starting from +0. K may be cut in chunks (prefill: KC elements,
 * so the 64-column weight tile of a chunk, 32 KB, stays in L1 while every
 * row tile of x passes over it); a chunk reloads the chain's value from y,
 * which is exact, so chunking changes no bits, and neither do MR, NV, M or
 * n0/n1: a row alone (decode) and the same row in a prompt agree. */
/* pf (may be NULL): each k step also asks for line kp of panels pf0..pf1-1
 * counted from pf (PK_PF_AHEAD, below, says why and which). */
#define PK_MR 6
#define PK_NV 4
#define PK_KC 256
#define PK_SPREAD_MAX CPU_SPREAD_MAX_M /* decode tiles, PK_PF_SPREAD below says why */
#define PK_PF_SPREAD 24 /* lines */

/* SwiGLU of one register of gate and up sums, as av512_swiglu computes it. */
T512 static AI __m256i glu16(__m512 g, __m512 u)
{
    __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return cvt16_bf16(_mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u));
}

/* The step every packed tile is made of: acc[m][j] += x_m . v[j] for
 * m < MR, j < NV, where x_m is the bf16 pair at x + m*ldx broadcast to all
 * lanes and v[j] holds one pair for each of 16 outputs. */
T512 static AI void op_step(const int MR, const int NV, __m512 acc[][8], const __m512i *v,
                            const uint16_t *x, size_t ldx)
{
    _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
    {
        int32_t pair;
        memcpy(&pair, x + (size_t)m * ldx, 4);
        __m512i xv = _mm512_set1_epi32(pair);
        _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++)
            acc[m][j] = _mm512_dpbf16_ps(acc[m][j], (__m512bh)xv, (__m512bh)v[j]);
    }
}

/* acc[m][j] to y + m*ldy + j*ys (ys = 16 where the panels are adjacent). */
T512 static AI void op_store(const int MR, const int NV, __m512 acc[][8], float *y, size_t ldy,
                             size_t ys)
{
    _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++)
            _mm512_storeu_ps(y + (size_t)m * ldy + j * ys, acc[m][j]);
}

/* MR rows of x against NV panels from w (the strip's first panel; panel j
 * at w + j*pstride), over k pairs kp0..kp1, sums into y (ldy; panel j's
 * outputs at y + j*ys). Fused mode (GLU, for gemm_bf16p_glu): the first
 * NV/2 panels are gate's, the others up's at w + d2 (same output
 * columns), up's sums go to y2, and the last K chunk writes h =
 * bf16(silu(g) * u) (ldh) instead of the sums. PF: each k step also asks
 * for line kp of panels pf0..pf1-1 counted from pf (PK_PF_AHEAD, below,
 * says why and which); a compile-time switch, so the prefill tiles' loop
 * carries nothing for it. */
T512 static AI void pk_tile(const int MR, const int NV, const int GLU, const int PF, int kp0,
                            int kp1, int first, int last, const uint16_t *x, int ldx,
                            const uint16_t *w, ptrdiff_t d2, size_t pstride, size_t ys, float *y,
                            float *y2, int ldy, uint16_t *h, int ldh, const uint16_t *pf, int pf0,
                            int pf1)
{
    const int HALF = GLU ? NV / 2 : NV;
    __m512 acc[PK_MR][8];
    _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            acc[m][j] = first ? _mm512_setzero_ps()
                              : _mm512_loadu_ps(j < HALF ? y + (size_t)m * ldy + j * ys
                                                         : y2 + (size_t)m * ldy + (j - HALF) * ys);
    w += (size_t)kp0 * 32;
    const uint16_t *xp = x + (size_t)kp0 * 2;
    for (int kp = kp0; kp < kp1; kp++, w += 32, xp += 2) {
        __m512i wv[PK_NV];
        if (PF == 2) /* every panel its own line, PK_PF_SPREAD steps ahead, not kept */
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
                _mm_prefetch((const char *)((j < HALF ? w + (size_t)j * pstride
                                                      : w + d2 + (size_t)(j - HALF) * pstride) +
                                            PK_PF_SPREAD * 32),
                             _MM_HINT_NTA);
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            wv[j] = _mm512_load_si512((const void *)(j < HALF ? w + (size_t)j * pstride
                                                              : w + d2 + (size_t)(j - HALF) * pstride));
        if (PF == 1)
            for (int j = pf0; j < pf1; j++) {
                const uint16_t *q = pf + (size_t)j * pstride + (size_t)kp * 32;
                _mm_prefetch((const char *)q, _MM_HINT_T0);
                if (GLU) /* up's panel beside gate's */
                    _mm_prefetch((const char *)(q + d2), _MM_HINT_T0);
            }
        op_step(MR, NV, acc, wv, xp, (size_t)ldx);
    }
    if (GLU && last) {
        _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
            _Pragma("GCC unroll 2") for (int j = 0; j < HALF; j++)
                _mm256_storeu_si256((void *)(h + (size_t)m * ldh + j * ys), glu16(acc[m][j], acc[m][j + HALF]));
        return;
    }
    if (!GLU) {
        op_store(MR, NV, acc, y, (size_t)ldy, ys);
        return;
    }
    _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++) /* partial sums between K chunks */
        _Pragma("GCC unroll 2") for (int j = 0; j < HALF; j++) {
            _mm512_storeu_ps(y + (size_t)m * ldy + j * ys, acc[m][j]);
            _mm512_storeu_ps(y2 + (size_t)m * ldy + j * ys, acc[m][j + HALF]);
        }
}

/* Every tile shape, plain (G = 0) or fused (G = 1), without prefetch
 * (P = 0) or, for full-width strips, with (P = 1). */
#define PK_ARGS kp0, kp1, first, last, x, ldx, w, d2, pstride, ys, y, y2, ldy, h, ldh, pf, pf0, pf1
#define PK_CASE(g, p, mr, nv)                                                 \
    case ((g) * 3 + (p)) * 64 + (mr) * 8 + (nv):                              \
        pk_tile(mr, nv, g, p, PK_ARGS);                                       \
        break;
#define PK_ROWS(g, p, nv)                                                     \
    PK_CASE(g, p, 1, nv) PK_CASE(g, p, 2, nv) PK_CASE(g, p, 3, nv)            \
    PK_CASE(g, p, 4, nv) PK_CASE(g, p, 5, nv) PK_CASE(g, p, 6, nv)

T512 static void pk_tile_any(int glu, int spread, int mr, int nv, int kp0, int kp1, int first, int last,
                             const uint16_t *x, int ldx, const uint16_t *w, ptrdiff_t d2,
                             size_t pstride, size_t ys, float *y, float *y2, int ldy, uint16_t *h,
                             int ldh, const uint16_t *pf, int pf0, int pf1)
{
    int p = nv != PK_NV ? 0 : spread ? 2 : pf != NULL;
    switch ((glu * 3 + p) * 64 + mr * 8 + nv) {
        PK_ROWS(0, 0, 1) PK_ROWS(0, 0, 2) PK_ROWS(0, 0, 3) PK_ROWS(0, 0, 4)
        PK_ROWS(0, 1, 4) PK_ROWS(0, 2, 4)
        PK_ROWS(1, 0, 2) PK_ROWS(1, 0, 4)
        PK_ROWS(1, 1, 4) PK_ROWS(1, 2, 4)
    default: break;
    }
}

/* Software prefetch for the weights streamed from memory (one pass over K:
 * decode and small batches). A 6-row tile does 24 dot products per 4 lines
 * it loads, so the out-of-order window alone keeps too few lines in flight
 * to stream at the memory's rate. So the first row tile of a strip asks for
 * its own lines PK_PF_AHEAD steps ahead, and the later row tiles, which
 * find the strip in L2, ask for the next strip's lines, a share of its
 * panels each. Only from M = 5: a lighter tile streams as fast without.
 * Measured on Zen 5 with 2 MiB pages: 1.1-1.5x at M = 6..24, and 0.9-1.0x
 * at M = 1..4 (hence the cut). In fused mode the shares count output
 * panels, and each brings gate's and up's. */
#define PK_PF_AHEAD 32

/* Decode (M <= PK_SPREAD_MAX, one pass over K): a tile's NV panels are not
 * neighbours but a share apart, panels i, i + q, i + 2q, ... of the rows
 * [n0, n1) (q = their panels / NV), and each asks for its own line
 * PK_PF_SPREAD steps ahead. Neighbouring panels are 16K elements apart
 * (32-96 KB), and NV streams at such a spacing read at about 70 GB/s on
 * two Zen 5 cores where NV streams a quarter of the chunk apart, with the
 * prefetch, read at 80-84 (the bandwidth probe's best pattern, 4 far
 * streams, reads at 84-86); neither change helps alone. The prefetch is
 * non-temporal: lines read once need no place in L2, and on Zen (whose L3
 * takes what L2 evicts) the weights then no longer push the KV cache and
 * activations out; tg64 went 63.6 -> 65.3 tok/s (median of 5 alternating
 * pairs), the KV writes and attention gaining most. How far ahead: 16
 * lines were best in the microbenchmark with T0; with the non-temporal
 * hint, in the engine, 24 beat 16 in 7 of 8 alternating tg64 pairs (69.0
 * against 65.7 tok/s, medians), 20 about ties with 24 and 28 loses. Which
 * panels share a tile changes no bits: every output keeps its own chain. */

/* The decode path described above, for M <= PK_SPREAD_MAX: tiles t0..t1-1
 * of the rows [n0, n1), tile i < q being panels i, i + q, ... and tile q
 * (when the panels do not divide evenly) the ones left over, side by side
 * (cpu_spread_tiles() in kernels.h counts them). */
T512 static void pk_spread(int glu, int M, int n0, int n1, int t0, int t1, int K, const uint16_t *x,
                           int ldx, const uint16_t *wp, ptrdiff_t d2, float *yp, float *yu, int ldy,
                           uint16_t *hp, int ldh)
{
    int per = glu ? PK_NV / 2 : PK_NV, np = (n1 - n0) / 16, q = np / per, r = np - q * per;
    size_t pstride = (size_t)16 * (size_t)K;
    for (int i = t0; i < t1 && i < q; i++) {
        int n = n0 + 16 * i;
        const uint16_t *w = wp + (size_t)(n / 16) * pstride;
        pk_tile_any(glu, 1, M, PK_NV, 0, K / 2, 1, 1, x, ldx, w, d2, pstride * (size_t)q,
                    (size_t)16 * (size_t)q, yp + n, glu ? yu + n : NULL, ldy, glu ? hp + n : NULL, ldh,
                    NULL, 0, 0);
    }
    if (r > 0 && t0 <= q && q < t1) {
        int n = n0 + 16 * q * per;
        pk_tile_any(glu, 0, M, glu ? 2 * r : r, 0, K / 2, 1, 1, x, ldx, wp + (size_t)(n / 16) * pstride, d2,
                    pstride, 16, yp + n, glu ? yu + n : NULL, ldy, glu ? hp + n : NULL, ldh, NULL, 0, 0);
    }
}

/* Both products: strips of PK_NV panels (fused: PK_NV/2 of gate and of up,
 * so half as many output columns per strip). wu and yu are gate's
 * partners in fused mode (h, ldh its output), else NULL. */
T512 static void pk_run(int M, int n0, int n1, int K, const uint16_t *x, int ldx,
                        const uint16_t *wp, const uint16_t *wu, float *yp, float *yu, int ldy,
                        uint16_t *hp, int ldh)
{
    if (M <= 0 || n1 <= n0 || K <= 0)
        return;
    int glu = wu != NULL, per = glu ? PK_NV / 2 : PK_NV; /* output panels per strip */
    size_t pstride = (size_t)16 * (size_t)K;
    ptrdiff_t d2 = glu ? wu - wp : 0;
    if (M <= PK_SPREAD_MAX) {
        pk_spread(glu, M, n0, n1, 0, cpu_spread_tiles(n1 - n0, glu), K, x, ldx, wp, d2, yp, yu, ldy,
                  hp, ldh);
        return;
    }
    /* Few rows (decode, small batches): one pass over K, the weights
     * stream from memory once and the tile's rows share every load. */
    int kc = M <= 4 * PK_MR ? K : PK_KC;
    int stream = kc == K && M > 4, mtiles = (M + PK_MR - 1) / PK_MR;
    for (int k0 = 0; k0 < K; k0 += kc) {
        int kp0 = k0 / 2, kp1 = (k0 + kc < K ? k0 + kc : K) / 2, first = k0 == 0, last = k0 + kc >= K;
        for (int n = n0; n < n1; n += 16 * per) {
            int nv = (n1 - n) / 16 < per ? (n1 - n) / 16 : per, nt = glu ? 2 * nv : nv;
            const uint16_t *w = wp + (size_t)(n / 16) * pstride;
            const uint16_t *pf = NULL;
            int pf0 = 0, pf1 = 0, m = 0;
            if (!stream && nt == PK_NV) /* the prefill loop: full tiles, no prefetch */
                for (; m + PK_MR <= M; m += PK_MR) {
                    const uint16_t *xt = x + (size_t)m * ldx;
                    float *yt = yp + (size_t)m * ldy + n;
                    if (glu)
                        pk_tile(PK_MR, PK_NV, 1, 0, kp0, kp1, first, last, xt, ldx, w, d2, pstride, 16, yt,
                                yu + (size_t)m * ldy + n, ldy, hp + (size_t)m * ldh + n, ldh, NULL, 0, 0);
                    else
                        pk_tile(PK_MR, PK_NV, 0, 0, kp0, kp1, first, last, xt, ldx, w, 0, pstride, 16, yt,
                                NULL, ldy, NULL, 0, NULL, 0, 0);
                }
            int nvn = (n1 - n) / 16 - per; /* output panels of the next strip */
            nvn = nvn < 0 ? 0 : nvn < per ? nvn : per;
            for (int mi = m / PK_MR; m < M; m += PK_MR, mi++) {
                pf = NULL, pf0 = pf1 = 0;
                if (stream && mi == 0) {
                    pf = w + (size_t)PK_PF_AHEAD * 32;
                    pf1 = nv;
                } else if (stream && nvn > 0) {
                    pf = w + (size_t)per * pstride;
                    pf0 = nvn * (mi - 1) / (mtiles - 1);
                    pf1 = nvn * mi / (mtiles - 1);
                }
                pk_tile_any(glu, 0, M - m < PK_MR ? M - m : PK_MR, nt, kp0, kp1, first, last,
                            x + (size_t)m * ldx, ldx, w, d2, pstride, 16, yp + (size_t)m * ldy + n,
                            glu ? yu + (size_t)m * ldy + n : NULL, ldy,
                            glu ? hp + (size_t)m * ldh + n : NULL, ldh, pf, pf0, pf1);
            }
        }
    }
}

T512 static void av512_gemm_bf16p(int M, int n0, int n1, int K, const uint16_t *x, int ldx,
                                  const uint16_t *wp, float *y, int ldy)
{
    pk_run(M, n0, n1, K, x, ldx, wp, NULL, y, NULL, ldy, NULL, 0);
}

T512 static void av512_gemm_bf16p_glu(int M, int n0, int n1, int K, const uint16_t *x, int ldx,
                                      const uint16_t *wg, const uint16_t *wu, float *yg, float *yu,
                                      int ldy, uint16_t *h, int ldh)
{
    pk_run(M, n0, n1, K, x, ldx, wg, wu, yg, yu, ldy, h, ldh);
}

T512 static void av512_gemm_bf16p_tiles(int M, int n0, int n1, int t0, int t1, int K,
                                        const uint16_t *x, int ldx, const uint16_t *wp,
                                        const uint16_t *wu, float *y, float *yu, int ldy,
                                        uint16_t *h, int ldh)
{
    if (M <= 0 || M > PK_SPREAD_MAX || n1 <= n0 || K <= 0)
        return;
    pk_spread(wu != NULL, M, n0, n1, t0, t1, K, x, ldx, wp, wu ? wu - wp : 0, y, yu, ldy, h, ldh);
}

/* ---- conversions and attention helpers ---------------------------------- */

T512 static void av512_f32_to_bf16(const float *x, uint16_t *y, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((void *)(y + i), cvt16_bf16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm256_mask_storeu_epi16(y + i, m, cvt16_bf16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

T512 static AI __m512 ld_bf16(const uint16_t *p)
{
    __m256i h = _mm256_loadu_si256((const void *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

T512 static AI __m512 ld_bf16_m(__mmask16 m, const uint16_t *p)
{
    __m256i h = _mm256_maskz_loadu_epi16(m, (const void *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

T512 static void av512_bf16_to_f32(const uint16_t *x, float *y, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, ld_bf16(x + i));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, m, ld_bf16_m(m, x + i));
    }
}

/* dot (two chains of 16 lanes, then the masked tail into the first) and
 * axpy over a row of AT elements against f32: the same loops for f32 and
 * bf16 rows, only the loads of the row differ (LD a full vector of 16,
 * LDM(m, p) the lanes of mask m). */
#define F32_LD(p) _mm512_loadu_ps(p)
#define F32_LDM(m, p) _mm512_maskz_loadu_ps(m, p)
#define DEFINE_DOT_AXPY(DOT, AXPY, AT, LD, LDM)                               \
    T512 static float DOT(const AT *a, const float *b, int n)                 \
    {                                                                         \
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();            \
        int i = 0;                                                            \
        for (; i + 32 <= n; i += 32) {                                        \
            s0 = _mm512_fmadd_ps(LD(a + i), _mm512_loadu_ps(b + i), s0);      \
            s1 = _mm512_fmadd_ps(LD(a + i + 16), _mm512_loadu_ps(b + i + 16), s1); \
        }                                                                     \
        for (; i < n; i += 16) {                                              \
            __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u); \
            s0 = _mm512_fmadd_ps(LDM(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0); \
        }                                                                     \
        return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));                   \
    }                                                                         \
                                                                              \
    T512 static void AXPY(float a, const AT *x, float *y, int n)              \
    {                                                                         \
        __m512 av = _mm512_set1_ps(a);                                        \
        int i = 0;                                                            \
        for (; i + 16 <= n; i += 16)                                          \
            _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, LD(x + i), _mm512_loadu_ps(y + i))); \
        if (i < n) {                                                          \
            __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);                  \
            _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, LDM(m, x + i),  \
                                                            _mm512_maskz_loadu_ps(m, y + i))); \
        }                                                                     \
    }

DEFINE_DOT_AXPY(av512_dot_f32, av512_axpy_f32, float, F32_LD, F32_LDM)
DEFINE_DOT_AXPY(av512_dot_bf16_f32, av512_axpy_bf16, uint16_t, ld_bf16, ld_bf16_m)

/* Scores for two query rows against eight keys in one red16: slot of
 * (row r, key c) is chosen so red16's output lane r*8 + c holds it (output
 * position 4j+q holds slot j+4q). Each chain is gemm_bf16's: dp over the
 * 32-element steps of hd ascending, from zero, then red16's tree, so the
 * bits equal BF_gemm's for the same pair. Missing rows/keys (tails) repeat
 * the last valid one and are not stored. */
T512 static void av512_scores_bf16(int R, int n, const uint16_t *q, int ldq, const uint16_t *k,
                                   int hd, float *s, int lds)
{
    for (int r = 0; r < R; r += 2) {
        const uint16_t *q0 = q + (size_t)r * ldq;
        const uint16_t *q1 = r + 1 < R ? q0 + ldq : q0;
        for (int c0 = 0; c0 < n; c0 += 8) {
            __m512 acc[16];
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
            for (int d = 0; d < hd; d += 32) {
                __m512i a0 = _mm512_loadu_si512((const void *)(q0 + d));
                __m512i a1 = _mm512_loadu_si512((const void *)(q1 + d));
                _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++)
                {
                    int kc = c0 + c < n ? c0 + c : n - 1;
                    __m512i kv = _mm512_loadu_si512((const void *)(k + (size_t)kc * hd + d));
                    int p0 = c, p1 = 8 + c; /* output positions */
                    acc[p0 / 4 + 4 * (p0 % 4)] =
                        _mm512_dpbf16_ps(acc[p0 / 4 + 4 * (p0 % 4)], (__m512bh)a0, (__m512bh)kv);
                    acc[p1 / 4 + 4 * (p1 % 4)] =
                        _mm512_dpbf16_ps(acc[p1 / 4 + 4 * (p1 % 4)], (__m512bh)a1, (__m512bh)kv);
                }
            }
            __m512 res = red16(acc);
            int nc = n - c0 < 8 ? n - c0 : 8;
            __mmask8 m = (__mmask8)((1u << nc) - 1u);
            _mm256_mask_storeu_ps(s + (size_t)r * lds + c0, m, _mm512_castps512_ps256(res));
            if (r + 1 < R)
                _mm256_mask_storeu_ps(s + (size_t)(r + 1) * lds + c0, m,
                                      _mm512_extractf32x8_ps(res, 1));
        }
    }
}

/* ---- attention: softmax and P x V ---------------------------------------- */

T512 static float av512_softmax(float *s, int n, float scale)
{
    __m512 sc = _mm512_set1_ps(scale), mx = _mm512_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(s + i), sc);
        _mm512_storeu_ps(s + i, v);
        mx = _mm512_max_ps(mx, v);
    }
    __mmask16 tm = (__mmask16)((1u << (n - i)) - 1u);
    if (i < n) {
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(tm, s + i), sc);
        _mm512_mask_storeu_ps(s + i, tm, v);
        mx = _mm512_mask_max_ps(mx, tm, mx, v);
    }
    __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), m));
        _mm512_storeu_ps(s + i, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (i < n) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tm, s + i), m));
        _mm512_mask_storeu_ps(s + i, tm, e);
        sum = _mm512_mask_add_ps(sum, tm, sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* R rows (<= 4) x 64 columns of the output in 16 registers; each key's 64
 * values are loaded (and widened, for bf16) once for all R rows. */
#define DEFINE_PV(NAME, VT, LOADV)                                            \
    T512 static AI void NAME##_tile(const int R, int n, const float *p,       \
                                    int ldp, const VT *v, int hd, float *o,   \
                                    int ldo)                                  \
    {                                                                         \
        __m512 acc[4][4];                                                     \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                   \
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)               \
                acc[r][c] = _mm512_loadu_ps(o + (size_t)r * ldo + 16 * c);    \
        for (int j = 0; j < n; j++) {                                         \
            const VT *vj = v + (size_t)j * hd;                                \
            __m512 vv[4];                                                     \
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)               \
                vv[c] = LOADV(vj + 16 * c);                                   \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)               \
            {                                                                 \
                __m512 pr = _mm512_set1_ps(p[(size_t)r * ldp + j]);           \
                _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)           \
                    acc[r][c] = _mm512_fmadd_ps(pr, vv[c], acc[r][c]);        \
            }                                                                 \
        }                                                                     \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                   \
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)               \
                _mm512_storeu_ps(o + (size_t)r * ldo + 16 * c, acc[r][c]);    \
    }                                                                         \
    /* one row, 16 columns: the hd % 64 tail */                               \
    T512 static AI void NAME##_col(int n, const float *p, const VT *v, int hd,\
                                   float *o)                                  \
    {                                                                         \
        __m512 acc = _mm512_loadu_ps(o);                                      \
        for (int j = 0; j < n; j++)                                           \
            acc = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), LOADV(v + (size_t)j * hd), acc); \
        _mm512_storeu_ps(o, acc);                                             \
    }                                                                         \
    T512 static void NAME(int R, int n, const float *p, int ldp, const VT *v, \
                          int hd, float *o, int ldo)                          \
    {                                                                         \
        int d = 0;                                                            \
        for (; d + 64 <= hd; d += 64) {                                       \
            int r = 0;                                                        \
            for (; r + 4 <= R; r += 4)                                        \
                NAME##_tile(4, n, p + (size_t)r * ldp, ldp, v + d, hd,        \
                            o + (size_t)r * ldo + d, ldo);                    \
            switch (R - r) {                                                  \
            case 3: NAME##_tile(3, n, p + (size_t)r * ldp, ldp, v + d, hd,    \
                                o + (size_t)r * ldo + d, ldo); break;         \
            case 2: NAME##_tile(2, n, p + (size_t)r * ldp, ldp, v + d, hd,    \
                                o + (size_t)r * ldo + d, ldo); break;         \
            case 1: NAME##_tile(1, n, p + (size_t)r * ldp, ldp, v + d, hd,    \
                                o + (size_t)r * ldo + d, ldo); break;         \
            default: break;                                                   \
            }                                                                 \
        }                                                                     \
        for (; d < hd; d += 16)                                               \
            for (int r = 0; r < R; r++)                                       \
                NAME##_col(n, p + (size_t)r * ldp, v + d, hd,                 \
                           o + (size_t)r * ldo + d);                          \
    }

#define PV_LD_F32(q) _mm512_loadu_ps(q)
DEFINE_PV(av512_pv_bf16, uint16_t, ld_bf16)
DEFINE_PV(av512_pv_f32, float, PV_LD_F32)

/* ---- packed-KV attention (kernels.h has the layouts) --------------------
 *
 * Both products are gemm_bf16p's tile turned to attention: scores take the
 * K blocks as 16-row panels (NB blocks of 16 keys per tile), P x V takes
 * the V blocks as panels of 16 dimensions over key pairs. Decode runs them
 * with the two query rows of a GQA group, prefill with a tile of up to 64;
 * the chains are per output, so the bits agree.
 *
 * Memory: in decode every block comes from DRAM, and the blocks of a
 * sequence lie anywhere in the pool, out of the hardware prefetcher's
 * sight. Scores walk NB blocks side by side, one line of each per pair
 * step, and ask for the line PF_AHEAD steps on in the same block; P x V
 * asks for the next block's lines while it works on the current one. */
#define AT_PF_AHEAD 8

T512 static AI void sc_tile(const int MR, const int NB, int npairs, const uint16_t *q, int ldq,
                            const uint16_t *const *kb, float *s, int lds, int pf)
{
    __m512 acc[6][8];
    _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 8") for (int b = 0; b < NB; b++) acc[m][b] = _mm512_setzero_ps();
    if (pf)
        for (int b = 0; b < NB; b++)
            for (int i = 0; i < AT_PF_AHEAD && i < npairs; i++)
                _mm_prefetch((const char *)(kb[b] + (size_t)i * 32), _MM_HINT_T0);
    for (int kp = 0; kp < npairs; kp++) {
        __m512i wv[8];
        _Pragma("GCC unroll 8") for (int b = 0; b < NB; b++)
        {
            if (pf && kp + AT_PF_AHEAD < npairs)
                _mm_prefetch((const char *)(kb[b] + (size_t)(kp + AT_PF_AHEAD) * 32), _MM_HINT_T0);
            wv[b] = _mm512_load_si512((const void *)(kb[b] + (size_t)kp * 32));
        }
        op_step(MR, NB, acc, wv, q + 2 * kp, (size_t)ldq);
    }
    op_store(MR, NB, acc, s, (size_t)lds, 16);
}

/* The attention tiles' shapes (rows x blocks or panels): up to 2 rows
 * against up to 8 (decode), up to 6 against up to 4 (prefill). */
#define AT_SHAPES(X)                                                          \
    X(1, 1) X(1, 2) X(1, 3) X(1, 4) X(1, 5) X(1, 6) X(1, 7) X(1, 8)           \
    X(2, 1) X(2, 2) X(2, 3) X(2, 4) X(2, 5) X(2, 6) X(2, 7) X(2, 8)           \
    X(3, 1) X(3, 2) X(3, 3) X(3, 4) X(4, 1) X(4, 2) X(4, 3) X(4, 4)           \
    X(5, 1) X(5, 2) X(5, 3) X(5, 4) X(6, 1) X(6, 2) X(6, 3) X(6, 4)

#define SC_CASE(mr, nb)                                                       \
    case (mr) * 16 + (nb):                                                    \
        sc_tile(mr, nb, npairs, q, ldq, kb, s, lds, pf);                      \
        break;

/* Row tiles of 6 against 4 blocks (24 accumulators, prefill), or of up to
 * 2 rows against 8 blocks (decode: 16 chains in flight, not 8). */
T512 static void sc_tile_any(int mr, int nb, int npairs, const uint16_t *q, int ldq,
                             const uint16_t *const *kb, float *s, int lds, int pf)
{
    switch (mr * 16 + nb) {
        AT_SHAPES(SC_CASE)
    default: break;
    }
}

T512 static void av512_scores_bf16p(int R, int nb, const uint16_t *q, int ldq,
                                    const uint16_t *const *kb, int hd, float *s, int lds)
{
    int mr = R <= 2 ? R : 6, nbt = R <= 2 ? 8 : 4;
    for (int b0 = 0; b0 < nb; b0 += nbt) {
        int n = nb - b0 < nbt ? nb - b0 : nbt;
        /* the first row tile brings the blocks in; the others find them
         * in L1/L2 */
        for (int m = 0; m < R; m += mr)
            sc_tile_any(R - m < mr ? R - m : mr, n, hd / 2, q + (size_t)m * ldq, ldq, kb + b0,
                        s + (size_t)m * lds + 16 * b0, lds, m == 0);
    }
}

T512 static AI void pvp_tile(const int MR, const int NV, int nb, int n_last, const uint16_t *p,
                             int ldp, const uint16_t *const *vb, int panel0, float *o, int ldo,
                             int pf)
{
    __m512 acc[6][8];
    _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++)
            acc[m][j] = _mm512_loadu_ps(o + (size_t)m * ldo + 16 * j);
    for (int b = 0; b < nb; b++) {
        const uint16_t *v = vb[b] + (size_t)panel0 * 256;
        int nk = b + 1 < nb ? 16 : n_last, full = nk / 2;
        const uint16_t *pb = p + (size_t)b * 16;
        for (int i = 0; i < full; i++) {
            __m512i vv[8];
            _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++)
            {
                if (pf && b + 1 < nb)
                    _mm_prefetch((const char *)(vb[b + 1] + (size_t)(panel0 + j) * 256 + (size_t)i * 32),
                                 _MM_HINT_T0);
                vv[j] = _mm512_load_si512((const void *)(v + (size_t)j * 256 + (size_t)i * 32));
            }
            op_step(MR, NV, acc, vv, pb + 2 * i, (size_t)ldp);
        }
        if (nk & 1) {
            /* the last key alone: its pair's other half (slot nk) is past
             * the end, so both its value and its p are zeroed */
            const __m512i lo = _mm512_set1_epi32(0xffff);
            __m512i vv[8];
            _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++)
                vv[j] = _mm512_and_si512(
                    _mm512_load_si512((const void *)(v + (size_t)j * 256 + (size_t)full * 32)), lo);
            _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
            {
                __m512i pv = _mm512_set1_epi32((int32_t)pb[(size_t)m * ldp + 2 * full]);
                _Pragma("GCC unroll 8") for (int j = 0; j < NV; j++)
                    acc[m][j] = _mm512_dpbf16_ps(acc[m][j], (__m512bh)pv, (__m512bh)vv[j]);
            }
        }
    }
    op_store(MR, NV, acc, o, (size_t)ldo, 16);
}

#define PVP_CASE(mr, nv)                                                      \
    case (mr) * 16 + (nv):                                                    \
        pvp_tile(mr, nv, nb, n_last, p, ldp, vb, panel0, o, ldo, pf);         \
        break;

T512 static void pvp_tile_any(int mr, int nv, int nb, int n_last, const uint16_t *p, int ldp,
                              const uint16_t *const *vb, int panel0, float *o, int ldo, int pf)
{
    switch (mr * 16 + nv) {
        AT_SHAPES(PVP_CASE)
    default: break;
    }
}

T512 static void av512_pv_bf16p(int R, int nb, int n_last, const uint16_t *p, int ldp,
                                const uint16_t *const *vb, int hd, float *o, int ldo)
{
    int mr = R <= 2 ? R : 6, nvt = R <= 2 ? 8 : 4, panels = hd / 16;
    for (int m = 0; m < R; m += mr)
        for (int j0 = 0; j0 < panels; j0 += nvt)
            pvp_tile_any(R - m < mr ? R - m : mr, panels - j0 < nvt ? panels - j0 : nvt, nb, n_last,
                         p + (size_t)m * ldp, ldp, vb, j0, o + (size_t)m * ldo + 16 * j0, ldo,
                         m == 0);
}

T512 static void av512_kv_put_bf16p(const float *k, const float *v, int hd, int slot,
                                    uint16_t *kblk, uint16_t *vblk)
{
    /* K: the pair (d, d+1) is one dword, 64 bytes (16 dwords) from the next */
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(16));
    for (int d = 0; d < hd; d += 32) {
        __m256i lo = cvt16_bf16(_mm512_loadu_ps(k + d)), hi = cvt16_bf16(_mm512_loadu_ps(k + d + 16));
        __m512i pairs = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        _mm512_i32scatter_epi32((void *)(kblk + (size_t)(d / 2) * 32 + (size_t)slot * 2), idx, pairs, 4);
    }
    /* V: sixteen dimensions of a panel go to every other 16-bit lane of the
     * slot pair's 64-byte row, the even or the odd ones */
    __mmask32 half = (slot & 1) ? (__mmask32)0xaaaaaaaau : (__mmask32)0x55555555u;
    for (int d = 0; d < hd; d += 16) {
        __m512i w = _mm512_cvtepu16_epi32(cvt16_bf16(_mm512_loadu_ps(v + d)));
        if (slot & 1)
            w = _mm512_slli_epi32(w, 16);
        _mm512_mask_storeu_epi16((void *)(vblk + ((size_t)(d / 16) * 8 + (size_t)(slot / 2)) * 32), half, w);
    }
}

/* ---- row helpers --------------------------------------------------------- */

T512 static void av512_rmsnorm(const float *x, const float *w, float *y, int n, float eps)
{
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
        s0 = _mm512_fmadd_pd(lo, lo, s0);
        s1 = _mm512_fmadd_pd(hi, hi, s1);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    for (; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    __m512 rv = _mm512_set1_ps(r);
    for (i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(w + i),
                                              _mm512_mul_ps(_mm512_loadu_ps(x + i), rv)));
    for (; i < n; i++)
        y[i] = w[i] * (x[i] * r);
}

T512 static void av512_norm_rope(float *x, int n, int hd, const float *w, float eps, const float *cs,
                                 const float *sn)
{
    int half = hd / 2;
    for (int r = 0; r < n; r++) {
        float *v = x + (size_t)r * (size_t)hd;
        av512_rmsnorm(v, w, v, hd, eps);
        for (int i = 0; i < half; i += 16) {
            __m512 a = _mm512_loadu_ps(v + i), b = _mm512_loadu_ps(v + i + half);
            __m512 c = _mm512_loadu_ps(cs + i), s = _mm512_loadu_ps(sn + i);
            _mm512_storeu_ps(v + i, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)));
            _mm512_storeu_ps(v + i + half, _mm512_fmadd_ps(b, c, _mm512_mul_ps(a, s)));
        }
    }
}

/* kernels.h lora_up: 128 columns in eight registers while the r rows go
 * by (eight chains, enough to cover the FMA latency), then 16, then a
 * masked tail */
T512 static void av512_lora_up(int r, const float *t, const float *w, size_t ldw, float *y, int n)
{
    int i = 0;
    for (; i + 128 <= n; i += 128) {
        __m512 a[8];
        for (int j = 0; j < 8; j++)
            a[j] = _mm512_setzero_ps();
        for (int k = 0; k < r; k++) {
            const float *wr = w + (size_t)k * ldw + i;
            __m512 tk = _mm512_set1_ps(t[k]);
            for (int j = 0; j < 8; j++)
                a[j] = _mm512_fmadd_ps(tk, _mm512_loadu_ps(wr + 16 * j), a[j]);
        }
        for (int j = 0; j < 8; j++)
            _mm512_storeu_ps(y + i + 16 * j, _mm512_add_ps(_mm512_loadu_ps(y + i + 16 * j), a[j]));
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i < 16 ? (__mmask16)((1u << (n - i)) - 1u) : (__mmask16)0xffff;
        __m512 a = _mm512_setzero_ps();
        for (int k = 0; k < r; k++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(t[k]), _mm512_maskz_loadu_ps(m, w + (size_t)k * ldw + i), a);
        _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), a));
    }
}

T512 static void av512_swiglu(float *g, const float *u, int n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)),
                                              _mm512_loadu_ps(u + i)));
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)),
                                                      _mm512_maskz_loadu_ps(m, u + i)));
    }
}

static const struct cpu_kernels av512_table = {
    .isa = CPU_ISA_AVX512BF16,
    .gemm_f32 = F32_gemm,
    .gemm_bf16 = BF_gemm,
    .gemm_f16 = F16_gemm,
    .f32_to_bf16 = av512_f32_to_bf16,
    .bf16_to_f32 = av512_bf16_to_f32,
    .dot_f32 = av512_dot_f32,
    .dot_bf16_f32 = av512_dot_bf16_f32,
    .axpy_f32 = av512_axpy_f32,
    .axpy_bf16 = av512_axpy_bf16,
    .gemm_bf16p = av512_gemm_bf16p,
    .gemm_bf16p_glu = av512_gemm_bf16p_glu,
    .gemm_bf16p_tiles = av512_gemm_bf16p_tiles,
    .softmax = av512_softmax,
    .scores_bf16 = av512_scores_bf16,
    .pv_bf16 = av512_pv_bf16,
    .pv_f32 = av512_pv_f32,
    .kv_put_bf16p = av512_kv_put_bf16p,
    .scores_bf16p = av512_scores_bf16p,
    .pv_bf16p = av512_pv_bf16p,
    .rmsnorm = av512_rmsnorm,
    .swiglu = av512_swiglu,
    .lora_up = av512_lora_up,
    .norm_rope = av512_norm_rope,
    .gemm_q = cpu_gemm_q_avx512,
    .q_panels = 1,
};

const struct cpu_kernels *cpu_kernels_avx512bf16(void)
{
    return &av512_table;
}

#else /* !__x86_64__ */

const struct cpu_kernels *cpu_kernels_avx512bf16(void)
{
    return NULL;
}

#endif
