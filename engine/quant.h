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

_Static_assert(sizeof(struct quant_block_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(struct quant_block_q4_k) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(struct quant_block_q5_k) == 176, "Q5_K block is 176 bytes");
_Static_assert(sizeof(struct quant_block_q6_k) == 210, "Q6_K block is 210 bytes");

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

#endif
