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
};

struct pbuf {
    char *p;
    size_t n, cap;
};

struct chat_parser {
    struct chat_parser_opts o;
    enum state st;
    bool skip_nl;     /* drop newlines at the start of the next text */
    size_t held_nl;   /* newlines withheld at the end of emitted text */
    struct pbuf pend; /* undecided bytes */
    struct pbuf tool; /* the current <tool_call> block so far */
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
    struct ev_rec *r = new_rec(p);
    if (r) {
        r->text = arena_str(p, raw, raw_n);
        r->len = raw_n;
        if (error) {
            r->type = CHAT_EVENT_TOOL_ERROR;
            r->error = error;
        } else {
            r->type = CHAT_EVENT_TOOL_CALL;
            r->name = arena_str(p, name->valuestring, strlen(name->valuestring));
            if (!args || cJSON_IsNull(args)) {
                r->arguments = arena_str(p, "{}", 2);
            } else if (cJSON_IsString(args)) {
                r->arguments = arena_str(p, args->valuestring, strlen(args->valuestring));
            } else {
                size_t n;
                char *s = chat_json_dumps(args, &n, NULL);
                if (!s)
                    p->oom = true;
                else
                    r->arguments = arena_str(p, s, n);
                free(s);
            }
        }
    }
    cJSON_Delete(j);
    p->tool.n = 0;
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
            }
        } else if (p->st == ST_CONTENT) { /* no_tools: nothing to look for */
            emit_text(p, s, n);
            used = n;
        } else { /* ST_TOOL */
            const char *at = find_tag(s, n, TAG_END_TOOL);
            if (!at) {
                size_t keep = partial_tag(s, n, TAG_END_TOOL);
                pb_add(p, &p->tool, s, n - keep);
                memmove(s, s + n - keep, keep);
                p->pend.n = keep;
                return;
            }
            used = (size_t)(at - s) + sizeof TAG_END_TOOL - 1;
            pb_add(p, &p->tool, s, used);
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
    free(p->arena.p);
    free(p->recs);
    free(p->evs);
    free(p);
}
