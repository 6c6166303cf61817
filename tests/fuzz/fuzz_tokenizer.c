/* tests/fuzz/fuzz_tokenizer.c - libFuzzer target for the encoder.
 *
 * The input's first byte picks the options, the rest is the text (any
 * bytes). Checks, besides the sanitizers' own: encoding never fails;
 * every id is a token; decoding the ids gives back the NFC of the input
 * with invalid UTF-8 replaced (checked on inputs without '<', see below);
 * the streaming decoder agrees with the whole decode. The Qwen3 tokenizer is
 * loaded once from the repository's engine/tokenizers/qwen3.
 *
 *   make fuzz && build-fuzz/fuzz/fuzz_tokenizer -max_total_time=60 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tests/unit/test_util.h"
#include "tokenizer.h"

static struct tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct rl_err err = {0};
    if (tok_load(&tok, tu_qwen3_tokenizer_dir(), &err)) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    unsigned flags = data[0] & 1 ? TOK_ENCODE_NO_SPECIAL : 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;

    struct tok_ids ids = {0};
    struct rl_err err = {0};
    if (tok_encode(tok, text, len, flags, &ids, &err)) {
        fprintf(stderr, "encode failed: %s\n", err.msg);
        abort();
    }
    for (size_t i = 0; i < ids.n; i++) {
        size_t n;
        if (!tok_token_bytes(tok, ids.ids[i], &n))
            abort();
    }
    char *dec;
    size_t dec_len;
    if (tok_decode(tok, ids.ids, ids.n, 0, &dec, &dec_len, &err))
        abort();

    /* expected: sanitize, then NFC; only when no '<' occurs, since NFC of
     * the whole text may compose across an added token's '>' (e.g. with
     * U+0338), which segment-wise normalization (HF's, ours) does not */
    if (!memchr(text, '<', len)) {
        size_t fixed_len;
        char *fixed = tok_utf8_sanitize(text, len, &fixed_len);
        utf8proc_uint8_t *want = NULL;
        utf8proc_ssize_t wn = utf8proc_map((const utf8proc_uint8_t *)fixed, (utf8proc_ssize_t)fixed_len,
                                           &want, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (wn < 0 || (size_t)wn != dec_len || memcmp(want, dec, dec_len)) {
            fprintf(stderr, "roundtrip mismatch\n");
            abort();
        }
        free(want);
        free(fixed);
    }

    /* streaming decode, with the skip flag from the options byte */
    unsigned dflags = data[0] & 2 ? TOK_DECODE_SKIP_SPECIAL : 0;
    struct tok_stream *s;
    if (tok_stream_create(&s, tok, dflags, &err))
        abort();
    char *acc = malloc(3 * dec_len + 16); /* a raw byte becomes at most one U+FFFD */
    size_t acc_n = 0;
    const char *chunk;
    size_t cl;
    for (size_t i = 0; i < ids.n; i++) {
        if (tok_stream_push(s, ids.ids[i], &chunk, &cl, &err))
            abort();
        memcpy(acc + acc_n, chunk, cl);
        acc_n += cl;
    }
    if (tok_stream_finish(s, &chunk, &cl, &err))
        abort();
    memcpy(acc + acc_n, chunk, cl);
    acc_n += cl;
    char *whole;
    size_t whole_n;
    if (tok_decode(tok, ids.ids, ids.n, dflags, &whole, &whole_n, &err) || whole_n != acc_n ||
        memcmp(whole, acc, acc_n))
        abort();
    free(whole);
    free(acc);
    tok_stream_free(s);
    free(dec);
    tok_ids_free(&ids);
    return 0;
}
