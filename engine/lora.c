/* engine/lora.c - PEFT LoRA adapters: the config, the tensors, the f32
 * layout the backends multiply with (lora.h). */
#include "lora.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dtype.h"
#include "file.h"
#include "gguf.h"
#include "quant.h"
#include "safetensors.h"

/* adapter_config.json is a few KB; anything near this is not one */
#define LORA_CONFIG_MAX (1u << 20)

struct lora_adapter {
    int n_layers;
    struct lora_pair *pairs; /* (n_layers * LORA_N_PROJ); rank 0 = none */
    float *data;             /* every pair's a and bt, one allocation */
    size_t bytes;
    int max_rank;
};

static const char *const proj_names[LORA_N_PROJ] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"};

static const char *const gguf_names[LORA_N_PROJ] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                    "ffn_gate", "ffn_up", "ffn_down"};

const char *lora_proj_name(enum lora_proj p)
{
    return p >= 0 && p < LORA_N_PROJ ? proj_names[p] : "?";
}

const char *lora_proj_block(enum lora_proj p) { return p <= LORA_O ? "self_attn" : "mlp"; }

const char *lora_proj_gguf_name(enum lora_proj p)
{
    return p >= 0 && p < LORA_N_PROJ ? gguf_names[p] : "?";
}

void lora_proj_shape(const struct model_config *cfg, enum lora_proj p, int *in, int *out)
{
    int q = cfg->n_heads * cfg->head_dim, kv = cfg->n_kv_heads * cfg->head_dim;
    switch (p) {
    case LORA_Q: *in = cfg->hidden; *out = q; break;
    case LORA_K:
    case LORA_V: *in = cfg->hidden; *out = kv; break;
    case LORA_O: *in = q; *out = cfg->hidden; break;
    case LORA_GATE:
    case LORA_UP: *in = cfg->hidden; *out = cfg->intermediate; break;
    default: *in = cfg->intermediate; *out = cfg->hidden; break;
    }
}

/* One LoRA matrix as its file holds it: row-major (rows, cols) in a float
 * dtype (a quantized GGUF matrix is dequantized into `owned` first). */
enum src_dt { SRC_F32, SRC_BF16, SRC_F16 };
struct src {
    const void *data; /* NULL: absent */
    enum src_dt dt;
    int64_t rows, cols;
    float *owned;
};

static float src_at(const struct src *t, size_t i)
{
    uint16_t h;
    switch (t->dt) {
    case SRC_F32: {
        float v;
        memcpy(&v, (const char *)t->data + i * 4, 4);
        return v;
    }
    case SRC_BF16:
        memcpy(&h, (const char *)t->data + i * 2, 2);
        return bf16_to_f32(h);
    default:
        memcpy(&h, (const char *)t->data + i * 2, 2);
        return f16_to_f32(h);
    }
}

/* A field of adapter_config.json that must be absent, null, false, empty
 * or equal to ok (when given): what we cannot serve is refused by name
 * rather than served wrong. */
static int refuse_field(const cJSON *root, const char *name, const char *ok, const char *why,
                        const char *path, struct rl_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v))
        return 0;
    if ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child)
        return 0;
    if (ok && cJSON_IsString(v) && !strcmp(v->valuestring, ok))
        return 0;
    return rl_errf(err, RL_EUNSUPPORTED, "%s: \"%s\" is set: %s", path, name, why);
}

struct lora_conf {
    double alpha;
    int rank;
    int rslora;
    int gguf;   /* llama.cpp's rule: alpha 0 means scale 1 */
};

static int parse_config(const char *dir, struct lora_conf *c, struct rl_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *json = NULL;
    int rc = file_read(path, LORA_CONFIG_MAX, &json, NULL, err);
    if (rc)
        return rc;
    cJSON *root = cJSON_Parse(json);
    free(json);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return rl_errf(err, RL_EFORMAT, "%s: not a JSON object", path);
    }
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "r");
    const cJSON *al = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "use_rslora");
    if (pt && (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA")))
        rc = rl_errf(err, RL_EUNSUPPORTED, "%s: \"peft_type\" is %s, only \"LORA\" is served", path,
                     cJSON_IsString(pt) ? pt->valuestring : "not a string");
    else if (!cJSON_IsNumber(r) || r->valuedouble != (double)r->valueint || r->valueint < 1 ||
             r->valueint > LORA_MAX_RANK)
        rc = rl_errf(err, RL_EFORMAT, "%s: \"r\" must be an integer 1-%d", path, LORA_MAX_RANK);
    else if (al && (!cJSON_IsNumber(al) || !isfinite(al->valuedouble) || al->valuedouble <= 0))
        rc = rl_errf(err, RL_EFORMAT, "%s: \"lora_alpha\" must be a positive number", path);
    else if (rs && !cJSON_IsBool(rs))
        rc = rl_errf(err, RL_EFORMAT, "%s: \"use_rslora\" must be true or false", path);
    else if ((rc = refuse_field(root, "use_dora", NULL, "DoRA adapters are not served", path, err)) ||
             (rc = refuse_field(root, "bias", "none", "adapters with biases are not served", path,
                                err)) ||
             (rc = refuse_field(root, "alpha_pattern", NULL,
                                "per-module alphas are not served (merge the adapter instead)", path,
                                err)) ||
             (rc = refuse_field(root, "modules_to_save", NULL,
                                "adapters that replace whole modules are not served", path, err)) ||
             (rc = refuse_field(root, "fan_in_fan_out", NULL,
                                "Conv1D-style (GPT-2) weights are not Qwen3's", path, err)) ||
             (rc = refuse_field(root, "layer_replication", NULL,
                                "layer replication is not served", path, err))) {
        /* rc and the message set */
    }
    if (!rc) {
        c->rank = r->valueint;
        c->alpha = al ? al->valuedouble : 8.0; /* PEFT's default */
        c->rslora = cJSON_IsTrue(rs);
    }
    cJSON_Delete(root);
    return rc;
}

/* Parses "base_model.model.model.layers.<l>.<self_attn|mlp>.<proj>.lora_<A|B>.weight". */
static int parse_name(const char *name, int *layer, enum lora_proj *p, int *is_b)
{
    static const char pre[] = "base_model.model.model.layers.";
    if (strncmp(name, pre, sizeof pre - 1))
        return -1;
    const char *s = name + sizeof pre - 1;
    char *end;
    long l = strtol(s, &end, 10);
    if (end == s || *end != '.' || l < 0 || l > 100000 || (s[0] == '0' && end - s > 1))
        return -1;
    s = end + 1;
    for (int i = 0; i < LORA_N_PROJ; i++) {
        char want[96];
        for (int b = 0; b < 2; b++) {
            snprintf(want, sizeof want, "%s.%s.lora_%c.weight", lora_proj_block((enum lora_proj)i),
                     proj_names[i], b ? 'B' : 'A');
            if (!strcmp(s, want)) {
                *layer = (int)l;
                *p = (enum lora_proj)i;
                *is_b = b;
                return 0;
            }
        }
    }
    return -1;
}

/* From the table of matrices (tab[(l * LORA_N_PROJ + p) * 2 + is_b], A
 * (r, in) and B (out, r)) to the adapter: shapes checked against cfg, A
 * copied, B transposed with the scale folded in, every value finite. */
static int build(struct lora_adapter *a, const struct src *tab, const struct model_config *cfg,
                 const struct lora_conf *conf, const char *path, struct rl_err *err)
{
    int L = cfg->n_layers;
    size_t floats = 0;
    int n_pairs = 0;
    for (int l = 0; l < L; l++)
        for (int p = 0; p < LORA_N_PROJ; p++) {
            const struct src *ta = &tab[((size_t)l * LORA_N_PROJ + p) * 2], *tb = ta + 1;
            if (!ta->data && !tb->data)
                continue;
            if (!ta->data || !tb->data)
                return rl_errf(err, RL_EFORMAT, "%s: layer %d %s has lora_%c but no lora_%c", path, l,
                               proj_names[p], ta->data ? 'A' : 'B', ta->data ? 'B' : 'A');
            int in, o;
            lora_proj_shape(cfg, (enum lora_proj)p, &in, &o);
            int64_t r = ta->rows;
            if (r < 1 || r > LORA_MAX_RANK || ta->cols != in || tb->rows != o || tb->cols != r)
                return rl_errf(err, RL_EFORMAT,
                               "%s: layer %d %s: lora_A must be (r, %d) and lora_B (%d, r) with r "
                               "1-%d for this model",
                               path, l, proj_names[p], in, o, LORA_MAX_RANK);
            struct lora_pair *pr = &a->pairs[(size_t)l * LORA_N_PROJ + p];
            pr->rank = (int)r;
            pr->in = in;
            pr->out = o;
            /* each matrix on a 64-byte boundary */
            floats += ((size_t)r * (size_t)in + 15) / 16 * 16 + ((size_t)r * (size_t)o + 15) / 16 * 16;
            n_pairs++;
            if (pr->rank > a->max_rank)
                a->max_rank = pr->rank;
        }
    if (!n_pairs)
        return rl_errf(err, RL_EFORMAT, "%s: no LoRA tensors", path);
    if (posix_memalign((void **)&a->data, 64, floats * sizeof(float))) {
        a->data = NULL;
        return rl_errf(err, RL_ENOMEM, "%s: out of memory for %zu MB of adapter", path,
                       floats * sizeof(float) >> 20);
    }
    a->bytes = floats * sizeof(float);
    float *at = a->data;
    for (int l = 0; l < L; l++)
        for (int p = 0; p < LORA_N_PROJ; p++) {
            struct lora_pair *pr = &a->pairs[(size_t)l * LORA_N_PROJ + p];
            if (!pr->rank)
                continue;
            const struct src *ta = &tab[((size_t)l * LORA_N_PROJ + p) * 2], *tb = ta + 1;
            /* PEFT's scaling: lora_alpha / r, with rsLoRA lora_alpha / sqrt(r),
             * r the pair's own (rank_pattern gives some pairs another);
             * llama.cpp's GGUF adapters: alpha / r, or 1 without an alpha */
            double scale = conf->gguf && conf->alpha == 0 ? 1.0
                           : conf->rslora                 ? conf->alpha / sqrt((double)pr->rank)
                                                          : conf->alpha / pr->rank;
            size_t na = (size_t)pr->rank * (size_t)pr->in, nb = (size_t)pr->rank * (size_t)pr->out;
            float *A = at, *Bt = at + (na + 15) / 16 * 16;
            for (size_t i = 0; i < na; i++)
                A[i] = src_at(ta, i);
            for (int o = 0; o < pr->out; o++)
                for (int k = 0; k < pr->rank; k++)
                    Bt[(size_t)k * (size_t)pr->out + (size_t)o] =
                        (float)(scale * src_at(tb, (size_t)o * (size_t)pr->rank + (size_t)k));
            for (size_t i = 0; i < na; i++)
                if (!isfinite(A[i]))
                    return rl_errf(err, RL_EFORMAT, "%s: layer %d %s: lora_A holds a non-finite value",
                                   path, l, proj_names[p]);
            for (size_t i = 0; i < nb; i++)
                if (!isfinite(Bt[i]))
                    return rl_errf(err, RL_EFORMAT, "%s: layer %d %s: lora_B holds a non-finite value",
                                   path, l, proj_names[p]);
            pr->a = A;
            pr->bt = Bt;
            at = Bt + (nb + 15) / 16 * 16;
        }
    return 0;
}

/* PEFT: dir/adapter_config.json and dir/adapter_model.safetensors. */
static int load_peft(struct lora_adapter *a, struct src *tab, const char *dir,
                     const struct model_config *cfg, struct rl_err *err)
{
    struct lora_conf conf = {0};
    int rc = parse_config(dir, &conf, err);
    if (rc)
        return rc;
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    struct st_file *st = NULL;
    if ((rc = st_open(&st, path, err)))
        return rc;
    int n = st_n_tensors(st);
    for (int i = 0; i < n && !rc; i++) {
        const struct st_tensor *t = st_get(st, i);
        int l, b;
        enum lora_proj p;
        if (parse_name(t->name, &l, &p, &b))
            rc = rl_errf(err, RL_EUNSUPPORTED,
                         "%s: tensor \"%s\" is not a LoRA pair of a layer's q/k/v/o/gate/up/down "
                         "projection (embedding, lm_head and DoRA adapters are not served)",
                         path, t->name);
        else if (l >= cfg->n_layers)
            rc = rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": layer %d, the model has %d", path,
                         t->name, l, cfg->n_layers);
        else if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
            rc = rl_errf(err, RL_EUNSUPPORTED, "%s: tensor \"%s\" is %s (F32, BF16 or F16 taken)",
                         path, t->name, st_dtype_name(t->dtype));
        else if (t->n_dims != 2)
            rc = rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" is not a matrix", path, t->name);
        else
            tab[((size_t)l * LORA_N_PROJ + p) * 2 + b] = (struct src){
                t->data, t->dtype == ST_F32 ? SRC_F32 : t->dtype == ST_BF16 ? SRC_BF16 : SRC_F16,
                t->shape[0], t->shape[1], NULL};
    }
    if (!rc)
        rc = build(a, tab, cfg, &conf, path, err);
    st_close(st);
    return rc;
}

/* llama.cpp's GGUF adapters (convert_lora_to_gguf.py): general.type
 * "adapter", adapter.type "lora", adapter.lora.alpha; tensors named after
 * the base GGUF's with ".lora_a" / ".lora_b", ne = (in, r) and (r, out),
 * i.e. row-major A (r, in) and B (out, r) as PEFT's. */
static int load_gguf(struct lora_adapter *a, struct src *tab, const char *path,
                     const struct model_config *cfg, struct rl_err *err)
{
    struct gguf_file *g = NULL;
    int rc = gguf_open(&g, path, err);
    if (rc)
        return rc;
    const char *s;
    size_t n;
    struct lora_conf conf = {.gguf = 1};
    if (gguf_get_str(g, "adapter.type", &s, &n, err) || n != 4 || memcmp(s, "lora", 4)) {
        rc = rl_errf(err, RL_EUNSUPPORTED,
                     "%s: not a LoRA adapter (its adapter.type is not \"lora\": a model, or "
                     "another kind of adapter)", path);
        goto out;
    }
    if (gguf_has_key(g, "general.architecture") &&
        (gguf_get_str(g, "general.architecture", &s, &n, err) || n != 5 || memcmp(s, "qwen3", 5))) {
        rc = rl_errf(err, RL_EUNSUPPORTED, "%s: an adapter for general.architecture \"%.*s\", not "
                     "qwen3", path, (int)(n < 64 ? n : 64), s);
        goto out;
    }
    if (gguf_has_key(g, "adapter.lora.alpha") &&
        ((rc = gguf_get_float(g, "adapter.lora.alpha", &conf.alpha, err)) ||
         !isfinite(conf.alpha) || conf.alpha < 0)) {
        rc = rl_errf(err, RL_EFORMAT, "%s: adapter.lora.alpha must be a number >= 0", path);
        goto out;
    }
    for (int i = 0; i < gguf_n_tensors(g) && !rc; i++) {
        const struct gguf_tensor *t = gguf_get_tensor(g, i);
        int l = -1, b = -1, p = -1, at = 0;
        char sfx[32] = "";
        if (sscanf(t->name, "blk.%d.%31[a-z_].weight.lora_%n", &l, sfx, &at) == 2 && at > 0 &&
            (!strcmp(t->name + at, "a") || !strcmp(t->name + at, "b")))
            b = t->name[at] == 'b';
        for (int k = 0; k < LORA_N_PROJ && b >= 0; k++)
            if (!strcmp(sfx, gguf_names[k]))
                p = k;
        if (p < 0) {
            rc = rl_errf(err, RL_EUNSUPPORTED,
                         "%s: tensor \"%s\" is not a LoRA pair of a layer's attn_q/k/v/output or "
                         "ffn_gate/up/down (token_embd and output adapters are not served)",
                         path, t->name);
        } else if (l < 0 || l >= cfg->n_layers) {
            rc = rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": layer %d, the model has %d", path,
                         t->name, l, cfg->n_layers);
        } else if (t->n_dims != 2) {
            rc = rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" is not a matrix", path, t->name);
        } else {
            struct src *d = &tab[((size_t)l * LORA_N_PROJ + p) * 2 + b];
            *d = (struct src){t->data, SRC_F32, t->ne[1], t->ne[0], NULL};
            size_t cnt = (size_t)(t->ne[0] * t->ne[1]);
            if (t->type == GGUF_T_F16)
                d->dt = SRC_F16;
            else if (t->type == GGUF_T_BF16)
                d->dt = SRC_BF16;
            else if (t->type == GGUF_T_Q8_0 && t->ne[0] % 32 == 0) {
                if (!(d->owned = malloc(cnt * sizeof(float))))
                    rc = rl_errf(err, RL_ENOMEM, "out of memory");
                else
                    quant_dequant_q8_0((const struct quant_block_q8_0 *)t->data, d->owned, (int64_t)cnt);
                d->data = d->owned;
            } else if (t->type != GGUF_T_F32) {
                char tn[16];
                rc = rl_errf(err, RL_EUNSUPPORTED, "%s: tensor \"%s\" is %s (F32, F16, BF16 or Q8_0 "
                             "taken)", path, t->name, gguf_type_name(t->type, tn));
            }
        }
    }
    if (!rc)
        rc = build(a, tab, cfg, &conf, path, err);
out:
    gguf_close(g);
    return rc;
}

int lora_load(struct lora_adapter **out, const char *path, const struct model_config *cfg,
              struct rl_err *err)
{
    *out = NULL;
    int L = cfg->n_layers;
    struct src *tab = calloc((size_t)L * LORA_N_PROJ * 2, sizeof *tab);
    struct lora_adapter *a = calloc(1, sizeof *a);
    int rc = 0;
    if (!tab || !a || !(a->pairs = calloc((size_t)L * LORA_N_PROJ, sizeof *a->pairs)))
        rc = rl_errf(err, RL_ENOMEM, "out of memory");
    else {
        a->n_layers = L;
        struct stat st;
        rc = stat(path, &st) == 0 && S_ISREG(st.st_mode) ? load_gguf(a, tab, path, cfg, err)
                                                         : load_peft(a, tab, path, cfg, err);
    }
    for (size_t i = 0; tab && i < (size_t)L * LORA_N_PROJ * 2; i++)
        free(tab[i].owned);
    free(tab);
    if (rc) {
        lora_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

void lora_free(struct lora_adapter *a)
{
    if (!a)
        return;
    free(a->data);
    free(a->pairs);
    free(a);
}

const struct lora_pair *lora_get(const struct lora_adapter *a, int layer, enum lora_proj p)
{
    if (!a || layer < 0 || layer >= a->n_layers || p < 0 || p >= LORA_N_PROJ)
        return NULL;
    const struct lora_pair *pr = &a->pairs[(size_t)layer * LORA_N_PROJ + p];
    return pr->rank ? pr : NULL;
}

int lora_max_rank(const struct lora_adapter *a) { return a ? a->max_rank : 0; }

size_t lora_bytes(const struct lora_adapter *a) { return a ? a->bytes : 0; }
