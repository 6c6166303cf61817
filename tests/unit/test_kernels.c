/* tests/unit/test_kernels.c - every kernel table this CPU can run, against a
 * double-precision reference and against itself (batch invariance).
 *
 * Error metric: for a dot product the tolerated error is
 *   |y - ref| <= tol * sum_k |x_k w_k|
 * i.e. relative to the magnitude of the terms, which is what f32
 * accumulation can promise (cancellation makes |ref| itself meaningless as
 * a scale). Tolerances are named per dtype below. */
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

/* f32 accumulation over up to K = 1000 terms in 16-lane trees: the bound is
 * ~ (K/16 + 4) * 2^-24 ~ 4e-6; 2e-5 leaves margin, yet a dropped or doubled
 * term (error ~ |term| / sum ~ 1e-3) still fails. */
#define TOL_GEMM_F32 2e-5
#define TOL_GEMM_BF16 2e-5 /* inputs are exact bf16, products exact in f32 */
#define TOL_GEMM_F16 2e-5
#define TOL_DOT 2e-5
#define TOL_AXPY 1e-6 /* one multiply-add per element, relative */
/* Scalar vs SIMD: both within their bound of the reference, so within two. */
#define TOL_CROSS (2 * TOL_GEMM_F32)

#define SENTINEL -12345.0f

/* ---- helpers ------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* uniform in [-1, 1) */
static float rnd_f(void)
{
    return (float)((double)rnd_u32() / 2147483648.0 - 1.0);
}

static uint16_t rnd_f16(void)
{
    /* normal halves in about [-8, 8]: exponent 10..17 of bias 15 */
    uint16_t sign = (uint16_t)((rnd_u32() & 1) << 15);
    uint16_t ex = (uint16_t)(10 + rnd_u32() % 8);
    return (uint16_t)(sign | (ex << 10) | (rnd_u32() & 0x3ff));
}

static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Tables this CPU can run; every test loops over them. */
static int available(const struct cpu_kernels *out[CPU_ISA_N])
{
    int n = 0;
    for (int i = 0; i < CPU_ISA_N; i++) {
        const struct cpu_kernels *k = cpu_kernels_get((enum cpu_isa)i);
        if (k)
            out[n++] = k;
    }
    return n;
}

enum dt { DT_F32, DT_BF16, DT_F16 };
static const char *const dt_name[] = {"f32", "bf16", "f16"};

/* One gemm problem with inputs in every representation. */
struct prob {
    int M, N, K, ldx, ldy;
    float *xf;      /* (M, ldx) f32; for bf16 already bf16-exact values */
    uint16_t *xb;   /* (M, ldx) bf16 bits of xf */
    float *wf;      /* (N, K) f32 values of the weights of dtype dt */
    uint16_t *wb;   /* (N, K) bf16 bits */
    uint16_t *wh;   /* (N, K) f16 bits */
    enum dt dt;
};

static void prob_init(struct prob *p, enum dt dt, int M, int N, int K, int xpad, int ypad)
{
    memset(p, 0, sizeof *p);
    p->dt = dt;
    p->M = M, p->N = N, p->K = K, p->ldx = K + xpad, p->ldy = N + ypad;
    size_t nx = (size_t)M * p->ldx, nw = (size_t)N * K;
    p->xf = malloc(nx * sizeof(float));
    p->xb = malloc(nx * sizeof(uint16_t));
    p->wf = malloc(nw * sizeof(float));
    p->wb = malloc(nw * sizeof(uint16_t));
    p->wh = malloc(nw * sizeof(uint16_t));
    assert_non_null(p->xf);
    assert_non_null(p->wh);
    for (size_t i = 0; i < nx; i++) {
        float v = rnd_f();
        if (dt == DT_BF16) {
            p->xb[i] = cpu_f32_to_bf16(v);
            v = cpu_bf16_to_f32(p->xb[i]);
        }
        p->xf[i] = v;
    }
    for (size_t i = 0; i < nw; i++) {
        if (dt == DT_F16) {
            p->wh[i] = rnd_f16();
            p->wf[i] = cpu_f16_to_f32(p->wh[i]);
        } else {
            float v = rnd_f();
            p->wb[i] = cpu_f32_to_bf16(v);
            p->wf[i] = dt == DT_BF16 ? cpu_bf16_to_f32(p->wb[i]) : v;
        }
    }
}

static void prob_free(struct prob *p)
{
    free(p->xf);
    free(p->xb);
    free(p->wf);
    free(p->wb);
    free(p->wh);
}

static float *new_y(const struct prob *p)
{
    size_t n = (size_t)p->M * p->ldy;
    float *y = malloc(n * sizeof(float));
    assert_non_null(y);
    for (size_t i = 0; i < n; i++)
        y[i] = SENTINEL;
    return y;
}

static void run_gemm(const struct cpu_kernels *k, const struct prob *p, int M,
                     int row0, int n0, int n1, float *y)
{
    size_t xo = (size_t)row0 * p->ldx, yo = (size_t)row0 * p->ldy;
    switch (p->dt) {
    case DT_F32: k->gemm_f32(M, n0, n1, p->K, p->xf + xo, p->ldx, p->wf, y + yo, p->ldy); break;
    case DT_BF16: k->gemm_bf16(M, n0, n1, p->K, p->xb + xo, p->ldx, p->wb, y + yo, p->ldy); break;
    case DT_F16: k->gemm_f16(M, n0, n1, p->K, p->xf + xo, p->ldx, p->wh, y + yo, p->ldy); break;
    }
}

static double tol_of(enum dt dt)
{
    return dt == DT_F32 ? TOL_GEMM_F32 : dt == DT_BF16 ? TOL_GEMM_BF16 : TOL_GEMM_F16;
}

/* Checks y against the reference on [n0, n1) and the sentinel elsewhere. */
static void check_gemm(const char *isa, const struct prob *p, int n0, int n1, const float *y)
{
    double tol = tol_of(p->dt);
    for (int m = 0; m < p->M; m++) {
        for (int n = 0; n < p->ldy; n++) {
            float got = y[(size_t)m * p->ldy + n];
            if (n < n0 || n >= n1) {
                if (got != SENTINEL)
                    fail_msg("%s %s M=%d K=%d [%d,%d): wrote outside at m=%d n=%d",
                             isa, dt_name[p->dt], p->M, p->K, n0, n1, m, n);
                continue;
            }
            double ref = 0, mag = 0;
            for (int kk = 0; kk < p->K; kk++) {
                double t = (double)p->xf[(size_t)m * p->ldx + kk] * p->wf[(size_t)n * p->K + kk];
                ref += t;
                mag += fabs(t);
            }
            double e = fabs((double)got - ref);
            if (!(e <= tol * mag + 1e-30))
                fail_msg("%s %s M=%d K=%d [%d,%d) m=%d n=%d: got %.9g ref %.9g rel %.3g > %.3g",
                         isa, dt_name[p->dt], p->M, p->K, n0, n1, m, n, got, ref,
                         e / (mag > 0 ? mag : 1), tol);
        }
    }
}

/* ---- conversions -------------------------------------------------------- */

static const struct { uint32_t in; uint16_t out; const char *what; } bf16_cases[] = {
    {0x3f800000u, 0x3f80, "1.0 exact"},
    {0x3f808000u, 0x3f80, "tie, even below: stays"},
    {0x3f818000u, 0x3f82, "tie, odd below: rounds up"},
    {0x3f808001u, 0x3f81, "just above the tie"},
    {0x3f807fffu, 0x3f80, "just below the tie"},
    {0xbf818000u, 0xbf82, "negative tie to even"},
    {0x7f7fffffu, 0x7f80, "max float rounds to inf"},
    {0x7f800000u, 0x7f80, "+inf"},
    {0xff800000u, 0xff80, "-inf"},
    {0x7fc00000u, 0x7fc0, "quiet NaN"},
    {0x7f800001u, 0x7fc0, "signalling NaN, low payload: must not become inf"},
    {0x7fffffffu, 0x7fff, "NaN all ones"},
    {0xffc00001u, 0xffc0, "negative NaN"},
    {0x80000000u, 0x8000, "-0"},
    {0x00010000u, 0x0001, "subnormal kept"},
    {0x00008000u, 0x0000, "subnormal tie to even (zero)"},
    {0x00018000u, 0x0002, "subnormal tie to even (up)"},
};

static void test_bf16_rounding(void **state)
{
    (void)state;
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks);
    size_t nc = sizeof bf16_cases / sizeof bf16_cases[0];
    for (size_t i = 0; i < nc; i++) {
        uint16_t got = cpu_f32_to_bf16(bits_f(bf16_cases[i].in));
        if (got != bf16_cases[i].out)
            fail_msg("cpu_f32_to_bf16(%08x) [%s] = %04x, want %04x", bf16_cases[i].in,
                     bf16_cases[i].what, got, bf16_cases[i].out);
    }
    /* Each table, on a vector long enough for its SIMD body plus a tail,
     * at every offset so every case hits every lane. */
    enum { L = 53 };
    float in[L];
    uint16_t out[L];
    for (int t = 0; t < nk; t++) {
        for (int off = 0; off < L; off++) {
            for (int i = 0; i < L; i++)
                in[i] = bits_f(bf16_cases[(size_t)(i + off) % nc].in);
            for (int n = 1; n <= L; n += (n < 20 ? 1 : 16)) {
                memset(out, 0xab, sizeof out);
                ks[t]->f32_to_bf16(in, out, n);
                for (int i = 0; i < L; i++) {
                    uint16_t want = i < n ? bf16_cases[(size_t)(i + off) % nc].out : 0xabab;
                    if (out[i] != want)
                        fail_msg("%s f32_to_bf16 n=%d [%d] of %08x = %04x, want %04x",
                                 cpu_isa_name(ks[t]->isa), n, i, f_bits(in[i]), out[i], want);
                }
            }
        }
        /* random values: every table agrees with the scalar bits exactly */
        float r[1000];
        uint16_t o[1000];
        for (int i = 0; i < 1000; i++)
            r[i] = bits_f(rnd_u32() ^ (rnd_u32() << 16));
        ks[t]->f32_to_bf16(r, o, 1000);
        for (int i = 0; i < 1000; i++)
            if (o[i] != cpu_f32_to_bf16(r[i]))
                fail_msg("%s f32_to_bf16(%08x) = %04x, scalar %04x",
                         cpu_isa_name(ks[t]->isa), f_bits(r[i]), o[i], cpu_f32_to_bf16(r[i]));
        /* and widening is exact */
        float back[1000];
        ks[t]->bf16_to_f32(o, back, 999);
        for (int i = 0; i < 999; i++)
            if (f_bits(back[i]) != (uint32_t)o[i] << 16)
                fail_msg("%s bf16_to_f32(%04x) = %08x", cpu_isa_name(ks[t]->isa), o[i],
                         f_bits(back[i]));
    }
}

static const struct { uint16_t h; uint32_t f; } f16_cases[] = {
    {0x3c00, 0x3f800000u}, {0xc000, 0xc0000000u}, {0x7bff, 0x477fe000u}, /* 65504 */
    {0x0001, 0x33800000u}, /* 2^-24 smallest subnormal */
    {0x03ff, 0x387fc000u}, /* largest subnormal */
    {0x8000, 0x80000000u}, {0x7c00, 0x7f800000u}, {0xfc00, 0xff800000u},
    {0x3555, 0x3eaaa000u}, /* ~1/3 */
};

static void test_f16_convert(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof f16_cases / sizeof f16_cases[0]; i++) {
        uint32_t got = f_bits(cpu_f16_to_f32(f16_cases[i].h));
        if (got != f16_cases[i].f)
            fail_msg("cpu_f16_to_f32(%04x) = %08x, want %08x", f16_cases[i].h, got, f16_cases[i].f);
    }
    assert_true(isnan(cpu_f16_to_f32(0x7e00)));
    /* every table's f16 gemm reads halves the same way: K = 1, x = 1 */
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks);
    enum { N = 9 };
    uint16_t w[N];
    for (int i = 0; i < N; i++)
        w[i] = f16_cases[i].h;
    float one = 1.0f;
    for (int t = 0; t < nk; t++) {
        for (int m = 0; m < 2; m++) { /* M = 1 path and tile path */
            float x2[2] = {1.0f, 1.0f}, y[2 * N];
            ks[t]->gemm_f16(m + 1, 0, N, 1, m ? x2 : &one, 1, w, y, N);
            for (int i = 0; i < N; i++)
                /* value compare: the sum starts at +0, so -0 comes out +0 */
                if (y[i] != bits_f(f16_cases[i].f))
                    fail_msg("%s gemm_f16 of half %04x = %08x, want %08x",
                             cpu_isa_name(ks[t]->isa), w[i], f_bits(y[i]), f16_cases[i].f);
        }
    }
}

/* ---- gemm accuracy ------------------------------------------------------ */

static const int acc_M[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13};
static const int acc_K[] = {1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 100, 1000};
static const struct { int n0, n1; } acc_N[] = {
    {0, 1}, {0, 37}, {3, 22}, {5, 40}, {16, 48}, {1, 2},
};

static void accuracy(enum dt dt)
{
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks);
    for (size_t ki = 0; ki < sizeof acc_K / sizeof acc_K[0]; ki++) {
        for (size_t mi = 0; mi < sizeof acc_M / sizeof acc_M[0]; mi++) {
            struct prob p;
            int K = acc_K[ki], M = acc_M[mi];
            if (K >= 1000 && M > 5 && M != 13)
                continue; /* the reference is slow; the shapes add nothing */
            prob_init(&p, dt, M, 48, K, (int)(rnd_u32() % 5), 3);
            for (size_t ni = 0; ni < sizeof acc_N / sizeof acc_N[0]; ni++) {
                for (int t = 0; t < nk; t++) {
                    float *y = new_y(&p);
                    run_gemm(ks[t], &p, M, 0, acc_N[ni].n0, acc_N[ni].n1, y);
                    check_gemm(cpu_isa_name(ks[t]->isa), &p, acc_N[ni].n0, acc_N[ni].n1, y);
                    free(y);
                }
            }
            prob_free(&p);
        }
    }
}

static void test_gemm_f32_accuracy(void **state) { (void)state; accuracy(DT_F32); }
static void test_gemm_bf16_accuracy(void **state) { (void)state; accuracy(DT_BF16); }
static void test_gemm_f16_accuracy(void **state) { (void)state; accuracy(DT_F16); }

/* A tolerance test that must fail: a deliberately wrong result is caught.
 * Guards against a check_gemm that silently accepts everything. */
static void test_checker_catches_errors(void **state)
{
    (void)state;
    struct prob p;
    prob_init(&p, DT_F32, 2, 16, 100, 0, 0);
    const struct cpu_kernels *k = cpu_kernels_scalar();
    float *y = new_y(&p);
    run_gemm(k, &p, 2, 0, 0, 16, y);
    /* drop one term from one output */
    double mag = 0;
    for (int kk = 0; kk < p.K; kk++)
        mag += fabs((double)p.xf[kk] * p.wf[5 * p.K + kk]);
    float drop = p.xf[50] * p.wf[5 * p.K + 50];
    y[5] -= drop;
    double rel = fabs(drop) / mag;
    /* so the test is meaningful, the dropped term is above the tolerance */
    if (rel > TOL_GEMM_F32) {
        double ref = 0;
        for (int kk = 0; kk < p.K; kk++)
            ref += (double)p.xf[kk] * p.wf[5 * p.K + kk];
        assert_true(fabs(y[5] - ref) > TOL_GEMM_F32 * mag);
    }
    free(y);
    prob_free(&p);
}

/* ---- batch invariance --------------------------------------------------- */

static void invariance(enum dt dt, int K)
{
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks);
    enum { M = 13, N = 64 };
    struct prob p;
    prob_init(&p, dt, M, N, K, 5, 7);
    for (int t = 0; t < nk; t++) {
        const char *isa = cpu_isa_name(ks[t]->isa);
        float *full = new_y(&p), *y = new_y(&p);
        run_gemm(ks[t], &p, M, 0, 0, N, full);
        /* each row alone (the M = 1 path) */
        for (int m = 0; m < M; m++)
            run_gemm(ks[t], &p, 1, m, 0, N, y);
        for (size_t i = 0; i < (size_t)M * p.ldy; i++)
            if (f_bits(full[i]) != f_bits(y[i]))
                fail_msg("%s %s K=%d: row %zu col %zu alone %.9g != in M=13 %.9g", isa,
                         dt_name[dt], K, i / p.ldy, i % p.ldy, y[i], full[i]);
        /* rows in uneven groups: 3 + 5 + 1 + 4, so each row sits at a
         * different tile position than in the M = 13 call */
        static const int groups[] = {3, 5, 1, 4};
        free(y);
        y = new_y(&p);
        for (int g = 0, m = 0; g < 4; m += groups[g], g++)
            run_gemm(ks[t], &p, groups[g], m, 0, N, y);
        assert_memory_equal(full, y, (size_t)M * p.ldy * sizeof(float));
        /* split n ranges, aligned and not */
        static const int cuts[][5] = {{0, 16, 48, 64, -1}, {0, 5, 21, 22, 64}, {0, 1, 35, 64, -1}};
        for (int c = 0; c < 3; c++) {
            free(y);
            y = new_y(&p);
            for (int j = 0; j < 4 && cuts[c][j + 1] >= 0; j++)
                run_gemm(ks[t], &p, M, 0, cuts[c][j], cuts[c][j + 1], y);
            for (size_t i = 0; i < (size_t)M * p.ldy; i++)
                if (f_bits(full[i]) != f_bits(y[i]))
                    fail_msg("%s %s K=%d split %d: (%zu,%zu) %.9g != %.9g", isa, dt_name[dt],
                             K, c, i / p.ldy, i % p.ldy, y[i], full[i]);
        }
        /* M = 1 with a split n range */
        free(y);
        y = new_y(&p);
        run_gemm(ks[t], &p, 1, 4, 0, 7, y);
        run_gemm(ks[t], &p, 1, 4, 7, N, y);
        assert_memory_equal(full + 4 * p.ldy, y + 4 * p.ldy, (size_t)N * sizeof(float));
        free(full);
        free(y);
    }
    prob_free(&p);
}

static void test_invariance_bf16(void **state)
{
    (void)state;
    static const int Ks[] = {1, 33, 1000, 1024};
    for (int i = 0; i < 4; i++)
        invariance(DT_BF16, Ks[i]);
}

static void test_invariance_f32(void **state)
{
    (void)state;
    static const int Ks[] = {1, 17, 1000};
    for (int i = 0; i < 3; i++)
        invariance(DT_F32, Ks[i]);
}

static void test_invariance_f16(void **state)
{
    (void)state;
    static const int Ks[] = {7, 1000};
    for (int i = 0; i < 2; i++)
        invariance(DT_F16, Ks[i]);
}

/* Large M crosses the blocked path's M-chunk boundary (mc rows of x per
 * chunk): rows on either side still match the row computed alone. */
static void test_invariance_big_m(void **state)
{
    (void)state;
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks);
    struct prob p;
    int M = 300, N = 20, K = 2048; /* 512 KB / (2048*2) = 128-row chunks */
    prob_init(&p, DT_BF16, M, N, K, 0, 0);
    for (int t = 0; t < nk; t++) {
        float *full = new_y(&p), *y = new_y(&p);
        run_gemm(ks[t], &p, M, 0, 0, N, full);
        for (int m = 0; m < M; m++)
            run_gemm(ks[t], &p, 1, m, 0, N, y);
        assert_memory_equal(full, y, (size_t)M * p.ldy * sizeof(float));
        free(full);
        free(y);
    }
    prob_free(&p);
}


/* ---- packed BF16 panels (gemm_bf16p) ------------------------------------ */

/* cpu_pack_bf16's panels of p's weights (the caller frees them). */
static uint16_t *pack_prob(const struct prob *p)
{
    uint16_t *wp = aligned_alloc(64, ((size_t)p->N * p->K * 2 + 63) / 64 * 64);
    assert_non_null(wp);
    cpu_pack_bf16(p->wb, p->N, p->K, wp);
    return wp;
}

/* gemm_bf16p on cpu_pack_bf16's panels: within the bf16 tolerance of the
 * reference, and bit-identical whatever M, the row grouping, the n split or
 * the K chunking (M > 24 takes the K-chunked prefill path, K = 1000 and
 * 3072 cross its 256-element chunks). */
static void test_packed_bf16(void **state)
{
    (void)state;
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks), tested = 0;
    static const int Ks[] = {2, 34, 1000, 3072};
    for (int t = 0; t < nk; t++) {
        if (!ks[t]->gemm_bf16p)
            continue;
        const char *isa = cpu_isa_name(ks[t]->isa);
        for (int ki = 0; ki < 4; ki++) {
            enum { M = 40, N = 96 };
            int K = Ks[ki];
            struct prob p;
            prob_init(&p, DT_BF16, M, N, K, 6, 5);
            uint16_t *wp = pack_prob(&p);
            /* the layout: element (n, k) where kernels.h says */
            for (int n = 0; n < N; n += 7)
                for (int kk = 0; kk < K; kk += 3)
                    assert_int_equal(wp[((size_t)(n / 16) * (K / 2) + kk / 2) * 32 + (n % 16) * 2 + kk % 2],
                                     p.wb[(size_t)n * K + kk]);
            float *full = new_y(&p), *y = new_y(&p);
            ks[t]->gemm_bf16p(M, 0, N, K, p.xb, p.ldx, wp, full, p.ldy);
            check_gemm(isa, &p, 0, N, full);
            for (int m = 0; m < M; m++)
                ks[t]->gemm_bf16p(1, 0, N, K, p.xb + (size_t)m * p.ldx, p.ldx, wp,
                                  y + (size_t)m * p.ldy, p.ldy);
            for (size_t i = 0; i < (size_t)M * p.ldy; i++)
                if (f_bits(full[i]) != f_bits(y[i]))
                    fail_msg("%s packed K=%d: (%zu,%zu) alone %.9g != in M=40 %.9g", isa, K,
                             i / p.ldy, i % p.ldy, y[i], full[i]);
            /* uneven row groups and a split n range, each row at another
             * tile position and with another chunking than above */
            static const int groups[] = {3, 5, 1, 4, 27};
            free(y);
            y = new_y(&p);
            for (int g = 0, m = 0; g < 5; m += groups[g], g++) {
                ks[t]->gemm_bf16p(groups[g], 0, 32, K, p.xb + (size_t)m * p.ldx, p.ldx, wp,
                                  y + (size_t)m * p.ldy, p.ldy);
                ks[t]->gemm_bf16p(groups[g], 32, N, K, p.xb + (size_t)m * p.ldx, p.ldx, wp,
                                  y + (size_t)m * p.ldy, p.ldy);
            }
            assert_memory_equal(full, y, (size_t)M * p.ldy * sizeof(float));
            /* a column range leaves the rest alone */
            free(y);
            y = new_y(&p);
            ks[t]->gemm_bf16p(M, 16, 48, K, p.xb, p.ldx, wp, y, p.ldy);
            check_gemm(isa, &p, 16, 48, y);
            free(full), free(y), free(wp);
            prob_free(&p);
            tested++;
        }
    }
    if (!tested)
        printf("  (no table here has gemm_bf16p)\n");
}

/* y equals full bit for bit on columns [n0, n1) and was not written
 * elsewhere (still SENTINEL). */
static void same_in_range(const char *isa, const char *what, const struct prob *p, int n0, int n1,
                          const float *full, const float *y)
{
    for (int m = 0; m < p->M; m++)
        for (int n = 0; n < p->ldy; n++) {
            float got = y[(size_t)m * p->ldy + n];
            float want = n >= n0 && n < n1 ? full[(size_t)m * p->ldy + n] : SENTINEL;
            if (f_bits(got) != f_bits(want))
                fail_msg("%s %s K=%d [%d,%d) (%d,%d): %.9g, want %.9g", isa, what, p->K, n0, n1, m, n,
                         got, want);
        }
}

/* Decode rows (M = 1..4) take tiles of panels far apart (a share of the
 * column range each, kernels_avx512.c): on ranges of many panels, with a
 * remainder of 1-3 panels and starting off zero, every row in groups of
 * 1..4 equals the same row of one M = 40 product bit for bit, and nothing
 * outside the range is written. */
static void test_packed_spread(void **state)
{
    (void)state;
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks), tested = 0;
    static const int Ks[] = {34, 1000};
    /* column ranges: 23 panels (5 per share, 3 left), 22, 7, 1, 4 */
    static const int rng[][2] = {{0, 368}, {16, 368}, {48, 160}, {352, 368}, {64, 128}};
    for (int t = 0; t < nk; t++) {
        if (!ks[t]->gemm_bf16p)
            continue;
        const char *isa = cpu_isa_name(ks[t]->isa);
        for (int ki = 0; ki < 2; ki++) {
            enum { M = 40, N = 368 };
            int K = Ks[ki];
            struct prob p;
            prob_init(&p, DT_BF16, M, N, K, 6, 5);
            uint16_t *wp = pack_prob(&p);
            float *full = new_y(&p);
            ks[t]->gemm_bf16p(M, 0, N, K, p.xb, p.ldx, wp, full, p.ldy);
            for (int r = 0; r < 5; r++) {
                int n0 = rng[r][0], n1 = rng[r][1];
                float *y = new_y(&p);
                for (int m = 0, g = 1; m < M; m += g, g = g % 4 + 1) {
                    int rows = M - m < g ? M - m : g;
                    ks[t]->gemm_bf16p(rows, n0, n1, K, p.xb + (size_t)m * p.ldx, p.ldx, wp,
                                      y + (size_t)m * p.ldy, p.ldy);
                }
                same_in_range(isa, "spread", &p, n0, n1, full, y);
                free(y);
                /* the same range tile by tile, back to front, rows 1..4 at a time */
                if (!ks[t]->gemm_bf16p_tiles)
                    continue;
                y = new_y(&p);
                int nt = cpu_spread_tiles(n1 - n0, 0);
                for (int m = 0, g = 1; m < M; m += g, g = g % 4 + 1) {
                    int rows = M - m < g ? M - m : g;
                    for (int tile = nt - 1; tile >= 0; tile--)
                        ks[t]->gemm_bf16p_tiles(rows, n0, n1, tile, tile + 1, K, p.xb + (size_t)m * p.ldx,
                                                p.ldx, wp, NULL, y + (size_t)m * p.ldy, NULL, p.ldy, NULL, 0);
                }
                same_in_range(isa, "tiles", &p, n0, n1, full, y);
                free(y);
            }
            free(full), free(wp);
            prob_free(&p);
            tested++;
        }
    }
    if (!tested)
        printf("  (no table here has gemm_bf16p)\n");
}

/* The fused gate/up product: h equals bf16(swiglu(g, u)) of two separate
 * gemm_bf16p products bit for bit, for M that take one pass over K (decode)
 * and M that cut K in chunks (prefill), on column ranges with a 16-panel
 * tail, rows alone or together. */
static void test_packed_glu(void **state)
{
    (void)state;
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks), tested = 0;
    for (int t = 0; t < nk; t++) {
        const struct cpu_kernels *k = ks[t];
        if (!k->gemm_bf16p_glu)
            continue;
        const char *isa = cpu_isa_name(k->isa);
        static const int Ms[] = {1, 3, 5, 16, 40};
        /* 11 panels: decode tiles pair panel i with i + 5, and 32..N leaves one over */
        enum { N = 176, K = 1000 };
        for (int mi = 0; mi < 5; mi++) {
            int M = Ms[mi];
            struct prob g, u;
            prob_init(&g, DT_BF16, M, N, K, 6, 5);
            prob_init(&u, DT_BF16, M, N, K, 6, 5);
            for (size_t i = 0; i < (size_t)N * K; i++) /* another up matrix, same x */
                u.wb[i] = g.wb[((size_t)N * K - 1 - i)];
            uint16_t *wg = aligned_alloc(64, (size_t)N * K * 2), *wu = aligned_alloc(64, (size_t)N * K * 2);
            cpu_pack_bf16(g.wb, N, K, wg);
            cpu_pack_bf16(u.wb, N, K, wu);
            float *yg = new_y(&g), *yu = new_y(&g), *sg = new_y(&g), *su = new_y(&g);
            uint16_t *h = calloc((size_t)M * N, 2), *e = calloc((size_t)M * N, 2);
            k->gemm_bf16p(M, 0, N, K, g.xb, g.ldx, wg, yg, g.ldy);
            k->gemm_bf16p(M, 0, N, K, g.xb, g.ldx, wu, yu, g.ldy);
            for (int m = 0; m < M; m++) {
                k->swiglu(yg + (size_t)m * g.ldy, yu + (size_t)m * g.ldy, N);
                k->f32_to_bf16(yg + (size_t)m * g.ldy, e + (size_t)m * N, N);
            }
            /* two column ranges (the second ends in a lone panel) */
            k->gemm_bf16p_glu(M, 0, 32, K, g.xb, g.ldx, wg, wu, sg, su, g.ldy, h, N);
            k->gemm_bf16p_glu(M, 32, N, K, g.xb, g.ldx, wg, wu, sg, su, g.ldy, h, N);
            for (size_t i = 0; i < (size_t)M * N; i++)
                if (h[i] != e[i])
                    fail_msg("%s glu M=%d (%zu,%zu): 0x%04x, separate products 0x%04x", isa, M,
                             i / N, i % N, h[i], e[i]);
            /* decode rows: tile by tile, last first, over two ranges */
            if (k->gemm_bf16p_tiles && M <= CPU_SPREAD_MAX_M) {
                memset(h, 0, (size_t)M * N * 2);
                static const int cut[3] = {0, 64, N};
                for (int part = 0; part < 2; part++)
                    for (int tile = cpu_spread_tiles(cut[part + 1] - cut[part], 1) - 1; tile >= 0; tile--)
                        k->gemm_bf16p_tiles(M, cut[part], cut[part + 1], tile, tile + 1, K, g.xb, g.ldx,
                                            wg, wu, sg, su, g.ldy, h, N);
                assert_memory_equal(h, e, (size_t)M * N * 2);
            }
            /* each row alone */
            memset(h, 0, (size_t)M * N * 2);
            for (int m = 0; m < M; m++)
                k->gemm_bf16p_glu(1, 0, N, K, g.xb + (size_t)m * g.ldx, g.ldx, wg, wu, sg, su, g.ldy,
                                  h + (size_t)m * N, N);
            assert_memory_equal(h, e, (size_t)M * N * 2);
            free(yg), free(yu), free(sg), free(su), free(h), free(e), free(wg), free(wu);
            prob_free(&g);
            prob_free(&u);
            tested++;
        }
    }
    if (!tested)
        printf("  (no table here has gemm_bf16p_glu)\n");
}

/* norm_rope against rmsnorm then the rotation in double, on rows that
 * share cos/sin; a row alone equals the same row among others. */
static void test_norm_rope(void **state)
{
    (void)state;
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks), tested = 0;
    for (int t = 0; t < nk; t++) {
        const struct cpu_kernels *k = ks[t];
        if (!k->norm_rope)
            continue;
        enum { N = 5, HD = 128 };
        static float x[N][HD], y[N][HD], one[HD], w[HD], cs[HD / 2], sn[HD / 2];
        for (int d = 0; d < HD; d++)
            w[d] = 1 + rnd_f() / 2;
        for (int i = 0; i < HD / 2; i++) {
            double a = (i + 1) * 0.37;
            cs[i] = (float)cos(a);
            sn[i] = (float)sin(a);
        }
        for (int r = 0; r < N; r++)
            for (int d = 0; d < HD; d++)
                x[r][d] = y[r][d] = 3 * rnd_f();
        k->norm_rope(&y[0][0], N, HD, w, 1e-6f, cs, sn);
        for (int r = 0; r < N; r++) {
            double ss = 0, n[HD];
            for (int d = 0; d < HD; d++)
                ss += (double)x[r][d] * x[r][d];
            for (int d = 0; d < HD; d++)
                n[d] = w[d] * (x[r][d] / sqrt(ss / HD + 1e-6));
            for (int i = 0; i < HD / 2; i++) {
                double a = n[i] * cs[i] - n[i + HD / 2] * sn[i], b = n[i + HD / 2] * cs[i] + n[i] * sn[i];
                if (fabs(y[r][i] - a) > 1e-5 * (1 + fabs(a)) || fabs(y[r][i + HD / 2] - b) > 1e-5 * (1 + fabs(b)))
                    fail_msg("%s norm_rope row %d pair %d: (%.9g, %.9g) vs (%.9g, %.9g)",
                             cpu_isa_name(k->isa), r, i, y[r][i], y[r][i + HD / 2], a, b);
            }
            memcpy(one, x[r], sizeof one);
            k->norm_rope(one, 1, HD, w, 1e-6f, cs, sn);
            assert_memory_equal(one, y[r], sizeof one);
        }
        tested++;
    }
    if (!tested)
        printf("  (no table here has norm_rope)\n");
}


/* ---- attention pieces: softmax, P x V ----------------------------------- */

/* softmax against double exp (2 ulp-ish), its sum; scores bit-identical to
 * gemm_bf16 (sentinels stay outside [0, n)); P x V bit-identical to
 * the same table's axpy loop (both are one fused multiply-add per key and
 * column, keys ascending), for row counts that cross the 4-row tile, head
 * sizes with and without a 64-column tail, and row/key ranges cut apart. */
static void test_attention_pieces(void **state)
{
    (void)state;
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks), tested = 0;
    for (int t = 0; t < nk; t++) {
        const struct cpu_kernels *k = ks[t];
        const char *isa = cpu_isa_name(k->isa);
        if (k->softmax) {
            static const int ns[] = {1, 15, 16, 17, 100, 1000};
            for (int i = 0; i < 6; i++) {
                int n = ns[i];
                float *s = malloc((size_t)n * 4);
                double *ref = malloc((size_t)n * 8), mx = -INFINITY, rs = 0;
                for (int j = 0; j < n; j++) {
                    s[j] = 30 * rnd_f();
                    mx = fmax(mx, (double)(s[j] * 0.125f));
                }
                for (int j = 0; j < n; j++)
                    rs += ref[j] = exp((double)(s[j] * 0.125f) - mx);
                float sum = k->softmax(s, n, 0.125f);
                for (int j = 0; j < n; j++)
                    if (fabs(s[j] - ref[j]) > 1e-6 * ref[j] + 1e-38)
                        fail_msg("%s softmax n=%d [%d]: %.9g vs %.9g", isa, n, j, s[j], ref[j]);
                assert_true(fabs(sum - rs) <= 1e-5 * rs);
                free(s), free(ref);
            }
            tested++;
        }
        if (k->scores_bf16) {
            /* scores: the same bits as gemm_bf16, rows and keys with tails */
            static const int Rs[] = {1, 2, 3, 8}, ns[] = {1, 7, 8, 16};
            for (int hd = 32; hd <= 128; hd += 96)
                for (int ri = 0; ri < 4; ri++)
                    for (int ni = 0; ni < 4; ni++) {
                        int R = Rs[ri], n = ns[ni], ldq = hd + 32, lds = 19;
                        uint16_t *q = malloc((size_t)R * ldq * 2), *kk = malloc((size_t)n * hd * 2);
                        float *a = malloc((size_t)R * lds * 4), *e = malloc((size_t)R * lds * 4);
                        for (int i = 0; i < R * ldq; i++)
                            q[i] = cpu_f32_to_bf16(rnd_f());
                        for (int i = 0; i < n * hd; i++)
                            kk[i] = cpu_f32_to_bf16(rnd_f());
                        for (int i = 0; i < R * lds; i++)
                            a[i] = e[i] = SENTINEL;
                        k->scores_bf16(R, n, q, ldq, kk, hd, a, lds);
                        k->gemm_bf16(R, 0, n, hd, q, ldq, kk, e, lds);
                        for (int i = 0; i < R * lds; i++)
                            if (f_bits(a[i]) != f_bits(e[i]))
                                fail_msg("%s scores R=%d n=%d hd=%d: [%d] %.9g vs gemm %.9g", isa,
                                         R, n, hd, i, a[i], e[i]);
                        free(q), free(kk), free(a), free(e);
                    }
            tested++;
        }
        for (int b = 0; b < 2; b++) {
            if (b ? !k->pv_bf16 : !k->pv_f32)
                continue;
            static const int hds[] = {16, 80, 128};
            for (int hi = 0; hi < 3; hi++)
                for (int R = 1; R <= 9; R += 4) {
                    int hd = hds[hi], n = 21, ldp = 37;
                    float *p = malloc((size_t)R * ldp * 4), *o = malloc((size_t)R * hd * 4),
                          *e = malloc((size_t)R * hd * 4), *vf = malloc((size_t)n * hd * 4);
                    uint16_t *vb = malloc((size_t)n * hd * 2);
                    for (int i = 0; i < R * ldp; i++)
                        p[i] = (rnd_f() + 1) / 2;
                    for (int i = 0; i < n * hd; i++) {
                        vb[i] = cpu_f32_to_bf16(rnd_f());
                        vf[i] = rnd_f();
                    }
                    for (int i = 0; i < R * hd; i++)
                        o[i] = e[i] = rnd_f();
                    for (int r = 0; r < R; r++)
                        for (int j = 0; j < n; j++) {
                            if (b)
                                k->axpy_bf16(p[r * ldp + j], vb + (size_t)j * hd, e + (size_t)r * hd, hd);
                            else
                                k->axpy_f32(p[r * ldp + j], vf + (size_t)j * hd, e + (size_t)r * hd, hd);
                        }
                    /* keys in two ranges, the first for all rows at once */
                    if (b) {
                        k->pv_bf16(R, 8, p, ldp, vb, hd, o, hd);
                        k->pv_bf16(R, n - 8, p + 8, ldp, vb + (size_t)8 * hd, hd, o, hd);
                    } else {
                        k->pv_f32(R, 8, p, ldp, vf, hd, o, hd);
                        k->pv_f32(R, n - 8, p + 8, ldp, vf + (size_t)8 * hd, hd, o, hd);
                    }
                    for (int i = 0; i < R * hd; i++)
                        if (f_bits(o[i]) != f_bits(e[i]))
                            fail_msg("%s pv_%s R=%d hd=%d: [%d] %.9g vs axpy %.9g", isa,
                                     b ? "bf16" : "f32", R, hd, i, o[i], e[i]);
                    free(p), free(o), free(e), free(vf), free(vb);
                }
            tested++;
        }
    }
    if (!tested)
        printf("  (no table here has the attention pieces)\n");
}

/* Packed-KV attention (kernels.h): tokens written with kv_put_bf16p land
 * where the layouts say; scores_bf16p and pv_bf16p agree with a double
 * reference on the same bf16 inputs, and each output's bits do not depend
 * on R, on the number of blocks or on the keys past a row's own (p = 0),
 * and pv never adds a value past n_last even when that slot holds NaN. */
static void test_packed_attention(void **state)
{
    (void)state;
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks), tested = 0;
    for (int t = 0; t < nk; t++) {
        const struct cpu_kernels *k = ks[t];
        if (!k->kv_put_bf16p || !k->scores_bf16p || !k->pv_bf16p)
            continue;
        const char *isa = cpu_isa_name(k->isa);
        enum { NB = 5, HD = 64, R = 9, LD = NB * 16 };
        uint16_t *kb[NB], *vb[NB];
        static uint16_t kx[NB * 16][HD], vx[NB * 16][HD]; /* what went in, as bf16 */
        for (int b = 0; b < NB; b++) {
            kb[b] = aligned_alloc(64, 16 * HD * 2);
            vb[b] = aligned_alloc(64, 16 * HD * 2);
            memset(kb[b], 0xff, 16 * HD * 2); /* NaN everywhere not written */
            memset(vb[b], 0xff, 16 * HD * 2);
        }
        int n_keys = 16 * (NB - 1) + 7; /* the last block holds 7 */
        for (int j = 0; j < n_keys; j++) {
            float kf[HD], vf[HD];
            for (int d = 0; d < HD; d++) {
                kf[d] = rnd_f();
                vf[d] = rnd_f();
                kx[j][d] = cpu_f32_to_bf16(kf[d]);
                vx[j][d] = cpu_f32_to_bf16(vf[d]);
            }
            k->kv_put_bf16p(kf, vf, HD, j % 16, kb[j / 16], vb[j / 16]);
        }
        for (int j = 0; j < n_keys; j++)
            for (int d = 0; d < HD; d++) {
                int s = j % 16;
                assert_int_equal(kb[j / 16][(d / 2) * 32 + s * 2 + d % 2], kx[j][d]);
                assert_int_equal(vb[j / 16][((d / 16) * 8 + s / 2) * 32 + (d % 16) * 2 + s % 2], vx[j][d]);
            }
        /* scores: all R rows and blocks at once, against the reference and
         * against one row / one block at a time */
        static uint16_t q[R][HD];
        static float sc[R][LD], one[1][16];
        for (int r = 0; r < R; r++)
            for (int d = 0; d < HD; d++)
                q[r][d] = cpu_f32_to_bf16(rnd_f());
        k->scores_bf16p(R, NB, &q[0][0], HD, (const uint16_t *const *)kb, HD, &sc[0][0], LD);
        for (int r = 0; r < R; r++)
            for (int j = 0; j < n_keys; j++) {
                double ref = 0;
                for (int d = 0; d < HD; d++)
                    ref += (double)cpu_bf16_to_f32(q[r][d]) * cpu_bf16_to_f32(kx[j][d]);
                if (fabs(sc[r][j] - ref) > 1e-4 * (1 + fabs(ref)))
                    fail_msg("%s scores_bf16p [%d][%d]: %.9g vs %.9g", isa, r, j, sc[r][j], ref);
            }
        for (int r = 0; r < R; r++)
            for (int b = 0; b < NB; b++) {
                k->scores_bf16p(1, 1, q[r], HD, (const uint16_t *const *)&kb[b], HD, &one[0][0], 16);
                for (int j = 0; j < 16 && b * 16 + j < n_keys; j++)
                    if (f_bits(one[0][j]) != f_bits(sc[r][b * 16 + j]))
                        fail_msg("%s scores_bf16p row %d block %d key %d: alone %.9g, in the tile %.9g",
                                 isa, r, b, j, one[0][j], sc[r][b * 16 + j]);
            }
        /* P x V: row r uses keys 0..len[r]-1 (zeros after); all rows over
         * every key, then each row alone over just its own keys */
        static uint16_t p[R][LD];
        static float o[R][HD], o1[HD];
        int len[R];
        for (int r = 0; r < R; r++) {
            len[r] = r == R - 1 ? n_keys : 1 + (r * 13) % n_keys;
            for (int j = 0; j < LD; j++)
                p[r][j] = j < len[r] ? cpu_f32_to_bf16((rnd_f() + 1) / 2) : 0;
        }
        memset(o, 0, sizeof o);
        k->pv_bf16p(R, NB, n_keys - 16 * (NB - 1), &p[0][0], LD, (const uint16_t *const *)vb, HD, &o[0][0], HD);
        for (int r = 0; r < R; r++) {
            for (int d = 0; d < HD; d++) {
                double ref = 0;
                for (int j = 0; j < len[r]; j++)
                    ref += (double)cpu_bf16_to_f32(p[r][j]) * cpu_bf16_to_f32(vx[j][d]);
                if (fabs(o[r][d] - ref) > 1e-4 * (1 + fabs(ref)))
                    fail_msg("%s pv_bf16p [%d][%d]: %.9g vs %.9g", isa, r, d, o[r][d], ref);
            }
            memset(o1, 0, sizeof o1);
            int nb = (len[r] + 15) / 16;
            k->pv_bf16p(1, nb, len[r] - 16 * (nb - 1), p[r], LD, (const uint16_t *const *)vb, HD, o1, HD);
            for (int d = 0; d < HD; d++)
                if (f_bits(o1[d]) != f_bits(o[r][d]))
                    fail_msg("%s pv_bf16p row %d (%d keys) dim %d: alone %.9g, in the tile %.9g", isa,
                             r, len[r], d, o1[d], o[r][d]);
        }
        for (int b = 0; b < NB; b++)
            free(kb[b]), free(vb[b]);
        tested++;
    }
    if (!tested)
        printf("  (no table here has the packed attention kernels)\n");
}


/* rmsnorm and swiglu against double references, tails included, and
 * rmsnorm in place (y == x) equal to out of place. */
static void test_row_helpers(void **state)
{
    (void)state;
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks);
    static const int ns[] = {1, 16, 37, 1024};
    for (int t = 0; t < nk; t++) {
        const struct cpu_kernels *k = ks[t];
        for (int i = 0; i < 4; i++) {
            int n = ns[i];
            float *x = malloc((size_t)n * 4), *w = malloc((size_t)n * 4), *y = malloc((size_t)n * 4),
                  *u = malloc((size_t)n * 4);
            double ss = 0;
            for (int j = 0; j < n; j++) {
                x[j] = 3 * rnd_f(), w[j] = rnd_f(), u[j] = rnd_f();
                ss += (double)x[j] * x[j];
            }
            double r = 1.0 / sqrt(ss / n + 1e-6);
            if (k->rmsnorm) {
                k->rmsnorm(x, w, y, n, 1e-6f);
                for (int j = 0; j < n; j++)
                    if (fabs(y[j] - w[j] * x[j] * r) > 1e-6 * fabs(w[j] * x[j] * r) + 1e-30)
                        fail_msg("%s rmsnorm n=%d [%d]: %.9g vs %.9g", cpu_isa_name(k->isa), n, j,
                                 y[j], w[j] * x[j] * r);
                float *z = malloc((size_t)n * 4);
                memcpy(z, x, (size_t)n * 4);
                k->rmsnorm(z, w, z, n, 1e-6f);
                assert_memory_equal(z, y, (size_t)n * 4);
                free(z);
            }
            if (k->swiglu) {
                memcpy(y, x, (size_t)n * 4);
                x[0] = -200.0f; /* exp overflows: silu is -0, not NaN */
                y[0] = -200.0f;
                k->swiglu(y, u, n);
                for (int j = 0; j < n; j++) {
                    double e = x[j] / (1.0 + exp(-(double)x[j])) * u[j];
                    if (!(fabs(y[j] - e) <= 2e-6 * fabs(e) + 1e-30))
                        fail_msg("%s swiglu n=%d [%d] x=%g: %.9g vs %.9g", cpu_isa_name(k->isa), n,
                                 j, x[j], y[j], e);
                }
            }
            free(x), free(w), free(y), free(u);
        }
    }
}

/* ---- scalar vs SIMD ----------------------------------------------------- */

static void test_cross_isa(void **state)
{
    (void)state;
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks);
    struct prob p;
    prob_init(&p, DT_BF16, 6, 40, 777, 1, 1);
    float *ref = new_y(&p);
    run_gemm(cpu_kernels_scalar(), &p, 6, 0, 0, 40, ref);
    for (int t = 0; t < nk; t++) {
        float *y = new_y(&p);
        run_gemm(ks[t], &p, 6, 0, 0, 40, y);
        for (int m = 0; m < 6; m++)
            for (int n = 0; n < 40; n++) {
                double mag = 0;
                for (int kk = 0; kk < p.K; kk++)
                    mag += fabs((double)p.xf[m * p.ldx + kk] * p.wf[n * p.K + kk]);
                double e = fabs((double)y[m * p.ldy + n] - ref[m * p.ldy + n]);
                if (e > TOL_CROSS * mag)
                    fail_msg("%s vs scalar (%d,%d): %.9g vs %.9g", cpu_isa_name(ks[t]->isa),
                             m, n, y[m * p.ldy + n], ref[m * p.ldy + n]);
            }
        free(y);
    }
    free(ref);
    prob_free(&p);
}

/* ---- attention helpers -------------------------------------------------- */

static void test_dot_axpy(void **state)
{
    (void)state;
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks);
    static const int ns[] = {1, 7, 15, 16, 17, 31, 32, 33, 64, 100, 128, 129};
    float a[129], b[129], y0[129], y[129];
    uint16_t ab[129];
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        int n = ns[ni];
        for (int i = 0; i < n; i++) {
            a[i] = rnd_f();
            b[i] = rnd_f();
            y0[i] = rnd_f();
            ab[i] = cpu_f32_to_bf16(a[i]);
        }
        double rd = 0, rdb = 0, mag = 0, magb = 0;
        for (int i = 0; i < n; i++) {
            rd += (double)a[i] * b[i];
            mag += fabs((double)a[i] * b[i]);
            rdb += (double)cpu_bf16_to_f32(ab[i]) * b[i];
            magb += fabs((double)cpu_bf16_to_f32(ab[i]) * b[i]);
        }
        for (int t = 0; t < nk; t++) {
            const char *isa = cpu_isa_name(ks[t]->isa);
            float d = ks[t]->dot_f32(a, b, n);
            if (fabs(d - rd) > TOL_DOT * mag)
                fail_msg("%s dot_f32 n=%d: %.9g vs %.9g", isa, n, d, rd);
            d = ks[t]->dot_bf16_f32(ab, b, n);
            if (fabs(d - rdb) > TOL_DOT * magb)
                fail_msg("%s dot_bf16_f32 n=%d: %.9g vs %.9g", isa, n, d, rdb);
            float s = 0.37f;
            for (int pass = 0; pass < 2; pass++) {
                memcpy(y, y0, sizeof y);
                if (pass == 0)
                    ks[t]->axpy_f32(s, a, y, n);
                else
                    ks[t]->axpy_bf16(s, ab, y, n);
                for (int i = 0; i < 129; i++) {
                    double xv = pass ? cpu_bf16_to_f32(ab[i]) : a[i];
                    double want = i < n ? (double)y0[i] + (double)s * xv : y0[i];
                    double sc = i < n ? fabs(y0[i]) + fabs(s * xv) : 0;
                    if (fabs(y[i] - want) > TOL_AXPY * sc)
                        fail_msg("%s axpy_%s n=%d [%d]: %.9g vs %.9g", isa,
                                 pass ? "bf16" : "f32", n, i, y[i], want);
                }
            }
        }
    }
}

/* lora_up against a double sum, nothing written past n, and the same bits
 * for a column whatever piece of [0, n) it is computed in */
static void test_lora_up(void **state)
{
    (void)state;
    const struct cpu_kernels *ks[CPU_ISA_N];
    int nk = available(ks);
    enum { R = 19, LD = 203 };
    static const int ns[] = {1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 129, 200};
    static float t[R], w[R * LD], y0[LD], y[LD], yp[LD];
    for (int k = 0; k < R; k++)
        t[k] = rnd_f();
    for (int i = 0; i < R * LD; i++)
        w[i] = rnd_f();
    for (int i = 0; i < LD; i++)
        y0[i] = rnd_f();
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (int r = 1; r <= R; r += 6)
            for (int x = 0; x < nk; x++) {
                int n = ns[ni];
                const char *isa = cpu_isa_name(ks[x]->isa);
                memcpy(y, y0, sizeof y);
                ks[x]->lora_up(r, t, w, LD, y, n);
                for (int i = 0; i < LD; i++) {
                    double want = y0[i], mag = fabs(y0[i]);
                    for (int k = 0; i < n && k < r; k++) {
                        want += (double)t[k] * w[k * LD + i];
                        mag += fabs((double)t[k] * w[k * LD + i]);
                    }
                    if (fabs(y[i] - want) > TOL_DOT * mag + (i >= n ? 0 : 1e-30))
                        fail_msg("%s lora_up r=%d n=%d [%d]: %.9g vs %.9g", isa, r, n, i, y[i], want);
                }
                /* in two pieces cut anywhere: the same bits */
                int cut = n / 3;
                memcpy(yp, y0, sizeof yp);
                ks[x]->lora_up(r, t, w + cut, LD, yp + cut, n - cut);
                ks[x]->lora_up(r, t, w, LD, yp, cut);
                assert_memory_equal(yp, y, sizeof y);
            }
}

/* ---- dispatch ----------------------------------------------------------- */

static void test_dispatch(void **state)
{
    (void)state;
    assert_non_null(cpu_kernels_get(CPU_ISA_SCALAR));
    assert_int_equal(cpu_kernels_get(CPU_ISA_SCALAR)->isa, CPU_ISA_SCALAR);
    enum cpu_isa best = cpu_isa_detect();
    assert_non_null(cpu_kernels_get(best));
    assert_int_equal(cpu_kernels_get(best)->isa, best);
    assert_null(cpu_kernels_get(CPU_ISA_N));
    assert_int_equal(cpu_isa_parse("scalar"), CPU_ISA_SCALAR);
    assert_int_equal(cpu_isa_parse("avx2"), CPU_ISA_AVX2);
    assert_int_equal(cpu_isa_parse("avx512bf16"), CPU_ISA_AVX512BF16);
    assert_int_equal(cpu_isa_parse("auto"), best);
    assert_int_equal(cpu_isa_parse("sse9"), -1);
    assert_int_equal(cpu_isa_parse(NULL), -1);
    assert_string_equal(cpu_isa_name(CPU_ISA_AVX2), "avx2");
    print_message("detected ISA: %s\n", cpu_isa_name(best));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dispatch),
        cmocka_unit_test(test_lora_up),
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_f16_convert),
        cmocka_unit_test(test_checker_catches_errors),
        cmocka_unit_test(test_gemm_f32_accuracy),
        cmocka_unit_test(test_gemm_bf16_accuracy),
        cmocka_unit_test(test_gemm_f16_accuracy),
        cmocka_unit_test(test_invariance_bf16),
        cmocka_unit_test(test_invariance_f32),
        cmocka_unit_test(test_invariance_f16),
        cmocka_unit_test(test_invariance_big_m),
        cmocka_unit_test(test_packed_bf16),
        cmocka_unit_test(test_packed_spread),
        cmocka_unit_test(test_packed_glu),
        cmocka_unit_test(test_norm_rope),
        cmocka_unit_test(test_attention_pieces),
        cmocka_unit_test(test_packed_attention),
        cmocka_unit_test(test_row_helpers),
        cmocka_unit_test(test_cross_isa),
        cmocka_unit_test(test_dot_axpy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
