/* engine/grammar/ebnf.c - the raw grammar syntax (schemas/grammar.md) into
 * the IR.
 *
 *   grammar  = { rule }                 rules in any order; `root` starts
 *   rule     = NAME "::=" alts          a rule runs to the next NAME "::="
 *   alts     = seq { "|" seq }
 *   seq      = { item }                 an empty seq matches ""
 *   item     = prim [ "*" | "+" | "?" | "{" m [ "," [ n ] ] "}" ]
 *   prim     = STRING | CLASS | "." | NAME | "(" alts ")"
 * Text is UTF-8; STRING ("...") and CLASS ([...], [^...]) are in code
 * points, "." is any code point; escapes \n \r \t \\ \" \' \[ \] \- \^ \/
 * \xHH \uHHHH \UHHHHHHHH. `#` starts a comment. The empty class [] matches
 * nothing. Every error is "line:col: what" (EV_CODE_BAD_PARAM).
 * Recursion is over parentheses only, bounded by MAX_NEST. */
#include "gir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"

#define MAX_NEST 64
#define MAX_RANGES 4096

struct ps {
    const char *s; size_t n, i;
    int line, col;
    struct gir *g;
    struct rl_err *err;
    int rc;
    int depth;
};

static int fail(struct ps *p, const char *fmt, const char *arg)
{
    if (!p->rc) {
        char m[256];
        snprintf(m, sizeof m, fmt, arg ? arg : "");
        p->rc = rl_errf(p->err, EV_CODE_BAD_PARAM, "grammar %d:%d: %s", p->line, p->col, m);
    }
    return 0;
}

static int peek(const struct ps *p) { return p->i < p->n ? (unsigned char)p->s[p->i] : -1; }

static void adv(struct ps *p)
{
    if (p->i >= p->n) return;
    if (p->s[p->i] == '\n') { p->line++; p->col = 1; }
    else if (((unsigned char)p->s[p->i] & 0xc0) != 0x80) p->col++;
    p->i++;
}

static void skip_ws(struct ps *p)
{
    for (;;) {
        int c = peek(p);
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') adv(p);
        else if (c == '#') { while (peek(p) >= 0 && peek(p) != '\n') adv(p); }
        else return;
    }
}

static bool is_name0(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_name(int c) { return is_name0(c) || (c >= '0' && c <= '9') || c == '-'; }

/* Is a NAME "::=" at the current position (the start of the next rule)? */
static bool at_rule_start(const struct ps *p)
{
    size_t j = p->i;
    if (j >= p->n || !is_name0((unsigned char)p->s[j])) return false;
    while (j < p->n && is_name((unsigned char)p->s[j])) j++;
    while (j < p->n && (p->s[j] == ' ' || p->s[j] == '\t')) j++;
    return j + 3 <= p->n && !memcmp(p->s + j, "::=", 3);
}

/* One UTF-8 code point from the source; -1 with an error when invalid. */
static long utf8_cp(struct ps *p)
{
    const unsigned char *u = (const unsigned char *)p->s + p->i;
    size_t left = p->n - p->i;
    long c = u[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || (size_t)len > left) { fail(p, "invalid UTF-8", NULL); return -1; }
    if (len > 1) c &= 0x3f >> (len - 1);
    for (int k = 1; k < len; k++) {
        if ((u[k] & 0xc0) != 0x80) { fail(p, "invalid UTF-8", NULL); return -1; }
        c = (c << 6) | (u[k] & 0x3f);
    }
    static const long minv[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < minv[len] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) { fail(p, "invalid UTF-8", NULL); return -1; }
    for (int k = 0; k < len; k++) adv(p);
    return c;
}

static long hexn(struct ps *p, int n)
{
    long v = 0;
    for (int k = 0; k < n; k++) {
        int c = peek(p);
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) { fail(p, "bad hex digit in escape", NULL); return -1; }
        v = v * 16 + d;
        adv(p);
    }
    if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) { fail(p, "escape is not a Unicode scalar value", NULL); return -1; }
    return v;
}

/* A character of a STRING or CLASS, escapes decoded. */
static long char_at(struct ps *p)
{
    if (peek(p) < 0) { fail(p, "unterminated string or class", NULL); return -1; }
    if (peek(p) != '\\') return utf8_cp(p);
    adv(p);
    int c = peek(p);
    adv(p);
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': return c;
    case 'x': return hexn(p, 2);
    case 'u': return hexn(p, 4);
    case 'U': return hexn(p, 8);
    default: {
        char b[2] = {(char)(c < 0 ? '?' : c), 0};
        fail(p, "unknown escape \\%s", b);
        return -1;
    }
    }
}

static size_t put_utf8(char *o, uint32_t c)
{
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xc0 | c >> 6); o[1] = (char)(0x80 | (c & 0x3f)); return 2; }
    if (c < 0x10000) { o[0] = (char)(0xe0 | c >> 12); o[1] = (char)(0x80 | (c >> 6 & 0x3f)); o[2] = (char)(0x80 | (c & 0x3f)); return 3; }
    o[0] = (char)(0xf0 | c >> 18); o[1] = (char)(0x80 | (c >> 12 & 0x3f)); o[2] = (char)(0x80 | (c >> 6 & 0x3f)); o[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

static int parse_string(struct ps *p)
{
    adv(p); /* " */
    size_t cap = 64, n = 0;
    char *buf = malloc(cap);
    if (!buf) { p->g->oom = true; return 0; }
    while (peek(p) != '"') {
        if (peek(p) < 0 || peek(p) == '\n') { free(buf); return fail(p, "unterminated string", NULL); }
        long c = char_at(p);
        if (c < 0) { free(buf); return 0; }
        if (n + 4 > cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); p->g->oom = true; return 0; }
            buf = nb; cap *= 2;
        }
        n += put_utf8(buf + n, (uint32_t)c);
    }
    adv(p);
    int e = gir_lit(p->g, buf, n);
    free(buf);
    return e;
}

/* The alternation of code point ranges r (n), complemented when neg. */
static int ranges_expr(struct gir *g, struct gir_range *r, int n, bool neg)
{
    struct gir_range *tmp = NULL;
    if (neg) {
        tmp = malloc(sizeof *tmp * (size_t)(n + 1));
        if (!tmp) { g->oom = true; return 0; }
        n = gir_ranges_neg(r, n, tmp);
        r = tmp;
    } else {
        n = gir_ranges_norm(r, n);
    }
    int *alts = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!alts) { free(tmp); g->oom = true; return 0; }
    for (int i = 0; i < n; i++) alts[i] = gir_cprange(g, r[i].lo, r[i].hi);
    int e = gir_alt(g, alts, n);
    free(alts);
    free(tmp);
    return e;
}

static int parse_class(struct ps *p)
{
    adv(p); /* [ */
    bool neg = false;
    if (peek(p) == '^') { neg = true; adv(p); }
    struct gir_range *r = malloc(sizeof *r * MAX_RANGES);
    int n = 0;
    if (!r) { p->g->oom = true; return 0; }
    while (peek(p) != ']') {
        if (peek(p) < 0 || peek(p) == '\n') { free(r); return fail(p, "unterminated character class", NULL); }
        if (n >= MAX_RANGES) { free(r); return fail(p, "character class has too many ranges", NULL); }
        long lo = char_at(p), hi = lo;
        if (lo < 0) { free(r); return 0; }
        if (peek(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
            adv(p);
            hi = char_at(p);
            if (hi < 0) { free(r); return 0; }
            if (hi < lo) { free(r); return fail(p, "character range is reversed", NULL); }
        }
        r[n++] = (struct gir_range){(uint32_t)lo, (uint32_t)hi};
    }
    adv(p);
    int e = ranges_expr(p->g, r, n, neg);
    free(r);
    return e;
}

static int parse_alts(struct ps *p);

static long parse_int(struct ps *p)
{
    if (!(peek(p) >= '0' && peek(p) <= '9')) { fail(p, "expected a number", NULL); return -1; }
    long v = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        v = v * 10 + (peek(p) - '0');
        if (v > GIR_MAX_REPEAT) { fail(p, "repetition count over 10000", NULL); return -1; }
        adv(p);
    }
    return v;
}

static int parse_item(struct ps *p, bool *got)
{
    *got = true;
    int c = peek(p), e;
    if (c == '"') e = parse_string(p);
    else if (c == '[') e = parse_class(p);
    else if (c == '.') { adv(p); e = gir_cprange(p->g, 0, 0x10ffff); }
    else if (c == '(') {
        if (++p->depth > MAX_NEST) return fail(p, "parentheses nested too deeply", NULL);
        adv(p);
        e = parse_alts(p);
        if (p->rc) return 0;
        skip_ws(p);
        if (peek(p) != ')') return fail(p, "expected ')'", NULL);
        adv(p);
        p->depth--;
    } else if (is_name0(c) && !at_rule_start(p)) {
        size_t st = p->i;
        int l = p->line, co = p->col;
        while (is_name(peek(p))) adv(p);
        int r = gir_rule(p->g, p->s + st, p->i - st, l, co);
        if (r < 0) return 0;
        e = gir_ref(p->g, r);
    } else { *got = false; return 0; }
    if (p->rc) return 0;
    /* quantifier (no space before it) */
    c = peek(p);
    if (c == '*') { adv(p); return gir_rep(p->g, e, 0, -1); }
    if (c == '+') { adv(p); return gir_rep(p->g, e, 1, -1); }
    if (c == '?') { adv(p); return gir_rep(p->g, e, 0, 1); }
    if (c == '{') {
        int ql = p->line, qc = p->col;
        adv(p);
        long m = parse_int(p), n = m;
        if (m < 0) return 0;
        if (peek(p) == ',') {
            adv(p);
            if (peek(p) == '}') n = -1;
            else if ((n = parse_int(p)) < 0) return 0;
        }
        if (peek(p) != '}') return fail(p, "expected '}'", NULL);
        adv(p);
        if (n >= 0 && n < m) { p->line = ql; p->col = qc; return fail(p, "repetition {m,n} has n < m", NULL); }
        return gir_rep(p->g, e, (int)m, (int)n);
    }
    return e;
}

/* Appends e to the growable array *k (n, cap); false when out of memory. */
static bool push_kid(struct ps *p, int **k, int *n, int *cap, int e)
{
    if (*n == *cap) {
        int *nk = realloc(*k, sizeof(int) * (size_t)*cap * 2);
        if (!nk) { p->g->oom = true; return false; }
        *k = nk;
        *cap *= 2;
    }
    (*k)[(*n)++] = e;
    return true;
}

static int parse_seq(struct ps *p)
{
    int cap = 16, n = 0;
    int *k = malloc(sizeof(int) * (size_t)cap);
    if (!k) { p->g->oom = true; return 0; }
    for (;;) {
        skip_ws(p);
        bool got;
        int e = parse_item(p, &got);
        if (p->rc || !got || !push_kid(p, &k, &n, &cap, e)) break;
    }
    int e = p->rc || p->g->oom ? 0 : gir_seq(p->g, k, n);
    free(k);
    return e;
}

static int parse_alts(struct ps *p)
{
    int cap = 8, n = 0;
    int *k = malloc(sizeof(int) * (size_t)cap);
    if (!k) { p->g->oom = true; return 0; }
    for (;;) {
        int e = parse_seq(p);
        if (p->rc || !push_kid(p, &k, &n, &cap, e)) break;
        skip_ws(p);
        if (peek(p) != '|') break;
        adv(p);
    }
    int e = p->rc || p->g->oom ? 0 : gir_alt(p->g, k, n);
    free(k);
    return e;
}

int gir_parse_ebnf(struct gir *g, const char *src, size_t len, int *root, struct rl_err *err)
{
    struct ps p = {.s = src, .n = len, .line = 1, .col = 1, .g = g, .err = err};
    for (;;) {
        skip_ws(&p);
        if (peek(&p) < 0) break;
        if (!at_rule_start(&p)) {
            fail(&p, "expected a rule: NAME ::= ...", NULL);
            break;
        }
        size_t st = p.i;
        int l = p.line, co = p.col;
        while (is_name(peek(&p))) adv(&p);
        int r = gir_rule(g, src + st, p.i - st, l, co);
        if (r < 0) break;
        if (g->rules[r].expr >= 0) {
            char nm[80];
            snprintf(nm, sizeof nm, "%.*s", (int)(p.i - st > 60 ? 60 : p.i - st), src + st);
            p.line = l; p.col = co;
            fail(&p, "rule '%s' is defined twice", nm);
            break;
        }
        skip_ws(&p);
        adv(&p); adv(&p); adv(&p); /* ::= */
        int e = parse_alts(&p);
        if (p.rc) break;
        skip_ws(&p);
        if (peek(&p) >= 0 && !at_rule_start(&p)) {
            char b[8];
            int c = peek(&p);
            snprintf(b, sizeof b, "%c", c >= 0x20 && c < 0x7f ? c : '?');
            fail(&p, "unexpected '%s'", b);
            break;
        }
        g->rules[r].expr = e;
        g->rules[r].line = l;
        g->rules[r].col = co;
    }
    if (p.rc)
        return p.rc;
    if (g->oom)
        return rl_errf(err, RL_ENOMEM, "grammar: out of memory");
    int r = -1;
    for (int i = 0; i < g->n_rules; i++)
        if (!strcmp(g->rules[i].name, "root")) r = i;
    if (r < 0 || g->rules[r].expr < 0)
        return rl_errf(err, EV_CODE_BAD_PARAM, "grammar %d:%d: no rule named 'root' (the start rule)", p.line, p.col);
    *root = r;
    return 0;
}
