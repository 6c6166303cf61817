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
#include "safetensors.h"

struct model {
    char *dir;
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
    }
    return "?";
}

/* ---- config.json ---- */

static int read_file(const char *path, char **out, struct rl_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return rl_errf(err, RL_EIO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return rl_errf(err, RL_ENOMEM, "%s: out of memory", path);
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return rl_errf(err, RL_EIO, "%s: read error", path);
    }
    buf[len] = 0;
    *out = buf;
    return 0;
}

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

static int parse_quant(struct model_config *c, const cJSON *q, const char *path,
                       struct rl_err *err)
{
    if (!q || cJSON_IsNull(q))
        return 0;
    if (!cJSON_IsObject(q))
        return rl_errf(err, RL_EFORMAT, "%s: field \"quantization_config\" must be an object", path);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    if (!cJSON_IsString(m) || strcmp(m->valuestring, "fp8"))
        return rl_errf(err, RL_EUNSUPPORTED,
                       "%s: field \"quantization_config.quant_method\" = %s is not supported (only \"fp8\")",
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

static int bind_all(struct model *m, struct rl_err *err)
{
    const struct model_config *c = &m->cfg;
    struct model_weights *w = &m->w;
    int64_t H = c->hidden, I = c->intermediate, Q = (int64_t)c->n_heads * c->head_dim,
            KV = (int64_t)c->n_kv_heads * c->head_dim, D = c->head_dim;
    int rc;
    if ((rc = bind(m, &w->embed, "model.embed_tokens.weight", c->vocab, H, err)) ||
        (rc = bind(m, &w->final_norm, "model.norm.weight", 0, H, err)))
        return rc;
    if (w->embed.dtype == MODEL_F8_E4M3)
        return rl_errf(err, RL_EUNSUPPORTED, "%s: FP8 embeddings are not supported", m->dir);
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
            snprintf(n[i], sizeof n[i], "model.layers.%d.%s", l, suffix[i]);
        if ((rc = bind(m, &L->attn_norm, n[0], 0, H, err)) ||
            (rc = bind(m, &L->wq, n[1], Q, H, err)) || (rc = bind(m, &L->wk, n[2], KV, H, err)) ||
            (rc = bind(m, &L->wv, n[3], KV, H, err)) || (rc = bind(m, &L->wo, n[4], H, Q, err)) ||
            (rc = bind(m, &L->q_norm, n[5], 0, D, err)) ||
            (rc = bind(m, &L->k_norm, n[6], 0, D, err)) ||
            (rc = bind(m, &L->mlp_norm, n[7], 0, H, err)) ||
            (rc = bind(m, &L->w_gate, n[8], I, H, err)) || (rc = bind(m, &L->w_up, n[9], I, H, err)) ||
            (rc = bind(m, &L->w_down, n[10], H, I, err)))
            return rc;
    }
    const struct st_tensor *extra = st_first_unused(m->st);
    if (extra)
        return rl_errf(err, RL_EFORMAT, "%s: unexpected tensor \"%s\" (not part of a Qwen3 dense model with this config)",
                       extra->file, extra->name);
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
        if (n > 5 && !strcasecmp(dir + n - 5, ".gguf"))
            return rl_errf(err, RL_EFORMAT,
                           "%s is a GGUF file, which redlm does not read; %s (the safetensors "
                           "repository the GGUF was made from, e.g. Qwen/Qwen3-0.6B)", dir, expected);
        return rl_errf(err, RL_EFORMAT, "%s is a file, not a directory; %s", dir, expected);
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
    int rc;
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
    if ((rc = read_file(path, &json, err)) || (rc = model_parse_config(&m->cfg, json, path, err)))
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
    free(m->dir);
    free(m);
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
