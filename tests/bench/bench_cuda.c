/* tests/bench/bench_cuda.c - CUDA backend throughput on a Qwen3-14B-shaped
 * model with random weights generated on the device
 * (cuda_backend_load_random: speed does not depend on weight values, and
 * it spares writing and reading a 28 GB checkpoint).
 *
 * Measures, per dtype (bf16, fp8):
 *   - the ceilings: device copy bandwidth, cuBLASLt GEMM rate at a prefill
 *     shape;
 *   - where an eager step's time goes, op by op (CUDA events): decode at
 *     batch 1 and 64, prefill of 512 and 2048 tokens;
 *   - single-stream decode tokens/s at 512- and 8192-token contexts (greedy
 *     on the device, CUDA graphs), against bandwidth / weight bytes per
 *     token;
 *   - prefill tokens/s for a 2048-token prompt in one pass and in the
 *     worker's 512-token chunks, against GEMM rate / (2 x matrix params);
 *   - aggregate decode tokens/s at 8, 64, 256 sequences (prompt 512,
 *     prefill excluded and included), and batch 64 at a 1024-token context
 *     the way the worker runs it: logits rows to pinned host memory and
 *     sampled there (temperature 0.7, top_p 0.9, seeded), against greedy
 *     on the device.
 * Each figure's JSON line carries "sim_tok_s", the sim backend's model
 * (engine/sim, profile h200) for the same shape: the calibration the fleet
 * benchmarks rely on. Prints one JSON line per figure and a table at the
 * end. Without a GPU it says so and exits 0. Only built with `make CUDA=1`. */
#include <stdio.h>

#ifndef REDLM_CUDA
/* The Makefile builds every tests/bench/bench_*.c; without CUDA=1 this is
 * a stub. */
int main(void)
{
    printf("bench_cuda: built without CUDA=1; nothing to measure\n");
    return 0;
}
#else
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "clock.h"
#include "cuda/cuda_backend.h"
#include "sample.h"
#include "sim/sim.h"

#define BS 16

static struct rl_err err;
#define RUN(call)                                                                                          \
    do {                                                                                                   \
        memset(&err, 0, sizeof err);                                                                       \
        if ((call)) {                                                                                      \
            fprintf(stderr, "bench_cuda: %s: %s\n", #call, err.msg);                                       \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

static struct model_config qwen3_14b(void)
{
    struct model_config c;
    memset(&c, 0, sizeof c);
    c.hidden = 5120, c.intermediate = 17408, c.n_layers = 40, c.n_heads = 40, c.n_kv_heads = 8, c.head_dim = 128;
    c.vocab = 151936, c.max_pos = 40960, c.rms_eps = 1e-6f, c.rope_theta = 1e6f, c.tied = 0;
    c.dtype = MODEL_BF16, c.bos_id = c.eos_id = -1;
    return c;
}

/* Matrix parameters (what a decode step streams, and 2x the prefill FLOPs). */
static double matrix_params(const struct model_config *c, int with_lm_head)
{
    double H = c->hidden, I = c->intermediate, Q = (double)c->n_heads * c->head_dim;
    double KV = (double)c->n_kv_heads * c->head_dim;
    double layer = H * (Q + 2 * KV) + Q * H + 3 * H * I;
    return c->n_layers * layer + (with_lm_head ? (double)c->vocab * H : 0);
}

struct figures {
    double bw, gemm;
    double dec1, dec1_ceiling, dec1_host, dec1_8k, dec1_lt;
    double prefill, prefill_ceiling, prefill_chunked;
    double agg[3], agg_e2e[3];
    double b64_1k_dev, b64_1k_host, b64_1k_pre;
};

/* The sequences' block tables: sequence s owns blocks [s*per, (s+1)*per). */
static int32_t *tables;
static int per_seq_blocks;

static struct sim_profile simp;

/* The sim model's tokens/s for the same shape (engine/sim/sim.h). */
static double sim_decode(const struct model_config *c, int n_seqs, int ctx)
{
    return sim_decode_tok_s(&simp, c, n_seqs, ctx);
}

static double sim_prefill(const struct model_config *c, int len, int chunk)
{
    return sim_prefill_tok_s(&simp, c, len, chunk);
}

/* Decode steps at batch n_seqs with the logits on the host, sampled there
 * as the engine does for non-greedy requests; returns seconds. */
static double decode_host_sampled(struct backend *be, int n_seqs, int ctx0, int steps, float *host_logits,
                                  int vocab)
{
    struct be_seq *seqs = calloc((size_t)n_seqs, sizeof *seqs);
    int32_t *tok = calloc((size_t)n_seqs, sizeof *tok);
    struct sample_state **st = calloc((size_t)n_seqs, sizeof *st);
    struct sample_params sp;
    sample_params_default(&sp);
    sp.temperature = 0.7f, sp.top_p = 0.9f;
    for (int s = 0; s < n_seqs; s++)
        RUN(sample_state_create(&st[s], 1000 + (uint64_t)s, NULL, 0, &err));
    double t0 = rl_mono_s();
    for (int k = 0; k < steps; k++) {
        for (int s = 0; s < n_seqs; s++)
            seqs[s] = (struct be_seq){ctx0 + k, 1, tables + (size_t)s * per_seq_blocks, 0, 0};
        struct be_batch b = {n_seqs, seqs, n_seqs, tok, n_seqs, host_logits};
        RUN(be->ops->forward(be->ctx, &b, &err));
        for (int s = 0; s < n_seqs; s++) {
            struct sample_out so;
            RUN(sample_next(st[s], &sp, host_logits + (size_t)s * vocab, vocab, &so, &err));
            tok[s] = so.token;
        }
    }
    double dt = rl_mono_s() - t0;
    for (int s = 0; s < n_seqs; s++)
        sample_state_free(st[s]);
    free(st), free(seqs), free(tok);
    return dt;
}


static void prefill(struct backend *be, int n_seqs, int first, int len, int max_tokens, int32_t *scratch_ids)
{
    int per_step = max_tokens / len;
    if (per_step < 1)
        per_step = 1;
    struct be_seq *seqs = calloc((size_t)per_step, sizeof *seqs);
    for (int s0 = 0; s0 < n_seqs; s0 += per_step) {
        int n = n_seqs - s0 < per_step ? n_seqs - s0 : per_step;
        if (len > max_tokens) { /* one long prompt, chunked */
            for (int at = 0; at < len; at += max_tokens) {
                int c = len - at < max_tokens ? len - at : max_tokens;
                struct be_seq sq = {at, c, tables + (size_t)(first + s0) * per_seq_blocks, c - 1, 0};
                struct be_batch b = {1, &sq, c, scratch_ids, 1, NULL};
                RUN(be->ops->forward(be->ctx, &b, &err));
            }
            continue;
        }
        for (int i = 0; i < n; i++)
            seqs[i] = (struct be_seq){0, len, tables + (size_t)(first + s0 + i) * per_seq_blocks, len - 1, 0};
        struct be_batch b = {n, seqs, n * len, scratch_ids, n, NULL};
        RUN(be->ops->forward(be->ctx, &b, &err));
    }
    free(seqs);
}

/* One prompt of len tokens in chunks of chunk, each chunk one forward
 * after the previous ones' keys, as the worker's scheduler sends it. */
static void prefill_chunks(struct backend *be, int seq, int len, int chunk, int32_t *scratch_ids)
{
    for (int at = 0; at < len; at += chunk) {
        int c = len - at < chunk ? len - at : chunk;
        struct be_seq sq = {at, c, tables + (size_t)seq * per_seq_blocks, c - 1, 0};
        struct be_batch b = {1, &sq, c, scratch_ids, 1, NULL};
        RUN(be->ops->forward(be->ctx, &b, &err));
    }
}

/* steps decode steps for n_seqs sequences at context ctx0; returns seconds. */
static double decode(struct backend *be, int n_seqs, int ctx0, int steps, float *host_logits)
{
    struct be_seq *seqs = calloc((size_t)n_seqs, sizeof *seqs);
    int32_t *tok = calloc((size_t)n_seqs, sizeof *tok);
    double t0 = rl_mono_s();
    for (int st = 0; st < steps; st++) {
        for (int s = 0; s < n_seqs; s++)
            seqs[s] = (struct be_seq){ctx0 + st, 1, tables + (size_t)s * per_seq_blocks, 0, 0};
        struct be_batch b = {n_seqs, seqs, n_seqs, tok, n_seqs, host_logits};
        RUN(be->ops->forward(be->ctx, &b, &err));
        const int32_t *ids = cuda_backend_sampled(be);
        for (int s = 0; s < n_seqs; s++)
            tok[s] = ids ? ids[s] : 0;
    }
    double dt = rl_mono_s() - t0;
    free(seqs), free(tok);
    return dt;
}

/* Where an eager step's time goes (graphs off, CUDA events between ops):
 * one JSON line per shape with milliseconds per step for each op kind. */
static void profile(struct backend *be, const char *name, const char *shape, int n_seqs, int ctx0, int prompt,
                    int max_tokens, int32_t *ids)
{
    double ms[16];
    const char *names[16];
    RUN(cuda_backend_set_graphs(be, 0));
    RUN(cuda_backend_set_profile(be, 1, &err));
    int steps = 4;
    if (prompt) {
        prefill(be, 1, 0, prompt, max_tokens, ids); /* warm-up (plans) */
        cuda_backend_profile(be, ms, names, 1);
        for (int i = 0; i < steps; i++)
            prefill(be, 1, 0, prompt, max_tokens, ids);
    } else {
        prefill(be, n_seqs, 0, ctx0, max_tokens, ids);
        decode(be, n_seqs, ctx0, 2, NULL);
        cuda_backend_profile(be, ms, names, 1);
        decode(be, n_seqs, ctx0 + 2, steps, NULL);
    }
    int n = cuda_backend_profile(be, ms, names, 1);
    double total = 0;
    printf("{\"bench\":\"profile\",\"dtype\":\"%s\",\"shape\":\"%s\",\"ms_per_step\":{", name, shape);
    for (int k = 0; k < n; k++) {
        printf("%s\"%s\":%.3f", k ? "," : "", names[k], ms[k] / steps);
        total += ms[k] / steps;
    }
    printf("},\"total_ms\":%.3f}\n", total);
    fflush(stdout);
    RUN(cuda_backend_set_profile(be, 0, &err));
    RUN(cuda_backend_set_graphs(be, 1));
}

static void run_dtype(enum model_dtype dt, const char *name, int quick, struct figures *f)
{
    struct model_config cfg = qwen3_14b();
    struct backend *be;
    struct be_options o = {0};
    int max_tokens = 4096;
    RUN(be_create(&be, "cuda", &o, &err));
    double t0 = rl_mono_s();
    RUN(cuda_backend_load_random(be, &cfg, dt, max_tokens, 7, &err));
    int max_seqs = quick ? 64 : 256, ctx = 1024 + 256 + 16;
    per_seq_blocks = (ctx + BS - 1) / BS;
    int n_blocks = max_seqs * per_seq_blocks;
    int long_ctx = 8192 + 256 + 16; /* sequence 0 alone, for the 8k figure */
    if (n_blocks < (long_ctx + BS - 1) / BS * 2)
        n_blocks = (long_ctx + BS - 1) / BS * 2;
    RUN(be->ops->kv_init(be->ctx, n_blocks, BS, &err));
    tables = malloc((size_t)n_blocks * sizeof *tables);
    for (int i = 0; i < n_blocks; i++)
        tables[i] = i;
    fprintf(stderr, "# %s: random weights on the device in %.1f s; %s\n", name, rl_mono_s() - t0, be->ops->describe(be->ctx));
    {
        /* which kernel each decode product runs, as measured at load */
        static char rep[8192];
        if (cuda_backend_gemm_report(be, rep, sizeof rep) >= 0)
            printf("{\"bench\":\"decode_products\",\"dtype\":\"%s\",\"shapes\":%s}\n", name, rep);
    }
    int32_t *ids = calloc((size_t)max_tokens, sizeof *ids);
    for (int i = 0; i < max_tokens; i++)
        ids[i] = (i * 7919) % cfg.vocab;

    double wbytes = matrix_params(&cfg, 0) * (dt == MODEL_BF16 ? 2.0 : 1.0) + (double)cfg.vocab * cfg.hidden * 2.0;
    RUN(cuda_measure_gemm(0, dt, 2048, 2 * cfg.intermediate, cfg.hidden, &f->gemm, &err));
    printf("{\"bench\":\"gemm_ceiling\",\"dtype\":\"%s\",\"M\":2048,\"N\":%d,\"K\":%d,\"tflops\":%.1f}\n", name,
           2 * cfg.intermediate, cfg.hidden, f->gemm / 1e12);

    RUN(cuda_backend_set_device_argmax(be, 1));
    profile(be, name, "decode_b1_ctx512", 1, 512, 0, max_tokens, ids);
    if (max_seqs >= 64)
        profile(be, name, "decode_b64_ctx512", 64, 512, 0, max_tokens, ids);
    profile(be, name, "prefill_512", 1, 0, 512, max_tokens, ids);
    profile(be, name, "prefill_2048", 1, 0, 2048, max_tokens, ids);

    /* single stream */
    prefill(be, 1, 0, 512, max_tokens, ids);
    decode(be, 1, 512, 8, NULL); /* warm-up: graph capture */
    prefill(be, 1, 0, 512, max_tokens, ids);
    int steps = quick ? 64 : 128;
    double dt1 = decode(be, 1, 512, steps, NULL);
    f->dec1 = steps / dt1;
    f->dec1_ceiling = f->bw / wbytes;
    printf("{\"bench\":\"decode_single\",\"dtype\":\"%s\",\"ctx\":512,\"tok_s\":%.1f,\"ceiling_tok_s\":%.1f,"
           "\"fraction\":%.3f,\"weight_bytes_per_token\":%.0f,\"sim_tok_s\":%.1f}\n",
           name, f->dec1, f->dec1_ceiling, f->dec1 / f->dec1_ceiling, wbytes, sim_decode(&cfg, 1, 512 + steps / 2));
    {
        /* the same with every product on cuBLASLt: what the load-time
         * choice of decode kernels is worth */
        RUN(cuda_backend_set_gemm_path(be, 1));
        prefill(be, 1, 0, 512, max_tokens, ids);
        decode(be, 1, 512, 8, NULL);
        prefill(be, 1, 0, 512, max_tokens, ids);
        f->dec1_lt = steps / decode(be, 1, 512, steps, NULL);
        RUN(cuda_backend_set_gemm_path(be, 0));
        printf("{\"bench\":\"decode_single\",\"dtype\":\"%s\",\"ctx\":512,\"products\":\"cublaslt\",\"tok_s\":%.1f,"
               "\"auto_over_cublaslt\":%.3f}\n",
               name, f->dec1_lt, f->dec1 / f->dec1_lt);
    }
    {
        int keep = per_seq_blocks;
        per_seq_blocks = (long_ctx + BS - 1) / BS; /* sequence 0 owns the first blocks */
        prefill_chunks(be, 0, 8192, 2048, ids);
        decode(be, 1, 8192, 4, NULL);
        f->dec1_8k = steps / decode(be, 1, 8192 + 4, steps, NULL);
        per_seq_blocks = keep;
        printf("{\"bench\":\"decode_single\",\"dtype\":\"%s\",\"ctx\":8192,\"tok_s\":%.1f,\"sim_tok_s\":%.1f}\n",
               name, f->dec1_8k, sim_decode(&cfg, 1, 8192 + steps / 2));
    }
    RUN(cuda_backend_set_device_argmax(be, 0));
    float *hl = cuda_host_alloc((size_t)256 * cfg.vocab * 4);
    prefill(be, 1, 0, 512, max_tokens, ids);
    decode(be, 1, 512, 4, hl);
    prefill(be, 1, 0, 512, max_tokens, ids);
    f->dec1_host = steps / decode(be, 1, 512, steps, hl);
    printf("{\"bench\":\"decode_single_host_logits\",\"dtype\":\"%s\",\"tok_s\":%.1f}\n", name, f->dec1_host);
    RUN(cuda_backend_set_device_argmax(be, 1));

    /* prefill 2048 */
    prefill(be, 1, 0, 2048, max_tokens, ids); /* warm-up */
    t0 = rl_mono_s();
    int reps = 3;
    for (int r = 0; r < reps; r++)
        prefill(be, 1, 0, 2048, max_tokens, ids);
    f->prefill = reps * 2048 / (rl_mono_s() - t0);
    f->prefill_ceiling = f->gemm / (2.0 * matrix_params(&cfg, 0));
    printf("{\"bench\":\"prefill\",\"dtype\":\"%s\",\"prompt\":2048,\"chunk\":2048,\"tok_s\":%.0f,\"ceiling_tok_s\":%.0f,"
           "\"fraction\":%.3f,\"sim_tok_s\":%.0f}\n",
           name, f->prefill, f->prefill_ceiling, f->prefill / f->prefill_ceiling, sim_prefill(&cfg, 2048, 2048));
    t0 = rl_mono_s();
    for (int r = 0; r < reps; r++)
        prefill_chunks(be, 0, 2048, 512, ids);
    f->prefill_chunked = reps * 2048 / (rl_mono_s() - t0);
    printf("{\"bench\":\"prefill\",\"dtype\":\"%s\",\"prompt\":2048,\"chunk\":512,\"tok_s\":%.0f,\"ceiling_tok_s\":%.0f,"
           "\"fraction\":%.3f,\"sim_tok_s\":%.0f}\n",
           name, f->prefill_chunked, f->prefill_ceiling, f->prefill_chunked / f->prefill_ceiling,
           sim_prefill(&cfg, 2048, 512));

    /* aggregate decode */
    int Bs[3] = {8, 64, 256};
    for (int i = 0; i < 3; i++) {
        int B = Bs[i];
        if (B > max_seqs) {
            f->agg[i] = f->agg_e2e[i] = 0;
            continue;
        }
        decode(be, B, 0, 2, NULL); /* graph capture for this bucket */
        double tp = rl_mono_s();
        prefill(be, B, 0, 512, max_tokens, ids);
        double pre = rl_mono_s() - tp;
        int out = quick ? 64 : 256;
        double dd = decode(be, B, 512, out, NULL);
        f->agg[i] = (double)B * out / dd;
        f->agg_e2e[i] = (double)B * out / (dd + pre);
        printf("{\"bench\":\"decode_batch\",\"dtype\":\"%s\",\"seqs\":%d,\"prompt\":512,\"output\":%d,"
               "\"decode_tok_s\":%.0f,\"with_prefill_tok_s\":%.0f,\"prefill_s\":%.2f,\"sim_tok_s\":%.0f}\n",
               name, B, out, f->agg[i], f->agg_e2e[i], pre, sim_decode(&cfg, B, 512 + out / 2));
    }

    /* batch 64 at a 1024-token context: greedy on the device, and the
     * worker's path for sampled requests (rows to the host, sampled there) */
    if (max_seqs >= 64) {
        int out = quick ? 32 : 64;
        prefill(be, 64, 0, 1024, max_tokens, ids);
        f->b64_1k_dev = 64.0 * out / decode(be, 64, 1024, out, NULL);
        RUN(cuda_backend_set_device_argmax(be, 0));
        decode_host_sampled(be, 64, 1024 + out, 2, hl, cfg.vocab); /* graph capture */
        f->b64_1k_host = 64.0 * out / decode_host_sampled(be, 64, 1024 + out + 2, out, hl, cfg.vocab);
        RUN(cuda_backend_set_device_argmax(be, 1));
        printf("{\"bench\":\"decode_batch\",\"dtype\":\"%s\",\"seqs\":64,\"ctx\":1024,\"output\":%d,"
               "\"device_greedy_tok_s\":%.0f,\"host_sampled_tok_s\":%.0f,\"sim_tok_s\":%.0f}\n",
               name, out, f->b64_1k_dev, f->b64_1k_host, sim_decode(&cfg, 64, 1024 + out));
        /* the decode attention's preloading variant, same batch: the
         * attention is a third of this step (issue 25) */
        RUN(cuda_backend_set_attn_variant(be, 1));
        decode(be, 64, 1024 + out, 2, NULL); /* graph capture */
        f->b64_1k_pre = 64.0 * out / decode(be, 64, 1024 + out + 2, out, NULL);
        RUN(cuda_backend_set_attn_variant(be, 0));
        printf("{\"bench\":\"decode_batch\",\"dtype\":\"%s\",\"seqs\":64,\"ctx\":1024,\"output\":%d,"
               "\"attn_variant\":\"preload\",\"device_greedy_tok_s\":%.0f,\"over_plain\":%.3f}\n",
               name, out, f->b64_1k_pre, f->b64_1k_pre / f->b64_1k_dev);
    }
    cuda_host_free(hl);
    free(ids);
    free(tables);
    be_free(be);
}

int main(int argc, char **argv)
{
    char why[256] = "";
    setvbuf(stdout, NULL, _IOLBF, 0); /* a run killed at its time limit keeps its lines */
    if (cuda_device_count(why, sizeof why) < 1) {
        printf("bench_cuda: skipped, no CUDA device: %s\n", why);
        return 0;
    }
    int quick = 0, want_bf16 = 1, want_fp8 = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            want_bf16 = !strcmp(d, "bf16") || !strcmp(d, "both");
            want_fp8 = !strcmp(d, "fp8") || !strcmp(d, "both");
        } else {
            fprintf(stderr, "usage: bench_cuda [--quick] [--dtype bf16|fp8|both]\n");
            return 2;
        }
    }
    char name[128];
    size_t mem;
    int sms;
    RUN(cuda_device_info(0, name, sizeof name, &mem, &sms, &err));
    double bw;
    RUN(cuda_measure_bandwidth(0, &bw, &err));
    printf("{\"bench\":\"device\",\"name\":\"%s\",\"mem_gib\":%.1f,\"sms\":%d,\"copy_bw_gb_s\":%.0f}\n", name,
           (double)mem / (1 << 30), sms, bw / 1e9);
    RUN(sim_profile_get("h200", &simp, &err));
    struct figures fb = {0}, ff = {0};
    fb.bw = ff.bw = bw;
    if (want_bf16)
        run_dtype(MODEL_BF16, "bf16", quick, &fb);
    if (want_fp8)
        run_dtype(MODEL_F8_E4M3, "fp8", quick, &ff);
    printf("\n%s, copy bandwidth %.0f GB/s, Qwen3-14B shapes, random weights\n", name, bw / 1e9);
    printf("%-34s %12s %12s\n", "", "bf16", "fp8");
    printf("%-34s %12.1f %12.1f\n", "GEMM ceiling TFLOP/s (2048x34816x5120)", fb.gemm / 1e12, ff.gemm / 1e12);
    printf("%-34s %12.1f %12.1f\n", "decode 1 seq tok/s (device argmax)", fb.dec1, ff.dec1);
    printf("%-34s %12.1f %12.1f\n", "  bandwidth ceiling tok/s", fb.dec1_ceiling, ff.dec1_ceiling);
    printf("%-34s %11.0f%% %11.0f%%\n", "  fraction (target 85%)", 100 * fb.dec1 / (fb.dec1_ceiling + 1e-9),
           100 * ff.dec1 / (ff.dec1_ceiling + 1e-9));
    printf("%-34s %12.1f %12.1f\n", "  all products on cuBLASLt", fb.dec1_lt, ff.dec1_lt);
    printf("%-34s %12.1f %12.1f\n", "decode 1 seq tok/s (host logits)", fb.dec1_host, ff.dec1_host);
    printf("%-34s %12.1f %12.1f\n", "decode 1 seq tok/s at 8k context", fb.dec1_8k, ff.dec1_8k);
    printf("%-34s %12.0f %12.0f\n", "prefill 2048 tok/s", fb.prefill, ff.prefill);
    printf("%-34s %11.0f%% %11.0f%%\n", "  of GEMM ceiling (target 60%)", 100 * fb.prefill / (fb.prefill_ceiling + 1e-9),
           100 * ff.prefill / (ff.prefill_ceiling + 1e-9));
    printf("%-34s %12.0f %12.0f\n", "prefill 2048 in 512 chunks tok/s", fb.prefill_chunked, ff.prefill_chunked);
    printf("%-34s %12.0f %12.0f\n", "decode 64 at 1k, device greedy", fb.b64_1k_dev, ff.b64_1k_dev);
    printf("%-34s %12.0f %12.0f\n", "decode 64 at 1k, host sampled", fb.b64_1k_host, ff.b64_1k_host);
    printf("%-34s %12.0f %12.0f\n", "  attention keys preloaded", fb.b64_1k_pre, ff.b64_1k_pre);
    const char *lab[3] = {"decode 8 seqs tok/s", "decode 64 seqs tok/s (target 5000)", "decode 256 seqs tok/s"};
    for (int i = 0; i < 3; i++)
        printf("%-34s %12.0f %12.0f   (incl. prefill: %.0f / %.0f)\n", lab[i], fb.agg[i], ff.agg[i], fb.agg_e2e[i],
               ff.agg_e2e[i]);
    return 0;
}
#endif
