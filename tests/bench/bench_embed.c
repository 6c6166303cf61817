/* tests/bench/bench_embed.c - what an embedding costs the engine.
 *
 * D documents of L tokens each (distinct random ids, so no prefix-cache
 * hit helps any mode), on one engine, three ways:
 *   - "one": an embed request at a time, each run to its end before the
 *     next (a client that embeds a list in a loop);
 *   - "batch": all D embed requests submitted together, continuous
 *     batching packs their prompts into the steps (a list in one request,
 *     which the front door sends as D jobs);
 *   - "prefill": the same D prompts as generating requests of one token,
 *     submitted together: the prefill an embedding should cost, no more;
 *   - "score": the same D prompts as score requests of two ids, together
 *     (what a rerank job costs: Qwen3-Reranker's "yes" and "no").
 * Each mode runs R times, alternating, after an untimed warm-up; every
 * run has documents of its own, so each computes every prompt. Prints one JSON line per mode (median
 * prompt tokens per second and ms per document) and one with the ratios
 * batch/one and batch/prefill.
 *
 * usage: bench_embed -m DIR [--docs D] [--len L] [--reps R] [--threads N]
 *                    [--max-batch B] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine.h"
#include "tests/bench/bench_util.h"

enum mode { MODE_ONE, MODE_BATCH, MODE_PREFILL, MODE_SCORE, N_MODES };
static const char *const mode_name[N_MODES] = {"one", "batch", "prefill", "score"};

static int drain(struct engine *e, int *n_vectors, struct rl_err *err)
{
    while (engine_n_active(e) > 0) {
        const struct engine_event *ev;
        int n;
        if (engine_step(e, &ev, &n, err))
            return -1;
        for (int i = 0; i < n; i++) {
            if (ev[i].finish == ENGINE_FINISH_ERROR)
                return rl_errf(err, RL_EINTERNAL, "a request failed: %s", ev[i].error);
            *n_vectors += ev[i].embedding != NULL;
        }
    }
    return 0;
}

static int submit(struct engine *e, const int32_t *ids, int L, enum mode m, struct rl_err *err)
{
    static const int32_t yes_no[2] = {9693, 2152};
    struct engine_request q;
    engine_request_init(&q);
    q.prompt_ids = ids;
    q.n_prompt = L;
    q.embed = m == MODE_ONE || m == MODE_BATCH;
    if (m == MODE_SCORE) {
        q.score_ids = yes_no;
        q.n_score = 2;
    }
    q.temperature = 0;
    q.ignore_eos = true;
    q.max_tokens = 1;
    uint64_t id;
    return engine_submit(e, &q, &id, err);
}

/* One run of mode m over the D documents; wall seconds in *secs. */
static int one_run(struct engine *e, enum mode m, const int32_t *docs, int D, int L, double *secs,
                   struct rl_err *err)
{
    int got = 0;
    double t0 = engine_now();
    for (int d = 0; d < D; d++) {
        if (submit(e, docs + (size_t)d * (size_t)L, L, m, err))
            return -1;
        if (m == MODE_ONE && drain(e, &got, err))
            return -1;
    }
    if (drain(e, &got, err))
        return -1;
    *secs = engine_now() - t0;
    if (got != (m == MODE_PREFILL || m == MODE_SCORE ? 0 : D))
        return rl_errf(err, RL_EINTERNAL, "%s: %d vectors for %d documents", mode_name[m], got, D);
    return 0;
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    int D = 32, L = 128, R = 3, threads = 2, max_batch = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "-m"))
            dir = v;
        else if (!strcmp(a, "--docs"))
            D = atoi(v);
        else if (!strcmp(a, "--len"))
            L = atoi(v);
        else if (!strcmp(a, "--reps"))
            R = atoi(v);
        else if (!strcmp(a, "--threads"))
            threads = atoi(v);
        else if (!strcmp(a, "--max-batch"))
            max_batch = atoi(v);
        else
            dir = NULL, i = argc;
    }
    if (!dir || D < 1 || L < 2 || R < 1 || R > 64 || max_batch < 1) {
        fprintf(stderr, "usage: bench_embed -m DIR [--docs D] [--len L] [--reps R] "
                        "[--threads N] [--max-batch B]\n");
        return 2;
    }
    struct engine_options o;
    engine_options_default(&o);
    o.n_threads = threads;
    o.max_batch = max_batch;
    o.kv_blocks = (D * (L + 1) + 15) / 16 + max_batch;
    o.kv_prefault = 1;
    struct rl_err err = {0};
    struct engine *e;
    if (engine_create(&e, dir, &o, &err)) {
        fprintf(stderr, "bench_embed: %s\n", err.msg);
        return 1;
    }
    /* distinct documents per run and mode: nothing comes from the cache */
    int n_sets = 1 + R * N_MODES;
    int32_t *docs = malloc((size_t)n_sets * (size_t)D * (size_t)L * sizeof *docs);
    if (!docs)
        return 1;
    uint32_t s = 12345;
    for (size_t i = 0; i < (size_t)n_sets * (size_t)D * (size_t)L; i++) {
        s = s * 1664525u + 1013904223u;
        docs[i] = (int32_t)((s >> 8) % 30000) + 100;
    }
    double t[N_MODES][64];
    int set = 0;
    size_t per_set = (size_t)D * (size_t)L;
    for (int m = 0; m < N_MODES; m++) { /* warm-up: pages, threads, caches */
        double x;
        if (one_run(e, (enum mode)m, docs, m == MODE_ONE ? 1 : D, L, &x, &err))
            goto fail;
    }
    set = 1;
    for (int r = 0; r < R; r++)
        for (int m = 0; m < N_MODES; m++, set++)
            if (one_run(e, (enum mode)m, docs + (size_t)set * per_set, D, L, &t[m][r], &err))
                goto fail;
    double med[N_MODES];
    for (int m = 0; m < N_MODES; m++) {
        med[m] = bench_median(t[m], R);
        printf("{\"bench\":\"embed\",\"mode\":\"%s\",\"docs\":%d,\"len\":%d,\"threads\":%d,"
               "\"reps\":%d,\"tok_s\":%.1f,\"ms_per_doc\":%.2f}\n",
               mode_name[m], D, L, threads, R, (double)D * L / med[m], 1e3 * med[m] / D);
    }
    printf("{\"bench\":\"embed\",\"batch_over_one\":%.2f,\"batch_over_prefill\":%.3f,"
           "\"score_over_prefill\":%.3f}\n",
           med[MODE_ONE] / med[MODE_BATCH], med[MODE_PREFILL] / med[MODE_BATCH],
           med[MODE_PREFILL] / med[MODE_SCORE]);
    free(docs);
    engine_free(e);
    return 0;
fail:
    fprintf(stderr, "bench_embed: %s\n", err.msg);
    free(docs);
    engine_free(e);
    return 1;
}
