/* worker/cli/cmd_spec.c - speculative decoding from the command line:
 *
 *   redlm run -m DIR --tokens 1,2,3 -n N --speculative ngram [--spec-tokens K]
 *   redlm bench-engine -m DIR --speculative oracle|ngram [--spec-correct PCT]
 *                      [--prompt P --gen G --batch B --spec-tokens K --reps R --repeat]
 *
 * `run` hands over here when --speculative is given: the one greedy request
 * goes through the batching engine (speculation lives in the engine's
 * step), and the tokens printed are those plain `run` prints.
 *
 * `bench-engine` hands over here too: B requests (distinct random prompts
 * of P tokens, greedy, G tokens each) run through one engine, plain
 * (per request no_speculative) and speculating, alternately, R times
 * each after an untimed plain warm-up; the decode rate of a run is the
 * tokens generated after every request had its first token, over that
 * stretch of time (what bench_batching and llama.cpp's batched-bench call
 * S_TG). The figures are the medians and the median of the per-pair
 * ratios, and every speculating run's tokens are checked against the
 * plain run's ("identical").
 *
 * Random weights do not repeat their prompt, so the mechanism is measured
 * with an oracle draft source: the next tokens of the warm-up's plain run
 * of the same request, each one kept right with probability PCT % (a hash
 * of request and position decides, the same in every run) and otherwise
 * replaced by another id. --speculative ngram uses the real prompt-lookup
 * source; --repeat builds prompts that repeat themselves (a document,
 * then the same document again), where prompt lookup finds drafts.
 * Single-threaded: this function owns the engine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "cmds.h"
#include "engine.h"

struct spec_args {
    struct cli_engine_args e; /* --model, --tokens, -n, --prompt, ... */
    const char *source;       /* --speculative */
    int reps, repeat, correct;
    enum spec_mode mode;
    int spec_tokens, spec_max_rows;
};

static void spec_usage(void)
{
    fprintf(stderr,
            "usage: redlm run -m DIR --tokens 1,2,3 [-n N] [--ignore-eos] --speculative ngram\n"
            "                 [--spec-tokens K]\n"
            "       redlm bench-engine -m DIR --speculative oracle|ngram [--spec-correct PCT]\n"
            "                 [--prompt P] [--gen G] [--batch B] [--spec-tokens K] [--reps R]\n"
            "                 [--repeat] [--threads N] [--isa X]\n"
            "  --speculative off|ngram|oracle  draft source (oracle: bench-engine only)\n"
            "  --spec-tokens K     draft tokens per step at most (4)\n"
            "  --spec-max-rows N   drafts only in steps of fewer tokens (cpu 8, cuda 64)\n"
            "  --spec-correct PCT  oracle: share of its draft tokens that are right (100)\n"
            "  --reps R            plain and speculating runs each, alternating (3)\n"
            "  --repeat            prompts of a document followed by the same document\n");
}

static int spec_parse(int argc, char **argv, struct spec_args *a, struct rl_err *err)
{
    memset(a, 0, sizeof *a);
    struct cli_opt opts[CLI_ENGINE_N_OPTS + 7];
    int n = cli_engine_opts(opts, &a->e);
    a->e.prompt = 128, a->e.gen = 64;
    a->reps = 3, a->correct = 100;
    a->spec_tokens = SPEC_DEFAULT_TOKENS;
    const struct cli_opt own[] = {
        {"--speculative", NULL, CLI_OPT_STR, &a->source, 0, 0},
        {"--reps", NULL, CLI_OPT_INT, &a->reps, 1, 100},
        {"--spec-tokens", NULL, CLI_OPT_INT, &a->spec_tokens, 1, SPEC_MAX_TOKENS},
        {"--spec-max-rows", NULL, CLI_OPT_INT, &a->spec_max_rows, 1, 1 << 20},
        {"--spec-correct", NULL, CLI_OPT_INT, &a->correct, 0, 100},
        {"--repeat", NULL, CLI_OPT_FLAG, &a->repeat, 0, 0},
        {NULL, NULL, 0, NULL, 0, 0},
    };
    memcpy(opts + n, own, sizeof own);
    /* the bench's buffers and sequences: narrower than plain bench-engine */
    cli_opt_bounds(opts, "--prompt", 2, 1 << 16);
    cli_opt_bounds(opts, "--gen", 2, 1 << 16);
    cli_opt_bounds(opts, "--batch", 1, 256);
    int rc = cli_parse_opts(argc, argv, opts, err);
    if (rc)
        return rc;
    if (a->e.temperature != 0)
        return rl_errf(err, RL_EINVAL, "--temperature: only 0 (greedy) here; "
                                       "use run --batch for sampling");
    if (!a->e.mo.dir)
        return rl_errf(err, RL_EINVAL, "-m DIR is required");
    if (!a->source)
        return rl_errf(err, RL_EINVAL, "--speculative is required");
    if (strcmp(a->source, "oracle") && spec_mode_parse(a->source, &a->mode))
        return rl_errf(err, RL_EINVAL, "--speculative: off, ngram or oracle, not %s", a->source);
    if (!strcmp(a->source, "oracle"))
        a->mode = SPEC_NGRAM; /* on, with the oracle as its source */
    return 0;
}

static int open_engine(const struct spec_args *a, int max_batch, int kv_blocks,
                       spec_draft_fn src, void *src_user, struct engine **e, struct rl_err *err)
{
    struct engine_options eo;
    engine_options_default(&eo);
    eo.backend = a->e.mo.backend;
    eo.isa = a->e.mo.isa;
    eo.quantize = a->e.mo.quantize;
    eo.n_threads = a->e.mo.n_threads;
    eo.max_batch = max_batch;
    eo.kv_blocks = kv_blocks;
    eo.kv_prefault = 1; /* steady state: a server's pool is warm */
    eo.speculative = a->mode;
    eo.spec_tokens = a->spec_tokens;
    eo.spec_max_rows = a->spec_max_rows;
    eo.spec_draft = src;
    eo.spec_draft_user = src_user;
    return engine_create(e, a->e.mo.dir, &eo, err);
}

/* The body of `redlm run ... --speculative MODE`: one greedy request
 * through the batching engine. Returns the exit status. */
static int run_spec(const struct spec_args *a, int rc, struct rl_err *err)
{
    int32_t *ids = NULL, *out = NULL;
    int n = 0, n_out = 0;
    struct engine *e = NULL;
    if (!rc && !strcmp(a->source, "oracle"))
        rc = rl_errf(err, RL_EINVAL, "--speculative oracle is for bench-engine");
    if (!rc && !a->e.tokens)
        rc = rl_errf(err, RL_EINVAL, "--tokens is required");
    if (!rc)
        rc = cli_parse_ids(a->e.tokens, &ids, &n, err);
    if (!rc)
        rc = open_engine(a, 1, (n + a->e.n_gen + SPEC_MAX_TOKENS + 15) / 16 + 1, NULL, NULL, &e,
                         err);
    if (!rc && !(out = malloc(((size_t)a->e.n_gen + 1) * sizeof *out)))
        rc = rl_errf(err, RL_ENOMEM, "out of memory");
    struct engine_usage usage = {0};
    if (!rc && a->e.n_gen > 0) {
        /* plain `run`: greedy, stops at the checkpoint's eos only */
        struct engine_request q;
        engine_request_init(&q);
        q.prompt_ids = ids;
        q.n_prompt = n;
        q.temperature = 0;
        q.max_tokens = a->e.n_gen;
        q.ignore_eos = true;
        int32_t eos = engine_eos_id(e);
        if (!a->e.ignore_eos && eos >= 0) {
            q.stop_ids = &eos;
            q.n_stop_ids = 1;
        }
        rc = engine_submit(e, &q, NULL, err);
        while (!rc && engine_n_active(e) > 0) {
            const struct engine_event *ev;
            int n_ev;
            if ((rc = engine_step(e, &ev, &n_ev, err)))
                break;
            for (int i = 0; i < n_ev; i++) {
                for (int t = 0; t < ev[i].n_tokens && n_out < a->e.n_gen; t++)
                    out[n_out++] = ev[i].tokens[t];
                usage = ev[i].usage;
                if (ev[i].finish == ENGINE_FINISH_ERROR)
                    rc = rl_errf(err, ev[i].error_code ? ev[i].error_code : RL_EINTERNAL, "%s",
                                 ev[i].error ? ev[i].error : "engine error");
            }
        }
    }
    if (!rc) {
        printf("{\"tokens\": [");
        for (int i = 0; i < n_out; i++)
            printf(i ? ", %d" : "%d", out[i]);
        printf("], \"spec\": {\"mode\": \"%s\", \"drafted\": %d, \"accepted\": %d}}\n",
               spec_mode_name(a->mode), usage.spec_drafted, usage.spec_accepted);
    } else {
        fprintf(stderr, "redlm run: %s\n", err->msg);
    }
    engine_free(e);
    free(ids);
    free(out);
    return rc ? 1 : 0;
}

/* ---- bench-engine --speculative ---- */

struct bench_seq {
    int idx;
    int32_t *prompt;   /* (n_prompt) */
    int n_prompt;
    int32_t *ref;      /* (n_ref) the warm-up's plain output: the oracle */
    int n_ref;
    int32_t *out;      /* (cap) this run's output */
    int n_out, cap;
};

struct oracle {
    struct bench_seq *seqs;
    int correct;       /* percent of draft tokens that are right */
    int vocab;
};

static uint32_t mix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

static int oracle_draft(void *src, void *req_user, const int32_t *tokens, int n_tokens,
                        int n_prompt, int32_t *out, int max_n)
{
    (void)tokens;
    struct oracle *o = src;
    const struct bench_seq *s = req_user;
    int at = n_tokens - n_prompt, n = 0;
    for (; n < max_n && at + n < s->n_ref; n++) {
        int32_t t = s->ref[at + n];
        uint32_t h = mix32((uint32_t)s->idx * 0x9e3779b9u + (uint32_t)(at + n));
        if ((int)(h % 100) >= o->correct)
            t = (t + 1 + (int32_t)(h % 1000)) % o->vocab; /* another id */
        out[n] = t;
    }
    return n;
}

/* One run of every sequence; *tok_s gets the decode rate. */
static int bench_run(struct engine *e, struct bench_seq *seqs, int B, int G, bool spec,
                     double *tok_s, struct engine_usage *tot, struct rl_err *err)
{
    for (int s = 0; s < B; s++) {
        struct engine_request q;
        engine_request_init(&q);
        q.prompt_ids = seqs[s].prompt;
        q.n_prompt = seqs[s].n_prompt;
        q.temperature = 0;
        q.ignore_eos = true;
        q.max_tokens = G;
        q.no_speculative = !spec;
        q.user = &seqs[s];
        seqs[s].n_out = 0;
        int rc = engine_submit(e, &q, NULL, err);
        if (rc)
            return rc;
    }
    int started = 0;
    long tokens_after = 0;
    double t0 = 0;
    memset(tot, 0, sizeof *tot);
    while (engine_n_active(e) > 0) {
        const struct engine_event *ev;
        int n;
        int rc = engine_step(e, &ev, &n, err);
        if (rc)
            return rc;
        double now = engine_now();
        for (int i = 0; i < n; i++) {
            struct bench_seq *s = ev[i].user;
            if (ev[i].finish == ENGINE_FINISH_ERROR)
                return rl_errf(err, RL_EINTERNAL, "%s", ev[i].error ? ev[i].error : "engine error");
            if (ev[i].n_tokens > 0 && s->n_out == 0)
                started++;
            else if (t0 > 0)
                tokens_after += ev[i].n_tokens;
            for (int t = 0; t < ev[i].n_tokens && s->n_out < s->cap; t++)
                s->out[s->n_out++] = ev[i].tokens[t];
            if (ev[i].finish != ENGINE_FINISH_NONE) {
                tot->spec_drafted += ev[i].usage.spec_drafted;
                tot->spec_accepted += ev[i].usage.spec_accepted;
                tot->completion_tokens += ev[i].usage.completion_tokens;
            }
        }
        if (started == B && t0 == 0)
            t0 = now;
    }
    double dt = engine_now() - t0;
    *tok_s = dt > 0 ? (double)tokens_after / dt : 0;
    return 0;
}

static double median(double *v, int n);

/* What prompt lookup costs a decode step: spec_ngram_propose as the
 * engine calls it (n = 4 down to 1, up to k tokens) at every decode
 * position of every sequence's prompt and plain output, in microseconds
 * per call, median of 5 passes. The engine calls it only in steps that
 * draft, so this is an upper bound on its share of a step. */
static double lookup_us(const struct bench_seq *seqs, int B, int k)
{
    double pass[5];
    int32_t draft[SPEC_MAX_TOKENS];
    volatile int sink = 0; /* keeps the calls */
    for (int p = 0; p < 5; p++) {
        long calls = 0;
        double t0 = engine_now();
        for (int s = 0; s < B; s++) {
            int n_all = seqs[s].n_prompt + seqs[s].n_ref;
            int32_t *all = malloc((size_t)n_all * sizeof *all);
            if (!all)
                return -1;
            memcpy(all, seqs[s].prompt, (size_t)seqs[s].n_prompt * sizeof *all);
            memcpy(all + seqs[s].n_prompt, seqs[s].ref, (size_t)seqs[s].n_ref * sizeof *all);
            for (int n = seqs[s].n_prompt; n < n_all; n++, calls++)
                sink += spec_ngram_propose(all, n, 1, 4, draft, k);
            free(all);
        }
        pass[p] = calls ? (engine_now() - t0) * 1e6 / (double)calls : 0;
    }
    (void)sink;
    return median(pass, 5);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The body of `redlm bench-engine ... --speculative SOURCE`. Returns the
 * exit status. */
static int bench_spec(const struct spec_args *a, int rc, struct rl_err *err)
{
    if (!rc && a->mode == SPEC_OFF)
        rc = rl_errf(err, RL_EINVAL, "--speculative off: use plain bench-engine");
    if (rc) {
        fprintf(stderr, "redlm bench-engine: %s\n", err->msg);
        return 1;
    }
    int B = a->e.batch, P = a->e.prompt, G = a->e.gen, R = a->reps;
    bool oracle = !strcmp(a->source, "oracle");
    struct bench_seq *seqs = calloc((size_t)B, sizeof *seqs);
    double *plain = calloc((size_t)R, sizeof(double)), *spec = calloc((size_t)R, sizeof(double)),
           *ratio = calloc((size_t)R, sizeof(double));
    struct oracle orc = {seqs, a->correct, 0};
    struct engine *e = NULL;
    if (!seqs || !plain || !spec || !ratio) {
        fprintf(stderr, "redlm bench-engine: out of memory\n");
        return 1;
    }
    /* every sequence's blocks twice over: the runs' prefixes stay cached */
    int per_seq = (P + G + SPEC_MAX_TOKENS + 15) / 16 + 1;
    rc = open_engine(a, B, 2 * B * per_seq, oracle ? oracle_draft : NULL, &orc, &e, err);
    int vocab = rc ? 0 : engine_n_vocab(e);
    orc.vocab = vocab;
    for (int s = 0; !rc && s < B; s++) {
        seqs[s].idx = s;
        seqs[s].n_prompt = P;
        seqs[s].cap = G;
        seqs[s].prompt = malloc((size_t)P * sizeof(int32_t));
        seqs[s].ref = malloc((size_t)G * sizeof(int32_t));
        seqs[s].out = malloc((size_t)G * sizeof(int32_t));
        if (!seqs[s].prompt || !seqs[s].ref || !seqs[s].out) {
            rc = rl_errf(err, RL_ENOMEM, "out of memory");
            break;
        }
        uint32_t r = 0x12345u + 7919u * (uint32_t)s;
        int doc = a->repeat ? P / 2 : P;
        for (int i = 0; i < P; i++) {
            r = r * 1664525u + 1013904223u;
            seqs[s].prompt[i] =
                i < doc ? (int32_t)((r >> 8) % (uint32_t)(vocab > 2000 ? vocab - 1000 : vocab))
                        : seqs[s].prompt[i - doc];
        }
    }
    /* warm-up, untimed: the pool's threads, the prompts' prefill (cached
     * from here on), and the oracle's reference */
    struct engine_usage u;
    double t;
    if (!rc)
        rc = bench_run(e, seqs, B, G, false, &t, &u, err);
    for (int s = 0; !rc && s < B; s++) {
        memcpy(seqs[s].ref, seqs[s].out, (size_t)seqs[s].n_out * sizeof(int32_t));
        seqs[s].n_ref = seqs[s].n_out;
    }
    bool identical = true;
    long drafted = 0, accepted = 0, spec_tokens = 0;
    for (int r = 0; !rc && r < R; r++) {
        /* alternate the order: a drift of the machine's speed does not
         * favour either side */
        for (int k = 0; k < 2 && !rc; k++) {
            bool on = (k == 0) == (r % 2 == 1);
            rc = bench_run(e, seqs, B, G, on, on ? &spec[r] : &plain[r], &u, err);
            if (!rc && on) {
                drafted += u.spec_drafted;
                accepted += u.spec_accepted;
                spec_tokens += u.completion_tokens;
                for (int s = 0; s < B; s++)
                    identical &= seqs[s].n_out == seqs[s].n_ref &&
                                 !memcmp(seqs[s].out, seqs[s].ref,
                                         (size_t)seqs[s].n_out * sizeof(int32_t));
            }
        }
        if (!rc)
            ratio[r] = plain[r] > 0 ? spec[r] / plain[r] : 0;
    }
    if (!rc) {
        printf("{\"bench\": \"speculative\", \"source\": \"%s\", \"correct_pct\": %d, "
               "\"repeat\": %s, \"batch\": %d, \"prompt\": %d, \"gen\": %d, "
               "\"spec_tokens\": %d, \"spec_max_rows\": %d, \"reps\": %d, "
               "\"runs_plain_tok_s\": [",
               a->source, oracle ? a->correct : -1, a->repeat ? "true" : "false", B, P, G,
               a->spec_tokens, a->spec_max_rows, R);
        for (int r = 0; r < R; r++)
            printf(r ? ", %.2f" : "%.2f", plain[r]);
        printf("], \"runs_spec_tok_s\": [");
        for (int r = 0; r < R; r++)
            printf(r ? ", %.2f" : "%.2f", spec[r]);
        printf("], \"plain_decode_tok_s\": %.2f, \"spec_decode_tok_s\": %.2f, "
               "\"speedup\": %.3f, \"acceptance\": %.4f, \"drafted_per_token\": %.3f, "
               "\"lookup_us_per_call\": %.2f, \"identical\": %s}\n",
               median(plain, R), median(spec, R), median(ratio, R),
               drafted ? (double)accepted / (double)drafted : 0.0,
               spec_tokens ? (double)drafted / (double)spec_tokens : 0.0,
               lookup_us(seqs, B, a->spec_tokens), identical ? "true" : "false");
        if (!identical)
            rc = rl_errf(err, RL_EINTERNAL, "speculative output differs from plain decoding");
    }
    if (rc)
        fprintf(stderr, "redlm bench-engine: %s\n", err->msg);
    engine_free(e);
    for (int s = 0; s < B; s++) {
        free(seqs[s].prompt);
        free(seqs[s].ref);
        free(seqs[s].out);
    }
    free(seqs), free(plain), free(spec), free(ratio);
    return rc ? 1 : 0;
}

/* The prelude both commands share: parses argv, prints the usage and
 * exits 1 on a usage error (spec_parse > 0), else hands the arguments
 * and spec_parse's code (0, or < 0 with err filled, which body reports in
 * its own name) to body. Returns the process exit status body returns. */
static int spec_main(int argc, char **argv,
                     int (*body)(const struct spec_args *a, int rc, struct rl_err *err))
{
    struct spec_args a;
    struct rl_err err = {0};
    int rc = spec_parse(argc, argv, &a, &err);
    if (rc > 0) {
        spec_usage();
        return 1;
    }
    return body(&a, rc, &err);
}

/* `redlm run ... --speculative MODE` */
int cmd_run_spec(int argc, char **argv)
{
    return spec_main(argc, argv, run_spec);
}

/* `redlm bench-engine ... --speculative SOURCE` */
int cmd_bench_spec(int argc, char **argv)
{
    return spec_main(argc, argv, bench_spec);
}
