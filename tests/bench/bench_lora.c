/* tests/bench/bench_lora.c - what serving LoRA adapters beside the base
 * costs the engine.
 *
 * Makes A adapters of rank R on every projection for the model (random
 * PEFT adapters, mklora.h) in a temporary directory, then on one engine
 * measures, alternating the modes rep by rep after an untimed warm-up:
 *   - decode: B sequences of a 16-token prompt generating G tokens each,
 *     all on the base ("base"), all on one adapter ("lora"), or spread
 *     over the base and the A adapters in turn ("mixed": a batch of
 *     fine-tunes, what multi-LoRA serving is for); tokens/s over the run;
 *   - prefill: one P-token prompt, one token out, base and one adapter.
 * Every run has prompts of its own (no prefix-cache hit). Prints one JSON
 * line per mode with the median, then the ratios to the base.
 *
 * usage: bench_lora -m DIR [--rank R] [--adapters A] [--batch B] [--gen G]
 *                   [--prompt P] [--reps N] [--threads T] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine.h"
#include "mklora.h"
#include "tests/bench/bench_util.h"

enum mode { M_BASE, M_LORA, M_MIXED, M_PRE_BASE, M_PRE_LORA, N_MODES };
static const char *const mode_name[N_MODES] = {"decode_base", "decode_lora", "decode_mixed",
                                               "prefill_base", "prefill_lora"};
static const char *const lora_names[] = {"a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7"};
#define MAX_ADAPTERS 8

struct args {
    const char *model;
    int rank, n_adapters, batch, gen, prompt, reps, threads;
};

static int drain(struct engine *e, long *tokens, struct rl_err *err)
{
    while (engine_n_active(e) > 0) {
        const struct engine_event *ev;
        int n;
        if (engine_step(e, &ev, &n, err))
            return -1;
        for (int i = 0; i < n; i++) {
            if (ev[i].finish == ENGINE_FINISH_ERROR)
                return rl_errf(err, RL_EINTERNAL, "a request failed: %s", ev[i].error);
            *tokens += ev[i].n_tokens;
        }
    }
    return 0;
}

/* One run of mode m; the tokens/s it measured in *rate (prompt tokens/s
 * for the prefill modes). salt makes the prompts the run's own. */
static int one_run(struct engine *e, const struct args *a, enum mode m, int salt, double *rate,
                   struct rl_err *err)
{
    bool pre = m == M_PRE_BASE || m == M_PRE_LORA;
    int n_seqs = pre ? 1 : a->batch, len = pre ? a->prompt : 16;
    int32_t *ids = malloc((size_t)n_seqs * (size_t)len * sizeof *ids);
    if (!ids)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(salt + 1);
    for (int i = 0; i < n_seqs * len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(1000 + x % 100000);
    }
    double t0 = rl_mono_s();
    int rc = 0;
    for (int s = 0; s < n_seqs && !rc; s++) {
        struct engine_request q;
        engine_request_init(&q);
        q.prompt_ids = ids + (size_t)s * (size_t)len;
        q.n_prompt = len;
        q.temperature = 0;
        q.ignore_eos = true;
        q.max_tokens = pre ? 1 : a->gen;
        if (m == M_LORA || m == M_PRE_LORA)
            q.lora = lora_names[0];
        else if (m == M_MIXED)
            q.lora = s % (a->n_adapters + 1) ? lora_names[s % (a->n_adapters + 1) - 1] : NULL;
        uint64_t id;
        rc = engine_submit(e, &q, &id, err);
    }
    long tokens = 0;
    if (!rc)
        rc = drain(e, &tokens, err);
    double dt = rl_mono_s() - t0;
    free(ids);
    if (rc)
        return rc;
    if (!pre && tokens != (long)n_seqs * a->gen)
        return rl_errf(err, RL_EINTERNAL, "%ld tokens, %d expected", tokens, n_seqs * a->gen);
    *rate = (pre ? (double)len : (double)tokens) / dt;
    return 0;
}

static int parse(int argc, char **argv, struct args *a)
{
    *a = (struct args){NULL, 16, 4, 8, 32, 512, 5, 2};
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "-m"))
            a->model = argv[i + 1];
        else if (!strcmp(argv[i], "--rank"))
            a->rank = v;
        else if (!strcmp(argv[i], "--adapters"))
            a->n_adapters = v;
        else if (!strcmp(argv[i], "--batch"))
            a->batch = v;
        else if (!strcmp(argv[i], "--gen"))
            a->gen = v;
        else if (!strcmp(argv[i], "--prompt"))
            a->prompt = v;
        else if (!strcmp(argv[i], "--reps"))
            a->reps = v;
        else if (!strcmp(argv[i], "--threads"))
            a->threads = v;
        else
            return -1;
    }
    return a->model && a->rank >= 1 && a->rank <= 512 && a->n_adapters >= 1 &&
                   a->n_adapters <= MAX_ADAPTERS && a->batch >= 1 && a->batch <= 64 && a->gen >= 1 &&
                   a->prompt >= 1 && a->reps >= 1 && a->threads >= 1
               ? 0
               : -1;
}

int main(int argc, char **argv)
{
    struct args a;
    if (parse(argc, argv, &a)) {
        fprintf(stderr, "usage: bench_lora -m DIR [--rank R] [--adapters A<=8] [--batch B<=64] "
                        "[--gen G] [--prompt P] [--reps N] [--threads T]\n");
        return 2;
    }
    char tmp[] = "/tmp/redlm-bench-lora.XXXXXX";
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    struct rl_err err = {0};
    struct engine_options o;
    engine_options_default(&o);
    o.n_threads = a.threads;
    o.max_batch = a.batch;
    o.kv_bytes = (size_t)1 << 30;
    struct engine *e = NULL;
    int rc = engine_create(&e, a.model, &o, &err);
    char dirs[MAX_ADAPTERS][sizeof tmp + 8];
    for (int i = 0; !rc && i < a.n_adapters; i++) {
        snprintf(dirs[i], sizeof dirs[i], "%s/%s", tmp, lora_names[i]);
        struct mk_lora_opts lo;
        mk_lora_opts_init(&lo);
        lo.base_dir = a.model;
        lo.out_dir = dirs[i];
        lo.rank = a.rank;
        lo.seed = (uint64_t)i;
        lo.bf16 = 1;
        rc = mk_lora_write(&lo, &err);
        if (!rc)
            rc = engine_lora_add(e, lora_names[i], dirs[i], &err);
    }
    double *rates = calloc((size_t)N_MODES * (size_t)a.reps, sizeof *rates);
    double warm;
    for (int m = 0; !rc && m < N_MODES; m++) /* warm-up: pages, caches, the pool */
        rc = one_run(e, &a, (enum mode)m, 1000 + m, &warm, &err);
    for (int r = 0; !rc && r < a.reps; r++)
        for (int m = 0; !rc && m < N_MODES; m++)
            rc = one_run(e, &a, (enum mode)m, r * N_MODES + m, &rates[m * a.reps + r], &err);
    if (rc) {
        fprintf(stderr, "bench_lora: %s\n", err.msg);
    } else {
        double med[N_MODES];
        for (int m = 0; m < N_MODES; m++) {
            med[m] = bench_median(rates + m * a.reps, a.reps);
            printf("{\"mode\": \"%s\", \"tokens_per_s\": %.1f, \"rank\": %d, \"adapters\": %d, "
                   "\"batch\": %d, \"gen\": %d, \"prompt\": %d, \"reps\": %d, \"threads\": %d}\n",
                   mode_name[m], med[m], a.rank, a.n_adapters,
                   m >= M_PRE_BASE ? 1 : a.batch, a.gen, m >= M_PRE_BASE ? a.prompt : 16, a.reps,
                   a.threads);
        }
        printf("{\"ratios\": {\"decode_lora/base\": %.3f, \"decode_mixed/base\": %.3f, "
               "\"prefill_lora/base\": %.3f}}\n",
               med[M_LORA] / med[M_BASE], med[M_MIXED] / med[M_BASE], med[M_PRE_LORA] / med[M_PRE_BASE]);
    }
    free(rates);
    engine_free(e);
    for (int i = 0; i < a.n_adapters; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/adapter_config.json", dirs[i]);
        remove(p);
        snprintf(p, sizeof p, "%s/adapter_model.safetensors", dirs[i]);
        remove(p);
        remove(dirs[i]);
    }
    remove(tmp);
    return rc ? 1 : 0;
}
