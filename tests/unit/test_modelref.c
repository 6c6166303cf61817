/* tests/unit/test_modelref.c - `--model` resolution (common/modelref.c) on a
 * Hugging Face cache tree built in a temp directory: the three places the
 * cache is looked for, refs and commit revisions, served names, owners, and
 * misses that say where they looked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "modelref.h"
#include "test_util.h"

static char root[256];

static void put(const char *rel, const char *text)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    *strrchr(p, '/') = 0;
    assert_int_equal(tu_mkdirs(p), 0);
    snprintf(p, sizeof p, "%s/%s", root, rel);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    if (tu_tmpdir(root, sizeof root, "test-modelref"))
        return -1;
    put("hub/models--Qwen--Qwen3-14B/refs/main", "abc123");
    put("hub/models--Qwen--Qwen3-14B/refs/v2", "def456\n");
    put("hub/models--Qwen--Qwen3-14B/snapshots/abc123/config.json", "{}");
    put("hub/models--Qwen--Qwen3-14B/snapshots/def456/config.json", "{}");
    put("hub/models--Qwen--Qwen3-14B/snapshots/0123cafe/config.json", "{}");
    put("hub/models--gpt2/refs/main", "g1");
    put("hub/models--gpt2/snapshots/g1/config.json", "{}");
    put("hub/models--Qwen--Broken/refs/main", "feed");
    put("dirs/q14b/config.json", "{}");
    /* an Ollama store: manifests -> the model layer's blob */
    static const char man[] =
        "{\"schemaVersion\":2,\"layers\":["
        "{\"mediaType\":\"application/vnd.ollama.image.template\",\"digest\":\"sha256:"
        "1111111111111111111111111111111111111111111111111111111111111111\"},"
        "{\"mediaType\":\"application/vnd.ollama.image.model\",\"digest\":\"sha256:"
        "a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5\"}]}";
    static const char man_latest[] =
        "{\"layers\":[{\"mediaType\":\"application/vnd.ollama.image.model\",\"digest\":"
        "\"sha256:b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6\"}]}";
    put("ollama/manifests/registry.ollama.ai/library/qwen3/14b", man);
    put("ollama/manifests/registry.ollama.ai/library/qwen3/latest", man_latest);
    put("ollama/manifests/registry.ollama.ai/someone/tiny/q4", man);
    put("ollama/manifests/hf.co/org/repo/Q8_0", man_latest);
    put("ollama/manifests/registry.ollama.ai/library/nomodel/latest",
        "{\"layers\":[{\"mediaType\":\"application/vnd.ollama.image.template\","
        "\"digest\":\"sha256:11\"}]}");
    put("ollama/manifests/registry.ollama.ai/library/noblob/latest",
        "{\"layers\":[{\"mediaType\":\"application/vnd.ollama.image.model\",\"digest\":"
        "\"sha256:c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7c7\"}]}");
    put("ollama/manifests/registry.ollama.ai/library/baddigest/latest",
        "{\"layers\":[{\"mediaType\":\"application/vnd.ollama.image.model\",\"digest\":"
        "\"sha256:../../etc/passwd\"}]}");
    put("ollama/manifests/registry.ollama.ai/library/finetuned/latest",
        "{\"layers\":[{\"mediaType\":\"application/vnd.ollama.image.model\",\"digest\":"
        "\"sha256:a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5\"},"
        "{\"mediaType\":\"application/vnd.ollama.image.adapter\",\"digest\":"
        "\"sha256:b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6\"}]}");
    put("ollama/blobs/sha256-a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5", "GGUF");
    put("ollama/blobs/sha256-b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6", "GGUF");
    put("home/.ollama/models/manifests/registry.ollama.ai/library/qwen3/0.6b", man_latest);
    put("home/.ollama/models/blobs/sha256-b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6", "GGUF");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return tu_rmtree(root);
}

static void use_cache(const char *hub_cache, const char *hf_home, const char *home)
{
    char p[512];
    unsetenv("HF_HUB_CACHE");
    unsetenv("HF_HOME");
    if (hub_cache) {
        snprintf(p, sizeof p, "%s/%s", root, hub_cache);
        setenv("HF_HUB_CACHE", p, 1);
    }
    if (hf_home) {
        snprintf(p, sizeof p, "%s/%s", root, hf_home);
        setenv("HF_HOME", p, 1);
    }
    if (home) {
        snprintf(p, sizeof p, "%s/%s", root, home);
        setenv("HOME", p, 1);
    }
}

/* spec -> snapshot (relative to root/hub), served name, owner. */
static void test_repo_ids(void **state)
{
    (void)state;
    static const struct {
        const char *spec, *snap, *name, *owner;
    } cases[] = {
        {"Qwen/Qwen3-14B", "models--Qwen--Qwen3-14B/snapshots/abc123", "Qwen/Qwen3-14B", "Qwen"},
        {"Qwen/Qwen3-14B@main", "models--Qwen--Qwen3-14B/snapshots/abc123", "Qwen/Qwen3-14B", "Qwen"},
        {"Qwen/Qwen3-14B@v2", "models--Qwen--Qwen3-14B/snapshots/def456", "Qwen/Qwen3-14B", "Qwen"},
        {"Qwen/Qwen3-14B@0123cafe", "models--Qwen--Qwen3-14B/snapshots/0123cafe", "Qwen/Qwen3-14B",
         "Qwen"},
        {"gpt2", "models--gpt2/snapshots/g1", "gpt2", "huggingface"},
    };
    use_cache("hub", NULL, NULL);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct modelref m;
        struct rl_err err = {0};
        char want[1024];
        assert_int_equal(modelref_resolve(cases[i].spec, &m, &err), 0);
        snprintf(want, sizeof want, "%s/hub/%s", root, cases[i].snap);
        assert_string_equal(m.dir, want);
        assert_string_equal(m.name, cases[i].name);
        assert_string_equal(m.owned_by, cases[i].owner);
        assert_true(m.from_hub);
        assert_true(m.created > 0);
    }
}

/* $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub. */
static void test_cache_places(void **state)
{
    (void)state;
    char link[512], target[512], buf[2048];
    const char *why;
    snprintf(target, sizeof target, "%s/hub", root);
    snprintf(link, sizeof link, "%s/home/.cache/huggingface", root);
    assert_int_equal(tu_mkdirs(link), 0);
    snprintf(buf, sizeof buf, "%s/hub", link);
    unlink(buf);
    assert_int_equal(symlink(target, buf), 0);
    struct modelref m;
    use_cache(NULL, NULL, "home");
    assert_int_equal(modelref_resolve("Qwen/Qwen3-14B", &m, NULL), 0);
    modelref_hub_cache(buf, sizeof buf, &why);
    assert_string_equal(why, "~/.cache/huggingface/hub");
    use_cache(NULL, ".", NULL); /* HF_HOME=root: root/hub */
    assert_int_equal(modelref_resolve("Qwen/Qwen3-14B@v2", &m, NULL), 0);
    modelref_hub_cache(buf, sizeof buf, &why);
    assert_string_equal(why, "$HF_HOME/hub");
    use_cache("hub", "nowhere", NULL); /* HF_HUB_CACHE wins over HF_HOME */
    assert_int_equal(modelref_resolve("gpt2", &m, NULL), 0);
    modelref_hub_cache(buf, sizeof buf, &why);
    assert_string_equal(why, "$HF_HUB_CACHE");
}

/* A directory wins, and is named by its last component. */
static void test_directories(void **state)
{
    (void)state;
    char dir[512];
    struct modelref m;
    use_cache("hub", NULL, NULL);
    snprintf(dir, sizeof dir, "%s/dirs/q14b/", root);
    assert_int_equal(modelref_resolve(dir, &m, NULL), 0);
    assert_string_equal(m.dir, dir);
    assert_string_equal(m.name, "q14b");
    assert_string_equal(m.owned_by, "redlm");
    assert_false(m.from_hub);
    assert_int_equal(chdir(root), 0);
    assert_int_equal(modelref_resolve("dirs/q14b", &m, NULL), 0);
    assert_string_equal(m.name, "q14b");
    /* a directory spelt like a repo id is a directory */
    assert_int_equal(tu_mkdirs("Qwen/Qwen3-14B"), 0);
    assert_int_equal(modelref_resolve("Qwen/Qwen3-14B", &m, NULL), 0);
    assert_string_equal(m.dir, "Qwen/Qwen3-14B");
    assert_false(m.from_hub);
    assert_int_equal(tu_rmtree("Qwen"), 0);
}

/* Misses name what was looked for and where. */
static void test_misses(void **state)
{
    (void)state;
    static const struct {
        const char *spec, *has1, *has2;
    } cases[] = {
        {"Qwen/Qwen3-32B", "models--Qwen--Qwen3-32B/refs/main", "$HF_HUB_CACHE"},
        {"Qwen/Qwen3-14B@v9", "models--Qwen--Qwen3-14B/refs/v9", "snapshots/v9"},
        {"Qwen/Broken", "names commit feed", "unfinished download"},
        {"/no/such/dir", "no such directory", "/no/such/dir"},
        {"./x", "no such directory", "./x"},
        {"a/b/c", "no such directory", "ORG/NAME"},
        {"Qwen/Qwen3@..", "not a revision", ".."},
        {"", "no model", "--model"},
    };
    use_cache("hub", NULL, NULL);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct modelref m;
        struct rl_err err = {0};
        assert_true(modelref_resolve(cases[i].spec, &m, &err) < 0);
        if (!strstr(err.msg, cases[i].has1) || !strstr(err.msg, cases[i].has2))
            fail_msg("%s: \"%s\" lacks \"%s\" or \"%s\"", cases[i].spec, err.msg, cases[i].has1,
                     cases[i].has2);
    }
}

/* ollama:NAME[:TAG] through the store tree: the model layer's blob, served
 * as NAME:TAG; $OLLAMA_MODELS, else ~/.ollama/models; misses say where. */
static void test_ollama(void **state)
{
    (void)state;
    char store[512], home[512];
    snprintf(store, sizeof store, "%s/ollama", root);
    snprintf(home, sizeof home, "%s/home", root);
    setenv("OLLAMA_MODELS", store, 1);
    static const struct {
        const char *spec, *blob, *name;
    } ok[] = {
        {"ollama:qwen3:14b", "a5a5", "qwen3:14b"},
        {"ollama:qwen3", "b6b6", "qwen3:latest"},
        {"ollama:qwen3:latest", "b6b6", "qwen3:latest"},
        {"ollama:someone/tiny:q4", "a5a5", "someone/tiny:q4"},
        {"ollama:hf.co/org/repo:Q8_0", "b6b6", "hf.co/org/repo:Q8_0"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        struct modelref m;
        struct rl_err err = {0};
        if (modelref_resolve(ok[i].spec, &m, &err))
            fail_msg("%s: %s", ok[i].spec, err.msg);
        char want[600];
        snprintf(want, sizeof want, "%s/blobs/sha256-%s", store, ok[i].blob);
        if (strncmp(m.dir, want, strlen(want)))
            fail_msg("%s: dir %s, want %s...", ok[i].spec, m.dir, want);
        assert_string_equal(m.name, ok[i].name);
        assert_string_equal(m.owned_by, "ollama");
        assert_true(m.from_ollama);
        assert_false(m.from_hub);
        assert_true(modelref_name_ok(m.name));
        assert_true(m.created > 0);
    }
    static const struct {
        const char *spec, *has1, *has2;
    } miss[] = {
        {"ollama:qwen3:32b", "manifests/registry.ollama.ai/library/qwen3/32b", "$OLLAMA_MODELS"},
        {"ollama:nomodel", "no layer of mediaType", "application/vnd.ollama.image.model"},
        {"ollama:noblob", "sha256-c7c7", "not there"},
        {"ollama:baddigest", "not a sha256 digest", "passwd"},
        {"ollama:../x:1", "not an Ollama model name", "../x"},
        {"ollama:a/b/c/d", "not an Ollama model name", "a/b/c/d"},
        {"ollama:qwen3:bad tag", "not an Ollama tag", "bad tag"},
        {"ollama:", "no model name", "ollama:"},
    };
    for (size_t i = 0; i < sizeof miss / sizeof miss[0]; i++) {
        struct modelref m;
        struct rl_err err = {0};
        assert_int_equal(modelref_resolve(miss[i].spec, &m, &err), -RL_ENOTFOUND);
        if (!strstr(err.msg, miss[i].has1) || !strstr(err.msg, miss[i].has2))
            fail_msg("%s: \"%s\" lacks \"%s\" or \"%s\"", miss[i].spec, err.msg,
                     miss[i].has1, miss[i].has2);
    }
    /* a Modelfile's ADAPTER: refused, not served as its base */
    {
        struct modelref m;
        struct rl_err err = {0};
        assert_int_equal(modelref_resolve("ollama:finetuned", &m, &err), -RL_EUNSUPPORTED);
        assert_non_null(strstr(err.msg, "application/vnd.ollama.image.adapter"));
        assert_non_null(strstr(err.msg, "--lora NAME=DIR"));
        /* ... which a worker serves: the adapter's blob beside the model's */
        assert_int_equal(modelref_resolve_ex("ollama:finetuned", MODELREF_ADAPTER, &m, &err), 0);
        assert_non_null(strstr(m.dir, "/blobs/sha256-a5a5"));
        assert_non_null(strstr(m.adapter, "/blobs/sha256-b6b6"));
        assert_string_equal(m.name, "finetuned:latest");
        assert_int_equal(modelref_resolve_ex("ollama:qwen3:14b", MODELREF_ADAPTER, &m, &err), 0);
        assert_string_equal(m.adapter, ""); /* none */
    }
    /* without $OLLAMA_MODELS: ~/.ollama/models */
    unsetenv("OLLAMA_MODELS");
    char *old_home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
    setenv("HOME", home, 1);
    struct modelref m;
    struct rl_err err = {0};
    if (modelref_resolve("ollama:qwen3:0.6b", &m, &err))
        fail_msg("~/.ollama: %s", err.msg);
    assert_non_null(strstr(m.dir, "/home/.ollama/models/blobs/sha256-b6b6"));
    assert_int_equal(modelref_resolve("ollama:qwen3:14b", &m, &err), -RL_ENOTFOUND);
    assert_non_null(strstr(err.msg, "~/.ollama/models"));
    if (old_home)
        setenv("HOME", old_home, 1);
    free(old_home);
}

static void test_names(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        bool ok;
    } cases[] = {
        {"Qwen/Qwen3-14B", true}, {"q14b", true}, {"qwen3:14b", true}, {"a.b_c-d", true},
        {"", false}, {"/abs", false}, {".hidden", false}, {"with space", false},
        {"quote\"", false}, {"back\\slash", false}, {"ümlaut", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (modelref_name_ok(cases[i].name) != cases[i].ok)
            fail_msg("\"%s\": want %s", cases[i].name, cases[i].ok ? "ok" : "refused");
    char long_name[MODELREF_NAME_MAX + 2];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[MODELREF_NAME_MAX + 1] = 0;
    assert_false(modelref_name_ok(long_name));
    long_name[MODELREF_NAME_MAX] = 0;
    assert_true(modelref_name_ok(long_name));
}

/* --lora NAME=DIR (worker option lora_modules) */
static void test_lora_parse(void **state)
{
    (void)state;
    static const struct {
        const char *spec;
        int rc;
        const char *name, *dir, *msg; /* msg: a part of the refusal */
    } cases[] = {
        {"a=/x/y", 0, "a", "/x/y", NULL},
        {"sql-lora=adapters/sql", 0, "sql-lora", "adapters/sql", NULL},
        {"org/ft:v1=/m", 0, "org/ft:v1", "/m", NULL},
        {"a=/dir=with=eq", 0, "a", "/dir=with=eq", NULL}, /* split at the first '=' */
        {"a=/x,y", 0, "a", "/x,y", NULL},                 /* a comma is the directory's */
        {"a", -RL_EINVAL, NULL, NULL, "NAME=DIR"},
        {"=/x", -RL_EINVAL, NULL, NULL, "NAME=DIR"},
        {"a=", -RL_EINVAL, NULL, NULL, "NAME=DIR"},
        {"", -RL_EINVAL, NULL, NULL, "NAME=DIR"},
        {"a b=/x", -RL_EINVAL, NULL, NULL, "[A-Za-z0-9._:/-]"},
        {".a=/x", -RL_EINVAL, NULL, NULL, "not starting"},
        {"/a=/x", -RL_EINVAL, NULL, NULL, "not starting"},
        {"\"q\"=/x", -RL_EINVAL, NULL, NULL, "[A-Za-z0-9._:/-]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct modelref_lora l;
        struct rl_err err = {0};
        int rc = modelref_lora_parse(cases[i].spec, &l, &err);
        if (rc != cases[i].rc)
            fail_msg("\"%s\": rc %d, want %d (%s)", cases[i].spec, rc, cases[i].rc, err.msg);
        if (rc == 0 && (strcmp(l.name, cases[i].name) || strcmp(l.dir, cases[i].dir)))
            fail_msg("\"%s\": name \"%s\" dir \"%s\"", cases[i].spec, l.name, l.dir);
        if (rc && !strstr(err.msg, cases[i].msg))
            fail_msg("\"%s\": message \"%s\" lacks \"%s\"", cases[i].spec, err.msg, cases[i].msg);
    }
    char spec[MODELREF_NAME_MAX + 8];
    memset(spec, 'n', MODELREF_NAME_MAX + 1);
    strcpy(spec + MODELREF_NAME_MAX + 1, "=/x");
    struct modelref_lora l;
    struct rl_err err;
    assert_int_equal(modelref_lora_parse(spec, &l, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "longer than"));
    strcpy(spec + MODELREF_NAME_MAX, "=/x"); /* exactly MODELREF_NAME_MAX: taken */
    assert_int_equal(modelref_lora_parse(spec, &l, &err), 0);
}

static void test_lora_check(void **state)
{
    (void)state;
    struct modelref_lora l[3];
    struct rl_err err;
    assert_int_equal(modelref_lora_parse("a=/x", &l[0], &err), 0);
    assert_int_equal(modelref_lora_parse("b=/y", &l[1], &err), 0);
    assert_int_equal(modelref_lora_parse("a=/z", &l[2], &err), 0);
    assert_int_equal(modelref_lora_check(l, 2, "base", &err), 0);
    assert_int_equal(modelref_lora_check(l, 0, "base", &err), 0);
    assert_int_equal(modelref_lora_check(l, 3, "base", &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "lora a: the name is given twice"));
    assert_int_equal(modelref_lora_check(l, 2, "b", &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "lora b: the name is the model's own served name"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repo_ids),     cmocka_unit_test(test_cache_places),
        cmocka_unit_test(test_directories),  cmocka_unit_test(test_misses),
        cmocka_unit_test(test_names),        cmocka_unit_test(test_ollama),
        cmocka_unit_test(test_lora_parse),   cmocka_unit_test(test_lora_check),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
