/* tests/bench/bench_tokenizer.c - encoding speed on one core.
 *
 * Builds a few MB of mixed text deterministically (a fixed-seed generator
 * over English words, common Chinese characters with CJK punctuation, and
 * lines of C and Python), then times tok_encode on it: once cold (the piece
 * cache empty), then the best of several warm passes, both as one call and
 * as 4 KiB prompt-sized calls. Also times tok_decode. Prints one JSON line
 * per figure, like the other benchmarks. Times are this thread's CPU time
 * (CLOCK_THREAD_CPUTIME_ID): the figure is per core, and it stays honest on
 * a build machine that other jobs share; on an idle machine it equals wall
 * time.
 *
 * usage: bench_tokenizer [--tokenizer DIR] [--mb N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/unit/test_util.h"
#include "tokenizer.h"

static uint64_t rng = 12345;
static uint32_t rnd(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *const english[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "model", "attention",
    "tokenizer", "scheduler", "memory", "question", "between", "important", "language",
    "different", "because", "government", "information", "development", "experience",
    "It's", "don't", "we'll", "Qwen3", "GPU", "2025", "3.14159", "e.g.", "(see", "below)",
};

/* 120 frequent Chinese characters */
static const char chinese[] =
    "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后"
    "能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分"
    "此心前面又定见只主没公从";

static const char *const code[] = {
    "int main(int argc, char **argv) {\n",
    "    for (size_t i = 0; i < n; i++)\n",
    "        sum += x[i] * w[i];\n",
    "    return rc ? rc : rl_errf(err, RL_EINVAL, \"%s: bad\", name);\n",
    "}\n",
    "def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
    "    h = self.norm(x)\n",
    "    return x + self.mlp(h)  # residual\n",
    "if __name__ == \"__main__\":\n",
    "    print(json.dumps({\"ids\": ids}, ensure_ascii=False))\n",
    "\n",
};

static size_t gen(char *buf, size_t max)
{
    char *p = buf, *end = buf + max - 512;
    while (p < end) {
        uint32_t kind = rnd() % 3;
        if (kind == 0) { /* an English paragraph */
            int words = 20 + rnd() % 60;
            for (int i = 0; i < words; i++) {
                const char *w = english[rnd() % (sizeof english / sizeof english[0])];
                p += sprintf(p, "%s%s", i ? " " : "", w);
                if (rnd() % 12 == 0)
                    *p++ = rnd() % 2 ? ',' : '.';
            }
            p += sprintf(p, ".\n\n");
        } else if (kind == 1) { /* a Chinese paragraph */
            int chars = 30 + rnd() % 120;
            size_t nc = (sizeof chinese - 1) / 3;
            for (int i = 0; i < chars; i++) {
                memcpy(p, chinese + 3 * (rnd() % nc), 3);
                p += 3;
                if (rnd() % 15 == 0)
                    p += sprintf(p, "%s", rnd() % 2 ? "，" : "。");
            }
            p += sprintf(p, "。\n\n");
        } else { /* a block of code */
            int lines = 3 + rnd() % 10;
            for (int i = 0; i < lines; i++)
                p += sprintf(p, "%s", code[rnd() % (sizeof code / sizeof code[0])]);
            *p++ = '\n';
        }
    }
    *p = 0;
    return (size_t)(p - buf);
}

int main(int argc, char **argv)
{
    const char *dir = tu_qwen3_tokenizer_dir();
    double mb = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc)
            mb = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--tokenizer DIR] [--mb N]\n", argv[0]);
            return 2;
        }
    }
    struct rl_err err = {0};
    struct tokenizer *t;
    double t0 = now();
    if (tok_load(&t, dir, &err)) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        return 1;
    }
    double load_s = now() - t0;
    size_t max = (size_t)(mb * 1e6) + 1024;
    char *text = malloc(max);
    size_t n = gen(text, max);

    struct tok_ids v = {0};
    t0 = now();
    if (tok_encode(t, text, n, 0, &v, &err)) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        return 1;
    }
    double cold = now() - t0;
    size_t n_ids = v.n;

    double best_whole = 1e9, best_chunked = 1e9;
    for (int r = 0; r < 3; r++) {
        v.n = 0;
        t0 = now();
        tok_encode(t, text, n, 0, &v, &err);
        double d = now() - t0;
        if (d < best_whole)
            best_whole = d;
        v.n = 0;
        t0 = now();
        for (size_t off = 0; off < n;) {
            size_t len = n - off < 4096 ? n - off : 4096;
            while (off + len < n && ((unsigned char)text[off + len] & 0xC0) == 0x80)
                len++; /* keep characters whole */
            tok_encode(t, text + off, len, 0, &v, &err);
            off += len;
        }
        d = now() - t0;
        if (d < best_chunked)
            best_chunked = d;
    }
    v.n = 0;
    tok_encode(t, text, n, 0, &v, &err);
    char *out;
    size_t out_len;
    t0 = now();
    tok_decode(t, v.ids, v.n, 0, &out, &out_len, &err);
    double dec = now() - t0;

    double m = (double)n / 1e6;
    printf("{\"bench\": \"tokenizer_load\", \"seconds\": %.3f}\n", load_s);
    printf("{\"bench\": \"tokenizer_encode\", \"mode\": \"cold, one call\", \"mb\": %.2f, \"ids\": %zu, "
           "\"bytes_per_id\": %.2f, \"mb_per_s\": %.1f}\n",
           m, n_ids, (double)n / (double)n_ids, m / cold);
    printf("{\"bench\": \"tokenizer_encode\", \"mode\": \"warm, one call\", \"mb\": %.2f, \"mb_per_s\": %.1f}\n",
           m, m / best_whole);
    printf("{\"bench\": \"tokenizer_encode\", \"mode\": \"warm, 4 KiB calls\", \"mb\": %.2f, \"mb_per_s\": %.1f}\n",
           m, m / best_chunked);
    printf("{\"bench\": \"tokenizer_decode\", \"mb\": %.2f, \"mb_per_s\": %.1f}\n", m, m / dec);
    free(out);
    free(text);
    tok_ids_free(&v);
    tok_free(t);
    return 0;
}
