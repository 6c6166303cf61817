/* engine/rowsets.c - the row-wants wrapper (rowsets.h).
 *
 * forward(): the inner backend writes every row into batch->logits; then
 * the rows with a constraint mask (set_masks) get -inf where disallowed, as
 * CUDA's mask kernel does on the device; then each row wanted as ARGMAX or
 * CANDS is kept aside (for fetch_row), reduced with sample_cands_from_row()
 * (ARGMAX: its first entry only, what the device argmax gives) and
 * overwritten with NaN in batch->logits. Single-threaded like every
 * backend; everything lives until the next forward(). */
#include "rowsets.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample.h"

struct rows_ctx {
    struct backend *inner;
    int vocab;
    uint8_t *wants;                    /* the next forward's (set_row_wants), or NULL */
    int n_wants;
    const uint32_t *const *masks;      /* the next forward's (set_masks), or NULL */
    int n_masks;
    struct sample_cands *cands;        /* (cap) per logits row */
    float *kept;                       /* (cap, vocab) the reduced rows, whole */
    int cap, n_rows;                   /* rows allocated; rows of the last forward */
};

static int rows_load(void *ctx, const struct model_config *cfg, const struct model_weights *w, int max_tokens,
                     struct rl_err *err)
{
    struct rows_ctx *c = ctx;
    c->vocab = cfg->vocab;
    return c->inner->ops->load(c->inner->ctx, cfg, w, max_tokens, err);
}

static size_t rows_kv_block_bytes(void *ctx, int block_size)
{
    struct rows_ctx *c = ctx;
    return c->inner->ops->kv_block_bytes(c->inner->ctx, block_size);
}

static int rows_kv_init(void *ctx, int n_blocks, int block_size, struct rl_err *err)
{
    struct rows_ctx *c = ctx;
    return c->inner->ops->kv_init(c->inner->ctx, n_blocks, block_size, err);
}

static int rows_kv_copy(void *ctx, int32_t dst, int32_t src, int n_tokens, struct rl_err *err)
{
    struct rows_ctx *c = ctx;
    if (!c->inner->ops->kv_copy)
        return rl_errf(err, RL_EUNSUPPORTED, "rowsets: the inner backend has no kv_copy");
    return c->inner->ops->kv_copy(c->inner->ctx, dst, src, n_tokens, err);
}

static int rows_profile(void *ctx, char *out, size_t n)
{
    struct rows_ctx *c = ctx;
    if (!c->inner->ops->profile)
        return n ? (out[0] = 0, 0) : -1;
    return c->inner->ops->profile(c->inner->ctx, out, n);
}

static const char *rows_describe(void *ctx)
{
    struct rows_ctx *c = ctx;
    return c->inner->ops->describe ? c->inner->ops->describe(c->inner->ctx) : "rowsets";
}

static size_t rows_kv_capacity(void *ctx)
{
    struct rows_ctx *c = ctx;
    return c->inner->ops->kv_capacity ? c->inner->ops->kv_capacity(c->inner->ctx) : 0;
}

static int rows_set_masks(void *ctx, const uint32_t *const *masks, int n_rows, struct rl_err *err)
{
    struct rows_ctx *c = ctx;
    c->masks = masks;
    c->n_masks = masks ? n_rows : 0;
    return c->inner->ops->set_masks ? c->inner->ops->set_masks(c->inner->ctx, masks, n_rows, err) : 0;
}

static int rows_set_row_wants(void *ctx, uint8_t *wants, int n_rows, struct rl_err *err)
{
    struct rows_ctx *c = ctx;
    (void)err;
    c->wants = n_rows > 0 ? wants : NULL;
    c->n_wants = wants ? n_rows : 0;
    return 0;
}

static int rows_forward(void *ctx, const struct be_batch *b, struct rl_err *err)
{
    struct rows_ctx *c = ctx;
    uint8_t *wants = c->wants;
    int n_wants = c->n_wants;
    const uint32_t *const *masks = c->masks;
    int n_masks = c->n_masks;
    c->wants = NULL, c->n_wants = 0, c->masks = NULL, c->n_masks = 0; /* one step's */
    c->n_rows = 0;
    int rc = c->inner->ops->forward(c->inner->ctx, b, err);
    if (rc)
        return rc;
    const size_t V = (size_t)c->vocab;
    for (int r = 0; r < b->n_logits && r < n_masks; r++) {
        if (!masks[r])
            continue;
        float *row = b->logits + (size_t)r * V;
        for (size_t i = 0; i < V; i++)
            if (!(masks[r][i >> 5] >> (i & 31) & 1u))
                row[i] = -INFINITY;
    }
    if (!wants)
        return 0;
    if (n_wants < b->n_logits) {
        for (int r = 0; r < n_wants; r++)
            wants[r] = BE_ROW_FULL;
        return 0;
    }
    if (b->n_logits > c->cap) {
        int cap = b->n_logits;
        struct sample_cands *cs = realloc(c->cands, sizeof *cs * (size_t)cap);
        if (cs)
            c->cands = cs;
        float *k = realloc(c->kept, sizeof *k * (size_t)cap * V);
        if (k)
            c->kept = k;
        if (!cs || !k)
            return rl_errf(err, RL_ENOMEM, "rowsets: out of memory for %d rows", cap);
        c->cap = cap;
    }
    for (int r = 0; r < b->n_logits; r++) {
        if (wants[r] == BE_ROW_FULL)
            continue;
        if (wants[r] != BE_ROW_ARGMAX && wants[r] != BE_ROW_CANDS)
            return rl_errf(err, RL_EINVAL, "rowsets: row %d wants %d", r, (int)wants[r]);
        float *row = b->logits + (size_t)r * V;
        memcpy(c->kept + (size_t)r * V, row, V * sizeof *row);
        sample_cands_from_row(row, (int)V, &c->cands[r]);
        if (wants[r] == BE_ROW_ARGMAX && c->cands[r].n > 1)
            c->cands[r].n = 1;
        for (size_t i = 0; i < V; i++)
            row[i] = NAN; /* never sent: reading it is a bug */
    }
    c->n_rows = b->n_logits;
    return 0;
}

static const struct sample_cands *rows_row_cands(void *ctx)
{
    return ((struct rows_ctx *)ctx)->cands;
}

static int rows_fetch_row(void *ctx, int row, float *out, struct rl_err *err)
{
    struct rows_ctx *c = ctx;
    if (row < 0 || row >= c->n_rows)
        return rl_errf(err, RL_EINVAL, "rowsets: row %d of %d", row, c->n_rows);
    memcpy(out, c->kept + (size_t)row * (size_t)c->vocab, (size_t)c->vocab * sizeof *out);
    return 0;
}

static void rows_free(void *ctx)
{
    struct rows_ctx *c = ctx;
    if (!c)
        return;
    be_free(c->inner);
    free(c->cands);
    free(c->kept);
    free(c);
}

static int rows_hidden(void *ctx, int row, float *out, struct rl_err *err)
{
    struct rows_ctx *c = ctx;
    if (!c->inner->ops->hidden)
        return rl_errf(err, RL_EUNSUPPORTED, "rowsets: the inner backend has no hidden states");
    return c->inner->ops->hidden(c->inner->ctx, row, out, err);
}

static int rows_lora_set(void *ctx, int slot, const struct lora_adapter *a, struct rl_err *err)
{
    struct rows_ctx *c = ctx;
    if (!c->inner->ops->lora_set)
        return rl_errf(err, RL_EUNSUPPORTED, "rowsets: the inner backend serves no adapters");
    return c->inner->ops->lora_set(c->inner->ctx, slot, a, err);
}

static const struct be_ops rows_ops = {
    .name = "cpu-rowsets",
    .load = rows_load,
    .kv_block_bytes = rows_kv_block_bytes,
    .kv_init = rows_kv_init,
    .forward = rows_forward,
    .kv_copy = rows_kv_copy,
    .profile = rows_profile,
    .describe = rows_describe,
    .free = rows_free,
    .set_masks = rows_set_masks,
    .kv_capacity = rows_kv_capacity,
    .set_row_wants = rows_set_row_wants,
    .row_cands = rows_row_cands,
    .fetch_row = rows_fetch_row,
    .hidden = rows_hidden,
    .lora_set = rows_lora_set,
};

int rows_backend_wrap(struct backend **out, struct backend *inner, struct rl_err *err)
{
    *out = NULL;
    struct rows_ctx *c = calloc(1, sizeof *c);
    struct backend *be = calloc(1, sizeof *be);
    if (!c || !be) {
        free(c), free(be);
        be_free(inner);
        return rl_errf(err, RL_ENOMEM, "rowsets: out of memory");
    }
    c->inner = inner;
    be->ops = &rows_ops;
    be->ctx = c;
    *out = be;
    return 0;
}
