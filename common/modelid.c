/* common/modelid.c - the model identity of the result-cache key (see
 * modelid.h). Moved here from worker/cache.c; generation_config.json joined
 * the hashed files when unset sampling fields began to take its values. Reentrant; called once at start by the worker and
 * by the dispatcher. */
#include "modelid.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void hash_file(struct sha256_ctx *c, const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    sha256_update(c, name, strlen(name) + 1);
    if (!f)
        return;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        sha256_update(c, buf, n);
    fclose(f);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int modelid_compute(const char *dir, char out[SHA256_HEX_LEN + 1], struct rl_err *err)
{
    struct sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, "redlm-model-id-v1", 17);
    hash_file(&c, dir, "config.json");
    hash_file(&c, dir, "tokenizer.json");
    hash_file(&c, dir, "tokenizer_config.json");
    /* the sampling defaults of unset fields come from it (engine.h) */
    hash_file(&c, dir, "generation_config.json");
    struct stat fst;
    if (stat(dir, &fst) == 0 && S_ISREG(fst.st_mode)) {
        /* a GGUF file (the Ollama store's blobs have no name to go by): its
         * size and its header, where the config and tokenizer live */
        char rec[64];
        snprintf(rec, sizeof rec, "gguf:%lld;", (long long)fst.st_size);
        sha256_update(&c, rec, strlen(rec));
        FILE *f = fopen(dir, "rb");
        if (!f)
            return rl_errf(err, RL_EIO, "%s: cannot read the model file", dir);
        char buf[65536];
        size_t n, total = 0;
        while (total < ((size_t)16 << 20) && (n = fread(buf, 1, sizeof buf, f)) > 0) {
            sha256_update(&c, buf, n);
            total += n;
        }
        fclose(f);
        uint8_t dg[SHA256_DIGEST_LEN];
        sha256_final(&c, dg);
        sha256_to_hex(dg, out);
        return 0;
    }
    DIR *d = opendir(dir);
    if (!d)
        return rl_errf(err, RL_EIO, "%s: cannot list the model directory", dir);
    char *names[4096];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 4096) {
        size_t l = strlen(de->d_name);
        if ((l > 12 && !strcmp(de->d_name + l - 12, ".safetensors")) ||
            (l > 5 && !strcmp(de->d_name + l - 5, ".gguf")))
            if ((names[n] = strdup(de->d_name)))
                n++;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str); /* readdir order is arbitrary */
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        long long size = stat(path, &st) == 0 ? (long long)st.st_size : -1;
        char rec[64];
        snprintf(rec, sizeof rec, ":%lld;", size);
        sha256_update(&c, names[i], strlen(names[i]));
        sha256_update(&c, rec, strlen(rec));
        free(names[i]);
    }
    uint8_t dg[SHA256_DIGEST_LEN];
    sha256_final(&c, dg);
    sha256_to_hex(dg, out);
    return 0;
}

int modelid_lora(const char *base_id, const char *dir, char out[SHA256_HEX_LEN + 1],
                 struct rl_err *err)
{
    static const char *const files[] = {"adapter_config.json", "adapter_model.safetensors"};
    struct sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, "redlm-lora-id-v1", 16);
    sha256_update(&c, base_id, strlen(base_id) + 1);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        FILE *f = fopen(path, "rb");
        if (!f)
            return rl_errf(err, RL_EIO, "%s: cannot read the adapter file", path);
        fclose(f);
        hash_file(&c, dir, files[i]);
    }
    uint8_t dg[SHA256_DIGEST_LEN];
    sha256_final(&c, dg);
    sha256_to_hex(dg, out);
    return 0;
}
