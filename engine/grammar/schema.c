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
 * exponent digits: no number overflows a double). Every keyword not in
 * the supported set, and every supported one with a bad value, is refused
 * with EV_CODE_BAD_PARAM naming its JSON pointer. Annotations (title, description, ...) are ignored. */
#include "gir.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"
#include "grammar.h"

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
                                    "$defs", "definitions", NULL};
    for (int i = 0; a[i]; i++)
        if (!strcmp(k, a[i])) return true;
    return false;
}

static const char *const KNOWN[] = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
    "minLength", "maxLength", "pattern", "format", "minimum", "maximum", NULL};

static bool known(const char *k)
{
    for (int i = 0; KNOWN[i]; i++)
        if (!strcmp(k, KNOWN[i])) return true;
    return is_annotation(k);
}

static int gen(struct sc *c, const cJSON *s);

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

/* ---- regular expressions (pattern) -> grammar text over JSON-encoded
 * characters ---- */
struct rx { const char *s; size_t n, i; struct sc *c; struct sb *o; int depth; };

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
        if (x->i + 1 == x->n) { *got = false; return 0; }
        return rx_bad(x, "$ not at the end");
    }
    if (ch == '*' || ch == '+' || ch == '?' || ch == '{') return rx_bad(x, "quantifier without an operand");
    if (ch == ')' || ch == '|') { *got = false; return 0; }
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
    sb_s(x->o, "(\"\"");
    while (x->i < x->n) {
        sb_s(x->o, " (");
        bool got;
        if (rx_atom(x, &got)) return x->c->rc;
        sb_s(x->o, ")");
        if (!got) { x->o->n -= 2; x->o->p[x->o->n] = 0; break; }
        if (x->i < x->n) {
            char q = x->s[x->i];
            if (q == '*' || q == '+' || q == '?') { x->i++; sb_add(x->o, &q, 1); }
            else if (q == '{') {
                x->i++;
                long m, k;
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
                if (k < 0) sb_f(x->o, "{%ld,}", m);
                else sb_f(x->o, "{%ld,%ld}", m, k);
            } else continue;
            if (x->i < x->n && x->s[x->i] == '?') x->i++; /* lazy: same language */
            if (x->i < x->n && (x->s[x->i] == '*' || x->s[x->i] == '+' || x->s[x->i] == '{'))
                return rx_bad(x, "repeated quantifier");
        }
    }
    sb_s(x->o, ")");
    return 0;
}

static int rx_alt(struct rx *x)
{
    sb_s(x->o, "(");
    for (;;) {
        if (rx_seq(x)) return x->c->rc;
        if (x->i < x->n && x->s[x->i] == '|') { x->i++; sb_s(x->o, " | "); continue; }
        break;
    }
    sb_s(x->o, ")");
    return 0;
}

/* The content of a string matching pattern p (ECMA-262 semantics: it may
 * match anywhere unless anchored). */
static int gen_pattern(struct sc *c, struct sb *o, const char *p)
{
    size_t n = strlen(p);
    bool a0 = n && p[0] == '^', a1 = n && p[n - 1] == '$' && (n < 2 || p[n - 2] != '\\');
    struct rx x = {.s = p, .n = n, .i = a0 ? 1 : 0, .c = c, .o = o};
    if (!a0) sb_s(o, CH "* ");
    if (rx_alt(&x)) return c->rc;
    if (a1 && x.i == n - 1) x.i++;
    if (x.i != n) return rx_bad(&x, "unexpected character");
    if (!a1) sb_s(o, " " CH "*");
    return 0;
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

/* non-negative lo..hi without leading zeros */
static void pos_range(struct sb *o, long long lo, long long hi)
{
    sb_s(o, "(");
    bool first = true;
    long long p10 = 1;
    for (int len = 1; len <= 16; len++, p10 *= 10) {
        long long a = len == 1 ? 0 : p10, b = p10 * 10 - 1;
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        if (a > b) continue;
        char sa[24], sbuf[24];
        snprintf(sa, sizeof sa, "%lld", a);
        snprintf(sbuf, sizeof sbuf, "%lld", b);
        if (!first) sb_s(o, " | ");
        digits_range(o, sa, sbuf, len);
        first = false;
    }
    sb_s(o, ")");
}

#define INT_LIM 999999999999999LL /* 15 digits */

static int gen_integer(struct sc *c, struct sb *o, const cJSON *s, bool is_int)
{
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minimum");
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(s, "maximum");
    if (!mn && !mx) { sb_s(o, is_int ? "integer" : "number"); return 0; }
    if (!is_int)
        return bad(c, mn ? "minimum" : "maximum", "bounds are supported on type integer only");
    if ((mn && !cJSON_IsNumber(mn)) || (mx && !cJSON_IsNumber(mx)))
        return bad(c, mn && !cJSON_IsNumber(mn) ? "minimum" : "maximum", "must be a number");
    double lo = mn ? ceil(mn->valuedouble) : -INT_LIM, hi = mx ? floor(mx->valuedouble) : INT_LIM;
    if (lo < -INT_LIM || lo > INT_LIM) return bad(c, "minimum", "beyond the supported magnitude 10^15");
    if (hi < -INT_LIM || hi > INT_LIM) return bad(c, "maximum", "beyond the supported magnitude 10^15");
    if (lo > hi) return bad(c, "minimum", "is above maximum: no integer satisfies this schema");
    long long a = (long long)lo, b = (long long)hi;
    sb_s(o, "(");
    bool first = true;
    if (a < 0) { /* negatives: -(max(1,-b) .. -a) */
        long long na = b < 0 ? -b : 1, nb = -a;
        sb_s(o, "\"-\" ");
        pos_range(o, na, nb);
        first = false;
    }
    if (b >= 0) {
        if (!first) sb_s(o, " | ");
        pos_range(o, a > 0 ? a : 0, b);
    }
    sb_s(o, ")");
    return 0;
}

/* ---- strings ---- */
static int gen_string(struct sc *c, struct sb *o, const cJSON *s)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    bool has_len = cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength");
    if (fmt) {
        if (!cJSON_IsString(fmt)) return bad(c, "format", "must be a string");
        if (pat || has_len) return bad(c, "format", "format together with pattern or minLength/maxLength is not supported");
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
        const char *f = fmt->valuestring;
        sb_s(o, "\"\\\"\" (");
        if (!strcmp(f, "date")) sb_s(o, date);
        else if (!strcmp(f, "date-time")) { sb_s(o, date); sb_s(o, " \"T\" "); sb_s(o, tim); }
        else if (!strcmp(f, "uuid"))
            sb_s(o, "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}");
        else if (!strcmp(f, "email"))
            sb_s(o, "[A-Za-z0-9_%+-] [A-Za-z0-9._%+-]{0,63} \"@\" [A-Za-z0-9] [A-Za-z0-9-]{0,62} (\".\" [A-Za-z0-9] [A-Za-z0-9-]{0,62}){1,4}");
        else return bad(c, "format", "'%.40s' is not supported (date, date-time, uuid, email are)", f);
        sb_s(o, ") \"\\\"\"");
        return 0;
    }
    if (pat) {
        if (!cJSON_IsString(pat)) return bad(c, "pattern", "must be a string");
        if (has_len) return bad(c, "pattern", "pattern together with minLength/maxLength is not supported");
        sb_s(o, "\"\\\"\" (");
        if (gen_pattern(c, o, pat->valuestring)) return c->rc;
        sb_s(o, ") \"\\\"\"");
        return 0;
    }
    long mn = count_kw(c, s, "minLength", 0), mx = count_kw(c, s, "maxLength", -1);
    if (mn < 0 || c->rc) return c->rc;
    if (mx >= 0 && mx < mn) return bad(c, "minLength", "is above maxLength: no string satisfies this schema");
    if (mn == 0 && mx < 0) { sb_s(o, "string"); return 0; }
    if (mx < 0) sb_f(o, "\"\\\"\" " CH "{%ld,} \"\\\"\"", mn);
    else sb_f(o, "\"\\\"\" " CH "{%ld,%ld} \"\\\"\"", mn, mx);
    return 0;
}

/* ---- arrays ---- */
static int gen_array(struct sc *c, struct sb *o, const cJSON *s)
{
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    long mn = count_kw(c, s, "minItems", 0), mx = count_kw(c, s, "maxItems", -1);
    if (c->rc) return c->rc;
    if (pre && !cJSON_IsArray(pre)) return bad(c, "prefixItems", "must be an array of schemas");
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items)) return bad(c, "items", "must be a schema");
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
    /* the name of one pair: "key": value */
    struct sb *b = o;
    char an[64];
    if (arule >= 0) snprintf(an, sizeof an, "%ss%d", c->prefix, arule);
    else snprintf(an, sizeof an, "value");
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
                else if (written) sb_f(&r, "(" SEP " string " COLON " %s)*", an);
                else sb_f(&r, "(string " COLON " %s (" SEP " string " COLON " %s)*)?", an, an);
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

/* Merges allOf members (objects) into one object schema. */
static int gen_allof(struct sc *c, struct sb *o, const cJSON *s, const cJSON *all)
{
    cJSON *m = cJSON_CreateObject(), *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
    if (!m || !props || !req) { cJSON_Delete(m); cJSON_Delete(props); cJSON_Delete(req); c->out.oom = true; return 0; }
    cJSON_AddItemToObject(m, "properties", props);
    cJSON_AddItemToObject(m, "required", req);
    const cJSON *addp = NULL;
    int n = cJSON_GetArraySize(all);
    for (int i = -1; i < n && !c->rc; i++) {
        const cJSON *x = i < 0 ? s : cJSON_GetArrayItem(all, i);
        size_t o0 = c->plen;
        if (i >= 0) { ptr_push(c, "allOf"); ptr_idx(c, i); }
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(x, "$ref");
        if (i >= 0 && cJSON_IsString(r)) x = resolve(c, r->valuestring);
        if (!cJSON_IsObject(x)) { bad(c, NULL, "allOf members must be object schemas"); break; }
        for (const cJSON *k = x->child; k && !c->rc; k = k->next) {
            if (!strcmp(k->string, "type")) {
                if (!cJSON_IsString(k) || strcmp(k->valuestring, "object")) bad(c, "type", "allOf is supported for objects only");
            } else if (!strcmp(k->string, "properties") && cJSON_IsObject(k)) {
                for (const cJSON *p = k->child; p; p = p->next) {
                    if (cJSON_GetObjectItemCaseSensitive(props, p->string)) {
                        size_t o1 = ptr_push(c, "properties");
                        bad(c, p->string, "property declared by two allOf members");
                        c->plen = o1;
                        break;
                    }
                    cJSON_AddItemToObject(props, p->string, cJSON_Duplicate(p, 1));
                }
            } else if (!strcmp(k->string, "required") && cJSON_IsArray(k)) {
                for (const cJSON *q = k->child; q; q = q->next) cJSON_AddItemToArray(req, cJSON_Duplicate(q, 1));
            } else if (!strcmp(k->string, "additionalProperties")) {
                if (!addp || cJSON_IsFalse(k)) addp = k;
            } else if (!strcmp(k->string, "allOf") || !strcmp(k->string, "$ref") || is_annotation(k->string)) {
            } else {
                bad(c, k->string, "not supported inside allOf (properties, required, additionalProperties are)");
            }
        }
        c->plen = o0;
    }
    if (addp) cJSON_AddItemToObject(m, "additionalProperties", cJSON_Duplicate(addp, 1));
    int rc = c->rc ? c->rc : gen_object(c, o, m);
    cJSON_Delete(m);
    return rc;
}

static int gen_body(struct sc *c, struct sb *o, const cJSON *s)
{
    if (cJSON_IsTrue(s)) { sb_s(o, "value"); return 0; }
    if (cJSON_IsFalse(s)) { sb_s(o, "[]"); return 0; }
    if (!cJSON_IsObject(s)) return bad(c, NULL, "a schema must be an object or a boolean");
    for (const cJSON *k = s->child; k; k = k->next)
        if (!known(k->string)) return bad(c, k->string, "unsupported keyword");
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
        if (cJSON_GetArraySize(x) == 1 && s->child == x && !x->next) {
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
        if (has(s, "properties") || has(s, "required") || has(s, "additionalProperties")) types[nt++] = "object";
        if (has(s, "items") || has(s, "prefixItems") || has(s, "minItems") || has(s, "maxItems")) types[nt++] = "array";
        if (has(s, "minLength") || has(s, "maxLength") || has(s, "pattern") || has(s, "format")) types[nt++] = "string";
        if (has(s, "minimum") || has(s, "maximum")) types[nt++] = "integer";
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
