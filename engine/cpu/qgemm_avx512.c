/* engine/cpu/qgemm_avx512.c - the AVX-512 VNNI products on the panel
 * layouts of qgemm.c (Q8_0, Q4_1, Q5_1, Q2_K, Q4_K, Q5_K, Q6_K, IQ4_XS, AWQ; and
 * the formats packed in another's panels), the AVX-512 table's gemm_q.
 *
 * Outer-product tiles, as gemm_bf16p's: a tile is MR rows of activations
 * against NV panels of 16 weight rows. One 64-byte vector of a panel holds
 * a group of 4 codes for each of its 16 rows; vpdpbusd multiplies it by one
 * dword of activation codes broadcast to every lane (4 products per lane,
 * summed into the lane's int32), so lane r of accumulator (m, j) is output
 * (m, 16 (p + j) + r) and no horizontal sum is ever needed. The weights are
 * the unsigned operand: Q8_0 codes are stored + 128 and Q6_K's as q + 32,
 * and the exact offsets (128 sum qx, 32 sum_s sc_s sum qx) come off the
 * int32 sums with the activation block's stored sums; Q4_K and AWQ codes
 * are unsigned already. Scales: 6-bit Q4_K scales and Q6_K's signed ones
 * multiply the sub-block sums in int32 (vpmulld); the Q4_K min term is a
 * vpdpwssd of the min pairs against the activation's 32-element sum pairs;
 * Q5_K is Q4_K with a fifth bit merged into each code.
 * Then the float step of qgemm.h's recipe, per lane, in block order: so
 * these kernels give the portable product's bits (test_kernels checks it),
 * whatever MR, NV, M or the split.
 *
 * Decode (M <= 3): NV = 4 panels side by side, each asking for its own
 * line QP_PF_AHEAD bytes ahead (four far streams). Prefill: chunks of
 * activation rows that stay in L2, swept by 2-panel strips; for small
 * batches (M <= 24) the first row tile of a strip prefetches the same way.
 * Prefill with Q8_0, Q4_K and Q6_K weights (M >= QP_AMX_MIN_M) runs on the
 * AMX tile unit instead where the CPU and the kernel allow it (below: the
 * same integer sums from TDPBSUD, the same f32 steps, the same bits).
 *
 * Compiled through target attributes; the table only hands gemm_q out
 * after cpu_isa_detect() found AVX-512 BF16 and VNNI. */
#include "cpu/qgemm.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TQ __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define AI __attribute__((always_inline)) inline

#define QP_PF_AHEAD 1536 /* bytes ahead of each panel's stream, decode */
/* The hint of those prefetches: T0. NTA (which this file used first) kept
 * the decode products at 11-14 GB/s where the same loops with T0 read
 * 24-28 GB/s, as fast as a plain read loop on the same threads (Q8_0,
 * Q4_K, Q6_K, AWQ alike, 2026-12-04): on this core an NTA prefetch seems
 * to bypass the L2 and its streamer, so each line waits on DRAM. */
#define QP_PF_HINT _MM_HINT_T0
#define QP_MC_BYTES (192 * 1024) /* activation rows per prefill chunk */
/* The fewest rows the AMX products take: at M = 16 (a batch of 16
 * decoding) the VNNI tiles, which prefetch the weights' stream, measured
 * 3-30 % faster (Q8_0, Q4_K, Q6_K; 3072 x 1024); from 24 rows on the tiles
 * win (12-32 % at 24 and 32 rows for Q8_0 and Q4_K). */
#ifndef QP_AMX_MIN_M
#define QP_AMX_MIN_M 17
#endif

TQ static AI __m512i bcast32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

TQ static AI __m512 ld_f16x16(const uint8_t *p)
{
    return _mm512_cvtph_ps(_mm256_load_si256((const void *)p));
}

/* ---------------------------------------------------------------- Q8_0 */

/* OFS (compile time): Q4_1 / Q5_1, in Q8_0's panels with their offsets m
 * as a second header (per 2 blocks 1152 bytes: d, m, then the codes):
 * codes unsigned as they are (no + 128), and after each block's step the
 * offset's, S m dx, S the activation block's sum (qgemm.h). */
TQ static AI void q8x_tile(const int OFS, const int MR, const int NV, const int PF, int nb2, const uint8_t *w,
                           size_t ps, const uint8_t *xq, size_t ldxq, float *y, int ldy)
{
    const size_t b2b = OFS ? 1152 : 1088, hdr = OFS ? 128 : 64;
    __m512 acc[6][4];
    _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[m][j] = _mm512_setzero_ps();
    for (int b2 = 0; b2 < nb2; b2++) {
        const uint8_t *B = w + (size_t)b2 * b2b;
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
        {
            const struct cpu_xq32 *xb[6];
            _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++) xb[m] =
                (const struct cpu_xq32 *)(xq + (size_t)m * ldxq) + 2 * b2 + h;
            __m512i is[6][4];
            _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) is[m][j] = _mm512_setzero_si512();
            _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++)
            {
                __m512i wv[4];
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
                {
                    const uint8_t *src = B + (size_t)j * ps + hdr + 512 * h + 64 * g;
                    if (PF)
                        _mm_prefetch((const char *)src + QP_PF_AHEAD, QP_PF_HINT);
                    wv[j] = _mm512_load_si512((const void *)src);
                }
                _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
                {
                    __m512i xv = bcast32(xb[m]->q + 4 * g);
                    _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) is[m][j] =
                        _mm512_dpbusd_epi32(is[m][j], wv[j], xv);
                }
            }
            __m512 dw[4];
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) dw[j] = ld_f16x16(B + (size_t)j * ps + 32 * h);
            __m512 mw[4];
            if (OFS)
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) mw[j] = ld_f16x16(B + (size_t)j * ps + 64 + 32 * h);
            _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
            {
                __m512i corr = _mm512_set1_epi32(OFS ? 0 : 128 * xb[m]->s);
                __m512 dx = _mm512_set1_ps(xb[m]->d);
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[m][j] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(_mm512_sub_epi32(is[m][j], corr)), _mm512_mul_ps(dw[j], dx), acc[m][j]);
                if (OFS) {
                    __m512 sx = _mm512_set1_ps((float)xb[m]->s);
                    _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[m][j] =
                        _mm512_fmadd_ps(sx, _mm512_mul_ps(mw[j], dx), acc[m][j]);
                }
            }
        }
    }
    _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            _mm512_storeu_ps(y + (size_t)m * ldy + 16 * j, acc[m][j]);
}

TQ static AI void q80_tile(const int MR, const int NV, const int PF, int nb2, const uint8_t *w, size_t ps,
                           const uint8_t *xq, size_t ldxq, float *y, int ldy)
{
    q8x_tile(0, MR, NV, PF, nb2, w, ps, xq, ldxq, y, ldy);
}

TQ static AI void q8m_tile(const int MR, const int NV, const int PF, int nb2, const uint8_t *w, size_t ps,
                           const uint8_t *xq, size_t ldxq, float *y, int ldy)
{
    q8x_tile(1, MR, NV, PF, nb2, w, ps, xq, ldxq, y, ldy);
}

/* ---------------------------------------------------------- Q4_K, Q5_K */

/* Q5 (compile time): 1 for Q5_K, whose panels add 8 vectors of fifth bits
 * after Q4_K's; the fifth bit of group 8 s + g (sub-block s) is bit s of
 * vector g, moved to bit 4 and merged into the nibble with one vpternlogd.
 * 2 for IQ4_XS, in Q4_K's panels with signed scales (ls - 32) and no mins:
 * each nibble becomes its level + 128 by vpshufb (the unsigned operand),
 * and the 128 sum qx that adds, times the scales, comes off the int32 sum
 * as Q4_K's min term would (the scale pairs against the 32-element sums). */
TQ static AI void q45k_tile(const int Q5, const int MR, const int NV, const int PF, int nsb, const uint8_t *w,
                            size_t ps, const uint8_t *xq, size_t ldxq, float *y, int ldy)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
    const __m512i lev = _mm512_set_epi8(/* QUANT_IQ4_VALUES + 128, per 128-bit lane, high byte first */
        (char)241, (char)217, (char)197, (char)181, (char)166, (char)153, (char)141, (char)129,
        118, 106, 93, 79, 63, 45, 24, 1, (char)241, (char)217, (char)197, (char)181, (char)166, (char)153,
        (char)141, (char)129, 118, 106, 93, 79, 63, 45, 24, 1, (char)241, (char)217, (char)197, (char)181,
        (char)166, (char)153, (char)141, (char)129, 118, 106, 93, 79, 63, 45, 24, 1, (char)241, (char)217,
        (char)197, (char)181, (char)166, (char)153, (char)141, (char)129, 118, 106, 93, 79, 63, 45, 24, 1);
    const size_t sbb = Q5 == 1 ? 2880 : 2368;
    __m512 acc[4][4];
    _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[m][j] = _mm512_setzero_ps();
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *B = w + (size_t)sb * sbb;
        const struct cpu_xq256 *xb[4];
        _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++) xb[m] =
            (const struct cpu_xq256 *)(xq + (size_t)m * ldxq) + sb;
        __m512i ia[4][4];
        _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) ia[m][j] = _mm512_setzero_si512();
        for (int s = 0; s < 8; s++) { /* sub-block s: pair s % 4, half s / 4 */
            int i = s % 4, h = s / 4;
            __m128i up = _mm_cvtsi32_si128(s <= 4 ? 4 - s : 0), dn = _mm_cvtsi32_si128(s > 4 ? s - 4 : 0);
            __m512i a[4][4];
            _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[m][j] = _mm512_setzero_si512();
            _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++)
            {
                __m512i wv[4];
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
                {
                    const uint8_t *src = B + (size_t)j * ps + 320 + 64 * (8 * i + g);
                    if (PF && h == 0)
                        _mm_prefetch((const char *)src + QP_PF_AHEAD, QP_PF_HINT);
                    __m512i raw = _mm512_load_si512((const void *)src);
                    wv[j] = _mm512_and_si512(h ? _mm512_srli_epi16(raw, 4) : raw, lo4);
                    if (Q5 == 2)
                        wv[j] = _mm512_shuffle_epi8(lev, wv[j]);
                    if (Q5 == 1) {
                        const uint8_t *hp = B + (size_t)j * ps + 2368 + 64 * g;
                        if (PF && s == 0)
                            _mm_prefetch((const char *)hp + QP_PF_AHEAD, QP_PF_HINT);
                        __m512i hb = _mm512_load_si512((const void *)hp);
                        hb = _mm512_srl_epi16(_mm512_sll_epi16(hb, up), dn);
                        wv[j] = _mm512_ternarylogic_epi32(wv[j], hb, b4, 0xF8);
                    }
                }
                _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
                {
                    __m512i xv = bcast32(xb[m]->q + 32 * s + 4 * g);
                    _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[m][j] =
                        _mm512_dpbusd_epi32(a[m][j], wv[j], xv);
                }
            }
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            {
                const void *spp = B + (size_t)j * ps + 64 + 32 * i;
                __m512i sc;
                if (Q5 == 2) { /* signed */
                    __m512i sp = _mm512_cvtepi8_epi16(_mm256_load_si256(spp));
                    sc = h ? _mm512_srai_epi32(sp, 16) : _mm512_srai_epi32(_mm512_slli_epi32(sp, 16), 16);
                } else {
                    __m512i sp = _mm512_cvtepu8_epi16(_mm256_load_si256(spp));
                    sc = h ? _mm512_srli_epi32(sp, 16) : _mm512_and_si512(sp, lo16);
                }
                _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++) ia[m][j] =
                    _mm512_add_epi32(ia[m][j], _mm512_mullo_epi32(a[m][j], sc));
            }
        }
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
        {
            const uint8_t *Bj = B + (size_t)j * ps;
            __m512 d = ld_f16x16(Bj), dmin = ld_f16x16(Bj + 32);
            __m512i mp[4];
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) mp[i] =
                Q5 == 2 ? _mm512_cvtepi8_epi16(_mm256_load_si256((const void *)(Bj + 64 + 32 * i)))
                        : _mm512_cvtepu8_epi16(_mm256_load_si256((const void *)(Bj + 192 + 32 * i)));
            _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
            {
                __m512i J = _mm512_setzero_si512();
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
                {
                    int32_t pr;
                    memcpy(&pr, &xb[m]->s32p[2 * i], 4);
                    J = _mm512_dpwssd_epi32(J, mp[i], _mm512_set1_epi32(pr));
                }
                __m512 dx = _mm512_set1_ps(xb[m]->d);
                if (Q5 == 2) { /* I = sum (level + 128) qx - 128 sum_j sc_j S32_j */
                    __m512i I = _mm512_sub_epi32(ia[m][j], _mm512_slli_epi32(J, 7));
                    acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(d, dx), acc[m][j]);
                    continue;
                }
                acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[m][j]), _mm512_mul_ps(d, dx), acc[m][j]);
                acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(), J)),
                                            _mm512_mul_ps(dmin, dx), acc[m][j]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            _mm512_storeu_ps(y + (size_t)m * ldy + 16 * j, acc[m][j]);
}

TQ static AI void q4k_tile(const int MR, const int NV, const int PF, int nsb, const uint8_t *w, size_t ps,
                           const uint8_t *xq, size_t ldxq, float *y, int ldy)
{
    q45k_tile(0, MR, NV, PF, nsb, w, ps, xq, ldxq, y, ldy);
}

TQ static AI void q5k_tile(const int MR, const int NV, const int PF, int nsb, const uint8_t *w, size_t ps,
                           const uint8_t *xq, size_t ldxq, float *y, int ldy)
{
    q45k_tile(1, MR, NV, PF, nsb, w, ps, xq, ldxq, y, ldy);
}

TQ static AI void iq4xs_tile(const int MR, const int NV, const int PF, int nsb, const uint8_t *w, size_t ps,
                             const uint8_t *xq, size_t ldxq, float *y, int ldy)
{
    q45k_tile(2, MR, NV, PF, nsb, w, ps, xq, ldxq, y, ldy);
}

/* ---------------------------------------------------------------- Q2_K */

/* Q2_K: 16 sub-blocks of 16 (4 groups each), 2-bit unsigned codes, 4-bit
 * scales and mins. Sub-block s reads groups 4 s .. 4 s + 3 from vectors
 * (4 s + g) % 16 at bits 2 (s / 4); its int32 sums are scaled at once
 * (vpmulld), so one accumulator per (row, panel) suffices; the min term is
 * a vpdpwssd of the min pairs against the activation's 16-element sum
 * pairs, as Q6_K's offset. */
TQ static AI void q2k_tile(const int MR, const int NV, const int PF, int nsb, const uint8_t *w, size_t ps,
                           const uint8_t *xq, size_t ldxq, float *y, int ldy)
{
    const __m512i three = _mm512_set1_epi8(3), lo16 = _mm512_set1_epi32(0xFFFF);
    __m512 acc[4][4];
    _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[m][j] = _mm512_setzero_ps();
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *B = w + (size_t)sb * 1600;
        const struct cpu_xq256 *xb[4];
        _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++) xb[m] =
            (const struct cpu_xq256 *)(xq + (size_t)m * ldxq) + sb;
        __m512i ia[4][4];
        _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) ia[m][j] = _mm512_setzero_si512();
        for (int s = 0; s < 16; s++) {
            __m128i sh = _mm_cvtsi32_si128(2 * (s / 4));
            __m512i a[4][4];
            _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[m][j] = _mm512_setzero_si512();
            _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++)
            {
                __m512i wv[4];
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
                {
                    const uint8_t *src = B + (size_t)j * ps + 576 + 64 * ((4 * s + g) % 16);
                    if (PF && s < 4)
                        _mm_prefetch((const char *)src + QP_PF_AHEAD, QP_PF_HINT);
                    wv[j] = _mm512_and_si512(_mm512_srl_epi16(_mm512_load_si512((const void *)src), sh), three);
                }
                _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
                {
                    __m512i xv = bcast32(xb[m]->q + 16 * s + 4 * g);
                    _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[m][j] =
                        _mm512_dpbusd_epi32(a[m][j], wv[j], xv);
                }
            }
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            {
                __m512i sp = _mm512_cvtepu8_epi16(_mm256_load_si256((const void *)(B + (size_t)j * ps + 64 + 32 * (s % 8))));
                __m512i sc = s >= 8 ? _mm512_srli_epi32(sp, 16) : _mm512_and_si512(sp, lo16);
                _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++) ia[m][j] =
                    _mm512_add_epi32(ia[m][j], _mm512_mullo_epi32(a[m][j], sc));
            }
        }
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
        {
            const uint8_t *Bj = B + (size_t)j * ps;
            __m512 d = ld_f16x16(Bj), dmin = ld_f16x16(Bj + 32);
            _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
            {
                __m512i J = _mm512_setzero_si512();
                _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
                {
                    int32_t pr;
                    memcpy(&pr, &xb[m]->s16p[2 * i], 4);
                    J = _mm512_dpwssd_epi32(J, _mm512_cvtepu8_epi16(_mm256_load_si256((const void *)(Bj + 320 + 32 * i))),
                                            _mm512_set1_epi32(pr));
                }
                __m512 dx = _mm512_set1_ps(xb[m]->d);
                acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[m][j]), _mm512_mul_ps(d, dx), acc[m][j]);
                acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(), J)),
                                            _mm512_mul_ps(dmin, dx), acc[m][j]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            _mm512_storeu_ps(y + (size_t)m * ldy + 16 * j, acc[m][j]);
}

/* ---------------------------------------------------------------- Q6_K */

/* a | (b & m) in one instruction (vpternlogd, truth table 0xF8). */
TQ static AI __m512i or_and30(__m512i a, __m512i b, __m512i m)
{
    return _mm512_ternarylogic_epi32(a, b, m, 0xF8);
}

TQ static AI void q6k_tile(const int MR, const int NV, const int PF, int nsb, const uint8_t *w,
                           size_t ps, const uint8_t *xq, size_t ldxq, float *y, int ldy)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512 acc[4][4];
    _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[m][j] = _mm512_setzero_ps();
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *B = w + (size_t)sb * 3392;
        const struct cpu_xq256 *xb[4];
        _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++) xb[m] =
            (const struct cpu_xq256 *)(xq + (size_t)m * ldxq) + sb;
        __m512i ia[4][4];
        _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) ia[m][j] = _mm512_setzero_si512();
        for (int s = 0; s < 16; s++) { /* sub-block s of 16: groups 4s .. 4s + 3 */
            __m512i a[4][4];
            _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[m][j] = _mm512_setzero_si512();
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++)
            {
                int g = 4 * s + t, hs = g / 16; /* top bits at 2 hs of vector g % 16 */
                __m512i wv[4];
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
                {
                    const uint8_t *Bj = B + (size_t)j * ps;
                    const uint8_t *pl = Bj + 320 + 64 * (g % 32), *ph = Bj + 2368 + 64 * (g % 16);
                    if (PF && g < 32)
                        _mm_prefetch((const char *)pl + QP_PF_AHEAD, QP_PF_HINT);
                    if (PF && g < 16)
                        _mm_prefetch((const char *)ph + QP_PF_AHEAD, QP_PF_HINT);
                    __m512i l = _mm512_load_si512((const void *)pl), q = _mm512_load_si512((const void *)ph);
                    l = _mm512_and_si512(g >= 32 ? _mm512_srli_epi16(l, 4) : l, lo4);
                    q = hs == 0 ? _mm512_slli_epi16(q, 4)
                        : hs == 1 ? _mm512_slli_epi16(q, 2)
                        : hs == 2 ? q : _mm512_srli_epi16(q, 2);
                    wv[j] = or_and30(l, q, m30);
                }
                _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
                {
                    __m512i xv = bcast32(xb[m]->q + 16 * s + 4 * t);
                    _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[m][j] =
                        _mm512_dpbusd_epi32(a[m][j], wv[j], xv);
                }
            }
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            {
                __m512i sp = _mm512_cvtepi8_epi16(_mm256_load_si256((const void *)(B + (size_t)j * ps + 64 + 32 * (s % 8))));
                __m512i sc = s >= 8 ? _mm512_srai_epi32(sp, 16) : _mm512_srai_epi32(_mm512_slli_epi32(sp, 16), 16);
                _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++) ia[m][j] =
                    _mm512_add_epi32(ia[m][j], _mm512_mullo_epi32(a[m][j], sc));
            }
        }
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
        {
            const uint8_t *Bj = B + (size_t)j * ps;
            __m512 d = ld_f16x16(Bj);
            __m512i sp[8];
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) sp[i] =
                _mm512_cvtepi8_epi16(_mm256_load_si256((const void *)(Bj + 64 + 32 * i)));
            _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
            {
                __m512i c = _mm512_setzero_si512(); /* sum_s sc_s sum qx over s */
                _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
                {
                    int32_t pr;
                    memcpy(&pr, &xb[m]->s16p[2 * i], 4);
                    c = _mm512_dpwssd_epi32(c, sp[i], _mm512_set1_epi32(pr));
                }
                __m512i I = _mm512_sub_epi32(ia[m][j], _mm512_slli_epi32(c, 5));
                acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(d, _mm512_set1_ps(xb[m]->d)),
                                            acc[m][j]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            _mm512_storeu_ps(y + (size_t)m * ldy + 16 * j, acc[m][j]);
}

/* Q6_K with MR x NV <= 4 (decode with one or two rows, and the prefill
 * tiles of one panel): the same sums in another order. Each 64-byte
 * vector of top bits serves four groups (v, v + 16, v + 32, v + 48, in
 * sub-blocks s0, s0 + 4, s0 + 8, s0 + 12 for s0 = v / 4) and each vector of
 * low bits two, so loading and unpacking them once per four groups (four
 * sub-block accumulators at a time) costs about 30 % fewer instructions
 * than a sub-block at a time; the integer sums are the same, so are the
 * bits. Four accumulators per (row, panel): only for small tiles. */
TQ static AI void q6kd_tile(const int MR, const int NV, const int PF, int nsb, const uint8_t *w,
                            size_t ps, const uint8_t *xq, size_t ldxq, float *y, int ldy)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512 acc[4][4];
    _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[m][j] = _mm512_setzero_ps();
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *B = w + (size_t)sb * 3392;
        const struct cpu_xq256 *xb[4];
        _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++) xb[m] =
            (const struct cpu_xq256 *)(xq + (size_t)m * ldxq) + sb;
        __m512i ia[4][4];
        _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) ia[m][j] = _mm512_setzero_si512();
        for (int s0 = 0; s0 < 4; s0++) {
            __m512i a[4][4][4]; /* [m][j][sub-block s0 + 4 i] */
            _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
                    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) a[m][j][i] = _mm512_setzero_si512();
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++)
            {
                int v = 4 * s0 + t; /* groups v + 16 i, i < 4 */
                __m512i wv[4][4];
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
                {
                    const uint8_t *Bj = B + (size_t)j * ps;
                    const uint8_t *p0 = Bj + 320 + 64 * v, *p1 = Bj + 320 + 64 * (v + 16), *ph = Bj + 2368 + 64 * v;
                    if (PF) {
                        _mm_prefetch((const char *)p0 + QP_PF_AHEAD, QP_PF_HINT);
                        _mm_prefetch((const char *)p1 + QP_PF_AHEAD, QP_PF_HINT);
                        _mm_prefetch((const char *)ph + QP_PF_AHEAD, QP_PF_HINT);
                    }
                    __m512i l0 = _mm512_load_si512((const void *)p0), l1 = _mm512_load_si512((const void *)p1);
                    __m512i q = _mm512_load_si512((const void *)ph);
                    wv[j][0] = or_and30(_mm512_and_si512(l0, lo4), _mm512_slli_epi16(q, 4), m30);
                    wv[j][1] = or_and30(_mm512_and_si512(l1, lo4), _mm512_slli_epi16(q, 2), m30);
                    wv[j][2] = or_and30(_mm512_and_si512(_mm512_srli_epi16(l0, 4), lo4), q, m30);
                    wv[j][3] = or_and30(_mm512_and_si512(_mm512_srli_epi16(l1, 4), lo4), _mm512_srli_epi16(q, 2), m30);
                }
                _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
                    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
                    {
                        /* group v + 16 i = 4 (s0 + 4 i) + t: sub-block s0 + 4 i, dword t */
                        __m512i xv = bcast32(xb[m]->q + 16 * (s0 + 4 * i) + 4 * t);
                        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[m][j][i] =
                            _mm512_dpbusd_epi32(a[m][j][i], wv[j][i], xv);
                    }
            }
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
                {
                    int s = s0 + 4 * i;
                    __m512i sp = _mm512_cvtepi8_epi16(_mm256_load_si256((const void *)(B + (size_t)j * ps + 64 + 32 * (s % 8))));
                    __m512i sc = s >= 8 ? _mm512_srai_epi32(sp, 16) : _mm512_srai_epi32(_mm512_slli_epi32(sp, 16), 16);
                    _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++) ia[m][j] =
                        _mm512_add_epi32(ia[m][j], _mm512_mullo_epi32(a[m][j][i], sc));
                }
        }
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
        {
            const uint8_t *Bj = B + (size_t)j * ps;
            __m512 d = ld_f16x16(Bj);
            __m512i sp[8];
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) sp[i] =
                _mm512_cvtepi8_epi16(_mm256_load_si256((const void *)(Bj + 64 + 32 * i)));
            _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
            {
                __m512i c = _mm512_setzero_si512();
                _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
                {
                    int32_t pr;
                    memcpy(&pr, &xb[m]->s16p[2 * i], 4);
                    c = _mm512_dpwssd_epi32(c, sp[i], _mm512_set1_epi32(pr));
                }
                __m512i I = _mm512_sub_epi32(ia[m][j], _mm512_slli_epi32(c, 5));
                acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(d, _mm512_set1_ps(xb[m]->d)),
                                            acc[m][j]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            _mm512_storeu_ps(y + (size_t)m * ldy + 16 * j, acc[m][j]);
}

/* ----------------------------------------------------------------- AWQ */

/* G: the group (a multiple of 32); per group, G / 32 activation blocks,
 * the first half of them in the low nibbles. */
TQ static AI void awq_tile(const int MR, const int NV, const int PF, int ng, int G, const uint8_t *w,
                           size_t ps, const uint8_t *xq, size_t ldxq, float *y, int ldy)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    size_t gbytes = (size_t)(64 + G * 8);
    __m512 acc[6][4];
    _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[m][j] = _mm512_setzero_ps();
    for (int gi = 0; gi < ng; gi++) {
        const uint8_t *B = w + (size_t)gi * gbytes;
        __m512 s[4];
        __m512i z[4];
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
        {
            s[j] = ld_f16x16(B + (size_t)j * ps);
            z[j] = _mm512_cvtepu8_epi32(_mm_load_si128((const void *)(B + (size_t)j * ps + 32)));
        }
        for (int xbk = 0; xbk < G / 32; xbk++) {
            int h = xbk >= G / 64, u0 = 8 * (h ? xbk - G / 64 : xbk);
            const struct cpu_xq32 *xb[6];
            _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++) xb[m] =
                (const struct cpu_xq32 *)(xq + (size_t)m * ldxq) + (size_t)gi * (size_t)(G / 32) + xbk;
            __m512i a[6][4];
            _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[m][j] = _mm512_setzero_si512();
            _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++)
            {
                __m512i wv[4];
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
                {
                    const uint8_t *src = B + (size_t)j * ps + 64 + 64 * (u0 + g);
                    if (PF && !h)
                        _mm_prefetch((const char *)src + QP_PF_AHEAD, QP_PF_HINT);
                    __m512i raw = _mm512_load_si512((const void *)src);
                    wv[j] = _mm512_and_si512(h ? _mm512_srli_epi16(raw, 4) : raw, lo4);
                }
                _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
                {
                    __m512i xv = bcast32(xb[m]->q + 4 * g);
                    _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[m][j] =
                        _mm512_dpbusd_epi32(a[m][j], wv[j], xv);
                }
            }
            _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
            {
                __m512i xs = _mm512_set1_epi32(xb[m]->s);
                __m512 dx = _mm512_set1_ps(xb[m]->d);
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
                {
                    __m512i I = _mm512_sub_epi32(a[m][j], _mm512_mullo_epi32(z[j], xs));
                    acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(s[j], dx), acc[m][j]);
                }
            }
        }
    }
    _Pragma("GCC unroll 6") for (int m = 0; m < MR; m++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            _mm512_storeu_ps(y + (size_t)m * ldy + 16 * j, acc[m][j]);
}


/* ------------------------------------------------------- Q8_0 on AMX */

/* Prefill (M >= 16) with Q8_0 weights on the AMX tile unit, where the CPU
 * has AMX-INT8 and the kernel lets this process use the tile state. The
 * panel layout is already what TDPBSUD reads as its B operand: the 8
 * vectors of one Q8_0 block in a panel are 8 rows of 64 bytes, each 4
 * consecutive codes of each of the 16 weight rows, i.e. a (K = 32) x
 * (N = 16) tile in the VNNI order; the A operand is 16 activation rows'
 * codes of the same block, loaded in place (32 bytes at stride ldxq). One
 * TDPBSUD gives the block's exact int32 sums sum (qw + 128) qx for 16 x 16
 * outputs, the same integers vpdpbusd gives, and the float step is the
 * same per element, blocks ascending: the same bits as the VNNI tiles and
 * the portable product. One block per instruction (K = 32, half a tile's
 * depth) because each block has its own scales; the float step, 5 vector
 * instructions per row of 16 outputs and block, is then most of the work,
 * against 8 vpdpbusd and their loads, broadcasts and float step for the
 * same products on the VNNI path. */

#define TA __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

/* ldtilecfg's 64-byte operand (palette 1). */
struct amx_cfg {
    uint8_t palette, start_row;
    uint8_t rsv[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static int amx_usable;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

/* Whether the CPU has AMX-TILE and AMX-INT8, the OS enables their state
 * (XCR0 bits 17, 18) and grants this process the tile data
 * (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+); REDLM_CPU_AMX=0 turns the
 * path off (A/B timing, or a machine where it misbehaves). A property of
 * the process, asked once: the permission request is process-wide. */
static void amx_probe(void)
{
    const char *e = getenv("REDLM_CPU_AMX");
    if (e && e[0] == '0')
        return;
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7)
        return;
    __cpuid_count(7, 0, a, b, c, d);
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) /* AMX-TILE, AMX-INT8 */
        return;
    __cpuid(1, a, b, c, d);
    if (!((c >> 27) & 1)) /* OSXSAVE: xgetbv allowed */
        return;
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & 0x60000) != 0x60000) /* XTILECFG, XTILEDATA */
        return;
#if defined(SYS_arch_prctl)
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0)
        return;
    amx_usable = 1;
#endif
}

static int amx_ready(void)
{
    pthread_once(&amx_once, amx_probe);
    return amx_usable;
}

/* The tiles the AMX products use: tmm0-3 C (16 x 16 int32), tmm4-5 A (16
 * rows x kd codes), tmm6-7 B (kd / 4 x (16 rows x 4 codes)). This thread's
 * tile state until _tile_release(). */
TA static void amx_config(int kd) /* kd: the codes per dot product, 32 or 16 */
{
    struct amx_cfg cfg __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 4; t++)
        cfg.rows[t] = 16, cfg.colsb[t] = 64;
    cfg.rows[4] = cfg.rows[5] = 16, cfg.colsb[4] = cfg.colsb[5] = (uint16_t)kd;
    cfg.rows[6] = cfg.rows[7] = (uint8_t)(kd / 4), cfg.colsb[6] = cfg.colsb[7] = 64;
    /* GCC 12 does not see ldtilecfg read the struct and drops the stores
     * above (the tile instructions then fault): make them visible */
    __asm__ volatile("" : : "m"(cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* The float step of one block for 16 rows: buf holds the block's 16 x 16
 * int32 sums (row m, lane n), cs and dx the rows' 128 * (sum of codes) and
 * scales. */
TA static AI void q80_amx_epi(__m512 acc[16], const int32_t *buf, const int32_t *cs, const float *dx, __m512 dw)
{
    _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++)
    {
        __m512i is = _mm512_sub_epi32(_mm512_load_si512((const void *)(buf + 16 * m)), _mm512_set1_epi32(cs[m]));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(dx[m])), acc[m]);
    }
}

/* 16 activation rows (their blocks' cs / dx at [b][16]) against panels
 * [pa, pb), the tile config loaded by the caller. Four blocks at a time
 * in four accumulator tiles, so that the tile unit has four independent
 * load-multiply-store chains in flight (two at a time measured 1.6x
 * slower per block). */
TA static void q80_amx_strip(int nb, const uint8_t *W, size_t ps, int pa, int pb, const int8_t *xa,
                             const int32_t *cs, const float *dx, float *y, int ldy)
{
    int32_t buf[4][256] __attribute__((aligned(64)));
    for (int p = pa; p < pb; p++) {
        const uint8_t *w = W + (size_t)p * ps;
        __m512 acc[16];
        _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
        int b = 0;
        for (; b + 4 <= nb; b += 4) {
            const uint8_t *B = w + (size_t)(b / 2) * 1088;
            const int8_t *X = xa + (size_t)512 * b;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            _tile_loadd(4, X, 32);
            _tile_loadd(6, B + 64, 64);
            _tile_dpbsud(0, 4, 6);
            _tile_loadd(5, X + 512, 32);
            _tile_loadd(7, B + 576, 64);
            _tile_dpbsud(1, 5, 7);
            _tile_loadd(4, X + 1024, 32);
            _tile_loadd(6, B + 1088 + 64, 64);
            _tile_dpbsud(2, 4, 6);
            _tile_loadd(5, X + 1536, 32);
            _tile_loadd(7, B + 1088 + 576, 64);
            _tile_dpbsud(3, 5, 7);
            _tile_stored(0, buf[0], 64);
            _tile_stored(1, buf[1], 64);
            _tile_stored(2, buf[2], 64);
            _tile_stored(3, buf[3], 64);
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
                q80_amx_epi(acc, buf[i], cs + 16 * (b + i), dx + 16 * (b + i),
                            ld_f16x16(B + 1088 * (i / 2) + 32 * (i % 2)));
        }
        for (; b < nb; b += 2) { /* nb % 4 == 2: the last pair */
            const uint8_t *B = w + (size_t)(b / 2) * 1088;
            const int8_t *X = xa + (size_t)512 * b;
            _tile_zero(0);
            _tile_zero(1);
            _tile_loadd(4, X, 32);
            _tile_loadd(6, B + 64, 64);
            _tile_dpbsud(0, 4, 6);
            _tile_loadd(5, X + 512, 32);
            _tile_loadd(7, B + 576, 64);
            _tile_dpbsud(1, 5, 7);
            _tile_stored(0, buf[0], 64);
            _tile_stored(1, buf[1], 64);
            q80_amx_epi(acc, buf[0], cs + 16 * b, dx + 16 * b, ld_f16x16(B));
            q80_amx_epi(acc, buf[1], cs + 16 * (b + 1), dx + 16 * (b + 1), ld_f16x16(B + 32));
        }
        _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++)
            _mm512_storeu_ps(y + (size_t)m * ldy + 16 * p, acc[m]);
    }
}

/* Rows [0, M16) (a multiple of 16) against panels [pa, pb), in chunks of
 * activation rows whose codes stay in L2 (as the VNNI path), each chunk
 * first copied into scratch as the A tiles want them: per strip of 16
 * rows and block, the 16 rows' 32 codes in 512 contiguous bytes (a tile
 * load of 8 whole lines, not 16 lines of the rows' blocks), beside each
 * block's cs = 128 * (sum of codes) and scale per row. Returns 0 without
 * touching y when the scratch cannot be had (the caller then runs the VNNI
 * tiles). */
TA static int q80_amx(int M16, int nb2, const uint8_t *W, size_t ps, int pa, int pb, const uint8_t *xq,
                      size_t ldxq, float *y, int ldy)
{
    int nb = 2 * nb2;
    int mc = (int)(QP_MC_BYTES / ldxq) / 16 * 16;
    mc = mc < 16 ? 16 : mc;
    mc = mc < M16 ? mc : M16;
    size_t per_row = (size_t)nb * 40; /* 32 codes, cs and dx per block */
    uint8_t *scratch = aligned_alloc(64, ((size_t)mc * per_row + 63) / 64 * 64);
    if (!scratch)
        return 0;
    int8_t *xa = (int8_t *)scratch;
    int32_t *cs = (int32_t *)(scratch + (size_t)mc * nb * 32);
    float *dx = (float *)(cs + (size_t)mc * nb);
    amx_config(32);
    for (int m0 = 0; m0 < M16; m0 += mc) {
        int m1 = m0 + mc < M16 ? m0 + mc : M16;
        for (int m = m0; m < m1; m++) {
            const struct cpu_xq32 *xb = (const struct cpu_xq32 *)(xq + (size_t)m * ldxq);
            size_t st = (size_t)((m - m0) / 16) * (size_t)nb, r = (size_t)(m % 16);
            for (int b = 0; b < nb; b++) {
                memcpy(xa + ((st + (size_t)b) * 16 + r) * 32, xb[b].q, 32);
                cs[(st + (size_t)b) * 16 + r] = 128 * xb[b].s;
                dx[(st + (size_t)b) * 16 + r] = xb[b].d;
            }
        }
        for (int p = pa; p < pb; p += 4) {
            int pe = pb - p < 4 ? pb : p + 4;
            for (int m = m0; m < m1; m += 16) {
                size_t o = (size_t)((m - m0) / 16) * (size_t)nb * 16;
                q80_amx_strip(nb, W, ps, p, pe, xa + o * 32, cs + o, dx + o, y + (size_t)m * ldy, ldy);
            }
        }
    }
    _tile_release();
    free(scratch);
    return 1;
}

/* ------------------------------------------------------- Q4_K on AMX */

/* Prefill with Q4_K weights on the tile unit, as Q8_0's: the int32 sum of
 * each 32-wide sub-block is one TDPBSUD of 16 activation rows (A, copied
 * per chunk into tile order) against the sub-block's 16 weight rows (B).
 * The panels hold two sub-blocks per byte (nibbles), so each panel is
 * first unpacked into scratch once per chunk of rows (16 x 32 bytes per
 * sub-block, the layout TDPBSUD reads) and then serves every 16-row strip
 * of the chunk. Then the sums go through qgemm.h's Q4_K recipe exactly as
 * on the VNNI tiles: I = sum_s sc_s * sum_s (vpmulld, int32), the min term
 * J by vpdpwssd of the min pairs against the activation's 32-element sum
 * pairs, and the two f32 steps per super-block, ascending; between
 * super-blocks the f32 accumulator waits in y (16 rows of integer sums
 * fill the registers), which rounds nothing. */

/* One panel (unpacked: u, its header lines in w) against one strip of 16
 * rows (codes xa [sub-block][16][32]; per super-block pair sums pr
 * [sb][4][16] and scales dx [sb][16]). */
TA static void q4k_amx_strip(int nsb, const uint8_t *w, const uint8_t *u, const int8_t *xa, const int32_t *pr,
                             const float *dx, float *y, int ldy)
{
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
    int32_t buf[4][256] __attribute__((aligned(64)));
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *B = w + (size_t)sb * 2368;
        __m512i ia[16];
        _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++) ia[m] = _mm512_setzero_si512();
        _Pragma("GCC unroll 2") for (int hf = 0; hf < 2; hf++)
        {
            const int8_t *X = xa + (size_t)(8 * sb + 4 * hf) * 512;
            const uint8_t *U = u + (size_t)(8 * sb + 4 * hf) * 512;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            _tile_loadd(4, X, 32);
            _tile_loadd(6, U, 64);
            _tile_dpbsud(0, 4, 6);
            _tile_loadd(5, X + 512, 32);
            _tile_loadd(7, U + 512, 64);
            _tile_dpbsud(1, 5, 7);
            _tile_loadd(4, X + 1024, 32);
            _tile_loadd(6, U + 1024, 64);
            _tile_dpbsud(2, 4, 6);
            _tile_loadd(5, X + 1536, 32);
            _tile_loadd(7, U + 1536, 64);
            _tile_dpbsud(3, 5, 7);
            _tile_stored(0, buf[0], 64);
            _tile_stored(1, buf[1], 64);
            _tile_stored(2, buf[2], 64);
            _tile_stored(3, buf[3], 64);
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++)
            {
                /* sub-block 4 hf + t: scale pair t, half hf */
                __m512i sp = _mm512_cvtepu8_epi16(_mm256_load_si256((const void *)(B + 64 + 32 * t)));
                __m512i sc = hf ? _mm512_srli_epi32(sp, 16) : _mm512_and_si512(sp, lo16);
                _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++) ia[m] = _mm512_add_epi32(
                    ia[m], _mm512_mullo_epi32(_mm512_load_si512((const void *)buf[t] + 64 * m), sc));
            }
        }
        __m512 d = ld_f16x16(B), dmin = ld_f16x16(B + 32);
        __m512i mp[4];
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) mp[i] =
            _mm512_cvtepu8_epi16(_mm256_load_si256((const void *)(B + 192 + 32 * i)));
        const int32_t *P = pr + (size_t)sb * 64;
        const float *D = dx + (size_t)sb * 16;
        _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++)
        {
            __m512i J = _mm512_setzero_si512();
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) J =
                _mm512_dpwssd_epi32(J, mp[i], _mm512_set1_epi32(P[16 * i + m]));
            __m512 dxv = _mm512_set1_ps(D[m]);
            float *yr = y + (size_t)m * ldy;
            __m512 a = sb ? _mm512_loadu_ps(yr) : _mm512_setzero_ps();
            a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[m]), _mm512_mul_ps(d, dxv), a);
            a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(), J)),
                                _mm512_mul_ps(dmin, dxv), a);
            _mm512_storeu_ps(yr, a);
        }
    }
}

/* Rows [0, M16) against panels [pa, pb) of Q4_K; as q80_amx. */
TA static int q4k_amx(int M16, int nsb, const uint8_t *W, size_t ps, int pa, int pb, const uint8_t *xq,
                      size_t ldxq, float *y, int ldy)
{
    int mc = (int)(QP_MC_BYTES / ldxq) / 16 * 16;
    mc = mc < 16 ? 16 : mc;
    mc = mc < M16 ? mc : M16;
    size_t per_row = (size_t)nsb * (256 + 16 * 4 + 4);
    uint8_t *scratch = aligned_alloc(64, ((size_t)mc * per_row + 63) / 64 * 64 + (size_t)nsb * 4096);
    if (!scratch)
        return 0;
    int8_t *xa = (int8_t *)scratch;
    int32_t *pr = (int32_t *)(scratch + (size_t)mc * nsb * 256);
    float *dx = (float *)(pr + (size_t)mc * nsb * 16);
    uint8_t *u = (uint8_t *)(dx + (size_t)mc * nsb);
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    amx_config(32);
    for (int m0 = 0; m0 < M16; m0 += mc) {
        int m1 = m0 + mc < M16 ? m0 + mc : M16;
        for (int m = m0; m < m1; m++) {
            const struct cpu_xq256 *xb = (const struct cpu_xq256 *)(xq + (size_t)m * ldxq);
            size_t st = (size_t)((m - m0) / 16), r = (size_t)(m % 16);
            for (int sb = 0; sb < nsb; sb++) {
                for (int sub = 0; sub < 8; sub++)
                    memcpy(xa + (((st * (size_t)nsb + (size_t)sb) * 8 + (size_t)sub) * 16 + r) * 32,
                           xb[sb].q + 32 * sub, 32);
                for (int i = 0; i < 4; i++)
                    memcpy(pr + ((st * (size_t)nsb + (size_t)sb) * 4 + (size_t)i) * 16 + r, &xb[sb].s32p[2 * i], 4);
                dx[(st * (size_t)nsb + (size_t)sb) * 16 + r] = xb[sb].d;
            }
        }
        for (int p = pa; p < pb; p++) {
            const uint8_t *w = W + (size_t)p * ps;
            for (int sb = 0; sb < nsb; sb++)
                for (int sub = 0; sub < 8; sub++)
                    for (int g = 0; g < 8; g++) {
                        __m512i raw = _mm512_load_si512((const void *)(w + (size_t)sb * 2368 + 320 + 64 * (8 * (sub % 4) + g)));
                        _mm512_store_si512((void *)(u + ((size_t)(8 * sb + sub) * 8 + (size_t)g) * 64),
                                           _mm512_and_si512(sub >= 4 ? _mm512_srli_epi16(raw, 4) : raw, lo4));
                    }
            for (int m = m0; m < m1; m += 16) {
                size_t st = (size_t)((m - m0) / 16);
                q4k_amx_strip(nsb, w, u, xa + st * (size_t)nsb * 8 * 512, pr + st * (size_t)nsb * 64,
                              dx + st * (size_t)nsb * 16, y + (size_t)m * ldy + 16 * p, ldy);
            }
        }
    }
    _tile_release();
    free(scratch);
    return 1;
}

/* ------------------------------------------------------- Q6_K on AMX */

/* Q6_K as Q4_K, with 16-wide sub-blocks: one TDPBSUD of depth 16 per
 * sub-block (A 16 rows x 16 codes, B 4 x 64 bytes), the panel unpacked per
 * chunk into the codes + 32 (6 bits: low nibble and top pair merged as the
 * VNNI tiles do), then qgemm.h's recipe as q6k_tile: I = sum_s sc_s *
 * sum_s (vpmulld) less 32 sum_s sc_s * (sum of the activation's codes over
 * s) (vpdpwssd against the stored 16-element sum pairs), one f32 step per
 * super-block, the accumulator waiting in y between them. */
TA static void q6k_amx_strip(int nsb, const uint8_t *w, const uint8_t *u, const int8_t *xa, const int32_t *pr,
                             const float *dx, float *y, int ldy)
{
    int32_t buf[4][256] __attribute__((aligned(64)));
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *B = w + (size_t)sb * 3392;
        __m512i ia[16];
        _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++) ia[m] = _mm512_setzero_si512();
        for (int q4 = 0; q4 < 4; q4++) { /* sub-blocks 4 q4 .. 4 q4 + 3 */
            const int8_t *X = xa + (size_t)(16 * sb + 4 * q4) * 256;
            const uint8_t *U = u + (size_t)(16 * sb + 4 * q4) * 256;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            _tile_loadd(4, X, 16);
            _tile_loadd(6, U, 64);
            _tile_dpbsud(0, 4, 6);
            _tile_loadd(5, X + 256, 16);
            _tile_loadd(7, U + 256, 64);
            _tile_dpbsud(1, 5, 7);
            _tile_loadd(4, X + 512, 16);
            _tile_loadd(6, U + 512, 64);
            _tile_dpbsud(2, 4, 6);
            _tile_loadd(5, X + 768, 16);
            _tile_loadd(7, U + 768, 64);
            _tile_dpbsud(3, 5, 7);
            _tile_stored(0, buf[0], 64);
            _tile_stored(1, buf[1], 64);
            _tile_stored(2, buf[2], 64);
            _tile_stored(3, buf[3], 64);
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++)
            {
                int sub = 4 * q4 + t;
                __m512i sp = _mm512_cvtepi8_epi16(_mm256_load_si256((const void *)(B + 64 + 32 * (sub % 8))));
                __m512i sc = sub >= 8 ? _mm512_srai_epi32(sp, 16) : _mm512_srai_epi32(_mm512_slli_epi32(sp, 16), 16);
                _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++) ia[m] = _mm512_add_epi32(
                    ia[m], _mm512_mullo_epi32(_mm512_load_si512((const void *)buf[t] + 64 * m), sc));
            }
        }
        __m512 d = ld_f16x16(B);
        __m512i sp[8];
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) sp[i] =
            _mm512_cvtepi8_epi16(_mm256_load_si256((const void *)(B + 64 + 32 * i)));
        const int32_t *P = pr + (size_t)sb * 128;
        const float *D = dx + (size_t)sb * 16;
        _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++)
        {
            __m512i c = _mm512_setzero_si512();
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) c =
                _mm512_dpwssd_epi32(c, sp[i], _mm512_set1_epi32(P[16 * i + m]));
            __m512i I = _mm512_sub_epi32(ia[m], _mm512_slli_epi32(c, 5));
            float *yr = y + (size_t)m * ldy;
            __m512 a = sb ? _mm512_loadu_ps(yr) : _mm512_setzero_ps();
            a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(d, _mm512_set1_ps(D[m])), a);
            _mm512_storeu_ps(yr, a);
        }
    }
}

/* Rows [0, M16) against panels [pa, pb) of Q6_K; as q4k_amx. */
TA static int q6k_amx(int M16, int nsb, const uint8_t *W, size_t ps, int pa, int pb, const uint8_t *xq,
                      size_t ldxq, float *y, int ldy)
{
    int mc = (int)(QP_MC_BYTES / ldxq) / 16 * 16;
    mc = mc < 16 ? 16 : mc;
    mc = mc < M16 ? mc : M16;
    size_t per_row = (size_t)nsb * (256 + 8 * 4 + 4);
    uint8_t *scratch = aligned_alloc(64, ((size_t)mc * per_row + 63) / 64 * 64 + (size_t)nsb * 4096);
    if (!scratch)
        return 0;
    int8_t *xa = (int8_t *)scratch;
    int32_t *pr = (int32_t *)(scratch + (size_t)mc * nsb * 256);
    float *dx = (float *)(pr + (size_t)mc * nsb * 8);
    uint8_t *u = (uint8_t *)(dx + (size_t)mc * nsb);
    const __m512i lo4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    amx_config(16);
    for (int m0 = 0; m0 < M16; m0 += mc) {
        int m1 = m0 + mc < M16 ? m0 + mc : M16;
        for (int m = m0; m < m1; m++) {
            const struct cpu_xq256 *xb = (const struct cpu_xq256 *)(xq + (size_t)m * ldxq);
            size_t st = (size_t)((m - m0) / 16), r = (size_t)(m % 16);
            for (int sb = 0; sb < nsb; sb++) {
                size_t o = st * (size_t)nsb + (size_t)sb;
                for (int sub = 0; sub < 16; sub++)
                    memcpy(xa + ((o * 16 + (size_t)sub) * 16 + r) * 16, xb[sb].q + 16 * sub, 16);
                for (int i = 0; i < 8; i++)
                    memcpy(pr + (o * 8 + (size_t)i) * 16 + r, &xb[sb].s16p[2 * i], 4);
                dx[o * 16 + r] = xb[sb].d;
            }
        }
        for (int p = pa; p < pb; p++) {
            const uint8_t *w = W + (size_t)p * ps;
            for (int sb = 0; sb < nsb; sb++) {
                const uint8_t *B = w + (size_t)sb * 3392;
                for (int g = 0; g < 64; g++) { /* codes 4 g .. 4 g + 3 of the 16 rows */
                    int hs = g / 16;
                    __m512i l = _mm512_load_si512((const void *)(B + 320 + 64 * (g % 32)));
                    __m512i q = _mm512_load_si512((const void *)(B + 2368 + 64 * (g % 16)));
                    l = _mm512_and_si512(g >= 32 ? _mm512_srli_epi16(l, 4) : l, lo4);
                    q = hs == 0 ? _mm512_slli_epi16(q, 4)
                        : hs == 1 ? _mm512_slli_epi16(q, 2)
                        : hs == 2 ? q : _mm512_srli_epi16(q, 2);
                    _mm512_store_si512((void *)(u + ((size_t)sb * 64 + (size_t)g) * 64), or_and30(l, q, m30));
                }
            }
            for (int m = m0; m < m1; m += 16) {
                size_t st = (size_t)((m - m0) / 16);
                q6k_amx_strip(nsb, w, u, xa + st * (size_t)nsb * 16 * 256, pr + st * (size_t)nsb * 128,
                              dx + st * (size_t)nsb * 16, y + (size_t)m * ldy + 16 * p, ldy);
            }
        }
    }
    _tile_release();
    free(scratch);
    return 1;
}

/* ---------------------------------------------------------------- driver */

struct qargs {
    int nblk, G;          /* block pairs / super-blocks / groups per row; AWQ group */
    const uint8_t *w;     /* panel 0 */
    size_t ps;            /* bytes per panel */
    const uint8_t *xq;
    size_t ldxq;
    float *y;
    int ldy;
};

#define QT_ARGS a->nblk, a->w, a->ps, a->xq, a->ldxq, a->y, a->ldy
#define QT_CASE(F, mr, nv, pf)                                                \
    case (mr) * 16 + (nv) * 2 + (pf): F##_tile(mr, nv, pf, QT_ARGS); break;
#define QT_AWQ_CASE(mr, nv, pf)                                               \
    case (mr) * 16 + (nv) * 2 + (pf):                                         \
        awq_tile(mr, nv, pf, a->nblk, a->G, a->w, a->ps, a->xq, a->ldxq, a->y, a->ldy); \
        break;
/* decode shapes (MR 1..3, NV 1..4, with prefetch at NV 4) and prefill
 * shapes (MR up to 4 or 6, NV 1..2) */
#define QT_DECODE(C, F)                                                       \
    C(F, 1, 1, 0) C(F, 1, 2, 0) C(F, 1, 3, 0) C(F, 1, 4, 1)                   \
    C(F, 2, 1, 0) C(F, 2, 2, 0) C(F, 2, 3, 0) C(F, 2, 4, 1)                   \
    C(F, 3, 1, 0) C(F, 3, 2, 0) C(F, 3, 3, 0) C(F, 3, 4, 1)
#define QT_PREFILL4(C, F) C(F, 4, 1, 0) C(F, 4, 2, 0) C(F, 4, 2, 1)
#define QT_PREFILL6(C, F)                                                     \
    QT_PREFILL4(C, F) C(F, 5, 1, 0) C(F, 5, 2, 0) C(F, 6, 1, 0) C(F, 6, 2, 0) C(F, 6, 2, 1)
#define QT_A(F, mr, nv, pf) QT_AWQ_CASE(mr, nv, pf)

TQ static void tile_q80(int mr, int nv, int pf, const struct qargs *a)
{
    switch (mr * 16 + nv * 2 + pf) { QT_DECODE(QT_CASE, q80) QT_PREFILL6(QT_CASE, q80) default: break; }
}
TQ static void tile_q8m(int mr, int nv, int pf, const struct qargs *a)
{
    switch (mr * 16 + nv * 2 + pf) { QT_DECODE(QT_CASE, q8m) QT_PREFILL6(QT_CASE, q8m) default: break; }
}
TQ static void tile_q4k(int mr, int nv, int pf, const struct qargs *a)
{
    switch (mr * 16 + nv * 2 + pf) { QT_DECODE(QT_CASE, q4k) QT_PREFILL4(QT_CASE, q4k) default: break; }
}
TQ static void tile_q5k(int mr, int nv, int pf, const struct qargs *a)
{
    switch (mr * 16 + nv * 2 + pf) { QT_DECODE(QT_CASE, q5k) QT_PREFILL4(QT_CASE, q5k) default: break; }
}
TQ static void tile_q2k(int mr, int nv, int pf, const struct qargs *a)
{
    switch (mr * 16 + nv * 2 + pf) { QT_DECODE(QT_CASE, q2k) QT_PREFILL4(QT_CASE, q2k) default: break; }
}
TQ static void tile_iq4xs(int mr, int nv, int pf, const struct qargs *a)
{
    switch (mr * 16 + nv * 2 + pf) { QT_DECODE(QT_CASE, iq4xs) QT_PREFILL4(QT_CASE, iq4xs) default: break; }
}
#define C_Q6(mr, nv, pf) QT_CASE(q6kd, mr, nv, pf)
#define QT_DECODE2(C, F)                                                      \
    C(F, 1, 1, 0) C(F, 1, 2, 0) C(F, 1, 3, 0) C(F, 1, 4, 1)                   \
    C(F, 2, 1, 0) C(F, 2, 2, 0) C(F, 2, 3, 0) C(F, 2, 4, 1)
TQ static void tile_q6k(int mr, int nv, int pf, const struct qargs *a)
{
    if (mr <= 2 || nv == 1) {
        switch (mr * 16 + nv * 2 + pf) {
        QT_DECODE2(QT_CASE, q6kd) C_Q6(3, 1, 0) C_Q6(4, 1, 0) C_Q6(4, 1, 1) default: break;
        }
        return;
    }
    switch (mr * 16 + nv * 2 + pf) { QT_DECODE(QT_CASE, q6k) QT_PREFILL4(QT_CASE, q6k) default: break; }
}
TQ static void tile_awq(int mr, int nv, int pf, const struct qargs *a)
{
    switch (mr * 16 + nv * 2 + pf) { QT_DECODE(QT_A, awq) QT_PREFILL6(QT_A, awq) default: break; }
}

TQ static void tile_any(enum model_dtype dt, int mr, int nv, int pf, const struct qargs *a)
{
    switch (dt) {
    case MODEL_Q8_0: tile_q80(mr, nv, pf, a); break;
    case MODEL_Q4_1:
    case MODEL_Q5_1: tile_q8m(mr, nv, pf, a); break;
    case MODEL_Q4_K: tile_q4k(mr, nv, pf, a); break;
    case MODEL_Q5_K: tile_q5k(mr, nv, pf, a); break;
    case MODEL_IQ4_XS: tile_iq4xs(mr, nv, pf, a); break;
    case MODEL_Q2_K: tile_q2k(mr, nv, pf, a); break;
    case MODEL_Q6_K: tile_q6k(mr, nv, pf, a); break;
    case MODEL_AWQ4: tile_awq(mr, nv, pf, a); break;
    default: break;
    }
}

/* The panel product: rows [n0, n1) (multiples of 16) of w. */
TQ static void gemm_q_panels(int M, int n0, int n1, const struct cpu_qmat *w, const void *xq,
                             size_t ldxq, float *y, int ldy)
{
    size_t ps = cpu_q_panel_bytes(w->dt, w->cols, w->awq_group);
    int G = w->awq_group;
    int nblk = w->dt == MODEL_Q8_0 || w->dt == MODEL_Q4_1 || w->dt == MODEL_Q5_1 ? w->cols / 64
               : w->dt == MODEL_AWQ4                                              ? w->cols / G
                                                                                  : w->cols / 256;
    int p0 = n0 / 16, p1 = n1 / 16;
    const uint8_t *W = w->w;
    if (M <= 3) { /* decode: four far streams, prefetched */
        for (int p = p0; p < p1; p += 4) {
            int nv = p1 - p < 4 ? p1 - p : 4;
            struct qargs a = {nblk, G, W + (size_t)p * ps, ps, xq, ldxq, y + 16 * p, ldy};
            tile_any(w->dt, M, nv, nv == 4, &a);
        }
        return;
    }
    if (M >= QP_AMX_MIN_M && (w->dt == MODEL_Q8_0 || w->dt == MODEL_Q4_K || w->dt == MODEL_Q6_K) && amx_ready() &&
        (w->dt == MODEL_Q8_0   ? q80_amx(M / 16 * 16, nblk, W, ps, p0, p1, xq, ldxq, y, ldy)
         : w->dt == MODEL_Q4_K ? q4k_amx(M / 16 * 16, nblk, W, ps, p0, p1, xq, ldxq, y, ldy)
                               : q6k_amx(M / 16 * 16, nblk, W, ps, p0, p1, xq, ldxq, y, ldy))) {
        int M16 = M / 16 * 16;
        if (M16 == M)
            return;
        xq = (const uint8_t *)xq + (size_t)M16 * ldxq;
        y += (size_t)M16 * ldy;
        M -= M16;
    }
    int mrmax = w->dt == MODEL_Q4_K || w->dt == MODEL_Q5_K || w->dt == MODEL_Q6_K || w->dt == MODEL_IQ4_XS ||
                        w->dt == MODEL_Q2_K
                    ? 4
                    : 6;
    int nvs = w->dt == MODEL_Q6_K ? 1 : 2; /* Q6_K: the one-panel tiles of q6kd_tile */
    int mc = (int)(QP_MC_BYTES / ldxq);
    mc = mc < mrmax ? mrmax : mc / mrmax * mrmax;
    for (int m0 = 0; m0 < M; m0 += mc) {
        int m1 = m0 + mc < M ? m0 + mc : M;
        for (int p = p0; p < p1; p += nvs) {
            int nv = p1 - p < nvs ? p1 - p : nvs;
            for (int m = m0; m < m1; m += mrmax) {
                int mr = m1 - m < mrmax ? m1 - m : mrmax;
                /* small batches stream the weights from memory once: the
                 * first full row tile of a strip prefetches its lines ahead
                 * (running on into the next strip), the others find them
                 * in L1 / L2 */
                int pf = M <= 24 && m == m0 && mr == mrmax && nv == nvs;
                struct qargs a = {nblk, G, W + (size_t)p * ps, ps, (const uint8_t *)xq + (size_t)m * ldxq,
                                  ldxq, y + (size_t)m * ldy + 16 * p, ldy};
                tile_any(w->dt, mr, nv, pf, &a);
            }
        }
    }
}

void cpu_gemm_q_avx512(int M, int n0, int n1, const struct cpu_qmat *w, const void *xq, size_t ldxq,
                       float *y, int ldy)
{
    if (M <= 0 || n1 <= n0)
        return;
    if (w->layout != CPU_QL_PANELS || n0 % 16 || n1 % 16) {
        cpu_gemm_q_avx2(M, n0, n1, w, xq, ldxq, y, ldy);
        return;
    }
    struct cpu_qmat pw = *w; /* packed as its panel format (cpu_q_panel_dt) */
    pw.dt = cpu_q_panel_dt(w->dt);
    gemm_q_panels(M, n0, n1, &pw, xq, ldxq, y, ldy);
}
#else
void cpu_gemm_q_avx512(int M, int n0, int n1, const struct cpu_qmat *w, const void *xq, size_t ldxq,
                       float *y, int ldy)
{
    cpu_gemm_q_scalar(M, n0, n1, w, xq, ldxq, y, ldy);
}
#endif
