/* worker/cli/cli_util.c - see cli_util.h. */
#include "cli_util.h"
#include "modelref.h"
#include "clock.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

static const struct cli_opt *find_opt(const struct cli_opt *opts, const char *f)
{
    for (; opts->name; opts++)
        if (!strcmp(f, opts->name) || (opts->alias && !strcmp(f, opts->alias)))
            return opts;
    return NULL;
}

int cli_parse_opts(int argc, char **argv, const struct cli_opt *opts, struct rl_err *err)
{
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const struct cli_opt *o = find_opt(opts, f);
        if (!o) {
            if (!strcmp(f, "-h") || !strcmp(f, "--help"))
                return 1;
            return rl_errf(err, RL_EINVAL, "unknown option %s", f);
        }
        if (o->type == CLI_OPT_FLAG) {
            *(int *)o->field = 1;
            continue;
        }
        if (!v)
            return rl_errf(err, RL_EINVAL, "%s needs a value", f);
        i++;
        if (o->type == CLI_OPT_STR) {
            *(const char **)o->field = v;
        } else if (o->type == CLI_OPT_INT) {
            long x;
            int rc = cli_parse_int(v, o->lo, o->hi, &x, f, err);
            if (rc)
                return rc;
            *(int *)o->field = (int)x;
        } else {
            char *end;
            errno = 0;
            double x = strtod(v, &end);
            if (errno || end == v || *end || !(x >= (double)o->lo))
                return rl_errf(err, RL_EINVAL, "%s needs a number >= %ld", f, o->lo);
            *(double *)o->field = x;
        }
    }
    return 0;
}

int cli_engine_opts(struct cli_opt *opts, struct cli_engine_args *a)
{
    memset(a, 0, sizeof *a);
    a->mo.backend = "cpu";
    a->n_gen = 32;
    a->batch = 1;
    const struct cli_opt common[CLI_ENGINE_N_OPTS] = {
        {"--model", "-m", CLI_OPT_STR, &a->mo.dir, 0, 0},
        {"--tokens", NULL, CLI_OPT_STR, &a->tokens, 0, 0},
        {"--backend", NULL, CLI_OPT_STR, &a->mo.backend, 0, 0},
        {"--isa", NULL, CLI_OPT_STR, &a->mo.isa, 0, 0},
        {"--threads", NULL, CLI_OPT_INT, &a->mo.n_threads, 1, 1024},
        {"--max-tokens", "-n", CLI_OPT_INT, &a->n_gen, 0, 1 << 20},
        {"--prompt", NULL, CLI_OPT_INT, &a->prompt, 1, 1 << 20},
        {"--gen", NULL, CLI_OPT_INT, &a->gen, 1, 1 << 20},
        {"--batch", NULL, CLI_OPT_INT, &a->batch, 1, 4096},
        {"--temperature", NULL, CLI_OPT_DOUBLE, &a->temperature, 0, 0},
        {"--ignore-eos", NULL, CLI_OPT_FLAG, &a->ignore_eos, 0, 0},
        {"--quantize", NULL, CLI_OPT_STR, &a->mo.quantize, 0, 0},
    };
    memcpy(opts, common, sizeof common);
    return CLI_ENGINE_N_OPTS;
}

int cli_opt_bounds(struct cli_opt *opts, const char *name, long lo, long hi)
{
    for (; opts->name; opts++)
        if (!strcmp(opts->name, name)) {
            opts->lo = lo, opts->hi = hi;
            return 0;
        }
    return -1;
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
    struct modelref ref; /* a directory, or a repo id in the Hugging Face cache */
    int rc = modelref_resolve(o->dir, &ref, err);
    if (rc)
        return rc;
    rc = model_load(&cm->model, ref.dir, err);
    if (rc)
        return rc;
    struct cli_progress pg;
    cli_progress_init(&pg, o->dir);
    struct be_options bo = {.n_threads = o->n_threads, .isa = o->isa,
                            .kv_prefault = o->kv_prefault, .progress = cli_progress_show, .progress_user = &pg,
                            .quantize = o->quantize};
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

void cli_format_size(char *buf, size_t n, size_t done, size_t total)
{
    int gb = total >= 1000000000u;
    double unit = gb ? 1e9 : 1e6;
    snprintf(buf, n, "%.1f/%.1f %s", (double)done / unit, (double)total / unit, gb ? "GB" : "MB");
}

void cli_progress_init(struct cli_progress *p, const char *what)
{
    p->what = what ? what : "model";
    p->tty = isatty(STDERR_FILENO);
    p->t0 = rl_mono_s();
}

void cli_progress_show(void *user, size_t done, size_t total)
{
    struct cli_progress *p = user;
    int last = done >= total;
    if (!p->tty && !last)
        return;
    char size[64];
    cli_format_size(size, sizeof size, done, total);
    int pct = total ? (int)((double)done * 100.0 / (double)total) : 100;
    /* \r + erase-line redraws in place; the final line keeps its newline */
    fprintf(stderr, "%sloading %s: %s  %3d%%", p->tty ? "\r\033[K" : "", p->what, size, pct);
    if (last)
        fprintf(stderr, "  %.1f s\n", rl_mono_s() - p->t0);
    fflush(stderr);
}

void cli_on_signal(int sig, void (*fn)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}
