/* tests/unit/test_quant.c - the quantized formats of engine/quant.h against
 * their definitions.
 *
 * Dequantization: hand-made blocks with known values. Each format's
 * expected values come from a formula written here independently of
 * quant.c, straight from the format's definition (ggml's
 * dequantize_row_* in ggml-quants.c and block_* in ggml-common.h; AutoAWQ's
 * WQLinear_GEMM packing), plus literal values worked out by hand for a few
 * elements, the K-quant super-block scales and mins included. Then the
 * reference quantizers: round trips within stated error bounds, the f16
 * conversion, and the row helpers' argument checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "quant.h"
#include "test_util.h"

/* f16 bit patterns of a few exact values */
#define H_0_125 0x3000
#define H_0_25 0x3400
#define H_0_5 0x3800
#define H_1 0x3C00
#define H_2 0x4000

static void test_sizes(void **state)
{
    (void)state;
    assert_int_equal(quant_block_elems(MODEL_Q8_0), 32);
    assert_int_equal(quant_block_elems(MODEL_Q4_K), 256);
    assert_int_equal(quant_block_elems(MODEL_Q6_K), 256);
    assert_int_equal(quant_block_elems(MODEL_BF16), 1);
    assert_int_equal(quant_block_bytes(MODEL_Q8_0), 34);
    assert_int_equal(quant_block_bytes(MODEL_Q4_K), 144);
    assert_int_equal(quant_block_bytes(MODEL_Q5_K), 176);
    assert_int_equal(quant_block_bytes(MODEL_Q6_K), 210);
    assert_int_equal(quant_row_bytes(MODEL_Q8_0, 4096), 128 * 34);
    assert_int_equal(quant_row_bytes(MODEL_Q4_K, 5120), 20 * 144);
    assert_int_equal(quant_row_bytes(MODEL_Q4_K, 5000), 0); /* not whole blocks */
    assert_int_equal(quant_row_bytes(MODEL_BF16, 256), 0);
    assert_int_equal(quant_row_bytes(MODEL_AWQ4, 256), 0);
    assert_true(quant_is_quantized(MODEL_AWQ4));
    assert_true(quant_is_quantized(MODEL_Q5_K));
    assert_false(quant_is_quantized(MODEL_F8_E4M3));
    /* the field offsets ggml's structs have (a GGUF block is read in place) */
    assert_int_equal(offsetof(struct quant_block_q4_k, scales), 4);
    assert_int_equal(offsetof(struct quant_block_q4_k, qs), 16);
    assert_int_equal(offsetof(struct quant_block_q5_k, qh), 16);
    assert_int_equal(offsetof(struct quant_block_q5_k, qs), 48);
    assert_int_equal(offsetof(struct quant_block_q6_k, qh), 128);
    assert_int_equal(offsetof(struct quant_block_q6_k, scales), 192);
    assert_int_equal(offsetof(struct quant_block_q6_k, d), 208);
}

static void test_f16(void **state)
{
    (void)state;
    static const struct {
        float f;
        uint16_t h;
    } cases[] = {
        {0.0f, 0x0000},        {-0.0f, 0x8000},    {1.0f, 0x3C00},     {-2.0f, 0xC000},
        {0.5f, 0x3800},        {65504.0f, 0x7BFF}, {65520.0f, 0x7C00}, {1e9f, 0x7C00},
        {6.103515625e-05f, 0x0400},  /* smallest normal */
        {5.960464477539063e-08f, 0x0001}, /* smallest subnormal */
        {2.98e-08f, 0x0000},   /* below half the smallest subnormal */
        {1.0009765625f, 0x3C01},
        {1.00048828125f, 0x3C00}, /* a tie rounds to even */
        {1.00146484375f, 0x3C02}, /* a tie rounds to even (up) */
        {0.1f, 0x2E66},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t h = f32_to_f16(cases[i].f);
        if (h != cases[i].h)
            fail_msg("f32_to_f16(%g) = 0x%04x, want 0x%04x", cases[i].f, h, cases[i].h);
    }
    /* every finite f16 survives the trip through f32 */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7C00) == 0x7C00)
            continue;
        uint16_t back = f32_to_f16(f16_to_f32((uint16_t)h));
        if (back != h)
            fail_msg("f16 0x%04x -> %g -> 0x%04x", h, f16_to_f32((uint16_t)h), back);
    }
    assert_true(isnan(f16_to_f32(f32_to_f16(NAN))));
}

static void test_q8_0(void **state)
{
    (void)state;
    struct quant_block_q8_0 b[2];
    b[0].d = H_0_5;
    b[1].d = H_2;
    for (int i = 0; i < 32; i++) {
        b[0].qs[i] = (int8_t)(i * 8 - 128);
        b[1].qs[i] = (int8_t)(127 - i);
    }
    float out[64];
    quant_dequant_q8_0(b, out, 64);
    for (int i = 0; i < 32; i++) {
        assert_true(out[i] == 0.5f * (float)(i * 8 - 128));
        assert_true(out[32 + i] == 2.0f * (float)(127 - i));
    }
    assert_true(out[0] == -64.0f);
    assert_true(out[63] == 192.0f);
}

/* The 12 scale bytes used by the Q4_K and Q5_K blocks below, and the
 * (scale, min) of each sub-block worked out by hand from the layout:
 * sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins);
 * 4-7 in the nibbles of bytes 8-11, their top two bits in the high bits of
 * bytes 0-3 (scales) and 4-7 (mins). */
static const uint8_t KS[12] = {0x41, 0x02, 0xC3, 0x04, 0x05, 0x86, 0x07, 0x48,
                               0x9A, 0xBC, 0xDE, 0xF1};
static const uint8_t KS_SC[8] = {1, 2, 3, 4, 26, 12, 62, 1};
static const uint8_t KS_M[8] = {5, 6, 7, 8, 9, 43, 13, 31};

static void test_k_scale_min(void **state)
{
    (void)state;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        quant_k_scale_min(KS, j, &sc, &m);
        if (sc != KS_SC[j] || m != KS_M[j])
            fail_msg("sub-block %d: scale %d min %d, want %d %d", j, sc, m, KS_SC[j], KS_M[j]);
    }
}

static void test_q4_k(void **state)
{
    (void)state;
    struct quant_block_q4_k b;
    b.d = H_0_25;
    b.dmin = H_0_125;
    memcpy(b.scales, KS, 12);
    for (int i = 0; i < 128; i++)
        b.qs[i] = (uint8_t)(i * 29 + 7);
    float out[256];
    quant_dequant_q4_k(&b, out, 256);
    /* element 32 j + l of sub-block j: byte qs[32 (j / 2) + l], low nibble
     * for even j, high for odd; x = d * scale_j * q - dmin * min_j */
    for (int e = 0; e < 256; e++) {
        int j = e / 32, l = e % 32;
        uint8_t byte = b.qs[32 * (j / 2) + l];
        int q = j % 2 ? byte >> 4 : byte & 15;
        double want = 0.25 * KS_SC[j] * q - 0.125 * KS_M[j];
        if (fabs(out[e] - want) > 1e-6)
            fail_msg("Q4_K element %d: %g, want %g", e, out[e], want);
    }
    /* by hand: e0: qs[0] = 7 -> 0.25*1*7 - 0.125*5; e32: high nibble of 7
     * is 0 -> -0.125*6; e133 (sub-block 4, l 5): qs[69] = 0xD8, low 8 ->
     * 0.25*26*8 - 0.125*9; e255: qs[127] = 0x6A, high 6 -> 0.25*1*6 - 0.125*31 */
    assert_true(out[0] == 1.125f);
    assert_true(out[32] == -0.75f);
    assert_true(out[133] == 50.875f);
    assert_true(out[255] == -2.375f);
}

static void test_q5_k(void **state)
{
    (void)state;
    struct quant_block_q5_k b;
    b.d = H_0_25;
    b.dmin = H_0_125;
    memcpy(b.scales, KS, 12);
    for (int i = 0; i < 128; i++)
        b.qs[i] = (uint8_t)(i * 29 + 7);
    for (int i = 0; i < 32; i++)
        b.qh[i] = (uint8_t)(i * 53 + 1);
    float out[256];
    quant_dequant_q5_k(&b, out, 256);
    /* Q4_K's low four bits; the fifth bit of element l of sub-block j is
     * bit j of qh[l] */
    for (int e = 0; e < 256; e++) {
        int j = e / 32, l = e % 32;
        uint8_t byte = b.qs[32 * (j / 2) + l];
        int q = (j % 2 ? byte >> 4 : byte & 15) + 16 * ((b.qh[l] >> j) & 1);
        double want = 0.25 * KS_SC[j] * q - 0.125 * KS_M[j];
        if (fabs(out[e] - want) > 1e-6)
            fail_msg("Q5_K element %d: %g, want %g", e, out[e], want);
    }
    /* by hand: e0: qh[0] = 1, bit 0 set -> q = 7 + 16 = 23 ->
     * 0.25*1*23 - 0.125*5; e255: qh[31] = 0x6C, bit 7 clear -> q = 6 */
    assert_true(out[0] == 5.125f);
    assert_true(out[255] == -2.375f);
}

static void test_q6_k(void **state)
{
    (void)state;
    struct quant_block_q6_k b[2];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 128; i++)
            b[k].ql[i] = (uint8_t)(i * 13 + 1 + k);
        for (int i = 0; i < 64; i++)
            b[k].qh[i] = (uint8_t)(i * 7 + 3 + k);
        for (int i = 0; i < 16; i++)
            b[k].scales[i] = (int8_t)(i * 9 - 70 + k);
    }
    b[0].d = H_0_5;
    b[1].d = H_1;
    float out[512];
    quant_dequant_q6_k(b, out, 512);
    /* element n = 128 h + 32 k + l: low four bits in ql[64 h + l + 32 (k & 1)]
     * (low nibble for k < 2, high for k >= 2), top two bits at bit 2k of
     * qh[32 h + l], scale scales[n / 16], q - 32 */
    for (int blk = 0; blk < 2; blk++)
        for (int n = 0; n < 256; n++) {
            const struct quant_block_q6_k *x = &b[blk];
            int h = n / 128, k = (n % 128) / 32, l = n % 32;
            uint8_t lb = x->ql[64 * h + l + 32 * (k & 1)];
            int lo = k < 2 ? lb & 15 : lb >> 4, hi = (x->qh[32 * h + l] >> (2 * k)) & 3;
            double want = f16_to_f32(x->d) * x->scales[n / 16] * ((lo | hi << 4) - 32);
            if (fabs(out[256 * blk + n] - want) > 1e-6)
                fail_msg("Q6_K block %d element %d: %g, want %g", blk, n, out[256 * blk + n], want);
        }
    /* by hand: e0: ql[0] = 1, qh[0] = 3 -> q = (1 | 3 << 4) - 32 = 17,
     * scale -70 -> 0.5*-70*17; e100 (h 0, k 3, l 4): ql[36] = 0xD5 high
     * 13, qh[4] = 31 bits 6-7 = 0 -> q = -19, scale[6] = -16 -> 152 */
    assert_true(out[0] == -595.0f);
    assert_true(out[100] == 152.0f);
}

/* AutoAWQ packs features 8j + order[i] into nibble i of int32 j (its
 * AWQ_ORDER), the inverse of QUANT_AWQ_NIBBLE. */
static const int AWQ_ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7};

static void test_awq(void **state)
{
    (void)state;
    enum { ROWS = 16, COLS = 4, GROUP = 2 };
    int q[ROWS][COLS], z[COLS / GROUP][ROWS];
    int32_t qweight[COLS][ROWS / 8] = {{0}}, qzeros[COLS / GROUP][ROWS / 8] = {{0}};
    uint16_t scales[COLS / GROUP][ROWS];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++)
            q[r][c] = (r * 5 + c * 3) % 16;
    for (int g = 0; g < COLS / GROUP; g++)
        for (int r = 0; r < ROWS; r++) {
            z[g][r] = (r + 7 * g) % 16;
            scales[g][r] = r % 2 ? H_0_5 : H_0_25;
        }
    for (int c = 0; c < COLS; c++)
        for (int j = 0; j < ROWS / 8; j++)
            for (int i = 0; i < 8; i++) {
                qweight[c][j] |= (int32_t)((uint32_t)q[8 * j + AWQ_ORDER[i]][c] << (4 * i));
                if (c < COLS / GROUP)
                    qzeros[c][j] |= (int32_t)((uint32_t)z[c][8 * j + AWQ_ORDER[i]] << (4 * i));
            }
    for (int i = 0; i < 8; i++)
        assert_int_equal(QUANT_AWQ_NIBBLE[AWQ_ORDER[i]], i);
    struct model_tensor t = {.dtype = MODEL_AWQ4, .rows = ROWS, .cols = COLS,
                             .data = qweight, .awq_qzeros = &qzeros[0][0],
                             .awq_scales = &scales[0][0], .awq_group = GROUP};
    for (int r = 0; r < ROWS; r++) {
        float out[COLS];
        assert_int_equal(quant_dequant_row(&t, r, out), 0);
        for (int c = 0; c < COLS; c++) {
            double want = (q[r][c] - z[c / GROUP][r]) * (r % 2 ? 0.5 : 0.25);
            if (out[c] != want)
                fail_msg("AWQ (%d, %d): %g, want %g", r, c, out[c], want);
        }
    }
    /* by hand: row 1, col 0: q = 5, zero = 1, scale 0.5 -> 2; its int32
     * qweight[0][0] holds feature 1 in nibble 4 */
    assert_int_equal(((uint32_t)qweight[0][0] >> 16) & 15, 5);
    float row1[COLS];
    quant_dequant_row(&t, 1, row1);
    assert_true(row1[0] == 2.0f);
    /* argument checks */
    assert_int_equal(quant_dequant_row(&t, ROWS, row1), -RL_EINVAL);
    assert_int_equal(quant_dequant_row(&t, -1, row1), -RL_EINVAL);
    t.awq_group = 3;
    assert_int_equal(quant_dequant_row(&t, 0, row1), -RL_EINVAL);
    struct model_tensor bf = {.dtype = MODEL_BF16, .rows = 1, .cols = 4, .data = scales};
    assert_int_equal(quant_dequant_row(&bf, 0, row1), -RL_EINVAL);
}

/* A row of blocks through quant_dequant_row, against the per-format call. */
static void test_dequant_row(void **state)
{
    (void)state;
    struct quant_block_q8_0 b[4];
    for (int k = 0; k < 4; k++) {
        b[k].d = f32_to_f16(0.01f * (float)(k + 1));
        for (int i = 0; i < 32; i++)
            b[k].qs[i] = (int8_t)(i - 16 + k);
    }
    struct model_tensor t = {.dtype = MODEL_Q8_0, .rows = 2, .cols = 64, .data = b};
    float a[64], want[64];
    assert_int_equal(quant_dequant_row(&t, 1, a), 0);
    quant_dequant_q8_0(b + 2, want, 64);
    assert_memory_equal(a, want, sizeof a);
    t.cols = 48; /* not whole blocks */
    assert_int_equal(quant_dequant_row(&t, 0, a), -RL_EINVAL);
}

/* ---- quantizers ---- */

/* Deterministic test values: a smooth wave plus an outlier per 256, like
 * the heavy-tailed rows of real weights. */
static void fill(float *x, int n, unsigned seed)
{
    uint32_t s = seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float u = (float)(s >> 8) / 16777216.0f - 0.5f;
        x[i] = 0.05f * u + 0.02f * sinf(0.37f * (float)i);
        if (i % 256 == 77)
            x[i] *= 6.0f;
    }
}

static double rel_rms(const float *a, const float *b, int n)
{
    double e = 0, s = 0;
    for (int i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)a[i] * a[i];
    }
    return sqrt(e / s);
}

static void test_quantize_round_trip(void **state)
{
    (void)state;
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t buf[N * 2];
    fill(x, N, 1);
    /* bounds: the figures measured when this was written (Q8_0 0.0063,
     * Q6_K 0.021, Q5_K 0.039, Q4_K 0.080 on these values, whose one 6x
     * outlier per 256 widens its block's grid; Q4_0 0.100, Q4_1 0.079,
     * Q5_0 0.050, Q5_1 0.039, IQ4_NL 0.087, Q2_K 0.344, Q3_K 0.171,
     * IQ4_XS 0.088) plus ~25%; each format roughly halves the error of the
     * one with one bit less, as it should */
    static const struct {
        enum model_dtype dt;
        double bound;
    } fmts[] = {{MODEL_Q8_0, 0.008}, {MODEL_Q6_K, 0.027}, {MODEL_Q5_K, 0.05}, {MODEL_Q4_K, 0.1},
                {MODEL_Q4_0, 0.125}, {MODEL_Q4_1, 0.1}, {MODEL_Q5_0, 0.063}, {MODEL_Q5_1, 0.05},
                {MODEL_IQ4_NL, 0.11}, {MODEL_Q2_K, 0.43}, {MODEL_Q3_K, 0.22}, {MODEL_IQ4_XS, 0.11}};
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        struct model_tensor t = {.dtype = fmts[f].dt, .rows = 1, .cols = N, .data = buf};
        assert_int_equal(quant_quantize_row(fmts[f].dt, x, buf, N), 0);
        assert_int_equal(quant_dequant_row(&t, 0, y), 0);
        double e = rel_rms(x, y, N);
        printf("  %s round trip: relative rms error %.4f (bound %.3f)\n",
               model_dtype_name(fmts[f].dt), e, fmts[f].bound);
        if (e > fmts[f].bound)
            fail_msg("%s: relative rms error %g > %g", model_dtype_name(fmts[f].dt), e, fmts[f].bound);
        /* quantizing the dequantized values again changes nothing much:
         * the codes are stable under the format's own grid */
        static uint8_t buf2[N * 2];
        static float y2[N];
        quant_quantize_row(fmts[f].dt, y, buf2, N);
        t.data = buf2;
        quant_dequant_row(&t, 0, y2);
        assert_true(rel_rms(y, y2, N) < fmts[f].bound);
    }
    /* all-zero and constant rows: exact */
    memset(x, 0, sizeof x);
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        struct model_tensor t = {.dtype = fmts[f].dt, .rows = 1, .cols = N, .data = buf};
        quant_quantize_row(fmts[f].dt, x, buf, N);
        quant_dequant_row(&t, 0, y);
        for (int i = 0; i < N; i++)
            assert_true(y[i] == 0.0f);
    }
    assert_int_equal(quant_quantize_row(MODEL_Q4_K, x, buf, 100), -RL_EINVAL);
    assert_int_equal(quant_quantize_row(MODEL_BF16, x, buf, 256), -RL_EINVAL);
}

/* The Q8_0 quantizer's per-element error is at most half a step. */
static void test_q8_0_bound(void **state)
{
    (void)state;
    float x[256], y[256];
    struct quant_block_q8_0 b[8];
    fill(x, 256, 7);
    quant_quantize_q8_0(x, b, 256);
    quant_dequant_q8_0(b, y, 256);
    for (int i = 0; i < 256; i++) {
        float d = f16_to_f32(b[i / 32].d);
        if (fabsf(x[i] - y[i]) > 0.5f * d * 1.01f + 1e-9f)
            fail_msg("Q8_0 element %d: |%g - %g| > d/2 = %g", i, x[i], y[i], 0.5f * d);
    }
}

static void test_awq_quantize(void **state)
{
    (void)state;
    enum { ROWS = 64, COLS = 256, GROUP = 128 };
    static float w[ROWS * COLS], back[ROWS * COLS];
    static int32_t qw[COLS * ROWS / 8], qz[COLS / GROUP * ROWS / 8];
    static uint16_t sc[COLS / GROUP * ROWS];
    fill(w, ROWS * COLS, 3);
    assert_int_equal(quant_quantize_awq(w, ROWS, COLS, GROUP, qw, qz, sc), 0);
    struct model_tensor t = {.dtype = MODEL_AWQ4, .rows = ROWS, .cols = COLS, .data = qw,
                             .awq_qzeros = qz, .awq_scales = sc, .awq_group = GROUP};
    for (int r = 0; r < ROWS; r++)
        assert_int_equal(quant_dequant_row(&t, r, back + r * COLS), 0);
    double e = rel_rms(w, back, ROWS * COLS);
    printf("  AWQ4 g128 round trip: relative rms error %.4f\n", e);
    assert_true(e < 0.14); /* 0.115 measured: groups of 128 hold the outliers */
    /* each element within half a step plus the zero point's rounding */
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++) {
            float s = f16_to_f32(sc[(c / GROUP) * ROWS + r]);
            if (fabsf(w[r * COLS + c] - back[r * COLS + c]) > 1.01f * s)
                fail_msg("AWQ (%d, %d): error %g > step %g", r, c,
                         fabsf(w[r * COLS + c] - back[r * COLS + c]), s);
        }
    assert_int_equal(quant_quantize_awq(w, 60, COLS, GROUP, qw, qz, sc), -RL_EINVAL);
    assert_int_equal(quant_quantize_awq(w, ROWS, 200, GROUP, qw, qz, sc), -RL_EINVAL);
}

/* ---- against ggml itself ----
 *
 * tests/data/quant/ggml_blocks.json: blocks and the floats ggml's
 * dequantize_row_* makes of them (tests/data/quant/README.md). The
 * dequantizers must give the same floats bit for bit: the same arithmetic
 * in the same order (this file is built with -std=c11, no contraction). */

static const struct {
    const char *name;
    enum model_dtype dt;
} GGML_FMTS[] = {
    {"Q4_0", MODEL_Q4_0}, {"Q4_1", MODEL_Q4_1}, {"Q5_0", MODEL_Q5_0},     {"Q5_1", MODEL_Q5_1},
    {"Q8_0", MODEL_Q8_0}, {"Q2_K", MODEL_Q2_K}, {"Q3_K", MODEL_Q3_K},     {"Q4_K", MODEL_Q4_K},
    {"Q5_K", MODEL_Q5_K}, {"Q6_K", MODEL_Q6_K}, {"IQ4_NL", MODEL_IQ4_NL}, {"IQ4_XS", MODEL_IQ4_XS},
};

static size_t unhex(const char *h, uint8_t *out, size_t cap)
{
    size_t n = strlen(h) / 2;
    assert_true(n <= cap);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        assert_int_equal(sscanf(h + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
    return n;
}

static void floats(const cJSON *a, float *out, int n)
{
    assert_int_equal(cJSON_GetArraySize(a), n);
    for (int i = 0; i < n; i++)
        out[i] = (float)cJSON_GetArrayItem(a, i)->valuedouble;
}

static void test_ggml_reference(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/quant/ggml_blocks.json", tu_data_dir());
    cJSON *root = tu_read_json(path);
    assert_non_null(root);
    const cJSON *f, *fmts = cJSON_GetObjectItemCaseSensitive(root, "formats");
    int seen = 0;
    cJSON_ArrayForEach(f, fmts) {
        const char *name = cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring;
        size_t k = 0;
        while (k < sizeof GGML_FMTS / sizeof GGML_FMTS[0] && strcmp(GGML_FMTS[k].name, name))
            k++;
        if (k == sizeof GGML_FMTS / sizeof GGML_FMTS[0])
            fail_msg("ggml_blocks.json: format %s is not one redlm reads", name);
        enum model_dtype dt = GGML_FMTS[k].dt;
        seen++;
        assert_int_equal(quant_block_elems(dt), cJSON_GetObjectItemCaseSensitive(f, "block_elems")->valueint);
        assert_int_equal(quant_block_bytes(dt), cJSON_GetObjectItemCaseSensitive(f, "block_bytes")->valueint);
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(f, "cases")) {
            const char *cname = cJSON_GetObjectItemCaseSensitive(c, "case")->valuestring;
            int n = cJSON_GetObjectItemCaseSensitive(c, "n")->valueint;
            static uint8_t blk[4096];
            static float want[1024], got[1024], in[1024];
            assert_true(n <= 1024);
            size_t nb = unhex(cJSON_GetObjectItemCaseSensitive(c, "blocks_hex")->valuestring, blk, sizeof blk);
            assert_int_equal(nb, quant_row_bytes(dt, n));
            floats(cJSON_GetObjectItemCaseSensitive(c, "dequant"), want, n);
            assert_int_equal(quant_dequant_blocks(dt, blk, got, n), 0);
            for (int i = 0; i < n; i++)
                if (memcmp(&got[i], &want[i], sizeof got[i]))
                    fail_msg("%s %s element %d: %.9g, ggml %.9g", name, cname, i, got[i], want[i]);
            const cJSON *input = cJSON_GetObjectItemCaseSensitive(c, "input");
            if (!input)
                continue;
            /* our reference quantizer on ggml's input: its error stays
             * within a bound of ggml's own (make_qkx2_quants and friends
             * search for better scales; ours take them from the range) */
            floats(input, in, n);
            assert_int_equal(quant_quantize_row(dt, in, blk, n), 0);
            assert_int_equal(quant_dequant_blocks(dt, blk, got, n), 0);
            double ours = rel_rms(in, got, n), theirs = rel_rms(in, want, n);
            printf("  %-6s relative rms error: ours %.4f, ggml's %.4f (%.2fx)\n", name, ours, theirs,
                   ours / theirs);
            if (ours > 1.6 * theirs)
                fail_msg("%s: our quantizer's error %g > 1.6 x ggml's %g", name, ours, theirs);
        }
    }
    assert_int_equal(seen, (int)(sizeof GGML_FMTS / sizeof GGML_FMTS[0]));
    cJSON_Delete(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_q8_0),
        cmocka_unit_test(test_k_scale_min),
        cmocka_unit_test(test_q4_k),
        cmocka_unit_test(test_q5_k),
        cmocka_unit_test(test_q6_k),
        cmocka_unit_test(test_awq),
        cmocka_unit_test(test_dequant_row),
        cmocka_unit_test(test_quantize_round_trip),
        cmocka_unit_test(test_q8_0_bound),
        cmocka_unit_test(test_awq_quantize),
        cmocka_unit_test(test_ggml_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
