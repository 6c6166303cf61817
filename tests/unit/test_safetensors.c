/* tests/unit/test_safetensors.c - the safetensors reader and writer:
 * writer -> reader round trips for every dtype, a table of malformed headers
 * parsed from memory (each must fail with the right code and a message that
 * names the file and the tensor), truncated files on disk, sharded
 * checkpoints with broken indexes, used-tensor tracking, and the shared
 * tiny-qwen3-a checkpoint. */
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

#include "safetensors.h"
#include "test_util.h"


/* A file image: le64 header length, the header, then data_len bytes. */
static uint8_t *image(const char *hdr, size_t data_len, size_t *len)
{
    size_t h = strlen(hdr);
    *len = 8 + h + data_len;
    uint8_t *b = calloc(1, *len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, hdr, h);
    for (size_t i = 0; i < data_len; i++)
        b[8 + h + i] = (uint8_t)i;
    return b;
}

/* malloc'd (the caller frees it after rm_rf) */
static char *mktemp_dir(void)
{
    char d[256];
    assert_int_equal(tu_tmpdir(d, sizeof d, "test-st"), 0);
    return strdup(d);
}

static void rm_rf(const char *dir)
{
    assert_int_equal(tu_rmtree(dir), 0);
}

static void write_file(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);
}

/* ---- malformed headers from memory ---- */

#define T8 "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]"

static const struct bad_case {
    const char *what;
    const char *hdr;
    size_t data_len;
    int code;
    const char *tensor; /* must appear in the message; NULL = none */
    const char *needle; /* a phrase of the message */
} bad_cases[] = {
    {"not json", "{\"t\":", 0, RL_EFORMAT, NULL, "not valid JSON"},
    {"empty header", "", 0, RL_EFORMAT, NULL, "not valid JSON"},
    {"array root", "[1,2]", 0, RL_EFORMAT, NULL, "not a JSON object"},
    {"trailing garbage", "{}xx", 0, RL_EFORMAT, NULL, "trailing"},
    {"entry not object", "{\"t\":5}", 0, RL_EFORMAT, "t", "not an object"},
    {"missing dtype", "{\"t\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, RL_EFORMAT, "t", "missing key \"dtype\""},
    {"missing shape", "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, RL_EFORMAT, "t", "missing key \"shape\""},
    {"missing offsets", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, RL_EFORMAT, "t", "missing key \"data_offsets\""},
    {"extra key", "{\"t\":{" T8 ",\"x\":1}}", 8, RL_EFORMAT, "t", "unexpected key \"x\""},
    {"key twice", "{\"t\":{" T8 ",\"dtype\":\"F32\"}}", 8, RL_EFORMAT, "t", "appears twice"},
    {"dtype not string", "{\"t\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, RL_EFORMAT, "t", "dtype is not a string"},
    {"dtype unknown", "{\"t\":{\"dtype\":\"F8_E5M2\",\"shape\":[2],\"data_offsets\":[0,2]}}", 8, RL_EUNSUPPORTED, "t", "F8_E5M2"},
    {"shape not array", "{\"t\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, RL_EFORMAT, "t", "shape is not an array"},
    {"shape float", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 8, RL_EFORMAT, "t", "shape[0]"},
    {"shape negative", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,8]}}", 8, RL_EFORMAT, "t", "shape[1]"},
    {"shape string", "{\"t\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, RL_EFORMAT, "t", "shape[0]"},
    {"shape huge", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,8]}}", 8, RL_EFORMAT, "t", "shape[0]"},
    {"too many dims", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8, RL_EFORMAT, "t", "dims"},
    {"count overflow", "{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, RL_EFORMAT, "t", "overflows"},
    {"bytes overflow", "{\"t\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, RL_EFORMAT, "t", "overflows"},
    {"offsets one", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, RL_EFORMAT, "t", "data_offsets"},
    {"offsets three", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", 8, RL_EFORMAT, "t", "data_offsets"},
    {"offsets float", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.5]}}", 8, RL_EFORMAT, "t", "data_offsets"},
    {"offsets negative", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, RL_EFORMAT, "t", "data_offsets"},
    {"begin > end", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, RL_EFORMAT, "t", "begin 8 > end 0"},
    {"end beyond data", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 8, RL_EFORMAT, "t", "beyond the data section"},
    {"length mismatch", "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 16, RL_EFORMAT, "t", "needs 12"},
    {"bf16 mismatch", "{\"t\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,4]}}", 16, RL_EFORMAT, "t", "needs 8"},
    {"overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 16, RL_EFORMAT, "t", "overlaps tensor \"a\""},
    {"overlap nested", "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 16, RL_EFORMAT, "t", "overlaps"},
    {"same range", "{\"a\":{" T8 "},\"t\":{" T8 "}}", 8, RL_EFORMAT, "t", "overlaps"},
    {"duplicate name", "{\"t\":{" T8 "},\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, RL_EFORMAT, "t", "named twice"},
    {"metadata not object", "{\"__metadata__\":[],\"t\":{" T8 "}}", 8, RL_EFORMAT, NULL, "__metadata__"},
    {"metadata value", "{\"__metadata__\":{\"format\":1},\"t\":{" T8 "}}", 8, RL_EFORMAT, NULL, "format"},
    {"metadata twice", "{\"__metadata__\":{},\"__metadata__\":{},\"t\":{" T8 "}}", 8, RL_EFORMAT, NULL, "twice"},
};

static void test_bad_headers(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const struct bad_case *c = &bad_cases[i];
        size_t len;
        uint8_t *b = image(c->hdr, c->data_len, &len);
        struct st_file *f = (struct st_file *)1;
        struct rl_err err = {0};
        int rc = st_parse_buffer(&f, b, len, "mem.safetensors", &err);
        if (rc != -c->code || err.code != c->code || !strstr(err.msg, "mem.safetensors") ||
            !strstr(err.msg, c->needle) ||
            (c->tensor && !strstr(err.msg, c->tensor)))
            fail_msg("case \"%s\": rc %d code %d msg \"%s\"", c->what, rc, err.code, err.msg);
        assert_null(f);
        free(b);
    }
}

static void test_good_header_variants(void **state)
{
    (void)state;
    static const char *const good[] = {
        "{}",
        "{\"__metadata__\":{\"format\":\"pt\"}}",
        "{\"t\":{" T8 "}}   ",
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[8,8]},\"u\":{" T8 "}}",
        "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},\"u\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}",
        /* a zero-length tensor inside another's range shares no byte */
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},\"u\":{" T8 "}}",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        size_t len;
        uint8_t *b = image(good[i], 8, &len);
        struct st_file *f = NULL;
        struct rl_err err = {0};
        if (st_parse_buffer(&f, b, len, "mem", &err))
            fail_msg("good case %zu: %s", i, err.msg);
        st_close(f);
        free(b);
    }
}

static void test_short_and_long(void **state)
{
    (void)state;
    struct st_file *f;
    struct rl_err err = {0};
    uint8_t tiny[5] = {1, 0, 0, 0, 0};
    assert_int_equal(st_parse_buffer(&f, tiny, sizeof tiny, "short.st", &err), -RL_EFORMAT);
    assert_non_null(strstr(err.msg, "short.st"));
    assert_non_null(strstr(err.msg, "shorter than"));

    uint8_t lying[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    assert_int_equal(st_parse_buffer(&f, lying, sizeof lying, "lying.st", &err), -RL_EFORMAT);
    assert_non_null(strstr(err.msg, "lying.st"));
    assert_non_null(strstr(err.msg, "beyond the file"));

    uint8_t huge[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(st_parse_buffer(&f, huge, sizeof huge, "huge.st", &err), -RL_EFORMAT);

    /* a header that fits the file but exceeds the sanity limit */
    size_t n = 8 + 100000001;
    uint8_t *big = calloc(1, n);
    assert_non_null(big);
    uint64_t h = 100000001;
    for (int i = 0; i < 8; i++)
        big[i] = (uint8_t)(h >> (8 * i));
    assert_int_equal(st_parse_buffer(&f, big, n, "big.st", &err), -RL_EFORMAT);
    assert_non_null(strstr(err.msg, "absurdly large"));
    free(big);
}

/* ---- writer -> reader ---- */

static void test_round_trip_all_dtypes(void **state)
{
    (void)state;
    char *dir = mktemp_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);
    struct st_writer *w;
    struct rl_err err = {0};
    assert_int_equal(st_writer_create(&w, &err), 0);
    uint8_t *bufs[ST_N_DTYPES];
    int64_t shape[2] = {3, 5};
    char names[ST_N_DTYPES][32];
    for (int d = 0; d < ST_N_DTYPES; d++) {
        size_t nb = 15 * st_dtype_size((enum st_dtype)d);
        bufs[d] = malloc(nb);
        for (size_t i = 0; i < nb; i++)
            bufs[d][i] = (uint8_t)(i * 7 + (size_t)d * 31);
        snprintf(names[d], sizeof names[d], "w.%s", st_dtype_name((enum st_dtype)d));
        assert_int_equal(st_writer_add(w, names[d], (enum st_dtype)d, 2, shape, bufs[d], &err), 0);
    }
    float scalar = 3.5f;
    assert_int_equal(st_writer_add(w, "scalar", ST_F32, 0, NULL, &scalar, &err), 0);
    int64_t empty_shape[2] = {0, 4};
    assert_int_equal(st_writer_add(w, "empty", ST_BF16, 2, empty_shape, NULL, &err), 0);
    /* adding a name twice is the caller's bug and is refused */
    assert_int_equal(st_writer_add(w, "scalar", ST_F32, 0, NULL, &scalar, &err), -RL_EINVAL);
    assert_int_equal(st_writer_write(w, path, &err), 0);
    st_writer_free(w);

    struct st_file *f;
    if (st_open(&f, path, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(st_n_tensors(f), ST_N_DTYPES + 2);
    for (int d = 0; d < ST_N_DTYPES; d++) {
        const struct st_tensor *t = st_find(f, names[d]);
        assert_non_null(t);
        assert_string_equal(t->name, names[d]);
        assert_int_equal(t->dtype, d);
        assert_int_equal(t->n_dims, 2);
        assert_int_equal(t->shape[0], 3);
        assert_int_equal(t->shape[1], 5);
        assert_int_equal(t->n_bytes, 15 * st_dtype_size((enum st_dtype)d));
        assert_memory_equal(t->data, bufs[d], t->n_bytes);
        assert_string_equal(t->file, path);
        assert_ptr_equal(st_get(f, d), t); /* add order is kept */
        free(bufs[d]);
    }
    const struct st_tensor *s = st_find(f, "scalar");
    assert_non_null(s);
    assert_int_equal(s->n_dims, 0);
    assert_memory_equal(s->data, &scalar, 4);
    const struct st_tensor *e = st_find(f, "empty");
    assert_non_null(e);
    assert_int_equal(e->n_bytes, 0);
    assert_int_equal(e->shape[0], 0);
    assert_null(st_find(f, "nope"));
    assert_null(st_get(f, -1));
    assert_null(st_get(f, 1000));
    st_close(f);

    /* the data section starts 8-byte aligned */
    FILE *fp = fopen(path, "rb");
    uint8_t lb[8];
    assert_int_equal(fread(lb, 1, 8, fp), 8);
    fclose(fp);
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--)
        h = h << 8 | lb[i];
    assert_int_equal(h % 8, 0);
    rm_rf(dir);
    free(dir);
}

struct counter {
    uint64_t next;
    int calls;
};

static int fill_counter(void *ctx, uint64_t off, void *buf, size_t n, struct rl_err *err)
{
    struct counter *c = ctx;
    if (off != c->next)
        return rl_errf(err, RL_EINTERNAL, "out of order");
    for (size_t i = 0; i < n; i++)
        ((uint8_t *)buf)[i] = (uint8_t)((off + i) * 13 >> 3);
    c->next = off + n;
    c->calls++;
    return 0;
}

static int fill_fail(void *ctx, uint64_t off, void *buf, size_t n, struct rl_err *err)
{
    return rl_errf(err, RL_EIO, "generator broke");
}

static void test_writer_fill(void **state)
{
    (void)state;
    char *dir = mktemp_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/fill.safetensors", dir);
    struct st_writer *w;
    struct rl_err err = {0};
    assert_int_equal(st_writer_create(&w, &err), 0);
    int64_t shape[2] = {1024, 5000}; /* 20 MB of F32: crosses the staging buffer */
    struct counter c = {0, 0};
    assert_int_equal(st_writer_add_fill(w, "big", ST_F32, 2, shape, fill_counter, &c, &err), 0);
    assert_int_equal(st_writer_write(w, path, &err), 0);
    st_writer_free(w);
    assert_true(c.calls >= 3);
    struct st_file *f;
    assert_int_equal(st_open(&f, path, &err), 0);
    const struct st_tensor *t = st_find(f, "big");
    assert_non_null(t);
    const uint8_t *p = t->data;
    for (size_t i = 0; i < t->n_bytes; i += 4099)
        assert_int_equal(p[i], (uint8_t)(i * 13 >> 3));
    st_close(f);

    /* a failing generator leaves no file under the real name */
    char path2[512];
    snprintf(path2, sizeof path2, "%s/broken.safetensors", dir);
    assert_int_equal(st_writer_create(&w, &err), 0);
    assert_int_equal(st_writer_add_fill(w, "x", ST_F32, 2, shape, fill_fail, NULL, &err), 0);
    assert_int_equal(st_writer_write(w, path2, &err), -RL_EIO);
    assert_non_null(strstr(err.msg, "\"x\""));
    assert_non_null(strstr(err.msg, "generator broke"));
    st_writer_free(w);
    assert_int_not_equal(access(path2, F_OK), 0);
    rm_rf(dir);
    free(dir);
}

static void write_simple(const char *path, const char *const *names, int n)
{
    struct st_writer *w;
    struct rl_err err = {0};
    static const float v[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    assert_int_equal(st_writer_create(&w, &err), 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(st_writer_add(w, names[i], ST_F32, 1, shape, v, &err), 0);
    if (st_writer_write(w, path, &err))
        fail_msg("%s", err.msg);
    st_writer_free(w);
}

static void test_truncated_file(void **state)
{
    (void)state;
    char *dir = mktemp_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    static const char *const names[] = {"first", "second"};
    write_simple(path, names, 2);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    struct st_file *f;
    struct rl_err err = {0};
    assert_int_equal(truncate(path, st.st_size - 4), 0);
    assert_int_equal(st_open(&f, path, &err), -RL_EFORMAT);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "\"second\""));
    assert_non_null(strstr(err.msg, "beyond the data section"));
    assert_int_equal(truncate(path, 20), 0);
    assert_int_equal(st_open(&f, path, &err), -RL_EFORMAT);
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(truncate(path, 3), 0);
    assert_int_equal(st_open(&f, path, &err), -RL_EFORMAT);
    assert_non_null(strstr(err.msg, "shorter than"));
    assert_int_equal(truncate(path, 0), 0);
    assert_int_equal(st_open(&f, path, &err), -RL_EFORMAT);

    char missing[512];
    snprintf(missing, sizeof missing, "%s/none.safetensors", dir);
    assert_int_equal(st_open(&f, missing, &err), -RL_ENOTFOUND);
    assert_non_null(strstr(err.msg, missing));
    /* a directory with neither index nor model.safetensors */
    assert_int_equal(unlink(path), 0);
    assert_int_equal(st_open(&f, dir, &err), -RL_ENOTFOUND);
    rm_rf(dir);
    free(dir);
}

/* ---- sharded checkpoints ---- */

static void write_index(const char *dir, const char *weight_map)
{
    char path[512], text[2048];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    snprintf(text, sizeof text, "{\"metadata\":{\"total_size\":32},\"weight_map\":{%s}}", weight_map);
    write_file(path, text, strlen(text));
}

static const struct shard_case {
    const char *what;
    const char *map;
    int code;
    const char *needle1, *needle2;
} shard_cases[] = {
    {"ok", "\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\"", 0, NULL, NULL},
    {"missing shard", "\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s3.safetensors\"", RL_EFORMAT, "s3.safetensors", "\"c\""},
    {"tensor not in named shard", "\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\",\"c\":\"s2.safetensors\"", RL_EFORMAT, "\"b\"", "s2.safetensors"},
    {"map names absent tensor", "\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\",\"z\":\"s2.safetensors\"", RL_EFORMAT, "\"z\"", "s2.safetensors"},
    {"tensor not in map", "\"a\":\"s1.safetensors\",\"c\":\"s2.safetensors\"", RL_EFORMAT, "\"b\"", "not in the weight_map"},
    {"listed twice", "\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\",\"a\":\"s1.safetensors\"", RL_EFORMAT, "\"a\"", "twice"},
    {"path in map", "\"a\":\"../s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\"", RL_EFORMAT, "\"a\"", "shard file name"},
    {"value not string", "\"a\":1,\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\"", RL_EFORMAT, "\"a\"", "index.json"},
};

static void test_sharded(void **state)
{
    (void)state;
    char *dir = mktemp_dir();
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s/s1.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/s2.safetensors", dir);
    static const char *const n1[] = {"a", "b"}, *const n2[] = {"c"};
    write_simple(p1, n1, 2);
    write_simple(p2, n2, 1);
    for (size_t i = 0; i < sizeof shard_cases / sizeof shard_cases[0]; i++) {
        const struct shard_case *c = &shard_cases[i];
        write_index(dir, c->map);
        struct st_file *f = NULL;
        struct rl_err err = {0};
        int rc = st_open(&f, dir, &err);
        if (rc != -c->code || (c->code && (!strstr(err.msg, c->needle1) ||
                                           !strstr(err.msg, c->needle2))))
            fail_msg("case \"%s\": rc %d msg \"%s\"", c->what, rc, err.msg);
        if (!c->code) {
            assert_int_equal(st_n_tensors(f), 3);
            const struct st_tensor *t = st_find(f, "c");
            assert_non_null(t);
            assert_string_equal(t->file, p2);
            assert_string_equal(st_find(f, "a")->file, p1);
            assert_int_equal(st_prefetch(f), 0);
            st_close(f);
        } else {
            assert_null(f);
        }
    }
    /* the same tensor in two shards */
    static const char *const n2b[] = {"c", "a"};
    write_simple(p2, n2b, 2);
    write_index(dir, "\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\"");
    struct st_file *f = NULL;
    struct rl_err err = {0};
    assert_int_equal(st_open(&f, dir, &err), -RL_EFORMAT);
    assert_non_null(strstr(err.msg, "\"a\""));

    /* a broken index file */
    char ip[512];
    snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", dir);
    write_file(ip, "{\"weight_map\":", 14);
    assert_int_equal(st_open(&f, dir, &err), -RL_EFORMAT);
    assert_non_null(strstr(err.msg, "index.json"));
    write_file(ip, "{\"metadata\":{}}", 15);
    assert_int_equal(st_open(&f, dir, &err), -RL_EFORMAT);
    assert_non_null(strstr(err.msg, "weight_map"));

    /* without an index, a directory means its model.safetensors */
    assert_int_equal(unlink(ip), 0);
    char pm[512];
    snprintf(pm, sizeof pm, "%s/model.safetensors", dir);
    write_simple(pm, n1, 2);
    assert_int_equal(st_open(&f, dir, &err), 0);
    assert_int_equal(st_n_tensors(f), 2);
    assert_string_equal(st_find(f, "b")->file, pm);
    st_close(f);
    rm_rf(dir);
    free(dir);
}

static void test_mark_used(void **state)
{
    (void)state;
    size_t len;
    uint8_t *b = image("{\"a\":{" T8 "},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, &len);
    struct st_file *f;
    struct rl_err err = {0};
    assert_int_equal(st_parse_buffer(&f, b, len, "m", &err), 0);
    const struct st_tensor *a = st_find(f, "a"), *bb = st_find(f, "b");
    assert_non_null(a);
    assert_non_null(bb);
    assert_ptr_equal((const uint8_t *)bb->data - (const uint8_t *)a->data, 8);
    assert_ptr_equal(st_first_unused(f), a);
    st_mark_used(f, a);
    assert_ptr_equal(st_first_unused(f), bb);
    st_mark_used(f, bb);
    assert_null(st_first_unused(f));
    st_close(f);
    free(b);
}

static void test_dtype_names(void **state)
{
    (void)state;
    for (int d = 0; d < ST_N_DTYPES; d++) {
        enum st_dtype back;
        assert_int_equal(st_dtype_from_name(st_dtype_name((enum st_dtype)d), &back), 0);
        assert_int_equal(back, d);
        assert_true(st_dtype_size((enum st_dtype)d) > 0);
    }
    enum st_dtype x;
    assert_int_equal(st_dtype_from_name("U32", &x), -1);
    assert_int_equal(st_dtype_size(ST_N_DTYPES), 0);
    assert_int_equal(st_dtype_size(ST_F8_E4M3), 1);
    assert_int_equal(st_dtype_size(ST_BF16), 2);
    assert_int_equal(st_dtype_size(ST_F64), 8);
}

static void test_shared_checkpoint(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/models/tiny-qwen3-a/model.safetensors", tu_data_dir());
    if (access(path, R_OK))
        skip();
    struct st_file *f;
    struct rl_err err = {0};
    if (st_open(&f, path, &err))
        fail_msg("%s", err.msg);
    const struct st_tensor *t = st_find(f, "model.embed_tokens.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_F32);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->shape[0], 768);
    assert_int_equal(t->shape[1], 128);
    assert_int_equal(t->n_bytes, 768 * 128 * 4);
    assert_non_null(st_find(f, "model.layers.3.mlp.down_proj.weight"));
    st_close(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_headers),
        cmocka_unit_test(test_good_header_variants),
        cmocka_unit_test(test_short_and_long),
        cmocka_unit_test(test_round_trip_all_dtypes),
        cmocka_unit_test(test_writer_fill),
        cmocka_unit_test(test_truncated_file),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_mark_used),
        cmocka_unit_test(test_dtype_names),
        cmocka_unit_test(test_shared_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
