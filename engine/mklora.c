/* engine/mklora.c - random PEFT adapters and merged checkpoints (mklora.h). */
#include "mklora.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "file.h"
#include "gguf.h"
#include "lora.h"
#include "model.h"
#include "safetensors.h"
#include "xoshiro.h"

#define MK_CONFIG_MAX (1u << 20)

void mk_lora_opts_init(struct mk_lora_opts *o)
{
    memset(o, 0, sizeof *o);
    o->rank = 8;
}

static int base_config(const char *dir, struct model_config *cfg, struct rl_err *err)
{
    char path[4096], *json = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = file_read(path, MK_CONFIG_MAX, &json, NULL, err);
    if (!rc)
        rc = model_parse_config(cfg, json, path, err);
    free(json);
    return rc;
}


int mk_lora_write(const struct mk_lora_opts *o, struct rl_err *err)
{
    if (!o->base_dir || !o->out_dir)
        return rl_errf(err, RL_EINVAL, "mkmodel --lora-of: a base checkpoint and --out are needed");
    if (o->rank < 1 || o->rank > LORA_MAX_RANK)
        return rl_errf(err, RL_EINVAL, "--lora-rank: %d is not 1-%d", o->rank, LORA_MAX_RANK);
    if (o->alpha < 0 || !isfinite(o->alpha) || o->std < 0 || !isfinite(o->std))
        return rl_errf(err, RL_EINVAL, "--lora-alpha / --lora-std: must be positive");
    struct model_config cfg;
    int rc = base_config(o->base_dir, &cfg, err);
    if (rc)
        return rc;
    unsigned targets = o->targets ? o->targets : (1u << LORA_N_PROJ) - 1;
    float std = o->std > 0 ? o->std : 0.02f;
    /* out_dir ending in ".gguf": llama.cpp's adapter file instead (lora.h) */
    size_t ol = strlen(o->out_dir);
    bool gguf = ol > 5 && !strcmp(o->out_dir + ol - 5, ".gguf");
    if (gguf && o->rslora)
        return rl_errf(err, RL_EINVAL, "--rslora: a GGUF adapter's scale is alpha / r, always");
    struct st_writer *w = NULL;
    struct gguf_writer *gw = NULL;
    if ((rc = gguf ? gguf_writer_create(&gw, err) : st_writer_create(&w, err)))
        return rc;
    /* every tensor's values live until the write: one list of buffers */
    int n_bufs = 0;
    void **bufs = calloc((size_t)cfg.n_layers * LORA_N_PROJ * 2, sizeof *bufs);
    if (!bufs)
        rc = rl_errf(err, RL_ENOMEM, "out of memory");
    uint64_t s[4];
    uint64_t x = o->seed ^ 0x4c6f5241ull; /* "LoRA": not the base's stream */
    for (int i = 0; i < 4; i++)
        s[i] = xo_splitmix64(&x);
    for (int l = 0; !rc && l < cfg.n_layers; l++)
        for (int p = 0; !rc && p < LORA_N_PROJ; p++) {
            if (!(targets & (1u << p)))
                continue;
            int in, out;
            lora_proj_shape(&cfg, (enum lora_proj)p, &in, &out);
            for (int b = 0; !rc && b < 2; b++) {
                int64_t shape[2] = {b ? out : o->rank, b ? o->rank : in};
                size_t n = (size_t)(shape[0] * shape[1]);
                void *v = malloc(n * (o->bf16 ? 2 : 4));
                if (!v) {
                    rc = rl_errf(err, RL_ENOMEM, "out of memory");
                    break;
                }
                bufs[n_bufs++] = v;
                for (size_t i = 0; i < n; i++) {
                    float f = xo_normal(s) * std;
                    if (o->bf16)
                        ((uint16_t *)v)[i] = f32_to_bf16(f);
                    else
                        ((float *)v)[i] = f;
                }
                char name[256];
                if (gguf) { /* the same bytes: ne is the shape reversed */
                    snprintf(name, sizeof name, "blk.%d.%s.weight.lora_%c", l,
                             lora_proj_gguf_name((enum lora_proj)p), b ? 'b' : 'a');
                    int64_t ne[2] = {shape[1], shape[0]};
                    gguf_writer_tensor(gw, name, o->bf16 ? GGUF_T_BF16 : GGUF_T_F32, 2, ne, v, NULL, NULL);
                    continue;
                }
                snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l,
                         lora_proj_block((enum lora_proj)p), lora_proj_name((enum lora_proj)p), b ? 'B' : 'A');
                rc = st_writer_add(w, name, o->bf16 ? ST_BF16 : ST_F32, 2, shape, v, err);
            }
        }
    cJSON *c = cJSON_CreateObject(), *tm = cJSON_AddArrayToObject(c, "target_modules");
    for (int p = 0; p < LORA_N_PROJ; p++)
        if (targets & (1u << p))
            cJSON_AddItemToArray(tm, cJSON_CreateString(lora_proj_name((enum lora_proj)p)));
    cJSON_AddStringToObject(c, "peft_type", "LORA");
    cJSON_AddStringToObject(c, "task_type", "CAUSAL_LM");
    cJSON_AddStringToObject(c, "base_model_name_or_path", o->base_dir);
    cJSON_AddNumberToObject(c, "r", o->rank);
    cJSON_AddNumberToObject(c, "lora_alpha", o->alpha > 0 ? o->alpha : 2.0 * o->rank);
    cJSON_AddNumberToObject(c, "lora_dropout", 0);
    cJSON_AddBoolToObject(c, "use_rslora", o->rslora != 0);
    cJSON_AddBoolToObject(c, "use_dora", 0);
    cJSON_AddStringToObject(c, "bias", "none");
    cJSON_AddBoolToObject(c, "fan_in_fan_out", 0);
    cJSON_AddItemToObject(c, "modules_to_save", cJSON_CreateNull());
    char path[4096];
    if (gguf) {
        double alpha = o->alpha > 0 ? o->alpha : 2.0 * o->rank;
        gguf_writer_str(gw, "general.architecture", "qwen3", 5);
        gguf_writer_str(gw, "general.type", "adapter", 7);
        gguf_writer_str(gw, "adapter.type", "lora", 4);
        gguf_writer_f32(gw, "adapter.lora.alpha", (float)alpha);
        snprintf(path, sizeof path, "%s", o->out_dir);
        char *slash = strrchr(path, '/');
        if (slash && slash != path) {
            *slash = 0;
            if (!rc)
                rc = file_mkdir_p(path, err);
        }
        if (!rc)
            rc = gguf_writer_write(gw, o->out_dir, err);
    } else {
        if (!rc)
            rc = file_mkdir_p(o->out_dir, err);
        if (!rc) {
            snprintf(path, sizeof path, "%s/adapter_model.safetensors", o->out_dir);
            rc = st_writer_write(w, path, err);
        }
        if (!rc) {
            snprintf(path, sizeof path, "%s/adapter_config.json", o->out_dir);
            rc = file_write_json(path, c, err);
        }
    }
    cJSON_Delete(c);
    st_writer_free(w);
    gguf_writer_free(gw);
    for (int i = 0; i < n_bufs; i++)
        free(bufs[i]);
    free(bufs);
    return rc;
}

/* Which projection a checkpoint tensor is: "model.layers.<l>.<blk>.<p>.weight". */
static int base_proj(const char *name, int *layer)
{
    int l, n = 0;
    if (sscanf(name, "model.layers.%d.%n", &l, &n) != 1 || !n)
        return -1;
    for (int p = 0; p < LORA_N_PROJ; p++) {
        char want[96];
        snprintf(want, sizeof want, "%s.%s.weight", lora_proj_block((enum lora_proj)p),
                 lora_proj_name((enum lora_proj)p));
        if (!strcmp(name + n, want)) {
            *layer = l;
            return p;
        }
    }
    return -1;
}

int mk_lora_merge(const char *base_dir, const char *adapter_dir, const char *out_dir,
                  struct rl_err *err)
{
    struct model_config cfg;
    int rc = base_config(base_dir, &cfg, err);
    if (rc)
        return rc;
    struct lora_adapter *a = NULL;
    struct st_file *st = NULL;
    struct st_writer *w = NULL;
    if ((rc = lora_load(&a, adapter_dir, &cfg, err)) || (rc = st_open(&st, base_dir, err)) ||
        (rc = st_writer_create(&w, err))) {
        lora_free(a);
        st_close(st);
        return rc;
    }
    int n = st_n_tensors(st), n_bufs = 0;
    void **bufs = calloc((size_t)n, sizeof *bufs);
    if (!bufs)
        rc = rl_errf(err, RL_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < n; i++) {
        const struct st_tensor *t = st_get(st, i);
        int l = -1, p = base_proj(t->name, &l);
        const struct lora_pair *pr = p >= 0 ? lora_get(a, l, (enum lora_proj)p) : NULL;
        if (!pr) { /* as it is */
            rc = st_writer_add(w, t->name, t->dtype, t->n_dims, t->shape, t->data, err);
            continue;
        }
        if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16) {
            rc = rl_errf(err, RL_EUNSUPPORTED, "%s: %s is %s; merging takes F32, BF16 or F16", base_dir,
                         t->name, st_dtype_name(t->dtype));
            break;
        }
        size_t es = st_dtype_size(t->dtype), cols = (size_t)pr->in;
        void *v = malloc((size_t)pr->out * cols * es);
        float *row = malloc(cols * sizeof *row);
        if (!v || !row) {
            free(v);
            free(row);
            rc = rl_errf(err, RL_ENOMEM, "out of memory");
            break;
        }
        bufs[n_bufs++] = v;
        /* W[o] += sum_k Bt[k][o] A[k], k ascending (bt holds the scale) */
        for (int o = 0; o < pr->out; o++) {
            const char *src = (const char *)t->data + (size_t)o * cols * es;
            for (size_t c = 0; c < cols; c++) {
                uint16_t h;
                if (t->dtype == ST_F32)
                    memcpy(&row[c], src + c * 4, 4);
                else {
                    memcpy(&h, src + c * 2, 2);
                    row[c] = t->dtype == ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
                }
            }
            for (int k = 0; k < pr->rank; k++) {
                float b = pr->bt[(size_t)k * (size_t)pr->out + (size_t)o];
                const float *ar = pr->a + (size_t)k * cols;
                for (size_t c = 0; c < cols; c++)
                    row[c] += b * ar[c];
            }
            char *dst = (char *)v + (size_t)o * cols * es;
            for (size_t c = 0; c < cols; c++) {
                uint16_t h;
                if (t->dtype == ST_F32)
                    memcpy(dst + c * 4, &row[c], 4);
                else {
                    h = t->dtype == ST_BF16 ? f32_to_bf16(row[c]) : f32_to_f16(row[c]);
                    memcpy(dst + c * 2, &h, 2);
                }
            }
        }
        free(row);
        rc = st_writer_add(w, t->name, t->dtype, t->n_dims, t->shape, v, err);
    }
    char path[4096];
    if (!rc)
        rc = file_mkdir_p(out_dir, err);
    if (!rc) {
        snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
        rc = st_writer_write(w, path, err);
    }
    if (!rc)
        rc = file_copy(base_dir, out_dir, "config.json", 1, err);
    const char *extra[] = {"generation_config.json", "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; !rc && i < sizeof extra / sizeof extra[0]; i++)
        rc = file_copy(base_dir, out_dir, extra[i], 0, err);
    st_writer_free(w);
    for (int i = 0; i < n_bufs; i++)
        free(bufs[i]);
    free(bufs);
    st_close(st);
    lora_free(a);
    return rc;
}
