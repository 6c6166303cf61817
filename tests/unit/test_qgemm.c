/* tests/unit/test_qgemm.c - the quantized products of engine/cpu/qgemm.h on
 * every table this CPU can run.
 *
 * On random blocks (random codes, random scales over the whole f16 range:
 * tiny and subnormal halves, up to 65504; activations from 1e-20 to 1e20):
 *  - each table's gemm_q against a double reference over the dequantized
 *    weights (quant.c) and the dequantized activations, within
 *    TOL_Q * sum |terms|: the integer sums are exact, so what remains is
 *    the f32 chain over the blocks (and the rounding of I to f32);
 *  - every table, layout, M, tile and split gives the scalar table's bits
 *    (qgemm.h's one recipe), so logits stay batch invariant;
 *  - panels unpack to the native bytes (the token embedding reads them),
 *    also where a format is packed in another's panels (cpu_q_panel_dt);
 *  - AWQ's conversion dequantizes as quant.c reads AutoAWQ's layout;
 *  - the accuracy of quantizing the activations themselves, against the
 *    float64 product with unquantized x, printed and bounded per format
 *    (the figure engine/cpu/README.md quotes). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/kernels.h"
#include "cpu/qgemm.h"
#include "dtype.h"
#include "quant.h"

/* |y - ref| <= TOL_Q * sum |w_k x_k| (+ a tiny absolute floor): one f32
 * rounding per block step over at most 96 steps, and the conversion of an
 * int32 sum above 2^24 (relative 2^-24 of that block's terms). */
#define TOL_Q 1e-5

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float rndf(void) { return (float)((double)rnd() / 2147483648.0 - 1.0); }

/* A random half for a scale: mostly ordinary, sometimes extreme (subnormal,
 * the smallest normal, the largest finite), never inf / NaN. */
static uint16_t rnd_scale(void)
{
    switch (rnd() % 16) {
    case 0: return (uint16_t)(1 + rnd() % 0x3ff);     /* subnormal */
    case 1: return 0x7bff;                            /* 65504 */
    case 2: return 0x0400;                            /* 2^-14 */
    case 3: return 0;                                 /* zero scale */
    default: return (uint16_t)(((10 + rnd() % 8) << 10) | (rnd() & 0x3ff));
    }
}

static void fill_bytes(void *p, size_t n)
{
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)rnd();
}

/* Random NATIVE rows of dt (rows x cols), scales by rnd_scale. */
static void *rand_native(enum model_dtype dt, int rows, int cols, int G)
{
    size_t rb = cpu_q_row_bytes(dt, cols, G);
    uint8_t *w = malloc(rb * (size_t)rows);
    assert_non_null(w);
    fill_bytes(w, rb * (size_t)rows);
    for (int r = 0; r < rows; r++) {
        uint8_t *row = w + (size_t)r * rb;
        switch (dt) {
        case MODEL_Q8_0:
            for (int b = 0; b < cols / 32; b++)
                ((struct quant_block_q8_0 *)row)[b].d = rnd_scale();
            break;
        case MODEL_Q4_K:
            for (int b = 0; b < cols / 256; b++) {
                ((struct quant_block_q4_k *)row)[b].d = rnd_scale();
                ((struct quant_block_q4_k *)row)[b].dmin = rnd_scale();
            }
            break;
        case MODEL_Q5_K:
            for (int b = 0; b < cols / 256; b++) {
                ((struct quant_block_q5_k *)row)[b].d = rnd_scale();
                ((struct quant_block_q5_k *)row)[b].dmin = rnd_scale();
            }
            break;
        case MODEL_Q6_K:
            for (int b = 0; b < cols / 256; b++)
                ((struct quant_block_q6_k *)row)[b].d = rnd_scale();
            break;
        case MODEL_AWQ4:
            for (int g = 0; g < cols / G; g++) {
                uint8_t *gr = row + (size_t)g * (size_t)(4 + G / 2);
                uint16_t s = rnd_scale();
                memcpy(gr, &s, 2);
                gr[2] &= 0xF;
                gr[3] = 0;
            }
            break;
        default: { /* the other GGUF formats: their f16 fields by offset (quant.h) */
            size_t bb = quant_block_bytes(dt), offs[2] = {0, 0};
            int nf = 1;
            if (dt == MODEL_Q4_1 || dt == MODEL_Q5_1)
                offs[1] = 2, nf = 2;
            else if (dt == MODEL_Q2_K)
                offs[0] = 80, offs[1] = 82, nf = 2;
            else if (dt == MODEL_Q3_K)
                offs[0] = 108;
            for (int b = 0; b < cols / quant_block_elems(dt); b++)
                for (int i = 0; i < nf; i++) {
                    uint16_t s = rnd_scale();
                    memcpy(row + (size_t)b * bb + offs[i], &s, 2);
                }
            break;
        }
        }
    }
    return w;
}

/* Activations: rows scaled 1, 1e-20, 1e20, with a zero block now and then. */
static float *rand_x(int M, int K)
{
    float *x = malloc((size_t)M * (size_t)K * sizeof *x);
    assert_non_null(x);
    for (int m = 0; m < M; m++) {
        float sc = m % 5 == 3 ? 1e-20f : m % 5 == 4 ? 1e20f : 1.0f;
        for (int k = 0; k < K; k++)
            x[(size_t)m * K + k] = rndf() * sc;
        if (m % 3 == 1)
            memset(x + (size_t)m * K + 32, 0, 32 * sizeof *x);
    }
    return x;
}

static void *quant_rows(enum cpu_xq f, const float *x, int M, int K, size_t *ld)
{
    *ld = cpu_xq_row_bytes(f, K);
    uint8_t *q = malloc(*ld * (size_t)M);
    assert_non_null(q);
    for (int m = 0; m < M; m++)
        cpu_xq_quantize(f, x + (size_t)m * K, K, q + (size_t)m * *ld);
    return q;
}

/* Dequantized activation row (d * q per block). */
static void xq_dequant(enum cpu_xq f, const void *row, int K, double *out)
{
    for (int k = 0; k < K; k++) {
        if (f == CPU_XQ_256) {
            const struct cpu_xq256 *b = (const struct cpu_xq256 *)row + k / 256;
            out[k] = (double)b->d * b->q[k % 256];
        } else {
            const struct cpu_xq32 *b = (const struct cpu_xq32 *)row + k / 32;
            out[k] = (double)b->d * b->q[k % 32];
        }
    }
}

static const struct cpu_kernels *tables[CPU_ISA_N];
static int n_tables;

static int setup(void **state)
{
    (void)state;
    for (int i = 0; i < CPU_ISA_N; i++)
        if (cpu_kernels_get((enum cpu_isa)i))
            tables[n_tables++] = cpu_kernels_get((enum cpu_isa)i);
    return 0;
}

struct qcase {
    enum model_dtype dt;
    int N, K, G;
};

static const struct qcase cases[] = {
    {MODEL_Q8_0, 48, 128, 0},   {MODEL_Q8_0, 64, 96, 0},   /* 96: not packable */
    {MODEL_Q4_K, 48, 512, 0},   {MODEL_Q5_K, 32, 512, 0},  {MODEL_Q6_K, 48, 512, 0},
    {MODEL_AWQ4, 48, 256, 128}, {MODEL_AWQ4, 32, 192, 64}, {MODEL_AWQ4, 24, 96, 32},
    {MODEL_Q4_0, 48, 128, 0},   {MODEL_Q4_1, 32, 96, 0},   {MODEL_Q5_0, 48, 128, 0},
    {MODEL_Q5_1, 32, 160, 0},   {MODEL_IQ4_NL, 48, 128, 0}, {MODEL_Q2_K, 32, 512, 0},
    {MODEL_Q3_K, 48, 512, 0},   {MODEL_IQ4_XS, 32, 512, 0}, {MODEL_Q4_1, 48, 128, 0},
    {MODEL_Q5_1, 48, 192, 0}, /* Q4_1 96 and Q5_1 160 above: not packable */
};

/* The matrix in NATIVE form and, where the AVX-512 table packs it, PANELS. */
struct qmats {
    struct cpu_qmat nat, pan;
    void *wn, *wp;
    float *wf; /* (N, K) dequantized, reference */
};

static void mats_make(const struct qcase *c, struct qmats *q)
{
    memset(q, 0, sizeof *q);
    q->wn = rand_native(c->dt, c->N, c->K, c->G);
    q->nat = (struct cpu_qmat){c->dt, c->N, c->K, c->G, CPU_QL_NATIVE, q->wn};
    q->wf = malloc((size_t)c->N * (size_t)c->K * sizeof *q->wf);
    assert_non_null(q->wf);
    for (int r = 0; r < c->N; r++)
        cpu_q_dequant_row(&q->nat, r, q->wf + (size_t)r * c->K);
    if (cpu_q_can_pack(c->dt, c->N, c->K, c->G)) {
        size_t pb = cpu_q_panel_bytes(c->dt, c->K, c->G) * (size_t)(c->N / 16);
        q->wp = aligned_alloc(64, (pb + 63) & ~(size_t)63);
        assert_non_null(q->wp);
        cpu_q_pack(c->dt, c->N, c->K, c->G, q->wn, q->wp);
        q->pan = q->nat;
        q->pan.layout = CPU_QL_PANELS;
        q->pan.w = q->wp;
    }
}

static void mats_free(struct qmats *q)
{
    free(q->wn), free(q->wp), free(q->wf);
}

/* Dequantization of NATIVE rows is quant.c's reference, and PANELS unpack
 * to the same floats. */
static void test_dequant_and_unpack(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const struct qcase *c = &cases[i];
        struct qmats q;
        mats_make(c, &q);
        float *a = malloc((size_t)c->K * 4), *b = malloc((size_t)c->K * 4);
        for (int r = 0; r < c->N; r++) {
            if (c->dt != MODEL_AWQ4) { /* the NATIVE bytes are quant.c's */
                struct model_tensor t = {.dtype = c->dt, .rows = c->N, .cols = c->K, .data = q.wn};
                assert_int_equal(quant_dequant_row(&t, r, a), 0);
                assert_memory_equal(a, q.wf + (size_t)r * c->K, (size_t)c->K * 4);
            }
            if (q.wp) {
                cpu_q_dequant_row(&q.pan, r, b);
                if (memcmp(b, q.wf + (size_t)r * c->K, (size_t)c->K * 4))
                    fail_msg("%s %dx%d: panel row %d unpacks differently", model_dtype_name(c->dt), c->N,
                             c->K, r);
            }
        }
        free(a), free(b);
        mats_free(&q);
    }
}

/* AutoAWQ's GEMM layout through cpu_q_awq_convert reads as quant.c reads
 * the original tensor. */
static void test_awq_convert(void **state)
{
    (void)state;
    int rows = 32, cols = 256, G = 128;
    int32_t *qw = malloc((size_t)cols * (rows / 8) * 4), *qz = malloc((size_t)(cols / G) * (rows / 8) * 4);
    uint16_t *sc = malloc((size_t)(cols / G) * rows * 2);
    fill_bytes(qw, (size_t)cols * (rows / 8) * 4);
    fill_bytes(qz, (size_t)(cols / G) * (rows / 8) * 4);
    for (int i = 0; i < (cols / G) * rows; i++)
        sc[i] = rnd_scale();
    struct model_tensor t = {.dtype = MODEL_AWQ4, .rows = rows, .cols = cols, .data = qw,
                             .awq_qzeros = qz, .awq_scales = sc, .awq_group = G};
    uint8_t *conv = malloc(cpu_q_row_bytes(MODEL_AWQ4, cols, G) * rows);
    cpu_q_awq_convert(&t, conv);
    struct cpu_qmat m = {MODEL_AWQ4, rows, cols, G, CPU_QL_NATIVE, conv};
    float a[256], b[256];
    for (int r = 0; r < rows; r++) {
        assert_int_equal(quant_dequant_row(&t, r, a), 0);
        cpu_q_dequant_row(&m, r, b);
        assert_memory_equal(a, b, sizeof a);
    }
    free(qw), free(qz), free(sc), free(conv);
}

/* Activation quantization: the recipe of qgemm.h written out here. */
static void test_xq_quantize(void **state)
{
    (void)state;
    int K = 512;
    float *x = rand_x(6, K);
    x[7] = NAN; /* row 0, block 0: garbage in, but defined bits out */
    for (int f = 0; f < CPU_XQ_N; f++) {
        size_t ld;
        uint8_t *q = quant_rows((enum cpu_xq)f, x, 6, K, &ld);
        int bs = cpu_xq_block((enum cpu_xq)f);
        for (int m = 0; m < 6; m++)
            for (int b = 0; b < K / bs; b++) {
                const float *xb = x + (size_t)m * K + (size_t)b * bs;
                float amax = 0;
                for (int i = 0; i < bs; i++)
                    amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
                float d = amax / 127.0f;
                d = d >= 1.17549435e-38f ? d : 0.0f;
                float id = d != 0 ? 1.0f / d : 0.0f;
                const int8_t *qq;
                float got_d;
                if (f == CPU_XQ_256) {
                    const struct cpu_xq256 *blk = (const struct cpu_xq256 *)(q + (size_t)m * ld) + b;
                    qq = blk->q, got_d = blk->d;
                    for (int i = 0; i < 8; i++) {
                        int s0 = 0, s1 = 0;
                        for (int l = 0; l < 16; l++)
                            s0 += qq[16 * i + l], s1 += qq[16 * (i + 8) + l];
                        assert_int_equal(blk->s16p[2 * i], s0);
                        assert_int_equal(blk->s16p[2 * i + 1], s1);
                    }
                    for (int i = 0; i < 4; i++) {
                        int s0 = 0, s1 = 0;
                        for (int l = 0; l < 32; l++)
                            s0 += qq[32 * i + l], s1 += qq[32 * (i + 4) + l];
                        assert_int_equal(blk->s32p[2 * i], s0);
                        assert_int_equal(blk->s32p[2 * i + 1], s1);
                    }
                } else {
                    const struct cpu_xq32 *blk = (const struct cpu_xq32 *)(q + (size_t)m * ld) + b;
                    qq = blk->q, got_d = blk->d;
                    int s = 0;
                    for (int i = 0; i < 32; i++)
                        s += qq[i];
                    assert_int_equal(blk->s, s);
                }
                assert_true(memcmp(&got_d, &d, 4) == 0);
                for (int i = 0; i < bs; i++) {
                    float v = nearbyintf(xb[i] * id);
                    v = !(v >= -127.0f) ? -127.0f : v > 127.0f ? 127.0f : v;
                    if (qq[i] != (int8_t)v)
                        fail_msg("xq%d row %d block %d elem %d: %d, want %d", bs, m, b, i, qq[i], (int)v);
                }
            }
        free(q);
    }
    free(x);
}

/* Every table and layout against the double reference, and bit-equal to
 * the scalar table, for M = 1..9 and a few splits of [0, N). */
static void test_products(void **state)
{
    (void)state;
    const struct cpu_kernels *sc = cpu_kernels_scalar();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const struct qcase *c = &cases[i];
        struct qmats q;
        mats_make(c, &q);
        enum cpu_xq f = cpu_xq_for(c->dt);
        int Mmax = 9;
        float *x = rand_x(Mmax, c->K);
        size_t ld;
        uint8_t *xq = quant_rows(f, x, Mmax, c->K, &ld);
        float *ref = malloc((size_t)Mmax * c->N * 4), *got = malloc((size_t)Mmax * c->N * 4);
        sc->gemm_q(Mmax, 0, c->N, &q.nat, xq, ld, ref, c->N);
        /* the scalar result against the double reference */
        double *xd = malloc((size_t)c->K * sizeof *xd);
        double worst = 0;
        for (int m = 0; m < Mmax; m++) {
            xq_dequant(f, xq + (size_t)m * ld, c->K, xd);
            for (int n = 0; n < c->N; n++) {
                double r = 0, mag = 0;
                for (int k = 0; k < c->K; k++) {
                    double t = (double)q.wf[(size_t)n * c->K + k] * xd[k];
                    r += t, mag += fabs(t);
                }
                double e = fabs((double)ref[(size_t)m * c->N + n] - r);
                if (!(e <= TOL_Q * mag + 1e-37))
                    fail_msg("%s %dx%d m=%d n=%d: %.9g, reference %.9g (rel %.3g)", model_dtype_name(c->dt),
                             c->N, c->K, m, n, ref[(size_t)m * c->N + n], r, e / mag);
                if (mag > 0 && e / mag > worst)
                    worst = e / mag;
            }
        }
        print_message("  %s %dx%d: worst |y - ref| / sum|terms| = %.2g\n", model_dtype_name(c->dt), c->N, c->K,
                      worst);
        for (int t = 0; t < n_tables; t++)
            for (int lay = 0; lay < 2; lay++) {
                const struct cpu_qmat *w = lay ? &q.pan : &q.nat;
                if (lay && (!q.wp || !tables[t]->q_panels))
                    continue;
                int splits[][2] = {{0, c->N}, {16, c->N}, {0, 16}, {16, 32}};
                for (int M = 1; M <= Mmax; M++)
                    for (int s = 0; s < 4; s++) {
                        int n0 = splits[s][0], n1 = splits[s][1] < c->N ? splits[s][1] : c->N;
                        for (int z = 0; z < Mmax * c->N; z++)
                            got[z] = -12345.0f;
                        /* rows Mmax - M .. : a row's bits do not depend on where it sits */
                        tables[t]->gemm_q(M, n0, n1, w, xq + (size_t)(Mmax - M) * ld, ld,
                                          got + (size_t)(Mmax - M) * c->N, c->N);
                        for (int m = Mmax - M; m < Mmax; m++)
                            for (int n = 0; n < c->N; n++) {
                                float g = got[(size_t)m * c->N + n], e = ref[(size_t)m * c->N + n];
                                if (n < n0 || n >= n1) {
                                    if (g != -12345.0f)
                                        fail_msg("%s wrote outside [%d,%d)", cpu_isa_name(tables[t]->isa), n0, n1);
                                } else if (memcmp(&g, &e, 4)) {
                                    fail_msg("%s %s %s %dx%d M=%d [%d,%d) m=%d n=%d: %.9g, scalar %.9g",
                                             cpu_isa_name(tables[t]->isa), lay ? "panels" : "native",
                                             model_dtype_name(c->dt), c->N, c->K, M, n0, n1, m, n, g, e);
                                }
                            }
                    }
            }
        free(x), free(xq), free(ref), free(got), free(xd);
        mats_free(&q);
    }
}

/* A bigger matrix through the prefill path (many row tiles, chunks of
 * activation rows, 2-panel strips) against the decode path, row by row. */
static void test_prefill_vs_decode(void **state)
{
    (void)state;
    const enum model_dtype dts[] = {MODEL_Q8_0, MODEL_Q4_K, MODEL_Q5_K, MODEL_Q6_K, MODEL_AWQ4,
                                    MODEL_Q4_0, MODEL_Q5_1, MODEL_Q3_K, MODEL_IQ4_XS, MODEL_Q2_K};
    for (int t = 0; t < n_tables; t++)
        for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
            struct qcase c = {dts[i], 80, 1024, dts[i] == MODEL_AWQ4 ? 128 : 0};
            struct qmats q;
            mats_make(&c, &q);
            int M = 700;
            float *x = rand_x(M, c.K);
            size_t ld;
            uint8_t *xq = quant_rows(cpu_xq_for(c.dt), x, M, c.K, &ld);
            float *big = malloc((size_t)M * c.N * 4), *one = malloc((size_t)c.N * 4);
            const struct cpu_qmat *w = tables[t]->q_panels && q.wp ? &q.pan : &q.nat;
            tables[t]->gemm_q(M, 0, c.N, w, xq, ld, big, c.N);
            for (int m = 0; m < M; m += 37) {
                tables[t]->gemm_q(1, 0, c.N, w, xq + (size_t)m * ld, ld, one, c.N);
                if (memcmp(one, big + (size_t)m * c.N, (size_t)c.N * 4))
                    fail_msg("%s %s: row %d of M=%d differs from it alone", cpu_isa_name(tables[t]->isa),
                             model_dtype_name(c.dt), m, M);
            }
            free(x), free(xq), free(big), free(one);
            mats_free(&q);
        }
}

/* The prefill shapes of every table against the scalar table, bit for
 * bit: M of 16 and more (the AVX-512 table's Q8_0, Q4_K and Q6_K
 * products run on the AMX tile unit from 17 rows on, where the CPU has it,
 * 16 rows at a time, the rest on the VNNI tiles), K of 3 Q8_0 block pairs
 * (an odd number of pairs: the AMX loop's two-block tail), N split as the
 * threads split it. */
static void test_prefill_shapes(void **state)
{
    (void)state;
    const struct qcase cs[] = {{MODEL_Q8_0, 80, 192, 0}, {MODEL_Q8_0, 48, 512, 0}, {MODEL_Q4_K, 48, 512, 0},
                               {MODEL_Q6_K, 32, 256, 0}, {MODEL_Q4_0, 48, 192, 0}, {MODEL_IQ4_NL, 32, 256, 0},
                               {MODEL_Q3_K, 32, 512, 0}, {MODEL_IQ4_XS, 48, 512, 0}, {MODEL_Q5_1, 32, 192, 0},
                               {MODEL_Q2_K, 48, 256, 0}};
    const int Ms[] = {16, 17, 31, 48, 53};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        struct qmats q;
        mats_make(&cs[i], &q);
        int Mmax = 53, N = cs[i].N;
        float *x = rand_x(Mmax, cs[i].K);
        size_t ld;
        uint8_t *xq = quant_rows(cpu_xq_for(cs[i].dt), x, Mmax, cs[i].K, &ld);
        float *ref = malloc((size_t)Mmax * N * 4), *got = malloc((size_t)Mmax * N * 4);
        cpu_kernels_scalar()->gemm_q(Mmax, 0, N, &q.nat, xq, ld, ref, N);
        for (int t = 0; t < n_tables; t++) {
            const struct cpu_qmat *w = tables[t]->q_panels && q.wp ? &q.pan : &q.nat;
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                int M = Ms[mi];
                for (int z = 0; z < Mmax * N; z++)
                    got[z] = -12345.0f;
                tables[t]->gemm_q(M, 0, 16, w, xq, ld, got, N);
                tables[t]->gemm_q(M, 16, N, w, xq, ld, got, N);
                for (int m = 0; m < M; m++)
                    if (memcmp(got + (size_t)m * N, ref + (size_t)m * N, (size_t)N * 4))
                        fail_msg("%s %s %dx%d M=%d: row %d differs from the scalar table's",
                                 cpu_isa_name(tables[t]->isa), model_dtype_name(cs[i].dt), N, cs[i].K, M, m);
            }
        }
        free(x), free(xq), free(ref), free(got);
        mats_free(&q);
    }
}

/* What quantizing the activations costs, against the float64 product with
 * the original x: max over outputs of |y - exact| / sqrt(sum (w x)^2),
 * the error relative to the size of a typical output (random signs). The
 * bounds are about 1.5x the figures measured (printed: 0.015, 0.017,
 * 0.021, 0.016 on this test's seed; 0.016-0.021 for the other GGUF
 * formats), so a coarser rounding fails. */
static void test_activation_accuracy(void **state)
{
    (void)state;
    const struct {
        enum model_dtype dt;
        double bound;
    } f[] = {{MODEL_Q8_0, 0.025}, {MODEL_Q4_K, 0.03}, {MODEL_Q6_K, 0.035}, {MODEL_AWQ4, 0.025},
             {MODEL_Q4_0, 0.03}, {MODEL_Q4_1, 0.03}, {MODEL_Q5_0, 0.03}, {MODEL_Q5_1, 0.03},
             {MODEL_IQ4_NL, 0.03}, {MODEL_Q2_K, 0.03}, {MODEL_Q3_K, 0.03}, {MODEL_IQ4_XS, 0.03}};
    const struct cpu_kernels *k = cpu_kernels_get(cpu_isa_detect());
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        struct qcase c = {f[i].dt, 64, 1024, f[i].dt == MODEL_AWQ4 ? 128 : 0};
        struct qmats q;
        mats_make(&c, &q);
        /* ordinary scales: the figure is about x, not about extreme w */
        for (int r = 0; r < c.N; r++)
            for (int kk = 0; kk < c.K; kk++)
                if (!isfinite(q.wf[(size_t)r * c.K + kk]))
                    q.wf[(size_t)r * c.K + kk] = 0;
        int M = 8;
        float *x = malloc((size_t)M * c.K * 4);
        for (int z = 0; z < M * c.K; z++) /* normal-ish, like a normed hidden state */
            x[z] = (rndf() + rndf() + rndf()) * 0.6f;
        size_t ld;
        uint8_t *xq = quant_rows(cpu_xq_for(c.dt), x, M, c.K, &ld);
        float *y = malloc((size_t)M * c.N * 4);
        k->gemm_q(M, 0, c.N, &q.nat, xq, ld, y, c.N);
        double worst = 0;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < c.N; n++) {
                double r = 0, s2 = 0;
                for (int kk = 0; kk < c.K; kk++) {
                    double t = (double)q.wf[(size_t)n * c.K + kk] * x[(size_t)m * c.K + kk];
                    r += t, s2 += t * t;
                }
                if (s2 > 0) {
                    double e = fabs(y[(size_t)m * c.N + n] - r) / sqrt(s2);
                    worst = e > worst ? e : worst;
                }
            }
        print_message("  %s, activations in int8 blocks of %d: max |y - exact| / rms-scale %.4f (bound %.2f)\n",
                      model_dtype_name(c.dt), cpu_xq_block(cpu_xq_for(c.dt)), worst, f[i].bound);
        assert_true(worst < f[i].bound);
        free(x), free(xq), free(y);
        mats_free(&q);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_and_unpack),
        cmocka_unit_test(test_awq_convert),
        cmocka_unit_test(test_xq_quantize),
        cmocka_unit_test(test_products),
        cmocka_unit_test(test_prefill_vs_decode),
        cmocka_unit_test(test_prefill_shapes),
        cmocka_unit_test(test_activation_accuracy),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
