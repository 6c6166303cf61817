/* engine/mkmodel.c - the random checkpoint maker and dtype converter.
 *
 * mk_write() first builds a plan: one `struct gen` per output tensor, in HF
 * order (embeddings, layers, final norm, lm_head), each knowing its name,
 * shape, output dtype and where its values come from (a seeded PRNG, or a
 * tensor of the --from checkpoint). Tensors are grouped into units (an FP8
 * weight and its weight_scale_inv stay together) and units into shards.
 * Each shard is then one st_writer whose tensors are produced by gen_fill()
 * while the writer streams them to disk, so a 28 GB checkpoint needs a few
 * MB of heap: values are made one band of rows at a time (128 rows for FP8,
 * which is exactly one row of quantisation blocks; ~4 MB otherwise).
 *
 * Determinism: each tensor's PRNG is seeded from (seed, tensor name), and
 * values are drawn in row-major order, so the F32, BF16 and FP8 models of
 * one seed hold the same weights up to rounding, and sharding changes no
 * value.
 *
 * FP8 follows Qwen/Qwen3-*-FP8 (DeepSeek-style block quantisation): per
 * 128x128 block, scale_inv = amax / 448, stored value = e4m3(w / scale_inv),
 * so dequantised w ~= e4m3 value * scale_inv. An FP8 weight is always added
 * to the writer before its scale tensor: the scales are computed while the
 * weight streams out and written right after.
 *
 * Called by the `redlm mkmodel` command and tests; single-threaded. */
#include "mkmodel.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "dtype.h"
#include "file.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "safetensors.h"
#include "xoshiro.h"

#define MK_BLOCK 128             /* FP8 block edge, rows and cols */
#define MK_BAND_BYTES (4u << 20) /* float staging per band for non-FP8 tensors */
#define MK_PATTERN 65521         /* pattern length: prime, so rows don't line up */
#define MK_FP8_MAX 448.0f

/* ---- PRNG: splitmix64 to seed, xoshiro256** to draw ---- */

struct rng {
    uint64_t s[4];
};

static void rng_seed(struct rng *r, uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a of the name */
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    uint64_t x = seed ^ h;
    for (int i = 0; i < 4; i++)
        r->s[i] = xo_splitmix64(&x);
}

static inline uint64_t rng_next(struct rng *r) { return xo_next(r->s); }

static inline float rng_normal(struct rng *r) { return xo_normal(r->s); }

uint8_t mk_f32_to_e4m3(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u)
        return 0x7f;
    float a;
    memcpy(&a, &u, 4);
    if (a >= MK_FP8_MAX)
        return sign | 0x7e; /* E4M3fn has no infinity: saturate */
    if (a < 0.015625f)      /* below 2^-6: subnormal, steps of 2^-9; 8 = min normal */
        return sign | (uint8_t)nearbyintf(a * 512.0f);
    /* normal: round the f32 mantissa to 3 bits, ties to even; a carry moves
     * into the exponent by itself. Then rebias 127 -> 7. */
    uint32_t r = (u + 0x7ffffu + ((u >> 20) & 1u)) >> 20;
    return sign | (uint8_t)(r - (120u << 3));
}

/* ---- the plan ---- */

enum gen_kind {
    GEN_RANDOM, /* mean + std * normal */
    GEN_SOURCE, /* converted from a --from tensor */
    GEN_RAW,    /* a --from tensor copied byte for byte (non-float dtypes) */
    GEN_SCALE,  /* the weight_scale_inv of the F8 weight `weight` */
    GEN_AWQ_QWEIGHT, /* an AWQ projection's qweight: quantizes the whole matrix at once */
    GEN_AWQ_QZEROS,  /* its qzeros, from the qweight gen `weight` */
    GEN_AWQ_SCALES,  /* its scales, from the qweight gen `weight`; frees its buffers */
};

struct gen {
    char name[192];
    enum gen_kind kind;
    enum st_dtype out;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    int64_t rows, cols; /* shape folded to 2-D: rows = all but the last dim */
    uint64_t n_bytes;
    int shard;
    /* GEN_RANDOM */
    struct rng rng;
    float mean, std;
    int pattern;
    /* GEN_SOURCE / GEN_RAW */
    const struct st_tensor *src;
    const struct st_tensor *src_scale; /* (ceil(rows/sbr), ceil(cols/sbc)) for an F8 source */
    int src_br, src_bc;
    /* FP8 */
    struct gen *scale;  /* for an F8 weight: its scale tensor, which owns `scales` */
    struct gen *weight; /* for GEN_SCALE */
    float *scales;      /* (ceil(rows/128), ceil(cols/128)) f32, filled as the weight streams */
    int scale_bf16;
    /* streaming state */
    int64_t next_row, band_rows;
    float *fbuf;   /* (band_rows, cols) */
    uint8_t *band; /* encoded bytes of the current band */
    uint64_t band_off;
    size_t band_len;
    float *pat; /* (MK_PATTERN) when pattern */
    /* AWQ (GEN_AWQ_QWEIGHT): the projection's (awq_rows, awq_cols) and its
     * packed tensors, made on the first fill and freed after the scales */
    int64_t awq_rows, awq_cols;
    int awq_group;
    int32_t *awq_qw, *awq_qz;
    uint16_t *awq_sc;
};

static void gen_release(struct gen *g)
{
    free(g->fbuf);
    free(g->band);
    free(g->pat);
    free(g->awq_qw);
    free(g->awq_qz);
    free(g->awq_sc);
    g->fbuf = NULL;
    g->band = NULL;
    g->pat = NULL;
    g->awq_qw = g->awq_qz = NULL;
    g->awq_sc = NULL;
}

/* Random weights of one tensor: element e (row-major) is mean + std *
 * normal from the tensor's PRNG, or pattern[e % MK_PATTERN]; rounded to
 * BF16, as the quantized formats stand for a BF16 model that was
 * quantized. One row of cols values into v; rows come in order. */
static int random_row(struct gen *g, int64_t r, int64_t cols, float *v, struct rl_err *err)
{
    if (g->pattern && !g->pat) {
        if (!(g->pat = malloc(MK_PATTERN * sizeof *g->pat)))
            return rl_errf(err, RL_ENOMEM, "out of memory for tensor \"%s\"", g->name);
        for (int i = 0; i < MK_PATTERN; i++)
            g->pat[i] = g->mean + g->std * rng_normal(&g->rng);
    }
    uint64_t e = (uint64_t)r * (uint64_t)cols;
    for (int64_t c = 0; c < cols; c++)
        v[c] = bf16_to_f32(f32_to_bf16(g->pat ? g->pat[(e + (uint64_t)c) % MK_PATTERN]
                                              : g->mean + g->std * rng_normal(&g->rng)));
    return 0;
}

/* Quantizes the whole AWQ projection of qweight gen g. */
static int awq_make(struct gen *g, struct rl_err *err)
{
    int64_t R = g->awq_rows, C = g->awq_cols, G = g->awq_group;
    float *w = malloc((size_t)(R * C) * sizeof *w);
    g->awq_qw = malloc((size_t)(C * R / 8) * sizeof *g->awq_qw);
    g->awq_qz = malloc((size_t)(C / G * R / 8) * sizeof *g->awq_qz);
    g->awq_sc = malloc((size_t)(C / G * R) * sizeof *g->awq_sc);
    int rc = 0;
    if (!w || !g->awq_qw || !g->awq_qz || !g->awq_sc)
        rc = rl_errf(err, RL_ENOMEM, "out of memory for tensor \"%s\"", g->name);
    for (int64_t r = 0; r < R && !rc; r++)
        rc = random_row(g, r, C, w + r * C, err);
    if (!rc && quant_quantize_awq(w, R, C, (int)G, g->awq_qw, g->awq_qz, g->awq_sc))
        rc = rl_errf(err, RL_EINTERNAL, "tensor \"%s\": AWQ shape", g->name);
    free(w);
    return rc;
}

static int awq_fill(struct gen *g, uint64_t off, uint8_t *out, size_t n, struct rl_err *err)
{
    struct gen *o = g->kind == GEN_AWQ_QWEIGHT ? g : g->weight;
    if (g->kind == GEN_AWQ_QWEIGHT && off == 0) {
        int rc = awq_make(g, err);
        if (rc)
            return rc;
    }
    if (!o->awq_qw)
        return rl_errf(err, RL_EINTERNAL, "\"%s\" wanted before its qweight", g->name);
    const uint8_t *src = g->kind == GEN_AWQ_QWEIGHT ? (const uint8_t *)o->awq_qw
                         : g->kind == GEN_AWQ_QZEROS ? (const uint8_t *)o->awq_qz
                                                     : (const uint8_t *)o->awq_sc;
    memcpy(out, src + off, n);
    if (g->kind == GEN_AWQ_SCALES && off + n == g->n_bytes)
        gen_release(o); /* the three are written in a row: free the matrix's copy */
    return 0;
}

/* Float value of element (r, c) of g's source tensor. */
static float src_value(const struct gen *g, int64_t r, int64_t c)
{
    int64_t i = r * g->cols + c;
    const uint8_t *p = g->src->data;
    switch (g->src->dtype) {
    case ST_F32: {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case ST_F64: {
        double v;
        memcpy(&v, p + 8 * i, 8);
        return (float)v;
    }
    case ST_BF16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return bf16_to_f32(h);
    }
    case ST_F16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return f16_to_f32(h);
    }
    case ST_F8_E4M3: {
        const struct st_tensor *s = g->src_scale;
        int64_t bc = (g->cols + g->src_bc - 1) / g->src_bc, si = (r / g->src_br) * bc + c / g->src_bc;
        float sc;
        if (s->dtype == ST_F32) {
            memcpy(&sc, (const uint8_t *)s->data + 4 * si, 4);
        } else {
            uint16_t h;
            memcpy(&h, (const uint8_t *)s->data + 2 * si, 2);
            sc = bf16_to_f32(h);
        }
        return f8e4m3_to_f32(p[i]) * sc;
    }
    default:
        return 0.0f; /* planning sends other dtypes to GEN_RAW */
    }
}

/* Quantises one band (nr <= 128 rows starting at a multiple of 128) of
 * fbuf into F8 codes, recording each block's scale_inv. */
static void quantize_band(struct gen *g, int64_t r0, int64_t nr)
{
    int64_t cols = g->cols, nbc = (cols + MK_BLOCK - 1) / MK_BLOCK;
    for (int64_t j = 0; j < nbc; j++) {
        int64_t c0 = j * MK_BLOCK, c1 = c0 + MK_BLOCK < cols ? c0 + MK_BLOCK : cols;
        float amax = 0.0f;
        for (int64_t r = 0; r < nr; r++)
            for (int64_t c = c0; c < c1; c++) {
                float a = fabsf(g->fbuf[r * cols + c]);
                amax = a > amax ? a : amax;
            }
        float s = amax > 0.0f && isfinite(amax) ? amax / MK_FP8_MAX : 1.0f;
        if (g->scale->scale_bf16)
            s = bf16_to_f32(f32_to_bf16(s));
        float inv = 1.0f / s;
        g->scale->scales[(r0 / MK_BLOCK) * nbc + j] = s;
        for (int64_t r = 0; r < nr; r++)
            for (int64_t c = c0; c < c1; c++)
                g->band[r * cols + c] = mk_f32_to_e4m3(g->fbuf[r * cols + c] * inv);
    }
}

/* Produces the next band of rows of g into g->band. */
static int next_band(struct gen *g, struct rl_err *err)
{
    size_t dsz = st_dtype_size(g->out);
    if (!g->fbuf) {
        if (g->out == ST_F8_E4M3)
            g->band_rows = MK_BLOCK;
        else
            g->band_rows = (int64_t)(MK_BAND_BYTES / 4) / g->cols;
        if (g->band_rows < 1)
            g->band_rows = 1;
        if (g->band_rows > g->rows)
            g->band_rows = g->rows;
        size_t ne = (size_t)(g->band_rows * g->cols);
        g->fbuf = malloc(ne * sizeof *g->fbuf);
        g->band = malloc(ne * dsz);
        if (!g->fbuf || !g->band)
            return rl_errf(err, RL_ENOMEM, "out of memory for tensor \"%s\"", g->name);
        if (g->kind == GEN_RANDOM && g->pattern) {
            if (!(g->pat = malloc(MK_PATTERN * sizeof *g->pat)))
                return rl_errf(err, RL_ENOMEM, "out of memory for tensor \"%s\"", g->name);
            for (int i = 0; i < MK_PATTERN; i++)
                g->pat[i] = g->mean + g->std * rng_normal(&g->rng);
        }
    }
    if (g->next_row >= g->rows)
        return rl_errf(err, RL_EINTERNAL, "tensor \"%s\": asked for bytes past its end", g->name);
    int64_t r0 = g->next_row, nr = g->rows - r0 < g->band_rows ? g->rows - r0 : g->band_rows;
    size_t ne = (size_t)(nr * g->cols);
    float *v = g->fbuf;
    if (g->kind == GEN_RANDOM && g->pat) {
        uint64_t e = (uint64_t)r0 * (uint64_t)g->cols;
        for (size_t i = 0; i < ne;) {
            size_t at = (size_t)((e + i) % MK_PATTERN), k = MK_PATTERN - at;
            k = k < ne - i ? k : ne - i;
            memcpy(v + i, g->pat + at, k * sizeof *v);
            i += k;
        }
    } else if (g->kind == GEN_RANDOM) {
        for (size_t i = 0; i < ne; i++)
            v[i] = g->mean + g->std * rng_normal(&g->rng);
    } else {
        for (int64_t r = 0; r < nr; r++)
            for (int64_t c = 0; c < g->cols; c++)
                v[r * g->cols + c] = src_value(g, r0 + r, c);
    }
    switch (g->out) {
    case ST_F32:
        memcpy(g->band, v, ne * 4);
        break;
    case ST_BF16:
        for (size_t i = 0; i < ne; i++) {
            uint16_t h = f32_to_bf16(v[i]);
            memcpy(g->band + 2 * i, &h, 2);
        }
        break;
    case ST_F16: /* AWQ's unquantized tensors: the BF16 value, as F16 */
        for (size_t i = 0; i < ne; i++) {
            uint16_t h = f32_to_f16(bf16_to_f32(f32_to_bf16(v[i])));
            memcpy(g->band + 2 * i, &h, 2);
        }
        break;
    case ST_F8_E4M3:
        /* random FP8 weights stand for a BF16 model that was quantised */
        if (g->kind == GEN_RANDOM)
            for (size_t i = 0; i < ne; i++)
                v[i] = bf16_to_f32(f32_to_bf16(v[i]));
        quantize_band(g, r0, nr);
        break;
    default:
        return rl_errf(err, RL_EINTERNAL, "tensor \"%s\": cannot generate %s", g->name,
                       st_dtype_name(g->out));
    }
    g->band_off += g->band_len;
    g->band_len = ne * dsz;
    g->next_row = r0 + nr;
    return 0;
}

static int scale_fill(struct gen *g, uint64_t off, uint8_t *out, size_t n, struct rl_err *err)
{
    const struct gen *w = g->weight;
    if (w->next_row != w->rows)
        return rl_errf(err, RL_EINTERNAL, "scales of \"%s\" wanted before the weight was written",
                       w->name);
    size_t dsz = g->scale_bf16 ? 2 : 4;
    for (size_t i = 0; i < n; i += dsz) {
        float s = g->scales[(off + i) / dsz];
        if (g->scale_bf16) {
            uint16_t h = f32_to_bf16(s);
            memcpy(out + i, &h, 2);
        } else {
            memcpy(out + i, &s, 4);
        }
    }
    return 0;
}

/* st_fill_fn for every planned tensor. */
static int gen_fill(void *ctx, uint64_t off, void *buf, size_t n, struct rl_err *err)
{
    struct gen *g = ctx;
    uint8_t *out = buf;
    if (g->kind == GEN_SCALE)
        return scale_fill(g, off, out, n, err);
    if (g->kind >= GEN_AWQ_QWEIGHT)
        return awq_fill(g, off, out, n, err);
    if (g->kind == GEN_RAW) {
        memcpy(out, (const uint8_t *)g->src->data + off, n);
        return 0;
    }
    uint64_t end = off + n;
    while (off < end) {
        if (off >= g->band_off + g->band_len) {
            int rc = next_band(g, err);
            if (rc)
                return rc;
        }
        if (off < g->band_off)
            return rl_errf(err, RL_EINTERNAL, "tensor \"%s\": out-of-order fill", g->name);
        size_t in = (size_t)(off - g->band_off), k = g->band_len - in;
        k = k < end - off ? k : (size_t)(end - off);
        memcpy(out, g->band + in, k);
        out += k;
        off += k;
    }
    if (end == g->n_bytes)
        gen_release(g);
    return 0;
}

struct plan {
    struct gen *g;
    int n, cap;
};

/* Appends a tensor to the plan; *out points at it until the next plan_add. */
static int plan_add(struct plan *p, const char *name, int n_dims, const int64_t *shape,
                    enum st_dtype out_dt, struct gen **out, struct rl_err *err)
{
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 256;
        struct gen *g = realloc(p->g, (size_t)cap * sizeof *g);
        if (!g)
            return rl_errf(err, RL_ENOMEM, "out of memory");
        /* scale <-> weight links are pointers: rebase them */
        for (int i = 0; i < p->n; i++) {
            if (g[i].scale)
                g[i].scale = g + (g[i].scale - p->g);
            if (g[i].weight)
                g[i].weight = g + (g[i].weight - p->g);
        }
        p->g = g;
        p->cap = cap;
    }
    if (strlen(name) >= sizeof p->g[0].name)
        return rl_errf(err, RL_EINVAL, "tensor name \"%.100s...\" too long", name);
    struct gen *g = &p->g[p->n++];
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", name);
    g->n_dims = n_dims;
    g->rows = 1;
    g->cols = 1;
    for (int i = 0; i < n_dims; i++) {
        g->shape[i] = shape[i];
        if (i < n_dims - 1)
            g->rows *= shape[i];
        else
            g->cols = shape[i];
    }
    g->out = out_dt;
    g->n_bytes = (uint64_t)g->rows * (uint64_t)g->cols * st_dtype_size(out_dt);
    *out = g;
    return 0;
}

/* Adds the weight_scale_inv companion of F8 weight p->g[wi]. */
static int plan_add_scale(struct plan *p, int wi, int scale_bf16, struct rl_err *err)
{
    char name[256];
    snprintf(name, sizeof name, "%s_scale_inv", p->g[wi].name);
    int64_t sh[2] = {(p->g[wi].rows + MK_BLOCK - 1) / MK_BLOCK,
                     (p->g[wi].cols + MK_BLOCK - 1) / MK_BLOCK};
    struct gen *s;
    int rc = plan_add(p, name, 2, sh, scale_bf16 ? ST_BF16 : ST_F32, &s, err);
    if (rc)
        return rc;
    struct gen *w = &p->g[wi];
    s->kind = GEN_SCALE;
    s->scale_bf16 = scale_bf16;
    s->weight = w;
    w->scale = s;
    if (!(s->scales = calloc((size_t)(sh[0] * sh[1]), sizeof *s->scales)))
        return rl_errf(err, RL_ENOMEM, "out of memory");
    return 0;
}

static void plan_free(struct plan *p)
{
    for (int i = 0; i < p->n; i++) {
        gen_release(&p->g[i]);
        free(p->g[i].scales);
    }
    free(p->g);
}

static const char *const proj_suffix[7] = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
};

static int is_proj(const char *name)
{
    size_t n = strlen(name);
    for (int i = 0; i < 7; i++) {
        size_t k = strlen(proj_suffix[i]);
        if (n > k && name[n - k - 1] == '.' && !strcmp(name + n - k, proj_suffix[i]))
            return 1;
    }
    return 0;
}

static enum st_dtype out_dtype(enum mk_dtype d, int proj)
{
    return d == MK_F32 ? ST_F32 : d == MK_FP8 && proj ? ST_F8_E4M3 : d == MK_AWQ ? ST_F16 : ST_BF16;
}

/* An AWQ projection `name` (....weight) of (rows, cols): qweight, qzeros
 * and scales, seeded by the weight's name so one seed gives the same
 * weights as the BF16 model. */
static int plan_awq(struct plan *p, const struct mk_opts *o, const char *name, int64_t rows,
                    int64_t cols, struct rl_err *err)
{
    int G = o->awq_group ? o->awq_group : 128;
    char base[192], n[256];
    snprintf(base, sizeof base, "%.*s", (int)(strlen(name) - strlen(".weight")), name);
    int64_t shq[2] = {cols, rows / 8}, shz[2] = {cols / G, rows / 8}, shs[2] = {cols / G, rows};
    struct gen *g;
    snprintf(n, sizeof n, "%s.qweight", base);
    int rc = plan_add(p, n, 2, shq, ST_I32, &g, err);
    if (rc)
        return rc;
    int wi = p->n - 1;
    g->kind = GEN_AWQ_QWEIGHT;
    g->mean = 0.0f;
    g->std = o->weight_std > 0 ? o->weight_std : 0.02f;
    g->pattern = o->pattern;
    g->awq_rows = rows;
    g->awq_cols = cols;
    g->awq_group = G;
    rng_seed(&g->rng, o->seed, name);
    snprintf(n, sizeof n, "%s.qzeros", base);
    if ((rc = plan_add(p, n, 2, shz, ST_I32, &g, err)))
        return rc;
    g->kind = GEN_AWQ_QZEROS;
    g->weight = &p->g[wi];
    snprintf(n, sizeof n, "%s.scales", base);
    if ((rc = plan_add(p, n, 2, shs, ST_F16, &g, err)))
        return rc;
    g->kind = GEN_AWQ_SCALES;
    g->weight = &p->g[wi];
    return 0;
}

/* One random tensor: matrices get std 0.02 (activations stay O(1) through
 * many layers), norm vectors 1 +- 0.02. */
static int plan_random(struct plan *p, const struct mk_opts *o, const char *name, int64_t rows,
                       int64_t cols, struct rl_err *err)
{
    int proj = rows && is_proj(name);
    if (proj && o->dtype == MK_AWQ)
        return plan_awq(p, o, name, rows, cols, err);
    int64_t sh[2] = {rows, cols};
    struct gen *g;
    int rc = rows ? plan_add(p, name, 2, sh, out_dtype(o->dtype, proj), &g, err)
                  : plan_add(p, name, 1, sh + 1, out_dtype(o->dtype, 0), &g, err);
    if (rc)
        return rc;
    g->kind = GEN_RANDOM;
    g->mean = rows ? 0.0f : 1.0f;
    g->std = rows && o->weight_std > 0 ? o->weight_std : 0.02f;
    g->pattern = o->pattern;
    rng_seed(&g->rng, o->seed, name);
    if (g->out == ST_F8_E4M3)
        return plan_add_scale(p, p->n - 1, o->scale_bf16, err);
    return 0;
}

/* A decoder layer's tensors, in the order they are written: the Hugging
 * Face name after "model.layers.<l>.", the GGUF name between "blk.<l>." and
 * ".weight", and the shape (rows 0: a norm's vector of cols). */
enum { LT_ATTN_V = 3, LT_FFN_DOWN = 10, N_LAYER_TENSORS = 11 };
static const struct {
    const char *hf, *gguf;
} layer_tensors[N_LAYER_TENSORS] = {
    {"input_layernorm.weight", "attn_norm"},
    {"self_attn.q_proj.weight", "attn_q"},
    {"self_attn.k_proj.weight", "attn_k"},
    {"self_attn.v_proj.weight", "attn_v"},
    {"self_attn.o_proj.weight", "attn_output"},
    {"self_attn.q_norm.weight", "attn_q_norm"},
    {"self_attn.k_norm.weight", "attn_k_norm"},
    {"post_attention_layernorm.weight", "ffn_norm"},
    {"mlp.gate_proj.weight", "ffn_gate"},
    {"mlp.up_proj.weight", "ffn_up"},
    {"mlp.down_proj.weight", "ffn_down"},
};

static void layer_shape(const struct mk_opts *o, int i, int64_t *rows, int64_t *cols)
{
    int64_t H = o->hidden, I = o->intermediate, Q = (int64_t)o->n_heads * o->head_dim,
            KV = (int64_t)o->n_kv_heads * o->head_dim, D = o->head_dim;
    const int64_t r[N_LAYER_TENSORS] = {0, Q, KV, KV, H, 0, 0, 0, I, I, H};
    const int64_t c[N_LAYER_TENSORS] = {H, H, H, H, Q, D, D, H, H, H, I};
    *rows = r[i];
    *cols = c[i];
}

static int plan_model(struct plan *p, const struct mk_opts *o, struct rl_err *err)
{
    int64_t H = o->hidden, V = o->vocab;
    int rc;
    const char *pfx = o->embedding ? "" : "model.";
    char n[160];
    snprintf(n, sizeof n, "%sembed_tokens.weight", pfx);
    if ((rc = plan_random(p, o, n, V, H, err)))
        return rc;
    for (int l = 0; l < o->n_layers; l++) {
        for (int i = 0; i < N_LAYER_TENSORS; i++) {
            int64_t rows, cols;
            layer_shape(o, i, &rows, &cols);
            snprintf(n, sizeof n, "%slayers.%d.%s", pfx, l, layer_tensors[i].hf);
            if ((rc = plan_random(p, o, n, rows, cols, err)))
                return rc;
        }
    }
    snprintf(n, sizeof n, "%snorm.weight", pfx);
    if ((rc = plan_random(p, o, n, 0, H, err)))
        return rc;
    if (!o->tied && !o->embedding && (rc = plan_random(p, o, "lm_head.weight", V, H, err)))
        return rc;
    return 0;
}

static int is_float_dtype(enum st_dtype d)
{
    return d == ST_F32 || d == ST_F16 || d == ST_BF16 || d == ST_F8_E4M3 || d == ST_F64;
}

/* Plans the conversion of every tensor of `src` (scales are regenerated). */
static int plan_from(struct plan *p, const struct mk_opts *o, const struct st_file *src,
                     int src_br, int src_bc, struct rl_err *err)
{
    for (int i = 0; i < st_n_tensors(src); i++) {
        const struct st_tensor *t = st_get(src, i);
        size_t nl = strlen(t->name);
        if (nl > 10 && !strcmp(t->name + nl - 10, "_scale_inv"))
            continue; /* an input FP8 scale: folded into its weight */
        const struct st_tensor *sc = NULL;
        if (t->dtype == ST_F8_E4M3) {
            char sn[256];
            snprintf(sn, sizeof sn, "%s_scale_inv", t->name);
            sc = st_find(src, sn);
            int64_t r = 1;
            for (int d = 0; d + 1 < t->n_dims; d++)
                r *= t->shape[d];
            int64_t c = t->n_dims ? t->shape[t->n_dims - 1] : 1;
            if (!sc || sc->n_dims != 2 || (sc->dtype != ST_F32 && sc->dtype != ST_BF16) ||
                sc->shape[0] != (r + src_br - 1) / src_br || sc->shape[1] != (c + src_bc - 1) / src_bc)
                return rl_errf(err, RL_EFORMAT, "%s: F8 tensor \"%s\" lacks a matching F32/BF16 \"%s\"",
                               t->file, t->name, sn);
        }
        /* the embedding layout: the body's names bare, no vocabulary product */
        const char *name = t->name;
        if (o->embedding && !strcmp(name, "lm_head.weight"))
            continue;
        if (o->embedding && !strncmp(name, "model.", 6))
            name += 6;
        int fl = is_float_dtype(t->dtype);
        enum st_dtype out = fl ? out_dtype(o->dtype, t->n_dims == 2 && is_proj(t->name)) : t->dtype;
        struct gen *g;
        int rc = plan_add(p, name, t->n_dims, t->shape, out, &g, err);
        if (rc)
            return rc;
        g->kind = fl ? GEN_SOURCE : GEN_RAW;
        g->src = t;
        g->src_scale = sc;
        g->src_br = src_br;
        g->src_bc = src_bc;
        if (out == ST_F8_E4M3 && (rc = plan_add_scale(p, p->n - 1, o->scale_bf16, err)))
            return rc;
    }
    return 0;
}

/* Assigns p->g[*].shard; returns the number of shards. */
static int plan_shards(struct plan *p, const struct mk_opts *o)
{
    uint64_t total = 0;
    for (int i = 0; i < p->n; i++)
        total += p->g[i].n_bytes;
    int shard = 0, want = o->n_shards > 1 ? o->n_shards : 1;
    uint64_t cum = 0, cur = 0;
    for (int i = 0; i < p->n;) {
        /* a unit: a weight and, if F8, its scale */
        int j = i + 1;
        uint64_t ub = p->g[i].n_bytes;
        while (j < p->n && p->g[j].weight == &p->g[i]) { /* FP8 scale, AWQ qzeros + scales */
            ub += p->g[j].n_bytes;
            j++;
        }
        int s = shard;
        if (o->shard_size) {
            if (cur && cur + ub > o->shard_size)
                s = shard + 1;
        } else if (want > 1 && total) {
            /* the shard whose slice of the byte range holds this unit's middle */
            int k = (int)((double)(cum + ub / 2) * want / (double)total);
            k = k >= want ? want - 1 : k;
            s = k > shard && cur ? shard + 1 : shard; /* never leave a shard empty */
        }
        if (s != shard)
            cur = 0;
        shard = s;
        for (int k = i; k < j; k++)
            p->g[k].shard = shard;
        cur += ub;
        cum += ub;
        i = j;
    }
    return shard + 1;
}

/* ---- files ---- */

static void set_item(cJSON *obj, const char *key, cJSON *v)
{
    if (cJSON_GetObjectItemCaseSensitive(obj, key))
        cJSON_ReplaceItemInObjectCaseSensitive(obj, key, v);
    else
        cJSON_AddItemToObject(obj, key, v);
}

/* Sets torch_dtype and quantization_config for `dtype` in config `c`. */
static void config_dtype(cJSON *c, const struct mk_opts *o)
{
    set_item(c, "torch_dtype", cJSON_CreateString(o->dtype == MK_F32   ? "float32"
                                                  : o->dtype == MK_AWQ ? "float16"
                                                                       : "bfloat16"));
    cJSON_DeleteItemFromObjectCaseSensitive(c, "quantization_config");
    if (o->dtype == MK_AWQ) { /* as Qwen/Qwen3-*-AWQ's config.json has it */
        cJSON *q = cJSON_CreateObject();
        cJSON_AddNumberToObject(q, "bits", 4);
        cJSON_AddNumberToObject(q, "group_size", o->awq_group ? o->awq_group : 128);
        cJSON_AddNullToObject(q, "modules_to_not_convert");
        cJSON_AddStringToObject(q, "quant_method", "awq");
        cJSON_AddStringToObject(q, "version", "gemm");
        cJSON_AddTrueToObject(q, "zero_point");
        cJSON_AddItemToObject(c, "quantization_config", q);
        return;
    }
    if (o->dtype != MK_FP8)
        return;
    cJSON *q = cJSON_CreateObject();
    cJSON_AddStringToObject(q, "activation_scheme", "dynamic");
    cJSON_AddStringToObject(q, "fmt", "e4m3");
    cJSON_AddStringToObject(q, "quant_method", "fp8");
    const int bs[2] = {MK_BLOCK, MK_BLOCK};
    cJSON_AddItemToObject(q, "weight_block_size", cJSON_CreateIntArray(bs, 2));
    cJSON_AddItemToObject(c, "quantization_config", q);
}

static cJSON *make_config(const struct mk_opts *o)
{
    cJSON *c = cJSON_CreateObject();
    const char *arch = "Qwen3ForCausalLM";
    cJSON_AddItemToObject(c, "architectures", cJSON_CreateStringArray(&arch, 1));
    cJSON_AddFalseToObject(c, "attention_bias");
    cJSON_AddNumberToObject(c, "attention_dropout", 0.0);
    int bos = o->bos_id >= 0 ? o->bos_id : o->vocab > 151645 ? 151643 : o->vocab - 2;
    int eos = o->eos_id >= 0 ? o->eos_id : o->vocab > 151645 ? 151645 : o->vocab - 1;
    cJSON_AddNumberToObject(c, "bos_token_id", bos);
    cJSON_AddNumberToObject(c, "eos_token_id", eos);
    cJSON_AddNumberToObject(c, "head_dim", o->head_dim);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddNumberToObject(c, "hidden_size", o->hidden);
    cJSON_AddNumberToObject(c, "initializer_range", 0.02);
    cJSON_AddNumberToObject(c, "intermediate_size", o->intermediate);
    cJSON_AddNumberToObject(c, "max_position_embeddings", 40960);
    cJSON_AddNumberToObject(c, "max_window_layers", o->n_layers);
    cJSON_AddStringToObject(c, "model_type", "qwen3");
    cJSON_AddNumberToObject(c, "num_attention_heads", o->n_heads);
    cJSON_AddNumberToObject(c, "num_hidden_layers", o->n_layers);
    cJSON_AddNumberToObject(c, "num_key_value_heads", o->n_kv_heads);
    cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-6);
    if (o->yarn_factor > 0) {
        cJSON *y = cJSON_AddObjectToObject(c, "rope_scaling");
        cJSON_AddStringToObject(y, "rope_type", "yarn");
        cJSON_AddNumberToObject(y, "factor", o->yarn_factor);
        cJSON_AddNumberToObject(y, "original_max_position_embeddings", 32768);
    } else {
        cJSON_AddNullToObject(c, "rope_scaling");
    }
    cJSON_AddNumberToObject(c, "rope_theta", 1000000.0);
    cJSON_AddNullToObject(c, "sliding_window");
    cJSON_AddBoolToObject(c, "tie_word_embeddings", o->tied);
    cJSON_AddStringToObject(c, "transformers_version", "4.51.0");
    cJSON_AddTrueToObject(c, "use_cache");
    cJSON_AddFalseToObject(c, "use_sliding_window");
    cJSON_AddNumberToObject(c, "vocab_size", o->vocab);
    config_dtype(c, o);
    return c;
}

/* ---- options ---- */

static const struct preset {
    const char *name;
    int hidden, inter, layers, heads, kv, head_dim, vocab, tied;
} presets[] = {
    /* from the Qwen/Qwen3-* config.json files on Hugging Face */
    {"tiny", 128, 384, 4, 4, 2, 32, 768, 1},
    {"qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936, 1},
    {"qwen3-1.7b", 2048, 6144, 28, 16, 8, 128, 151936, 1},
    {"qwen3-4b", 2560, 9728, 36, 32, 8, 128, 151936, 1},
    {"qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, 0},
    {"qwen3-14b", 5120, 17408, 40, 40, 8, 128, 151936, 0},
    {"qwen3-32b", 5120, 25600, 64, 64, 8, 128, 151936, 0},
};

int mk_opts_preset(struct mk_opts *o, const char *shape, struct rl_err *err)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const struct preset *p = &presets[i];
        if (strcmp(shape, p->name))
            continue;
        o->hidden = p->hidden;
        o->intermediate = p->inter;
        o->n_layers = p->layers;
        o->n_heads = p->heads;
        o->n_kv_heads = p->kv;
        o->head_dim = p->head_dim;
        o->vocab = p->vocab;
        o->tied = p->tied;
        return 0;
    }
    return rl_errf(err, RL_EINVAL,
                   "unknown shape \"%s\" (tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-14b, qwen3-32b)",
                   shape);
}

void mk_opts_init(struct mk_opts *o)
{
    memset(o, 0, sizeof *o);
    mk_opts_preset(o, "tiny", NULL);
    o->dtype = MK_BF16;
    o->bos_id = -1;
    o->eos_id = -1;
}

/* Every --dtype: its name, and for the GGUF ones the mix written (base:
 * most matrices; more: attn_v and ffn_down of the use_more_bits layers;
 * out: output, or token_embd when tied) and llama.cpp's llama_ftype. */
static const struct {
    const char *name;
    enum model_dtype base, more, out;
    uint32_t ftype;
} MK_DTYPES[MK_N] = {
    [MK_F32] = {"f32", 0, 0, 0, 0},
    [MK_BF16] = {"bf16", 0, 0, 0, 0},
    [MK_FP8] = {"fp8", 0, 0, 0, 0},
    [MK_AWQ] = {"awq", 0, 0, 0, 0},
    [MK_Q8_0] = {"q8_0", MODEL_Q8_0, MODEL_Q8_0, MODEL_Q8_0, 7},
    [MK_Q4_K_M] = {"q4_k_m", MODEL_Q4_K, MODEL_Q6_K, MODEL_Q6_K, 15},
    [MK_Q5_K_M] = {"q5_k_m", MODEL_Q5_K, MODEL_Q6_K, MODEL_Q6_K, 17},
    [MK_Q6_K] = {"q6_k", MODEL_Q6_K, MODEL_Q6_K, MODEL_Q6_K, 18},
    [MK_Q4_0] = {"q4_0", MODEL_Q4_0, MODEL_Q4_0, MODEL_Q6_K, 2},
    [MK_Q4_1] = {"q4_1", MODEL_Q4_1, MODEL_Q4_1, MODEL_Q6_K, 3},
    [MK_Q5_0] = {"q5_0", MODEL_Q5_0, MODEL_Q5_0, MODEL_Q6_K, 8},
    [MK_Q5_1] = {"q5_1", MODEL_Q5_1, MODEL_Q5_1, MODEL_Q6_K, 9},
    [MK_Q2_K] = {"q2_k", MODEL_Q2_K, MODEL_Q3_K, MODEL_Q6_K, 10},
    [MK_Q3_K_M] = {"q3_k_m", MODEL_Q3_K, MODEL_Q4_K, MODEL_Q6_K, 12},
    [MK_IQ4_NL] = {"iq4_nl", MODEL_IQ4_NL, MODEL_IQ4_NL, MODEL_Q6_K, 25},
    [MK_IQ4_XS] = {"iq4_xs", MODEL_IQ4_XS, MODEL_IQ4_XS, MODEL_Q6_K, 30},
};

const char *mk_dtype_name(enum mk_dtype d)
{
    return (unsigned)d < MK_N ? MK_DTYPES[d].name : "?";
}

int mk_dtype_parse(const char *s, enum mk_dtype *out)
{
    for (int d = 0; d < MK_N; d++)
        if (!strcmp(s, MK_DTYPES[d].name)) {
            *out = (enum mk_dtype)d;
            return 0;
        }
    return -1;
}

int mk_dtype_is_gguf(enum mk_dtype d) { return d >= MK_Q8_0 && d < MK_N; }

/* The quantized formats split rows into blocks or groups: every matrix's
 * input features (hidden, heads x head_dim, intermediate) must be whole
 * blocks, and AWQ packs 8 output features per int32. */
static int check_quant_shape(const struct mk_opts *o, struct rl_err *err)
{
    int blk = 1;
    if (o->dtype == MK_AWQ) {
        blk = o->awq_group ? o->awq_group : 128;
    } else if (mk_dtype_is_gguf(o->dtype)) { /* the largest block of the mix */
        enum model_dtype ts[3] = {MK_DTYPES[o->dtype].base, MK_DTYPES[o->dtype].more,
                                  MK_DTYPES[o->dtype].out};
        for (int i = 0; i < 3; i++)
            blk = quant_block_elems(ts[i]) > blk ? quant_block_elems(ts[i]) : blk;
    }
    const char *what = o->dtype == MK_AWQ ? "the AWQ group size" : "the quantization block";
    const struct {
        const char *dim;
        long v;
    } in[] = {{"--hidden", o->hidden},
              {"--heads x --head-dim", (long)o->n_heads * o->head_dim},
              {"--intermediate", o->intermediate}};
    for (size_t i = 0; i < 3; i++)
        if (in[i].v % blk)
            return rl_errf(err, RL_EINVAL, "%s %ld is not a multiple of %s (%d)", in[i].dim,
                           in[i].v, what, blk);
    if (o->dtype == MK_AWQ && ((long)o->n_kv_heads * o->head_dim % 8 || o->hidden % 8))
        return rl_errf(err, RL_EINVAL, "AWQ packs 8 output features per int32: --hidden and "
                                       "--kv-heads x --head-dim must be multiples of 8");
    return 0;
}

static int check_opts(const struct mk_opts *o, struct rl_err *err)
{
    if (!o->out_dir || !*o->out_dir)
        return rl_errf(err, RL_EINVAL, "no output directory (--out)");
    if ((unsigned)o->dtype >= MK_N)
        return rl_errf(err, RL_EINVAL, "bad dtype %d", (int)o->dtype);
    if (o->from_dir && o->dtype >= MK_AWQ)
            return rl_errf(err, RL_EINVAL, "--from converts to f32, bf16 or fp8 only; awq and GGUF "
                                       "models are made with random weights");
    if (o->embedding && o->dtype >= MK_AWQ)
        return rl_errf(err, RL_EINVAL, "--embedding: the embedding layout is written as "
                                       "safetensors in f32, bf16 or fp8");
    if (o->awq_group < 0 || o->awq_group > 1 << 16)
        return rl_errf(err, RL_EINVAL, "--group %d: must be in [1, 65536]", o->awq_group);
    if (o->n_shards < 0 || (o->n_shards > 1 && o->shard_size))
        return rl_errf(err, RL_EINVAL, "give --shards or --shard-size, not both");
    if (o->n_shards > 99999)
        return rl_errf(err, RL_EINVAL, "--shards %d: at most 99999", o->n_shards);
    if (!(o->yarn_factor >= 0) || o->yarn_factor > 1000)
        return rl_errf(err, RL_EINVAL, "--yarn %g: must be in (0, 1000]", o->yarn_factor);
    if (o->from_dir)
        return 0;
    const struct {
        const char *flag;
        int v, max;
    } dims[] = {
        {"--hidden", o->hidden, 1 << 20},   {"--intermediate", o->intermediate, 1 << 20},
        {"--layers", o->n_layers, 10000},   {"--heads", o->n_heads, 4096},
        {"--kv-heads", o->n_kv_heads, 4096}, {"--head-dim", o->head_dim, 4096},
        {"--vocab", o->vocab, 1 << 24},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].v < 1 || dims[i].v > dims[i].max)
            return rl_errf(err, RL_EINVAL, "%s %d: must be in [1, %d]", dims[i].flag, dims[i].v,
                           dims[i].max);
    if (o->n_heads % o->n_kv_heads)
        return rl_errf(err, RL_EINVAL, "--heads %d is not a multiple of --kv-heads %d", o->n_heads,
                       o->n_kv_heads);
    if (o->vocab < 2)
        return rl_errf(err, RL_EINVAL, "--vocab %d: need at least 2 tokens", o->vocab);
    if (o->bos_id >= o->vocab || o->eos_id >= o->vocab)
        return rl_errf(err, RL_EINVAL, "bos/eos id beyond the vocab of %d", o->vocab);
    return check_quant_shape(o, err);
}

/* Reads the source config.json and its FP8 block size (default 128). */
static int load_src_config(const char *dir, cJSON **out, int *br, int *bc, struct rl_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *c;
    int rc = file_read_json(path, MODEL_CONFIG_MAX, &c, err);
    if (rc)
        return rc;
    *br = *bc = MK_BLOCK;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(c, "quantization_config");
    const cJSON *bs = cJSON_IsObject(q) ? cJSON_GetObjectItemCaseSensitive(q, "weight_block_size") : NULL;
    if (bs) {
        const cJSON *a = cJSON_GetArrayItem(bs, 0), *b = cJSON_GetArrayItem(bs, 1);
        if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2 || !cJSON_IsNumber(a) ||
            !cJSON_IsNumber(b) || a->valueint < 1 || b->valueint < 1 || a->valueint > 65536 ||
            b->valueint > 65536) {
            cJSON_Delete(c);
            return rl_errf(err, RL_EFORMAT, "%s: bad quantization_config.weight_block_size", path);
        }
        *br = a->valueint;
        *bc = b->valueint;
    }
    *out = c;
    return 0;
}

static int same_dir(const char *a, const char *b)
{
    struct stat sa, sb;
    return !stat(a, &sa) && !stat(b, &sb) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static int write_index(const char *out_dir, const struct plan *p, char (*fn)[64],
                       struct rl_err *err)
{
    uint64_t total = 0;
    for (int i = 0; i < p->n; i++)
        total += p->g[i].n_bytes;
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON *wm = cJSON_AddObjectToObject(root, "weight_map");
    for (int i = 0; i < p->n; i++)
        cJSON_AddStringToObject(wm, p->g[i].name, fn[p->g[i].shard]);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out_dir);
    int rc = file_write_json(path, root, err);
    cJSON_Delete(root);
    return rc;
}


/* ---- GGUF (Q8_0, Q4_K_M) ----
 *
 * One file, written by gguf_writer: the Qwen3 hyperparameters under the
 * "qwen3." keys llama.cpp's converter uses, the tokenizer (when given) as
 * llama.cpp's converter writes a Qwen tokenizer, then the tensors under
 * llama.cpp's names. Each tensor streams one row at a time from its seeded
 * PRNG (seeded by its Hugging Face name, so one seed gives the weights of
 * the BF16 model of that seed, quantized), so any size needs a few rows of
 * memory. */

/* llama.cpp's token types */
enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5 };

struct qt {
    struct gen g;      /* name (GGUF), rng, mean, std, pattern */
    enum model_dtype dt; /* MODEL_F32 or a block format */
    int64_t rows, cols;
    size_t row_bytes;
    int64_t next_row;
    float *row;        /* (cols) */
    uint8_t *enc;      /* (row_bytes) the row last made */
};

static int qt_fill(void *ctx, uint64_t off, void *buf, size_t n, struct rl_err *err)
{
    struct qt *q = ctx;
    uint8_t *out = buf;
    if (!q->row && (!(q->row = malloc((size_t)q->cols * sizeof *q->row)) ||
                    !(q->enc = malloc(q->row_bytes))))
        return rl_errf(err, RL_ENOMEM, "out of memory for tensor \"%s\"", q->g.name);
    while (n) {
        int64_t r = (int64_t)(off / q->row_bytes);
        size_t in = (size_t)(off % q->row_bytes);
        if (r != q->next_row - 1) { /* the writer asks in order: r is the next row */
            if (r != q->next_row)
                return rl_errf(err, RL_EINTERNAL, "tensor \"%s\": rows asked out of order", q->g.name);
            int rc = random_row(&q->g, r, q->cols, q->row, err);
            if (rc)
                return rc;
            if (q->dt == MODEL_F32)
                memcpy(q->enc, q->row, q->row_bytes);
            else
                quant_quantize_row(q->dt, q->row, q->enc, q->cols);
            q->next_row = r + 1;
        }
        size_t k = q->row_bytes - in < n ? q->row_bytes - in : n;
        memcpy(out, q->enc + in, k);
        out += k;
        off += k;
        n -= k;
    }
    return 0;
}

static uint32_t gguf_type_of(enum model_dtype dt)
{
    switch (dt) {
    case MODEL_Q8_0: return GGUF_T_Q8_0;
    case MODEL_Q4_K: return GGUF_T_Q4_K;
    case MODEL_Q5_K: return GGUF_T_Q5_K;
    case MODEL_Q6_K: return GGUF_T_Q6_K;
    case MODEL_Q4_0: return GGUF_T_Q4_0;
    case MODEL_Q4_1: return GGUF_T_Q4_1;
    case MODEL_Q5_0: return GGUF_T_Q5_0;
    case MODEL_Q5_1: return GGUF_T_Q5_1;
    case MODEL_Q2_K: return GGUF_T_Q2_K;
    case MODEL_Q3_K: return GGUF_T_Q3_K;
    case MODEL_IQ4_NL: return GGUF_T_IQ4_NL;
    case MODEL_IQ4_XS: return GGUF_T_IQ4_XS;
    default: return GGUF_T_F32;
    }
}


/* llama.cpp's use_more_bits: the layers whose attn_v and ffn_down Q4_K_M
 * keeps at 6 bits. */
static int more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

void mk_gguf_path(const char *out, char *buf, size_t size)
{
    size_t n = strlen(out);
    if (n > 5 && !strcmp(out + n - 5, ".gguf"))
        snprintf(buf, size, "%s", out);
    else
        snprintf(buf, size, "%s/model.gguf", out);
}

static const char *json_str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsObject(v)) /* {"content": "<|im_end|>", ...} in older configs */
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* tokenizer.json and its config, copied into the checkpoint made */
#define MK_JSON_MAX (256u << 20)

static cJSON *read_json_file(const char *dir, const char *name, int must, struct rl_err *err,
                             int *rc)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cJSON *j;
    *rc = file_read_json(path, MK_JSON_MAX, &j, err);
    if (*rc == -RL_ENOTFOUND && !must)
        *rc = 0;
    return j;
}

/* Tokens looking like control tokens are CONTROL whatever "special" says,
 * as llama.cpp's converter decides (does_token_look_special): <|...|>. */
static int looks_special(const char *t)
{
    size_t n = strlen(t);
    return n >= 4 && !strncmp(t, "<|", 2) && !strcmp(t + n - 2, "|>");
}

/* The tokenizer of dir as GGUF metadata, the way llama.cpp's converter
 * writes a Qwen (gpt2-style BPE) tokenizer: one token per id up to
 * max(vocab, ids) (vocab entries NORMAL, added tokens CONTROL or
 * USER_DEFINED, holes "[PAD<id>]" UNUSED), merges "left right", the special
 * ids, and the chat template. */
static int gguf_tokenizer(struct gguf_writer *w, const char *dir, int vocab, int bos, int eos,
                          struct rl_err *err)
{
    int rc;
    cJSON *tj = read_json_file(dir, "tokenizer.json", 1, err, &rc), *cj = NULL;
    if (!tj)
        return rc;
    cj = read_json_file(dir, "tokenizer_config.json", 0, err, &rc);
    char **tok = NULL;
    int32_t *type = NULL;
    const char **mg = NULL;
    char **mg_own = NULL;
    int n_ids = 0, n_mg = 0;
    if (rc)
        goto out;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj, "model");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(tj, "added_tokens");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsObject(v) || !cJSON_IsArray(merges) || !cJSON_IsString(mt) || strcmp(mt->valuestring, "BPE")) {
        rc = rl_errf(err, RL_EUNSUPPORTED, "%s/tokenizer.json: not a BPE model with vocab and merges", dir);
        goto out;
    }
    n_ids = vocab;
    for (const cJSON *e = v->child; e; e = e->next)
        if (cJSON_IsNumber(e) && e->valueint >= n_ids)
            n_ids = e->valueint + 1;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (cJSON_IsNumber(id) && id->valueint >= n_ids)
            n_ids = id->valueint + 1;
    }
    if (n_ids > (1 << 22)) {
        rc = rl_errf(err, RL_EFORMAT, "%s/tokenizer.json: ids up to %d", dir, n_ids);
        goto out;
    }
    tok = calloc((size_t)n_ids, sizeof *tok);
    type = calloc((size_t)n_ids, sizeof *type);
    n_mg = cJSON_GetArraySize(merges);
    mg = calloc((size_t)(n_mg ? n_mg : 1), sizeof *mg);
    mg_own = calloc((size_t)(n_mg ? n_mg : 1), sizeof *mg_own);
    if (!tok || !type || !mg || !mg_own) {
        rc = rl_errf(err, RL_ENOMEM, "out of memory for the tokenizer");
        goto out;
    }
    for (const cJSON *e = v->child; e; e = e->next)
        if (cJSON_IsNumber(e) && e->valueint >= 0) {
            tok[e->valueint] = e->string;
            type[e->valueint] = TT_NORMAL;
        }
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        const char *content = json_str(a, "content");
        if (!cJSON_IsNumber(id) || id->valueint < 0 || !content)
            continue;
        tok[id->valueint] = (char *)content;
        type[id->valueint] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "special")) ||
                                     looks_special(content)
                                 ? TT_CONTROL
                                 : TT_USER_DEFINED;
    }
    char (*pad)[24] = NULL;
    int n_pad = 0;
    for (int i = 0; i < n_ids; i++)
        n_pad += !tok[i];
    if (n_pad && !(pad = calloc((size_t)n_pad, sizeof *pad))) {
        rc = rl_errf(err, RL_ENOMEM, "out of memory for the tokenizer");
        goto out;
    }
    for (int i = 0, k = 0; i < n_ids; i++)
        if (!tok[i]) {
            snprintf(pad[k], sizeof pad[k], "[PAD%d]", i);
            tok[i] = pad[k++];
            type[i] = TT_UNUSED;
        }
    int k = 0;
    for (const cJSON *m = merges->child; m; m = m->next, k++) {
        if (cJSON_IsString(m)) {
            mg[k] = m->valuestring;
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(m->child) && cJSON_IsString(m->child->next)) {
            size_t a = strlen(m->child->valuestring), b = strlen(m->child->next->valuestring);
            if (!(mg_own[k] = malloc(a + b + 2))) {
                free(pad);
                rc = rl_errf(err, RL_ENOMEM, "out of memory for the tokenizer");
                goto out;
            }
            memcpy(mg_own[k], m->child->valuestring, a);
            mg_own[k][a] = ' ';
            memcpy(mg_own[k] + a + 1, m->child->next->valuestring, b + 1);
            mg[k] = mg_own[k];
        } else {
            free(pad);
            rc = rl_errf(err, RL_EFORMAT, "%s/tokenizer.json: merge %d is not \"a b\" or [a, b]", dir, k);
            goto out;
        }
    }
    gguf_writer_str(w, "tokenizer.ggml.model", "gpt2", 4);
    gguf_writer_str(w, "tokenizer.ggml.pre", "qwen2", 5);
    gguf_writer_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, NULL, (uint64_t)n_ids);
    gguf_writer_arr_i32(w, "tokenizer.ggml.token_type", type, (uint64_t)n_ids);
    gguf_writer_arr_str(w, "tokenizer.ggml.merges", mg, NULL, (uint64_t)n_mg);
    free(pad);
    /* special ids: eos / pad by name from tokenizer_config.json, as
     * llama.cpp's SpecialVocab reads them; bos from config.json */
    const char *names[2] = {json_str(cj, "eos_token"), json_str(cj, "pad_token")};
    int ids[2] = {eos, -1};
    for (int s = 0; s < 2; s++)
        for (int i = 0; names[s] && i < n_ids; i++)
            if (!strcmp(tok[i], names[s]) && type[i] != TT_NORMAL) {
                ids[s] = i;
                break;
            }
    gguf_writer_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    gguf_writer_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)ids[0]);
    if (ids[1] >= 0)
        gguf_writer_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)ids[1]);
    gguf_writer_bool(w, "tokenizer.ggml.add_bos_token", 0);
    const char *tpl = json_str(cj, "chat_template");
    if (tpl)
        gguf_writer_str(w, "tokenizer.chat_template", tpl, strlen(tpl));
out:
    for (int i = 0; mg_own && i < n_mg; i++)
        free(mg_own[i]);
    free(mg_own);
    free(mg);
    free(tok);
    free(type);
    cJSON_Delete(cj);
    cJSON_Delete(tj);
    return rc;
}

static int mk_write_gguf(const struct mk_opts *o, struct mk_result *res, struct rl_err *err)
{
    int64_t H = o->hidden, I = o->intermediate, D = o->head_dim, V = o->vocab;
    int L = o->n_layers, n_t = 3 + N_LAYER_TENSORS * L + (o->tied ? 0 : 1);
    int bos = o->bos_id >= 0 ? o->bos_id : o->vocab > 151645 ? 151643 : o->vocab - 2;
    int eos = o->eos_id >= 0 ? o->eos_id : o->vocab > 151645 ? 151645 : o->vocab - 1;
    struct qt *t = calloc((size_t)n_t, sizeof *t);
    struct gguf_writer *w = NULL;
    char path[4096];
    int rc = 0, n = 0;
    if (!t)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    if ((rc = gguf_writer_create(&w, err)))
        goto out;
    enum model_dtype base = MK_DTYPES[o->dtype].base, more = MK_DTYPES[o->dtype].more,
                     outq = MK_DTYPES[o->dtype].out;
    float wstd = o->weight_std > 0 ? o->weight_std : 0.02f;
#define ADD(gname, hfname, r, c, d)                                                     \
    do {                                                                                \
        struct qt *q_ = &t[n++];                                                        \
        snprintf(q_->g.name, sizeof q_->g.name, "%s", gname);                          \
        q_->rows = (r) ? (r) : 1;                                                       \
        q_->cols = (c);                                                                 \
        q_->dt = (r) ? (d) : MODEL_F32;                                                 \
        q_->g.mean = (r) ? 0.0f : 1.0f;                                                 \
        q_->g.std = (r) ? wstd : 0.02f;                                                 \
        q_->g.pattern = o->pattern;                                                     \
        rng_seed(&q_->g.rng, o->seed, hfname);                                          \
        q_->row_bytes = q_->dt == MODEL_F32 ? (size_t)q_->cols * 4                      \
                                            : quant_row_bytes(q_->dt, q_->cols);        \
    } while (0)
    /* tied: the embedding is also the output, so it gets the output's type */
    ADD("token_embd.weight", "model.embed_tokens.weight", V, H, o->tied ? outq : base);
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < N_LAYER_TENSORS; i++) {
            char a[96], b[160];
            int64_t rows, cols;
            layer_shape(o, i, &rows, &cols);
            snprintf(a, sizeof a, "blk.%d.%s.weight", l, layer_tensors[i].gguf);
            snprintf(b, sizeof b, "model.layers.%d.%s", l, layer_tensors[i].hf);
            int more_b = (i == LT_ATTN_V || i == LT_FFN_DOWN) && more_bits(l, L);
            ADD(a, b, rows, cols, more_b ? more : base);
        }
    }
    ADD("output_norm.weight", "model.norm.weight", 0, H, MODEL_F32);
    if (!o->tied)
        ADD("output.weight", "lm_head.weight", V, H, outq);
#undef ADD
    gguf_writer_str(w, "general.architecture", "qwen3", 5);
    gguf_writer_str(w, "general.name", "redlm random", 12);
    gguf_writer_u32(w, "general.file_type", MK_DTYPES[o->dtype].ftype);
    gguf_writer_u32(w, "general.quantization_version", 2);
    gguf_writer_u32(w, "qwen3.block_count", (uint32_t)L);
    gguf_writer_u32(w, "qwen3.context_length", 40960);
    gguf_writer_u32(w, "qwen3.embedding_length", (uint32_t)H);
    gguf_writer_u32(w, "qwen3.feed_forward_length", (uint32_t)I);
    gguf_writer_u32(w, "qwen3.attention.head_count", (uint32_t)o->n_heads);
    gguf_writer_u32(w, "qwen3.attention.head_count_kv", (uint32_t)o->n_kv_heads);
    gguf_writer_u32(w, "qwen3.attention.key_length", (uint32_t)D);
    gguf_writer_u32(w, "qwen3.attention.value_length", (uint32_t)D);
    gguf_writer_f32(w, "qwen3.rope.freq_base", 1000000.0f);
    gguf_writer_f32(w, "qwen3.attention.layer_norm_rms_epsilon", 1e-6f);
    if (o->yarn_factor > 0) {
        gguf_writer_str(w, "qwen3.rope.scaling.type", "yarn", 4);
        gguf_writer_f32(w, "qwen3.rope.scaling.factor", (float)o->yarn_factor);
        gguf_writer_u32(w, "qwen3.rope.scaling.original_context_length", 32768);
    }
    if (o->tokenizer_dir) {
        if ((rc = gguf_tokenizer(w, o->tokenizer_dir, o->vocab, bos, eos, err)))
            goto out;
    } else {
        gguf_writer_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
        gguf_writer_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    }
    for (int i = 0; i < n; i++) {
        int64_t ne[2] = {t[i].cols, t[i].rows};
        gguf_writer_tensor(w, t[i].g.name, gguf_type_of(t[i].dt), t[i].rows > 1 ? 2 : 1, ne,
                           NULL, qt_fill, &t[i]);
    }
    mk_gguf_path(o->out_dir, path, sizeof path);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir)
        *slash = 0;
    if (slash && (rc = file_mkdir_p(dir, err)))
        goto out;
    if ((rc = gguf_writer_write(w, path, err)))
        goto out;
    if (res) {
        struct stat st;
        res->n_params = 0;
        for (int i = 0; i < n; i++)
            res->n_params += t[i].rows * t[i].cols;
        res->n_bytes = stat(path, &st) ? 0 : (uint64_t)st.st_size;
        res->n_files = 1;
    }
out:
    for (int i = 0; i < n; i++) {
        free(t[i].row);
        free(t[i].enc);
        free(t[i].g.pat);
    }
    free(t);
    gguf_writer_free(w);
    return rc;
}

int mk_write(const struct mk_opts *o, struct mk_result *res, struct rl_err *err)
{
    int rc = check_opts(o, err);
    if (rc)
        return rc;
    if (mk_dtype_is_gguf(o->dtype))
        return mk_write_gguf(o, res, err);
    struct plan p = {0};
    struct st_file *src = NULL;
    cJSON *cfg = NULL;
    char (*fn)[64] = NULL;
    struct st_writer *w = NULL;
    int n_shards = 0;
    char path[4096];
    if (o->from_dir) {
        int br, bc;
        if (same_dir(o->from_dir, o->out_dir)) {
            rc = rl_errf(err, RL_EINVAL, "%s: --from and --out are the same directory", o->out_dir);
            goto out;
        }
        if ((rc = load_src_config(o->from_dir, &cfg, &br, &bc, err)) ||
            (rc = st_open(&src, o->from_dir, err)) || (rc = plan_from(&p, o, src, br, bc, err)))
            goto out;
        config_dtype(cfg, o);
    } else {
        if ((rc = plan_model(&p, o, err)))
            goto out;
        cfg = make_config(o);
    }
    if (!cfg) {
        rc = rl_errf(err, RL_ENOMEM, "out of memory");
        goto out;
    }
    n_shards = plan_shards(&p, o);
    if (!(fn = calloc((size_t)n_shards, sizeof *fn))) {
        rc = rl_errf(err, RL_ENOMEM, "out of memory");
        goto out;
    }
    for (int s = 0; s < n_shards; s++) {
        if (n_shards == 1)
            snprintf(fn[s], sizeof fn[s], "model.safetensors");
        else
            snprintf(fn[s], sizeof fn[s], "model-%05d-of-%05d.safetensors", s + 1, n_shards);
    }
    if ((rc = file_mkdir_p(o->out_dir, err)))
        goto out;
    snprintf(path, sizeof path, "%s/config.json", o->out_dir);
    if ((rc = file_write_json(path, cfg, err)))
        goto out;
    const char *tok = o->tokenizer_dir ? o->tokenizer_dir : o->from_dir;
    /* an explicit --tokenizer must hold tokenizer.json; generation_config.json
     * carries token ids, so it only travels with a converted model */
    if (tok && ((rc = file_copy(tok, o->out_dir, "tokenizer.json", !!o->tokenizer_dir, err)) ||
                (rc = file_copy(tok, o->out_dir, "tokenizer_config.json", 0, err))))
        goto out;
    if (o->from_dir && (rc = file_copy(o->from_dir, o->out_dir, "generation_config.json", 0, err)))
        goto out;
    /* a stale single file or index would contradict what we write now */
    snprintf(path, sizeof path, "%s/%s", o->out_dir,
             n_shards == 1 ? "model.safetensors.index.json" : "model.safetensors");
    unlink(path);
    uint64_t bytes = 0;
    for (int s = 0, i = 0; s < n_shards; s++) {
        if ((rc = st_writer_create(&w, err)))
            goto out;
        for (; i < p.n && p.g[i].shard == s; i++)
            if ((rc = st_writer_add_fill(w, p.g[i].name, p.g[i].out, p.g[i].n_dims, p.g[i].shape,
                                         gen_fill, &p.g[i], err)))
                goto out;
        snprintf(path, sizeof path, "%s/%s", o->out_dir, fn[s]);
        if ((rc = st_writer_write(w, path, err)))
            goto out;
        st_writer_free(w);
        w = NULL;
        struct stat st;
        if (!stat(path, &st))
            bytes += (uint64_t)st.st_size;
    }
    if (n_shards > 1 && (rc = write_index(o->out_dir, &p, fn, err)))
        goto out;
    if (res) {
        res->n_params = 0;
        for (int i = 0; i < p.n; i++)
            if (p.g[i].kind == GEN_AWQ_QWEIGHT)
                res->n_params += p.g[i].awq_rows * p.g[i].awq_cols;
            else if (p.g[i].kind != GEN_SCALE && p.g[i].kind != GEN_AWQ_QZEROS &&
                     p.g[i].kind != GEN_AWQ_SCALES)
                res->n_params += p.g[i].rows * p.g[i].cols;
        res->n_bytes = bytes;
        res->n_files = n_shards;
    }
out:
    st_writer_free(w);
    free(fn);
    cJSON_Delete(cfg);
    plan_free(&p);
    st_close(src);
    return rc;
}
