/* engine/quant.c - block sizes and reference dequantization of the
 * quantized formats (definitions in quant.h).
 *
 * These loops are the formats' definitions written out once, in float and
 * in the order llama.cpp's reference (dequantize_row_*) uses, so that the
 * fast kernels and the fidelity tests have one thing to agree with. They
 * are not for hot paths. Any thread; no state. */
#include "quant.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "dtype.h"
#include "err.h"

const int QUANT_AWQ_NIBBLE[8] = {0, 4, 1, 5, 2, 6, 3, 7};
const int8_t QUANT_IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

int quant_is_quantized(enum model_dtype dt)
{
    switch (dt) {
    case MODEL_Q8_0:
    case MODEL_Q4_K:
    case MODEL_Q5_K:
    case MODEL_Q6_K:
    case MODEL_AWQ4:
    case MODEL_Q4_0:
    case MODEL_Q4_1:
    case MODEL_Q5_0:
    case MODEL_Q5_1:
    case MODEL_Q2_K:
    case MODEL_Q3_K:
    case MODEL_IQ4_NL:
    case MODEL_IQ4_XS: return 1;
    default: return 0;
    }
}

int quant_block_elems(enum model_dtype dt)
{
    switch (dt) {
    case MODEL_Q8_0:
    case MODEL_Q4_0:
    case MODEL_Q4_1:
    case MODEL_Q5_0:
    case MODEL_Q5_1:
    case MODEL_IQ4_NL: return QUANT_QK8_0;
    case MODEL_Q4_K:
    case MODEL_Q5_K:
    case MODEL_Q6_K:
    case MODEL_Q2_K:
    case MODEL_Q3_K:
    case MODEL_IQ4_XS: return QUANT_QK_K;
    default: return 1;
    }
}

size_t quant_block_bytes(enum model_dtype dt)
{
    switch (dt) {
    case MODEL_Q8_0: return sizeof(struct quant_block_q8_0);
    case MODEL_Q4_K: return sizeof(struct quant_block_q4_k);
    case MODEL_Q5_K: return sizeof(struct quant_block_q5_k);
    case MODEL_Q6_K: return sizeof(struct quant_block_q6_k);
    case MODEL_Q4_0: return sizeof(struct quant_block_q4_0);
    case MODEL_Q4_1: return sizeof(struct quant_block_q4_1);
    case MODEL_Q5_0: return sizeof(struct quant_block_q5_0);
    case MODEL_Q5_1: return sizeof(struct quant_block_q5_1);
    case MODEL_IQ4_NL: return sizeof(struct quant_block_iq4_nl);
    case MODEL_Q2_K: return sizeof(struct quant_block_q2_k);
    case MODEL_Q3_K: return sizeof(struct quant_block_q3_k);
    case MODEL_IQ4_XS: return sizeof(struct quant_block_iq4_xs);
    default: return 0;
    }
}

size_t quant_row_bytes(enum model_dtype dt, int64_t n)
{
    size_t bb = quant_block_bytes(dt);
    int be = quant_block_elems(dt);
    if (!bb || n <= 0 || n % be)
        return 0;
    return (size_t)(n / be) * bb;
}

/* Sub-blocks 0..3 keep their scale and min in the low 6 bits of bytes
 * 0..3 and 4..7; sub-blocks 4..7 in the nibbles of bytes 8..11, with their
 * top two bits in the spare high bits of bytes 0..7. */
void quant_k_scale_min(const uint8_t q[QUANT_K_SCALE_BYTES], int j, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

void quant_dequant_q8_0(const struct quant_block_q8_0 *x, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / QUANT_QK8_0; b++) {
        float d = f16_to_f32(x[b].d);
        for (int i = 0; i < QUANT_QK8_0; i++)
            *out++ = d * (float)x[b].qs[i];
    }
}

void quant_dequant_q4_k(const struct quant_block_q4_k *x, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / QUANT_QK_K; b++) {
        const uint8_t *q = x[b].qs;
        float d = f16_to_f32(x[b].d), dmin = f16_to_f32(x[b].dmin);
        for (int j = 0; j < 8; j += 2) {
            uint8_t sc, m;
            quant_k_scale_min(x[b].scales, j, &sc, &m);
            float d1 = d * sc, m1 = dmin * m;
            quant_k_scale_min(x[b].scales, j + 1, &sc, &m);
            float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                *out++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++)
                *out++ = d2 * (float)(q[l] >> 4) - m2;
            q += 32;
        }
    }
}

void quant_dequant_q5_k(const struct quant_block_q5_k *x, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / QUANT_QK_K; b++) {
        const uint8_t *ql = x[b].qs, *qh = x[b].qh;
        float d = f16_to_f32(x[b].d), dmin = f16_to_f32(x[b].dmin);
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < 8; j += 2) {
            uint8_t sc, m;
            quant_k_scale_min(x[b].scales, j, &sc, &m);
            float d1 = d * sc, m1 = dmin * m;
            quant_k_scale_min(x[b].scales, j + 1, &sc, &m);
            float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                *out++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *out++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
            u1 = (uint8_t)(u1 << 2);
            u2 = (uint8_t)(u2 << 2);
        }
    }
}

/* Each half (128 elements) of a Q6_K block: element l + 32 k (k = 0..3,
 * l = 0..31) has its low nibble in ql[l + 32 (k & 1)] (low nibble for
 * k < 2, high for k >= 2), its high two bits at bits 2k of qh[l], and the
 * scale scales[l / 16 + 2 k]. */
void quant_dequant_q6_k(const struct quant_block_q6_k *x, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / QUANT_QK_K; b++) {
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        const int8_t *sc = x[b].scales;
        float d = f16_to_f32(x[b].d);
        for (int h = 0; h < 2; h++) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                out[l] = d * (float)sc[is] * (float)q1;
                out[l + 32] = d * (float)sc[is + 2] * (float)q2;
                out[l + 64] = d * (float)sc[is + 4] * (float)q3;
                out[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
            out += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

int quant_q3_k_scale(const uint8_t scales[12], int s)
{
    int lo = s < 8 ? scales[s] & 0xF : scales[s - 8] >> 4;
    return lo | ((scales[8 + s % 4] >> (2 * (s / 4))) & 3) << 4;
}

int quant_q3_k_code(const struct quant_block_q3_k *b, int e)
{
    int h = e / 128, k = (e % 128) / 32, l = e % 32;
    return ((b->qs[32 * h + l] >> (2 * k)) & 3) - ((b->hmask[l] >> (4 * h + k)) & 1 ? 0 : 4);
}

void quant_q6_k_put(struct quant_block_q6_k *b, int e, int q)
{
    int h = e / 128, k = (e % 128) / 32, l = e % 32, u = q + 32;
    b->ql[64 * h + l + 32 * (k & 1)] |= (uint8_t)((u & 0xF) << (k < 2 ? 0 : 4));
    b->qh[32 * h + l] |= (uint8_t)((u >> 4) << (2 * k));
}

int quant_iq4_xs_scale(const struct quant_block_iq4_xs *b, int j)
{
    return ((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | ((b->scales_h >> (2 * j)) & 3) << 4;
}

/* The fifth bits of a Q5_0 / Q5_1 block, as the little-endian word. */
static uint32_t q5_high(const uint8_t qh[4])
{
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

void quant_dequant_q4_0(const struct quant_block_q4_0 *x, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, out += 32) {
        float d = f16_to_f32(x[b].d);
        for (int l = 0; l < 16; l++) {
            out[l] = (float)((x[b].qs[l] & 0xF) - 8) * d;
            out[l + 16] = (float)((x[b].qs[l] >> 4) - 8) * d;
        }
    }
}

void quant_dequant_q4_1(const struct quant_block_q4_1 *x, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, out += 32) {
        float d = f16_to_f32(x[b].d), m = f16_to_f32(x[b].m);
        for (int l = 0; l < 16; l++) {
            out[l] = (float)(x[b].qs[l] & 0xF) * d + m;
            out[l + 16] = (float)(x[b].qs[l] >> 4) * d + m;
        }
    }
}

void quant_dequant_q5_0(const struct quant_block_q5_0 *x, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, out += 32) {
        float d = f16_to_f32(x[b].d);
        uint32_t h = q5_high(x[b].qh);
        for (int l = 0; l < 16; l++) {
            int q0 = (int)((x[b].qs[l] & 0xF) | ((h >> l) & 1) << 4);
            int q1 = (int)((x[b].qs[l] >> 4) | ((h >> (l + 16)) & 1) << 4);
            out[l] = (float)(q0 - 16) * d;
            out[l + 16] = (float)(q1 - 16) * d;
        }
    }
}

void quant_dequant_q5_1(const struct quant_block_q5_1 *x, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, out += 32) {
        float d = f16_to_f32(x[b].d), m = f16_to_f32(x[b].m);
        uint32_t h = q5_high(x[b].qh);
        for (int l = 0; l < 16; l++) {
            int q0 = (int)((x[b].qs[l] & 0xF) | ((h >> l) & 1) << 4);
            int q1 = (int)((x[b].qs[l] >> 4) | ((h >> (l + 16)) & 1) << 4);
            out[l] = (float)q0 * d + m;
            out[l + 16] = (float)q1 * d + m;
        }
    }
}

void quant_dequant_iq4_nl(const struct quant_block_iq4_nl *x, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, out += 32) {
        float d = f16_to_f32(x[b].d);
        for (int l = 0; l < 16; l++) {
            out[l] = d * (float)QUANT_IQ4_VALUES[x[b].qs[l] & 0xF];
            out[l + 16] = d * (float)QUANT_IQ4_VALUES[x[b].qs[l] >> 4];
        }
    }
}

void quant_dequant_q2_k(const struct quant_block_q2_k *x, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / QUANT_QK_K; b++, out += QUANT_QK_K) {
        float d = f16_to_f32(x[b].d), dmin = f16_to_f32(x[b].dmin);
        for (int c = 0; c < QUANT_QK_K; c++) {
            int h = c / 128, k = (c % 128) / 32, l = c % 32, sc = x[b].scales[c / 16];
            float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
            out[c] = dl * (float)((x[b].qs[32 * h + l] >> (2 * k)) & 3) - ml;
        }
    }
}

void quant_dequant_q3_k(const struct quant_block_q3_k *x, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / QUANT_QK_K; b++, out += QUANT_QK_K) {
        float d = f16_to_f32(x[b].d);
        for (int c = 0; c < QUANT_QK_K; c++) {
            float dl = d * (float)(quant_q3_k_scale(x[b].scales, c / 16) - 32);
            out[c] = dl * (float)quant_q3_k_code(&x[b], c);
        }
    }
}

void quant_dequant_iq4_xs(const struct quant_block_iq4_xs *x, float *out, int64_t n)
{
    for (int64_t b = 0; b < n / QUANT_QK_K; b++) {
        float d = f16_to_f32(x[b].d);
        for (int j = 0; j < 8; j++, out += 32) {
            float dl = d * (float)(quant_iq4_xs_scale(&x[b], j) - 32);
            const uint8_t *qs = x[b].qs + 16 * j;
            for (int l = 0; l < 16; l++) {
                out[l] = dl * (float)QUANT_IQ4_VALUES[qs[l] & 0xF];
                out[l + 16] = dl * (float)QUANT_IQ4_VALUES[qs[l] >> 4];
            }
        }
    }
}

int quant_dequant_blocks(enum model_dtype dt, const void *x, float *out, int64_t n)
{
    if (!quant_row_bytes(dt, n))
        return -RL_EINVAL;
    switch (dt) {
    case MODEL_Q8_0: quant_dequant_q8_0(x, out, n); break;
    case MODEL_Q4_K: quant_dequant_q4_k(x, out, n); break;
    case MODEL_Q5_K: quant_dequant_q5_k(x, out, n); break;
    case MODEL_Q6_K: quant_dequant_q6_k(x, out, n); break;
    case MODEL_Q4_0: quant_dequant_q4_0(x, out, n); break;
    case MODEL_Q4_1: quant_dequant_q4_1(x, out, n); break;
    case MODEL_Q5_0: quant_dequant_q5_0(x, out, n); break;
    case MODEL_Q5_1: quant_dequant_q5_1(x, out, n); break;
    case MODEL_IQ4_NL: quant_dequant_iq4_nl(x, out, n); break;
    case MODEL_Q2_K: quant_dequant_q2_k(x, out, n); break;
    case MODEL_Q3_K: quant_dequant_q3_k(x, out, n); break;
    case MODEL_IQ4_XS: quant_dequant_iq4_xs(x, out, n); break;
    default: return -RL_EINVAL;
    }
    return 0;
}

static void dequant_awq_row(const struct model_tensor *t, int64_t r, float *out)
{
    const int32_t *qw = t->data;
    int64_t ld = t->rows / 8;               /* int32s per packed row */
    int64_t col8 = r / 8;
    int shift = 4 * QUANT_AWQ_NIBBLE[r % 8];
    for (int64_t c = 0; c < t->cols; c++) {
        int64_t g = c / t->awq_group;
        uint32_t qv = (uint32_t)qw[c * ld + col8];
        uint32_t zv = (uint32_t)t->awq_qzeros[g * ld + col8];
        int q = (int)((qv >> shift) & 0xF), z = (int)((zv >> shift) & 0xF);
        float s = f16_to_f32(t->awq_scales[g * t->rows + r]);
        out[c] = (float)(q - z) * s;
    }
}

int quant_dequant_row(const struct model_tensor *t, int64_t r, float *out)
{
    if (r < 0 || r >= t->rows)
        return -RL_EINVAL;
    if (t->dtype == MODEL_AWQ4) {
        if (!t->awq_qzeros || !t->awq_scales || t->awq_group <= 0 || t->rows % 8 ||
            t->cols % t->awq_group)
            return -RL_EINVAL;
        dequant_awq_row(t, r, out);
        return 0;
    }
    size_t rb = quant_row_bytes(t->dtype, t->cols);
    if (!rb)
        return -RL_EINVAL;
    return quant_dequant_blocks(t->dtype, (const char *)t->data + (size_t)r * rb, out, t->cols);
}

/* ---- reference quantizers ----
 *
 * Every quantizer rounds its scales to f16 first and then quantizes the
 * values against the rounded scales, so the stored codes are the best for
 * the scales a reader will actually use. */

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

void quant_quantize_q8_0(const float *x, struct quant_block_q8_0 *out, int64_t n)
{
    for (int64_t b = 0; b < n / QUANT_QK8_0; b++, x += QUANT_QK8_0) {
        float amax = 0.0f;
        for (int i = 0; i < QUANT_QK8_0; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        out[b].d = f32_to_f16(amax / 127.0f);
        float d = f16_to_f32(out[b].d), id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int i = 0; i < QUANT_QK8_0; i++)
            out[b].qs[i] = (int8_t)clampi((int)lrintf(x[i] * id), -127, 127);
    }
}

/* The 8 sub-block scales and mins of a Q4_K / Q5_K super-block x (256
 * values) for codes 0..nmax: fills d, dmin (f16), the packed scales, and
 * per sub-block the effective step and offset a reader will use. */
static void k_scales(const float *x, int nmax, uint16_t *d16, uint16_t *dmin16,
                     uint8_t scales[QUANT_K_SCALE_BYTES], float step[8], float off[8])
{
    float sc[8], mn[8], max_sc = 0.0f, max_mn = 0.0f;
    for (int j = 0; j < 8; j++) {
        float lo = 0.0f, hi = 0.0f; /* the min is stored as a positive offset, so lo <= 0 */
        for (int l = 0; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        sc[j] = (hi - lo) / (float)nmax;
        mn[j] = -lo;
        max_sc = fmaxf(max_sc, sc[j]);
        max_mn = fmaxf(max_mn, mn[j]);
    }
    *d16 = f32_to_f16(max_sc / 63.0f);
    *dmin16 = f32_to_f16(max_mn / 63.0f);
    float d = f16_to_f32(*d16), dmin = f16_to_f32(*dmin16);
    uint8_t qs[8], qm[8];
    for (int j = 0; j < 8; j++) {
        qs[j] = (uint8_t)(d > 0.0f ? clampi((int)lrintf(sc[j] / d), 0, 63) : 0);
        qm[j] = (uint8_t)(dmin > 0.0f ? clampi((int)lrintf(mn[j] / dmin), 0, 63) : 0);
        /* a range the 6-bit scale rounds to nothing still needs a step */
        if (!qs[j] && sc[j] > 0.0f && d > 0.0f)
            qs[j] = 1;
        step[j] = d * qs[j];
        off[j] = dmin * qm[j];
    }
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(qs[j] | ((qs[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)(qm[j] | ((qm[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((qs[j + 4] & 0xF) | ((qm[j + 4] & 0xF) << 4));
    }
}

static inline int k_code(float v, float step, float off, int nmax)
{
    return step > 0.0f ? clampi((int)lrintf((v + off) / step), 0, nmax) : 0;
}

void quant_quantize_q4_k(const float *x, struct quant_block_q4_k *out, int64_t n)
{
    for (int64_t b = 0; b < n / QUANT_QK_K; b++, x += QUANT_QK_K) {
        float step[8], off[8];
        k_scales(x, 15, &out[b].d, &out[b].dmin, out[b].scales, step, off);
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++) {
                int lo = k_code(x[64 * p + l], step[2 * p], off[2 * p], 15);
                int hi = k_code(x[64 * p + 32 + l], step[2 * p + 1], off[2 * p + 1], 15);
                out[b].qs[32 * p + l] = (uint8_t)(lo | hi << 4);
            }
    }
}

void quant_quantize_q5_k(const float *x, struct quant_block_q5_k *out, int64_t n)
{
    for (int64_t b = 0; b < n / QUANT_QK_K; b++, x += QUANT_QK_K) {
        float step[8], off[8];
        k_scales(x, 31, &out[b].d, &out[b].dmin, out[b].scales, step, off);
        memset(out[b].qh, 0, sizeof out[b].qh);
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++) {
                int lo = k_code(x[64 * p + l], step[2 * p], off[2 * p], 31);
                int hi = k_code(x[64 * p + 32 + l], step[2 * p + 1], off[2 * p + 1], 31);
                out[b].qs[32 * p + l] = (uint8_t)((lo & 0xF) | (hi & 0xF) << 4);
                out[b].qh[l] |= (uint8_t)(((lo >> 4) << (2 * p)) | ((hi >> 4) << (2 * p + 1)));
            }
    }
}

void quant_quantize_q6_k(const float *x, struct quant_block_q6_k *out, int64_t n)
{
    for (int64_t b = 0; b < n / QUANT_QK_K; b++, x += QUANT_QK_K) {
        struct quant_block_q6_k *y = &out[b];
        float sc[16], max_sc = 0.0f;
        for (int s = 0; s < 16; s++) {
            float amax = 0.0f;
            for (int l = 0; l < 16; l++)
                amax = fmaxf(amax, fabsf(x[16 * s + l]));
            sc[s] = amax / 31.0f; /* codes -31..31 of the -32..31 range */
            max_sc = fmaxf(max_sc, sc[s]);
        }
        y->d = f32_to_f16(max_sc / 127.0f);
        float d = f16_to_f32(y->d);
        float step[16];
        for (int s = 0; s < 16; s++) {
            int q = d > 0.0f ? clampi((int)lrintf(sc[s] / d), 0, 127) : 0;
            if (!q && sc[s] > 0.0f && d > 0.0f)
                q = 1;
            y->scales[s] = (int8_t)q;
            step[s] = d * (float)q;
        }
        memset(y->ql, 0, sizeof y->ql);
        memset(y->qh, 0, sizeof y->qh);
        for (int e = 0; e < QUANT_QK_K; e++) {
            int s = e / 16;
            quant_q6_k_put(y, e, step[s] > 0.0f ? clampi((int)lrintf(x[e] / step[s]), -32, 31) : 0);
        }
    }
}

/* The element of largest magnitude, with its sign: the symmetric formats
 * map it to their most negative code, which reaches one step further than
 * the positive side (Q4_0: -8..7), as llama.cpp's reference does. */
static float signed_amax(const float *x, int n)
{
    float m = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > fabsf(m))
            m = x[i];
    return m;
}

/* Q4_0 / Q5_0 (half = 8 or 16): d = amax / -half, q = x / d + half. */
static void quantize_sym32(const float *x, uint16_t *d16, uint8_t qs[16], uint32_t *high, int half)
{
    *d16 = f32_to_f16(signed_amax(x, 32) / (float)-half);
    float d = f16_to_f32(*d16), id = d != 0.0f ? 1.0f / d : 0.0f;
    *high = 0;
    for (int l = 0; l < 16; l++) {
        int q0 = clampi((int)lrintf(x[l] * id) + half, 0, 2 * half - 1);
        int q1 = clampi((int)lrintf(x[l + 16] * id) + half, 0, 2 * half - 1);
        qs[l] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
        *high |= (uint32_t)(q0 >> 4) << l | (uint32_t)(q1 >> 4) << (l + 16);
    }
}

/* Q4_1 / Q5_1 (nmax = 15 or 31): d = (max - min) / nmax, m = min. */
static void quantize_affine32(const float *x, uint16_t *d16, uint16_t *m16, uint8_t qs[16],
                              uint32_t *high, int nmax)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    *d16 = f32_to_f16((hi - lo) / (float)nmax);
    *m16 = f32_to_f16(lo);
    float d = f16_to_f32(*d16), m = f16_to_f32(*m16), id = d > 0.0f ? 1.0f / d : 0.0f;
    *high = 0;
    for (int l = 0; l < 16; l++) {
        int q0 = clampi((int)lrintf((x[l] - m) * id), 0, nmax);
        int q1 = clampi((int)lrintf((x[l + 16] - m) * id), 0, nmax);
        qs[l] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
        *high |= (uint32_t)(q0 >> 4) << l | (uint32_t)(q1 >> 4) << (l + 16);
    }
}

static void put_high(uint8_t qh[4], uint32_t h)
{
    for (int i = 0; i < 4; i++)
        qh[i] = (uint8_t)(h >> (8 * i));
}

void quant_quantize_q4_0(const float *x, struct quant_block_q4_0 *out, int64_t n)
{
    uint32_t h;
    for (int64_t b = 0; b < n / 32; b++, x += 32)
        quantize_sym32(x, &out[b].d, out[b].qs, &h, 8);
}

void quant_quantize_q5_0(const float *x, struct quant_block_q5_0 *out, int64_t n)
{
    uint32_t h;
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        quantize_sym32(x, &out[b].d, out[b].qs, &h, 16);
        put_high(out[b].qh, h);
    }
}

void quant_quantize_q4_1(const float *x, struct quant_block_q4_1 *out, int64_t n)
{
    uint32_t h;
    for (int64_t b = 0; b < n / 32; b++, x += 32)
        quantize_affine32(x, &out[b].d, &out[b].m, out[b].qs, &h, 15);
}

void quant_quantize_q5_1(const float *x, struct quant_block_q5_1 *out, int64_t n)
{
    uint32_t h;
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        quantize_affine32(x, &out[b].d, &out[b].m, out[b].qs, &h, 31);
        put_high(out[b].qh, h);
    }
}

/* The IQ4 level nearest v (in units of the block's step). */
static int iq4_code(float v)
{
    int best = 0;
    for (int i = 1; i < 16; i++)
        if (fabsf(v - (float)QUANT_IQ4_VALUES[i]) < fabsf(v - (float)QUANT_IQ4_VALUES[best]))
            best = i;
    return best;
}

/* 32 values against step d (the largest at level -127: d = amax / -127). */
static void iq4_codes(const float *x, float d, uint8_t qs[16])
{
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int l = 0; l < 16; l++)
        qs[l] = (uint8_t)(iq4_code(x[l] * id) | iq4_code(x[l + 16] * id) << 4);
}

void quant_quantize_iq4_nl(const float *x, struct quant_block_iq4_nl *out, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        out[b].d = f32_to_f16(signed_amax(x, 32) / -127.0f);
        iq4_codes(x, f16_to_f32(out[b].d), out[b].qs);
    }
}

/* A signed sub-block scale s (step of its codes) as a 6-bit code c of a
 * super-block step d: s ~ d * (c - 32), c - 32 in -32..31, never 0 for a
 * sub-block that has a step. */
static int sub_scale(float s, float d)
{
    if (d <= 0.0f)
        return 32;
    int v = clampi((int)lrintf(s / d), -32, 31);
    if (!v && s != 0.0f)
        v = s > 0.0f ? 1 : -1;
    return v + 32;
}

void quant_quantize_iq4_xs(const float *x, struct quant_block_iq4_xs *out, int64_t n)
{
    for (int64_t b = 0; b < n / QUANT_QK_K; b++, x += QUANT_QK_K) {
        struct quant_block_iq4_xs *y = &out[b];
        float s[8], smax = 0.0f;
        for (int j = 0; j < 8; j++) {
            s[j] = signed_amax(x + 32 * j, 32) / -127.0f;
            smax = fmaxf(smax, fabsf(s[j]));
        }
        y->d = f32_to_f16(smax / 32.0f);
        float d = f16_to_f32(y->d);
        y->scales_h = 0;
        memset(y->scales_l, 0, sizeof y->scales_l);
        for (int j = 0; j < 8; j++) {
            int c = sub_scale(s[j], d);
            y->scales_l[j / 2] |= (uint8_t)((c & 0xF) << (4 * (j % 2)));
            y->scales_h |= (uint16_t)((c >> 4) << (2 * j));
            iq4_codes(x + 32 * j, d * (float)(c - 32), y->qs + 16 * j);
        }
    }
}

void quant_quantize_q3_k(const float *x, struct quant_block_q3_k *out, int64_t n)
{
    for (int64_t b = 0; b < n / QUANT_QK_K; b++, x += QUANT_QK_K) {
        struct quant_block_q3_k *y = &out[b];
        float s[16], smax = 0.0f;
        for (int j = 0; j < 16; j++) {
            s[j] = signed_amax(x + 16 * j, 16) / -4.0f; /* codes -4..3 */
            smax = fmaxf(smax, fabsf(s[j]));
        }
        y->d = f32_to_f16(smax / 32.0f);
        float d = f16_to_f32(y->d), step[16];
        memset(y, 0, offsetof(struct quant_block_q3_k, d));
        for (int j = 0; j < 16; j++) {
            int c = sub_scale(s[j], d);
            y->scales[j < 8 ? j : j - 8] |= (uint8_t)((c & 0xF) << (j < 8 ? 0 : 4));
            y->scales[8 + j % 4] |= (uint8_t)((c >> 4) << (2 * (j / 4)));
            step[j] = d * (float)(c - 32);
        }
        for (int e = 0; e < QUANT_QK_K; e++) {
            int h = e / 128, k = (e % 128) / 32, l = e % 32, j = e / 16;
            int q = step[j] != 0.0f ? clampi((int)lrintf(x[e] / step[j]), -4, 3) : 0;
            int u = q + 4;
            y->qs[32 * h + l] |= (uint8_t)((u & 3) << (2 * k));
            y->hmask[l] |= (uint8_t)((u >> 2) << (4 * h + k));
        }
    }
}

void quant_quantize_q2_k(const float *x, struct quant_block_q2_k *out, int64_t n)
{
    for (int64_t b = 0; b < n / QUANT_QK_K; b++, x += QUANT_QK_K) {
        struct quant_block_q2_k *y = &out[b];
        float sc[16], mn[16], max_sc = 0.0f, max_mn = 0.0f;
        for (int j = 0; j < 16; j++) {
            float lo = 0.0f, hi = 0.0f; /* the offset is stored positive, so lo <= 0 */
            for (int l = 0; l < 16; l++) {
                lo = fminf(lo, x[16 * j + l]);
                hi = fmaxf(hi, x[16 * j + l]);
            }
            sc[j] = (hi - lo) / 3.0f;
            mn[j] = -lo;
            max_sc = fmaxf(max_sc, sc[j]);
            max_mn = fmaxf(max_mn, mn[j]);
        }
        y->d = f32_to_f16(max_sc / 15.0f);
        y->dmin = f32_to_f16(max_mn / 15.0f);
        float d = f16_to_f32(y->d), dmin = f16_to_f32(y->dmin), step[16], off[16];
        for (int j = 0; j < 16; j++) {
            int qs = d > 0.0f ? clampi((int)lrintf(sc[j] / d), 0, 15) : 0;
            int qm = dmin > 0.0f ? clampi((int)lrintf(mn[j] / dmin), 0, 15) : 0;
            if (!qs && sc[j] > 0.0f && d > 0.0f)
                qs = 1;
            y->scales[j] = (uint8_t)(qs | qm << 4);
            step[j] = d * (float)qs;
            off[j] = dmin * (float)qm;
        }
        memset(y->qs, 0, sizeof y->qs);
        for (int e = 0; e < QUANT_QK_K; e++) {
            int h = e / 128, k = (e % 128) / 32, l = e % 32;
            int q = k_code(x[e], step[e / 16], off[e / 16], 3);
            y->qs[32 * h + l] |= (uint8_t)(q << (2 * k));
        }
    }
}

int quant_quantize_row(enum model_dtype dt, const float *x, void *out, int64_t n)
{
    if (!quant_row_bytes(dt, n))
        return -RL_EINVAL;
    switch (dt) {
    case MODEL_Q8_0: quant_quantize_q8_0(x, out, n); return 0;
    case MODEL_Q4_K: quant_quantize_q4_k(x, out, n); return 0;
    case MODEL_Q5_K: quant_quantize_q5_k(x, out, n); return 0;
    case MODEL_Q6_K: quant_quantize_q6_k(x, out, n); return 0;
    case MODEL_Q4_0: quant_quantize_q4_0(x, out, n); return 0;
    case MODEL_Q4_1: quant_quantize_q4_1(x, out, n); return 0;
    case MODEL_Q5_0: quant_quantize_q5_0(x, out, n); return 0;
    case MODEL_Q5_1: quant_quantize_q5_1(x, out, n); return 0;
    case MODEL_IQ4_NL: quant_quantize_iq4_nl(x, out, n); return 0;
    case MODEL_Q2_K: quant_quantize_q2_k(x, out, n); return 0;
    case MODEL_Q3_K: quant_quantize_q3_k(x, out, n); return 0;
    case MODEL_IQ4_XS: quant_quantize_iq4_xs(x, out, n); return 0;
    default: return -RL_EINVAL;
    }
}

int quant_quantize_awq(const float *w, int64_t rows, int64_t cols, int group, int32_t *qweight,
                       int32_t *qzeros, uint16_t *scales)
{
    if (rows <= 0 || cols <= 0 || group <= 0 || rows % 8 || cols % group)
        return -RL_EINVAL;
    int64_t ld = rows / 8, ng = cols / group;
    memset(qweight, 0, (size_t)(cols * ld) * sizeof *qweight);
    memset(qzeros, 0, (size_t)(ng * ld) * sizeof *qzeros);
    for (int64_t r = 0; r < rows; r++) {
        int shift = 4 * QUANT_AWQ_NIBBLE[r % 8];
        for (int64_t g = 0; g < ng; g++) {
            const float *x = w + r * cols + g * group;
            float lo = x[0], hi = x[0];
            for (int i = 1; i < group; i++) {
                lo = fminf(lo, x[i]);
                hi = fmaxf(hi, x[i]);
            }
            uint16_t s16 = f32_to_f16(fmaxf(hi - lo, 1e-5f) / 15.0f);
            float s = f16_to_f32(s16);
            int z = clampi((int)lrintf(-lo / s), 0, 15);
            scales[g * rows + r] = s16;
            qzeros[g * ld + r / 8] |= (int32_t)((uint32_t)z << shift);
            for (int i = 0; i < group; i++) {
                int q = clampi((int)lrintf(x[i] / s) + z, 0, 15);
                int64_t c = g * group + i;
                qweight[c * ld + r / 8] |= (int32_t)((uint32_t)q << shift);
            }
        }
    }
    return 0;
}
