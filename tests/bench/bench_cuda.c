/* tests/bench/bench_cuda.c - CUDA backend throughput on a Qwen3-14B-shaped
 * model with random weights generated on the device
 * (cuda_backend_load_random: speed does not depend on weight values, and
 * it spares writing and reading a 28 GB checkpoint).
 *
 * Measures, per dtype (bf16, fp8):
 *   - the ceilings: device copy bandwidth, cuBLASLt GEMM rate at a prefill
 *     shape;
 *   - single-stream decode tokens/s at a 512-token context (greedy on the
 *     device, CUDA graphs), against bandwidth / weight bytes per token;
 *   - prefill tokens/s for one 2048-token prompt, against
 *     GEMM rate / (2 x matrix parameters);
 *   - aggregate decode tokens/s at 8, 64, 256 sequences (prompt 512,
 *     output 256), prefill excluded and included.
 * Prints one JSON line per figure and a table at the end. Without a GPU it
 * says so and exits 0. Only built with `make CUDA=1`. */
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
    double dec1, dec1_ceiling, dec1_host;
    double prefill, prefill_ceiling;
    double agg[3], agg_e2e[3];
};

/* The sequences' block tables: sequence s owns blocks [s*per, (s+1)*per). */
static int32_t *tables;
static int per_seq_blocks;

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
                struct be_seq sq = {at, c, tables + (size_t)(first + s0) * per_seq_blocks, c - 1};
                struct be_batch b = {1, &sq, c, scratch_ids, 1, NULL};
                RUN(be->ops->forward(be->ctx, &b, &err));
            }
            continue;
        }
        for (int i = 0; i < n; i++)
            seqs[i] = (struct be_seq){0, len, tables + (size_t)(first + s0 + i) * per_seq_blocks, len - 1};
        struct be_batch b = {n, seqs, n * len, scratch_ids, n, NULL};
        RUN(be->ops->forward(be->ctx, &b, &err));
    }
    free(seqs);
}

/* steps decode steps for n_seqs sequences at context ctx0; returns seconds. */
static double decode(struct backend *be, int n_seqs, int ctx0, int steps, float *host_logits)
{
    struct be_seq *seqs = calloc((size_t)n_seqs, sizeof *seqs);
    int32_t *tok = calloc((size_t)n_seqs, sizeof *tok);
    double t0 = rl_mono_s();
    for (int st = 0; st < steps; st++) {
        for (int s = 0; s < n_seqs; s++)
            seqs[s] = (struct be_seq){ctx0 + st, 1, tables + (size_t)s * per_seq_blocks, 0};
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

static void run_dtype(enum model_dtype dt, const char *name, int quick, struct figures *f)
{
    struct model_config cfg = qwen3_14b();
    struct backend *be;
    struct be_options o = {0};
    int max_tokens = 4096;
    RUN(be_create(&be, "cuda", &o, &err));
    double t0 = rl_mono_s();
    RUN(cuda_backend_load_random(be, &cfg, dt, max_tokens, 7, &err));
    int max_seqs = quick ? 64 : 256, ctx = 512 + 256 + 16;
    per_seq_blocks = (ctx + BS - 1) / BS;
    int n_blocks = max_seqs * per_seq_blocks;
    if (n_blocks < (2048 + 64) / BS * 2)
        n_blocks = (2048 + 64) / BS * 2;
    RUN(be->ops->kv_init(be->ctx, n_blocks, BS, &err));
    tables = malloc((size_t)n_blocks * sizeof *tables);
    for (int i = 0; i < n_blocks; i++)
        tables[i] = i;
    fprintf(stderr, "# %s: random weights on the device in %.1f s; %s\n", name, rl_mono_s() - t0, be->ops->describe(be->ctx));
    int32_t *ids = calloc((size_t)max_tokens, sizeof *ids);
    for (int i = 0; i < max_tokens; i++)
        ids[i] = (i * 7919) % cfg.vocab;

    double wbytes = matrix_params(&cfg, 0) * (dt == MODEL_BF16 ? 2.0 : 1.0) + (double)cfg.vocab * cfg.hidden * 2.0;
    RUN(cuda_measure_gemm(0, dt, 2048, 2 * cfg.intermediate, cfg.hidden, &f->gemm, &err));
    printf("{\"bench\":\"gemm_ceiling\",\"dtype\":\"%s\",\"M\":2048,\"N\":%d,\"K\":%d,\"tflops\":%.1f}\n", name,
           2 * cfg.intermediate, cfg.hidden, f->gemm / 1e12);

    /* single stream */
    RUN(cuda_backend_set_device_argmax(be, 1));
    prefill(be, 1, 0, 512, max_tokens, ids);
    decode(be, 1, 512, 8, NULL); /* warm-up: graph capture */
    prefill(be, 1, 0, 512, max_tokens, ids);
    int steps = quick ? 64 : 128;
    double dt1 = decode(be, 1, 512, steps, NULL);
    f->dec1 = steps / dt1;
    f->dec1_ceiling = f->bw / wbytes;
    printf("{\"bench\":\"decode_single\",\"dtype\":\"%s\",\"ctx\":512,\"tok_s\":%.1f,\"ceiling_tok_s\":%.1f,"
           "\"fraction\":%.3f,\"weight_bytes_per_token\":%.0f}\n",
           name, f->dec1, f->dec1_ceiling, f->dec1 / f->dec1_ceiling, wbytes);
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
    printf("{\"bench\":\"prefill\",\"dtype\":\"%s\",\"prompt\":2048,\"tok_s\":%.0f,\"ceiling_tok_s\":%.0f,"
           "\"fraction\":%.3f}\n",
           name, f->prefill, f->prefill_ceiling, f->prefill / f->prefill_ceiling);

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
               "\"decode_tok_s\":%.0f,\"with_prefill_tok_s\":%.0f,\"prefill_s\":%.2f}\n",
               name, B, out, f->agg[i], f->agg_e2e[i], pre);
    }
    cuda_host_free(hl);
    free(ids);
    free(tables);
    be_free(be);
}

int main(int argc, char **argv)
{
    char why[256] = "";
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
    printf("%-34s %12.1f %12.1f\n", "decode 1 seq tok/s (host logits)", fb.dec1_host, ff.dec1_host);
    printf("%-34s %12.0f %12.0f\n", "prefill 2048 tok/s", fb.prefill, ff.prefill);
    printf("%-34s %11.0f%% %11.0f%%\n", "  of GEMM ceiling (target 60%)", 100 * fb.prefill / (fb.prefill_ceiling + 1e-9),
           100 * ff.prefill / (ff.prefill_ceiling + 1e-9));
    const char *lab[3] = {"decode 8 seqs tok/s", "decode 64 seqs tok/s (target 5000)", "decode 256 seqs tok/s"};
    for (int i = 0; i < 3; i++)
        printf("%-34s %12.0f %12.0f   (incl. prefill: %.0f / %.0f)\n", lab[i], fb.agg[i], ff.agg[i], fb.agg_e2e[i],
               ff.agg_e2e[i]);
    return 0;
}
#endif
