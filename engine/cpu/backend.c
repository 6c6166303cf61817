/* engine/cpu/backend.c - the CPU implementation of engine/backend.h.
 *
 * A forward step is a fixed sequence of parallel loops over a persistent
 * thread pool (pool.h); all arithmetic goes through one kernel table
 * (kernels.h) chosen at create time, so the scalar, AVX2 and AVX-512 paths
 * run the same code around them.
 *
 * Per layer: (previous layer's residual +) rmsnorm -> {q,k,v} projections
 * (one loop over their stacked rows) -> q/k rmsnorm + rotary + KV-cache
 * write -> attention (writing the o projection's bf16 input) -> o
 * projection -> residual + rmsnorm in one pass -> {gate,up} projections
 * fused with SwiGLU -> down projection (its residual joins the next layer's
 * norm). Logits only for the rows the batch asks for. Seven pool runs per
 * layer; the products, norms and attention take their work from a counter
 * in chunks (cpu_pool_run_dyn), so a thread that loses its core on a shared
 * machine does not hold the other at the barrier.
 *
 * Batch invariance (engine issue): nothing a token computes depends on the
 * other tokens of the step except through its own sequence's KV cache. The
 * gemm kernels promise per-(row, column) reduction orders independent of M;
 * norms and rotary are per row; attention for a query at position p always
 * reads keys 0..p from the cache in ascending order, so prefill (many
 * queries), chunked prefill and decode (one query) give identical bits.
 *
 * Weights: copied into 2 MiB pages at load (or used in place from the
 * mapping with mmap_weights). FP8 matrices are widened to BF16 once at load
 * (the CPU has no FP8 dot product); quantized matrices (GGUF, AWQ) without
 * a native kernel are dequantized to F32 once (mat_dequant_f32); norm
 * vectors are copied to F32. On the
 * AVX-512 table the BF16 matrices are then repacked into 16-row panels for
 * gemm_bf16p (pack_weights). Activations are F32; they
 * are rounded to BF16 only as the input of a BF16 matrix product.
 *
 * KV cache: bf16 (f32 for F32 checkpoints). On the AVX-512 table, with
 * 16-token blocks, every (layer, block, kv head) is kept in the packed K
 * and V layouts of kernels.h, so attention runs as outer-product tiles
 * with BF16 dot products (attn_packed: P rounded to bf16 for P x V, as
 * GPU flash attention does); elsewhere slot-major rows (attn_slots).
 *
 * Threading: driven by one thread; every loop runs on the pool. */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "clock.h"
#include "backend.h"
#include "dtype.h"
#include "kernels.h"
#include "cpu/lora_apply.h"
#include "pool.h"
#include "quant.h"

/* Rows of one attention item (queries x heads of a GQA group): the score
 * tile for them stays in L2 for contexts of a few thousand tokens. */
#define ATT_ROWS 64
/* Rows of a tile that go through P x V together, sharing each V block. */
#define ATT_PV_ROWS 8

struct attn_item {
    int32_t seq, g, t0, n; /* sequence, kv head, first token index, tokens */
};

struct cpu_mat {
    enum model_dtype dt;  /* F32, BF16 or F16 (FP8 is widened at load), or
                             a quantized format (then q says how it is held) */
    int rows, cols;
    const void *w;        /* (rows, cols) row-major, or panels when packed */
    int packed;           /* BF16 in cpu_pack_bf16's layout, for gemm_bf16p */
    struct cpu_qmat q;    /* quantized: the matrix as gemm_q takes it (q.w == w) */
};

/* Weights copied out of the file mapping into one anonymous region backed
 * by 2 MiB pages: decode streams every weight once per token, and with 4 KiB
 * pages the TLB misses alone cost about half the memory bandwidth here.
 * Each matrix starts on a 64-byte boundary so AVX-512 loads never straddle
 * cache lines (safetensors only promises 8-byte alignment). */
struct cpu_arena {
    char *base;
    size_t size, used;
};

struct cpu_layer {
    float *attn_norm, *mlp_norm; /* (hidden) */
    float *q_norm, *k_norm;      /* (head_dim) */
    struct cpu_mat wq, wk, wv, wo, gate, up, down;
};

/* Phases of a forward step, for the profile op: wall time of each pool run
 * as the driving thread sees it (barrier waits included, which is the
 * point: a phase that balances badly shows up as its own cost). */
enum cpu_phase { PH_EMBED, PH_NORM, PH_QKV, PH_ROPE, PH_ATTN, PH_O, PH_GATEUP, PH_DOWN, PH_LOGITS, PH_N };
static const char *const phase_name[PH_N] = {"embed", "norm", "qkv", "rope", "attn",
                                             "o", "gate_up", "down", "logits"};

struct cpu_ctx {
    struct cpu_pool *pool;
    const struct cpu_kernels *k;
    int n_threads;
    enum be_kv_dtype kv_req;
    enum be_kv_dtype kv_dtype;
    struct model_config cfg;
    int loaded;

    int mmap_weights;          /* use matrices in place from the file mapping */
    int quant_q8;              /* be_options.quantize "q8_0" */
    int kv_prefault;           /* be_options.kv_prefault */
    struct be_options opt;     /* as created: the load progress callback */
    struct cpu_arena arena;    /* copied / widened matrices */
    struct cpu_layer *layers;  /* (n_layers) */
    struct cpu_mat embed;      /* (vocab, hidden) */
    struct cpu_mat lm_head;    /* (vocab, hidden) */
    float *final_norm;         /* (hidden) */
    float *inv_freq;           /* (head_dim / 2) */
    float rope_mscale;         /* YaRN attention factor on cos/sin */

    int max_tokens;
    float *x;       /* (max_tokens, hidden) residual stream */
    float *xn;      /* (max_tokens, max(hidden, q_dim)) normed f32 input; after
                       a forward, its logits rows' final-normed hidden states
                       (cpu_hidden) */
    int n_hidden;   /* logits rows of the last forward held in xn */
    uint16_t *xb;   /* (max_tokens, max(hidden, q_dim)) bf16 copy of xn / att */
    uint16_t *hb;   /* (max_tokens, inter) bf16 SwiGLU output: apart from xb,
                       which the gate/up gemms are still reading */
    void *xq[CPU_XQ_N];    /* (max_tokens, the widest product input) the
                              input of a quantized product in int8 blocks
                              (qgemm.h), per activation format in use */
    int xq_need[CPU_XQ_N];
    float *q;       /* (max_tokens, n_heads * head_dim) */
    float *kx, *vx; /* (max_tokens, n_kv * head_dim) */
    float *att;     /* (max_tokens, n_heads * head_dim) */
    float *g;       /* (max_tokens, inter) gate, then SwiGLU output */
    float *u;       /* (max_tokens, inter) up */
    float *tmp;     /* (max_tokens, hidden) projection output */
    float *rope;    /* (max_tokens, head_dim) cos then sin of each token's
                       position, once per step for all layers */
    int32_t *tok_seq, *tok_pos; /* (max_tokens) */
    struct attn_item *items;    /* (max_tokens * n_kv_heads) */

    int n_blocks, block_size;
    void *kcache, *vcache; /* (n_layers, n_blocks, n_kv, block_size, head_dim) */
    int kv_packed;         /* each (layer, block, kv head) in the kernels'
                              packed K / V layouts (kernels.h), for the
                              packed attention path; else slot-major rows */
    size_t kv_half;        /* bytes of each (kv_map) */
    /* Attention scratch per thread: scores (ATT_ROWS, s_ld) f32, the query
     * tile (ATT_ROWS, head_dim) as f32 and bf16, its output rows and sums;
     * for the packed path also P as bf16 (ATT_ROWS, s_ld) and the tile's
     * K and V block addresses. */
    float *scratch;
    size_t scratch_per_thread; /* floats */
    int ctx_max;               /* n_blocks * block_size */
    int seq_max;               /* longest sequence: min(ctx_max, max_pos) */
    int s_ld;                  /* row stride of the score tile: seq_max
                                  rounded up to whole blocks */
    int q_tile;                /* queries per attention item: ATT_ROWS / group */

    /* LoRA adapters (lora_apply.h): slot k's adapter (the engine's, kept
     * alive by it until the slot is emptied), this step's rows that run
     * with one, and the rank-wide scratch between the two phases */
    const struct lora_adapter *lora[LORA_MAX_ADAPTERS + 1];
    int lora_max_rank;             /* of the adapters in the slots */
    struct cpu_lora_rows lrows;    /* this forward's */
    int32_t *lrow_t;               /* (max_tokens) */
    const struct lora_adapter **lrow_a; /* (max_tokens) */
    float *lora_tmp;               /* (max_tokens * 3 * lora_max_rank) */

    double prof[PH_N];         /* seconds per phase since the last profile() */
    long prof_steps;           /* forward calls since then */
    int64_t prof_tokens;       /* tokens through them */

    char desc[96];
};

/* Closes the phase that started at *t: adds its time, starts the next. */
static void prof_mark(struct cpu_ctx *c, enum cpu_phase ph, double *t)
{
    double now = rl_mono_s();
    c->prof[ph] += now - *t;
    *t = now;
}

/* ---- load ---- */

/* Activations start on cache lines, as the kernels' loads prefer. */
static void *amalloc(size_t n)
{
    return aligned_alloc(64, (n + 63) & ~(size_t)63);
}

/* A quantized matrix the kernels take as it is (cpu_q_supported); others
 * are dequantized to F32 at load (mat_dequant_f32). */
static int q_native(const struct model_tensor *t)
{
    return quant_is_quantized(t->dtype) &&
           cpu_q_supported(t->dtype, (int)t->rows, (int)t->cols, t->dtype == MODEL_AWQ4 ? t->awq_group : 0);
}

static int q_group(const struct model_tensor *t) { return t->dtype == MODEL_AWQ4 ? t->awq_group : 0; }

/* Whether quantized matrix t goes into gemm_q's panels when this load
 * packs (qpack: q_pack_all): where its format and shape have a panel
 * layout; the rest (shapes without one) keep NATIVE rows beside them. */
static int q_packs(const struct model_tensor *t, int qpack)
{
    return qpack && cpu_q_can_pack(t->dtype, (int)t->rows, (int)t->cols, q_group(t));
}

/* Arena bytes of matrix t; qpack: quantized matrices go into gemm_q's
 * panels (cpu_q_pack) where they can, else their NATIVE rows. */
static size_t mat_bytes(const struct model_tensor *t, int qpack)
{
    if (q_native(t)) {
        qpack = q_packs(t, qpack);
        size_t b = qpack ? cpu_q_panel_bytes(t->dtype, (int)t->cols, q_group(t)) * (size_t)(t->rows / 16)
                         : cpu_q_row_bytes(t->dtype, (int)t->cols, q_group(t)) * (size_t)t->rows;
        return (b + 63) & ~(size_t)63;
    }
    /* FP8 is widened to BF16; other quantized formats to F32 (mat_dequant_f32) */
    size_t el = t->dtype == MODEL_F32 || quant_is_quantized(t->dtype) ? 4 : 2;
    return ((size_t)t->rows * (size_t)t->cols * el + 63) & ~(size_t)63;
}

static int arena_init(struct cpu_arena *a, size_t size)
{
    const size_t huge = (size_t)2 << 20;
    a->size = (size + huge - 1) & ~(huge - 1);
    a->used = 0;
    a->base = NULL;
    if (!a->size)
        return 0;
    void *p = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    madvise(p, a->size, MADV_HUGEPAGE); /* a hint: without THP we still run */
    a->base = p;
    return 0;
}

static void arena_free(struct cpu_arena *a)
{
    if (a->base)
        munmap(a->base, a->size);
    a->base = NULL;
    a->size = a->used = 0;
}

/* Load progress (be_options.progress) in checkpoint bytes. */
struct cpu_progress {
    const struct be_options *o;
    size_t done, total, next;
};

static size_t src_bytes(const struct model_tensor *t)
{
    if (quant_is_quantized(t->dtype)) /* progress counts dequantized elements */
        return (size_t)t->rows * (size_t)t->cols;
    size_t el = t->dtype == MODEL_F32 ? 4 : t->dtype == MODEL_F8_E4M3 ? 1 : 2;
    return (size_t)t->rows * (size_t)t->cols * el;
}

static void progress_add(struct cpu_progress *p, size_t n)
{
    p->done += n;
    if (p->o->progress && (p->done >= p->next || p->done == p->total)) {
        p->o->progress(p->o->progress_user, p->done, p->total);
        p->next = p->done + (p->o->progress_every ? p->o->progress_every : (size_t)64 << 20);
    }
}

/* The fallback for quantized weights (engine/quant.h: GGUF Q8_0 / K-quants,
 * AWQ INT4) that no native kernel takes: the matrix is dequantized once at
 * load into an F32 copy in the arena, through the formats' reference
 * dequantization, so the products run the F32 kernels and activations stay
 * F32 (the fidelity tests hold these to 1e-3 of a float64 forward). It costs
 * 4 bytes a weight (a Q4_K_M 14B needs ~59 GB this way): native kernels
 * replace it format by format, and it stays for whatever they do not
 * cover. The embedding lookup of a quantized embedding kept as it is
 * (native lm_head kernels) is embed_quant_row. */
static void mat_dequant_f32(struct cpu_mat *m, const struct model_tensor *t, struct cpu_arena *a,
                            struct cpu_progress *pg)
{
    float *o = (float *)(a->base + a->used);
    a->used += mat_bytes(t, 0);
    for (int64_t r = 0; r < t->rows; r++) {
        quant_dequant_row(t, r, o + (size_t)r * (size_t)t->cols);
        progress_add(pg, (size_t)t->cols);
    }
    m->dt = MODEL_F32;
    m->w = o;
}

/* After a matrix is copied out of the checkpoint's mapping, its source
 * pages are no longer needed here: they are asked back (MADV_PAGEOUT), so
 * the load's peak resident memory is the arena plus about one matrix, not
 * the arena plus the whole file (a Q4_K_M 14B: ~9 GB instead of ~18 GB).
 * PAGEOUT, not DONTNEED: the weights may be anonymous memory (a test's
 * arrays, a loader's converted copy), which DONTNEED would zero, and
 * another backend may read them after this one; PAGEOUT only drops clean
 * file pages (read back on demand) and moves anonymous ones to swap, if
 * any. A hint: kernels without it ignore it. */
static void release_src(const void *p, size_t n)
{
#ifdef MADV_PAGEOUT
    uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, b = ((uintptr_t)p + n) & ~(uintptr_t)4095;
    if (b > a)
        madvise((void *)a, b - a, MADV_PAGEOUT);
#else
    (void)p, (void)n;
#endif
}

/* Quantized matrices the kernels take (qgemm.h): GGUF's blocks as they
 * are, or on a table with VNNI panels (qpack) repacked into them at about
 * the same size; AWQ converted to rows first (its transposed layout is no
 * use to a row kernel), which needs the arena even with mmap_weights. Row
 * by row for the progress. */
static int mat_bind_q(struct cpu_mat *m, const struct model_tensor *t, struct cpu_arena *a, int copy,
                      int qpack, struct cpu_progress *pg)
{
    int G = q_group(t), rows = (int)t->rows, cols = (int)t->cols;
    size_t rb = cpu_q_row_bytes(t->dtype, cols, G);
    qpack = q_packs(t, qpack);
    m->dt = t->dtype;
    m->q = (struct cpu_qmat){t->dtype, rows, cols, G, qpack ? CPU_QL_PANELS : CPU_QL_NATIVE, t->data};
    const uint8_t *src = t->data;
    uint8_t *conv = NULL;
    if (t->dtype == MODEL_AWQ4) {
        conv = qpack ? malloc(rb * (size_t)rows) : (uint8_t *)(a->base + a->used);
        if (!conv)
            return -1;
        cpu_q_awq_convert(t, conv);
        src = conv;
    }
    if (qpack) {
        uint8_t *dst = (uint8_t *)(a->base + a->used);
        size_t pb = cpu_q_panel_bytes(t->dtype, cols, G);
        for (int r = 0; r < rows; r += 16) {
            cpu_q_pack(t->dtype, 16, cols, G, src + (size_t)r * rb, dst + (size_t)(r / 16) * pb);
            progress_add(pg, (size_t)cols * 16);
        }
        a->used += mat_bytes(t, 1);
        m->q.w = dst;
        free(conv);
        release_src(t->data, t->dtype == MODEL_AWQ4 ? (size_t)rows * (size_t)cols / 2 : rb * (size_t)rows);
    } else if (conv) {
        a->used += mat_bytes(t, 0);
        m->q.w = conv;
        release_src(t->data, (size_t)rows * (size_t)cols / 2);
        progress_add(pg, (size_t)rows * (size_t)cols);
    } else if (copy) {
        uint8_t *dst = (uint8_t *)(a->base + a->used);
        memcpy(dst, src, rb * (size_t)rows);
        a->used += mat_bytes(t, 0);
        m->q.w = dst;
        release_src(src, rb * (size_t)rows);
        progress_add(pg, (size_t)rows * (size_t)cols);
    } else {
        progress_add(pg, (size_t)rows * (size_t)cols);
    }
    m->w = m->q.w;
    return 0;
}

/* Binds matrix t: in place from the mapping, or copied (widened for FP8)
 * into the arena when `copy` is set or the dtype needs widening. The copy
 * goes in progress-sized pieces: it is where the file is actually read. */
static int mat_bind(struct cpu_mat *m, const struct model_tensor *t, const struct model_config *cfg,
                    struct cpu_arena *a, int copy, int qpack, struct cpu_progress *pg)
{
    m->rows = (int)t->rows;
    m->cols = (int)t->cols;
    size_t n = (size_t)m->rows * (size_t)m->cols;
    if (q_native(t))
        return mat_bind_q(m, t, a, copy, qpack, pg);
    if (quant_is_quantized(t->dtype)) {
        mat_dequant_f32(m, t, a, pg);
        return 0;
    }
    if (t->dtype != MODEL_F8_E4M3) {
        m->dt = t->dtype;
        m->w = t->data;
        if (copy) {
            char *dst = a->base + a->used;
            size_t bytes = n * (t->dtype == MODEL_F32 ? 4 : 2), piece = (size_t)16 << 20;
            for (size_t off = 0; off < bytes; off += piece) {
                size_t k = bytes - off < piece ? bytes - off : piece;
                memcpy(dst + off, (const char *)t->data + off, k);
                progress_add(pg, k);
            }
            a->used += mat_bytes(t, 0);
            m->w = dst;
        } else {
            progress_add(pg, src_bytes(t));
        }
        return 0;
    }
    /* FP8 -> BF16 with the 128x128 block scale folded in. */
    uint16_t *o = (uint16_t *)(a->base + a->used);
    a->used += mat_bytes(t, 0);
    const uint8_t *src = t->data;
    int bc = (m->cols + cfg->fp8_block_cols - 1) / cfg->fp8_block_cols;
    for (int r = 0; r < m->rows; r++) {
        const float *srow = t->scale_f32 + (size_t)(r / cfg->fp8_block_rows) * (size_t)bc;
        for (int c = 0; c < m->cols; c++) {
            size_t i = (size_t)r * (size_t)m->cols + (size_t)c;
            o[i] = f32_to_bf16(f8e4m3_to_f32(src[i]) * srow[c / cfg->fp8_block_cols]);
        }
        progress_add(pg, (size_t)m->cols);
    }
    m->dt = MODEL_BF16;
    m->w = o;
    return 0;
}

/* Repacks the arena's BF16 matrices into gemm_bf16p's panels, once, after
 * the copy: the packed kernel reaches about 1.4x the prefill rate and 1.7x
 * the 16-row rate of gemm_bf16 (bench_kernels --ab). Only when the kernel
 * table has it, the weights were copied (the file mapping is read-only), and
 * every matrix splits into whole panels - the thread split of stacked
 * matrices (chunk_rows) then lands on panel boundaries. A tied embedding is
 * packed too, for the lm_head product (at 16 rows the row-major kernel cost
 * 3x the weight streaming); the token lookup gathers its row from the
 * panels (embed_task). */
static int pack_ok(const struct cpu_mat *m)
{
    return m->dt == MODEL_BF16 && m->rows % 16 == 0 && m->cols % 2 == 0;
}

/* The matrices pack_weights() packs: lm_head (untied only) as index -1,
 * then each layer's seven. Returns how many it put in out. */
static int pack_list(struct cpu_ctx *c, int l, struct cpu_mat *out[7])
{
    if (l < 0) {
        out[0] = c->cfg.tied ? &c->embed : &c->lm_head;
        return pack_ok(out[0]);
    }
    struct cpu_layer *L = &c->layers[l];
    struct cpu_mat *ms[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down};
    memcpy(out, ms, sizeof ms);
    return 7;
}

static int pack_weights(struct cpu_ctx *c)
{
    if (!c->k->gemm_bf16p || c->mmap_weights)
        return 0;
    struct cpu_mat *ms[7];
    size_t biggest = 0;
    for (int l = -1; l < c->cfg.n_layers; l++)
        for (int i = 0, n = pack_list(c, l, ms); i < n; i++) {
            if (l >= 0 && ms[i]->dt != MODEL_BF16)
                continue; /* quantized (gemm_q's own layout) or F32/F16 */
            if (l >= 0 && !pack_ok(ms[i]))
                return 0; /* all BF16 layers packed or none: simpler to reason about */
            size_t bytes = (size_t)ms[i]->rows * (size_t)ms[i]->cols * 2;
            biggest = bytes > biggest ? bytes : biggest;
        }
    uint16_t *tmp = malloc(biggest);
    if (!tmp)
        return -1;
    for (int l = -1; l < c->cfg.n_layers; l++)
        for (int i = 0, n = pack_list(c, l, ms); i < n; i++) {
            if (!pack_ok(ms[i]))
                continue;
            memcpy(tmp, ms[i]->w, (size_t)ms[i]->rows * (size_t)ms[i]->cols * 2);
            cpu_pack_bf16(tmp, ms[i]->rows, ms[i]->cols, (uint16_t *)ms[i]->w);
            ms[i]->packed = 1;
        }
    if (c->cfg.tied)
        c->lm_head = c->embed;
    free(tmp);
    return 0;
}

/* Bytes the arena needs for the matrices that will live in it. */
static size_t arena_need(const struct model_config *cfg, const struct model_weights *w, int copy, int qpack)
{
    size_t total = 0;
#define NEED(t)                                                               \
    total += (copy || (t).dtype == MODEL_F8_E4M3 || (t).dtype == MODEL_AWQ4 || qpack || \
              (quant_is_quantized((t).dtype) && !q_native(&(t))))            \
                 ? mat_bytes(&(t), qpack)                                     \
                 : 0
    NEED(w->embed);
    if (!cfg->tied)
        NEED(w->lm_head);
    for (int l = 0; l < cfg->n_layers; l++) {
        const struct model_layer *S = &w->layers[l];
        NEED(S->wq), NEED(S->wk), NEED(S->wv), NEED(S->wo);
        NEED(S->w_gate), NEED(S->w_up), NEED(S->w_down);
    }
#undef NEED
    return total;
}

static float *vec_f32(const struct model_tensor *t)
{
    int n = (int)t->cols;
    float *v = malloc((size_t)n * sizeof *v);
    if (!v)
        return NULL;
    for (int i = 0; i < n; i++) {
        switch (t->dtype) {
        case MODEL_F32: memcpy(&v[i], (const char *)t->data + 4 * (size_t)i, 4); break;
        case MODEL_BF16: {
            uint16_t h;
            memcpy(&h, (const char *)t->data + 2 * (size_t)i, 2);
            v[i] = bf16_to_f32(h);
            break;
        }
        case MODEL_F16: {
            uint16_t h;
            memcpy(&h, (const char *)t->data + 2 * (size_t)i, 2);
            v[i] = f16_to_f32(h);
            break;
        }
        case MODEL_F8_E4M3: v[i] = f8e4m3_to_f32(((const uint8_t *)t->data)[i]); break;
        default: /* vectors (norms) are never quantized: the loaders refuse it */
            free(v);
            return NULL;
        }
    }
    return v;
}

static int rope_init(struct cpu_ctx *c)
{
    c->inv_freq = malloc((size_t)(c->cfg.head_dim / 2) * sizeof(float));
    if (!c->inv_freq)
        return -1;
    model_rope_inv_freq(&c->cfg, c->inv_freq, &c->rope_mscale);
    return 0;
}

static void free_weights(struct cpu_ctx *c)
{
    if (c->layers) {
        for (int l = 0; l < c->cfg.n_layers; l++) {
            struct cpu_layer *L = &c->layers[l];
            free(L->attn_norm), free(L->mlp_norm), free(L->q_norm), free(L->k_norm);
        }
        free(c->layers);
        c->layers = NULL;
    }
    arena_free(&c->arena);
    free(c->final_norm), free(c->inv_freq);
    c->final_norm = NULL, c->inv_freq = NULL;
    free(c->x), free(c->xn), free(c->xb), free(c->q), free(c->kx), free(c->vx);
    free(c->att), free(c->g), free(c->u), free(c->tmp), free(c->tok_seq), free(c->tok_pos);
    free(c->items), free(c->hb), free(c->rope), free(c->xq[0]), free(c->xq[1]);
    c->xq[0] = c->xq[1] = NULL;
    c->rope = NULL;
    c->items = NULL;
    c->hb = NULL;
    c->x = c->xn = c->q = c->kx = c->vx = c->att = c->g = c->u = c->tmp = NULL;
    c->xb = NULL, c->tok_seq = c->tok_pos = NULL;
    c->loaded = 0;
}

/* --quantize q8_0: the float matrices of w (F32, BF16, F16; the embedding
 * too, which a tied checkpoint multiplies as the lm_head) quantized to
 * Q8_0 rows with quant.c's reference quantizer, into a copy of the weight
 * table (*qw, layers in *ql) that the load then takes like a Q8_0 GGUF's.
 * The Q8_0 rows are malloc'd, listed in bufs (up to 2 + 7 n_layers), and
 * freed by the caller after the load has copied them. */
static int quantize_q8_0(const struct model_config *cfg, const struct model_weights *w,
                         struct model_weights *qw, struct model_layer **ql, void **bufs, int *n_bufs)
{
    *qw = *w;
    *n_bufs = 0;
    if (!(*ql = malloc((size_t)cfg->n_layers * sizeof **ql)))
        return -1;
    memcpy(*ql, w->layers, (size_t)cfg->n_layers * sizeof **ql);
    qw->layers = *ql;
    float *row = malloc((size_t)(cfg->hidden > cfg->intermediate ? cfg->hidden : cfg->intermediate) * 4 +
                        (size_t)cfg->n_heads * (size_t)cfg->head_dim * 4);
    if (!row)
        return -1;
    for (int l = -1; l < cfg->n_layers; l++) {
        struct model_tensor *ts[7];
        int n = 0;
        if (l < 0) {
            ts[n++] = &qw->embed;
            if (!cfg->tied)
                ts[n++] = &qw->lm_head;
        } else {
            struct model_layer *S = &(*ql)[l];
            struct model_tensor *ls[7] = {&S->wq, &S->wk, &S->wv, &S->wo, &S->w_gate, &S->w_up, &S->w_down};
            memcpy(ts, ls, sizeof ls);
            n = 7;
        }
        for (int i = 0; i < n; i++) {
            struct model_tensor *t = ts[i];
            if ((t->dtype != MODEL_F32 && t->dtype != MODEL_BF16 && t->dtype != MODEL_F16) || t->cols % 32)
                continue;
            size_t rb = quant_row_bytes(MODEL_Q8_0, t->cols);
            uint8_t *q = malloc(rb * (size_t)t->rows);
            if (!q) {
                free(row);
                return -1;
            }
            bufs[(*n_bufs)++] = q;
            for (int64_t r = 0; r < t->rows; r++) {
                const char *src = (const char *)t->data + (size_t)r * (size_t)t->cols * (t->dtype == MODEL_F32 ? 4 : 2);
                for (int64_t c = 0; c < t->cols; c++) {
                    uint16_t h;
                    if (t->dtype == MODEL_F32)
                        memcpy(&row[c], src + 4 * c, 4);
                    else {
                        memcpy(&h, src + 2 * c, 2);
                        row[c] = t->dtype == MODEL_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
                    }
                }
                quant_quantize_q8_0(row, (struct quant_block_q8_0 *)(q + (size_t)r * rb), t->cols);
            }
            t->dtype = MODEL_Q8_0;
            t->data = q;
        }
    }
    if (cfg->tied)
        qw->lm_head = qw->embed;
    free(row);
    return 0;
}

/* Whether this load puts quantized matrices into gemm_q's panels: the
 * table reads them, the weights are copied, and every matrix of the layers
 * has whole 16-row panels, so that the row splits of stacked matrices
 * (multiples of 64 from the first row of the stack) land on panel
 * boundaries of each; then each quantized matrix packs where its format
 * has panels (q_packs). */
static int q_pack_all(const struct cpu_ctx *c, const struct model_config *cfg, const struct model_weights *w)
{
    if (!c->k->q_panels || c->mmap_weights)
        return 0;
    const struct model_tensor *ts[2 + 7];
    int any = 0;
    for (int l = -1; l < cfg->n_layers; l++) {
        int n = 0;
        if (l < 0) {
            ts[n++] = &w->embed;
            if (!cfg->tied)
                ts[n++] = &w->lm_head;
        } else {
            const struct model_layer *S = &w->layers[l];
            const struct model_tensor *ls[7] = {&S->wq, &S->wk, &S->wv, &S->wo, &S->w_gate, &S->w_up, &S->w_down};
            memcpy(ts, ls, sizeof ls);
            n = 7;
        }
        for (int i = 0; i < n; i++) {
            if (l >= 0 && ts[i]->rows % 16) /* stacked: see above */
                return 0;
            any |= q_native(ts[i]) && cpu_q_can_pack(ts[i]->dtype, (int)ts[i]->rows, (int)ts[i]->cols,
                                                      q_group(ts[i]));
        }
    }
    return any;
}

/* The activation formats the quantized matrices of this load read. */
static void q_formats(struct cpu_ctx *c, const struct model_config *cfg, const struct model_weights *w)
{
    c->xq_need[0] = c->xq_need[1] = 0;
    const struct model_tensor *ts[7];
    for (int l = -1; l < cfg->n_layers; l++) {
        int n = 1;
        if (l < 0) {
            ts[0] = cfg->tied ? &w->embed : &w->lm_head;
        } else {
            const struct model_layer *S = &w->layers[l];
            const struct model_tensor *ls[7] = {&S->wq, &S->wk, &S->wv, &S->wo, &S->w_gate, &S->w_up, &S->w_down};
            memcpy(ts, ls, sizeof ls);
            n = 7;
        }
        for (int i = 0; i < n; i++)
            if (q_native(ts[i]))
                c->xq_need[cpu_xq_for(ts[i]->dtype)] = 1;
    }
}

static int cpu_load(void *ctx, const struct model_config *cfg, const struct model_weights *w,
                    int max_tokens, struct rl_err *err)
{
    struct cpu_ctx *c = ctx;
    if (max_tokens < 1)
        return rl_errf(err, RL_EINVAL, "max_tokens must be >= 1");
    free_weights(c);
    c->cfg = *cfg;
    int rc;
    /* --quantize q8_0: the load below takes a Q8_0 copy of the weights */
    struct model_weights qw;
    struct model_layer *ql = NULL;
    void **qbufs = NULL;
    int n_qbufs = 0;
    if (c->quant_q8) {
        if (!(qbufs = calloc((size_t)(2 + 7 * cfg->n_layers), sizeof *qbufs)) ||
            quantize_q8_0(cfg, w, &qw, &ql, qbufs, &n_qbufs))
            goto oom;
        w = &qw;
    }
    c->layers = calloc((size_t)cfg->n_layers, sizeof *c->layers);
    if (!c->layers)
        goto oom;
    int copy = !c->mmap_weights;
    struct cpu_progress pg = {.o = &c->opt};
    pg.total = src_bytes(&w->embed) + (cfg->tied ? 0 : src_bytes(&w->lm_head));
    for (int l = 0; l < cfg->n_layers; l++) {
        const struct model_layer *S = &w->layers[l];
        pg.total += src_bytes(&S->wq) + src_bytes(&S->wk) + src_bytes(&S->wv) + src_bytes(&S->wo) +
                    src_bytes(&S->w_gate) + src_bytes(&S->w_up) + src_bytes(&S->w_down);
    }
    int qpack = q_pack_all(c, cfg, w);
    if (arena_init(&c->arena, arena_need(cfg, w, copy, qpack))) {
        rc = rl_errf(err, RL_ENOMEM, "cpu backend: cannot map %zu bytes for the weights",
                     arena_need(cfg, w, copy, qpack));
        goto fail;
    }
    if (mat_bind(&c->embed, &w->embed, cfg, &c->arena, copy, qpack, &pg))
        goto oom;
    if (cfg->tied)
        c->lm_head = c->embed;
    else if (mat_bind(&c->lm_head, &w->lm_head, cfg, &c->arena, copy, qpack, &pg))
        goto oom;
    if (!(c->final_norm = vec_f32(&w->final_norm)))
        goto oom;
    for (int l = 0; l < cfg->n_layers; l++) {
        const struct model_layer *S = &w->layers[l];
        struct cpu_layer *L = &c->layers[l];
        if (!(L->attn_norm = vec_f32(&S->attn_norm)) || !(L->mlp_norm = vec_f32(&S->mlp_norm)) ||
            !(L->q_norm = vec_f32(&S->q_norm)) || !(L->k_norm = vec_f32(&S->k_norm)))
            goto oom;
        if (mat_bind(&L->wq, &S->wq, cfg, &c->arena, copy, qpack, &pg) ||
            mat_bind(&L->wk, &S->wk, cfg, &c->arena, copy, qpack, &pg) ||
            mat_bind(&L->wv, &S->wv, cfg, &c->arena, copy, qpack, &pg) ||
            mat_bind(&L->wo, &S->wo, cfg, &c->arena, copy, qpack, &pg) ||
            mat_bind(&L->gate, &S->w_gate, cfg, &c->arena, copy, qpack, &pg) ||
            mat_bind(&L->up, &S->w_up, cfg, &c->arena, copy, qpack, &pg) ||
            mat_bind(&L->down, &S->w_down, cfg, &c->arena, copy, qpack, &pg))
            goto oom;
    }
    q_formats(c, cfg, w);
    if (pack_weights(c))
        goto oom;
    if (rope_init(c))
        goto oom;
    size_t T = (size_t)max_tokens, H = (size_t)cfg->hidden, I = (size_t)cfg->intermediate;
    size_t Q = (size_t)cfg->n_heads * (size_t)cfg->head_dim;
    size_t KV = (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim;
    size_t wide = H > Q ? H : Q;
    c->max_tokens = max_tokens;
    if (!(c->x = amalloc(T * H * 4)) || !(c->xn = amalloc(T * wide * 4)) ||
        !(c->xb = amalloc(T * wide * 2)) || !(c->hb = amalloc(T * I * 2)) || !(c->q = amalloc(T * Q * 4)) ||
        !(c->kx = amalloc(T * KV * 4)) || !(c->vx = amalloc(T * KV * 4)) ||
        !(c->att = amalloc(T * Q * 4)) || !(c->g = amalloc(T * I * 4)) ||
        !(c->u = amalloc(T * I * 4)) || !(c->tmp = amalloc(T * H * 4)) ||
        !(c->rope = amalloc(T * (size_t)cfg->head_dim * 4)) ||
        !(c->tok_seq = amalloc(T * 4)) || !(c->tok_pos = amalloc(T * 4)) ||
        !(c->items = amalloc(T * (size_t)cfg->n_kv_heads * sizeof *c->items)))
        goto oom;
    size_t kmax = wide > I ? wide : I;
    for (int f = 0; f < CPU_XQ_N; f++)
        if (c->xq_need[f] && !(c->xq[f] = amalloc(T * cpu_xq_row_bytes((enum cpu_xq)f, (int)kmax + 255))))
            goto oom;
    c->kv_dtype = c->kv_req != BE_KV_AUTO ? c->kv_req
                  : cfg->dtype == MODEL_F32 && w->layers[0].wq.dtype == MODEL_F32 ? BE_KV_F32
                                                                       : BE_KV_BF16;
    c->loaded = 1;
    rc = 0;
    goto out;
oom:
    rc = rl_errf(err, RL_ENOMEM, "cpu backend: out of memory loading weights");
fail:
    free_weights(c);
out:
    for (int i = 0; i < n_qbufs; i++)
        free(qbufs[i]);
    free(qbufs);
    free(ql);
    return rc;
}

/* ---- KV cache ---- */

static size_t kv_elem(const struct cpu_ctx *c) { return c->kv_dtype == BE_KV_F32 ? 4 : 2; }

static size_t cpu_kv_block_bytes(void *ctx, int block_size)
{
    struct cpu_ctx *c = ctx;
    return 2 * (size_t)c->cfg.n_layers * (size_t)c->cfg.n_kv_heads * (size_t)c->cfg.head_dim *
           (size_t)block_size * kv_elem(c);
}

/* The KV arrays: anonymous mappings, so untouched blocks cost no memory
 * (fresh pages read as zero), with a transparent-huge-page hint: the first
 * write into each page faults, and on this VM a fault costs more than the
 * zeroing - at 4 KiB pages the first pass of a batch through its blocks
 * spent about 3 % of a step in page faults. */
static void *kv_map(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    madvise(p, bytes, MADV_HUGEPAGE); /* a hint; without THP we still run */
    return p;
}

/* Touches one byte per 4 KiB page of both KV arrays, the pages split
 * across the pool's threads (the kernel zeroes each page at its fault, and
 * that zeroing is the cost worth spreading). */
struct prefault_job {
    struct cpu_ctx *c;
};

static void prefault_task(void *arg, int ith, int nth)
{
    const struct prefault_job *j = arg;
    size_t pages = (j->c->kv_half + 4095) / 4096;
    size_t a = pages * (size_t)ith / (size_t)nth, b = pages * (size_t)(ith + 1) / (size_t)nth;
    for (size_t p = a; p < b; p++) {
        ((volatile char *)j->c->kcache)[p * 4096] = 0;
        ((volatile char *)j->c->vcache)[p * 4096] = 0;
    }
}

static void kv_unmap(struct cpu_ctx *c)
{
    if (c->kcache)
        munmap(c->kcache, c->kv_half);
    if (c->vcache)
        munmap(c->vcache, c->kv_half);
    c->kcache = c->vcache = NULL;
}

static int cpu_kv_init(void *ctx, int n_blocks, int block_size, struct rl_err *err)
{
    struct cpu_ctx *c = ctx;
    if (!c->loaded)
        return rl_errf(err, RL_EINVAL, "cpu backend: kv_init before load");
    if (n_blocks < 1 || block_size < 1)
        return rl_errf(err, RL_EINVAL, "cpu backend: kv pool needs n_blocks >= 1 and block_size >= 1");
    kv_unmap(c);
    free(c->scratch);
    c->scratch = NULL;
    size_t half = cpu_kv_block_bytes(c, block_size) / 2 * (size_t)n_blocks;
    c->ctx_max = n_blocks * block_size;
    c->seq_max = c->ctx_max < c->cfg.max_pos ? c->ctx_max : c->cfg.max_pos;
    int group = c->cfg.n_heads / c->cfg.n_kv_heads;
    c->q_tile = ATT_ROWS / group > 0 ? ATT_ROWS / group : 1;
    size_t rows = (size_t)c->q_tile * (size_t)group;
    const struct cpu_kernels *k = c->k;
    c->kv_packed = c->kv_dtype == BE_KV_BF16 && block_size == 16 && c->cfg.head_dim % 32 == 0 &&
                   k->kv_put_bf16p && k->scores_bf16p && k->pv_bf16p && k->softmax;
    c->s_ld = (c->seq_max + block_size - 1) / block_size * block_size;
    size_t n_blk = (size_t)(c->seq_max + block_size - 1) / (size_t)block_size;
    /* scores, f32 queries, bf16 queries (half of that), the output rows
     * O, their softmax sums, P in bf16 (half the scores), two block
     * address lists (two floats per pointer), and alignment slack */
    c->scratch_per_thread = rows * (size_t)c->s_ld + rows * (size_t)c->cfg.head_dim * 3 + rows +
                            rows * (size_t)c->s_ld / 2 + 4 * n_blk + 64;
    c->scratch_per_thread = (c->scratch_per_thread + 15) & ~(size_t)15;
    c->kv_half = half;
    c->kcache = kv_map(half);
    c->vcache = kv_map(half);
    c->scratch = amalloc((size_t)c->n_threads * c->scratch_per_thread * 4);
    if (!c->kcache || !c->vcache || !c->scratch) {
        kv_unmap(c);
        free(c->scratch);
        c->scratch = NULL;
        return rl_errf(err, RL_ENOMEM, "cpu backend: cannot allocate %zu bytes of KV cache", 2 * half);
    }
    c->n_blocks = n_blocks;
    c->block_size = block_size;
    if (c->kv_prefault) {
        struct prefault_job pj = {c};
        cpu_pool_run(c->pool, prefault_task, &pj);
    }
    return 0;
}

/* Address of (layer, block, kv head, slot) in a cache array. */
static inline void *kv_at(const struct cpu_ctx *c, void *base, int layer, int block, int h, int slot)
{
    size_t hd = (size_t)c->cfg.head_dim, nkv = (size_t)c->cfg.n_kv_heads, bs = (size_t)c->block_size;
    size_t idx = ((((size_t)layer * (size_t)c->n_blocks + (size_t)block) * nkv + (size_t)h) * bs +
                  (size_t)slot) * hd;
    return (char *)base + idx * kv_elem(c);
}

static int cpu_kv_copy(void *ctx, int32_t dst, int32_t src, int n_tokens, struct rl_err *err)
{
    struct cpu_ctx *c = ctx;
    if (dst < 0 || src < 0 || dst >= c->n_blocks || src >= c->n_blocks || n_tokens < 0 ||
        n_tokens > c->block_size)
        return rl_errf(err, RL_EINVAL, "cpu backend: kv_copy(%d, %d, %d) out of range", dst, src, n_tokens);
    /* packed blocks interleave their slots: copy all of it (what lies past
     * n_tokens is dead in both) */
    size_t n = (size_t)(c->kv_packed ? c->block_size : n_tokens) * (size_t)c->cfg.head_dim * kv_elem(c);
    for (int l = 0; l < c->cfg.n_layers; l++)
        for (int h = 0; h < c->cfg.n_kv_heads; h++) {
            memcpy(kv_at(c, c->kcache, l, dst, h, 0), kv_at(c, c->kcache, l, src, h, 0), n);
            memcpy(kv_at(c, c->vcache, l, dst, h, 0), kv_at(c, c->vcache, l, src, h, 0), n);
        }
    return 0;
}

/* ---- parallel loops ---- */

/* Up to three matrices sharing one input, their rows stacked and split
 * across threads in CPU_GEMM_N_ALIGN steps. */
#define MM_MAX_RANGES (3 * 64) /* matrices x threads of the decode split */
struct mm_job {
    const struct cpu_kernels *k;
    int M, n_mats;
    const struct cpu_mat *mat[3];
    float *y[3];
    int ldy[3];
    const float *x;      /* (M, K) f32, for F32/F16 and quantized matrices */
    const uint16_t *xb;  /* (M, K) bf16, for BF16 matrices */
    int ldx;
    /* quantized matrices: x in their activation format (mm_run fills them
     * from x before the product), rows ldxq[f] bytes apart */
    void *xq[CPU_XQ_N];
    size_t ldxq[CPU_XQ_N];
    /* SwiGLU fusion: when set, mat[0] = gate and mat[1] = up over the same
     * rows; each thread turns its own columns of y[0] into silu(g) * u. */
    int swiglu;
    uint16_t *hb;        /* (M, rows) bf16 copy of the SwiGLU output, or NULL */
    _Atomic int next;    /* first row not yet handed out (starts at 0) */
    /* Decode (mm_tiles, set by mm_run): range[i * nth + h] holds thread
     * h's share of matrix i as tiles lo..hi-1 of its rows, lo | hi << 32 */
    int tiles, nth;
    _Atomic uint64_t range[MM_MAX_RANGES];
};

/* The matrices whose rows the job shares out (fused gate/up: gate's rows
 * stand for both). */
static int mm_n_split(const struct mm_job *j) { return j->swiglu ? 1 : j->n_mats; }

static void mm_one(const struct mm_job *j, int i, int n0, int n1)
{
    const struct cpu_mat *m = j->mat[i];
    if (quant_is_quantized(m->dt)) {
        enum cpu_xq f = cpu_xq_for(m->dt);
        j->k->gemm_q(j->M, n0, n1, &m->q, j->xq[f], j->ldxq[f], j->y[i], j->ldy[i]);
        return;
    }
    switch (m->dt) {
    case MODEL_BF16:
        if (m->packed)
            j->k->gemm_bf16p(j->M, n0, n1, m->cols, j->xb, j->ldx, m->w, j->y[i], j->ldy[i]);
        else
            j->k->gemm_bf16(j->M, n0, n1, m->cols, j->xb, j->ldx, m->w, j->y[i], j->ldy[i]);
        break;
    case MODEL_F32:
        j->k->gemm_f32(j->M, n0, n1, m->cols, j->x, j->ldx, m->w, j->y[i], j->ldy[i]);
        break;
    default:
        j->k->gemm_f16(j->M, n0, n1, m->cols, j->x, j->ldx, m->w, j->y[i], j->ldy[i]);
        break;
    }
}

/* Takes the next rows [*a, *b) of a dynamically shared product off the
 * job's counter. Chunks rather than one fixed share per thread: on a
 * shared machine a thread that loses its core for a while no longer holds
 * the other one at the barrier, the other simply takes more chunks; and
 * which thread computes a row changes no bits (kernels.h). Guided sizes: a
 * chunk is a share of what is left (remaining / 2 nth, whole 64-row
 * tiles, so packed panels stay whole), so they shrink towards the end and
 * the first thread to run out waits for a small one, not for an eighth of
 * the product (fixed eighths cost prefill about 3 % at the barriers).
 * With few rows (M <= 24: decode batches, and decode where mm_tiles does
 * not apply) the weights stream from memory and every
 * chunk starts its stream cold, so chunks are at least 512 rows: on the
 * 1024-row o and down projections at M = 16, 128-row chunks cost them
 * 15-20 %. */
static int take_rows(_Atomic int *next, int total, int nth, int M, int *a, int *b)
{
    int floor = M <= 24 ? 512 : 64;
    int cur = atomic_load_explicit(next, memory_order_relaxed);
    for (;;) {
        if (cur >= total)
            return 0;
        int ch = ((total - cur) / (2 * nth) + 63) / 64 * 64;
        ch = ch < floor ? floor : ch;
        int end = total - cur > ch ? cur + ch : total;
        if (atomic_compare_exchange_weak_explicit(next, &cur, end, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *a = cur;
            *b = end;
            return 1;
        }
    }
}

/* Decode products (M <= CPU_SPREAD_MAX_M, packed BF16 weights): each
 * matrix's rows are cut into one share per thread, and each share into the
 * kernel's tiles (gemm_bf16p_tiles), whose weights stream as one range. A
 * thread takes its own shares' tiles from the front, one at a time, then
 * the others' from the back until none is left: its own tiles keep one
 * stream going (the prefetch runs on from tile to tile), a thread that
 * loses its core is covered, and the threads end within a tile of each
 * other. Chunks of rows, as below, left 5-8 % of the threads' time idle
 * at the ends of the decode products, a whole chunk of one thread against
 * nothing of the other. Which thread computes a tile changes no bits. */
static int mm_cut(const struct mm_job *j, int i, int h)
{
    return h == j->nth ? j->mat[i]->rows : (int)((int64_t)j->mat[i]->rows * h / j->nth) / 64 * 64;
}

/* Thread h's share of matrix i: rows [*n0, *n1), whole 64-row tiles but
 * for the last share's end. */
static void mm_share(const struct mm_job *j, int i, int h, int *n0, int *n1)
{
    *n0 = mm_cut(j, i, h);
    *n1 = mm_cut(j, i, h + 1);
}

static void mm_tile(const struct mm_job *j, int i, int h, int t)
{
    const struct cpu_mat *m = j->mat[i];
    int n0, n1;
    mm_share(j, i, h, &n0, &n1);
    if (j->swiglu)
        j->k->gemm_bf16p_tiles(j->M, n0, n1, t, t + 1, m->cols, j->xb, j->ldx, m->w, j->mat[1]->w,
                               j->y[0], j->y[1], j->ldy[0], j->hb, j->ldy[0]);
    else
        j->k->gemm_bf16p_tiles(j->M, n0, n1, t, t + 1, m->cols, j->xb, j->ldx, m->w, NULL, j->y[i],
                               NULL, j->ldy[i], NULL, 0);
}

/* Takes one tile of range r, from the front (own) or the back; -1 when
 * none is left. */
static int mm_take(struct mm_job *j, int r, int own)
{
    uint64_t s = atomic_load_explicit(&j->range[r], memory_order_relaxed);
    for (;;) {
        uint32_t lo = (uint32_t)s, hi = (uint32_t)(s >> 32);
        if (lo >= hi)
            return -1;
        uint64_t to = own ? s + 1 : s - ((uint64_t)1 << 32);
        if (atomic_compare_exchange_weak_explicit(&j->range[r], &s, to, memory_order_relaxed,
                                                  memory_order_relaxed))
            return own ? (int)lo : (int)hi - 1;
    }
}

static void mm_tiles(struct mm_job *j, int ith)
{
    int n = mm_n_split(j), t;
    for (int i = 0; i < n; i++)
        while ((t = mm_take(j, i * j->nth + ith, 1)) >= 0)
            mm_tile(j, i, ith, t);
    for (int d = 1; d < j->nth; d++) {
        int h = (ith + d) % j->nth;
        for (int i = 0; i < n; i++)
            while ((t = mm_take(j, i * j->nth + h, 0)) >= 0)
                mm_tile(j, i, h, t);
    }
}

static void mm_task(void *arg, int ith, int nth)
{
    struct mm_job *j = arg;
    if (j->tiles) {
        mm_tiles(j, ith);
        return;
    }
    int total = 0;
    for (int i = 0; i < mm_n_split(j); i++)
        total += j->mat[i]->rows;
    int a, b;
    while (take_rows(&j->next, total, nth, j->M, &a, &b)) {
        if (j->swiglu && j->hb && j->k->gemm_bf16p_glu && j->mat[0]->packed && j->mat[1]->packed) {
            /* gate, up and SwiGLU in one pass: h never exists as f32 */
            j->k->gemm_bf16p_glu(j->M, a, b, j->mat[0]->cols, j->xb, j->ldx, j->mat[0]->w, j->mat[1]->w,
                                 j->y[0], j->y[1], j->ldy[0], j->hb, j->ldy[0]);
            continue;
        }
        if (j->swiglu) {
            mm_one(j, 0, a, b);
            mm_one(j, 1, a, b);
            for (int m = 0; m < j->M; m++) {
                float *g = j->y[0] + (size_t)m * (size_t)j->ldy[0];
                const float *u = j->y[1] + (size_t)m * (size_t)j->ldy[1];
                if (j->k->swiglu)
                    j->k->swiglu(g + a, u + a, b - a);
                else
                    for (int n = a; n < b; n++)
                        g[n] = g[n] / (1.0f + expf(-g[n])) * u[n];
                if (j->hb)
                    j->k->f32_to_bf16(g + a, j->hb + (size_t)m * (size_t)j->ldy[0] + a, b - a);
            }
            continue;
        }
        int base = 0;
        for (int i = 0; i < j->n_mats; i++) {
            int r = j->mat[i]->rows;
            int lo = a > base ? a - base : 0, hi = b - base < r ? b - base : r;
            if (lo < hi)
                mm_one(j, i, lo, hi);
            base += r;
        }
    }
}

/* RMSNorm of rows of x into xn (f32) and, when bf16 is set, xb. */
struct norm_job {
    const struct cpu_kernels *k;
    float *x;
    int ldx;
    const int32_t *rows; /* which rows of x, or NULL for 0..n-1 */
    int n, dim;
    const float *w;
    float eps;
    float *xn;
    uint16_t *xb;
    const float *add;    /* residual first: x += add, row for row (rows NULL,
                            same stride), then the norm; one pass, one
                            barrier fewer than a separate add */
    _Atomic int next;    /* next chunk of rows to hand out (starts at 0) */
};

static void rmsnorm_row(const float *x, const float *w, float *y, int n, float eps)
{
    /* Double accumulation: cheap at these sizes and independent of order
     * worries; the result is still a pure function of the row. */
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++)
        y[i] = w[i] * (x[i] * r);
}

static void norm_row(const struct cpu_kernels *k, const float *x, const float *w, float *y, int n,
                     float eps)
{
    if (k->rmsnorm)
        k->rmsnorm(x, w, y, n, eps);
    else
        rmsnorm_row(x, w, y, n, eps);
}

static void norm_task(void *arg, int ith, int nth)
{
    struct norm_job *j = arg;
    int ch = j->n / (nth * 4) > 1 ? j->n / (nth * 4) : 1;
    for (;;) {
        int i0 = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed) * ch;
        if (i0 >= j->n)
            return;
        for (int i = i0; i < j->n && i < i0 + ch; i++) {
            int src = j->rows ? j->rows[i] : i;
            float *x = j->x + (size_t)src * (size_t)j->ldx;
            if (j->add) {
                const float *a = j->add + (size_t)src * (size_t)j->ldx;
                for (int d = 0; d < j->dim; d++)
                    x[d] += a[d];
            }
            float *y = j->xn + (size_t)i * (size_t)j->dim;
            norm_row(j->k, x, j->w, y, j->dim, j->eps);
            if (j->xb)
                j->k->f32_to_bf16(y, j->xb + (size_t)i * (size_t)j->dim, j->dim);
        }
    }
}

static void run(struct cpu_ctx *c, cpu_pool_fn fn, void *arg, int n_items)
{
    if (n_items <= 1) /* not worth waking the pool */
        fn(arg, 0, 1);
    else
        cpu_pool_run(c->pool, fn, arg);
}

/* For the tasks that take their work from a shared counter (mm, norm,
 * attention): a worker that has not started when the caller is done is
 * not waited for (pool.h). */
static void run_dyn(struct cpu_ctx *c, cpu_pool_fn fn, void *arg, int n_items)
{
    if (n_items <= 1)
        fn(arg, 0, 1);
    else
        cpu_pool_run_dyn(c->pool, fn, arg);
}

/* q/k norm + rotary + KV write, one token per iteration. */
struct rope_job {
    struct cpu_ctx *c;
    const struct cpu_layer *L;
    int layer, n_tokens;
    const struct be_batch *b;
};

static void rope_apply(float *v, const float *cs, const float *sn, int half)
{
    for (int i = 0; i < half; i++) {
        float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * cs[i] - x1 * sn[i];
        v[i + half] = x1 * cs[i] + x0 * sn[i];
    }
}

/* A token's write into a packed block touches every line of its K block
 * (each line holds one pair of dimensions for all 16 slots) and one line
 * per 16 dimensions of its V block: in decode those blocks are cold, and
 * the writes would wait on each line in turn. So when a token opens a
 * block, ask for all of it for writing first, while its queries are normed
 * and rotated. */
static void kv_prefetch_put(const struct cpu_ctx *c, int layer, int blk, int slot)
{
    int hd = c->cfg.head_dim;
    for (int h = 0; h < c->cfg.n_kv_heads; h++) {
        const char *kb = kv_at(c, c->kcache, layer, blk, h, 0);
        const char *vb = kv_at(c, c->vcache, layer, blk, h, 0);
        for (int i = 0; i < hd * 32; i += 64)
            __builtin_prefetch(kb + i, 1, 3);
        for (int p = 0; p < hd / 16; p++)
            __builtin_prefetch(vb + ((size_t)p * 8 + (size_t)slot / 2) * 64, 1, 3);
    }
}

/* Qwen3's per-head rmsnorm then rotary on n rows of one token, in place. */
static void norm_rope_rows(const struct cpu_ctx *c, float *x, int n, const float *w, const float *cs,
                           const float *sn)
{
    int hd = c->cfg.head_dim;
    if (c->k->norm_rope && hd % 32 == 0) {
        c->k->norm_rope(x, n, hd, w, c->cfg.rms_eps, cs, sn);
        return;
    }
    for (int h = 0; h < n; h++) {
        float *v = x + (size_t)h * (size_t)hd;
        norm_row(c->k, v, w, v, hd, c->cfg.rms_eps);
        rope_apply(v, cs, sn, hd / 2);
    }
}

static void rope_task(void *arg, int ith, int nth)
{
    const struct rope_job *j = arg;
    struct cpu_ctx *c = j->c;
    const struct model_config *cfg = &c->cfg;
    int hd = cfg->head_dim, nkv = cfg->n_kv_heads;
    /* contiguous shares, not every nth token: a prompt's consecutive
     * tokens share their packed blocks' lines, which two cores writing in
     * turn would pass back and forth */
    int t0 = (int)((int64_t)j->n_tokens * ith / nth), t1 = (int)((int64_t)j->n_tokens * (ith + 1) / nth);
    for (int t = t0; t < t1; t++) {
        int pos = c->tok_pos[t];
        const struct be_seq *s = &j->b->seqs[c->tok_seq[t]];
        const float *cs = c->rope + (size_t)t * (size_t)hd, *sn = cs + hd / 2;
        int blk = s->block_table[pos / c->block_size], slot = pos % c->block_size;
        if (c->kv_packed && (t == t0 || slot == 0 || c->tok_seq[t - 1] != c->tok_seq[t]))
            kv_prefetch_put(c, j->layer, blk, slot);
        /* q and k in place: the projections' outputs are this step's
         * scratch, read by nothing else */
        norm_rope_rows(c, c->q + (size_t)t * (size_t)cfg->n_heads * (size_t)hd, cfg->n_heads,
                       j->L->q_norm, cs, sn);
        float *kt = c->kx + (size_t)t * (size_t)nkv * (size_t)hd;
        norm_rope_rows(c, kt, nkv, j->L->k_norm, cs, sn);
        for (int h = 0; h < nkv; h++) {
            const float *k = kt + (size_t)h * (size_t)hd;
            const float *v = c->vx + ((size_t)t * (size_t)nkv + (size_t)h) * (size_t)hd;
            if (c->kv_packed) {
                c->k->kv_put_bf16p(k, v, hd, slot, kv_at(c, c->kcache, j->layer, blk, h, 0),
                                   kv_at(c, c->vcache, j->layer, blk, h, 0));
                continue;
            }
            void *kd = kv_at(c, c->kcache, j->layer, blk, h, slot);
            void *vd = kv_at(c, c->vcache, j->layer, blk, h, slot);
            if (c->kv_dtype == BE_KV_F32) {
                memcpy(kd, k, (size_t)hd * 4);
                memcpy(vd, v, (size_t)hd * 4);
            } else {
                c->k->f32_to_bf16(k, kd, hd);
                c->k->f32_to_bf16(v, vd, hd);
            }
        }
    }
}

/* Attention. One item = one sequence, one KV head and a tile of up to
 * q_tile consecutive queries of that sequence; its rows are the tile's
 * queries times the heads of the KV head's group (GQA), so the group shares
 * every key and value it loads. Scores come from scores_bf16 (or the gemm
 * kernels) with the keys of one cache block as the "weight" rows: each
 * (query, key) score is one fixed-order dot product whatever the tile
 * holds, which keeps decode (one query) and prefill (a tile) bit-identical.
 * Softmax then runs per row over its own keys; P x V (pv_*) keeps up to 8
 * rows' outputs in registers across a cache block, each value row loaded
 * once for all of them, every row still adding its keys in ascending order
 * with one fused multiply-add each. */
struct attn_job {
    struct cpu_ctx *c;
    uint16_t *ob;       /* bf16 output rows (the o projection's input), or
                           NULL for f32 rows in c->att */
    int layer, n_items;
    const struct attn_item *items;
    const struct be_batch *b;
    _Atomic int next;   /* next item to hand out (starts at 0) */
};

/* Asks for a KV block's cache lines ahead of use. */
static inline void prefetch_block(const void *p, size_t bytes)
{
    for (size_t o = 0; o < bytes; o += 64)
        __builtin_prefetch((const char *)p + o, 0, 3);
}

/* One attention item on the packed cache (kernels.h): scores of the
 * tile's rows against whole blocks, softmax per row over its own keys into
 * bf16 P (zero past them), P x V over the blocks up to the tile's last key.
 * Leaves unnormalised rows in O and their sums in sum. */
static void attn_packed(struct cpu_ctx *c, int layer, const struct attn_item *a, const struct be_seq *s,
                        int rows, int last, const uint16_t *qb, float *S, uint16_t *P,
                        const uint16_t **kp, const uint16_t **vp, float *O, float *sum)
{
    const struct cpu_kernels *k = c->k;
    int hd = c->cfg.head_dim, group = c->cfg.n_heads / c->cfg.n_kv_heads, ld = c->s_ld;
    int nb = last / 16 + 1;
    float scale = 1.0f / sqrtf((float)hd);
    for (int b = 0; b < nb; b++) {
        kp[b] = kv_at(c, c->kcache, layer, s->block_table[b], a->g, 0);
        vp[b] = kv_at(c, c->vcache, layer, s->block_table[b], a->g, 0);
    }
    k->scores_bf16p(rows, nb, qb, hd, kp, hd, S, ld);
    /* V's first block is wanted right after the softmax */
    prefetch_block(vp[0], (size_t)16 * (size_t)hd * 2);
    for (int r = 0; r < rows; r++) {
        int n = c->tok_pos[a->t0 + r / group] + 1;
        float *sc = S + (size_t)r * (size_t)ld;
        uint16_t *pr = P + (size_t)r * (size_t)ld;
        sum[r] = k->softmax(sc, n, scale);
        k->f32_to_bf16(sc, pr, n);
        memset(pr + n, 0, (size_t)(nb * 16 - n) * 2);
    }
    memset(O, 0, (size_t)rows * (size_t)hd * 4);
    k->pv_bf16p(rows, nb, last % 16 + 1, P, ld, vp, hd, O, hd);
}

/* One attention item on the slot-major cache (f32 KV, other block sizes,
 * tables without the packed kernels): scores block by block, softmax per
 * row, P x V in row chunks sharing each V block. Leaves unnormalised rows
 * in O and their sums in sum. */
static void attn_slots(struct cpu_ctx *c, int layer, const struct attn_item *a, const struct be_seq *s,
                       int rows, int last, const float *qf, const uint16_t *qb, float *S, float *O,
                       float *sum)
{
    const struct cpu_kernels *k = c->k;
    int hd = c->cfg.head_dim, group = c->cfg.n_heads / c->cfg.n_kv_heads, bs = c->block_size;
    int smax = c->s_ld;
    float scale = 1.0f / sqrtf((float)hd);
    int bf = c->kv_dtype == BE_KV_BF16;
    size_t blk_bytes = (size_t)bs * (size_t)hd * (bf ? 2 : 4);
    prefetch_block(kv_at(c, c->kcache, layer, s->block_table[0], a->g, 0), blk_bytes);
    for (int blk = 0; blk * bs <= last; blk++) {
        int nk = last + 1 - blk * bs < bs ? last + 1 - blk * bs : bs;
        const void *kb = kv_at(c, c->kcache, layer, s->block_table[blk], a->g, 0);
        /* the blocks of a sequence lie anywhere in the pool, so the
         * hardware prefetcher cannot guess the next one: ask for it
         * while this one is computed (and for V's first at the end) */
        if ((blk + 1) * bs <= last)
            prefetch_block(kv_at(c, c->kcache, layer, s->block_table[blk + 1], a->g, 0), blk_bytes);
        else
            prefetch_block(kv_at(c, c->vcache, layer, s->block_table[0], a->g, 0), blk_bytes);
        if (bf && k->scores_bf16 && hd % 32 == 0)
            k->scores_bf16(rows, nk, qb, hd, kb, hd, S + (size_t)blk * (size_t)bs, smax);
        else if (bf)
            k->gemm_bf16(rows, 0, nk, hd, qb, hd, kb, S + (size_t)blk * (size_t)bs, smax);
        else
            k->gemm_f32(rows, 0, nk, hd, qf, hd, kb, S + (size_t)blk * (size_t)bs, smax);
    }
    /* softmax per row over its own keys 0..pos */
    for (int r = 0; r < rows; r++) {
        int pos = c->tok_pos[a->t0 + r / group];
        float *sc = S + (size_t)r * (size_t)smax;
        if (k->softmax) {
            sum[r] = k->softmax(sc, pos + 1, scale);
            continue;
        }
        float mx = -INFINITY;
        for (int p = 0; p <= pos; p++) {
            sc[p] *= scale;
            if (sc[p] > mx)
                mx = sc[p];
        }
        float acc = 0;
        for (int p = 0; p <= pos; p++) {
            sc[p] = expf(sc[p] - mx);
            acc += sc[p];
        }
        sum[r] = acc;
    }
    /* P x V into O (rows, hd), keys in ascending order for every row */
    memset(O, 0, (size_t)rows * (size_t)hd * 4);
    if ((bf ? k->pv_bf16 != NULL : k->pv_f32 != NULL) && hd % 16 == 0) {
        /* Rows in chunks that share each V block from L1; rows are
         * sorted by position (token-major), so within a block the keys
         * a row needs are a prefix and later rows need at least as many:
         * rows i.. take keys [done, cnt_i) together. */
        for (int r0 = 0; r0 < rows; r0 += ATT_PV_ROWS) {
            int R = rows - r0 < ATT_PV_ROWS ? rows - r0 : ATT_PV_ROWS;
            int plast = c->tok_pos[a->t0 + (r0 + R - 1) / group];
            for (int blk = 0; blk * bs <= plast; blk++) {
                const void *vb = kv_at(c, c->vcache, layer, s->block_table[blk], a->g, 0);
                if ((blk + 1) * bs <= plast)
                    prefetch_block(kv_at(c, c->vcache, layer, s->block_table[blk + 1], a->g, 0),
                                   blk_bytes);
                int done = 0;
                for (int i = 0; i < R; i++) {
                    int cnt = c->tok_pos[a->t0 + (r0 + i) / group] + 1 - blk * bs;
                    cnt = cnt < bs ? cnt : bs;
                    if (cnt <= done)
                        continue;
                    const float *pp = S + (size_t)(r0 + i) * (size_t)smax + (size_t)blk * (size_t)bs + (size_t)done;
                    float *oo = O + (size_t)(r0 + i) * (size_t)hd;
                    if (bf)
                        k->pv_bf16(R - i, cnt - done, pp, smax, (const uint16_t *)vb + (size_t)done * (size_t)hd, hd, oo, hd);
                    else
                        k->pv_f32(R - i, cnt - done, pp, smax, (const float *)vb + (size_t)done * (size_t)hd, hd, oo, hd);
                    done = cnt;
                }
            }
        }
    } else {
        for (int r = 0; r < rows; r++) {
            int pos = c->tok_pos[a->t0 + r / group];
            const float *sc = S + (size_t)r * (size_t)smax;
            float *o = O + (size_t)r * (size_t)hd;
            for (int p = 0; p <= pos; p++) {
                const void *vr = kv_at(c, c->vcache, layer, s->block_table[p / bs], a->g, p % bs);
                if (bf)
                    k->axpy_bf16(sc[p], vr, o, hd);
                else
                    k->axpy_f32(sc[p], vr, o, hd);
            }
        }
    }
}

static void attn_task(void *arg, int ith, int nth)
{
    struct attn_job *j = arg;
    struct cpu_ctx *c = j->c;
    const struct model_config *cfg = &c->cfg;
    const struct cpu_kernels *k = c->k;
    int hd = cfg->head_dim, group = cfg->n_heads / cfg->n_kv_heads, bs = c->block_size;
    int smax = c->s_ld;
    int bf = c->kv_dtype == BE_KV_BF16;
    size_t tile_rows = (size_t)c->q_tile * (size_t)group;
    float *S = c->scratch + (size_t)ith * c->scratch_per_thread;
    float *qf = S + tile_rows * (size_t)smax;
    uint16_t *qb = (uint16_t *)(qf + tile_rows * (size_t)hd);
    float *O = qf + tile_rows * (size_t)hd * 2;
    float *sum = O + tile_rows * (size_t)hd;
    uint16_t *P = (uint16_t *)(sum + tile_rows);
    /* the block address lists, on a cache line of their own */
    const uint16_t **kp = (const uint16_t **)(((uintptr_t)(P + tile_rows * (size_t)smax) + 63) & ~(uintptr_t)63);
    const uint16_t **vp = kp + smax / bs;
    for (;;) {
        /* dynamic, and from the end: the last tiles of a prompt see the
         * most keys, so the big items go first and the small ones fill in */
        int it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (it >= j->n_items)
            break;
        const struct attn_item *a = &j->items[j->n_items - 1 - it];
        const struct be_seq *s = &j->b->seqs[a->seq];
        int rows = a->n * group;
        /* gather the tile's query rows: row r = (token a->t0 + r / group, head g*group + r % group) */
        for (int r = 0; r < rows; r++) {
            int t = a->t0 + r / group, h = a->g * group + r % group;
            const float *q = c->q + ((size_t)t * (size_t)cfg->n_heads + (size_t)h) * (size_t)hd;
            if (bf)
                k->f32_to_bf16(q, qb + (size_t)r * (size_t)hd, hd);
            else
                memcpy(qf + (size_t)r * (size_t)hd, q, (size_t)hd * 4);
        }
        int last = c->tok_pos[a->t0 + a->n - 1]; /* keys 0..last cover the tile */
        if (c->kv_packed)
            attn_packed(c, j->layer, a, s, rows, last, qb, S, P, kp, vp, O, sum);
        else
            attn_slots(c, j->layer, a, s, rows, last, qf, qb, S, O, sum);
        for (int r = 0; r < rows; r++) {
            int t = a->t0 + r / group, h = a->g * group + r % group;
            float *out = c->att + ((size_t)t * (size_t)cfg->n_heads + (size_t)h) * (size_t)hd;
            float *o = O + (size_t)r * (size_t)hd;
            float inv = 1.0f / sum[r];
            if (j->ob) {
                for (int d = 0; d < hd; d++)
                    o[d] *= inv;
                k->f32_to_bf16(o, j->ob + (out - c->att), hd);
            } else {
                for (int d = 0; d < hd; d++)
                    out[d] = o[d] * inv;
            }
        }
    }
}

/* Splits the batch into attention items; longest work first would balance
 * better, but interleaving items across threads is close and stays cheap. */
static int attn_items(const struct cpu_ctx *c, const struct be_batch *b, struct attn_item *items)
{
    int n = 0;
    for (int s = 0, t = 0; s < b->n_seqs; s++) {
        int n_new = b->seqs[s].n_new;
        for (int t0 = 0; t0 < n_new; t0 += c->q_tile) {
            int cnt = n_new - t0 < c->q_tile ? n_new - t0 : c->q_tile;
            for (int g = 0; g < c->cfg.n_kv_heads; g++)
                items[n++] = (struct attn_item){s, g, t + t0, cnt};
        }
        t += n_new;
    }
    return n;
}

struct embed_job {
    struct cpu_ctx *c;
    const int32_t *tokens;
    int n;
};

static void embed_task(void *arg, int ith, int nth)
{
    const struct embed_job *j = arg;
    const struct cpu_mat *e = &j->c->embed;
    int H = e->cols;
    int half = j->c->cfg.head_dim / 2;
    for (int t = ith; t < j->n; t += nth) {
        /* this token's rotary cos/sin, for every layer's rope_task */
        float *cs = j->c->rope + (size_t)t * (size_t)j->c->cfg.head_dim, *sn = cs + half;
        for (int i = 0; i < half; i++) {
            float a = (float)j->c->tok_pos[t] * j->c->inv_freq[i];
            cs[i] = cosf(a) * j->c->rope_mscale;
            sn[i] = sinf(a) * j->c->rope_mscale;
        }
        float *x = j->c->x + (size_t)t * (size_t)H;
        size_t off = (size_t)j->tokens[t] * (size_t)H;
        if (e->packed) { /* row n of the panels: pairs 64 bytes apart */
            const uint16_t *p = (const uint16_t *)e->w +
                                (size_t)(j->tokens[t] / 16) * (size_t)H * 16 + (size_t)(j->tokens[t] % 16) * 2;
            for (int i = 0; i < H; i += 2) {
                x[i] = bf16_to_f32(p[(size_t)i * 16]);
                x[i + 1] = bf16_to_f32(p[(size_t)i * 16 + 1]);
            }
        } else if (e->dt == MODEL_F32)
            memcpy(x, (const float *)e->w + off, (size_t)H * 4);
        else if (quant_is_quantized(e->dt))
            cpu_q_dequant_row(&e->q, j->tokens[t], x);
        else if (e->dt == MODEL_BF16)
            j->c->k->bf16_to_f32((const uint16_t *)e->w + off, x, H);
        else
            for (int i = 0; i < H; i++)
                x[i] = f16_to_f32(((const uint16_t *)e->w)[off + (size_t)i]);
    }
}

struct add_job {
    float *x;
    const float *y;
    size_t n;
};

static void add_task(void *arg, int ith, int nth)
{
    const struct add_job *j = arg;
    size_t chunk = (j->n + (size_t)nth - 1) / (size_t)nth;
    size_t a = (size_t)ith * chunk, b = a + chunk < j->n ? a + chunk : j->n;
    for (size_t i = a; i < b; i++)
        j->x[i] += j->y[i];
}

static int needs_bf16(const struct cpu_mat *m) { return m->dt == MODEL_BF16; }

/* ---- forward ---- */

static int check_batch(const struct cpu_ctx *c, const struct be_batch *b, struct rl_err *err)
{
    if (!c->loaded || !c->kcache)
        return rl_errf(err, RL_EINVAL, "cpu backend: forward before load/kv_init");
    if (b->n_tokens < 1 || b->n_tokens > c->max_tokens)
        return rl_errf(err, RL_EINVAL, "cpu backend: batch has %d tokens; this backend takes 1..%d",
                       b->n_tokens, c->max_tokens);
    int nt = 0, nl = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct be_seq *q = &b->seqs[s];
        if (q->n_new < 1 || q->n_past < 0 || q->logits_from < 0 || q->logits_from > q->n_new)
            return rl_errf(err, RL_EINVAL, "cpu backend: sequence %d has a bad shape", s);
        int end = q->n_past + q->n_new;
        if (end > c->ctx_max || end > c->cfg.max_pos)
            return rl_errf(err, RL_EINVAL, "cpu backend: sequence %d reaches position %d, beyond the context",
                           s, end);
        for (int i = 0; i < (end + c->block_size - 1) / c->block_size; i++)
            if (q->block_table[i] < 0 || q->block_table[i] >= c->n_blocks)
                return rl_errf(err, RL_EINVAL, "cpu backend: sequence %d names KV block %d of %d", s,
                               q->block_table[i], c->n_blocks);
        if (q->lora < 0 || q->lora > LORA_MAX_ADAPTERS || (q->lora && !c->lora[q->lora]))
            return rl_errf(err, RL_EINVAL, "cpu backend: sequence %d names LoRA slot %d, which is empty",
                           s, q->lora);
        nt += q->n_new;
        nl += q->n_new - q->logits_from;
    }
    if (nt != b->n_tokens || nl != b->n_logits)
        return rl_errf(err, RL_EINVAL, "cpu backend: batch counts do not add up (%d/%d tokens, %d/%d logits)",
                       nt, b->n_tokens, nl, b->n_logits);
    for (int t = 0; t < b->n_tokens; t++)
        if (b->tokens[t] < 0 || b->tokens[t] >= c->cfg.vocab)
            return rl_errf(err, RL_EINVAL, "cpu backend: token id %d outside the vocabulary (%d)",
                           b->tokens[t], c->cfg.vocab);
    return 0;
}

/* Quantizes rows of a product's input into the activation formats its
 * quantized matrices read (qgemm.h): row by row, each a function of that
 * row alone, so batch invariance holds; rows taken from a counter. */
struct xq_job {
    const float *x;
    int ldx, K, M;
    const int *need;     /* (CPU_XQ_N) formats wanted */
    void *const *out;    /* (CPU_XQ_N) */
    const size_t *ld;    /* (CPU_XQ_N) */
    _Atomic int next;
};

static void xq_task(void *arg, int ith, int nth)
{
    struct xq_job *j = arg;
    int m;
    while ((m = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->M)
        for (int f = 0; f < CPU_XQ_N; f++)
            if (j->need[f])
                cpu_xq_quantize((enum cpu_xq)f, j->x + (size_t)m * (size_t)j->ldx, j->K,
                                (char *)j->out[f] + (size_t)m * j->ld[f]);
}

/* Fills j->xq from j->x when some matrix of j is quantized. Decode rows
 * (a few) are quantized by the calling thread: waking the pool for a
 * microsecond of work costs more than it. */
static void mm_quantize_input(struct cpu_ctx *c, struct mm_job *j)
{
    int need[CPU_XQ_N] = {0}, any = 0;
    for (int i = 0; i < j->n_mats; i++)
        if (quant_is_quantized(j->mat[i]->dt))
            need[cpu_xq_for(j->mat[i]->dt)] = any = 1;
    if (!any)
        return;
    int K = j->mat[0]->cols;
    for (int f = 0; f < CPU_XQ_N; f++) {
        j->xq[f] = c->xq[f];
        j->ldxq[f] = cpu_xq_row_bytes((enum cpu_xq)f, K);
    }
    struct xq_job q = {j->x, j->ldx, K, j->M, need, j->xq, j->ldxq, 0};
    if (j->M <= 4)
        xq_task(&q, 0, 1);
    else
        cpu_pool_run_dyn(c->pool, xq_task, &q);
}

/* Runs a product job on the pool, the decode split (mm_tiles) where it
 * applies. */
static void mm_run(struct cpu_ctx *c, struct mm_job *j)
{
    mm_quantize_input(c, j);
    int n = mm_n_split(j), nth = cpu_pool_n_threads(c->pool);
    int ok = j->M <= CPU_SPREAD_MAX_M && c->k->gemm_bf16p_tiles && n * nth <= MM_MAX_RANGES &&
             (!j->swiglu || (j->hb && j->mat[1]->packed));
    for (int i = 0; i < j->n_mats; i++)
        ok = ok && j->mat[i]->dt == MODEL_BF16 && j->mat[i]->packed;
    j->tiles = ok;
    j->nth = nth;
    for (int i = 0; ok && i < n; i++)
        for (int h = 0; h < nth; h++) {
            int n0, n1;
            mm_share(j, i, h, &n0, &n1);
            uint64_t hi = (uint64_t)cpu_spread_tiles(n1 - n0, j->swiglu);
            atomic_init(&j->range[i * nth + h], hi << 32);
        }
    cpu_pool_run_dyn(c->pool, mm_task, j);
}

static void project(struct cpu_ctx *c, int M, const float *xn, const uint16_t *xb, int ldx,
                    const struct cpu_mat *m0, float *y0, const struct cpu_mat *m1, float *y1,
                    const struct cpu_mat *m2, float *y2)
{
    struct mm_job j = {.k = c->k, .M = M, .x = xn, .xb = xb, .ldx = ldx};
    const struct cpu_mat *ms[3] = {m0, m1, m2};
    float *ys[3] = {y0, y1, y2};
    for (int i = 0; i < 3 && ms[i]; i++) {
        j.mat[i] = ms[i];
        j.y[i] = ys[i];
        j.ldy[i] = ms[i]->rows;
        j.n_mats++;
    }
    mm_run(c, &j);
}

/* SwiGLU over whole rows after an unfused gate/up product (a step with
 * LoRA rows: their gate and up get their deltas before the activation),
 * with the fused kernels' bits (kernels.h), and the bf16 copy the down
 * product reads. */
struct glu_job {
    const struct cpu_kernels *k;
    float *g;
    const float *u;
    uint16_t *hb;
    int M, I;
    _Atomic int next;
};

static void glu_task(void *arg, int ith, int nth)
{
    (void)ith, (void)nth;
    struct glu_job *j = arg;
    int m;
    while ((m = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->M) {
        float *g = j->g + (size_t)m * (size_t)j->I;
        const float *u = j->u + (size_t)m * (size_t)j->I;
        if (j->k->swiglu)
            j->k->swiglu(g, u, j->I);
        else
            for (int n = 0; n < j->I; n++)
                g[n] = g[n] / (1.0f + expf(-g[n])) * u[n];
        if (j->hb)
            j->k->f32_to_bf16(g, j->hb + (size_t)m * (size_t)j->I, j->I);
    }
}

/* This step's rows that run with an adapter (c->lrows). */
static void lora_rows(struct cpu_ctx *c, const struct be_batch *b)
{
    int n = 0, r = 0;
    for (int s = 0, t = 0; s < b->n_seqs; s++) {
        const struct be_seq *q = &b->seqs[s];
        for (int i = 0; i < q->n_new; i++, t++)
            if (q->lora) {
                c->lrow_t[n] = t;
                c->lrow_a[n++] = c->lora[q->lora];
                r = lora_max_rank(c->lora[q->lora]) > r ? lora_max_rank(c->lora[q->lora]) : r;
            }
    }
    c->lrows = (struct cpu_lora_rows){n, c->lrow_t, c->lrow_a, r};
}

/* Whether some row of the step has an adapter pair for projection p or q
 * of layer l. */
static bool lora_touches(const struct cpu_ctx *c, int l, enum lora_proj p, enum lora_proj q)
{
    for (int i = 0; i < c->lrows.n; i++)
        if (lora_get(c->lrows.a[i], l, p) || lora_get(c->lrows.a[i], l, q))
            return true;
    return false;
}

/* The adapters' deltas of up to three products that read the same rows x
 * (f32, or their bf16 copy xb widened first into the f32 rows x when x
 * holds nothing of them: the o projection's input) */
static void lora_deltas(struct cpu_ctx *c, int layer, int n, const enum lora_proj *projs, float *x,
                        const uint16_t *xb, int ldx, float *const *y, const int *ldy)
{
    if (xb)
        for (int i = 0; i < c->lrows.n; i++) {
            size_t t = (size_t)c->lrows.t[i] * (size_t)ldx;
            c->k->bf16_to_f32(xb + t, x + t, ldx);
        }
    cpu_lora_apply(c->pool, c->k, &c->lrows, layer, n, projs, x, ldx, y, ldy, c->lora_tmp);
}

static int cpu_forward(void *ctx, const struct be_batch *b, struct rl_err *err)
{
    struct cpu_ctx *c = ctx;
    int rc = check_batch(c, b, err);
    if (rc)
        return rc;
    const struct model_config *cfg = &c->cfg;
    int T = b->n_tokens, H = cfg->hidden, I = cfg->intermediate;
    int Q = cfg->n_heads * cfg->head_dim;
    for (int s = 0, t = 0; s < b->n_seqs; s++)
        for (int i = 0; i < b->seqs[s].n_new; i++, t++) {
            c->tok_seq[t] = s;
            c->tok_pos[t] = b->seqs[s].n_past + i;
        }
    int n_items = attn_items(c, b, c->items);
    c->lrows.n = 0;
    if (c->lrow_t)
        lora_rows(c, b);
    bool lora = c->lrows.n > 0;
    double tp = rl_mono_s(); /* start of the phase being timed */
    c->prof_steps++;
    c->prof_tokens += T;
    struct embed_job ej = {c, b->tokens, T};
    run(c, embed_task, &ej, T);
    prof_mark(c, PH_EMBED, &tp);
    for (int l = 0; l < cfg->n_layers; l++) {
        const struct cpu_layer *L = &c->layers[l];
        /* after layer 0 this also adds the previous layer's down projection */
        struct norm_job nj = {c->k, c->x, H, NULL, T, H, L->attn_norm, cfg->rms_eps, c->xn,
                              needs_bf16(&L->wq) || needs_bf16(&L->wk) || needs_bf16(&L->wv) ? c->xb : NULL,
                              l > 0 ? c->tmp : NULL, 0};
        run_dyn(c, norm_task, &nj, T);
        prof_mark(c, PH_NORM, &tp);
        project(c, T, c->xn, c->xb, H, &L->wq, c->q, &L->wk, c->kx, &L->wv, c->vx);
        if (lora) {
            static const enum lora_proj qkv[3] = {LORA_Q, LORA_K, LORA_V};
            int kvd = cfg->n_kv_heads * cfg->head_dim;
            lora_deltas(c, l, 3, qkv, c->xn, NULL, H, (float *const[]){c->q, c->kx, c->vx},
                        (const int[]){Q, kvd, kvd});
        }
        prof_mark(c, PH_QKV, &tp);
        struct rope_job rj = {c, L, l, T, b};
        run(c, rope_task, &rj, T);
        prof_mark(c, PH_ROPE, &tp);
        /* a BF16 o projection reads only the bf16 rows: attention writes
         * them itself, no separate conversion pass */
        struct attn_job aj = {c, needs_bf16(&L->wo) ? c->xb : NULL, l, n_items, c->items, b, 0};
        run_dyn(c, attn_task, &aj, n_items);
        prof_mark(c, PH_ATTN, &tp);
        project(c, T, c->att, c->xb, Q, &L->wo, c->tmp, NULL, NULL, NULL, NULL);
        if (lora)
            lora_deltas(c, l, 1, (const enum lora_proj[]){LORA_O}, c->att, aj.ob, Q,
                        (float *const[]){c->tmp}, (const int[]){H});
        prof_mark(c, PH_O, &tp);
        struct norm_job mj = {c->k, c->x, H, NULL, T, H, L->mlp_norm, cfg->rms_eps, c->xn,
                              needs_bf16(&L->gate) ? c->xb : NULL, c->tmp, 0};
        run_dyn(c, norm_task, &mj, T);
        prof_mark(c, PH_NORM, &tp);
        uint16_t *hb = needs_bf16(&L->down) ? c->hb : NULL;
        bool glu = lora && lora_touches(c, l, LORA_GATE, LORA_UP); /* unfused: deltas before SwiGLU */
        struct mm_job gj = {.k = c->k, .M = T, .n_mats = 2, .mat = {&L->gate, &L->up},
                            .y = {c->g, c->u}, .ldy = {I, I}, .x = c->xn, .xb = c->xb, .ldx = H,
                            .swiglu = !glu, .hb = glu ? NULL : hb};
        mm_run(c, &gj);
        if (glu) {
            static const enum lora_proj gu[2] = {LORA_GATE, LORA_UP};
            lora_deltas(c, l, 2, gu, c->xn, NULL, H, (float *const[]){c->g, c->u},
                        (const int[]){I, I});
            struct glu_job uj = {c->k, c->g, c->u, hb, T, I, 0};
            run_dyn(c, glu_task, &uj, T);
        }
        prof_mark(c, PH_GATEUP, &tp);
        project(c, T, c->g, c->hb, I, &L->down, c->tmp, NULL, NULL, NULL, NULL);
        if (lora)
            /* fused, the bf16 rows are all the SwiGLU output there is */
            lora_deltas(c, l, 1, (const enum lora_proj[]){LORA_DOWN}, c->g, glu ? NULL : hb, I,
                        (float *const[]){c->tmp}, (const int[]){H});
        if (l + 1 == cfg->n_layers) { /* else the next layer's norm adds it */
            struct add_job adj = {c->x, c->tmp, (size_t)T * (size_t)H};
            run(c, add_task, &adj, T);
        }
        prof_mark(c, PH_DOWN, &tp);
    }
    c->n_hidden = 0;
    if (b->n_logits == 0)
        return 0;
    /* Final norm on the rows that want logits, then the vocabulary matrix. */
    int32_t *rows = c->tok_pos; /* positions are no longer needed: reuse */
    int n = 0;
    for (int s = 0, t = 0; s < b->n_seqs; s++) {
        const struct be_seq *q = &b->seqs[s];
        for (int i = 0; i < q->n_new; i++, t++)
            if (i >= q->logits_from)
                rows[n++] = t;
    }
    struct norm_job fj = {c->k, c->x, H, rows, n, H, c->final_norm, cfg->rms_eps, c->xn,
                          needs_bf16(&c->lm_head) ? c->xb : NULL, NULL, 0};
    run_dyn(c, norm_task, &fj, n);
    struct mm_job lj = {.k = c->k, .M = n, .n_mats = 1, .mat = {&c->lm_head}, .y = {b->logits},
                        .ldy = {cfg->vocab}, .x = c->xn, .xb = c->xb, .ldx = H};
    mm_run(c, &lj);
    c->n_hidden = n;
    prof_mark(c, PH_LOGITS, &tp);
    return 0;
}

static int cpu_hidden(void *ctx, int row, float *out, struct rl_err *err)
{
    struct cpu_ctx *c = ctx;
    if (row < 0 || row >= c->n_hidden)
        return rl_errf(err, RL_EINVAL, "cpu backend: logits row %d of %d has no hidden state", row,
                       c->n_hidden);
    size_t H = (size_t)c->cfg.hidden;
    memcpy(out, c->xn + (size_t)row * H, H * sizeof *out);
    return 0;
}

static int cpu_profile(void *ctx, char *out, size_t n)
{
    struct cpu_ctx *c = ctx;
    double total = 0;
    for (int i = 0; i < PH_N; i++)
        total += c->prof[i];
    /* each snprintf gets what is left; once out is full, len passes n and
     * the later calls write nothing */
    size_t len = (size_t)snprintf(out, n, "{\"steps\": %ld, \"tokens\": %lld, \"total_ms\": %.2f",
                                  c->prof_steps, (long long)c->prof_tokens, 1e3 * total);
    for (int i = 0; i < PH_N; i++)
        len += (size_t)snprintf(out + (len < n ? len : n), len < n ? n - len : 0, ", \"%s_ms\": %.2f",
                                phase_name[i], 1e3 * c->prof[i]);
    len += (size_t)snprintf(out + (len < n ? len : n), len < n ? n - len : 0, "}");
    memset(c->prof, 0, sizeof c->prof);
    c->prof_steps = 0;
    c->prof_tokens = 0;
    return len < n ? (int)len : -1;
}

static const char *cpu_describe(void *ctx)
{
    struct cpu_ctx *c = ctx;
    return c->desc;
}

static void cpu_free(void *ctx)
{
    struct cpu_ctx *c = ctx;
    if (!c)
        return;
    free_weights(c);
    kv_unmap(c);
    free(c->scratch);
    free(c->lrow_t);
    free(c->lrow_a);
    free(c->lora_tmp);
    cpu_pool_free(c->pool);
    free(c);
}

static int cpu_lora_set(void *ctx, int slot, const struct lora_adapter *a, struct rl_err *err)
{
    struct cpu_ctx *c = ctx;
    if (slot < 1 || slot > LORA_MAX_ADAPTERS)
        return rl_errf(err, RL_EINVAL, "cpu backend: LoRA slot %d outside 1..%d", slot,
                       LORA_MAX_ADAPTERS);
    if (!c->loaded)
        return rl_errf(err, RL_EINVAL, "cpu backend: an adapter before load");
    size_t T = (size_t)c->max_tokens;
    if (!c->lrow_t && (!(c->lrow_t = malloc(T * sizeof *c->lrow_t)) ||
                       !(c->lrow_a = malloc(T * sizeof *c->lrow_a))))
        return rl_errf(err, RL_ENOMEM, "cpu backend: out of memory");
    int r = lora_max_rank(a);
    if (r > c->lora_max_rank) {
        float *t = malloc(T * 3 * (size_t)r * sizeof *t);
        if (!t)
            return rl_errf(err, RL_ENOMEM, "cpu backend: out of memory");
        free(c->lora_tmp);
        c->lora_tmp = t;
        c->lora_max_rank = r;
    }
    c->lora[slot] = a;
    return 0;
}

static const struct be_ops cpu_ops = {
    .name = "cpu",
    .load = cpu_load,
    .kv_block_bytes = cpu_kv_block_bytes,
    .kv_init = cpu_kv_init,
    .forward = cpu_forward,
    .kv_copy = cpu_kv_copy,
    .profile = cpu_profile,
    .describe = cpu_describe,
    .free = cpu_free,
    .hidden = cpu_hidden,
    .lora_set = cpu_lora_set,
};

int cpu_backend_create(struct backend **out, const struct be_options *opt, struct rl_err *err)
{
    *out = NULL;
    struct be_options def = {0};
    if (!opt)
        opt = &def;
    enum cpu_isa isa = cpu_isa_detect();
    if (opt->isa && strcmp(opt->isa, "auto")) {
        int want = cpu_isa_parse(opt->isa);
        if (want < 0)
            return rl_errf(err, RL_EINVAL, "unknown ISA \"%s\" (auto, avx512bf16, avx2, scalar)", opt->isa);
        if (want > (int)isa)
            return rl_errf(err, RL_EUNSUPPORTED, "this CPU cannot run ISA \"%s\" (best: %s)", opt->isa,
                           cpu_isa_name(isa));
        isa = (enum cpu_isa)want;
    }
    const struct cpu_kernels *k = cpu_kernels_get(isa);
    if (!k)
        return rl_errf(err, RL_EUNSUPPORTED, "no kernels for ISA %s", cpu_isa_name(isa));
    if (opt->quantize && strcmp(opt->quantize, "none") && strcmp(opt->quantize, "q8_0"))
        return rl_errf(err, RL_EINVAL, "unknown quantization \"%s\" (none, q8_0)", opt->quantize);
    struct cpu_ctx *c = calloc(1, sizeof *c);
    struct backend *be = calloc(1, sizeof *be);
    if (!c || !be) {
        free(c), free(be);
        return rl_errf(err, RL_ENOMEM, "out of memory");
    }
    int rc = cpu_pool_create(&c->pool, opt->n_threads, err);
    if (rc) {
        free(c), free(be);
        return rc;
    }
    c->k = k;
    c->n_threads = cpu_pool_n_threads(c->pool);
    c->kv_req = opt->kv_dtype;
    c->mmap_weights = opt->mmap_weights;
    c->quant_q8 = opt->quantize && !strcmp(opt->quantize, "q8_0");
    if (c->quant_q8) /* the Q8_0 rows live in the arena: nothing to use in place */
        c->mmap_weights = 0;
    c->kv_prefault = opt->kv_prefault;
    c->opt = *opt;
    c->opt.isa = NULL; /* not kept: the caller's string */
    snprintf(c->desc, sizeof c->desc, "cpu %s, %d threads", cpu_isa_name(isa), c->n_threads);
    be->ops = &cpu_ops;
    be->ctx = c;
    *out = be;
    return 0;
}
