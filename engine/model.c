/* engine/model.c - Qwen3 checkpoint loading: config.json and weight table.
 *
 * model_load() parses config.json strictly (an unknown value in a field we
 * interpret is an error naming the field; fields we do not interpret are
 * ignored, as transformers does), opens the safetensors shards, and binds
 * every tensor the Qwen3 dense architecture needs, checking dtype and shape
 * against the config. A tensor the architecture does not know is an error:
 * silently ignoring one usually means a different model.
 *
 * Ownership: struct model owns the mappings (struct st_file), the layer
 * array and the f32 copies of FP8 block scales. Tensor data pointers stay
 * valid until model_free(). Called once per process, from the owner thread. */
#include "model.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtype.h"
#include "file.h"
#include "gguf.h"
#include "quant.h"
#include "safetensors.h"

struct model {
    char *dir;
    char *gguf_path;     /* the GGUF file, or NULL */
    struct gguf_file *gg;
    struct model_config cfg;
    struct model_weights w;
    struct st_file *st;
    float **scales;      /* (n_scales) f32 block scales we converted */
    int n_scales, cap_scales;
};

const char *model_dtype_name(enum model_dtype dt)
{
    switch (dt) {
    case MODEL_F32: return "F32";
    case MODEL_BF16: return "BF16";
    case MODEL_F16: return "F16";
    case MODEL_F8_E4M3: return "F8_E4M3";
    case MODEL_Q8_0: return "Q8_0";
    case MODEL_Q4_K: return "Q4_K";
    case MODEL_Q5_K: return "Q5_K";
    case MODEL_Q6_K: return "Q6_K";
    case MODEL_AWQ4: return "AWQ4";
    case MODEL_Q4_0: return "Q4_0";
    case MODEL_Q4_1: return "Q4_1";
    case MODEL_Q5_0: return "Q5_0";
    case MODEL_Q5_1: return "Q5_1";
    case MODEL_Q2_K: return "Q2_K";
    case MODEL_Q3_K: return "Q3_K";
    case MODEL_IQ4_NL: return "IQ4_NL";
    case MODEL_IQ4_XS: return "IQ4_XS";
    }
    return "?";
}

/* ---- config.json ---- */

/* Reads an integer field. `required` fields must exist; others keep *v. */
static int cfg_int(const cJSON *root, const char *key, int required, int lo,
                   int hi, int *v, const char *path, struct rl_err *err)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it || cJSON_IsNull(it)) {
        if (required)
            return rl_errf(err, RL_EFORMAT, "%s: missing required field \"%s\"", path, key);
        return 0;
    }
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble))
        return rl_errf(err, RL_EFORMAT, "%s: field \"%s\" must be an integer", path, key);
    if (it->valuedouble < lo || it->valuedouble > hi)
        return rl_errf(err, RL_EFORMAT, "%s: field \"%s\" = %.0f is out of range [%d, %d]",
                       path, key, it->valuedouble, lo, hi);
    *v = (int)it->valuedouble;
    return 0;
}

static int cfg_float(const cJSON *root, const char *key, double lo, double hi,
                     float *v, const char *path, struct rl_err *err)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it || cJSON_IsNull(it))
        return 0;
    if (!cJSON_IsNumber(it))
        return rl_errf(err, RL_EFORMAT, "%s: field \"%s\" must be a number", path, key);
    if (!(it->valuedouble >= lo && it->valuedouble <= hi))
        return rl_errf(err, RL_EFORMAT, "%s: field \"%s\" = %g is out of range [%g, %g]",
                       path, key, it->valuedouble, lo, hi);
    *v = (float)it->valuedouble;
    return 0;
}

static int cfg_bool(const cJSON *root, const char *key, int *v, const char *path,
                    struct rl_err *err)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it || cJSON_IsNull(it))
        return 0;
    if (!cJSON_IsBool(it))
        return rl_errf(err, RL_EFORMAT, "%s: field \"%s\" must be true or false", path, key);
    *v = cJSON_IsTrue(it);
    return 0;
}

static int parse_rope_scaling(struct model_config *c, const cJSON *rs,
                              const char *path, struct rl_err *err)
{
    if (!rs || cJSON_IsNull(rs))
        return 0;
    if (!cJSON_IsObject(rs))
        return rl_errf(err, RL_EFORMAT, "%s: field \"rope_scaling\" must be an object or null", path);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t)
        t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(t))
        return rl_errf(err, RL_EFORMAT, "%s: field \"rope_scaling.rope_type\" must be a string", path);
    if (!strcmp(t->valuestring, "default"))
        return 0;
    if (strcmp(t->valuestring, "yarn"))
        return rl_errf(err, RL_EUNSUPPORTED,
                       "%s: field \"rope_scaling.rope_type\" = \"%s\" is not supported (only \"yarn\")",
                       path, t->valuestring);
    int rc;
    c->yarn_factor = 0;
    if ((rc = cfg_float(rs, "factor", 1.0, 1024.0, &c->yarn_factor, path, err)))
        return rl_err_wrap(err, "rope_scaling");
    if (c->yarn_factor == 0)
        return rl_errf(err, RL_EFORMAT, "%s: field \"rope_scaling.factor\" is required for yarn", path);
    c->yarn_orig_max_pos = c->max_pos;
    if ((rc = cfg_int(rs, "original_max_position_embeddings", 0, 1, 1 << 24,
                      &c->yarn_orig_max_pos, path, err)))
        return rl_err_wrap(err, "rope_scaling");
    c->yarn_beta_fast = 32.0f;
    c->yarn_beta_slow = 1.0f;
    c->yarn_attn_factor = 0.1f * logf(c->yarn_factor) + 1.0f;
    if ((rc = cfg_float(rs, "beta_fast", 0.0, 1e6, &c->yarn_beta_fast, path, err)) ||
        (rc = cfg_float(rs, "beta_slow", 0.0, 1e6, &c->yarn_beta_slow, path, err)) ||
        (rc = cfg_float(rs, "attention_factor", 0.0, 100.0, &c->yarn_attn_factor, path, err)))
        return rl_err_wrap(err, "rope_scaling");
    return 0;
}

/* AutoAWQ's quantization_config, as Qwen/Qwen3-*-AWQ ship it: 4 bits,
 * GEMM packing, zero points, a group size along the input features. */
static int parse_awq(struct model_config *c, const cJSON *q, const char *path, struct rl_err *err)
{
    int bits = 4, rc;
    if ((rc = cfg_int(q, "bits", 0, 1, 64, &bits, path, err)) ||
        (rc = cfg_int(q, "group_size", 1, -1, 1 << 20, &c->awq_group, path, err)))
        return rl_err_wrap(err, "quantization_config");
    if (bits != 4)
        return rl_errf(err, RL_EUNSUPPORTED,
                       "%s: field \"quantization_config.bits\" = %d is not supported (AWQ with 4 bits only)",
                       path, bits);
    if (c->awq_group < 1)
        return rl_errf(err, RL_EUNSUPPORTED,
                       "%s: field \"quantization_config.group_size\" = %d is not supported (a positive group)",
                       path, c->awq_group);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(q, "version");
    if (v && (!cJSON_IsString(v) || strcasecmp(v->valuestring, "gemm")))
        return rl_errf(err, RL_EUNSUPPORTED,
                       "%s: field \"quantization_config.version\" = %s is not supported (AWQ's \"gemm\" packing only)",
                       path, cJSON_IsString(v) ? v->valuestring : "(not a string)");
    const cJSON *z = cJSON_GetObjectItemCaseSensitive(q, "zero_point");
    if (z && !cJSON_IsTrue(z))
        return rl_errf(err, RL_EUNSUPPORTED,
                       "%s: field \"quantization_config.zero_point\" must be true", path);
    return 0;
}

static int parse_quant(struct model_config *c, const cJSON *q, const char *path,
                       struct rl_err *err)
{
    if (!q || cJSON_IsNull(q))
        return 0;
    if (!cJSON_IsObject(q))
        return rl_errf(err, RL_EFORMAT, "%s: field \"quantization_config\" must be an object", path);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    if (cJSON_IsString(m) && !strcmp(m->valuestring, "awq"))
        return parse_awq(c, q, path, err);
    if (!cJSON_IsString(m) || strcmp(m->valuestring, "fp8"))
        return rl_errf(err, RL_EUNSUPPORTED,
                       "%s: field \"quantization_config.quant_method\" = %s is not supported (\"fp8\" or \"awq\")",
                       path, cJSON_IsString(m) ? m->valuestring : "(not a string)");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(q, "fmt");
    if (fmt && (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "e4m3")))
        return rl_errf(err, RL_EUNSUPPORTED,
                       "%s: field \"quantization_config.fmt\" must be \"e4m3\"", path);
    const cJSON *as = cJSON_GetObjectItemCaseSensitive(q, "activation_scheme");
    if (as && (!cJSON_IsString(as) || strcmp(as->valuestring, "dynamic")))
        return rl_errf(err, RL_EUNSUPPORTED,
                       "%s: field \"quantization_config.activation_scheme\" must be \"dynamic\"", path);
    const cJSON *bs = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
    if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2 ||
        !cJSON_IsNumber(cJSON_GetArrayItem(bs, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(bs, 1)))
        return rl_errf(err, RL_EFORMAT,
                       "%s: field \"quantization_config.weight_block_size\" must be [rows, cols]", path);
    c->fp8_block_rows = cJSON_GetArrayItem(bs, 0)->valueint;
    c->fp8_block_cols = cJSON_GetArrayItem(bs, 1)->valueint;
    if (c->fp8_block_rows < 1 || c->fp8_block_cols < 1 || c->fp8_block_rows > 65536 ||
        c->fp8_block_cols > 65536)
        return rl_errf(err, RL_EFORMAT,
                       "%s: field \"quantization_config.weight_block_size\" out of range", path);
    return 0;
}

int model_parse_config(struct model_config *c, const char *json, const char *path,
                       struct rl_err *err)
{
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_Parse(json);
    if (!root)
        return rl_errf(err, RL_EFORMAT, "%s: not valid JSON (near byte %ld)", path,
                       cJSON_GetErrorPtr() ? (long)(cJSON_GetErrorPtr() - json) : -1L);
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        rc = rl_errf(err, RL_EFORMAT, "%s: top level must be an object", path);
        goto out;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt)) {
        rc = rl_errf(err, RL_EFORMAT, "%s: missing required field \"model_type\"", path);
        goto out;
    }
    if (strcmp(mt->valuestring, "qwen3")) {
        rc = rl_errf(err, RL_EUNSUPPORTED,
                     "%s: field \"model_type\" = \"%s\" is not supported (only \"qwen3\")", path,
                     mt->valuestring);
        goto out;
    }
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (arch) {
        const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
        if (!cJSON_IsString(a0) || strcmp(a0->valuestring, "Qwen3ForCausalLM")) {
            rc = rl_errf(err, RL_EUNSUPPORTED,
                         "%s: field \"architectures\" must be [\"Qwen3ForCausalLM\"]", path);
            goto out;
        }
    }
    c->head_dim = 0;
    c->rms_eps = 1e-6f;
    c->rope_theta = 1e6f;
    c->max_pos = 40960;
    c->bos_id = c->eos_id = -1;
    c->dtype = MODEL_BF16;
    if ((rc = cfg_int(root, "hidden_size", 1, 1, 1 << 16, &c->hidden, path, err)) ||
        (rc = cfg_int(root, "intermediate_size", 1, 1, 1 << 18, &c->intermediate, path, err)) ||
        (rc = cfg_int(root, "num_hidden_layers", 1, 1, 1024, &c->n_layers, path, err)) ||
        (rc = cfg_int(root, "num_attention_heads", 1, 1, 1024, &c->n_heads, path, err)) ||
        (rc = cfg_int(root, "num_key_value_heads", 1, 1, 1024, &c->n_kv_heads, path, err)) ||
        (rc = cfg_int(root, "vocab_size", 1, 1, 1 << 22, &c->vocab, path, err)) ||
        (rc = cfg_int(root, "head_dim", 0, 2, 1024, &c->head_dim, path, err)) ||
        (rc = cfg_int(root, "max_position_embeddings", 0, 1, 1 << 24, &c->max_pos, path, err)) ||
        (rc = cfg_int(root, "bos_token_id", 0, 0, 1 << 22, &c->bos_id, path, err)) ||
        (rc = cfg_int(root, "eos_token_id", 0, 0, 1 << 22, &c->eos_id, path, err)) ||
        (rc = cfg_float(root, "rms_norm_eps", 1e-12, 1e-1, &c->rms_eps, path, err)) ||
        (rc = cfg_float(root, "rope_theta", 1.0, 1e12, &c->rope_theta, path, err)) ||
        (rc = cfg_bool(root, "tie_word_embeddings", &c->tied, path, err)))
        goto out;
    if (!c->head_dim)
        c->head_dim = c->hidden / c->n_heads;
    if (c->head_dim % 2) {
        rc = rl_errf(err, RL_EFORMAT, "%s: field \"head_dim\" = %d must be even for rotary embedding",
                     path, c->head_dim);
        goto out;
    }
    if (c->n_heads % c->n_kv_heads) {
        rc = rl_errf(err, RL_EFORMAT,
                     "%s: field \"num_attention_heads\" = %d is not a multiple of \"num_key_value_heads\" = %d",
                     path, c->n_heads, c->n_kv_heads);
        goto out;
    }
    int flag = 0;
    if ((rc = cfg_bool(root, "attention_bias", &flag, path, err)))
        goto out;
    if (flag) {
        rc = rl_errf(err, RL_EUNSUPPORTED, "%s: field \"attention_bias\" = true is not Qwen3", path);
        goto out;
    }
    flag = 0;
    if ((rc = cfg_bool(root, "use_sliding_window", &flag, path, err)))
        goto out;
    if (flag) {
        rc = rl_errf(err, RL_EUNSUPPORTED,
                     "%s: field \"use_sliding_window\" = true is not supported", path);
        goto out;
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu"))) {
        rc = rl_errf(err, RL_EUNSUPPORTED, "%s: field \"hidden_act\" must be \"silu\"", path);
        goto out;
    }
    const cJSON *td = cJSON_GetObjectItemCaseSensitive(root, "torch_dtype");
    if (!td)
        td = cJSON_GetObjectItemCaseSensitive(root, "dtype");
    if (td && !cJSON_IsNull(td)) {
        static const struct { const char *name; enum model_dtype dt; } names[] = {
            {"float32", MODEL_F32}, {"bfloat16", MODEL_BF16}, {"float16", MODEL_F16}};
        int found = 0;
        for (size_t i = 0; i < 3 && cJSON_IsString(td); i++)
            if (!strcmp(td->valuestring, names[i].name)) {
                c->dtype = names[i].dt;
                found = 1;
            }
        if (!found) {
            rc = rl_errf(err, RL_EUNSUPPORTED,
                         "%s: field \"torch_dtype\" must be \"float32\", \"bfloat16\" or \"float16\"", path);
            goto out;
        }
    }
    if ((rc = parse_rope_scaling(c, cJSON_GetObjectItemCaseSensitive(root, "rope_scaling"), path, err)) ||
        (rc = parse_quant(c, cJSON_GetObjectItemCaseSensitive(root, "quantization_config"), path, err)))
        goto out;
out:
    cJSON_Delete(root);
    return rc;
}

/* ---- weights ---- */

static int dtype_from_st(enum st_dtype st, enum model_dtype *out)
{
    switch (st) {
    case ST_F32: *out = MODEL_F32; return 0;
    case ST_BF16: *out = MODEL_BF16; return 0;
    case ST_F16: *out = MODEL_F16; return 0;
    case ST_F8_E4M3: *out = MODEL_F8_E4M3; return 0;
    default: return -1;
    }
}

static int keep_scale(struct model *m, float *s)
{
    if (m->n_scales == m->cap_scales) {
        int cap = m->cap_scales ? m->cap_scales * 2 : 64;
        float **n = realloc(m->scales, (size_t)cap * sizeof *n);
        if (!n)
            return -1;
        m->scales = n;
        m->cap_scales = cap;
    }
    m->scales[m->n_scales++] = s;
    return 0;
}

/* Binds tensor `name`, checking its shape is (rows, cols) - or (cols) for a
 * vector when rows == 0 - and that its dtype is one a backend runs. FP8
 * matrices bring their weight_scale_inv along. */
static int bind(struct model *m, struct model_tensor *t, const char *name, int64_t rows,
                int64_t cols, struct rl_err *err)
{
    const struct st_tensor *st = st_find(m->st, name);
    if (!st)
        return rl_errf(err, RL_EFORMAT, "%s: missing tensor \"%s\"", m->dir, name);
    st_mark_used(m->st, st);
    int is_vec = rows == 0;
    int ok = is_vec ? (st->n_dims == 1 && st->shape[0] == cols)
                    : (st->n_dims == 2 && st->shape[0] == rows && st->shape[1] == cols);
    if (!ok) {
        char got[128] = "";
        int n = 0;
        for (int i = 0; i < st->n_dims && n < 100; i++)
            n += snprintf(got + n, sizeof got - (size_t)n, "%s%lld", i ? ", " : "",
                          (long long)st->shape[i]);
        if (is_vec)
            return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" has shape [%s], config says [%lld]",
                           st->file, name, got, (long long)cols);
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" has shape [%s], config says [%lld, %lld]",
                       st->file, name, got, (long long)rows, (long long)cols);
    }
    if (dtype_from_st(st->dtype, &t->dtype))
        return rl_errf(err, RL_EUNSUPPORTED, "%s: tensor \"%s\" has dtype %s; expected F32, BF16, F16 or F8_E4M3",
                       st->file, name, st_dtype_name(st->dtype));
    t->rows = is_vec ? 1 : rows;
    t->cols = cols;
    t->data = st->data;
    t->name = st->name;
    t->scale_f32 = NULL;
    if (t->dtype != MODEL_F8_E4M3)
        return 0;
    struct model_config *c = &m->cfg;
    if (is_vec || !c->fp8_block_rows)
        return rl_errf(err, RL_EFORMAT,
                       "%s: tensor \"%s\" is F8_E4M3 but config.json has no fp8 quantization_config",
                       st->file, name);
    char sname[512];
    snprintf(sname, sizeof sname, "%s_scale_inv", name);
    const struct st_tensor *sc = st_find(m->st, sname);
    if (!sc)
        return rl_errf(err, RL_EFORMAT, "%s: missing tensor \"%s\" for FP8 weight \"%s\"", m->dir,
                       sname, name);
    st_mark_used(m->st, sc);
    int64_t br = (rows + c->fp8_block_rows - 1) / c->fp8_block_rows;
    int64_t bc = (cols + c->fp8_block_cols - 1) / c->fp8_block_cols;
    if (sc->n_dims != 2 || sc->shape[0] != br || sc->shape[1] != bc)
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" must have shape [%lld, %lld]", sc->file,
                       sname, (long long)br, (long long)bc);
    if (sc->dtype != ST_F32 && sc->dtype != ST_BF16)
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" must be F32 or BF16, not %s", sc->file,
                       sname, st_dtype_name(sc->dtype));
    float *s = malloc((size_t)(br * bc) * sizeof *s);
    if (!s || keep_scale(m, s)) {
        free(s);
        return rl_errf(err, RL_ENOMEM, "out of memory for \"%s\"", sname);
    }
    for (int64_t i = 0; i < br * bc; i++) {
        float v;
        if (sc->dtype == ST_F32)
            memcpy(&v, (const char *)sc->data + 4 * i, 4);
        else {
            uint16_t h;
            memcpy(&h, (const char *)sc->data + 2 * i, 2);
            v = bf16_to_f32(h);
        }
        if (!isfinite(v))
            return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" holds a non-finite scale at %lld",
                           sc->file, sname, (long long)i);
        s[i] = v;
    }
    t->scale_f32 = s;
    return 0;
}

/* An AWQ projection: NAME.qweight I32 (cols, rows / 8), NAME.qzeros I32
 * (cols / group, rows / 8), NAME.scales F16 (cols / group, rows), for the
 * HF weight name NAME.weight (layout in engine/quant.h). */
static int bind_awq(struct model *m, struct model_tensor *t, const char *name, int64_t rows,
                    int64_t cols, struct rl_err *err)
{
    int64_t G = m->cfg.awq_group;
    char base[256], n[3][300];
    snprintf(base, sizeof base, "%.*s", (int)(strlen(name) - strlen(".weight")), name);
    if (rows % 8 || cols % G)
        return rl_errf(err, RL_EFORMAT, "%s: AWQ tensor \"%s\" of [%lld, %lld] needs rows in 8s and columns in groups of %lld",
                       m->dir, base, (long long)rows, (long long)cols, (long long)G);
    static const char *const sfx[3] = {"qweight", "qzeros", "scales"};
    const int64_t shape[3][2] = {{cols, rows / 8}, {cols / G, rows / 8}, {cols / G, rows}};
    const enum st_dtype want[3] = {ST_I32, ST_I32, ST_F16};
    const struct st_tensor *st[3];
    for (int i = 0; i < 3; i++) {
        snprintf(n[i], sizeof n[i], "%s.%s", base, sfx[i]);
        if (!(st[i] = st_find(m->st, n[i])))
            return rl_errf(err, RL_EFORMAT, "%s: missing tensor \"%s\" (the AWQ checkpoint's quantized \"%s\")",
                           m->dir, n[i], name);
        st_mark_used(m->st, st[i]);
        if (st[i]->dtype != want[i])
            return rl_errf(err, RL_EUNSUPPORTED, "%s: tensor \"%s\" has dtype %s; AWQ's %s is %s",
                           st[i]->file, n[i], st_dtype_name(st[i]->dtype), sfx[i], st_dtype_name(want[i]));
        if (st[i]->n_dims != 2 || st[i]->shape[0] != shape[i][0] || st[i]->shape[1] != shape[i][1])
            return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" must have shape [%lld, %lld] for a [%lld, %lld] weight in groups of %lld",
                           st[i]->file, n[i], (long long)shape[i][0], (long long)shape[i][1],
                           (long long)rows, (long long)cols, (long long)G);
    }
    *t = (struct model_tensor){.dtype = MODEL_AWQ4, .rows = rows, .cols = cols,
                               .data = st[0]->data, .name = st[0]->name,
                               .awq_qzeros = st[1]->data, .awq_scales = st[2]->data,
                               .awq_group = (int)G};
    return 0;
}

/* A projection: AWQ when the config says so, else a plain or FP8 weight. */
static int bind_proj(struct model *m, struct model_tensor *t, const char *name, int64_t rows,
                     int64_t cols, struct rl_err *err)
{
    if (m->cfg.awq_group)
        return bind_awq(m, t, name, rows, cols, err);
    return bind(m, t, name, rows, cols, err);
}

static int bind_all(struct model *m, struct rl_err *err)
{
    const struct model_config *c = &m->cfg;
    struct model_weights *w = &m->w;
    int64_t H = c->hidden, I = c->intermediate, Q = (int64_t)c->n_heads * c->head_dim,
            KV = (int64_t)c->n_kv_heads * c->head_dim, D = c->head_dim;
    int rc;
    /* Qwen3ForCausalLM names its body "model.*"; an embedding checkpoint
     * (Qwen3-Embedding, saved as Qwen3Model) names the same tensors bare */
    const char *pfx = !st_find(m->st, "model.embed_tokens.weight") &&
                              st_find(m->st, "embed_tokens.weight") ? "" : "model.";
    char en[64], nn[64];
    snprintf(en, sizeof en, "%sembed_tokens.weight", pfx);
    snprintf(nn, sizeof nn, "%snorm.weight", pfx);
    if ((rc = bind(m, &w->embed, en, c->vocab, H, err)) ||
        (rc = bind(m, &w->final_norm, nn, 0, H, err)))
        return rc;
    if (w->embed.dtype == MODEL_F8_E4M3)
        return rl_errf(err, RL_EUNSUPPORTED, "%s: FP8 embeddings are not supported", m->dir);
    if (!c->tied && !pfx[0] && !st_find(m->st, "lm_head.weight")) {
        /* the bare body of an untied model: no vocabulary product at all */
        m->cfg.embed_only = 1;
        m->cfg.tied = 1;
    }
    if (c->tied) {
        w->lm_head = w->embed;
        const struct st_tensor *lm = st_find(m->st, "lm_head.weight");
        if (lm) /* some exports write the tied copy too; it is the same matrix */
            st_mark_used(m->st, lm);
    } else if ((rc = bind(m, &w->lm_head, "lm_head.weight", c->vocab, H, err))) {
        return rc;
    }
    w->n_layers = c->n_layers;
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        struct model_layer *L = &w->layers[l];
        char n[11][128];
        static const char *const suffix[11] = {
            "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
            "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
            "self_attn.k_norm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
            "mlp.up_proj.weight", "mlp.down_proj.weight"};
        for (int i = 0; i < 11; i++)
            snprintf(n[i], sizeof n[i], "%slayers.%d.%s", pfx, l, suffix[i]);
        if ((rc = bind(m, &L->attn_norm, n[0], 0, H, err)) ||
            (rc = bind_proj(m, &L->wq, n[1], Q, H, err)) ||
            (rc = bind_proj(m, &L->wk, n[2], KV, H, err)) ||
            (rc = bind_proj(m, &L->wv, n[3], KV, H, err)) ||
            (rc = bind_proj(m, &L->wo, n[4], H, Q, err)) ||
            (rc = bind(m, &L->q_norm, n[5], 0, D, err)) ||
            (rc = bind(m, &L->k_norm, n[6], 0, D, err)) ||
            (rc = bind(m, &L->mlp_norm, n[7], 0, H, err)) ||
            (rc = bind_proj(m, &L->w_gate, n[8], I, H, err)) ||
            (rc = bind_proj(m, &L->w_up, n[9], I, H, err)) ||
            (rc = bind_proj(m, &L->w_down, n[10], H, I, err)))
            return rc;
    }
    const struct st_tensor *extra = st_first_unused(m->st);
    if (extra)
        return rl_errf(err, RL_EFORMAT, "%s: unexpected tensor \"%s\" (not part of a Qwen3 dense model with this config)",
                       extra->file, extra->name);
    return 0;
}

/* ---- GGUF ----
 *
 * A GGUF file of llama.cpp's "qwen3" architecture (convert_hf_to_gguf.py's
 * Qwen3Model): the config comes from the "qwen3." metadata keys, the
 * tensors have llama.cpp's names, ne[0] is the input dimension, and q/k
 * are stored as Hugging Face has them (Qwen3 uses NEOX-style rotary, so the
 * converter does not permute them as it does for LLaMA). A file without
 * output.weight ties the output to token_embd. */

static int gg_int(struct model *m, const char *key, int required, int64_t lo, int64_t hi, int *v,
                  struct rl_err *err)
{
    if (!gguf_has_key(m->gg, key)) {
        if (required)
            return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\" is missing", m->dir, key);
        return 0;
    }
    int64_t x;
    int rc = gguf_get_int(m->gg, key, &x, err);
    if (rc)
        return rc;
    if (x < lo || x > hi)
        return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\" = %lld is out of range [%lld, %lld]",
                       m->dir, key, (long long)x, (long long)lo, (long long)hi);
    *v = (int)x;
    return 0;
}

static int gg_float(struct model *m, const char *key, double lo, double hi, float *v,
                    struct rl_err *err)
{
    if (!gguf_has_key(m->gg, key))
        return 0;
    double x;
    int rc = gguf_get_float(m->gg, key, &x, err);
    if (rc)
        return rc;
    if (!(x >= lo && x <= hi))
        return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\" = %g is out of range [%g, %g]", m->dir,
                       key, x, lo, hi);
    *v = (float)x;
    return 0;
}

static int gguf_config(struct model *m, struct rl_err *err)
{
    struct model_config *c = &m->cfg;
    const char *s;
    size_t n;
    int rc = gguf_get_str(m->gg, "general.architecture", &s, &n, err);
    if (rc)
        return rc;
    if (n != 5 || memcmp(s, "qwen3", 5))
        return rl_errf(err, RL_EUNSUPPORTED, "%s: general.architecture \"%.*s\" is not supported (redlm runs \"qwen3\")",
                       m->dir, (int)(n < 64 ? n : 64), s);
    memset(c, 0, sizeof *c);
    c->max_pos = 40960;
    c->rms_eps = 1e-6f;
    c->rope_theta = 10000.0f; /* llama.cpp's default when the key is absent */
    c->bos_id = c->eos_id = -1;
    c->dtype = MODEL_F32;     /* norms are F32 in every GGUF llama.cpp writes */
    if ((rc = gg_int(m, "qwen3.embedding_length", 1, 1, 1 << 16, &c->hidden, err)) ||
        (rc = gg_int(m, "qwen3.feed_forward_length", 1, 1, 1 << 18, &c->intermediate, err)) ||
        (rc = gg_int(m, "qwen3.block_count", 1, 1, 1024, &c->n_layers, err)) ||
        (rc = gg_int(m, "qwen3.attention.head_count", 1, 1, 1024, &c->n_heads, err)))
        return rc;
    c->n_kv_heads = c->n_heads;
    int vlen = 0;
    if ((rc = gg_int(m, "qwen3.attention.head_count_kv", 0, 1, 1024, &c->n_kv_heads, err)) ||
        (rc = gg_int(m, "qwen3.attention.key_length", 0, 2, 1024, &c->head_dim, err)) ||
        (rc = gg_int(m, "qwen3.attention.value_length", 0, 2, 1024, &vlen, err)) ||
        (rc = gg_int(m, "qwen3.context_length", 0, 1, 1 << 24, &c->max_pos, err)) ||
        (rc = gg_int(m, "tokenizer.ggml.bos_token_id", 0, 0, 1 << 22, &c->bos_id, err)) ||
        (rc = gg_int(m, "tokenizer.ggml.eos_token_id", 0, 0, 1 << 22, &c->eos_id, err)) ||
        (rc = gg_float(m, "qwen3.attention.layer_norm_rms_epsilon", 1e-12, 1e-1, &c->rms_eps, err)) ||
        (rc = gg_float(m, "qwen3.rope.freq_base", 1.0, 1e12, &c->rope_theta, err)))
        return rc;
    if (!c->head_dim)
        c->head_dim = c->hidden / c->n_heads;
    if (c->head_dim % 2)
        return rl_errf(err, RL_EFORMAT, "%s: metadata \"qwen3.attention.key_length\" = %d must be even for rotary embedding",
                       m->dir, c->head_dim);
    if (vlen && vlen != c->head_dim)
        return rl_errf(err, RL_EUNSUPPORTED, "%s: metadata \"qwen3.attention.value_length\" = %d differs from key_length %d",
                       m->dir, vlen, c->head_dim);
    if (c->n_heads % c->n_kv_heads)
        return rl_errf(err, RL_EFORMAT, "%s: attention.head_count %d is not a multiple of head_count_kv %d",
                       m->dir, c->n_heads, c->n_kv_heads);
    if (gguf_has_key(m->gg, "qwen3.rope.scaling.type")) {
        if ((rc = gguf_get_str(m->gg, "qwen3.rope.scaling.type", &s, &n, err)))
            return rc;
        if (n == 4 && !memcmp(s, "yarn", 4)) {
            c->yarn_orig_max_pos = c->max_pos;
            if ((rc = gg_float(m, "qwen3.rope.scaling.factor", 1.0, 1024.0, &c->yarn_factor, err)) ||
                (rc = gg_int(m, "qwen3.rope.scaling.original_context_length", 0, 1, 1 << 24,
                             &c->yarn_orig_max_pos, err)))
                return rc;
            if (c->yarn_factor == 0)
                return rl_errf(err, RL_EFORMAT, "%s: metadata \"qwen3.rope.scaling.factor\" is required for yarn",
                               m->dir);
            c->yarn_beta_fast = 32.0f;
            c->yarn_beta_slow = 1.0f;
            c->yarn_attn_factor = 0.1f * logf(c->yarn_factor) + 1.0f;
        } else if (!(n == 4 && !memcmp(s, "none", 4))) {
            return rl_errf(err, RL_EUNSUPPORTED, "%s: metadata \"qwen3.rope.scaling.type\" = \"%.*s\" is not supported (only \"yarn\")",
                           m->dir, (int)(n < 32 ? n : 32), s);
        }
    }
    const struct gguf_tensor *te = gguf_find_tensor(m->gg, "token_embd.weight");
    if (!te)
        return rl_errf(err, RL_EFORMAT, "%s: missing tensor \"token_embd.weight\"", m->dir);
    if (te->n_dims != 2 || te->ne[1] < 1 || te->ne[1] > (1 << 22))
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"token_embd.weight\" is not a (hidden, vocab) matrix",
                       m->dir);
    c->vocab = (int)te->ne[1];
    c->tied = !gguf_find_tensor(m->gg, "output.weight");
    return 0;
}

/* The model dtype of a GGUF tensor type redlm reads; -1 otherwise. */
static int dtype_from_gguf(uint32_t t, enum model_dtype *out)
{
    switch (t) {
    case GGUF_T_F32: *out = MODEL_F32; return 0;
    case GGUF_T_F16: *out = MODEL_F16; return 0;
    case GGUF_T_BF16: *out = MODEL_BF16; return 0;
    case GGUF_T_Q8_0: *out = MODEL_Q8_0; return 0;
    case GGUF_T_Q4_K: *out = MODEL_Q4_K; return 0;
    case GGUF_T_Q5_K: *out = MODEL_Q5_K; return 0;
    case GGUF_T_Q6_K: *out = MODEL_Q6_K; return 0;
    case GGUF_T_Q4_0: *out = MODEL_Q4_0; return 0;
    case GGUF_T_Q4_1: *out = MODEL_Q4_1; return 0;
    case GGUF_T_Q5_0: *out = MODEL_Q5_0; return 0;
    case GGUF_T_Q5_1: *out = MODEL_Q5_1; return 0;
    case GGUF_T_Q2_K: *out = MODEL_Q2_K; return 0;
    case GGUF_T_Q3_K: *out = MODEL_Q3_K; return 0;
    case GGUF_T_IQ4_NL: *out = MODEL_IQ4_NL; return 0;
    case GGUF_T_IQ4_XS: *out = MODEL_IQ4_XS; return 0;
    default: return -1;
    }
}

/* Binds GGUF tensor `name` as (rows, cols), or a vector (cols) when rows is
 * 0; vectors must not be quantized. */
static int bind_gguf(struct model *m, struct model_tensor *t, const char *name, int64_t rows,
                     int64_t cols, struct rl_err *err)
{
    const struct gguf_tensor *g = gguf_find_tensor(m->gg, name);
    if (!g)
        return rl_errf(err, RL_EFORMAT, "%s: missing tensor \"%s\"", m->dir, name);
    gguf_mark_used(m->gg, g);
    char tb[16];
    const char *tn = gguf_type_name(g->type, tb);
    if (dtype_from_gguf(g->type, &t->dtype))
        return rl_errf(err, RL_EUNSUPPORTED, "%s: tensor \"%s\" has type %s, which redlm does not read "
                                             "(F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, "
                                             "Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)",
                       m->dir, name, tn);
    int is_vec = rows == 0;
    int ok = is_vec ? g->n_dims == 1 && g->ne[0] == cols
                    : g->n_dims == 2 && g->ne[0] == cols && g->ne[1] == rows;
    if (!ok) {
        if (is_vec)
            return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" (%s) has %d dims [%lld, %lld], config says [%lld]",
                           m->dir, name, tn, g->n_dims, (long long)g->ne[0], (long long)g->ne[1],
                           (long long)cols);
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" (%s) has %d dims ne [%lld, %lld], config says ne [%lld, %lld] (cols, rows)",
                       m->dir, name, tn, g->n_dims, (long long)g->ne[0], (long long)g->ne[1],
                       (long long)cols, (long long)rows);
    }
    if (is_vec && quant_is_quantized(t->dtype))
        return rl_errf(err, RL_EUNSUPPORTED, "%s: tensor \"%s\" is a %s vector; norms must be F32, F16 or BF16",
                       m->dir, name, tn);
    t->rows = is_vec ? 1 : rows;
    t->cols = cols;
    t->data = g->data;
    t->name = g->name;
    return 0;
}

static int gguf_bind_all(struct model *m, struct rl_err *err)
{
    const struct model_config *c = &m->cfg;
    struct model_weights *w = &m->w;
    int64_t H = c->hidden, I = c->intermediate, Q = (int64_t)c->n_heads * c->head_dim,
            KV = (int64_t)c->n_kv_heads * c->head_dim, D = c->head_dim;
    int rc;
    if ((rc = bind_gguf(m, &w->embed, "token_embd.weight", c->vocab, H, err)) ||
        (rc = bind_gguf(m, &w->final_norm, "output_norm.weight", 0, H, err)))
        return rc;
    if (c->tied)
        w->lm_head = w->embed;
    else if ((rc = bind_gguf(m, &w->lm_head, "output.weight", c->vocab, H, err)))
        return rc;
    w->n_layers = c->n_layers;
    if (!(w->layers = calloc((size_t)c->n_layers, sizeof *w->layers)))
        return rl_errf(err, RL_ENOMEM, "out of memory");
    static const char *const sfx[11] = {"attn_norm", "attn_q", "attn_k", "attn_v",
                                        "attn_output", "attn_q_norm", "attn_k_norm",
                                        "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"};
    const int64_t rows[11] = {0, Q, KV, KV, H, 0, 0, 0, I, I, H};
    const int64_t cols[11] = {H, H, H, H, Q, D, D, H, H, H, I};
    for (int l = 0; l < c->n_layers; l++) {
        struct model_layer *L = &w->layers[l];
        struct model_tensor *ts[11] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo,
                                       &L->q_norm, &L->k_norm, &L->mlp_norm, &L->w_gate,
                                       &L->w_up, &L->w_down};
        for (int i = 0; i < 11; i++) {
            char n[64];
            snprintf(n, sizeof n, "blk.%d.%s.weight", l, sfx[i]);
            if ((rc = bind_gguf(m, ts[i], n, rows[i], cols[i], err)))
                return rc;
        }
    }
    const struct gguf_tensor *extra = gguf_first_unused(m->gg);
    if (extra)
        return rl_errf(err, RL_EFORMAT, "%s: unexpected tensor \"%s\" (not part of a Qwen3 dense model with this config)",
                       m->dir, extra->name);
    return 0;
}

static int load_gguf(struct model **out, const char *file, struct rl_err *err)
{
    struct model *m = calloc(1, sizeof *m);
    int rc;
    if (!m || !(m->dir = strdup(file)) || !(m->gguf_path = strdup(file))) {
        model_free(m);
        return rl_errf(err, RL_ENOMEM, "out of memory");
    }
    if ((rc = gguf_open(&m->gg, file, err)) || (rc = gguf_config(m, err)) ||
        (rc = gguf_bind_all(m, err))) {
        model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* Says what is wrong with a model path before config.json is opened, so
 * that a .gguf file or a repository folder gets a sentence about what redlm
 * loads instead of "config.json: Not a directory". A missing path keeps
 * the system's own message. */
static int check_model_dir(const char *dir, struct rl_err *err)
{
    static const char expected[] =
        "expected a Hugging Face Qwen3 checkpoint directory holding config.json, "
        "*.safetensors and (for chat jobs) tokenizer.json";
    struct stat sb;
    if (stat(dir, &sb))
        return rl_errf(err, RL_EIO, "%s: %s", dir, strerror(errno));
    size_t n = strlen(dir);
    if (!S_ISDIR(sb.st_mode)) {
        (void)n;
        return rl_errf(err, RL_EFORMAT, "%s is a file, not a directory; %s, or a GGUF file", dir,
                       expected);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, F_OK) == 0)
        return 0;
    /* a folder one level up from the checkpoint (a repo with models in
     * subfolders, or a Hugging Face cache root) is the common mistake */
    return rl_errf(err, RL_EIO, "%s has no config.json: %s", dir, expected);
}

int model_load(struct model **out, const char *dir, struct rl_err *err)
{
    *out = NULL;
    char gpath[4096];
    int rc = gguf_locate(dir, gpath, sizeof gpath, err);
    if (rc < 0)
        return rc;
    size_t dl = strlen(dir);
    struct stat sb;
    if (!rc && dl > 5 && !strcasecmp(dir + dl - 5, ".gguf") && !stat(dir, &sb) && S_ISREG(sb.st_mode)) {
        snprintf(gpath, sizeof gpath, "%s", dir); /* named like one: gguf_open says what is wrong */
        rc = 1;
    }
    if (rc)
        return load_gguf(out, gpath, err);
    if ((rc = check_model_dir(dir, err)))
        return rc;
    struct model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir))) {
        free(m);
        return rl_errf(err, RL_ENOMEM, "out of memory");
    }
    char path[4096];
    char *json = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = file_read(path, MODEL_CONFIG_MAX, &json, NULL, err)) ||
        (rc = model_parse_config(&m->cfg, json, path, err)))
        goto fail;
    if ((rc = st_open(&m->st, dir, err)) || (rc = bind_all(m, err)))
        goto fail;
    free(json);
    *out = m;
    return 0;
fail:
    free(json);
    model_free(m);
    return rc;
}

void model_free(struct model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_scales; i++)
        free(m->scales[i]);
    free(m->scales);
    free(m->w.layers);
    st_close(m->st);
    gguf_close(m->gg);
    free(m->gguf_path);
    free(m->dir);
    free(m);
}

const char *model_get_gguf(const struct model *m) { return m->gguf_path; }

/* llama.cpp's llama_ftype names (general.file_type), the ones a Qwen3 GGUF
 * is published in */
static const char *ftype_name(int64_t t)
{
    static const struct {
        int id;
        const char *name;
    } names[] = {{0, "F32"},     {1, "F16"},     {2, "Q4_0"},    {3, "Q4_1"},    {7, "Q8_0"},
                 {8, "Q5_0"},    {9, "Q5_1"},    {10, "Q2_K"},   {11, "Q3_K_S"}, {12, "Q3_K_M"},
                 {13, "Q3_K_L"}, {14, "Q4_K_S"}, {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"},
                 {18, "Q6_K"},   {21, "Q2_K_S"}, {25, "IQ4_NL"}, {30, "IQ4_XS"}, {32, "BF16"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].id == t)
            return names[i].name;
    return NULL;
}

void model_quant_label(const struct model *m, char *buf, size_t n)
{
    const struct model_config *c = &m->cfg;
    const char *s = NULL;
    int64_t ft;
    struct rl_err err;
    if (m->gg && gguf_has_key(m->gg, "general.file_type") &&
        !gguf_get_int(m->gg, "general.file_type", &ft, &err))
        s = ftype_name(ft);
    if (!s && m->gg && c->n_layers > 0)
        s = model_dtype_name(m->w.layers[0].w_up.dtype);
    if (!s)
        s = c->fp8_block_rows ? "FP8" : c->awq_group ? "AWQ" : model_dtype_name(c->dtype);
    snprintf(buf, n, "%s", s);
}

int64_t model_n_params(const struct model_config *c)
{
    int64_t H = c->hidden, D = c->head_dim, I = c->intermediate, V = c->vocab;
    int64_t layer = H * D * (2 * (int64_t)c->n_heads + 2 * (int64_t)c->n_kv_heads) + 3 * H * I + 2 * H + 2 * D;
    return V * H * (c->tied ? 1 : 2) + (int64_t)c->n_layers * layer + H;
}

void model_rope_inv_freq(const struct model_config *cfg, float *inv_freq, float *mscale)
{
    int half = cfg->head_dim / 2, dim = cfg->head_dim;
    double base = cfg->rope_theta;
    *mscale = 1.0f;
    for (int i = 0; i < half; i++)
        inv_freq[i] = (float)(1.0 / pow(base, (double)(2 * i) / dim));
    if (cfg->yarn_factor > 0) {
        double f = cfg->yarn_factor, om = cfg->yarn_orig_max_pos;
        double lo = floor(dim * log(om / (cfg->yarn_beta_fast * 2 * M_PI)) / (2 * log(base)));
        double hi = ceil(dim * log(om / (cfg->yarn_beta_slow * 2 * M_PI)) / (2 * log(base)));
        if (lo < 0)
            lo = 0;
        if (hi > dim - 1)
            hi = dim - 1;
        if (lo == hi)
            hi += 0.001;
        for (int i = 0; i < half; i++) {
            double pf = pow(base, (double)(2 * i) / dim);
            double extra = 1.0 / pf, inter = 1.0 / (f * pf);
            double ramp = (i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double ef = 1.0 - ramp;
            inv_freq[i] = (float)(inter * (1 - ef) + extra * ef);
        }
        *mscale = cfg->yarn_attn_factor;
    }
}

const struct model_config *model_get_config(const struct model *m) { return &m->cfg; }
const struct model_weights *model_get_weights(const struct model *m) { return &m->w; }
const char *model_get_dir(const struct model *m) { return m->dir; }

static size_t tensor_bytes(const struct model_tensor *t)
{
    static const size_t esize[] = {4, 2, 2, 1};
    if (t->dtype == MODEL_AWQ4) /* nibbles, plus an f16 scale and a zero nibble per group */
        return (size_t)(t->rows * t->cols) / 2 +
               (size_t)(t->rows * (t->cols / t->awq_group)) * 5 / 2;
    if (quant_is_quantized(t->dtype))
        return (size_t)t->rows * quant_row_bytes(t->dtype, t->cols);
    return (size_t)(t->rows * t->cols) * esize[t->dtype];
}

size_t model_weight_bytes_per_token(const struct model *m)
{
    size_t b = tensor_bytes(&m->w.lm_head);
    for (int l = 0; l < m->w.n_layers; l++) {
        const struct model_layer *L = &m->w.layers[l];
        b += tensor_bytes(&L->wq) + tensor_bytes(&L->wk) + tensor_bytes(&L->wv) +
             tensor_bytes(&L->wo) + tensor_bytes(&L->w_gate) + tensor_bytes(&L->w_up) +
             tensor_bytes(&L->w_down);
    }
    return b;
}

int model_create_shape(struct model **out, const struct model_config *cfg, const char *dir,
                       struct rl_err *err)
{
    *out = NULL;
    struct model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir ? dir : "")) ||
        !(m->w.layers = calloc((size_t)(cfg->n_layers > 0 ? cfg->n_layers : 1), sizeof *m->w.layers))) {
        model_free(m);
        return rl_errf(err, RL_ENOMEM, "out of memory");
    }
    m->cfg = *cfg;
    m->w.n_layers = cfg->n_layers;
    enum model_dtype dt = cfg->fp8_block_rows ? MODEL_F8_E4M3 : cfg->dtype;
    int64_t q = (int64_t)cfg->n_heads * cfg->head_dim, kv = (int64_t)cfg->n_kv_heads * cfg->head_dim;
#define SHAPE(t, r, c, d) ((t) = (struct model_tensor){.dtype = (d), .rows = (r), .cols = (c), .name = #t})
    SHAPE(m->w.embed, cfg->vocab, cfg->hidden, cfg->dtype);
    SHAPE(m->w.final_norm, 1, cfg->hidden, cfg->dtype);
    SHAPE(m->w.lm_head, cfg->vocab, cfg->hidden, cfg->dtype);
    for (int l = 0; l < cfg->n_layers; l++) {
        struct model_layer *L = &m->w.layers[l];
        SHAPE(L->attn_norm, 1, cfg->hidden, cfg->dtype);
        SHAPE(L->mlp_norm, 1, cfg->hidden, cfg->dtype);
        SHAPE(L->q_norm, 1, cfg->head_dim, cfg->dtype);
        SHAPE(L->k_norm, 1, cfg->head_dim, cfg->dtype);
        SHAPE(L->wq, q, cfg->hidden, dt);
        SHAPE(L->wk, kv, cfg->hidden, dt);
        SHAPE(L->wv, kv, cfg->hidden, dt);
        SHAPE(L->wo, cfg->hidden, q, dt);
        SHAPE(L->w_gate, cfg->intermediate, cfg->hidden, dt);
        SHAPE(L->w_up, cfg->intermediate, cfg->hidden, dt);
        SHAPE(L->w_down, cfg->hidden, cfg->intermediate, dt);
    }
#undef SHAPE
    *out = m;
    return 0;
}
