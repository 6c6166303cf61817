/* tests/bench/bench_batching.c - the batching engine under load.
 *
 *   bench_batching -m DIR [--threads 2] [--prompt 128] [--gen 128]
 *                  [--conc 1,4,16,64] [--prefix-prompt 512] [--shared 0,50,90]
 *
 * For each concurrency C, C requests (distinct random prompts, greedy,
 * ignore_eos) are submitted at once and run to the end; one JSON line:
 * aggregate generated tokens/s over the whole run (prompts' prefill
 * included), the decode rate (tokens generated once every request had its
 * first token, over that stretch of time: all C sequences decoding, no
 * prefill, which is what llama.cpp's batched-bench calls S_TG), mean and
 * p50/max time to first token, mean time per output token (after the
 * first). Then the
 * prefix-cache figure: a request whose prompt shares X% with one that ran
 * before (its blocks cached) against the same request on a cold cache,
 * time to first token of each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

struct bench_req {
    double t_submit, t_first, t_last;
    int n;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void rand_prompt(int32_t *ids, int n, uint32_t seed, int vocab)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        ids[i] = (int32_t)((seed >> 8) % (uint32_t)(vocab - 1000 > 100 ? vocab - 1000 : vocab));
    }
}

/* What run_all saw of the decode phase: from the step at which the last
 * request got its first token to the end. */
struct decode_phase {
    double t0, t1;
    long tokens;
};

/* Runs every submitted request to the end, stamping first/last tokens. */
static int run_all(struct engine *e, int n_req, struct decode_phase *dp, struct rl_err *err)
{
    int started = 0;
    if (dp)
        memset(dp, 0, sizeof *dp);
    while (engine_n_active(e) > 0) {
        const struct engine_event *ev;
        int n;
        if (engine_step(e, &ev, &n, err))
            return -1;
        double now = engine_now();
        int all_before = started == n_req;
        for (int i = 0; i < n; i++) {
            struct bench_req *r = ev[i].user;
            if (ev[i].n_tokens && !r->n) {
                r->t_first = now;
                started++;
            }
            if (ev[i].n_tokens)
                r->t_last = now;
            r->n += ev[i].n_tokens;
            if (dp && all_before)
                dp->tokens += ev[i].n_tokens;
        }
        if (dp && !all_before && started == n_req)
            dp->t0 = now;
        if (dp)
            dp->t1 = now;
    }
    return 0;
}

static int submit(struct engine *e, const int32_t *ids, int n, int gen, struct bench_req *r,
                  struct rl_err *err)
{
    struct engine_request q;
    engine_request_init(&q);
    q.prompt_ids = ids;
    q.n_prompt = n;
    q.max_tokens = gen;
    q.temperature = 0;
    q.ignore_eos = true;
    q.user = r;
    memset(r, 0, sizeof *r);
    r->t_submit = engine_now();
    return engine_submit(e, &q, NULL, err);
}

static int parse_list(const char *s, int *out, int cap)
{
    int n = 0;
    while (s && *s && n < cap) {
        out[n++] = atoi(s);
        s = strchr(s, ',');
        if (s)
            s++;
    }
    return n;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *conc_s = "1,4,16,64", *shared_s = "0,50,90";
    int threads = 2, prompt = 128, gen = 128, pprompt = 512;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m"))
            dir = argv[i + 1];
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt"))
            prompt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gen"))
            gen = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--conc"))
            conc_s = argv[i + 1];
        else if (!strcmp(argv[i], "--prefix-prompt"))
            pprompt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--shared"))
            shared_s = argv[i + 1];
        else {
            fprintf(stderr, "bench_batching: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!dir || prompt < 1 || gen < 1 || pprompt < 2) {
        fprintf(stderr, "usage: bench_batching -m DIR [--threads N] [--prompt P] [--gen G] "
                        "[--conc 1,4,16,64] [--prefix-prompt N] [--shared 0,50,90]\n");
        return 2;
    }
    int conc[16], shared[16];
    int n_conc = parse_list(conc_s, conc, 16), n_shared = parse_list(shared_s, shared, 16);
    int max_conc = 1;
    for (int i = 0; i < n_conc; i++)
        if (conc[i] > max_conc)
            max_conc = conc[i];

    /* one engine per measurement, its KV pool sized to what the run needs:
     * a pool larger than needed costs the CPU backend time per step */
    struct engine_options o;
    engine_options_default(&o);
    o.n_threads = threads;
    o.max_batch = max_conc;
    o.token_budget = 512 > max_conc ? 512 : max_conc;
    o.kv_prefault = 1; /* as the worker runs it */
    int per = (prompt + gen + 15) / 16, per_p = (pprompt + 1 + 15) / 16;
    struct engine *e;
    struct rl_err err = {0};
    o.kv_blocks = 2 * per_p + 4;
    if (engine_create(&e, dir, &o, &err)) {
        fprintf(stderr, "bench_batching: %s\n", err.msg);
        return 1;
    }
    int vocab = engine_n_vocab(e);
    int32_t *ids = malloc(((size_t)max_conc + 2) * (size_t)(prompt > pprompt ? prompt : pprompt) *
                          sizeof *ids);
    struct bench_req *reqs = calloc((size_t)max_conc, sizeof *reqs);
    double *ttft = calloc((size_t)max_conc, sizeof *ttft);
    if (!ids || !reqs || !ttft)
        return 1;
    uint32_t seed = 1;

    for (int c = 0; c < n_conc; c++) {
        int C = conc[c];
        if (C < 1)
            continue;
        engine_free(e);
        o.kv_blocks = C * per + 4;
        if (engine_create(&e, dir, &o, &err)) {
            fprintf(stderr, "bench_batching: %s\n", err.msg);
            return 1;
        }
        for (int i = 0; i < C; i++)
            rand_prompt(ids + (size_t)i * (size_t)prompt, prompt, seed++ * 7919u, vocab);
        double t0 = engine_now();
        for (int i = 0; i < C; i++)
            if (submit(e, ids + (size_t)i * (size_t)prompt, prompt, gen, &reqs[i], &err)) {
                fprintf(stderr, "bench_batching: %s\n", err.msg);
                return 1;
            }
        struct decode_phase dp;
        if (run_all(e, C, &dp, &err)) {
            fprintf(stderr, "bench_batching: %s\n", err.msg);
            return 1;
        }
        double t1 = engine_now();
        long total = 0;
        double tpot = 0, ttft_sum = 0;
        for (int i = 0; i < C; i++) {
            total += reqs[i].n;
            ttft[i] = reqs[i].t_first - reqs[i].t_submit;
            ttft_sum += ttft[i];
            if (reqs[i].n > 1)
                tpot += (reqs[i].t_last - reqs[i].t_first) / (reqs[i].n - 1);
        }
        qsort(ttft, (size_t)C, sizeof *ttft, cmp_double);
        printf("{\"bench\": \"batching\", \"concurrency\": %d, \"prompt\": %d, \"gen\": %d, "
               "\"threads\": %d, \"generated\": %ld, \"seconds\": %.3f, "
               "\"tokens_per_s\": %.1f, \"decode_tokens_per_s\": %.1f, \"ttft_ms_mean\": %.1f, "
               "\"ttft_ms_p50\": %.1f, \"ttft_ms_max\": %.1f, \"tpot_ms_mean\": %.2f}\n",
               C, prompt, gen, threads, total, t1 - t0, (double)total / (t1 - t0),
               dp.t1 > dp.t0 ? (double)dp.tokens / (dp.t1 - dp.t0) : 0.0,
               1e3 * ttft_sum / C, 1e3 * ttft[C / 2], 1e3 * ttft[C - 1], 1e3 * tpot / C);
        fflush(stdout);
    }

    /* prefix cache: warm a base prompt, then time a request sharing X% */
    engine_free(e);
    o.kv_blocks = 2 * per_p + 4;
    if (engine_create(&e, dir, &o, &err)) {
        fprintf(stderr, "bench_batching: %s\n", err.msg);
        return 1;
    }
    int32_t *base = ids, *probe = ids + pprompt;
    /* a fresh engine's first prefill also pays the first touch of its
     * activation buffers: run one unrelated prompt first, uncounted */
    {
        struct bench_req w;
        rand_prompt(base, pprompt, 99991u, vocab);
        if (submit(e, base, pprompt, 1, &w, &err) || run_all(e, 1, NULL, &err)) {
            fprintf(stderr, "bench_batching: %s\n", err.msg);
            return 1;
        }
    }
    for (int s = 0; s < n_shared; s++) {
        int X = shared[s] < 0 ? 0 : shared[s] > 100 ? 100 : shared[s];
        int n_sh = pprompt * X / 100;
        rand_prompt(base, pprompt, seed++ * 104729u, vocab);
        memcpy(probe, base, (size_t)n_sh * sizeof *probe);
        rand_prompt(probe + n_sh, pprompt - n_sh, seed++ * 15485863u, vocab);
        struct bench_req warm, hit;
        if (submit(e, base, pprompt, 1, &warm, &err) || run_all(e, 1, NULL, &err) ||
            submit(e, probe, pprompt, 1, &hit, &err) || run_all(e, 1, NULL, &err)) {
            fprintf(stderr, "bench_batching: %s\n", err.msg);
            return 1;
        }
        struct engine_stats st;
        engine_get_stats(e, &st);
        printf("{\"bench\": \"prefix_cache\", \"prompt\": %d, \"shared_pct\": %d, "
               "\"ttft_ms_cold\": %.1f, \"ttft_ms\": %.1f, \"ratio\": %.3f}\n",
               pprompt, X, 1e3 * (warm.t_first - warm.t_submit),
               1e3 * (hit.t_first - hit.t_submit),
               (hit.t_first - hit.t_submit) / (warm.t_first - warm.t_submit));
        fflush(stdout);
    }
    engine_free(e);
    free(ids);
    free(reqs);
    free(ttft);
    return 0;
}
