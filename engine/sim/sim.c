/* engine/sim/sim.c - the sim backend (sim.h): device timing without a device.
 *
 * forward() does three things per step:
 *   1. the token path: every new token's KV slot gets a 64-bit hash of the
 *      slot before it (position - 1 of the same sequence, through its block
 *      table) and the token id. The hash plays the part of the keys and
 *      values: it depends on the whole prefix and nothing else, so a prefix
 *      cache hit, a copy-on-write kv_copy, a preemption that recomputes, or
 *      a resumed job on another worker all see the same values, and a block
 *      table bug shows up as different tokens, as it would on a GPU;
 *   2. logits: each row asked for is -1e9 except four candidate ids drawn
 *      from the row's hash (logits 2, 1, 0.5, 0), ids in [256, 151643) -
 *      ordinary BPE merges of Qwen3's vocabulary, no byte tokens and no
 *      special tokens - so the engine's sampler (greedy or seeded) picks one
 *      of them deterministically: same prompt + seed + parameters, same ids.
 *      A row the engine wants as its best entry or its candidate set
 *      (set_row_wants, issue 25: what the CUDA backend sends instead of a
 *      151,936-float row) is never written: its set is built from the four
 *      candidates directly, exactly as sample_cands_from_row() would build
 *      it from the whole row (engine/sample.h), and fetch_row() writes the
 *      whole row from the row's hash when the sampler asks. So a sim
 *      worker's host work per step is what a GPU worker's is, not a
 *      whole-row sampler's (0.2 ms a row), and a fleet of them on two cores
 *      runs at the modelled speed;
 *   3. time: sleeps until the step has lasted sim_step_seconds() from its
 *      start (the CPU work of 1 and 2 is inside that time, as a GPU's
 *      compute would be).
 * The pool is (n_blocks * block_size) hashes, 8 bytes a slot. Owner thread
 * only, like every backend. */
#include "sim.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "file.h"
#include "sample.h"

static const struct sim_profile profiles[] = {
    /* NVIDIA datasheets, SXM parts, dense (no sparsity) tensor peaks */
    {"h200", 141e9, 4.8e12, 989.4e12, 1978.9e12},
    {"h100", 80e9, 3.35e12, 989.4e12, 1978.9e12},
    {"a100", 80e9, 2.039e12, 312e12, 0},
    {"l40s", 48e9, 0.864e12, 362.05e12, 733e12},
};

int sim_profile_get(const char *name, struct sim_profile *out, struct rl_err *err)
{
    if (!name || !*name)
        name = "h200";
    for (size_t i = 0; i < sizeof profiles / sizeof profiles[0]; i++)
        if (!strcmp(profiles[i].name, name)) {
            *out = profiles[i];
            return 0;
        }
    return rl_errf(err, RL_EINVAL, "sim: unknown device profile \"%s\" (expected h200, h100, a100 or l40s)",
                   name);
}

/* Built-in shapes: the Hugging Face config.json fields of the Qwen3 dense
 * models that matter here, parsed by the same model_parse_config(). */
#define QWEN3(h, i, l, nh, tied, extra)                                                          \
    "{\"model_type\":\"qwen3\",\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":" #h ",\"intermediate_size\":" #i ",\"num_hidden_layers\":" #l            \
    ",\"num_attention_heads\":" #nh ",\"num_key_value_heads\":8,\"head_dim\":128,"               \
    "\"vocab_size\":151936,\"max_position_embeddings\":40960,\"rms_norm_eps\":1e-6,"            \
    "\"rope_theta\":1000000,\"tie_word_embeddings\":" #tied ",\"torch_dtype\":\"bfloat16\","    \
    "\"bos_token_id\":151643,\"eos_token_id\":151645" extra "}"
#define FP8 ",\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128]}"
static const struct {
    const char *name, *json;
} shapes[] = {
    {"qwen3-0.6b", QWEN3(1024, 3072, 28, 16, true, "")},
    {"qwen3-1.7b", QWEN3(2048, 6144, 28, 16, true, "")},
    {"qwen3-4b", QWEN3(2560, 9728, 36, 32, true, "")},
    {"qwen3-8b", QWEN3(4096, 12288, 36, 32, false, "")},
    {"qwen3-14b", QWEN3(5120, 17408, 40, 40, false, "")},
    {"qwen3-32b", QWEN3(5120, 25600, 64, 64, false, "")},
    {"qwen3-8b-fp8", QWEN3(4096, 12288, 36, 32, false, FP8)},
    {"qwen3-14b-fp8", QWEN3(5120, 17408, 40, 40, false, FP8)},
    {"qwen3-32b-fp8", QWEN3(5120, 25600, 64, 64, false, FP8)},
};

int sim_model_config(const char *spec, struct model_config *cfg, struct rl_err *err)
{
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!strcmp(shapes[i].name, spec))
            return model_parse_config(cfg, shapes[i].json, shapes[i].name, err);
    char path[4096];
    struct stat st;
    if (stat(spec, &st) != 0) {
        if (!strchr(spec, '/') && !strstr(spec, ".json"))
            return rl_errf(err, RL_EINVAL,
                           "sim: unknown model \"%s\" (a built-in: qwen3-0.6b, -1.7b, -4b, -8b, -14b, "
                           "-32b, -8b-fp8, -14b-fp8, -32b-fp8; or a config.json path)", spec);
        return rl_errf(err, RL_EIO, "sim: %s: %s", spec, strerror(errno));
    }
    snprintf(path, sizeof path, S_ISDIR(st.st_mode) ? "%s/config.json" : "%s", spec);
    char *json = NULL;
    int rc = file_read(path, MODEL_CONFIG_MAX, &json, NULL, err);
    if (!rc)
        rc = model_parse_config(cfg, json, path, err);
    free(json);
    return rc;
}

int sim_model_load(struct model **out, const char *dir, const char *spec, struct rl_err *err)
{
    *out = NULL;
    struct model_config cfg;
    int rc = sim_model_config(spec && *spec ? spec : dir, &cfg, err);
    return rc ? rc : model_create_shape(out, &cfg, dir, err);
}

static double wbytes(const struct model_config *c)
{
    return c->fp8_block_rows ? 1.0 : c->dtype == MODEL_F32 ? 4.0 : 2.0;
}

/* matrix parameters of the layers (no norms, no embedding, no lm_head) */
static double layer_params(const struct model_config *c)
{
    double q = (double)c->n_heads * c->head_dim, kv = (double)c->n_kv_heads * c->head_dim;
    return (double)c->n_layers * (c->hidden * (2 * q + 2 * kv) + 3.0 * c->hidden * c->intermediate);
}

double sim_weight_bytes(const struct model_config *c, int read_per_step)
{
    double vh = (double)c->vocab * c->hidden, tbl = c->dtype == MODEL_F32 ? 4.0 : 2.0;
    double b = layer_params(c) * wbytes(c) + vh * tbl; /* lm_head (bf16 in FP8 checkpoints too) */
    if (!read_per_step && !c->tied)
        b += vh * tbl;                                 /* the embedding, stored apart */
    return b;
}

double sim_kv_token_bytes(const struct model_config *c)
{
    return (double)c->n_layers * 2.0 * c->n_kv_heads * c->head_dim * 2.0;
}

double sim_kv_capacity(const struct sim_profile *p, const struct model_config *c)
{
    double b = p->mem_bytes * SIM_MEM_UTIL - sim_weight_bytes(c, 0);
    return b > 0 ? b : 0;
}

double sim_step_seconds(const struct sim_profile *p, const struct model_config *c,
                        double n_tokens, double n_logits, double attn_pairs, double kv_tokens)
{
    bool fp8 = c->fp8_block_rows > 0;
    double layers = layer_params(c) * wbytes(c), head = sim_weight_bytes(c, 1) - layers;
    double wt = layers / (p->bw * (fp8 ? SIM_FP8_BW_EFF : SIM_BW_EFF)) + head / (p->bw * SIM_BW_EFF);
    double peak = fp8 && p->fp8_flops > 0 ? p->fp8_flops * SIM_FP8_FLOP_EFF : p->bf16_flops * SIM_FLOP_EFF;
    double flops = 2.0 * layer_params(c) * n_tokens + 2.0 * (double)c->vocab * c->hidden * n_logits +
                   4.0 * c->n_layers * (double)c->n_heads * c->head_dim * attn_pairs;
    double ct = flops / peak;
    return (wt > ct ? wt : ct) + kv_tokens * sim_kv_token_bytes(c) / (p->bw * SIM_KV_EFF) + SIM_LAUNCH_S +
           c->n_layers * SIM_LAYER_S;
}

double sim_decode_tok_s(const struct sim_profile *p, const struct model_config *c, int n_seqs,
                        int ctx)
{
    double kv = (double)n_seqs * ctx;
    return n_seqs / sim_step_seconds(p, c, n_seqs, n_seqs, kv, kv);
}

double sim_prefill_tok_s(const struct sim_profile *p, const struct model_config *c, int len,
                         int chunk)
{
    double t = 0;
    for (int at = 0; at < len; at += chunk) {
        int n = len - at < chunk ? len - at : chunk;
        double pairs = (double)n * at + (double)n * (n + 1) / 2;
        t += sim_step_seconds(p, c, n, 1, pairs, at + n);
    }
    return len / t;
}

struct sim {
    struct sim_profile p;
    struct model_config cfg;
    uint64_t *slots;          /* (n_blocks * block_size) prefix hash per KV slot */
    int n_blocks, block_size;
    int32_t id_lo, id_n;      /* candidate ids: [id_lo, id_lo + id_n) */
    double modelled_s, slept_s, over_s; /* since the last profile() */
    int64_t n_steps;
    char desc[160];
    /* issue 25's reduced rows: the next forward's wants and masks (the
     * engine's, valid until it returns), and the last forward's rows */
    uint8_t *wants;
    int n_wants;
    const uint32_t *const *masks;
    int n_masks;
    uint64_t *row_h;              /* (cap_rows) each row's hash: the row, for fetch_row */
    struct sample_cands *cands;   /* (cap_rows) the sets of the reduced rows */
    int cap_rows, n_rows;
};

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int sim_load(void *ctx, const struct model_config *cfg, const struct model_weights *w,
                    int max_tokens, struct rl_err *err)
{
    (void)w;
    (void)max_tokens;
    struct sim *s = ctx;
    s->cfg = *cfg;
    if (cfg->vocab < 4)
        return rl_errf(err, RL_EUNSUPPORTED, "sim: vocab_size %d is below 4", cfg->vocab);
    int32_t hi = cfg->vocab < 151643 ? cfg->vocab : 151643;
    s->id_lo = hi > 1024 ? 256 : 0;
    s->id_n = hi - s->id_lo;
    double cap = sim_kv_capacity(&s->p, cfg);
    if (cap <= 0)
        return rl_errf(err, RL_EUNSUPPORTED, "sim: %.1f GB of weights do not fit %s's %.0f GB",
                       sim_weight_bytes(cfg, 0) / 1e9, s->p.name, s->p.mem_bytes / 1e9);
    snprintf(s->desc, sizeof s->desc, "sim %s (%.2f TB/s, %.0f TFLOPS %s), %.1f GB weights, %.1f GB KV",
             s->p.name, s->p.bw / 1e12,
             (cfg->fp8_block_rows && s->p.fp8_flops > 0 ? s->p.fp8_flops : s->p.bf16_flops) / 1e12,
             cfg->fp8_block_rows && s->p.fp8_flops > 0 ? "fp8" : "bf16", sim_weight_bytes(cfg, 0) / 1e9,
             cap / 1e9);
    return 0;
}

static size_t sim_kv_block_bytes(void *ctx, int block_size)
{
    struct sim *s = ctx;
    return (size_t)(sim_kv_token_bytes(&s->cfg) * block_size);
}

static size_t sim_kv_capacity_op(void *ctx)
{
    struct sim *s = ctx;
    return (size_t)sim_kv_capacity(&s->p, &s->cfg);
}

static int sim_kv_init(void *ctx, int n_blocks, int block_size, struct rl_err *err)
{
    struct sim *s = ctx;
    free(s->slots);
    s->slots = calloc((size_t)n_blocks * (size_t)block_size, sizeof *s->slots);
    if (!s->slots)
        return rl_errf(err, RL_ENOMEM, "sim: out of memory for %d KV blocks", n_blocks);
    s->n_blocks = n_blocks;
    s->block_size = block_size;
    return 0;
}

static int sim_kv_copy(void *ctx, int32_t dst, int32_t src, int n_tokens, struct rl_err *err)
{
    struct sim *s = ctx;
    if (dst < 0 || src < 0 || dst >= s->n_blocks || src >= s->n_blocks || n_tokens > s->block_size)
        return rl_errf(err, RL_EBACKEND, "sim: kv_copy %d -> %d out of range", src, dst);
    memcpy(s->slots + (size_t)dst * s->block_size, s->slots + (size_t)src * s->block_size,
           (size_t)n_tokens * sizeof *s->slots);
    return 0;
}

static uint64_t *slot(struct sim *s, const struct be_seq *q, int32_t pos)
{
    int32_t b = q->block_table[pos / s->block_size];
    if (b < 0 || b >= s->n_blocks)
        return NULL;
    return s->slots + (size_t)b * s->block_size + pos % s->block_size;
}

static const float cand_val[4] = {2.0f, 1.0f, 0.5f, 0.0f};

/* Candidate c of the row whose hash is h. */
static int32_t cand_id(const struct sim *s, uint64_t h, int c)
{
    return s->id_lo + (int32_t)(mix(h + (uint64_t)c) % (uint64_t)s->id_n);
}

/* The whole row of hash h into l (vocab floats). */
static void fill_row(const struct sim *s, uint64_t h, float *l)
{
    for (int32_t v = 0; v < s->cfg.vocab; v++)
        l[v] = -1e9f;
    for (int c = 0; c < 4; c++) {
        int32_t id = cand_id(s, h, c);
        if (l[id] < cand_val[c])
            l[id] = cand_val[c];
    }
}

/* The set sample_cands_from_row() gives for fill_row(h), without the row:
 * the distinct candidates by value (an id drawn twice keeps its first,
 * larger, value), then the lowest other ids at -1e9, up to SAMPLE_CANDS. */
static void row_set(const struct sim *s, uint64_t h, struct sample_cands *cs)
{
    memset(cs, 0, sizeof *cs);
    int n = 0;
    for (int c = 0; c < 4; c++) {
        int32_t id = cand_id(s, h, c);
        bool seen = false;
        for (int k = 0; k < n; k++)
            seen |= cs->c[k].id == id;
        if (!seen && n < SAMPLE_CANDS) {
            cs->c[n].z = cand_val[c];
            cs->c[n++].id = id;
        }
    }
    int n_cands = n;
    for (int32_t id = 0; id < s->cfg.vocab && n < SAMPLE_CANDS; id++) {
        bool cand = false;
        for (int k = 0; k < n_cands; k++)
            cand |= cs->c[k].id == id;
        if (!cand) {
            cs->c[n].z = -1e9f;
            cs->c[n++].id = id;
        }
    }
    cs->n = n;
}

static int sim_set_row_wants(void *ctx, uint8_t *wants, int n_rows, struct rl_err *err)
{
    (void)err;
    struct sim *s = ctx;
    s->wants = n_rows > 0 ? wants : NULL;
    s->n_wants = wants ? n_rows : 0;
    return 0;
}

static int sim_set_masks(void *ctx, const uint32_t *const *masks, int n_rows, struct rl_err *err)
{
    (void)err;
    struct sim *s = ctx;
    s->masks = n_rows > 0 ? masks : NULL;
    s->n_masks = masks ? n_rows : 0;
    return 0;
}

static const struct sample_cands *sim_row_cands(void *ctx)
{
    return ((struct sim *)ctx)->cands;
}

static int sim_fetch_row(void *ctx, int row, float *out, struct rl_err *err)
{
    struct sim *s = ctx;
    if (row < 0 || row >= s->n_rows)
        return rl_errf(err, RL_EINVAL, "sim: row %d of %d", row, s->n_rows);
    fill_row(s, s->row_h[row], out);
    return 0;
}

/* A row's "hidden state": values drawn from the row's hash (the row
 * depends on its sequence's tokens, as the model's would), so that the
 * same prompt embeds the same wherever it runs and the fleet's embedding
 * jobs cost what a prefill costs. */
static int sim_hidden(void *ctx, int row, float *out, struct rl_err *err)
{
    struct sim *s = ctx;
    if (row < 0 || row >= s->n_rows)
        return rl_errf(err, RL_EINVAL, "sim: row %d of %d", row, s->n_rows);
    for (int d = 0; d < s->cfg.hidden; d++)
        out[d] = (float)((double)(mix(s->row_h[row] + (uint64_t)d) >> 11) * 0x1p-53 - 0.5);
    return 0;
}

/* What row r of this step is handed back as: a row whose constraint mask
 * the engine gave (set_masks) comes whole, since the sim applies no mask
 * before a set as a device does (the engine masks whole rows itself). */
static uint8_t row_want(const uint8_t *wants, int n_wants, const uint32_t *const *masks,
                        int n_masks, int r)
{
    if (!wants || r >= n_wants || (r < n_masks && masks[r]))
        return BE_ROW_FULL;
    return wants[r];
}

static int sim_forward(void *ctx, const struct be_batch *batch, struct rl_err *err)
{
    struct sim *s = ctx;
    double t0 = now_s();
    double attn = 0, kv = 0;
    int32_t tok = 0, row = 0;
    /* one step's wants and masks; all rows whole unless every row has a want */
    uint8_t *wants = s->wants;
    int n_wants = s->n_wants;
    const uint32_t *const *masks = s->masks;
    int n_masks = s->n_masks;
    s->wants = NULL, s->n_wants = 0, s->masks = NULL, s->n_masks = 0;
    s->n_rows = 0;
    if (wants && n_wants < batch->n_logits) {
        for (int r = 0; r < n_wants; r++)
            wants[r] = BE_ROW_FULL;
        wants = NULL;
    }
    if (batch->n_logits > s->cap_rows) {
        uint64_t *h = realloc(s->row_h, sizeof *h * (size_t)batch->n_logits);
        if (h)
            s->row_h = h;
        struct sample_cands *cs = realloc(s->cands, sizeof *cs * (size_t)batch->n_logits);
        if (cs)
            s->cands = cs;
        if (!h || !cs)
            return rl_errf(err, RL_ENOMEM, "sim: out of memory for %d rows", batch->n_logits);
        s->cap_rows = batch->n_logits;
    }
    for (int i = 0; i < batch->n_seqs; i++) {
        const struct be_seq *q = &batch->seqs[i];
        kv += q->n_past + q->n_new;
        for (int32_t j = 0; j < q->n_new; j++, tok++) {
            int32_t pos = q->n_past + j;
            attn += pos + 1;
            uint64_t prev = 0x5eed0fa11ull;
            if (pos > 0) {
                uint64_t *p = slot(s, q, pos - 1);
                if (!p)
                    return rl_errf(err, RL_EBACKEND, "sim: seq %d: bad block at position %d", i, pos - 1);
                prev = *p;
            }
            uint64_t *h = slot(s, q, pos);
            if (!h)
                return rl_errf(err, RL_EBACKEND, "sim: seq %d: bad block at position %d", i, pos);
            *h = mix(prev ^ mix((uint64_t)(uint32_t)batch->tokens[tok]));
            if (j < q->logits_from)
                continue;
            s->row_h[row] = *h;
            uint8_t w = row_want(wants, n_wants, masks, n_masks, row);
            if (wants)
                wants[row] = w;
            if (w == BE_ROW_FULL) {
                fill_row(s, *h, batch->logits + (size_t)row * (size_t)s->cfg.vocab);
            } else if (w == BE_ROW_ARGMAX || w == BE_ROW_CANDS) {
                row_set(s, *h, &s->cands[row]);
                if (w == BE_ROW_ARGMAX)
                    s->cands[row].n = 1;
            } else {
                return rl_errf(err, RL_EINVAL, "sim: row %d wants %d", row, (int)w);
            }
            row++;
        }
    }
    s->n_rows = row;
    double t = sim_step_seconds(&s->p, &s->cfg, batch->n_tokens, batch->n_logits, attn, kv);
    double end = t0 + t, now = now_s();
    s->modelled_s += t;
    s->n_steps++;
    if (now < end) {
        struct timespec ts = {(time_t)end, (long)((end - floor(end)) * 1e9)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
        s->slept_s += end - now;
    } else {
        s->over_s += now - end; /* the host work alone took longer than the model */
    }
    return 0;
}

static int sim_profile_op(void *ctx, char *out, size_t n)
{
    struct sim *s = ctx;
    int len = snprintf(out, n, "{\"modelled_ms\": %.3f, \"slept_ms\": %.3f, \"over_ms\": %.3f, \"steps\": %lld}",
                       s->modelled_s * 1e3, s->slept_s * 1e3, s->over_s * 1e3, (long long)s->n_steps);
    s->modelled_s = s->slept_s = s->over_s = 0;
    s->n_steps = 0;
    return len < 0 || (size_t)len >= n ? -1 : len;
}

static const char *sim_describe(void *ctx)
{
    return ((struct sim *)ctx)->desc;
}

static void sim_free(void *ctx)
{
    struct sim *s = ctx;
    if (!s)
        return;
    free(s->slots);
    free(s->row_h);
    free(s->cands);
    free(s);
}

static const struct be_ops sim_ops = {
    .name = "sim",
    .load = sim_load,
    .kv_block_bytes = sim_kv_block_bytes,
    .kv_init = sim_kv_init,
    .forward = sim_forward,
    .kv_copy = sim_kv_copy,
    .profile = sim_profile_op,
    .describe = sim_describe,
    .kv_capacity = sim_kv_capacity_op,
    .free = sim_free,
    .set_masks = sim_set_masks,
    .set_row_wants = sim_set_row_wants,
    .row_cands = sim_row_cands,
    .fetch_row = sim_fetch_row,
    .hidden = sim_hidden,
};

int sim_backend_create(struct backend **out, const struct be_options *opt, struct rl_err *err)
{
    *out = NULL;
    struct sim *s = calloc(1, sizeof *s);
    struct backend *be = calloc(1, sizeof *be);
    int rc = -RL_ENOMEM;
    if (!s || !be) {
        rl_errf(err, RL_ENOMEM, "sim: out of memory");
        goto fail;
    }
    if ((rc = sim_profile_get(opt ? opt->sim_profile : NULL, &s->p, err)))
        goto fail;
    snprintf(s->desc, sizeof s->desc, "sim %s", s->p.name);
    be->ops = &sim_ops;
    be->ctx = s;
    *out = be;
    return 0;
fail:
    free(s);
    free(be);
    return rc;
}
