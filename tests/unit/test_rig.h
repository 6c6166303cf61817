/* tests/unit/test_rig.h - a model loaded on the CPU backend with one
 * sequence's KV pool, for the tests that check the forward pass
 * (test_model, test_heldout). Header-only (static), like test_util.h:
 * each test is its own binary. Include after <cmocka.h>. */
#ifndef RL_TEST_RIG_H
#define RL_TEST_RIG_H

#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "model.h"

struct rig {
    struct model *m;
    struct backend *be;
    const struct model_config *cfg;
    int32_t table[512];
};

static inline void rig_open(struct rig *r, const char *dir, const char *isa, int threads,
                            int max_tokens)
{
    struct rl_err err = {0};
    memset(r, 0, sizeof *r);
    int rc = model_load(&r->m, dir, &err);
    if (rc)
        fail_msg("model_load %s: %s", dir, err.msg);
    struct be_options o = {.n_threads = threads, .isa = isa};
    assert_int_equal(be_create(&r->be, "cpu", &o, &err), 0);
    r->cfg = model_get_config(r->m);
    rc = r->be->ops->load(r->be->ctx, r->cfg, model_get_weights(r->m), max_tokens, &err);
    if (rc)
        fail_msg("load: %s", err.msg);
    rc = r->be->ops->kv_init(r->be->ctx, 512, 16, &err);
    if (rc)
        fail_msg("kv_init: %s", err.msg);
    for (int i = 0; i < 512; i++)
        r->table[i] = i;
}

static inline void rig_close(struct rig *r)
{
    be_free(r->be);
    model_free(r->m);
}

/* One forward of n tokens after `past`, logits for every new token. */
static inline void rig_step(struct rig *r, int past, const int32_t *ids, int n, float *logits,
                            const int32_t *table)
{
    struct rl_err err = {0};
    struct be_seq s = {past, n, table ? table : r->table, 0, 0};
    struct be_batch b = {1, &s, n, ids, n, logits};
    int rc = r->be->ops->forward(r->be->ctx, &b, &err);
    if (rc)
        fail_msg("forward: %s", err.msg);
}

static inline int argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

#endif
