/* engine/cpu/gemm_driver.h - the one row-major gemm driver of the SIMD
 * tables (kernels_avx2.c, kernels_avx512.c).
 *
 * Both tables compute gemm_f32 / gemm_bf16 / gemm_f16 the same way: every
 * output (m, n) owns one accumulator that walks k in the ISA's vector steps
 * and is folded by the ISA's fixed tree. What the ISA files define is how
 * a group of outputs is computed, as two functions per element type P:
 *
 *   P##_tile(MR, NR, K, x, ldx, w, y, ldy)   always inline, MR <= TM rows
 *       of x against NR <= 4 rows of w; MR and NR must be compile-time
 *       constants (they size the loops the registers are allocated for);
 *   P##_row##RN(K, x, w, y)                  one row of x against RN rows
 *       of w (the matrix-vector path of decode).
 *
 * What this driver decides is only *which* outputs share a call: for M = 1,
 * blocks of RN rows of w, then tiles of up to 4 for the rest of [n0, n1);
 * for M > 1, chunks of mc rows of x whose panel stays in L2
 * (CPU_GEMM_MC_BYTES), swept by tiles of 4 rows of w (kept in L1 while every
 * TM-row group of the chunk reuses them), full TM x 4 tiles first and edge
 * tiles through P##_tile_any's switch, so that every tile call still has
 * compile-time MR and NR. K is never blocked: that would cut the accumulator
 * chain and change the reduction order.
 *
 * Why sharing the driver keeps the bits: each ISA's tile, edge tile and row
 * functions run the same per-output recipe (its file says which), so the
 * value of (m, n) does not depend on which of them computed it, and the
 * batch invariance contract of kernels.h holds for any grouping. The driver
 * text is what both files used to stamp out each on its own; the machine
 * code it compiles to is the same.
 *
 * Included by the two SIMD kernel files only; each stamps the driver once
 * per element type inside its own target attribute. */
#ifndef RL_CPU_GEMM_DRIVER_H
#define RL_CPU_GEMM_DRIVER_H

#include <stddef.h>

/* At most this many bytes of x per chunk of the M > 1 path, so the x panel
 * plus the streaming w tiles fit a 1 MB L2. */
#define CPU_GEMM_MC_BYTES (512 * 1024)

/* The edge-tile cases of P##_tile_any for MR = m, NR = 1..4 (the switch
 * key is mr * 8 + nr). */
#define CPU_GEMM_CASES(P, m)                                                  \
    case 8 * (m) + 1: P##_tile(m, 1, K, x, ldx, w, y, ldy); break;            \
    case 8 * (m) + 2: P##_tile(m, 2, K, x, ldx, w, y, ldy); break;            \
    case 8 * (m) + 3: P##_tile(m, 3, K, x, ldx, w, y, ldy); break;            \
    case 8 * (m) + 4: P##_tile(m, 4, K, x, ldx, w, y, ldy); break;
/* All edge tiles up to TM rows: CPU_GEMM_ROWS_##TM(P). */
#define CPU_GEMM_ROWS_2(P) CPU_GEMM_CASES(P, 1) CPU_GEMM_CASES(P, 2)
#define CPU_GEMM_ROWS_4(P) CPU_GEMM_ROWS_2(P) CPU_GEMM_CASES(P, 3) CPU_GEMM_CASES(P, 4)

/* Stamps P##_tile_any and P##_gemm (the cpu_kernels gemm_* entry, contract
 * in kernels.h) for element types XT (x) and WT (w), under the function
 * attribute TARGET. TM: the rows of the full tile (2 or 4); RN: the rows of
 * w P##_row##RN takes (a literal, it is pasted into the name). */
#define CPU_GEMM_DRIVER(TARGET, P, XT, WT, TM, RN)                            \
    TARGET static void P##_tile_any(int mr, int nr, int K, const XT *x,       \
                                    int ldx, const WT *w, float *y, int ldy)  \
    {                                                                         \
        switch (mr * 8 + nr) {                                                \
        CPU_GEMM_ROWS_##TM(P)                                                 \
        default: break;                                                       \
        }                                                                     \
    }                                                                         \
                                                                              \
    TARGET static void P##_gemm(int M, int n0, int n1, int K, const XT *x,    \
                                int ldx, const WT *w, float *y, int ldy)      \
    {                                                                         \
        if (M <= 0 || n1 <= n0 || K <= 0)                                     \
            return;                                                           \
        if (M == 1) {                                                         \
            int n = n0;                                                       \
            for (; n + RN <= n1; n += RN)                                     \
                P##_row##RN(K, x, w + (size_t)n * K, y + n);                  \
            for (; n < n1; n += 4)                                            \
                P##_tile_any(1, n1 - n < 4 ? n1 - n : 4, K, x, ldx,           \
                             w + (size_t)n * K, y + n, ldy);                  \
            return;                                                           \
        }                                                                     \
        int mc = (int)(CPU_GEMM_MC_BYTES / ((size_t)K * sizeof(XT))) & ~(TM - 1); \
        if (mc < TM)                                                          \
            mc = TM;                                                          \
        for (int m0 = 0; m0 < M; m0 += mc) {                                  \
            int m1 = m0 + mc < M ? m0 + mc : M;                               \
            for (int n = n0; n < n1; n += 4) {                                \
                int nr = n1 - n < 4 ? n1 - n : 4;                             \
                const WT *wt = w + (size_t)n * K;                             \
                int m = m0;                                                   \
                if (nr == 4)                                                  \
                    for (; m + TM <= m1; m += TM)                             \
                        P##_tile(TM, 4, K, x + (size_t)m * ldx, ldx, wt,      \
                                 y + (size_t)m * ldy + n, ldy);               \
                for (; m < m1; m += TM)                                       \
                    P##_tile_any(m1 - m < TM ? m1 - m : TM, nr, K,            \
                                 x + (size_t)m * ldx, ldx, wt,                \
                                 y + (size_t)m * ldy + n, ldy);               \
            }                                                                 \
        }                                                                     \
    }

#endif
