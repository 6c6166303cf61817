/* engine/cpu/qgemm.c - the portable half of the quantized products
 * (qgemm.h): activation quantization, the NATIVE-layout product every
 * table can run, AWQ's conversion to rows, and the packing into the
 * AVX-512 table's panels (whose kernels are in qgemm_avx512.c).
 *
 * The product follows qgemm.h's recipe literally: exact int32 sums over a
 * block's codes, then one or two fmaf() per block on a single f32 chain per
 * output. The integer loops are written so that compilers vectorize them;
 * the same body is compiled twice, plainly (the scalar table) and for
 * AVX2 + FMA through a target attribute (the AVX2 table, and the AVX-512
 * table for matrices it did not pack), which changes no bit: integers are
 * exact and fmaf() is one rounding either way.
 *
 * Panel layouts (CPU_QL_PANELS), per panel of 16 rows, in order along K.
 * "Groups" are 4 consecutive columns; "interleaved" bytes of a group put
 * row r's four codes at bytes 4r..4r+3 of a 64-byte vector. Every part
 * starts on a 64-byte boundary.
 *   Q8_0, per 2 blocks (64 columns, 1088 bytes): f16 scales d[blk][r]
 *     (2 x 16), then per block 8 groups of interleaved codes + 128 (u8).
 *   Q4_K, per super-block (256 columns, 2368 bytes): d[16], dmin[16] f16;
 *     scale pairs sc[i][r] = (sc_i, sc_{i+4}) u8 (i < 4, 128 bytes); min
 *     pairs likewise (128 bytes); 32 vectors of interleaved nibbles,
 *     vector u holding group u in its low nibbles, group u + 32 in its high.
 *   Q5_K (2880 bytes): Q4_K's, then 8 vectors of the fifth bits, vector v
 *     holding group v + 8 i at bit i.
 *   Q6_K, per super-block (3392 bytes): d[16] f16, 32 spare bytes; scale
 *     pairs (sc_i, sc_{i+8}) i8 (i < 8, 256 bytes); 32 vectors of the low
 *     4 bits of q + 32 (group u low, u + 32 high); 16 vectors of the top 2
 *     bits, vector v holding group v + 16 j at bits 2j, 2j+1.
 *   AWQ (G a multiple of 64), per group of G columns (64 + G * 8 bytes): s[16] f16, z[16] u8,
 *     16 spare bytes; G / 8 vectors of nibbles, u holding group u low and
 *     group u + G / 8 high.
 *   Q4_1, Q5_1, per 2 blocks (1152 bytes): Q8_0's, with the offsets m[blk][r]
 *     f16 after the scales and the codes as they are (0..31, no + 128).
 *   IQ4_XS (2368 bytes): Q4_K's, the scale pairs signed (ls - 32), no dmin or
 *     mins, the nibbles the level indexes.
 *   Q2_K, per super-block (1600 bytes): d[16], dmin[16] f16; scale pairs
 *     (sc_i, sc_{i+8}) u8 (i < 8, 256 bytes); min pairs likewise (256 bytes);
 *     16 vectors of 2-bit codes, vector v holding group v + 16 j at bits 2j.
 *   Q4_0, Q5_0, IQ4_NL: Q8_0's, Q3_K: Q6_K's, after widen_row.
 * Any thread; no state. */
#include "cpu/qgemm.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "quant.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define T2 __attribute__((target("avx2,fma,f16c")))
#endif
#define AI __attribute__((always_inline)) inline

/* ---------------------------------------------------------------- formats */

enum cpu_xq cpu_xq_for(enum model_dtype dt)
{
    return quant_block_elems(dt) == QUANT_QK_K ? CPU_XQ_256 : CPU_XQ_32;
}

int cpu_xq_block(enum cpu_xq f) { return f == CPU_XQ_256 ? 256 : 32; }

size_t cpu_xq_row_bytes(enum cpu_xq f, int K)
{
    return f == CPU_XQ_256 ? (size_t)(K / 256) * sizeof(struct cpu_xq256)
                           : (size_t)(K / 32) * sizeof(struct cpu_xq32);
}

int cpu_q_supported(enum model_dtype dt, int rows, int cols, int g)
{
    if (rows <= 0 || cols <= 0)
        return 0;
    if (dt == MODEL_AWQ4)
        return g > 0 && g % 32 == 0 && cols % g == 0 && rows % 8 == 0;
    return quant_is_quantized(dt) && cols % quant_block_elems(dt) == 0;
}

size_t cpu_q_row_bytes(enum model_dtype dt, int cols, int g)
{
    if (dt == MODEL_AWQ4)
        return (size_t)(cols / g) * (size_t)(4 + g / 2);
    return quant_row_bytes(dt, cols);
}

/* ------------------------------------------------- activation quantizing */

/* One block of n: scale, codes; the arithmetic every ISA repeats. */
static AI float xq_block(const float *x, int n, int8_t *q)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    float d = amax / 127.0f;
    d = d >= FLT_MIN ? d : 0.0f; /* 1 / d must be finite */
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < n; i++) {
        float v = nearbyintf(x[i] * id);
        /* NaN to -127, as vcvtps2dq's integer indefinite then clamped */
        v = !(v >= -127.0f) ? -127.0f : v > 127.0f ? 127.0f : v;
        q[i] = (int8_t)v;
    }
    return d;
}

static void xq256_sums(struct cpu_xq256 *b)
{
    int s16[16];
    for (int i = 0; i < 16; i++) {
        s16[i] = 0;
        for (int l = 0; l < 16; l++)
            s16[i] += b->q[16 * i + l];
    }
    for (int i = 0; i < 8; i++) {
        b->s16p[2 * i] = (int16_t)s16[i];
        b->s16p[2 * i + 1] = (int16_t)s16[i + 8];
    }
    for (int i = 0; i < 4; i++) {
        b->s32p[2 * i] = (int16_t)(s16[2 * i] + s16[2 * i + 1]);
        b->s32p[2 * i + 1] = (int16_t)(s16[2 * i + 8] + s16[2 * i + 9]);
    }
}

#if defined(__x86_64__)
/* The same block with 8-lane vectors: max of |x| (exact in any order),
 * then the same IEEE division, reciprocal and product, rounded by
 * vcvtps2dq in the default nearest-even mode: the scalar bits. */
T2 static float xq_block_avx2(const float *x, int n, int8_t *q)
{
    __m256 mx = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < n; i += 8)
        mx = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), mx); /* NaN: keeps mx */
    float t[8];
    _mm256_storeu_ps(t, mx);
    float amax = 0.0f;
    for (int i = 0; i < 8; i++)
        amax = t[i] > amax ? t[i] : amax;
    float d = amax / 127.0f;
    d = d >= FLT_MIN ? d : 0.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    __m256 vid = _mm256_set1_ps(id);
    __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    for (int i = 0; i < n; i += 8) {
        __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vid));
        v = _mm256_max_epi32(lo, _mm256_min_epi32(hi, v));
        __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storel_epi64((void *)(q + i), _mm_packs_epi16(w, w));
    }
    return d;
}

/* libgcc's CPU model, filled once by a constructor: a load per call */
static int use_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif

void cpu_xq_quantize(enum cpu_xq f, const float *x, int K, void *out)
{
    int bs = cpu_xq_block(f);
    for (int b = 0; b < K / bs; b++) {
        int8_t *q;
        float *dp;
        if (f == CPU_XQ_256) {
            struct cpu_xq256 *o = (struct cpu_xq256 *)out + b;
            q = o->q, dp = &o->d;
            memset(o->pad, 0, sizeof o->pad);
        } else {
            struct cpu_xq32 *o = (struct cpu_xq32 *)out + b;
            q = o->q, dp = &o->d;
        }
#if defined(__x86_64__)
        if (use_avx2())
            *dp = xq_block_avx2(x + (size_t)b * bs, bs, q);
        else
#endif
            *dp = xq_block(x + (size_t)b * bs, bs, q);
        if (f == CPU_XQ_256) {
            xq256_sums((struct cpu_xq256 *)out + b);
        } else {
            int s = 0;
            for (int i = 0; i < 32; i++)
                s += q[i];
            ((struct cpu_xq32 *)out + b)->s = s;
        }
    }
}

/* ------------------------------------------------------- NATIVE products */

static AI int dot32(const int8_t *a, const int8_t *b)
{
    int s = 0;
    for (int i = 0; i < 32; i++)
        s += a[i] * b[i];
    return s;
}

static AI float row_q8_0(const struct quant_block_q8_0 *w, const struct cpu_xq32 *x, int nb)
{
    float acc = 0.0f;
    for (int b = 0; b < nb; b++)
        acc = fmaf((float)dot32(w[b].qs, x[b].q), f16_to_f32(w[b].d) * x[b].d, acc);
    return acc;
}

/* Q4_K / Q5_K: q of sub-block j (32 columns) into q8, then the sums. */
static AI float row_q45_k(const void *wv, int q5, const struct cpu_xq256 *x, int nb)
{
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *scales, *qs, *qh = NULL;
        uint16_t d16, dm16;
        if (q5) {
            const struct quant_block_q5_k *w = (const struct quant_block_q5_k *)wv + b;
            scales = w->scales, qs = w->qs, qh = w->qh, d16 = w->d, dm16 = w->dmin;
        } else {
            const struct quant_block_q4_k *w = (const struct quant_block_q4_k *)wv + b;
            scales = w->scales, qs = w->qs, d16 = w->d, dm16 = w->dmin;
        }
        int32_t I = 0, J = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_k_scale_min(scales, j, &sc, &m);
            const uint8_t *p = qs + 32 * (j / 2);
            int8_t q8[32];
            for (int l = 0; l < 32; l++) {
                int v = j % 2 ? p[l] >> 4 : p[l] & 0xF;
                if (q5)
                    v += (qh[l] >> j) & 1 ? 16 : 0;
                q8[l] = (int8_t)v;
            }
            int xs = 0;
            for (int l = 0; l < 32; l++)
                xs += x[b].q[32 * j + l];
            I += sc * dot32(q8, x[b].q + 32 * j);
            J += m * xs;
        }
        float dx = x[b].d;
        acc = fmaf((float)I, f16_to_f32(d16) * dx, acc);
        acc = fmaf((float)-J, f16_to_f32(dm16) * dx, acc);
    }
    return acc;
}

static AI float row_q6_k(const struct quant_block_q6_k *w, const struct cpu_xq256 *x, int nb)
{
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        int8_t q[256];
        const uint8_t *ql = w[b].ql, *qh = w[b].qh;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                int8_t *o = q + 128 * h + l;
                o[0] = (int8_t)(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
                o[32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                o[64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                o[96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        int32_t I = 0;
        for (int s = 0; s < 16; s++) {
            int t = 0;
            for (int l = 0; l < 16; l++)
                t += q[16 * s + l] * x[b].q[16 * s + l];
            I += w[b].scales[s] * t;
        }
        acc = fmaf((float)I, f16_to_f32(w[b].d) * x[b].d, acc);
    }
    return acc;
}

/* The codes of one block of a 32-element format as int8 (Q4_0, Q5_0:
 * q - 8, q - 16; Q4_1, Q5_1: q; IQ4_NL: the level), its scale d and, for
 * Q4_1 / Q5_1, its offset m. dt is a constant where this is inlined, so
 * each format's loop is its own. */
static AI void codes32(enum model_dtype dt, const uint8_t *blk, int8_t q8[32], uint16_t *d, uint16_t *m)
{
    const uint8_t *qs = blk + (dt == MODEL_Q4_1 ? 4 : dt == MODEL_Q5_0 ? 6 : dt == MODEL_Q5_1 ? 8 : 2);
    memcpy(d, blk, 2);
    if (dt == MODEL_Q4_1 || dt == MODEL_Q5_1)
        memcpy(m, blk + 2, 2);
    uint32_t h = 0;
    if (dt == MODEL_Q5_0 || dt == MODEL_Q5_1) {
        const uint8_t *qh = blk + (dt == MODEL_Q5_0 ? 2 : 4);
        h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    }
    for (int l = 0; l < 16; l++) {
        int lo = qs[l] & 0xF, hi = qs[l] >> 4;
        if (dt == MODEL_IQ4_NL) {
            q8[l] = QUANT_IQ4_VALUES[lo];
            q8[l + 16] = QUANT_IQ4_VALUES[hi];
            continue;
        }
        if (dt == MODEL_Q5_0 || dt == MODEL_Q5_1) {
            lo |= (int)((h >> l) & 1) << 4;
            hi |= (int)((h >> (l + 16)) & 1) << 4;
        }
        int z = dt == MODEL_Q4_0 ? 8 : dt == MODEL_Q5_0 ? 16 : 0;
        q8[l] = (int8_t)(lo - z);
        q8[l + 16] = (int8_t)(hi - z);
    }
}

static AI int dot16(const int8_t *a, const int8_t *b)
{
    int s = 0;
    for (int i = 0; i < 16; i++)
        s += a[i] * b[i];
    return s;
}

/* A super-block of Q2_K, Q3_K or IQ4_XS decoded: codes as int8 in element
 * order, the integer sub-block scales (Q2_K, Q3_K: 16 of 16 elements;
 * IQ4_XS: 8 of 32) and Q2_K's mins, d and dmin. */
struct kblk {
    int8_t q[256];
    int sc[16], mn[16];
    float d, dmin;
};

static AI void decode_k(enum model_dtype dt, const uint8_t *blk, struct kblk *o)
{
    if (dt == MODEL_IQ4_XS) {
        const struct quant_block_iq4_xs *w = (const void *)blk;
        o->d = f16_to_f32(w->d);
        for (int j = 0; j < 8; j++) {
            o->sc[j] = quant_iq4_xs_scale(w, j) - 32;
            for (int l = 0; l < 16; l++) {
                o->q[32 * j + l] = QUANT_IQ4_VALUES[w->qs[16 * j + l] & 0xF];
                o->q[32 * j + l + 16] = QUANT_IQ4_VALUES[w->qs[16 * j + l] >> 4];
            }
        }
        return;
    }
    if (dt == MODEL_Q2_K) {
        const struct quant_block_q2_k *w = (const void *)blk;
        o->d = f16_to_f32(w->d), o->dmin = f16_to_f32(w->dmin);
        for (int s = 0; s < 16; s++)
            o->sc[s] = w->scales[s] & 0xF, o->mn[s] = w->scales[s] >> 4;
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 32; l++)
                    o->q[128 * h + 32 * k + l] = (int8_t)((w->qs[32 * h + l] >> (2 * k)) & 3);
        return;
    }
    const struct quant_block_q3_k *w = (const void *)blk;
    o->d = f16_to_f32(w->d);
    for (int s = 0; s < 16; s++)
        o->sc[s] = quant_q3_k_scale(w->scales, s) - 32;
    for (int e = 0; e < 256; e++)
        o->q[e] = (int8_t)quant_q3_k_code(w, e);
}

/* Block b's term of one output row x (qgemm.h's recipe for the format). */
static AI float term_k(enum model_dtype dt, const struct kblk *k, const struct cpu_xq256 *x, float acc)
{
    int32_t I = 0, J = 0;
    if (dt == MODEL_IQ4_XS) {
        for (int j = 0; j < 8; j++)
            I += k->sc[j] * dot32(k->q + 32 * j, x->q + 32 * j);
    } else {
        for (int s = 0; s < 16; s++)
            I += k->sc[s] * dot16(k->q + 16 * s, x->q + 16 * s);
    }
    acc = fmaf((float)I, k->d * x->d, acc);
    if (dt == MODEL_Q2_K) {
        for (int s = 0; s < 16; s++) /* the sums over 16, as xq256_sums pairs them */
            J += k->mn[s] * x->s16p[s < 8 ? 2 * s : 2 * (s - 8) + 1];
        acc = fmaf((float)-J, k->dmin * x->d, acc);
    }
    return acc;
}

#define QB_ROWS 32 /* activation rows one decoded block serves at a time */

/* NATIVE rows of the eight GGUF formats after the first four (the scalar
 * table's product; the AVX2 one's is below, which the AVX-512 table uses
 * for matrices it did not pack): each weight block is decoded once for up to QB_ROWS
 * activation rows, not once per row, so a prefill pays the unpacking
 * (nibbles, the IQ4 table, Q3_K's scattered bits) once per block. Each
 * output's chain is the same fmaf steps in the same block order as a row
 * alone. */
static AI void gemm_q_blocks(enum model_dtype dt, int M, int n0, int n1, const struct cpu_qmat *w,
                             const void *xq, size_t ldxq, float *y, int ldy)
{
    size_t rb = cpu_q_row_bytes(dt, w->cols, 0), bb = quant_block_bytes(dt);
    int q32 = quant_block_elems(dt) == 32, nb = w->cols / quant_block_elems(dt);
    int offset = dt == MODEL_Q4_1 || dt == MODEL_Q5_1;
    for (int m0 = 0; m0 < M; m0 += QB_ROWS) {
        int mc = M - m0 < QB_ROWS ? M - m0 : QB_ROWS;
        const char *x0 = (const char *)xq + (size_t)m0 * ldxq;
        for (int n = n0; n < n1; n++) {
            const uint8_t *wr = (const uint8_t *)w->w + (size_t)n * rb;
            float acc[QB_ROWS];
            for (int m = 0; m < mc; m++)
                acc[m] = 0.0f;
            for (int b = 0; b < nb; b++) {
                if (q32) {
                    int8_t q8[32];
                    uint16_t d16, m16 = 0;
                    codes32(dt, wr + (size_t)b * bb, q8, &d16, &m16);
                    float d = f16_to_f32(d16), mf = f16_to_f32(m16);
                    for (int m = 0; m < mc; m++) {
                        const struct cpu_xq32 *x = (const struct cpu_xq32 *)(x0 + (size_t)m * ldxq) + b;
                        acc[m] = fmaf((float)dot32(q8, x->q), d * x->d, acc[m]);
                        if (offset)
                            acc[m] = fmaf((float)x->s, mf * x->d, acc[m]);
                    }
                } else {
                    struct kblk k;
                    decode_k(dt, wr + (size_t)b * bb, &k);
                    for (int m = 0; m < mc; m++)
                        acc[m] = term_k(dt, &k, (const struct cpu_xq256 *)(x0 + (size_t)m * ldxq) + b, acc[m]);
                }
            }
            for (int m = 0; m < mc; m++)
                y[(size_t)(m0 + m) * (size_t)ldy + (size_t)n] = acc[m];
        }
    }
}

/* AWQ rows (cpu_q_awq_convert): one fmaf per activation block of 32. */
static AI float row_awq(const uint8_t *w, int G, const struct cpu_xq32 *x, int nb)
{
    float acc = 0.0f;
    size_t gb = (size_t)(4 + G / 2);
    for (int b = 0; b < nb; b++) {
        const uint8_t *g = w + (size_t)(b * 32 / G) * gb;
        uint16_t s16;
        memcpy(&s16, g, 2);
        int z = g[2];
        const uint8_t *p = g + 4 + (b * 32 % G) / 2;
        int8_t q8[32];
        for (int l = 0; l < 16; l++) {
            q8[2 * l] = (int8_t)((p[l] & 0xF) - z);
            q8[2 * l + 1] = (int8_t)((p[l] >> 4) - z);
        }
        acc = fmaf((float)dot32(q8, x[b].q), f16_to_f32(s16) * x[b].d, acc);
    }
    return acc;
}

static AI void gemm_q_body(int M, int n0, int n1, const struct cpu_qmat *w, const void *xq,
                           size_t ldxq, float *y, int ldy)
{
    switch (w->dt) { /* dt a constant in each call: one loop per format */
    case MODEL_Q4_0: gemm_q_blocks(MODEL_Q4_0, M, n0, n1, w, xq, ldxq, y, ldy); return;
    case MODEL_Q4_1: gemm_q_blocks(MODEL_Q4_1, M, n0, n1, w, xq, ldxq, y, ldy); return;
    case MODEL_Q5_0: gemm_q_blocks(MODEL_Q5_0, M, n0, n1, w, xq, ldxq, y, ldy); return;
    case MODEL_Q5_1: gemm_q_blocks(MODEL_Q5_1, M, n0, n1, w, xq, ldxq, y, ldy); return;
    case MODEL_IQ4_NL: gemm_q_blocks(MODEL_IQ4_NL, M, n0, n1, w, xq, ldxq, y, ldy); return;
    case MODEL_Q2_K: gemm_q_blocks(MODEL_Q2_K, M, n0, n1, w, xq, ldxq, y, ldy); return;
    case MODEL_Q3_K: gemm_q_blocks(MODEL_Q3_K, M, n0, n1, w, xq, ldxq, y, ldy); return;
    case MODEL_IQ4_XS: gemm_q_blocks(MODEL_IQ4_XS, M, n0, n1, w, xq, ldxq, y, ldy); return;
    default: break;
    }
    size_t rb = cpu_q_row_bytes(w->dt, w->cols, w->awq_group);
    for (int m = 0; m < M; m++) {
        const void *x = (const char *)xq + (size_t)m * ldxq;
        float *yr = y + (size_t)m * (size_t)ldy;
        for (int n = n0; n < n1; n++) {
            const void *wr = (const char *)w->w + (size_t)n * rb;
            switch (w->dt) {
            case MODEL_Q8_0: yr[n] = row_q8_0(wr, x, w->cols / 32); break;
            case MODEL_Q4_K: yr[n] = row_q45_k(wr, 0, x, w->cols / 256); break;
            case MODEL_Q5_K: yr[n] = row_q45_k(wr, 1, x, w->cols / 256); break;
            case MODEL_Q6_K: yr[n] = row_q6_k(wr, x, w->cols / 256); break;
            case MODEL_AWQ4: yr[n] = row_awq(wr, w->awq_group, x, w->cols / 32); break;
            default: yr[n] = 0.0f; break;
            }
        }
    }
}

void cpu_gemm_q_scalar(int M, int n0, int n1, const struct cpu_qmat *w, const void *xq, size_t ldxq,
                       float *y, int ldy)
{
    gemm_q_body(M, n0, n1, w, xq, ldxq, y, ldy);
}

#if defined(__x86_64__)
/* ---- gemm_q_blocks with AVX2 ----
 *
 * The same recipe and so the same bits: each block's codes are decoded
 * once into int8 vectors in element order (nibbles split, the IQ4 levels
 * by vpshufb, Q5's fifth bits and Q3_K's high bits as byte masks), then
 * per activation row the exact int32 sums come from vpmaddubsw (|w| times
 * x with w's sign: no pair saturates, 2 x 127 x 127 < 32768) and vpmaddwd
 * (by 1, or by the sub-block scales), and the format's fmaf steps follow
 * in block order. */

T2 static inline int hsum8(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* int16 pair sums of w . x; signed: w's codes may be negative */
T2 static inline __m256i pairs(__m256i w, __m256i x, int sgn)
{
    if (sgn)
        return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_maddubs_epi16(w, x);
}

/* 16 bytes of nibbles as 32 codes: the low nibbles, then the high */
T2 static inline __m256i nibbles(const uint8_t *qs)
{
    __m128i b = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0xF);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

T2 static inline __m256i iq4_levels(__m256i q)
{
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)QUANT_IQ4_VALUES));
    return _mm256_shuffle_epi8(t, q);
}

/* A 32-element block's codes as codes32 gives them */
T2 static inline __m256i codes32_avx2(enum model_dtype dt, const uint8_t *blk)
{
    __m256i q = nibbles(blk + (dt == MODEL_Q4_1 ? 4 : dt == MODEL_Q5_0 ? 6 : dt == MODEL_Q5_1 ? 8 : 2));
    if (dt == MODEL_IQ4_NL)
        return iq4_levels(q);
    if (dt == MODEL_Q5_0 || dt == MODEL_Q5_1) { /* byte e gets bit e of qh */
        uint32_t h;
        memcpy(&h, blk + (dt == MODEL_Q5_0 ? 2 : 4), 4);
        __m256i hv = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h),
                                         _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                           0x0101010101010101, 0));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        hv = _mm256_cmpeq_epi8(_mm256_and_si256(hv, bit), bit);
        q = _mm256_or_si256(q, _mm256_and_si256(hv, _mm256_set1_epi8(0x10)));
    }
    if (dt == MODEL_Q4_0 || dt == MODEL_Q5_0)
        q = _mm256_sub_epi8(q, _mm256_set1_epi8(dt == MODEL_Q4_0 ? 8 : 16));
    return q;
}

/* A super-block's 8 vectors of 32 codes (element order) and, per vector,
 * the int16 scales of its pair sums: Q2_K / Q3_K sub-blocks of 16 (low
 * half, high half), IQ4_XS one of 32. */
T2 static inline void decode_k_avx2(enum model_dtype dt, const uint8_t *blk, __m256i q[8], __m256i sv[8],
                                    __m256i *mins, struct kblk *k)
{
    if (dt == MODEL_IQ4_XS) {
        const struct quant_block_iq4_xs *w = (const void *)blk;
        k->d = f16_to_f32(w->d);
        for (int j = 0; j < 8; j++) {
            q[j] = iq4_levels(nibbles(w->qs + 16 * j));
            sv[j] = _mm256_set1_epi16((short)(quant_iq4_xs_scale(w, j) - 32));
        }
        return;
    }
    const uint8_t *qs = blk + (dt == MODEL_Q2_K ? 16 : 32);
    int sc[16];
    if (dt == MODEL_Q2_K) {
        const struct quant_block_q2_k *w = (const void *)blk;
        k->d = f16_to_f32(w->d), k->dmin = f16_to_f32(w->dmin);
        for (int s = 0; s < 16; s++)
            sc[s] = w->scales[s] & 0xF;
        /* the mins as int16 in the order of the activation's s16p pairs
         * (sub-blocks 0, 8, 1, 9, ...): J is one vpmaddwd a row */
        __m128i m = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)w->scales), 4),
                                  _mm_set1_epi8(0xF));
        m = _mm_shuffle_epi8(m, _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15));
        *mins = _mm256_cvtepu8_epi16(m);
    } else {
        const struct quant_block_q3_k *w = (const void *)blk;
        k->d = f16_to_f32(w->d);
        for (int s = 0; s < 16; s++)
            sc[s] = quant_q3_k_scale(w->scales, s) - 32;
    }
    const __m256i three = _mm256_set1_epi8(3);
    __m256i hm = _mm256_loadu_si256((const __m256i *)blk); /* Q3_K's hmask */
    for (int v = 0; v < 8; v++) { /* elements 32 v ..: qs[32 (v / 4) ..] >> 2 (v % 4) */
        __m256i b = _mm256_loadu_si256((const __m256i *)(qs + 32 * (v / 4)));
        __m256i c = _mm256_and_si256(_mm256_srli_epi16(b, 2 * (v % 4)), three);
        if (dt == MODEL_Q3_K) { /* less 4 where bit v of hmask[l] is clear */
            __m256i bit = _mm256_set1_epi8((char)(1 << v));
            __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
            c = _mm256_sub_epi8(c, _mm256_and_si256(clear, _mm256_set1_epi8(4)));
        }
        q[v] = c;
        sv[v] = _mm256_set_m128i(_mm_set1_epi16((short)sc[2 * v + 1]), _mm_set1_epi16((short)sc[2 * v]));
    }
}

T2 static void gemm_q_blocks_avx2(enum model_dtype dt, int M, int n0, int n1, const struct cpu_qmat *w,
                                  const void *xq, size_t ldxq, float *y, int ldy)
{
    size_t rb = cpu_q_row_bytes(dt, w->cols, 0), bb = quant_block_bytes(dt);
    int q32 = quant_block_elems(dt) == 32, nb = w->cols / quant_block_elems(dt);
    int offset = dt == MODEL_Q4_1 || dt == MODEL_Q5_1;
    int sgn = !(offset || dt == MODEL_Q2_K);
    const __m256i one = _mm256_set1_epi16(1);
    for (int m0 = 0; m0 < M; m0 += QB_ROWS) {
        int mc = M - m0 < QB_ROWS ? M - m0 : QB_ROWS;
        const char *x0 = (const char *)xq + (size_t)m0 * ldxq;
        for (int n = n0; n < n1; n++) {
            const uint8_t *wr = (const uint8_t *)w->w + (size_t)n * rb;
            float acc[QB_ROWS];
            for (int m = 0; m < mc; m++)
                acc[m] = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = wr + (size_t)b * bb;
                if (q32) {
                    __m256i q = codes32_avx2(dt, blk);
                    uint16_t d16, m16 = 0;
                    memcpy(&d16, blk, 2);
                    if (offset)
                        memcpy(&m16, blk + 2, 2);
                    float d = f16_to_f32(d16), mf = f16_to_f32(m16);
                    for (int m = 0; m < mc; m++) {
                        const struct cpu_xq32 *x = (const struct cpu_xq32 *)(x0 + (size_t)m * ldxq) + b;
                        __m256i xv = _mm256_loadu_si256((const __m256i *)x->q);
                        int I = hsum8(_mm256_madd_epi16(pairs(q, xv, sgn), one));
                        acc[m] = fmaf((float)I, d * x->d, acc[m]);
                        if (offset)
                            acc[m] = fmaf((float)x->s, mf * x->d, acc[m]);
                    }
                } else {
                    __m256i q[8], sv[8], mins = _mm256_setzero_si256();
                    struct kblk k;
                    decode_k_avx2(dt, blk, q, sv, &mins, &k);
                    for (int m = 0; m < mc; m++) {
                        const struct cpu_xq256 *x = (const struct cpu_xq256 *)(x0 + (size_t)m * ldxq) + b;
                        __m256i s = _mm256_setzero_si256();
                        for (int v = 0; v < 8; v++)
                            s = _mm256_add_epi32(s, _mm256_madd_epi16(
                                                        pairs(q[v], _mm256_loadu_si256((const __m256i *)(x->q + 32 * v)), sgn),
                                                        sv[v]));
                        acc[m] = fmaf((float)hsum8(s), k.d * x->d, acc[m]);
                        if (dt == MODEL_Q2_K) {
                            int J = hsum8(_mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)x->s16p)));
                            acc[m] = fmaf((float)-J, k.dmin * x->d, acc[m]);
                        }
                    }
                }
            }
            for (int m = 0; m < mc; m++)
                y[(size_t)(m0 + m) * (size_t)ldy + (size_t)n] = acc[m];
        }
    }
}

T2 void cpu_gemm_q_avx2(int M, int n0, int n1, const struct cpu_qmat *w, const void *xq, size_t ldxq,
                        float *y, int ldy)
{
    switch (w->dt) {
    case MODEL_Q4_0:
    case MODEL_Q4_1:
    case MODEL_Q5_0:
    case MODEL_Q5_1:
    case MODEL_IQ4_NL:
    case MODEL_Q2_K:
    case MODEL_Q3_K:
    case MODEL_IQ4_XS: gemm_q_blocks_avx2(w->dt, M, n0, n1, w, xq, ldxq, y, ldy); return;
    default: gemm_q_body(M, n0, n1, w, xq, ldxq, y, ldy); return;
    }
}
#else
void cpu_gemm_q_avx2(int M, int n0, int n1, const struct cpu_qmat *w, const void *xq, size_t ldxq,
                     float *y, int ldy)
{
    gemm_q_body(M, n0, n1, w, xq, ldxq, y, ldy);
}
#endif

/* ------------------------------------------------------------------- AWQ */

void cpu_q_awq_convert(const struct model_tensor *t, void *out)
{
    int rows = (int)t->rows, cols = (int)t->cols, G = t->awq_group;
    size_t rb = cpu_q_row_bytes(MODEL_AWQ4, cols, G), ld = (size_t)rows / 8;
    const int32_t *qw = t->data;
    for (int r = 0; r < rows; r++) {
        uint8_t *o = (uint8_t *)out + (size_t)r * rb;
        int sh = 4 * QUANT_AWQ_NIBBLE[r % 8];
        for (int g = 0; g < cols / G; g++, o += 4 + G / 2) {
            memcpy(o, &t->awq_scales[(size_t)g * (size_t)rows + (size_t)r], 2);
            o[2] = (uint8_t)(((uint32_t)t->awq_qzeros[(size_t)g * ld + (size_t)r / 8] >> sh) & 0xF);
            o[3] = 0;
            for (int i = 0; i < G / 2; i++) {
                size_t c = (size_t)g * (size_t)G + 2 * (size_t)i;
                uint32_t a = ((uint32_t)qw[c * ld + (size_t)r / 8] >> sh) & 0xF;
                uint32_t b = ((uint32_t)qw[(c + 1) * ld + (size_t)r / 8] >> sh) & 0xF;
                o[4 + i] = (uint8_t)(a | b << 4);
            }
        }
    }
}

/* ---------------------------------------------------------------- panels */

enum model_dtype cpu_q_panel_dt(enum model_dtype dt)
{
    switch (dt) {
    case MODEL_Q4_0:
    case MODEL_Q5_0:
    case MODEL_IQ4_NL: return MODEL_Q8_0;
    case MODEL_Q3_K: return MODEL_Q6_K;
    default: return dt;
    }
}

/* One NATIVE row of a format packed as another (cpu_q_panel_dt) in that
 * format's blocks: Q4_0 / Q5_0 / IQ4_NL's codes (q - 8, q - 16, the level)
 * as Q8_0's with the same d; Q3_K's codes (-4..3) and scales (-32..31) as
 * Q6_K's with the same d. Exact, and the two recipes (qgemm.h) then sum
 * the same integers with the same scales: the same bits. */
static void widen_row(enum model_dtype dt, const uint8_t *src, uint8_t *dst, int cols)
{
    if (dt == MODEL_Q3_K) {
        const struct quant_block_q3_k *x = (const void *)src;
        struct quant_block_q6_k *y = (void *)dst;
        for (int b = 0; b < cols / 256; b++) {
            memset(&y[b], 0, sizeof y[b]);
            y[b].d = x[b].d;
            for (int s = 0; s < 16; s++)
                y[b].scales[s] = (int8_t)(quant_q3_k_scale(x[b].scales, s) - 32);
            for (int e = 0; e < 256; e++)
                quant_q6_k_put(&y[b], e, quant_q3_k_code(&x[b], e));
        }
        return;
    }
    size_t bb = quant_block_bytes(dt);
    struct quant_block_q8_0 *y = (void *)dst;
    for (int b = 0; b < cols / 32; b++) {
        uint16_t m;
        switch (dt) {
        case MODEL_Q4_0: codes32(MODEL_Q4_0, src + (size_t)b * bb, y[b].qs, &y[b].d, &m); break;
        case MODEL_Q5_0: codes32(MODEL_Q5_0, src + (size_t)b * bb, y[b].qs, &y[b].d, &m); break;
        default: codes32(MODEL_IQ4_NL, src + (size_t)b * bb, y[b].qs, &y[b].d, &m); break;
        }
    }
}

int cpu_q_can_pack(enum model_dtype dt, int rows, int cols, int g)
{
    if (!cpu_q_supported(dt, rows, cols, g) || rows % 16)
        return 0;
    if (cpu_q_panel_dt(dt) != dt)
        return cpu_q_can_pack(cpu_q_panel_dt(dt), rows, cols, 0);
    switch (dt) {
    case MODEL_Q8_0:
    case MODEL_Q4_1:
    case MODEL_Q5_1: return cols % 64 == 0;
    case MODEL_Q4_K:
    case MODEL_Q5_K:
    case MODEL_Q6_K:
    case MODEL_IQ4_XS:
    case MODEL_Q2_K: return 1; /* cols % 256 already */
    case MODEL_AWQ4: return g % 64 == 0; /* an activation block in one nibble half */
    default: return 0;
    }
}

#define P80_BYTES 1088 /* 2 blocks */
#define P8M_BYTES 1152 /* 2 blocks of Q4_1 / Q5_1 */
#define P2K_BYTES 1600
#define P4K_BYTES 2368
#define P5K_BYTES 2880
#define P6K_BYTES 3392

size_t cpu_q_panel_bytes(enum model_dtype dt, int cols, int g)
{
    switch (cpu_q_panel_dt(dt)) {
    case MODEL_Q8_0: return (size_t)(cols / 64) * P80_BYTES;
    case MODEL_Q4_1:
    case MODEL_Q5_1: return (size_t)(cols / 64) * P8M_BYTES;
    case MODEL_Q4_K:
    case MODEL_IQ4_XS: return (size_t)(cols / 256) * P4K_BYTES;
    case MODEL_Q5_K: return (size_t)(cols / 256) * P5K_BYTES;
    case MODEL_Q6_K: return (size_t)(cols / 256) * P6K_BYTES;
    case MODEL_Q2_K: return (size_t)(cols / 256) * P2K_BYTES;
    case MODEL_AWQ4: return (size_t)(cols / g) * (size_t)(64 + g * 8);
    default: return 0;
    }
}

/* The unsigned codes of a K-quant super-block row (Q4_K, Q5_K: q; Q6_K:
 * q + 32) in column order. */
static void k_codes(enum model_dtype dt, const void *blk, uint8_t q[256])
{
    if (dt == MODEL_IQ4_XS) { /* the level indexes */
        const uint8_t *qs = ((const struct quant_block_iq4_xs *)blk)->qs;
        for (int c = 0; c < 256; c++) {
            int j = c / 32, l = c % 32;
            q[c] = (uint8_t)(l < 16 ? qs[16 * j + l] & 0xF : qs[16 * j + l - 16] >> 4);
        }
        return;
    }
    if (dt == MODEL_Q4_K || dt == MODEL_Q5_K) {
        const uint8_t *qs = dt == MODEL_Q4_K ? ((const struct quant_block_q4_k *)blk)->qs
                                             : ((const struct quant_block_q5_k *)blk)->qs;
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 32; l++) {
                int v = j % 2 ? qs[32 * (j / 2) + l] >> 4 : qs[32 * (j / 2) + l] & 0xF;
                if (dt == MODEL_Q5_K)
                    v |= ((((const struct quant_block_q5_k *)blk)->qh[l] >> j) & 1) << 4;
                q[32 * j + l] = (uint8_t)v;
            }
    } else {
        const struct quant_block_q6_k *w = blk;
        const uint8_t *ql = w->ql, *qh = w->qh;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                uint8_t *o = q + 128 * h + l;
                o[0] = (uint8_t)((ql[l] & 0xF) | ((qh[l] & 3) << 4));
                o[32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
                o[64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                o[96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
            }
    }
}

/* Byte of element (row r, column c) among interleaved nibble vectors of a
 * run of `span` groups (vector u = group u low, u + span/2 high... see the
 * layout): returns the byte index, *hi the nibble. */
static size_t nib_at(int r, int c, int half, int *hi)
{
    int grp = c / 4, t = c % 4;
    *hi = grp >= half;
    int u = *hi ? grp - half : grp;
    return (size_t)u * 64 + (size_t)r * 4 + (size_t)t;
}

void cpu_q_pack(enum model_dtype dt, int rows, int cols, int G, const void *src, void *out)
{
    enum model_dtype pd = cpu_q_panel_dt(dt);
    if (pd != dt) { /* widened a panel's 16 rows at a time, then packed as pd */
        size_t rb = cpu_q_row_bytes(dt, cols, 0), wb = cpu_q_row_bytes(pd, cols, 0);
        size_t pb = cpu_q_panel_bytes(pd, cols, 0);
        uint8_t *wide = malloc(16 * wb);
        if (!wide) { /* cannot happen for real shapes (16 rows); keep the bytes defined */
            memset(out, 0, pb * (size_t)(rows / 16));
            return;
        }
        for (int p = 0; p < rows / 16; p++) {
            for (int r = 0; r < 16; r++)
                widen_row(dt, (const uint8_t *)src + (size_t)(16 * p + r) * rb, wide + (size_t)r * wb, cols);
            cpu_q_pack(pd, 16, cols, 0, wide, (uint8_t *)out + (size_t)p * pb);
        }
        free(wide);
        return;
    }
    size_t rb = cpu_q_row_bytes(dt, cols, G), pb = cpu_q_panel_bytes(dt, cols, G);
    memset(out, 0, pb * (size_t)(rows / 16));
    for (int p = 0; p < rows / 16; p++) {
        uint8_t *P = (uint8_t *)out + (size_t)p * pb;
        for (int r = 0; r < 16; r++) {
            const uint8_t *row = (const uint8_t *)src + (size_t)(16 * p + r) * rb;
            if (dt == MODEL_Q8_0) {
                const struct quant_block_q8_0 *w = (const void *)row;
                for (int b = 0; b < cols / 32; b++) {
                    uint8_t *B = P + (size_t)(b / 2) * P80_BYTES;
                    memcpy(B + 32 * (b % 2) + 2 * r, &w[b].d, 2);
                    uint8_t *Q = B + 64 + 512 * (b % 2);
                    for (int c = 0; c < 32; c++)
                        Q[(c / 4) * 64 + r * 4 + c % 4] = (uint8_t)(w[b].qs[c] + 128);
                }
            } else if (dt == MODEL_Q2_K) {
                const struct quant_block_q2_k *w = (const void *)row;
                for (int b = 0; b < cols / 256; b++) {
                    uint8_t *B = P + (size_t)b * P2K_BYTES;
                    memcpy(B + 2 * r, &w[b].d, 2);
                    memcpy(B + 32 + 2 * r, &w[b].dmin, 2);
                    for (int i = 0; i < 8; i++) {
                        B[64 + 32 * i + 2 * r] = w[b].scales[i] & 0xF;
                        B[64 + 32 * i + 2 * r + 1] = w[b].scales[i + 8] & 0xF;
                        B[320 + 32 * i + 2 * r] = w[b].scales[i] >> 4;
                        B[320 + 32 * i + 2 * r + 1] = w[b].scales[i + 8] >> 4;
                    }
                    for (int c = 0; c < 256; c++) { /* group g: vector g % 16, bits 2 (g / 16) */
                        int h = c / 128, k = (c % 128) / 32, l = c % 32, grp = c / 4;
                        int q = (w[b].qs[32 * h + l] >> (2 * k)) & 3;
                        B[576 + (size_t)(grp % 16) * 64 + (size_t)r * 4 + (size_t)(c % 4)] |=
                            (uint8_t)(q << (2 * (grp / 16)));
                    }
                }
            } else if (dt == MODEL_Q4_1 || dt == MODEL_Q5_1) {
                size_t bb = quant_block_bytes(dt);
                for (int b = 0; b < cols / 32; b++) {
                    const uint8_t *blk = row + (size_t)b * bb;
                    int8_t q8[32];
                    uint16_t d16, m16;
                    if (dt == MODEL_Q4_1)
                        codes32(MODEL_Q4_1, blk, q8, &d16, &m16);
                    else
                        codes32(MODEL_Q5_1, blk, q8, &d16, &m16);
                    uint8_t *B = P + (size_t)(b / 2) * P8M_BYTES;
                    memcpy(B + 32 * (b % 2) + 2 * r, &d16, 2);
                    memcpy(B + 64 + 32 * (b % 2) + 2 * r, &m16, 2);
                    uint8_t *Q = B + 128 + 512 * (b % 2);
                    for (int c = 0; c < 32; c++)
                        Q[(c / 4) * 64 + r * 4 + c % 4] = (uint8_t)q8[c];
                }
            } else if (dt == MODEL_Q4_K || dt == MODEL_Q5_K || dt == MODEL_Q6_K || dt == MODEL_IQ4_XS) {
                size_t bb = quant_block_bytes(dt);
                for (int b = 0; b < cols / 256; b++) {
                    const void *blk = row + (size_t)b * bb;
                    uint8_t q[256];
                    k_codes(dt, blk, q);
                    if (dt == MODEL_IQ4_XS) { /* Q4_K's panel, signed scales, no mins */
                        const struct quant_block_iq4_xs *w = blk;
                        uint8_t *B = P + (size_t)b * P4K_BYTES;
                        memcpy(B + 2 * r, &w->d, 2);
                        for (int i = 0; i < 4; i++) {
                            B[64 + 32 * i + 2 * r] = (uint8_t)(int8_t)(quant_iq4_xs_scale(w, i) - 32);
                            B[64 + 32 * i + 2 * r + 1] = (uint8_t)(int8_t)(quant_iq4_xs_scale(w, i + 4) - 32);
                        }
                        for (int c = 0; c < 256; c++) {
                            int hi;
                            size_t at = nib_at(r, c, 32, &hi);
                            B[320 + at] |= (uint8_t)(hi ? (q[c] & 0xF) << 4 : q[c] & 0xF);
                        }
                    } else if (dt == MODEL_Q4_K || dt == MODEL_Q5_K) {
                        /* Q5_K's d, dmin and scales sit where Q4_K's do */
                        const struct quant_block_q4_k *w = blk;
                        uint8_t *B = P + (size_t)b * (dt == MODEL_Q4_K ? P4K_BYTES : P5K_BYTES);
                        memcpy(B + 2 * r, &w->d, 2);
                        memcpy(B + 32 + 2 * r, &w->dmin, 2);
                        for (int i = 0; i < 4; i++) {
                            uint8_t s0, m0, s1, m1;
                            quant_k_scale_min(w->scales, i, &s0, &m0);
                            quant_k_scale_min(w->scales, i + 4, &s1, &m1);
                            B[64 + 32 * i + 2 * r] = s0, B[64 + 32 * i + 2 * r + 1] = s1;
                            B[192 + 32 * i + 2 * r] = m0, B[192 + 32 * i + 2 * r + 1] = m1;
                        }
                        for (int c = 0; c < 256; c++) {
                            int hi, grp = c / 4;
                            size_t at = nib_at(r, c, 32, &hi);
                            B[320 + at] |= (uint8_t)(hi ? (q[c] & 0xF) << 4 : q[c] & 0xF);
                            if (dt == MODEL_Q5_K) /* fifth bit: vector grp % 8, bit grp / 8 */
                                B[2368 + (size_t)(grp % 8) * 64 + (size_t)r * 4 + (size_t)(c % 4)] |=
                                    (uint8_t)((q[c] >> 4) << (grp / 8));
                        }
                    } else {
                        const struct quant_block_q6_k *w = blk;
                        uint8_t *B = P + (size_t)b * P6K_BYTES;
                        memcpy(B + 2 * r, &w->d, 2);
                        for (int i = 0; i < 8; i++) {
                            B[64 + 32 * i + 2 * r] = (uint8_t)w->scales[i];
                            B[64 + 32 * i + 2 * r + 1] = (uint8_t)w->scales[i + 8];
                        }
                        for (int c = 0; c < 256; c++) {
                            int hi, grp = c / 4;
                            size_t at = nib_at(r, c, 32, &hi);
                            B[320 + at] |= (uint8_t)(hi ? (q[c] & 0xF) << 4 : q[c] & 0xF);
                            size_t hb = (size_t)(grp % 16) * 64 + (size_t)r * 4 + (size_t)(c % 4);
                            B[2368 + hb] |= (uint8_t)((q[c] >> 4) << (2 * (grp / 16)));
                        }
                    }
                }
            } else { /* AWQ rows from cpu_q_awq_convert */
                size_t gbytes = (size_t)(64 + G * 8);
                for (int g = 0; g < cols / G; g++) {
                    const uint8_t *gr = row + (size_t)g * (size_t)(4 + G / 2);
                    uint8_t *B = P + (size_t)g * gbytes;
                    memcpy(B + 2 * r, gr, 2);
                    B[32 + r] = gr[2];
                    for (int c = 0; c < G; c++) {
                        int hi;
                        uint8_t v = (uint8_t)(c % 2 ? gr[4 + c / 2] >> 4 : gr[4 + c / 2] & 0xF);
                        size_t at = nib_at(r, c, G / 8, &hi);
                        B[64 + at] |= (uint8_t)(hi ? v << 4 : v);
                    }
                }
            }
        }
    }
}

/* ------------------------------------------------------------ dequantize */

/* Row r of a PANELS matrix back into NATIVE bytes (the inverse of
 * cpu_q_pack for one row); then the reference dequantization. */
static void unpack_row(const struct cpu_qmat *m, int r, uint8_t *row)
{
    int G = m->awq_group, cols = m->cols;
    size_t pb = cpu_q_panel_bytes(m->dt, cols, G);
    const uint8_t *P = (const uint8_t *)m->w + (size_t)(r / 16) * pb;
    int rr = r % 16;
    if (m->dt == MODEL_Q8_0) {
        struct quant_block_q8_0 *w = (void *)row;
        for (int b = 0; b < cols / 32; b++) {
            const uint8_t *B = P + (size_t)(b / 2) * P80_BYTES;
            memcpy(&w[b].d, B + 32 * (b % 2) + 2 * rr, 2);
            const uint8_t *Q = B + 64 + 512 * (b % 2);
            for (int c = 0; c < 32; c++)
                w[b].qs[c] = (int8_t)(Q[(c / 4) * 64 + rr * 4 + c % 4] - 128);
        }
    } else if (m->dt == MODEL_Q4_K || m->dt == MODEL_Q5_K) {
        int q5 = m->dt == MODEL_Q5_K;
        size_t bb = q5 ? sizeof(struct quant_block_q5_k) : sizeof(struct quant_block_q4_k);
        for (int b = 0; b < cols / 256; b++) {
            /* the header (d, dmin, scales) is common; Q5_K's qs after qh */
            struct quant_block_q4_k *w = (void *)(row + (size_t)b * bb);
            struct quant_block_q5_k *w5 = (void *)w;
            uint8_t *qs = q5 ? w5->qs : w->qs;
            const uint8_t *B = P + (size_t)b * (q5 ? P5K_BYTES : P4K_BYTES);
            memcpy(&w->d, B + 2 * rr, 2);
            memcpy(&w->dmin, B + 32 + 2 * rr, 2);
            uint8_t sc[8], mn[8];
            for (int i = 0; i < 4; i++) {
                sc[i] = B[64 + 32 * i + 2 * rr], sc[i + 4] = B[64 + 32 * i + 2 * rr + 1];
                mn[i] = B[192 + 32 * i + 2 * rr], mn[i + 4] = B[192 + 32 * i + 2 * rr + 1];
            }
            /* quant_k_scale_min's packing, written back */
            memset(w->scales, 0, sizeof w->scales);
            for (int j = 0; j < 4; j++) {
                w->scales[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
                w->scales[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
                w->scales[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
            }
            if (q5)
                memset(w5->qh, 0, sizeof w5->qh);
            for (int c = 0; c < 256; c++) {
                int hi, grp = c / 4;
                size_t at = nib_at(rr, c, 32, &hi);
                uint8_t v = (uint8_t)(hi ? B[320 + at] >> 4 : B[320 + at] & 0xF);
                int j = c / 32, l = c % 32;
                uint8_t *d = &qs[32 * (j / 2) + l];
                *d = (uint8_t)(j % 2 ? (*d & 0xF) | (v << 4) : (*d & 0xF0) | v);
                if (q5 && (B[2368 + (size_t)(grp % 8) * 64 + (size_t)rr * 4 + (size_t)(c % 4)] >> (grp / 8)) & 1)
                    w5->qh[l] |= (uint8_t)(1u << j);
            }
        }
    } else if (m->dt == MODEL_Q2_K) {
        struct quant_block_q2_k *w = (void *)row;
        for (int b = 0; b < cols / 256; b++) {
            const uint8_t *B = P + (size_t)b * P2K_BYTES;
            memcpy(&w[b].d, B + 2 * rr, 2);
            memcpy(&w[b].dmin, B + 32 + 2 * rr, 2);
            for (int i = 0; i < 8; i++) {
                w[b].scales[i] = (uint8_t)(B[64 + 32 * i + 2 * rr] | B[320 + 32 * i + 2 * rr] << 4);
                w[b].scales[i + 8] = (uint8_t)(B[64 + 32 * i + 2 * rr + 1] | B[320 + 32 * i + 2 * rr + 1] << 4);
            }
            memset(w[b].qs, 0, sizeof w[b].qs);
            for (int c = 0; c < 256; c++) {
                int h = c / 128, k = (c % 128) / 32, l = c % 32, grp = c / 4;
                int q = (B[576 + (size_t)(grp % 16) * 64 + (size_t)rr * 4 + (size_t)(c % 4)] >> (2 * (grp / 16))) & 3;
                w[b].qs[32 * h + l] |= (uint8_t)(q << (2 * k));
            }
        }
    } else if (m->dt == MODEL_Q4_1 || m->dt == MODEL_Q5_1) {
        size_t bb = quant_block_bytes(m->dt);
        for (int b = 0; b < cols / 32; b++) {
            uint8_t *blk = row + (size_t)b * bb;
            const uint8_t *B = P + (size_t)(b / 2) * P8M_BYTES;
            const uint8_t *Q = B + 128 + 512 * (b % 2);
            memcpy(blk, B + 32 * (b % 2) + 2 * rr, 2);
            memcpy(blk + 2, B + 64 + 32 * (b % 2) + 2 * rr, 2);
            uint8_t *qs = blk + (m->dt == MODEL_Q4_1 ? 4 : 8);
            uint32_t h = 0;
            for (int l = 0; l < 16; l++) {
                int q0 = Q[(l / 4) * 64 + rr * 4 + l % 4], q1 = Q[((l + 16) / 4) * 64 + rr * 4 + l % 4];
                qs[l] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
                h |= (uint32_t)(q0 >> 4) << l | (uint32_t)(q1 >> 4) << (l + 16);
            }
            if (m->dt == MODEL_Q5_1)
                for (int i = 0; i < 4; i++)
                    blk[4 + i] = (uint8_t)(h >> (8 * i));
        }
    } else if (m->dt == MODEL_IQ4_XS) {
        struct quant_block_iq4_xs *w = (void *)row;
        for (int b = 0; b < cols / 256; b++) {
            const uint8_t *B = P + (size_t)b * P4K_BYTES;
            memcpy(&w[b].d, B + 2 * rr, 2);
            w[b].scales_h = 0;
            memset(w[b].scales_l, 0, sizeof w[b].scales_l);
            for (int j = 0; j < 8; j++) {
                int ls = (int8_t)B[64 + 32 * (j % 4) + 2 * rr + j / 4] + 32;
                w[b].scales_l[j / 2] |= (uint8_t)((ls & 0xF) << (4 * (j % 2)));
                w[b].scales_h |= (uint16_t)((ls >> 4) << (2 * j));
            }
            memset(w[b].qs, 0, sizeof w[b].qs);
            for (int c = 0; c < 256; c++) {
                int hi, j = c / 32, l = c % 32;
                size_t at = nib_at(rr, c, 32, &hi);
                uint8_t v = (uint8_t)(hi ? B[320 + at] >> 4 : B[320 + at] & 0xF);
                w[b].qs[16 * j + (l & 15)] |= (uint8_t)(l < 16 ? v : v << 4);
            }
        }
    } else if (m->dt == MODEL_Q6_K) {
        struct quant_block_q6_k *w = (void *)row;
        for (int b = 0; b < cols / 256; b++) {
            const uint8_t *B = P + (size_t)b * P6K_BYTES;
            memcpy(&w[b].d, B + 2 * rr, 2);
            for (int i = 0; i < 8; i++) {
                w[b].scales[i] = (int8_t)B[64 + 32 * i + 2 * rr];
                w[b].scales[i + 8] = (int8_t)B[64 + 32 * i + 2 * rr + 1];
            }
            memset(w[b].ql, 0, sizeof w[b].ql);
            memset(w[b].qh, 0, sizeof w[b].qh);
            for (int c = 0; c < 256; c++) {
                int hi, grp = c / 4;
                size_t at = nib_at(rr, c, 32, &hi);
                int lo4 = hi ? B[320 + at] >> 4 : B[320 + at] & 0xF;
                size_t hb = (size_t)(grp % 16) * 64 + (size_t)rr * 4 + (size_t)(c % 4);
                int hi2 = (B[2368 + hb] >> (2 * (grp / 16))) & 3;
                /* the inverse of quant_dequant_q6_k's indexing */
                int h = c / 128, k = (c % 128) / 32, l = c % 32;
                uint8_t *ql = w[b].ql + 64 * h, *qh = w[b].qh + 32 * h;
                int li = l + 32 * (k & 1);
                ql[li] |= (uint8_t)(k >= 2 ? lo4 << 4 : lo4);
                qh[l] |= (uint8_t)(hi2 << (2 * k));
            }
        }
    } else { /* AWQ */
        size_t gbytes = (size_t)(64 + G * 8);
        for (int g = 0; g < cols / G; g++) {
            uint8_t *gr = row + (size_t)g * (size_t)(4 + G / 2);
            const uint8_t *B = P + (size_t)g * gbytes;
            memcpy(gr, B + 2 * rr, 2);
            gr[2] = B[32 + rr];
            gr[3] = 0;
            memset(gr + 4, 0, (size_t)G / 2);
            for (int c = 0; c < G; c++) {
                int hi;
                size_t at = nib_at(rr, c, G / 8, &hi);
                uint8_t v = (uint8_t)(hi ? B[64 + at] >> 4 : B[64 + at] & 0xF);
                gr[4 + c / 2] |= (uint8_t)(c % 2 ? v << 4 : v);
            }
        }
    }
}

void cpu_q_dequant_row(const struct cpu_qmat *m, int r, float *out)
{
    struct cpu_qmat pm;
    if (m->layout == CPU_QL_PANELS && cpu_q_panel_dt(m->dt) != m->dt) {
        /* packed as another format, whose dequantization gives the same
         * floats (widen_row): read it as that */
        pm = *m;
        pm.dt = cpu_q_panel_dt(m->dt);
        m = &pm;
    }
    size_t rb = cpu_q_row_bytes(m->dt, m->cols, m->awq_group);
    uint8_t stack[8192];
    const uint8_t *row = (const uint8_t *)m->w + (size_t)r * rb;
    uint8_t *tmp = NULL;
    if (m->layout == CPU_QL_PANELS) {
        tmp = rb <= sizeof stack ? stack : malloc(rb);
        if (!tmp) { /* cannot happen for real shapes; keep the row defined */
            memset(out, 0, (size_t)m->cols * sizeof *out);
            return;
        }
        unpack_row(m, r, tmp);
        row = tmp;
    }
    switch (m->dt) {
    case MODEL_AWQ4: {
        int G = m->awq_group;
        for (int g = 0; g < m->cols / G; g++) {
            const uint8_t *gr = row + (size_t)g * (size_t)(4 + G / 2);
            uint16_t s16;
            memcpy(&s16, gr, 2);
            float s = f16_to_f32(s16);
            for (int c = 0; c < G; c++) {
                int q = c % 2 ? gr[4 + c / 2] >> 4 : gr[4 + c / 2] & 0xF;
                out[g * G + c] = (float)(q - gr[2]) * s;
            }
        }
        break;
    }
    default:
        if (quant_dequant_blocks(m->dt, row, out, m->cols))
            memset(out, 0, (size_t)m->cols * sizeof *out);
        break;
    }
    if (tmp && tmp != stack)
        free(tmp);
}
