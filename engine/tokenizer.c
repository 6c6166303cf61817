/* engine/tokenizer.c - byte-level BPE as HF tokenizers runs it for Qwen3.
 *
 * Encoding goes through the same stages as HF's pipeline, in the same order:
 *
 *   raw text --(invalid UTF-8 -> U+FFFD)--> added tokens split off (leftmost,
 *   longest; normalized=false tokens) --> each remaining segment NFC'd -->
 *   normalized=true added tokens split off --> Split regex stages (PCRE2,
 *   JIT) cut it into pieces --> each piece: bytes -> byte tokens -> merges by
 *   rank (binary heap over a linked list, O(n log n)) -> ids.
 *
 * Tables, all built once in tok_load and read-only afterwards:
 *  - token bytes: one arena, (n_ids) offsets and lengths; the vocab is stored
 *    byte-level *decoded*, so BPE and decoding work on raw bytes and the
 *    GPT-2 bytes_to_unicode alphabet appears only while loading;
 *  - vocab: open-addressing table bytes -> id (used for merges and for
 *    ignore_merges models);
 *  - merges: open-addressing table (left id, right id) -> (rank, merged id);
 *  - added tokens: bucketed by first byte, longest first.
 *
 * The only mutable state after load is the piece cache: 64 shards, each a
 * direct-mapped table behind its own mutex (the critical section is one
 * <= 80-byte copy, so an uncontended lock is the whole cost), so concurrent
 * encoders contend only when they hash to the same shard. A mutex rather
 * than a spinlock: encoding threads share cores with compute threads, and a
 * preempted spinlock holder would stall every spinner for a time slice. Everything a call needs besides
 * that (PCRE2 match data, BPE scratch) lives in a per-call context, which is
 * what makes tok_encode thread-safe without a session object.
 *
 * Callers: the engine front (prompt encoding, streaming detokenization of
 * generated ids), the CLI (tokenize/detokenize), the fuzzer. */
#include "tokenizer.h"
#include "file.h"
#include "gguf.h"
#include "text.h"
#include "utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* Ids above this are refused at load: they would make the per-id tables of a
 * hostile file huge. Real vocabularies are below 300k. */
#define TOK_MAX_IDS (1 << 22)
#define TOK_MAX_STAGES 4
/* tokenizer.json and tokenizer_config.json are read whole: Qwen3's is 11 MB,
 * the largest vocabularies' ~35 MB; past this it is not a tokenizer */
#define TOK_FILE_MAX (256u << 20)
/* The NFC fast path covers planes 0-2 (BMP, emoji, CJK extensions and the
 * CJK compatibility supplement, where the last decompositions are). */
#define NFC_INERT_LIMIT 0x30000

/* Piece cache geometry: 64 shards x 1024 slots x 80 bytes = 5 MiB. Keys up
 * to 23 bytes cover almost every English/code piece; longer pieces (long CJK
 * runs, whitespace runs) are rare per byte and are merged directly. */
#define CACHE_SHARDS 64
#define CACHE_SLOTS 1024
#define CACHE_KEY_MAX 23
#define CACHE_IDS_MAX 10

enum { KIND_HOLE = 0, KIND_VOCAB = 1, KIND_ADDED = 2 };

enum split_behavior { SPLIT_ISOLATED, SPLIT_REMOVED };

struct stage {
    pcre2_code *re;
    bool jit; /* JIT compilation succeeded: use pcre2_jit_match */
    enum split_behavior behavior;
};

struct added_tok {
    int32_t id;
    uint32_t off, len; /* content in the bytes arena */
    bool special, lstrip, rstrip, normalized, single_word;
};

struct cache_slot {
    uint64_t hash;
    uint8_t klen; /* 0 = empty */
    uint8_t nids;
    char key[CACHE_KEY_MAX];
    int32_t ids[CACHE_IDS_MAX];
};

struct cache_shard {
    pthread_mutex_t mu;
    struct cache_slot *slots; /* (CACHE_SLOTS) */
};

struct merge_ent {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t id;
};

struct tokenizer {
    int32_t n_ids;
    char *bytes;          /* arena of token bytes */
    uint32_t *tok_off;    /* (n_ids) offset into bytes */
    int32_t *tok_len;     /* (n_ids) length; -1 for a hole in the id space */
    uint8_t *tok_kind;    /* (n_ids) KIND_* */
    uint8_t *tok_special; /* (n_ids) 1 for special=true added tokens */

    int32_t *vocab_tab; /* (vocab_cap) ids of vocab entries, -1 empty */
    uint32_t vocab_cap; /* power of two */

    struct merge_ent *merge_tab; /* (merge_cap) */
    int32_t *merge_id;           /* (n_merges) merged token of each rank */
    uint32_t merge_cap;          /* power of two */

    int32_t byte_id[256]; /* token of each single byte */
    /* (256 * 256) rank and merged id of each byte pair, rank -1 = no merge:
     * the first round of every piece, served from L2 instead of the big
     * merge table */
    struct byte_pair {
        int32_t rank, id;
    } *byte_pair;
    bool ignore_merges;

    struct added_tok *added; /* (n_added) sorted by first byte, longest first */
    int n_added;
    int added_first[257];   /* bucket [added_first[b], added_first[b+1]) */
    bool any_normalized;    /* some added token has normalized=true */

    utf8proc_option_t norm; /* 0 = no normalizer */
    /* (NFC_INERT_LIMIT / 8) bit per code point: set when the character is
     * left alone by NFC whatever surrounds it (canonical class 0, its own
     * NFC, never the second half of a composition). A segment made only of
     * such characters skips utf8proc, which matters for CJK text. */
    uint8_t *nfc_inert;

    struct stage stages[TOK_MAX_STAGES];
    int n_stages;

    int32_t eos_id, pad_id;

    struct cache_shard *cache; /* (CACHE_SHARDS) */
};

/* ---- small helpers ------------------------------------------------------ */

/* 64-bit hash of a short byte string: 8 bytes per step, multiply-xorshift
 * finish. Quality only matters for table spread, not security. */
static uint64_t hash_bytes(const void *p, size_t n)
{
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, s, n);
    h = (h ^ v) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static int ids_push(struct tok_ids *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 256;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p)
            return -1;
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return 0;
}

void tok_ids_free(struct tok_ids *v)
{
    if (!v)
        return;
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

/* ---- UTF-8 ------------------------------------------------------------- */

/* Classifies the bytes at s (n >= 1): returns the length (1..4) of a valid
 * character, -k when the first k bytes are a maximal invalid subpart (one
 * U+FFFD in Unicode's recommended practice), or 0 when s is a valid but
 * unfinished prefix that ran into the end of the buffer. */
static int utf8_next(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    if (c < 0x80)
        return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c == 0xE0)
        need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
        need = 2;
    else if (c == 0xED)
        need = 2, hi = 0x9F; /* no surrogates */
    else if (c == 0xF0)
        need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
        need = 3;
    else if (c == 0xF4)
        need = 3, hi = 0x8F; /* nothing past U+10FFFF */
    else
        return -1;
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n)
            return 0;
        if (s[i] < lo || s[i] > hi)
            return -i;
        lo = 0x80, hi = 0xBF;
    }
    return need + 1;
}

/* Appends s[0..n) to b with invalid subparts replaced by U+FFFD. With final
 * false an unfinished character at the end is not consumed; *consumed says
 * how many bytes were. */
static int utf8_fix_append(struct text *b, const uint8_t *s, size_t n, bool final,
                           size_t *consumed)
{
    static const char fffd[] = "\xEF\xBF\xBD";
    size_t i = 0;
    while (i < n) {
        size_t v = utf8_valid_len(s + i, n - i);
        if (v && text_add(b, s + i, v))
            return -1;
        i += v;
        if (i == n)
            break;
        int k = utf8_next(s + i, n - i);
        if (k == 0) {
            if (!final)
                break;
            k = -(int)(n - i); /* the unfinished tail is one maximal subpart */
        }
        if (text_add(b, fffd, 3))
            return -1;
        i += (size_t)(-k);
    }
    if (consumed)
        *consumed = i;
    return 0;
}

char *tok_utf8_sanitize(const char *src, size_t len, size_t *out_len)
{
    struct text b = {0};
    if (text_reserve(&b, len) || utf8_fix_append(&b, (const uint8_t *)src, len, true, NULL)) {
        free(b.p);
        return NULL;
    }
    b.p[b.n] = 0;
    if (out_len)
        *out_len = b.n;
    return b.p;
}

/* ---- GPT-2 byte-level alphabet ----------------------------------------- */

/* bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the
 * other 68 bytes are shifted to U+0100..U+0143 in byte order. Returns the
 * inverse map, code point -> byte, -1 for code points outside the alphabet. */
static void byte_level_inverse(int16_t inv[324])
{
    for (int i = 0; i < 324; i++)
        inv[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        int cp = printable ? b : 256 + extra++;
        inv[cp] = (int16_t)b;
    }
}

/* Converts a byte-level token string to raw bytes (appended to arena).
 * Returns the byte length or -1 when a character is outside the alphabet. */
static long byte_level_decode(const int16_t inv[324], const char *s, struct text *arena)
{
    size_t start = arena->n;
    const uint8_t *p = (const uint8_t *)s;
    size_t n = strlen(s);
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0 || cp < 0 || cp >= 324 || inv[cp] < 0)
            return -1;
        char c = (char)inv[cp];
        if (text_add(arena, &c, 1))
            return -2;
        i += (size_t)k;
    }
    return (long)(arena->n - start);
}

/* ---- tables ------------------------------------------------------------- */

static int32_t vocab_get(const struct tokenizer *t, const void *s, size_t n)
{
    uint32_t mask = t->vocab_cap - 1;
    uint32_t i = (uint32_t)hash_bytes(s, n) & mask;
    for (;;) {
        int32_t id = t->vocab_tab[i];
        if (id < 0)
            return -1;
        if ((size_t)t->tok_len[id] == n && !memcmp(t->bytes + t->tok_off[id], s, n))
            return id;
        i = (i + 1) & mask;
    }
}

/* Inserts id (whose bytes are already in the arena); returns the id that
 * already had the same bytes, or -1 when it was new. */
static int32_t vocab_put(struct tokenizer *t, int32_t id)
{
    const char *s = t->bytes + t->tok_off[id];
    size_t n = (size_t)t->tok_len[id];
    uint32_t mask = t->vocab_cap - 1;
    uint32_t i = (uint32_t)hash_bytes(s, n) & mask;
    for (;;) {
        int32_t o = t->vocab_tab[i];
        if (o < 0) {
            t->vocab_tab[i] = id;
            return -1;
        }
        if ((size_t)t->tok_len[o] == n && !memcmp(t->bytes + t->tok_off[o], s, n))
            return o;
        i = (i + 1) & mask;
    }
}

static inline const struct merge_ent *merge_get(const struct tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t mask = t->merge_cap - 1;
    uint32_t i = (uint32_t)hash_u64(key) & mask;
    for (;;) {
        const struct merge_ent *e = &t->merge_tab[i];
        if (e->key == key)
            return e;
        if (e->key == UINT64_MAX)
            return NULL;
        i = (i + 1) & mask;
    }
}

static void merge_put(struct tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t mask = t->merge_cap - 1;
    uint32_t i = (uint32_t)hash_u64(key) & mask;
    while (t->merge_tab[i].key != UINT64_MAX && t->merge_tab[i].key != key)
        i = (i + 1) & mask;
    /* a repeated pair takes the later rank, as HF's HashMap collect does */
    t->merge_tab[i] = (struct merge_ent){key, rank, id};
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

/* ---- loading ------------------------------------------------------------ */

static const char *json_type_str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Reads an optional boolean field: absent or null gives def. */
static int json_bool(const cJSON *o, const char *key, bool def, bool *out, const char *name,
                     const char *where, struct rl_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v))
        return rl_errf(err, RL_EFORMAT, "%s: %s.%s is not a boolean", name, where, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int json_id(const cJSON *v, int32_t *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d < TOK_MAX_IDS) || d != (double)(int32_t)d)
        return -1;
    *out = (int32_t)d;
    return 0;
}

/* A normalizer or pre_tokenizer section: its "type" (NULL when the section
 * is absent or null) and, for a Sequence, its array of sections. */
struct section {
    const char *type;
    const cJSON *list;
};

/* Reads section o (what: "normalizer" or "pre_tokenizer"; a Sequence's
 * array is o[list_key]) into *sec. Returns 0 or a negative code. */
static int section_get(const cJSON *o, const char *what, const char *list_key,
                       struct section *sec, const char *name, struct rl_err *err)
{
    *sec = (struct section){0};
    if (!o || cJSON_IsNull(o))
        return 0;
    if (!(sec->type = json_type_str(o, "type")))
        return rl_errf(err, RL_EFORMAT, "%s: %s.type missing", name, what);
    if (strcmp(sec->type, "Sequence"))
        return 0;
    sec->list = cJSON_GetObjectItemCaseSensitive(o, list_key);
    if (!cJSON_IsArray(sec->list))
        return rl_errf(err, RL_EFORMAT, "%s: %s.%s is not an array", name, what, list_key);
    return 0;
}

static int load_normalizer(struct tokenizer *t, const cJSON *n, const char *name,
                           struct rl_err *err)
{
    struct section sec;
    int rc = section_get(n, "normalizer", "normalizers", &sec, name, err);
    if (rc || !sec.type)
        return rc;
    if (sec.list) {
        if (cJSON_GetArraySize(sec.list) > 1)
            return rl_errf(err, RL_EUNSUPPORTED, "%s: normalizer Sequence of more than one", name);
        return load_normalizer(t, sec.list->child, name, err);
    }
    if (!strcmp(sec.type, "NFC"))
        t->norm = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    else if (!strcmp(sec.type, "NFD"))
        t->norm = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    else if (!strcmp(sec.type, "NFKC"))
        t->norm = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (!strcmp(sec.type, "NFKD"))
        t->norm = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else
        return rl_errf(err, RL_EUNSUPPORTED, "%s: normalizer type \"%s\"", name, sec.type);
    return 0;
}

/* GPT-2's own split, used by a ByteLevel pre-tokenizer with use_regex true. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_stage(struct tokenizer *t, const char *pat, bool literal,
                     enum split_behavior beh, const char *name, struct rl_err *err)
{
    if (t->n_stages == TOK_MAX_STAGES)
        return rl_errf(err, RL_EUNSUPPORTED, "%s: more than %d split stages", name,
                       TOK_MAX_STAGES);
    int ecode;
    PCRE2_SIZE eoff;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opts, &ecode, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        return rl_errf(err, RL_EFORMAT, "%s: pre_tokenizer regex at offset %zu: %s", name,
                       (size_t)eoff, (const char *)msg);
    }
    struct stage *s = &t->stages[t->n_stages++];
    s->re = re;
    s->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    s->behavior = beh;
    return 0;
}

static int load_pretok(struct tokenizer *t, const cJSON *p, const char *name, struct rl_err *err)
{
    struct section sec;
    int rc = section_get(p, "pre_tokenizer", "pretokenizers", &sec, name, err);
    if (rc || !sec.type)
        return rc;
    if (sec.list) {
        const cJSON *c;
        cJSON_ArrayForEach(c, sec.list)
            if ((rc = load_pretok(t, c, name, err)))
                return rc;
        return 0;
    }
    if (!strcmp(sec.type, "ByteLevel")) {
        bool aps, use_re;
        rc = json_bool(p, "add_prefix_space", false, &aps, name, "pre_tokenizer", err);
        if (!rc)
            rc = json_bool(p, "use_regex", true, &use_re, name, "pre_tokenizer", err);
        if (rc)
            return rc;
        if (aps)
            return rl_errf(err, RL_EUNSUPPORTED, "%s: ByteLevel add_prefix_space=true", name);
        /* the byte mapping itself is folded into the vocab at load */
        return use_re ? add_stage(t, gpt2_pattern, false, SPLIT_ISOLATED, name, err) : 0;
    }
    if (!strcmp(sec.type, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *re = json_type_str(pat, "Regex");
        const char *lit = json_type_str(pat, "String");
        if (!re && !lit)
            return rl_errf(err, RL_EFORMAT, "%s: Split.pattern has neither Regex nor String",
                           name);
        const char *beh = json_type_str(p, "behavior");
        enum split_behavior b;
        if (!beh)
            return rl_errf(err, RL_EFORMAT, "%s: Split.behavior missing", name);
        if (!strcmp(beh, "Isolated"))
            b = SPLIT_ISOLATED;
        else if (!strcmp(beh, "Removed"))
            b = SPLIT_REMOVED;
        else
            return rl_errf(err, RL_EUNSUPPORTED, "%s: Split behavior \"%s\"", name, beh);
        bool invert;
        rc = json_bool(p, "invert", false, &invert, name, "Split", err);
        if (rc)
            return rc;
        if (invert)
            return rl_errf(err, RL_EUNSUPPORTED, "%s: Split invert=true", name);
        return add_stage(t, re ? re : lit, !re, b, name, err);
    }
    return rl_errf(err, RL_EUNSUPPORTED, "%s: pre_tokenizer type \"%s\"", name, sec.type);
}

static int cmp_added(const void *a, const void *b, void *arena)
{
    const struct added_tok *x = a, *y = b;
    const uint8_t *bx = (const uint8_t *)arena + x->off, *by = (const uint8_t *)arena + y->off;
    if (bx[0] != by[0])
        return bx[0] < by[0] ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1; /* longest first */
    return x->id < y->id ? -1 : x->id > y->id;
}

/* qsort_r is a GNU extension; a tiny insertion sort keeps us portable and
 * the added-token list is short (tens of entries). */
static void sort_added(struct added_tok *a, int n, const char *arena)
{
    for (int i = 1; i < n; i++) {
        struct added_tok x = a[i];
        int j = i - 1;
        while (j >= 0 && cmp_added(&a[j], &x, (void *)arena) > 0) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = x;
    }
}

/* Fills t->nfc_inert (see its comment). A character is a possible second
 * half of a composition exactly when it appears after the first position of
 * some canonical decomposition (Hangul included: utf8proc decomposes
 * syllables into jamo), so one pass over all decompositions finds them. */
static int build_nfc_inert(struct tokenizer *t, const char *name, struct rl_err *err)
{
    t->nfc_inert = malloc(NFC_INERT_LIMIT / 8);
    if (!t->nfc_inert)
        return rl_errf(err, RL_ENOMEM, "%s: out of memory", name);
    memset(t->nfc_inert, 0xff, NFC_INERT_LIMIT / 8);
#define CLEAR_INERT(cp) (t->nfc_inert[(cp) >> 3] &= (uint8_t) ~(1u << ((cp) & 7)))
    for (utf8proc_int32_t cp = 0; cp < NFC_INERT_LIMIT; cp++) {
        if (cp >= 0xD800 && cp < 0xE000)
            continue;
        const utf8proc_property_t *pr = utf8proc_get_property(cp);
        if (pr->combining_class != 0)
            CLEAR_INERT(cp);
        if (pr->decomp_seqindex == UINT16_MAX && !(cp >= 0xAC00 && cp <= 0xD7A3))
            continue;
        utf8proc_int32_t d[32];
        int last = 0;
        utf8proc_ssize_t n = utf8proc_decompose_char(cp, d, 32, UTF8PROC_DECOMPOSE, &last);
        if (n <= 0 || n > 32)
            continue;
        for (utf8proc_ssize_t i = 1; i < n; i++)
            if (d[i] < NFC_INERT_LIMIT)
                CLEAR_INERT(d[i]);
        if (n == 1 && d[0] == cp)
            continue;
        /* does it come back as itself? (singletons and exclusions don't) */
        n = utf8proc_normalize_utf32(d, n, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (n != 1 || d[0] != cp)
            CLEAR_INERT(cp);
    }
#undef CLEAR_INERT
    return 0;
}

static int32_t token_from_config(const struct tokenizer *t, const cJSON *cfg, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v))
        return -1;
    return tok_find(t, v->valuestring, strlen(v->valuestring));
}

/* ---- build: tokenizer.json to the tables, one step per section ----------
 *
 * build() runs the steps below in order; each validates what it reads
 * before it writes a table, and on failure leaves what it allocated in t
 * for tok_free (the byte arena, until it is complete, is the caller's). */

/* model.*: a BPE model with only the options this encoder implements (no
 * byte fallback, no subword prefix or suffix, no dropout); reads
 * ignore_merges. */
static int check_model(struct tokenizer *t, const cJSON *model, const char *name,
                       struct rl_err *err)
{
    const char *mtype = json_type_str(model, "type");
    if (mtype && strcmp(mtype, "BPE"))
        return rl_errf(err, RL_EUNSUPPORTED, "%s: model.type \"%s\" (only BPE)", name, mtype);
    bool flag;
    int rc = json_bool(model, "byte_fallback", false, &flag, name, "model", err);
    if (rc)
        return rc;
    if (flag)
        return rl_errf(err, RL_EUNSUPPORTED, "%s: model.byte_fallback=true", name);
    rc = json_bool(model, "ignore_merges", false, &t->ignore_merges, name, "model", err);
    if (rc)
        return rc;
    const char *pfx = json_type_str(model, "continuing_subword_prefix");
    const char *sfx = json_type_str(model, "end_of_word_suffix");
    if ((pfx && *pfx) || (sfx && *sfx))
        return rl_errf(err, RL_EUNSUPPORTED, "%s: subword prefix/suffix", name);
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(drop) && drop->valuedouble > 0)
        return rl_errf(err, RL_EUNSUPPORTED, "%s: model.dropout > 0", name);
    return 0;
}

/* Pass 1, the id space: every vocab value and added token id is an id in
 * [0, TOK_MAX_IDS), every added token has content; sets t->n_ids to the
 * largest id + 1 and counts the entries of each list. */
static int count_ids(struct tokenizer *t, const cJSON *vocab, const cJSON *added, long *n_vocab,
                     long *n_added, const char *name, struct rl_err *err)
{
    int32_t max_id = -1;
    const cJSON *c;
    *n_vocab = *n_added = 0;
    cJSON_ArrayForEach(c, vocab) {
        int32_t id;
        if (json_id(c, &id))
            return rl_errf(err, RL_EFORMAT, "%s: model.vocab[\"%.80s\"] is not an id in [0, %d)",
                           name, c->string, TOK_MAX_IDS);
        if (id > max_id)
            max_id = id;
        ++*n_vocab;
    }
    if (*n_vocab == 0)
        return rl_errf(err, RL_EFORMAT, "%s: model.vocab is empty", name);
    cJSON_ArrayForEach(c, added) {
        int32_t id;
        if (!cJSON_IsObject(c) || json_id(cJSON_GetObjectItemCaseSensitive(c, "id"), &id))
            return rl_errf(err, RL_EFORMAT, "%s: added_tokens[%ld].id is not an id in [0, %d)",
                           name, *n_added, TOK_MAX_IDS);
        const char *content = json_type_str(c, "content");
        if (!content || !*content)
            return rl_errf(err, RL_EFORMAT, "%s: added_tokens[%ld].content missing or empty",
                           name, *n_added);
        if (id > max_id)
            max_id = id;
        ++*n_added;
    }
    t->n_ids = max_id + 1;
    return 0;
}

/* The per-id tables (every id a hole until filled), the empty vocab hash
 * and the added token list. */
static int alloc_id_tables(struct tokenizer *t, long n_vocab, long n_added, const char *name,
                           struct rl_err *err)
{
    size_t nid = (size_t)t->n_ids;
    t->tok_off = calloc(nid, sizeof *t->tok_off);
    t->tok_len = malloc(nid * sizeof *t->tok_len);
    t->tok_kind = calloc(nid, 1);
    t->tok_special = calloc(nid, 1);
    t->vocab_cap = pow2_at_least((uint64_t)n_vocab * 2);
    t->vocab_tab = malloc(t->vocab_cap * sizeof *t->vocab_tab);
    t->added = calloc((size_t)n_added + 1, sizeof *t->added);
    if (!t->tok_off || !t->tok_len || !t->tok_kind || !t->tok_special || !t->vocab_tab || !t->added)
        return rl_errf(err, RL_ENOMEM, "%s: out of memory for %d ids", name, t->n_ids);
    for (size_t i = 0; i < nid; i++)
        t->tok_len[i] = -1;
    memset(t->vocab_tab, 0xff, t->vocab_cap * sizeof *t->vocab_tab);
    return 0;
}

/* Pass 2a: each vocab entry's bytes (byte-level decoded) into the arena. */
static int load_vocab_bytes(struct tokenizer *t, const cJSON *vocab, const int16_t inv[324],
                            struct text *arena, const char *name, struct rl_err *err)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, vocab) {
        int32_t id = (int32_t)c->valuedouble;
        if (t->tok_kind[id] != KIND_HOLE)
            return rl_errf(err, RL_EFORMAT, "%s: model.vocab: id %d used twice", name, id);
        size_t off = arena->n;
        long n = byte_level_decode(inv, c->string, arena);
        if (n == -2)
            return rl_errf(err, RL_ENOMEM, "%s: out of memory", name);
        if (n <= 0)
            return rl_errf(err, RL_EFORMAT,
                           "%s: model.vocab[\"%.80s\"] has a character outside the byte-level alphabet",
                           name, c->string);
        if (off > UINT32_MAX - (size_t)n)
            return rl_errf(err, RL_EFORMAT, "%s: model.vocab too large", name);
        t->tok_off[id] = (uint32_t)off;
        t->tok_len[id] = (int32_t)n;
        t->tok_kind[id] = KIND_VOCAB;
    }
    return 0;
}

/* Pass 2b: added token contents go in the same arena, with their flags;
 * they may share an id with a vocab entry, in which case decoding uses the
 * added content. Sets t->n_added. */
static int load_added(struct tokenizer *t, const cJSON *added, struct text *arena,
                      const char *name, struct rl_err *err)
{
    int k = 0, rc;
    const cJSON *c;
    cJSON_ArrayForEach(c, added) {
        struct added_tok *a = &t->added[k];
        json_id(cJSON_GetObjectItemCaseSensitive(c, "id"), &a->id);
        const char *content = json_type_str(c, "content");
        size_t len = strlen(content);
        a->off = (uint32_t)arena->n;
        a->len = (uint32_t)len;
        if (text_add(arena, content, len))
            return rl_errf(err, RL_ENOMEM, "%s: out of memory", name);
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%d]", k);
        if ((rc = json_bool(c, "special", false, &a->special, name, where, err)) ||
            (rc = json_bool(c, "lstrip", false, &a->lstrip, name, where, err)) ||
            (rc = json_bool(c, "rstrip", false, &a->rstrip, name, where, err)) ||
            (rc = json_bool(c, "single_word", false, &a->single_word, name, where, err)) ||
            (rc = json_bool(c, "normalized", !a->special, &a->normalized, name, where, err)))
            return rc;
        if (t->tok_kind[a->id] == KIND_ADDED)
            return rl_errf(err, RL_EFORMAT, "%s: %s: id %d used twice", name, where, a->id);
        t->tok_off[a->id] = a->off;
        t->tok_len[a->id] = (int32_t)len;
        t->tok_kind[a->id] = KIND_ADDED;
        t->tok_special[a->id] = a->special;
        t->any_normalized |= a->normalized;
        k++;
    }
    t->n_added = k;
    return 0;
}

/* The vocab hash, of vocab entries only, so merges cannot resolve to an
 * added token's text; and the token of every single byte, which a
 * byte-level vocabulary must have. */
static int index_vocab(struct tokenizer *t, const cJSON *vocab, const char *name,
                       struct rl_err *err)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, vocab) {
        int32_t id = (int32_t)c->valuedouble;
        if (t->tok_kind[id] != KIND_VOCAB)
            continue;
        int32_t o = vocab_put(t, id);
        if (o >= 0)
            return rl_errf(err, RL_EFORMAT, "%s: model.vocab: ids %d and %d have the same bytes",
                           name, o, id);
    }
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        t->byte_id[b] = vocab_get(t, &byte, 1);
        if (t->byte_id[b] < 0)
            return rl_errf(err, RL_EFORMAT,
                           "%s: model.vocab has no token for byte 0x%02x (not byte-level?)", name, b);
    }
    return 0;
}

/* One merge's two parts, from "a b" (older files) or ["a", "b"]. *split is
 * the malloc'd copy the parts of a string point into (NULL for a pair), for
 * the caller to free; *l stays NULL when c is neither form. */
static int merge_parts(const cJSON *c, const char **l, const char **r, char **split,
                       const char *name, struct rl_err *err)
{
    *l = *r = NULL;
    *split = NULL;
    if (cJSON_IsString(c)) {
        const char *sp = strchr(c->valuestring, ' ');
        if (sp && !strchr(sp + 1, ' ')) {
            if (!(*split = strdup(c->valuestring)))
                return rl_errf(err, RL_ENOMEM, "%s: out of memory", name);
            (*split)[sp - c->valuestring] = 0;
            *l = *split;
            *r = *split + (sp - c->valuestring) + 1;
        }
    } else if (cJSON_IsArray(c) && cJSON_GetArraySize(c) == 2 && cJSON_IsString(c->child) &&
               cJSON_IsString(c->child->next)) {
        *l = c->child->valuestring;
        *r = c->child->next->valuestring;
    }
    return 0;
}

/* The merge table, ranks in file order: each merge's parts and their
 * concatenation must be vocab entries. */
static int load_merges(struct tokenizer *t, const cJSON *merges, const int16_t inv[324],
                       const char *name, struct rl_err *err)
{
    long n_merges = cJSON_GetArraySize(merges);
    t->merge_cap = pow2_at_least((uint64_t)n_merges * 2);
    t->merge_tab = malloc(t->merge_cap * sizeof *t->merge_tab);
    if (!t->merge_tab)
        return rl_errf(err, RL_ENOMEM, "%s: out of memory for merges", name);
    memset(t->merge_tab, 0xff, t->merge_cap * sizeof *t->merge_tab);
    t->merge_id = malloc(((size_t)n_merges + 1) * sizeof *t->merge_id);
    if (!t->merge_id)
        return rl_errf(err, RL_ENOMEM, "%s: out of memory for merges", name);
    struct text tmp = {0};
    int32_t rank = 0;
    int rc = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, merges) {
        const char *l, *r;
        char *split;
        if ((rc = merge_parts(c, &l, &r, &split, name, err)))
            break;
        if (!l || !*l || !*r) {
            free(split);
            rc = rl_errf(err, RL_EFORMAT, "%s: model.merges[%d] is not a pair of tokens", name,
                         rank);
            break;
        }
        int32_t ids[3];
        const char *parts[2] = {l, r};
        tmp.n = 0;
        for (int i = 0; i < 2; i++) {
            size_t before = tmp.n;
            long n = byte_level_decode(inv, parts[i], &tmp);
            ids[i] = n > 0 ? vocab_get(t, tmp.p + before, (size_t)n) : -1;
        }
        ids[2] = ids[0] >= 0 && ids[1] >= 0 ? vocab_get(t, tmp.p, tmp.n) : -1;
        if (ids[2] < 0) {
            rl_errf(err, RL_EFORMAT, "%s: model.merges[%d] (\"%.60s\" \"%.60s\"): %s not in vocab",
                    name, rank, l, r, ids[0] < 0 || ids[1] < 0 ? "a part is" : "the merge is");
            free(split);
            rc = -RL_EFORMAT;
            break;
        }
        free(split);
        merge_put(t, ids[0], ids[1], rank, ids[2]);
        t->merge_id[rank] = ids[2];
        rank++;
    }
    free(tmp.p);
    return rc;
}

/* t->byte_pair: the merge of every pair of byte tokens, looked up once. */
static int fill_byte_pairs(struct tokenizer *t, const char *name, struct rl_err *err)
{
    t->byte_pair = malloc(65536 * sizeof *t->byte_pair);
    if (!t->byte_pair)
        return rl_errf(err, RL_ENOMEM, "%s: out of memory for merges", name);
    for (int a = 0; a < 256; a++)
        for (int b = 0; b < 256; b++) {
            const struct merge_ent *m = merge_get(t, t->byte_id[a], t->byte_id[b]);
            t->byte_pair[a * 256 + b] = m ? (struct byte_pair){m->rank, m->id}
                                          : (struct byte_pair){-1, -1};
        }
    return 0;
}

/* decoder: absent, null or ByteLevel (what tok_decode implements). */
static int check_decoder(const cJSON *dec, const char *name, struct rl_err *err)
{
    if (!dec || cJSON_IsNull(dec))
        return 0;
    const char *dtype = json_type_str(dec, "type");
    if (!dtype || strcmp(dtype, "ByteLevel"))
        return rl_errf(err, RL_EUNSUPPORTED, "%s: decoder type \"%s\" (only ByteLevel)", name,
                       dtype ? dtype : "?");
    return 0;
}

/* Sorts the added tokens (first byte, longest first) and fills the
 * first-byte buckets find_added() walks. */
static void index_added(struct tokenizer *t)
{
    sort_added(t->added, t->n_added, t->bytes);
    int j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < t->n_added && (uint8_t)t->bytes[t->added[j].off] < b)
            j++;
        t->added_first[b] = j;
    }
}

/* The piece cache: every shard empty, its mutex initialised. */
static int create_cache(struct tokenizer *t, const char *name, struct rl_err *err)
{
    t->cache = calloc(CACHE_SHARDS, sizeof *t->cache);
    if (!t->cache)
        return rl_errf(err, RL_ENOMEM, "%s: out of memory for the cache", name);
    for (int i = 0; i < CACHE_SHARDS; i++) {
        t->cache[i].slots = calloc(CACHE_SLOTS, sizeof(struct cache_slot));
        if (!t->cache[i].slots)
            return rl_errf(err, RL_ENOMEM, "%s: out of memory for the cache", name);
        pthread_mutex_init(&t->cache[i].mu, NULL);
    }
    return 0;
}

/* All of t from the parsed tokenizer.json (root) and tokenizer_config.json
 * (cfg, may be NULL). On failure t holds whatever was built so far, for
 * tok_free. */
static int build(struct tokenizer *t, const cJSON *root, const cJSON *cfg, const char *name,
                 struct rl_err *err)
{
    if (!cJSON_IsObject(root))
        return rl_errf(err, RL_EFORMAT, "%s: not a JSON object", name);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model))
        return rl_errf(err, RL_EFORMAT, "%s: model missing", name);
    int rc = check_model(t, model, name, err);
    if (rc)
        return rc;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab))
        return rl_errf(err, RL_EFORMAT, "%s: model.vocab is not an object", name);
    if (!cJSON_IsArray(merges))
        return rl_errf(err, RL_EFORMAT, "%s: model.merges is not an array", name);
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return rl_errf(err, RL_EFORMAT, "%s: added_tokens is not an array", name);

    long n_vocab, n_added;
    if ((rc = count_ids(t, vocab, added, &n_vocab, &n_added, name, err)) ||
        (rc = alloc_id_tables(t, n_vocab, n_added, name, err)))
        return rc;
    int16_t inv[324];
    byte_level_inverse(inv);
    struct text arena = {0};
    if ((rc = load_vocab_bytes(t, vocab, inv, &arena, name, err)) ||
        (rc = load_added(t, added, &arena, name, err))) {
        free(arena.p);
        return rc;
    }
    t->bytes = arena.p;

    if ((rc = index_vocab(t, vocab, name, err)) || (rc = load_merges(t, merges, inv, name, err)) ||
        (rc = fill_byte_pairs(t, name, err)) ||
        (rc = load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), name, err)) ||
        (rc = load_pretok(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), name, err)) ||
        (rc = check_decoder(cJSON_GetObjectItemCaseSensitive(root, "decoder"), name, err)))
        return rc;
    if (t->norm == (UTF8PROC_STABLE | UTF8PROC_COMPOSE) && (rc = build_nfc_inert(t, name, err)))
        return rc;
    index_added(t);
    t->eos_id = token_from_config(t, cfg, "eos_token");
    t->pad_id = token_from_config(t, cfg, "pad_token");
    return create_cache(t, name, err);
}

int tok_load_json(struct tokenizer **out, const char *json, size_t len, const char *config_json,
                  size_t config_len, const char *name, struct rl_err *err)
{
    *out = NULL;
    if (!name)
        name = "tokenizer.json";
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root)
        return rl_errf(err, RL_EFORMAT, "%s: not valid JSON", name);
    cJSON *cfg = NULL;
    if (config_json) {
        cfg = cJSON_ParseWithLength(config_json, config_len);
        if (!cfg) {
            cJSON_Delete(root);
            return rl_errf(err, RL_EFORMAT, "%s: tokenizer_config.json is not valid JSON", name);
        }
    }
    struct tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(root);
        cJSON_Delete(cfg);
        return rl_errf(err, RL_ENOMEM, "%s: out of memory", name);
    }
    t->eos_id = t->pad_id = -1;
    int rc = build(t, root, cfg, name, err);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    if (rc) {
        tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int tok_load(struct tokenizer **out, const char *dir, struct rl_err *err)
{
    *out = NULL;
    char path[4096];
    char *json = NULL, *cfg = NULL;
    size_t len = 0, cfg_len = 0;
    int rc = gguf_locate(dir, path, sizeof path, err);
    if (rc < 0)
        return rc;
    if (rc) /* a GGUF model carries its tokenizer in its metadata */
        return tok_load_gguf(out, path, err);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    rc = file_read(path, TOK_FILE_MAX, &json, &len, err);
    if (rc)
        return rc;
    char cpath[4096];
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    rc = file_read(cpath, TOK_FILE_MAX, &cfg, &cfg_len, err);
    if (rc == -RL_ENOTFOUND) { /* optional: the chat template may come from elsewhere */
        rc = 0;
        cfg_len = 0;
    } else if (rc) {
        free(json);
        return rc;
    }
    rc = tok_load_json(out, json, len, cfg, cfg_len, path, err);
    free(json);
    free(cfg);
    return rc;
}

void tok_free(struct tokenizer *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n_stages; i++)
        pcre2_code_free(t->stages[i].re);
    if (t->cache) {
        for (int i = 0; i < CACHE_SHARDS; i++) {
            if (t->cache[i].slots)
                pthread_mutex_destroy(&t->cache[i].mu);
            free(t->cache[i].slots);
        }
        free(t->cache);
    }
    free(t->bytes);
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_kind);
    free(t->tok_special);
    free(t->vocab_tab);
    free(t->merge_tab);
    free(t->byte_pair);
    free(t->merge_id);
    free(t->nfc_inert);
    free(t->added);
    free(t);
}

/* ---- queries ------------------------------------------------------------ */

int32_t tok_n_ids(const struct tokenizer *t) { return t->n_ids; }
int32_t tok_eos_id(const struct tokenizer *t) { return t->eos_id; }
int32_t tok_pad_id(const struct tokenizer *t) { return t->pad_id; }

int tok_is_special(const struct tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && t->tok_special[id];
}

const char *tok_token_bytes(const struct tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_ids || t->tok_len[id] < 0)
        return NULL;
    *len = (size_t)t->tok_len[id];
    return t->bytes + t->tok_off[id];
}

int32_t tok_find(const struct tokenizer *t, const char *text, size_t len)
{
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == len && !memcmp(t->bytes + t->added[i].off, text, len))
            return t->added[i].id;
    if (len == 0)
        return -1;
    int32_t id = vocab_get(t, text, len);
    return id >= 0 && t->tok_kind[id] == KIND_VOCAB ? id : -1;
}

/* ---- encoding ----------------------------------------------------------- */

/* A candidate merge of the pair starting at pos. It is current exactly when
 * prank[pos] still equals rank: a merge rank names one pair of ids, and the
 * ids at a position only ever grow, so a pair never comes back. */
struct heap_ent {
    int32_t rank, pos;
};

/* Per-call state: what makes tok_encode reentrant. */
struct enc_ctx {
    const struct tokenizer *t;
    struct tok_ids *out;
    struct rl_err *err;
    unsigned flags;
    const struct tok_span *plain; /* (n_plain) sorted: no added token overlaps them */
    int n_plain;
    pcre2_match_data *md[TOK_MAX_STAGES];
    /* BPE scratch, grown to the longest piece seen in this call */
    size_t cap;
    int32_t *sym, *prev, *next; /* (cap) symbol ids and links, -1 = none */
    int32_t *prank;             /* (cap) rank of the pair (i, next[i]), -1 = none */
    struct heap_ent *heap;      /* (3 * cap): n-1 initial pairs + 2 per merge */
};

static bool heap_less(const struct heap_ent *a, const struct heap_ent *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct heap_ent *h, size_t *n, struct heap_ent e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static struct heap_ent heap_pop(struct heap_ent *h, size_t *n)
{
    struct heap_ent top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= *n)
            break;
        size_t m = l + 1 < *n && heap_less(&h[l + 1], &h[l]) ? l + 1 : l;
        if (!heap_less(&h[m], &last))
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n)
        h[i] = last;
    return top;
}

/* *v grown to cap ids; false, *v unchanged, when out of memory. */
static bool grow_ids(int32_t **v, size_t cap)
{
    int32_t *g = realloc(*v, cap * sizeof *g);
    if (g)
        *v = g;
    return g != NULL;
}

/* Room for a piece of n bytes in every scratch array. Each array that
 * could grow keeps its new size even when another could not (cap is only
 * raised when all did), so nothing is lost or freed twice. */
static int ctx_grow(struct enc_ctx *c, size_t n)
{
    if (n <= c->cap)
        return 0;
    size_t cap = c->cap ? c->cap : 64;
    while (cap < n)
        cap *= 2;
    bool ok = grow_ids(&c->sym, cap);
    ok = grow_ids(&c->prev, cap) && ok;
    ok = grow_ids(&c->next, cap) && ok;
    ok = grow_ids(&c->prank, cap) && ok;
    struct heap_ent *h = realloc(c->heap, 3 * cap * sizeof *h);
    if (h)
        c->heap = h;
    if (!ok || !h)
        return rl_errf(c->err, RL_ENOMEM, "tokenizer: out of memory for a %zu-byte piece", n);
    c->cap = cap;
    return 0;
}

static void try_pair(const struct tokenizer *t, struct enc_ctx *c, size_t *nh, int32_t i)
{
    int32_t j = c->next[i];
    const struct merge_ent *m = j < 0 ? NULL : merge_get(t, c->sym[i], c->sym[j]);
    c->prank[i] = m ? m->rank : -1;
    if (m)
        heap_push(c->heap, nh, (struct heap_ent){m->rank, i});
}

static int push_id(struct enc_ctx *c, int32_t id)
{
    if (ids_push(c->out, id))
        return rl_errf(c->err, RL_ENOMEM, "tokenizer: out of memory for ids");
    return 0;
}

static void shard_lock(struct cache_shard *sh) { pthread_mutex_lock(&sh->mu); }
static void shard_unlock(struct cache_shard *sh) { pthread_mutex_unlock(&sh->mu); }

static bool cache_get(const struct tokenizer *t, uint64_t h, const uint8_t *p, size_t n,
                      struct enc_ctx *c, int *rc)
{
    struct cache_shard *sh = &t->cache[h >> 58];
    struct cache_slot *s = &sh->slots[h & (CACHE_SLOTS - 1)];
    int32_t ids[CACHE_IDS_MAX];
    int nids = 0;
    shard_lock(sh);
    if (s->hash == h && s->klen == n && !memcmp(s->key, p, n)) {
        nids = s->nids;
        memcpy(ids, s->ids, (size_t)nids * sizeof ids[0]);
    }
    shard_unlock(sh);
    if (!nids)
        return false;
    for (int i = 0; i < nids; i++)
        if ((*rc = push_id(c, ids[i])))
            break;
    return true;
}

static void cache_put(const struct tokenizer *t, uint64_t h, const uint8_t *p, size_t n,
                      const int32_t *ids, size_t nids)
{
    struct cache_shard *sh = &t->cache[h >> 58];
    struct cache_slot *s = &sh->slots[h & (CACHE_SLOTS - 1)];
    shard_lock(sh);
    s->hash = h;
    s->klen = (uint8_t)n;
    s->nids = (uint8_t)nids;
    memcpy(s->key, p, n);
    memcpy(s->ids, ids, nids * sizeof *ids);
    shard_unlock(sh);
}

/* Byte-level BPE of one pre-token piece; appends its ids. */
static int bpe_piece(struct enc_ctx *c, const uint8_t *p, size_t n)
{
    const struct tokenizer *t = c->t;
    if (n == 1)
        return push_id(c, t->byte_id[p[0]]);
    if (t->ignore_merges) {
        int32_t id = vocab_get(t, p, n);
        if (id >= 0)
            return push_id(c, id);
    }
    uint64_t h = 0;
    int rc = 0;
    if (n <= CACHE_KEY_MAX) {
        h = hash_bytes(p, n);
        if (cache_get(t, h, p, n, c, &rc))
            return rc;
    }
    if ((rc = ctx_grow(c, n)))
        return rc;
    for (size_t i = 0; i < n; i++) {
        c->sym[i] = t->byte_id[p[i]];
        c->prev[i] = (int32_t)i - 1;
        c->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t rank = t->byte_pair[p[i] * 256 + p[i + 1]].rank;
        c->prank[i] = rank;
        if (rank >= 0)
            heap_push(c->heap, &nh, (struct heap_ent){rank, (int32_t)i});
    }
    c->prank[n - 1] = -1;
    while (nh) {
        struct heap_ent e = heap_pop(c->heap, &nh);
        if (c->prank[e.pos] != e.rank)
            continue; /* stale: the pair at pos changed since */
        int32_t right = c->next[e.pos];
        c->sym[e.pos] = t->merge_id[e.rank];
        int32_t nx = c->next[right];
        c->next[e.pos] = nx;
        if (nx >= 0)
            c->prev[nx] = e.pos;
        c->sym[right] = -1;
        c->next[right] = -1;
        c->prank[right] = -1;
        if (c->prev[e.pos] >= 0)
            try_pair(t, c, &nh, c->prev[e.pos]);
        try_pair(t, c, &nh, e.pos);
    }
    size_t first = c->out->n, nids = 0;
    for (int32_t i = 0; i >= 0; i = c->next[i], nids++)
        if ((rc = push_id(c, c->sym[i])))
            return rc;
    if (h && nids <= CACHE_IDS_MAX)
        cache_put(t, h, p, n, c->out->ids + first, nids);
    return 0;
}

static int split_stage(struct enc_ctx *c, int stage, const uint8_t *s, size_t n);

static int emit_piece(struct enc_ctx *c, int stage, const uint8_t *s, size_t n)
{
    if (n == 0)
        return 0;
    if (stage + 1 < c->t->n_stages)
        return split_stage(c, stage + 1, s, n);
    return bpe_piece(c, s, n);
}

/* Runs regex stage `stage` over s, passing pieces on (Isolated: matches and
 * the gaps between them are each a piece; Removed: only the gaps). */
static int split_stage(struct enc_ctx *c, int stage, const uint8_t *s, size_t n)
{
    const struct tokenizer *t = c->t;
    if (stage >= t->n_stages)
        return bpe_piece(c, s, n);
    const struct stage *st = &t->stages[stage];
    pcre2_match_data *md = c->md[stage];
    size_t pos = 0, gap = 0;
    int rc;
    while (pos < n) {
        int m = st->jit ? pcre2_jit_match(st->re, s, n, pos, 0, md, NULL)
                        : PCRE2_ERROR_JIT_STACKLIMIT;
        if (m == PCRE2_ERROR_JIT_STACKLIMIT) /* or no JIT: the interpreter has a heap stack */
            m = pcre2_match(st->re, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(m, msg, sizeof msg);
            return rl_errf(c->err, RL_EINTERNAL, "tokenizer: regex match failed: %s",
                           (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* empty match: step over one character */
            int k = utf8_next(s + ms, n - ms);
            pos = ms + (size_t)(k > 0 ? k : 1);
            continue;
        }
        if (ms > gap && (rc = emit_piece(c, stage, s + gap, ms - gap)))
            return rc;
        if (st->behavior == SPLIT_ISOLATED && (rc = emit_piece(c, stage, s + ms, me - ms)))
            return rc;
        pos = gap = me;
    }
    return emit_piece(c, stage, s + gap, n - gap);
}

static bool is_word_byte(uint8_t b)
{
    return b >= 0x80 || b == '_' || (b >= '0' && b <= '9') || ((b | 0x20) >= 'a' && (b | 0x20) <= 'z');
}

static bool is_space_byte(uint8_t b)
{
    return b == ' ' || (b >= '\t' && b <= '\r');
}

/* Whether s[b, e) overlaps a plain span. Spans are few (one per message)
 * and this runs only for a candidate match, so a linear scan will do. */
static bool in_plain(const struct enc_ctx *c, size_t b, size_t e)
{
    for (int i = 0; i < c->n_plain; i++) {
        const struct tok_span *p = &c->plain[i];
        if (p->off >= e)
            break;
        if (p->off + p->len > b)
            return true;
    }
    return false;
}

/* Finds the leftmost, then longest, added token in s[from..n) whose
 * normalized flag equals `normalized`; returns its index or -1, and the span
 * it covers (after lstrip/rstrip) in *ms and *me. */
static int find_added(const struct enc_ctx *c, const uint8_t *s, size_t n, size_t from,
                      bool normalized, size_t *ms, size_t *me)
{
    const struct tokenizer *t = c->t;
    bool no_special = c->flags & TOK_ENCODE_NO_SPECIAL;
    for (size_t i = from; i < n; i++) {
        int lo = t->added_first[s[i]], hi = t->added_first[s[i] + 1];
        for (int k = lo; k < hi; k++) {
            const struct added_tok *a = &t->added[k];
            if (a->normalized != normalized || (no_special && a->special))
                continue;
            if (a->len > n - i || memcmp(s + i, t->bytes + a->off, a->len))
                continue;
            /* plain spans are in the caller's coordinates: the first pass
             * only (the normalized pass works on a copy) */
            if (!normalized && c->n_plain && in_plain(c, i, i + a->len))
                continue;
            size_t b = i, e = i + a->len;
            if (a->single_word && ((b > 0 && is_word_byte(s[b - 1])) || (e < n && is_word_byte(s[e]))))
                continue;
            if (a->lstrip)
                while (b > from && is_space_byte(s[b - 1]))
                    b--;
            if (a->rstrip)
                while (e < n && is_space_byte(s[e]))
                    e++;
            *ms = b;
            *me = e;
            return k;
        }
    }
    return -1;
}

/* A normalized segment: split off normalized=true added tokens, then the
 * regex stages. */
static int encode_normalized(struct enc_ctx *c, const uint8_t *s, size_t n)
{
    const struct tokenizer *t = c->t;
    size_t pos = 0;
    int rc;
    while (t->any_normalized && pos < n) {
        size_t ms, me;
        int k = find_added(c, s, n, pos, true, &ms, &me);
        if (k < 0)
            break;
        if (ms > pos && (rc = split_stage(c, 0, s + pos, ms - pos)))
            return rc;
        if ((rc = push_id(c, t->added[k].id)))
            return rc;
        pos = me;
    }
    return pos < n ? split_stage(c, 0, s + pos, n - pos) : 0;
}

static int encode_segment(struct enc_ctx *c, const uint8_t *s, size_t n)
{
    const struct tokenizer *t = c->t;
    if (n == 0)
        return 0;
    /* Fast path: below U+0300 (lead bytes < 0xCC) no character composes
     * with a neighbour or is replaced under NFC; the other forms change
     * Latin-1 too, so for them only ASCII is left alone. */
    uint8_t limit = t->nfc_inert ? 0xCC : 0x80;
    bool plain = true;
    if (t->norm) {
        for (size_t i = 0; i < n && plain;) {
            if (s[i] < limit) {
                i++;
                continue;
            }
            utf8proc_int32_t cp;
            utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
            plain = t->nfc_inert && k > 0 && cp < NFC_INERT_LIMIT &&
                    (t->nfc_inert[cp >> 3] >> (cp & 7) & 1);
            i += (size_t)(k > 0 ? k : 1);
        }
    }
    if (plain)
        return encode_normalized(c, s, n);
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t m = utf8proc_map(s, (utf8proc_ssize_t)n, &dst, t->norm);
    if (m < 0) {
        free(dst);
        return rl_errf(c->err, RL_EINTERNAL, "tokenizer: normalization failed: %s",
                       utf8proc_errmsg(m));
    }
    int rc = encode_normalized(c, dst, (size_t)m);
    free(dst);
    return rc;
}

int tok_encode(const struct tokenizer *t, const char *text, size_t len, unsigned flags,
               struct tok_ids *out, struct rl_err *err)
{
    return tok_encode_spans(t, text, len, flags, NULL, 0, out, err);
}

int tok_encode_spans(const struct tokenizer *t, const char *text, size_t len, unsigned flags,
                     const struct tok_span *plain, int n_plain, struct tok_ids *out,
                     struct rl_err *err)
{
    struct enc_ctx c = {.t = t, .out = out, .err = err, .flags = flags,
                        .plain = plain, .n_plain = n_plain};
    size_t n0 = out->n;
    int rc = 0;
    const uint8_t *s = (const uint8_t *)text;
    char *fixed = NULL;
    for (int i = 0; i < n_plain; i++)
        if (plain[i].off + plain[i].len > len || (i && plain[i].off < plain[i - 1].off + plain[i - 1].len))
            return rl_errf(err, RL_EINVAL, "tok_encode_spans: span %d (%zu+%zu) is out of order "
                           "or past the text's %zu bytes", i, plain[i].off, plain[i].len, len);
    if (utf8_valid_len(s, len) != len) {
        if (n_plain)
            return rl_errf(err, RL_EINVAL, "tok_encode_spans: the text is not valid UTF-8");
        fixed = tok_utf8_sanitize(text, len, &len);
        if (!fixed)
            return rl_errf(err, RL_ENOMEM, "tokenizer: out of memory");
        s = (const uint8_t *)fixed;
    }
    for (int i = 0; i < t->n_stages; i++) {
        c.md[i] = pcre2_match_data_create_from_pattern(t->stages[i].re, NULL);
        if (!c.md[i]) {
            rc = rl_errf(err, RL_ENOMEM, "tokenizer: out of memory");
            goto done;
        }
    }
    size_t pos = 0;
    while (pos < len) {
        size_t ms, me;
        int k = t->n_added ? find_added(&c, s, len, pos, false, &ms, &me) : -1;
        if (k < 0)
            break;
        if ((rc = encode_segment(&c, s + pos, ms - pos)) || (rc = push_id(&c, t->added[k].id)))
            goto done;
        pos = me;
    }
    rc = encode_segment(&c, s + pos, len - pos);
done:
    for (int i = 0; i < t->n_stages; i++)
        pcre2_match_data_free(c.md[i]);
    free(c.sym);
    free(c.prev);
    free(c.next);
    free(c.prank);
    free(c.heap);
    free(fixed);
    if (rc)
        out->n = n0;
    return rc;
}

/* ---- decoding ----------------------------------------------------------- */

static int check_id(const struct tokenizer *t, int32_t id, size_t at, struct rl_err *err)
{
    if (id < 0 || id >= t->n_ids || t->tok_len[id] < 0)
        return rl_errf(err, RL_EINVAL, "id %d (at %zu) is not a token (ids are 0..%d)", id, at,
                       t->n_ids - 1);
    return 0;
}

int tok_decode(const struct tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
               char **text, size_t *len, struct rl_err *err)
{
    *text = NULL;
    for (size_t i = 0; i < n; i++) {
        int rc = check_id(t, ids[i], i, err);
        if (rc)
            return rc;
    }
    struct text raw = {0};
    for (size_t i = 0; i < n; i++) {
        if ((flags & TOK_DECODE_SKIP_SPECIAL) && t->tok_special[ids[i]])
            continue;
        if (text_add(&raw, t->bytes + t->tok_off[ids[i]], (size_t)t->tok_len[ids[i]])) {
            free(raw.p);
            return rl_errf(err, RL_ENOMEM, "decode: out of memory");
        }
    }
    char *s = tok_utf8_sanitize(raw.p ? raw.p : "", raw.n, len);
    free(raw.p);
    if (!s)
        return rl_errf(err, RL_ENOMEM, "decode: out of memory");
    *text = s;
    return 0;
}

struct tok_stream {
    const struct tokenizer *t;
    unsigned flags;
    uint8_t pend[4]; /* an unfinished character held back (at most 3 bytes) */
    size_t n_pend;
    struct text in, out;
};

int tok_stream_create(struct tok_stream **out, const struct tokenizer *t, unsigned flags,
                      struct rl_err *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return rl_errf(err, RL_ENOMEM, "tok_stream: out of memory");
    (*out)->t = t;
    (*out)->flags = flags;
    return 0;
}

static int stream_run(struct tok_stream *s, const char *bytes, size_t n, bool final,
                      const char **text, size_t *len, struct rl_err *err)
{
    s->in.n = 0;
    s->out.n = 0;
    size_t used = 0;
    if (text_add(&s->in, s->pend, s->n_pend) || (n && text_add(&s->in, bytes, n)) ||
        text_reserve(&s->out, s->in.n + 8) ||
        utf8_fix_append(&s->out, (const uint8_t *)s->in.p, s->in.n, final, &used))
        return rl_errf(err, RL_ENOMEM, "tok_stream: out of memory");
    s->n_pend = s->in.n - used;
    memcpy(s->pend, s->in.p + used, s->n_pend);
    s->out.p[s->out.n] = 0;
    *text = s->out.p;
    *len = s->out.n;
    return 0;
}

int tok_stream_push(struct tok_stream *s, int32_t id, const char **text, size_t *len,
                    struct rl_err *err)
{
    const struct tokenizer *t = s->t;
    int rc = check_id(t, id, 0, err);
    if (rc)
        return rc;
    if ((s->flags & TOK_DECODE_SKIP_SPECIAL) && t->tok_special[id])
        return stream_run(s, NULL, 0, false, text, len, err);
    return stream_run(s, t->bytes + t->tok_off[id], (size_t)t->tok_len[id], false, text, len, err);
}

int tok_stream_finish(struct tok_stream *s, const char **text, size_t *len, struct rl_err *err)
{
    int rc = stream_run(s, NULL, 0, true, text, len, err);
    s->n_pend = 0;
    return rc;
}

void tok_stream_free(struct tok_stream *s)
{
    if (!s)
        return;
    free(s->in.p);
    free(s->out.p);
    free(s);
}
