/* tests/unit/test_quant_forward.c - fidelity of quantized checkpoints
 * (issue 28): every format the loaders read, on the CPU backend, against a
 * float64 forward over the *dequantized* weights written here.
 *
 * The model maker writes one tiny Qwen3 per format from one seed (GGUF
 * Q8_0, Q4_K_M with its tied Q6_K embedding, Q5_K_M, Q6_K, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q2_K, Q3_K_M, IQ4_NL, IQ4_XS; AutoAWQ INT4 safetensors); each is loaded with model_load and run by the CPU backend
 * on a teacher-forced sequence (a prefill, then token-by-token decode), on
 * every kernel path this CPU has, as test_model.c does; the reference reads
 * the same model_tensor records through quant_dequant_row and computes in
 * double. Checks, per format and path:
 *  - max |dlogit| <= TOL_NATIVE (below; 1e-3 where activations stay F32,
 *    as in the dequantize-at-load fallback and the GGUF float types);
 *  - teacher-forced top-1 equal wherever the reference's margin between
 *    its first and second logit exceeds 0.3 (and there are such positions:
 *    the weights are drawn wider than the maker's default so that a tiny
 *    model has confident logits).
 * And the float tensor types of GGUF: a BF16 GGUF written from the BF16
 * safetensors model gives its logits bit for bit, an F16 one agrees with
 * the reference within 1e-3.
 * The figures are printed (tests/README.md records a run). The CPU's native
 * kernels (engine/cpu/qgemm.h) quantize activations to int8 per block for
 * their integer dot products, as llama.cpp's Q8_0 / Q8_K products do, which
 * brings the noise of that rounding: their bound is TOL_NATIVE, the figure
 * the issue quotes for llama.cpp on small Qwen3 models (0.2-0.3 max
 * |dlogit|); measured 0.14-0.23 here. The top-1 check is the same. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/kernels.h"
#include "dtype.h"
#include "gguf.h"
#include "mkmodel.h"
#include "model.h"
#include "quant.h"
#include "test_util.h"

/* max |dlogit| of the native quantized kernels (int8 activations) */
#define TOL_NATIVE 0.3

#define T_PREFILL 16
#define T_DECODE 8
#define T_ALL (T_PREFILL + T_DECODE)

static char tmp[256];

static const struct fmt {
    const char *name;
    enum mk_dtype dt;
    int tied;
} fmts[] = {
    {"q8_0", MK_Q8_0, 1},     {"q4_k_m", MK_Q4_K_M, 1}, {"q5_k_m", MK_Q5_K_M, 0},
    {"q6_k", MK_Q6_K, 0},     {"awq", MK_AWQ, 0},       {"q4_0", MK_Q4_0, 1},
    {"q4_1", MK_Q4_1, 0},     {"q5_0", MK_Q5_0, 0},     {"q5_1", MK_Q5_1, 1},
    {"q2_k", MK_Q2_K, 0},     {"q3_k_m", MK_Q3_K_M, 1}, {"iq4_nl", MK_IQ4_NL, 0},
    {"iq4_xs", MK_IQ4_XS, 1},
};

static void model_path(const struct fmt *f, char *buf, size_t n)
{
    if (f->dt == MK_AWQ)
        snprintf(buf, n, "%s/%s", tmp, f->name);
    else
        snprintf(buf, n, "%s/%s.gguf", tmp, f->name);
}

static int setup(void **state)
{
    (void)state;
    if (tu_tmpdir(tmp, sizeof tmp, "test-qfwd"))
        return -1;
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        struct mk_opts o;
        struct rl_err err = {0};
        char out[512];
        mk_opts_init(&o);
        o.hidden = 256, o.intermediate = 512, o.n_layers = 4, o.n_heads = 4, o.n_kv_heads = 2;
        o.head_dim = 64, o.vocab = 512, o.tied = fmts[i].tied, o.dtype = fmts[i].dt;
        o.seed = 28, o.weight_std = 0.08f;
        model_path(&fmts[i], out, sizeof out);
        o.out_dir = out;
        if (mk_write(&o, NULL, &err)) {
            fprintf(stderr, "mk_write %s: %s\n", fmts[i].name, err.msg);
            return -1;
        }
        if (i == 0) { /* and the BF16 model of the same seed, untied */
            struct mk_opts b = o;
            snprintf(out, sizeof out, "%s/bf16", tmp);
            b.out_dir = out, b.dtype = MK_BF16, b.tied = 0;
            if (mk_write(&b, NULL, &err)) {
                fprintf(stderr, "mk_write bf16: %s\n", err.msg);
                return -1;
            }
        }
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return tu_rmtree(tmp);
}

/* ---- the float64 reference ---- */

/* Row r of any weight as doubles. */
static void row_f64(const struct model_tensor *t, int64_t r, double *out)
{
    static float buf[1 << 14];
    assert_true(t->cols <= (int64_t)(sizeof buf / sizeof buf[0]));
    if (quant_is_quantized(t->dtype)) {
        assert_int_equal(quant_dequant_row(t, r, buf), 0);
    } else {
        for (int64_t c = 0; c < t->cols; c++) {
            size_t i = (size_t)(r * t->cols + c);
            uint16_t h;
            switch (t->dtype) {
            case MODEL_F32: memcpy(&buf[c], (const char *)t->data + 4 * i, 4); break;
            case MODEL_BF16:
                memcpy(&h, (const char *)t->data + 2 * i, 2);
                buf[c] = bf16_to_f32(h);
                break;
            case MODEL_F16:
                memcpy(&h, (const char *)t->data + 2 * i, 2);
                buf[c] = f16_to_f32(h);
                break;
            default: fail_msg("tensor %s: dtype %d", t->name, t->dtype);
            }
        }
    }
    for (int64_t c = 0; c < t->cols; c++)
        out[c] = buf[c];
}

/* A whole matrix (rows, cols) as doubles, malloc'd. */
static double *mat_f64(const struct model_tensor *t)
{
    double *m = malloc((size_t)(t->rows * t->cols) * sizeof *m);
    assert_non_null(m);
    for (int64_t r = 0; r < t->rows; r++)
        row_f64(t, r, m + r * t->cols);
    return m;
}

static void matvec(const double *w, int rows, int cols, const double *x, double *y)
{
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++)
            s += w[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

static void rmsnorm(const double *x, const double *w, int n, double eps, double *out)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * inv * w[i];
}

/* Logits (T, vocab) of tokens[0..T) at positions 0..T-1. */
static double *reference_forward(const struct model *m, const int32_t *tokens, int T)
{
    const struct model_config *c = model_get_config(m);
    const struct model_weights *w = model_get_weights(m);
    int H = c->hidden, I = c->intermediate, D = c->head_dim, NH = c->n_heads, NKV = c->n_kv_heads;
    int Q = NH * D, KV = NKV * D, V = c->vocab, L = c->n_layers, half = D / 2;
    double eps = c->rms_eps;
    double *x = calloc((size_t)T * H, sizeof *x), *h = malloc((size_t)H * sizeof *h);
    double *kc = malloc((size_t)L * T * KV * sizeof *kc), *vc = malloc((size_t)L * T * KV * sizeof *vc);
    double *q = malloc((size_t)Q * sizeof *q), *att = malloc((size_t)Q * sizeof *att);
    double *g = malloc((size_t)I * sizeof *g), *u = malloc((size_t)I * sizeof *u);
    double *tmpv = malloc((size_t)(H > I ? H : I) * sizeof *tmpv), *sc = malloc((size_t)T * sizeof *sc);
    double *logits = malloc((size_t)T * V * sizeof *logits);
    double *inv = malloc((size_t)half * sizeof *inv);
    for (int i = 0; i < half; i++)
        inv[i] = 1.0 / pow(c->rope_theta, (double)(2 * i) / D);
    for (int t = 0; t < T; t++)
        row_f64(&w->embed, tokens[t], x + (size_t)t * H);
    for (int l = 0; l < L; l++) {
        const struct model_layer *S = &w->layers[l];
        double *wq = mat_f64(&S->wq), *wk = mat_f64(&S->wk), *wv = mat_f64(&S->wv),
               *wo = mat_f64(&S->wo), *wg = mat_f64(&S->w_gate), *wu = mat_f64(&S->w_up),
               *wd = mat_f64(&S->w_down);
        double an[1 << 12], mn[1 << 12], qn[256], kn[256];
        row_f64(&S->attn_norm, 0, an);
        row_f64(&S->mlp_norm, 0, mn);
        row_f64(&S->q_norm, 0, qn);
        row_f64(&S->k_norm, 0, kn);
        for (int t = 0; t < T; t++) { /* causal: token t sees 0..t, all of them done */
            double *xt = x + (size_t)t * H, *kt = kc + ((size_t)l * T + t) * KV,
                   *vt = vc + ((size_t)l * T + t) * KV;
            rmsnorm(xt, an, H, eps, h);
            matvec(wq, Q, H, h, q);
            matvec(wk, KV, H, h, kt);
            matvec(wv, KV, H, h, vt);
            for (int hd = 0; hd < NH + NKV; hd++) {
                double *v = hd < NH ? q + hd * D : kt + (hd - NH) * D, nv[256];
                rmsnorm(v, hd < NH ? qn : kn, D, eps, nv);
                for (int i = 0; i < half; i++) { /* NEOX: pairs (i, i + D/2) */
                    double a = t * inv[i], cs = cos(a), sn = sin(a);
                    v[i] = nv[i] * cs - nv[i + half] * sn;
                    v[i + half] = nv[i + half] * cs + nv[i] * sn;
                }
            }
            for (int hd = 0; hd < NH; hd++) {
                int g_kv = hd / (NH / NKV);
                double mx = -1e300, sum = 0;
                for (int s = 0; s <= t; s++) {
                    const double *ks = kc + ((size_t)l * T + s) * KV + g_kv * D;
                    double d = 0;
                    for (int i = 0; i < D; i++)
                        d += q[hd * D + i] * ks[i];
                    sc[s] = d / sqrt((double)D);
                    mx = sc[s] > mx ? sc[s] : mx;
                }
                for (int s = 0; s <= t; s++)
                    sum += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < D; i++) {
                    double o = 0;
                    for (int s = 0; s <= t; s++)
                        o += sc[s] * vc[((size_t)l * T + s) * KV + g_kv * D + i];
                    att[hd * D + i] = o / sum;
                }
            }
            matvec(wo, H, Q, att, tmpv);
            for (int i = 0; i < H; i++)
                xt[i] += tmpv[i];
            rmsnorm(xt, mn, H, eps, h);
            matvec(wg, I, H, h, g);
            matvec(wu, I, H, h, u);
            for (int i = 0; i < I; i++)
                g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            matvec(wd, H, I, g, tmpv);
            for (int i = 0; i < H; i++)
                xt[i] += tmpv[i];
        }
        free(wq), free(wk), free(wv), free(wo), free(wg), free(wu), free(wd);
    }
    double fn[1 << 12];
    row_f64(&w->final_norm, 0, fn);
    double *head = mat_f64(&w->lm_head);
    for (int t = 0; t < T; t++) {
        rmsnorm(x + (size_t)t * H, fn, H, eps, h);
        matvec(head, V, H, h, logits + (size_t)t * V);
    }
    free(head), free(x), free(h), free(kc), free(vc), free(q), free(att), free(g), free(u);
    free(tmpv), free(sc), free(inv);
    return logits;
}

/* ---- the check ---- */

struct figures {
    double max_abs;
    int confident, agree;
};

/* Runs format f on CPU path isa: prefill T_PREFILL tokens, then decode
 * T_DECODE one at a time, teacher-forced; compares with the reference. */
static void check_format(const struct fmt *f, const char *isa, double tol, struct figures *fig)
{
    char path[512];
    model_path(f, path, sizeof path);
    struct model *m;
    struct backend *be;
    struct rl_err err = {0};
    if (model_load(&m, path, &err))
        fail_msg("%s: model_load: %s", f->name, err.msg);
    const struct model_config *c = model_get_config(m);
    int V = c->vocab;
    int32_t tokens[T_ALL], table[64];
    for (int i = 0; i < T_ALL; i++)
        tokens[i] = (int32_t)((i * 131 + 7) % V);
    for (int i = 0; i < 64; i++)
        table[i] = i;
    double *ref = reference_forward(m, tokens, T_ALL);
    struct be_options o = {.n_threads = 2, .isa = isa, .kv_dtype = BE_KV_F32};
    assert_int_equal(be_create(&be, "cpu", &o, &err), 0);
    if (be->ops->load(be->ctx, c, model_get_weights(m), T_ALL, &err) ||
        be->ops->kv_init(be->ctx, 64, 16, &err))
        fail_msg("%s/%s: %s", f->name, isa, err.msg);
    float *lg = malloc((size_t)T_ALL * V * sizeof *lg);
    struct be_seq s = {0, T_PREFILL, table, 0, 0};
    struct be_batch b = {1, &s, T_PREFILL, tokens, T_PREFILL, lg};
    if (be->ops->forward(be->ctx, &b, &err))
        fail_msg("%s/%s: forward: %s", f->name, isa, err.msg);
    for (int t = T_PREFILL; t < T_ALL; t++) {
        struct be_seq s1 = {t, 1, table, 0, 0};
        struct be_batch b1 = {1, &s1, 1, tokens + t, 1, lg + (size_t)t * V};
        if (be->ops->forward(be->ctx, &b1, &err))
            fail_msg("%s/%s: decode: %s", f->name, isa, err.msg);
    }
    memset(fig, 0, sizeof *fig);
    for (int t = 0; t < T_ALL; t++) {
        const double *r = ref + (size_t)t * V;
        const float *y = lg + (size_t)t * V;
        int best = 0, second = -1, mine = 0;
        for (int v = 0; v < V; v++) {
            double d = fabs((double)y[v] - r[v]);
            fig->max_abs = d > fig->max_abs ? d : fig->max_abs;
            if (r[v] > r[best]) {
                second = best;
                best = v;
            } else if (v != best && (second < 0 || r[v] > r[second])) {
                second = v;
            }
            if (y[v] > y[mine])
                mine = v;
        }
        if (r[best] - r[second] > 0.3) {
            fig->confident++;
            fig->agree += mine == best;
            if (mine != best)
                fail_msg("%s/%s: position %d: top-1 %d, the reference's %d (margin %.3f)", f->name,
                         isa, t, mine, best, r[best] - r[second]);
        }
    }
    printf("  %-7s %-11s max |dlogit| %.2e (bound %.0e); top-1 agrees at %d/%d positions with margin > 0.3\n",
           f->name, isa, fig->max_abs, tol, fig->agree, fig->confident);
    if (fig->max_abs > tol)
        fail_msg("%s/%s: max |dlogit| %g > %g", f->name, isa, fig->max_abs, tol);
    assert_true(fig->confident > 0); /* the margin check must not be vacuous */
    free(lg);
    free(ref);
    be_free(be);
    model_free(m);
}

static void run_all(const char *isa)
{
    if (cpu_isa_parse(isa) > (int)cpu_isa_detect()) {
        printf("  (skipping %s: this CPU lacks it)\n", isa);
        return;
    }
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        struct figures fig;
        check_format(&fmts[i], isa, TOL_NATIVE, &fig);
    }
}

static void test_fidelity_scalar(void **state) { (void)state; run_all("scalar"); }
static void test_fidelity_avx2(void **state) { (void)state; run_all("avx2"); }
static void test_fidelity_avx512(void **state) { (void)state; run_all("avx512bf16"); }

/* What the loaders bound: the formats and layouts the maker promises. */
static void test_layouts(void **state)
{
    (void)state;
    static const struct {
        const char *fmt;
        enum model_dtype embed, lm_head, wv[4], wdown[4], wq;
    } want[] = {
        /* Q4_K_M, 4 layers: use_more_bits keeps layers 2 and 3 (i >= 7n/8,
         * (i - n/8) % 3 == 2) at 6 bits; tied: the embedding is Q6_K */
        {"q4_k_m", MODEL_Q6_K, MODEL_Q6_K, {MODEL_Q4_K, MODEL_Q4_K, MODEL_Q6_K, MODEL_Q6_K},
         {MODEL_Q4_K, MODEL_Q4_K, MODEL_Q6_K, MODEL_Q6_K}, MODEL_Q4_K},
        {"q5_k_m", MODEL_Q5_K, MODEL_Q6_K, {MODEL_Q5_K, MODEL_Q5_K, MODEL_Q6_K, MODEL_Q6_K},
         {MODEL_Q5_K, MODEL_Q5_K, MODEL_Q6_K, MODEL_Q6_K}, MODEL_Q5_K},
        {"q8_0", MODEL_Q8_0, MODEL_Q8_0, {MODEL_Q8_0, MODEL_Q8_0, MODEL_Q8_0, MODEL_Q8_0},
         {MODEL_Q8_0, MODEL_Q8_0, MODEL_Q8_0, MODEL_Q8_0}, MODEL_Q8_0},
        {"awq", MODEL_F16, MODEL_F16, {MODEL_AWQ4, MODEL_AWQ4, MODEL_AWQ4, MODEL_AWQ4},
         {MODEL_AWQ4, MODEL_AWQ4, MODEL_AWQ4, MODEL_AWQ4}, MODEL_AWQ4},
        /* the legacy and IQ mixes: Q6_K only for the output (tied: the embedding) */
        {"q4_0", MODEL_Q6_K, MODEL_Q6_K, {MODEL_Q4_0, MODEL_Q4_0, MODEL_Q4_0, MODEL_Q4_0},
         {MODEL_Q4_0, MODEL_Q4_0, MODEL_Q4_0, MODEL_Q4_0}, MODEL_Q4_0},
        {"iq4_nl", MODEL_IQ4_NL, MODEL_Q6_K, {MODEL_IQ4_NL, MODEL_IQ4_NL, MODEL_IQ4_NL, MODEL_IQ4_NL},
         {MODEL_IQ4_NL, MODEL_IQ4_NL, MODEL_IQ4_NL, MODEL_IQ4_NL}, MODEL_IQ4_NL},
        /* Q3_K_M: the use_more_bits layers' attn_v and ffn_down at Q4_K */
        {"q3_k_m", MODEL_Q6_K, MODEL_Q6_K, {MODEL_Q3_K, MODEL_Q3_K, MODEL_Q4_K, MODEL_Q4_K},
         {MODEL_Q3_K, MODEL_Q3_K, MODEL_Q4_K, MODEL_Q4_K}, MODEL_Q3_K},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct fmt *f = NULL;
        for (size_t k = 0; k < sizeof fmts / sizeof fmts[0]; k++)
            if (!strcmp(fmts[k].name, want[i].fmt))
                f = &fmts[k];
        char path[512];
        model_path(f, path, sizeof path);
        struct model *m;
        struct rl_err err = {0};
        if (model_load(&m, path, &err))
            fail_msg("%s: %s", path, err.msg);
        const struct model_weights *w = model_get_weights(m);
        const struct model_config *c = model_get_config(m);
        assert_int_equal(c->tied, f->tied);
        assert_int_equal(w->embed.dtype, want[i].embed);
        assert_int_equal(w->lm_head.dtype, want[i].lm_head);
        for (int l = 0; l < 4; l++) {
            if (w->layers[l].wv.dtype != want[i].wv[l] || w->layers[l].w_down.dtype != want[i].wdown[l])
                fail_msg("%s layer %d: attn_v %s ffn_down %s", want[i].fmt, l,
                         model_dtype_name(w->layers[l].wv.dtype),
                         model_dtype_name(w->layers[l].w_down.dtype));
            assert_int_equal(w->layers[l].wq.dtype, want[i].wq);
            assert_int_equal(w->layers[l].w_gate.dtype, want[i].wq);
            assert_false(quant_is_quantized(w->layers[l].attn_norm.dtype));
        }
        assert_int_equal(c->hidden, 256);
        assert_int_equal(c->vocab, 512);
        assert_int_equal(c->head_dim, 64);
        assert_int_equal(c->n_kv_heads, 2);
        assert_true(c->rope_theta == 1e6f);
        model_free(m);
    }
}

/* One seed, any format: the quantized weights are the BF16 model's, within
 * each format's step. */
static void test_same_weights(void **state)
{
    (void)state;
    char bf[512];
    snprintf(bf, sizeof bf, "%s/bf16", tmp);
    struct rl_err err = {0};
    struct model *ref, *m;
    assert_int_equal(model_load(&ref, bf, &err), 0);
    static const struct {
        const char *fmt;
        double rel; /* max |dw| / max |w| over a row, per format */
    } cases[] = {{"q6_k", 0.05}, {"q5_k_m", 0.1}, {"awq", 0.15}, {"q5_1", 0.05}, {"q4_0", 0.1},
                 {"iq4_xs", 0.12}, {"q3_k_m", 0.2}, {"q2_k", 0.4}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct fmt *f = NULL;
        for (size_t k = 0; k < sizeof fmts / sizeof fmts[0]; k++)
            if (!strcmp(fmts[k].name, cases[i].fmt))
                f = &fmts[k];
        char path[512];
        model_path(f, path, sizeof path);
        assert_int_equal(model_load(&m, path, &err), 0);
        const struct model_tensor *a = &model_get_weights(ref)->layers[1].w_up,
                                  *b = &model_get_weights(m)->layers[1].w_up;
        double x[512], y[512];
        for (int r = 0; r < 8; r++) {
            row_f64(a, r, x);
            row_f64(b, r, y);
            double mx = 0, d = 0;
            for (int k = 0; k < 256; k++) {
                mx = fmax(mx, fabs(x[k]));
                d = fmax(d, fabs(x[k] - y[k]));
            }
            if (d > cases[i].rel * mx)
                fail_msg("%s row %d: max |dw| %g vs max |w| %g", cases[i].fmt, r, d, mx);
        }
        model_free(m);
    }
    model_free(ref);
}

/* ---- F32 / F16 / BF16 GGUF tensors ----
 *
 * A GGUF written here from the BF16 safetensors model (the same weights
 * under llama.cpp's names and keys): with BF16 matrices it must give the
 * safetensors model's logits bit for bit (same data, same kernels); with
 * F16 matrices (BF16 values are exact in F16 at these magnitudes) it must
 * agree with the float64 reference like the quantized formats. */

/* Tensor t (BF16 in the safetensors model) as `type` bytes, malloc'd. */
static void *convert(const struct model_tensor *t, uint32_t type)
{
    size_t n = (size_t)(t->rows * t->cols);
    assert_int_equal(t->dtype, MODEL_BF16);
    const uint16_t *src = t->data;
    if (type == GGUF_T_BF16) {
        void *b = malloc(n * 2);
        memcpy(b, src, n * 2);
        return b;
    }
    if (type == GGUF_T_F16) {
        uint16_t *b = malloc(n * 2);
        for (size_t i = 0; i < n; i++)
            b[i] = f32_to_f16(bf16_to_f32(src[i]));
        return b;
    }
    float *b = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        b[i] = bf16_to_f32(src[i]);
    return b;
}

static void gguf_from_safetensors(const char *st_dir, const char *out, uint32_t mat_type)
{
    struct model *m;
    struct rl_err err = {0};
    assert_int_equal(model_load(&m, st_dir, &err), 0);
    const struct model_config *c = model_get_config(m);
    const struct model_weights *w = model_get_weights(m);
    struct gguf_writer *g;
    assert_int_equal(gguf_writer_create(&g, &err), 0);
    gguf_writer_str(g, "general.architecture", "qwen3", 5);
    gguf_writer_u32(g, "qwen3.block_count", (uint32_t)c->n_layers);
    gguf_writer_u32(g, "qwen3.context_length", (uint32_t)c->max_pos);
    gguf_writer_u32(g, "qwen3.embedding_length", (uint32_t)c->hidden);
    gguf_writer_u32(g, "qwen3.feed_forward_length", (uint32_t)c->intermediate);
    gguf_writer_u32(g, "qwen3.attention.head_count", (uint32_t)c->n_heads);
    gguf_writer_u32(g, "qwen3.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    gguf_writer_u32(g, "qwen3.attention.key_length", (uint32_t)c->head_dim);
    gguf_writer_f32(g, "qwen3.rope.freq_base", c->rope_theta);
    gguf_writer_f32(g, "qwen3.attention.layer_norm_rms_epsilon", c->rms_eps);
    void *bufs[512];
    int nb = 0;
#define ADD(name, t, type)                                                                 \
    do {                                                                                   \
        int64_t ne_[2] = {(t)->cols, (t)->rows};                                           \
        bufs[nb] = convert(t, type);                                                       \
        gguf_writer_tensor(g, name, type, (t)->rows > 1 ? 2 : 1, ne_, bufs[nb], NULL, NULL); \
        nb++;                                                                              \
    } while (0)
    ADD("token_embd.weight", &w->embed, GGUF_T_BF16);
    ADD("output_norm.weight", &w->final_norm, GGUF_T_F32);
    if (!c->tied)
        ADD("output.weight", &w->lm_head, mat_type);
    for (int l = 0; l < c->n_layers; l++) {
        const struct model_layer *L = &w->layers[l];
        const struct model_tensor *ts[11] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo,
                                             &L->q_norm, &L->k_norm, &L->mlp_norm, &L->w_gate,
                                             &L->w_up, &L->w_down};
        static const char *const sfx[11] = {"attn_norm", "attn_q", "attn_k", "attn_v",
                                            "attn_output", "attn_q_norm", "attn_k_norm",
                                            "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"};
        for (int i = 0; i < 11; i++) {
            char n[64];
            snprintf(n, sizeof n, "blk.%d.%s.weight", l, sfx[i]);
            ADD(n, ts[i], ts[i]->rows > 1 ? mat_type : GGUF_T_F32);
        }
    }
#undef ADD
    if (gguf_writer_write(g, out, &err))
        fail_msg("%s: %s", out, err.msg);
    gguf_writer_free(g);
    for (int i = 0; i < nb; i++)
        free(bufs[i]);
    model_free(m);
}

/* Logits (T_ALL, vocab) of the model at path on the CPU path isa, F32 KV. */
static float *run_model(const char *path, const char *isa, const int32_t *tokens, int *vocab)
{
    struct model *m;
    struct backend *be;
    struct rl_err err = {0};
    if (model_load(&m, path, &err))
        fail_msg("%s: %s", path, err.msg);
    const struct model_config *c = model_get_config(m);
    int32_t table[64];
    for (int i = 0; i < 64; i++)
        table[i] = i;
    struct be_options o = {.n_threads = 2, .isa = isa, .kv_dtype = BE_KV_F32};
    assert_int_equal(be_create(&be, "cpu", &o, &err), 0);
    if (be->ops->load(be->ctx, c, model_get_weights(m), T_ALL, &err) ||
        be->ops->kv_init(be->ctx, 64, 16, &err))
        fail_msg("%s: %s", path, err.msg);
    float *lg = malloc((size_t)T_ALL * c->vocab * sizeof *lg);
    struct be_seq s = {0, T_ALL, table, 0, 0};
    struct be_batch b = {1, &s, T_ALL, tokens, T_ALL, lg};
    if (be->ops->forward(be->ctx, &b, &err))
        fail_msg("%s: forward: %s", path, err.msg);
    *vocab = c->vocab;
    be_free(be);
    model_free(m);
    return lg;
}

static void test_gguf_float_tensors(void **state)
{
    (void)state;
    char bf[512], g16[512], gbf[512];
    snprintf(bf, sizeof bf, "%s/bf16", tmp);
    snprintf(gbf, sizeof gbf, "%s/bf16.gguf", tmp);
    snprintf(g16, sizeof g16, "%s/f16.gguf", tmp);
    gguf_from_safetensors(bf, gbf, GGUF_T_BF16);
    gguf_from_safetensors(bf, g16, GGUF_T_F16);
    int32_t tokens[T_ALL];
    for (int i = 0; i < T_ALL; i++)
        tokens[i] = (int32_t)((i * 131 + 7) % 512);
    const char *isa = "auto";
    int V;
    float *a = run_model(bf, isa, tokens, &V), *b = run_model(gbf, isa, tokens, &V);
    assert_memory_equal(a, b, (size_t)T_ALL * V * sizeof *a);
    free(a);
    free(b);
    /* F16 matrices against the float64 reference */
    struct model *m;
    struct rl_err err = {0};
    assert_int_equal(model_load(&m, g16, &err), 0);
    assert_int_equal(model_get_weights(m)->layers[0].wq.dtype, MODEL_F16);
    assert_int_equal(model_get_weights(m)->embed.dtype, MODEL_BF16);
    double *ref = reference_forward(m, tokens, T_ALL);
    model_free(m);
    float *y = run_model(g16, isa, tokens, &V);
    double worst = 0;
    for (size_t i = 0; i < (size_t)T_ALL * V; i++)
        worst = fmax(worst, fabs((double)y[i] - ref[i]));
    printf("  f16 GGUF    auto        max |dlogit| %.2e (bound 1e-03)\n", worst);
    assert_true(worst <= 1e-3);
    free(y);
    free(ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts),
        cmocka_unit_test(test_same_weights),
        cmocka_unit_test(test_gguf_float_tensors),
        cmocka_unit_test(test_fidelity_scalar),
        cmocka_unit_test(test_fidelity_avx2),
        cmocka_unit_test(test_fidelity_avx512),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
