/* tests/unit/test_modelid.c - the model identity of the result-cache key
 * (common/modelid.h): equal for the same checkpoint wherever it lies,
 * different for any other, including the cases names and sizes alone
 * cannot tell apart (an adapter merged into its base, another seed of the
 * same shape as one GGUF file), and an adapter's own identity. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "file.h"
#include "mklora.h"
#include "mkmodel.h"
#include "modelid.h"
#include "test_util.h"

static char tmp[1024];

static void id_of(const char *dir, char out[SHA256_HEX_LEN + 1])
{
    struct rl_err err = {0};
    if (modelid_compute(dir, out, &err))
        fail_msg("modelid_compute %s: %s", dir, err.msg);
}

static void test_checkpoints(void **state)
{
    (void)state;
    char base[1100], copy[1100], ad[1100], merged[1100], a[SHA256_HEX_LEN + 1], b[SHA256_HEX_LEN + 1];
    snprintf(base, sizeof base, "%s/models/tiny-qwen3-a", tu_data_dir());
    snprintf(copy, sizeof copy, "%s/copy", tmp);
    snprintf(ad, sizeof ad, "%s/ad", tmp);
    snprintf(merged, sizeof merged, "%s/merged", tmp);
    assert_int_equal(tu_copy_dir(base, copy), 0);
    id_of(base, a);
    id_of(copy, b);
    assert_string_equal(a, b); /* where it lies does not matter */
    struct mk_lora_opts lo;
    mk_lora_opts_init(&lo);
    lo.base_dir = base;
    lo.out_dir = ad;
    struct rl_err err = {0};
    assert_int_equal(mk_lora_write(&lo, &err), 0);
    assert_int_equal(mk_lora_merge(base, ad, merged, &err), 0);
    /* the merged checkpoint: the same file names and sizes as the base,
     * other weights */
    char wb[1200], wm[1200];
    snprintf(wb, sizeof wb, "%s/model.safetensors", base);
    snprintf(wm, sizeof wm, "%s/model.safetensors", merged);
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    assert_int_equal(file_read(wb, (size_t)1 << 30, &x, &nx, &err), 0);
    assert_int_equal(file_read(wm, (size_t)1 << 30, &y, &ny, &err), 0);
    assert_int_equal(nx, ny);
    assert_true(memcmp(x, y, nx) != 0);
    free(x), free(y);
    id_of(merged, b);
    assert_string_not_equal(a, b);
    /* the adapter's identity: its base's and its own files */
    char la[SHA256_HEX_LEN + 1], lb[SHA256_HEX_LEN + 1];
    assert_int_equal(modelid_lora(a, ad, la, &err), 0);
    assert_string_not_equal(la, a);
    assert_int_equal(modelid_lora(b, ad, lb, &err), 0);
    assert_string_not_equal(la, lb);
    char ad2[1100];
    snprintf(ad2, sizeof ad2, "%s/ad2", tmp);
    lo.out_dir = ad2;
    lo.seed = 1; /* the same shape and size, other values */
    assert_int_equal(mk_lora_write(&lo, &err), 0);
    assert_int_equal(modelid_lora(a, ad2, lb, &err), 0);
    assert_string_not_equal(la, lb);
    /* a GGUF adapter: the file is the identity */
    char g1[1100], lg[SHA256_HEX_LEN + 1], lg2[SHA256_HEX_LEN + 1];
    snprintf(g1, sizeof g1, "%s/ad.gguf", tmp);
    lo.out_dir = g1;
    lo.seed = 0;
    assert_int_equal(mk_lora_write(&lo, &err), 0);
    assert_int_equal(modelid_lora(a, g1, lg, &err), 0);
    assert_string_not_equal(lg, la);
    lo.seed = 1;
    assert_int_equal(mk_lora_write(&lo, &err), 0);
    assert_int_equal(modelid_lora(a, g1, lg2, &err), 0);
    assert_string_not_equal(lg, lg2); /* rewritten in place, the same size */
    assert_true(modelid_lora(a, tmp, lb, &err) < 0); /* no adapter there */
    assert_non_null(strstr(err.msg, "adapter_config.json"));
}

static void test_gguf_files(void **state)
{
    (void)state;
    char g1[1100], g2[1100], a[SHA256_HEX_LEN + 1], b[SHA256_HEX_LEN + 1];
    snprintf(g1, sizeof g1, "%s/one.gguf", tmp);
    snprintf(g2, sizeof g2, "%s/two.gguf", tmp);
    struct mk_opts o;
    struct rl_err err = {0};
    for (int i = 0; i < 2; i++) {
        mk_opts_init(&o);
        o.out_dir = i ? g2 : g1;
        o.dtype = MK_Q8_0;
        o.seed = (uint64_t)i;
        assert_int_equal(mk_write(&o, NULL, &err), 0);
    }
    id_of(g1, a);
    id_of(g2, b);
    assert_string_not_equal(a, b); /* same size, same metadata, other weights */
    id_of(g1, b);
    assert_string_equal(a, b);
}

int main(void)
{
    if (tu_tmpdir(tmp, sizeof tmp, "test-modelid"))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoints),
        cmocka_unit_test(test_gguf_files),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmtree(tmp);
    return rc;
}
