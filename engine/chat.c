/* engine/chat.c - Qwen3's chat template in C, and Python-exact JSON.
 *
 * chat_render follows the official Jinja template (tokenizer_config.json of
 * Qwen3) statement by statement; the comments quote the Jinja they stand
 * for, so the two can be compared line by line. The parts that decide bytes:
 *  - a system prompt and/or a tools block open the prompt; with tools, each
 *    tool is one line of `tool | tojson`;
 *  - last_query_index is the last user message that is not a wrapped tool
 *    response; assistant turns after it (the current tool-calling chain)
 *    keep their reasoning as <think>...</think>, earlier ones lose it;
 *  - reasoning comes from reasoning_content, or is cut out of content when
 *    content contains </think>;
 *  - consecutive tool messages share one user turn of <tool_response>s.
 *
 * HF renders with its own tojson filter, json.dumps(x, ensure_ascii=False)
 * with no sorting, so chat_json_dumps reproduces Python's json module: its
 * separators, its escapes, its int/float distinction and float repr. cJSON
 * keeps only a double per number, so chat_json_parse records each number's
 * spelling from the source text next to it.
 *
 * Callers: the worker (prompt from a request), the CLI `template` command.
 * Reentrant; no state outside the arguments. The streaming output parser is
 * in chat_parse.c. */
#include "chat.h"
#include "text.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The prompt being rendered, and where the request's own text went in it. */
struct cbuf {
    struct text t;          /* appends stop at the first failed one (t.oom) */
    bool want_spans;        /* record where message content went */
    struct tok_span *spans; /* (n_spans) in order, malloc'd */
    int n_spans, cap_spans;
};

static void cb_add(struct cbuf *b, const char *s, size_t n)
{
    if (!b->t.oom)
        text_add(&b->t, s, n);
}

static void cb_str(struct cbuf *b, const char *s) { cb_add(b, s, strlen(s)); }

/* Records b->t.p[from, b->t.n) as text that came from the request (a message's
 * content, a tool definition) when spans are wanted: the tokenizer then
 * never reads control tokens out of it. */
static void cb_mark(struct cbuf *b, size_t from)
{
    if (!b->want_spans || b->t.oom || from >= b->t.n)
        return;
    struct tok_span *last = b->n_spans ? &b->spans[b->n_spans - 1] : NULL;
    if (last && last->off + last->len == from) {
        last->len = b->t.n - last->off; /* adjacent: one span */
        return;
    }
    if (b->n_spans == b->cap_spans) {
        int cap = b->cap_spans ? 2 * b->cap_spans : 16;
        struct tok_span *p = realloc(b->spans, (size_t)cap * sizeof *p);
        if (!p) {
            b->t.oom = true;
            return;
        }
        b->spans = p;
        b->cap_spans = cap;
    }
    b->spans[b->n_spans++] = (struct tok_span){from, b->t.n - from};
}

/* ---- JSON: parse keeping number spellings ------------------------------- */

/* Walks the source text in document order, which is also cJSON's child
 * order, and hands each number token to the next number item. */
struct num_walk {
    const char *s;
    size_t n, pos;
};

static bool next_number(struct num_walk *w, const char **tok, size_t *tok_len)
{
    while (w->pos < w->n) {
        char c = w->s[w->pos];
        if (c == '"') {
            w->pos++;
            while (w->pos < w->n && w->s[w->pos] != '"')
                w->pos += w->s[w->pos] == '\\' ? 2 : 1;
            w->pos++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t start = w->pos;
            while (w->pos < w->n && strchr("+-0123456789.eE", w->s[w->pos]) && w->s[w->pos])
                w->pos++;
            *tok = w->s + start;
            *tok_len = w->pos - start;
            return true;
        } else {
            w->pos++;
        }
    }
    return false;
}

static bool attach_numbers(cJSON *v, struct num_walk *w)
{
    for (; v; v = v->next) {
        if (cJSON_IsNumber(v)) {
            const char *tok;
            size_t n;
            if (!next_number(w, &tok, &n))
                return false;
            char *s = cJSON_malloc(n + 1);
            if (!s)
                return false;
            memcpy(s, tok, n);
            s[n] = 0;
            v->valuestring = s;
        } else if ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !attach_numbers(v->child, w)) {
            return false;
        }
    }
    return true;
}

static void drop_spellings(cJSON *v)
{
    for (; v; v = v->next) {
        if (cJSON_IsNumber(v) && v->valuestring) {
            cJSON_free(v->valuestring);
            v->valuestring = NULL;
        }
        drop_spellings(v->child);
    }
}

cJSON *chat_json_parse(const char *text, size_t len, struct rl_err *err)
{
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!v) {
        rl_errf(err, RL_EINVAL, "malformed JSON at offset %zu",
                end && end >= text ? (size_t)(end - text) : (size_t)0);
        return NULL;
    }
    struct num_walk w = {text, len, 0};
    if (!attach_numbers(v, &w))
        drop_spellings(v); /* cannot happen for text cJSON accepted; stay safe */
    return v;
}

/* ---- JSON: dump as Python does ------------------------------------------ */

static void dump_string(struct cbuf *b, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    cb_add(b, "\"", 1);
    const char *run = s;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        cb_add(b, run, (size_t)(s - run));
        run = s + 1;
        switch (c) {
        case '"': cb_add(b, "\\\"", 2); break;
        case '\\': cb_add(b, "\\\\", 2); break;
        case '\n': cb_add(b, "\\n", 2); break;
        case '\r': cb_add(b, "\\r", 2); break;
        case '\t': cb_add(b, "\\t", 2); break;
        case '\b': cb_add(b, "\\b", 2); break;
        case '\f': cb_add(b, "\\f", 2); break;
        default: {
            char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            cb_add(b, u, 6);
        }
        }
    }
    cb_add(b, run, (size_t)(s - run));
    cb_add(b, "\"", 1);
}

/* Python's repr(float): the shortest digit string that reads back to the
 * same double, in fixed notation for decimal exponents -4..15 and
 * scientific (two-digit minimum exponent, explicit sign) otherwise. */
static void dump_float(struct cbuf *b, double d)
{
    if (isnan(d)) {
        cb_str(b, "NaN");
        return;
    }
    if (isinf(d)) {
        cb_str(b, d < 0 ? "-Infinity" : "Infinity");
        return;
    }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    /* tmp = [-]D[.DDD]e[+-]XX: pull out the digits and the exponent */
    char digits[24];
    int nd = 0;
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg)
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    char out[64];
    int o = 0;
    if (neg)
        out[o++] = '-';
    if (exp < -4 || exp >= 16) {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++)
                out[o++] = digits[i];
        }
        o += snprintf(out + o, sizeof out - (size_t)o, "e%c%02d", exp < 0 ? '-' : '+',
                      exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -exp - 1; i++)
            out[o++] = '0';
        for (int i = 0; i < nd; i++)
            out[o++] = digits[i];
    } else {
        for (int i = 0; i <= exp; i++)
            out[o++] = i < nd ? digits[i] : '0';
        out[o++] = '.';
        if (nd > exp + 1)
            for (int i = exp + 1; i < nd; i++)
                out[o++] = digits[i];
        else
            out[o++] = '0';
    }
    cb_add(b, out, (size_t)o);
}

static void dump_number(struct cbuf *b, const cJSON *v)
{
    const char *s = v->valuestring;
    if (s && *s) {
        if (!strpbrk(s, ".eE")) { /* an int: Python keeps every digit */
            cb_str(b, strcmp(s, "-0") ? s : "0");
            return;
        }
        dump_float(b, v->valuedouble);
        return;
    }
    double d = v->valuedouble;
    if (d == floor(d) && fabs(d) < 1e16) {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "%.0f", d == 0 ? 0.0 : d);
        cb_str(b, tmp);
        return;
    }
    dump_float(b, d);
}

static int dump_value(struct cbuf *b, const cJSON *v, int depth)
{
    if (depth > 512)
        return -1;
    if (cJSON_IsNull(v) || cJSON_IsInvalid(v))
        cb_str(b, "null");
    else if (cJSON_IsTrue(v))
        cb_str(b, "true");
    else if (cJSON_IsFalse(v))
        cb_str(b, "false");
    else if (cJSON_IsNumber(v))
        dump_number(b, v);
    else if (cJSON_IsString(v))
        dump_string(b, v->valuestring ? v->valuestring : "");
    else if (cJSON_IsRaw(v))
        cb_str(b, v->valuestring ? v->valuestring : "null");
    else {
        bool obj = cJSON_IsObject(v);
        /* A repeated key: Python's dict keeps the first position and the
         * last value. Checked for objects of up to 256 members, which keeps
         * a hostile object from costing n^2; larger ones print as they are. */
        bool dedup = obj && cJSON_GetArraySize(v) <= 256;
        bool first = true;
        cb_add(b, obj ? "{" : "[", 1);
        for (const cJSON *c = v->child; c; c = c->next) {
            const cJSON *val = c;
            if (dedup && c->string) {
                bool seen = false;
                for (const cJSON *e = v->child; e != c && !seen; e = e->next)
                    seen = e->string && !strcmp(e->string, c->string);
                if (seen)
                    continue;
                for (const cJSON *e = c->next; e; e = e->next)
                    if (e->string && !strcmp(e->string, c->string))
                        val = e;
            }
            if (!first)
                cb_add(b, ", ", 2);
            first = false;
            if (obj) {
                dump_string(b, c->string ? c->string : "");
                cb_add(b, ": ", 2);
            }
            if (dump_value(b, val, depth + 1))
                return -1;
        }
        cb_add(b, obj ? "}" : "]", 1);
    }
    return 0;
}

static int dump_into(struct cbuf *b, const cJSON *v, struct rl_err *err)
{
    if (dump_value(b, v, 0))
        return rl_errf(err, RL_EINVAL, "JSON nested deeper than 512 levels");
    if (b->t.oom)
        return rl_errf(err, RL_ENOMEM, "out of memory serializing JSON");
    return 0;
}

char *chat_json_dumps(const cJSON *v, size_t *len, struct rl_err *err)
{
    struct cbuf b = {0};
    if (dump_into(&b, v, err)) {
        free(b.t.p);
        return NULL;
    }
    if (!b.t.p)
        cb_add(&b, "", 0);
    if (b.t.oom) {
        rl_errf(err, RL_ENOMEM, "out of memory serializing JSON");
        return NULL;
    }
    if (len)
        *len = b.t.n;
    return b.t.p;
}

/* ---- the template ------------------------------------------------------- */

/* A message's content as a string slice. For a list of parts the text parts
 * are joined into *owned (caller frees). */
struct slice {
    const char *s;
    size_t n;
};

static int get_content(const cJSON *m, int i, struct slice *out, char **owned, struct rl_err *err)
{
    *owned = NULL;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!c || cJSON_IsNull(c)) {
        *out = (struct slice){"", 0};
        return 0;
    }
    if (cJSON_IsString(c)) {
        *out = (struct slice){c->valuestring, strlen(c->valuestring)};
        return 0;
    }
    if (!cJSON_IsArray(c))
        return rl_errf(err, RL_EINVAL, "messages[%d].content is neither a string nor a list of parts", i);
    struct cbuf b = {0};
    const cJSON *part;
    int k = 0;
    cJSON_ArrayForEach(part, c) {
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(part, "type"));
        const char *text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(part, "text"));
        if (!type || strcmp(type, "text") || !text) {
            free(b.t.p);
            return rl_errf(err, RL_EINVAL, "messages[%d].content[%d] is not a text part", i, k);
        }
        cb_str(&b, text);
        k++;
    }
    if (b.t.oom) {
        free(b.t.p);
        return rl_errf(err, RL_ENOMEM, "out of memory");
    }
    *owned = b.t.p;
    *out = (struct slice){b.t.p ? b.t.p : "", b.t.n};
    return 0;
}

static bool starts_with(struct slice s, const char *p)
{
    size_t n = strlen(p);
    return s.n >= n && !memcmp(s.s, p, n);
}

static bool ends_with(struct slice s, const char *p)
{
    size_t n = strlen(p);
    return s.n >= n && !memcmp(s.s + s.n - n, p, n);
}

/* Position of the first / last occurrence of needle, or -1. */
static long find_first(struct slice s, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= s.n; i++)
        if (!memcmp(s.s + i, needle, n))
            return (long)i;
    return -1;
}

static long find_last(struct slice s, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = s.n; i >= n; i--)
        if (!memcmp(s.s + i - n, needle, n))
            return (long)(i - n);
    return -1;
}

static struct slice lstrip_nl(struct slice s)
{
    while (s.n && s.s[0] == '\n')
        s.s++, s.n--;
    return s;
}

static struct slice rstrip_nl(struct slice s)
{
    while (s.n && s.s[s.n - 1] == '\n')
        s.n--;
    return s;
}

static void cb_slice(struct cbuf *b, struct slice s) { cb_add(b, s.s, s.n); }
/* A slice of a user, system or tool message: ordinary text, never tokens. */
static void cb_content(struct cbuf *b, struct slice s)
{
    size_t at = b->t.n;
    cb_add(b, s.s, s.n);
    cb_mark(b, at);
}

static const char *role_of(const cJSON *m)
{
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
}

static int render_tool_calls(struct cbuf *b, const cJSON *calls, int i, struct slice content,
                             struct rl_err *err)
{
    const cJSON *tc;
    int k = 0;
    cJSON_ArrayForEach(tc, calls) {
        /* {%- if (loop.first and content) or (not loop.first) %} '\n' */
        if ((k == 0 && content.n) || k > 0)
            cb_add(b, "\n", 1);
        if (!cJSON_IsObject(tc))
            return rl_errf(err, RL_EINVAL, "messages[%d].tool_calls[%d] is not an object", i, k);
        /* {%- if tool_call.function %} {%- set tool_call = tool_call.function %} */
        const cJSON *call = tc;
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        if (cJSON_IsObject(fn) && fn->child)
            call = fn;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(call, "name");
        if (name && !cJSON_IsString(name))
            return rl_errf(err, RL_EINVAL, "messages[%d].tool_calls[%d].name is not a string", i, k);
        cb_str(b, "<tool_call>\n{\"name\": \"");
        if (name)
            cb_str(b, name->valuestring);
        cb_str(b, "\", \"arguments\": ");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(call, "arguments");
        if (!args)
            return rl_errf(err, RL_EINVAL, "messages[%d].tool_calls[%d].arguments missing", i, k);
        /* {%- if tool_call.arguments is string %} as is {%- else %} tojson */
        if (cJSON_IsString(args))
            cb_str(b, args->valuestring);
        else {
            int rc = dump_into(b, args, err);
            if (rc)
                return rc;
        }
        cb_str(b, "}\n</tool_call>");
        k++;
    }
    return 0;
}

static int render_assistant(struct cbuf *b, const cJSON *m, int i, bool last, int last_query,
                            bool keep_open, struct slice content, struct rl_err *err)
{
    /* {%- set reasoning_content = '' %} */
    struct slice reasoning = {"", 0};
    const cJSON *rc_item = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
    if (rc_item && !cJSON_IsNull(rc_item)) {
        if (!cJSON_IsString(rc_item))
            return rl_errf(err, RL_EINVAL, "messages[%d].reasoning_content is not a string", i);
        reasoning = (struct slice){rc_item->valuestring, strlen(rc_item->valuestring)};
    } else if (find_first(content, "</think>") >= 0) {
        /* reasoning = content.split('</think>')[0].rstrip('\n')
         *                    .split('<think>')[-1].lstrip('\n') */
        struct slice head = {content.s, (size_t)find_first(content, "</think>")};
        head = rstrip_nl(head);
        long open = find_last(head, "<think>");
        if (open >= 0)
            head = (struct slice){head.s + open + 7, head.n - (size_t)open - 7};
        reasoning = lstrip_nl(head);
        /* content = content.split('</think>')[-1].lstrip('\n') */
        long close = find_last(content, "</think>");
        content = lstrip_nl((struct slice){content.s + close + 8, content.n - (size_t)close - 8});
    }
    cb_str(b, "<|im_start|>assistant\n");
    /* {%- if loop.index0 > ns.last_query_index %}
     *   {%- if loop.last or (not loop.last and reasoning_content) %} */
    if (i > last_query && (last || reasoning.n)) {
        cb_str(b, "<think>\n");
        cb_slice(b, rstrip_nl(lstrip_nl(reasoning)));
        cb_str(b, "\n</think>\n\n");
        cb_slice(b, lstrip_nl(content));
    } else {
        cb_slice(b, content);
    }
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (calls && !cJSON_IsNull(calls)) {
        if (!cJSON_IsArray(calls))
            return rl_errf(err, RL_EINVAL, "messages[%d].tool_calls is not an array", i);
        /* content here is the value after the </think> split, not lstripped */
        int rc = render_tool_calls(b, calls, i, content, err);
        if (rc)
            return rc;
    }
    if (!keep_open) /* continued: the model writes on from its last byte */
        cb_str(b, "<|im_end|>\n");
    return 0;
}

static int render(struct cbuf *b, const cJSON *messages, const cJSON *tools,
                  const struct chat_template_opts *o, struct rl_err *err)
{
    if (!cJSON_IsArray(messages))
        return rl_errf(err, RL_EINVAL, "messages is not an array");
    int n = cJSON_GetArraySize(messages);
    if (n == 0)
        return rl_errf(err, RL_EINVAL, "messages is empty");
    if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools))
        return rl_errf(err, RL_EINVAL, "tools is not an array");
    bool have_tools = tools && cJSON_IsArray(tools) && tools->child;

    /* validate roles and contents before writing anything */
    const cJSON **msg = malloc((size_t)n * sizeof *msg);
    struct slice *content = malloc((size_t)n * sizeof *content);
    char **owned = calloc((size_t)n, sizeof *owned);
    int rc = 0;
    if (!msg || !content || !owned) {
        rc = rl_errf(err, RL_ENOMEM, "out of memory");
        goto out;
    }
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        if (!cJSON_IsObject(m)) {
            rc = rl_errf(err, RL_EINVAL, "messages[%d] is not an object", i);
            goto out;
        }
        if (!role_of(m)) {
            rc = rl_errf(err, RL_EINVAL, "messages[%d].role missing or not a string", i);
            goto out;
        }
        msg[i] = m;
        if ((rc = get_content(m, i, &content[i], &owned[i], err)))
            goto out;
        i++;
    }

    bool cont = o && o->continue_final;
    if (cont && strcmp(role_of(msg[n - 1]), "assistant")) {
        rc = rl_errf(err, RL_EINVAL,
                     "messages[%d]: continuing the final message needs an assistant's, not "
                     "a %s's", n - 1, role_of(msg[n - 1]));
        goto out;
    }
    bool first_system = !strcmp(role_of(msg[0]), "system");
    if (have_tools) {
        cb_str(b, "<|im_start|>system\n");
        if (first_system) {
            cb_content(b, content[0]);
            cb_str(b, "\n\n");
        }
        cb_str(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            cb_str(b, "\n");
            size_t at = b->t.n;
            if ((rc = dump_into(b, t, err)))
                goto out;
            cb_mark(b, at);
        }
        cb_str(b, "\n</tools>\n\nFor each function call, return a json object with function name and "
                  "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
                  "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
    } else if (first_system) {
        cb_str(b, "<|im_start|>system\n");
        cb_content(b, content[0]);
        cb_str(b, "<|im_end|>\n");
    }

    /* ns.last_query_index: the last user message that is not a
     * <tool_response>...</tool_response> wrapper; n - 1 when there is none */
    int last_query = n - 1;
    for (int k = n - 1; k >= 0; k--) {
        if (!strcmp(role_of(msg[k]), "user") &&
            !(starts_with(content[k], "<tool_response>") && ends_with(content[k], "</tool_response>"))) {
            last_query = k;
            break;
        }
    }

    for (i = 0; i < n; i++) {
        const char *role = role_of(msg[i]);
        bool last = i == n - 1;
        if (!strcmp(role, "user") || (!strcmp(role, "system") && i > 0)) {
            cb_str(b, "<|im_start|>");
            cb_str(b, role);
            cb_str(b, "\n");
            cb_content(b, content[i]);
            cb_str(b, "<|im_end|>\n");
        } else if (!strcmp(role, "assistant")) {
            if ((rc = render_assistant(b, msg[i], i, last, last_query, cont && last, content[i],
                                       err)))
                goto out;
        } else if (!strcmp(role, "tool")) {
            if (i == 0 || strcmp(role_of(msg[i - 1]), "tool"))
                cb_str(b, "<|im_start|>user");
            cb_str(b, "\n<tool_response>\n");
            cb_content(b, content[i]);
            cb_str(b, "\n</tool_response>");
            if (last || strcmp(role_of(msg[i + 1]), "tool"))
                cb_str(b, "<|im_end|>\n");
        }
        /* any other role renders nothing, as in the template */
    }
    if (o && o->add_generation_prompt && !cont) {
        cb_str(b, "<|im_start|>assistant\n");
        if (o->disable_thinking)
            cb_str(b, "<think>\n\n</think>\n\n");
    }
    if (b->t.oom)
        rc = rl_errf(err, RL_ENOMEM, "out of memory rendering the prompt");
out:
    if (owned)
        for (int k = 0; k < n; k++)
            free(owned[k]);
    free(owned);
    free(content);
    free(msg);
    return rc;
}

static int render_top(const cJSON *messages, const cJSON *tools,
                      const struct chat_template_opts *o, struct cbuf *b, struct rl_err *err)
{
    int rc = render(b, messages, tools, o, err);
    if (!rc && !b->t.p) {
        cb_add(b, "", 0);
        if (b->t.oom)
            rc = rl_errf(err, RL_ENOMEM, "out of memory");
    }
    if (!rc && b->t.oom)
        rc = rl_errf(err, RL_ENOMEM, "out of memory rendering the prompt");
    if (rc) {
        free(b->t.p);
        free(b->spans);
    }
    return rc;
}

int chat_render(const cJSON *messages, const cJSON *tools, const struct chat_template_opts *o,
                char **out, size_t *len, struct rl_err *err)
{
    *out = NULL;
    struct cbuf b = {0};
    int rc = render_top(messages, tools, o, &b, err);
    if (rc)
        return rc;
    *out = b.t.p;
    if (len)
        *len = b.t.n;
    return 0;
}

int chat_tokenize(const struct tokenizer *tok, const cJSON *messages, const cJSON *tools,
                  const struct chat_template_opts *o, struct tok_ids *ids, struct rl_err *err)
{
    struct cbuf b = {.want_spans = true};
    int rc = render_top(messages, tools, o, &b, err);
    if (rc)
        return rc;
    /* the template's own tags are real tokens; the request's text is text */
    rc = tok_encode_spans(tok, b.t.p, b.t.n, 0, b.spans, b.n_spans, ids, err);
    free(b.t.p);
    free(b.spans);
    return rc;
}
