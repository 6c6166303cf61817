/* tests/bench/bench_compile.c - what compiling a new constraint costs the
 * requests already running: the compile thread (the engine's default)
 * against a compile inside engine_submit (grammar_sync_compile, how the
 * engine worked before).
 *
 * One engine per mode, the same model. B free requests decode (no_think,
 * temperature 1, a seed each, ignore_eos, G tokens); once every one has 4
 * tokens, one request constrained by the schema arrives, its text new to
 * the engine every run (the run's number appended as trailing spaces: the
 * same grammar, a cache miss). What the running requests see is the time
 * between two steps of theirs, submit included (a worker's loop submits
 * and steps on one thread): per run, the longest such gap from the
 * submit until the constrained request's first token ("stall"), and the
 * median gap before the submit ("step"); and the constrained request's
 * time from submit to first token ("ttft"). The modes alternate R times
 * after an untimed warm-up of each; medians over the runs, wall clock
 * (latency is what is measured; the machine's noise is why the modes
 * alternate). Prints one JSON line per mode and one with the ratios.
 *
 * usage: bench_compile -m DIR [--schema FILE] [--batch B] [--gen G]
 *                      [--reps R] [--threads N]
 * DIR needs the real tokenizer (a compile's cost is the vocabulary's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine.h"
#include "file.h"

/* Near the compiler's state limit (schemas/grammar.md): the slowest kind
 * of schema a client can send that is still accepted. */
static const char DEFAULT_SCHEMA[] =
    "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\",\"maxLength\":2000}]}";

struct run {
    double stall_ms, step_ms, ttft_ms;
};

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0;
}

static int die(const char *what, const struct rl_err *err)
{
    fprintf(stderr, "bench_compile: %s: %s\n", what, err->msg);
    return 1;
}

/* One run on e: B free requests, then the constrained one with src. */
static int one_run(struct engine *e, const int32_t *prompt, int P, int B, int G, const char *src,
                   struct run *out, struct rl_err *err)
{
    int tokens[256] = {0};
    int rc = 0;
    for (int s = 0; s < B && !rc; s++) {
        struct engine_request q;
        engine_request_init(&q);
        q.prompt_ids = prompt + (size_t)s * (size_t)P;
        q.n_prompt = P;
        q.mode = ENGINE_MODE_NO_THINK;
        q.temperature = 1;
        q.has_seed = true;
        q.seed = (uint64_t)s + 1;
        q.ignore_eos = true;
        q.max_tokens = G;
        q.user = &tokens[s];
        rc = engine_submit(e, &q, NULL, err);
    }
    int constrained_tok = 0;
    double gaps[4096];
    int n_gaps = 0;
    double t_last = rl_mono_s(), t_submit = 0, stall = 0, ttft = 0;
    bool submitted = false, first = false;
    while (!rc && engine_n_active(e) > 0) {
        if (!submitted) {
            bool all = true;
            for (int s = 0; s < B; s++)
                all = all && tokens[s] >= 4;
            if (all) {
                struct engine_request q;
                engine_request_init(&q);
                q.prompt_ids = prompt;
                q.n_prompt = P;
                q.mode = ENGINE_MODE_NO_THINK;
                q.max_tokens = 4;
                q.user = &constrained_tok;
                q.constraint = ENGINE_CONSTRAINT_JSON_SCHEMA;
                q.constraint_src = src;
                q.constraint_len = strlen(src);
                t_submit = rl_mono_s();
                if ((rc = engine_submit(e, &q, NULL, err)))
                    break;
                submitted = true;
            }
        }
        const struct engine_event *ev;
        int n;
        if ((rc = engine_step(e, &ev, &n, err)))
            break;
        double t = rl_mono_s();
        for (int i = 0; i < n; i++) {
            if (ev[i].finish == ENGINE_FINISH_ERROR) {
                rc = rl_errf(err, RL_EINTERNAL, "%s", ev[i].error ? ev[i].error : "engine error");
                break;
            }
            *(int *)ev[i].user += ev[i].n_tokens;
        }
        if (!submitted && n_gaps < 4096)
            gaps[n_gaps++] = t - t_last;
        else if (submitted && !first && t - t_last > stall)
            stall = t - t_last;
        if (submitted && !first && constrained_tok > 0) {
            first = true;
            ttft = t - t_submit;
        }
        t_last = t;
    }
    if (!rc && !first)
        rc = rl_errf(err, RL_EINTERNAL, "the constrained request never started");
    out->stall_ms = stall * 1e3;
    out->step_ms = median(gaps + 1, n_gaps > 1 ? n_gaps - 1 : 0) * 1e3; /* the first has the prefill */
    out->ttft_ms = ttft * 1e3;
    return rc;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *schema_file = NULL;
    int B = 4, G = 400, R = 5, threads = 2, P = 16;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--schema")) schema_file = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gen")) G = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) R = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else dir = NULL, i = argc;
    }
    if (!dir || B < 1 || B > 255 || G < 16 || R < 1 || R > 100 || threads < 1) {
        fprintf(stderr, "usage: %s -m DIR [--schema FILE] [--batch B] [--gen G] [--reps R] "
                        "[--threads N]\n", argv[0]);
        return 2;
    }
    struct rl_err err = {0};
    char *schema = NULL;
    size_t len = 0;
    if (schema_file && file_read(schema_file, 0, &schema, &len, &err))
        return die(schema_file, &err);
    const char *base = schema ? schema : DEFAULT_SCHEMA;
    size_t base_len = strlen(base);
    char *src = malloc(base_len + 2 * (size_t)R + 8);
    int32_t *prompt = malloc((size_t)B * (size_t)P * sizeof *prompt);
    if (!src || !prompt)
        return fprintf(stderr, "bench_compile: out of memory\n"), 1;
    struct engine *e[2] = {NULL, NULL}; /* async, sync */
    for (int m = 0; m < 2; m++) {
        struct engine_options o;
        engine_options_default(&o);
        o.n_threads = threads;
        o.max_batch = B + 1;
        o.kv_blocks = (B + 1) * ((P + G + 15) / 16 + 2);
        o.kv_prefault = 1;
        o.grammar_sync_compile = m == 1;
        if (engine_create(&e[m], dir, &o, &err))
            return die(dir, &err);
    }
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < (size_t)B * (size_t)P; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        prompt[i] = (int32_t)(r % (uint64_t)engine_n_vocab(e[0]));
    }
    double stall[2][100], step[2][100], ttft[2][100];
    /* run k's text: the schema and k spaces (k = 0 the warm-up's) */
    for (int k = 0; k <= R; k++)
        for (int mi = 0; mi < 2; mi++) {
            int m = (k + mi) % 2; /* each mode first in turn */
            memcpy(src, base, base_len);
            memset(src + base_len, ' ', (size_t)k);
            src[base_len + (size_t)k] = 0;
            struct run x;
            if (one_run(e[m], prompt, P, B, G, src, &x, &err))
                return die(m ? "sync" : "async", &err);
            if (k > 0) {
                stall[m][k - 1] = x.stall_ms;
                step[m][k - 1] = x.step_ms;
                ttft[m][k - 1] = x.ttft_ms;
            }
        }
    const char *names[2] = {"async", "sync"};
    double ms[2];
    for (int m = 0; m < 2; m++) {
        ms[m] = median(stall[m], R);
        printf("{\"bench\": \"compile_stall\", \"mode\": \"%s\", \"batch\": %d, \"reps\": %d, "
               "\"step_ms\": %.2f, \"stall_ms\": %.2f, \"ttft_ms\": %.2f}\n",
               names[m], B, R, median(step[m], R), ms[m], median(ttft[m], R));
    }
    printf("{\"bench\": \"compile_stall_ratio\", \"batch\": %d, \"sync_over_async_stall\": %.2f}\n",
           B, ms[0] > 0 ? ms[1] / ms[0] : 0);
    engine_free(e[0]);
    engine_free(e[1]);
    free(src);
    free(prompt);
    free(schema);
    return 0;
}
