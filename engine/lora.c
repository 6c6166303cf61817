/* engine/lora.c - PEFT LoRA adapters: the config, the tensors, the f32
 * layout the backends multiply with (lora.h). */
#include "lora.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "file.h"
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

const char *lora_proj_name(enum lora_proj p)
{
    return p >= 0 && p < LORA_N_PROJ ? proj_names[p] : "?";
}

static void proj_shape(const struct model_config *cfg, enum lora_proj p, int *in, int *out)
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

/* Reads element i of a 2-D tensor of a float dtype as f32. */
static float elem(const struct st_tensor *t, size_t i)
{
    switch (t->dtype) {
    case ST_F32: {
        float v;
        memcpy(&v, (const char *)t->data + i * 4, 4);
        return v;
    }
    case ST_BF16: {
        uint16_t h;
        memcpy(&h, (const char *)t->data + i * 2, 2);
        return bf16_to_f32(h);
    }
    default: {
        uint16_t h;
        memcpy(&h, (const char *)t->data + i * 2, 2);
        return f16_to_f32(h);
    }
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
        const char *blk = i <= LORA_O ? "self_attn" : "mlp";
        for (int b = 0; b < 2; b++) {
            snprintf(want, sizeof want, "%s.%s.lora_%c.weight", blk, proj_names[i], b ? 'B' : 'A');
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

int lora_load(struct lora_adapter **out, const char *dir, const struct model_config *cfg,
              struct rl_err *err)
{
    *out = NULL;
    struct lora_conf conf = {0};
    int rc = parse_config(dir, &conf, err);
    if (rc)
        return rc;
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    struct st_file *st = NULL;
    if ((rc = st_open(&st, path, err)))
        return rc;
    int L = cfg->n_layers;
    const struct st_tensor **tab = calloc((size_t)L * LORA_N_PROJ * 2, sizeof *tab);
    struct lora_adapter *a = calloc(1, sizeof *a);
    if (!tab || !a || !(a->pairs = calloc((size_t)L * LORA_N_PROJ, sizeof *a->pairs))) {
        rc = rl_errf(err, RL_ENOMEM, "out of memory");
        goto done;
    }
    a->n_layers = L;
    int n = st_n_tensors(st);
    for (int i = 0; i < n; i++) {
        const struct st_tensor *t = st_get(st, i);
        int l, b;
        enum lora_proj p;
        if (parse_name(t->name, &l, &p, &b)) {
            rc = rl_errf(err, RL_EUNSUPPORTED,
                         "%s: tensor \"%s\" is not a LoRA pair of a layer's q/k/v/o/gate/up/down "
                         "projection (embedding, lm_head and DoRA adapters are not served)",
                         path, t->name);
            goto done;
        }
        if (l >= L) {
            rc = rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": layer %d, the model has %d", path,
                         t->name, l, L);
            goto done;
        }
        if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16) {
            rc = rl_errf(err, RL_EUNSUPPORTED, "%s: tensor \"%s\" is %s (F32, BF16 or F16 taken)",
                         path, t->name, st_dtype_name(t->dtype));
            goto done;
        }
        tab[((size_t)l * LORA_N_PROJ + p) * 2 + b] = t;
    }
    /* shapes first, then one allocation for every pair */
    size_t floats = 0;
    int n_pairs = 0;
    for (int l = 0; l < L; l++)
        for (int p = 0; p < LORA_N_PROJ; p++) {
            const struct st_tensor *ta = tab[((size_t)l * LORA_N_PROJ + p) * 2];
            const struct st_tensor *tb = tab[((size_t)l * LORA_N_PROJ + p) * 2 + 1];
            if (!ta && !tb)
                continue;
            if (!ta || !tb) {
                rc = rl_errf(err, RL_EFORMAT, "%s: layer %d %s has lora_%c but no lora_%c", path, l,
                             proj_names[p], ta ? 'A' : 'B', ta ? 'B' : 'A');
                goto done;
            }
            int in, o;
            proj_shape(cfg, (enum lora_proj)p, &in, &o);
            int64_t r = ta->n_dims == 2 ? ta->shape[0] : -1;
            if (ta->n_dims != 2 || tb->n_dims != 2 || r < 1 || r > LORA_MAX_RANK ||
                ta->shape[1] != in || tb->shape[0] != o || tb->shape[1] != r) {
                rc = rl_errf(err, RL_EFORMAT,
                             "%s: layer %d %s: lora_A must be (r, %d) and lora_B (%d, r) with r "
                             "1-%d for this model",
                             path, l, proj_names[p], in, o, LORA_MAX_RANK);
                goto done;
            }
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
    if (!n_pairs) {
        rc = rl_errf(err, RL_EFORMAT, "%s: no LoRA tensors", path);
        goto done;
    }
    if (posix_memalign((void **)&a->data, 64, floats * sizeof(float))) {
        a->data = NULL;
        rc = rl_errf(err, RL_ENOMEM, "%s: out of memory for %zu MB of adapter", path,
                     floats * sizeof(float) >> 20);
        goto done;
    }
    a->bytes = floats * sizeof(float);
    float *at = a->data;
    for (int l = 0; l < L; l++)
        for (int p = 0; p < LORA_N_PROJ; p++) {
            struct lora_pair *pr = &a->pairs[(size_t)l * LORA_N_PROJ + p];
            if (!pr->rank)
                continue;
            const struct st_tensor *ta = tab[((size_t)l * LORA_N_PROJ + p) * 2];
            const struct st_tensor *tb = tab[((size_t)l * LORA_N_PROJ + p) * 2 + 1];
            /* PEFT's scaling: lora_alpha / r, with rsLoRA lora_alpha / sqrt(r);
             * r is the pair's own (rank_pattern gives some pairs another) */
            double scale = conf.rslora ? conf.alpha / sqrt((double)pr->rank) : conf.alpha / pr->rank;
            size_t na = (size_t)pr->rank * (size_t)pr->in, nb = (size_t)pr->rank * (size_t)pr->out;
            float *A = at, *Bt = at + (na + 15) / 16 * 16;
            for (size_t i = 0; i < na; i++)
                A[i] = elem(ta, i);
            for (int o = 0; o < pr->out; o++)
                for (int k = 0; k < pr->rank; k++)
                    Bt[(size_t)k * (size_t)pr->out + (size_t)o] =
                        (float)(scale * elem(tb, (size_t)o * (size_t)pr->rank + (size_t)k));
            for (size_t i = 0; i < na; i++)
                if (!isfinite(A[i])) {
                    rc = rl_errf(err, RL_EFORMAT, "%s: layer %d %s: lora_A holds a non-finite value",
                                 path, l, proj_names[p]);
                    goto done;
                }
            for (size_t i = 0; i < nb; i++)
                if (!isfinite(Bt[i])) {
                    rc = rl_errf(err, RL_EFORMAT, "%s: layer %d %s: lora_B holds a non-finite value",
                                 path, l, proj_names[p]);
                    goto done;
                }
            pr->a = A;
            pr->bt = Bt;
            at = Bt + (nb + 15) / 16 * 16;
        }
    (void)conf.rank; /* the pairs' own shapes decide; r only had to be valid */
done:
    free(tab);
    st_close(st);
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
