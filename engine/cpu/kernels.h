/* engine/cpu/kernels.h - the CPU backend's inner loops, one table per ISA.
 *
 * The backend picks a table once (cpu_kernels_get) and calls through it, so
 * every path - AVX-512 with BF16 dot products, AVX2+FMA, portable scalar -
 * runs the same callers and the tests can force each one.
 *
 * Batch invariance contract, for every gemm_* here: the value written for
 * output (m, n) depends only on row m of x, row n of w and K. The reduction
 * over k runs in one fixed order that is the same for M = 1 and M = 512,
 * whatever n0/n1 are and wherever (m, n) falls inside a register tile. So a
 * sequence's logits are bit-identical alone or in a batch, and under any
 * split of the work across threads. Different ISAs may round differently. */
#ifndef RL_CPU_KERNELS_H
#define RL_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/qgemm.h"

enum cpu_isa { CPU_ISA_SCALAR = 0, CPU_ISA_AVX2, CPU_ISA_AVX512BF16, CPU_ISA_N };

/* The best ISA this CPU and this build support. */
enum cpu_isa cpu_isa_detect(void);
/* "scalar" | "avx2" | "avx512bf16" | "auto"; -1 when unknown. */
int cpu_isa_parse(const char *s);
const char *cpu_isa_name(enum cpu_isa isa);

struct cpu_kernels {
    enum cpu_isa isa;

    /* y[m*ldy + n] = sum_k x[m*ldx + k] * w[n*K + k]
     * for m in [0, M), n in [n0, n1). w is (N, K) row-major, the Hugging
     * Face layout. Writes only y[., n0..n1). */
    void (*gemm_f32)(int M, int n0, int n1, int K, const float *x, int ldx,
                     const float *w, float *y, int ldy);
    /* x already rounded to bf16 (f32_to_bf16 below); f32 accumulation. */
    void (*gemm_bf16)(int M, int n0, int n1, int K, const uint16_t *x,
                      int ldx, const uint16_t *w, float *y, int ldy);
    /* IEEE half weights, f32 activations. */
    void (*gemm_f16)(int M, int n0, int n1, int K, const float *x, int ldx,
                     const uint16_t *w, float *y, int ldy);

    /* y[i] = bf16(x[i]), round to nearest even. */
    void (*f32_to_bf16)(const float *x, uint16_t *y, int n);
    void (*bf16_to_f32)(const uint16_t *x, float *y, int n);

    /* Attention helpers, over one head's vectors. */
    float (*dot_f32)(const float *a, const float *b, int n);
    float (*dot_bf16_f32)(const uint16_t *a, const float *b, int n);
    void (*axpy_f32)(float a, const float *x, float *y, int n);     /* y += a x */
    void (*axpy_bf16)(float a, const uint16_t *x, float *y, int n); /* y += a x */

    /* Optional (NULL where the ISA has no use for it): the same product as
     * gemm_bf16 on a matrix repacked once by cpu_pack_bf16() below, for a
     * register tile that needs no horizontal sums. Needs N % 16 == 0,
     * K and ldx even, n0 and n1 multiples of 16, wp 64-byte aligned. Its own fixed reduction
     * order (one f32 chain per output over k pairs, ascending) differs
     * from gemm_bf16's, but like every gemm here it does not depend on M,
     * n0/n1 or the tile, so it is batch invariant on its own. */
    void (*gemm_bf16p)(int M, int n0, int n1, int K, const uint16_t *x,
                       int ldx, const uint16_t *wp, float *y, int ldy);

    /* Optional, with gemm_bf16p, for M <= CPU_SPREAD_MAX_M (decode): the
     * same product (plain, wu NULL, or fused as gemm_bf16p_glu, y and yu
     * then only scratch) in pieces. The rows [n0, n1) are a fixed set of
     * tiles, cpu_spread_tiles(n1 - n0, wu != NULL) of them, whose weights
     * stream as one range (kernels_avx512.c says why); this computes tiles
     * t0..t1-1 only, with gemm_bf16p's bits, so that threads can share a
     * range tile by tile, each taking from its own end and from the
     * other's, without cutting it into ranges of their own. */
    void (*gemm_bf16p_tiles)(int M, int n0, int n1, int t0, int t1, int K, const uint16_t *x,
                             int ldx, const uint16_t *wp, const uint16_t *wu, float *y,
                             float *yu, int ldy, uint16_t *h, int ldh);

    /* Optional, with gemm_bf16p: the gate and up products of a SwiGLU MLP
     * in one pass, h[m*ldh + n] = bf16(silu(g) * u) for n in [n0, n1),
     * g and u the gemm_bf16p products of x with the packed gate (wg) and
     * up (wu) matrices, with the same bits, and silu(g) * u computed as
     * the table's swiglu() does. yg and yu (ldy) take partial sums between
     * K chunks when M is large (their contents are then undefined); the
     * SwiGLU output never goes through memory as f32. n0 and n1 multiples
     * of 16. */
    void (*gemm_bf16p_glu)(int M, int n0, int n1, int K, const uint16_t *x,
                           int ldx, const uint16_t *wg, const uint16_t *wu,
                           float *yg, float *yu, int ldy, uint16_t *h, int ldh);

    /* Optional attention pieces (NULL: the backend runs its portable loops).
     * softmax: s[i] = exp(s[i] * scale - max_j(s[j] * scale)) for i < n,
     * returns the sum of the new s[i]; the order of every operation is a
     * function of n alone. */
    float (*softmax)(float *s, int n, float scale);
    /* P x V for R rows over n keys, values accumulated in registers:
     * o[r*ldo + d] += p[r*ldp + j] * v[j*hd + d] for j = 0..n-1 ascending,
     * one fused multiply-add per (j, d), for d < hd (hd % 16 == 0). The
     * result of each row depends only on that row, so callers may group
     * rows and cut the keys into ranges freely. */
    /* Scores: s[r*lds + j] = q_r . k_j for r < R, j < n, q rows of hd
     * bf16 at stride ldq, keys k_j = k + j*hd; hd % 32 == 0. Bit-identical
     * to gemm_bf16(R, 0, n, hd, q, ldq, k, s, lds) on the same table (same
     * chains, same fold), only without its per-call and tile overheads. */
    void (*scores_bf16)(int R, int n, const uint16_t *q, int ldq,
                        const uint16_t *k, int hd, float *s, int lds);
    void (*pv_bf16)(int R, int n, const float *p, int ldp, const uint16_t *v,
                    int hd, float *o, int ldo);
    void (*pv_f32)(int R, int n, const float *p, int ldp, const float *v,
                   int hd, float *o, int ldo);

    /* Optional packed-KV attention (all three or none). With blocks of 16
     * tokens and bf16 KV the backend may keep each (layer, block, kv head)
     * of the cache in these two layouts, so that scores and P x V become
     * outer-product tiles like gemm_bf16p: BF16 dot products, no
     * horizontal sums, one weight-like vector load per 16 outputs.
     *   K block (16 x hd): cpu_pack_bf16 of the keys, element (slot s,
     *     dim d) at (d/2)*32 + s*2 + d%2;
     *   V block (hd x 16): cpu_pack_bf16 of the transposed values,
     *     element (slot s, dim d) at ((d/16)*8 + s/2)*32 + (d%16)*2 + s%2.
     * Blocks start on 64-byte boundaries; hd % 32 == 0.
     *
     * kv_put_bf16p: writes one token's key and value (f32, rounded as
     * f32_to_bf16 does) into slot `slot` of a K and a V block. */
    void (*kv_put_bf16p)(const float *k, const float *v, int hd, int slot,
                         uint16_t *kblk, uint16_t *vblk);
    /* s[r*lds + 16*b + j] = q_r . (key j of block kb[b]) for r < R,
     * b < nb, j < 16; q rows bf16 at stride ldq (even). Every score is one
     * f32 chain over the pairs of d ascending from +0, whatever R and nb:
     * a decode query and the same query inside a prefill tile agree bit
     * for bit. Scores of slots past a sequence's end are garbage for the
     * caller to ignore. */
    void (*scores_bf16p)(int R, int nb, const uint16_t *q, int ldq,
                         const uint16_t *const *kb, int hd, float *s, int lds);
    /* o[r*ldo + d] += sum_j p[r*ldp + j] * v_j[d], v_j = slot j % 16 of
     * block vb[j / 16], over j < 16*(nb-1) + n_last (1 <= n_last <= 16),
     * in key pairs (2i, 2i+1) ascending, one f32 chain per (r, d); p bf16
     * rows at stride ldp (even). Values past n_last are never added (a
     * slot past a sequence's end may hold anything). A key whose p is +0
     * adds exactly nothing, so a row may run over more keys than it needs:
     * the result of a row depends on that row and its own keys alone. */
    void (*pv_bf16p)(int R, int nb, int n_last, const uint16_t *p, int ldp,
                     const uint16_t *const *vb, int hd, float *o, int ldo);

    /* Optional row helpers (NULL: the backend's portable loops).
     * rmsnorm: y[i] = w[i] * (x[i] * r), r = 1 / sqrt(mean(x^2) + eps),
     * the mean summed in double; y may be x. swiglu: g[i] = silu(g[i]) *
     * u[i]. Both are functions of the row alone. */
    void (*rmsnorm)(const float *x, const float *w, float *y, int n, float eps);
    void (*swiglu)(float *g, const float *u, int n);
    /* The up half of a LoRA delta (cpu/lora_apply.h): y[i] += sum_k t[k] *
     * w[k * ldw + i] for i < n, k < r, each i's sum in one f32 chain from
     * 0, k ascending, then added to y[i]: the r rows of w stream once and
     * the sums stay in registers (r axpys would load and store y r times).
     * A function of i's column alone, so any split of [0, n) gives the
     * same bits. Required. */
    void (*lora_up)(int r, const float *t, const float *w, size_t ldw, float *y, int n);
    /* Qwen3's per-head q/k step: each of n rows of hd floats (stride hd)
     * gets rmsnorm(row) * w as rmsnorm() computes it, then the rotate-half
     * rotary embedding with cos cs[i] / sin sn[i] for i < hd/2:
     * (a, b) -> (a cs - b sn, b cs + a sn). In place; a function of each
     * row alone. hd % 32 == 0. */
    void (*norm_rope)(float *x, int n, int hd, const float *w, float eps,
                      const float *cs, const float *sn);

    /* Products with quantized weights (engine/cpu/qgemm.h: formats, the
     * one recipe every table follows bit for bit): y[m*ldy + n] for
     * m < M, n in [n0, n1), activations xq quantized by cpu_xq_quantize
     * in cpu_xq_for(w->dt)'s format, rows ldxq bytes apart. Every table
     * takes CPU_QL_NATIVE weights; those with q_panels set also take
     * CPU_QL_PANELS (cpu_q_pack), then with n0 and n1 multiples of 16. */
    void (*gemm_q)(int M, int n0, int n1, const struct cpu_qmat *w, const void *xq,
                   size_t ldxq, float *y, int ldy);
    int q_panels;
};

/* gemm_bf16p_tiles' tiles over n rows: 4 panels of 16 rows each (fused:
 * 2 output panels, gate's and up's), and one tile more for the panels left
 * over. */
#define CPU_SPREAD_MAX_M 4
static inline int cpu_spread_tiles(int n, int glu)
{
    int np = n / 16, per = glu ? 2 : 4;
    return np / per + (np % per != 0);
}

/* The panel layout gemm_bf16p reads: rows in panels of 16, each panel
 * (K/2 pairs x 16 rows x 2) contiguous, so element (n, k) of w sits at
 * ((n/16) * (K/2) + k/2) * 32 + (n%16) * 2 + k%2. Same size as w.
 * Needs N % 16 == 0 and K even. */
void cpu_pack_bf16(const uint16_t *w, int N, int K, uint16_t *out);

/* The table for `isa`; NULL when this CPU cannot run it. */
const struct cpu_kernels *cpu_kernels_get(enum cpu_isa isa);


/* The per-ISA tables behind cpu_kernels_get(), one per source file
 * (kernels.c, kernels_avx2.c, kernels_avx512.c). Each returns NULL when the
 * build has no such code (a non-x86 target); none checks the CPU, so call
 * cpu_kernels_get() unless you know the CPU can run it. */
const struct cpu_kernels *cpu_kernels_scalar(void);
const struct cpu_kernels *cpu_kernels_avx2(void);
const struct cpu_kernels *cpu_kernels_avx512bf16(void);

/* Portable one-value conversions, identical to every table's f32_to_bf16 /
 * bf16_to_f32: round to nearest even, NaN stays NaN (quietened), no
 * flushing of subnormals. */
uint16_t cpu_f32_to_bf16(float f);
float cpu_bf16_to_f32(uint16_t h);
/* IEEE binary16 -> binary32, exact (subnormals, inf, NaN kept). */
float cpu_f16_to_f32(uint16_t h);

/* Alignment: the gemms read rows of x and w with 64-byte vector loads and
 * run at full speed when every row starts on a 64-byte boundary: allocate
 * x, w and y with aligned_alloc(CPU_ALIGN, ...) and keep ldx and K times
 * the element size multiples of 64. Misaligned rows work too, at about
 * two-thirds of the prefill speed on Zen 5 (every load splits two lines);
 * note that a large malloc() returns addresses 16 bytes past a page.
 * Weights also want madvise(MADV_HUGEPAGE): decode streams them from DRAM
 * and 4 KB pages cost about a third of the bandwidth in TLB misses. */
#define CPU_ALIGN 64

/* Rows of w each gemm call should get at least, so thread splits land on
 * whole register tiles. */
#define CPU_GEMM_N_ALIGN 16

#endif
