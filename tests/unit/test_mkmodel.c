/* tests/unit/test_mkmodel.c - the random checkpoint maker: the E4M3
 * encoder, tiny models in F32/BF16/FP8 re-read with the exact HF names and
 * shapes, one seed giving the same weights in every dtype, FP8 dequantising
 * close to its source, --from conversion of the tiny-qwen3-a fixture (BF16
 * exact to round-to-nearest-even), sharding, config.json fields, option
 * errors, and the engine's own loader accepting every output. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtype.h"
#include "mkmodel.h"
#include "model.h"
#include "safetensors.h"
#include "test_util.h"


static char tmp_root[256];

static int setup(void **state)
{
    (void)state;
    return tu_tmpdir(tmp_root, sizeof tmp_root, "test-mk");
}

static int teardown(void **state)
{
    (void)state;
    return tu_rmtree(tmp_root);
}

static const char *sub(const char *name)
{
    static char buf[8][512];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", tmp_root, name);
    return b;
}

static void make(struct mk_opts *o, struct mk_result *r)
{
    struct rl_err err = {0};
    if (mk_write(o, r, &err))
        fail_msg("mk_write %s: %s", o->out_dir, err.msg);
}

static float value_at(const struct st_tensor *t, const struct st_tensor *scale, int64_t i)
{
    const uint8_t *p = t->data;
    if (t->dtype == ST_F32) {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    if (t->dtype == ST_BF16) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return bf16_to_f32(h);
    }
    assert_int_equal(t->dtype, ST_F8_E4M3);
    assert_non_null(scale);
    int64_t cols = t->shape[1], r = i / cols, c = i % cols;
    int64_t si = (r / 128) * scale->shape[1] + c / 128;
    float s;
    if (scale->dtype == ST_F32) {
        memcpy(&s, (const uint8_t *)scale->data + 4 * si, 4);
    } else {
        uint16_t h;
        memcpy(&h, (const uint8_t *)scale->data + 2 * si, 2);
        s = bf16_to_f32(h);
    }
    return f8e4m3_to_f32(p[i]) * s;
}

static int64_t n_elem(const struct st_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++)
        n *= t->shape[i];
    return n;
}

/* Checks every tensor a tiny Qwen3 needs is there with its shape and
 * dtype, and nothing else. */
static void check_tiny_layout(const char *dir, enum mk_dtype dt, int tied, int scale_bf16)
{
    struct st_file *f;
    struct rl_err err = {0};
    if (st_open(&f, dir, &err))
        fail_msg("%s", err.msg);
    const int64_t H = 128, I = 384, Q = 4 * 32, KV = 2 * 32, D = 32, V = 768;
    struct {
        char name[128];
        int64_t r, c;
        int proj;
    } want[64]; /* 3 + 4 layers x 11 */
    int n = 0;
#define WANT(nm, rr, cc, pj)                                                                   \
    do {                                                                                       \
        snprintf(want[n].name, sizeof want[n].name, "%s", nm);                                 \
        want[n].r = rr, want[n].c = cc, want[n].proj = pj, n++;                                \
    } while (0)
    WANT("model.embed_tokens.weight", V, H, 0);
    WANT("model.norm.weight", 0, H, 0);
    if (!tied)
        WANT("lm_head.weight", V, H, 0);
    for (int l = 0; l < 4; l++) {
        char b[128];
#define L(sfx, rr, cc, pj)                                                                     \
    do {                                                                                       \
        snprintf(b, sizeof b, "model.layers.%d.%s", l, sfx);                                   \
        WANT(b, rr, cc, pj);                                                                   \
    } while (0)
        L("input_layernorm.weight", 0, H, 0);
        L("self_attn.q_proj.weight", Q, H, 1);
        L("self_attn.k_proj.weight", KV, H, 1);
        L("self_attn.v_proj.weight", KV, H, 1);
        L("self_attn.o_proj.weight", H, Q, 1);
        L("self_attn.q_norm.weight", 0, D, 0);
        L("self_attn.k_norm.weight", 0, D, 0);
        L("post_attention_layernorm.weight", 0, H, 0);
        L("mlp.gate_proj.weight", I, H, 1);
        L("mlp.up_proj.weight", I, H, 1);
        L("mlp.down_proj.weight", H, I, 1);
    }
    int n_expected = 0;
    for (int i = 0; i < n; i++) {
        const struct st_tensor *t = st_find(f, want[i].name);
        if (!t)
            fail_msg("%s: missing %s", dir, want[i].name);
        n_expected++;
        if (want[i].r) {
            assert_int_equal(t->n_dims, 2);
            assert_int_equal(t->shape[0], want[i].r);
            assert_int_equal(t->shape[1], want[i].c);
        } else {
            assert_int_equal(t->n_dims, 1);
            assert_int_equal(t->shape[0], want[i].c);
        }
        enum st_dtype exp = dt == MK_F32 ? ST_F32 : dt == MK_FP8 && want[i].proj ? ST_F8_E4M3 : ST_BF16;
        if (t->dtype != exp)
            fail_msg("%s: %s is %s, want %s", dir, t->name, st_dtype_name(t->dtype), st_dtype_name(exp));
        if (exp == ST_F8_E4M3) {
            char sn[sizeof want[0].name + 16];
            snprintf(sn, sizeof sn, "%.127s_scale_inv", want[i].name);
            const struct st_tensor *s = st_find(f, sn);
            if (!s)
                fail_msg("%s: missing %s", dir, sn);
            n_expected++;
            assert_int_equal(s->dtype, scale_bf16 ? ST_BF16 : ST_F32);
            assert_int_equal(s->n_dims, 2);
            assert_int_equal(s->shape[0], (want[i].r + 127) / 128);
            assert_int_equal(s->shape[1], (want[i].c + 127) / 128);
        }
    }
    assert_int_equal(st_n_tensors(f), n_expected);
    st_close(f);
}

static void check_loads(const char *dir)
{
    struct model *m;
    struct rl_err err = {0};
    if (model_load(&m, dir, &err))
        fail_msg("model_load %s: %s", dir, err.msg);
    model_free(m);
}

static cJSON *read_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    assert_non_null(j);
    return j;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v))
        fail_msg("config field %s missing", k);
    return v->valuedouble;
}

/* ---- tests ---- */

static void test_e4m3_encoder(void **state)
{
    (void)state;
    /* every finite code survives decode -> encode */
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f)
            continue;
        float v = f8e4m3_to_f32((uint8_t)c);
        uint8_t back = mk_f32_to_e4m3(v);
        if (back != c)
            fail_msg("code 0x%02x = %g encodes back to 0x%02x", c, v, back);
    }
    static const struct {
        float in;
        uint8_t code;
    } cases[] = {
        {0.0f, 0x00},     {1.0f, 0x38},       {-1.0f, 0xb8},     {448.0f, 0x7e},
        {1000.0f, 0x7e},  {-1e9f, 0xfe},      {1.0625f, 0x38},   /* tie -> even (1.0) */
        {1.1875f, 0x3a},  /* tie between 1.125 (odd) and 1.25: even 1.25 */
        {0.001953125f, 0x01}, /* 2^-9, smallest subnormal */
        {0.0009765625f, 0x00}, /* half of it: tie to even zero */
        {0.0146484375f, 0x08}, /* 7.5 * 2^-9: tie -> 8 = min normal */
        {240.0f, 0x77},   {0.015625f, 0x08},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (mk_f32_to_e4m3(cases[i].in) != cases[i].code)
            fail_msg("e4m3(%g) = 0x%02x, want 0x%02x", cases[i].in, mk_f32_to_e4m3(cases[i].in),
                     cases[i].code);
    assert_int_equal(mk_f32_to_e4m3(NAN) & 0x7f, 0x7f);
}

static void test_tiny_dtypes(void **state)
{
    (void)state;
    struct mk_opts o;
    struct mk_result r;
    static const struct {
        const char *dir;
        enum mk_dtype dt;
        int tied, scale_bf16;
    } cases[] = {
        {"f32", MK_F32, 1, 0}, {"bf16", MK_BF16, 1, 0}, {"fp8", MK_FP8, 1, 0},
        {"fp8-bf16scale-untied", MK_FP8, 0, 1}, {"bf16-untied", MK_BF16, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mk_opts_init(&o);
        o.out_dir = sub(cases[i].dir);
        o.dtype = cases[i].dt;
        o.tied = cases[i].tied;
        o.scale_bf16 = cases[i].scale_bf16;
        o.seed = 7;
        make(&o, &r);
        assert_int_equal(r.n_files, 1);
        int64_t params = 768 * 128 * (cases[i].tied ? 1 : 2) + 128 +
                         4 * (2 * 128 + 2 * 32 + 128 * 128 * 2 + 64 * 128 * 2 + 384 * 128 * 3);
        assert_int_equal(r.n_params, params);
        struct stat st;
        char p[600];
        snprintf(p, sizeof p, "%s/model.safetensors", o.out_dir);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(r.n_bytes, (uint64_t)st.st_size);
        check_tiny_layout(o.out_dir, cases[i].dt, cases[i].tied, cases[i].scale_bf16);
        check_loads(o.out_dir);
    }
}

/* One seed, three dtypes: BF16 is the RNE rounding of F32, FP8 dequantises
 * to within E4M3 precision of the BF16 value. Also checks the statistics
 * the maker promises (std 0.02 matrices, norms near 1). */
static void test_same_seed_across_dtypes(void **state)
{
    (void)state;
    struct mk_opts o;
    mk_opts_init(&o);
    o.seed = 42;
    const char *dirs[3] = {sub("s-f32"), sub("s-bf16"), sub("s-fp8")};
    const enum mk_dtype dts[3] = {MK_F32, MK_BF16, MK_FP8};
    for (int i = 0; i < 3; i++) {
        o.out_dir = dirs[i];
        o.dtype = dts[i];
        make(&o, NULL);
    }
    struct st_file *f[3];
    struct rl_err err = {0};
    for (int i = 0; i < 3; i++)
        assert_int_equal(st_open(&f[i], dirs[i], &err), 0);
    for (int k = 0; k < st_n_tensors(f[0]); k++) {
        const struct st_tensor *a = st_get(f[0], k), *b = st_find(f[1], a->name),
                               *c = st_find(f[2], a->name);
        assert_non_null(b);
        assert_non_null(c);
        char sn[160];
        snprintf(sn, sizeof sn, "%s_scale_inv", a->name);
        const struct st_tensor *cs = st_find(f[2], sn);
        int64_t n = n_elem(a);
        double sum = 0, sq = 0, max_rel = 0;
        for (int64_t i = 0; i < n; i++) {
            float x = value_at(a, NULL, i);
            uint16_t hb;
            memcpy(&hb, (const uint8_t *)b->data + 2 * i, 2);
            if (hb != f32_to_bf16(x))
                fail_msg("%s[%lld]: bf16 0x%04x, f32 %g", a->name, (long long)i, hb, x);
            float xb = bf16_to_f32(hb), y = value_at(c, cs, i);
            if (c->dtype == ST_F8_E4M3) {
                /* 3 mantissa bits: half an ulp is 1/16 relative, plus the
                 * subnormal step of this block's scale */
                int64_t si = (i / a->shape[1] / 128) * cs->shape[1] + (i % a->shape[1]) / 128;
                float s;
                memcpy(&s, (const uint8_t *)cs->data + 4 * si, 4);
                double tol = fabs(xb) / 16.0 + s / 512.0 + 1e-12;
                if (fabs(y - xb) > tol)
                    fail_msg("%s[%lld]: fp8 %g vs %g (tol %g)", a->name, (long long)i, y, xb, tol);
                if (fabs(xb) > 1e-3)
                    max_rel = fmax(max_rel, fabs(y - xb) / fabs(xb));
            } else {
                assert_true(y == xb);
            }
            sum += x;
            sq += (double)x * x;
        }
        double mean = sum / (double)n, sd = sqrt(sq / (double)n - mean * mean);
        if (a->n_dims == 2) {
            assert_true(fabs(mean) < 0.002);
            assert_true(fabs(sd - 0.02) < 0.002);
        } else {
            assert_true(fabs(mean - 1.0) < 0.01);
            assert_true(sd > 0.005 && sd < 0.05);
        }
        (void)max_rel;
    }
    for (int i = 0; i < 3; i++)
        st_close(f[i]);

    /* a different seed gives different weights */
    o.seed = 43;
    o.dtype = MK_F32;
    o.out_dir = sub("s-f32-43");
    make(&o, NULL);
    struct st_file *g;
    assert_int_equal(st_open(&g, o.out_dir, &err), 0);
    assert_int_equal(st_open(&f[0], dirs[0], &err), 0);
    const struct st_tensor *x = st_find(g, "model.embed_tokens.weight"),
                           *y = st_find(f[0], "model.embed_tokens.weight");
    assert_true(memcmp(x->data, y->data, x->n_bytes) != 0);
    st_close(g);
    st_close(f[0]);
}

static void test_from_conversion(void **state)
{
    (void)state;
    char src[512];
    snprintf(src, sizeof src, "%s/models/tiny-qwen3-a", tu_data_dir());
    if (access(src, R_OK))
        skip();
    struct mk_opts o;
    struct mk_result r;
    struct rl_err err = {0};
    mk_opts_init(&o);
    o.from_dir = src;
    o.out_dir = sub("a-bf16");
    o.dtype = MK_BF16;
    make(&o, &r);
    o.out_dir = sub("a-fp8");
    o.dtype = MK_FP8;
    make(&o, &r);
    o.out_dir = sub("a-fp8-bf16s");
    o.scale_bf16 = 1;
    make(&o, &r);

    struct st_file *s, *b, *q, *q2;
    assert_int_equal(st_open(&s, src, &err), 0);
    assert_int_equal(st_open(&b, sub("a-bf16"), &err), 0);
    assert_int_equal(st_open(&q, sub("a-fp8"), &err), 0);
    assert_int_equal(st_open(&q2, sub("a-fp8-bf16s"), &err), 0);
    assert_int_equal(st_n_tensors(b), st_n_tensors(s));
    for (int k = 0; k < st_n_tensors(s); k++) {
        const struct st_tensor *t = st_get(s, k), *tb = st_find(b, t->name),
                               *tq = st_find(q, t->name), *tq2 = st_find(q2, t->name);
        assert_non_null(tb);
        assert_non_null(tq);
        assert_non_null(tq2);
        assert_int_equal(tb->dtype, ST_BF16);
        assert_int_equal(tb->n_dims, t->n_dims);
        for (int d = 0; d < t->n_dims; d++)
            assert_int_equal(tb->shape[d], t->shape[d]);
        char sn[160];
        snprintf(sn, sizeof sn, "%s_scale_inv", t->name);
        const struct st_tensor *qs = st_find(q, sn), *qs2 = st_find(q2, sn);
        assert_int_equal(tq->dtype, qs ? ST_F8_E4M3 : ST_BF16);
        for (int64_t i = 0, n = n_elem(t); i < n; i++) {
            float x = value_at(t, NULL, i);
            uint16_t h;
            memcpy(&h, (const uint8_t *)tb->data + 2 * i, 2);
            if (h != f32_to_bf16(x))
                fail_msg("%s[%lld]: bf16 0x%04x for %g", t->name, (long long)i, h, x);
            if (qs) {
                int64_t si = (i / t->shape[1] / 128) * qs->shape[1] + (i % t->shape[1]) / 128;
                float sc;
                memcpy(&sc, (const uint8_t *)qs->data + 4 * si, 4);
                float y = value_at(tq, qs, i), y2 = value_at(tq2, qs2, i);
                if (fabs(y - x) > fabs(x) / 16.0 + sc / 512.0 + 1e-12)
                    fail_msg("%s[%lld]: fp8 %g vs %g", t->name, (long long)i, y, x);
                /* BF16 scales cost at most the scale's own rounding (1/256) */
                if (fabs(y2 - x) > fabs(x) * (1.0 / 16 + 1.0 / 128) + sc / 256.0 + 1e-12)
                    fail_msg("%s[%lld]: fp8/bf16-scale %g vs %g", t->name, (long long)i, y2, x);
            }
        }
    }
    st_close(s);
    st_close(b);
    st_close(q);
    st_close(q2);

    /* config and tokenizer carried over, dtype fields rewritten */
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", sub("a-fp8"));
    cJSON *c = read_json(p);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(c, "torch_dtype")->valuestring, "bfloat16");
    assert_int_equal((int)num(c, "bos_token_id"), 736);
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(c, "quantization_config");
    assert_non_null(qc);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(qc, "quant_method")->valuestring, "fp8");
    cJSON_Delete(c);
    snprintf(p, sizeof p, "%s/config.json", sub("a-bf16"));
    c = read_json(p);
    assert_null(cJSON_GetObjectItemCaseSensitive(c, "quantization_config"));
    cJSON_Delete(c);
    snprintf(p, sizeof p, "%s/tokenizer.json", sub("a-bf16"));
    assert_int_equal(access(p, R_OK), 0);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", sub("a-fp8"));
    assert_int_equal(access(p, R_OK), 0);
    check_loads(sub("a-bf16"));
    check_loads(sub("a-fp8"));
    check_loads(sub("a-fp8-bf16s"));

    /* FP8 -> BF16 dequantises */
    mk_opts_init(&o);
    o.from_dir = sub("a-fp8");
    o.out_dir = sub("a-fp8-back");
    o.dtype = MK_F32;
    make(&o, NULL);
    struct st_file *back, *fq;
    assert_int_equal(st_open(&back, o.out_dir, &err), 0);
    assert_int_equal(st_open(&fq, o.from_dir, &err), 0);
    const struct st_tensor *t = st_find(back, "model.layers.1.mlp.up_proj.weight"),
                           *t8 = st_find(fq, "model.layers.1.mlp.up_proj.weight"),
                           *ts = st_find(fq, "model.layers.1.mlp.up_proj.weight_scale_inv");
    assert_int_equal(t->dtype, ST_F32);
    assert_null(st_find(back, "model.layers.1.mlp.up_proj.weight_scale_inv"));
    for (int64_t i = 0; i < n_elem(t); i++)
        assert_true(value_at(t, NULL, i) == value_at(t8, ts, i));
    st_close(back);
    st_close(fq);
    check_loads(o.out_dir);

    /* converting onto itself is refused */
    o.out_dir = o.from_dir;
    assert_int_equal(mk_write(&o, NULL, &err), -RL_EINVAL);
}

static void test_sharding(void **state)
{
    (void)state;
    struct mk_opts o;
    struct mk_result r;
    struct rl_err err = {0};
    mk_opts_init(&o);
    o.seed = 3;
    o.dtype = MK_FP8;
    o.out_dir = sub("one");
    make(&o, &r);
    o.out_dir = sub("three");
    o.n_shards = 3;
    make(&o, &r);
    assert_int_equal(r.n_files, 3);
    o.n_shards = 0;
    o.out_dir = sub("bysize");
    o.shard_size = 200000;
    make(&o, &r);
    assert_true(r.n_files >= 5);
    char p[600];
    for (int i = 1; i <= 3; i++) {
        snprintf(p, sizeof p, "%s/model-%05d-of-00003.safetensors", sub("three"), i);
        assert_int_equal(access(p, R_OK), 0);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", sub("three"));
    assert_int_not_equal(access(p, F_OK), 0);
    struct st_file *a, *b, *c;
    assert_int_equal(st_open(&a, sub("one"), &err), 0);
    if (st_open(&b, sub("three"), &err))
        fail_msg("%s", err.msg);
    if (st_open(&c, sub("bysize"), &err))
        fail_msg("%s", err.msg);
    assert_int_equal(st_n_tensors(a), st_n_tensors(b));
    assert_int_equal(st_n_tensors(a), st_n_tensors(c));
    int n_files_seen = 0;
    const char *last = NULL;
    for (int k = 0; k < st_n_tensors(a); k++) {
        const struct st_tensor *x = st_get(a, k), *y = st_find(b, x->name), *z = st_find(c, x->name);
        assert_non_null(y);
        assert_non_null(z);
        assert_int_equal(x->n_bytes, y->n_bytes);
        assert_memory_equal(x->data, y->data, x->n_bytes);
        assert_memory_equal(x->data, z->data, x->n_bytes);
        if (!last || strcmp(last, y->file))
            n_files_seen++, last = y->file;
        /* a weight and its scales share a shard */
        size_t nl = strlen(x->name);
        if (nl > 10 && !strcmp(x->name + nl - 10, "_scale_inv")) {
            char wn[160];
            snprintf(wn, sizeof wn, "%.*s", (int)(nl - 10), x->name);
            assert_string_equal(st_find(c, wn)->file, z->file);
        }
    }
    assert_int_equal(n_files_seen, 3);
    st_close(a);
    st_close(b);
    st_close(c);
    check_loads(sub("three"));

    /* going back to one file removes the stale index */
    o.shard_size = 0;
    o.out_dir = sub("three");
    make(&o, &r);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", sub("three"));
    assert_int_not_equal(access(p, F_OK), 0);
    check_loads(sub("three"));
}

static void test_config_fields(void **state)
{
    (void)state;
    struct mk_opts o;
    mk_opts_init(&o);
    o.out_dir = sub("cfg");
    o.yarn_factor = 4.0;
    o.tied = 0;
    o.dtype = MK_F32;
    o.tokenizer_dir = NULL;
    make(&o, NULL);
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", o.out_dir);
    cJSON *c = read_json(p);
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(c, "architectures"), 0)->valuestring,
                        "Qwen3ForCausalLM");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(c, "model_type")->valuestring, "qwen3");
    assert_int_equal((int)num(c, "hidden_size"), 128);
    assert_int_equal((int)num(c, "intermediate_size"), 384);
    assert_int_equal((int)num(c, "num_hidden_layers"), 4);
    assert_int_equal((int)num(c, "num_attention_heads"), 4);
    assert_int_equal((int)num(c, "num_key_value_heads"), 2);
    assert_int_equal((int)num(c, "head_dim"), 32);
    assert_int_equal((int)num(c, "vocab_size"), 768);
    assert_int_equal((int)num(c, "bos_token_id"), 766);
    assert_int_equal((int)num(c, "eos_token_id"), 767);
    assert_int_equal((int)num(c, "max_position_embeddings"), 40960);
    assert_true(num(c, "rms_norm_eps") == 1e-6);
    assert_true(num(c, "rope_theta") == 1e6);
    assert_true(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(c, "tie_word_embeddings")));
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(c, "torch_dtype")->valuestring, "float32");
    const cJSON *y = cJSON_GetObjectItemCaseSensitive(c, "rope_scaling");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(y, "rope_type")->valuestring, "yarn");
    assert_true(num(y, "factor") == 4.0);
    assert_int_equal((int)num(y, "original_max_position_embeddings"), 32768);
    assert_null(cJSON_GetObjectItemCaseSensitive(c, "quantization_config"));
    cJSON_Delete(c);
    check_loads(o.out_dir);

    /* the real vocab gets the real special ids; tokenizer files copied */
    char tok[512];
    snprintf(tok, sizeof tok, "%s/models/tiny-qwen3-a", tu_data_dir());
    mk_opts_init(&o);
    o.out_dir = sub("cfg2");
    o.vocab = 151936;
    o.n_layers = 1;
    o.hidden = 64;
    o.intermediate = 64;
    o.head_dim = 16;
    o.pattern = 1;
    o.dtype = MK_FP8;
    int have_tok = !access(tok, R_OK);
    o.tokenizer_dir = have_tok ? tok : NULL;
    make(&o, NULL);
    snprintf(p, sizeof p, "%s/config.json", o.out_dir);
    c = read_json(p);
    assert_int_equal((int)num(c, "bos_token_id"), 151643);
    assert_int_equal((int)num(c, "eos_token_id"), 151645);
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(c, "rope_scaling")));
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(c, "quantization_config");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(q, "fmt")->valuestring, "e4m3");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(q, "activation_scheme")->valuestring, "dynamic");
    const cJSON *bs = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
    assert_int_equal(cJSON_GetArraySize(bs), 2);
    assert_int_equal(cJSON_GetArrayItem(bs, 0)->valueint, 128);
    cJSON_Delete(c);
    if (have_tok) {
        snprintf(p, sizeof p, "%s/tokenizer.json", o.out_dir);
        assert_int_equal(access(p, R_OK), 0);
    }
    check_loads(o.out_dir);
}

static void test_pattern_mode(void **state)
{
    (void)state;
    struct mk_opts o;
    mk_opts_init(&o);
    o.out_dir = sub("pat");
    o.pattern = 1;
    o.seed = 9;
    make(&o, NULL);
    struct st_file *f;
    struct rl_err err = {0};
    assert_int_equal(st_open(&f, o.out_dir, &err), 0);
    /* the embedding (98304 elements) repeats with period 65521 */
    const struct st_tensor *t = st_find(f, "model.embed_tokens.weight");
    const uint16_t *h = t->data;
    for (int i = 0; i < 1000; i++)
        assert_int_equal(h[i], h[i + 65521]);
    assert_true(memcmp(h, h + 1, 2000) != 0);
    st_close(f);
    check_loads(o.out_dir);
}

/* --embedding: Qwen3-Embedding's layout, which the loader takes as an
 * embeddings-only model when untied (no lm_head anywhere). */
static void test_embedding_layout(void **state)
{
    (void)state;
    struct mk_opts o;
    mk_opts_init(&o);
    o.out_dir = sub("emb");
    o.tied = 0;
    o.embedding = 1;
    make(&o, NULL);
    struct st_file *f;
    struct rl_err err = {0};
    assert_int_equal(st_open(&f, o.out_dir, &err), 0);
    assert_non_null(st_find(f, "embed_tokens.weight"));
    assert_non_null(st_find(f, "layers.0.self_attn.q_proj.weight"));
    assert_non_null(st_find(f, "norm.weight"));
    for (int i = 0; i < st_n_tensors(f); i++)
        assert_true(strncmp(st_get(f, i)->name, "model.", 6) != 0);
    assert_null(st_find(f, "lm_head.weight"));
    st_close(f);
    struct model *m;
    assert_int_equal(model_load(&m, o.out_dir, &err), 0);
    assert_int_equal(model_get_config(m)->embed_only, 1);
    assert_int_equal(model_get_config(m)->tied, 1); /* the embedding stands in */
    model_free(m);
    /* GGUF and AWQ have layouts of their own */
    o.dtype = MK_Q8_0;
    o.out_dir = sub("emb-q8");
    assert_int_equal(mk_write(&o, NULL, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "--embedding"));
}

static void test_bad_options(void **state)
{
    (void)state;
    struct mk_opts o;
    struct rl_err err = {0};
    mk_opts_init(&o);
    assert_int_equal(mk_write(&o, NULL, &err), -RL_EINVAL); /* no out dir */
    assert_non_null(strstr(err.msg, "--out"));
    o.out_dir = sub("bad");
    o.n_kv_heads = 3;
    assert_int_equal(mk_write(&o, NULL, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "--kv-heads"));
    mk_opts_init(&o);
    o.out_dir = sub("bad");
    o.hidden = 0;
    assert_int_equal(mk_write(&o, NULL, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "--hidden"));
    mk_opts_init(&o);
    o.out_dir = sub("bad");
    o.n_shards = 2;
    o.shard_size = 1000;
    assert_int_equal(mk_write(&o, NULL, &err), -RL_EINVAL);
    mk_opts_init(&o);
    o.out_dir = sub("bad");
    o.eos_id = 768;
    assert_int_equal(mk_write(&o, NULL, &err), -RL_EINVAL);
    assert_int_not_equal(access(sub("bad"), F_OK), 0); /* nothing written */
    mk_opts_init(&o);
    o.out_dir = sub("bad");
    o.from_dir = sub("does-not-exist");
    assert_int_equal(mk_write(&o, NULL, &err), -RL_ENOTFOUND);
    mk_opts_init(&o);
    o.out_dir = sub("bad");
    o.tokenizer_dir = sub("no-tokenizer-here");
    assert_int_equal(mk_write(&o, NULL, &err), -RL_ENOTFOUND);
    assert_non_null(strstr(err.msg, "tokenizer.json"));
    assert_int_equal(mk_opts_preset(&o, "qwen3-3b", &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "qwen3-3b"));
    /* quantized formats need whole blocks / groups and random weights */
    static const struct {
        enum mk_dtype dt;
        int hidden, inter, group;
        const char *needle;
    } q[] = {
        {MK_Q4_K_M, 128, 512, 0, "--hidden 128 is not a multiple of the quantization block (256)"},
        {MK_Q8_0, 128, 400, 0, "--intermediate 400 is not a multiple of the quantization block (32)"},
        {MK_Q6_K, 256, 256, 0, "--heads x --head-dim 128 is not a multiple of the quantization block (256)"},
        {MK_AWQ, 128, 320, 0, "--intermediate 320 is not a multiple of the AWQ group size (128)"},
        {MK_AWQ, 128, 384, 96, "--hidden 128 is not a multiple of the AWQ group size (96)"},
    };
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        mk_opts_init(&o);
        o.out_dir = sub("bad");
        o.dtype = q[i].dt, o.hidden = q[i].hidden, o.intermediate = q[i].inter;
        o.awq_group = q[i].group;
        assert_int_equal(mk_write(&o, NULL, &err), -RL_EINVAL);
        if (!strstr(err.msg, q[i].needle))
            fail_msg("\"%s\" lacks \"%s\"", err.msg, q[i].needle);
    }
    mk_opts_init(&o);
    o.out_dir = sub("bad");
    o.from_dir = sub("x");
    o.dtype = MK_Q8_0;
    assert_int_equal(mk_write(&o, NULL, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "--from converts to f32, bf16 or fp8 only"));
}

static void test_presets(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int hidden, inter, layers, heads, kv, hd, vocab, tied;
    } cases[] = {
        {"tiny", 128, 384, 4, 4, 2, 32, 768, 1},
        {"qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936, 1},
        {"qwen3-1.7b", 2048, 6144, 28, 16, 8, 128, 151936, 1},
        {"qwen3-4b", 2560, 9728, 36, 32, 8, 128, 151936, 1},
        {"qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, 0},
        {"qwen3-14b", 5120, 17408, 40, 40, 8, 128, 151936, 0},
        {"qwen3-32b", 5120, 25600, 64, 64, 8, 128, 151936, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct mk_opts o;
        struct rl_err err = {0};
        mk_opts_init(&o);
        assert_int_equal(mk_opts_preset(&o, cases[i].name, &err), 0);
        assert_int_equal(o.hidden, cases[i].hidden);
        assert_int_equal(o.intermediate, cases[i].inter);
        assert_int_equal(o.n_layers, cases[i].layers);
        assert_int_equal(o.n_heads, cases[i].heads);
        assert_int_equal(o.n_kv_heads, cases[i].kv);
        assert_int_equal(o.head_dim, cases[i].hd);
        assert_int_equal(o.vocab, cases[i].vocab);
        assert_int_equal(o.tied, cases[i].tied);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e4m3_encoder),
        cmocka_unit_test(test_tiny_dtypes),
        cmocka_unit_test(test_same_seed_across_dtypes),
        cmocka_unit_test(test_from_conversion),
        cmocka_unit_test(test_sharding),
        cmocka_unit_test(test_config_fields),
        cmocka_unit_test(test_pattern_mode),
        cmocka_unit_test(test_embedding_layout),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_presets),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
