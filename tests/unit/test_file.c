/* tests/unit/test_file.c - whole files (common/file.c): a read gives every
 * byte or a coded error naming the path, refuses what is larger than its
 * limit; a write appears under its name only when committed, never half. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file.h"
#include "test_util.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    return tu_tmpdir(dir, sizeof dir, "test-file");
}

static int teardown(void **state)
{
    (void)state;
    return tu_rmtree(dir);
}

static const char *at(const char *name)
{
    static char p[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static void put_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Sizes around the buffer's first size and the limit, read back byte for byte. */
static void test_read(void **state)
{
    (void)state;
    static const struct {
        size_t size, max;
        int code;
    } cases[] = {
        {0, 0, 0},                 /* empty: "" and 0, not NULL */
        {1, 1, 0},                 /* exactly the limit */
        {2, 1, -RL_EFORMAT},       /* one past it */
        {65536, 0, 0},             /* exactly the first buffer */
        {65537, 65536, -RL_EFORMAT},
        {300001, 0, 0},            /* several doublings */
        {300001, 300001, 0},
        {300001, 300000, -RL_EFORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char *b = malloc(cases[i].size + 1);
        for (size_t k = 0; k < cases[i].size; k++)
            b[k] = (unsigned char)(k * 7 + i);
        put_bytes(at("r"), b, cases[i].size);
        char *out = (char *)0x1;
        size_t len = 99;
        struct rl_err err = {0};
        int rc = file_read(at("r"), cases[i].max, &out, &len, &err);
        if (rc != cases[i].code)
            fail_msg("case %zu: rc %d (%s)", i, rc, err.msg);
        if (rc) {
            assert_null(out);
            assert_non_null(strstr(err.msg, "larger than"));
            assert_non_null(strstr(err.msg, dir));
        } else {
            assert_int_equal(len, cases[i].size);
            assert_memory_equal(out, b, cases[i].size);
            assert_int_equal(out[len], 0);
        }
        free(out);
        free(b);
    }
    /* what cannot be read says so, by code, naming the path */
    struct {
        const char *path;
        int code;
    } bad[] = {{at("none"), -RL_ENOTFOUND}, {at("r/x"), -RL_ENOTFOUND}, {dir, -RL_EIO}};
    for (size_t i = 0; i < 3; i++) {
        char *out = NULL;
        struct rl_err err = {0};
        assert_int_equal(file_read(bad[i].path, 0, &out, NULL, &err), bad[i].code);
        assert_null(out);
        assert_non_null(strstr(err.msg, bad[i].path));
    }
}

static void test_read_json(void **state)
{
    (void)state;
    static const struct {
        const char *text, *msg;
        int code;
    } cases[] = {
        {"{\"a\": 1}", NULL, 0},
        {"[1, 2]", "not a JSON object", -RL_EFORMAT},
        {"{\"a\": ", "not valid JSON", -RL_EFORMAT},
        {"", "not valid JSON", -RL_EFORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        put_bytes(at("j.json"), cases[i].text, strlen(cases[i].text));
        cJSON *j = NULL;
        struct rl_err err = {0};
        int rc = file_read_json(at("j.json"), 1024, &j, &err);
        if (rc != cases[i].code)
            fail_msg("case %zu: rc %d (%s)", i, rc, err.msg);
        if (rc) {
            assert_null(j);
            assert_non_null(strstr(err.msg, cases[i].msg));
        } else {
            assert_int_equal(cJSON_GetObjectItem(j, "a")->valueint, 1);
        }
        cJSON_Delete(j);
    }
}

/* byte off of the filled content: a pattern no chunk boundary can hide */
static int fill_pattern(void *ctx, uint64_t off, void *buf, size_t n, struct rl_err *err)
{
    (void)err;
    int *calls = ctx;
    (*calls)++;
    for (size_t i = 0; i < n; i++)
        ((unsigned char *)buf)[i] = (unsigned char)((off + i) * 31 >> 3);
    return 0;
}

static int fill_fails(void *ctx, uint64_t off, void *buf, size_t n, struct rl_err *err)
{
    (void)ctx, (void)buf, (void)n;
    return off ? rl_errf(err, RL_EINVAL, "no more") : 0;
}

static void test_write(void **state)
{
    (void)state;
    /* committed: the bytes written and filled, under the name, no .tmp;
     * a fill larger than the staging buffer comes in several calls */
    const char *path = at("w.bin");
    struct file_out *f;
    struct rl_err err = {0};
    assert_int_equal(file_out_open(&f, path, &err), 0);
    assert_true(exists(at("w.bin.tmp")));
    assert_false(exists(path)); /* not before the commit */
    const uint64_t n_fill = (8u << 20) * 2 + 5;
    int calls = 0;
    assert_int_equal(file_out_write(f, "head", 4, &err), 0);
    assert_int_equal(file_out_fill(f, n_fill, fill_pattern, &calls, &err), 0);
    assert_int_equal(calls, 3);
    assert_int_equal(file_out_commit(f, &err), 0);
    assert_false(exists(at("w.bin.tmp")));
    char *out;
    size_t len;
    assert_int_equal(file_read(path, 0, &out, &len, &err), 0);
    assert_int_equal(len, 4 + n_fill);
    assert_memory_equal(out, "head", 4);
    for (uint64_t i = 0; i < n_fill; i++)
        if ((unsigned char)out[4 + i] != (unsigned char)(i * 31 >> 3))
            fail_msg("byte %llu", (unsigned long long)i);
    free(out);

    /* a fill that fails: its error as it is; aborted, the old file stays
     * whole under its name and the temporary one is gone */
    assert_int_equal(file_out_open(&f, path, &err), 0);
    assert_int_equal(file_out_write(f, "new", 3, &err), 0);
    assert_int_equal(file_out_fill(f, (8u << 20) + 1, fill_fails, NULL, &err), -RL_EINVAL);
    assert_string_equal(err.msg, "no more");
    file_out_abort(f);
    assert_false(exists(at("w.bin.tmp")));
    assert_int_equal(file_read(path, 0, &out, &len, &err), 0);
    assert_int_equal(len, 4 + n_fill);
    free(out);
    file_out_abort(NULL);

    /* a commit that cannot rename (a directory holds the name): an error
     * naming it, and nothing left behind */
    assert_int_equal(mkdir(at("d"), 0755), 0);
    put_bytes(at("d/x"), "x", 1);
    assert_int_equal(file_out_open(&f, at("d"), &err), 0);
    assert_int_equal(file_out_write(f, "y", 1, &err), 0);
    assert_int_equal(file_out_commit(f, &err), -RL_EIO);
    assert_non_null(strstr(err.msg, "rename"));
    assert_false(exists(at("d.tmp")));

    /* a folder that does not exist: refused at the open, naming the file */
    assert_int_equal(file_out_open(&f, at("no/such"), &err), -RL_EIO);
    assert_null(f);
    assert_non_null(strstr(err.msg, "no/such.tmp"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read),
        cmocka_unit_test(test_read_json),
        cmocka_unit_test(test_write),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
