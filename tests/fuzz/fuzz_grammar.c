/* tests/fuzz/fuzz_grammar.c - libFuzzer target for the grammar compilers
 * and matcher (engine/grammar/): what a client's response_format schema,
 * raw grammar or tools array reaches on the worker's engine thread.
 *
 * The input's first byte picks the compiler, the rest is its source:
 *   0-95    a JSON Schema (gram_compile_json_schema)
 *   96-159  a raw grammar (gram_compile_ebnf)
 *   160-223 an OpenAI tools array (gram_compile_tool_call, any tool)
 *   224-255 the same, the tool named by the selector's low bits' index
 * over a small vocabulary (every byte a token, a few multi-byte tokens, an
 * EOS and one other special token), so a walk is cheap. Checks, besides
 * the sanitizers' own and libFuzzer's -timeout (a compile that runs away
 * stalls every sequence of a worker):
 *   - a refusal carries BAD_PARAM (the client's fault) or ENOMEM, and a
 *     message;
 *   - a compiled grammar's walk (tokens drawn from the mask by a seed of
 *     the input, up to WALK_STEPS): every allowed token is accepted; EOS is
 *     in the mask exactly when the matcher says complete; no special token
 *     but EOS inside a document; after a token has been accepted the mask
 *     is never empty (a dead end would leave the job unable to go on);
 *   - rolling back the last tokens restores the mask bit for bit.
 *
 *   make fuzz && build-fuzz/fuzz/fuzz_grammar -max_total_time=60 -timeout=10 \
 *     tests/data/schemas/generators */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"
#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define WALK_STEPS 96
#define ROLLBACK 5

/* ids 0-255: the bytes; then these; then EOS and one other special */
static const char *const multi[] = {
    "{\"", "\":", "\": ", "\",", "\"}", "},", "null", "true", "false", "  ", "\n", "\\\"",
    "\\u00", "12", "0.5", "e-3", "name", "\xc3\xa9", "\xe2\x82\xac", "<tool_call>", "</tool_call>",
    "arguments", "type", "\"name\": \"", "[", "]", ", ", "-1",
};
#define N_MULTI ((int)(sizeof multi / sizeof multi[0]))
#define ID_EOS (256 + N_MULTI)
#define ID_SPECIAL (ID_EOS + 1)
#define N_VOCAB (ID_SPECIAL + 1)
#define WORDS ((N_VOCAB + 31) / 32)

static const char *token_bytes(void *user, int32_t id, size_t *len, int *is_special)
{
    static char bytes[256];
    (void)user;
    *is_special = 0;
    if (id < 256) {
        bytes[id] = (char)id;
        *len = 1;
        return &bytes[id];
    }
    if (id < ID_EOS) {
        *len = strlen(multi[id - 256]);
        return multi[id - 256];
    }
    *is_special = 1;
    *len = id == ID_EOS ? 10 : 5;
    return id == ID_EOS ? "<|im_end|>" : "<|x|>";
}

static struct gram_vocab *vocab(void)
{
    static struct gram_vocab *v;
    if (!v) {
        struct rl_err err = {0};
        int32_t eos = ID_EOS;
        if (gram_vocab_create(&v, N_VOCAB, token_bytes, NULL, &eos, 1, &err)) {
            fprintf(stderr, "gram_vocab_create: %s\n", err.msg);
            abort();
        }
    }
    return v;
}

static bool bit(const uint32_t *m, int32_t id) { return m[id >> 5] >> (id & 31) & 1; }

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static void walk(struct gram *g, uint64_t seed)
{
    struct gram_match *m;
    struct rl_err err = {0};
    if (gram_match_create(&m, g, &err))
        return; /* out of memory: nothing to check */
    /* before[c]: the mask after c accepted tokens, on the current path */
    static uint32_t mask[WORDS], before[WALK_STEPS + 1][WORDS];
    int32_t allowed[N_VOCAB];
    uint64_t s = seed | 1;
    int accepted = 0;
    for (int step = 0; step < WALK_STEPS; step++) {
        gram_match_mask(m, mask);
        memcpy(before[accepted], mask, sizeof mask);
        int na = 0;
        for (int32_t id = 0; id < N_VOCAB; id++)
            if (bit(mask, id))
                allowed[na++] = id;
        bool complete = gram_match_complete(m);
        if (bit(mask, ID_EOS) != complete || bit(mask, ID_SPECIAL))
            abort();
        if (na == 0) {
            if (accepted) /* a dead end reached through allowed tokens */
                abort();
            break;          /* a language with nothing in it */
        }
        int32_t id = allowed[rng_next(&s) % (uint64_t)na];
        if (gram_match_accept(m, id, &err))
            abort();
        if (id == ID_EOS)
            break;
        accepted++;
        /* now and then, undo a few tokens: the mask must be what it was */
        if (accepted >= ROLLBACK && rng_next(&s) % 8 == 0) {
            int k = 1 + (int)(rng_next(&s) % ROLLBACK);
            if (gram_match_rollback(m, k))
                abort();
            accepted -= k;
            static uint32_t again[WORDS];
            gram_match_mask(m, again);
            if (memcmp(again, before[accepted], sizeof again))
                abort();
        }
    }
    gram_match_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t sel = data[0];
    const char *src = (const char *)data + 1;
    size_t len = size - 1;
    struct gram *g = NULL;
    struct rl_err err = {0};
    int rc;
    if (sel < 96)
        rc = gram_compile_json_schema(&g, vocab(), src, len, &err);
    else if (sel < 160)
        rc = gram_compile_ebnf(&g, vocab(), src, len, &err);
    else if (sel < 224)
        rc = gram_compile_tool_call(&g, vocab(), src, len, NULL, &err);
    else {
        /* a name that may or may not be among the tools */
        static const char *const names[] = {"get_weather", "a", "weather", "f"};
        rc = gram_compile_tool_call(&g, vocab(), src, len, names[sel & 3], &err);
    }
    if (rc) {
        if (g || !err.msg[0] || (err.code != EV_CODE_BAD_PARAM && rc != -RL_ENOMEM))
            abort();
        return 0;
    }
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < size; i++)
        seed = (seed ^ data[i]) * 0x100000001b3ull;
    walk(g, seed);
    gram_unref(g);
    return 0;
}
