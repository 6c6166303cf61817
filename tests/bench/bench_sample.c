/* tests/bench/bench_sample.c - the engine's host work per step for the
 * sampled rows (issue 25 point 4): full rows against reduced candidate sets.
 *
 *   build/tests/bench_sample [-m MODEL_DIR] [--threads N] [--reps R]
 *
 * Logits: with -m, one forward step of the CPU backend over 64 one-token
 * sequences of that model (run.sh gives the Qwen3-0.6B shape: a 151,936
 * vocabulary); without, synthetic peaked rows of 151,936. Then, for batch
 * 1, 16 and 64 and three settings (greedy; Qwen3's recommended T 0.6,
 * top_p 0.95, top_k 20; min_p 0.05):
 *   full     what the engine does with a backend that hands back whole rows:
 *            the rows copied into the engine's buffer (the host side of the
 *            device-to-host copy; a pageable cudaMemcpy stages through the
 *            CPU just so) and sample_next() on each;
 *   reduced  what it does with the CUDA backend's 64-entry sets: the sets
 *            copied (520 bytes a row) and sample_next_reduced() on each, the
 *            full row only where the set cannot prove the answer (counted).
 * The sets themselves are built before the clock starts - on the GPU they
 * are the device's work, inside the step. Rounds alternate full and
 * reduced so both see the same machine load; the median of --reps rounds
 * is reported. One JSON line per (batch, setting) on stdout. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "model.h"
#include "sample.h"

#define VOCAB_SYNTH 151936
#define MAXB 64

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* 64 rows from the CPU backend: one decode step of 64 fresh sequences. */
static int model_logits(const char *dir, int threads, float **out, int *vocab)
{
    struct rl_err err = {0};
    struct model *m = NULL;
    struct backend *be = NULL;
    int rc = model_load(&m, dir, &err);
    if (rc)
        goto done;
    const struct model_config *cfg = model_get_config(m);
    struct be_options o = {.n_threads = threads, .mmap_weights = 1};
    if ((rc = be_create(&be, "cpu", &o, &err)) ||
        (rc = be->ops->load(be->ctx, cfg, model_get_weights(m), MAXB, &err)) ||
        (rc = be->ops->kv_init(be->ctx, MAXB, 16, &err)))
        goto done;
    struct be_seq seqs[MAXB];
    int32_t tokens[MAXB], tables[MAXB];
    for (int i = 0; i < MAXB; i++) {
        tables[i] = i;
        tokens[i] = (int32_t)((i * 7919 + 13) % cfg->vocab);
        seqs[i] = (struct be_seq){.n_past = 0, .n_new = 1, .block_table = &tables[i], .logits_from = 0};
    }
    *vocab = cfg->vocab;
    *out = malloc((size_t)MAXB * (size_t)cfg->vocab * sizeof **out);
    if (!*out) {
        rc = rl_errf(&err, RL_ENOMEM, "out of memory");
        goto done;
    }
    struct be_batch b = {MAXB, seqs, MAXB, tokens, MAXB, *out};
    rc = be->ops->forward(be->ctx, &b, &err);
done:
    if (rc)
        fprintf(stderr, "bench_sample: %s: %s\n", dir, err.msg);
    be_free(be);
    model_free(m);
    return rc;
}

static void synth_logits(float *l, int rows, int v)
{
    uint32_t x = 12345;
    for (int r = 0; r < rows; r++) {
        float *row = l + (size_t)r * (size_t)v;
        for (int i = 0; i < v; i++) {
            x = x * 1664525u + 1013904223u;
            row[i] = -4 + 8 * (float)(x >> 8) / (float)(1u << 24);
        }
        for (int j = 0; j < 20; j++) {
            x = x * 1664525u + 1013904223u;
            row[(x >> 8) % (uint32_t)v] = 10 + (float)j / 4;
        }
    }
}

struct setting {
    const char *name;
    struct sample_params p;
};

int main(int argc, char **argv)
{
    const char *dir = NULL;
    int threads = 2, reps = 7;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [-m MODEL_DIR] [--threads N] [--reps R]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 101)
        reps = 7;
    float *logits = NULL;
    int V = VOCAB_SYNTH;
    if (dir) {
        if (model_logits(dir, threads, &logits, &V))
            return 1;
    } else {
        logits = malloc((size_t)MAXB * (size_t)V * sizeof *logits);
        if (!logits)
            return 1;
        synth_logits(logits, MAXB, V);
    }
    float *rows = malloc((size_t)MAXB * (size_t)V * sizeof *rows); /* the engine's buffer */
    struct sample_cands *dev = malloc(sizeof *dev * MAXB), *host = malloc(sizeof *host * MAXB);
    if (!rows || !dev || !host)
        return 1;
    for (int r = 0; r < MAXB; r++) /* the device's part: not timed */
        sample_cands_from_row(logits + (size_t)r * (size_t)V, V, &dev[r]);

    struct setting settings[3];
    for (int i = 0; i < 3; i++)
        sample_params_default(&settings[i].p);
    settings[0].name = "greedy";
    settings[0].p.temperature = 0;
    settings[1].name = "T0.6 top_p0.95 top_k20";
    settings[1].p.temperature = 0.6f;
    settings[1].p.top_p = 0.95f;
    settings[1].p.top_k = 20;
    settings[2].name = "min_p0.05";
    settings[2].p.min_p = 0.05f;

    fprintf(stderr, "# host work per step, %s logits, vocab %d (median of %d rounds)\n",
            dir ? "CPU backend" : "synthetic", V, reps);
    fprintf(stderr, "%-5s %-24s %10s %10s %8s %9s\n", "batch", "setting", "full ms", "reduced ms", "ratio",
            "fallback");
    const int batches[3] = {1, 16, 64};
    struct rl_err err = {0};
    for (int bi = 0; bi < 3; bi++) {
        int B = batches[bi];
        for (int si = 0; si < 3; si++) {
            const struct sample_params *p = &settings[si].p;
            struct sample_state *sf[MAXB], *sr[MAXB];
            for (int r = 0; r < B; r++)
                if (sample_state_create(&sf[r], (uint64_t)r + 1, NULL, 0, &err) ||
                    sample_state_create(&sr[r], (uint64_t)r + 1, NULL, 0, &err))
                    return 1;
            double tf[101], tr[101];
            int fallback = 0, mismatch = 0;
            for (int k = 0; k < reps; k++) {
                int32_t tok_f[MAXB], tok_r[MAXB];
                double t0 = now_ms();
                memcpy(rows, logits, (size_t)B * (size_t)V * sizeof *rows);
                for (int r = 0; r < B; r++) {
                    struct sample_out o;
                    if (sample_next(sf[r], p, rows + (size_t)r * (size_t)V, V, &o, &err))
                        return fprintf(stderr, "%s\n", err.msg), 1;
                    tok_f[r] = o.token;
                }
                double t1 = now_ms();
                memcpy(host, dev, (size_t)B * sizeof *host);
                for (int r = 0; r < B; r++) {
                    struct sample_out o;
                    int rc = sample_next_reduced(sr[r], p, &host[r], V, NULL, &o, &err);
                    if (rc == 1) { /* the row the backend would then send */
                        fallback++;
                        memcpy(rows + (size_t)r * (size_t)V, logits + (size_t)r * (size_t)V, (size_t)V * sizeof *rows);
                        rc = sample_next(sr[r], p, rows + (size_t)r * (size_t)V, V, &o, &err);
                    }
                    if (rc)
                        return fprintf(stderr, "%s\n", err.msg), 1;
                    tok_r[r] = o.token;
                }
                double t2 = now_ms();
                tf[k] = t1 - t0;
                tr[k] = t2 - t1;
                for (int r = 0; r < B; r++)
                    mismatch += tok_f[r] != tok_r[r];
            }
            for (int r = 0; r < B; r++) {
                sample_state_free(sf[r]);
                sample_state_free(sr[r]);
            }
            qsort(tf, (size_t)reps, sizeof *tf, cmp_d);
            qsort(tr, (size_t)reps, sizeof *tr, cmp_d);
            double mf = tf[reps / 2], mr = tr[reps / 2];
            fprintf(stderr, "%-5d %-24s %10.3f %10.4f %7.0fx %5d/%-3d%s\n", B, settings[si].name, mf, mr,
                    mr > 0 ? mf / mr : 0, fallback, B * reps, mismatch ? "  TOKENS DIFFER" : "");
            printf("{\"bench\":\"sample_host\",\"logits\":\"%s\",\"vocab\":%d,\"batch\":%d,\"setting\":\"%s\","
                   "\"full_ms\":%.4f,\"reduced_ms\":%.4f,\"fallback_rows\":%d,\"rows\":%d,\"tokens_equal\":%s}\n",
                   dir ? "cpu" : "synthetic", V, B, settings[si].name, mf, mr, fallback, B * reps,
                   mismatch ? "false" : "true");
            if (mismatch)
                return 1;
        }
    }
    free(logits);
    free(rows);
    free(dev);
    free(host);
    return 0;
}
