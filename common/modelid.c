/* common/modelid.c - the model identity of the result-cache key (see
 * modelid.h). Moved here from worker/cache.c; generation_config.json joined
 * the hashed files when unset sampling fields began to take its values. Reentrant; called once at start by the worker and
 * by the dispatcher. */
#include "modelid.h"
#include "modelref.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Weight bytes sampled per file: MODELID_SAMPLES blocks at evenly spaced
 * offsets. Names and sizes alone cannot tell a checkpoint from the same
 * shape with other weights (a fine-tune, an adapter merged into its base:
 * the same files, the same sizes), whose cached answers would then be
 * served for it; a fine-tune changes nearly every byte of the matrices,
 * so a few hundred KB read per file at start tell them apart. */
#define MODELID_SAMPLES 64
#define MODELID_BLOCK 4096

static int hash_samples(struct sha256_ctx *c, const char *path, long long size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char buf[MODELID_BLOCK];
    for (int i = 0; i < MODELID_SAMPLES && size > 0; i++) {
        long long span = size > MODELID_BLOCK ? size - MODELID_BLOCK : 0;
        off_t at = (off_t)(span * i / (MODELID_SAMPLES - 1));
        ssize_t n = pread(fd, buf, sizeof buf, at);
        if (n < 0) {
            close(fd);
            return -1;
        }
        sha256_update(c, buf, (size_t)n);
    }
    close(fd);
    return 0;
}

/* name, then the content of the file at path (none when it cannot be read) */
static void hash_named(struct sha256_ctx *c, const char *name, const char *path)
{
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

static void hash_file(struct sha256_ctx *c, const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    hash_named(c, name, path);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int modelid_compute(const char *dir, char out[SHA256_HEX_LEN + 1], struct rl_err *err)
{
    struct sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, "redlm-model-id-v2", 17); /* v2: sampled weight bytes */
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
        if (hash_samples(&c, dir, (long long)fst.st_size))
            return rl_errf(err, RL_EIO, "%s: cannot read the model file", dir);
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
        if (size >= 0 && hash_samples(&c, path, size)) {
            for (int j = i + 1; j < n; j++)
                free(names[j]);
            return rl_errf(err, RL_EIO, "%s: cannot read the weights", path);
        }
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
    struct stat st = {0};
    if (stat(dir, &st) != 0)
        st.st_mode = 0;
    if (S_ISREG(st.st_mode)) { /* a GGUF adapter: the one file */
        FILE *f = fopen(dir, "rb");
        if (!f)
            return rl_errf(err, RL_EIO, "%s: cannot read the adapter file", dir);
        fclose(f);
        const char *slash = strrchr(dir, '/');
        hash_named(&c, slash ? slash + 1 : dir, dir);
    }
    for (size_t i = 0; !S_ISREG(st.st_mode) && i < sizeof files / sizeof files[0]; i++) {
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

int modelid_of(const struct modelref *m, char out[SHA256_HEX_LEN + 1], struct rl_err *err)
{
    char base[SHA256_HEX_LEN + 1];
    int rc = modelid_compute(m->dir, m->adapter[0] ? base : out, err);
    if (rc || !m->adapter[0])
        return rc;
    return modelid_lora(base, m->adapter, out, err);
}
