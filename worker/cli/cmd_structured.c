/* worker/cli/cmd_structured.c - the cost of structured output:
 *
 *   redlm bench-engine -m DIR --json-schema FILE [--prompt P] [--gen G]
 *                      [--batch B] [--reps R] [--threads N] [--isa X]
 *
 * bench-engine hands over here when --json-schema is given. B requests
 * (distinct random prompts of P tokens, no_think, temperature 1 with a
 * seed each, G tokens) run through one engine three ways, alternately, R
 * times after an untimed warm-up: free (ignore_eos, so it runs G tokens),
 * constrained by the schema with the masks on the helper thread during
 * the forward pass (the engine's default), and constrained with the masks
 * computed on the owner thread before it (grammar_inline_masks). The
 * schema should admit documents longer than G tokens (a long array), so
 * every constrained request also runs G tokens and ends "length". The
 * decode rate of a run is the tokens generated after every request had
 * its first token, over that stretch of time (as bench_batching and
 * cmd_spec.c measure it); a mode's figure is its tokens over its time
 * across the R runs, and the ratios divide those. The engine's compile
 * cache makes every run after the first reuse the compiled schema.
 * Single-threaded: this function owns the engines. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "cmds.h"
#include "engine.h"
#include "file.h"

struct st_args {
    const char *dir, *schema, *isa, *backend;
    int threads, prompt, gen, batch, reps;
};

static void st_usage(void)
{
    fprintf(stderr,
            "usage: redlm bench-engine -m DIR --json-schema FILE [--prompt P] [--gen G]\n"
            "                 [--batch B] [--reps R] [--threads N] [--isa X] [--backend B]\n"
            "  --json-schema FILE  the constraint (a schema whose documents outlast G tokens)\n"
            "  --reps R            runs of each mode, alternating (3)\n");
}

static int st_parse(int argc, char **argv, struct st_args *a, struct rl_err *err)
{
    memset(a, 0, sizeof *a);
    a->prompt = 128, a->gen = 64, a->batch = 1, a->reps = 3;
    a->backend = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x;
        int rc = 0;
        if (!v)
            return rl_errf(err, RL_EINVAL, "%s: needs a value", f);
        if (!strcmp(f, "-m") || !strcmp(f, "--model"))
            a->dir = v;
        else if (!strcmp(f, "--json-schema"))
            a->schema = v;
        else if (!strcmp(f, "--isa"))
            a->isa = v;
        else if (!strcmp(f, "--backend"))
            a->backend = v;
        else if (!strcmp(f, "--threads"))
            rc = cli_parse_int(v, 1, 1024, &x, f, err), a->threads = (int)x;
        else if (!strcmp(f, "--prompt"))
            rc = cli_parse_int(v, 1, 1 << 16, &x, f, err), a->prompt = (int)x;
        else if (!strcmp(f, "--gen"))
            rc = cli_parse_int(v, 2, 1 << 16, &x, f, err), a->gen = (int)x;
        else if (!strcmp(f, "--batch"))
            rc = cli_parse_int(v, 1, 256, &x, f, err), a->batch = (int)x;
        else if (!strcmp(f, "--reps"))
            rc = cli_parse_int(v, 1, 100, &x, f, err), a->reps = (int)x;
        else
            return 1;
        if (rc)
            return rc;
        i++;
    }
    if (!a->dir || !a->schema)
        return rl_errf(err, RL_EINVAL, "-m DIR and --json-schema FILE are required");
    return 0;
}

enum st_mode { ST_FREE, ST_HELPER, ST_INLINE };

/* One run of B requests; adds its decode tokens and seconds. */
static int st_run(struct engine *e, const int32_t *prompts, const struct st_args *a,
                  enum st_mode mode, const char *schema, size_t schema_len, long *tokens,
                  double *secs, struct rl_err *err)
{
    int B = a->batch, P = a->prompt;
    char *started = calloc((size_t)B, 1);
    if (!started)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    int rc = 0;
    for (int s = 0; s < B && !rc; s++) {
        struct engine_request q;
        engine_request_init(&q);
        q.prompt_ids = prompts + (size_t)s * (size_t)P;
        q.n_prompt = P;
        q.mode = ENGINE_MODE_NO_THINK;
        q.temperature = 1;
        q.top_k = 0;
        q.top_p = 1;
        q.has_seed = true;
        q.seed = (uint64_t)s + 1;
        q.max_tokens = a->gen;
        q.user = started + s;
        if (mode == ST_FREE) {
            q.ignore_eos = true;
        } else {
            q.constraint = ENGINE_CONSTRAINT_JSON_SCHEMA;
            q.constraint_src = schema;
            q.constraint_len = schema_len;
        }
        rc = engine_submit(e, &q, NULL, err);
    }
    int n_started = 0;
    long after = 0;
    double t0 = 0;
    while (!rc && engine_n_active(e) > 0) {
        const struct engine_event *ev;
        int n;
        if ((rc = engine_step(e, &ev, &n, err)))
            break;
        for (int i = 0; i < n; i++) {
            char *st = ev[i].user;
            if (ev[i].finish == ENGINE_FINISH_ERROR) {
                rc = rl_errf(err, RL_EINTERNAL, "%s", ev[i].error ? ev[i].error : "engine error");
                break;
            }
            if (ev[i].n_tokens > 0 && !*st) {
                *st = 1;
                n_started++;
            } else if (t0 > 0) {
                after += ev[i].n_tokens;
            }
        }
        if (n_started == B && t0 == 0)
            t0 = engine_now();
    }
    if (!rc) {
        *tokens += after;
        *secs += engine_now() - t0;
    }
    free(started);
    return rc;
}

static int st_engine(const struct st_args *a, bool inline_masks, struct engine **e,
                     struct rl_err *err)
{
    struct engine_options eo;
    engine_options_default(&eo);
    eo.backend = a->backend;
    eo.isa = a->isa;
    eo.n_threads = a->threads;
    eo.max_batch = a->batch;
    eo.kv_blocks = a->batch * ((a->prompt + a->gen + 15) / 16 + 1);
    eo.kv_prefault = 1; /* steady state: a server's pool is warm */
    eo.grammar_inline_masks = inline_masks;
    return engine_create(e, a->dir, &eo, err);
}

/* `redlm bench-engine ... --json-schema FILE` */
int cmd_bench_structured(int argc, char **argv)
{
    struct st_args a;
    struct rl_err err = {0};
    int rc = st_parse(argc, argv, &a, &err);
    if (rc > 0) {
        st_usage();
        return 1;
    }
    size_t len = 0;
    char *schema = NULL;
    if (!rc)
        rc = file_read(a.schema, 0, &schema, &len, &err);
    struct engine *e[2] = {NULL, NULL}; /* helper masks, inline masks */
    int32_t *prompts = NULL;
    if (!rc && (rc = st_engine(&a, false, &e[0], &err)) == 0)
        rc = st_engine(&a, true, &e[1], &err);
    if (!rc && !(prompts = malloc((size_t)a.batch * (size_t)a.prompt * sizeof *prompts)))
        rc = rl_errf(&err, RL_ENOMEM, "out of memory");
    if (!rc) {
        uint64_t r = 0x9e3779b97f4a7c15ull;
        int V = engine_n_vocab(e[0]);
        for (size_t i = 0; i < (size_t)a.batch * (size_t)a.prompt; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            prompts[i] = (int32_t)(r % (uint64_t)V);
        }
    }
    long tok[3] = {0, 0, 0}, warm = 0;
    double sec[3] = {0, 0, 0}, wsec = 0;
    /* warm-up, not counted: first touch of buffers, the compile of the schema */
    if (!rc)
        rc = st_run(e[0], prompts, &a, ST_FREE, schema, len, &warm, &wsec, &err);
    for (int k = 0; k < 2 && !rc; k++)
        rc = st_run(e[k], prompts, &a, ST_HELPER, schema, len, &warm, &wsec, &err);
    for (int rep = 0; rep < a.reps && !rc; rep++)
        for (int m = ST_FREE; m <= ST_INLINE && !rc; m++)
            rc = st_run(e[m == ST_INLINE], prompts, &a, (enum st_mode)m, schema, len, &tok[m],
                        &sec[m], &err);
    if (rc) {
        fprintf(stderr, "redlm bench-engine: %s\n", err.msg);
    } else {
        double f = sec[0] > 0 ? tok[0] / sec[0] : 0, h = sec[1] > 0 ? tok[1] / sec[1] : 0,
               in = sec[2] > 0 ? tok[2] / sec[2] : 0;
        printf("{\"bench\": \"structured\", \"schema\": \"%s\", \"prompt\": %d, \"gen\": %d, "
               "\"batch\": %d, \"reps\": %d, \"free_tok_s\": %.2f, \"constrained_tok_s\": %.2f, "
               "\"constrained_inline_masks_tok_s\": %.2f, \"constrained_over_free\": %.4f, "
               "\"helper_over_inline\": %.4f}\n",
               a.schema, a.prompt, a.gen, a.batch, a.reps, f, h, in, f > 0 ? h / f : 0,
               in > 0 ? h / in : 0);
    }
    free(prompts);
    free(schema);
    engine_free(e[0]);
    engine_free(e[1]);
    return rc ? 1 : 0;
}
