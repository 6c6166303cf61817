/* engine/gguf.c - the GGUF v3 reader and writer (see gguf.h).
 *
 * The layout (ggml's docs/gguf.md), all little-endian:
 *
 *   "GGUF"  u32 version (3)  u64 n_tensors  u64 n_kv
 *   n_kv x  { string key, u32 value type, value }
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml type,
 *                 u64 offset (from the data section, a multiple of the
 *                 alignment) }
 *   padding to general.alignment (default 32), then the data section.
 *
 * A string is a u64 length and that many bytes (no NUL). An array value is
 * a u32 element type, a u64 count, then the elements; arrays of arrays are
 * refused (no model redlm reads has one, and ggml's own reader refuses
 * them too).
 *
 * Reading trusts nothing in the file: every count and length is checked
 * against the bytes left before it is used, products are overflow-checked,
 * and the tables are only handed out once the whole header has parsed, so
 * a fuzzer gets an error, never a crash. Metadata values are not copied:
 * each key records where its value lies in the mapping; string arrays get
 * an offset table so element i is found without walking the array (the
 * tokenizer reads 150k of them). Keys and tensor names are copied as C
 * strings (they must hold no NUL).
 *
 * Writing serialises metadata into one growing buffer as it is added and
 * streams tensor data from the caller's buffers or fill callbacks, so a
 * 9 GB model file needs no more memory than its tokenizer arrays.
 *
 * Callers: engine/model.c (loading), engine/tokenizer.c (a GGUF's
 * tokenizer), engine/mkmodel.c (writing), tests and the fuzz target. No
 * globals; an opened file may be read from many threads, except the
 * used-marks, which the loader sets single-threaded. */
#include "gguf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_VERSION 3
#define GGUF_MAX_NAME 256    /* tensor names; ggml's limit is 64 */
#define GGUF_MAX_KEY 65535

/* ---- ggml types ---- */

static const struct {
    uint32_t id;
    const char *name;
    int block;        /* elements per block; 0: not sized here */
    int bytes;        /* bytes per block */
} ttypes[] = {
    {0, "F32", 1, 4},       {1, "F16", 1, 2},       {2, "Q4_0", 32, 18},   {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},    {7, "Q5_1", 32, 24},    {8, "Q8_0", 32, 34},   {9, "Q8_1", 0, 0},
    {10, "Q2_K", 256, 84},  {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210}, {15, "Q8_K", 0, 0},     {16, "IQ2_XXS", 0, 0}, {17, "IQ2_XS", 0, 0},
    {18, "IQ3_XXS", 0, 0},  {19, "IQ1_S", 0, 0},    {20, "IQ4_NL", 32, 18}, {21, "IQ3_S", 0, 0},
    {22, "IQ2_S", 0, 0},    {23, "IQ4_XS", 256, 136}, {24, "I8", 0, 0},    {25, "I16", 0, 0},
    {26, "I32", 0, 0},      {27, "I64", 0, 0},      {28, "F64", 0, 0},     {29, "IQ1_M", 0, 0},
    {30, "BF16", 1, 2},     {34, "TQ1_0", 0, 0},    {35, "TQ2_0", 0, 0},   {39, "MXFP4", 0, 0},
};

static int ttype_index(uint32_t id)
{
    for (size_t i = 0; i < sizeof ttypes / sizeof ttypes[0]; i++)
        if (ttypes[i].id == id)
            return (int)i;
    return -1;
}

const char *gguf_type_name(uint32_t type, char buf[16])
{
    int i = ttype_index(type);
    if (i >= 0)
        return ttypes[i].name;
    snprintf(buf, 16, "type %u", type);
    return buf;
}

static const char *vtype_name(uint32_t t)
{
    static const char *const n[] = {"uint8", "int8",  "uint16", "int16",  "uint32",
                                    "int32", "float32", "bool", "string", "array",
                                    "uint64", "int64", "float64"};
    return t < sizeof n / sizeof n[0] ? n[t] : "unknown";
}

/* Bytes of one scalar of type t; 0 for string/array/unknown. */
static size_t vtype_size(uint32_t t)
{
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

/* ---- the reader's data ---- */

struct gguf_kv {
    char *key;
    uint32_t type;       /* value type */
    uint32_t atype;      /* arrays: element type */
    uint64_t n;          /* arrays: element count */
    const uint8_t *val;  /* scalar bytes, string length field, or first element */
    uint64_t *str_off;   /* string arrays: (n) offsets from val of each length field */
};

struct gguf_ent {
    struct gguf_tensor t; /* first, so a handed-out pointer maps back */
    uint64_t off;         /* from the data section */
    int used;
};

struct gguf_file {
    char *path;
    void *map;            /* NULL for a caller's buffer */
    size_t map_len;
    struct gguf_kv *kv;
    uint64_t n_kv;
    struct gguf_ent *ents;
    uint64_t n_ents;
};

void gguf_close(struct gguf_file *f)
{
    if (!f)
        return;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        free(f->kv[i].key);
        free(f->kv[i].str_off);
    }
    for (uint64_t i = 0; i < f->n_ents; i++)
        free((char *)f->ents[i].t.name);
    free(f->kv);
    free(f->ents);
    if (f->map)
        munmap(f->map, f->map_len);
    free(f->path);
    free(f);
}

const char *gguf_path(const struct gguf_file *f) { return f->path; }

/* ---- a bounds-checked cursor ---- */

struct rd {
    const uint8_t *b;
    size_t len, pos;
    const char *file;
};

static inline int rd_has(const struct rd *r, uint64_t n) { return n <= r->len - r->pos; }

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static int rd_u32(struct rd *r, uint32_t *v)
{
    if (!rd_has(r, 4))
        return -1;
    *v = (uint32_t)le(r->b + r->pos, 4);
    r->pos += 4;
    return 0;
}

static int rd_u64(struct rd *r, uint64_t *v)
{
    if (!rd_has(r, 8))
        return -1;
    *v = le(r->b + r->pos, 8);
    r->pos += 8;
    return 0;
}

/* A string: *p at its bytes, *n its length. */
static int rd_str(struct rd *r, const uint8_t **p, uint64_t *n)
{
    if (rd_u64(r, n) || !rd_has(r, *n))
        return -1;
    *p = r->b + r->pos;
    r->pos += (size_t)*n;
    return 0;
}

/* A copy of a key or name: non-empty, at most max bytes, no NUL. */
static char *name_dup(const uint8_t *p, uint64_t n, uint64_t max)
{
    if (n == 0 || n > max || memchr(p, 0, (size_t)n))
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (s) {
        memcpy(s, p, (size_t)n);
        s[n] = 0;
    }
    return s;
}

/* Skips one value of type t (not an array) at the cursor. */
static int skip_value(struct rd *r, uint32_t t)
{
    if (t == GGUF_VT_STRING) {
        const uint8_t *p;
        uint64_t n;
        return rd_str(r, &p, &n);
    }
    size_t sz = vtype_size(t);
    if (!sz || !rd_has(r, sz))
        return -1;
    r->pos += sz;
    return 0;
}

static int parse_kv(struct gguf_file *f, struct rd *r, uint64_t i, struct rl_err *err)
{
    struct gguf_kv *kv = &f->kv[i];
    const uint8_t *kp;
    uint64_t kn;
    if (rd_str(r, &kp, &kn))
        return rl_errf(err, RL_EFORMAT, "%s: metadata entry %llu: key runs past the end of the file",
                       f->path, (unsigned long long)i);
    if (!(kv->key = name_dup(kp, kn, GGUF_MAX_KEY)))
        return rl_errf(err, RL_EFORMAT, "%s: metadata entry %llu: key is empty, too long or holds a NUL",
                       f->path, (unsigned long long)i);
    if (rd_u32(r, &kv->type))
        return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\": type runs past the end of the file",
                       f->path, kv->key);
    kv->val = r->b + r->pos;
    if (kv->type != GGUF_VT_ARRAY) {
        if (kv->type > GGUF_VT_FLOAT64)
            return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\": unknown value type %u", f->path,
                           kv->key, kv->type);
        if (skip_value(r, kv->type))
            return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\": value runs past the end of the file",
                           f->path, kv->key);
        return 0;
    }
    if (rd_u32(r, &kv->atype) || rd_u64(r, &kv->n))
        return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\": array header runs past the end of the file",
                       f->path, kv->key);
    if (kv->atype == GGUF_VT_ARRAY)
        return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\": arrays of arrays are not supported",
                       f->path, kv->key);
    if (kv->atype > GGUF_VT_FLOAT64)
        return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\": unknown array element type %u",
                       f->path, kv->key, kv->atype);
    kv->val = r->b + r->pos;
    if (kv->atype != GGUF_VT_STRING) {
        size_t sz = vtype_size(kv->atype);
        if (kv->n > (r->len - r->pos) / sz)
            return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\": %llu elements run past the end of the file",
                           f->path, kv->key, (unsigned long long)kv->n);
        r->pos += (size_t)(kv->n * sz);
        return 0;
    }
    /* each string takes at least its 8-byte length */
    if (kv->n > (r->len - r->pos) / 8)
        return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\": %llu strings run past the end of the file",
                       f->path, kv->key, (unsigned long long)kv->n);
    if (!(kv->str_off = malloc((size_t)(kv->n ? kv->n : 1) * sizeof *kv->str_off)))
        return rl_errf(err, RL_ENOMEM, "%s: out of memory", f->path);
    for (uint64_t k = 0; k < kv->n; k++) {
        kv->str_off[k] = (uint64_t)(r->b + r->pos - kv->val);
        const uint8_t *p;
        uint64_t n;
        if (rd_str(r, &p, &n))
            return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\": string %llu runs past the end of the file",
                           f->path, kv->key, (unsigned long long)k);
    }
    return 0;
}

static int parse_tensor_info(struct gguf_file *f, struct rd *r, uint64_t i, struct rl_err *err)
{
    struct gguf_ent *e = &f->ents[i];
    const uint8_t *np;
    uint64_t nn;
    if (rd_str(r, &np, &nn))
        return rl_errf(err, RL_EFORMAT, "%s: tensor %llu: name runs past the end of the file", f->path,
                       (unsigned long long)i);
    if (!(e->t.name = name_dup(np, nn, GGUF_MAX_NAME)))
        return rl_errf(err, RL_EFORMAT, "%s: tensor %llu: name is empty, longer than %d bytes or holds a NUL",
                       f->path, (unsigned long long)i, GGUF_MAX_NAME);
    const char *name = e->t.name;
    uint32_t nd;
    if (rd_u32(r, &nd))
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": header runs past the end of the file",
                       f->path, name);
    if (nd < 1 || nd > GGUF_MAX_DIMS)
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": %u dims (1 to %d)", f->path, name, nd,
                       GGUF_MAX_DIMS);
    e->t.n_dims = (int)nd;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        e->t.ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t v;
        if (rd_u64(r, &v))
            return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": header runs past the end of the file",
                           f->path, name);
        if (v > ((uint64_t)1 << 48))
            return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": dim %u = %llu is absurd", f->path,
                           name, d, (unsigned long long)v);
        e->t.ne[d] = (int64_t)v;
    }
    if (rd_u32(r, &e->t.type) || rd_u64(r, &e->off))
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": header runs past the end of the file",
                       f->path, name);
    if (ttype_index(e->t.type) < 0)
        return rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\": unknown ggml type %u", f->path, name,
                       e->t.type);
    return 0;
}

static int cmp_ent_name(const void *a, const void *b)
{
    return strcmp((*(const struct gguf_ent *const *)a)->t.name,
                  (*(const struct gguf_ent *const *)b)->t.name);
}

static int cmp_ent_off(const void *a, const void *b)
{
    const struct gguf_ent *x = *(const struct gguf_ent *const *)a,
                          *y = *(const struct gguf_ent *const *)b;
    return x->off < y->off ? -1 : x->off > y->off ? 1 : 0;
}

static int cmp_kv_key(const void *a, const void *b)
{
    return strcmp((*(const struct gguf_kv *const *)a)->key, (*(const struct gguf_kv *const *)b)->key);
}

/* Names and keys unique; sized tensors inside the data and apart. */
static int check_tables(struct gguf_file *f, const uint8_t *data, uint64_t data_len,
                        uint32_t align, struct rl_err *err)
{
    uint64_t n = f->n_ents > f->n_kv ? f->n_ents : f->n_kv;
    const void **v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v)
        return rl_errf(err, RL_ENOMEM, "%s: out of memory", f->path);
    int rc = 0;
    char tb[16];
    for (uint64_t i = 0; i < f->n_kv; i++)
        v[i] = &f->kv[i];
    qsort(v, (size_t)f->n_kv, sizeof *v, cmp_kv_key);
    for (uint64_t i = 1; i < f->n_kv; i++)
        if (!cmp_kv_key(&v[i - 1], &v[i])) {
            rc = rl_errf(err, RL_EFORMAT, "%s: metadata key \"%s\" appears twice", f->path,
                         ((const struct gguf_kv *)v[i])->key);
            goto out;
        }
    for (uint64_t i = 0; i < f->n_ents; i++) {
        struct gguf_ent *e = &f->ents[i];
        v[i] = e;
        const char *tn = gguf_type_name(e->t.type, tb);
        int ti = ttype_index(e->t.type);
        if (e->off % align) {
            rc = rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" (%s): offset %llu is not a multiple of the alignment %u",
                         f->path, e->t.name, tn, (unsigned long long)e->off, align);
            goto out;
        }
        if (e->off > data_len) {
            rc = rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" (%s): offset %llu is beyond the data section (%llu bytes)",
                         f->path, e->t.name, tn, (unsigned long long)e->off, (unsigned long long)data_len);
            goto out;
        }
        e->t.data = data + e->off;
        if (!ttypes[ti].block)
            continue; /* not ours: refused by name when a loader asks for it */
        if (e->t.ne[0] % ttypes[ti].block) {
            rc = rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" (%s): %lld elements per row is not a multiple of the block (%d)",
                         f->path, e->t.name, tn, (long long)e->t.ne[0], ttypes[ti].block);
            goto out;
        }
        uint64_t bytes = (uint64_t)(e->t.ne[0] / ttypes[ti].block) * (uint64_t)ttypes[ti].bytes;
        int over = 0;
        for (int d = 1; d < GGUF_MAX_DIMS; d++)
            over |= __builtin_mul_overflow(bytes, (uint64_t)e->t.ne[d], &bytes);
        if (over || bytes > data_len - e->off) {
            rc = rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" (%s): %s at offset %llu run past the data section (%llu bytes)",
                         f->path, e->t.name, tn, over ? "its size overflows; its bytes" : "its bytes",
                         (unsigned long long)e->off, (unsigned long long)data_len);
            goto out;
        }
        e->t.n_bytes = (size_t)bytes;
    }
    qsort(v, (size_t)f->n_ents, sizeof *v, cmp_ent_name);
    for (uint64_t i = 1; i < f->n_ents; i++)
        if (!cmp_ent_name(&v[i - 1], &v[i])) {
            rc = rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" is named twice", f->path,
                         ((const struct gguf_ent *)v[i])->t.name);
            goto out;
        }
    qsort(v, (size_t)f->n_ents, sizeof *v, cmp_ent_off);
    const struct gguf_ent *last = NULL;
    for (uint64_t i = 0; i < f->n_ents; i++) {
        const struct gguf_ent *e = v[i];
        if (!e->t.n_bytes)
            continue;
        if (last && e->off < last->off + last->t.n_bytes) {
            rc = rl_errf(err, RL_EFORMAT, "%s: tensor \"%s\" overlaps tensor \"%s\"", f->path,
                         e->t.name, last->t.name);
            goto out;
        }
        if (!last || e->off + e->t.n_bytes > last->off + last->t.n_bytes)
            last = e;
    }
out:
    free(v);
    return rc;
}

static struct gguf_kv *find_kv(const struct gguf_file *f, const char *key)
{
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (!strcmp(f->kv[i].key, key))
            return &f->kv[i];
    return NULL;
}

static int parse(struct gguf_file *f, const uint8_t *buf, size_t len, struct rl_err *err)
{
    struct rd r = {buf, len, 0, f->path};
    uint32_t version;
    uint64_t n_t, n_kv;
    if (len < 4 || memcmp(buf, GGUF_MAGIC, 4))
        return rl_errf(err, RL_EFORMAT, "%s: not a GGUF file (no \"GGUF\" magic)", f->path);
    r.pos = 4;
    if (rd_u32(&r, &version) || rd_u64(&r, &n_t) || rd_u64(&r, &n_kv))
        return rl_errf(err, RL_EFORMAT, "%s: file is %zu bytes, shorter than the GGUF header", f->path, len);
    if (version != GGUF_VERSION)
        return rl_errf(err, RL_EUNSUPPORTED, "%s: GGUF version %u; redlm reads version 3", f->path, version);
    /* a key/value takes at least 13 bytes and a tensor 29: counts beyond
     * that are lies, refused before anything is allocated for them */
    if (n_kv > len / 13 || n_t > len / 29)
        return rl_errf(err, RL_EFORMAT, "%s: header claims %llu tensors and %llu metadata entries, more than %zu bytes can hold",
                       f->path, (unsigned long long)n_t, (unsigned long long)n_kv, len);
    if (!(f->kv = calloc((size_t)(n_kv ? n_kv : 1), sizeof *f->kv)) ||
        !(f->ents = calloc((size_t)(n_t ? n_t : 1), sizeof *f->ents)))
        return rl_errf(err, RL_ENOMEM, "%s: out of memory", f->path);
    int rc;
    for (uint64_t i = 0; i < n_kv; i++) {
        f->n_kv = i + 1;
        if ((rc = parse_kv(f, &r, i, err)))
            return rc;
    }
    for (uint64_t i = 0; i < n_t; i++) {
        f->n_ents = i + 1;
        if ((rc = parse_tensor_info(f, &r, i, err)))
            return rc;
    }
    uint32_t align = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *a = find_kv(f, "general.alignment");
    if (a) {
        if (a->type != GGUF_VT_UINT32)
            return rl_errf(err, RL_EFORMAT, "%s: metadata \"general.alignment\" is %s, not uint32",
                           f->path, vtype_name(a->type));
        align = (uint32_t)le(a->val, 4);
        if (!align || (align & (align - 1)) || align > (1u << 20))
            return rl_errf(err, RL_EFORMAT, "%s: metadata \"general.alignment\" = %u is not a power of two up to 1 MiB",
                           f->path, align);
    }
    uint64_t start = (r.pos + align - 1) / align * align;
    if (start > len) {
        if (n_t)
            return rl_errf(err, RL_EFORMAT, "%s: the data section (at byte %llu) is beyond the end of the file (%zu bytes)",
                           f->path, (unsigned long long)start, len);
        start = len;
    }
    return check_tables(f, buf + start, len - start, align, err);
}

int gguf_parse_buffer(struct gguf_file **out, const void *buf, size_t len, const char *name,
                      struct rl_err *err)
{
    *out = NULL;
    struct gguf_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(name ? name : "(buffer)"))) {
        free(f);
        return rl_errf(err, RL_ENOMEM, "out of memory");
    }
    int rc = parse(f, buf, len, err);
    if (rc) {
        gguf_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int gguf_open(struct gguf_file **out, const char *path, struct rl_err *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rl_errf(err, errno == ENOENT ? RL_ENOTFOUND : RL_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return rl_errf(err, RL_EIO, "%s: not a regular file", path);
    }
    size_t len = (size_t)st.st_size;
    if (len < 24) {
        close(fd);
        return rl_errf(err, RL_EFORMAT, "%s: file is %zu bytes, shorter than the GGUF header", path, len);
    }
    void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED)
        return rl_errf(err, RL_EIO, "%s: mmap: %s", path, strerror(e));
    struct gguf_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        munmap(m, len);
        return rl_errf(err, RL_ENOMEM, "out of memory");
    }
    f->map = m;
    f->map_len = len;
    int rc = parse(f, m, len, err);
    if (rc) {
        gguf_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int gguf_is_gguf(const char *path)
{
    struct stat st;
    if (stat(path, &st) || !S_ISREG(st.st_mode))
        return 0;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return 0;
    char m[4];
    int ok = fread(m, 1, 4, fp) == 4 && !memcmp(m, GGUF_MAGIC, 4);
    fclose(fp);
    return ok;
}

int gguf_locate(const char *path, char *out, size_t size, struct rl_err *err)
{
    struct stat st;
    if (stat(path, &st))
        return 0;
    if (S_ISREG(st.st_mode)) {
        if (!gguf_is_gguf(path))
            return 0;
        snprintf(out, size, "%s", path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode))
        return 0;
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", path);
    if (!access(p, F_OK))
        return 0; /* a Hugging Face checkpoint, whatever else lies beside it */
    DIR *d = opendir(path);
    if (!d)
        return 0;
    int found = 0;
    char first[256] = "";
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n <= 5 || strcmp(e->d_name + n - 5, ".gguf"))
            continue;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        if (!gguf_is_gguf(p))
            continue;
        if (found++) {
            int rc = rl_errf(err, RL_EINVAL, "%s holds several GGUF files (%s, %s, ...): name the one to load",
                             path, first, e->d_name); /* before closedir frees e */
            closedir(d);
            return rc;
        }
        snprintf(first, sizeof first, "%s", e->d_name);
        snprintf(out, size, "%s", p);
    }
    closedir(d);
    return found;
}

/* ---- tensors ---- */

int gguf_n_tensors(const struct gguf_file *f) { return (int)f->n_ents; }

const struct gguf_tensor *gguf_get_tensor(const struct gguf_file *f, int i)
{
    return i >= 0 && (uint64_t)i < f->n_ents ? &f->ents[i].t : NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name)
{
    for (uint64_t i = 0; i < f->n_ents; i++) /* a few hundred: a scan is fine */
        if (!strcmp(f->ents[i].t.name, name))
            return &f->ents[i].t;
    return NULL;
}

void gguf_mark_used(struct gguf_file *f, const struct gguf_tensor *t)
{
    struct gguf_ent *e = (struct gguf_ent *)t;
    if (e >= f->ents && e < f->ents + f->n_ents)
        e->used = 1;
}

const struct gguf_tensor *gguf_first_unused(const struct gguf_file *f)
{
    for (uint64_t i = 0; i < f->n_ents; i++)
        if (!f->ents[i].used)
            return &f->ents[i].t;
    return NULL;
}

/* ---- metadata ---- */

int gguf_has_key(const struct gguf_file *f, const char *key) { return find_kv(f, key) != NULL; }

static int want_kv(const struct gguf_file *f, const char *key, const struct gguf_kv **kv,
                   struct rl_err *err)
{
    if (!(*kv = find_kv(f, key)))
        return rl_errf(err, RL_ENOTFOUND, "%s: metadata \"%s\" is missing", f->path, key);
    return 0;
}

static int wrong_type(const struct gguf_file *f, const struct gguf_kv *kv, const char *want,
                      struct rl_err *err)
{
    return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\" is %s, not %s", f->path, kv->key,
                   vtype_name(kv->type), want);
}

/* An integer scalar of type t at p; -1 when t is not an integer type or
 * a uint64 does not fit an int64. */
static int int_value(uint32_t t, const uint8_t *p, int64_t *out)
{
    uint64_t u;
    switch (t) {
    case GGUF_VT_UINT8: *out = p[0]; return 0;
    case GGUF_VT_INT8: *out = (int8_t)p[0]; return 0;
    case GGUF_VT_UINT16: *out = (int64_t)le(p, 2); return 0;
    case GGUF_VT_INT16: *out = (int16_t)le(p, 2); return 0;
    case GGUF_VT_UINT32: *out = (int64_t)le(p, 4); return 0;
    case GGUF_VT_INT32: *out = (int32_t)le(p, 4); return 0;
    case GGUF_VT_UINT64:
        u = le(p, 8);
        if (u > INT64_MAX)
            return -1;
        *out = (int64_t)u;
        return 0;
    case GGUF_VT_INT64: *out = (int64_t)le(p, 8); return 0;
    default: return -1;
    }
}

int gguf_get_int(const struct gguf_file *f, const char *key, int64_t *out, struct rl_err *err)
{
    const struct gguf_kv *kv;
    int rc = want_kv(f, key, &kv, err);
    if (rc)
        return rc;
    if (int_value(kv->type, kv->val, out))
        return wrong_type(f, kv, "an integer", err);
    return 0;
}

int gguf_get_float(const struct gguf_file *f, const char *key, double *out, struct rl_err *err)
{
    const struct gguf_kv *kv;
    int rc = want_kv(f, key, &kv, err);
    if (rc)
        return rc;
    int64_t i;
    if (kv->type == GGUF_VT_FLOAT32) {
        uint32_t u = (uint32_t)le(kv->val, 4);
        float v;
        memcpy(&v, &u, 4);
        *out = v;
    } else if (kv->type == GGUF_VT_FLOAT64) {
        uint64_t u = le(kv->val, 8);
        memcpy(out, &u, 8);
    } else if (!int_value(kv->type, kv->val, &i)) {
        *out = (double)i;
    } else {
        return wrong_type(f, kv, "a number", err);
    }
    return 0;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, int *out, struct rl_err *err)
{
    const struct gguf_kv *kv;
    int rc = want_kv(f, key, &kv, err);
    if (rc)
        return rc;
    if (kv->type != GGUF_VT_BOOL)
        return wrong_type(f, kv, "bool", err);
    *out = kv->val[0] != 0;
    return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, const char **s, size_t *len,
                 struct rl_err *err)
{
    const struct gguf_kv *kv;
    int rc = want_kv(f, key, &kv, err);
    if (rc)
        return rc;
    if (kv->type != GGUF_VT_STRING)
        return wrong_type(f, kv, "string", err);
    *len = (size_t)le(kv->val, 8);
    *s = (const char *)kv->val + 8;
    return 0;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype *type, uint64_t *n,
                 struct rl_err *err)
{
    const struct gguf_kv *kv;
    int rc = want_kv(f, key, &kv, err);
    if (rc)
        return rc;
    if (kv->type != GGUF_VT_ARRAY)
        return wrong_type(f, kv, "array", err);
    *type = (enum gguf_vtype)kv->atype;
    *n = kv->n;
    return 0;
}

static int arr_elem(const struct gguf_file *f, const char *key, uint64_t i,
                    const struct gguf_kv **kv, struct rl_err *err)
{
    int rc = want_kv(f, key, kv, err);
    if (rc)
        return rc;
    if ((*kv)->type != GGUF_VT_ARRAY)
        return wrong_type(f, *kv, "array", err);
    if (i >= (*kv)->n)
        return rl_errf(err, RL_EINVAL, "%s: metadata \"%s\": element %llu of %llu", f->path, key,
                       (unsigned long long)i, (unsigned long long)(*kv)->n);
    return 0;
}

int gguf_arr_str(const struct gguf_file *f, const char *key, uint64_t i, const char **s,
                 size_t *len, struct rl_err *err)
{
    const struct gguf_kv *kv;
    int rc = arr_elem(f, key, i, &kv, err);
    if (rc)
        return rc;
    if (kv->atype != GGUF_VT_STRING)
        return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\" is an array of %s, not of strings",
                       f->path, key, vtype_name(kv->atype));
    const uint8_t *p = kv->val + kv->str_off[i];
    *len = (size_t)le(p, 8);
    *s = (const char *)p + 8;
    return 0;
}

int gguf_arr_int(const struct gguf_file *f, const char *key, uint64_t i, int64_t *out,
                 struct rl_err *err)
{
    const struct gguf_kv *kv;
    int rc = arr_elem(f, key, i, &kv, err);
    if (rc)
        return rc;
    if (int_value(kv->atype, kv->val + i * vtype_size(kv->atype), out))
        return rl_errf(err, RL_EFORMAT, "%s: metadata \"%s\" is an array of %s, not of integers",
                       f->path, key, vtype_name(kv->atype));
    return 0;
}

/* ---- writing ---- */

struct gguf_wtensor {
    char *name;
    uint32_t type;
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t n_bytes, off;
    const void *data;
    gguf_fill_fn fill;
    void *ctx;
};

struct gguf_writer {
    uint8_t *kv;           /* serialised metadata */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    struct gguf_wtensor *t;
    int n_t, cap_t;
    struct rl_err err;     /* first failure of a setter */
};

int gguf_writer_create(struct gguf_writer **out, struct rl_err *err)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : rl_errf(err, RL_ENOMEM, "out of memory");
}

void gguf_writer_free(struct gguf_writer *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->t);
    free(w->kv);
    free(w);
}

static int w_fail(struct gguf_writer *w, int code, const char *what, const char *name)
{
    if (!w->err.code)
        rl_errf(&w->err, code, "%s \"%s\"", what, name);
    return -code;
}

static int w_put(struct gguf_writer *w, const void *p, size_t n)
{
    if (w->kv_len + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap : 4096;
        while (cap < w->kv_len + n)
            cap *= 2;
        uint8_t *b = realloc(w->kv, cap);
        if (!b)
            return -1;
        w->kv = b;
        w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return 0;
}

static int w_le(struct gguf_writer *w, uint64_t v, int n)
{
    uint8_t b[8];
    for (int i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    return w_put(w, b, (size_t)n);
}

static int w_str(struct gguf_writer *w, const char *s, size_t n)
{
    return w_le(w, n, 8) || w_put(w, s, n);
}

static int w_key(struct gguf_writer *w, const char *key, uint32_t type)
{
    if (w_str(w, key, strlen(key)) || w_le(w, type, 4))
        return w_fail(w, RL_ENOMEM, "out of memory for metadata", key);
    w->n_kv++;
    return 0;
}

int gguf_writer_str(struct gguf_writer *w, const char *key, const char *v, size_t len)
{
    if (w_key(w, key, GGUF_VT_STRING) || w_str(w, v, len))
        return w_fail(w, RL_ENOMEM, "out of memory for metadata", key);
    return 0;
}

int gguf_writer_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
    if (w_key(w, key, GGUF_VT_UINT32) || w_le(w, v, 4))
        return w_fail(w, RL_ENOMEM, "out of memory for metadata", key);
    return 0;
}

int gguf_writer_i32(struct gguf_writer *w, const char *key, int32_t v)
{
    if (w_key(w, key, GGUF_VT_INT32) || w_le(w, (uint32_t)v, 4))
        return w_fail(w, RL_ENOMEM, "out of memory for metadata", key);
    return 0;
}

int gguf_writer_f32(struct gguf_writer *w, const char *key, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    if (w_key(w, key, GGUF_VT_FLOAT32) || w_le(w, u, 4))
        return w_fail(w, RL_ENOMEM, "out of memory for metadata", key);
    return 0;
}

int gguf_writer_bool(struct gguf_writer *w, const char *key, int v)
{
    if (w_key(w, key, GGUF_VT_BOOL) || w_le(w, v ? 1 : 0, 1))
        return w_fail(w, RL_ENOMEM, "out of memory for metadata", key);
    return 0;
}

int gguf_writer_arr_str(struct gguf_writer *w, const char *key, const char *const *v,
                        const size_t *lens, uint64_t n)
{
    if (w_key(w, key, GGUF_VT_ARRAY) || w_le(w, GGUF_VT_STRING, 4) || w_le(w, n, 8))
        return w_fail(w, RL_ENOMEM, "out of memory for metadata", key);
    for (uint64_t i = 0; i < n; i++)
        if (w_str(w, v[i], lens ? lens[i] : strlen(v[i])))
            return w_fail(w, RL_ENOMEM, "out of memory for metadata", key);
    return 0;
}

int gguf_writer_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    if (w_key(w, key, GGUF_VT_ARRAY) || w_le(w, GGUF_VT_INT32, 4) || w_le(w, n, 8))
        return w_fail(w, RL_ENOMEM, "out of memory for metadata", key);
    for (uint64_t i = 0; i < n; i++)
        if (w_le(w, (uint32_t)v[i], 4))
            return w_fail(w, RL_ENOMEM, "out of memory for metadata", key);
    return 0;
}

int gguf_writer_tensor(struct gguf_writer *w, const char *name, uint32_t type, int n_dims,
                       const int64_t *ne, const void *data, gguf_fill_fn fill, void *ctx)
{
    int ti = ttype_index(type);
    if (ti < 0 || !ttypes[ti].block)
        return w_fail(w, RL_EINVAL, "gguf writer: unsupported type for tensor", name);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || !name || !*name || strlen(name) > GGUF_MAX_NAME)
        return w_fail(w, RL_EINVAL, "gguf writer: bad dims or name for tensor", name ? name : "");
    uint64_t bytes = 0;
    if (ne[0] < 0 || ne[0] % ttypes[ti].block)
        return w_fail(w, RL_EINVAL, "gguf writer: rows not whole blocks in tensor", name);
    bytes = (uint64_t)(ne[0] / ttypes[ti].block) * (uint64_t)ttypes[ti].bytes;
    for (int d = 1; d < n_dims; d++)
        if (ne[d] < 0 || __builtin_mul_overflow(bytes, (uint64_t)ne[d], &bytes))
            return w_fail(w, RL_EINVAL, "gguf writer: bad dims in tensor", name);
    if (bytes && !data && !fill)
        return w_fail(w, RL_EINVAL, "gguf writer: no data for tensor", name);
    for (int i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return w_fail(w, RL_EINVAL, "gguf writer: tensor added twice:", name);
    if (w->n_t == w->cap_t) {
        int cap = w->cap_t ? 2 * w->cap_t : 64;
        struct gguf_wtensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t)
            return w_fail(w, RL_ENOMEM, "out of memory for tensor", name);
        w->t = t;
        w->cap_t = cap;
    }
    struct gguf_wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name)))
        return w_fail(w, RL_ENOMEM, "out of memory for tensor", name);
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++)
        t->ne[d] = ne[d];
    t->n_bytes = bytes;
    t->data = data;
    t->fill = fill;
    t->ctx = ctx;
    w->n_t++;
    return 0;
}

int gguf_writer_write(struct gguf_writer *w, const char *path, struct rl_err *err)
{
    if (w->err.code)
        return rl_errf(err, w->err.code, "%s: %s", path, w->err.msg);
    const uint64_t A = GGUF_DEFAULT_ALIGNMENT;
    /* the header: fixed part, metadata, tensor infos, padding */
    struct gguf_writer h = {0};
    uint64_t off = 0;
    int bad = w_put(&h, GGUF_MAGIC, 4) || w_le(&h, GGUF_VERSION, 4) || w_le(&h, (uint64_t)w->n_t, 8) ||
              w_le(&h, w->n_kv, 8) || w_put(&h, w->kv, w->kv_len);
    for (int i = 0; i < w->n_t && !bad; i++) {
        struct gguf_wtensor *t = &w->t[i];
        t->off = off;
        off = (off + t->n_bytes + A - 1) / A * A;
        bad = w_str(&h, t->name, strlen(t->name)) || w_le(&h, (uint64_t)t->n_dims, 4);
        for (int d = 0; d < t->n_dims && !bad; d++)
            bad = w_le(&h, (uint64_t)t->ne[d], 8);
        bad = bad || w_le(&h, t->type, 4) || w_le(&h, t->off, 8);
    }
    static const uint8_t zeros[64];
    if (!bad && h.kv_len % A)
        bad = w_put(&h, zeros, (size_t)(A - h.kv_len % A));
    if (bad) {
        free(h.kv);
        return rl_errf(err, RL_ENOMEM, "%s: out of memory building the header", path);
    }
    /* then the data, each tensor padded to the alignment but the last */
    struct file_out *fo;
    int rc = file_out_open(&fo, path, err);
    if (!rc) {
        rc = file_out_write(fo, h.kv, h.kv_len, err);
        for (int i = 0; i < w->n_t && !rc; i++) {
            const struct gguf_wtensor *t = &w->t[i];
            if (t->data)
                rc = file_out_write(fo, t->data, (size_t)t->n_bytes, err);
            else if ((rc = file_out_fill(fo, t->n_bytes, t->fill, t->ctx, err)))
                rl_err_wrap(err, "%s: tensor \"%s\"", path, t->name);
            if (!rc && i + 1 < w->n_t && t->n_bytes % A)
                rc = file_out_write(fo, zeros, (size_t)(A - t->n_bytes % A), err);
        }
        if (rc)
            file_out_abort(fo);
        else
            rc = file_out_commit(fo, err);
    }
    free(h.kv);
    return rc;
}
