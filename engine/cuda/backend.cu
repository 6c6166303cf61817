/* engine/cuda/backend.cu - the CUDA implementation of engine/backend.h.
 *
 * Same forward pass as engine/cpu/backend.c, on one device and one stream:
 *   embed -> per layer: rmsnorm -> qkv (one fused matrix) -> q/k norm +
 *   rotary + KV write -> attention (decode kernel for 1-token sequences,
 *   prefill kernel for the rest) -> o -> residual add + rmsnorm (fused) ->
 *   gate|up (one fused matrix) -> SwiGLU -> down -> residual add + next norm
 *   -> final norm on the logits rows only -> lm_head (or tied embed).
 * The residual stream is f32; each norm/activation writes the next matrix
 * product's input directly in that matrix's activation dtype (f32 for F32
 * weights, BF16 for BF16 and FP8, F16 for F16).
 *
 * Step metadata (token ids, positions, physical KV slots, block tables,
 * attention work lists) is packed on the host into one page-locked buffer
 * and sent with a single copy; every kernel reads its shapes from there.
 * Decode steps are replayed as CUDA graphs, one per batch-size bucket:
 * sequences are padded to the bucket with dummies that write into one spare
 * KV block (block n_blocks, never handed out), and the buffer layout
 * depends on the bucket only, so a graph captured once stays valid. The
 * only synchronisation in a step is the one before returning, after the
 * logits (or sampled ids) have been copied out.
 *
 * What leaves the device per logits row is what the engine asked for
 * (set_row_wants, issue 25): a greedy row's best entry, another reducible
 * row's 64 best (topk.cu), or the whole row, copied run by run into the
 * engine's page-locked buffer (host_alloc); the rows stay on the device
 * until the next step for fetch_row. The KV pool's size comes from the
 * device (kv_capacity: free memory at the end of load less allowances and
 * kv_reserve_mb, kv_fit.c).
 *
 * Weights are uploaded once in the checkpoint dtype; FP8 stays FP8 (see
 * gemm.cu). The KV pool is f32 for F32 checkpoints (as the CPU does, so the
 * tiny F32 model reproduces the reference) and BF16 otherwise.
 *
 * Threading: one thread drives a backend at a time; the CUDA device is made
 * current at every entry. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.cuh"

extern "C" {
#include "cuda_backend.h"
#include "dtype.h"
#include "quant.h"
#include "cpu/qgemm.h"
#include "cuda/kv_fit.h"
#include "lora.h"
#include "sample.h"
}

#define N_BUCKETS 10        /* graph buckets 1, 2, 4, ... 512 */
#define LOGIT_ROWS_MAX 512  /* lm_head rows per pass; bounds the logits buffer */
#define ROW_PAD 16          /* FP8 cuBLASLt rounds M up to 16 */

struct cu_layer {
    float *attn_norm, *mlp_norm; /* (hidden) */
    float *q_norm, *k_norm;      /* (head_dim) */
    struct cu_linear qkv;        /* (n_heads + 2 n_kv) * head_dim outputs */
    struct cu_linear o;          /* hidden outputs */
    struct cu_linear gu;         /* 2 * intermediate outputs: gate | up */
    struct cu_linear down;       /* hidden outputs */
};

struct cu_graph {
    int B;      /* bucket: sequences (= tokens) per step, 0 = not captured */
    int nsplit; /* attention splits it was captured with */
    cudaGraphExec_t exec;
};

/* Pointers into the step-metadata buffer (host or device copy). */
struct meta_view {
    int32_t *tokens, *pos, *seq, *slot; /* (capT) */
    int32_t *dec;                       /* (capT) */
    int32_t *lslot;                     /* (capT) each token row's be_seq.lora, 0 padding */
    int32_t *lrow;                      /* (capL) token rows for lm_head, wanted ones first */
    int32_t *tile_seq, *tile_r0;        /* (capTiles) */
    int32_t *seq_tok0, *seq_nnew, *seq_npast, *seq_bt_off; /* (capS) */
    int32_t *bt;                        /* the block tables, concatenated */
};

struct meta_caps {
    int T, S, tiles, L;
};

struct step {
    int T, n_dec, nsplit, n_tiles, n_lrows;
    int lora;                           /* some row runs with an adapter */
    struct meta_view d;
};

struct cuda_ctx {
    int device, sm_count, cc_major, cc_minor;
    char dev_name[96];
    cudaStream_t st;
    struct cu_gemm *gemm;
    enum be_kv_dtype kv_req, kv_dtype;
    be_progress_fn progress;   /* load progress, once per layer; may be NULL */
    void *progress_user;
    struct model_config cfg;
    int loaded;

    void **allocs; /* device weight allocations, freed together */
    int n_allocs, cap_allocs;
    struct cu_layer *layers; /* (n_layers) */
    struct cu_mat embed;     /* (vocab, hidden) */
    struct cu_linear lm_head;/* (vocab) outputs; its matrix is embed when tied */
    float *final_norm;       /* (hidden) */
    float *inv_freq;         /* (head_dim / 2) */
    float mscale;

    int max_tokens, rows;    /* rows = max_tokens + ROW_PAD */
    int logit_rows;          /* lm_head rows per pass */
    float *x;                /* (rows, hidden) residual stream */
    float *qkv;              /* (rows, (n_heads + 2 n_kv) head_dim) */
    float *tmp;              /* (rows, hidden) o / down outputs */
    float *gu;               /* (rows, 2 intermediate) */
    float *att;              /* (rows, n_heads head_dim) attention output */
    void *xin;               /* (rows, max(hidden, q_dim, inter)) matrix input, any act type */
    void *q;                 /* (rows, n_heads, head_dim) rotated q in the KV type */
    float *logits;           /* (logit_rows + ROW_PAD, vocab) */
    float *part_ml, *part_acc; /* attention split partials: (part_cap, n_heads, 2 | head_dim) */
    int part_cap;
    int32_t *ids_d, *ids_h;  /* (max_tokens) sampled ids, device and pinned host */
    int n_ids;
    /* be_batch.masks of this step, packed: n_masked row ids, then their
     * masks; allocated on the first constrained step for max_tokens rows */
    int32_t *mrows_d;        /* (max_tokens) */
    uint32_t *masks_d;       /* (max_tokens, (vocab + 31) / 32) */
    void *mask_h;            /* pinned: rows (max_tokens int32), then masks */
    int n_masked;
    const uint32_t *const *set_m; /* set_masks(): the next forward's, or NULL */
    int set_n;

    int n_blocks, block_size; /* pool holds n_blocks + 1 blocks: the last is the graphs' spare */
    void *kc, *vc;            /* (n_layers, n_blocks + 1, n_kv, block_size, head_dim) */
    size_t layer_elems;
    int ctx_max, seq_max;

    int32_t *meta_h, *meta_d; /* step metadata, pinned host and device */
    size_t meta_cap;          /* int32 elements */

    struct cu_graph graphs[2 * N_BUCKETS]; /* per bucket: without, then with LoRA deltas */
    int use_graphs, device_argmax, gemm_path, attn_variant;
    struct cu_prof *prof; /* NULL unless the benchmark asked (eager steps only) */
    size_t kv_reserve;        /* be_options.kv_reserve_bytes */
    /* per-row wants (set_row_wants, issue 25): the next forward's, or NULL */
    uint8_t *wants;
    int n_wants;
    int32_t *wrows_h, *wrows_d;        /* (max_tokens) argmax rows, then cands rows: pinned, device */
    struct sample_cands *cands_d, *cands_h; /* (logit_rows) per logits row: device, pinned */
    int last_rows;                     /* logits rows of the last forward still in c->logits (fetch_row) */
    const int32_t *last_lrow_d;        /* the last forward's token row of each logits row (in meta_d) */
    int last_hidden;                   /* logits rows cuda_hidden can serve: their x rows hold the full residual */
    float *hid_d;                      /* (hidden) one final-normed row in f32 (cuda_hidden) */
    /* LoRA adapters (lora.cu): the device table of every slot's matrices,
     * the rank-wide scratch between the two kernels (both allocated at the
     * first adapter, at fixed addresses the graphs keep), and each slot's
     * own allocation */
    struct cu_lora_ent *lora_tab_d;    /* ((LORA_MAX_ADAPTERS + 1) * n_layers * CU_LORA_PROJ) */
    float *lora_tmp;                   /* (rows, 3, CU_LORA_MAX_RANK) */
    void *lora_mem[LORA_MAX_ADAPTERS + 1];
    struct kv_fit_out fit;    /* the pool the device holds, from load (fit_kv) */
    char desc[256];
};

static int cuda_load(void *ctx, const struct model_config *cfg, const struct model_weights *w, int max_tokens,
                     struct rl_err *err);
static size_t cuda_kv_block_bytes(void *ctx, int block_size);
static int cuda_kv_init(void *ctx, int n_blocks, int block_size, struct rl_err *err);
static int cuda_forward(void *ctx, const struct be_batch *b, struct rl_err *err);
static int cuda_kv_copy(void *ctx, int32_t dst, int32_t src, int n_tokens, struct rl_err *err);
static const char *cuda_describe(void *ctx);
static void cuda_free(void *ctx);
static int cuda_set_masks(void *ctx, const uint32_t *const *masks, int n_rows, struct rl_err *err);
static size_t cuda_kv_capacity(void *ctx);
static int cuda_set_row_wants(void *ctx, uint8_t *wants, int n_rows, struct rl_err *err);
static const struct sample_cands *cuda_row_cands(void *ctx);
static int cuda_fetch_row(void *ctx, int row, float *out, struct rl_err *err);
static void *cuda_host_alloc_op(void *ctx, size_t bytes);
static void cuda_host_free_op(void *ctx, void *p);
static int cuda_hidden(void *ctx, int row, float *out, struct rl_err *err);
static int cuda_lora_set(void *ctx, int slot, const struct lora_adapter *a, struct rl_err *err);

static const struct be_ops cuda_ops = {
    "cuda",
    cuda_load,
    cuda_kv_block_bytes,
    cuda_kv_init,
    cuda_forward,
    cuda_kv_copy,
    NULL, /* profile: not yet; nvprof / nsys see inside a step */
    cuda_describe,
    cuda_free,
    cuda_set_masks,
    cuda_kv_capacity,
    cuda_set_row_wants,
    cuda_row_cands,
    cuda_fetch_row,
    cuda_host_alloc_op,
    cuda_host_free_op,
    cuda_hidden,
    cuda_lora_set,
};

/* ---- allocation ---- */

static int dev_alloc(struct cuda_ctx *c, void **p, size_t bytes, struct rl_err *err)
{
    *p = NULL;
    if (c->n_allocs == c->cap_allocs) {
        int n = c->cap_allocs ? 2 * c->cap_allocs : 64;
        void **a = (void **)realloc(c->allocs, (size_t)n * sizeof *a);
        if (!a)
            return rl_errf(err, RL_ENOMEM, "out of memory");
        c->allocs = a;
        c->cap_allocs = n;
    }
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess)
        return rl_errf(err, RL_ENOMEM, "cudaMalloc(%zu bytes): %s (cudaError %d)", bytes, cudaGetErrorString(e),
                       (int)e);
    c->allocs[c->n_allocs++] = *p;
    return 0;
}

static void graphs_reset(struct cuda_ctx *c)
{
    for (int i = 0; i < 2 * N_BUCKETS; i++) {
        if (c->graphs[i].exec)
            cudaGraphExecDestroy(c->graphs[i].exec);
        memset(&c->graphs[i], 0, sizeof c->graphs[i]);
    }
}

static void free_weights(struct cuda_ctx *c)
{
    graphs_reset(c);
    for (int i = 0; i < c->n_allocs; i++)
        cudaFree(c->allocs[i]);
    c->n_allocs = 0;
    free(c->layers);
    c->layers = NULL;
    cu_gemm_free(c->gemm);
    c->gemm = NULL;
    if (c->ids_h)
        cudaFreeHost(c->ids_h);
    c->ids_h = NULL;
    if (c->mask_h)
        cudaFreeHost(c->mask_h);
    c->mask_h = NULL;
    if (c->wrows_h)
        cudaFreeHost(c->wrows_h);
    if (c->cands_h)
        cudaFreeHost(c->cands_h);
    c->wrows_h = NULL;
    c->cands_h = NULL;
    c->wrows_d = NULL; /* in allocs */
    c->cands_d = NULL;
    c->last_rows = 0;
    c->mrows_d = NULL; /* in allocs: freed above */
    c->masks_d = NULL;
    c->loaded = 0;
}

static void free_kv(struct cuda_ctx *c)
{
    graphs_reset(c);
    cudaFree(c->kc);
    cudaFree(c->vc);
    c->kc = c->vc = NULL;
    c->n_blocks = 0;
}

static size_t dt_size(enum model_dtype dt)
{
    return dt == MODEL_F32 ? 4 : dt == MODEL_F8_E4M3 ? 1 : 2;
}

static size_t kv_esize(const struct cuda_ctx *c) { return c->kv_dtype == BE_KV_F32 ? 4 : 2; }

/* ---- the KV pool the device holds ---- */

#define GRAPH_ALLOWANCE ((size_t)64 << 20) /* N_BUCKETS graph executables */
#define META_ALLOWANCE ((size_t)32 << 20)  /* step metadata growth (block tables) */
#define SPARE_TOKENS 256                   /* the graphs' spare block, for block sizes up to 256 */

static size_t kv_token_bytes(const struct cuda_ctx *c)
{
    return 2 * (size_t)c->cfg.n_layers * (size_t)c->cfg.n_kv_heads * (size_t)c->cfg.head_dim * kv_esize(c);
}

/* At the end of load, with weights, activations, cuBLASLt's workspace and
 * the quantized panel allocated: what the device still has free, less what
 * is allocated later (graph executables, the constraint masks' buffers on
 * the first constrained step, metadata growth) and the reserve, in whole
 * tokens (kv_capacity does not know the engine's block size; the spare
 * block the pool adds is covered by SPARE_TOKENS). A device that cannot hold
 * one step's token budget fails the load here, with the figures, rather
 * than at kv_init or mid-request. */
static int fit_kv(struct cuda_ctx *c, struct rl_err *err)
{
    size_t free_b = 0, total_b = 0;
    CU_CHECK(err, cudaMemGetInfo(&free_b, &total_b));
    size_t W = ((size_t)c->cfg.vocab + 31) / 32, cap = (size_t)c->max_tokens;
    size_t pending = GRAPH_ALLOWANCE + META_ALLOWANCE + (c->mask_h ? 0 : cap * 4 + cap * W * 4);
    struct kv_fit_in in = {c->dev_name, total_b, free_b, pending, c->kv_reserve, kv_token_bytes(c), 1,
                           SPARE_TOKENS, (long)c->max_tokens};
    return kv_fit_compute(&in, &c->fit, err);
}

static size_t cuda_kv_capacity(void *ctx)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    return c->loaded ? c->fit.bytes : 0;
}

/* ---- weights from a checkpoint ---- */

static int vec_upload(struct cuda_ctx *c, float **out, const struct model_tensor *t, struct rl_err *err)
{
    int n = (int)t->cols;
    float *h = (float *)malloc((size_t)n * sizeof *h);
    if (!h)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const char *p = (const char *)t->data;
        uint16_t u;
        switch (t->dtype) {
        case MODEL_F32: memcpy(&h[i], p + 4 * (size_t)i, 4); break;
        case MODEL_BF16: memcpy(&u, p + 2 * (size_t)i, 2); h[i] = bf16_to_f32(u); break;
        case MODEL_F16: memcpy(&u, p + 2 * (size_t)i, 2); h[i] = f16_to_f32(u); break;
        case MODEL_F8_E4M3: h[i] = f8e4m3_to_f32((uint8_t)p[i]); break;
        }
    }
    int rc = dev_alloc(c, (void **)out, (size_t)n * 4, err);
    if (!rc) {
        cudaError_t e = cudaMemcpy(*out, h, (size_t)n * 4, cudaMemcpyHostToDevice);
        if (e != cudaSuccess)
            rc = rl_errf(err, RL_EBACKEND, "cudaMemcpy(%s): %s", t->name, cudaGetErrorString(e));
    }
    free(h);
    return rc;
}

/* Device bytes of a checkpoint matrix (quantized: the CPU's NATIVE rows). */
static size_t mat_dev_bytes(const struct model_tensor *t)
{
    if (quant_is_quantized(t->dtype))
        return cpu_q_row_bytes(t->dtype, (int)t->cols, t->dtype == MODEL_AWQ4 ? t->awq_group : 0) * (size_t)t->rows;
    return (size_t)t->rows * (size_t)t->cols * dt_size(t->dtype);
}

/* Stacks n tensors (same dtype and cols) into one device matrix, or keeps
 * them apart when FP8 block rows would not line up. */
static int lin_upload(struct cuda_ctx *c, struct cu_linear *l, const struct model_tensor *const *ts, int n,
                      struct rl_err *err)
{
    const struct model_config *cfg = &c->cfg;
    memset(l, 0, sizeof *l);
    enum model_dtype dt = ts[0]->dtype;
    int cols = (int)ts[0]->cols, fuse = 1, rows = 0;
    for (int i = 0; i < n; i++) {
        if (ts[i]->dtype != dt || ts[i]->cols != cols)
            fuse = 0;
        if (dt == MODEL_F8_E4M3 && i < n - 1 && ts[i]->rows % cfg->fp8_block_rows)
            fuse = 0;
        rows += (int)ts[i]->rows;
    }
    l->rows = rows;
    int groups = fuse ? 1 : n;
    for (int gi = 0, r0 = 0; gi < groups; gi++) {
        int first = fuse ? 0 : gi, last = fuse ? n - 1 : gi;
        struct cu_mat *m = &l->m[gi];
        int mrows = 0;
        for (int i = first; i <= last; i++)
            mrows += (int)ts[i]->rows;
        m->dt = ts[first]->dtype;
        m->rows = mrows;
        m->cols = (int)ts[first]->cols;
        l->off[gi] = r0;
        r0 += mrows;
        if (m->dt == MODEL_AWQ4) {
            m->group = ts[first]->awq_group;
            for (int i = first; i <= last; i++) /* stacked only with the same group */
                if (ts[i]->awq_group != m->group)
                    return rl_errf(err, RL_EUNSUPPORTED, "cuda backend: %s and %s have different AWQ groups",
                                   ts[first]->name, ts[i]->name);
        }
        size_t bytes = 0;
        for (int i = first; i <= last; i++)
            bytes += mat_dev_bytes(ts[i]);
        int rc = dev_alloc(c, &m->w, bytes, err);
        if (rc)
            return rc;
        size_t at = 0;
        for (int i = first; i <= last; i++) {
            size_t b = mat_dev_bytes(ts[i]);
            const void *src = ts[i]->data;
            void *conv = NULL;
            if (ts[i]->dtype == MODEL_AWQ4) { /* AutoAWQ's transposed packing into rows */
                if (!(conv = malloc(b)))
                    return rl_errf(err, RL_ENOMEM, "out of memory converting %s", ts[i]->name);
                cpu_q_awq_convert(ts[i], conv);
                src = conv;
            }
            cudaError_t e = cudaMemcpy((char *)m->w + at, src, b, cudaMemcpyHostToDevice);
            free(conv);
            if (e != cudaSuccess)
                return rl_errf(err, RL_EBACKEND, "cudaMemcpy(%s): %s", ts[i]->name, cudaGetErrorString(e));
            at += b;
        }
        if (m->dt == MODEL_F8_E4M3) {
            m->br = cfg->fp8_block_rows;
            m->bc = cfg->fp8_block_cols;
            int nkb = (m->cols + m->bc - 1) / m->bc;
            m->scale_ld = (nkb + 3) / 4 * 4;
            int nrb = (mrows + m->br - 1) / m->br;
            float *h = (float *)calloc((size_t)nrb * (size_t)m->scale_ld, sizeof *h);
            if (!h)
                return rl_errf(err, RL_ENOMEM, "out of memory");
            int rb0 = 0;
            for (int i = first; i <= last; i++) {
                int prb = ((int)ts[i]->rows + m->br - 1) / m->br;
                for (int rb = 0; rb < prb; rb++)
                    memcpy(h + (size_t)(rb0 + rb) * (size_t)m->scale_ld, ts[i]->scale_f32 + (size_t)rb * (size_t)nkb,
                           (size_t)nkb * 4);
                rb0 += prb;
            }
            rc = dev_alloc(c, (void **)&m->scale, (size_t)nrb * (size_t)m->scale_ld * 4, err);
            if (!rc) {
                cudaError_t e = cudaMemcpy(m->scale, h, (size_t)nrb * (size_t)m->scale_ld * 4, cudaMemcpyHostToDevice);
                if (e != cudaSuccess)
                    rc = rl_errf(err, RL_EBACKEND, "cudaMemcpy(scales of %s): %s", ts[first]->name,
                                 cudaGetErrorString(e));
            }
            free(h);
            if (rc)
                return rc;
        }
    }
    l->n = groups;
    return 0;
}

static int mat_upload(struct cuda_ctx *c, struct cu_mat *m, const struct model_tensor *t, struct rl_err *err)
{
    struct cu_linear l;
    const struct model_tensor *ts[1] = {t};
    int rc = lin_upload(c, &l, ts, 1, err);
    if (!rc)
        *m = l.m[0];
    return rc;
}

static int check_config(const struct cuda_ctx *c, const struct model_config *cfg, int max_tokens, struct rl_err *err)
{
    if (max_tokens < 1)
        return rl_errf(err, RL_EINVAL, "cuda backend: max_tokens must be >= 1");
    if (cfg->n_kv_heads < 1 || cfg->n_heads % cfg->n_kv_heads)
        return rl_errf(err, RL_EINVAL, "cuda backend: %d heads over %d KV heads", cfg->n_heads, cfg->n_kv_heads);
    if (!cu_attn_supports(cfg->head_dim, cfg->n_heads / cfg->n_kv_heads))
        return rl_errf(err, RL_EUNSUPPORTED,
                       "cuda backend: head_dim %d / GQA group %d not built (head_dim 32, 64, 128, 256; group <= %d)",
                       cfg->head_dim, cfg->n_heads / cfg->n_kv_heads, CU_ATTN_MAXG);
    if (cfg->fp8_block_rows && (cfg->fp8_block_cols % 16 || cfg->hidden % 16 || cfg->intermediate % 16 ||
                                (cfg->n_heads * cfg->head_dim) % 16))
        return rl_errf(err, RL_EUNSUPPORTED, "cuda backend: FP8 needs 16-multiple block columns and matrix widths");
    return 0;
}

/* Which kernel each BF16/F16 decode product runs (gemm.cu's
 * cu_gemm_tune): measured once per shape at load on every layer's copy of
 * the matrix, before any graph is captured. */
static int tune_products(struct cuda_ctx *c, struct rl_err *err)
{
    int L = c->cfg.n_layers, rc = 0;
    const struct cu_mat **ms = (const struct cu_mat **)calloc((size_t)(L > 1 ? L : 1), sizeof *ms);
    if (!ms)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    for (int kind = 0; kind < 4 && !rc; kind++)
        for (int part = 0; part < 3 && !rc; part++) {
            int n = 0;
            for (int l = 0; l < L; l++) {
                const struct cu_layer *Ly = &c->layers[l];
                const struct cu_linear *lin = kind == 0 ? &Ly->qkv : kind == 1 ? &Ly->o : kind == 2 ? &Ly->gu : &Ly->down;
                if (part < lin->n)
                    ms[n++] = &lin->m[part];
            }
            if (n)
                rc = cu_gemm_tune(c->gemm, ms, n, err);
        }
    free(ms);
    if (rc)
        return rc;
    const struct cu_mat *head = &c->lm_head.m[0];
    return cu_gemm_tune(c->gemm, &head, 1, err);
}

/* Activations, rotary table and the gemm context: shared by both loads. */
static int alloc_common(struct cuda_ctx *c, int max_tokens, struct rl_err *err)
{
    const struct model_config *cfg = &c->cfg;
    int rc;
    size_t H = (size_t)cfg->hidden, I = (size_t)cfg->intermediate, V = (size_t)cfg->vocab;
    size_t Q = (size_t)cfg->n_heads * (size_t)cfg->head_dim, KV = (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim;
    size_t widest = H > Q ? H : Q;
    if (I > widest)
        widest = I;
    c->max_tokens = max_tokens;
    c->rows = max_tokens + ROW_PAD;
    c->logit_rows = max_tokens < LOGIT_ROWS_MAX ? max_tokens : LOGIT_ROWS_MAX;
    size_t R = (size_t)c->rows;
    size_t kvs = c->kv_dtype == BE_KV_F32 ? 4 : 2;
    c->part_cap = 4 * c->sm_count / cfg->n_kv_heads + 64;
    if ((rc = dev_alloc(c, (void **)&c->x, R * H * 4, err)) || (rc = dev_alloc(c, (void **)&c->qkv, R * (Q + 2 * KV) * 4, err)) ||
        (rc = dev_alloc(c, (void **)&c->tmp, R * H * 4, err)) || (rc = dev_alloc(c, (void **)&c->gu, R * 2 * I * 4, err)) ||
        (rc = dev_alloc(c, (void **)&c->att, R * Q * 4, err)) || (rc = dev_alloc(c, &c->xin, R * widest * 4, err)) ||
        (rc = dev_alloc(c, &c->q, R * Q * kvs, err)) ||
        (rc = dev_alloc(c, (void **)&c->logits, ((size_t)c->logit_rows + ROW_PAD) * V * 4, err)) ||
        (rc = dev_alloc(c, (void **)&c->part_ml, (size_t)c->part_cap * (size_t)cfg->n_heads * 2 * 4, err)) ||
        (rc = dev_alloc(c, (void **)&c->part_acc, (size_t)c->part_cap * Q * 4, err)) ||
        (rc = dev_alloc(c, (void **)&c->ids_d, (size_t)max_tokens * 4, err)) ||
        (rc = dev_alloc(c, (void **)&c->inv_freq, (size_t)cfg->head_dim / 2 * 4, err)) ||
        (rc = dev_alloc(c, (void **)&c->wrows_d, (size_t)max_tokens * 4, err)) ||
        (rc = dev_alloc(c, (void **)&c->cands_d, (size_t)c->logit_rows * sizeof(struct sample_cands), err)) ||
        (rc = dev_alloc(c, (void **)&c->hid_d, H * 4, err)))
        return rc;
    CU_CHECK(err, cudaHostAlloc((void **)&c->ids_h, (size_t)max_tokens * 4, cudaHostAllocDefault));
    CU_CHECK(err, cudaHostAlloc((void **)&c->wrows_h, (size_t)max_tokens * 4, cudaHostAllocDefault));
    CU_CHECK(err, cudaHostAlloc((void **)&c->cands_h, (size_t)c->logit_rows * sizeof(struct sample_cands),
                                cudaHostAllocDefault));
    float fr[512];
    model_rope_inv_freq(cfg, fr, &c->mscale);
    CU_CHECK(err, cudaMemcpy(c->inv_freq, fr, (size_t)cfg->head_dim / 2 * 4, cudaMemcpyHostToDevice));
    if ((rc = cu_gemm_create(&c->gemm, c->rows, (int)widest, c->cc_major, c->st, err)))
        return rc;
    if (c->gemm_path)
        cu_gemm_force(c->gemm, (enum cu_gemm_path)c->gemm_path);
    return cu_attn_init(err);
}

/* The quantized formats (engine/quant.h: GGUF Q8_0 / K-quants, AWQ INT4)
 * run on qgemm.cu's kernels in shapes whose rows are whole blocks (and,
 * for the 8-element steps of those kernels, cols a multiple of 8); others
 * are refused by name rather than uploaded and misread. Returns the widest
 * quantized matrix's cols through *qcols (0: none), for the prefill panel. */
static int check_quantized(const struct model_weights *w, int *qcols, struct rl_err *err)
{
    *qcols = 0;
    const struct model_tensor *ts[3] = {&w->embed, &w->lm_head, &w->final_norm};
    for (int l = -1; l < w->n_layers; l++) {
        const struct model_tensor *ms[7];
        int n = 3;
        if (l < 0) {
            memcpy(ms, ts, sizeof ts);
        } else {
            const struct model_layer *L = &w->layers[l];
            const struct model_tensor *ls[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
            memcpy(ms, ls, sizeof ls);
            n = 7;
        }
        for (int i = 0; i < n; i++) {
            const struct model_tensor *t = ms[i];
            if (!quant_is_quantized(t->dtype))
                continue;
            if (t->rows == 1 || !cpu_q_supported(t->dtype, (int)t->rows, (int)t->cols,
                                                 t->dtype == MODEL_AWQ4 ? t->awq_group : 0) || t->cols % 8)
                return rl_errf(err, RL_EUNSUPPORTED, "cuda backend: tensor \"%s\" (%s, %lld x %lld) has no CUDA kernel",
                               t->name, model_dtype_name(t->dtype), (long long)t->rows, (long long)t->cols);
            if ((int)t->cols > *qcols)
                *qcols = (int)t->cols;
        }
    }
    return 0;
}


static int cuda_load(void *ctx, const struct model_config *cfg, const struct model_weights *w, int max_tokens,
                     struct rl_err *err)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    size_t pg_head = 0, pg_layer = 0, pg_total = 0; /* load progress, checkpoint bytes */
    int rc = check_config(c, cfg, max_tokens, err);
    if (rc)
        return rc;
    int qcols;
    if ((rc = check_quantized(w, &qcols, err)))
        return rc;
    CU_CHECK(err, cudaSetDevice(c->device));
    free_kv(c);
    free_weights(c);
    c->cfg = *cfg;
    c->kv_dtype = c->kv_req != BE_KV_AUTO ? c->kv_req
                  : cfg->dtype == MODEL_F32 && w->layers[0].wq.dtype == MODEL_F32 ? BE_KV_F32
                                                                         : BE_KV_BF16;
    c->layers = (struct cu_layer *)calloc((size_t)cfg->n_layers, sizeof *c->layers);
    if (!c->layers)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    if ((rc = mat_upload(c, &c->embed, &w->embed, err)))
        goto fail;
    if (cfg->tied) {
        memset(&c->lm_head, 0, sizeof c->lm_head);
        c->lm_head.n = 1;
        c->lm_head.m[0] = c->embed;
        c->lm_head.rows = c->embed.rows;
    } else {
        const struct model_tensor *ts[1] = {&w->lm_head};
        if ((rc = lin_upload(c, &c->lm_head, ts, 1, err)))
            goto fail;
    }
    if ((rc = vec_upload(c, &c->final_norm, &w->final_norm, err)))
        goto fail;
    /* progress in checkpoint bytes: the embedding (and lm_head), then a layer at a time */
    {
        const struct model_tensor *hs[2] = {&w->embed, cfg->tied ? NULL : &w->lm_head};
        const struct model_layer *S = &w->layers[0];
        const struct model_tensor *ls[7] = {&S->wq, &S->wk, &S->wv, &S->wo, &S->w_gate, &S->w_up, &S->w_down};
        for (int i = 0; i < 9; i++) {
            const struct model_tensor *t = i < 2 ? hs[i] : ls[i - 2];
            size_t b = t ? mat_dev_bytes(t) : 0;
            *(i < 2 ? &pg_head : &pg_layer) += b;
        }
    }
    pg_total = pg_head + pg_layer * (size_t)cfg->n_layers;
    if (c->progress)
        c->progress(c->progress_user, pg_head, pg_total);
    for (int l = 0; l < cfg->n_layers; l++) {
        const struct model_layer *S = &w->layers[l];
        struct cu_layer *L = &c->layers[l];
        if (c->progress && l)
            c->progress(c->progress_user, pg_head + pg_layer * (size_t)l, pg_total);
        const struct model_tensor *qkv[3] = {&S->wq, &S->wk, &S->wv}, *o[1] = {&S->wo};
        const struct model_tensor *gu[2] = {&S->w_gate, &S->w_up}, *dn[1] = {&S->w_down};
        if ((rc = vec_upload(c, &L->attn_norm, &S->attn_norm, err)) || (rc = vec_upload(c, &L->mlp_norm, &S->mlp_norm, err)) ||
            (rc = vec_upload(c, &L->q_norm, &S->q_norm, err)) || (rc = vec_upload(c, &L->k_norm, &S->k_norm, err)) ||
            (rc = lin_upload(c, &L->qkv, qkv, 3, err)) || (rc = lin_upload(c, &L->o, o, 1, err)) ||
            (rc = lin_upload(c, &L->gu, gu, 2, err)) || (rc = lin_upload(c, &L->down, dn, 1, err)))
            goto fail;
    }
    if ((rc = alloc_common(c, max_tokens, err)))
        goto fail;
    /* the prefill panel of the quantized products: up to 2048 rows of the
     * widest one (prefill's cuBLASLt products then run in a few chunks) */
    if (qcols && (rc = cu_gemm_reserve_dequant(c->gemm, (size_t)2048 * (size_t)qcols * 2, err)))
        goto fail;
    if ((rc = fit_kv(c, err)) || (rc = tune_products(c, err)))
        goto fail;
    if (c->progress)
        c->progress(c->progress_user, pg_total, pg_total);
    c->loaded = 1;
    return 0;
fail:
    free_weights(c);
    return rl_err_wrap(err, "cuda backend load");
}

/* ---- random weights (benchmark) ---- */

static int rand_mat(struct cuda_ctx *c, struct cu_mat *m, enum model_dtype dt, int rows, int cols, uint64_t seed,
                    struct rl_err *err)
{
    memset(m, 0, sizeof *m);
    m->dt = dt;
    m->rows = rows;
    m->cols = cols;
    int rc = dev_alloc(c, &m->w, (size_t)rows * (size_t)cols * dt_size(dt), err);
    if (rc)
        return rc;
    float amp = 1.7f / sqrtf((float)cols); /* unit-variance outputs for unit-variance inputs */
    if (dt == MODEL_F8_E4M3) {
        m->br = m->bc = 128;
        int nkb = (cols + 127) / 128, nrb = (rows + 127) / 128;
        m->scale_ld = (nkb + 3) / 4 * 4;
        if ((rc = dev_alloc(c, (void **)&m->scale, (size_t)nrb * (size_t)m->scale_ld * 4, err)) ||
            (rc = cu_fill_random(m->w, (size_t)rows * (size_t)cols, dt, 1.0f, seed, c->st, err)) ||
            (rc = cu_fill_const(m->scale, (size_t)nrb * (size_t)m->scale_ld, amp, c->st, err)))
            return rc;
        return 0;
    }
    return cu_fill_random(m->w, (size_t)rows * (size_t)cols, dt, amp, seed, c->st, err);
}

static int rand_lin(struct cuda_ctx *c, struct cu_linear *l, enum model_dtype dt, int rows, int cols, uint64_t seed,
                    struct rl_err *err)
{
    memset(l, 0, sizeof *l);
    l->n = 1;
    l->rows = rows;
    return rand_mat(c, &l->m[0], dt, rows, cols, seed, err);
}

static int ones(struct cuda_ctx *c, float **p, int n, struct rl_err *err)
{
    int rc = dev_alloc(c, (void **)p, (size_t)n * 4, err);
    return rc ? rc : cu_fill_const(*p, (size_t)n, 1.0f, c->st, err);
}

extern "C" int cuda_backend_load_random(struct backend *be, const struct model_config *cfg, enum model_dtype wdt,
                                        int max_tokens, uint64_t seed, struct rl_err *err)
{
    if (!be || be->ops != &cuda_ops)
        return rl_errf(err, RL_EINVAL, "cuda_backend_load_random: not a cuda backend");
    if (wdt != MODEL_BF16 && wdt != MODEL_F8_E4M3)
        return rl_errf(err, RL_EINVAL, "cuda_backend_load_random: dtype %s (bf16 or fp8)", model_dtype_name(wdt));
    struct cuda_ctx *c = (struct cuda_ctx *)be->ctx;
    struct model_config cf = *cfg;
    if (wdt == MODEL_F8_E4M3)
        cf.fp8_block_rows = cf.fp8_block_cols = 128;
    cf.dtype = MODEL_BF16;
    int rc = check_config(c, &cf, max_tokens, err);
    if (rc)
        return rc;
    CU_CHECK(err, cudaSetDevice(c->device));
    free_kv(c);
    free_weights(c);
    c->cfg = cf;
    c->kv_dtype = c->kv_req == BE_KV_F32 ? BE_KV_F32 : BE_KV_BF16;
    int H = cf.hidden, I = cf.intermediate, Q = cf.n_heads * cf.head_dim, KV = cf.n_kv_heads * cf.head_dim;
    c->layers = (struct cu_layer *)calloc((size_t)cf.n_layers, sizeof *c->layers);
    if (!c->layers)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    uint64_t s = seed * 1000003u;
    if ((rc = rand_mat(c, &c->embed, MODEL_BF16, cf.vocab, H, s++, err)) || (rc = ones(c, &c->final_norm, H, err)))
        goto fail;
    if (cf.tied) {
        memset(&c->lm_head, 0, sizeof c->lm_head);
        c->lm_head.n = 1;
        c->lm_head.m[0] = c->embed;
        c->lm_head.rows = cf.vocab;
    } else if ((rc = rand_lin(c, &c->lm_head, MODEL_BF16, cf.vocab, H, s++, err))) {
        goto fail;
    }
    for (int l = 0; l < cf.n_layers; l++) {
        struct cu_layer *L = &c->layers[l];
        if ((rc = ones(c, &L->attn_norm, H, err)) || (rc = ones(c, &L->mlp_norm, H, err)) ||
            (rc = ones(c, &L->q_norm, cf.head_dim, err)) || (rc = ones(c, &L->k_norm, cf.head_dim, err)) ||
            (rc = rand_lin(c, &L->qkv, wdt, Q + 2 * KV, H, s++, err)) || (rc = rand_lin(c, &L->o, wdt, H, Q, s++, err)) ||
            (rc = rand_lin(c, &L->gu, wdt, 2 * I, H, s++, err)) || (rc = rand_lin(c, &L->down, wdt, H, I, s++, err)))
            goto fail;
    }
    if ((rc = alloc_common(c, max_tokens, err)))
        goto fail;
    CU_CHECK(err, cudaStreamSynchronize(c->st));
    if ((rc = fit_kv(c, err)) || (rc = tune_products(c, err)))
        goto fail;
    c->loaded = 1;
    return 0;
fail:
    free_weights(c);
    return rl_err_wrap(err, "cuda backend random load");
}

/* ---- KV pool ---- */

static size_t cuda_kv_block_bytes(void *ctx, int block_size)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    return 2 * (size_t)c->cfg.n_layers * (size_t)c->cfg.n_kv_heads * (size_t)c->cfg.head_dim * (size_t)block_size *
           kv_esize(c);
}

static int cuda_kv_init(void *ctx, int n_blocks, int block_size, struct rl_err *err)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!c->loaded)
        return rl_errf(err, RL_EINVAL, "cuda backend: kv_init before load");
    if (n_blocks < 1 || block_size < 1)
        return rl_errf(err, RL_EINVAL, "cuda backend: kv pool needs n_blocks >= 1 and block_size >= 1");
    CU_CHECK(err, cudaSetDevice(c->device));
    free_kv(c);
    c->layer_elems = (size_t)(n_blocks + 1) * (size_t)c->cfg.n_kv_heads * (size_t)block_size * (size_t)c->cfg.head_dim;
    size_t bytes = c->layer_elems * (size_t)c->cfg.n_layers * kv_esize(c);
    cudaError_t e1 = cudaMalloc(&c->kc, bytes), e2 = e1 == cudaSuccess ? cudaMalloc(&c->vc, bytes) : e1;
    if (e1 != cudaSuccess || e2 != cudaSuccess) {
        free_kv(c);
        return rl_errf(err, RL_ENOMEM, "cuda backend: cannot allocate 2 x %zu bytes of KV cache: %s", bytes,
                       cudaGetErrorString(e1 != cudaSuccess ? e1 : e2));
    }
    /* Zeroed like the CPU's calloc: no kernel reads an unwritten slot, but
     * a stray read then sees zeros, not NaN garbage. */
    CU_CHECK(err, cudaMemsetAsync(c->kc, 0, bytes, c->st));
    CU_CHECK(err, cudaMemsetAsync(c->vc, 0, bytes, c->st));
    CU_CHECK(err, cudaStreamSynchronize(c->st));
    c->n_blocks = n_blocks;
    c->block_size = block_size;
    c->ctx_max = n_blocks * block_size;
    c->seq_max = c->ctx_max < c->cfg.max_pos ? c->ctx_max : c->cfg.max_pos;
    return 0;
}

static int cuda_kv_copy(void *ctx, int32_t dst, int32_t src, int n_tokens, struct rl_err *err)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!c->kc)
        return rl_errf(err, RL_EINVAL, "cuda backend: kv_copy before kv_init");
    if (dst < 0 || src < 0 || dst >= c->n_blocks || src >= c->n_blocks || n_tokens < 0 || n_tokens > c->block_size)
        return rl_errf(err, RL_EINVAL, "cuda backend: kv_copy(%d, %d, %d) out of range", dst, src, n_tokens);
    CU_CHECK(err, cudaSetDevice(c->device));
    int rc = cu_kv_copy(c->kc, c->vc, c->kv_dtype == BE_KV_BF16, c->cfg.n_layers, c->layer_elems, c->cfg.n_kv_heads,
                        c->block_size, c->cfg.head_dim, dst, src, n_tokens, c->st, err);
    if (rc)
        return rc;
    CU_CHECK(err, cudaStreamSynchronize(c->st));
    return 0;
}

/* ---- step metadata ---- */

static size_t meta_fixed(const struct meta_caps *k)
{
    return 6 * (size_t)k->T + (size_t)k->L + 2 * (size_t)k->tiles + 4 * (size_t)k->S;
}

static void meta_view_at(int32_t *base, const struct meta_caps *k, struct meta_view *v)
{
    int32_t *p = base;
    v->tokens = p, p += k->T;
    v->pos = p, p += k->T;
    v->seq = p, p += k->T;
    v->slot = p, p += k->T;
    v->dec = p, p += k->T;
    v->lslot = p, p += k->T;
    v->lrow = p, p += k->L;
    v->tile_seq = p, p += k->tiles;
    v->tile_r0 = p, p += k->tiles;
    v->seq_tok0 = p, p += k->S;
    v->seq_nnew = p, p += k->S;
    v->seq_npast = p, p += k->S;
    v->seq_bt_off = p, p += k->S;
    v->bt = p;
}

static int meta_reserve(struct cuda_ctx *c, size_t need, struct rl_err *err)
{
    if (need <= c->meta_cap)
        return 0;
    size_t cap = need + need / 2 + 1024;
    graphs_reset(c); /* graphs hold the old device address */
    if (c->meta_h)
        cudaFreeHost(c->meta_h);
    cudaFree(c->meta_d);
    c->meta_h = c->meta_d = NULL;
    c->meta_cap = 0;
    CU_CHECK(err, cudaHostAlloc((void **)&c->meta_h, cap * 4, cudaHostAllocDefault));
    CU_CHECK(err, cudaMalloc((void **)&c->meta_d, cap * 4));
    c->meta_cap = cap;
    return 0;
}

static int n_tbl(const struct cuda_ctx *c, const struct be_seq *q)
{
    return (q->n_past + q->n_new + c->block_size - 1) / c->block_size;
}

/* Packs the batch (padded to B sequences when B > 0: a graph step) and
 * sends it; fills *s with what the kernels need. */
static int build_step(struct cuda_ctx *c, const struct be_batch *b, int B, struct step *s, struct rl_err *err)
{
    int G = c->cfg.n_heads / c->cfg.n_kv_heads;
    struct meta_caps k;
    size_t n_bt = 0;
    int n_tiles = 0, max_len = 0, n_dec_seqs = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        const struct be_seq *q = &b->seqs[i];
        n_bt += (size_t)n_tbl(c, q);
        if (q->n_new > 1)
            n_tiles += (q->n_new * G + CU_ATTN_TILE_ROWS - 1) / CU_ATTN_TILE_ROWS;
        else {
            n_dec_seqs++;
            if (q->n_past + 1 > max_len)
                max_len = q->n_past + 1;
        }
    }
    /* Decode rows stay on the split decode kernel even where the tensor-core
     * tile kernel could take them (one tile of G rows a sequence): measured
     * on an H200 at batch 64, 512-token contexts, 4.7 ms a step for the tile
     * kernel against 4.1 ms for the split kernel (BENCHMARKS.md). The switch
     * stays so the tile kernel can take them once it prefetches its keys. */
    int dec_items = B ? B : n_dec_seqs;
    int tc_dec = 0 && cu_attn_tc(c->kv_dtype == BE_KV_BF16, c->cfg.head_dim) &&
                 (long)dec_items * c->cfg.n_kv_heads >= 2L * c->sm_count;
    if (tc_dec)
        n_tiles += dec_items;
    if (B) {
        k.T = k.S = k.L = B;
        k.tiles = tc_dec ? B : 0;
        n_bt += 1; /* the spare block's one-entry table */
    } else {
        k.T = b->n_tokens;
        k.S = b->n_seqs;
        k.L = b->n_logits > 0 ? b->n_logits : 1;
        k.tiles = n_tiles;
    }
    size_t total = meta_fixed(&k) + n_bt;
    int rc = meta_reserve(c, total, err);
    if (rc)
        return rc;
    struct meta_view h;
    meta_view_at(c->meta_h, &k, &h);
    int bs = c->block_size, T = b->n_tokens;
    int n_dec = 0, nl = 0, nt = 0, bt_at = 0;
    s->lora = 0;
    for (int i = 0, t = 0; i < b->n_seqs; i++) {
        const struct be_seq *q = &b->seqs[i];
        s->lora |= q->lora != 0;
        int nb = n_tbl(c, q);
        memcpy(h.bt + bt_at, q->block_table, (size_t)nb * 4);
        h.seq_tok0[i] = t;
        h.seq_nnew[i] = q->n_new;
        h.seq_npast[i] = q->n_past;
        h.seq_bt_off[i] = bt_at;
        bt_at += nb;
        if (q->n_new > 1 || tc_dec)
            for (int r0 = 0; r0 < q->n_new * G; r0 += CU_ATTN_TILE_ROWS) {
                h.tile_seq[nt] = i;
                h.tile_r0[nt++] = r0;
            }
        for (int j = 0; j < q->n_new; j++, t++) {
            int p = q->n_past + j;
            h.tokens[t] = b->tokens[t];
            h.pos[t] = p;
            h.seq[t] = i;
            h.slot[t] = q->block_table[p / bs] * bs + p % bs;
            h.lslot[t] = q->lora;
            if (q->n_new == 1 && !tc_dec)
                h.dec[n_dec++] = t;
            if (j >= q->logits_from)
                h.lrow[nl++] = t;
        }
    }
    if (B) {
        int spare = bt_at;
        h.bt[bt_at++] = c->n_blocks;
        for (int t = T; t < B; t++) { /* padding sequences, one token each */
            h.tokens[t] = 0;
            h.pos[t] = 0;
            h.seq[t] = t;
            h.slot[t] = c->n_blocks * bs;
            h.lslot[t] = 0;
            if (tc_dec) {
                h.tile_seq[nt] = t;
                h.tile_r0[nt++] = 0;
            } else {
                h.dec[n_dec++] = t;
            }
            h.seq_tok0[t] = t;
            h.seq_nnew[t] = 1;
            h.seq_npast[t] = 0;
            h.seq_bt_off[t] = spare;
        }
        /* lm_head runs on all B rows: wanted ones first, then every other
         * row once (a row listed twice would get the residual added twice) */
        for (int t = 0, i = 0; t < B; t++) {
            const struct be_seq *q = t < T ? &b->seqs[t] : NULL;
            if (q && q->logits_from == 0)
                continue;
            h.lrow[nl + i++] = t;
        }
        s->n_lrows = B;
        s->nsplit = cu_attn_splits(B, c->cfg.n_kv_heads, c->sm_count, c->seq_max, c->part_cap);
    } else {
        s->n_lrows = b->n_logits;
        s->nsplit = cu_attn_splits(n_dec, c->cfg.n_kv_heads, c->sm_count, max_len, c->part_cap);
    }
    s->T = k.T;
    s->n_dec = n_dec;
    s->n_tiles = nt;
    meta_view_at(c->meta_d, &k, &s->d);
    CU_CHECK(err, cudaMemcpyAsync(c->meta_d, c->meta_h, total * 4, cudaMemcpyHostToDevice, c->st));
    return 0;
}

/* ---- the step ---- */

static enum cu_act lin_act(const struct cu_linear *l) { return cu_act_for(l->m[0].dt); }

/* The adapters' deltas of projections p0 .. p0 + n - 1 of layer l (one
 * input x of type xt, ldx wide) into y (ldy wide, projection j's outputs
 * from column col[j]), for the step's rows that run with one. */
static int lora_deltas(struct cuda_ctx *c, const struct step *s, int l, int p0, int n, const void *x,
                       enum cu_act xt, int ldx, float *y, int ldy, const int col[3], int max_out,
                       struct rl_err *err)
{
    struct cu_lora_call a;
    memset(&a, 0, sizeof a);
    a.x = x;
    a.xt = xt;
    a.ldx = ldx;
    a.T = s->T;
    a.slot = s->d.lslot;
    a.tab = c->lora_tab_d;
    a.n_layers = c->cfg.n_layers;
    a.layer = l;
    a.p0 = p0;
    a.n_proj = n;
    a.max_out = max_out;
    a.tmp = c->lora_tmp;
    a.y = y;
    a.ldy = ldy;
    for (int j = 0; j < 3; j++)
        a.col[j] = col[j];
    return cu_lora_apply(&a, c->st, err);
}

/* Enqueues a whole step. out_logits: host rows to copy into (NULL in
 * graph capture, where the caller copies after the launch). */
static int run_step(struct cuda_ctx *c, const struct step *s, float *out_logits, struct rl_err *err)
{
    const struct model_config *cfg = &c->cfg;
    int T = s->T, H = cfg->hidden, I = cfg->intermediate, V = cfg->vocab;
    int NH = cfg->n_heads, Q = NH * cfg->head_dim;
    float eps = cfg->rms_eps;
    int rc;
    struct cu_attn_meta am = {s->d.seq, s->d.pos, s->d.dec, s->d.tile_seq, s->d.tile_r0,
                              s->d.seq_tok0, s->d.seq_nnew, s->d.seq_npast, s->d.seq_bt_off, s->d.bt};
    size_t es = kv_esize(c);
    struct cu_prof *P = c->prof; /* never inside a graph capture */
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (P && (cudaStreamIsCapturing(c->st, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone))
        P = NULL;
#define MARK(kind) cu_prof_mark(P, CU_PROF_##kind, c->st)
    cu_prof_begin(P, c->st);
    if ((rc = cu_embed(&c->embed, s->d.tokens, T, c->x, c->st, err)))
        return rc;
    MARK(EMBED);
    if ((rc = cu_rmsnorm(c->x, NULL, NULL, T, H, c->layers[0].attn_norm, eps, c->xin, lin_act(&c->layers[0].qkv),
                         c->st, err)))
        return rc;
    MARK(NORM);
    for (int l = 0; l < cfg->n_layers; l++) {
        const struct cu_layer *L = &c->layers[l];
        struct cu_kv_layer kv = {(char *)c->kc + (size_t)l * c->layer_elems * es,
                                 (char *)c->vc + (size_t)l * c->layer_elems * es, c->kv_dtype == BE_KV_BF16,
                                 cfg->n_kv_heads, cfg->head_dim, c->block_size};
        if ((rc = cu_linear_run(c->gemm, &L->qkv, T, c->xin, c->qkv, err)))
            return rc;
        int KV = cfg->n_kv_heads * cfg->head_dim;
        if (s->lora) {
            const int col[3] = {0, Q, Q + KV};
            if ((rc = lora_deltas(c, s, l, LORA_Q, 3, c->xin, lin_act(&L->qkv), H, c->qkv, Q + 2 * KV, col,
                                  Q > KV ? Q : KV, err)))
                return rc;
        }
        MARK(QKV);
        if ((rc = cu_qk_rope_write(c->qkv, T, NH, L->q_norm, L->k_norm, eps, c->inv_freq, c->mscale, s->d.pos,
                                   s->d.slot, c->q, &kv, c->st, err)))
            return rc;
        MARK(ROPE);
        if ((rc = cu_attn_decode(c->q, &kv, &am, s->n_dec, NH, s->nsplit, c->attn_variant, c->part_ml, c->part_acc,
                                 c->att, c->st, err)) ||
            (rc = cu_attn_prefill(c->q, &kv, &am, s->n_tiles, NH, c->att, c->st, err)))
            return rc;
        MARK(ATTN);
        const void *oin = c->att;
        if (lin_act(&L->o) != CU_ACT_F32) {
            if ((rc = cu_cast(c->att, (size_t)T * (size_t)Q, c->xin, lin_act(&L->o), c->st, err)))
                return rc;
            oin = c->xin;
        }
        if ((rc = cu_linear_run(c->gemm, &L->o, T, oin, c->tmp, err)))
            return rc;
        if (s->lora) {
            const int col[3] = {0, 0, 0};
            if ((rc = lora_deltas(c, s, l, LORA_O, 1, oin, oin == c->att ? CU_ACT_F32 : lin_act(&L->o), Q, c->tmp,
                                  H, col, H, err)))
                return rc;
        }
        MARK(O);
        if ((rc = cu_rmsnorm(c->x, c->tmp, NULL, T, H, L->mlp_norm, eps, c->xin, lin_act(&L->gu), c->st, err)))
            return rc;
        MARK(NORM);
        if ((rc = cu_linear_run(c->gemm, &L->gu, T, c->xin, c->gu, err)))
            return rc;
        if (s->lora) {
            const int col[3] = {0, I, 0};
            if ((rc = lora_deltas(c, s, l, LORA_GATE, 2, c->xin, lin_act(&L->gu), H, c->gu, 2 * I, col, I, err)))
                return rc;
        }
        MARK(GU);
        if ((rc = cu_swiglu(c->gu, T, I, c->xin, lin_act(&L->down), c->st, err)))
            return rc;
        MARK(SWIGLU);
        if ((rc = cu_linear_run(c->gemm, &L->down, T, c->xin, c->tmp, err)))
            return rc;
        if (s->lora) {
            const int col[3] = {0, 0, 0};
            if ((rc = lora_deltas(c, s, l, LORA_DOWN, 1, c->xin, lin_act(&L->down), I, c->tmp, H, col, H, err)))
                return rc;
        }
        MARK(DOWN);
        if (l + 1 < cfg->n_layers &&
            (rc = cu_rmsnorm(c->x, c->tmp, NULL, T, H, c->layers[l + 1].attn_norm, eps, c->xin,
                             lin_act(&c->layers[l + 1].qkv), c->st, err)))
            return rc;
        MARK(NORM);
    }
    /* The last residual add happens inside the final norm, for the logits
     * rows only; rows nobody asked logits for are finished. */
    for (int r0 = 0; r0 < s->n_lrows; r0 += c->logit_rows) {
        int n = s->n_lrows - r0 < c->logit_rows ? s->n_lrows - r0 : c->logit_rows;
        if ((rc = cu_rmsnorm(c->x, c->tmp, s->d.lrow + r0, n, H, c->final_norm, eps, c->xin, lin_act(&c->lm_head),
                             c->st, err)) ||
            (rc = cu_linear_run(c->gemm, &c->lm_head, n, c->xin, c->logits, err)))
            return rc;
        MARK(LMHEAD);
        /* a constraint's mask, before the rows leave the device or meet
         * the argmax (not while capturing a graph: masks change per step) */
        if (out_logits && c->n_masked &&
            (rc = cu_mask_logits(c->logits, V, r0, n, c->mrows_d, c->masks_d, c->n_masked, c->st, err)))
            return rc;
        if (c->device_argmax) {
            if ((rc = cu_argmax(c->logits, n, V, c->ids_d + r0, c->st, err)))
                return rc;
        } else if (out_logits) {
            CU_CHECK(err, cudaMemcpyAsync(out_logits + (size_t)r0 * (size_t)V, c->logits, (size_t)n * (size_t)V * 4,
                                          cudaMemcpyDeviceToHost, c->st));
        }
        MARK(SAMPLE);
    }
#undef MARK
    return 0;
}

static int check_batch(const struct cuda_ctx *c, const struct be_batch *b, struct rl_err *err)
{
    if (!c->loaded || !c->kc)
        return rl_errf(err, RL_EINVAL, "cuda backend: forward before load/kv_init");
    if (b->n_tokens < 1 || b->n_tokens > c->max_tokens || b->n_seqs < 1)
        return rl_errf(err, RL_EINVAL, "cuda backend: batch has %d tokens in %d sequences; this backend takes 1..%d",
                       b->n_tokens, b->n_seqs, c->max_tokens);
    int nt = 0, nl = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct be_seq *q = &b->seqs[s];
        if (q->n_new < 1 || q->n_past < 0 || q->logits_from < 0 || q->logits_from > q->n_new)
            return rl_errf(err, RL_EINVAL, "cuda backend: sequence %d has a bad shape", s);
        int end = q->n_past + q->n_new;
        if (end > c->ctx_max || end > c->cfg.max_pos)
            return rl_errf(err, RL_EINVAL, "cuda backend: sequence %d reaches position %d, beyond the context", s, end);
        for (int i = 0; i < (end + c->block_size - 1) / c->block_size; i++)
            if (q->block_table[i] < 0 || q->block_table[i] >= c->n_blocks)
                return rl_errf(err, RL_EINVAL, "cuda backend: sequence %d names KV block %d of %d", s,
                               q->block_table[i], c->n_blocks);
        if (q->lora < 0 || q->lora > LORA_MAX_ADAPTERS || (q->lora && !c->lora_mem[q->lora]))
            return rl_errf(err, RL_EINVAL, "cuda backend: sequence %d names LoRA slot %d, which is empty", s,
                           q->lora);
        nt += q->n_new;
        nl += q->n_new - q->logits_from;
    }
    if (nt != b->n_tokens || nl != b->n_logits)
        return rl_errf(err, RL_EINVAL, "cuda backend: batch counts do not add up (%d/%d tokens, %d/%d logits)", nt,
                       b->n_tokens, nl, b->n_logits);
    for (int t = 0; t < b->n_tokens; t++)
        if (b->tokens[t] < 0 || b->tokens[t] >= c->cfg.vocab)
            return rl_errf(err, RL_EINVAL, "cuda backend: token id %d outside the vocabulary (%d)", b->tokens[t],
                           c->cfg.vocab);
    return 0;
}

/* Smallest bucket >= n (1, 2, 4, ...), or 0 when graphs cannot take it. */
static int bucket_of(const struct cuda_ctx *c, int n, int *idx)
{
    int B = 1, i = 0;
    while (B < n && i < N_BUCKETS - 1)
        B *= 2, i++;
    if (B < n || B > c->max_tokens || B > c->logit_rows)
        return 0;
    *idx = i;
    return B;
}

static int graph_get(struct cuda_ctx *c, int idx, const struct step *s, cudaGraphExec_t *out, struct rl_err *err)
{
    struct cu_graph *g = &c->graphs[idx];
    if (g->exec && g->B == s->T && g->nsplit == s->nsplit) {
        *out = g->exec;
        return 0;
    }
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    memset(g, 0, sizeof *g);
    cudaGraph_t graph = NULL;
    CU_CHECK(err, cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal));
    int rc = run_step(c, s, NULL, err);
    cudaError_t e = cudaStreamEndCapture(c->st, &graph);
    if (rc) {
        if (graph)
            cudaGraphDestroy(graph);
        return rl_err_wrap(err, "capturing the decode graph for %d sequences", s->T);
    }
    if (e != cudaSuccess)
        return rl_errf(err, RL_EBACKEND, "cudaStreamEndCapture (bucket %d): %s (cudaError %d)", s->T,
                       cudaGetErrorString(e), (int)e);
    e = cudaGraphInstantiate(&g->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        g->exec = NULL;
        return rl_errf(err, RL_EBACKEND, "cudaGraphInstantiate (bucket %d): %s (cudaError %d)", s->T,
                       cudaGetErrorString(e), (int)e);
    }
    g->B = s->T;
    g->nsplit = s->nsplit;
    *out = g->exec;
    return 0;
}

static int cuda_set_masks(void *ctx, const uint32_t *const *masks, int n_rows, struct rl_err *err)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    (void)err;
    c->set_m = masks;
    c->set_n = masks ? n_rows : 0;
    return 0;
}

/* Packs the masks set_masks() gave for this step (the rows that have one)
 * and uploads them on the stream; c->n_masked says how many. */
static int upload_masks(struct cuda_ctx *c, const struct be_batch *b, struct rl_err *err)
{
    c->n_masked = 0;
    const uint32_t *const *masks = c->set_m;
    int n_set = c->set_n;
    c->set_m = NULL; /* one step's */
    c->set_n = 0;
    if (!masks)
        return 0;
    size_t W = ((size_t)c->cfg.vocab + 31) / 32, cap = (size_t)c->max_tokens;
    if (!c->mask_h) {
        int rc;
        if ((rc = dev_alloc(c, (void **)&c->mrows_d, cap * 4, err)) ||
            (rc = dev_alloc(c, (void **)&c->masks_d, cap * W * 4, err)))
            return rc;
        CU_CHECK(err, cudaHostAlloc(&c->mask_h, cap * 4 + cap * W * 4, cudaHostAllocDefault));
    }
    int32_t *rows = (int32_t *)c->mask_h;
    uint32_t *m = (uint32_t *)(rows + cap);
    int n = 0;
    for (int i = 0; i < b->n_logits && i < n_set && (size_t)i < cap; i++)
        if (masks[i]) {
            rows[n] = i;
            memcpy(m + (size_t)n * W, masks[i], W * 4);
            n++;
        }
    if (!n)
        return 0;
    CU_CHECK(err, cudaMemcpyAsync(c->mrows_d, rows, (size_t)n * 4, cudaMemcpyHostToDevice, c->st));
    CU_CHECK(err, cudaMemcpyAsync(c->masks_d, m, (size_t)n * W * 4, cudaMemcpyHostToDevice, c->st));
    c->n_masked = n;
    return 0;
}

/* After a step whose logits rows [0, n_logits) all sit in c->logits
 * (masked): the greedy rows' best entries and the other reduced rows'
 * candidate sets on the device, then one copy of the sets and one copy per
 * run of whole rows into batch->logits (pinned when the engine took it
 * from host_alloc). Enqueued only; the forward's synchronisation ends it. */
static int finish_rows(struct cuda_ctx *c, const struct be_batch *b, const uint8_t *wants, struct rl_err *err)
{
    const int n = b->n_logits;
    const size_t V = (size_t)c->cfg.vocab;
    int n_arg = 0, n_cand = 0;
    for (int r = 0; r < n; r++)
        n_arg += wants[r] == BE_ROW_ARGMAX;
    for (int r = 0, a = 0, k = n_arg; r < n; r++) {
        if (wants[r] == BE_ROW_ARGMAX)
            c->wrows_h[a++] = r;
        else if (wants[r] == BE_ROW_CANDS)
            c->wrows_h[k++] = r, n_cand++;
    }
    int rc;
    if (n_arg + n_cand) {
        CU_CHECK(err, cudaMemcpyAsync(c->wrows_d, c->wrows_h, (size_t)(n_arg + n_cand) * 4, cudaMemcpyHostToDevice,
                                      c->st));
        if ((rc = cu_row_cands(c->logits, (int)V, c->wrows_d, n_arg, 1, c->cands_d, c->st, err)) ||
            (rc = cu_row_cands(c->logits, (int)V, c->wrows_d + n_arg, n_cand, 0, c->cands_d, c->st, err)))
            return rc;
        CU_CHECK(err, cudaMemcpyAsync(c->cands_h, c->cands_d, (size_t)n * sizeof(struct sample_cands),
                                      cudaMemcpyDeviceToHost, c->st));
    }
    for (int r = 0; r < n;) { /* whole rows, a run at a time */
        if (wants[r] != BE_ROW_FULL && wants[r] != BE_ROW_ARGMAX && wants[r] != BE_ROW_CANDS)
            return rl_errf(err, RL_EINVAL, "cuda backend: row %d wants %d", r, (int)wants[r]);
        if (wants[r] != BE_ROW_FULL) {
            r++;
            continue;
        }
        int e = r;
        while (e < n && wants[e] == BE_ROW_FULL)
            e++;
        CU_CHECK(err, cudaMemcpyAsync(b->logits + (size_t)r * V, c->logits + (size_t)r * V, (size_t)(e - r) * V * 4,
                                      cudaMemcpyDeviceToHost, c->st));
        r = e;
    }
    return 0;
}

static int cuda_set_row_wants(void *ctx, uint8_t *wants, int n_rows, struct rl_err *err)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    (void)err;
    c->wants = n_rows > 0 ? wants : NULL;
    c->n_wants = wants ? n_rows : 0;
    return 0;
}

static const struct sample_cands *cuda_row_cands(void *ctx)
{
    return ((struct cuda_ctx *)ctx)->cands_h;
}

static int cuda_fetch_row(void *ctx, int row, float *out, struct rl_err *err)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (row < 0 || row >= c->last_rows)
        return rl_errf(err, RL_EINVAL, "cuda backend: logits row %d is not on the device (%d rows kept)", row,
                       c->last_rows);
    CU_CHECK(err, cudaSetDevice(c->device));
    CU_CHECK(err, cudaMemcpyAsync(out, c->logits + (size_t)row * (size_t)c->cfg.vocab, (size_t)c->cfg.vocab * 4,
                                  cudaMemcpyDeviceToHost, c->st));
    CU_CHECK(err, cudaStreamSynchronize(c->st));
    return 0;
}

/* The final norm once more, over the residual the forward left in x, into
 * an f32 row (the forward's own normed rows are in the lm_head's input
 * type, BF16 or FP8, and overwritten pass by pass). */
/* An adapter's pairs go to one device allocation of their own, f32 as
 * lora.h keeps them, and the slot's table entries point into it. The
 * table and the scratch are allocated with the first adapter, at the
 * addresses every captured graph keeps. Memory comes out of what the KV
 * pool left (kv_reserve_mb). */
static int cuda_lora_set(void *ctx, int slot, const struct lora_adapter *a, struct rl_err *err)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (slot < 1 || slot > LORA_MAX_ADAPTERS)
        return rl_errf(err, RL_EINVAL, "cuda backend: LoRA slot %d outside 1..%d", slot, LORA_MAX_ADAPTERS);
    if (!c->loaded)
        return rl_errf(err, RL_EINVAL, "cuda backend: an adapter before load");
    CU_CHECK(err, cudaSetDevice(c->device));
    int L = c->cfg.n_layers;
    size_t per_slot = (size_t)L * CU_LORA_PROJ;
    if (!c->lora_tab_d) {
        size_t tb = (size_t)(LORA_MAX_ADAPTERS + 1) * per_slot * sizeof(struct cu_lora_ent);
        size_t sb = (size_t)c->rows * 3 * CU_LORA_MAX_RANK * sizeof(float);
        cudaError_t e = cudaMalloc((void **)&c->lora_tab_d, tb);
        if (e == cudaSuccess)
            e = cudaMalloc((void **)&c->lora_tmp, sb);
        if (e != cudaSuccess) {
            cudaFree(c->lora_tab_d);
            c->lora_tab_d = NULL;
            return rl_errf(err, RL_ENOMEM,
                           "cuda backend: %zu MB for the LoRA tables: %s (raise kv_reserve_mb to leave room)",
                           (tb + sb) >> 20, cudaGetErrorString(e));
        }
        CU_CHECK(err, cudaMemset(c->lora_tab_d, 0, tb));
    }
    struct cu_lora_ent *ents = (struct cu_lora_ent *)calloc(per_slot, sizeof *ents);
    if (!ents)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    void *mem = NULL;
    if (a) {
        size_t need = 16; /* each pair's A and B^T together, on 256-byte boundaries */
        for (int l = 0; l < L; l++)
            for (int p = 0; p < CU_LORA_PROJ; p++) {
                const struct lora_pair *pr = lora_get(a, l, (enum lora_proj)p);
                if (pr)
                    need += ((size_t)pr->rank * (size_t)(pr->in + pr->out) * 4 + 255) / 256 * 256;
            }
        cudaError_t e = cudaMalloc(&mem, need);
        if (e != cudaSuccess) {
            free(ents);
            return rl_errf(err, RL_ENOMEM,
                           "cuda backend: %zu MB for an adapter: %s (raise kv_reserve_mb to leave room)",
                           need >> 20, cudaGetErrorString(e));
        }
        char *at = (char *)mem;
        int rc = 0;
        for (int l = 0; l < L && !rc; l++)
            for (int p = 0; p < CU_LORA_PROJ && !rc; p++) {
                const struct lora_pair *pr = lora_get(a, l, (enum lora_proj)p);
                if (!pr)
                    continue;
                size_t na = (size_t)pr->rank * (size_t)pr->in * 4, nb = (size_t)pr->rank * (size_t)pr->out * 4;
                struct cu_lora_ent *en = &ents[(size_t)l * CU_LORA_PROJ + p];
                en->a = (const float *)at;
                en->bt = (const float *)(at + na);
                en->rank = pr->rank;
                en->in = pr->in;
                en->out = pr->out;
                if (cudaMemcpy(at, pr->a, na, cudaMemcpyHostToDevice) != cudaSuccess ||
                    cudaMemcpy(at + na, pr->bt, nb, cudaMemcpyHostToDevice) != cudaSuccess)
                    rc = rl_errf(err, RL_EBACKEND, "cuda backend: uploading an adapter failed");
                at += (na + nb + 255) / 256 * 256;
            }
        if (rc) {
            cudaFree(mem);
            free(ents);
            return rc;
        }
    }
    /* the table changes between steps only (forward synchronises before
     * it returns), so no step reads a half-written slot */
    cudaError_t e = cudaMemcpy(c->lora_tab_d + (size_t)slot * per_slot, ents, per_slot * sizeof *ents,
                               cudaMemcpyHostToDevice);
    free(ents);
    if (e != cudaSuccess) {
        cudaFree(mem);
        return rl_errf(err, RL_EBACKEND, "cuda backend: the LoRA table: %s", cudaGetErrorString(e));
    }
    cudaFree(c->lora_mem[slot]);
    c->lora_mem[slot] = mem;
    return 0;
}

static int cuda_hidden(void *ctx, int row, float *out, struct rl_err *err)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (row < 0 || row >= c->last_hidden || !c->last_lrow_d)
        return rl_errf(err, RL_EINVAL, "cuda backend: logits row %d of %d has no hidden state", row,
                       c->last_hidden);
    int H = c->cfg.hidden, rc;
    CU_CHECK(err, cudaSetDevice(c->device));
    if ((rc = cu_rmsnorm(c->x, NULL, c->last_lrow_d + row, 1, H, c->final_norm, c->cfg.rms_eps, c->hid_d, CU_ACT_F32,
                         c->st, err)))
        return rc;
    CU_CHECK(err, cudaMemcpyAsync(out, c->hid_d, (size_t)H * 4, cudaMemcpyDeviceToHost, c->st));
    CU_CHECK(err, cudaStreamSynchronize(c->st));
    return 0;
}

static void *cuda_host_alloc_op(void *ctx, size_t bytes)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    void *p = NULL;
    if (cudaSetDevice(c->device) != cudaSuccess)
        return NULL;
    return cudaHostAlloc(&p, bytes ? bytes : 16, cudaHostAllocDefault) == cudaSuccess ? p : NULL;
}

static void cuda_host_free_op(void *ctx, void *p)
{
    (void)ctx;
    if (p)
        cudaFreeHost(p);
}

static int cuda_forward(void *ctx, const struct be_batch *b, struct rl_err *err)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    int rc = check_batch(c, b, err);
    if (rc)
        return rc;
    CU_CHECK(err, cudaSetDevice(c->device));
    int all_decode = 1;
    for (int i = 0; i < b->n_seqs && all_decode; i++)
        all_decode = b->seqs[i].n_new == 1;
    if ((rc = upload_masks(c, b, err)))
        return rc;
    /* per-row wants: served when every logits row stays on the device
     * until the end of the step (one lm_head pass); else all rows whole */
    uint8_t *wants = c->wants;
    int n_wants = c->n_wants;
    c->wants = NULL;
    c->n_wants = 0;
    int use_wants = wants && !c->device_argmax && b->n_logits > 0 && b->n_logits <= c->logit_rows &&
                    n_wants >= b->n_logits;
    if (wants && !use_wants)
        for (int r = 0; r < n_wants; r++)
            wants[r] = BE_ROW_FULL;
    c->last_rows = 0;
    c->last_hidden = 0;
    /* a captured graph ends in the argmax: masked rows take the plain path */
    int graphs = c->use_graphs && !(c->device_argmax && c->n_masked);
    int idx = 0, B = graphs && all_decode ? bucket_of(c, b->n_seqs, &idx) : 0;
    struct step s;
    if ((rc = build_step(c, b, B, &s, err)))
        return rc;
    if (B) {
        cudaGraphExec_t exec;
        if ((rc = graph_get(c, idx + (s.lora ? N_BUCKETS : 0), &s, &exec, err)))
            return rc;
        CU_CHECK(err, cudaGraphLaunch(exec, c->st));
        if (c->n_masked && (rc = cu_mask_logits(c->logits, c->cfg.vocab, 0, b->n_logits, c->mrows_d, c->masks_d,
                                                c->n_masked, c->st, err)))
            return rc;
        if (use_wants) {
            if ((rc = finish_rows(c, b, wants, err)))
                return rc;
        } else if (!c->device_argmax && b->n_logits > 0) {
            CU_CHECK(err, cudaMemcpyAsync(b->logits, c->logits, (size_t)b->n_logits * (size_t)c->cfg.vocab * 4,
                                          cudaMemcpyDeviceToHost, c->st));
        }
    } else if (use_wants) {
        /* rows stay on the device (one pass): mask them, then serve the wants */
        if ((rc = run_step(c, &s, NULL, err)))
            return rc;
        if (c->n_masked && (rc = cu_mask_logits(c->logits, c->cfg.vocab, 0, b->n_logits, c->mrows_d, c->masks_d,
                                                c->n_masked, c->st, err)))
            return rc;
        if ((rc = finish_rows(c, b, wants, err)))
            return rc;
    } else if ((rc = run_step(c, &s, b->logits, err))) {
        return rc;
    }
    if (b->n_logits <= c->logit_rows)
        c->last_rows = b->n_logits;
    /* every logits row's x row got its last residual add in the final norm
     * (each pass of logit_rows adds its own rows once) */
    c->last_lrow_d = s.d.lrow;
    c->last_hidden = b->n_logits;
    if (c->device_argmax && b->n_logits > 0)
        CU_CHECK(err, cudaMemcpyAsync(c->ids_h, c->ids_d, (size_t)b->n_logits * 4, cudaMemcpyDeviceToHost, c->st));
    c->n_ids = b->n_logits;
    /* The one synchronisation of the step; kernel faults surface here. */
    CU_CHECK(err, cudaStreamSynchronize(c->st));
    cu_prof_collect(c->prof);
    return 0;
}

static const char *cuda_describe(void *ctx)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    char tuned[64] = "";
    if (c->gemm) {
        int n, own = cu_gemm_n_own(c->gemm, &n);
        if (n)
            snprintf(tuned, sizeof tuned, ", decode products: ours on %d of %d shapes", own, n);
    }
    snprintf(c->desc, sizeof c->desc, "cuda %s (sm_%d%d, %d SMs), kv %s, graphs %s%s%s%s", c->dev_name, c->cc_major,
             c->cc_minor, c->sm_count, c->kv_dtype == BE_KV_F32 ? "f32" : "bf16", c->use_graphs ? "on" : "off",
             c->gemm && c->cfg.fp8_block_rows ? ", " : "", c->gemm && c->cfg.fp8_block_rows ? cu_gemm_fp8_path(c->gemm) : "",
             tuned);
    return c->desc;
}

static void cuda_free(void *ctx)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!c)
        return;
    cudaSetDevice(c->device);
    free_kv(c);
    free_weights(c);
    for (int i = 0; i <= LORA_MAX_ADAPTERS; i++)
        cudaFree(c->lora_mem[i]);
    cudaFree(c->lora_tab_d);
    cudaFree(c->lora_tmp);
    cu_prof_free(c->prof);
    free(c->allocs);
    if (c->meta_h)
        cudaFreeHost(c->meta_h);
    cudaFree(c->meta_d);
    if (c->st)
        cudaStreamDestroy(c->st);
    free(c);
}


extern "C" int cuda_backend_create(struct backend **out, const struct be_options *opt, struct rl_err *err)
{
    *out = NULL;
    struct be_options def;
    memset(&def, 0, sizeof def);
    if (!opt)
        opt = &def;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return rl_errf(err, RL_EUNSUPPORTED, "cuda backend: no CUDA device (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    if (opt->device < 0 || opt->device >= n)
        return rl_errf(err, RL_EINVAL, "cuda backend: device %d of %d", opt->device, n);
    if (opt->kv_dtype != BE_KV_AUTO && opt->kv_dtype != BE_KV_F32 && opt->kv_dtype != BE_KV_BF16)
        return rl_errf(err, RL_EINVAL, "cuda backend: unknown kv dtype %d", (int)opt->kv_dtype);
    struct cudaDeviceProp prop;
    CU_CHECK(err, cudaGetDeviceProperties(&prop, opt->device));
    if (prop.major < 8)
        return rl_errf(err, RL_EUNSUPPORTED, "cuda backend: %s is sm_%d%d; this build needs sm_80 or newer", prop.name,
                       prop.major, prop.minor);
    struct cuda_ctx *c = (struct cuda_ctx *)calloc(1, sizeof *c);
    struct backend *be = (struct backend *)calloc(1, sizeof *be);
    if (!c || !be) {
        free(c), free(be);
        return rl_errf(err, RL_ENOMEM, "out of memory");
    }
    c->device = opt->device;
    c->sm_count = prop.multiProcessorCount;
    c->cc_major = prop.major;
    c->cc_minor = prop.minor;
    snprintf(c->dev_name, sizeof c->dev_name, "%s", prop.name);
    c->kv_req = opt->kv_dtype;
    c->progress = opt->progress;
    c->progress_user = opt->progress_user;
    c->use_graphs = 1;
    c->kv_reserve = opt->kv_reserve_bytes;
    e = cudaSetDevice(c->device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(c), free(be);
        return rl_errf(err, RL_EBACKEND, "cuda backend: creating the stream: %s (cudaError %d)", cudaGetErrorString(e),
                       (int)e);
    }
    be->ops = &cuda_ops;
    be->ctx = c;
    *out = be;
    return 0;
}

/* ---- the switches in cuda_backend.h ---- */

static struct cuda_ctx *ctx_of(struct backend *be)
{
    return be && be->ops == &cuda_ops ? (struct cuda_ctx *)be->ctx : NULL;
}

extern "C" int cuda_backend_set_graphs(struct backend *be, int on)
{
    struct cuda_ctx *c = ctx_of(be);
    if (!c)
        return -RL_EINVAL;
    c->use_graphs = on != 0;
    graphs_reset(c);
    return 0;
}

extern "C" int cuda_backend_set_gemm_path(struct backend *be, int path)
{
    struct cuda_ctx *c = ctx_of(be);
    if (!c || path < 0 || path > 2)
        return -RL_EINVAL;
    c->gemm_path = path;
    if (c->gemm)
        cu_gemm_force(c->gemm, (enum cu_gemm_path)path);
    graphs_reset(c);
    return 0;
}

extern "C" int cuda_backend_set_attn_variant(struct backend *be, int variant)
{
    struct cuda_ctx *c = ctx_of(be);
    if (!c || (variant != CU_ATTN_DEC_PLAIN && variant != CU_ATTN_DEC_PRELOAD))
        return -RL_EINVAL;
    c->attn_variant = variant;
    graphs_reset(c);
    return 0;
}

extern "C" int cuda_backend_gemm_report(struct backend *be, char *buf, size_t cap)
{
    struct cuda_ctx *c = ctx_of(be);
    if (!c || !c->gemm || !cap)
        return -RL_EINVAL;
    return cu_gemm_tune_report(c->gemm, buf, cap);
}

extern "C" int cuda_backend_set_device_argmax(struct backend *be, int on)
{
    struct cuda_ctx *c = ctx_of(be);
    if (!c)
        return -RL_EINVAL;
    c->device_argmax = on != 0;
    graphs_reset(c);
    return 0;
}

extern "C" int cuda_backend_set_profile(struct backend *be, int on, struct rl_err *err)
{
    struct cuda_ctx *c = ctx_of(be);
    if (!c)
        return rl_errf(err, RL_EINVAL, "cuda_backend_set_profile: not a cuda backend");
    CU_CHECK(err, cudaSetDevice(c->device));
    if (!on) {
        cu_prof_free(c->prof);
        c->prof = NULL;
        return 0;
    }
    return c->prof ? 0 : cu_prof_create(&c->prof, err);
}

extern "C" int cuda_backend_profile(struct backend *be, double *ms, const char **names, int reset)
{
    struct cuda_ctx *c = ctx_of(be);
    cu_prof_read(c ? c->prof : NULL, ms, reset);
    for (int k = 0; k < CU_PROF_KINDS; k++)
        names[k] = cu_prof_kind_name(k);
    return CU_PROF_KINDS;
}

extern "C" const int32_t *cuda_backend_sampled(struct backend *be)
{
    struct cuda_ctx *c = ctx_of(be);
    return c && c->device_argmax ? c->ids_h : NULL;
}

extern "C" void *cuda_host_alloc(size_t bytes)
{
    void *p = NULL;
    return cudaHostAlloc(&p, bytes, cudaHostAllocDefault) == cudaSuccess ? p : NULL;
}

extern "C" void cuda_host_free(void *p)
{
    if (p)
        cudaFreeHost(p);
}
