/* common/modelref.c - resolving `--model` (see modelref.h).
 *
 * The Hugging Face cache layout this reads (huggingface_hub's
 * "Understand caching" guide):
 *
 *   <cache>/models--Qwen--Qwen3-14B/
 *       refs/main                 the commit hash main points at, one line
 *       snapshots/<hash>/...      the files of that commit (symlinks into
 *       blobs/<sha256>            the content-addressed blobs)
 *
 * A directory always wins over a repo id of the same spelling, so a local
 * folder named like a repo (`Qwen/Qwen3-14B` under the working directory)
 * keeps working as it did.
 *
 * The Ollama store (Ollama's server/modelpath.go and manifest.go):
 *
 *   <store>/manifests/registry.ollama.ai/library/qwen3/14b   a JSON manifest:
 *       {"layers": [{"mediaType": "application/vnd.ollama.image.model",
 *                    "digest": "sha256:<hex>", ...}, ...template, params...]}
 *       (a Modelfile's ADAPTER adds an application/vnd.ollama.image.adapter
 *       layer: refused, the base alone is another model)
 *   <store>/blobs/sha256-<hex>                                the GGUF file
 *
 * Reentrant; reads the environment and the file system only. */
#include "modelref.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file.h"

/* An Ollama manifest is ~1 KB of JSON */
#define MANIFEST_MAX (1u << 20)

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* $HOME, else the password database's, else "/". */
static const char *home_dir(void)
{
    const char *home = getenv("HOME");
    if (home && *home)
        return home;
    struct passwd *pw = getpwuid(getuid());
    return pw && pw->pw_dir ? pw->pw_dir : "/";
}

const char *modelref_hub_cache(char *buf, size_t size, const char **why)
{
    const char *v = getenv("HF_HUB_CACHE");
    if (v && *v) {
        snprintf(buf, size, "%s", v);
        if (why)
            *why = "$HF_HUB_CACHE";
        return buf;
    }
    v = getenv("HF_HOME");
    if (v && *v) {
        snprintf(buf, size, "%s/hub", v);
        if (why)
            *why = "$HF_HOME/hub";
        return buf;
    }
    const char *home = home_dir();
    snprintf(buf, size, "%s/.cache/huggingface/hub", home);
    if (why)
        *why = "~/.cache/huggingface/hub";
    return buf;
}

/* A part of a name, at most max bytes of [A-Za-z0-9._-], not starting
 * with '.' or '-' (so never "." or ".."): the Hub's rule for the two parts
 * of a repo id (max 96), Ollama's for a model name or tag (max 80). */
static bool name_part_ok(const char *s, size_t n, size_t max)
{
    if (n == 0 || n > max || s[0] == '.' || s[0] == '-')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '.' && s[i] != '_' && s[i] != '-')
            return false;
    return true;
}

/* A revision: a branch, tag or commit; [A-Za-z0-9._/-], no "..". */
static bool revision_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > MODELREF_NAME_MAX || s[0] == '/' || strstr(s, ".."))
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '.' && *s != '_' && *s != '-' && *s != '/')
            return false;
    return true;
}

bool modelref_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > MODELREF_NAME_MAX || s[0] == '/' || s[0] == '.')
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("._:/-", *s))
            return false;
    return true;
}

int modelref_lora_parse(const char *spec, struct modelref_lora *out, struct rl_err *err)
{
    memset(out, 0, sizeof *out);
    const char *eq = strchr(spec, '=');
    if (!eq || eq == spec || !eq[1])
        return rl_errf(err, RL_EINVAL, "lora: \"%.200s\" is not NAME=DIR (an adapter's model "
                       "name and its PEFT directory)", spec);
    size_t n = (size_t)(eq - spec);
    if (n > MODELREF_NAME_MAX)
        return rl_errf(err, RL_EINVAL, "lora: the name of \"%.200s\" is longer than %d characters",
                       spec, MODELREF_NAME_MAX);
    memcpy(out->name, spec, n);
    out->name[n] = 0;
    if (!modelref_name_ok(out->name))
        return rl_errf(err, RL_EINVAL, "lora: name \"%.128s\" must be 1-%d of [A-Za-z0-9._:/-], "
                       "not starting with '/' or '.'", out->name, MODELREF_NAME_MAX);
    if (strlen(eq + 1) >= sizeof out->dir)
        return rl_errf(err, RL_EINVAL, "lora %s: the directory is longer than %d characters",
                       out->name, MODELREF_PATH_MAX - 1);
    snprintf(out->dir, sizeof out->dir, "%s", eq + 1);
    return 0;
}

int modelref_lora_check(const struct modelref_lora *l, int n, const char *served,
                        struct rl_err *err)
{
    for (int i = 0; i < n; i++) {
        if (served && !strcmp(l[i].name, served))
            return rl_errf(err, RL_EINVAL, "lora %s: the name is the model's own served name; "
                           "a job naming it would mean the base model", l[i].name);
        for (int k = 0; k < i; k++)
            if (!strcmp(l[i].name, l[k].name))
                return rl_errf(err, RL_EINVAL, "lora %s: the name is given twice (%s and %s)",
                               l[i].name, l[k].dir, l[i].dir);
    }
    return 0;
}

static void fill_common(struct modelref *m)
{
    char p[MODELREF_PATH_MAX + 16];
    struct stat st;
    snprintf(p, sizeof p, "%s/config.json", m->dir);
    m->created = stat(p, &st) == 0 ? (int64_t)st.st_mtime : 0;
}

/* The directory's last component, as its served name; characters a name
 * cannot hold become '-'. */
static void dir_name(const char *dir, char *out, size_t size)
{
    char tmp[MODELREF_PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", dir);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/')
        tmp[--n] = 0;
    const char *b = strrchr(tmp, '/');
    b = b && b[1] ? b + 1 : tmp;
    if (!strcmp(b, ".") || !strcmp(b, "..") || !strcmp(b, "/")) {
        char cwd[MODELREF_PATH_MAX];
        if (realpath(dir, cwd)) {
            const char *c = strrchr(cwd, '/');
            snprintf(tmp, sizeof tmp, "%s", c && c[1] ? c + 1 : "model");
            b = tmp;
        }
    }
    size_t k = 0;
    for (; *b && k + 1 < size && k < MODELREF_NAME_MAX; b++)
        out[k++] = (isalnum((unsigned char)*b) || strchr("._:-", *b)) ? *b : '-';
    out[k] = 0;
    if (k == 0 || out[0] == '.')
        snprintf(out, size, "model");
}

const char *modelref_ollama_store(char *buf, size_t size, const char **why)
{
    const char *v = getenv("OLLAMA_MODELS");
    if (v && *v) {
        snprintf(buf, size, "%s", v);
        if (why)
            *why = "$OLLAMA_MODELS";
        return buf;
    }
    const char *home = home_dir();
    snprintf(buf, size, "%s/.ollama/models", home);
    if (why)
        *why = "~/.ollama/models";
    return buf;
}

/* spec without the "ollama:" prefix: NAME[:TAG]. */
/* The blob a manifest layer's digest names: "sha256:<64 hex>" ->
 * <store>/blobs/sha256-<64 hex>, which must be a file. */
static int layer_blob(const char *store, const char *digest, const char *what, const char *full,
                      const char *man, char *out, size_t size, struct rl_err *err)
{
    size_t dl = strlen(digest);
    bool hex_ok = dl == 71 && !strncmp(digest, "sha256:", 7);
    for (size_t i = 7; hex_ok && i < dl; i++)
        hex_ok = isxdigit((unsigned char)digest[i]) != 0;
    if (!hex_ok)
        return rl_errf(err, RL_ENOTFOUND, "model %s: the Ollama manifest %s names the %s blob "
                                          "\"%.80s\", not a sha256 digest", full, man, what, digest);
    if ((size_t)snprintf(out, size, "%s/blobs/sha256-%s", store, digest + 7) >= size)
        return rl_errf(err, RL_EINVAL, "model %s: the path is too long", full);
    struct stat st;
    if (stat(out, &st) || !S_ISREG(st.st_mode))
        return rl_errf(err, RL_ENOTFOUND, "model %s: the Ollama manifest %s names the blob %s, which "
                                          "is not there (an unfinished pull?)", full, man, out);
    return 0;
}

static int resolve_ollama(const char *full, const char *spec, unsigned flags, struct modelref *m,
                          struct rl_err *err)
{
    char name[256], tag[128] = "latest";
    const char *colon = strrchr(spec, ':');
    size_t nn = colon ? (size_t)(colon - spec) : strlen(spec);
    if (colon &&
        (!name_part_ok(colon + 1, strlen(colon + 1), 80) || strlen(colon + 1) >= sizeof tag))
        return rl_errf(err, RL_ENOTFOUND, "model %s: \"%s\" is not an Ollama tag", full, colon + 1);
    if (colon)
        snprintf(tag, sizeof tag, "%s", colon + 1);
    if (nn == 0 || nn >= sizeof name)
        return rl_errf(err, RL_ENOTFOUND, "model %s: no model name (ollama:NAME[:TAG])", full);
    memcpy(name, spec, nn);
    name[nn] = 0;
    /* MODEL, NAMESPACE/MODEL or HOST/NAMESPACE/MODEL */
    const char *part[3];
    size_t plen[3];
    int np = 0;
    for (const char *p = name; np < 4;) {
        const char *e = strchr(p, '/');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (np == 3 || !name_part_ok(p, l, 80))
            return rl_errf(err, RL_ENOTFOUND,
                           "model %s: \"%s\" is not an Ollama model name (MODEL, NAMESPACE/MODEL or "
                           "HOST/NAMESPACE/MODEL)", full, name);
        part[np] = p;
        plen[np++] = l;
        if (!e)
            break;
        p = e + 1;
    }
    char path3[300];
    if (np == 1)
        snprintf(path3, sizeof path3, "registry.ollama.ai/library/%.*s", (int)plen[0], part[0]);
    else if (np == 2)
        snprintf(path3, sizeof path3, "registry.ollama.ai/%s", name);
    else
        snprintf(path3, sizeof path3, "%s", name);
    const char *why;
    char store[MODELREF_PATH_MAX], man[MODELREF_PATH_MAX * 2], blob[MODELREF_PATH_MAX * 2];
    modelref_ollama_store(store, sizeof store, &why);
    snprintf(man, sizeof man, "%s/manifests/%s/%s", store, path3, tag);
    char *text;
    int rc = file_read(man, MANIFEST_MAX, &text, NULL, err);
    if (rc && rc != -RL_ENOTFOUND)
        return rl_err_wrap(err, "model %s", full);
    if (rc)
        return rl_errf(err, RL_ENOTFOUND,
                       "model %s: not in the Ollama store %s (%s): looked for the manifest %s; "
                       "pull it with `ollama pull %s:%s`, or give a GGUF file or checkpoint "
                       "directory", full, store, why, man, name, tag);
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers");
    const char *digest = NULL;
    const cJSON *l, *arr = cJSON_IsArray(layers) ? layers : NULL;
    const char *adapter = NULL;
    int n_adapters = 0;
    cJSON_ArrayForEach(l, arr)
    {
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(l, "mediaType");
        const cJSON *dg = cJSON_GetObjectItemCaseSensitive(l, "digest");
        if (cJSON_IsString(mt) && !strcmp(mt->valuestring, "application/vnd.ollama.image.adapter")) {
            n_adapters++;
            adapter = cJSON_IsString(dg) ? dg->valuestring : "";
        }
        if (!digest && cJSON_IsString(mt) &&
            !strcmp(mt->valuestring, "application/vnd.ollama.image.model") && cJSON_IsString(dg))
            digest = dg->valuestring;
    }
    /* a Modelfile's ADAPTER: the model is the base plus a LoRA (a GGUF
     * adapter blob); serving the base alone would answer as another model */
    if (n_adapters && !(flags & MODELREF_ADAPTER)) {
        rc = rl_errf(err, RL_EUNSUPPORTED,
                     "model %s: the Ollama manifest %s has a LoRA adapter layer "
                     "(application/vnd.ollama.image.adapter, a Modelfile's ADAPTER), which only "
                     "redlm-worker serves; or serve the base model and the adapter with --lora "
                     "NAME=DIR", full, man);
        goto out;
    }
    if (n_adapters > 1) {
        rc = rl_errf(err, RL_EUNSUPPORTED,
                     "model %s: the Ollama manifest %s has %d adapter layers; one is served", full,
                     man, n_adapters);
        goto out;
    }
    if (!digest) {
        rc = rl_errf(err, RL_ENOTFOUND,
                     "model %s: the Ollama manifest %s has no layer of mediaType "
                     "application/vnd.ollama.image.model", full, man);
        goto out;
    }
    if ((rc = layer_blob(store, digest, "model", full, man, blob, sizeof blob, err)) ||
        (adapter && (rc = layer_blob(store, adapter, "adapter", full, man, m->adapter,
                                     sizeof m->adapter, err))))
        goto out;
    struct stat st;
    if (strlen(blob) >= sizeof m->dir) {
        rc = rl_errf(err, RL_EINVAL, "model %s: the path is too long", full);
        goto out;
    }
    snprintf(m->dir, sizeof m->dir, "%s", blob);
    snprintf(m->name, sizeof m->name, "%.100s:%.27s", name, tag);
    snprintf(m->owned_by, sizeof m->owned_by, "ollama");
    snprintf(m->revision, sizeof m->revision, "%s", tag);
    m->from_ollama = true;
    m->created = stat(man, &st) == 0 ? (int64_t)st.st_mtime : 0;
out:
    cJSON_Delete(root);
    return rc;
}

int modelref_resolve(const char *spec, struct modelref *m, struct rl_err *err)
{
    return modelref_resolve_ex(spec, 0, m, err);
}

int modelref_resolve_ex(const char *spec, unsigned flags, struct modelref *m, struct rl_err *err)
{
    memset(m, 0, sizeof *m);
    if (!spec || !*spec)
        return rl_errf(err, RL_EINVAL, "no model: give --model DIR or a Hugging Face repo id");
    if (strlen(spec) >= MODELREF_PATH_MAX)
        return rl_errf(err, RL_EINVAL, "model: the path is too long");
    struct stat st;
    /* ollama:NAME[:TAG] names a model of the Ollama store, unless a file or
     * directory of that spelling exists (it wins, as for repo ids) */
    if (!strncmp(spec, "ollama:", 7) && stat(spec, &st) != 0)
        return resolve_ollama(spec, spec + 7, flags, m, err);
    /* an existing file (a .gguf, a config.json given by mistake) goes to
     * the model loader as it is, which says what it expects instead */
    if (is_dir(spec) || stat(spec, &st) == 0) {
        snprintf(m->dir, sizeof m->dir, "%s", spec);
        dir_name(spec, m->name, sizeof m->name);
        snprintf(m->owned_by, sizeof m->owned_by, "redlm");
        fill_common(m);
        return 0;
    }
    /* not a directory: a repo id? */
    char repo[2 * 96 + 2], rev[MODELREF_NAME_MAX + 1] = "main";
    const char *at = strchr(spec, '@');
    size_t rn = at ? (size_t)(at - spec) : strlen(spec);
    if (at && !revision_ok(at + 1))
        return rl_errf(err, RL_ENOTFOUND,
                       "model %s: not a directory, and \"%s\" is not a revision", spec, at + 1);
    if (at)
        snprintf(rev, sizeof rev, "%s", at + 1);
    const char *slash = memchr(spec, '/', rn);
    bool ok = rn < sizeof repo &&
              (slash ? name_part_ok(spec, (size_t)(slash - spec), 96) &&
                           name_part_ok(slash + 1, rn - (size_t)(slash - spec) - 1, 96)
                     : name_part_ok(spec, rn, 96));
    if (!ok)
        return rl_errf(err, RL_ENOTFOUND,
                       "model %s: no such directory (and not a Hugging Face repo id "
                       "ORG/NAME[@REVISION])", spec);
    memcpy(repo, spec, rn);
    repo[rn] = 0;
    const char *why;
    char cache[MODELREF_PATH_MAX];
    modelref_hub_cache(cache, sizeof cache, &why);
    /* models--ORG--NAME: the repo id with "/" spelt "--" */
    char folder[sizeof repo + 16] = "models--";
    for (size_t i = 0, k = 8; i < rn && k + 3 < sizeof folder; i++) {
        if (repo[i] == '/') {
            folder[k++] = '-';
            folder[k++] = '-';
        } else {
            folder[k++] = repo[i];
        }
        folder[k] = 0;
    }
    char ref[MODELREF_PATH_MAX * 2], snap[MODELREF_PATH_MAX * 2];
    snprintf(ref, sizeof ref, "%s/%s/refs/%s", cache, folder, rev);
    char hash[128] = "";
    FILE *f = fopen(ref, "r");
    if (f) {
        if (!fgets(hash, sizeof hash, f))
            hash[0] = 0;
        fclose(f);
        size_t n = strlen(hash);
        while (n && isspace((unsigned char)hash[n - 1]))
            hash[--n] = 0;
        if (!revision_ok(hash) || strchr(hash, '/'))
            return rl_errf(err, RL_ENOTFOUND, "model %s: %s does not hold a commit hash", spec,
                           ref);
        snprintf(snap, sizeof snap, "%s/%s/snapshots/%s", cache, folder, hash);
        if (!is_dir(snap))
            return rl_errf(err, RL_ENOTFOUND,
                           "model %s: %s names commit %s, but %s is not there (an "
                           "unfinished download?)", spec, ref, hash, snap);
    } else {
        /* a commit hash given as the revision has no ref file */
        snprintf(snap, sizeof snap, "%s/%s/snapshots/%s", cache, folder, rev);
        if (!is_dir(snap))
            return rl_errf(err, RL_ENOTFOUND,
                           "model %s: not a directory, and not in the Hugging Face cache %s "
                           "(%s): looked for %s and %s; download it with `huggingface-cli "
                           "download %s` or give the checkpoint directory", spec, cache, why,
                           ref, snap, repo);
    }
    if (strlen(snap) >= sizeof m->dir)
        return rl_errf(err, RL_EINVAL, "model %s: the path is too long", spec);
    snprintf(m->dir, sizeof m->dir, "%s", snap);
    snprintf(m->name, sizeof m->name, "%.128s", repo);
    snprintf(m->revision, sizeof m->revision, "%s", rev);
    if (slash)
        snprintf(m->owned_by, sizeof m->owned_by, "%.*s", (int)(slash - spec), spec);
    else
        snprintf(m->owned_by, sizeof m->owned_by, "huggingface");
    m->from_hub = true;
    fill_common(m);
    return 0;
}
