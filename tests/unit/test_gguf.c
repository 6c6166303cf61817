/* tests/unit/test_gguf.c - the GGUF reader and writer (engine/gguf.c).
 *
 * Writer -> reader round trips for every metadata type and every tensor
 * type redlm reads; a table of malformed images built byte by byte here
 * (independently of the writer), each refused with the right code and a
 * message naming the file and the key or tensor (and its type); every
 * truncation of a good file refused; the getters' type errors; and
 * gguf_locate on files and directories. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "test_util.h"

/* ---- a byte builder for hand-made images ---- */

struct img {
    uint8_t b[8192];
    size_t n;
};

static void put(struct img *m, const void *p, size_t n)
{
    assert_true(m->n + n <= sizeof m->b);
    memcpy(m->b + m->n, p, n);
    m->n += n;
}
static void u32(struct img *m, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        m->b[m->n++] = (uint8_t)(v >> (8 * i));
}
static void u64(struct img *m, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        m->b[m->n++] = (uint8_t)(v >> (8 * i));
}
static void str(struct img *m, const char *s)
{
    u64(m, strlen(s));
    put(m, s, strlen(s));
}
static void head(struct img *m, uint32_t version, uint64_t n_t, uint64_t n_kv)
{
    m->n = 0;
    put(m, "GGUF", 4);
    u32(m, version);
    u64(m, n_t);
    u64(m, n_kv);
}
static void kv_u32(struct img *m, const char *k, uint32_t v)
{
    str(m, k);
    u32(m, GGUF_VT_UINT32);
    u32(m, v);
}
static void tinfo(struct img *m, const char *name, int nd, const uint64_t *ne, uint32_t type,
                  uint64_t off)
{
    str(m, name);
    u32(m, (uint32_t)nd);
    for (int i = 0; i < nd; i++)
        u64(m, ne[i]);
    u32(m, type);
    u64(m, off);
}
static void pad_data(struct img *m, size_t align, size_t data)
{
    while (m->n % align)
        m->b[m->n++] = 0;
    for (size_t i = 0; i < data; i++)
        m->b[m->n++] = (uint8_t)i;
}

typedef void (*build_fn)(struct img *m);

static void b_short(struct img *m) { m->n = 0; put(m, "GGUF", 4); u32(m, 3); }
static void b_magic(struct img *m) { head(m, 3, 0, 0); m->b[0] = 'X'; }
static void b_version(struct img *m) { head(m, 2, 0, 0); }
static void b_counts(struct img *m) { head(m, 3, 1ull << 40, 0); }
static void b_key_past(struct img *m) { head(m, 3, 0, 1); u64(m, 1000); put(m, "abc", 3); }
static void b_key_empty(struct img *m) { head(m, 3, 0, 1); str(m, ""); u32(m, 4); u32(m, 1); }
static void b_key_nul(struct img *m) { head(m, 3, 0, 1); u64(m, 3); put(m, "a\0b", 3); u32(m, 4); u32(m, 1); }
static void b_vtype(struct img *m) { head(m, 3, 0, 1); str(m, "general.x"); u32(m, 13); u32(m, 0); }
static void b_val_past(struct img *m) { head(m, 3, 0, 1); str(m, "general.x"); u32(m, GGUF_VT_UINT64); u32(m, 1); }
static void b_str_past(struct img *m) { head(m, 3, 0, 1); str(m, "general.name"); u32(m, GGUF_VT_STRING); u64(m, 99); put(m, "ab", 2); }
static void b_nested(struct img *m)
{
    head(m, 3, 0, 1);
    str(m, "tokenizer.ggml.merges");
    u32(m, GGUF_VT_ARRAY);
    u32(m, GGUF_VT_ARRAY);
    u64(m, 1);
}
static void b_atype(struct img *m)
{
    head(m, 3, 0, 1);
    str(m, "tokenizer.ggml.token_type");
    u32(m, GGUF_VT_ARRAY);
    u32(m, 77);
    u64(m, 0);
}
static void b_arr_past(struct img *m)
{
    head(m, 3, 0, 1);
    str(m, "tokenizer.ggml.token_type");
    u32(m, GGUF_VT_ARRAY);
    u32(m, GGUF_VT_INT32);
    u64(m, 1000000);
    u32(m, 1);
}
static void b_strs_past(struct img *m)
{
    head(m, 3, 0, 1);
    str(m, "tokenizer.ggml.tokens");
    u32(m, GGUF_VT_ARRAY);
    u32(m, GGUF_VT_STRING);
    u64(m, 3);
    str(m, "a");
    str(m, "b");
    u64(m, 50);
}
static void b_dup_key(struct img *m)
{
    head(m, 3, 0, 2);
    kv_u32(m, "qwen3.block_count", 1);
    kv_u32(m, "qwen3.block_count", 2);
}
static void b_align_type(struct img *m)
{
    head(m, 3, 0, 1);
    str(m, "general.alignment");
    u32(m, GGUF_VT_UINT64);
    u64(m, 32);
}
static void b_align_pow2(struct img *m) { head(m, 3, 0, 1); kv_u32(m, "general.alignment", 48); }
static const uint64_t NE_V[1] = {64};
static const uint64_t NE_M[2] = {256, 2};
static void b_name_past(struct img *m) { head(m, 3, 1, 0); u64(m, 64); put(m, "blk", 3); }
static void b_ndims(struct img *m) { head(m, 3, 1, 0); tinfo(m, "blk.0.attn_q.weight", 5, (uint64_t[5]){1, 1, 1, 1, 1}, 0, 0); pad_data(m, 32, 4); }
static void b_dim_absurd(struct img *m) { head(m, 3, 1, 0); tinfo(m, "blk.0.attn_q.weight", 2, (uint64_t[2]){1ull << 50, 1}, 0, 0); pad_data(m, 32, 4); }
static void b_ggml_type(struct img *m) { head(m, 3, 1, 0); tinfo(m, "blk.0.attn_q.weight", 1, NE_V, 4, 0); pad_data(m, 32, 256); }
static void b_misaligned(struct img *m)
{
    head(m, 3, 1, 0);
    tinfo(m, "output_norm.weight", 1, NE_V, GGUF_T_F32, 8);
    pad_data(m, 32, 512);
}
static void b_off_beyond(struct img *m)
{
    head(m, 3, 1, 0);
    tinfo(m, "output_norm.weight", 1, NE_V, GGUF_T_F32, 4096);
    pad_data(m, 32, 256);
}
static void b_blocks(struct img *m)
{
    head(m, 3, 1, 0);
    tinfo(m, "blk.0.ffn_up.weight", 2, (uint64_t[2]){100, 2}, GGUF_T_Q4_K, 0);
    pad_data(m, 32, 512);
}
static void b_size_past(struct img *m)
{
    head(m, 3, 1, 0);
    tinfo(m, "blk.0.ffn_up.weight", 2, NE_M, GGUF_T_Q6_K, 0); /* 2 x 210 bytes */
    pad_data(m, 32, 300);
}
static void b_overlap(struct img *m)
{
    head(m, 3, 2, 0);
    tinfo(m, "a.weight", 1, NE_V, GGUF_T_F32, 0);   /* 256 bytes */
    tinfo(m, "b.weight", 1, NE_V, GGUF_T_F32, 128);
    pad_data(m, 32, 512);
}
static void b_dup_tensor(struct img *m)
{
    head(m, 3, 2, 0);
    tinfo(m, "a.weight", 1, NE_V, GGUF_T_F32, 0);
    tinfo(m, "a.weight", 1, NE_V, GGUF_T_F32, 256);
    pad_data(m, 32, 512);
}
static void b_no_data(struct img *m)
{
    head(m, 3, 1, 0);
    tinfo(m, "ab.weight", 1, NE_V, GGUF_T_F32, 0); /* header of 65 bytes: the data
                                                    * section would start at 96 */
}

static void test_malformed(void **state)
{
    (void)state;
    static const struct {
        const char *what;
        build_fn build;
        int code;
        const char *needle1, *needle2;
    } cases[] = {
        {"short", b_short, RL_EFORMAT, "shorter than the GGUF header", NULL},
        {"magic", b_magic, RL_EFORMAT, "no \"GGUF\" magic", NULL},
        {"version", b_version, RL_EUNSUPPORTED, "GGUF version 2", "version 3"},
        {"counts", b_counts, RL_EFORMAT, "1099511627776 tensors", NULL},
        {"key past end", b_key_past, RL_EFORMAT, "metadata entry 0", "past the end"},
        {"empty key", b_key_empty, RL_EFORMAT, "metadata entry 0", "empty"},
        {"key with NUL", b_key_nul, RL_EFORMAT, "metadata entry 0", "NUL"},
        {"value type", b_vtype, RL_EFORMAT, "\"general.x\"", "unknown value type 13"},
        {"value past end", b_val_past, RL_EFORMAT, "\"general.x\"", "past the end"},
        {"string past end", b_str_past, RL_EFORMAT, "\"general.name\"", "past the end"},
        {"nested array", b_nested, RL_EFORMAT, "\"tokenizer.ggml.merges\"", "arrays of arrays"},
        {"array type", b_atype, RL_EFORMAT, "\"tokenizer.ggml.token_type\"", "element type 77"},
        {"array past end", b_arr_past, RL_EFORMAT, "\"tokenizer.ggml.token_type\"", "1000000 elements"},
        {"strings past end", b_strs_past, RL_EFORMAT, "\"tokenizer.ggml.tokens\"", "string 2"},
        {"duplicate key", b_dup_key, RL_EFORMAT, "\"qwen3.block_count\"", "twice"},
        {"alignment type", b_align_type, RL_EFORMAT, "general.alignment", "uint64, not uint32"},
        {"alignment", b_align_pow2, RL_EFORMAT, "general.alignment", "48"},
        {"name past end", b_name_past, RL_EFORMAT, "tensor 0", "name"},
        {"dims", b_ndims, RL_EFORMAT, "\"blk.0.attn_q.weight\"", "5 dims"},
        {"absurd dim", b_dim_absurd, RL_EFORMAT, "\"blk.0.attn_q.weight\"", "absurd"},
        {"ggml type", b_ggml_type, RL_EFORMAT, "\"blk.0.attn_q.weight\"", "unknown ggml type 4"},
        {"misaligned", b_misaligned, RL_EFORMAT, "\"output_norm.weight\" (F32)", "not a multiple of the alignment"},
        {"offset", b_off_beyond, RL_EFORMAT, "\"output_norm.weight\" (F32)", "beyond the data section"},
        {"blocks", b_blocks, RL_EFORMAT, "\"blk.0.ffn_up.weight\" (Q4_K)", "not a multiple of the block (256)"},
        {"size", b_size_past, RL_EFORMAT, "\"blk.0.ffn_up.weight\" (Q6_K)", "run past the data section"},
        {"overlap", b_overlap, RL_EFORMAT, "\"b.weight\" overlaps tensor \"a.weight\"", NULL},
        {"duplicate tensor", b_dup_tensor, RL_EFORMAT, "\"a.weight\" is named twice", NULL},
        {"no data", b_no_data, RL_EFORMAT, "data section", "beyond the end of the file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        static struct img m;
        cases[i].build(&m);
        struct gguf_file *f = (struct gguf_file *)1;
        struct rl_err err = {0};
        int rc = gguf_parse_buffer(&f, m.b, m.n, "bad.gguf", &err);
        if (rc != -cases[i].code)
            fail_msg("%s: rc %d (%s), want %d", cases[i].what, rc, err.msg, -cases[i].code);
        assert_null(f);
        if (!strstr(err.msg, "bad.gguf") || !strstr(err.msg, cases[i].needle1) ||
            (cases[i].needle2 && !strstr(err.msg, cases[i].needle2)))
            fail_msg("%s: \"%s\" lacks the file, \"%s\" or \"%s\"", cases[i].what, err.msg,
                     cases[i].needle1, cases[i].needle2 ? cases[i].needle2 : "");
    }
}

/* A hand-made image the reader accepts: an unsized (unsupported) type is
 * parsed, named, and left for the loader to refuse. */
static void test_hand_made(void **state)
{
    (void)state;
    static struct img m;
    head(&m, 3, 2, 2);
    kv_u32(&m, "general.alignment", 64);
    str(&m, "general.name");
    u32(&m, GGUF_VT_STRING);
    str(&m, "tiny");
    tinfo(&m, "a.weight", 1, NE_V, GGUF_T_F32, 0);
    tinfo(&m, "q.weight", 2, (uint64_t[2]){32, 2}, 16 /* IQ2_XXS */, 256);
    pad_data(&m, 64, 512);
    struct gguf_file *f;
    struct rl_err err = {0};
    if (gguf_parse_buffer(&f, m.b, m.n, "ok.gguf", &err))
        fail_msg("%s", err.msg);
    const struct gguf_tensor *a = gguf_find_tensor(f, "a.weight"), *q = gguf_find_tensor(f, "q.weight");
    assert_non_null(a);
    assert_non_null(q);
    assert_int_equal(a->n_bytes, 256);
    assert_int_equal(((const uint8_t *)a->data - m.b) % 64, 0);
    assert_int_equal(((const uint8_t *)a->data)[1], 1);
    assert_int_equal(q->n_bytes, 0); /* not sized: not a type redlm reads */
    char tb[16];
    assert_string_equal(gguf_type_name(q->type, tb), "IQ2_XXS");
    assert_string_equal(gguf_type_name(4, tb), "type 4");
    const char *s;
    size_t n;
    assert_int_equal(gguf_get_str(f, "general.name", &s, &n, &err), 0);
    assert_int_equal(n, 4);
    assert_memory_equal(s, "tiny", 4);
    gguf_close(f);
}

/* ---- writer -> reader ---- */

static char tmp[256];

static int setup(void **state)
{
    (void)state;
    return tu_tmpdir(tmp, sizeof tmp, "test-gguf");
}

static int teardown(void **state)
{
    (void)state;
    return tu_rmtree(tmp);
}

struct fill_ctx {
    uint64_t next;
    uint8_t seed;
};

static int fill(void *ctx, uint64_t off, void *buf, size_t n, struct rl_err *err)
{
    struct fill_ctx *c = ctx;
    if (off != c->next)
        return rl_errf(err, RL_EINTERNAL, "out of order");
    for (size_t i = 0; i < n; i++)
        ((uint8_t *)buf)[i] = (uint8_t)(c->seed + off + i);
    c->next = off + n;
    return 0;
}

static void write_sample(const char *path)
{
    struct gguf_writer *w;
    struct rl_err err = {0};
    assert_int_equal(gguf_writer_create(&w, &err), 0);
    gguf_writer_str(w, "general.architecture", "qwen3", 5);
    gguf_writer_u32(w, "qwen3.block_count", 28);
    gguf_writer_i32(w, "test.neg", -5);
    gguf_writer_f32(w, "qwen3.rope.freq_base", 1e6f);
    gguf_writer_bool(w, "tokenizer.ggml.add_bos_token", 1);
    const char *toks[4] = {"a", "\xc4\xa0" "b", "<|im_end|>", ""};
    gguf_writer_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 4);
    const int32_t types[4] = {1, 1, 3, 5};
    gguf_writer_arr_i32(w, "tokenizer.ggml.token_type", types, 4);
    static float f32[3 * 64];
    for (int i = 0; i < 3 * 64; i++)
        f32[i] = (float)i;
    static uint8_t q8[2 * 34 * 2], q4[144], q5[176 * 2], q6[210], h[2 * 64];
    memset(q8, 7, sizeof q8);
    memset(q4, 4, sizeof q4);
    memset(q5, 5, sizeof q5);
    memset(q6, 6, sizeof q6);
    memset(h, 9, sizeof h);
    static struct fill_ctx fc = {0, 3};
    fc.next = 0;
    gguf_writer_tensor(w, "f32", GGUF_T_F32, 2, (int64_t[2]){64, 3}, f32, NULL, NULL);
    gguf_writer_tensor(w, "q8", GGUF_T_Q8_0, 2, (int64_t[2]){64, 2}, q8, NULL, NULL);
    gguf_writer_tensor(w, "q4", GGUF_T_Q4_K, 1, (int64_t[1]){256}, q4, NULL, NULL);
    gguf_writer_tensor(w, "q5", GGUF_T_Q5_K, 2, (int64_t[2]){256, 2}, NULL, fill, &fc);
    gguf_writer_tensor(w, "q6", GGUF_T_Q6_K, 1, (int64_t[1]){256}, q6, NULL, NULL);
    gguf_writer_tensor(w, "f16", GGUF_T_F16, 1, (int64_t[1]){64}, h, NULL, NULL);
    gguf_writer_tensor(w, "bf16", GGUF_T_BF16, 1, (int64_t[1]){64}, h, NULL, NULL);
    if (gguf_writer_write(w, path, &err))
        fail_msg("write: %s", err.msg);
    gguf_writer_free(w);
}

static void test_round_trip(void **state)
{
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/rt.gguf", tmp);
    write_sample(path);
    assert_true(gguf_is_gguf(path));
    struct gguf_file *f;
    struct rl_err err = {0};
    if (gguf_open(&f, path, &err))
        fail_msg("open: %s", err.msg);
    int64_t v;
    double d;
    int b;
    const char *s;
    size_t n;
    assert_int_equal(gguf_get_int(f, "qwen3.block_count", &v, &err), 0);
    assert_int_equal(v, 28);
    assert_int_equal(gguf_get_int(f, "test.neg", &v, &err), 0);
    assert_int_equal(v, -5);
    assert_int_equal(gguf_get_float(f, "qwen3.rope.freq_base", &d, &err), 0);
    assert_true(d == 1e6);
    assert_int_equal(gguf_get_float(f, "qwen3.block_count", &d, &err), 0); /* ints are numbers */
    assert_true(d == 28);
    assert_int_equal(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b, &err), 0);
    assert_int_equal(b, 1);
    assert_int_equal(gguf_get_str(f, "general.architecture", &s, &n, &err), 0);
    assert_int_equal(n, 5);
    enum gguf_vtype vt;
    uint64_t an;
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.tokens", &vt, &an, &err), 0);
    assert_int_equal(vt, GGUF_VT_STRING);
    assert_int_equal(an, 4);
    assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", 1, &s, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(s, "\xc4\xa0" "b", 3);
    assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", 3, &s, &n, &err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(gguf_arr_int(f, "tokenizer.ggml.token_type", 2, &v, &err), 0);
    assert_int_equal(v, 3);
    /* getters' errors name the file and key */
    assert_int_equal(gguf_get_int(f, "general.architecture", &v, &err), -RL_EFORMAT);
    assert_non_null(strstr(err.msg, "rt.gguf"));
    assert_non_null(strstr(err.msg, "\"general.architecture\" is string, not an integer"));
    assert_int_equal(gguf_get_str(f, "no.such", &s, &n, &err), -RL_ENOTFOUND);
    assert_non_null(strstr(err.msg, "\"no.such\" is missing"));
    assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", 4, &s, &n, &err), -RL_EINVAL);
    assert_int_equal(gguf_arr_int(f, "tokenizer.ggml.tokens", 0, &v, &err), -RL_EFORMAT);
    assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.token_type", 0, &s, &n, &err), -RL_EFORMAT);
    /* tensors */
    static const struct {
        const char *name;
        uint32_t type;
        size_t bytes;
        int n_dims;
        int64_t ne0, ne1;
    } want[] = {
        {"f32", GGUF_T_F32, 3 * 64 * 4, 2, 64, 3}, {"q8", GGUF_T_Q8_0, 4 * 34, 2, 64, 2},
        {"q4", GGUF_T_Q4_K, 144, 1, 256, 1},       {"q5", GGUF_T_Q5_K, 2 * 176, 2, 256, 2},
        {"q6", GGUF_T_Q6_K, 210, 1, 256, 1},       {"f16", GGUF_T_F16, 128, 1, 64, 1},
        {"bf16", GGUF_T_BF16, 128, 1, 64, 1},
    };
    assert_int_equal(gguf_n_tensors(f), 7);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct gguf_tensor *t = gguf_find_tensor(f, want[i].name);
        assert_non_null(t);
        assert_ptr_equal(t, gguf_get_tensor(f, (int)i));
        assert_int_equal(t->type, want[i].type);
        assert_int_equal(t->n_bytes, want[i].bytes);
        assert_int_equal(t->n_dims, want[i].n_dims);
        assert_int_equal(t->ne[0], want[i].ne0);
        assert_int_equal(t->ne[1], want[i].ne1);
        assert_int_equal((uintptr_t)t->data % 32, 0); /* the mapping is page-aligned */
    }
    const struct gguf_tensor *t = gguf_find_tensor(f, "f32");
    assert_true(((const float *)t->data)[191] == 191.0f);
    t = gguf_find_tensor(f, "q5");
    for (size_t i = 0; i < t->n_bytes; i++)
        assert_int_equal(((const uint8_t *)t->data)[i], (uint8_t)(3 + i));
    assert_int_equal(((const uint8_t *)gguf_find_tensor(f, "q6")->data)[209], 6);
    /* used-marks */
    for (int i = 0; i < 6; i++)
        gguf_mark_used(f, gguf_get_tensor(f, i));
    assert_ptr_equal(gguf_first_unused(f), gguf_find_tensor(f, "bf16"));
    gguf_mark_used(f, gguf_find_tensor(f, "bf16"));
    assert_null(gguf_first_unused(f));
    gguf_close(f);
}

/* Every prefix of a good file is refused, never read past. */
static void test_truncations(void **state)
{
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/tr.gguf", tmp);
    write_sample(path);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    static uint8_t buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    assert_true(len > 1000 && len < sizeof buf);
    for (size_t n = 0; n < len; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exactly n bytes, for ASan */
        memcpy(copy, buf, n);
        struct gguf_file *f = NULL;
        struct rl_err err = {0};
        int rc = gguf_parse_buffer(&f, copy, n, "cut.gguf", &err);
        if (!rc)
            fail_msg("a %zu-byte prefix of %zu was accepted", n, len);
        assert_true(err.msg[0] != 0);
        free(copy);
    }
}

static void test_writer_errors(void **state)
{
    (void)state;
    struct gguf_writer *w;
    struct rl_err err = {0};
    char path[300];
    snprintf(path, sizeof path, "%s/bad.gguf", tmp);
    assert_int_equal(gguf_writer_create(&w, &err), 0);
    uint8_t x[256] = {0};
    assert_int_equal(gguf_writer_tensor(w, "t", GGUF_T_Q4_K, 1, (int64_t[1]){100}, x, NULL, NULL),
                     -RL_EINVAL);
    assert_int_equal(gguf_writer_write(w, path, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "\"t\""));
    assert_int_equal(access(path, F_OK), -1);
    gguf_writer_free(w);
    assert_int_equal(gguf_writer_create(&w, &err), 0);
    assert_int_equal(gguf_writer_tensor(w, "q", 16 /* IQ2_XXS */, 1, (int64_t[1]){256}, x, NULL, NULL),
                     -RL_EINVAL);
    gguf_writer_free(w);
}

static void test_locate(void **state)
{
    (void)state;
    char d[300], p[600], out[600];
    struct rl_err err = {0};
    snprintf(d, sizeof d, "%s/loc", tmp);
    mkdir(d, 0755);
    assert_int_equal(gguf_locate(d, out, sizeof out, &err), 0); /* empty */
    snprintf(p, sizeof p, "%s/one.gguf", d);
    write_sample(p);
    assert_int_equal(gguf_locate(d, out, sizeof out, &err), 1);
    assert_string_equal(out, p);
    assert_int_equal(gguf_locate(p, out, sizeof out, &err), 1);
    /* a blob with no extension is found by its magic */
    snprintf(p, sizeof p, "%s/sha256-abcd", tmp);
    write_sample(p);
    assert_int_equal(gguf_locate(p, out, sizeof out, &err), 1);
    snprintf(p, sizeof p, "%s/two.gguf", d);
    write_sample(p);
    assert_int_equal(gguf_locate(d, out, sizeof out, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "several GGUF files"));
    /* a Hugging Face directory is not a GGUF model, whatever lies in it */
    snprintf(p, sizeof p, "%s/config.json", d);
    FILE *f = fopen(p, "w");
    fputs("{}", f);
    fclose(f);
    assert_int_equal(gguf_locate(d, out, sizeof out, &err), 0);
    assert_int_equal(gguf_locate(p, out, sizeof out, &err), 0); /* no magic */
    assert_int_equal(gguf_locate("/no/such", out, sizeof out, &err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed),   cmocka_unit_test(test_hand_made),
        cmocka_unit_test(test_round_trip),  cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_writer_errors), cmocka_unit_test(test_locate),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
