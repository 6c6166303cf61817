/* engine/grammar/schema.c - JSON Schema (the subset in schemas/grammar.md),
 * "any JSON object" and tool calls, written as grammar text for ebnf.c.
 *
 * Why text: one parser and one set of checks for everything; the text of a
 * schema's grammar can be read when something looks wrong. Each schema
 * node becomes a rule `<prefix>s<N>`; the shared JSON pieces (value,
 * object, array, string, number, integer) are fixed rules. $ref targets
 * are memoised by node and compiled from a work list, so recursion in the
 * schema is recursion in the grammar, and the C recursion here is bounded
 * by the schema's nesting (GRAM_MAX_DEPTH, checked on the text before it
 * is parsed).
 *
 * Output format: JSON as Python's json.dumps writes it by default: no
 * whitespace except one optional space after ',' and ':' (so a model's
 * natural `{"a": 1, "b": 2}` fits), properties in the schema's order,
 * numbers bounded in length (16 integer digits, 15 fraction digits, 2
 * exponent digits: no number overflows a double; bounded integers up to
 * int64). Every keyword not in the supported set, and every supported one
 * with a bad value, is refused with EV_CODE_BAD_PARAM naming its JSON
 * pointer. Annotations (title, description, ...) are ignored.
 *
 * The invariant: the grammar's language is a subset of the schema's
 * valid instances, never more. Where a keyword cannot be written exactly
 * the compiler writes a smaller set that still satisfies it (multipleOf
 * over a wide range, uniqueItems over free items as at most one item, a
 * pattern bounded to meet minLength/maxLength, narrow forms of formats
 * beside zod's patterns, extra keys longer than the declared names), or
 * refuses the schema with a sentence saying why (not, if/then/else,
 * allOf members that contradict each other). What zod 4 and Pydantic
 * write for typical models compiles (tests/data/schemas/generators). */
#include "gir.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"
#include "grammar.h"
#include "utf8.h"

/* ---- a growable string ---- */
struct sb { char *p; size_t n, cap; bool oom; };

static void sb_add(struct sb *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (b->n + n + 1 > nc) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) { b->oom = true; return; }
        b->p = np; b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_s(struct sb *b, const char *s) { sb_add(b, s, strlen(s)); }
static void sb_f(struct sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_f(struct sb *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n >= 0) sb_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}
/* An EBNF string literal of the bytes s[0..n). */
static void sb_lit(struct sb *b, const char *s, size_t n)
{
    sb_s(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { char e[3] = {'\\', (char)c, 0}; sb_s(b, e); }
        else if (c < 0x20 || c == 0x7f) sb_f(b, "\\x%02x", c);
        else sb_add(b, (const char *)&c, 1);
    }
    sb_s(b, "\"");
}

/* The shared rules. CH is one character of a JSON string, as JSON writes
 * it: anything but '"', '\' and controls, or an escape. */
#define CH "([^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}))"
static const char BASE[] =
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" (string \":\" \" \"? value (\",\" \" \"? string \":\" \" \"? value)*)? \"}\"\n"
    "array ::= \"[\" (value (\",\" \" \"? value)*)? \"]\"\n"
    "string ::= \"\\\"\" " CH "* \"\\\"\"\n"
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15}) (\".\" [0-9]{1,15})? ([eE] [-+]? [0-9]{1,2})?\n"
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n";

#define SEP "\",\" \" \"?"
#define COLON "\":\" \" \"?"

/* ---- the compiler ---- */
struct memo { const cJSON *node; int rule; };
struct pend { const cJSON *node; int rule; char *ptr; };

struct sc {
    struct sb out;
    const cJSON *doc;        /* the schema's root (for $ref) */
    char prefix[24];
    int n_rules;
    struct memo *memo; int n_memo, cap_memo;
    struct pend *pend; int n_pend, cap_pend;
    char ptr[4096]; size_t plen;
    struct rl_err *err;
    int rc;
};

static int bad(struct sc *c, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(struct sc *c, const char *key, const char *fmt, ...)
{
    if (c->rc) return c->rc;
    char m[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    c->rc = rl_errf(c->err, EV_CODE_BAD_PARAM, "%.*s%s%s: %s", (int)c->plen, c->ptr,
                    key ? "/" : (c->plen ? "" : "/"), key ? key : "", m);
    return c->rc;
}

/* Pushes "/seg" (escaped per RFC 6901) on the pointer; returns the old
 * length to pop to. */
static size_t ptr_push(struct sc *c, const char *seg)
{
    size_t old = c->plen;
    if (c->plen + 2 < sizeof c->ptr) c->ptr[c->plen++] = '/';
    for (const char *s = seg; *s && c->plen + 3 < sizeof c->ptr; s++) {
        if (*s == '~') { c->ptr[c->plen++] = '~'; c->ptr[c->plen++] = '0'; }
        else if (*s == '/') { c->ptr[c->plen++] = '~'; c->ptr[c->plen++] = '1'; }
        else c->ptr[c->plen++] = *s;
    }
    return old;
}
static size_t ptr_idx(struct sc *c, int i)
{
    char b[16];
    snprintf(b, sizeof b, "%d", i);
    return ptr_push(c, b);
}

static int new_rule(struct sc *c) { return c->n_rules++; }
static void rule_name(struct sc *c, struct sb *b, int r) { sb_f(b, "%ss%d", c->prefix, r); }

static bool is_annotation(const char *k)
{
    static const char *const a[] = {"title", "description", "default", "examples", "$comment",
                                    "$schema", "$id", "deprecated", "readOnly", "writeOnly",
                                    "$defs", "definitions", "discriminator", NULL};
    for (int i = 0; a[i]; i++)
        if (!strcmp(k, a[i])) return true;
    return false;
}

static const char *const KNOWN[] = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
    "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minProperties", "maxProperties",
    "patternProperties", "propertyNames", "uniqueItems", "additionalItems", NULL};

static bool known(const char *k)
{
    for (int i = 0; KNOWN[i]; i++)
        if (!strcmp(k, KNOWN[i])) return true;
    return is_annotation(k);
}

static int gen(struct sc *c, const cJSON *s);
static const cJSON *resolve(struct sc *c, const char *ref);

/* A non-negative integer keyword value, or -1 (with an error) when bad. */
static long count_kw(struct sc *c, const cJSON *s, const char *k, long dflt)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, k);
    if (!x) return dflt;
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble)) {
        bad(c, k, "must be a non-negative integer");
        return -1;
    }
    if (x->valuedouble > GIR_MAX_REPEAT) {
        bad(c, k, "%.0f is over the supported limit of %d", x->valuedouble, GIR_MAX_REPEAT);
        return -1;
    }
    return (long)x->valuedouble;
}

/* minLength/maxLength: any non-negative integer (up to 10^15); a
 * maxLength above STR_MAX_GEN is written as STR_MAX_GEN (each position of
 * a count is automaton states: a subset of the schema's strings, as
 * Pydantic's AnyUrl maxLength 65536 needs). *raw gets the value as given. */
#define STR_MAX_GEN 2000
static long len_kw(struct sc *c, const cJSON *s, const char *k, long dflt, long *raw)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, k);
    *raw = dflt;
    if (!x) return dflt;
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble) || x->valuedouble > 1e15) {
        bad(c, k, "must be a non-negative integer");
        return -1;
    }
    *raw = (long)x->valuedouble;
    if (!strcmp(k, "minLength") && *raw > STR_MAX_GEN) {
        bad(c, k, "%ld is over the supported limit of %d", *raw, STR_MAX_GEN);
        return -1;
    }
    return *raw > STR_MAX_GEN ? STR_MAX_GEN : *raw;
}

/* ---- regular expressions (pattern) -> grammar text over JSON-encoded
 * characters ---- */
/* K >= 0: every unbounded repetition {m,} is written {m+J, m+J+K} (a
 * subset of the pattern's strings, so minLength/maxLength can be met
 * exactly); mn/mx: the length in characters of the strings the text
 * written matches, min and max (RX_INF: unbounded). */
#define RX_INF (1L << 40)
struct rx { const char *s; size_t n, i; struct sc *c; struct sb *o; int depth; long J, K, mn, mx; };
static long rx_add(long a, long b) { return a >= RX_INF || b >= RX_INF ? RX_INF : a + b; }
static long rx_mul(long a, long b) { return !a || !b ? 0 : a >= RX_INF || b >= RX_INF || a * b >= RX_INF ? RX_INF : a * b; }

/* Writes the alternatives for "one character in ranges r", JSON-encoded:
 * plain characters as a class, '"', '\' and controls as their escapes. */
static void emit_set(struct sb *o, struct gir_range *r, int n)
{
    n = gir_ranges_norm(r, n);
    sb_s(o, "([");
    for (int i = 0; i < n; i++) {
        uint32_t lo = r[i].lo, hi = r[i].hi;
        /* the plain part: skip 0..0x1f, '"' (0x22) and '\' (0x5c) */
        uint32_t cuts[][2] = {{0x20, 0x21}, {0x23, 0x5b}, {0x5d, 0x10ffff}};
        for (int k = 0; k < 3; k++) {
            uint32_t a = lo > cuts[k][0] ? lo : cuts[k][0], b = hi < cuts[k][1] ? hi : cuts[k][1];
            if (a <= b) sb_f(o, "\\U%08X-\\U%08X", a, b);
        }
    }
    sb_s(o, "]");
    for (int i = 0; i < n; i++)
        for (uint32_t ch = r[i].lo; ch <= r[i].hi && ch < 0x20; ch++) {
            static const char sh[] = {['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
            if (ch < sizeof sh && sh[ch]) sb_f(o, " | \"\\\\%c\"", sh[ch]);
            else sb_f(o, " | \"\\\\u%04x\"", ch);
        }
    for (int i = 0; i < n; i++) {
        if (r[i].lo <= 0x22 && r[i].hi >= 0x22) sb_s(o, " | \"\\\\\\\"\"");
        if (r[i].lo <= 0x5c && r[i].hi >= 0x5c) sb_s(o, " | \"\\\\\\\\\"");
    }
    sb_s(o, ")");
}

static int rx_bad(struct rx *x, const char *what)
{
    return bad(x->c, "pattern", "%s at offset %zu (supported: literals, ., [...] classes, \\d \\w \\s \\D \\W \\S, groups, |, * + ? {m,n}, ^ and $ at the ends)",
               what, x->i);
}

static long rx_cp(struct rx *x)
{
    const unsigned char *u = (const unsigned char *)x->s + x->i;
    size_t left = x->n - x->i;
    long c = u[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || (size_t)len > left) { rx_bad(x, "invalid UTF-8"); return -1; }
    if (len > 1) c &= 0x3f >> (len - 1);
    for (int k = 1; k < len; k++) c = (c << 6) | (u[k] & 0x3f);
    x->i += (size_t)len;
    return c;
}

static long rx_hex(struct rx *x, int n)
{
    long v = 0;
    for (int k = 0; k < n; k++, x->i++) {
        int ch = x->i < x->n ? x->s[x->i] : -1;
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (d < 0) { rx_bad(x, "bad hex escape"); return -1; }
        v = v * 16 + d;
    }
    return v;
}

/* A class escape (after '\') into ranges; returns the count or -1. For a
 * single character sets *single. */
static int rx_esc(struct rx *x, struct gir_range *r, bool in_class)
{
    if (x->i >= x->n) { rx_bad(x, "dangling \\"); return -1; }
    char e = x->s[x->i++];
    struct gir_range tmp[8];
    int n = 0;
    bool neg = false;
    switch (e) {
    case 'D': neg = true; /* fall through */
    case 'd': tmp[n++] = (struct gir_range){'0', '9'}; break;
    case 'W': neg = true; /* fall through */
    case 'w': tmp[n++] = (struct gir_range){'a', 'z'}; tmp[n++] = (struct gir_range){'A', 'Z'};
              tmp[n++] = (struct gir_range){'0', '9'}; tmp[n++] = (struct gir_range){'_', '_'}; break;
    case 'S': neg = true; /* fall through */
    case 's': tmp[n++] = (struct gir_range){' ', ' '}; tmp[n++] = (struct gir_range){'\t', '\r'}; break;
    case 'n': r[0] = (struct gir_range){'\n', '\n'}; return 1;
    case 't': r[0] = (struct gir_range){'\t', '\t'}; return 1;
    case 'r': r[0] = (struct gir_range){'\r', '\r'}; return 1;
    case 'f': r[0] = (struct gir_range){'\f', '\f'}; return 1;
    case 'v': r[0] = (struct gir_range){'\v', '\v'}; return 1;
    case 'x': { long v = rx_hex(x, 2); if (v < 0) return -1; r[0] = (struct gir_range){(uint32_t)v, (uint32_t)v}; return 1; }
    case 'u': { long v = rx_hex(x, 4); if (v < 0) return -1; r[0] = (struct gir_range){(uint32_t)v, (uint32_t)v}; return 1; }
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
            x->i--;
            rx_bad(x, "unsupported escape (backreference, \\b or similar)");
            return -1;
        }
        r[0] = (struct gir_range){(uint32_t)(unsigned char)e, (uint32_t)(unsigned char)e};
        return 1;
    }
    if (neg && in_class) { x->i--; rx_bad(x, "negated class escape inside [...]"); return -1; }
    if (neg) return gir_ranges_neg(tmp, n, r);
    memcpy(r, tmp, sizeof(struct gir_range) * (size_t)n);
    return n;
}

#define RX_MAXR 512

static int rx_alt(struct rx *x);

static int rx_atom(struct rx *x, bool *got)
{
    *got = true;
    x->mn = x->mx = 1; /* one character, unless a group says otherwise */
    char ch = x->s[x->i];
    struct gir_range r[RX_MAXR];
    int n;
    if (ch == '(') {
        x->i++;
        if (x->i < x->n && x->s[x->i] == '?') {
            if (x->i + 1 < x->n && x->s[x->i + 1] == ':') x->i += 2;
            else return rx_bad(x, "lookaround or named group");
        }
        if (++x->depth > 32) return rx_bad(x, "groups nested too deeply");
        sb_s(x->o, "(");
        if (rx_alt(x)) return x->c->rc;
        if (x->i >= x->n || x->s[x->i] != ')') return rx_bad(x, "missing )");
        x->i++;
        x->depth--;
        sb_s(x->o, ")");
        return 0;
    }
    if (ch == '[') {
        x->i++;
        bool neg = false;
        if (x->i < x->n && x->s[x->i] == '^') { neg = true; x->i++; }
        n = 0;
        bool first = true;
        while (x->i < x->n && (x->s[x->i] != ']' || first)) {
            first = false;
            if (n + 8 > RX_MAXR) return rx_bad(x, "class too large");
            long lo;
            if (x->s[x->i] == '\\') {
                x->i++;
                struct gir_range t[8];
                int k = rx_esc(x, t, true);
                if (k < 0) return x->c->rc;
                if (k != 1 || t[0].lo != t[0].hi) { memcpy(r + n, t, sizeof(struct gir_range) * (size_t)k); n += k; continue; }
                lo = t[0].lo;
            } else if ((lo = rx_cp(x)) < 0) return x->c->rc;
            long hi = lo;
            if (x->i + 1 < x->n && x->s[x->i] == '-' && x->s[x->i + 1] != ']') {
                x->i++;
                if (x->s[x->i] == '\\') {
                    x->i++;
                    struct gir_range t[8];
                    int k = rx_esc(x, t, true);
                    if (k < 0) return x->c->rc;
                    if (k != 1 || t[0].lo != t[0].hi) return rx_bad(x, "class escape as a range end");
                    hi = t[0].lo;
                } else if ((hi = rx_cp(x)) < 0) return x->c->rc;
                if (hi < lo) return rx_bad(x, "reversed range");
            }
            r[n++] = (struct gir_range){(uint32_t)lo, (uint32_t)hi};
        }
        if (x->i >= x->n) return rx_bad(x, "missing ]");
        x->i++;
        if (neg) { struct gir_range t[RX_MAXR]; n = gir_ranges_neg(r, n, t); memcpy(r, t, sizeof(struct gir_range) * (size_t)n); }
        if (n == 0) { sb_s(x->o, "[]"); return 0; }
        emit_set(x->o, r, n);
        return 0;
    }
    if (ch == '.') {
        x->i++;
        r[0] = (struct gir_range){0, '\n' - 1};
        r[1] = (struct gir_range){'\n' + 1, 0x10ffff};
        emit_set(x->o, r, 2);
        return 0;
    }
    if (ch == '\\') {
        x->i++;
        if ((n = rx_esc(x, r, false)) < 0) return x->c->rc;
        emit_set(x->o, r, n);
        return 0;
    }
    if (ch == '^') return rx_bad(x, "^ not at the start");
    if (ch == '$') {
        if (x->i + 1 == x->n) { *got = false; x->mn = x->mx = 0; return 0; }
        return rx_bad(x, "$ not at the end");
    }
    if (ch == '*' || ch == '+' || ch == '?' || ch == '{') return rx_bad(x, "quantifier without an operand");
    if (ch == ')' || ch == '|') { *got = false; x->mn = x->mx = 0; return 0; }
    long cp = rx_cp(x);
    if (cp < 0) return x->c->rc;
    r[0] = (struct gir_range){(uint32_t)cp, (uint32_t)cp};
    emit_set(x->o, r, 1);
    return 0;
}

static int rx_num(struct rx *x, long *v)
{
    if (x->i >= x->n || x->s[x->i] < '0' || x->s[x->i] > '9') return rx_bad(x, "expected a number in {}");
    *v = 0;
    while (x->i < x->n && x->s[x->i] >= '0' && x->s[x->i] <= '9') {
        *v = *v * 10 + (x->s[x->i++] - '0');
        if (*v > 1000) return rx_bad(x, "repetition count over 1000");
    }
    return 0;
}

static int rx_seq(struct rx *x)
{
    long smn = 0, smx = 0;
    sb_s(x->o, "(\"\"");
    while (x->i < x->n) {
        sb_s(x->o, " (");
        bool got;
        if (rx_atom(x, &got)) return x->c->rc;
        sb_s(x->o, ")");
        if (!got) { x->o->n -= 2; x->o->p[x->o->n] = 0; break; }
        long amn = x->mn, amx = x->mx, qmn = 1, qmx = 1;
        if (x->i < x->n) {
            char q = x->s[x->i];
            long m = -1, k = -1;
            if (q == '*' || q == '+' || q == '?') {
                x->i++;
                m = q == '+'; k = q == '?' ? 1 : -1;
            } else if (q == '{') {
                x->i++;
                if (rx_num(x, &m)) return x->c->rc;
                k = m;
                if (x->i < x->n && x->s[x->i] == ',') {
                    x->i++;
                    if (x->i < x->n && x->s[x->i] == '}') k = -1;
                    else if (rx_num(x, &k)) return x->c->rc;
                }
                if (x->i >= x->n || x->s[x->i] != '}') return rx_bad(x, "missing }");
                x->i++;
                if (k >= 0 && k < m) return rx_bad(x, "{m,n} with n < m");
            }
            if (m >= 0) {
                if (k < 0 && x->K >= 0) { m += x->J; k = m + x->K; }
                if (k < 0) sb_f(x->o, "{%ld,}", m);
                else sb_f(x->o, "{%ld,%ld}", m, k);
                qmn = m; qmx = k < 0 ? RX_INF : k;
                if (x->i < x->n && x->s[x->i] == '?') x->i++; /* lazy: same language */
                if (x->i < x->n && (x->s[x->i] == '*' || x->s[x->i] == '+' || x->s[x->i] == '{'))
                    return rx_bad(x, "repeated quantifier");
            }
        }
        smn = rx_add(smn, rx_mul(amn, qmn));
        smx = rx_add(smx, rx_mul(amx, qmx));
    }
    sb_s(x->o, ")");
    x->mn = smn; x->mx = smx;
    return 0;
}

static int rx_alt(struct rx *x)
{
    long amn = RX_INF, amx = 0;
    sb_s(x->o, "(");
    for (;;) {
        if (rx_seq(x)) return x->c->rc;
        if (x->mn < amn) amn = x->mn;
        if (x->mx > amx) amx = x->mx;
        if (x->i < x->n && x->s[x->i] == '|') { x->i++; sb_s(x->o, " | "); continue; }
        break;
    }
    sb_s(x->o, ")");
    x->mn = amn; x->mx = amx;
    return 0;
}

/* The content of a string matching pattern p (ECMA-262 semantics: it may
 * match anywhere unless anchored). */
static int gen_pattern_jk(struct sc *c, struct sb *o, const char *p, long J, long K, long *mn, long *mx)
{
    size_t n = strlen(p);
    bool a0 = n && p[0] == '^', a1 = n && p[n - 1] == '$' && (n < 2 || p[n - 2] != '\\');
    struct rx x = {.s = p, .n = n, .i = a0 ? 1 : 0, .c = c, .o = o, .J = J, .K = K};
    if (!a0) { if (K >= 0) sb_f(o, CH "{0,%ld} ", K); else sb_s(o, CH "* "); }
    if (rx_alt(&x)) return c->rc;
    if (a1 && x.i == n - 1) x.i++;
    if (x.i != n) return rx_bad(&x, "unexpected character");
    if (!a1) { if (K >= 0) sb_f(o, " " CH "{0,%ld}", K); else sb_s(o, " " CH "*"); }
    *mn = x.mn;
    *mx = (!a0 || !a1) ? (K >= 0 ? rx_add(x.mx, (!a0 + !a1) * K) : RX_INF) : x.mx;
    return 0;
}

static int gen_pattern(struct sc *c, struct sb *o, const char *p)
{
    long mn, mx;
    return gen_pattern_jk(c, o, p, 0, -1, &mn, &mx);
}

/* pattern with minLength lo and maxLength hi (-1: none): the pattern's
 * unbounded repetitions are bounded ({m,} as {m+J, m+J+K}) so that every
 * string written has a length within lo..hi, searched over J (raising
 * short strings) and K (the most slack under hi). A subset of the
 * schema's strings; refused when no J, K makes every string fit (e.g. a
 * fixed part longer than hi, or a short alternative below lo). */
static int gen_pattern_len(struct sc *c, struct sb *o, const char *p, long lo, long hi)
{
    long mn, mx;
    struct sb t = {0};
    int rc = gen_pattern_jk(c, &t, p, 0, -1, &mn, &mx);
    free(t.p);
    if (rc) return rc;
    if (mn >= lo && (hi < 0 || mx <= hi)) return gen_pattern(c, o, p); /* implied */
    for (long J = 0; J <= 64 && J <= lo; J++) {
        long best = -1, a = 0, b = hi >= 0 ? hi : (lo > 64 ? lo : 64);
        while (a <= b) { /* the largest K with max <= hi */
            long K = (a + b) / 2;
            struct sb u = {0};
            rc = gen_pattern_jk(c, &u, p, J, K, &mn, &mx);
            free(u.p);
            if (rc) return rc;
            if (hi < 0 || mx <= hi) { best = K; a = K + 1; } else b = K - 1;
        }
        if (best < 0) break; /* even K = 0 is too long: larger J only adds */
        struct sb u = {0};
        rc = gen_pattern_jk(c, &u, p, J, best, &mn, &mx);
        free(u.p);
        if (rc) return rc;
        if (mn >= lo) return gen_pattern_jk(c, o, p, J, best, &mn, &mx);
    }
    return bad(c, "pattern", "together with minLength/maxLength: no bounding of the pattern's repetitions keeps every string within the lengths (supported when its fixed parts fit)");
}

/* ---- integer ranges ---- */
/* same-length decimal strings lo..hi (no sign) */
static void digits_range(struct sb *o, const char *lo, const char *hi, int n)
{
    if (n == 0) { sb_s(o, "\"\""); return; }
    if (lo[0] == hi[0]) {
        sb_f(o, "\"%c\" (", lo[0]);
        digits_range(o, lo + 1, hi + 1, n - 1);
        sb_s(o, ")");
        return;
    }
    bool lo0 = true, hi9 = true;
    for (int i = 1; i < n; i++) { lo0 &= lo[i] == '0'; hi9 &= hi[i] == '9'; }
    char nines[20], zeros[20];
    memset(nines, '9', sizeof nines); memset(zeros, '0', sizeof zeros);
    sb_s(o, "(");
    char a = lo[0], b = hi[0];
    bool first = true;
    if (!lo0) {
        sb_f(o, "\"%c\" (", a);
        digits_range(o, lo + 1, nines, n - 1);
        sb_s(o, ")");
        a++;
        first = false;
    }
    char bb = hi9 ? b : (char)(b - 1);
    if (a <= bb) {
        sb_f(o, "%s[%c-%c]", first ? "" : " | ", a, bb);
        if (n > 1) sb_f(o, " [0-9]{%d}", n - 1);
        first = false;
    }
    if (!hi9) {
        sb_f(o, "%s\"%c\" (", first ? "" : " | ", b);
        digits_range(o, zeros, hi + 1, n - 1);
        sb_s(o, ")");
    }
    sb_s(o, ")");
}

/* non-negative lo..hi without leading zeros (up to 19 digits: int64) */
static void pos_range(struct sb *o, unsigned long long lo, unsigned long long hi)
{
    sb_s(o, "(");
    bool first = true;
    unsigned long long p10 = 1;
    for (int len = 1; len <= 19; len++, p10 *= 10) {
        unsigned long long a = len == 1 ? 0 : p10, b = p10 * 10 - 1;
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        if (a > b) continue;
        char sa[24], sbuf[24];
        snprintf(sa, sizeof sa, "%llu", a);
        snprintf(sbuf, sizeof sbuf, "%llu", b);
        if (!first) sb_s(o, " | ");
        digits_range(o, sa, sbuf, len);
        first = false;
    }
    if (first) sb_s(o, "[]");
    sb_s(o, ")");
}

/* The integers a..b (a <= b, both within +-INT_GEN_MAX) as an alternation. */
static void int_range(struct sb *o, long long a, long long b)
{
    sb_s(o, "(");
    bool first = true;
    if (a < 0) { /* negatives: -(max(1,-b) .. -a) */
        unsigned long long na = b < 0 ? (unsigned long long)-b : 1, nb = (unsigned long long)-a;
        sb_s(o, "\"-\" ");
        pos_range(o, na, nb);
        first = false;
    }
    if (b >= 0) {
        if (!first) sb_s(o, " | ");
        pos_range(o, a > 0 ? (unsigned long long)a : 0, (unsigned long long)b);
    }
    sb_s(o, ")");
}

/* Bounds without a value: what is generated (15 digits, as before). A
 * bound beyond INT_GEN_MAX is clamped to it (the grammar then allows a
 * subset of what the schema does; int64 holds it). */
#define INT_LIM 999999999999999LL
#define INT_GEN_MAX 9000000000000000000LL
#define MULT_ENUM 256 /* multipleOf: at most this many values listed */

/* A bound keyword: minimum/maximum, and exclusiveMinimum/Maximum as a
 * number (draft 6+) or as a boolean on the plain bound (draft 4). Sets *v
 * to the bound (+-INFINITY when none) and *ex when it is exclusive. */
static int bound_kw(struct sc *c, const cJSON *s, bool upper, double *v, bool *ex)
{
    const char *kn = upper ? "maximum" : "minimum", *ke = upper ? "exclusiveMaximum" : "exclusiveMinimum";
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(s, kn), *e = cJSON_GetObjectItemCaseSensitive(s, ke);
    *v = upper ? INFINITY : -INFINITY;
    *ex = false;
    if (n) {
        if (!cJSON_IsNumber(n)) return bad(c, kn, "must be a number");
        *v = n->valuedouble;
    }
    if (e) {
        if (cJSON_IsBool(e)) {
            if (!n && cJSON_IsTrue(e)) return bad(c, ke, "true (draft 4) needs %s beside it", kn);
            *ex = cJSON_IsTrue(e);
        } else if (cJSON_IsNumber(e)) {
            double x = e->valuedouble;
            if (upper ? x <= *v : x >= *v) { *v = x; *ex = true; }
        } else {
            return bad(c, ke, "must be a number (or a boolean, draft 4)");
        }
    }
    return 0;
}

/* The multiples of m in [a, b] (a <= b): listed when at most MULT_ENUM;
 * else, when m divides 10^k, every number whose last k digits are a
 * multiple of m, inside [a, b] by whole blocks of 10^k, and the listed
 * multiples of magnitude under 10^k; else the MULT_ENUM multiples nearest
 * zero. The last two are subsets of the schema's set: every output is
 * valid. Returns false when nothing is written (no multiple in range). */
static bool mult_range(struct sb *o, long long a, long long b, long long m)
{
    long long qa = a >= 0 ? (a + m - 1) / m : -((-a) / m), qb = b >= 0 ? b / m : -((-b + m - 1) / m);
    if (qa > qb) return false;
    sb_s(o, "([]");
    if (qb - qa < MULT_ENUM) {
        for (long long q = qa; q <= qb; q++) sb_f(o, " | \"%lld\"", q * m);
        sb_s(o, ")");
        return true;
    }
    long long p10 = 1;
    int k = 0;
    while (k < 7 && p10 % m) { p10 *= 10; k++; }
    if (p10 % m == 0 && k >= 1 && p10 / m <= 1000) { /* at most 1,000 suffixes */
        /* suffixes: the multiples of m below 10^k, k digits with zeros */
        struct sb suf = {0};
        sb_s(&suf, "([]");
        for (long long x = 0; x < p10; x += m) sb_f(&suf, " | \"%0*lld\"", k, x);
        sb_s(&suf, ")");
        for (int neg = 0; neg < 2; neg++) {
            /* magnitudes allowed on this side */
            long long lo = neg ? (b < 0 ? -b : 0) : (a > 0 ? a : 0), hi = neg ? -a : b;
            if (hi < lo || (neg && hi <= 0)) continue;
            long long plo = (lo + p10 - 1) / p10, phi = (hi + 1) / p10 - 1;
            if (plo < 1) plo = 1;
            if (plo <= phi) {
                sb_s(o, neg ? " | \"-\" " : " | ");
                pos_range(o, (unsigned long long)plo, (unsigned long long)phi);
                sb_f(o, " %s", suf.p ? suf.p : "[]");
            }
            /* magnitudes below 10^k */
            for (long long x = neg ? m : 0; x < p10 && x <= hi; x += m)
                if (x >= lo) sb_f(o, " | \"%s%lld\"", neg ? "-" : "", x);
        }
        free(suf.p);
        sb_s(o, ")");
        return true;
    }
    /* the MULT_ENUM multiples nearest 0 (or the range's near end) */
    long long q0 = qa > 0 ? qa : qb < 0 ? qb - MULT_ENUM + 1 : -(MULT_ENUM / 2);
    if (q0 < qa) q0 = qa;
    for (long long q = q0, i = 0; q <= qb && i < MULT_ENUM; q++, i++) sb_f(o, " | \"%lld\"", q * m);
    sb_s(o, ")");
    return true;
}

/* The decimal text I.F (F exactly 3 digits) as a double, as a validator
 * parses it. */
static double dec3(double I, long F)
{
    char t[48];
    snprintf(t, sizeof t, "%.0f.%03ld", I, F);
    return strtod(t, NULL);
}

/* Numbers with a fraction whose magnitude x lies in [A, B] (A >= 0; the
 * flags make an end exclusive), written as " | " alternatives, "-" first
 * when neg: the open cells (m, m+1) that lie inside, with 1-6 fraction
 * digits (the last not 0), and the cells the ends cut, with exactly 3
 * (I.FFF, each checked as a double against the end, so no rounding puts
 * one outside). Whole parts below 10^9 only: a double holds them with 6
 * fraction digits exactly enough to keep each value inside. Returns
 * whether anything was written. */
static bool frac_side(struct sb *o, double A, bool Aex, double B, bool Bex, bool neg)
{
    const double CL = 999999999.0;
    if (!(A <= B)) return false;
    bool any = false;
    const char *sg = neg ? "\"-\" " : "";
    double mlo = ceil(A), mhi = fmin(CL, isinf(B) ? CL : floor(B) - 1);
    if (mlo <= mhi) {
        sb_f(o, " | %s", sg);
        pos_range(o, (unsigned long long)mlo, (unsigned long long)mhi);
        sb_s(o, " \".\" [0-9]{0,5} [1-9]");
        any = true;
    }
    /* the cells the ends cut: floor(A) when A is no integer, floor(B) when
     * B is none (one cell when both fall in it) */
    double cut[2] = {floor(A), isinf(B) ? -1 : floor(B)};
    bool done0 = false;
    for (int k = 0; k < 2; k++) {
        double I = cut[k];
        if (I < 0 || I > CL) continue;
        if (k == 0 && I == A) continue;          /* A whole: no cut cell */
        if (k == 1 && (I == B || (done0 && I == cut[0]))) continue;
        done0 |= k == 0;
        long F0 = 1, F1 = 999;
        while (F0 <= F1 && (dec3(I, F0) < A || (Aex && dec3(I, F0) == A))) F0++;
        while (F1 >= F0 && (dec3(I, F1) > B || (Bex && dec3(I, F1) == B))) F1--;
        if (F0 > F1) continue;
        char a[8], b[8];
        snprintf(a, sizeof a, "%03ld", F0);
        snprintf(b, sizeof b, "%03ld", F1);
        sb_f(o, " | %s\"%.0f.\" ", sg, I);
        digits_range(o, a, b, 3);
        any = true;
    }
    return any;
}

/* Integers (is_int) and numbers with bounds and multipleOf. Bounds: any
 * value; the integers generated are clamped to +-INT_GEN_MAX (int64) and,
 * on a side without a bound, to 15 digits. Numbers: the integers in range
 * and the fractions of frac_side().
 * multipleOf: whole numbers only (see mult_range). */
static int gen_integer(struct sc *c, struct sb *o, const cJSON *s, bool is_int)
{
    double lo, hi;
    bool lx, hx;
    if (bound_kw(c, s, false, &lo, &lx) || bound_kw(c, s, true, &hi, &hx)) return c->rc;
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(s, "multipleOf");
    long long m = 1;
    if (mo) {
        if (!cJSON_IsNumber(mo) || !(mo->valuedouble > 0)) return bad(c, "multipleOf", "must be a number above 0");
        if (mo->valuedouble != floor(mo->valuedouble) || mo->valuedouble > 1e15)
            return bad(c, "multipleOf", "%g: only whole divisors up to 10^15 are supported (a fraction is not exact in binary floating point)",
                       mo->valuedouble);
        m = (long long)mo->valuedouble;
    }
    if (isinf(lo) && isinf(hi) && m == 1) { sb_s(o, is_int ? "integer" : "number"); return 0; }
    /* the integers in [lo, hi]: doubles beyond 2^53 may stand for a
     * neighbour of the written bound: step one ulp inwards */
    double L = lo, H = hi;
    if (fabs(L) >= 9007199254740992.0 && !isinf(L)) L = nextafter(L, INFINITY);
    if (fabs(H) >= 9007199254740992.0 && !isinf(H)) H = nextafter(H, -INFINITY);
    L = isinf(L) ? L : lx ? floor(L) + 1 : ceil(L);
    H = isinf(H) ? H : hx ? ceil(H) - 1 : floor(H);
    if (isinf(L)) L = H < -INT_LIM ? H - INT_LIM : -INT_LIM;
    if (isinf(H)) H = L > INT_LIM ? L + INT_LIM : INT_LIM;
    double Lc = L < -INT_GEN_MAX ? -INT_GEN_MAX : L, Hc = H > INT_GEN_MAX ? INT_GEN_MAX : H;
    bool have_int = Lc <= Hc;
    if (L <= H && !have_int)
        return bad(c, L > 0 ? "minimum" : "maximum", "the integers allowed are all beyond the supported magnitude 9*10^18");
    bool any = false;
    sb_s(o, "([]");
    if (have_int) {
        sb_s(o, " | ");
        if (m == 1) { int_range(o, (long long)Lc, (long long)Hc); any = true; }
        else if (mult_range(o, (long long)Lc, (long long)Hc, m)) any = true;
        else sb_s(o, "[]");
    }
    if (!is_int && m == 1) {
        /* the positive side: magnitudes in [max(lo, 0), hi]; the negative
         * side: "-" and magnitudes in [max(-hi, 0), -lo], the exclusive
         * flags swapped */
        any |= frac_side(o, lo > 0 ? lo : 0, lo > 0 && lx, hi, hx, false);
        any |= frac_side(o, hi < 0 ? -hi : 0, hi < 0 && hx, -lo, lx, true);
    }
    sb_s(o, ")");
    if (!any)
        return bad(c, "minimum", "no %s satisfies this schema (or none the grammar writes: a range narrower than 0.001 without an integer)",
                   is_int ? "integer" : "number");
    return 0;
}

/* ---- strings ---- */
/* Patterns zod 4 (z.toJSONSchema) writes beside a format that use
 * lookarounds, which the pattern translator refuses, verbatim. Each
 * accepts every string of the narrow form fmt_text writes for that format
 * (checked by hand: email a@b.cc has no leading dot and no "..", duration
 * PnD has no W and starts with a digit). zod's other format patterns
 * (date, date-time, time, uuid, ipv4, ipv6) need no entry: comparing the
 * automata shows the full or the narrow form inside them. */
static const char *const ZOD_PATTERNS[][2] = {
    {"email", "^(?!\\.)(?!.*\\.\\.)([A-Za-z0-9_'+\\-\\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"},
    {"duration", "^P(?:(\\d+W)|(?!.*W)(?=\\d|T\\d)(\\d+Y)?(\\d+M)?(\\d+D)?(T(?=\\d)(\\d+H)?(\\d+M)?(\\d+([.,]\\d+)?S)?)?)$"},
};

/* The content of a string of format f (one of FMTS' "as" names), the
 * narrow form when narrow (see ZOD_PATTERNS). */
static void fmt_text(struct sb *o, const char *f, bool narrow)
{
    /* a real calendar date (what RFC 3339 full-date and Python's
     * date.fromisoformat accept): year 0001-9999, each month's own day
     * count, and February 29th only in leap years (by 4, centuries by
     * 400: the last two digits, or the first two of a century) */
    static const char date[] =
        "(\"000\" [1-9] | \"00\" [1-9] [0-9] | \"0\" [1-9] [0-9]{2} | [1-9] [0-9]{3}) \"-\" "
        "((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) | "
        "(\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | "
        "\"02-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8])) | "
        "([0-9]{2} (\"0\" [48] | [2468] [048] | [13579] [26]) | "
        "(\"0\" [48] | [2468] [048] | [13579] [26]) \"00\") \"-02-29\"";
    static const char tim[] = "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])";
    if (!strcmp(f, "date")) sb_s(o, date);
    /* the date is an alternation: bracket it, or "T" time binds to its
     * last branch (Feb 29th) only */
    else if (!strcmp(f, "date-time")) {
        sb_s(o, "("); sb_s(o, date); sb_s(o, ") \"T\" ");
        /* narrow (zod's patterns): UTC, "Z" */
        if (narrow) sb_s(o, "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? \"Z\"");
        else sb_s(o, tim);
    }
    else if (!strcmp(f, "time")) {
        /* narrow (zod's pattern): no offset, which zod refuses */
        if (narrow) sb_s(o, "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})?");
        else sb_s(o, tim);
    } else if (!strcmp(f, "uuid")) {
        /* narrow: a version 4, variant 1 UUID in lower case */
        if (narrow) sb_s(o, "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-4\" [0-9a-f]{3} \"-\" [89ab] [0-9a-f]{3} \"-\" [0-9a-f]{12}");
        else sb_s(o, "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}");
    } else if (!strcmp(f, "email")) {
        /* narrow: no dots in the local part, letters for the top level */
        if (narrow) sb_s(o, "[a-z0-9]{1,20} \"@\" [a-z0-9]{1,20} (\".\" [a-z0-9]{1,20}){0,2} \".\" [a-z]{2,6}");
        else sb_s(o, "[A-Za-z0-9_%+-] [A-Za-z0-9._%+-]{0,63} \"@\" [A-Za-z0-9] [A-Za-z0-9-]{0,62} (\".\" [A-Za-z0-9] [A-Za-z0-9-]{0,62}){1,4}");
    } else if (!strcmp(f, "ipv4")) {
        sb_s(o, "((\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]) \".\"){3} "
                "(\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9])");
    } else if (!strcmp(f, "ipv6")) {
        sb_s(o, "([0-9a-f]{1,4} \":\"){7} [0-9a-f]{1,4}"); /* the full form */
    } else if (!strcmp(f, "hostname")) {
        sb_s(o, "[a-z] [a-z0-9]{0,19} (\".\" [a-z] [a-z0-9]{0,19}){0,3}");
    } else if (!strcmp(f, "duration")) {
        sb_s(o, "\"P\" [1-9] [0-9]{0,2} \"D\"");
    } else if (!strcmp(f, "uri")) {
        sb_s(o, "\"https://\" [a-z0-9]{1,20} (\".\" [a-z0-9]{1,20}){0,2} \".\" [a-z]{2,6} (\"/\" [A-Za-z0-9._~-]{0,20}){0,4}");
    }
}

/* The automaton of a grammar expression with no rule references (a
 * format's or a pattern's text): one DFA over bytes. */
static int dfa_of(const char *expr, struct gpda *p)
{
    struct sb t = {0};
    sb_s(&t, "root ::= ");
    sb_s(&t, expr ? expr : "\"\"");
    sb_s(&t, "\n");
    struct gir g;
    gir_init(&g);
    g.what = "schema";
    int root = 0, rc = -1;
    struct rl_err e = {0};
    if (!t.oom) rc = gir_parse_ebnf(&g, t.p, t.n, &root, &e);
    if (!rc) rc = gir_build(&g, root, p, &e);
    gir_fini(&g);
    free(t.p);
    return rc;
}

/* Whether every string of expression a is one of expression b's (both
 * without rule references): the product of their DFAs, walked from the
 * start; a reachable pair where a may end and b may not, or a byte a takes
 * and b does not, is a counterexample (both automata are trimmed: every
 * state of a can still reach an end). 1 yes, 0 no, -1 not decided (too
 * large, or an error). */
static int lang_within(const char *a, const char *b)
{
    struct gpda A, B;
    if (dfa_of(a, &A)) return -1;
    if (dfa_of(b, &B)) { gpda_fini(&A); return -1; }
    int res = -1;
    size_t na = (size_t)A.n_st, nb = (size_t)B.n_st;
    char *seen = na * nb <= 1000000 ? calloc(na * nb, 1) : NULL;
    int32_t *q = seen ? malloc(sizeof(int32_t) * 2 * na * nb) : NULL;
    if (!q) goto out;
    size_t h = 0, n = 0;
    int32_t x0 = A.rule_start[A.root], y0 = B.rule_start[B.root];
    q[n++] = x0; q[n++] = y0;
    seen[(size_t)x0 * nb + (size_t)y0] = 1;
    res = 1;
    while (h < n && res == 1) {
        int32_t x = q[h++], y = q[h++];
        const struct gstate *sa = &A.st[x], *sb2 = &B.st[y];
        if (sa->n_ref || sb2->n_ref) { res = -1; break; }
        if (sa->final && !sb2->final) { res = 0; break; }
        for (int ch = 0; ch < 256; ch++) {
            int32_t nx = sa->next[ch];
            if (nx < 0) continue;
            int32_t ny = sb2->next[ch];
            if (ny < 0) { res = 0; break; }
            size_t k = (size_t)nx * nb + (size_t)ny;
            if (!seen[k]) { seen[k] = 1; q[n++] = nx; q[n++] = ny; }
        }
    }
out:
    free(seen); free(q);
    gpda_fini(&A); gpda_fini(&B);
    return res;
}

/* Format f beside pattern p: 0 when every string of the format's full
 * form matches p, 1 when every string of its narrow form does, -1 when
 * neither is shown (or p uses what the translator refuses). */
static int fmt_in_pattern(struct sc *c, const char *f, const char *p)
{
    struct sb pt = {0};
    struct rl_err saved = {0};
    if (c->err) saved = *c->err;
    if (gen_pattern(c, &pt, p)) { /* not translatable: not an error here */
        c->rc = 0;
        if (c->err) *c->err = saved;
        free(pt.p);
        return -1;
    }
    int res = -1;
    for (int narrow = 0; narrow < 2 && res < 0; narrow++) {
        struct sb ft = {0};
        fmt_text(&ft, f, narrow);
        if (!ft.oom && !pt.oom && lang_within(ft.p, pt.p) == 1) res = narrow;
        free(ft.p);
    }
    free(pt.p);
    return res;
}

static int gen_string(struct sc *c, struct sb *o, const cJSON *s)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    bool has_len = cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength");
    if (fmt && !cJSON_IsString(fmt)) return bad(c, "format", "must be a string");
    /* formats: those written below; JSON Schema's others are refused (a
     * validator may check them); any other name (zod's cuid2, base64,
     * Pydantic's binary, ...) is no JSON Schema format, which validators
     * ignore: the other keywords alone decide */
    static const struct { const char *name, *as; int lo, hi, nlo, nhi; } FMTS[] = {
        /* name, written as, length in characters: lo..hi, narrow nlo..nhi */
        {"date", "date", 10, 10, 10, 10},          {"date-time", "date-time", 20, 32, 20, 27},
        {"time", "time", 9, 21, 8, 15},            {"uuid", "uuid", 36, 36, 36, 36},
        {"email", "email", 5, 384, 6, 90},         {"idn-email", "email", 5, 384, 6, 90},
        {"uri", "uri", 12, 161, 12, 161},          {"uri-reference", "uri", 12, 161, 12, 161},
        {"iri", "uri", 12, 161, 12, 161},          {"iri-reference", "uri", 12, 161, 12, 161},
        {"ipv4", "ipv4", 7, 15, 7, 15},            {"ipv6", "ipv6", 15, 39, 15, 39},
        {"hostname", "hostname", 1, 83, 1, 83},    {"idn-hostname", "hostname", 1, 83, 1, 83},
        {"duration", "duration", 3, 5, 3, 5},
    };
    static const char *const REFUSED_FMTS[] = {"uri-template", "json-pointer", "relative-json-pointer", "regex", NULL};
    int fi = -1;
    if (fmt) {
        for (size_t i = 0; i < sizeof FMTS / sizeof *FMTS && fi < 0; i++)
            if (!strcmp(fmt->valuestring, FMTS[i].name)) fi = (int)i;
        for (int i = 0; fi < 0 && REFUSED_FMTS[i]; i++)
            if (!strcmp(fmt->valuestring, REFUSED_FMTS[i]))
                return bad(c, "format", "'%.40s' is not supported (date, date-time, time, uuid, email, uri, ipv4, ipv6, hostname, duration are)", fmt->valuestring);
        if (fi < 0) fmt = NULL; /* not a JSON Schema format: an annotation */
    }
    if (fmt) {
        /* format with a pattern (zod writes both): the pattern must be one
         * known to accept every string of the narrow form written then
         * (checked by hand against each pattern; see schemas/grammar.md) */
        bool narrow = false;
        if (pat) {
            for (size_t i = 0; i < sizeof ZOD_PATTERNS / sizeof *ZOD_PATTERNS && !narrow; i++)
                narrow = cJSON_IsString(pat) && !strcmp(fmt->valuestring, ZOD_PATTERNS[i][0]) &&
                         !strcmp(pat->valuestring, ZOD_PATTERNS[i][1]);
            /* else: shown by comparing automata (the full form first) */
            int w = narrow || !cJSON_IsString(pat) ? 1 : fmt_in_pattern(c, FMTS[fi].as, pat->valuestring);
            if (w < 0)
                return bad(c, "pattern", "format '%.40s' together with this pattern is not supported: neither the format's strings nor a narrow form of them all match it (zod 4's patterns are known)",
                           fmt->valuestring);
            narrow = w == 1;
        }
        /* lengths: when every string the format is written as fits */
        if (has_len) {
            long lo, hi;
            len_kw(c, s, "minLength", 0, &lo);
            len_kw(c, s, "maxLength", -1, &hi);
            if (c->rc) return c->rc;
            int flo = narrow ? FMTS[fi].nlo : FMTS[fi].lo, fhi = narrow ? FMTS[fi].nhi : FMTS[fi].hi;
            if (lo > flo || (hi >= 0 && hi < fhi))
                return bad(c, "format", "'%.40s' (written %d-%d characters long) together with minLength %ld / maxLength %ld is not supported",
                           fmt->valuestring, flo, fhi, lo, hi);
        }
        const char *f = FMTS[fi].as;
        sb_s(o, "\"\\\"\" (");
        fmt_text(o, f, narrow);
        sb_s(o, ") \"\\\"\"");
        return 0;
    }
    if (pat) {
        if (!cJSON_IsString(pat)) return bad(c, "pattern", "must be a string");
        long raw, lo = len_kw(c, s, "minLength", 0, &raw), hi = len_kw(c, s, "maxLength", -1, &raw);
        if (lo < 0 || c->rc) return c->rc;
        if (hi >= 0 && hi < lo) return bad(c, "minLength", "is above maxLength: no string satisfies this schema");
        sb_s(o, "\"\\\"\" (");
        if (has_len ? gen_pattern_len(c, o, pat->valuestring, lo, hi) : gen_pattern(c, o, pat->valuestring)) return c->rc;
        sb_s(o, ") \"\\\"\"");
        return 0;
    }
    long raw, mn = len_kw(c, s, "minLength", 0, &raw), mx = len_kw(c, s, "maxLength", -1, &raw);
    if (mn < 0 || c->rc) return c->rc;
    if (mx >= 0 && mx < mn) return bad(c, "minLength", "is above maxLength: no string satisfies this schema");
    if (mn == 0 && mx < 0) { sb_s(o, "string"); return 0; }
    if (mx < 0) sb_f(o, "\"\\\"\" " CH "{%ld,} \"\\\"\"", mn);
    else sb_f(o, "\"\\\"\" " CH "{%ld,%ld} \"\\\"\"", mn, mx);
    return 0;
}

/* ---- arrays ---- */
/* uniqueItems over a finite item set (enum, const, boolean, null, also
 * through $ref): each value at most once, in the set's order (a subset of
 * the unique arrays, so every output is valid), mn..mx of them. Rules
 * U(i, k) = "values i.. remain, k written" keep the text quadratic in the
 * set's size. Returns 0 when written, 1 when the items are not a finite
 * set (nothing written), or the error. */
static int gen_unique(struct sc *c, struct sb *o, const cJSON *items, long mn, long mx)
{
    const cJSON *it = items;
    for (int hop = 0; hop < 8 && cJSON_IsObject(it) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(it, "$ref")); hop++)
        it = resolve(c, cJSON_GetObjectItemCaseSensitive(it, "$ref")->valuestring);
    if (!cJSON_IsObject(it)) return 1;
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(it, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(it, "const");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
    cJSON *vals = cJSON_CreateArray();
    if (!vals) { c->out.oom = true; return 0; }
    for (const cJSON *k = it->child; k; k = k->next)
        if (!is_annotation(k->string) && strcmp(k->string, "enum") && strcmp(k->string, "const") && strcmp(k->string, "type")) {
            cJSON_Delete(vals);
            return 1;
        }
    if (cJSON_IsArray(en)) {
        for (const cJSON *v = en->child; v; v = v->next) cJSON_AddItemToArray(vals, cJSON_Duplicate(v, 1));
    } else if (cn) {
        cJSON_AddItemToArray(vals, cJSON_Duplicate(cn, 1));
    } else if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "boolean")) {
        cJSON_AddItemToArray(vals, cJSON_CreateTrue());
        cJSON_AddItemToArray(vals, cJSON_CreateFalse());
    } else if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "null")) {
        cJSON_AddItemToArray(vals, cJSON_CreateNull());
    } else {
        cJSON_Delete(vals);
        return 1;
    }
    /* the values kept: of the type given, each once */
    int nv = 0;
    char *lit[64];
    for (const cJSON *v = vals->child; v && nv < 64; v = v->next) {
        if (cJSON_IsString(ty)) {
            const char *t = ty->valuestring;
            bool ok = (!strcmp(t, "string") && cJSON_IsString(v)) || (!strcmp(t, "number") && cJSON_IsNumber(v)) ||
                      (!strcmp(t, "integer") && cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble)) ||
                      (!strcmp(t, "boolean") && cJSON_IsBool(v)) || (!strcmp(t, "null") && cJSON_IsNull(v));
            if (!ok) continue;
        } else if (ty) { cJSON_Delete(vals); return 1; }
        bool dup = false;
        for (const cJSON *w = vals->child; w != v; w = w->next) dup |= cJSON_Compare(v, w, 1);
        if (dup) continue;
        lit[nv] = cJSON_PrintUnformatted(v);
        if (!lit[nv]) { c->out.oom = true; break; }
        nv++;
    }
    cJSON_Delete(vals);
    int rc = 0;
    long cap = mx < 0 || mx > nv ? nv : mx;
    if (mn > cap) {
        rc = bad(c, "minItems", "cannot be met with unique items (at most %ld distinct values): no array satisfies this schema", cap);
        goto out;
    }
    /* U(i, k): rule base + i * (cap + 1) + k */
    int base = c->n_rules;
    c->n_rules += (nv + 1) * (int)(cap + 1);
    for (int i = nv; i >= 0; i--) {
        for (long k = 0; k <= cap; k++) {
            struct sb r = {0};
            rule_name(c, &r, base + i * (int)(cap + 1) + (int)k);
            sb_s(&r, " ::= ([]");
            if (i == nv) { if (k >= mn) sb_s(&r, " | \"\""); }
            else {
                if (k < cap) {
                    sb_s(&r, " | (");
                    if (k) sb_s(&r, SEP " ");
                    sb_lit(&r, lit[i], strlen(lit[i]));
                    sb_s(&r, " ");
                    rule_name(c, &r, base + (i + 1) * (int)(cap + 1) + (int)k + 1);
                    sb_s(&r, ")");
                }
                sb_s(&r, " | ");
                rule_name(c, &r, base + (i + 1) * (int)(cap + 1) + (int)k);
            }
            sb_s(&r, ")\n");
            if (r.oom) c->out.oom = true; else sb_s(&c->out, r.p);
            free(r.p);
        }
    }
    sb_s(o, "\"[\" ");
    rule_name(c, o, base);
    sb_s(o, " \"]\"");
out:
    for (int i = 0; i < nv; i++) free(lit[i]);
    return rc;
}

static int gen_array(struct sc *c, struct sb *o, const cJSON *s)
{
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    /* drafts 4-2019 (Pydantic 1's tuples): items as an array is
     * prefixItems, additionalItems the rest (absent: none generated) */
    if (cJSON_IsArray(items)) {
        if (pre) return bad(c, "items", "an array of schemas together with prefixItems");
        pre = items;
        items = cJSON_GetObjectItemCaseSensitive(s, "additionalItems");
        if (!items) {
            static const cJSON no = {.type = cJSON_False}; /* read only: threads share it */
            items = &no;
        }
    } else if (cJSON_GetObjectItemCaseSensitive(s, "additionalItems")) {
        return bad(c, "additionalItems", "without items as an array is not supported");
    }
    long mn = count_kw(c, s, "minItems", 0), mx = count_kw(c, s, "maxItems", -1);
    if (c->rc) return c->rc;
    if (pre && !cJSON_IsArray(pre)) return bad(c, "prefixItems", "must be an array of schemas");
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items)) return bad(c, "items", "must be a schema");
    const cJSON *uq = cJSON_GetObjectItemCaseSensitive(s, "uniqueItems");
    if (uq && !cJSON_IsBool(uq)) return bad(c, "uniqueItems", "must be a boolean");
    if (cJSON_IsTrue(uq)) {
        if (pre) return bad(c, "uniqueItems", "together with prefixItems is not supported");
        int r = gen_unique(c, o, items, mn, mx);
        if (r != 1) return r;
        /* items not a finite set: at most one item, which is unique */
        if (mn > 1) return bad(c, "uniqueItems", "over items that are not a finite set (enum, const, boolean) with minItems above 1 is not enforced by the grammar: refused");
        mx = mx < 0 || mx > 1 ? 1 : mx;
    }
    int k = pre ? cJSON_GetArraySize(pre) : 0;
    if (k > 256) return bad(c, "prefixItems", "more than 256 entries are not supported");
    int prule[256];
    for (int i = 0; i < k; i++) {
        size_t o0 = ptr_push(c, "prefixItems");
        ptr_idx(c, i);
        prule[i] = gen(c, cJSON_GetArrayItem(pre, i));
        c->plen = o0;
        if (c->rc) return c->rc;
    }
    /* items absent after prefixItems: none more (a valid subset) */
    bool more = items ? !cJSON_IsFalse(items) : k == 0;
    int irule = -1;
    if (more && items && !cJSON_IsTrue(items)) {
        size_t o0 = ptr_push(c, "items");
        irule = gen(c, items);
        c->plen = o0;
        if (c->rc) return c->rc;
    }
    long cap = more ? mx : (mx < 0 || mx > k ? k : mx);
    if (cap >= 0 && mn > cap) return bad(c, "minItems", "cannot be met (at most %ld items): no array satisfies this schema", cap);
    sb_s(o, "\"[\" ");
    /* positions 0..k-1: nested optionals from minItems on */
    int opened = 0;
    for (int j = 0; j < k && (cap < 0 || j < cap); j++) {
        if (j >= mn) { sb_s(o, "("); opened++; }
        if (j) sb_s(o, SEP " ");
        rule_name(c, o, prule[j]);
        sb_s(o, " ");
    }
    if (more && (cap < 0 || cap > k)) {
        struct sb it = {0};
        if (irule >= 0) rule_name(c, &it, irule);
        else sb_s(&it, "value");
        long rmin = mn > k ? mn - k : 0, rmax = cap < 0 ? -1 : cap - k;
        if (it.oom) { free(it.p); c->out.oom = true; return 0; }
        if (k == 0) {
            if (rmin == 0) sb_s(o, "(");
            sb_f(o, "%s (" SEP " %s)", it.p, it.p);
            long a = rmin > 0 ? rmin - 1 : 0, b = rmax < 0 ? -1 : rmax - 1;
            if (b < 0) sb_f(o, "{%ld,}", a);
            else sb_f(o, "{%ld,%ld}", a, b);
            if (rmin == 0) sb_s(o, ")?");
        } else {
            sb_f(o, "(" SEP " %s)", it.p);
            if (rmax < 0) sb_f(o, "{%ld,}", rmin);
            else sb_f(o, "{%ld,%ld}", rmin, rmax);
        }
        free(it.p);
    }
    for (int j = 0; j < opened; j++) sb_s(o, ")?");
    sb_s(o, " \"]\"");
    return 0;
}

/* ---- objects ---- */
struct prop { const char *name; int rule; bool req; };

static int gen_object(struct sc *c, struct sb *o, const cJSON *s)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return bad(c, "properties", "must be an object of schemas");
    if (req && !cJSON_IsArray(req)) return bad(c, "required", "must be an array of strings");
    if (add && !cJSON_IsObject(add) && !cJSON_IsBool(add)) return bad(c, "additionalProperties", "must be a schema");
    int np = props ? cJSON_GetArraySize(props) : 0, nr = req ? cJSON_GetArraySize(req) : 0;
    struct prop *pv = calloc((size_t)(np + nr + 1), sizeof *pv);
    if (!pv) { c->out.oom = true; return 0; }
    int n = 0;
    /* extra properties: only when additionalProperties says so (absent:
     * none are generated, which the schema allows) */
    bool extra = add && !cJSON_IsFalse(add);
    int arule = -1;
    if (extra && cJSON_IsObject(add)) {
        size_t o0 = ptr_push(c, "additionalProperties");
        arule = gen(c, add);
        c->plen = o0;
    }
    /* the keys of extra properties: any string, or what propertyNames or
     * the one pattern of patternProperties allow (then with its schema:
     * every generated key matches it, so additionalProperties does not
     * apply to them). Declared properties beside them are refused: a
     * generated key could repeat a declared one. */
    char kname[64] = "string";
    const cJSON *pn = cJSON_GetObjectItemCaseSensitive(s, "propertyNames");
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(s, "patternProperties");
    if (pn && !cJSON_IsObject(pn) && !cJSON_IsBool(pn)) { free(pv); return bad(c, "propertyNames", "must be a schema"); }
    if (pp && !cJSON_IsObject(pp)) { free(pv); return bad(c, "patternProperties", "must be an object of schemas"); }
    if (pp && !pp->child) pp = NULL;
    bool pn_plain = !pn || cJSON_IsTrue(pn);
    if (cJSON_IsObject(pn)) {
        pn_plain = true;
        for (const cJSON *k = pn->child; k; k = k->next)
            pn_plain &= is_annotation(k->string) || (!strcmp(k->string, "type") && cJSON_IsString(k) && !strcmp(k->valuestring, "string"));
    }
    if (cJSON_IsFalse(pn)) extra = false, pp = NULL;
    if ((!pn_plain || pp) && (np || nr)) {
        free(pv);
        return bad(c, pp ? "patternProperties" : "propertyNames", "together with properties or required is not supported (a generated key could repeat a declared one)");
    }
    if (pp && !pn_plain) { free(pv); return bad(c, "patternProperties", "together with propertyNames is not supported"); }
    if (pp) {
        if (pp->child->next) { free(pv); return bad(c, "patternProperties", "more than one pattern is not supported (a key could match two)"); }
        size_t o0 = ptr_push(c, "patternProperties");
        ptr_push(c, pp->child->string);
        cJSON *ks = cJSON_CreateObject();
        if (!ks) { c->out.oom = true; free(pv); return 0; }
        cJSON_AddStringToObject(ks, "type", "string");
        cJSON_AddStringToObject(ks, "pattern", pp->child->string);
        int kr = gen(c, ks);
        cJSON_Delete(ks);
        arule = gen(c, pp->child);
        c->plen = o0;
        snprintf(kname, sizeof kname, "%ss%d", c->prefix, kr);
        extra = true;
    } else if (!pn_plain && extra) {
        /* keys: propertyNames as a string schema */
        cJSON *ks = cJSON_Duplicate(pn, 1);
        if (!ks) { c->out.oom = true; free(pv); return 0; }
        if (!cJSON_GetObjectItemCaseSensitive(ks, "type")) cJSON_AddStringToObject(ks, "type", "string");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(ks, "type");
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "string")) {
            cJSON_Delete(ks); free(pv);
            return bad(c, "propertyNames", "keys are strings: type must be string");
        }
        size_t o0 = ptr_push(c, "propertyNames");
        int kr = gen(c, ks);
        c->plen = o0;
        cJSON_Delete(ks);
        snprintf(kname, sizeof kname, "%ss%d", c->prefix, kr);
    }
    /* minProperties/maxProperties: enforced when the declared properties
     * settle them, or for extras alone with at most one required (a key
     * repeated by the model would count once) */
    long minp = count_kw(c, s, "minProperties", 0), maxp = count_kw(c, s, "maxProperties", -1);
    if (c->rc) { free(pv); return c->rc; }
    if (maxp >= 0 && maxp < minp) { free(pv); return bad(c, "minProperties", "is above maxProperties: no object satisfies this schema"); }
    for (const cJSON *p = props ? props->child : NULL; p && !c->rc; p = p->next) {
        size_t o0 = ptr_push(c, "properties");
        ptr_push(c, p->string);
        int r = gen(c, p);
        c->plen = o0;
        pv[n++] = (struct prop){p->string, r, false};
    }
    for (int i = 0; i < nr && !c->rc; i++) {
        const cJSON *x = cJSON_GetArrayItem(req, i);
        if (!cJSON_IsString(x)) { bad(c, "required", "must be an array of strings"); break; }
        int j = 0;
        while (j < n && strcmp(pv[j].name, x->valuestring)) j++;
        if (j == n) {
            if (!add || cJSON_IsFalse(add)) {
                if (add) bad(c, "required", "'%.60s' is required but not allowed (not in properties, additionalProperties false): no object satisfies this schema", x->valuestring);
                else bad(c, "required", "'%.60s' is not in properties (declare it there)", x->valuestring);
                break;
            }
            pv[n++] = (struct prop){x->valuestring, arule, false};
        }
        pv[j].req = true;
    }
    if (c->rc) { free(pv); return c->rc; }
    int nreq = 0;
    for (int i = 0; i < n; i++) nreq += pv[i].req;
    bool counts_ok = minp <= nreq && (maxp < 0 || (!extra && maxp >= n));
    bool extras_only = n == 0 && extra && minp <= 1;
    if (!counts_ok && !extras_only) {
        free(pv);
        return bad(c, minp > nreq ? "minProperties" : "maxProperties",
                   "not enforced for this object (supported: bounds the required and declared properties settle, or on extra properties alone with minProperties at most 1)");
    }
    if (!counts_ok) { /* extras alone, 1 <= count <= maxp (or unbounded) */
        char an2[64];
        if (arule >= 0) snprintf(an2, sizeof an2, "%ss%d", c->prefix, arule);
        else snprintf(an2, sizeof an2, "value");
        sb_f(o, "\"{\" (%s " COLON " %s (" SEP " %s " COLON " %s)", kname, an2, kname, an2);
        if (maxp >= 0) sb_f(o, "{0,%ld}", maxp - 1);
        else sb_s(o, "*");
        sb_s(o, minp == 1 ? ")" : ")?");
        sb_s(o, " \"}\"");
        free(pv);
        return 0;
    }
    /* the name of one pair: "key": value */
    struct sb *b = o;
    char an[64];
    if (arule >= 0) snprintf(an, sizeof an, "%ss%d", c->prefix, arule);
    else snprintf(an, sizeof an, "value");
    /* extra keys beside declared ones: longer (in characters, an escape
     * counting one, as decoded) than every declared name, so none repeats
     * a declared property (whose value would then have to match two
     * schemas, and a parser keeps only one of the pair) */
    if (extra && n > 0 && !strcmp(kname, "string")) {
        long L = 0;
        for (int i = 0; i < n; i++) {
            long ch = 0;
            for (const unsigned char *q = (const unsigned char *)pv[i].name; *q; q++) ch += (*q & 0xc0) != 0x80;
            if (ch > L) L = ch;
        }
        if (L + 1 > GIR_MAX_REPEAT) { free(pv); return bad(c, "additionalProperties", "beside a property name over %d characters is not supported", GIR_MAX_REPEAT - 1); }
        int kr = new_rule(c);
        rule_name(c, &c->out, kr);
        sb_f(&c->out, " ::= \"\\\"\" " CH "{%ld,} \"\\\"\"\n", L + 1);
        snprintf(kname, sizeof kname, "%ss%d", c->prefix, kr);
    }
    bool all_req = true;
    for (int i = 0; i < n; i++) all_req &= pv[i].req;
    sb_s(b, "\"{\" ");
    if (all_req && !extra) {
        for (int i = 0; i < n; i++) {
            if (i) sb_s(b, SEP " ");
            char *k = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(props, pv[i].name));
            (void)k; free(k);
            cJSON *ks = cJSON_CreateString(pv[i].name);
            char *kt = ks ? cJSON_PrintUnformatted(ks) : NULL;
            if (!kt) { c->out.oom = true; cJSON_Delete(ks); break; }
            sb_lit(b, kt, strlen(kt));
            sb_s(b, " " COLON " ");
            if (pv[i].rule >= 0) rule_name(c, b, pv[i].rule); else sb_s(b, "value");
            sb_s(b, " ");
            free(kt); cJSON_Delete(ks);
        }
        sb_s(b, "\"}\"");
        free(pv);
        return 0;
    }
    /* B_i (nothing written yet) and A_i (something written): rules, so the
     * text stays linear in the number of properties */
    int base = c->n_rules;
    c->n_rules += 2 * (n + 1);
    for (int i = 0; i <= n; i++) {
        for (int written = 0; written < 2; written++) {
            int me = base + 2 * i + written, nextA = base + 2 * (i + 1) + 1, nextB = base + 2 * (i + 1);
            struct sb r = {0};
            rule_name(c, &r, me);
            sb_s(&r, " ::= ");
            if (i == n) {
                if (!extra) sb_s(&r, "\"\"");
                else if (written) sb_f(&r, "(" SEP " %s " COLON " %s)*", kname, an);
                else sb_f(&r, "(%s " COLON " %s (" SEP " %s " COLON " %s)*)?", kname, an, kname, an);
            } else {
                cJSON *ks = cJSON_CreateString(pv[i].name);
                char *kt = ks ? cJSON_PrintUnformatted(ks) : NULL;
                if (!kt) { c->out.oom = true; cJSON_Delete(ks); free(r.p); break; }
                sb_s(&r, "(");
                if (written) sb_s(&r, SEP " ");
                sb_lit(&r, kt, strlen(kt));
                sb_s(&r, " " COLON " ");
                if (pv[i].rule >= 0) rule_name(c, &r, pv[i].rule); else sb_s(&r, "value");
                sb_s(&r, " ");
                rule_name(c, &r, nextA);
                sb_s(&r, ")");
                if (!pv[i].req) { sb_s(&r, " | "); rule_name(c, &r, written ? nextA : nextB); }
                free(kt); cJSON_Delete(ks);
            }
            sb_s(&r, "\n");
            if (r.oom) c->out.oom = true; else sb_s(&c->out, r.p);
            free(r.p);
        }
    }
    rule_name(c, b, base);
    sb_s(b, " \"}\"");
    free(pv);
    return 0;
}

/* ---- $ref ---- */
static const cJSON *resolve(struct sc *c, const char *ref)
{
    if (ref[0] != '#') return NULL;
    const cJSON *cur = c->doc;
    const char *p = ref + 1;
    while (*p == '/' && cur) {
        p++;
        char seg[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof seg) {
            if (p[0] == '~' && p[1] == '0') { seg[n++] = '~'; p += 2; }
            else if (p[0] == '~' && p[1] == '1') { seg[n++] = '/'; p += 2; }
            else seg[n++] = *p++;
        }
        seg[n] = 0;
        if (cJSON_IsArray(cur)) {
            char *end;
            long i = strtol(seg, &end, 10);
            cur = *end || !n ? NULL : cJSON_GetArrayItem(cur, (int)i);
        } else {
            cur = cJSON_GetObjectItemCaseSensitive(cur, seg);
        }
    }
    return *p ? NULL : cur;
}

static int gen_ref(struct sc *c, const char *ref)
{
    const cJSON *t = resolve(c, ref);
    if (!t) { bad(c, "$ref", "'%.80s' does not resolve (only local references: #, #/$defs/NAME, ...)", ref); return -1; }
    for (int i = 0; i < c->n_memo; i++)
        if (c->memo[i].node == t) return c->memo[i].rule;
    if (c->n_memo == c->cap_memo) {
        int nc = c->cap_memo ? c->cap_memo * 2 : 16;
        void *a = realloc(c->memo, sizeof *c->memo * (size_t)nc);
        void *b = realloc(c->pend, sizeof *c->pend * (size_t)nc);
        if (a) c->memo = a;
        if (b) c->pend = b;
        if (!a || !b) { c->out.oom = true; return -1; }
        c->cap_memo = c->cap_pend = nc;
    }
    int r = new_rule(c);
    c->memo[c->n_memo++] = (struct memo){t, r};
    c->pend[c->n_pend++] = (struct pend){t, r, strdup(ref + 1)};
    return r;
}

/* ---- one schema node ---- */
static bool has(const cJSON *s, const char *k) { return cJSON_GetObjectItemCaseSensitive(s, k) != NULL; }

/* One value of a JSON type for the (possibly typeless) schema s. */
static int gen_type(struct sc *c, struct sb *o, const cJSON *s, const char *t)
{
    if (!strcmp(t, "string")) return gen_string(c, o, s);
    if (!strcmp(t, "integer")) return gen_integer(c, o, s, true);
    if (!strcmp(t, "number")) return gen_integer(c, o, s, false);
    if (!strcmp(t, "boolean")) { sb_s(o, "(\"true\" | \"false\")"); return 0; }
    if (!strcmp(t, "null")) { sb_s(o, "\"null\""); return 0; }
    if (!strcmp(t, "array")) return gen_array(c, o, s);
    if (!strcmp(t, "object")) return gen_object(c, o, s);
    return bad(c, "type", "'%.40s' is not a JSON Schema type", t);
}

/* allOf over object schemas, merged by JSON Schema's rules: each member
 * is checked on its own, so a property must be allowed by every member
 * (declared there, or that member's additionalProperties not false), its
 * value must match every schema that applies to it (the declaring members'
 * and the additionalProperties schemas of the members that do not declare
 * it), and required is the union. A required property that some member
 * shuts out is refused (no object satisfies the schema); two different
 * schemas for one property are refused (their intersection is not
 * written). Extra properties are generated only when every member allows
 * them, with one schema at most. */
struct amember { const cJSON *x; char label[96]; };

static int allof_collect(struct sc *c, const cJSON *x, const char *label, struct amember *mv, int *n, int depth)
{
    if (depth > 8 || *n >= 64) return bad(c, "allOf", "members nest too deeply or are too many (64)");
    if (!cJSON_IsObject(x)) return bad(c, "allOf", "%s: allOf members must be object schemas", label);
    mv[*n].x = x;
    snprintf(mv[*n].label, sizeof mv[*n].label, "%s", label);
    (*n)++;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(x, "$ref");
    if (r) {
        const cJSON *t = cJSON_IsString(r) ? resolve(c, r->valuestring) : NULL;
        if (!t) return bad(c, "allOf", "%s: $ref does not resolve", label);
        if (allof_collect(c, t, r->valuestring, mv, n, depth + 1)) return c->rc;
    }
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(x, "allOf");
    if (all) {
        if (!cJSON_IsArray(all)) return bad(c, "allOf", "%s: allOf must be an array", label);
        int i = 0;
        for (const cJSON *m = all->child; m; m = m->next, i++) {
            char l[96];
            snprintf(l, sizeof l, "%s/allOf/%d", depth ? label : "", i);
            if (allof_collect(c, m, l, mv, n, depth + 1)) return c->rc;
        }
    }
    return 0;
}

static int gen_allof(struct sc *c, struct sb *o, const cJSON *s, const cJSON *all)
{
    (void)all;
    struct amember mv[64];
    int nm = 0;
    if (allof_collect(c, s, "", mv, &nm, 0)) return c->rc;
    /* what each member says */
    for (int i = 0; i < nm; i++) {
        for (const cJSON *k = mv[i].x->child; k; k = k->next) {
            const char *n = k->string;
            if (!strcmp(n, "type")) {
                if (!cJSON_IsString(k) || strcmp(k->valuestring, "object"))
                    return bad(c, "allOf", "%s/type: allOf is supported for object schemas only", mv[i].label);
            } else if (!strcmp(n, "properties") || !strcmp(n, "additionalProperties")) {
                if (!cJSON_IsObject(k) && !(cJSON_IsBool(k) && n[0] == 'a'))
                    return bad(c, "allOf", "%s/%s: must be %s", mv[i].label, n, n[0] == 'a' ? "a schema" : "an object of schemas");
            } else if (!strcmp(n, "required")) {
                if (!cJSON_IsArray(k)) return bad(c, "allOf", "%s/required: must be an array of strings", mv[i].label);
                for (const cJSON *q = k->child; q; q = q->next)
                    if (!cJSON_IsString(q)) return bad(c, "allOf", "%s/required: must be an array of strings", mv[i].label);
            } else if (!strcmp(n, "allOf") || !strcmp(n, "$ref") || is_annotation(n)) {
            } else {
                return bad(c, "allOf", "%s/%s: not supported inside allOf (properties, required, additionalProperties, type object are)",
                           mv[i].label, n);
            }
        }
    }
    cJSON *m = cJSON_CreateObject(), *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
    if (!m || !props || !req) { cJSON_Delete(m); cJSON_Delete(props); cJSON_Delete(req); c->out.oom = true; return 0; }
    cJSON_AddItemToObject(m, "properties", props);
    cJSON_AddItemToObject(m, "required", req);
    /* the merged additionalProperties: false when any member says false;
     * else generated only when every member allows extras explicitly */
    const cJSON *addp = NULL;
    bool any_false = false, all_allow = true;
    for (int i = 0; i < nm; i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(mv[i].x, "additionalProperties");
        if (cJSON_IsFalse(a)) any_false = true;
        if (!a) { all_allow = false; continue; }
        if (cJSON_IsObject(a)) {
            if (addp && !cJSON_Compare(addp, a, 1)) all_allow = false;
            else addp = a;
        }
    }
    if (any_false) cJSON_AddFalseToObject(m, "additionalProperties");
    else if (all_allow) cJSON_AddItemToObject(m, "additionalProperties", addp ? cJSON_Duplicate(addp, 1) : cJSON_CreateTrue());
    /* the schemas that apply to key k; NULL with *shut naming the member
     * that shuts k out; *one the schema when they agree */
    for (int pass = 0; pass < 2 && !c->rc; pass++) {
        for (int i = 0; i < nm && !c->rc; i++) {
            const cJSON *list = cJSON_GetObjectItemCaseSensitive(mv[i].x, pass ? "required" : "properties");
            for (const cJSON *p = list ? list->child : NULL; p && !c->rc; p = p->next) {
                const char *k = pass ? p->valuestring : p->string;
                if (!pass && cJSON_GetObjectItemCaseSensitive(props, k)) continue; /* merged already */
                const cJSON *one = NULL;
                int shut = -1, two = -1;
                for (int j = 0; j < nm; j++) {
                    const cJSON *pj = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(mv[j].x, "properties"), k);
                    const cJSON *aj = cJSON_GetObjectItemCaseSensitive(mv[j].x, "additionalProperties");
                    const cJSON *sj = pj ? pj : aj;
                    if (!pj && cJSON_IsFalse(aj)) { shut = j; continue; }
                    if (!sj || cJSON_IsTrue(sj)) continue;
                    if (!one) one = sj;
                    else if (!cJSON_Compare(one, sj, 1)) two = j;
                }
                if (pass && shut >= 0) {
                    bad(c, "allOf", "'%.60s' is required by %s but not allowed by %s (additionalProperties false): no object satisfies this schema",
                        k, mv[i].label[0] ? mv[i].label : "the schema", mv[shut].label[0] ? mv[shut].label : "the schema");
                    break;
                }
                if (shut >= 0) continue; /* never generated */
                if (two >= 0) {
                    bad(c, "allOf", "'%.60s' has different schemas in two members (%s): their intersection is not supported",
                        k, mv[two].label[0] ? mv[two].label : "the schema");
                    break;
                }
                if (pass) {
                    if (!cJSON_GetObjectItemCaseSensitive(props, k))
                        cJSON_AddItemToObject(props, k, one ? cJSON_Duplicate(one, 1) : cJSON_CreateTrue());
                    bool dup = false;
                    for (const cJSON *q = req->child; q; q = q->next) dup |= !strcmp(q->valuestring, k);
                    if (!dup) cJSON_AddItemToArray(req, cJSON_CreateString(k));
                } else {
                    cJSON_AddItemToObject(props, k, one ? cJSON_Duplicate(one, 1) : cJSON_CreateTrue());
                }
            }
        }
    }
    int rc = c->rc ? c->rc : gen_object(c, o, m);
    cJSON_Delete(m);
    return rc;
}

static int gen_body(struct sc *c, struct sb *o, const cJSON *s)
{
    if (cJSON_IsTrue(s)) { sb_s(o, "value"); return 0; }
    if (cJSON_IsFalse(s)) { sb_s(o, "[]"); return 0; }
    if (!cJSON_IsObject(s)) return bad(c, NULL, "a schema must be an object or a boolean");
    /* not: {} / not: true (zod's z.never()) matches nothing, not: false
     * anything; other forms are refused below */
    const cJSON *nt_ = cJSON_GetObjectItemCaseSensitive(s, "not");
    if (nt_ && (cJSON_IsBool(nt_) || (cJSON_IsObject(nt_) && !nt_->child))) {
        bool others = false;
        for (const cJSON *k = s->child; k; k = k->next) others |= k != nt_ && !is_annotation(k->string);
        if (!others) { sb_s(o, cJSON_IsFalse(nt_) ? "value" : "[]"); return 0; }
    }
    for (const cJSON *k = s->child; k; k = k->next)
        if (!known(k->string)) {
            static const char *const unenforced[] = {"not", "if", "then", "else", "dependentRequired", "dependentSchemas",
                                                     "unevaluatedProperties", "unevaluatedItems", "contains", NULL};
            for (int u = 0; unenforced[u]; u++)
                if (!strcmp(k->string, unenforced[u]))
                    return bad(c, k->string, "unsupported keyword: the grammar cannot enforce it exactly, so the schema is refused rather than risk an output that fails it");
            return bad(c, k->string, "unsupported keyword");
        }
    /* keywords that stand alone */
    const char *alone[] = {"$ref", "enum", "const", "anyOf", "oneOf", NULL};
    for (int a = 0; alone[a]; a++) {
        if (!has(s, alone[a])) continue;
        for (const cJSON *k = s->child; k; k = k->next)
            if (strcmp(k->string, alone[a]) && !is_annotation(k->string) &&
                !((!strcmp(alone[a], "enum") || !strcmp(alone[a], "const")) && !strcmp(k->string, "type")))
                return bad(c, k->string, "together with %s is not supported", alone[a]);
    }
    const cJSON *x;
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
        if (!cJSON_IsString(x)) return bad(c, "$ref", "must be a string");
        int r = gen_ref(c, x->valuestring);
        if (r >= 0) rule_name(c, o, r);
        return c->rc;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "enum")) || (x = cJSON_GetObjectItemCaseSensitive(s, "const"))) {
        bool is_enum = !strcmp(x->string, "enum");
        if (is_enum && !cJSON_IsArray(x)) return bad(c, "enum", "must be an array");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
        sb_s(o, "([]");
        int n = is_enum ? cJSON_GetArraySize(x) : 1;
        for (int i = 0; i < n; i++) {
            const cJSON *v = is_enum ? cJSON_GetArrayItem(x, i) : x;
            if (cJSON_IsString(ty)) { /* keep the values of that type */
                const char *t = ty->valuestring;
                bool ok = (!strcmp(t, "string") && cJSON_IsString(v)) || (!strcmp(t, "number") && cJSON_IsNumber(v)) ||
                          (!strcmp(t, "integer") && cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble)) ||
                          (!strcmp(t, "boolean") && cJSON_IsBool(v)) || (!strcmp(t, "null") && cJSON_IsNull(v)) ||
                          (!strcmp(t, "array") && cJSON_IsArray(v)) || (!strcmp(t, "object") && cJSON_IsObject(v));
                if (!ok) continue;
            }
            char *t = cJSON_PrintUnformatted(v);
            if (!t) { c->out.oom = true; return 0; }
            sb_s(o, " | ");
            sb_lit(o, t, strlen(t));
            free(t);
        }
        sb_s(o, ")");
        return 0;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "anyOf")) || (x = cJSON_GetObjectItemCaseSensitive(s, "oneOf"))) {
        if (!cJSON_IsArray(x) || !cJSON_GetArraySize(x)) return bad(c, x->string, "must be a non-empty array of schemas");
        sb_s(o, "(");
        int n = cJSON_GetArraySize(x);
        for (int i = 0; i < n && !c->rc; i++) {
            size_t o0 = ptr_push(c, x->string);
            ptr_idx(c, i);
            int r = gen(c, cJSON_GetArrayItem(x, i));
            c->plen = o0;
            if (i) sb_s(o, " | ");
            rule_name(c, o, r);
        }
        sb_s(o, ")");
        return c->rc;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "allOf"))) {
        if (!cJSON_IsArray(x) || !cJSON_GetArraySize(x)) return bad(c, "allOf", "must be a non-empty array of schemas");
        /* one member beside annotations (Pydantic 1 wraps a $ref with a
         * description so): that member, of any type */
        bool only = cJSON_GetArraySize(x) == 1;
        for (const cJSON *k = s->child; k; k = k->next) only &= k == x || is_annotation(k->string);
        if (only) {
            size_t o0 = ptr_push(c, "allOf");
            ptr_idx(c, 0);
            int r = gen(c, cJSON_GetArrayItem(x, 0));
            c->plen = o0;
            rule_name(c, o, r);
            return c->rc;
        }
        return gen_allof(c, o, s, x);
    }
    /* types: given, or implied by the keywords present */
    const char *types[8];
    int nt = 0;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (ty) {
        if (cJSON_IsString(ty)) types[nt++] = ty->valuestring;
        else if (cJSON_IsArray(ty) && cJSON_GetArraySize(ty) > 0 && cJSON_GetArraySize(ty) <= 7) {
            for (const cJSON *t = ty->child; t; t = t->next) {
                if (!cJSON_IsString(t)) return bad(c, "type", "must be a type name or an array of them");
                types[nt++] = t->valuestring;
            }
        } else return bad(c, "type", "must be a type name or an array of 1-7 of them");
    } else {
        if (has(s, "properties") || has(s, "required") || has(s, "additionalProperties") || has(s, "patternProperties") ||
            has(s, "propertyNames") || has(s, "minProperties") || has(s, "maxProperties"))
            types[nt++] = "object";
        if (has(s, "items") || has(s, "prefixItems") || has(s, "minItems") || has(s, "maxItems") || has(s, "uniqueItems"))
            types[nt++] = "array";
        if (has(s, "minLength") || has(s, "maxLength") || has(s, "pattern") || has(s, "format")) types[nt++] = "string";
        if (has(s, "minimum") || has(s, "maximum") || has(s, "exclusiveMinimum") || has(s, "exclusiveMaximum") ||
            has(s, "multipleOf"))
            types[nt++] = "integer";
        if (!nt) { sb_s(o, "value"); return 0; }
    }
    sb_s(o, "(");
    for (int i = 0; i < nt && !c->rc; i++) {
        if (i) sb_s(o, " | ");
        gen_type(c, o, s, types[i]);
    }
    sb_s(o, ")");
    return c->rc;
}

/* Compiles node s into a new rule; returns its number. */
static int gen_into(struct sc *c, const cJSON *s, int r)
{
    struct sb body = {0};
    gen_body(c, &body, s);
    if (!c->rc) {
        rule_name(c, &c->out, r);
        sb_s(&c->out, " ::= ");
        sb_s(&c->out, body.p ? body.p : "\"\"");
        sb_s(&c->out, "\n");
        if (body.oom) c->out.oom = true;
    }
    free(body.p);
    return r;
}

static int gen(struct sc *c, const cJSON *s)
{
    return gen_into(c, s, new_rule(c));
}

/* Depth of the JSON text's nesting, without parsing it (so a deep text is
 * refused before any recursive parser sees it). */
static int text_depth(const char *s, size_t n)
{
    int d = 0, mx = 0;
    bool str = false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (str) { if (ch == '\\') i++; else if (ch == '"') str = false; continue; }
        if (ch == '"') str = true;
        else if (ch == '{' || ch == '[') { if (++d > mx) mx = d; }
        else if (ch == '}' || ch == ']') d--;
    }
    return mx;
}

static int parse_doc(const char *json, size_t len, const char *what, cJSON **doc, struct rl_err *err)
{
    if (len > GRAM_MAX_SOURCE)
        return rl_errf(err, EV_CODE_BAD_PARAM, "%s is %zu bytes; the limit is %d", what, len, GRAM_MAX_SOURCE);
    int d = text_depth(json, len);
    if (d > GRAM_MAX_DEPTH)
        return rl_errf(err, EV_CODE_BAD_PARAM, "%s nests %d levels deep; the limit is %d", what, d, GRAM_MAX_DEPTH);
    /* JSON text is UTF-8 (RFC 8259); a string that is not would reach the
     * generated grammar, whose parser would then refuse our own text */
    size_t ok = utf8_valid_len(json, len);
    if (ok != len)
        return rl_errf(err, EV_CODE_BAD_PARAM, "%s is not valid UTF-8 (at byte %zu)", what, ok);
    *doc = cJSON_ParseWithLength(json, len);
    if (!*doc)
        return rl_errf(err, EV_CODE_BAD_PARAM, "%s is not valid JSON", what);
    return 0;
}

/* Compiles pending $ref targets, then frees the compiler's tables. */
static int finish(struct sc *c)
{
    for (int i = 0; i < c->n_pend && !c->rc; i++) {
        size_t L = strlen(c->pend[i].ptr);
        if (L >= sizeof c->ptr) L = sizeof c->ptr - 1;
        memcpy(c->ptr, c->pend[i].ptr, L);
        c->plen = L;
        gen_into(c, c->pend[i].node, c->pend[i].rule);
    }
    for (int i = 0; i < c->n_pend; i++) free(c->pend[i].ptr);
    free(c->pend); free(c->memo);
    c->pend = NULL; c->memo = NULL;
    c->n_pend = c->n_memo = 0;
    return c->rc;
}

static int done_text(struct sc *c, char **ebnf, struct rl_err *err)
{
    if (c->rc) { free(c->out.p); return c->rc; }
    if (c->out.oom) { free(c->out.p); return rl_errf(err, RL_ENOMEM, "schema: out of memory"); }
    *ebnf = c->out.p;
    return 0;
}

int gschema_to_ebnf(const char *json, size_t len, char **ebnf, struct rl_err *err)
{
    *ebnf = NULL;
    cJSON *doc;
    int rc = parse_doc(json, len, "schema", &doc, err);
    if (rc) return rc;
    struct sc c = {.doc = doc, .err = err};
    sb_s(&c.out, BASE);
    int r = gen(&c, doc);
    finish(&c);
    if (!c.rc) sb_f(&c.out, "root ::= s%d\n", r);
    cJSON_Delete(doc);
    return done_text(&c, ebnf, err);
}

int gschema_object_ebnf(char **ebnf, struct rl_err *err)
{
    *ebnf = NULL;
    struct sc c = {.err = err};
    sb_s(&c.out, BASE);
    sb_s(&c.out, "root ::= object\n");
    return done_text(&c, ebnf, err);
}

int gschema_tool_ebnf(const char *tools, size_t len, const char *name, char **ebnf, struct rl_err *err)
{
    *ebnf = NULL;
    cJSON *doc;
    int rc = parse_doc(tools, len, "tools", &doc, err);
    if (rc) return rc;
    if (!cJSON_IsArray(doc) || !cJSON_GetArraySize(doc)) {
        cJSON_Delete(doc);
        return rl_errf(err, EV_CODE_BAD_PARAM, "tools must be a non-empty array");
    }
    struct sc c = {.err = err};
    sb_s(&c.out, BASE);
    struct sb root = {0};
    sb_s(&root, "root ::= \"<tool_call>\\n{\\\"name\\\": \\\"\" (");
    int n = 0, i = 0;
    for (const cJSON *t = doc->child; t && !c.rc; t = t->next, i++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(nm)) { rc = rl_errf(err, EV_CODE_BAD_PARAM, "/%d/function/name: required string", i); c.rc = rc; break; }
        if (name && strcmp(name, nm->valuestring)) continue;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        snprintf(c.prefix, sizeof c.prefix, "t%d", i);
        c.doc = params;
        c.plen = (size_t)snprintf(c.ptr, sizeof c.ptr, "/%d/function/parameters", i);
        c.n_rules = 0;
        int r = -1;
        if (params) { r = gen(&c, params); finish(&c); }
        if (c.rc) break;
        /* the name as it appears inside the JSON string */
        cJSON *ks = cJSON_CreateString(nm->valuestring);
        char *kt = ks ? cJSON_PrintUnformatted(ks) : NULL;
        if (!kt) { c.out.oom = true; cJSON_Delete(ks); break; }
        if (n++) sb_s(&root, " | ");
        sb_s(&root, "(");
        sb_lit(&root, kt + 1, strlen(kt) - 2);
        sb_s(&root, " \"\\\", \\\"arguments\\\": \" ");
        if (r >= 0) sb_f(&root, "t%ds%d", i, r);
        else sb_s(&root, "object");
        sb_s(&root, ")");
        free(kt); cJSON_Delete(ks);
    }
    if (!c.rc && !n)
        c.rc = rl_errf(err, EV_CODE_BAD_PARAM, "tool_choice names '%.80s', which is not among the tools", name ? name : "");
    sb_s(&root, ") \"}\\n</tool_call>\"\n");
    if (!c.rc) sb_s(&c.out, root.p ? root.p : "");
    if (root.oom) c.out.oom = true;
    free(root.p);
    cJSON_Delete(doc);
    return done_text(&c, ebnf, err);
}
