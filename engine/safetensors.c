/* engine/safetensors.c - the safetensors reader and writer.
 *
 * Reading. A file is an 8-byte little-endian header length N, N bytes of
 * JSON naming each tensor's dtype, shape and [begin, end) byte range, then
 * the data section the ranges point into. The header comes from outside, so
 * nothing in it is trusted: every number is checked to be an exact
 * non-negative integer before it is used, every product is overflow-checked,
 * and the tensor table is only published once the whole header (and, for a
 * sharded checkpoint, the whole index) has been validated. Files are mapped
 * read-only (MAP_PRIVATE) and tensor data is handed out as pointers into the
 * mapping, so a 28 GB checkpoint costs page-cache, not heap.
 *
 * Invariants of a published struct st_file: every tensor's data lies inside
 * its shard's data section; no two non-empty tensors overlap; names are
 * unique across all shards; byte length == product(shape) * dtype size.
 * `by_name` is a sorted view used by st_find (binary search) and to detect
 * duplicates, which cJSON keeps silently.
 *
 * Writing. st_writer collects (name, dtype, shape, data or fill callback)
 * records, then writes one file: the header in add order, padded with
 * spaces to a multiple of 8 so the data section starts 8-byte aligned, then
 * the data straight from the caller's buffers (or from the callback through
 * one bounded staging buffer), so files of tens of GB never sit in memory.
 * The file is written under a temporary name and renamed into place, so a
 * crash never leaves a truncated checkpoint under the real name.
 *
 * Callers: engine/model.c (loading), engine/mkmodel.c (writing), tests and
 * the fuzz target. No globals; one st_file may be read from many threads
 * once opened, except st_mark_used, which the loader calls single-threaded. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "file.h"

/* A header beyond this is hostile or broken: real ones are well under 1 MB
 * even for 1000-tensor shards. */
#define ST_MAX_HEADER (100u * 1000u * 1000u)
/* Same idea for model.safetensors.index.json. */
#define ST_MAX_INDEX (100u * 1000u * 1000u)
/* Largest integer a double (cJSON's number type) holds exactly. */
#define ST_MAX_EXACT 9007199254740992.0 /* 2^53 */

static const struct {
    const char *name;
    size_t size;
} dtype_info[ST_N_DTYPES] = {
    [ST_F32] = {"F32", 4},     [ST_F16] = {"F16", 2},          [ST_BF16] = {"BF16", 2},
    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F64] = {"F64", 8},      [ST_I64] = {"I64", 8},
    [ST_I32] = {"I32", 4},     [ST_I16] = {"I16", 2},          [ST_I8] = {"I8", 1},
    [ST_U8] = {"U8", 1},       [ST_BOOL] = {"BOOL", 1},
};

size_t st_dtype_size(enum st_dtype dt)
{
    return (unsigned)dt < ST_N_DTYPES ? dtype_info[dt].size : 0;
}

const char *st_dtype_name(enum st_dtype dt)
{
    return (unsigned)dt < ST_N_DTYPES ? dtype_info[dt].name : "INVALID";
}

int st_dtype_from_name(const char *s, enum st_dtype *out)
{
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (!strcmp(s, dtype_info[i].name)) {
            *out = (enum st_dtype)i;
            return 0;
        }
    return -1;
}

/* ---- the reader's data structures ---- */

struct st_shard {
    char *path;          /* as opened (or the name given to st_parse_buffer) */
    void *map;           /* NULL when the image is caller-owned */
    size_t map_len;
    const uint8_t *data; /* start of the data section */
    size_t data_len;
};

/* The public record first, so a `const struct st_tensor *` handed out can be
 * turned back into its entry. */
struct st_entry {
    struct st_tensor t;
    uint64_t begin, end; /* relative to the shard's data section */
    int shard;
    int used;
};

struct st_file {
    struct st_shard *shards;
    int n_shards;
    struct st_entry *ents;
    int n_ents, cap_ents;
    const struct st_entry **by_name; /* (n_ents) sorted by name */
};

static void file_free(struct st_file *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n_ents; i++)
        free((char *)f->ents[i].t.name);
    for (int i = 0; i < f->n_shards; i++) {
        if (f->shards[i].map)
            munmap(f->shards[i].map, f->shards[i].map_len);
        free(f->shards[i].path);
    }
    free(f->shards);
    free(f->ents);
    free(f->by_name);
    free(f);
}

void st_close(struct st_file *f)
{
    file_free(f);
}

static int add_shard(struct st_file *f, const char *path, struct rl_err *err)
{
    struct st_shard *s = realloc(f->shards, (size_t)(f->n_shards + 1) * sizeof *s);
    if (!s)
        return rl_errf(err, RL_ENOMEM, "%s: out of memory", path);
    f->shards = s;
    memset(&s[f->n_shards], 0, sizeof *s);
    if (!(s[f->n_shards].path = strdup(path)))
        return rl_errf(err, RL_ENOMEM, "%s: out of memory", path);
    f->n_shards++;
    return 0;
}

static struct st_entry *new_entry(struct st_file *f)
{
    if (f->n_ents == f->cap_ents) {
        int cap = f->cap_ents ? f->cap_ents * 2 : 64;
        struct st_entry *e = realloc(f->ents, (size_t)cap * sizeof *e);
        if (!e)
            return NULL;
        f->ents = e;
        f->cap_ents = cap;
    }
    struct st_entry *e = &f->ents[f->n_ents++];
    memset(e, 0, sizeof *e);
    return e;
}

/* Reads an exact non-negative integer no larger than 2^53 from a cJSON
 * number; floats, negatives, NaN and huge values are refused. */
static int json_u64(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > ST_MAX_EXACT || d != (double)(uint64_t)d)
        return -1;
    *out = (uint64_t)d;
    return 0;
}

/* Parses one tensor entry of a header into *e (name not yet set). */
static int parse_entry(struct st_entry *e, const cJSON *obj, const char *file, const char *name,
                       uint64_t data_len, struct rl_err *err)
{
    if (!cJSON_IsObject(obj))
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": entry is not an object", file, name);
    const cJSON *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *k = obj->child; k; k = k->next) {
        const cJSON **slot = !strcmp(k->string, "dtype")          ? &dtype
                             : !strcmp(k->string, "shape")        ? &shape
                             : !strcmp(k->string, "data_offsets") ? &offs
                                                                  : NULL;
        if (!slot)
            return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": unexpected key \"%s\"", file, name,
                           k->string);
        if (*slot)
            return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": key \"%s\" appears twice", file,
                           name, k->string);
        *slot = k;
    }
    if (!dtype || !shape || !offs)
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": missing key \"%s\"", file, name,
                       !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
    if (!cJSON_IsString(dtype))
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": dtype is not a string", file, name);
    if (st_dtype_from_name(dtype->valuestring, &e->t.dtype))
        return rl_errf(err, RL_EUNSUPPORTED, "%s: tensor \"%s\": unsupported dtype \"%.40s\"", file,
                       name, dtype->valuestring);

    if (!cJSON_IsArray(shape))
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": shape is not an array", file, name);
    int nd = cJSON_GetArraySize(shape);
    if (nd > ST_MAX_DIMS)
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": shape has %d dims (max %d)", file, name,
                       nd, ST_MAX_DIMS);
    e->t.n_dims = nd;
    uint64_t n_elem = 1;
    int i = 0;
    int overflow = 0;
    for (const cJSON *d = shape->child; d; d = d->next, i++) {
        uint64_t v;
        if (json_u64(d, &v))
            return rl_errf(err, RL_EFORMAT,
                           "%s: tensor \"%s\": shape[%d] is not a non-negative integer", file, name,
                           i);
        e->t.shape[i] = (int64_t)v;
        if (v && n_elem > UINT64_MAX / v)
            overflow = 1; /* keep going: a later 0 dim still makes it empty */
        else
            n_elem *= v;
    }
    uint64_t n_bytes;
    /* a zero anywhere makes the tensor empty whatever the other dims say */
    for (int j = 0; j < nd; j++)
        if (e->t.shape[j] == 0)
            overflow = 0, n_elem = 0;
    if (overflow || __builtin_mul_overflow(n_elem, (uint64_t)st_dtype_size(e->t.dtype), &n_bytes))
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": element count overflows", file, name);

    uint64_t b, en;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || json_u64(offs->child, &b) ||
        json_u64(offs->child->next, &en))
        return rl_errf(err, RL_EFORMAT,
                       "%s: tensor \"%s\": data_offsets must be [begin, end] non-negative integers",
                       file, name);
    if (b > en)
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": data_offsets begin %llu > end %llu",
                       file, name, (unsigned long long)b, (unsigned long long)en);
    if (en > data_len)
        return rl_errf(err, RL_EFORMAT,
                       "%s: tensor \"%s\": data_offsets end %llu is beyond the data section (%llu bytes)",
                       file, name, (unsigned long long)en, (unsigned long long)data_len);
    if (en - b != n_bytes)
        return rl_errf(err, RL_EFORMAT,
                       "%s: tensor \"%s\": %llu bytes but shape x %s needs %llu", file, name,
                       (unsigned long long)(en - b), st_dtype_name(e->t.dtype),
                       (unsigned long long)n_bytes);
    e->begin = b;
    e->end = en;
    e->t.n_bytes = (size_t)n_bytes;
    return 0;
}

static int cmp_begin(const void *a, const void *b)
{
    const struct st_entry *x = *(const struct st_entry *const *)a,
                          *y = *(const struct st_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* Checks that no two non-empty tensors of shard `si` share a byte. */
static int check_overlap(const struct st_file *f, int si, int first, struct rl_err *err)
{
    int n = f->n_ents - first;
    if (n < 2)
        return 0;
    const struct st_entry **v = malloc((size_t)n * sizeof *v);
    if (!v)
        return rl_errf(err, RL_ENOMEM, "%s: out of memory", f->shards[si].path);
    for (int i = 0; i < n; i++)
        v[i] = &f->ents[first + i];
    qsort(v, (size_t)n, sizeof *v, cmp_begin);
    const struct st_entry *last = NULL; /* the non-empty tensor reaching furthest */
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (v[i]->begin == v[i]->end)
            continue;
        if (last && v[i]->begin < last->end) {
            rc = rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" overlaps tensor \"%s\"",
                         f->shards[si].path, v[i]->t.name, last->t.name);
            break;
        }
        if (!last || v[i]->end > last->end)
            last = v[i];
    }
    free(v);
    return rc;
}

/* Parses the image of shard `si` (buf, len) and appends its tensors. */
static int parse_image(struct st_file *f, int si, const uint8_t *buf, size_t len,
                       struct rl_err *err)
{
    const char *file = f->shards[si].path;
    if (len < 8)
        return rl_errf(err, RL_EFORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length",
                       file, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | buf[i];
    if (hlen > len - 8)
        return rl_errf(err, RL_EFORMAT, "%s: header length %llu is beyond the file (%zu bytes)",
                       file, (unsigned long long)hlen, len);
    if (hlen > ST_MAX_HEADER)
        return rl_errf(err, RL_EFORMAT, "%s: header length %llu is absurdly large (max %u)", file,
                       (unsigned long long)hlen, ST_MAX_HEADER);
    const char *hdr = (const char *)buf + 8;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!root)
        return rl_errf(err, RL_EFORMAT, "%s: header is not valid JSON (near byte %lld)", file,
                       end ? (long long)(end - hdr) : -1LL);
    int rc = 0;
    /* writers pad with spaces; anything else after the object is garbage */
    for (const char *p = end; p < hdr + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            rc = rl_errf(err, RL_EFORMAT, "%s: header has trailing bytes after the JSON object",
                         file);
            goto out;
        }
    if (!cJSON_IsObject(root)) {
        rc = rl_errf(err, RL_EFORMAT, "%s: header is not a JSON object", file);
        goto out;
    }
    struct st_shard *sh = &f->shards[si];
    sh->data = buf + 8 + hlen;
    sh->data_len = len - 8 - (size_t)hlen;
    int first = f->n_ents, seen_meta = 0;
    for (const cJSON *k = root->child; k; k = k->next) {
        if (!strcmp(k->string, "__metadata__")) {
            if (seen_meta++) {
                rc = rl_errf(err, RL_EFORMAT, "%s: \"__metadata__\" appears twice", file);
                goto out;
            }
            if (!cJSON_IsObject(k)) {
                rc = rl_errf(err, RL_EFORMAT, "%s: \"__metadata__\" is not an object", file);
                goto out;
            }
            for (const cJSON *m = k->child; m; m = m->next)
                if (!cJSON_IsString(m)) {
                    rc = rl_errf(err, RL_EFORMAT, "%s: \"__metadata__\" value \"%s\" is not a string",
                                 file, m->string);
                    goto out;
                }
            continue;
        }
        struct st_entry *e = new_entry(f);
        if (!e) {
            rc = rl_errf(err, RL_ENOMEM, "%s: out of memory", file);
            goto out;
        }
        e->shard = si;
        if (!(e->t.name = strdup(k->string))) {
            rc = rl_errf(err, RL_ENOMEM, "%s: out of memory", file);
            goto out;
        }
        if ((rc = parse_entry(e, k, file, k->string, sh->data_len, err)))
            goto out;
        e->t.data = sh->data + e->begin;
        e->t.file = sh->path;
    }
    rc = check_overlap(f, si, first, err);
out:
    cJSON_Delete(root);
    return rc;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const struct st_entry *const *)a)->t.name,
                  (*(const struct st_entry *const *)b)->t.name);
}

/* Builds the sorted name view and rejects a name seen twice (in one header,
 * which cJSON keeps, or across shards). */
static int index_names(struct st_file *f, struct rl_err *err)
{
    free(f->by_name);
    f->by_name = malloc((size_t)(f->n_ents ? f->n_ents : 1) * sizeof *f->by_name);
    if (!f->by_name)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    for (int i = 0; i < f->n_ents; i++)
        f->by_name[i] = &f->ents[i];
    qsort(f->by_name, (size_t)f->n_ents, sizeof *f->by_name, cmp_name);
    for (int i = 1; i < f->n_ents; i++)
        if (!strcmp(f->by_name[i]->t.name, f->by_name[i - 1]->t.name)) {
            const struct st_entry *a = f->by_name[i - 1], *b = f->by_name[i];
            if (a->shard == b->shard)
                return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" is named twice", a->t.file,
                               a->t.name);
            return rl_errf(err, RL_EFORMAT, "tensor \"%s\" is in both %s and %s", a->t.name,
                           a->t.file, b->t.file);
        }
    return 0;
}

int st_parse_buffer(struct st_file **out, const void *buf, size_t len, const char *name,
                    struct rl_err *err)
{
    *out = NULL;
    struct st_file *f = calloc(1, sizeof *f);
    if (!f)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    int rc;
    if ((rc = add_shard(f, name ? name : "(buffer)", err)) ||
        (rc = parse_image(f, 0, buf, len, err)) || (rc = index_names(f, err))) {
        file_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

/* Maps shard `si` and parses it. */
static int map_shard(struct st_file *f, int si, struct rl_err *err)
{
    struct st_shard *s = &f->shards[si];
    int fd = open(s->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rl_errf(err, errno == ENOENT ? RL_ENOTFOUND : RL_EIO, "%s: %s", s->path,
                       strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        int e = errno;
        close(fd);
        return rl_errf(err, RL_EIO, "%s: %s", s->path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return rl_errf(err, RL_EIO, "%s: not a regular file", s->path);
    }
    size_t len = (size_t)st.st_size;
    if (len < 8) {
        close(fd);
        return rl_errf(err, RL_EFORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length",
                       s->path, len);
    }
    void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file alive */
    if (m == MAP_FAILED)
        return rl_errf(err, RL_EIO, "%s: mmap: %s", s->path, strerror(e));
    s->map = m;
    s->map_len = len;
    /* The header is read right now; the weights are read by the loader in
     * its own order, so only the first pages get a read-ahead hint. */
    madvise(m, len < (1u << 20) ? len : (1u << 20), MADV_WILLNEED);
    return parse_image(f, si, m, len, err);
}

int st_prefetch(const struct st_file *f)
{
    int rc = 0;
    for (int i = 0; i < f->n_shards; i++)
        if (f->shards[i].map && madvise(f->shards[i].map, f->shards[i].map_len, MADV_WILLNEED))
            rc = -RL_EIO;
    return rc;
}

struct map_ent {
    const char *name;
    int shard;
};

static int cmp_map_ent(const void *a, const void *b)
{
    return strcmp(((const struct map_ent *)a)->name, ((const struct map_ent *)b)->name);
}

static const struct st_entry *find_ent(const struct st_file *f, const char *name)
{
    int lo = 0, hi = f->n_ents - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->t.name, name);
        if (!c)
            return f->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

/* Opens the shards named by `index` (path of model.safetensors.index.json
 * inside `dir`) and checks the weight map against their contents. */
static int open_index(struct st_file *f, const char *dir, const char *index, struct rl_err *err)
{
    cJSON *root;
    int rc = file_read_json(index, ST_MAX_INDEX, &root, err);
    if (rc)
        return rc;
    struct map_ent *me = NULL;
    int n_me = 0;
    char path[4096];
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    if (meta && !cJSON_IsObject(meta) && !cJSON_IsNull(meta)) {
        rc = rl_errf(err, RL_EFORMAT, "%s: \"metadata\" is not an object", index);
        goto out;
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        rc = rl_errf(err, RL_EFORMAT, "%s: \"weight_map\" is missing or not an object", index);
        goto out;
    }
    int n = cJSON_GetArraySize(wm);
    me = malloc((size_t)(n ? n : 1) * sizeof *me);
    if (!me) {
        rc = rl_errf(err, RL_ENOMEM, "out of memory");
        goto out;
    }
    for (const cJSON *k = wm->child; k; k = k->next) {
        if (!cJSON_IsString(k) || !k->valuestring[0] || strchr(k->valuestring, '/') ||
            !strcmp(k->valuestring, "..") || !strcmp(k->valuestring, ".")) {
            rc = rl_errf(err, RL_EFORMAT,
                         "%s: weight_map entry for tensor \"%s\" is not a shard file name", index,
                         k->string);
            goto out;
        }
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, k->valuestring) >= sizeof path) {
            rc = rl_errf(err, RL_EINVAL, "%s: shard path too long", index);
            goto out;
        }
        int si = -1;
        for (int i = 0; i < f->n_shards; i++)
            if (!strcmp(f->shards[i].path, path))
                si = i;
        if (si < 0) {
            if ((rc = add_shard(f, path, err)))
                goto out;
            si = f->n_shards - 1;
            if ((rc = map_shard(f, si, err))) {
                if (rc != -RL_EFORMAT) { /* a missing shard is a bad index */
                    char why[RL_ERR_MSG_MAX] = "";
                    if (err)
                        memcpy(why, err->msg, sizeof why);
                    rc = rl_errf(err, RL_EFORMAT,
                                 "%s: shard \"%s\" named for tensor \"%s\" cannot be opened: %.200s",
                                 index, k->valuestring, k->string, why);
                }
                goto out;
            }
        }
        me[n_me].name = k->string;
        me[n_me].shard = si;
        n_me++;
    }
    if ((rc = index_names(f, err)))
        goto out;
    qsort(me, (size_t)n_me, sizeof *me, cmp_map_ent);
    for (int i = 0; i < n_me; i++) {
        if (i && !strcmp(me[i].name, me[i - 1].name)) {
            rc = rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" is listed twice in weight_map", index,
                         me[i].name);
            goto out;
        }
        const struct st_entry *e = find_ent(f, me[i].name);
        if (!e || e->shard != me[i].shard) {
            rc = rl_errf(err, RL_EFORMAT, "%s: weight_map puts tensor \"%s\" in %s, which does not hold it",
                         index, me[i].name, f->shards[me[i].shard].path);
            goto out;
        }
    }
    for (int i = 0; i < f->n_ents; i++) {
        struct map_ent key = {f->ents[i].t.name, 0};
        if (!bsearch(&key, me, (size_t)n_me, sizeof *me, cmp_map_ent)) {
            rc = rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" is not in the weight_map of %s",
                         f->ents[i].t.file, f->ents[i].t.name, index);
            goto out;
        }
    }
out:
    free(me);
    cJSON_Delete(root);
    return rc;
}

int st_open(struct st_file **out, const char *path, struct rl_err *err)
{
    *out = NULL;
    struct stat st;
    if (stat(path, &st))
        return rl_errf(err, errno == ENOENT ? RL_ENOTFOUND : RL_EIO, "%s: %s", path,
                       strerror(errno));
    struct st_file *f = calloc(1, sizeof *f);
    if (!f)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    int rc = 0;
    if (S_ISDIR(st.st_mode)) {
        char p[4096];
        if ((size_t)snprintf(p, sizeof p, "%s/model.safetensors.index.json", path) >= sizeof p) {
            rc = rl_errf(err, RL_EINVAL, "%s: path too long", path);
            goto out;
        }
        if (!access(p, F_OK)) {
            rc = open_index(f, path, p, err);
            goto out;
        }
        snprintf(p, sizeof p, "%s/model.safetensors", path);
        if (access(p, F_OK)) {
            rc = rl_errf(err, RL_ENOTFOUND,
                         "%s: no model.safetensors or model.safetensors.index.json", path);
            goto out;
        }
        if (!(rc = add_shard(f, p, err)) && !(rc = map_shard(f, 0, err)))
            rc = index_names(f, err);
    } else if (!(rc = add_shard(f, path, err)) && !(rc = map_shard(f, 0, err))) {
        rc = index_names(f, err);
    }
out:
    if (rc) {
        file_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

const struct st_tensor *st_find(const struct st_file *f, const char *name)
{
    const struct st_entry *e = find_ent(f, name);
    return e ? &e->t : NULL;
}

int st_n_tensors(const struct st_file *f)
{
    return f->n_ents;
}

const struct st_tensor *st_get(const struct st_file *f, int i)
{
    return i >= 0 && i < f->n_ents ? &f->ents[i].t : NULL;
}

void st_mark_used(struct st_file *f, const struct st_tensor *t)
{
    struct st_entry *e = (struct st_entry *)t;
    if (e >= f->ents && e < f->ents + f->n_ents)
        e->used = 1;
}

const struct st_tensor *st_first_unused(const struct st_file *f)
{
    for (int i = 0; i < f->n_ents; i++)
        if (!f->ents[i].used)
            return &f->ents[i].t;
    return NULL;
}

/* ---- writing ---- */

struct st_wtensor {
    char *name;
    enum st_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    uint64_t n_bytes;
    const void *data;   /* or NULL with fill */
    st_fill_fn fill;
    void *fill_ctx;
};

struct st_writer {
    struct st_wtensor *t;
    int n, cap;
    uint64_t data_bytes;
};

int st_writer_create(struct st_writer **out, struct rl_err *err)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : rl_errf(err, RL_ENOMEM, "out of memory");
}

void st_writer_free(struct st_writer *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->n; i++)
        free(w->t[i].name);
    free(w->t);
    free(w);
}

static int writer_add(struct st_writer *w, const char *name, enum st_dtype dt, int n_dims,
                      const int64_t *shape, const void *data, st_fill_fn fill, void *ctx,
                      struct rl_err *err)
{
    if (!name || !strcmp(name, "__metadata__"))
        return rl_errf(err, RL_EINVAL, "st_writer_add: bad tensor name \"%s\"", name ? name : "(null)");
    if (!st_dtype_size(dt))
        return rl_errf(err, RL_EINVAL, "st_writer_add: tensor \"%s\": invalid dtype %d", name, (int)dt);
    if (n_dims < 0 || n_dims > ST_MAX_DIMS)
        return rl_errf(err, RL_EINVAL, "st_writer_add: tensor \"%s\": %d dims", name, n_dims);
    uint64_t nb = st_dtype_size(dt);
    for (int i = 0; i < n_dims; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(nb, (uint64_t)shape[i], &nb))
            return rl_errf(err, RL_EINVAL, "st_writer_add: tensor \"%s\": bad shape", name);
    for (int i = 0; i < w->n; i++) /* writers add hundreds, not millions */
        if (!strcmp(w->t[i].name, name))
            return rl_errf(err, RL_EINVAL, "st_writer_add: tensor \"%s\" added twice", name);
    if (nb && !data && !fill)
        return rl_errf(err, RL_EINVAL, "st_writer_add: tensor \"%s\" has no data", name);
    if (w->n == w->cap) {
        int cap = w->cap ? w->cap * 2 : 64;
        struct st_wtensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t)
            return rl_errf(err, RL_ENOMEM, "out of memory");
        w->t = t;
        w->cap = cap;
    }
    struct st_wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name)))
        return rl_errf(err, RL_ENOMEM, "out of memory");
    t->dtype = dt;
    t->n_dims = n_dims;
    for (int i = 0; i < n_dims; i++)
        t->shape[i] = shape[i];
    t->n_bytes = nb;
    t->data = data;
    t->fill = fill;
    t->fill_ctx = ctx;
    w->data_bytes += nb;
    w->n++;
    return 0;
}

int st_writer_add(struct st_writer *w, const char *name, enum st_dtype dt, int n_dims,
                  const int64_t *shape, const void *data, struct rl_err *err)
{
    return writer_add(w, name, dt, n_dims, shape, data, NULL, NULL, err);
}

int st_writer_add_fill(struct st_writer *w, const char *name, enum st_dtype dt, int n_dims,
                       const int64_t *shape, st_fill_fn fill, void *ctx, struct rl_err *err)
{
    if (!fill)
        return rl_errf(err, RL_EINVAL, "st_writer_add_fill: tensor \"%s\": no fill function", name);
    return writer_add(w, name, dt, n_dims, shape, NULL, fill, ctx, err);
}

/* Builds the padded header; *len gets its length (a multiple of 8). */
static char *build_header(const struct st_writer *w, uint64_t *len)
{
    cJSON *root = cJSON_CreateObject(), *meta = NULL;
    if (!root)
        return NULL;
    if (!(meta = cJSON_AddObjectToObject(root, "__metadata__")) ||
        !cJSON_AddStringToObject(meta, "format", "pt"))
        goto fail;
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const struct st_wtensor *t = &w->t[i];
        cJSON *e = cJSON_AddObjectToObject(root, t->name), *sh, *of;
        if (!e || !cJSON_AddStringToObject(e, "dtype", st_dtype_name(t->dtype)) ||
            !(sh = cJSON_AddArrayToObject(e, "shape")))
            goto fail;
        for (int d = 0; d < t->n_dims; d++) {
            cJSON *v = cJSON_CreateNumber((double)t->shape[d]);
            if (!v || !cJSON_AddItemToArray(sh, v))
                goto fail;
        }
        if (!(of = cJSON_AddArrayToObject(e, "data_offsets")))
            goto fail;
        cJSON *b = cJSON_CreateNumber((double)off), *en = cJSON_CreateNumber((double)(off + t->n_bytes));
        if (!b || !cJSON_AddItemToArray(of, b) || !en || !cJSON_AddItemToArray(of, en))
            goto fail;
        off += t->n_bytes;
    }
    char *js = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!js)
        return NULL;
    size_t n = strlen(js), padded = (n + 7) & ~(size_t)7;
    char *out = realloc(js, padded + 1);
    if (!out) {
        free(js);
        return NULL;
    }
    memset(out + n, ' ', padded - n);
    out[padded] = 0;
    *len = padded;
    return out;
fail:
    cJSON_Delete(root);
    return NULL;
}

int st_writer_write(struct st_writer *w, const char *path, struct rl_err *err)
{
    uint64_t hlen = 0;
    char *hdr = build_header(w, &hlen);
    if (!hdr)
        return rl_errf(err, RL_ENOMEM, "%s: out of memory building the header", path);
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++)
        lenb[i] = (uint8_t)(hlen >> (8 * i));
    struct file_out *fo;
    int rc = file_out_open(&fo, path, err);
    if (!rc) {
        rc = file_out_write(fo, lenb, 8, err);
        if (!rc)
            rc = file_out_write(fo, hdr, (size_t)hlen, err);
        for (int i = 0; i < w->n && !rc; i++) {
            const struct st_wtensor *t = &w->t[i];
            if (t->data)
                rc = file_out_write(fo, t->data, (size_t)t->n_bytes, err);
            else if ((rc = file_out_fill(fo, t->n_bytes, t->fill, t->fill_ctx, err)))
                rl_err_wrap(err, "%s: tensor \"%s\"", path, t->name);
        }
        if (rc)
            file_out_abort(fo);
        else
            rc = file_out_commit(fo, err);
    }
    free(hdr);
    return rc;
}
