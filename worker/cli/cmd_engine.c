/* worker/cli/cmd_engine.c - `redlm logits`, `redlm run`, `redlm bench-engine`:
 * the model on a backend, driven directly (one sequence, or B identical-
 * length sequences for the benchmark), without the batching engine. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "cli_util.h"
#include "cmds.h"
#include "cpu/kernels.h"
#include "cpu/machine.h"
#include "cpu/pool.h"

static void eng_usage(const char *cmd)
{
    fprintf(stderr,
            "usage: redlm %s -m DIR [options]\n"
            "  -m, --model DIR     Qwen3 checkpoint directory, or a Hugging Face repo id\n"
            "                      ORG/NAME[@REV] found in the Hugging Face cache (offline)\n"
            "  --tokens 1,2,3      prompt token ids (logits, run)\n"
            "  --all               logits: every position, not just the last\n"
            "  -n N                run: tokens to generate (default 32)\n"
            "  --temperature T     run: only 0 (greedy) here; sampling is the engine's\n"
            "  --ignore-eos        run: do not stop at the end-of-sequence token\n"
            "  --prompt P --gen G --batch B   bench-engine shape (512, 64, 1)\n"
            "  --threads N         CPU threads (default: all cores)\n"
            "  --isa auto|avx512bf16|avx2|scalar   CPU kernel path\n"
            "  --kv auto|f32|bf16  KV cache dtype\n"
            "  --quantize q8_0     CPU: a BF16/F16/F32 checkpoint's matrices in Q8_0 (at load)\n"
            "  --backend cpu|cuda\n"
            "  --speculative ngram run, bench-engine: through the batching engine with\n"
            "                      speculative decoding (redlm run --speculative --help)\n"
            "  --json-schema FILE  bench-engine: free vs schema-constrained decoding\n",
            cmd);
}

static int eng_parse(int argc, char **argv, struct cli_engine_args *a, struct rl_err *err)
{
    struct cli_opt opts[CLI_ENGINE_N_OPTS + 3];
    int n = cli_engine_opts(opts, a);
    a->prompt = 512, a->gen = 64;
    opts[n++] = (struct cli_opt){"--kv", NULL, CLI_OPT_STR, &a->mo.kv, 0, 0};
    opts[n++] = (struct cli_opt){"--all", NULL, CLI_OPT_FLAG, &a->all, 0, 0};
    opts[n] = (struct cli_opt){NULL, NULL, 0, NULL, 0, 0};
    int rc = cli_parse_opts(argc, argv, opts, err);
    if (rc)
        return rc;
    if (!a->mo.dir)
        return rl_errf(err, RL_EINVAL, "-m DIR is required");
    return 0;
}

static int argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) /* ties keep the lower id */
            best = i;
    return best;
}

/* Values of a logits row that are NaN or infinite: a broken checkpoint
 * (or forward pass) whose argmax would be token 0 without a word. */
static int n_not_finite(const float *v, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += !isfinite(v[i]);
    return k;
}

static void table_identity(int32_t *t, int n, int first)
{
    for (int i = 0; i < n; i++)
        t[i] = first + i;
}

/* Shared by logits and run: parses, loads, hands back the prompt. `run`
 * also reserves KV room for the -n tokens it will generate. */
static int eng_open(int argc, char **argv, const char *cmd, struct cli_engine_args *a,
                    struct cli_model *cm, int32_t **ids, int *n_ids)
{
    struct rl_err err = {0};
    int is_run = !strcmp(cmd, "run");
    int rc = eng_parse(argc, argv, a, &err);
    if (rc > 0) {
        eng_usage(cmd);
        return 1;
    }
    if (!rc && is_run && a->temperature != 0)
        rc = rl_errf(&err, RL_EINVAL, "only --temperature 0 (greedy) is available without the "
                                      "batching engine; use --batch FILE.jsonl for sampling");
    int extra_tokens = is_run ? a->n_gen : 0;
    if (!rc && !a->tokens)
        rc = rl_errf(&err, RL_EINVAL, "--tokens is required");
    if (!rc)
        rc = cli_parse_ids(a->tokens, ids, n_ids, &err);
    if (!rc) {
        int ctx = *n_ids + extra_tokens;
        a->mo.max_tokens = *n_ids;
        a->mo.block_size = 16;
        a->mo.n_blocks = (ctx + 15) / 16;
        rc = cli_model_open(cm, &a->mo, &err);
    }
    if (rc) {
        fprintf(stderr, "redlm %s: %s\n", cmd, err.msg);
        free(*ids);
        *ids = NULL;
        return 1;
    }
    return 0;
}

int cmd_logits(int argc, char **argv)
{
    struct cli_engine_args a;
    struct cli_model cm;
    int32_t *ids = NULL;
    int n = 0;
    if (eng_open(argc, argv, "logits", &a, &cm, &ids, &n))
        return 1;
    const struct model_config *cfg = model_get_config(cm.model);
    int rows = a.all ? n : 1;
    float *logits = malloc((size_t)rows * (size_t)cfg->vocab * sizeof(float));
    int32_t *table = malloc((size_t)cm.n_blocks * sizeof(int32_t));
    struct rl_err err = {0};
    int rc = !logits || !table ? rl_errf(&err, RL_ENOMEM, "out of memory") : 0;
    if (!rc) {
        table_identity(table, cm.n_blocks, 0);
        struct be_seq s = {0, n, table, a.all ? 0 : n - 1, 0};
        struct be_batch b = {1, &s, n, ids, rows, logits};
        rc = cm.be->ops->forward(cm.be->ctx, &b, &err);
    }
    if (!rc) {
        printf("{\"logits\": [");
        for (int r = 0; r < rows; r++) {
            printf(r ? ", [" : "[");
            for (int i = 0; i < cfg->vocab; i++) {
                if (i)
                    printf(", ");
                cli_print_float(logits[(size_t)r * (size_t)cfg->vocab + (size_t)i]);
            }
            printf("]");
        }
        printf("]}\n");
    } else {
        fprintf(stderr, "redlm logits: %s\n", err.msg);
    }
    free(logits), free(table), free(ids);
    cli_model_close(&cm);
    return rc ? 1 : 0;
}

int cmd_run(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--batch")) /* run --batch FILE.jsonl: the batching engine */
            return cmd_run_batch(argc, argv);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--speculative")) /* speculation lives in the engine */
            return cmd_run_spec(argc, argv);
    struct cli_engine_args a;
    struct cli_model cm;
    int32_t *ids = NULL;
    int n = 0;
    if (eng_open(argc, argv, "run", &a, &cm, &ids, &n))
        return 1;
    struct rl_err err = {0};
    const struct model_config *cfg = model_get_config(cm.model);
    float *logits = malloc((size_t)cfg->vocab * sizeof(float));
    int32_t *table = malloc((size_t)cm.n_blocks * sizeof(int32_t));
    int32_t *out = malloc(((size_t)a.n_gen + 1) * sizeof(int32_t));
    int rc = !logits || !table || !out ? rl_errf(&err, RL_ENOMEM, "out of memory") : 0;
    int n_out = 0;
    if (!rc)
        table_identity(table, cm.n_blocks, 0);
    int past = 0;
    const int32_t *feed = ids;
    int n_feed = n;
    while (!rc && n_out < a.n_gen) {
        struct be_seq s = {past, n_feed, table, n_feed - 1, 0};
        struct be_batch b = {1, &s, n_feed, feed, 1, logits};
        if ((rc = cm.be->ops->forward(cm.be->ctx, &b, &err)))
            break;
        past += n_feed;
        int bad = n_not_finite(logits, cfg->vocab);
        if (bad) {
            rc = rl_errf(&err, RL_EINVAL, "the logits of step %d are not finite (%d of %d NaN or "
                         "infinite): the checkpoint's weights, or the forward pass, produce NaN",
                         n_out, bad, cfg->vocab);
            break;
        }
        int tok = argmax(logits, cfg->vocab);
        out[n_out++] = tok;
        if (!a.ignore_eos && tok == cfg->eos_id)
            break;
        feed = &out[n_out - 1];
        n_feed = 1;
    }
    if (!rc) {
        printf("{\"tokens\": [");
        for (int i = 0; i < n_out; i++)
            printf(i ? ", %d" : "%d", out[i]);
        printf("]}\n");
    } else {
        fprintf(stderr, "redlm run: %s\n", err.msg);
    }
    free(logits), free(table), free(out), free(ids);
    cli_model_close(&cm);
    return rc ? 1 : 0;
}

/* The CPU's read bandwidth in GB/s on a pool of its own (n_threads), or
 * -1 with err set. */
static double read_bw_cpu(int n_threads, struct rl_err *err)
{
    struct cpu_pool *pool;
    if (cpu_pool_create(&pool, n_threads, err))
        return -1;
    double bw = cpu_measure_read_bw(pool, (size_t)1 << 30);
    cpu_pool_free(pool);
    if (bw < 0)
        rl_errf(err, RL_ENOMEM, "bandwidth probe: cannot allocate its 1 GiB buffer");
    return bw;
}

/* Prefill one P-token prompt, then B sequences decode G tokens each in
 * lock step. Prints speeds next to the machine limits measured here. */
int cmd_bench_engine(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--speculative"))
            return cmd_bench_spec(argc, argv);
        if (!strcmp(argv[i], "--json-schema"))
            return cmd_bench_structured(argc, argv);
    }
    struct cli_engine_args a;
    struct rl_err err = {0};
    int rc = eng_parse(argc, argv, &a, &err);
    if (rc > 0) {
        eng_usage("bench-engine");
        return 1;
    }
    if (rc) {
        fprintf(stderr, "redlm bench-engine: %s\n", err.msg);
        return 1;
    }
    int B = a.batch, P = a.prompt, G = a.gen;
    int per_seq = (P + G + 15) / 16;
    a.mo.max_tokens = P > B ? P : B;
    a.mo.block_size = 16;
    a.mo.n_blocks = per_seq * B;
    a.mo.kv_prefault = 1; /* steady state: a server's pool is warm */

    /* Machine limits first, before the model's pages compete for cache;
     * the read bandwidth again after decode (read_bw_cpu), because a
     * shared machine's bandwidth moves within minutes, and the roofline
     * takes the higher of the two, so a slow moment of the probe cannot
     * flatter the decode figure. */
    double bw = 0, bw_after = 0, peak = 0;
    if (!strcmp(a.mo.backend, "cpu")) {
        if ((bw = read_bw_cpu(a.mo.n_threads, &err)) < 0) {
            fprintf(stderr, "redlm bench-engine: %s\n", err.msg);
            return 1;
        }
        struct cpu_pool *pool;
        if ((rc = cpu_pool_create(&pool, a.mo.n_threads, &err))) {
            fprintf(stderr, "redlm bench-engine: %s\n", err.msg);
            return 1;
        }
        int isa = a.mo.isa && strcmp(a.mo.isa, "auto") ? cpu_isa_parse(a.mo.isa) : (int)cpu_isa_detect();
        const struct cpu_kernels *k = isa >= 0 ? cpu_kernels_get((enum cpu_isa)isa) : NULL;
        peak = k ? cpu_measure_bf16_peak(pool, k) : 0;
        cpu_pool_free(pool);
    }

    struct cli_model cm;
    if ((rc = cli_model_open(&cm, &a.mo, &err))) {
        fprintf(stderr, "redlm bench-engine: %s\n", err.msg);
        return 1;
    }
    const struct model_config *cfg = model_get_config(cm.model);
    size_t V = (size_t)cfg->vocab;
    int32_t *tables = malloc((size_t)cm.n_blocks * sizeof(int32_t));
    int32_t *prompt = malloc((size_t)P * sizeof(int32_t));
    int32_t *next = malloc((size_t)B * sizeof(int32_t));
    float *logits = malloc((size_t)B * V * sizeof(float));
    struct be_seq *seqs = calloc((size_t)B, sizeof *seqs);
    if (!tables || !prompt || !next || !logits || !seqs) {
        fprintf(stderr, "redlm bench-engine: out of memory\n");
        return 1;
    }
    table_identity(tables, cm.n_blocks, 0);
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < P; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        prompt[i] = (int32_t)(r % (uint64_t)cfg->vocab);
    }
    /* where the time went, prefill and decode apart (backends that can say) */
    char prof_pre[1024] = "null", prof_dec[1024] = "null";
    /* Prefill: one warm-up prefill of sequence 0 is not counted (first
     * touch of the activation buffers, the pool's threads waking up, as
     * llama-bench's warm-up run); then every sequence's prompt is
     * prefilled in turn, and the mean rate reported. */
    {
        struct be_seq q = {0, P, tables, P - 1, 0};
        struct be_batch b = {1, &q, P, prompt, 1, logits};
        rc = cm.be->ops->forward(cm.be->ctx, &b, &err);
        if (!rc && cm.be->ops->profile)
            cm.be->ops->profile(cm.be->ctx, prof_pre, sizeof prof_pre); /* not counted either */
    }
    double t_prefill = 0;
    for (int s = 0; s < B && !rc; s++) {
        struct be_seq q = {0, P, tables + (size_t)s * (size_t)per_seq, P - 1, 0};
        struct be_batch b = {1, &q, P, prompt, 1, logits + (size_t)s * V};
        double t0 = rl_mono_s();
        rc = cm.be->ops->forward(cm.be->ctx, &b, &err);
        t_prefill += rl_mono_s() - t0;
        next[s] = argmax(logits + (size_t)s * V, cfg->vocab);
    }
    if (cm.be->ops->profile && cm.be->ops->profile(cm.be->ctx, prof_pre, sizeof prof_pre) < 0)
        strcpy(prof_pre, "null");
    double t_decode = 0;
    for (int g = 0; g < G - 1 && !rc; g++) {
        for (int s = 0; s < B; s++)
            seqs[s] = (struct be_seq){P + g, 1, tables + (size_t)s * (size_t)per_seq, 0, 0};
        struct be_batch b = {B, seqs, B, next, B, logits};
        double t0 = rl_mono_s();
        rc = cm.be->ops->forward(cm.be->ctx, &b, &err);
        t_decode += rl_mono_s() - t0;
        for (int s = 0; s < B; s++)
            next[s] = argmax(logits + (size_t)s * V, cfg->vocab);
    }
    if (cm.be->ops->profile && cm.be->ops->profile(cm.be->ctx, prof_dec, sizeof prof_dec) < 0)
        strcpy(prof_dec, "null");
    if (!rc && bw > 0 && (bw_after = read_bw_cpu(a.mo.n_threads, &err)) < 0)
        rc = 1;
    if (rc) {
        fprintf(stderr, "redlm bench-engine: %s\n", err.msg);
    } else {
        double bw_best = bw_after > bw ? bw_after : bw;
        size_t wbytes = model_weight_bytes_per_token(cm.model);
        double pre = (double)P * B / t_prefill;
        double dec = G > 1 ? (double)B * (G - 1) / t_decode : 0;
        /* prefill FLOPs per token: the layers' matrices (lm_head runs for
         * the last token only); attention's share is left out */
        double Hd = cfg->hidden, Qd = (double)cfg->n_heads * cfg->head_dim,
               KVd = (double)cfg->n_kv_heads * cfg->head_dim, Id = cfg->intermediate;
        double flops_tok = 2.0 * cfg->n_layers * (Hd * (Qd + 2 * KVd) + Qd * Hd + 3 * Hd * Id);
        printf("{\"backend\": \"%s\", \"prompt\": %d, \"gen\": %d, \"batch\": %d, "
               "\"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"roofline_decode_tok_s\": %.2f, "
               "\"mem_read_gb_s\": %.2f, \"mem_read_gb_s_before_after\": [%.2f, %.2f], "
               "\"bf16_peak_gflop_s\": %.1f, "
               "\"prefill_gflop_s\": %.1f, \"weight_bytes_per_token\": %zu, "
               "\"profile_prefill\": %s, \"profile_decode\": %s}\n",
               cm.be->ops->describe ? cm.be->ops->describe(cm.be->ctx) : a.mo.backend, P, G, B,
               pre, dec, bw_best > 0 ? bw_best * 1e9 / (double)wbytes : 0, bw_best, bw, bw_after, peak,
               pre * flops_tok / 1e9, wbytes, prof_pre, prof_dec);
    }
    free(tables), free(prompt), free(next), free(logits), free(seqs);
    cli_model_close(&cm);
    return rc ? 1 : 0;
}
