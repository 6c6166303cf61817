/* engine/quant.c - block sizes and reference dequantization of the
 * quantized formats (definitions in quant.h).
 *
 * These loops are the formats' definitions written out once, in float and
 * in the order llama.cpp's reference (dequantize_row_*) uses, so that the
 * fast kernels and the fidelity tests have one thing to agree with. They
 * are not for hot paths. Any thread; no state. */
#include "quant.h"

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
