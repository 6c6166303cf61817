/* engine/chat_parse.c - the streaming parser of Qwen3's output.
 *
 * A small state machine over the generated text:
 *
 *   START --"<think>"--> REASONING --"</think>"--> CONTENT
 *     \--anything else--> CONTENT --"<tool_call>"--> TOOL --"</tool_call>"--> CONTENT
 *
 * (think_open starts in REASONING.) Each state looks for one tag. Bytes that
 * could still be the beginning of that tag (a delta ending in "</thi") stay
 * in `pend` until more text decides; everything before is emitted at once,
 * so a client sees text as soon as it cannot be part of a tag. Newlines
 * next to tags are the template's formatting, not the model's words: the
 * ones right after an opening position are dropped (skip_nl), and a run of
 * newlines at the end of emitted text is held (held_nl) until we know
 * whether a closing tag follows (dropped) or more text (emitted).
 *
 * A tool call's JSON is parsed when its block closes: {"name": ...,
 * "arguments": ...} becomes a TOOL_CALL with the arguments re-serialized
 * as Python's json.dumps would; anything else is a TOOL_ERROR carrying the
 * raw block, so no model output is ever lost.
 *
 * While a block is open, its JSON is also scanned as it arrives (struct
 * tscan): once the "name" string is complete and an "arguments" (or
 * "parameters") object starts, each feed emits a TOOL_DELTA with the
 * arguments' new text in the form TOOL_CALL will give them (whitespace
 * dropped, ", " and ": " separators, each string, number and literal
 * re-serialized alone with chat_json_dumps), so the fragments of a call
 * concatenate to its final arguments; finish_tool makes sure of it (the
 * remainder as one more fragment, see there). Strings are cut only
 * between characters and escapes, never inside a UTF-8 sequence or a
 * surrogate pair.
 *
 * Events point into `arena`, which is rebuilt on every feed; they are made
 * with offsets and turned into pointers once the feed is done, so arena
 * growth never leaves an event dangling. One parser per generated output,
 * driven by one thread. */
#include "chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum state { ST_START, ST_REASONING, ST_CONTENT, ST_TOOL };

struct ev_rec {
    enum chat_event_type type;
    size_t text, len;        /* offsets into arena */
    size_t name, arguments;  /* offsets, SIZE_MAX = none */
    const char *error;       /* static sentence */
    bool streamed;
};

struct pbuf {
    char *p;
    size_t n, cap;
};

/* The incremental scan of one <tool_call> block's JSON (see the top). */
enum tphase {
    TS_PRE,      /* before the object's "{" */
    TS_KEY_WAIT, /* a key or "}" next */
    TS_KEY,      /* inside a key string */
    TS_COLON,    /* ":" next */
    TS_VAL_WAIT, /* a value next */
    TS_SKIP,     /* inside a value we do not stream (name's string, others) */
    TS_ARGS,     /* inside the arguments object: streaming */
    TS_AFTER,    /* "," or "}" next */
    TS_OFF,      /* not a shape we stream; the end decides, as before */
};

struct tscan {
    enum tphase ph;
    struct pbuf key;   /* the raw key being read */
    struct pbuf val;   /* TS_SKIP of "name": its raw string */
    bool val_is_name, args_seen;
    int depth;         /* TS_SKIP/TS_ARGS: nesting depth inside the value */
    bool in_str, esc;  /* TS_SKIP/TS_ARGS: inside a string, after a backslash */
    struct pbuf str;   /* TS_ARGS: raw string bytes not yet emitted */
    struct pbuf tok;   /* TS_ARGS: a number or literal being read */
    char *name;        /* the decoded "name", once complete */
    bool started;      /* a TOOL_DELTA of this call went out */
    bool args_done;    /* the arguments object closed */
    struct pbuf sent;  /* all argument text emitted for this call */
    struct pbuf out;   /* argument text of this feed, not yet an event */
};

struct chat_parser {
    struct chat_parser_opts o;
    enum state st;
    bool skip_nl;     /* drop newlines at the start of the next text */
    size_t held_nl;   /* newlines withheld at the end of emitted text */
    struct pbuf pend; /* undecided bytes */
    struct pbuf tool; /* the current <tool_call> block so far */
    struct tscan ts;
    struct pbuf arena;
    struct ev_rec *recs;
    struct chat_event *evs;
    size_t n_ev, cap_ev;
    bool oom;
};

static const char TAG_THINK[] = "<think>", TAG_END_THINK[] = "</think>";
static const char TAG_TOOL[] = "<tool_call>", TAG_END_TOOL[] = "</tool_call>";

static void pb_add(struct chat_parser *p, struct pbuf *b, const char *s, size_t n)
{
    if (p->oom || n == 0)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            p->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* Appends s and its NUL to the arena; returns its offset. */
static size_t arena_str(struct chat_parser *p, const char *s, size_t n)
{
    size_t off = p->arena.n;
    pb_add(p, &p->arena, s, n);
    pb_add(p, &p->arena, "", 1); /* keeps each string NUL-terminated */
    return off;
}

static struct ev_rec *new_rec(struct chat_parser *p)
{
    if (p->n_ev == p->cap_ev) {
        size_t cap = p->cap_ev ? p->cap_ev * 2 : 16;
        struct ev_rec *r = realloc(p->recs, cap * sizeof *r);
        if (r)
            p->recs = r;
        struct chat_event *e = realloc(p->evs, cap * sizeof *e);
        if (e)
            p->evs = e;
        if (!r || !e) {
            p->oom = true;
            return NULL;
        }
        p->cap_ev = cap;
    }
    struct ev_rec *r = &p->recs[p->n_ev++];
    *r = (struct ev_rec){.name = SIZE_MAX, .arguments = SIZE_MAX};
    return r;
}

/* Emits text of a type, merging with the previous event when it is text of
 * the same type (its bytes are the last thing in the arena then). */
static void emit_raw(struct chat_parser *p, enum chat_event_type type, const char *s, size_t n)
{
    if (n == 0)
        return;
    if (p->n_ev && p->recs[p->n_ev - 1].type == type &&
        p->recs[p->n_ev - 1].text + p->recs[p->n_ev - 1].len + 1 == p->arena.n) {
        p->arena.n--; /* over the NUL */
        pb_add(p, &p->arena, s, n);
        pb_add(p, &p->arena, "", 1);
        p->recs[p->n_ev - 1].len += n;
        return;
    }
    struct ev_rec *r = new_rec(p);
    if (!r)
        return;
    r->type = type;
    r->len = n;
    r->text = arena_str(p, s, n);
}

static enum chat_event_type text_type(const struct chat_parser *p)
{
    return p->st == ST_REASONING ? CHAT_EVENT_REASONING : CHAT_EVENT_CONTENT;
}

/* Text of the current state, with the newline rules applied. */
static void emit_text(struct chat_parser *p, const char *s, size_t n)
{
    if (p->skip_nl) {
        while (n && *s == '\n')
            s++, n--;
        if (n == 0)
            return;
        p->skip_nl = false;
    }
    if (n == 0)
        return;
    size_t nl = 0;
    while (nl < n && s[n - 1 - nl] == '\n')
        nl++;
    if (nl == n) { /* only newlines: add to the held run */
        p->held_nl += n;
        return;
    }
    enum chat_event_type t = text_type(p);
    for (; p->held_nl; p->held_nl--)
        emit_raw(p, t, "\n", 1);
    emit_raw(p, t, s, n - nl);
    p->held_nl = nl;
}

static void flush_held(struct chat_parser *p)
{
    enum chat_event_type t = text_type(p);
    for (; p->held_nl; p->held_nl--)
        emit_raw(p, t, "\n", 1);
}

/* Length of the longest proper prefix of tag that s ends with. */
static size_t partial_tag(const char *s, size_t n, const char *tag)
{
    size_t tl = strlen(tag);
    for (size_t k = tl - 1 < n ? tl - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, tag, k))
            return k;
    return 0;
}

static const char *find_tag(const char *s, size_t n, const char *tag)
{
    size_t tl = strlen(tag);
    for (size_t i = 0; i + tl <= n; i++)
        if (s[i] == tag[0] && !memcmp(s + i, tag, tl))
            return s + i;
    return NULL;
}


/* ---- the incremental scan of a tool call (struct tscan) ----------------- */

static void ts_reset(struct chat_parser *p)
{
    struct tscan *t = &p->ts;
    free(t->name);
    t->name = NULL;
    t->key.n = t->val.n = t->str.n = t->tok.n = t->sent.n = t->out.n = 0;
    t->ph = TS_PRE;
    t->val_is_name = t->args_seen = t->in_str = t->esc = t->started = t->args_done = false;
    t->depth = 0;
}

static void ts_put(struct chat_parser *p, const char *s, size_t n)
{
    pb_add(p, &p->ts.out, s, n);
    pb_add(p, &p->ts.sent, s, n);
}

/* s (one JSON value) as chat_json_dumps writes it, appended to out; false
 * when s is not a value. */
static bool ts_canon(struct chat_parser *p, const char *s, size_t n, struct pbuf *out)
{
    cJSON *j = chat_json_parse(s, n, NULL);
    if (!j)
        return false;
    size_t dn;
    char *d = chat_json_dumps(j, &dn, NULL);
    cJSON_Delete(j);
    if (!d)
        return false;
    pb_add(p, out, d, dn);
    free(d);
    return true;
}

static int hexval(const char *s)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Emits the string bytes held in ts.str up to the last point between two
 * characters (all: every byte; the string has closed), re-serialized. */
static void ts_str_flush(struct chat_parser *p, bool all)
{
    struct tscan *t = &p->ts;
    const char *s = t->str.p;
    size_t n = t->str.n, i = 0, cut = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t len = 1;
        if (c == '\\') {
            if (i + 1 >= n)
                break;
            len = 2;
            if (s[i + 1] == 'u') {
                len = 6;
                if (i + 6 > n)
                    break;
                int v = hexval(s + i + 2);
                if (v >= 0xD800 && v <= 0xDBFF) {
                    len = 12; /* a surrogate pair goes out whole */
                    if (i + 12 > n)
                        break;
                    int lo = s[i + 6] == '\\' && s[i + 7] == 'u' ? hexval(s + i + 8) : -1;
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        v = -1;
                }
                /* cJSON reads a bad escape leniently, and differently
                 * whole and piecewise; a NUL ends its string: such a
                 * call's rest comes at its end */
                if (v <= 0 || (v >= 0xDC00 && v <= 0xDFFF)) {
                    t->ph = TS_OFF;
                    return;
                }
            } else if (!strchr("\"\\/bfnrt", s[i + 1]) || !s[i + 1]) {
                t->ph = TS_OFF;
                return;
            }
        } else if (c >= 0xC0) {
            /* a lead byte and the continuation bytes that follow it (an
             * invalid sequence ends at the first byte that is not one, so
             * a backslash or quote is never swallowed) */
            size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            while (len < want && i + len < n && ((unsigned char)s[i + len] & 0xC0) == 0x80)
                len++;
            if (len < want && i + len == n && !all)
                break; /* its next byte may still come */
        }
        if (i + len > n)
            break;
        i += len;
        cut = i;
    }
    if (all && cut != n) { /* the string closed inside an escape */
        t->ph = TS_OFF;
        return;
    }
    if (cut == 0)
        return;
    struct pbuf q = {0}, d = {0};
    pb_add(p, &q, "\"", 1);
    pb_add(p, &q, s, cut);
    pb_add(p, &q, "\"", 1);
    if (!p->oom && ts_canon(p, q.p, q.n, &d) && d.n >= 2)
        ts_put(p, d.p + 1, d.n - 2);
    else
        t->ph = TS_OFF; /* not a string after all: the end decides */
    free(q.p);
    free(d.p);
    memmove(t->str.p, s + cut, n - cut);
    t->str.n = n - cut;
}

static void ts_tok_flush(struct chat_parser *p)
{
    struct tscan *t = &p->ts;
    struct pbuf d = {0};
    if (t->tok.n && ts_canon(p, t->tok.p, t->tok.n, &d))
        ts_put(p, d.p, d.n);
    else if (t->tok.n)
        t->ph = TS_OFF;
    free(d.p);
    t->tok.n = 0;
}

/* What cJSON skips between tokens: every byte up to the space. */
static bool is_ws(char c)
{
    return (unsigned char)c <= 32;
}

static bool is_tokc(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           c == '-' || c == '+' || c == '.';
}

static bool key_is(const struct tscan *t, const char *k)
{
    return t->key.n == strlen(k) && !memcmp(t->key.p, k, t->key.n);
}

static void ts_value_end(struct chat_parser *p)
{
    struct tscan *t = &p->ts;
    if (t->val_is_name && !t->name) {
        cJSON *j = chat_json_parse(t->val.p, t->val.n, NULL);
        if (cJSON_IsString(j) && j->valuestring[0] && !(t->name = strdup(j->valuestring)))
            p->oom = true;
        cJSON_Delete(j);
    }
    t->val_is_name = false;
    t->ph = TS_AFTER;
}

static void ts_byte(struct chat_parser *p, char c)
{
    struct tscan *t = &p->ts;
    switch (t->ph) {
    case TS_PRE:
        if (c == '{')
            t->ph = TS_KEY_WAIT;
        else if (!is_ws(c))
            t->ph = TS_OFF;
        return;
    case TS_KEY_WAIT:
        if (c == '"') {
            t->ph = TS_KEY;
            t->key.n = 0;
            t->esc = false;
        } else if (!is_ws(c)) {
            t->ph = TS_OFF; /* "}" too: the object ended */
        }
        return;
    case TS_KEY:
        if (!t->esc && c == '"') {
            t->ph = TS_COLON;
            return;
        }
        t->esc = !t->esc && c == '\\';
        pb_add(p, &t->key, &c, 1);
        return;
    case TS_COLON:
        if (c == ':')
            t->ph = TS_VAL_WAIT;
        else if (!is_ws(c))
            t->ph = TS_OFF;
        return;
    case TS_VAL_WAIT:
        if (is_ws(c))
            return;
        if (key_is(t, "arguments") || key_is(t, "parameters")) {
            bool first = !t->args_seen;
            t->args_seen = true;
            if (first && t->name && c == '{') {
                t->ph = TS_ARGS;
                t->depth = 1;
                t->in_str = t->esc = false;
                ts_put(p, "{", 1);
                return;
            }
        }
        t->val_is_name = key_is(t, "name") && c == '"';
        t->val.n = 0;
        t->ph = TS_SKIP;
        t->depth = 0;
        t->in_str = t->esc = false;
        /* c is the value's first byte */
        __attribute__((fallthrough));
    case TS_SKIP:
        if (t->val_is_name)
            pb_add(p, &t->val, &c, 1);
        if (t->in_str) {
            if (t->esc)
                t->esc = false;
            else if (c == '\\')
                t->esc = true;
            else if (c == '"') {
                t->in_str = false;
                if (t->depth == 0)
                    ts_value_end(p);
            }
            return;
        }
        if (t->depth == 0 && (c == ',' || c == '}' || is_ws(c))) {
            ts_value_end(p); /* a number or literal ended */
            ts_byte(p, c);
        } else if (c == '"') {
            t->in_str = true;
        } else if (c == '{' || c == '[') {
            t->depth++;
        } else if (c == '}' || c == ']') {
            if (--t->depth <= 0)
                ts_value_end(p);
        }
        return;
    case TS_AFTER:
        if (c == ',')
            t->ph = TS_KEY_WAIT;
        else if (!is_ws(c))
            t->ph = TS_OFF;
        return;
    case TS_ARGS:
        if (t->in_str && c == 0) {
            t->ph = TS_OFF; /* a raw NUL ends a cJSON string: the end decides */
            return;
        }
        if (t->in_str) {
            if (t->esc) {
                t->esc = false;
            } else if (c == '\\') {
                t->esc = true;
            } else if (c == '"') {
                t->in_str = false;
                ts_str_flush(p, true);
                if (t->ph == TS_ARGS)
                    ts_put(p, "\"", 1);
                return;
            }
            pb_add(p, &t->str, &c, 1);
            return;
        }
        if (t->tok.n && is_tokc(c)) {
            pb_add(p, &t->tok, &c, 1);
            return;
        }
        if (t->tok.n) {
            ts_tok_flush(p);
            if (t->ph != TS_ARGS)
                return;
        }
        if (is_ws(c))
            return;
        if (c == '"') {
            t->in_str = true;
            t->str.n = 0;
            ts_put(p, "\"", 1);
        } else if (c == '{' || c == '[') {
            t->depth++;
            ts_put(p, &c, 1);
        } else if (c == '}' || c == ']') {
            ts_put(p, &c, 1);
            if (--t->depth == 0) {
                t->args_done = true;
                t->ph = TS_AFTER;
            }
        } else if (c == ',') {
            ts_put(p, ", ", 2);
        } else if (c == ':') {
            ts_put(p, ": ", 2);
        } else if (is_tokc(c)) {
            pb_add(p, &t->tok, &c, 1);
        } else {
            t->ph = TS_OFF;
        }
        return;
    case TS_OFF:
        return;
    }
}

/* The argument text this feed produced, as one TOOL_DELTA (the first of a
 * call carries its name). */
static void ts_emit(struct chat_parser *p)
{
    struct tscan *t = &p->ts;
    if (!t->out.n || p->oom)
        return;
    struct ev_rec *r = new_rec(p);
    if (!r)
        return;
    r->type = CHAT_EVENT_TOOL_DELTA;
    if (!t->started)
        r->name = arena_str(p, t->name, strlen(t->name));
    r->arguments = arena_str(p, t->out.p, t->out.n);
    r->text = r->arguments;
    r->len = t->out.n;
    t->started = true;
    t->out.n = 0;
}

/* Bytes of the open block's JSON body. */
static void tool_body(struct chat_parser *p, const char *s, size_t n)
{
    pb_add(p, &p->tool, s, n);
    for (size_t i = 0; i < n && p->ts.ph != TS_OFF; i++)
        ts_byte(p, s[i]);
    if (p->ts.ph == TS_ARGS && p->ts.in_str)
        ts_str_flush(p, false);
    ts_emit(p);
}

/* An object (with up to 256 members, as chat_json_dumps folds them)
 * anywhere in v repeats a key. */
static bool repeats_key(const cJSON *v, int depth)
{
    if (!v || depth > 512)
        return false;
    bool obj = cJSON_IsObject(v);
    if (obj && cJSON_GetArraySize(v) <= 256)
        for (const cJSON *c = v->child; c; c = c->next)
            for (const cJSON *e = c->next; e; e = e->next)
                if (c->string && e->string && !strcmp(c->string, e->string))
                    return true;
    if (obj || cJSON_IsArray(v))
        for (const cJSON *c = v->child; c; c = c->next)
            if (repeats_key(c, depth + 1))
                return true;
    return false;
}

static void finish_tool(struct chat_parser *p)
{
    /* p->tool holds "<tool_call>...</tool_call>" */
    size_t ol = sizeof TAG_TOOL - 1, cl = sizeof TAG_END_TOOL - 1;
    const char *raw = p->tool.p;
    size_t raw_n = p->tool.n;
    const char *body = raw + ol;
    size_t body_n = raw_n >= ol + cl ? raw_n - ol - cl : 0;
    const char *error = NULL;
    cJSON *j = chat_json_parse(body, body_n, NULL);
    const cJSON *name = NULL, *args = NULL;
    if (!j)
        error = "the tool call is not valid JSON";
    else if (!cJSON_IsObject(j))
        error = "the tool call is not a JSON object";
    else if (!cJSON_IsString(name = cJSON_GetObjectItemCaseSensitive(j, "name")) || !*name->valuestring)
        error = "the tool call has no \"name\" string";
    else {
        args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
        if (!args)
            args = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    }
    char *fa = NULL; /* the final arguments, malloc'd */
    size_t fa_n = 0;
    if (!error) {
        if (!args || cJSON_IsNull(args)) {
            fa = strdup("{}");
            fa_n = 2;
        } else if (cJSON_IsString(args)) {
            fa_n = strlen(args->valuestring);
            fa = strdup(args->valuestring);
        } else {
            fa = chat_json_dumps(args, &fa_n, NULL);
        }
        if (!fa)
            p->oom = true;
    }
    struct tscan *t = &p->ts;
    if (fa && t->started) {
        /* The fragments must add up to the arguments. They are the same
         * text but where dumps is not piecewise (a repeated key keeps the
         * last value), and then the streamed text, valid JSON, is the
         * answer. Otherwise what was sent is a prefix (the scan stopped
         * early): the rest is one more fragment. */
        cJSON *sj = t->args_done ? chat_json_parse(t->sent.p, t->sent.n, NULL) : NULL;
        if (sj && (fa_n != t->sent.n || memcmp(fa, t->sent.p, fa_n))) {
            char *c = malloc(t->sent.n + 1);
            if (c) {
                memcpy(c, t->sent.p, t->sent.n);
                c[t->sent.n] = 0;
                free(fa);
                fa = c;
                fa_n = t->sent.n;
            }
        } else if (!sj && !repeats_key(args, 0) && fa_n >= t->sent.n &&
                   !memcmp(fa, t->sent.p, t->sent.n)) {
            pb_add(p, &t->out, fa + t->sent.n, fa_n - t->sent.n);
            ts_emit(p);
        } else if (!sj) {
            /* The scan stopped at something cJSON reads its own way (a
             * NUL or a bad escape in a string) and the arguments repeat a
             * key, which dumps folds: what was sent need not be a prefix,
             * and whether it is would depend on the split. No call rather
             * than one whose fragments disagree with it. */
            error = "the tool call's arguments repeat a key and hold a string that cannot be "
                    "streamed (a NUL or a bad escape)";
            free(fa);
            fa = NULL;
        }
        cJSON_Delete(sj);
    }
    struct ev_rec *r = new_rec(p);
    if (r) {
        r->text = arena_str(p, raw, raw_n);
        r->len = raw_n;
        r->streamed = t->started;
        if (error) {
            r->type = CHAT_EVENT_TOOL_ERROR;
            r->error = error;
        } else {
            r->type = CHAT_EVENT_TOOL_CALL;
            r->name = arena_str(p, name->valuestring, strlen(name->valuestring));
            if (fa)
                r->arguments = arena_str(p, fa, fa_n);
        }
    }
    free(fa);
    cJSON_Delete(j);
    p->tool.n = 0;
    ts_reset(p);
}

/* Consumes as much of pend as the current state can decide. */
static void run(struct chat_parser *p)
{
    for (;;) {
        char *s = p->pend.p;
        size_t n = p->pend.n;
        if (n == 0 || p->oom)
            return;
        size_t used;
        if (p->st == ST_START) {
            size_t tl = sizeof TAG_THINK - 1;
            if (n < tl && !memcmp(s, TAG_THINK, n))
                return; /* could still be <think> */
            if (n >= tl && !memcmp(s, TAG_THINK, tl)) {
                p->st = ST_REASONING;
                p->skip_nl = true;
                used = tl;
            } else {
                p->st = ST_CONTENT;
                used = 0;
            }
        } else if (p->st == ST_REASONING || (p->st == ST_CONTENT && !p->o.no_tools)) {
            const char *tag = p->st == ST_REASONING ? TAG_END_THINK : TAG_TOOL;
            const char *at = find_tag(s, n, tag);
            if (!at) {
                size_t keep = partial_tag(s, n, tag);
                emit_text(p, s, n - keep);
                memmove(s, s + n - keep, keep);
                p->pend.n = keep;
                return;
            }
            emit_text(p, s, (size_t)(at - s));
            p->held_nl = 0; /* newlines before a tag are formatting */
            used = (size_t)(at - s) + strlen(tag);
            if (p->st == ST_REASONING) {
                p->st = ST_CONTENT;
                p->skip_nl = true;
            } else {
                p->st = ST_TOOL;
                p->skip_nl = false;
                pb_add(p, &p->tool, TAG_TOOL, sizeof TAG_TOOL - 1);
                ts_reset(p);
            }
        } else if (p->st == ST_CONTENT) { /* no_tools: nothing to look for */
            emit_text(p, s, n);
            used = n;
        } else { /* ST_TOOL */
            const char *at = find_tag(s, n, TAG_END_TOOL);
            if (!at) {
                size_t keep = partial_tag(s, n, TAG_END_TOOL);
                tool_body(p, s, n - keep);
                memmove(s, s + n - keep, keep);
                p->pend.n = keep;
                return;
            }
            used = (size_t)(at - s) + sizeof TAG_END_TOOL - 1;
            tool_body(p, s, (size_t)(at - s));
            pb_add(p, &p->tool, at, sizeof TAG_END_TOOL - 1);
            finish_tool(p);
            p->st = ST_CONTENT;
            p->skip_nl = true;
        }
        memmove(s, s + used, n - used);
        p->pend.n = n - used;
    }
}

static int deliver(struct chat_parser *p, const struct chat_event **events, size_t *n_events,
                   struct rl_err *err)
{
    if (p->oom) {
        *events = NULL;
        *n_events = 0;
        return rl_errf(err, RL_ENOMEM, "chat parser: out of memory");
    }
    for (size_t i = 0; i < p->n_ev; i++) {
        const struct ev_rec *r = &p->recs[i];
        p->evs[i] = (struct chat_event){
            .type = r->type,
            .text = p->arena.p + r->text,
            .len = r->len,
            .name = r->name == SIZE_MAX ? NULL : p->arena.p + r->name,
            .arguments = r->arguments == SIZE_MAX ? NULL : p->arena.p + r->arguments,
            .error = r->error,
            .streamed = r->streamed,
        };
    }
    *events = p->evs;
    *n_events = p->n_ev;
    return 0;
}

int chat_parser_create(struct chat_parser **out, const struct chat_parser_opts *o,
                       struct rl_err *err)
{
    struct chat_parser *p = calloc(1, sizeof *p);
    if (!p)
        return rl_errf(err, RL_ENOMEM, "chat parser: out of memory");
    if (o)
        p->o = *o;
    p->st = p->o.think_open ? ST_REASONING : ST_START;
    p->skip_nl = p->o.think_open;
    *out = p;
    return 0;
}

int chat_parser_feed(struct chat_parser *p, const char *text, size_t len,
                     const struct chat_event **events, size_t *n_events, struct rl_err *err)
{
    p->n_ev = 0;
    p->arena.n = 0;
    pb_add(p, &p->pend, text, len);
    run(p);
    return deliver(p, events, n_events, err);
}

int chat_parser_finish(struct chat_parser *p, const struct chat_event **events,
                       size_t *n_events, struct rl_err *err)
{
    p->n_ev = 0;
    p->arena.n = 0;
    run(p);
    if (p->st == ST_START && p->pend.n) /* a lone "<thi": it was content */
        p->st = ST_CONTENT;
    if (p->st == ST_TOOL) {
        pb_add(p, &p->tool, p->pend.p, p->pend.n);
        struct ev_rec *r = new_rec(p);
        if (r) {
            r->type = CHAT_EVENT_TOOL_ERROR;
            r->text = arena_str(p, p->tool.p ? p->tool.p : "", p->tool.n);
            r->len = p->tool.n;
            r->error = "the tool call is not terminated by </tool_call>";
            r->streamed = p->ts.started;
        }
    } else {
        emit_text(p, p->pend.p ? p->pend.p : "", p->pend.n);
        flush_held(p);
    }
    int rc = deliver(p, events, n_events, err);
    /* ready for the next output */
    p->pend.n = 0;
    p->tool.n = 0;
    p->held_nl = 0;
    ts_reset(p);
    p->st = p->o.think_open ? ST_REASONING : ST_START;
    p->skip_nl = p->o.think_open;
    p->oom = false;
    return rc;
}

void chat_parser_free(struct chat_parser *p)
{
    if (!p)
        return;
    free(p->pend.p);
    free(p->tool.p);
    ts_reset(p);
    free(p->ts.key.p);
    free(p->ts.val.p);
    free(p->ts.str.p);
    free(p->ts.tok.p);
    free(p->ts.sent.p);
    free(p->ts.out.p);
    free(p->arena.p);
    free(p->recs);
    free(p->evs);
    free(p);
}
