/* engine/cpu/qgemm.h - the CPU's products with quantized weights (GGUF's
 * block formats of engine/quant.h, AWQ INT4) and the activation formats
 * they read.
 *
 * Integer dot products, as llama.cpp's: each row of activations is
 * quantized once per product input to int8 in blocks (cpu_xq_quantize),
 * the weights stay in their 4-8 bit codes, the sum of code products over a
 * block is an exact int32, and only the per-block scaling is floating
 * point. That makes the recipe easy to pin down bit for bit, so every ISA
 * (scalar, AVX2, AVX-512 VNNI) computes the same bits, not only the same
 * values within a bound:
 *
 *   Activations. CPU_XQ_32 (for the 32-element formats and AWQ): blocks
 *   of 32, scale d = amax / 127 (f32 division), q = nearest-even(x *
 *   (1 / d)), 0 when amax is 0, and the block's sum of q. CPU_XQ_256 (the
 *   K-quants and IQ4_XS): the same with blocks of 256 (one scale per
 *   super-block, llama.cpp's Q8_K), plus the sums of q over each 16 and 32
 *   elements for the formats' min and offset terms.
 *
 *   Output (m, n), one f32 chain over the blocks b of the row, ascending,
 *   from +0 (dw, dmin, s: the f16 scales as f32; dx: the activation
 *   block's scale; I: exact int32 sums over the block's codes):
 *     Q8_0:  acc = fmaf((float)I, dw * dx, acc),  I = sum qw qx
 *     Q4_K,  acc = fmaf((float)I, dw * dx, acc);
 *     Q5_K:  acc = fmaf((float)-J, dmin * dx, acc),
 *            I = sum_j sc_j sum_{i in j} q_i qx_i,  J = sum_j m_j sum_{i in j} qx_i
 *     Q6_K:  acc = fmaf((float)I, dw * dx, acc),  I = sum_s sc_s sum_{i in s} (q_i - 32) qx_i
 *     AWQ:   per activation block of 32 (inside weight group g):
 *            acc = fmaf((float)I, s_g * dx, acc),  I = sum (q_i - z_g) qx_i
 *     Q4_0, Q5_0, IQ4_NL:  acc = fmaf((float)I, dw * dx, acc),
 *            I = sum c_i qx_i, c = q - 8, q - 16, or the IQ4 level of q
 *     Q4_1, Q5_1:  acc = fmaf((float)I, dw * dx, acc);
 *            acc = fmaf((float)S, m * dx, acc),  I = sum q_i qx_i, S = sum qx_i
 *     Q2_K:  as Q4_K over 16 sub-blocks of 16 (4-bit scales and mins)
 *     Q3_K:  acc = fmaf((float)I, dw * dx, acc),  I = sum_s (sc_s - 32) sum_{i in s} q_i qx_i
 *     IQ4_XS: acc = fmaf((float)I, dw * dx, acc),
 *            I = sum_j (ls_j - 32) sum_{i in j} level(q_i) qx_i
 *   The value of (m, n) thus depends on row m of x and row n of w only:
 *   batch invariant (kernels.h's contract) whatever M, the tile or the
 *   split, and the same on every table.
 *
 * Weight layouts. CPU_QL_NATIVE: GGUF's blocks, row after row (quant.h),
 * for every GGUF format; for AWQ the rows of cpu_q_awq_convert
 * below (AutoAWQ's transposed layout is no use to a row kernel).
 * CPU_QL_PANELS: rows in panels of 16 with the codes of 16 rows
 * interleaved four bytes at a time, so one VNNI instruction (vpdpbusd) does
 * 4 products for each of 16 rows against one broadcast dword of x: the
 * AVX-512 table's layout (cpu_q_pack), about the size of the native one
 * (Q8_0 34 bytes per 32 weights as native, Q4_K 148 per 256 against 144,
 * Q5_K 180 against 176, Q6_K 212 against 210, AWQ 68 per 128, IQ4_XS 148
 * against 136, Q4_1 and Q5_1 36 per 32 against 20 and 24, Q2_K 100 per
 * 256 against 84; Q4_0, Q5_0 and IQ4_NL in Q8_0's panels, Q3_K in Q6_K's:
 * cpu_q_panel_dt).
 * Which layouts a table reads:
 * cpu_kernels.gemm_q always takes NATIVE; PANELS only where the table has
 * q_panels set.
 *
 * Thread-safe: no state. */
#ifndef RL_CPU_QGEMM_H
#define RL_CPU_QGEMM_H

/* C11 and C++ (the CUDA code includes this header) spell it differently. */
#ifndef RL_STATIC_ASSERT
#ifdef __cplusplus
#define RL_STATIC_ASSERT static_assert
#else
#define RL_STATIC_ASSERT _Static_assert
#endif
#endif

#include <stddef.h>
#include <stdint.h>

#include "model.h"

enum cpu_xq { CPU_XQ_32 = 0, CPU_XQ_256, CPU_XQ_N };

/* One activation block of CPU_XQ_32: 40 bytes. */
struct cpu_xq32 {
    int8_t q[32];
    float d;        /* scale: x ~ d * q */
    int32_t s;      /* sum of q */
};

/* One activation block of CPU_XQ_256: 320 bytes (five cache lines). The
 * sums are stored in the pairs the packed kernels feed to vpdpwssd:
 * s16p[2i], s16p[2i+1] = sums of q over elements 16i.. and 16(i+8)..
 * (i < 8); s32p[2i], s32p[2i+1] = sums over 32i.. and 32(i+4).. (i < 4). */
struct cpu_xq256 {
    int8_t q[256];
    int16_t s16p[16];
    int16_t s32p[8];
    float d;
    uint8_t pad[12];
};

RL_STATIC_ASSERT(sizeof(struct cpu_xq32) == 40, "xq32 block is 40 bytes");
RL_STATIC_ASSERT(sizeof(struct cpu_xq256) == 320, "xq256 block is 320 bytes");

enum cpu_qlayout { CPU_QL_NATIVE = 0, CPU_QL_PANELS };

/* A quantized matrix as the CPU backend holds it. rows x cols as in
 * struct model_tensor (rows = output features). */
struct cpu_qmat {
    enum model_dtype dt;       /* a GGUF block format or MODEL_AWQ4 */
    int rows, cols;
    int awq_group;             /* AWQ4: the group along cols, else 0 */
    enum cpu_qlayout layout;
    const void *w;             /* NATIVE: rows of cpu_q_row_bytes; PANELS:
                                  rows / 16 panels of cpu_q_panel_bytes */
};

/* The activation format a weight format's products read. */
enum cpu_xq cpu_xq_for(enum model_dtype dt);
/* Elements per activation block (32 or 256). */
int cpu_xq_block(enum cpu_xq f);
/* Bytes one row of K activations takes (K a multiple of the block). */
size_t cpu_xq_row_bytes(enum cpu_xq f, int K);
/* Quantizes one row of K floats (K a multiple of the block) into out
 * (cpu_xq_row_bytes). Portable C, the same bits on every ISA. */
void cpu_xq_quantize(enum cpu_xq f, const float *x, int K, void *out);

/* 1 when the CPU backend can multiply by a (dt, rows, cols[, group])
 * matrix at all: cols a multiple of the format's block (AWQ: of 32 and of
 * the group, the group of 32; rows of 8). */
int cpu_q_supported(enum model_dtype dt, int rows, int cols, int awq_group);
/* Bytes of one NATIVE row (AWQ: of the converted row). */
size_t cpu_q_row_bytes(enum model_dtype dt, int cols, int awq_group);

/* AWQ's GEMM layout (t->data, awq_qzeros, awq_scales; quant.h) into NATIVE
 * rows, per group of G columns: f16 scale, zero point (byte), a spare
 * byte, then G / 2 bytes holding columns 2i (low nibble) and 2i + 1 (high).
 * out: rows * cpu_q_row_bytes(MODEL_AWQ4, cols, G) bytes. */
void cpu_q_awq_convert(const struct model_tensor *t, void *out);

/* The format whose panels a matrix of dt is packed in: dt itself, or for
 * Q4_0, Q5_0 and IQ4_NL Q8_0's, for Q3_K Q6_K's (their codes and scales
 * widened exactly: the same products, bit for bit, at the wider format's
 * speed and about 1.9x the bytes). */
enum model_dtype cpu_q_panel_dt(enum model_dtype dt);

/* PANELS: whether a matrix can be packed (rows % 16 == 0; cols % 64 for
 * Q8_0, Q4_1, Q5_1 and the formats in Q8_0's panels, % 256 for K-quants
 * and IQ4_XS, a multiple of the group for AWQ with the group a multiple
 * of 64), the bytes of one panel, and the packing of NATIVE rows
 * (src, rows * cpu_q_row_bytes) into panels (out, rows / 16 panels). */
int cpu_q_can_pack(enum model_dtype dt, int rows, int cols, int awq_group);
size_t cpu_q_panel_bytes(enum model_dtype dt, int cols, int awq_group);
void cpu_q_pack(enum model_dtype dt, int rows, int cols, int awq_group, const void *src, void *out);

/* Row r of m as floats (cols of them): the format's dequantization, in
 * the order quant.c's reference uses (so equal to it bit for bit), from
 * either layout. For the token embedding of a quantized checkpoint. */
void cpu_q_dequant_row(const struct cpu_qmat *m, int r, float *out);

/* The portable product on NATIVE weights: y[m*ldy + n] for m < M and
 * n in [n0, n1), xq rows of cpu_xq_row_bytes(cpu_xq_for(dt), cols) at
 * stride ldxq bytes. The scalar table's gemm_q; cpu_gemm_q_avx2 is the
 * same code compiled for AVX2 + FMA (call it only where the CPU has them),
 * cpu_gemm_q_avx512 the VNNI kernels on PANELS (and the AVX2 code on
 * NATIVE weights; call it only where the AVX-512 table runs). */
void cpu_gemm_q_scalar(int M, int n0, int n1, const struct cpu_qmat *w, const void *xq,
                       size_t ldxq, float *y, int ldy);
void cpu_gemm_q_avx2(int M, int n0, int n1, const struct cpu_qmat *w, const void *xq,
                     size_t ldxq, float *y, int ldy);
void cpu_gemm_q_avx512(int M, int n0, int n1, const struct cpu_qmat *w, const void *xq,
                       size_t ldxq, float *y, int ldy);

#endif
