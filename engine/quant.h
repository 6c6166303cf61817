/* engine/quant.h - the quantized weight formats redlm reads, as data.
 *
 * Four block formats of GGUF files (llama.cpp's ggml layouts, byte for
 * byte, so a GGUF tensor's data is used in place) and AutoAWQ's INT4 GEMM
 * layout. This module owns their definitions: the block records, how many
 * bytes a row takes, and the scalar reference dequantization that every
 * kernel (engine/cpu/, engine/cuda/) and every fidelity test is checked
 * against. It does no I/O and holds no state.
 *
 * Row convention (struct model_tensor): a matrix has `rows` output features
 * and `cols` input features.
 *  - Block formats (Q8_0, Q4_K, Q5_K, Q6_K): each row is cols / QUANT_BLOCK(dt)
 *    consecutive blocks, rows one after another, exactly GGUF's order for a
 *    tensor with ne[0] = cols, ne[1] = rows. cols must be a multiple of the
 *    block size (32 or 256); a loader refuses other shapes.
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

/* AutoAWQ's nibble of feature 8j + k inside a packed int32 (see above). */
extern const int QUANT_AWQ_NIBBLE[8];

/* 1 when dt is one of this module's formats (Q8_0, Q4_K, Q5_K, Q6_K, AWQ4). */
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

/* Reference dequantization of n elements (a multiple of the block) of one
 * row of blocks into out (n floats). Arithmetic in float, in the order the
 * format's definition gives, so kernels can be checked against it. */
void quant_dequant_q8_0(const struct quant_block_q8_0 *x, float *out, int64_t n);
void quant_dequant_q4_k(const struct quant_block_q4_k *x, float *out, int64_t n);
void quant_dequant_q5_k(const struct quant_block_q5_k *x, float *out, int64_t n);
void quant_dequant_q6_k(const struct quant_block_q6_k *x, float *out, int64_t n);

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
