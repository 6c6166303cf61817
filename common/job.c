/* common/job.c - the job codec: text -> validated struct job -> text, and
 * the result-cache key.
 *
 * The dispatcher calls job_parse on every request it routes and the worker
 * again on every job it reads (a job may have been written by anyone with
 * access to Redis), both from their main threads; nothing here is shared
 * between calls, so it is thread-safe.
 *
 * Order of checks, so that each bad job gets the most precise code:
 * size (JOB_TOO_LARGE), encoding (BAD_UTF8: cJSON passes raw bytes
 * through, and the tokenizer must never see broken UTF-8), syntax
 * (INVALID_JSON, with the byte offset), a \u0000 escape in any string
 * (BAD_ID in the id, BAD_VALUE elsewhere: cJSON would cut the string
 * there), shape (NOT_OBJECT), then each
 * member in document order: duplicate (DUPLICATE_FIELD: cJSON keeps both,
 * and which one wins would be an accident), unknown name (UNKNOWN_FIELD),
 * type (BAD_TYPE), bounds (OUT_OF_RANGE / BAD_VALUE / BAD_ID); last the
 * cross-field rules (exactly one of messages, prompt, prompt_ids; tools
 * only with messages; one constraint at most, a forced tool among the
 * tools). The first problem found is the one reported.
 *
 * Constraints (response_format, grammar, tool_choice) are checked for
 * shape and size here; whether a schema or grammar compiles is the
 * engine's question (engine_check), since only it has the vocabulary.
 * Every refusal of a constraint's content carries BAD_PARAM, the code the
 * engine's compiler refuses with too, so a client sees one code for "this
 * constraint cannot be served" wherever it was caught.
 *
 * Numbers: JSON has one number type and cJSON keeps doubles, so "integer"
 * means a double with no fractional part (1.0 counts, as in JSON Schema),
 * and integers must stay below 2^53 to be exact; seeds are bounded there. */
#include "job.h"
#include "modelref.h"
#include "utf8.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define MAX_SAFE_INT 9007199254740991.0 /* 2^53 - 1 */

void job_opts_default(struct job_opts *o)
{
    memset(o, 0, sizeof *o);
    o->max_job_bytes = 4u << 20;
    o->default_max_tokens = 1024;
    o->max_max_tokens = JOB_MAX_TOKENS_MAX;
    o->default_stream_ttl_s = 3600;
    o->max_stream_ttl_s = 7 * 86400;
    o->max_prompt_ids = JOB_MAX_TOKENS_MAX;
    o->fallback_id = NULL;
}

/* Records the fault and the sentence; always returns -RL_EINVAL. */
__attribute__((format(printf, 4, 5)))
static int bad(struct job_fault *f, struct rl_err *err, enum ev_code code, const char *fmt, ...)
{
    char msg[RL_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    f->code = code;
    return rl_errf(err, RL_EINVAL, "%s", msg);
}

static void set_field(struct job_fault *f, const char *path)
{
    snprintf(f->field, sizeof f->field, "%s", path);
}

/* Field paths ("messages[2].content[0].type"), cut at JOB_FIELD_MAX - 1
 * bytes: a path that long is still enough to find the field. */
static void sub(char out[JOB_FIELD_MAX], const char *base, const char *suffix)
{
    size_t a = strlen(base), b = strlen(suffix);
    if (a > JOB_FIELD_MAX - 1)
        a = JOB_FIELD_MAX - 1;
    if (b > JOB_FIELD_MAX - 1 - a)
        b = JOB_FIELD_MAX - 1 - a;
    memmove(out, base, a);
    memcpy(out + a, suffix, b);
    out[a + b] = 0;
}

static void subi(char out[JOB_FIELD_MAX], const char *base, int i)
{
    char idx[16];
    snprintf(idx, sizeof idx, "[%d]", i);
    sub(out, base, idx);
}

/* The JSON grammar cJSON is lenient about: raw control characters (it
 * skips any byte <= 0x20 as whitespace and accepts them inside strings)
 * and number syntax (it hands "01" or "1." to strtod). RFC 8259 rejects
 * both, and so does every other parser a client may test with, so we do
 * too. Returns the offset of the first offence, or len. */
static size_t json_lex_check(const char *s, size_t len)
{
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 && (in_str || (c != '\t' && c != '\n' && c != '\r')))
            return i;
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"') {
            in_str = true;
            continue;
        }
        if (c != '-' && (c < '0' || c > '9'))
            continue;
        /* a number: -? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)? */
        size_t st = i;
        if (s[i] == '-')
            i++;
        if (i >= len || s[i] < '0' || s[i] > '9')
            return st;
        if (s[i] == '0') {
            i++;
        } else {
            while (i < len && s[i] >= '0' && s[i] <= '9')
                i++;
        }
        if (i < len && s[i] == '.') {
            i++;
            if (i >= len || s[i] < '0' || s[i] > '9')
                return st;
            while (i < len && s[i] >= '0' && s[i] <= '9')
                i++;
        }
        if (i < len && (s[i] == 'e' || s[i] == 'E')) {
            i++;
            if (i < len && (s[i] == '+' || s[i] == '-'))
                i++;
            if (i >= len || s[i] < '0' || s[i] > '9')
                return st;
            while (i < len && s[i] >= '0' && s[i] <= '9')
                i++;
        }
        if (i < len && ((s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == 'e' ||
                        s[i] == 'E' || s[i] == '+' || s[i] == '-'))
            return st;
        i--; /* the loop's i++ moves onto the byte after the number */
    }
    return len;
}

/* NaN, Infinity, -Infinity (JSON5 and Python's json.dumps by default,
 * never RFC 8259) at offset at, outside strings, where json_lex_check
 * stopped: the token's name, or NULL. */
static const char *non_number_at(const char *s, size_t len, size_t at)
{
    static const char *const names[] = {"NaN", "Infinity", "-Infinity", "-NaN"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t n = strlen(names[i]);
        if (at + n <= len && !memcmp(s + at, names[i], n))
            return names[i];
    }
    return NULL;
}

static int hex4(const char *s, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16u;
        if (d > 15)
            return -1;
        *v = *v << 4 | d;
    }
    return 0;
}

/* A \uD800-\uDFFF escape that is not a high surrogate followed at once by
 * a low one (Python's json.dumps of a str holding a lone surrogate writes
 * exactly that): cJSON refuses it as "not JSON" without a word of why. On
 * text that passed json_lex_check; returns the offset of the backslash, or
 * len. */
static size_t lone_surrogate_check(const char *s, size_t len)
{
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        if (!in_str) {
            in_str = s[i] == '"';
            continue;
        }
        if (s[i] == '"') {
            in_str = false;
            continue;
        }
        if (s[i] != '\\')
            continue;
        unsigned v, w;
        if (i + 5 < len && s[i + 1] == 'u' && hex4(s + i + 2, &v) == 0 && v >= 0xD800 &&
            v <= 0xDFFF) {
            if (v >= 0xDC00 || i + 11 >= len || s[i + 6] != '\\' || s[i + 7] != 'u' ||
                hex4(s + i + 8, &w) || w < 0xDC00 || w > 0xDFFF)
                return i;
            i += 11; /* the pair */
            continue;
        }
        i++; /* the escaped character */
    }
    return len;
}

/* The nesting depth check (JOB_DEPTH_MAX), on text that passed
 * json_lex_check: returns the offset where the nesting first goes past
 * max, or len; key gets the name of the top-level member that holds that
 * point (unescaped bytes, cut to key_size - 1; "" outside any member). */
static size_t json_depth_check(const char *s, size_t len, int max, char *key, size_t key_size)
{
    int depth = 0;
    size_t str_at = 0;
    key[0] = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '"') {
            str_at = i + 1;
            for (i++; i < len && s[i] != '"'; i++)
                if (s[i] == '\\')
                    i++;
            if (depth == 1) { /* a top-level key or string value: keep the last one seen */
                size_t n = i - str_at < key_size - 1 ? i - str_at : key_size - 1;
                size_t j = i + 1;
                while (j < len && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r'))
                    j++;
                if (j < len && s[j] == ':') {
                    memcpy(key, s + str_at, n);
                    key[n] = 0;
                }
            }
        } else if (c == '{' || c == '[') {
            if (++depth > max)
                return i;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return len;
}

/* cJSON decodes the escape \u0000 into a NUL byte and hands out C
 * strings, so a string holding one reaches us cut short: an id
 * "req-42\u0000zz" would become "req-42" and write into another job's
 * stream, message content would lose its tail without a word. redlm
 * carries no NUL in any string; this finds the first \u0000 escape in any
 * string of s (which passed json_lex_check), and *id_at gets the first one
 * inside the value of the top-level member "id" (len when none). Returns
 * the first offset, or len. */
static size_t json_nul_check(const char *s, size_t len, size_t *id_at)
{
    int depth = 0;
    bool in_str = false, expect_key = false, is_key = false, key_is_id = false,
         val_is_id = false;
    size_t str_at = 0, first = len;
    *id_at = len;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\') {
                if (i + 5 < len && s[i + 1] == 'u' && !memcmp(s + i + 2, "0000", 4)) {
                    if (first == len)
                        first = i;
                    if (val_is_id && *id_at == len)
                        *id_at = i;
                }
                i++;
            } else if (c == '"') {
                in_str = false;
                if (is_key)
                    key_is_id = i - str_at == 3 && !memcmp(s + str_at + 1, "id", 2);
            }
            continue;
        }
        if (c == '"') {
            in_str = true;
            str_at = i;
            is_key = depth == 1 && expect_key;
            val_is_id = depth == 1 && !expect_key && key_is_id;
        } else if (c == '{' || c == '[') {
            depth++;
            expect_key = depth == 1 && c == '{';
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (depth == 1 && c == ',') {
            expect_key = true;
        } else if (depth == 1 && c == ':') {
            expect_key = false;
        }
    }
    return first;
}

/* The NUL rule for a whole text: BAD_ID when the escape is in the id,
 * BAD_VALUE anywhere else. Returns 0 or -RL_EINVAL with the fault. */
static int nul_rule(const char *text, size_t len, const char *what, struct job_fault *f,
                    struct rl_err *err);

/* Common type/bounds helpers. Each returns 0 or -RL_EINVAL with the fault
 * filled for path. */
static int get_number(const cJSON *v, const char *path, double lo, double hi, bool lo_open,
                      double *out, struct job_fault *f, struct rl_err *err)
{
    set_field(f, path);
    if (!cJSON_IsNumber(v))
        return bad(f, err, EV_CODE_BAD_TYPE, "%s: must be a number", path);
    double x = v->valuedouble;
    if (!isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo))
        return bad(f, err, EV_CODE_OUT_OF_RANGE, "%s: %g is out of range %s%g, %g]", path, x,
                   lo_open ? "(" : "[", lo, hi);
    *out = x;
    return 0;
}

static int get_integer(const cJSON *v, const char *path, double lo, double hi, double *out,
                       struct job_fault *f, struct rl_err *err)
{
    set_field(f, path);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return bad(f, err, EV_CODE_BAD_TYPE, "%s: must be an integer", path);
    double x = v->valuedouble;
    if (x != floor(x))
        return bad(f, err, EV_CODE_BAD_TYPE, "%s: must be an integer, not %g", path, x);
    if (x < lo || x > hi)
        return bad(f, err, EV_CODE_OUT_OF_RANGE, "%s: %.0f is out of range [%.0f, %.0f]", path,
                   x, lo, hi);
    *out = x;
    return 0;
}

static int get_bool(const cJSON *v, const char *path, bool *out, struct job_fault *f,
                    struct rl_err *err)
{
    set_field(f, path);
    if (!cJSON_IsBool(v))
        return bad(f, err, EV_CODE_BAD_TYPE, "%s: must be true or false", path);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A string of min..max bytes. */
static int get_string(const cJSON *v, const char *path, size_t min, size_t max,
                      const char **out, struct job_fault *f, struct rl_err *err)
{
    set_field(f, path);
    if (!cJSON_IsString(v) || !v->valuestring)
        return bad(f, err, EV_CODE_BAD_TYPE, "%s: must be a string", path);
    size_t n = strlen(v->valuestring);
    if (n < min || n > max)
        return bad(f, err, EV_CODE_OUT_OF_RANGE, "%s: length %zu is out of range [%zu, %zu]",
                   path, n, min, max);
    *out = v->valuestring;
    return 0;
}

/* An array of lo..hi items: of says what it holds in the type error
 * ("message objects"), items what it counts in the range error
 * ("messages"). *n gets the size. */
static int get_array(const cJSON *v, const char *path, const char *of, const char *items, int lo,
                     int hi, int *n, struct job_fault *f, struct rl_err *err)
{
    set_field(f, path);
    if (!cJSON_IsArray(v))
        return bad(f, err, EV_CODE_BAD_TYPE, "%s: must be an array of %s", path, of);
    *n = cJSON_GetArraySize(v);
    if (*n < lo || *n > hi)
        return bad(f, err, EV_CODE_OUT_OF_RANGE, "%s: %d %s is out of range [%d, %d]", path, *n,
                   items, lo, hi);
    return 0;
}

/* Rejects a member name seen twice in obj; also checks each name against
 * allowed (NULL-terminated list) when allowed is non-NULL. */
static int check_members(const cJSON *obj, const char *path, const char *const *allowed,
                         struct job_fault *f, struct rl_err *err)
{
    char p[JOB_FIELD_MAX];
    for (const cJSON *a = obj->child; a; a = a->next) {
        const char *k = a->string ? a->string : "";
        snprintf(p, sizeof p, "%s%s%s", path, path[0] ? "." : "", k);
        for (const cJSON *b = obj->child; b != a; b = b->next)
            if (b->string && !strcmp(b->string, k)) {
                set_field(f, p);
                return bad(f, err, EV_CODE_DUPLICATE_FIELD, "%s: appears twice", p);
            }
        if (!allowed)
            continue;
        int ok = 0;
        for (int i = 0; allowed[i] && !ok; i++)
            ok = !strcmp(allowed[i], k);
        if (!ok) {
            set_field(f, p);
            return bad(f, err, EV_CODE_UNKNOWN_FIELD, "%.80s: unknown field", p);
        }
    }
    return 0;
}

static const cJSON *member(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

/* obj's member key, when present, a string of min..max bytes: path gets
 * base.key (which the caller's later errors about the value name too) and
 * *out the string; when absent, *out is NULL and the fault is untouched. */
static int get_optional_string(const cJSON *obj, const char *base, const char *key, size_t min,
                               size_t max, char path[JOB_FIELD_MAX], const char **out,
                               struct job_fault *f, struct rl_err *err)
{
    char suffix[72];
    snprintf(suffix, sizeof suffix, ".%s", key);
    sub(path, base, suffix);
    *out = NULL;
    const cJSON *v = member(obj, key);
    return v ? get_string(v, path, min, max, out, f, err) : 0;
}

/* obj's member key: required, a string of min..max bytes, with path as
 * get_optional_string fills it. */
static int get_required_string(const cJSON *obj, const char *base, const char *key, size_t min,
                               size_t max, char path[JOB_FIELD_MAX], const char **out,
                               struct job_fault *f, struct rl_err *err)
{
    int rc = get_optional_string(obj, base, key, min, max, path, out, f, err);
    if (!rc && !*out) {
        set_field(f, path);
        return bad(f, err, EV_CODE_MISSING_FIELD, "%s: required", path);
    }
    return rc;
}

/* One entry of an array of objects: path p gets base[i], and the entry
 * must be an object whose members are among keys, each once. */
static int check_entry(const cJSON *o, const char *base, int i, const char *const *keys,
                       char p[JOB_FIELD_MAX], struct job_fault *f, struct rl_err *err)
{
    subi(p, base, i);
    set_field(f, p);
    if (!cJSON_IsObject(o))
        return bad(f, err, EV_CODE_BAD_TYPE, "%s: must be an object", p);
    return check_members(o, p, keys, f, err);
}

/* A text content part list: [{"type": "text", "text": "..."}]. */
static int check_content(const cJSON *c, const char *path, bool may_be_null,
                         struct job_fault *f, struct rl_err *err)
{
    char p[JOB_FIELD_MAX];
    set_field(f, path);
    if (cJSON_IsString(c))
        return 0;
    if (cJSON_IsNull(c) && may_be_null)
        return 0;
    if (!cJSON_IsArray(c))
        return bad(f, err, EV_CODE_BAD_TYPE, "%s: must be a string or an array of text parts%s",
                   path, may_be_null ? " or null" : "");
    static const char *const part_keys[] = {"type", "text", NULL};
    int i = 0;
    for (const cJSON *part = c->child; part; part = part->next, i++) {
        int rc = check_entry(part, path, i, part_keys, p, f, err);
        if (rc)
            return rc;
        char q[JOB_FIELD_MAX];
        const char *ts;
        if ((rc = get_required_string(part, p, "type", 0, 64, q, &ts, f, err)))
            return rc;
        if (strcmp(ts, "text"))
            return bad(f, err, EV_CODE_BAD_VALUE, "%s: \"%.32s\" is not supported (only \"text\")", q, ts);
        const char *txt;
        if ((rc = get_required_string(part, p, "text", 0, SIZE_MAX, q, &txt, f, err)))
            return rc;
    }
    return 0;
}

/* The {"type": "function", "function": {"name", ...}} shape that an
 * assistant's tool_calls entries and the tools list share, checked in one
 * place: type (required when type_required) must be "function"; function
 * must be an object with only fn_keys and a name of 1..name_max bytes.
 * *fn gets the function object, fpath its path ("tools[0].function"). */
static int check_function_entry(const cJSON *o, const char *p, bool type_required,
                                const char *const *fn_keys, size_t name_max,
                                const cJSON **fn, char fpath[JOB_FIELD_MAX],
                                struct job_fault *f, struct rl_err *err)
{
    char q[JOB_FIELD_MAX];
    const char *s;
    int rc;
    rc = (type_required ? get_required_string : get_optional_string)(o, p, "type", 0, 64, q, &s,
                                                                    f, err);
    if (rc)
        return rc;
    if (s && strcmp(s, "function"))
        return bad(f, err, EV_CODE_BAD_VALUE, "%s: must be \"function\"", q);
    *fn = member(o, "function");
    sub(fpath, p, ".function");
    set_field(f, fpath);
    if (!*fn)
        return bad(f, err, EV_CODE_MISSING_FIELD, "%s: required", fpath);
    if (!cJSON_IsObject(*fn))
        return bad(f, err, EV_CODE_BAD_TYPE, "%s: must be an object", fpath);
    if ((rc = check_members(*fn, fpath, fn_keys, f, err)))
        return rc;
    char r[JOB_FIELD_MAX];
    return get_required_string(*fn, fpath, "name", 1, name_max, r, &s, f, err);
}

/* tool_calls on an assistant message: [{"id", "type": "function",
 * "function": {"name", "arguments"}}]. */
static int check_tool_calls(const cJSON *tc, const char *path, struct job_fault *f,
                            struct rl_err *err)
{
    static const char *const call_keys[] = {"id", "type", "function", NULL};
    static const char *const fn_keys[] = {"name", "arguments", NULL};
    char p[JOB_FIELD_MAX], q[JOB_FIELD_MAX];
    const char *s;
    int rc;
    set_field(f, path);
    if (!cJSON_IsArray(tc))
        return bad(f, err, EV_CODE_BAD_TYPE, "%s: must be an array", path);
    int i = 0;
    for (const cJSON *c = tc->child; c; c = c->next, i++) {
        if ((rc = check_entry(c, path, i, call_keys, p, f, err)) ||
            (rc = get_optional_string(c, p, "id", 0, 256, q, &s, f, err)))
            return rc;
        const cJSON *fn;
        if ((rc = check_function_entry(c, p, false, fn_keys, 256, &fn, q, f, err)))
            return rc;
        char r[JOB_FIELD_MAX];
        const cJSON *args = member(fn, "arguments");
        sub(r, q, ".arguments");
        set_field(f, r);
        /* OpenAI sends arguments as a JSON-encoded string; accept an
         * object too, since that is what a parser of our own output has */
        if (args && !cJSON_IsString(args) && !cJSON_IsObject(args))
            return bad(f, err, EV_CODE_BAD_TYPE, "%s: must be a string or an object", r);
    }
    return 0;
}

static int check_messages(const cJSON *m, struct job_fault *f, struct rl_err *err)
{
    static const char *const msg_keys[] = {"role", "content", "name", "tool_calls",
                                           "tool_call_id", "reasoning_content", NULL};
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool", NULL};
    char p[JOB_FIELD_MAX], q[JOB_FIELD_MAX];
    const char *s;
    int n, rc = get_array(m, "messages", "message objects", "messages", 1, JOB_MESSAGES_MAX, &n,
                          f, err);
    if (rc)
        return rc;
    int i = 0;
    for (const cJSON *msg = m->child; msg; msg = msg->next, i++) {
        if ((rc = check_entry(msg, "messages", i, msg_keys, p, f, err)) ||
            (rc = get_required_string(msg, p, "role", 0, 64, q, &s, f, err)))
            return rc;
        int ok = 0;
        for (int k = 0; roles[k] && !ok; k++)
            ok = !strcmp(roles[k], s);
        if (!ok)
            return bad(f, err, EV_CODE_BAD_VALUE,
                       "%s: \"%.32s\" is not one of system, developer, user, assistant, tool", q, s);
        bool assistant = !strcmp(s, "assistant"), tool = !strcmp(s, "tool");
        const cJSON *tc = member(msg, "tool_calls");
        sub(q, p, ".content");
        if (!member(msg, "content") && !(assistant && tc)) {
            set_field(f, q);
            return bad(f, err, EV_CODE_MISSING_FIELD, "%s: required", q);
        }
        if (member(msg, "content") && (rc = check_content(member(msg, "content"), q, assistant, f, err)))
            return rc;
        if ((rc = get_optional_string(msg, p, "name", 1, 256, q, &s, f, err)))
            return rc;
        if (tc) {
            sub(q, p, ".tool_calls");
            if (!assistant) {
                set_field(f, q);
                return bad(f, err, EV_CODE_BAD_VALUE, "%s: only assistant messages carry tool_calls", q);
            }
            if ((rc = check_tool_calls(tc, q, f, err)))
                return rc;
        }
        if ((rc = get_optional_string(msg, p, "tool_call_id", 0, 256, q, &s, f, err)))
            return rc;
        if (s && !tool)
            return bad(f, err, EV_CODE_BAD_VALUE, "%s: only tool messages carry tool_call_id", q);
        if ((rc = get_optional_string(msg, p, "reasoning_content", 0, SIZE_MAX, q, &s, f, err)))
            return rc;
    }
    return 0;
}

static int check_tools(const cJSON *t, struct job_fault *f, struct rl_err *err)
{
    static const char *const tool_keys[] = {"type", "function", NULL};
    static const char *const fn_keys[] = {"name", "description", "parameters", "strict", NULL};
    char p[JOB_FIELD_MAX], q[JOB_FIELD_MAX];
    const char *s;
    int n, rc = get_array(t, "tools", "tool objects", "tools", 0, JOB_TOOLS_MAX, &n, f, err);
    if (rc)
        return rc;
    int i = 0;
    for (const cJSON *tool = t->child; tool; tool = tool->next, i++) {
        const cJSON *fn;
        char r[JOB_FIELD_MAX];
        if ((rc = check_entry(tool, "tools", i, tool_keys, p, f, err)) ||
            (rc = check_function_entry(tool, p, true, fn_keys, 64, &fn, q, f, err)) ||
            (rc = get_optional_string(fn, q, "description", 0, SIZE_MAX, r, &s, f, err)))
            return rc;
        if (member(fn, "parameters")) {
            sub(r, q, ".parameters");
            set_field(f, r);
            if (!cJSON_IsObject(member(fn, "parameters")))
                return bad(f, err, EV_CODE_BAD_TYPE, "%s: must be an object (a JSON Schema)", r);
        }
        if (member(fn, "strict")) {
            sub(r, q, ".strict");
            bool b;
            if ((rc = get_bool(member(fn, "strict"), r, &b, f, err)))
                return rc;
        }
    }
    return 0;
}

static bool id_char(char c, bool pool)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-' || (!pool && (c == '.' || c == ':'));
}

/* The value of the top-level member "id" of a JSON text too deep for
 * cJSON (JOB_DEPTH_MAX), found by a scan of depth 1 only: the raw bytes of
 * its string (ids have no escapes; one with a backslash is not used).
 * Returns 1 with out filled, 0 when there is none, -1 when it is unusable. */
static int shallow_id(const char *s, size_t len, char out[JOB_ID_MAX + 1])
{
    int depth = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == '"') {
            size_t at = ++i;
            while (i < len && s[i] != '"')
                i += s[i] == '\\' ? 2 : 1;
            if (i >= len)
                return 0; /* the text ends inside this string */
            if (depth != 1 || i - at != 2 || memcmp(s + at, "id", 2))
                continue;
            size_t j = i + 1;
            while (j < len && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r'))
                j++;
            if (j >= len || s[j] != ':')
                continue; /* the string "id" as a value */
            for (j++; j < len && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r');)
                j++;
            if (j >= len || s[j] != '"')
                return -1;
            size_t v = ++j;
            for (; j < len && s[j] != '"' && s[j] != '\\'; j++)
                if (j - v == JOB_ID_MAX || !id_char(s[j], false))
                    return -1; /* too long for an id, or not an id's byte */
            if (j >= len || s[j] != '"' || j == v)
                return -1;
            memcpy(out, s + v, j - v);
            out[j - v] = 0;
            return 1;
        }
    }
    return 0;
}

void job_guess_id(const char *raw, size_t len, const char *fallback, char out[JOB_ID_MAX + 1])
{
    out[0] = 0;
    size_t id_at;
    if (raw && (json_nul_check(raw, len, &id_at), id_at < len))
        return; /* its id is cut at a NUL: no usable id, never a shorter one */
    /* a huge text (refused as JOB_TOO_LARGE) is only scanned: a tree of
     * 50 MB would cost the dispatcher's round more than the answer is worth */
    cJSON *o = raw && len <= (1u << 20) ? cJSON_ParseWithLength(raw, len) : NULL;
    if (!o && raw) {
        /* not JSON cJSON takes (too deep, NaN, a lone surrogate, a typo
         * after the id): the top-level "id" member, found by a scan of
         * depth 1, still says where its client reads; without one the
         * fallback, as for valid JSON without an id */
        int r = shallow_id(raw, len, out);
        if (r == 0 && fallback)
            snprintf(out, JOB_ID_MAX + 1, "%s", fallback);
        if (r < 0)
            out[0] = 0;
        return;
    }
    const cJSON *id = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "id") : NULL;
    if (cJSON_IsString(id)) {
        size_t n = strlen(id->valuestring);
        bool ok = n >= 1 && n <= JOB_ID_MAX;
        for (size_t i = 0; ok && i < n; i++)
            ok = id_char(id->valuestring[i], false);
        if (ok)
            memcpy(out, id->valuestring, n + 1);
    } else if (!id && fallback) {
        snprintf(out, JOB_ID_MAX + 1, "%s", fallback);
    }
    cJSON_Delete(o);
}

void job_sha256(const char *raw, size_t len, char out[JOB_SHA_LEN + 1])
{
    sha256_hex(raw ? raw : "", raw ? len : 0, out);
}

bool job_tenant_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n < 1 || n > JOB_TENANT_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!id_char(name[i], true))
            return false;
    return true;
}

int job_tenant_id(const char *tenant, const char *id, char out[JOB_ID_MAX + 1])
{
    size_t t = strlen(tenant), n = strlen(id);
    if (n > t && id[t] == ':' && !memcmp(id, tenant, t)) {
        memcpy(out, id, n + 1);
        return 0;
    }
    if (t + 1 + n > JOB_ID_MAX) {
        out[0] = 0;
        return -1;
    }
    memcpy(out, tenant, t);
    out[t] = ':';
    memcpy(out + t + 1, id, n + 1);
    return 0;
}

static int random_id(char out[JOB_ID_MAX + 1], struct rl_err *err)
{
    uint8_t b[16];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t n = getrandom(b + got, sizeof b - got, 0);
        if (n <= 0) {
            /* no entropy source: time and address still make collisions
             * between two workers vanishingly unlikely */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (uintptr_t)out;
            for (; got < sizeof b; got++, x = x * 6364136223846793005ull + 1442695040888963407ull)
                b[got] = (uint8_t)(x >> 56);
            break;
        }
        got += (size_t)n;
    }
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hx[b[i] >> 4];
        out[2 * i + 1] = hx[b[i] & 15];
    }
    out[32] = 0;
    (void)err;
    return 0;
}

/* The top-level members, in the order job_to_json writes them. */
enum kind {
    K_ID, K_MODEL, K_POOL, K_MESSAGES, K_TOOLS, K_PROMPT, K_PROMPT_IDS, K_MODE, K_MAX_TOKENS,
    K_TEMPERATURE, K_TOP_P, K_TOP_K, K_MIN_P, K_PRESENCE, K_FREQUENCY, K_REPETITION,
    K_SEED, K_STOP, K_IGNORE_EOS, K_MAX_THINKING, K_LOGPROBS, K_PRIORITY, K_DEADLINE,
    K_CACHE, K_STREAM_TTL, K_METADATA, K_SPECULATIVE, K_RESPONSE_FORMAT, K_TOOL_CHOICE,
    K_GRAMMAR, K_CLIENT_LEASE, K_MIN_TOKENS, K_STOP_IDS, K_LOGIT_BIAS, K_SKIP_SPECIAL,
    K_TASK, K_DIMENSIONS, K_TRUNCATE, K_QUERY, K_DOCUMENT, K_INSTRUCTION, K_NORMALIZE,
    K_CONTINUE_FINAL,
};
static const struct {
    const char *name;
    enum kind kind;
} top_fields[] = {
    {"id", K_ID}, {"model", K_MODEL}, {"pool", K_POOL}, {"messages", K_MESSAGES}, {"tools", K_TOOLS},
    {"prompt", K_PROMPT}, {"prompt_ids", K_PROMPT_IDS}, {"mode", K_MODE},
    {"max_tokens", K_MAX_TOKENS}, {"temperature", K_TEMPERATURE}, {"top_p", K_TOP_P},
    {"top_k", K_TOP_K}, {"min_p", K_MIN_P}, {"presence_penalty", K_PRESENCE},
    {"frequency_penalty", K_FREQUENCY}, {"repetition_penalty", K_REPETITION},
    {"seed", K_SEED}, {"stop", K_STOP}, {"ignore_eos", K_IGNORE_EOS},
    {"max_thinking_tokens", K_MAX_THINKING}, {"logprobs", K_LOGPROBS},
    {"priority", K_PRIORITY}, {"deadline_ms", K_DEADLINE}, {"cache", K_CACHE},
    {"stream_ttl_s", K_STREAM_TTL}, {"metadata", K_METADATA},
    {"speculative", K_SPECULATIVE}, {"response_format", K_RESPONSE_FORMAT},
    {"tool_choice", K_TOOL_CHOICE}, {"grammar", K_GRAMMAR},
    {"client_lease_ms", K_CLIENT_LEASE}, {"min_tokens", K_MIN_TOKENS},
    {"stop_token_ids", K_STOP_IDS}, {"logit_bias", K_LOGIT_BIAS},
    {"skip_special_tokens", K_SKIP_SPECIAL}, {"task", K_TASK}, {"dimensions", K_DIMENSIONS},
    {"truncate", K_TRUNCATE}, {"query", K_QUERY}, {"document", K_DOCUMENT},
    {"instruction", K_INSTRUCTION}, {"normalize", K_NORMALIZE},
    {"continue_final_message", K_CONTINUE_FINAL},
};
#define N_TOP ((int)(sizeof top_fields / sizeof top_fields[0]))

static int take_stop(struct job *j, const cJSON *v, struct job_fault *f, struct rl_err *err)
{
    const char *one[1];
    const cJSON *items[JOB_STOP_MAX];
    int n = 0, rc;
    char p[JOB_FIELD_MAX];
    set_field(f, "stop");
    if (cJSON_IsString(v)) {
        if ((rc = get_string(v, "stop", 1, JOB_STOP_LEN_MAX, &one[0], f, err)))
            return rc;
        items[n++] = v;
    } else if (cJSON_IsArray(v)) {
        int sz; /* an array: only the size can be wrong */
        if ((rc = get_array(v, "stop", "strings", "strings", 0, JOB_STOP_MAX, &sz, f, err)))
            return rc;
        for (const cJSON *it = v->child; it; it = it->next, n++) {
            snprintf(p, sizeof p, "stop[%d]", n);
            if ((rc = get_string(it, p, 1, JOB_STOP_LEN_MAX, &one[0], f, err)))
                return rc;
            items[n] = it;
        }
    } else {
        return bad(f, err, EV_CODE_BAD_TYPE, "stop: must be a string or an array of strings");
    }
    j->stop = calloc((size_t)(n ? n : 1), sizeof *j->stop);
    if (!j->stop)
        return -RL_ENOMEM;
    for (int i = 0; i < n; i++) {
        j->stop[i] = strdup(items[i]->valuestring);
        if (!j->stop[i])
            return -RL_ENOMEM;
        j->n_stop = i + 1;
    }
    return 0;
}

static int take_prompt_ids(struct job *j, const cJSON *v, const struct job_opts *o,
                           struct job_fault *f, struct rl_err *err)
{
    char p[JOB_FIELD_MAX];
    int n, rc = get_array(v, "prompt_ids", "integers", "ids", 1, o->max_prompt_ids, &n, f, err);
    if (rc)
        return rc;
    j->prompt_ids = malloc(sizeof(int32_t) * (size_t)n);
    if (!j->prompt_ids)
        return -RL_ENOMEM;
    int i = 0;
    for (const cJSON *it = v->child; it; it = it->next, i++) {
        double x;
        snprintf(p, sizeof p, "prompt_ids[%d]", i);
        rc = get_integer(it, p, 0, INT32_MAX, &x, f, err);
        if (rc)
            return rc;
        j->prompt_ids[i] = (int32_t)x;
    }
    j->n_prompt_ids = n;
    return 0;
}

/* stop_token_ids: up to JOB_STOP_IDS_MAX token ids (the worker's engine
 * checks them against its vocabulary). */
static int take_stop_ids(struct job *j, const cJSON *v, struct job_fault *f, struct rl_err *err)
{
    char p[JOB_FIELD_MAX];
    int n, rc = get_array(v, "stop_token_ids", "integers", "ids", 0, JOB_STOP_IDS_MAX, &n, f, err);
    if (rc)
        return rc;
    j->stop_ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!j->stop_ids)
        return -RL_ENOMEM;
    int i = 0;
    for (const cJSON *it = v->child; it; it = it->next, i++) {
        double x;
        snprintf(p, sizeof p, "stop_token_ids[%d]", i);
        if ((rc = get_integer(it, p, 0, INT32_MAX, &x, f, err)))
            return rc;
        j->stop_ids[i] = (int32_t)x;
    }
    j->n_stop_ids = n;
    j->given |= JOB_F_STOP_IDS;
    return 0;
}

/* logit_bias: OpenAI's {"<token id>": bias in [-100, 100]}, the id in
 * decimal without sign or leading zeros. */
static int take_logit_bias(struct job *j, const cJSON *v, struct job_fault *f,
                           struct rl_err *err)
{
    char p[JOB_FIELD_MAX];
    set_field(f, "logit_bias");
    if (!cJSON_IsObject(v))
        return bad(f, err, EV_CODE_BAD_TYPE, "logit_bias: must be an object of token id -> bias");
    int n = cJSON_GetArraySize(v);
    if (n > JOB_LOGIT_BIAS_MAX)
        return bad(f, err, EV_CODE_OUT_OF_RANGE, "logit_bias: %d entries is over the limit of %d",
                   n, JOB_LOGIT_BIAS_MAX);
    j->bias_ids = malloc(sizeof *j->bias_ids * (size_t)(n ? n : 1));
    j->bias = malloc(sizeof *j->bias * (size_t)(n ? n : 1));
    if (!j->bias_ids || !j->bias)
        return -RL_ENOMEM;
    int i = 0;
    for (const cJSON *it = v->child; it; it = it->next, i++) {
        const char *k = it->string;
        snprintf(p, sizeof p, "logit_bias.%.60s", k);
        size_t kl = strlen(k);
        bool digits = kl >= 1 && kl <= 10 && (k[0] != '0' || kl == 1);
        for (size_t c = 0; c < kl && digits; c++)
            digits = k[c] >= '0' && k[c] <= '9';
        long long id = digits ? strtoll(k, NULL, 10) : -1;
        if (id < 0 || id > INT32_MAX) {
            set_field(f, p);
            return bad(f, err, EV_CODE_BAD_VALUE,
                       "logit_bias: key \"%.32s\" is not a token id (a decimal integer)", k);
        }
        for (int d = 0; d < i; d++)
            if (j->bias_ids[d] == (int32_t)id) {
                set_field(f, p);
                return bad(f, err, EV_CODE_BAD_VALUE, "logit_bias: token %lld is given twice", id);
            }
        double x;
        int rc = get_number(it, p, -100, 100, false, &x, f, err);
        if (rc)
            return rc;
        j->bias_ids[i] = (int32_t)id;
        j->bias[i] = (float)x;
    }
    j->n_bias = n;
    j->given |= JOB_F_LOGIT_BIAS;
    return 0;
}

/* response_format: {"type": "text"}, {"type": "json_object"} or
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict",
 * "description"}} (OpenAI's shape; an absent schema is any JSON object). */
static int take_response_format(struct job *j, const cJSON *v, struct job_fault *f,
                                struct rl_err *err)
{
    static const char *const rf_keys[] = {"type", "json_schema", NULL};
    static const char *const js_keys[] = {"name", "schema", "strict", "description", NULL};
    char p[JOB_FIELD_MAX];
    const char *type, *s;
    int rc;
    set_field(f, "response_format");
    if (!cJSON_IsObject(v))
        return bad(f, err, EV_CODE_BAD_TYPE, "response_format: must be an object");
    if ((rc = check_members(v, "response_format", rf_keys, f, err)) ||
        (rc = get_required_string(v, "response_format", "type", 1, 32, p, &type, f, err)))
        return rc;
    const cJSON *js = member(v, "json_schema");
    if (!strcmp(type, "text") || !strcmp(type, "json_object")) {
        if (js) {
            set_field(f, "response_format.json_schema");
            return bad(f, err, EV_CODE_BAD_PARAM,
                       "response_format.json_schema: only with type \"json_schema\"");
        }
        j->constraint = type[0] == 't' ? JOB_CONSTRAINT_NONE : JOB_CONSTRAINT_JSON_OBJECT;
    } else if (!strcmp(type, "json_schema")) {
        set_field(f, "response_format.json_schema");
        if (!js)
            return bad(f, err, EV_CODE_MISSING_FIELD, "response_format.json_schema: required");
        if (!cJSON_IsObject(js))
            return bad(f, err, EV_CODE_BAD_TYPE,
                       "response_format.json_schema: must be an object");
        if ((rc = check_members(js, "response_format.json_schema", js_keys, f, err)) ||
            (rc = get_required_string(js, "response_format.json_schema", "name", 1, 64, p, &s,
                                      f, err)))
            return rc;
        const cJSON *x = member(js, "strict");
        if (x && !cJSON_IsNull(x)) {
            bool b;
            if ((rc = get_bool(x, "response_format.json_schema.strict", &b, f, err)))
                return rc;
        }
        if ((x = member(js, "description")) &&
            (rc = get_string(x, "response_format.json_schema.description", 0, SIZE_MAX, &s, f,
                             err)))
            return rc;
        const cJSON *schema = member(js, "schema");
        if (!schema) {
            j->constraint = JOB_CONSTRAINT_JSON_OBJECT;
        } else {
            set_field(f, "response_format.json_schema.schema");
            if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
                return bad(f, err, EV_CODE_BAD_TYPE,
                           "response_format.json_schema.schema: must be a JSON Schema (an "
                           "object or a boolean)");
            if (!(j->constraint_src = cJSON_PrintUnformatted(schema)))
                return -RL_ENOMEM;
            size_t n = strlen(j->constraint_src);
            if (n > JOB_CONSTRAINT_MAX)
                return bad(f, err, EV_CODE_BAD_PARAM,
                           "response_format.json_schema.schema: %zu bytes is over the limit "
                           "of %d", n, JOB_CONSTRAINT_MAX);
            j->constraint = JOB_CONSTRAINT_JSON_SCHEMA;
        }
    } else {
        set_field(f, "response_format.type");
        return bad(f, err, EV_CODE_BAD_PARAM,
                   "response_format.type: \"%.32s\" is not one of \"text\", \"json_object\", "
                   "\"json_schema\"", type);
    }
    if (!(j->response_format = cJSON_Duplicate(v, 1)))
        return -RL_ENOMEM;
    return 0;
}

/* tool_choice: "none" | "auto" (free text, the tool-call parser as
 * without it) | "required" | {"type": "function", "function": {"name"}}.
 * Whether the tools it needs are there is a cross-field rule (job_parse). */
static int take_tool_choice(struct job *j, const cJSON *v, struct job_fault *f,
                            struct rl_err *err)
{
    static const char *const tc_keys[] = {"type", "function", NULL};
    static const char *const fn_keys[] = {"name", NULL};
    int rc;
    set_field(f, "tool_choice");
    if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        if (!strcmp(s, "required"))
            j->tool_name[0] = 0;
        else if (strcmp(s, "none") && strcmp(s, "auto"))
            return bad(f, err, EV_CODE_BAD_PARAM,
                       "tool_choice: \"%.32s\" is not one of \"none\", \"auto\", "
                       "\"required\" or a {\"type\": \"function\"} object", s);
    } else if (cJSON_IsObject(v)) {
        const cJSON *fn;
        char q[JOB_FIELD_MAX];
        if ((rc = check_members(v, "tool_choice", tc_keys, f, err)) ||
            (rc = check_function_entry(v, "tool_choice", true, fn_keys, 64, &fn, q, f, err)))
            return rc;
        const char *name = member(fn, "name")->valuestring;
        memcpy(j->tool_name, name, strlen(name) + 1);
    } else {
        return bad(f, err, EV_CODE_BAD_TYPE, "tool_choice: must be a string or an object");
    }
    if (!(j->tool_choice = cJSON_Duplicate(v, 1)))
        return -RL_ENOMEM;
    return 0;
}

/* The cross-field rules of the constraint members, after all are taken:
 * one constraint at most, a forced tool call needs the tools (and a named
 * one among them), and the tools' text within the size bound. */
static int check_constraint(struct job *j, struct job_fault *f, struct rl_err *err)
{
    bool forced = j->tool_choice && (cJSON_IsObject(j->tool_choice) ||
                                     !strcmp(j->tool_choice->valuestring, "required"));
    int n = (j->constraint != JOB_CONSTRAINT_NONE) + !!j->grammar + forced;
    if (n > 1) {
        set_field(f, j->grammar ? "grammar" : "tool_choice");
        return bad(f, err, EV_CODE_BAD_PARAM,
                   "%s: only one constraint at a time (response_format json_object/json_schema, "
                   "grammar, tool_choice required/named)", f->field);
    }
    if (j->grammar) {
        j->constraint = JOB_CONSTRAINT_GRAMMAR;
        if (!(j->constraint_src = strdup(j->grammar)))
            return -RL_ENOMEM;
    }
    if (!forced)
        return 0;
    set_field(f, "tool_choice");
    if (!j->tools || cJSON_GetArraySize(j->tools) == 0)
        return bad(f, err, EV_CODE_BAD_PARAM, "tool_choice: forces a tool call but the job "
                   "gives no tools");
    if (j->tool_name[0]) {
        bool found = false;
        for (const cJSON *t = j->tools->child; t && !found; t = t->next)
            found = !strcmp(member(member(t, "function"), "name")->valuestring, j->tool_name);
        if (!found)
            return bad(f, err, EV_CODE_BAD_PARAM, "tool_choice: names \"%s\", which is not "
                       "among the tools", j->tool_name);
    }
    if (!(j->constraint_src = cJSON_PrintUnformatted(j->tools)))
        return -RL_ENOMEM;
    if (strlen(j->constraint_src) > JOB_CONSTRAINT_MAX)
        return bad(f, err, EV_CODE_BAD_PARAM, "tools: %zu bytes is over the limit of %d for a "
                   "forced tool call", strlen(j->constraint_src), JOB_CONSTRAINT_MAX);
    j->constraint = JOB_CONSTRAINT_TOOL_CALL;
    return 0;
}

/* The sampling numbers: bounds (hi closed, lo open or closed), the double
 * of struct job each fills and the flag that records it was given. */
static const struct {
    enum kind kind;
    double lo, hi;
    bool lo_open;
    size_t off;
    unsigned flag;
} num_fields[] = {
    {K_TEMPERATURE, 0, 2, false, offsetof(struct job, temperature), JOB_F_TEMPERATURE},
    {K_TOP_P, 0, 1, true, offsetof(struct job, top_p), JOB_F_TOP_P},
    {K_MIN_P, 0, 1, false, offsetof(struct job, min_p), JOB_F_MIN_P},
    {K_PRESENCE, -2, 2, false, offsetof(struct job, presence_penalty), JOB_F_PRESENCE},
    {K_FREQUENCY, -2, 2, false, offsetof(struct job, frequency_penalty), JOB_F_FREQUENCY},
    {K_REPETITION, 0, 2, true, offsetof(struct job, repetition_penalty), JOB_F_REPETITION},
};

/* One of num_fields' members into j; recorded as given even when refused,
 * as the job is then freed anyway. */
static int take_number(struct job *j, enum kind k, const cJSON *v, struct job_fault *f,
                       struct rl_err *err)
{
    for (size_t i = 0; i < sizeof num_fields / sizeof num_fields[0]; i++) {
        if (num_fields[i].kind != k)
            continue;
        double *out = (double *)((char *)j + num_fields[i].off);
        int rc = get_number(v, v->string, num_fields[i].lo, num_fields[i].hi,
                            num_fields[i].lo_open, out, f, err);
        j->given |= num_fields[i].flag;
        return rc;
    }
    return rl_errf(err, RL_EINTERNAL, "job: %s is not a number member", v->string);
}

/* An integer member of lo..hi into *out, recorded as given (flag). */
static int take_int(struct job *j, const cJSON *v, double lo, double hi, int *out,
                    unsigned flag, struct job_fault *f, struct rl_err *err)
{
    double x;
    int rc = get_integer(v, v->string, lo, hi, &x, f, err);
    if (rc)
        return rc;
    *out = (int)x;
    j->given |= flag;
    return 0;
}

/* Copies a checked id, model or pool name s (which fits dst) into dst,
 * recorded as given (flag). Returns 0. */
static int keep_name(struct job *j, char *dst, const char *s, unsigned flag)
{
    memcpy(dst, s, strlen(s) + 1);
    j->given |= flag;
    return 0;
}

/* Takes one top-level member into j. */
static int take(struct job *j, enum kind k, const cJSON *v, const struct job_opts *o,
                struct job_fault *f, struct rl_err *err)
{
    const char *name = v->string;
    const char *s;
    double x;
    int rc = 0;
    switch (k) {
    case K_ID:
        set_field(f, "id");
        if (!cJSON_IsString(v))
            return bad(f, err, EV_CODE_BAD_TYPE, "id: must be a string");
        s = v->valuestring;
        if (!s[0] || strlen(s) > JOB_ID_MAX)
            return bad(f, err, EV_CODE_BAD_ID, "id: length %zu is out of range [1, %d]",
                       strlen(s), JOB_ID_MAX);
        for (const char *c = s; *c; c++)
            if (!id_char(*c, false))
                return bad(f, err, EV_CODE_BAD_ID,
                           "id: character %d is not one of [A-Za-z0-9_.:-]", (int)(c - s));
        return keep_name(j, j->id, s, JOB_F_ID);
    case K_MODEL:
        if ((rc = get_string(v, "model", 1, JOB_MODEL_MAX, &s, f, err)))
            return rc;
        if (!modelref_name_ok(s))
            return bad(f, err, EV_CODE_BAD_VALUE,
                       "model: \"%.128s\" is not a model name ([A-Za-z0-9._:/-], not starting "
                       "with '/' or '.')", s);
        return keep_name(j, j->model, s, JOB_F_MODEL);
    case K_POOL:
        if ((rc = get_string(v, "pool", 1, JOB_POOL_MAX, &s, f, err)))
            return rc;
        for (const char *c = s; *c; c++)
            if (!id_char(*c, true))
                return bad(f, err, EV_CODE_BAD_VALUE, "pool: \"%.64s\" is not [A-Za-z0-9_-]", s);
        return keep_name(j, j->pool, s, JOB_F_POOL);
    case K_MESSAGES:
        if ((rc = check_messages(v, f, err)))
            return rc;
        if (!(j->messages = cJSON_Duplicate(v, 1)))
            return -RL_ENOMEM;
        return 0;
    case K_TOOLS:
        if ((rc = check_tools(v, f, err)))
            return rc;
        if (!(j->tools = cJSON_Duplicate(v, 1)))
            return -RL_ENOMEM;
        j->given |= JOB_F_TOOLS;
        return 0;
    case K_PROMPT:
        if ((rc = get_string(v, "prompt", 1, SIZE_MAX, &s, f, err)))
            return rc;
        if (!(j->prompt = strdup(s)))
            return -RL_ENOMEM;
        j->prompt_len = strlen(s);
        return 0;
    case K_PROMPT_IDS:
        return take_prompt_ids(j, v, o, f, err);
    case K_MODE:
        if ((rc = get_string(v, "mode", 0, 64, &s, f, err)))
            return rc;
        if (!strcmp(s, "think"))
            j->mode = JOB_MODE_THINK;
        else if (!strcmp(s, "no_think"))
            j->mode = JOB_MODE_NO_THINK;
        else if (!strcmp(s, "auto"))
            j->mode = JOB_MODE_AUTO;
        else
            return bad(f, err, EV_CODE_BAD_VALUE, "mode: \"%.32s\" is not think, no_think or auto",
                       s);
        j->given |= JOB_F_MODE;
        return 0;
    case K_MAX_TOKENS:
        return take_int(j, v, 1, o->max_max_tokens, &j->max_tokens, JOB_F_MAX_TOKENS, f, err);
    case K_TEMPERATURE:
    case K_TOP_P:
    case K_MIN_P:
    case K_PRESENCE:
    case K_FREQUENCY:
    case K_REPETITION:
        return take_number(j, k, v, f, err);
    case K_TOP_K:
        return take_int(j, v, 0, 1000000, &j->top_k, JOB_F_TOP_K, f, err);
    case K_SEED:
        if ((rc = get_integer(v, name, 0, MAX_SAFE_INT, &x, f, err)))
            return rc;
        j->seed = (uint64_t)x;
        j->has_seed = true;
        j->given |= JOB_F_SEED;
        return 0;
    case K_STOP:
        j->given |= JOB_F_STOP;
        return take_stop(j, v, f, err);
    case K_IGNORE_EOS:
        j->given |= JOB_F_IGNORE_EOS;
        return get_bool(v, name, &j->ignore_eos, f, err);
    case K_MIN_TOKENS:
        return take_int(j, v, 0, o->max_max_tokens, &j->min_tokens, JOB_F_MIN_TOKENS, f, err);
    case K_STOP_IDS:
        return take_stop_ids(j, v, f, err);
    case K_LOGIT_BIAS:
        return take_logit_bias(j, v, f, err);
    case K_SKIP_SPECIAL:
        j->given |= JOB_F_SKIP_SPECIAL;
        return get_bool(v, name, &j->skip_special, f, err);
    case K_MAX_THINKING:
        return take_int(j, v, 0, o->max_max_tokens, &j->max_thinking_tokens, JOB_F_MAX_THINKING, f, err);
    case K_LOGPROBS:
        set_field(f, "logprobs");
        j->given |= JOB_F_LOGPROBS;
        if (cJSON_IsBool(v)) {
            j->logprobs = cJSON_IsTrue(v) ? 0 : -1;
            return 0;
        }
        if (!cJSON_IsNumber(v))
            return bad(f, err, EV_CODE_BAD_TYPE, "logprobs: must be true, false or an integer");
        if ((rc = get_integer(v, name, 0, JOB_LOGPROBS_MAX, &x, f, err)))
            return rc;
        j->logprobs = (int)x;
        return 0;
    case K_PRIORITY:
        return take_int(j, v, -1000, 1000, &j->priority, JOB_F_PRIORITY, f, err);
    case K_DEADLINE:
        if ((rc = get_integer(v, name, 0, MAX_SAFE_INT, &x, f, err)))
            return rc;
        j->deadline_ms = (int64_t)x;
        j->given |= JOB_F_DEADLINE;
        return 0;
    case K_CACHE:
        j->given |= JOB_F_CACHE;
        return get_bool(v, name, &j->cache, f, err);
    case K_SPECULATIVE:
        j->given |= JOB_F_SPECULATIVE;
        return get_bool(v, name, &j->speculative, f, err);
    case K_CLIENT_LEASE:
        return take_int(j, v, 1000, 3600000, &j->client_lease_ms, JOB_F_CLIENT_LEASE, f, err);
    case K_RESPONSE_FORMAT:
        return take_response_format(j, v, f, err);
    case K_TOOL_CHOICE:
        return take_tool_choice(j, v, f, err);
    case K_GRAMMAR:
        if ((rc = get_string(v, "grammar", 1, SIZE_MAX, &s, f, err)))
            return rc;
        if (strlen(s) > JOB_CONSTRAINT_MAX)
            return bad(f, err, EV_CODE_BAD_PARAM, "grammar: %zu bytes is over the limit of %d",
                       strlen(s), JOB_CONSTRAINT_MAX);
        if (!(j->grammar = strdup(s)))
            return -RL_ENOMEM;
        return 0;
    case K_STREAM_TTL:
        return take_int(j, v, 1, o->max_stream_ttl_s, &j->stream_ttl_s, JOB_F_STREAM_TTL, f, err);
    case K_TASK:
        if ((rc = get_string(v, "task", 0, 64, &s, f, err)))
            return rc;
        if (!strcmp(s, "generate"))
            j->task = JOB_TASK_GENERATE;
        else if (!strcmp(s, "embed"))
            j->task = JOB_TASK_EMBED;
        else if (!strcmp(s, "rerank"))
            j->task = JOB_TASK_RERANK;
        else
            return bad(f, err, EV_CODE_BAD_VALUE,
                       "task: \"%.32s\" is not generate, embed or rerank", s);
        j->given |= JOB_F_TASK;
        return 0;
    case K_DIMENSIONS:
        return take_int(j, v, 1, JOB_DIMENSIONS_MAX, &j->dimensions, JOB_F_DIMENSIONS, f, err);
    case K_QUERY:
    case K_DOCUMENT:
    case K_INSTRUCTION: {
        char **dst = k == K_QUERY ? &j->query : k == K_DOCUMENT ? &j->document : &j->instruction;
        if ((rc = get_string(v, name, k == K_INSTRUCTION ? 0 : 1, SIZE_MAX, &s, f, err)))
            return rc;
        return (*dst = strdup(s)) ? 0 : -RL_ENOMEM;
    }
    case K_TRUNCATE:
        j->given |= JOB_F_TRUNCATE;
        return get_bool(v, name, &j->truncate, f, err);
    case K_CONTINUE_FINAL: /* no given bit left: written back only when true */
        return get_bool(v, name, &j->continue_final, f, err);
    case K_NORMALIZE: { /* no given bit left: written back only when false */
        bool b;
        if ((rc = get_bool(v, name, &b, f, err)))
            return rc;
        j->no_normalize = !b;
        return 0;
    }
    case K_METADATA:
        set_field(f, "metadata");
        if (!cJSON_IsObject(v))
            return bad(f, err, EV_CODE_BAD_TYPE, "metadata: must be an object");
        if (!(j->metadata = cJSON_Duplicate(v, 1)))
            return -RL_ENOMEM;
        j->given |= JOB_F_METADATA;
        return 0;
    }
    return rl_errf(err, RL_EINTERNAL, "job: unhandled field kind %d", (int)k);
}

/* An embedding or rerank job runs its prompt through the model once and
 * generates nothing: a member that only shapes generated tokens would be
 * silently meaningless, so it is refused by name, as are the members of
 * one task on a job of another. The members each may carry: */
static const char *const embed_fields[] = {
    "id", "model", "pool", "prompt", "prompt_ids", "mode", "task", "dimensions", "truncate",
    "normalize", "priority", "deadline_ms", "cache", "stream_ttl_s", "metadata",
    "client_lease_ms", NULL,
};
static const char *const rerank_fields[] = {
    "id", "model", "pool", "query", "document", "instruction", "mode", "task", "priority",
    "deadline_ms", "cache", "stream_ttl_s", "metadata", "client_lease_ms", NULL,
};

static bool listed(const char *const *names, const char *s)
{
    while (*names && strcmp(*names, s))
        names++;
    return *names != NULL;
}

/* The task's own rules, before any other check of the job's inputs. */
static int check_task(const struct job *j, const cJSON *root, struct job_fault *f,
                      struct rl_err *err)
{
    static const char *const task_name[] = {"generate", "embed", "rerank"};
    const char *tn = task_name[j->task];
    if (j->task != JOB_TASK_EMBED) {
        const char *only = j->given & JOB_F_DIMENSIONS ? "dimensions"
                           : j->given & JOB_F_TRUNCATE ? "truncate"
                           : cJSON_GetObjectItemCaseSensitive(root, "normalize") ? "normalize"
                                                       : NULL;
        if (only) {
            set_field(f, only);
            return bad(f, err, EV_CODE_BAD_VALUE, "%s: only for task \"embed\"", only);
        }
    }
    if (j->task != JOB_TASK_RERANK) {
        const char *only = j->query ? "query" : j->document ? "document"
                           : j->instruction ? "instruction" : NULL;
        if (only) {
            set_field(f, only);
            return bad(f, err, EV_CODE_BAD_VALUE, "%s: only for task \"rerank\"", only);
        }
    }
    int n_inputs = !!j->messages + !!j->prompt + !!j->prompt_ids;
    if (j->task == JOB_TASK_RERANK) {
        if (n_inputs) {
            set_field(f, j->messages ? "messages" : j->prompt ? "prompt" : "prompt_ids");
            return bad(f, err, EV_CODE_CONFLICTING_PROMPT,
                       "%s: task \"rerank\" takes a query and a document instead", f->field);
        }
        if (!j->query || !j->document) {
            set_field(f, j->query ? "document" : "query");
            return bad(f, err, EV_CODE_MISSING_PROMPT, "%s: required for task \"rerank\"",
                       f->field);
        }
    } else if (n_inputs == 0) {
        return bad(f, err, EV_CODE_MISSING_PROMPT,
                   "job: one of messages, prompt or prompt_ids is required");
    } else if (n_inputs > 1) {
        return bad(f, err, EV_CODE_CONFLICTING_PROMPT,
                   "job: give only one of messages, prompt and prompt_ids");
    }
    if (j->task == JOB_TASK_GENERATE)
        return 0;
    if (j->messages) {
        set_field(f, "messages");
        return bad(f, err, EV_CODE_CONFLICTING_PROMPT,
                   "messages: task \"embed\" takes prompt or prompt_ids");
    }
    const char *const *allowed = j->task == JOB_TASK_EMBED ? embed_fields : rerank_fields;
    for (const cJSON *v = root->child; v; v = v->next) {
        if (listed(allowed, v->string))
            continue;
        set_field(f, v->string);
        return bad(f, err, EV_CODE_BAD_VALUE,
                   "%.80s: not a member of a job of task \"%s\" (it generates no tokens)",
                   v->string, tn);
    }
    return 0;
}

static void defaults(struct job *j, const struct job_opts *o)
{
    j->max_tokens = o->default_max_tokens;
    /* unset: the engine applies the model's defaults (engine.h) */
    j->temperature = -1.0;
    j->top_p = -1.0;
    j->top_k = -1;
    j->min_p = -1.0;
    j->repetition_penalty = 1.0;
    j->max_thinking_tokens = -1;
    j->logprobs = -1;
    j->cache = true;
    j->speculative = true;
    j->skip_special = true;
    j->stream_ttl_s = o->default_stream_ttl_s;
}

void job_free(struct job *j)
{
    if (!j)
        return;
    cJSON_Delete(j->messages);
    cJSON_Delete(j->tools);
    cJSON_Delete(j->metadata);
    cJSON_Delete(j->response_format);
    cJSON_Delete(j->tool_choice);
    free(j->grammar);
    free(j->constraint_src);
    free(j->prompt);
    free(j->prompt_ids);
    free(j->query);
    free(j->document);
    free(j->instruction);
    free(j->stop_ids);
    free(j->bias_ids);
    free(j->bias);
    for (int i = 0; i < j->n_stop; i++)
        free(j->stop[i]);
    free(j->stop);
    free(j);
}

int job_parse(const char *text, size_t len, const struct job_opts *opts, struct job **out,
              struct job_fault *fault, struct rl_err *err)
{
    struct job_opts dflt;
    struct job_fault fdummy;
    if (!opts) {
        job_opts_default(&dflt);
        opts = &dflt;
    }
    if (!fault)
        fault = &fdummy;
    memset(fault, 0, sizeof *fault);
    *out = NULL;
    if (!text)
        return bad(fault, err, EV_CODE_BAD_ENTRY, "job: the entry has no job field");
    if (len > opts->max_job_bytes)
        return bad(fault, err, EV_CODE_JOB_TOO_LARGE, "job: %zu bytes is over the limit of %zu",
                   len, opts->max_job_bytes);
    size_t badpos = utf8_valid_len(text, len);
    if (badpos != len)
        return bad(fault, err, EV_CODE_BAD_UTF8, "job: invalid UTF-8 at byte %zu", badpos);

    badpos = json_lex_check(text, len);
    if (badpos != len) {
        /* Python's json.dumps writes these unless allow_nan=False: say so,
         * so the client can find its bug (the id is still found, so the
         * answer reaches the stream it reads: job_guess_id) */
        const char *nonnum = non_number_at(text, len, badpos);
        if (nonnum)
            return bad(fault, err, EV_CODE_INVALID_JSON,
                       "job: %s at byte %zu is not a JSON number (Python's json.dumps writes "
                       "NaN and Infinity unless allow_nan=False)", nonnum, badpos);
        return bad(fault, err, EV_CODE_INVALID_JSON, "job: not valid JSON (at byte %zu of %zu)",
                   badpos, len);
    }
    badpos = lone_surrogate_check(text, len);
    if (badpos != len)
        return bad(fault, err, EV_CODE_INVALID_JSON,
                   "job: the escape at byte %zu is a lone UTF-16 surrogate (\\u%.4s), which no "
                   "UTF-8 text can hold", badpos, text + badpos + 2);

    if (nul_rule(text, len, "job", fault, err))
        return -RL_EINVAL;

    char deep[JOB_FIELD_MAX];
    badpos = json_depth_check(text, len, JOB_DEPTH_MAX, deep, sizeof deep);
    if (badpos != len) {
        /* a constraint's schema is the usual suspect: say so in its code */
        bool constraint = !strcmp(deep, "response_format") || !strcmp(deep, "tools") ||
                          !strcmp(deep, "tool_choice");
        set_field(fault, deep);
        return bad(fault, err, constraint ? EV_CODE_BAD_PARAM : EV_CODE_BAD_VALUE,
                   "%s: nested deeper than %d levels (at byte %zu)", deep[0] ? deep : "job",
                   JOB_DEPTH_MAX, badpos);
    }

    /* cJSON wants a NUL-terminated buffer to reject trailing garbage */
    char *buf = malloc(len + 1);
    struct job *j = NULL;
    cJSON *root = NULL;
    int rc = 0;
    if (!buf)
        goto oom;
    memcpy(buf, text, len);
    buf[len] = 0;
    const char *end = NULL;
    root = cJSON_ParseWithOpts(buf, &end, 1);
    if (!root) {
        size_t at = end && end >= buf ? (size_t)(end - buf) : 0;
        const char *nonnum = non_number_at(buf, len, at);
        if (nonnum)
            rc = bad(fault, err, EV_CODE_INVALID_JSON,
                     "job: %s at byte %zu is not a JSON number (Python's json.dumps writes NaN "
                     "and Infinity unless allow_nan=False)", nonnum, at);
        else
            rc = bad(fault, err, EV_CODE_INVALID_JSON, "job: not valid JSON (at byte %zu of %zu)",
                     at, len);
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        rc = bad(fault, err, EV_CODE_NOT_OBJECT, "job: must be a JSON object");
        goto done;
    }
    if ((rc = check_members(root, "", NULL, fault, err)))
        goto done;

    if (!(j = calloc(1, sizeof *j)))
        goto oom;
    defaults(j, opts);
    for (const cJSON *v = root->child; v; v = v->next) {
        int k = 0;
        while (k < N_TOP && strcmp(top_fields[k].name, v->string))
            k++;
        if (k == N_TOP) {
            set_field(fault, v->string);
            rc = bad(fault, err, EV_CODE_UNKNOWN_FIELD, "%.80s: unknown field", v->string);
            goto done;
        }
        if ((rc = take(j, top_fields[k].kind, v, opts, fault, err))) {
            if (rc == -RL_ENOMEM)
                goto oom;
            goto done;
        }
    }
    memset(fault, 0, sizeof *fault);

    if ((rc = check_task(j, root, fault, err)))
        goto done;
    /* vLLM's rule: a floor above the ceiling cannot be met (max_tokens is
     * the default when not given: the default must hold it too) */
    if ((j->given & JOB_F_MIN_TOKENS) && j->min_tokens > j->max_tokens) {
        set_field(fault, "min_tokens");
        rc = bad(fault, err, EV_CODE_BAD_VALUE, "min_tokens: %d is above max_tokens (%d)", j->min_tokens,
                 j->max_tokens);
        goto done;
    }
    if (j->tools && !j->messages) {
        set_field(fault, "tools");
        rc = bad(fault, err, EV_CODE_CONFLICTING_PROMPT, "tools: only allowed with messages");
        goto done;
    }
    if ((rc = check_constraint(j, fault, err))) {
        if (rc == -RL_ENOMEM)
            goto oom;
        goto done;
    }
    memset(fault, 0, sizeof *fault);
    if (j->continue_final) {
        const cJSON *last = cJSON_GetArrayItem(j->messages, cJSON_GetArraySize(j->messages) - 1);
        const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(last, "role"));
        set_field(fault, "continue_final_message");
        if (!role || strcmp(role, "assistant")) {
            rc = bad(fault, err, EV_CODE_BAD_VALUE,
                     "continue_final_message: the last message must be the assistant's (the "
                     "text to continue)");
            goto done;
        }
        if (j->constraint != JOB_CONSTRAINT_NONE) {
            /* the constraint would start its document again after the prefill */
            rc = bad(fault, err, EV_CODE_BAD_VALUE,
                     "continue_final_message: not with response_format, grammar or a "
                     "required tool call");
            goto done;
        }
        memset(fault, 0, sizeof *fault);
    }
    j->input = j->messages ? JOB_INPUT_MESSAGES : j->prompt ? JOB_INPUT_PROMPT
               : j->prompt_ids                ? JOB_INPUT_IDS
                                              : JOB_INPUT_RERANK;
    if (!(j->given & JOB_F_ID)) {
        const char *fb = opts->fallback_id;
        if (fb && fb[0] && strlen(fb) <= JOB_ID_MAX)
            memcpy(j->id, fb, strlen(fb) + 1);
        else
            random_id(j->id, err);
        j->id_generated = true;
    }
    *out = j;
    j = NULL;
    goto done;
oom:
    fault->code = EV_CODE_INTERNAL;
    rc = rl_errf(err, RL_ENOMEM, "job: out of memory");
done:
    job_free(j);
    cJSON_Delete(root);
    free(buf);
    return rc;
}

int job_check_text(const char *text, size_t len, const char *what, struct job_fault *fault,
                   struct rl_err *err)
{
    struct job_fault fdummy;
    if (!fault)
        fault = &fdummy;
    memset(fault, 0, sizeof *fault);
    size_t badpos = utf8_valid_len(text, len);
    if (badpos != len)
        return bad(fault, err, EV_CODE_BAD_UTF8, "%s: invalid UTF-8 at byte %zu", what, badpos);
    badpos = json_lex_check(text, len);
    if (badpos != len)
        return bad(fault, err, EV_CODE_INVALID_JSON, "%s: not valid JSON (at byte %zu of %zu)",
                   what, badpos, len);
    return nul_rule(text, len, what, fault, err);
}

static int nul_rule(const char *text, size_t len, const char *what, struct job_fault *f,
                    struct rl_err *err)
{
    size_t id_at;
    size_t at = json_nul_check(text, len, &id_at);
    if (id_at < len) {
        set_field(f, "id");
        return bad(f, err, EV_CODE_BAD_ID, "id: contains \\u0000 (NUL) at byte %zu; an id is "
                   "1-%d of [A-Za-z0-9_.:-]", id_at, JOB_ID_MAX);
    }
    if (at < len)
        return bad(f, err, EV_CODE_BAD_VALUE, "%s: a string contains \\u0000 (NUL) at byte "
                   "%zu; NUL is refused in every string, since it would cut the text short",
                   what, at);
    return 0;
}

int job_check_pool(const struct job *j, const char *stream_pool, const char *const *pools,
                   int n_pools, struct job_fault *fault, struct rl_err *err)
{
    struct job_fault fd;
    if (!fault)
        fault = &fd;
    memset(fault, 0, sizeof *fault);
    const char *want = j->pool[0] ? j->pool : stream_pool;
    if (j->pool[0] && stream_pool && strcmp(j->pool, stream_pool)) {
        set_field(fault, "pool");
        return bad(fault, err, EV_CODE_UNKNOWN_POOL,
                   "pool: job names \"%s\" but was queued on \"%s\"", j->pool, stream_pool);
    }
    for (int i = 0; want && i < n_pools; i++)
        if (!strcmp(pools[i], want))
            return 0;
    set_field(fault, j->pool[0] ? "pool" : "");
    return bad(fault, err, EV_CODE_UNKNOWN_POOL, "pool: \"%.64s\" is not a configured pool",
               want ? want : "");
}

enum job_mode job_mode_on(const struct job *j, const char *pool)
{
    if (j->mode == JOB_MODE_THINK || j->mode == JOB_MODE_NO_THINK)
        return j->mode;
    return pool && !strcmp(pool, "think") ? JOB_MODE_THINK : JOB_MODE_NO_THINK;
}

bool job_is_deterministic(const struct job *j)
{
    return j->task != JOB_TASK_GENERATE || j->temperature == 0.0 || j->top_k == 1 || j->has_seed;
}

/* cJSON prints numbers with 15 significant digits and accepts the result
 * if it is merely close, so 2^53-1 comes back as 9.00719925474099e+15 and
 * 0.1 + 2^-55 as 0.1. We write numbers ourselves: integers exactly, doubles
 * with the fewest digits that read back to the very same double. */
static cJSON *num_exact(double x)
{
    char buf[40];
    if (x == floor(x) && fabs(x) <= MAX_SAFE_INT) {
        snprintf(buf, sizeof buf, "%.0f", x);
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, x);
            if (strtod(buf, NULL) == x)
                break;
        }
    }
    return cJSON_CreateRaw(buf);
}

static bool add_num(cJSON *o, const char *k, double x)
{
    cJSON *n = num_exact(x);
    return n && cJSON_AddItemToObject(o, k, n);
}

int job_to_json(const struct job *j, char **out, struct rl_err *err)
{
    *out = NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        goto oom;
#define ADD(x) do { if (!(x)) goto oom; } while (0)
    ADD(cJSON_AddStringToObject(o, "id", j->id));
    if (j->given & JOB_F_MODEL)
        ADD(cJSON_AddStringToObject(o, "model", j->model));
    if (j->given & JOB_F_POOL)
        ADD(cJSON_AddStringToObject(o, "pool", j->pool));
    if (j->messages) {
        cJSON *m = cJSON_Duplicate(j->messages, 1);
        ADD(m && cJSON_AddItemToObject(o, "messages", m));
    }
    if (j->tools) {
        cJSON *t = cJSON_Duplicate(j->tools, 1);
        ADD(t && cJSON_AddItemToObject(o, "tools", t));
    }
    if (j->prompt)
        ADD(cJSON_AddStringToObject(o, "prompt", j->prompt));
    if (j->prompt_ids) {
        cJSON *a = cJSON_AddArrayToObject(o, "prompt_ids");
        ADD(a);
        for (int i = 0; i < j->n_prompt_ids; i++)
            ADD(cJSON_AddItemToArray(a, num_exact(j->prompt_ids[i])));
    }
    if (j->given & JOB_F_TASK)
        ADD(cJSON_AddStringToObject(o, "task", j->task == JOB_TASK_EMBED    ? "embed"
                                               : j->task == JOB_TASK_RERANK ? "rerank"
                                                                            : "generate"));
    if (j->query)
        ADD(cJSON_AddStringToObject(o, "query", j->query));
    if (j->document)
        ADD(cJSON_AddStringToObject(o, "document", j->document));
    if (j->instruction)
        ADD(cJSON_AddStringToObject(o, "instruction", j->instruction));
    if (j->given & JOB_F_DIMENSIONS)
        ADD(add_num(o, "dimensions", j->dimensions));
    if (j->given & JOB_F_TRUNCATE)
        ADD(cJSON_AddBoolToObject(o, "truncate", j->truncate));
    if (j->no_normalize)
        ADD(cJSON_AddBoolToObject(o, "normalize", 0));
    if (j->continue_final)
        ADD(cJSON_AddBoolToObject(o, "continue_final_message", 1));
    if (j->given & JOB_F_MODE)
        ADD(cJSON_AddStringToObject(o, "mode", j->mode == JOB_MODE_THINK      ? "think"
                                               : j->mode == JOB_MODE_AUTO ? "auto"
                                                                          : "no_think"));
    /* the scalars in the order job_parse's table lists them: 'n' a number,
     * 'b' a bool, 'l' false when negative else a number (logprobs), 's'
     * the stop list; on says whether the job gave it */
#define GIVEN(bit) ((j->given & (bit)) != 0)
    const struct {
        bool on;
        char type;
        const char *k;
        double x;
    } scalars[] = {
        {GIVEN(JOB_F_MAX_TOKENS), 'n', "max_tokens", j->max_tokens},
        {GIVEN(JOB_F_TEMPERATURE), 'n', "temperature", j->temperature},
        {GIVEN(JOB_F_TOP_P), 'n', "top_p", j->top_p}, {GIVEN(JOB_F_TOP_K), 'n', "top_k", j->top_k},
        {GIVEN(JOB_F_MIN_P), 'n', "min_p", j->min_p},
        {GIVEN(JOB_F_PRESENCE), 'n', "presence_penalty", j->presence_penalty},
        {GIVEN(JOB_F_FREQUENCY), 'n', "frequency_penalty", j->frequency_penalty},
        {GIVEN(JOB_F_REPETITION), 'n', "repetition_penalty", j->repetition_penalty},
        {j->has_seed, 'n', "seed", (double)j->seed}, {GIVEN(JOB_F_STOP), 's', "stop", 0},
        {GIVEN(JOB_F_IGNORE_EOS), 'b', "ignore_eos", j->ignore_eos},
        {GIVEN(JOB_F_MAX_THINKING), 'n', "max_thinking_tokens", j->max_thinking_tokens},
        {GIVEN(JOB_F_LOGPROBS), 'l', "logprobs", j->logprobs},
        {GIVEN(JOB_F_PRIORITY), 'n', "priority", j->priority},
        {GIVEN(JOB_F_DEADLINE), 'n', "deadline_ms", (double)j->deadline_ms},
        {GIVEN(JOB_F_CACHE), 'b', "cache", j->cache},
        {GIVEN(JOB_F_STREAM_TTL), 'n', "stream_ttl_s", j->stream_ttl_s},
        {GIVEN(JOB_F_SPECULATIVE), 'b', "speculative", j->speculative},
        {GIVEN(JOB_F_CLIENT_LEASE), 'n', "client_lease_ms", j->client_lease_ms},
        {GIVEN(JOB_F_MIN_TOKENS), 'n', "min_tokens", j->min_tokens},
        {GIVEN(JOB_F_STOP_IDS), 'i', "stop_token_ids", 0},
        {GIVEN(JOB_F_LOGIT_BIAS), 'o', "logit_bias", 0},
        {GIVEN(JOB_F_SKIP_SPECIAL), 'b', "skip_special_tokens", j->skip_special},
    };
#undef GIVEN
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++) {
        const char *k = scalars[i].k;
        double x = scalars[i].x;
        if (!scalars[i].on)
            continue;
        if (scalars[i].type == 'b' || (scalars[i].type == 'l' && x < 0)) {
            ADD(cJSON_AddBoolToObject(o, k, x > 0));
        } else if (scalars[i].type == 's') {
            cJSON *a = cJSON_AddArrayToObject(o, k);
            ADD(a);
            for (int s = 0; s < j->n_stop; s++)
                ADD(cJSON_AddItemToArray(a, cJSON_CreateString(j->stop[s])));
        } else if (scalars[i].type == 'i') {
            cJSON *a = cJSON_AddArrayToObject(o, k);
            ADD(a);
            for (int s = 0; s < j->n_stop_ids; s++)
                ADD(cJSON_AddItemToArray(a, num_exact(j->stop_ids[s])));
        } else if (scalars[i].type == 'o') {
            cJSON *b = cJSON_AddObjectToObject(o, k);
            ADD(b);
            for (int s = 0; s < j->n_bias; s++) {
                char key[16];
                snprintf(key, sizeof key, "%d", (int)j->bias_ids[s]);
                ADD(add_num(b, key, j->bias[s]));
            }
        } else {
            ADD(add_num(o, k, x));
        }
    }
    /* the members kept as given */
    const struct {
        const char *k;
        const cJSON *v;
    } trees[] = {{"metadata", j->metadata}, {"response_format", j->response_format},
                 {"tool_choice", j->tool_choice}};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++)
        if (trees[i].v) {
            cJSON *m = cJSON_Duplicate(trees[i].v, 1);
            ADD(m && cJSON_AddItemToObject(o, trees[i].k, m));
        }
    if (j->grammar)
        ADD(cJSON_AddStringToObject(o, "grammar", j->grammar));
#undef ADD
    *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!*out)
        return rl_errf(err, RL_ENOMEM, "job_to_json: out of memory");
    return 0;
oom:
    cJSON_Delete(o);
    return rl_errf(err, RL_ENOMEM, "job_to_json: out of memory");
}

/* Little-endian, fixed-width encoders for the cache-key preimage. */
static void put_u64(struct sha256_ctx *c, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    sha256_update(c, b, 8);
}

static void put_f64(struct sha256_ctx *c, double x)
{
    uint64_t u;
    if (x == 0.0)
        x = 0.0; /* -0.0 and 0.0 sample the same */
    memcpy(&u, &x, sizeof u);
    put_u64(c, u);
}

static void put_str(struct sha256_ctx *c, const char *s, size_t n)
{
    put_u64(c, n);
    sha256_update(c, s, n);
}

int job_cache_key(const struct job *j, enum job_mode mode, const char *model_id,
                  const int32_t *ids, int n_ids, char out[JOB_CACHE_KEY_LEN + 1],
                  struct rl_err *err)
{
    if (!j || !model_id || !model_id[0] || n_ids < 0 || (n_ids && !ids))
        return rl_errf(err, RL_EINVAL, "job_cache_key: need a model id and the prompt ids");
    struct sha256_ctx c;
    sha256_init(&c);
    /* bump the version whenever the encoding or the field list changes,
     * so old entries simply stop matching */
    static const char tag[] = "redlm-cache-v4";
    sha256_update(&c, tag, sizeof tag);
    put_str(&c, model_id, strlen(model_id));
    put_u64(&c, (uint64_t)n_ids);
    for (int i = 0; i < n_ids; i++) {
        uint8_t b[4];
        uint32_t v = (uint32_t)ids[i];
        for (int k = 0; k < 4; k++)
            b[k] = (uint8_t)(v >> (8 * k));
        sha256_update(&c, b, 4);
    }
    put_u64(&c, (uint64_t)j->max_tokens);
    put_f64(&c, j->temperature);
    put_f64(&c, j->top_p);
    put_u64(&c, (uint64_t)(int64_t)j->top_k);
    put_f64(&c, j->min_p);
    put_f64(&c, j->presence_penalty);
    put_f64(&c, j->frequency_penalty);
    put_f64(&c, j->repetition_penalty);
    put_u64(&c, j->has_seed ? 1 : 0);
    put_u64(&c, j->has_seed ? j->seed : 0);
    put_u64(&c, (uint64_t)j->n_stop);
    for (int i = 0; i < j->n_stop; i++)
        put_str(&c, j->stop[i], strlen(j->stop[i]));
    put_u64(&c, j->ignore_eos ? 1 : 0);
    put_u64(&c, (uint64_t)(int64_t)j->max_thinking_tokens);
    put_u64(&c, (uint64_t)(int64_t)j->logprobs);
    /* v2: unset sampling fields take per-mode defaults, and prompt or
     * prompt_ids carry no mode of their own */
    put_u64(&c, mode == JOB_MODE_THINK ? 1 : 0);
    /* v3: the constraint decides which tokens may come at all */
    put_u64(&c, (uint64_t)j->constraint);
    put_str(&c, j->constraint_src ? j->constraint_src : "",
            j->constraint_src ? strlen(j->constraint_src) : 0);
    put_str(&c, j->tool_name, strlen(j->tool_name));
    /* v4: min_tokens, stop_token_ids and logit_bias (issue 29) */
    put_u64(&c, (uint64_t)j->min_tokens);
    put_u64(&c, (uint64_t)j->n_stop_ids);
    for (int i = 0; i < j->n_stop_ids; i++)
        put_u64(&c, (uint64_t)j->stop_ids[i]);
    put_u64(&c, (uint64_t)j->n_bias);
    for (int i = 0; i < j->n_bias; i++) {
        put_u64(&c, (uint64_t)j->bias_ids[i]);
        put_f64(&c, j->bias[i]);
    }
    put_u64(&c, j->skip_special ? 1 : 0); /* the text differs */
    /* an embedding is not text: its key says so (appended only there, so
     * the keys of generating jobs are those of v4) */
    if (j->task == JOB_TASK_EMBED) {
        static const char etag[] = "embed";
        put_str(&c, etag, sizeof etag - 1);
        put_u64(&c, (uint64_t)j->dimensions);
        put_u64(&c, j->truncate ? 1 : 0);
        if (j->no_normalize) { /* appended only then: unit vectors keep their keys */
            static const char raw[] = "raw";
            put_str(&c, raw, sizeof raw - 1);
        }
    }
    if (j->task == JOB_TASK_RERANK) { /* query, document and instruction are in the ids */
        static const char rtag[] = "rerank";
        put_str(&c, rtag, sizeof rtag - 1);
    }
    uint8_t d[SHA256_DIGEST_LEN];
    sha256_final(&c, d);
    sha256_to_hex(d, out);
    return 0;
}
