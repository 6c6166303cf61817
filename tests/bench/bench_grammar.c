/* tests/bench/bench_grammar.c - grammar compile time and per-step mask time
 * (engine/grammar/) on the real Qwen3 vocabulary (151,936 mask bits).
 *
 * For each schema of a fixed corpus: compile time (best of 3), then uniform
 * random walks over the allowed tokens (seeds 1..WALKS, each to EOS or 600
 * steps), timing every gram_match_mask() call; prints p50 / p99 / max per
 * schema and over the whole corpus, as a table and as one JSON line per
 * figure like the other benchmarks. The first pass of walks includes any
 * per-state class computed on first use (states beyond the eager budget),
 * so its p99 and max show that cost; "warm" repeats the same walks on the
 * same compiled grammar (as a cached grammar is used again). Times are this thread's CPU
 * time (CLOCK_THREAD_CPUTIME_ID), honest on a shared machine.
 *
 * --schemas DIR replaces the fixed corpus with every *.json file there
 * (e.g. tests/data/schemas/generators, issue 29: what zod and Pydantic
 * write), each a JSON Schema named by its file.
 *
 * usage: bench_grammar [--tokenizer DIR] [--walks N] [--schemas DIR] */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar.h"
#include "tests/unit/test_util.h"
#include "tokenizer.h"

#define N_VOCAB 151936

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static const char *tb(void *u, int32_t id, size_t *len, int *sp)
{
    const struct tokenizer *t = u;
    if (id >= tok_n_ids(t)) return NULL;
    *sp = tok_is_special(t, id);
    return tok_token_bytes(t, id, len);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *v, int n, double p)
{
    if (!n) return 0;
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

struct item { const char *name, *kind, *src; };

static const struct item corpus[] = {
    {"person", "schema", "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"email\":{\"type\":\"string\",\"format\":\"email\"}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}"},
    {"enum+bool", "schema", "{\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"ok\":{\"type\":\"boolean\"},\"n\":{\"type\":\"number\"}},\"required\":[\"color\",\"ok\",\"n\"]}"},
    {"array-of-str", "schema", "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1,\"maxItems\":8}"},
    {"free-string", "schema", "{\"type\":\"string\"}"},
    {"nested", "schema", "{\"type\":\"object\",\"properties\":{\"user\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":5}},\"required\":[\"id\",\"tags\"]},\"when\":{\"type\":\"string\",\"format\":\"date-time\"}},\"required\":[\"user\",\"when\"]}"},
    {"anyOf", "schema", "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"},\"x\":{\"type\":\"integer\"}},\"required\":[\"kind\",\"x\"]},{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"b\"},\"y\":{\"type\":\"string\"}},\"required\":[\"kind\",\"y\"]}]}"},
    {"recursive", "schema", "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":3}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}"},
    {"optional-props", "schema", "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"integer\"},\"c\":{\"type\":\"boolean\"},\"d\":{\"type\":\"null\"},\"e\":{\"type\":\"number\"}},\"required\":[\"c\"]}"},
    {"pattern", "schema", "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-[0-9]{4}$\"},\"note\":{\"type\":\"string\",\"maxLength\":64}},\"required\":[\"code\",\"note\"]}"},
    {"json_object", "object", ""},
    {"tool_call", "tools", "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\"]}},\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\"},\"limit\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":50}},\"required\":[\"q\"]}}}]"},
    {"ebnf-arith", "ebnf", "root ::= expr\nexpr ::= term ((\" + \" | \" - \") term){0,6}\nterm ::= [0-9]{1,4} | \"(\" expr \")\"\n"},
};

static int compile(const struct item *it, const struct gram_vocab *v, struct gram **g, struct rl_err *err)
{
    size_t n = strlen(it->src);
    if (!strcmp(it->kind, "schema")) return gram_compile_json_schema(g, v, it->src, n, err);
    if (!strcmp(it->kind, "object")) return gram_compile_json_object(g, v, err);
    if (!strcmp(it->kind, "tools")) return gram_compile_tool_call(g, v, it->src, n, NULL, err);
    return gram_compile_ebnf(g, v, it->src, n, err);
}

static int cmp_item(const void *a, const void *b)
{
    return strcmp(((const struct item *)a)->name, ((const struct item *)b)->name);
}

/* Every *.json in sdir as a schema item (names and texts malloc'd, kept
 * to the end of the run). Returns the count, -1 on error. */
static int load_dir(const char *sdir, struct item **out)
{
    DIR *d = opendir(sdir);
    if (!d) { perror(sdir); return -1; }
    int n = 0, cap = 0;
    struct item *v = NULL;
    for (struct dirent *e; (e = readdir(d));) {
        size_t L = strlen(e->d_name);
        if (L < 6 || strcmp(e->d_name + L - 5, ".json")) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", sdir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) { perror(path); closedir(d); return -1; }
        fseek(f, 0, SEEK_END);
        long sz = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *txt = malloc((size_t)sz + 1);
        size_t got = txt ? fread(txt, 1, (size_t)sz, f) : 0;
        fclose(f);
        if (!txt || got != (size_t)sz) { free(txt); closedir(d); return -1; }
        txt[sz] = 0;
        if (n == cap) { cap = cap ? cap * 2 : 64; v = realloc(v, sizeof *v * (size_t)cap); if (!v) { closedir(d); return -1; } }
        char *name = strndup(e->d_name, L - 5);
        v[n++] = (struct item){name, "schema", txt};
    }
    closedir(d);
    if (n) qsort(v, (size_t)n, sizeof *v, cmp_item);
    *out = v;
    return n;
}

int main(int argc, char **argv)
{
    const char *dir = tu_qwen3_tokenizer_dir(), *sdir = NULL;
    int walks = 8;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--walks") && i + 1 < argc) walks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--schemas") && i + 1 < argc) sdir = argv[++i];
        else { fprintf(stderr, "usage: %s [--tokenizer DIR] [--walks N] [--schemas DIR]\n", argv[0]); return 2; }
    }
    const struct item *items = corpus;
    int n_items = (int)(sizeof corpus / sizeof *corpus);
    struct item *loaded = NULL;
    if (sdir) {
        n_items = load_dir(sdir, &loaded);
        if (n_items <= 0) { fprintf(stderr, "bench_grammar: no *.json schemas in %s\n", sdir); return 1; }
        items = loaded;
    }
    struct rl_err err = {0};
    struct tokenizer *tok;
    if (tok_load(&tok, dir, &err)) { fprintf(stderr, "bench_grammar: %s\n", err.msg); return 1; }
    int32_t eos[2] = {tok_find(tok, "<|im_end|>", 10), tok_find(tok, "<|endoftext|>", 13)};
    struct gram_vocab *v;
    double t0 = now_us();
    if (gram_vocab_create(&v, N_VOCAB, tb, tok, eos, 2, &err)) { fprintf(stderr, "bench_grammar: %s\n", err.msg); return 1; }
    double vocab_ms = (now_us() - t0) / 1e3;
    printf("{\"bench\": \"grammar_vocab\", \"ms\": %.1f, \"n_vocab\": %d}\n", vocab_ms, N_VOCAB);
    int W = gram_mask_words_n(N_VOCAB);
    uint32_t *mask = malloc(sizeof(uint32_t) * (size_t)W);
    int32_t *allowed = malloc(sizeof(int32_t) * N_VOCAB);
    size_t cap_all = 1 << 16, n_all = 0;
    double *all = malloc(sizeof(double) * cap_all);
    static char table[65536];
    int tl = snprintf(table, sizeof table, "| grammar | compile ms | KB compiled | KB walked | steps | mask p50 us | mask p99 us | mask max us | warm p50 us | warm p99 us |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    size_t cap_warm = 1 << 16, n_warm = 0;
    double *warm = malloc(sizeof(double) * cap_warm);
    for (int c = 0; c < n_items; c++) {
        const struct item *it = &items[c];
        double best = 1e30;
        struct gram *g = NULL;
        for (int r = 0; r < 3; r++) {
            struct gram *x;
            double a = now_us();
            if (compile(it, v, &x, &err)) { fprintf(stderr, "bench_grammar: %s: %s\n", it->name, err.msg); return 1; }
            double b = now_us() - a;
            if (b < best) best = b;
            if (g) gram_unref(g);
            g = x;
        }
        size_t cap = 4096, n = 0, n_cold = 0;
        double *t = malloc(sizeof(double) * cap);
        double kb0 = (double)gram_bytes(g) / 1024; /* after the compile's eager states */
        /* pass 0: cold (states past the eager budget classified on first
         * use); pass 1: the same walks again, every visited state ready */
        for (int pass = 0; pass < 2; pass++)
        for (int seed = 1; seed <= walks; seed++) {
            if (pass == 1 && seed == 1) n_cold = n;
            struct gram_match *m;
            if (gram_match_create(&m, g, &err)) { fprintf(stderr, "bench_grammar: %s\n", err.msg); return 1; }
            uint64_t s = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 1;
            for (int step = 0; step < 600; step++) {
                double a = now_us();
                gram_match_mask(m, mask);
                double b = now_us() - a;
                if (n == cap) t = realloc(t, sizeof(double) * (cap *= 2));
                t[n++] = b;
                int na = 0;
                for (int w = 0; w < W; w++)
                    for (uint32_t bits = mask[w]; bits; bits &= bits - 1)
                        allowed[na++] = w * 32 + __builtin_ctz(bits);
                if (!na) break;
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                int32_t id = allowed[s % (uint64_t)na];
                if (id == eos[0] || id == eos[1]) break;
                if (gram_match_accept(m, id, &err)) { fprintf(stderr, "bench_grammar: accept: %s\n", err.msg); return 1; }
            }
            gram_match_free(m);
        }
        size_t nw = n - n_cold;
        n = n_cold;
        while (n_all + n > cap_all) all = realloc(all, sizeof(double) * (cap_all *= 2));
        memcpy(all + n_all, t, sizeof(double) * n);
        n_all += n;
        while (n_warm + nw > cap_warm) warm = realloc(warm, sizeof(double) * (cap_warm *= 2));
        memcpy(warm + n_warm, t + n, sizeof(double) * nw);
        n_warm += nw;
        qsort(t + n, nw, sizeof(double), cmp_d);
        double w50 = pct(t + n, (int)nw, 0.5), w99 = pct(t + n, (int)nw, 0.99);
        qsort(t, n, sizeof(double), cmp_d);
        double p50 = pct(t, (int)n, 0.5), p99 = pct(t, (int)n, 0.99), mx = n ? t[n - 1] : 0;
        double kb1 = (double)gram_bytes(g) / 1024; /* and every state the walks met */
        printf("{\"bench\": \"grammar_mask\", \"grammar\": \"%s\", \"compile_ms\": %.2f, \"kb_compiled\": %.0f, "
               "\"kb_walked\": %.0f, \"steps\": %zu, "
               "\"mask_p50_us\": %.1f, \"mask_p99_us\": %.1f, \"mask_max_us\": %.1f, \"warm_p50_us\": %.1f, \"warm_p99_us\": %.1f}\n",
               it->name, best / 1e3, kb0, kb1, n, p50, p99, mx, w50, w99);
        tl += snprintf(table + tl, sizeof table - (size_t)tl, "| %s | %.1f | %.0f | %.0f | %zu | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
                       it->name, best / 1e3, kb0, kb1, n, p50, p99, mx, w50, w99);
        free(t);
        gram_unref(g);
    }
    qsort(all, n_all, sizeof(double), cmp_d);
    qsort(warm, n_warm, sizeof(double), cmp_d);
    printf("{\"bench\": \"grammar_mask\", \"grammar\": \"corpus\", \"steps\": %zu, \"mask_p50_us\": %.1f, "
           "\"mask_p99_us\": %.1f, \"mask_max_us\": %.1f, \"warm_p50_us\": %.1f, \"warm_p99_us\": %.1f}\n",
           n_all, pct(all, (int)n_all, 0.5), pct(all, (int)n_all, 0.99), n_all ? all[n_all - 1] : 0,
           pct(warm, (int)n_warm, 0.5), pct(warm, (int)n_warm, 0.99));
    tl += snprintf(table + tl, sizeof table - (size_t)tl, "| **corpus** | | | | %zu | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
                   n_all, pct(all, (int)n_all, 0.5), pct(all, (int)n_all, 0.99), n_all ? all[n_all - 1] : 0,
                   pct(warm, (int)n_warm, 0.5), pct(warm, (int)n_warm, 0.99));
    free(warm);
    fputs(table, stderr);
    free(all); free(mask); free(allowed);
    gram_vocab_free(v);
    tok_free(tok);
    return 0;
}
