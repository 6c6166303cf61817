/* engine/quant.c - block sizes and reference dequantization of the
 * quantized formats (definitions in quant.h).
 *
 * These loops are the formats' definitions written out once, in float and
 * in the order llama.cpp's reference (dequantize_row_*) uses, so that the
 * fast kernels and the fidelity tests have one thing to agree with. They
 * are not for hot paths. Any thread; no state. */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "dtype.h"
#include "err.h"

const int QUANT_AWQ_NIBBLE[8] = {0, 4, 1, 5, 2, 6, 3, 7};

int quant_is_quantized(enum model_dtype dt)
{
    switch (dt) {
    case MODEL_Q8_0:
    case MODEL_Q4_K:
    case MODEL_Q5_K:
    case MODEL_Q6_K:
    case MODEL_AWQ4: return 1;
    default: return 0;
    }
}

int quant_block_elems(enum model_dtype dt)
{
    switch (dt) {
    case MODEL_Q8_0: return QUANT_QK8_0;
    case MODEL_Q4_K:
    case MODEL_Q5_K:
    case MODEL_Q6_K: return QUANT_QK_K;
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
    const void *row = (const char *)t->data + (size_t)r * rb;
    switch (t->dtype) {
    case MODEL_Q8_0: quant_dequant_q8_0(row, out, t->cols); break;
    case MODEL_Q4_K: quant_dequant_q4_k(row, out, t->cols); break;
    case MODEL_Q5_K: quant_dequant_q5_k(row, out, t->cols); break;
    case MODEL_Q6_K: quant_dequant_q6_k(row, out, t->cols); break;
    default: return -RL_EINVAL;
    }
    return 0;
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
        /* element 128 h + 32 k + l: see quant_dequant_q6_k */
        for (int e = 0; e < QUANT_QK_K; e++) {
            int h = e / 128, k = (e % 128) / 32, l = e % 32, s = e / 16;
            int q = step[s] > 0.0f ? clampi((int)lrintf(x[e] / step[s]), -32, 31) : 0;
            int u = q + 32;
            y->ql[64 * h + l + 32 * (k & 1)] |= (uint8_t)((u & 0xF) << (k < 2 ? 0 : 4));
            y->qh[32 * h + l] |= (uint8_t)((u >> 4) << (2 * k));
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
