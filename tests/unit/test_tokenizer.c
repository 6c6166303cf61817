/* tests/unit/test_tokenizer.c - the tokenizer against the real Qwen3
 * vocabulary and the tiny test model's, plus synthetic tokenizers.
 *
 * Reference data lives in tests/data (see its README for the sources): the
 * Qwen3 cases.json (ids from llama.cpp, cross-checked with transformers.js) and
 * the tiny model's reference.json prompts. Random tests use a fixed seed so
 * a failure reproduces; the seed and the failing input are printed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <utf8proc.h>

#include "gguf.h"
#include "mkmodel.h"
#include "tokenizer.h"

static cJSON *load_json(const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", tu_data_dir(), rel);
    char *s = tu_slurp(path, NULL);
    if (!s)
        fail_msg("cannot read %s", path);
    cJSON *j = cJSON_Parse(s);
    free(s);
    assert_non_null(j);
    return j;
}

static struct tokenizer *qwen3, *tiny;

static int setup(void **state)
{
    struct rl_err err = {0};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tu_qwen3_tokenizer_dir());
    if (tok_load(&qwen3, dir, &err)) {
        fprintf(stderr, "load %s: %s\n", dir, err.msg);
        return -1;
    }
    snprintf(dir, sizeof dir, "%s/models/tiny-qwen3-a", tu_data_dir());
    if (tok_load(&tiny, dir, &err)) {
        fprintf(stderr, "load %s: %s\n", dir, err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    tok_free(qwen3);
    tok_free(tiny);
    return 0;
}

static void expect_ids(const struct tokenizer *t, const char *text, size_t len, unsigned flags,
                       const cJSON *want, const char *what)
{
    struct tok_ids v = {0};
    struct rl_err err = {0};
    assert_int_equal(tok_encode(t, text, len, flags, &v, &err), 0);
    int ok = (size_t)cJSON_GetArraySize(want) == v.n;
    for (size_t i = 0; ok && i < v.n; i++)
        ok = cJSON_GetArrayItem(want, (int)i)->valueint == v.ids[i];
    if (!ok) {
        fprintf(stderr, "%s: %s\n  got:", what, text);
        for (size_t i = 0; i < v.n; i++)
            fprintf(stderr, " %d", v.ids[i]);
        fprintf(stderr, "\n");
    }
    tok_ids_free(&v);
    assert_true(ok);
}

static char *nfc(const char *s, size_t n, size_t *out_len)
{
    utf8proc_uint8_t *d = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &d,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    assert_true(m >= 0);
    *out_len = (size_t)m;
    return (char *)d;
}

/* cases.json: ids (special parsing on), ids_no_special_parsing, and the
 * transformers.js ids where present; decoding gives the NFC text back. */
static void test_qwen3_cases(void **state)
{
    cJSON *root = load_json("tokenizer/qwen3/cases.json");
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        size_t len = strlen(text);
        expect_ids(qwen3, text, len, 0, cJSON_GetObjectItem(c, "ids"), "ids");
        expect_ids(qwen3, text, len, TOK_ENCODE_NO_SPECIAL,
                   cJSON_GetObjectItem(c, "ids_no_special_parsing"), "ids_no_special_parsing");
        if (cJSON_GetObjectItem(c, "hf_js_ids"))
            expect_ids(qwen3, text, len, 0, cJSON_GetObjectItem(c, "hf_js_ids"), "hf_js_ids");

        const cJSON *ids = cJSON_GetObjectItem(c, "ids");
        int32_t buf[256];
        int k = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, ids) buf[k++] = x->valueint;
        char *out;
        size_t out_len, nl;
        assert_int_equal(tok_decode(qwen3, buf, (size_t)k, 0, &out, &out_len, NULL), 0);
        char *want = nfc(text, len, &nl);
        assert_int_equal(out_len, nl);
        assert_memory_equal(out, want, nl);
        free(out);
        free(want);
        n++;
    }
    assert_int_equal(n, 20);
    cJSON_Delete(root);
}

static void test_tiny_reference(void **state)
{
    cJSON *root = load_json("models/tiny-qwen3-a/reference.json");
    const cJSON *p;
    int n = 0;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(root, "prompts")) {
        const cJSON *text = cJSON_GetObjectItem(p, "text");
        if (!cJSON_IsString(text))
            continue;
        /* the reference lists the first n ids of the text's encoding */
        struct tok_ids v = {0};
        const char *s = text->valuestring;
        assert_int_equal(tok_encode(tiny, s, strlen(s), 0, &v, NULL), 0);
        const cJSON *ids = cJSON_GetObjectItem(p, "ids");
        size_t k = (size_t)cJSON_GetArraySize(ids);
        assert_true(k <= v.n);
        for (size_t i = 0; i < k; i++)
            assert_int_equal(cJSON_GetArrayItem(ids, (int)i)->valueint, v.ids[i]);
        tok_ids_free(&v);
        n++;
    }
    assert_true(n >= 4);
    cJSON_Delete(root);
}

static void test_special_ids(void **state)
{
    assert_int_equal(tok_n_ids(qwen3), 151669);
    assert_int_equal(tok_eos_id(qwen3), 151645);
    assert_int_equal(tok_pad_id(qwen3), 151643);
    assert_int_equal(tok_find(qwen3, "<think>", 7), 151667);
    assert_int_equal(tok_find(qwen3, "Hello", 5), 9707);
    assert_int_equal(tok_find(qwen3, "no such token at all", 20), -1);
    assert_true(tok_is_special(qwen3, 151644));
    assert_false(tok_is_special(qwen3, 151667)); /* <think> is special=false */
    assert_false(tok_is_special(qwen3, 9707));
    assert_int_equal(tok_eos_id(tiny), 738);
}

/* ---- random strings ----------------------------------------------------- */

static uint64_t rng_state;
static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static void put_cp(char **p, uint32_t cp)
{
    *p += utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)*p);
}

/* A random valid UTF-8 string of up to ~max bytes drawn from the classes
 * that stress the pipeline. Added tokens are followed by a space so that no
 * combining mark lands right after one: NFC would compose '>' + U+0338
 * across the boundary, which HF (normalizing segments) does not do. */
static size_t random_text(char *buf, size_t max)
{
    static const char *words[] = {"the", " quick", "It's", " we'll", "'S", "foo_bar", "x+=1;",
                                  "<|im_start|>", "<think>", "</tool_call>", "<|endoftext|>",
                                  "\r\n", "...", "§", "naïve", "ﬁ", "Å", "ñ"};
    char *p = buf;
    while ((size_t)(p - buf) + 64 < max) {
        uint32_t k = rnd() % 14, n = 1 + rnd() % 8;
        switch (k) {
        case 0: /* ASCII letters */
            for (uint32_t i = 0; i < n; i++)
                *p++ = (char)('a' + rnd() % 26 - (rnd() % 4 == 0 ? 32 : 0));
            break;
        case 1: /* digit strings */
            for (uint32_t i = 0; i < n * 3; i++)
                *p++ = (char)('0' + rnd() % 10);
            break;
        case 2: { /* whitespace runs, sometimes long */
            uint32_t len = rnd() % 5 == 0 ? 20 + rnd() % 40 : n;
            for (uint32_t i = 0; i < len && (size_t)(p - buf) + 64 < max; i++)
                *p++ = " \t\n\r  "[rnd() % 6];
            break;
        }
        case 3: /* CJK */
            for (uint32_t i = 0; i < n; i++)
                put_cp(&p, 0x4E00 + rnd() % 0x5200);
            break;
        case 4: /* emoji, some with ZWJ and variation selectors */
            for (uint32_t i = 0; i < n / 2 + 1; i++) {
                put_cp(&p, 0x1F300 + rnd() % 0x700);
                if (rnd() % 3 == 0)
                    put_cp(&p, rnd() % 2 ? 0x200D : 0xFE0F);
            }
            break;
        case 5: /* combining marks after a base letter, or on their own */
            if (rnd() % 2)
                *p++ = (char)('a' + rnd() % 26);
            for (uint32_t i = 0; i < n % 4 + 1; i++)
                put_cp(&p, 0x0300 + rnd() % 0x70);
            break;
        case 6: /* Hangul syllables and conjoining jamo */
            for (uint32_t i = 0; i < n; i++)
                put_cp(&p, rnd() % 2 ? 0xAC00 + rnd() % 11172 : 0x1100 + rnd() % 0x100);
            break;
        case 7: /* ASCII punctuation */
            for (uint32_t i = 0; i < n; i++)
                *p++ = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"[rnd() % 32];
            break;
        case 8: { /* a word, keyword or added token */
            const char *w = words[rnd() % (sizeof words / sizeof words[0])];
            memcpy(p, w, strlen(w));
            p += strlen(w);
            if (w[0] == '<')
                *p++ = ' ';
            break;
        }
        case 9: /* any scalar value of the BMP except surrogates and NUL */
            for (uint32_t i = 0; i < n; i++) {
                uint32_t cp = 1 + rnd() % 0xFFFF;
                if (cp >= 0xD800 && cp < 0xE000)
                    cp = 0xE000;
                put_cp(&p, cp);
            }
            break;
        case 10: /* astral planes */
            put_cp(&p, 0x10000 + rnd() % 0x100000);
            break;
        case 11: /* Latin-1 and Latin Extended, Greek, Cyrillic, Arabic */
            for (uint32_t i = 0; i < n; i++)
                put_cp(&p, (uint32_t[]){0xA0, 0x100, 0x391, 0x410, 0x627}[rnd() % 5] + rnd() % 0x60);
            break;
        case 12: /* control characters */
            *p++ = (char)(1 + rnd() % 31);
            break;
        default: /* a space then letters: the common " word" piece */
            *p++ = ' ';
            for (uint32_t i = 0; i < n; i++)
                *p++ = (char)('a' + rnd() % 26);
        }
    }
    *p = 0;
    return (size_t)(p - buf);
}

static void roundtrip(const struct tokenizer *t, const char *s, size_t n, uint64_t seed)
{
    struct tok_ids v = {0};
    struct rl_err err = {0};
    assert_int_equal(tok_encode(t, s, n, 0, &v, &err), 0);
    char *out;
    size_t out_len, nl;
    assert_int_equal(tok_decode(t, v.ids, v.n, 0, &out, &out_len, &err), 0);
    char *want = nfc(s, n, &nl);
    if (out_len != nl || memcmp(out, want, nl)) {
        fprintf(stderr, "roundtrip failed (seed %llu): input %zu bytes:\n", (unsigned long long)seed, n);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, "\\x%02x", (uint8_t)s[i]);
        fprintf(stderr, "\n");
        fail();
    }
    free(out);
    free(want);
    tok_ids_free(&v);
}

/* Characters where the NFC fast path must not skip utf8proc. */
static void test_nfc_edges(void **state)
{
    static const char *const cases[] = {
        "e\xcc\x81",             /* e + acute -> U+00E9 */
        "\xea\xb0\x80\xe1\x86\xa8", /* Hangul LV syllable + T jamo -> one syllable */
        "\xe1\x84\x80\xe1\x85\xa1", /* L + V jamo */
        "\xe2\x84\xab",          /* ANGSTROM SIGN -> U+00C5 (singleton) */
        "\xcd\x80",               /* U+0340 -> U+0300 */
        "\xe0\xb3\x86\xe0\xb3\x82", /* Kannada 0CC6 + 0CC2 -> 0CCA (a ccc-0 second) */
        "a\xcc\xa3\xcc\x81x",   /* reordering of marks */
        "\xef\xac\x81",          /* U+FB01 ligature: NFC keeps it */
        "\xe4\xb8\xad\xe6\x96\x87\xef\xbc\x8c\xf0\x9f\x8e\x89", /* CJK, fullwidth comma, emoji */
        "\xf0\xaf\xa0\x80",     /* U+2F800 CJK compatibility -> U+4E3D */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        roundtrip(qwen3, cases[i], strlen(cases[i]), i);
        roundtrip(tiny, cases[i], strlen(cases[i]), i);
    }
}

static void test_roundtrip_random(void **state)
{
    static char buf[4096];
    for (uint64_t seed = 1; seed <= 400; seed++) {
        rng_state = seed;
        size_t n = random_text(buf, 80 + rnd() % 2000);
        roundtrip(qwen3, buf, n, seed);
        roundtrip(tiny, buf, n, seed);
    }
}

/* Invalid UTF-8 is replaced by U+FFFD per maximal subpart before encoding;
 * the encoder never fails on bytes. */
static void test_invalid_utf8(void **state)
{
    static const struct {
        const char *in, *fixed;
    } cases[] = {
        {"a\xff" "b", "a\xEF\xBF\xBD" "b"},
        {"\xe4\xb8", "\xEF\xBF\xBD"},                        /* truncated at the end */
        {"\xe4\xb8" "x", "\xEF\xBF\xBD" "x"},                /* truncated before ASCII */
        {"\xed\xa0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* surrogate: 3 subparts */
        {"\xc0\xaf", "\xEF\xBF\xBD\xEF\xBF\xBD"},            /* overlong */
        {"\xf4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"ok\xf0\x9f\x98", "ok\xEF\xBF\xBD"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct tok_ids a = {0}, b = {0};
        assert_int_equal(tok_encode(qwen3, cases[i].in, strlen(cases[i].in), 0, &a, NULL), 0);
        assert_int_equal(tok_encode(qwen3, cases[i].fixed, strlen(cases[i].fixed), 0, &b, NULL), 0);
        assert_int_equal(a.n, b.n);
        assert_memory_equal(a.ids, b.ids, a.n * sizeof a.ids[0]);
        size_t n;
        char *s = tok_utf8_sanitize(cases[i].in, strlen(cases[i].in), &n);
        assert_string_equal(s, cases[i].fixed);
        free(s);
        tok_ids_free(&a);
        tok_ids_free(&b);
    }
    /* NUL is a character like any other */
    struct tok_ids v = {0};
    assert_int_equal(tok_encode(qwen3, "a\0b", 3, 0, &v, NULL), 0);
    char *out;
    size_t len;
    assert_int_equal(tok_decode(qwen3, v.ids, v.n, 0, &out, &len, NULL), 0);
    assert_int_equal(len, 3);
    assert_memory_equal(out, "a\0b", 3);
    free(out);
    tok_ids_free(&v);
}

static void test_decode_errors_and_skip(void **state)
{
    struct rl_err err = {0};
    char *out = NULL;
    size_t len;
    int32_t bad[] = {9707, 151669};
    assert_int_equal(tok_decode(qwen3, bad, 2, 0, &out, &len, &err), -RL_EINVAL);
    assert_int_equal(err.code, RL_EINVAL);
    assert_non_null(strstr(err.msg, "151669"));
    assert_null(out);
    int32_t neg[] = {-1};
    assert_int_equal(tok_decode(qwen3, neg, 1, 0, &out, &len, &err), -RL_EINVAL);

    int32_t ids[] = {151644, 872, 198, 151667, 151668, 9707, 151645};
    assert_int_equal(tok_decode(qwen3, ids, 7, 0, &out, &len, &err), 0);
    assert_string_equal(out, "<|im_start|>user\n<think></think>Hello<|im_end|>");
    free(out);
    assert_int_equal(tok_decode(qwen3, ids, 7, TOK_DECODE_SKIP_SPECIAL, &out, &len, &err), 0);
    assert_string_equal(out, "user\n<think></think>Hello");
    free(out);

    /* a lone continuation byte token decodes to U+FFFD, as HF's errors=replace */
    int32_t half[] = {11162}; /* " \xf0\x9f", the start of an emoji */
    assert_int_equal(tok_decode(qwen3, half, 1, 0, &out, &len, &err), 0);
    assert_string_equal(out, " \xEF\xBF\xBD");
    free(out);
}

static int valid_utf8(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0)
            return 0;
        i += (size_t)k;
    }
    return 1;
}

static void stream_check(const struct tokenizer *t, const int32_t *ids, size_t n, unsigned flags)
{
    struct tok_stream *s;
    struct rl_err err = {0};
    assert_int_equal(tok_stream_create(&s, t, flags, &err), 0);
    char *acc = malloc(n * 64 + 16);
    size_t acc_n = 0;
    for (size_t i = 0; i < n; i++) {
        const char *chunk;
        size_t len;
        assert_int_equal(tok_stream_push(s, ids[i], &chunk, &len, &err), 0);
        assert_true(valid_utf8(chunk, len));
        memcpy(acc + acc_n, chunk, len);
        acc_n += len;
    }
    const char *chunk;
    size_t len;
    assert_int_equal(tok_stream_finish(s, &chunk, &len, &err), 0);
    assert_true(valid_utf8(chunk, len));
    memcpy(acc + acc_n, chunk, len);
    acc_n += len;
    char *whole;
    size_t whole_n;
    assert_int_equal(tok_decode(t, ids, n, flags, &whole, &whole_n, &err), 0);
    assert_int_equal(acc_n, whole_n);
    assert_memory_equal(acc, whole, whole_n);
    free(whole);
    free(acc);
    tok_stream_free(s);
}

static void test_stream_decoder(void **state)
{
    /* ids of real text, including emoji split over byte tokens */
    const char *text = "emoji 🎉🎉 中文分词测试 <think>ok</think> 🤖 naïve<|im_end|>";
    struct tok_ids v = {0};
    assert_int_equal(tok_encode(qwen3, text, strlen(text), 0, &v, NULL), 0);
    stream_check(qwen3, v.ids, v.n, 0);
    stream_check(qwen3, v.ids, v.n, TOK_DECODE_SKIP_SPECIAL);
    tok_ids_free(&v);

    /* random ids: byte tokens make broken sequences, which must come out as
     * U+FFFD at the same places as in the whole decode */
    int32_t ids[64];
    for (uint64_t seed = 1; seed <= 300; seed++) {
        rng_state = seed;
        size_t n = 1 + rnd() % 64;
        for (size_t i = 0; i < n; i++) {
            uint32_t r = rnd() % 4;
            ids[i] = r == 0 ? (int32_t)(rnd() % 256)
                   : r == 1 ? 151643 + (int32_t)(rnd() % 26)
                            : (int32_t)(rnd() % 151643);
        }
        stream_check(qwen3, ids, n, seed % 2 ? TOK_DECODE_SKIP_SPECIAL : 0);
    }

    /* bad id: error, stream state unchanged */
    struct tok_stream *s;
    struct rl_err err = {0};
    const char *chunk;
    size_t len;
    assert_int_equal(tok_stream_create(&s, qwen3, 0, &err), 0);
    assert_int_equal(tok_stream_push(s, 11162, &chunk, &len, &err), 0); /* " " f0 9f */
    assert_int_equal(len, 1);
    assert_int_equal(tok_stream_push(s, 999999, &chunk, &len, &err), -RL_EINVAL);
    assert_int_equal(tok_stream_push(s, 236, &chunk, &len, &err), 0);   /* 8e */
    assert_int_equal(len, 0);
    assert_int_equal(tok_stream_push(s, 231, &chunk, &len, &err), 0);   /* 89 */
    assert_int_equal(len, 4);
    assert_memory_equal(chunk, "🎉", 4);
    tok_stream_free(s);
}

/* ---- synthetic tokenizers ----------------------------------------------- */

/* A byte-level tokenizer.json with every byte token (ids 0..255 in byte
 * order), the given merges, and extra vocab entries; `extra` is spliced into
 * the top-level object. */
static char *synth(const char *merges, const char *vocab_extra, const char *extra)
{
    static char buf[65536];
    char *p = buf;
    p += sprintf(p, "{\"model\":{\"type\":\"BPE\",\"vocab\":{");
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        int cp = printable ? b : 256 + n++;
        char u[8] = {0};
        utf8proc_encode_char(cp, (utf8proc_uint8_t *)u);
        if (cp == '"' || cp == '\\')
            p += sprintf(p, "\"\\%s\":%d,", u, b);
        else
            p += sprintf(p, "\"%s\":%d,", u, b);
    }
    if (!vocab_extra[0])
        p--; /* drop the trailing comma */
    p += sprintf(p, "%s}, \"merges\":[%s]}%s%s}", vocab_extra, merges, extra[0] ? "," : "", extra);
    return buf;
}

static const char split_pre[] =
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
    "\"pattern\":{\"Regex\":\" ?\\\\p{L}+|\\\\s+|.\"},\"behavior\":\"Isolated\"},"
    "{\"type\":\"ByteLevel\",\"use_regex\":false}]}";

static void encode_expect(const struct tokenizer *t, const char *text, const int32_t *want, size_t n)
{
    struct tok_ids v = {0};
    assert_int_equal(tok_encode(t, text, strlen(text), 0, &v, NULL), 0);
    if (v.n != n || memcmp(v.ids, want, n * sizeof *want)) {
        fprintf(stderr, "encode \"%s\":", text);
        for (size_t i = 0; i < v.n; i++)
            fprintf(stderr, " %d", v.ids[i]);
        fprintf(stderr, "\n");
        fail();
    }
    tok_ids_free(&v);
}

static void test_merge_order(void **state)
{
    struct tokenizer *t;
    struct rl_err err = {0};
    /* ranks: "b c" first, then "a b", then "a bc": "abc" must become a+bc
     * then abc; "abab" (no "ab ab") stays ab,ab; ties go left first */
    const char *js = synth("[\"b\",\"c\"],[\"a\",\"b\"],\"a bc\",[\"x\",\"x\"]",
                           "\"bc\":256,\"ab\":257,\"abc\":258,\"xx\":259", split_pre);
    assert_int_equal(tok_load_json(&t, js, strlen(js), NULL, 0, "synth", &err), 0);
    encode_expect(t, "abc", (int32_t[]){258}, 1);
    encode_expect(t, "abab", (int32_t[]){257, 257}, 2);
    encode_expect(t, "abbc", (int32_t[]){257, 256}, 2);
    encode_expect(t, "xxx", (int32_t[]){259, 'x'}, 2); /* leftmost pair wins the tie */
    encode_expect(t, "xxxxx", (int32_t[]){259, 259, 'x'}, 3);
    /* the split keeps " abc" one piece: byte 0x20 is id 32 */
    encode_expect(t, "ab abc", (int32_t[]){257, 32, 258}, 3);
    tok_free(t);
}

static void test_added_token_flags(void **state)
{
    struct tokenizer *t;
    struct rl_err err = {0};
    const char *extra =
        "\"added_tokens\":["
        "{\"id\":300,\"content\":\"<L>\",\"lstrip\":true,\"special\":true},"
        "{\"id\":301,\"content\":\"<R>\",\"rstrip\":true,\"special\":true},"
        "{\"id\":302,\"content\":\"<RR>\",\"special\":false,\"normalized\":false},"
        "{\"id\":303,\"content\":\"<R\",\"special\":true},"
        "{\"id\":304,\"content\":\"w\",\"single_word\":true,\"special\":false},"
        "{\"id\":305,\"content\":\"ÅX\",\"normalized\":true,\"special\":false}],";
    char full[4096];
    snprintf(full, sizeof full, "%s\"normalizer\":{\"type\":\"NFC\"},%s", extra, split_pre);
    const char *js = synth("", "", full);
    assert_int_equal(tok_load_json(&t, js, strlen(js), NULL, 0, "synth", &err), 0);
    encode_expect(t, "a  <L>b", (int32_t[]){'a', 300, 'b'}, 3);        /* lstrip eats both spaces */
    encode_expect(t, "a <R>  b", (int32_t[]){'a', ' ', 301, 'b'}, 4);   /* rstrip eats the right */
    encode_expect(t, "<RR>", (int32_t[]){302}, 1);                      /* longest wins */
    /* normalized=true tokens are matched only after the raw ones, as HF
     * does: <R (raw) beats w (normalized) at no overlap, but here "<R" is
     * found inside "<Rw" before the normalized pass sees "w" */
    encode_expect(t, "<Rw", (int32_t[]){303, 304}, 2);
    encode_expect(t, "<Rx", (int32_t[]){303, 'x'}, 2);
    encode_expect(t, "w aw w", (int32_t[]){304, ' ', 'a', 'w', ' ', 304}, 6);
    /* normalized token matched after NFC: A + U+030A composes to U+00C5 */
    encode_expect(t, "A\xcc\x8aX", (int32_t[]){305}, 1);
    /* without special parsing <L> and <R> are text; <RR> (special=false) stays */
    struct tok_ids v = {0};
    assert_int_equal(tok_encode(t, "<R><RR>", 7, TOK_ENCODE_NO_SPECIAL, &v, NULL), 0);
    int32_t want[] = {'<', 'R', '>', 302};
    assert_int_equal(v.n, 4);
    assert_memory_equal(v.ids, want, sizeof want);
    tok_ids_free(&v);
    tok_free(t);
}

static void test_malformed(void **state)
{
    static const struct {
        const char *merges, *vocab, *extra;
        int code;
        const char *msg;
    } cases[] = {
        {"[\"a\",\"q\"]", "", "", RL_EFORMAT, "merges[0]"},        /* merge result not in vocab */
        {"[\"a\",\"zz\"]", "\"aq\":256", "", RL_EFORMAT, "merges[0]"}, /* part not in vocab */
        {"7", "", "", RL_EFORMAT, "merges[0]"},
        {"\"abc\"", "", "", RL_EFORMAT, "merges[0]"},              /* no space */
        {"", "\"zz\":-1", "", RL_EFORMAT, "vocab[\"zz\"]"},
        {"", "\"zz\":\"3\"", "", RL_EFORMAT, "vocab[\"zz\"]"},
        {"", "\"zz\":1e9", "", RL_EFORMAT, "vocab[\"zz\"]"},
        {"", "\"zz\":5", "", RL_EFORMAT, "id 5 used twice"},
        {"", "\"中\":300", "", RL_EFORMAT, "byte-level alphabet"},
        {"", "\"a\\u0101\":300,\"a\\u0101 \":301", "", RL_EFORMAT, "byte-level"},
        {"", "", "\"added_tokens\":[{\"id\":1,\"content\":\"\"}]", RL_EFORMAT, "content"},
        {"", "", "\"added_tokens\":[{\"content\":\"x\"}]", RL_EFORMAT, "added_tokens[0].id"},
        {"", "", "\"added_tokens\":[{\"id\":400,\"content\":\"x\",\"special\":1}]", RL_EFORMAT, "special"},
        {"", "", "\"added_tokens\":{}", RL_EFORMAT, "added_tokens"},
        {"", "", "\"normalizer\":{\"type\":\"Lowercase\"}", RL_EUNSUPPORTED, "Lowercase"},
        {"", "", "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"}",
         RL_EFORMAT, "regex"},
        {"", "", "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Contiguous\"}",
         RL_EUNSUPPORTED, "Contiguous"},
        {"", "", "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{},\"behavior\":\"Isolated\"}",
         RL_EFORMAT, "pattern"},
        {"", "", "\"pre_tokenizer\":{\"type\":\"Metaspace\"}", RL_EUNSUPPORTED, "Metaspace"},
        {"", "", "\"decoder\":{\"type\":\"WordPiece\"}", RL_EUNSUPPORTED, "decoder"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *js = synth(cases[i].merges, cases[i].vocab[0] ? cases[i].vocab : "\"zz\":999",
                               cases[i].extra);
        struct tokenizer *t = NULL;
        struct rl_err err = {0};
        int rc = tok_load_json(&t, js, strlen(js), NULL, 0, "synth", &err);
        if (rc != -cases[i].code || !strstr(err.msg, cases[i].msg))
            fail_msg("case %zu: rc %d (%s), want %s containing '%s'", i, rc, err.msg,
                     rl_code_name(cases[i].code), cases[i].msg);
        assert_null(t);
    }
    /* whole-file problems */
    static const struct {
        const char *js;
        int code;
    } files[] = {
        {"", RL_EFORMAT},
        {"not json", RL_EFORMAT},
        {"[]", RL_EFORMAT},
        {"{}", RL_EFORMAT},
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", RL_EUNSUPPORTED},
        {"{\"model\":{\"vocab\":[],\"merges\":[]}}", RL_EFORMAT},
        {"{\"model\":{\"vocab\":{},\"merges\":[]}}", RL_EFORMAT},
        {"{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]}}", RL_EFORMAT}, /* no byte tokens */
        {"{\"model\":{\"vocab\":{\"a\":0},\"merges\":{}}}", RL_EFORMAT},
        {"{\"model\":{\"vocab\":{\"a\":0},\"merges\":[],\"byte_fallback\":true}}", RL_EUNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        struct tokenizer *t = NULL;
        struct rl_err err = {0};
        int rc = tok_load_json(&t, files[i].js, strlen(files[i].js), NULL, 0, "f", &err);
        if (rc != -files[i].code)
            fail_msg("file case %zu: rc %d (%s)", i, rc, err.msg);
        assert_true(err.msg[0] != 0);
    }
    struct tokenizer *t = NULL;
    struct rl_err err = {0};
    assert_int_equal(tok_load(&t, "/nonexistent/dir", &err), -RL_ENOTFOUND);
    assert_non_null(strstr(err.msg, "/nonexistent/dir/tokenizer.json"));
}

/* Concurrent encoders on one tokenizer give the single-threaded result. */
struct thr_arg {
    const char *text;
    size_t len;
    const struct tok_ids *want;
    int ok;
};

/* POSIX threads, so that ThreadSanitizer sees them (test_grammar.c) */
static void *thr_main(void *p)
{
    struct thr_arg *a = p;
    a->ok = 1;
    for (int r = 0; r < 20 && a->ok; r++) {
        struct tok_ids v = {0};
        if (tok_encode(qwen3, a->text, a->len, 0, &v, NULL) || v.n != a->want->n ||
            memcmp(v.ids, a->want->ids, v.n * sizeof v.ids[0]))
            a->ok = 0;
        tok_ids_free(&v);
    }
    return NULL;
}

static void test_threads(void **state)
{
    static char buf[32768];
    rng_state = 77;
    size_t n = random_text(buf, sizeof buf);
    struct tok_ids want = {0};
    assert_int_equal(tok_encode(qwen3, buf, n, 0, &want, NULL), 0);
    pthread_t th[4];
    struct thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thr_arg){buf, n, &want, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thr_main, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(args[i].ok);
    }
    tok_ids_free(&want);
}

/* ---- a GGUF model's tokenizer ----
 *
 * The model maker writes the tokenizer into a GGUF file's metadata as
 * llama.cpp's converter does; tok_load of that file must encode exactly as
 * tok_load of the tokenizer.json it came from: on cases.json (both special
 * parsing modes, where the only difference llama.cpp's token types bring,
 * the <|fim_*|> family, does not occur), on the chat template cases, and
 * token for token over the whole id space. */

static char gguf_dir[256];

static struct tokenizer *gguf_tok(const char *tokdir, int vocab, const char *name)
{
    struct mk_opts o;
    struct rl_err err = {0};
    mk_opts_init(&o);
    o.hidden = 256, o.intermediate = 256, o.n_layers = 1, o.n_heads = 2, o.n_kv_heads = 1;
    o.head_dim = 128, o.vocab = vocab, o.dtype = MK_Q8_0;
    char out[512];
    snprintf(out, sizeof out, "%s/%s.gguf", gguf_dir, name);
    o.out_dir = out;
    o.tokenizer_dir = tokdir;
    if (mk_write(&o, NULL, &err))
        fail_msg("mk_write: %s", err.msg);
    struct tokenizer *t;
    if (tok_load(&t, out, &err))
        fail_msg("tok_load %s: %s", out, err.msg);
    assert_true(tok_available(out));
    return t;
}

static void same_ids(const struct tokenizer *a, const struct tokenizer *b, const char *text,
                     size_t len, unsigned flags)
{
    struct tok_ids x = {0}, y = {0};
    assert_int_equal(tok_encode(a, text, len, flags, &x, NULL), 0);
    assert_int_equal(tok_encode(b, text, len, flags, &y, NULL), 0);
    if (x.n != y.n || memcmp(x.ids, y.ids, x.n * sizeof *x.ids))
        fail_msg("\"%.60s\" (flags %u): %zu ids from tokenizer.json, %zu from the GGUF", text, flags,
                 x.n, y.n);
    tok_ids_free(&x);
    tok_ids_free(&y);
}

static void test_gguf_tokenizer(void **state)
{
    assert_int_equal(tu_tmpdir(gguf_dir, sizeof gguf_dir, "test-tok-gguf"), 0);
    struct tokenizer *g = gguf_tok(tu_qwen3_tokenizer_dir(), 151936, "qwen3");
    cJSON *root = load_json("tokenizer/qwen3/cases.json");
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        expect_ids(g, text, strlen(text), 0, cJSON_GetObjectItem(c, "ids"), "gguf ids");
        expect_ids(g, text, strlen(text), TOK_ENCODE_NO_SPECIAL,
                   cJSON_GetObjectItem(c, "ids_no_special_parsing"), "gguf ids_no_special_parsing");
        n++;
    }
    assert_int_equal(n, 20);
    cJSON_Delete(root);
    root = load_json("tokenizer/qwen3/template_cases.json");
    cJSON_ArrayForEach(c, root) {
        const char *r = cJSON_GetObjectItem(c, "rendered")->valuestring;
        same_ids(qwen3, g, r, strlen(r), 0);
        same_ids(qwen3, g, r, strlen(r), TOK_ENCODE_NO_SPECIAL);
        n++;
    }
    cJSON_Delete(root);
    /* the whole id space: same bytes; same special flags except the
     * tokens llama.cpp's converter marks CONTROL because they look like
     * control tokens (<|fim_prefix|> ... <|file_sep|>, special=false in
     * tokenizer.json) */
    assert_int_equal(tok_n_ids(g), tok_n_ids(qwen3));
    int differ = 0;
    for (int32_t id = 0; id < tok_n_ids(qwen3); id++) {
        size_t la, lb;
        const char *a = tok_token_bytes(qwen3, id, &la), *b = tok_token_bytes(g, id, &lb);
        if (!a != !b || (a && (la != lb || memcmp(a, b, la))))
            fail_msg("id %d: token bytes differ", id);
        if (tok_is_special(qwen3, id) != tok_is_special(g, id)) {
            differ++;
            if (!a || la < 4 || memcmp(a, "<|", 2) || memcmp(a + la - 2, "|>", 2))
                fail_msg("id %d (%.*s): special flag differs", id, (int)la, a ? a : "");
        }
    }
    assert_int_equal(differ, 6); /* fim_prefix/middle/suffix/pad, repo_name, file_sep */
    assert_int_equal(tok_eos_id(g), tok_eos_id(qwen3));
    assert_int_equal(tok_pad_id(g), tok_pad_id(qwen3));
    tok_free(g);
    /* the tiny model's tokenizer, on its reference prompts */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/tiny-qwen3-a", tu_data_dir());
    g = gguf_tok(dir, 768, "tiny");
    root = load_json("models/tiny-qwen3-a/reference.json");
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "prompts")) {
        const cJSON *text = cJSON_GetObjectItem(c, "text");
        if (cJSON_IsString(text))
            same_ids(tiny, g, text->valuestring, strlen(text->valuestring), 0);
    }
    cJSON_Delete(root);
    tok_free(g);
}

/* A GGUF whose tokenizer is not one we read says which field and value. */
static void test_gguf_tokenizer_refused(void **state)
{
    static const struct {
        const char *model, *pre, *needle;
    } cases[] = {
        {"llama", "default", "tokenizer.ggml.model \"llama\" is not supported"},
        {"gpt2", "llama-bpe", "tokenizer.ggml.pre \"llama-bpe\" is not supported"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct gguf_writer *w;
        struct rl_err err = {0};
        char path[512];
        snprintf(path, sizeof path, "%s/refused%zu.gguf", gguf_dir, i);
        assert_int_equal(gguf_writer_create(&w, &err), 0);
        gguf_writer_str(w, "tokenizer.ggml.model", cases[i].model, strlen(cases[i].model));
        gguf_writer_str(w, "tokenizer.ggml.pre", cases[i].pre, strlen(cases[i].pre));
        const char *toks[1] = {"a"};
        gguf_writer_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 1);
        gguf_writer_arr_str(w, "tokenizer.ggml.merges", toks, NULL, 0);
        assert_int_equal(gguf_writer_write(w, path, &err), 0);
        gguf_writer_free(w);
        struct tokenizer *t;
        assert_int_equal(tok_load(&t, path, &err), -RL_EUNSUPPORTED);
        if (!strstr(err.msg, cases[i].needle) || !strstr(err.msg, path))
            fail_msg("\"%s\" lacks \"%s\" or the file", err.msg, cases[i].needle);
    }
    assert_int_equal(tu_rmtree(gguf_dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_cases),
        cmocka_unit_test(test_gguf_tokenizer),
        cmocka_unit_test(test_gguf_tokenizer_refused),
        cmocka_unit_test(test_tiny_reference),
        cmocka_unit_test(test_special_ids),
        cmocka_unit_test(test_nfc_edges),
        cmocka_unit_test(test_roundtrip_random),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_decode_errors_and_skip),
        cmocka_unit_test(test_stream_decoder),
        cmocka_unit_test(test_merge_order),
        cmocka_unit_test(test_added_token_flags),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
