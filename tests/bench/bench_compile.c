/* tests/bench/bench_compile.c - what compiling a new constraint costs the
 * requests already running: the compile thread (the engine's default)
 * against a compile inside engine_submit (grammar_sync_compile, how the
 * engine worked before).
 *
 * One engine per mode, the same model. B free requests decode (no_think,
 * temperature 1, a seed each, ignore_eos, G tokens); once every one has 4
 * tokens, K requests constrained by the schema arrive together, each text
 * new to the engine (trailing spaces, a different number per request and
 * run: the same grammar, a cache miss). What the running requests see is
 * the time between two steps of theirs, submits included (a worker's loop
 * submits and steps on one thread): per run, the longest such gap from
 * the submits until every constrained request has its first token
 * ("stall"), and the median gap before the submits ("step"); and the
 * constrained requests' time from submit to first token, the first's and
 * the last's ("ttft"). Modes: inside engine_submit (grammar_sync_compile,
 * how the engine worked before), one compile thread, C compile threads.
 * They alternate R times after an untimed warm-up of each; medians over
 * the runs, wall clock (latency is what is measured; the machine's noise
 * is why the modes alternate). Prints one JSON line per mode and one with
 * the ratios.
 *
 * usage: bench_compile -m DIR [--schema FILE] [--batch B] [--gen G]
 *                      [--constrained K] [--compile-threads C]
 *                      [--reps R] [--threads N]
 * DIR needs the real tokenizer (a compile's cost is the vocabulary's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine.h"
#include "file.h"
#include "tests/bench/bench_util.h"

/* Near the compiler's state limit (schemas/grammar.md): the slowest kind
 * of schema a client can send that is still accepted. */
static const char DEFAULT_SCHEMA[] =
    "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\",\"maxLength\":2000}]}";

struct run {
    double stall_ms, step_ms, ttft_ms, ttft_last_ms;
};

#define K_MAX 16

static int die(const char *what, const struct rl_err *err)
{
    fprintf(stderr, "bench_compile: %s: %s\n", what, err->msg);
    return 1;
}

/* One run on e: B free requests, then the K constrained ones with src[]. */
static int one_run(struct engine *e, const int32_t *prompt, int P, int B, int G, int K,
                   char *const *src, struct run *out, struct rl_err *err)
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
    int constrained_tok[K_MAX] = {0};
    double gaps[4096];
    int n_gaps = 0, n_first = 0;
    double t_last = rl_mono_s(), t_submit = 0, stall = 0, ttft = 0, ttft_last = 0;
    bool submitted = false;
    while (!rc && engine_n_active(e) > 0) {
        if (!submitted) {
            bool all = true;
            for (int s = 0; s < B; s++)
                all = all && tokens[s] >= 4;
            if (all) {
                t_submit = rl_mono_s();
                for (int k = 0; k < K && !rc; k++) {
                    struct engine_request q;
                    engine_request_init(&q);
                    q.prompt_ids = prompt;
                    q.n_prompt = P;
                    q.mode = ENGINE_MODE_NO_THINK;
                    q.max_tokens = 4;
                    q.user = &constrained_tok[k];
                    q.constraint = ENGINE_CONSTRAINT_JSON_SCHEMA;
                    q.constraint_src = src[k];
                    q.constraint_len = strlen(src[k]);
                    rc = engine_submit(e, &q, NULL, err);
                }
                if (rc)
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
        else if (submitted && n_first < K && t - t_last > stall)
            stall = t - t_last;
        if (submitted && n_first < K) {
            int got = 0;
            for (int k = 0; k < K; k++)
                got += constrained_tok[k] > 0;
            if (got > 0 && n_first == 0)
                ttft = t - t_submit;
            if (got == K)
                ttft_last = t - t_submit;
            n_first = got;
        }
        t_last = t;
    }
    if (!rc && n_first < K)
        rc = rl_errf(err, RL_EINTERNAL, "a constrained request never started");
    out->stall_ms = stall * 1e3;
    out->step_ms = bench_median(gaps + 1, n_gaps > 1 ? n_gaps - 1 : 0) * 1e3; /* the first has the prefill */
    out->ttft_ms = ttft * 1e3;
    out->ttft_last_ms = ttft_last * 1e3;
    return rc;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *schema_file = NULL;
    int B = 4, G = 400, R = 5, threads = 2, P = 16, K = 1, C = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--schema")) schema_file = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gen")) G = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) R = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--constrained")) K = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--compile-threads")) C = atoi(argv[i + 1]);
        else dir = NULL, i = argc;
    }
    if (!dir || B < 1 || B > 255 || G < 16 || R < 1 || R > 100 || threads < 1 || K < 1 ||
        K > K_MAX || C < 2 || C > 16) {
        fprintf(stderr, "usage: %s -m DIR [--schema FILE] [--batch B] [--gen G] [--constrained K"
                        " (1-%d)] [--compile-threads C (2-16)] [--reps R] [--threads N]\n",
                argv[0], K_MAX);
        return 2;
    }
    struct rl_err err = {0};
    char *schema = NULL;
    size_t len = 0;
    if (schema_file && file_read(schema_file, 0, &schema, &len, &err))
        return die(schema_file, &err);
    const char *base = schema ? schema : DEFAULT_SCHEMA;
    size_t base_len = strlen(base);
    size_t pad_max = (size_t)(R + 1) * K_MAX;
    char *src[K_MAX];
    for (int k = 0; k < K; k++)
        if (!(src[k] = malloc(base_len + pad_max + 1)))
            return fprintf(stderr, "bench_compile: out of memory\n"), 1;
    int32_t *prompt = malloc((size_t)B * (size_t)P * sizeof *prompt);
    if (!prompt)
        return fprintf(stderr, "bench_compile: out of memory\n"), 1;
    enum { N_MODES = 3 };
    const char *names[N_MODES] = {"sync", "threads_1", "threads_n"};
    struct engine *e[N_MODES] = {NULL, NULL, NULL};
    for (int m = 0; m < N_MODES; m++) {
        struct engine_options o;
        engine_options_default(&o);
        o.n_threads = threads;
        o.max_batch = B + K;
        o.kv_blocks = (B + K) * ((P + G + 15) / 16 + 2);
        o.kv_prefault = 1;
        o.grammar_sync_compile = m == 0;
        o.grammar_compile_threads = m == 2 ? C : 1;
        if (engine_create(&e[m], dir, &o, &err))
            return die(dir, &err);
    }
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < (size_t)B * (size_t)P; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        prompt[i] = (int32_t)(r % (uint64_t)engine_n_vocab(e[0]));
    }
    static double stall[N_MODES][100], step[N_MODES][100], ttft[N_MODES][100],
        ttft_last[N_MODES][100];
    /* run k's texts: the schema and k * K_MAX + i spaces (k = 0 the warm-up's) */
    for (int k = 0; k <= R; k++)
        for (int mi = 0; mi < N_MODES; mi++) {
            int m = (k + mi) % N_MODES; /* each mode first in turn */
            for (int i = 0; i < K; i++) {
                size_t pad = (size_t)k * K_MAX + (size_t)i;
                memcpy(src[i], base, base_len);
                memset(src[i] + base_len, ' ', pad);
                src[i][base_len + pad] = 0;
            }
            struct run x;
            if (one_run(e[m], prompt, P, B, G, K, src, &x, &err))
                return die(names[m], &err);
            if (k > 0) {
                stall[m][k - 1] = x.stall_ms;
                step[m][k - 1] = x.step_ms;
                ttft[m][k - 1] = x.ttft_ms;
                ttft_last[m][k - 1] = x.ttft_last_ms;
            }
        }
    double ms[N_MODES], last[N_MODES];
    for (int m = 0; m < N_MODES; m++) {
        ms[m] = bench_median(stall[m], R);
        last[m] = bench_median(ttft_last[m], R);
        printf("{\"bench\": \"compile_stall\", \"mode\": \"%s\", \"compile_threads\": %d, "
               "\"batch\": %d, \"constrained\": %d, \"reps\": %d, \"step_ms\": %.2f, "
               "\"stall_ms\": %.2f, \"ttft_first_ms\": %.2f, \"ttft_last_ms\": %.2f}\n",
               names[m], m == 0 ? 0 : m == 1 ? 1 : C, B, K, R, bench_median(step[m], R), ms[m],
               bench_median(ttft[m], R), last[m]);
    }
    printf("{\"bench\": \"compile_stall_ratio\", \"batch\": %d, \"constrained\": %d, "
           "\"sync_over_threads_1_stall\": %.2f, \"threads_1_over_threads_n_ttft_last\": %.2f}\n",
           B, K, ms[1] > 0 ? ms[0] / ms[1] : 0, last[2] > 0 ? last[1] / last[2] : 0);
    for (int m = 0; m < N_MODES; m++)
        engine_free(e[m]);
    for (int k = 0; k < K; k++)
        free(src[k]);
    free(prompt);
    free(schema);
    return 0;
}
