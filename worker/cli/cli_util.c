/* worker/cli/cli_util.c - see cli_util.h. */
#include "cli_util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_parse_int(const char *s, long lo, long hi, long *v, const char *what, struct rl_err *err)
{
    if (!s || !*s)
        return rl_errf(err, RL_EINVAL, "%s needs a number", what);
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || *end)
        return rl_errf(err, RL_EINVAL, "%s: \"%s\" is not an integer", what, s);
    if (x < lo || x > hi)
        return rl_errf(err, RL_EINVAL, "%s: %ld is out of range [%ld, %ld]", what, x, lo, hi);
    *v = x;
    return 0;
}

int cli_parse_ids(const char *s, int32_t **out, int *n, struct rl_err *err)
{
    *out = NULL;
    *n = 0;
    if (!s || !*s)
        return rl_errf(err, RL_EINVAL, "--tokens needs a comma-separated list of ids");
    int cap = 16, cnt = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(ids);
            return rl_errf(err, RL_EINVAL, "bad token id list at \"%.20s\"", p);
        }
        if (cnt == cap) {
            cap *= 2;
            int32_t *g = realloc(ids, (size_t)cap * sizeof *ids);
            if (!g) {
                free(ids);
                return rl_errf(err, RL_ENOMEM, "out of memory");
            }
            ids = g;
        }
        ids[cnt++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    *out = ids;
    *n = cnt;
    return 0;
}

int cli_model_open(struct cli_model *cm, const struct cli_model_opts *o, struct rl_err *err)
{
    memset(cm, 0, sizeof *cm);
    int rc = model_load(&cm->model, o->dir, err);
    if (rc)
        return rc;
    struct be_options bo = {.n_threads = o->n_threads, .isa = o->isa};
    if (o->kv && !strcmp(o->kv, "f32"))
        bo.kv_dtype = BE_KV_F32;
    else if (o->kv && !strcmp(o->kv, "bf16"))
        bo.kv_dtype = BE_KV_BF16;
    else if (o->kv && strcmp(o->kv, "auto")) {
        rc = rl_errf(err, RL_EINVAL, "--kv must be auto, f32 or bf16");
        goto fail;
    }
    if ((rc = be_create(&cm->be, o->backend, &bo, err)))
        goto fail;
    if ((rc = cm->be->ops->load(cm->be->ctx, model_get_config(cm->model),
                                model_get_weights(cm->model), o->max_tokens, err)))
        goto fail;
    cm->block_size = o->block_size ? o->block_size : 16;
    cm->n_blocks = o->n_blocks;
    if ((rc = cm->be->ops->kv_init(cm->be->ctx, cm->n_blocks, cm->block_size, err)))
        goto fail;
    return 0;
fail:
    cli_model_close(cm);
    return rc;
}

void cli_model_close(struct cli_model *cm)
{
    be_free(cm->be);
    model_free(cm->model);
    memset(cm, 0, sizeof *cm);
}

void cli_print_float(float f)
{
    if (isfinite(f))
        printf("%.9g", (double)f);
    else
        printf("null");
}
