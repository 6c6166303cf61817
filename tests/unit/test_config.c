/* tests/unit/test_config.c - the option table, the file loader, flags,
 * help, and config/redlm.conf == cfg_write_sample(). Run from the
 * repository root. REDLM_WRITE_CONFIG=1 rewrites config/redlm.conf. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
#include "job.h"
#include "rconn.h"
#include "test_util.h"

static char *capture(void (*fn)(FILE *, const void *), const void *arg)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    fn(f, arg);
    fclose(f);
    return buf;
}

static void sample(FILE *f, const void *arg) { (void)arg; cfg_write_sample(f); }
static void help_worker(FILE *f, const void *arg) { (void)arg; cfg_print_help(f, "redlm-worker", CFG_WORKER); }
static void help_disp(FILE *f, const void *arg) { (void)arg; cfg_print_help(f, "redlm-dispatcher", CFG_DISPATCHER); }

static char tmp_path[64];

static const char *write_tmp(const char *text)
{
    snprintf(tmp_path, sizeof tmp_path, "/tmp/redlm-cfg-%d.conf", (int)getpid());
    FILE *f = fopen(tmp_path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return tmp_path;
}

static void test_defaults(void **state)
{
    (void)state;
    struct cfg c;
    assert_int_equal(cfg_defaults(&c, NULL), 0);
    assert_string_equal(c.redis, "127.0.0.1:6379");
    assert_string_equal(c.prefix, "redlm:");
    assert_int_equal(c.pools.n, 2);
    assert_string_equal(c.pools.v[0], "fast");
    assert_string_equal(c.pools.v[1], "think");
    assert_string_equal(c.backend, "cpu");
    assert_string_equal(c.log_level, "info");
    assert_true(c.result_cache);
    assert_false(c.publish_channel);
    assert_int_equal(c.max_deliveries, 3);
    assert_int_equal(cfg_check(&c, CFG_BOTH, NULL), 0);
    struct job_opts jo;
    cfg_job_opts(&c, &jo);
    assert_int_equal(jo.max_job_bytes, 4096 * 1024);
    assert_int_equal(jo.default_max_tokens, 1024);
    struct rconn_opts ro;
    cfg_rconn_opts(&c, &ro);
    assert_string_equal(ro.addr, "127.0.0.1:6379");
    assert_int_equal(ro.backoff_max_ms, 5000);
    char name[256];
    cfg_worker_name(&c, name, sizeof name);
    assert_true(name[0]);
    cfg_free(&c);
    cfg_free(&c); /* idempotent */
}

/* The committed sample is exactly what the table generates, and loading
 * it yields the defaults. */
static void test_sample_file_matches_table(void **state)
{
    (void)state;
    char *gen = capture(sample, NULL);
    if (getenv("REDLM_WRITE_CONFIG")) {
        FILE *f = fopen(tu_repo_file("config/redlm.conf"), "w");
        assert_non_null(f);
        fputs(gen, f);
        fclose(f);
    }
    char *file = tu_slurp(tu_repo_file("config/redlm.conf"), NULL);
    if (!file)
        fail_msg("config/redlm.conf: cannot read");
    if (strcmp(gen, file))
        fail_msg("config/redlm.conf differs from cfg_write_sample(); regenerate with "
                 "REDLM_WRITE_CONFIG=1 build/tests/test_config");
    struct cfg d, c;
    struct rl_err err = {0};
    assert_int_equal(cfg_defaults(&d, NULL), 0);
    assert_int_equal(cfg_defaults(&c, NULL), 0);
    c.max_batch = 1; /* so loading must set it back */
    if (cfg_load_file(&c, tu_repo_file("config/redlm.conf"), &err))
        fail_msg("%s", err.msg);
    assert_int_equal(c.max_batch, d.max_batch);
    assert_string_equal(c.redis, d.redis);
    assert_int_equal(c.pools.n, d.pools.n);
    cfg_free(&c);
    cfg_free(&d);
    free(gen);
    free(file);
}

static void test_help(void **state)
{
    (void)state;
    char *w = capture(help_worker, NULL), *d = capture(help_disp, NULL);
    assert_non_null(strstr(w, "--redis "));
    assert_non_null(strstr(w, "--model "));
    assert_non_null(strstr(w, "--claim-idle-ms"));
    assert_non_null(strstr(w, "[1000, 3600000]"));
    assert_non_null(strstr(w, "one of cpu|cuda"));
    assert_null(strstr(w, "--default-pool")); /* dispatcher only */
    assert_non_null(strstr(d, "--default-pool"));
    assert_non_null(strstr(d, "--model ")); /* the dispatcher's cache fast path */
    assert_null(strstr(d, "--backend"));
    assert_non_null(strstr(d, "--think-ratio"));
    assert_non_null(strstr(d, "number in [0, 1]"));
    assert_null(strstr(w, "--think-ratio"));
    free(w);
    free(d);
}

static void test_file_overrides(void **state)
{
    (void)state;
    const char *p = write_tmp("# a comment\n"
                              "redis = \"unix:/run/redis.sock\";\n"
                              "pools = [\"think\", \"fast\", \"batch\"];\n"
                              "threads = 8;\n"
                              "publish_channel = true;\n"
                              "backend = \"cuda\";\n"
                              "device = 3;\n"
                              "mmap_weights = true;\n"
                              "kv_budget_mb = 40000L;\n");
    struct cfg c;
    struct rl_err err = {0};
    assert_int_equal(cfg_defaults(&c, NULL), 0);
    if (cfg_load_file(&c, p, &err))
        fail_msg("%s", err.msg);
    assert_string_equal(c.redis, "unix:/run/redis.sock");
    assert_int_equal(c.pools.n, 3);
    assert_string_equal(c.pools.v[2], "batch");
    assert_int_equal(c.threads, 8);
    assert_true(c.publish_channel);
    assert_string_equal(c.backend, "cuda");
    assert_int_equal(c.device, 3); /* reaches engine_options.device (worker/main.c) */
    assert_true(c.mmap_weights);
    assert_int_equal(c.kv_budget_mb, 40000);
    cfg_free(&c);
    unlink(p);

    /* the dispatcher's routing block: doubles (written as 1 too), an
     * empty list, patterns with commas */
    p = write_tmp("think_ratio = 0.25;\nadaptive_max_ratio = 1;\nthink_rules = [];\n"
                  "adaptive = true;\n");
    assert_int_equal(cfg_defaults(&c, NULL), 0);
    assert_true(c.think_ratio == 0.3 && c.think_rules.n == 0 && !c.adaptive);
    if (cfg_load_file(&c, p, &err))
        fail_msg("%s", err.msg);
    assert_true(c.think_ratio == 0.25 && c.adaptive_max_ratio == 1.0 && c.adaptive);
    assert_int_equal(c.think_rules.n, 0);
    cfg_free(&c);
    p = write_tmp("think_rules = [\"(?i)prove\", \"\\\\d{2,}\"];\n");
    assert_int_equal(cfg_defaults(&c, NULL), 0);
    if (cfg_load_file(&c, p, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(c.think_rules.n, 2);
    assert_string_equal(c.think_rules.v[1], "\\d{2,}");
    cfg_free(&c);
    unlink(p);

    /* flags: --think-ratio, --max-waiting, --think-rules a,b; the
     * bounds cross-check */
    char *a[] = {"redlm-dispatcher", "--think-ratio", "0.7", "--max-waiting=5", "--think-rules",
                 "proof,theorem", "--no-adaptive", NULL};
    enum cfg_action act;
    assert_int_equal(cfg_load(&c, 7, a, CFG_DISPATCHER, &act, &err), 0);
    assert_true(c.think_ratio == 0.7);
    assert_int_equal(c.max_waiting, 5);
    assert_int_equal(c.think_rules.n, 2);
    assert_string_equal(c.think_rules.v[1], "theorem");
    cfg_free(&c);
    /* flags override the file */
    p = write_tmp("think_ratio = 0.2;\nmax_waiting = 7;\nredis = \"10.0.0.1:1\";\n");
    char *f[] = {"redlm-dispatcher", "-c", (char *)p, "--think-ratio", "0.4", "--redis",
                 "127.0.0.1:7000", NULL};
    assert_int_equal(cfg_load(&c, 7, f, CFG_DISPATCHER, &act, &err), 0);
    assert_true(c.think_ratio == 0.4);
    assert_int_equal(c.max_waiting, 7);
    assert_string_equal(c.redis, "127.0.0.1:7000");
    cfg_free(&c);
    unlink(p);
    /* LoRA adapters: --lora NAME=DIR once per adapter (a comma is the
     * directory's), --lora-modules the same, the first flag replacing the
     * file's list; the dispatcher has no such flag */
    p = write_tmp("lora_modules = [\"f=/file/a\", \"g=/file/b\"];\n");
    char *lo[] = {"redlm-worker", "-c", (char *)p, "--lora", "a=/x,y", "--lora-modules=b=/z",
                  "--lora", "c=/w", NULL};
    assert_int_equal(cfg_load(&c, 8, lo, CFG_WORKER, &act, &err), 0);
    assert_int_equal(c.lora_modules.n, 3);
    assert_string_equal(c.lora_modules.v[0], "a=/x,y");
    assert_string_equal(c.lora_modules.v[1], "b=/z");
    assert_string_equal(c.lora_modules.v[2], "c=/w");
    cfg_free(&c);
    char *lf[] = {"redlm-worker", "-c", (char *)p, NULL};
    assert_int_equal(cfg_load(&c, 3, lf, CFG_WORKER, &act, &err), 0);
    assert_int_equal(c.lora_modules.n, 2);
    assert_string_equal(c.lora_modules.v[1], "g=/file/b");
    cfg_free(&c);
    unlink(p);
    char *ld[] = {"redlm-dispatcher", "--lora", "a=/x", NULL};
    assert_int_equal(cfg_load(&c, 3, ld, CFG_DISPATCHER, &act, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "--lora_modules is not an option of this program"));
    char *l0[] = {"redlm-worker", NULL};
    assert_int_equal(cfg_load(&c, 1, l0, CFG_WORKER, &act, &err), 0);
    assert_int_equal(c.lora_modules.n, 0);
    cfg_free(&c);
    char *b[] = {"redlm-dispatcher", "--adaptive-min-ratio", "0.8", NULL};
    assert_int_equal(cfg_load(&c, 3, b, CFG_DISPATCHER, &act, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "adaptive_min_ratio"));
    cfg_free(&c);
    char *d[] = {"redlm-dispatcher", "--think-ratio", "x", NULL};
    assert_int_equal(cfg_load(&c, 3, d, CFG_DISPATCHER, &act, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "think_ratio must be a number"));
    cfg_free(&c);
}

/* Each bad file: the message names file:line and the reason. */
static void test_bad_files(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int line;
        const char *reason;
    } cases[] = {
        {"threads = 4;\nthreds = 4;\n", 2, "unknown option \"threds\""},
        {"threads = \"4\";\n", 1, "threads must be an integer"},
        {"\n\nthreads = 2000;\n", 3, "threads = 2000 is out of range [0, 1024]"},
        {"backend = \"tpu\";\n", 1, "backend must be one of cpu|cuda"},
        {"backend = cuda;\n", 1, "syntax error"},
        {"pools = \"fast\";\n", 1, "pools must be a list of strings"},
        {"pools = [];\n", 1, "pools must not be empty"},
        {"pools = [\"fast\", \"fast\"];\n", 1, "lists \"fast\" twice"},
        {"pools = [\"a b\"];\n", 1, "must be 1-64 characters"},
        {"publish_channel = 1;\n", 1, "publish_channel must be true or false"},
        {"redis = 6379;\n", 1, "redis must be a string"},
        {"worker = { name = \"x\"; };\n", 1, "options are not grouped"},
        {"threads = 4;\nmax_batch = = 2;\n", 2, "syntax error"},
        {"max_batch = 0;\n", 1, "out of range [1, 4096]"},
        {"threads = 1.5;\n", 1, "threads must be an integer"},
        {"think_ratio = 1.5;\n", 1, "think_ratio = 1.5 is out of range [0, 1]"},
        {"think_ratio = \"0.3\";\n", 1, "think_ratio must be a number"},
        {"think_rules = \"x\";\n", 1, "think_rules must be a list of strings"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = write_tmp(cases[i].text);
        struct cfg c;
        struct rl_err err = {0};
        assert_int_equal(cfg_defaults(&c, NULL), 0);
        int before = c.threads;
        if (cfg_load_file(&c, p, &err) != -RL_EINVAL)
            fail_msg("case %zu accepted: %s", i, cases[i].text);
        char want[128];
        snprintf(want, sizeof want, "%s:%d: ", p, cases[i].line);
        if (strncmp(err.msg, want, strlen(want)) || !strstr(err.msg, cases[i].reason))
            fail_msg("case %zu: want \"%s...%s\", got \"%s\"", i, want, cases[i].reason, err.msg);
        assert_int_equal(c.threads, before); /* nothing applied */
        cfg_free(&c);
        unlink(p);
    }
    struct cfg c;
    struct rl_err err = {0};
    assert_int_equal(cfg_defaults(&c, NULL), 0);
    assert_int_equal(cfg_load_file(&c, "/nonexistent/redlm.conf", &err), -RL_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent/redlm.conf"));
    cfg_free(&c);
}

static void test_flags(void **state)
{
    (void)state;
    const char *p = write_tmp("threads = 8;\nmodel = \"/m/file\";\nname = \"from-file\";\n");
    char *argv[] = {"redlm-worker", "-c", (char *)p, "--redis", "10.0.0.5:6380", "--pools=think",
                    "--model", "/m/flag", "--backend", "cuda", "--threads", "16",
                    "--claim-idle-ms", "60000", "--publish-channel", "--no-result-cache",
                    "--log_level=debug", NULL};
    int argc = (int)(sizeof argv / sizeof argv[0]) - 1;
    struct cfg c;
    enum cfg_action act;
    struct rl_err err = {0};
    if (cfg_load(&c, argc, argv, CFG_WORKER, &act, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(act, CFG_RUN);
    assert_string_equal(c.redis, "10.0.0.5:6380");
    assert_int_equal(c.pools.n, 1);
    assert_string_equal(c.pools.v[0], "think");
    assert_string_equal(c.model, "/m/flag");   /* flag beats file */
    assert_string_equal(c.name, "from-file");  /* file beats default */
    assert_string_equal(c.backend, "cuda");
    assert_int_equal(c.threads, 16);
    assert_int_equal(c.claim_idle_ms, 60000);
    assert_true(c.publish_channel);
    assert_false(c.result_cache);
    assert_string_equal(c.log_level, "debug");
    cfg_free(&c);
    unlink(p);

    /* a boolean flag takes a following true/false as --help's "--name
     * VALUE" says (issue 29: `--result-cache false` was refused), and
     * stays bare before another flag */
    char *b[] = {"redlm-worker", "--result-cache", "false", "--publish-channel", "--kv-prefault", "off",
                 "--mmap-weights", "--threads", "3", NULL};
    if (cfg_load(&c, 9, b, CFG_WORKER, &act, &err))
        fail_msg("%s", err.msg);
    assert_false(c.result_cache);
    assert_true(c.publish_channel);
    assert_false(c.kv_prefault);
    assert_true(c.mmap_weights);
    assert_int_equal(c.threads, 3);
    cfg_free(&c);

    /* the cross-option check sees the merged result: --pools=think has
     * no "fast", the default default_pool */
    char *a2[] = {"redlm-dispatcher", "--pools", "think", NULL};
    assert_int_equal(cfg_load(&c, 3, a2, CFG_DISPATCHER, &act, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "default_pool"));
    cfg_free(&c);

    a2[0] = "redlm-worker"; /* the worker has no default_pool to care about */
    assert_int_equal(cfg_load(&c, 3, a2, CFG_WORKER, &act, &err), 0);
    cfg_free(&c);
    char *a4[] = {"redlm-dispatcher", "--backend", "cpu", NULL};
    assert_int_equal(cfg_load(&c, 3, a4, CFG_DISPATCHER, &act, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "--backend is not an option of this program"));
    cfg_free(&c);

    /* no file at all */
    char *a3[] = {"redlm-worker", "--model", "/m", NULL};
    assert_int_equal(cfg_load(&c, 3, a3, CFG_WORKER, &act, &err), 0);
    assert_string_equal(c.model, "/m");
    cfg_free(&c);

    static const struct {
        const char *args[4];
        const char *reason;
    } bad[] = {
        {{"--threads", "many"}, "--threads: threads must be an integer"},
        {{"--threads", "-1"}, "out of range"},
        {{"--thread", "4"}, "unknown flag --thread"},
        {{"--backend", "tpu"}, "one of cpu|cuda"},
        {{"--model"}, "--model needs a value"},
        {{"stray"}, "unexpected argument \"stray\""},
        {{"--publish-channel=maybe"}, "true or false"},
        {{"--no-threads"}, "unknown flag"},
        {{"--pools", "fast,,think"}, "pools item \"\" must be"},
        {{"--pools", "fast, fast"}, "pools lists \"fast\" twice"},
        {{"--lease-renew-ms", "40000"}, "lease_renew_ms (40000) must be below claim_idle_ms"},
        {{"-c"}, "-c needs a file name"},
        {{"--redis-user", "bob"}, "needs redis_password_file"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *av[6] = {"redlm-worker"};
        int n = 1;
        for (int k = 0; k < 4 && bad[i].args[k]; k++)
            av[n++] = (char *)bad[i].args[k];
        av[n] = NULL;
        struct rl_err e2 = {0};
        int rc = cfg_load(&c, n, av, CFG_WORKER, &act, &e2);
        if (rc != -RL_EINVAL || !strstr(e2.msg, bad[i].reason))
            fail_msg("case %zu: want \"%s\", got \"%s\"", i, bad[i].reason, e2.msg);
        cfg_free(&c);
    }

    char *h[] = {"redlm-worker", "--threads", "bogus", "--help", NULL};
    assert_int_equal(cfg_load(&c, 4, h, CFG_WORKER, &act, &err), 0); /* --help wins over bad flags */
    assert_int_equal(act, CFG_HELP);
    cfg_free(&c);
    char *pc[] = {"redlm-worker", "--print-config", NULL};
    assert_int_equal(cfg_load(&c, 2, pc, CFG_WORKER, &act, &err), 0);
    assert_int_equal(act, CFG_PRINT_CONFIG);
    cfg_free(&c);
}

static void test_live_reload(void **state)
{
    (void)state;
    struct cfg run, fresh;
    struct rl_err err = {0};
    assert_int_equal(cfg_defaults(&run, NULL), 0);
    assert_int_equal(cfg_defaults(&fresh, NULL), 0);
    char *a[] = {"x", "--log-level", "debug", "--max-deliveries", "7", "--threads", "3",
                 "--redis", "other:1", NULL};
    assert_int_equal(cfg_apply_args(&fresh, 9, a, CFG_WORKER, &err), 0);
    assert_int_equal(cfg_apply_live(&run, &fresh, CFG_WORKER, &err), 0);
    assert_string_equal(run.log_level, "debug"); /* live */
    assert_int_equal(run.max_deliveries, 7);     /* live */
    assert_int_equal(run.threads, 0);            /* needs a restart */
    assert_string_equal(run.redis, "127.0.0.1:6379");
    /* a reload that breaks a cross-option rule changes nothing */
    fresh.lease_renew_ms = 100000;
    fresh.claim_idle_ms = 1000;
    assert_int_equal(cfg_apply_live(&run, &fresh, CFG_WORKER, &err), -RL_EINVAL);
    assert_int_equal(run.max_deliveries, 7);
    assert_int_equal(run.claim_idle_ms, 30000);
    cfg_free(&run);
    cfg_free(&fresh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_sample_file_matches_table),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_file_overrides),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_flags),
        cmocka_unit_test(test_live_reload),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
