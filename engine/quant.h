/* engine/quant.h - the quantized weight formats redlm reads, as data.
 *
 * Twelve block formats of GGUF files (llama.cpp's ggml layouts, byte for
 * byte, so a GGUF tensor's data is used in place): what Qwen's own GGUF
 * releases and the usual community quantizations (Q4_K_M, Q3_K_M, IQ4_XS,
 * Q4_0, ...) contain, every tensor type of their mixes; and AutoAWQ's INT4
 * GEMM layout. This module owns their definitions: the block records, how many
 * bytes a row takes, and the scalar reference dequantization that every
 * kernel (engine/cpu/, engine/cuda/) and every fidelity test is checked
 * against. It does no I/O and holds no state.
 *
 * Row convention (struct model_tensor): a matrix has `rows` output features
 * and `cols` input features.
 *  - Block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL: blocks of 32;
 *    Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS: super-blocks of 256): each row is
 *    cols / quant_block_elems(dt) consecutive blocks, rows one after
 *    another, exactly GGUF's order for a tensor with ne[0] = cols,
 *    ne[1] = rows. cols must be a multiple of the block size; a loader
 *    refuses other shapes.
 *  - AWQ INT4 (GEMM layout, AutoAWQ WQLinear_GEMM, what Qwen3-*-AWQ ships):
 *    stored transposed and packed: qweight int32 (cols, rows / 8),
 *    qzeros int32 (cols / group, rows / 8), scales f16 (cols / group, rows);
 *    weight[r][c] = (q(c, r) - z(c / group, r)) * s(c / group, r), where the
 *    int32 at [i][r / 8] holds features r = 8j .. 8j + 7 with feature 8j + k
 *    in bits 4 * QUANT_AWQ_NIBBLE[k] .. + 3 (AutoAWQ packs in the order
 *    0, 2, 4, 6, 1, 3, 5, 7).
 *
 * Everything here is plain C: the CUDA code includes it for the layouts. */
#ifndef RL_QUANT_H
#define RL_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

#define QUANT_QK8_0 32  /* elements per Q8_0 block */
#define QUANT_QK_K 256  /* elements per K-quant super-block */
#define QUANT_K_SCALE_BYTES 12 /* Q4_K / Q5_K: 8 six-bit scales + 8 six-bit mins */

/* Q8_0: x[i] = d * qs[i]. 34 bytes per 32 elements. */
struct quant_block_q8_0 {
    uint16_t d;             /* f16 scale */
    int8_t qs[QUANT_QK8_0];
};

/* Q4_K: 8 sub-blocks of 32; sub-block j has a 6-bit scale sc_j and min m_j
 * (quant_k_scale_min); x = d * sc_j * q - dmin * m_j, q in 0..15. Bytes
 * qs[32 * p + l] hold sub-block 2p in the low nibble (element l) and
 * sub-block 2p + 1 in the high nibble. 144 bytes per 256 elements. */
struct quant_block_q4_k {
    uint16_t d;             /* f16 super-block scale of the scales */
    uint16_t dmin;          /* f16 super-block scale of the mins */
    uint8_t scales[QUANT_K_SCALE_BYTES];
    uint8_t qs[QUANT_QK_K / 2];
};

/* Q5_K: Q4_K plus a fifth bit per element: bit (2p) of qh[l] is the high
 * bit of element l of sub-block 2p, bit (2p + 1) that of sub-block 2p + 1;
 * q in 0..31. 176 bytes per 256 elements. */
struct quant_block_q5_k {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[QUANT_K_SCALE_BYTES];
    uint8_t qh[QUANT_QK_K / 8];
    uint8_t qs[QUANT_QK_K / 2];
};

/* Q6_K: 16 sub-blocks of 16 with signed 8-bit scales; q in -32..31
 * (ql: low 4 bits, qh: high 2 bits; layout in quant_dequant_q6_k);
 * x = d * scales[s] * q. 210 bytes per 256 elements. */
struct quant_block_q6_k {
    uint8_t ql[QUANT_QK_K / 2];
    uint8_t qh[QUANT_QK_K / 4];
    int8_t scales[QUANT_QK_K / 16];
    uint16_t d;             /* f16 */
};

/* The 32-element formats keep element l (l < 16) of a block in the low
 * nibble of qs[l] and element l + 16 in its high nibble. */

/* Q4_0: x = d * (q - 8), q in 0..15. 18 bytes per 32 elements. */
struct quant_block_q4_0 {
    uint16_t d;
    uint8_t qs[16];
};

/* Q4_1: x = d * q + m, q in 0..15. 20 bytes per 32 elements. */
struct quant_block_q4_1 {
    uint16_t d;
    uint16_t m;             /* f16 offset (the block's minimum) */
    uint8_t qs[16];
};

/* Q5_0: x = d * (q - 16), q in 0..31; bit e of the little-endian 32-bit
 * qh is the fifth bit of element e. 22 bytes per 32 elements. */
struct quant_block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
};

/* Q5_1: x = d * q + m, q in 0..31, qh as Q5_0's. 24 bytes per 32. */
struct quant_block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[16];
};

/* IQ4_NL: x = d * QUANT_IQ4_VALUES[q], q in 0..15 (a non-linear grid of
 * 16 int8 levels). 18 bytes per 32 elements. */
struct quant_block_iq4_nl {
    uint16_t d;
    uint8_t qs[16];
};

/* The 2- and 3-bit K-quants: 16 sub-blocks of 16. Element c of a
 * super-block (h = c / 128, k = (c % 128) / 32, l = c % 32) keeps its
 * two low bits at bits 2k of qs[32 h + l]; sub-block s = c / 16. */

/* Q2_K: x = d * sc_s * q - dmin * m_s, q in 0..3; scales[s] holds sc_s
 * (low nibble) and m_s (high nibble). 84 bytes per 256 elements. */
struct quant_block_q2_k {
    uint8_t scales[16];
    uint8_t qs[64];
    uint16_t d;
    uint16_t dmin;
};

/* Q3_K: x = d * (sc_s - 32) * q, q = the two low bits less 4 unless bit
 * 4h + k of hmask[l] is set (q in -4..3); sc_s 6 bits (quant_q3_k_scale).
 * 110 bytes per 256 elements. */
struct quant_block_q3_k {
    uint8_t hmask[32];
    uint8_t qs[64];
    uint8_t scales[12];
    uint16_t d;
};

/* IQ4_XS: 8 sub-blocks of 32 with 6-bit scales ls_j (low 4 bits: nibble
 * j % 2 of scales_l[j / 2]; high 2 bits: bits 2j of scales_h);
 * x = d * (ls_j - 32) * QUANT_IQ4_VALUES[q]; the codes of sub-block j are
 * qs[16 j ..] in IQ4_NL's nibble order. 136 bytes per 256 elements. */
struct quant_block_iq4_xs {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[4];
    uint8_t qs[128];
};

/* C11's _Static_assert is static_assert in the C++ nvcc compiles .cu as */
#ifdef __cplusplus
#define QUANT_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define QUANT_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif
QUANT_STATIC_ASSERT(sizeof(struct quant_block_q8_0) == 34, "Q8_0 block is 34 bytes");
QUANT_STATIC_ASSERT(sizeof(struct quant_block_q4_k) == 144, "Q4_K block is 144 bytes");
QUANT_STATIC_ASSERT(sizeof(struct quant_block_q5_k) == 176, "Q5_K block is 176 bytes");
QUANT_STATIC_ASSERT(sizeof(struct quant_block_q6_k) == 210, "Q6_K block is 210 bytes");
QUANT_STATIC_ASSERT(sizeof(struct quant_block_q4_0) == 18, "Q4_0 block is 18 bytes");
QUANT_STATIC_ASSERT(sizeof(struct quant_block_q4_1) == 20, "Q4_1 block is 20 bytes");
QUANT_STATIC_ASSERT(sizeof(struct quant_block_q5_0) == 22, "Q5_0 block is 22 bytes");
QUANT_STATIC_ASSERT(sizeof(struct quant_block_q5_1) == 24, "Q5_1 block is 24 bytes");
QUANT_STATIC_ASSERT(sizeof(struct quant_block_iq4_nl) == 18, "IQ4_NL block is 18 bytes");
QUANT_STATIC_ASSERT(sizeof(struct quant_block_q2_k) == 84, "Q2_K block is 84 bytes");
QUANT_STATIC_ASSERT(sizeof(struct quant_block_q3_k) == 110, "Q3_K block is 110 bytes");
QUANT_STATIC_ASSERT(sizeof(struct quant_block_iq4_xs) == 136, "IQ4_XS block is 136 bytes");

/* IQ4_NL's and IQ4_XS's 16 levels (ggml's kvalues_iq4nl). */
extern const int8_t QUANT_IQ4_VALUES[16];

/* AutoAWQ's nibble of feature 8j + k inside a packed int32 (see above). */
extern const int QUANT_AWQ_NIBBLE[8];

/* 1 when dt is one of this module's formats (the GGUF blocks and AWQ4). */
int quant_is_quantized(enum model_dtype dt);
/* Elements per block of a block format (32 or 256); 1 for AWQ4 and the
 * plain dtypes. */
int quant_block_elems(enum model_dtype dt);
/* Bytes per block of a block format; 0 for others. */
size_t quant_block_bytes(enum model_dtype dt);
/* Bytes one row of n elements takes in a block format (n a multiple of the
 * block); 0 when n is not, or dt is not a block format. */
size_t quant_row_bytes(enum model_dtype dt, int64_t n);

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block. */
void quant_k_scale_min(const uint8_t scales[QUANT_K_SCALE_BYTES], int j, uint8_t *sc,
                       uint8_t *m);

/* The 6-bit scale (0..63, before the - 32) of sub-block s (0..15) of a
 * Q3_K block: low 4 bits from a nibble of bytes 0..7, high 2 from bytes
 * 8..11. */
int quant_q3_k_scale(const uint8_t scales[12], int s);
/* The code (-4..3) of element e (0..255) of a Q3_K block. */
int quant_q3_k_code(const struct quant_block_q3_k *b, int e);
/* Sets element e of a Q6_K block whose ql and qh were zeroed to code q
 * (-32..31): the inverse of quant_dequant_q6_k's indexing. */
void quant_q6_k_put(struct quant_block_q6_k *b, int e, int q);
/* The 6-bit scale (0..63, before the - 32) of sub-block j of an IQ4_XS
 * block. */
int quant_iq4_xs_scale(const struct quant_block_iq4_xs *b, int j);

/* Reference dequantization of n elements (a multiple of the block) of one
 * row of blocks into out (n floats). Arithmetic in float, in the order the
 * format's definition gives, so kernels can be checked against it. */
void quant_dequant_q8_0(const struct quant_block_q8_0 *x, float *out, int64_t n);
void quant_dequant_q4_k(const struct quant_block_q4_k *x, float *out, int64_t n);
void quant_dequant_q5_k(const struct quant_block_q5_k *x, float *out, int64_t n);
void quant_dequant_q6_k(const struct quant_block_q6_k *x, float *out, int64_t n);
void quant_dequant_q4_0(const struct quant_block_q4_0 *x, float *out, int64_t n);
void quant_dequant_q4_1(const struct quant_block_q4_1 *x, float *out, int64_t n);
void quant_dequant_q5_0(const struct quant_block_q5_0 *x, float *out, int64_t n);
void quant_dequant_q5_1(const struct quant_block_q5_1 *x, float *out, int64_t n);
void quant_dequant_iq4_nl(const struct quant_block_iq4_nl *x, float *out, int64_t n);
void quant_dequant_q2_k(const struct quant_block_q2_k *x, float *out, int64_t n);
void quant_dequant_q3_k(const struct quant_block_q3_k *x, float *out, int64_t n);
void quant_dequant_iq4_xs(const struct quant_block_iq4_xs *x, float *out, int64_t n);
/* Any block format dt (a row of n elements at x). Returns 0, or -RL_EINVAL
 * when dt is not a block format or n not a multiple of its block. */
int quant_dequant_blocks(enum model_dtype dt, const void *x, float *out, int64_t n);

/* Row r (an output feature, cols floats into out) of a quantized matrix t:
 * any block format or AWQ4 (then t->awq_* are used). Returns 0, or
 * -RL_EINVAL when t's dtype is not quantized or r is out of range. */
int quant_dequant_row(const struct model_tensor *t, int64_t r, float *out);

/* ---- reference quantizers (the model maker, tests, --quantize at load) ----
 *
 * Deterministic and simple rather than optimal: each sub-block's scale
 * (and min) comes straight from its range, with no search for the scale
 * that minimises the error as llama.cpp's make_qkx2_quants does. The
 * blocks they write are valid in every reader; their error is within a
 * few per cent of llama.cpp's (tests/unit/test_quant.c states the bounds).
 * n is a multiple of the block size; out holds n / block blocks. */
void quant_quantize_q8_0(const float *x, struct quant_block_q8_0 *out, int64_t n);
void quant_quantize_q4_k(const float *x, struct quant_block_q4_k *out, int64_t n);
void quant_quantize_q5_k(const float *x, struct quant_block_q5_k *out, int64_t n);
void quant_quantize_q6_k(const float *x, struct quant_block_q6_k *out, int64_t n);
void quant_quantize_q4_0(const float *x, struct quant_block_q4_0 *out, int64_t n);
void quant_quantize_q4_1(const float *x, struct quant_block_q4_1 *out, int64_t n);
void quant_quantize_q5_0(const float *x, struct quant_block_q5_0 *out, int64_t n);
void quant_quantize_q5_1(const float *x, struct quant_block_q5_1 *out, int64_t n);
void quant_quantize_iq4_nl(const float *x, struct quant_block_iq4_nl *out, int64_t n);
void quant_quantize_q2_k(const float *x, struct quant_block_q2_k *out, int64_t n);
void quant_quantize_q3_k(const float *x, struct quant_block_q3_k *out, int64_t n);
void quant_quantize_iq4_xs(const float *x, struct quant_block_iq4_xs *out, int64_t n);

/* One row of n floats into block format dt (quant_row_bytes(dt, n) bytes at
 * out). Returns 0, or -RL_EINVAL when dt is not a block format or n is not
 * a multiple of its block. */
int quant_quantize_row(enum model_dtype dt, const float *x, void *out, int64_t n);

/* AutoAWQ's asymmetric INT4 quantization of a (rows, cols) row-major matrix
 * w, in groups of `group` along cols (AutoAWQ's pseudo_quantize_tensor:
 * scale = max(max - min, 1e-5) / 15, zero = clamp(round(-min / scale), 0,
 * 15), q = clamp(round(w / scale) + zero, 0, 15)), packed in the GEMM
 * layout above: qweight (cols, rows / 8), qzeros (cols / group, rows / 8),
 * scales (cols / group, rows) f16. Returns 0, or -RL_EINVAL when rows is
 * not a multiple of 8 or cols of group. */
int quant_quantize_awq(const float *w, int64_t rows, int64_t cols, int group, int32_t *qweight,
                       int32_t *qzeros, uint16_t *scales);

#endif
