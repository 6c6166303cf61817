/* dispatcher/anthropic.c - Anthropic's Messages API <-> redlm jobs and
 * events (anthropic.h).
 *
 * The request becomes the Chat Completions body it means, so openai.c
 * checks every field once and the job is the one job_parse accepts:
 * system -> a system message; text blocks -> text parts; an assistant's
 * tool_use blocks -> its tool_calls (input as the arguments' JSON), its
 * thinking -> reasoning_content; a user's tool_result blocks -> tool
 * messages, before the user's text as the API orders them; a last
 * assistant message -> a prefill the model continues
 * (continue_final_message; not with a forced tool or format); thinking
 * enabled / adaptive / disabled -> redlm's think / no_think mode and
 * budget_tokens -> the thinking budget. Without `thinking` the request is
 * routed as any request without a mode (the dispatcher's ratios decide)
 * and its thinking, if any, comes back as thinking blocks. cache_control
 * changes nothing: every prompt's prefix is cached (redlm's prefix cache),
 * and cache_read_input_tokens says how much was.
 *
 * Usage follows Anthropic's sums: input_tokens are the prompt tokens the
 * cache did not supply, cache_read_input_tokens those it did. */
#include "anthropic.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compat.h"
#include "job.h"
#include "text.h"

static const char T_INVALID[] = "invalid_request_error";

static int bad(struct oai_error *e, const char *code, const char *param, const char *msg)
{
    oai_error_set(e, 400, T_INVALID, code, param, "%s: %s", param, msg);
    return -RL_EINVAL;
}

static cJSON *text_part(const char *s)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "text");
    cJSON_AddStringToObject(p, "text", s);
    return p;
}

/* Why a block type is refused, or NULL when it is not one we know. */
static const char *refusal(const char *type)
{
    static const char *const media[] = {"image", "document", "search_result",
                                        "container_upload"};
    for (size_t i = 0; i < sizeof media / sizeof media[0]; i++)
        if (!strcmp(type, media[i]))
            return "is not supported: the model reads text";
    if (strstr(type, "tool_use") || strstr(type, "tool_result"))
        return "is a server tool's block: redlm runs no server tools";
    return NULL;
}

static int bad_block(struct oai_error *e, const char *p, const char *type, const char *where)
{
    char msg[160];
    const char *why = refusal(type);
    snprintf(msg, sizeof msg, "\"%.40s\" %s", type, why ? why : where);
    return bad(e, "BAD_VALUE", p, msg);
}

/* A string or an array of text blocks (system, a tool_result's content) as
 * the chat content: the string, or text parts. */
static int text_content(const cJSON *c, const char *param, cJSON **out, struct oai_error *e)
{
    if (!c || cJSON_IsNull(c))
        return (*out = cJSON_CreateString("")) ? 0 : -RL_ENOMEM;
    if (cJSON_IsString(c))
        return (*out = cJSON_CreateString(c->valuestring)) ? 0 : -RL_ENOMEM;
    if (!cJSON_IsArray(c))
        return bad(e, "BAD_TYPE", param, "must be a string or an array of text blocks");
    cJSON *parts = cJSON_CreateArray();
    int j = 0;
    for (const cJSON *b = c->child; b; b = b->next, j++) {
        char p[JOB_FIELD_MAX];
        snprintf(p, sizeof p, "%.60s[%d].type", param, j);
        const char *t = oai_str_member(b, "type");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(b, "text");
        if (!t || strcmp(t, "text") || !cJSON_IsString(x)) {
            cJSON_Delete(parts);
            return t ? bad_block(e, p, t, "is not a text block")
                     : bad(e, "BAD_TYPE", p, "must be \"text\" (with a text string)");
        }
        cJSON_AddItemToArray(parts, text_part(x->valuestring));
    }
    *out = parts;
    return 0;
}

/* is_error: the model is told the tool failed the way a chat template can
 * say it, in the result's text ("Error: " first), since Qwen3's tool
 * turn has no field for it. */
static int mark_error(bool is_error, cJSON **content)
{
    if (!is_error)
        return 0;
    if (cJSON_IsString(*content)) {
        size_t n = strlen((*content)->valuestring);
        char *s = malloc(n + 8);
        cJSON *v = NULL;
        if (s) {
            memcpy(s, "Error: ", 7);
            memcpy(s + 7, (*content)->valuestring, n + 1);
            v = cJSON_CreateString(s);
            free(s);
        }
        if (!v)
            return -RL_ENOMEM;
        cJSON_Delete(*content);
        *content = v;
        return 0;
    }
    cJSON *first = text_part("Error: ");
    if (!first)
        return -RL_ENOMEM;
    return cJSON_InsertItemInArray(*content, 0, first) ? 0 : -RL_ENOMEM;
}

static cJSON *chat_message(const char *role, cJSON *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddItemToObject(m, "content", content ? content : cJSON_CreateString(""));
    return m;
}

/* A message's blocks. A user's: text, and tool_result blocks as tool
 * messages, which come before the user's text as the API orders them. An
 * assistant's: text, thinking (its reasoning_content, which the template
 * keeps only where Qwen3 keeps it) and tool_use (its tool calls). */
static int blocks_of(bool user, const cJSON *c, const char *mp, cJSON *msgs, struct oai_error *e)
{
    cJSON *parts = cJSON_CreateArray(), *calls = cJSON_CreateArray();
    struct text reasoning = {0};
    int j = 0, rc = 0;
    for (const cJSON *b = c->child; b && !rc; b = b->next, j++) {
        char p[JOB_FIELD_MAX];
        snprintf(p, sizeof p, "%.60s.content[%d].type", mp, j);
        const char *t = oai_str_member(b, "type");
        if (!t) {
            rc = bad(e, "BAD_TYPE", p, "must be a block type");
        } else if (!strcmp(t, "text")) {
            const char *x = oai_str_member(b, "text");
            snprintf(p, sizeof p, "%.60s.content[%d].text", mp, j);
            if (!x)
                rc = bad(e, "BAD_TYPE", p, "must be a string");
            else
                cJSON_AddItemToArray(parts, text_part(x));
        } else if (user && !strcmp(t, "tool_result")) {
            const char *id = oai_str_member(b, "tool_use_id");
            const cJSON *err = cJSON_GetObjectItemCaseSensitive(b, "is_error");
            cJSON *content = NULL;
            snprintf(p, sizeof p, "%.60s.content[%d].content", mp, j);
            if (!id) {
                snprintf(p, sizeof p, "%.60s.content[%d].tool_use_id", mp, j);
                rc = bad(e, "MISSING_FIELD", p, "required (a string)");
            } else if (err && !cJSON_IsBool(err) && !cJSON_IsNull(err)) {
                snprintf(p, sizeof p, "%.60s.content[%d].is_error", mp, j);
                rc = bad(e, "BAD_TYPE", p, "must be a boolean");
            } else if (!(rc = text_content(cJSON_GetObjectItemCaseSensitive(b, "content"), p,
                                           &content, e))) {
                if ((rc = mark_error(cJSON_IsTrue(err), &content))) {
                    cJSON_Delete(content);
                } else {
                    cJSON *m = chat_message("tool", content);
                    cJSON_AddStringToObject(m, "tool_call_id", id);
                    cJSON_AddItemToArray(msgs, m);
                }
            }
        } else if (!user && !strcmp(t, "thinking")) {
            const char *x = oai_str_member(b, "thinking");
            if (x && text_add(&reasoning, x, strlen(x)))
                rc = -RL_ENOMEM;
        } else if (!user && !strcmp(t, "redacted_thinking")) {
            /* another model's encrypted thinking: nothing Qwen3 can read */
        } else if (!user && !strcmp(t, "tool_use")) {
            const char *id = oai_str_member(b, "id"), *name = oai_str_member(b, "name");
            const cJSON *input = cJSON_GetObjectItemCaseSensitive(b, "input");
            snprintf(p, sizeof p, "%.60s.content[%d]", mp, j);
            char *args = cJSON_IsObject(input) ? cJSON_PrintUnformatted(input) : NULL;
            if (!id || !name || !cJSON_IsObject(input)) {
                rc = bad(e, "BAD_TYPE", p, "a tool_use block needs an id, a name and an input "
                                           "object");
            } else if (!args) {
                rc = -RL_ENOMEM;
            } else {
                cJSON *call = cJSON_CreateObject();
                cJSON_AddStringToObject(call, "id", id);
                cJSON_AddStringToObject(call, "type", "function");
                cJSON *f = cJSON_AddObjectToObject(call, "function");
                cJSON_AddStringToObject(f, "name", name);
                cJSON_AddStringToObject(f, "arguments", args);
                cJSON_AddItemToArray(calls, call);
            }
            free(args);
        } else {
            rc = bad_block(e, p, t,
                           user ? "is not a block a user message carries (text, tool_result)"
                                : "is not a block an assistant message carries (text, thinking, "
                                  "tool_use)");
        }
    }
    if (!rc && (!user || parts->child)) { /* a user turn of tool results alone has no text */
        cJSON *m = chat_message(user ? "user" : "assistant", parts);
        parts = NULL;
        if (reasoning.n)
            cJSON_AddStringToObject(m, "reasoning_content", reasoning.p);
        if (calls->child) {
            cJSON_AddItemToObject(m, "tool_calls", calls);
            calls = NULL;
        }
        cJSON_AddItemToArray(msgs, m);
    }
    cJSON_Delete(parts);
    cJSON_Delete(calls);
    text_free(&reasoning);
    return rc;
}

/* The messages; *prefill: the last is the assistant's, to be continued. */
static int messages_of(const cJSON *v, cJSON *msgs, bool *prefill, struct oai_error *e)
{
    if (!cJSON_IsArray(v))
        return bad(e, "BAD_TYPE", "messages", "must be an array of messages");
    int i = 0, n = cJSON_GetArraySize(v);
    if (!n)
        return bad(e, "BAD_VALUE", "messages", "holds no message");
    for (const cJSON *m = v->child; m; m = m->next, i++) {
        char mp[JOB_FIELD_MAX], p[JOB_FIELD_MAX];
        snprintf(mp, sizeof mp, "messages[%d]", i);
        if (!cJSON_IsObject(m))
            return bad(e, "BAD_TYPE", mp, "must be an object");
        const char *role = oai_str_member(m, "role");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        snprintf(p, sizeof p, "messages[%d].role", i);
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system")))
            return bad(e, "BAD_VALUE", p, "must be user, assistant or system");
        *prefill = i == n - 1 && !strcmp(role, "assistant");
        snprintf(p, sizeof p, "messages[%d].content", i);
        int rc;
        if (!strcmp(role, "system") || cJSON_IsString(c)) {
            cJSON *content = NULL;
            if ((rc = text_content(c, p, &content, e)))
                return rc;
            cJSON_AddItemToArray(msgs, chat_message(role, content));
            continue;
        }
        if (!cJSON_IsArray(c))
            return bad(e, "BAD_TYPE", p, "must be a string or an array of content blocks");
        rc = blocks_of(!strcmp(role, "user"), c, mp, msgs, e);
        if (rc)
            return rc;
    }
    return 0;
}

/* tools: custom tools ({name, description, input_schema}, type absent,
 * null or "custom") -> chat function tools. */
static int tools_of(const cJSON *v, cJSON *chat, struct oai_error *e)
{
    if (!cJSON_IsArray(v))
        return bad(e, "BAD_TYPE", "tools", "must be an array");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    int i = 0;
    for (const cJSON *t = v->child; t; t = t->next, i++) {
        char p[JOB_FIELD_MAX];
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        snprintf(p, sizeof p, "tools[%d].type", i);
        if (type && !cJSON_IsNull(type) &&
            (!cJSON_IsString(type) || strcmp(type->valuestring, "custom"))) {
            char msg[256];
            snprintf(msg, sizeof msg,
                     "\"%.60s\" is a server tool Anthropic runs: redlm runs none (give the tool "
                     "as {name, description, input_schema} and run it yourself)",
                     cJSON_IsString(type) ? type->valuestring : "?");
            return bad(e, "BAD_VALUE", p, msg);
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
        snprintf(p, sizeof p, "tools[%d]", i);
        if (!cJSON_IsString(name) || !cJSON_IsObject(schema))
            return bad(e, "BAD_TYPE", p, "a tool needs a name and an input_schema object");
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(t, "description");
        if (cJSON_IsString(d))
            cJSON_AddStringToObject(f, "description", d->valuestring);
        cJSON_AddItemToObject(f, "parameters", cJSON_Duplicate(schema, 1));
        const cJSON *strict = cJSON_GetObjectItemCaseSensitive(t, "strict");
        if (cJSON_IsBool(strict))
            cJSON_AddBoolToObject(f, "strict", cJSON_IsTrue(strict));
        cJSON_AddItemToArray(out, c);
    }
    return 0;
}

/* tool_choice {type: auto | any | tool (name) | none} -> chat's. */
static int tool_choice_of(const cJSON *v, cJSON *chat, struct oai_error *e)
{
    const char *t = oai_str_member(v, "type");
    if (!cJSON_IsObject(v) || !t)
        return bad(e, "BAD_TYPE", "tool_choice", "must be an object with a type");
    if (!strcmp(t, "auto") || !strcmp(t, "none")) {
        cJSON_AddStringToObject(chat, "tool_choice", t);
    } else if (!strcmp(t, "any")) {
        cJSON_AddStringToObject(chat, "tool_choice", "required");
    } else if (!strcmp(t, "tool")) {
        const char *name = oai_str_member(v, "name");
        if (!name)
            return bad(e, "MISSING_FIELD", "tool_choice.name", "required with type tool");
        cJSON *c = cJSON_AddObjectToObject(chat, "tool_choice");
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name);
    } else {
        return bad(e, "BAD_VALUE", "tool_choice.type", "must be auto, any, tool or none");
    }
    return 0;
}

/* thinking -> mode and the thinking budget. */
static int thinking_of(const cJSON *v, cJSON *chat, bool *omit, struct oai_error *e)
{
    const char *t = oai_str_member(v, "type");
    if (!cJSON_IsObject(v) || !t)
        return bad(e, "BAD_TYPE", "thinking", "must be an object with a type");
    if (!strcmp(t, "disabled")) {
        cJSON_AddStringToObject(chat, "mode", "no_think");
        return 0;
    }
    if (strcmp(t, "enabled") && strcmp(t, "adaptive") && strcmp(t, "between_tools"))
        return bad(e, "BAD_VALUE", "thinking.type", "must be enabled, adaptive or disabled");
    cJSON_AddStringToObject(chat, "mode", "think");
    const cJSON *budget = cJSON_GetObjectItemCaseSensitive(v, "budget_tokens");
    if (budget && !cJSON_IsNull(budget)) {
        if (!oai_is_integer(budget) || budget->valuedouble < 1)
            return bad(e, "BAD_VALUE", "thinking.budget_tokens", "must be a positive integer");
        cJSON_AddItemToObject(chat, "max_thinking_tokens", cJSON_Duplicate(budget, 1));
    } else if (!strcmp(t, "enabled")) {
        return bad(e, "MISSING_FIELD", "thinking.budget_tokens", "required with type enabled");
    }
    const char *display = oai_str_member(v, "display");
    *omit = display && !strcmp(display, "omitted");
    return 0;
}

/* output_config.format / output_format {type: json_schema, schema} ->
 * response_format json_schema. */
static int format_of(const cJSON *f, const char *param, cJSON *chat, struct oai_error *e)
{
    if (!f || cJSON_IsNull(f))
        return 0;
    const char *t = oai_str_member(f, "type");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(f, "schema");
    if (!t || strcmp(t, "json_schema") || !cJSON_IsObject(schema))
        return bad(e, "BAD_VALUE", param, "must be {\"type\": \"json_schema\", \"schema\": {...}}");
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    cJSON_AddStringToObject(js, "name", "output");
    cJSON_AddItemToObject(js, "schema", cJSON_Duplicate(schema, 1));
    cJSON_AddBoolToObject(js, "strict", 1);
    return 0;
}

/* The members mapped here; the others pass on to the chat body. */
enum member {
    M_MESSAGES, M_SYSTEM, M_MAX_TOKENS, M_STOP, M_STREAM, M_TOOLS, M_TOOL_CHOICE, M_THINKING,
    M_OUTPUT_CONFIG, M_OUTPUT_FORMAT, M_MCP, M_DROPPED, M_CHAT,
};
static const struct oai_member members[] = {
    {"messages", M_MESSAGES, 1},           {"system", M_SYSTEM, 1},
    {"max_tokens", M_MAX_TOKENS, 1},       {"stop_sequences", M_STOP, 1},
    {"stream", M_STREAM, 1},               {"tools", M_TOOLS, 1},
    {"tool_choice", M_TOOL_CHOICE, 1},     {"thinking", M_THINKING, 1},
    {"output_config", M_OUTPUT_CONFIG, 1}, {"output_format", M_OUTPUT_FORMAT, 1},
    {"mcp_servers", M_MCP, 1},
    /* change nothing here: where a request runs and how it is billed,
     * beta switches, Anthropic's own prompt caching (redlm caches every
     * prefix) */
    {"metadata", M_DROPPED, 1},            {"service_tier", M_DROPPED, 1},
    {"container", M_DROPPED, 1},           {"context_management", M_DROPPED, 1},
    {"inference_geo", M_DROPPED, 1},       {"speed", M_DROPPED, 1},
    {"diagnostics", M_DROPPED, 1},         {"user_profile_id", M_DROPPED, 1},
    {"workspace_id", M_DROPPED, 1},        {"cache_control", M_DROPPED, 1},
    {"betas", M_DROPPED, 1},
    /* model, temperature, top_p, top_k, and redlm's and vLLM's extensions:
     * as openai.c takes them (its policy on unknown members applies) */
    {NULL, M_CHAT, 1},
};

struct walk {
    enum ant_body kind;
    cJSON *chat, *msgs, *system;
    bool prefill, *omit_thinking;
    struct oai_error *e;
};

static int take_member(void *ctx, int m, const char *k, const cJSON *v)
{
    struct walk *w = ctx;
    struct oai_error *e = w->e;
    switch ((enum member)m) {
    case M_MESSAGES:
        return messages_of(v, w->msgs, &w->prefill, e);
    case M_SYSTEM:
        return text_content(v, "system", &w->system, e);
    case M_MAX_TOKENS:
    case M_STREAM:
        if (w->kind == ANT_MESSAGES) /* count_tokens: nothing is generated */
            cJSON_AddItemToObject(w->chat, k, cJSON_Duplicate(v, 1));
        return 0;
    case M_STOP:
        if (!cJSON_IsArray(v)) /* chat's stop also takes one string */
            return bad(e, "BAD_TYPE", k, "must be an array of strings");
        cJSON_AddItemToObject(w->chat, "stop", cJSON_Duplicate(v, 1));
        return 0;
    case M_TOOLS:
        return tools_of(v, w->chat, e);
    case M_TOOL_CHOICE:
        return tool_choice_of(v, w->chat, e);
    case M_THINKING:
        return thinking_of(v, w->chat, w->omit_thinking, e);
    case M_OUTPUT_CONFIG: /* effort has no Qwen3 meaning beside the thinking switch */
        return cJSON_IsObject(v) ? format_of(cJSON_GetObjectItemCaseSensitive(v, "format"),
                                             "output_config.format", w->chat, e)
                                 : bad(e, "BAD_TYPE", k, "must be an object");
    case M_OUTPUT_FORMAT: /* its name in the beta */
        return format_of(v, k, w->chat, e);
    case M_MCP:
        return cJSON_IsArray(v) && !v->child
                   ? 0 : bad(e, "BAD_VALUE", k, "redlm connects to no MCP servers");
    case M_DROPPED:
        return 0;
    case M_CHAT:
        cJSON_AddItemToObject(w->chat, k, cJSON_Duplicate(v, 1));
        return 0;
    }
    abort(); /* a member with no case: a broken table */
}

int ant_to_chat(const cJSON *root, enum ant_body kind, cJSON *chat, bool *omit_thinking,
                struct oai_error *e)
{
    *omit_thinking = false;
    struct walk w = {kind, chat, cJSON_CreateArray(), NULL, false, omit_thinking, e};
    cJSON *msgs = w.msgs;
    /* each mapped member at most once (DUPLICATE_FIELD); a catch-all takes
     * the rest, so no lim or request is needed for unknown members */
    int rc = oai_walk_members(root, members, (int)(sizeof members / sizeof members[0]), 1, NULL,
                              NULL, e, take_member, &w);
    cJSON *system = w.system;
    bool prefill = w.prefill;
    if (!rc && kind == ANT_MESSAGES && !cJSON_GetObjectItemCaseSensitive(root, "max_tokens"))
        rc = bad(e, "MISSING_FIELD", "max_tokens", "required");
    if (!rc && !cJSON_GetObjectItemCaseSensitive(root, "messages"))
        rc = bad(e, "MISSING_FIELD", "messages", "required");
    if (!rc && system && !(cJSON_IsString(system) && !system->valuestring[0])) {
        cJSON_InsertItemInArray(msgs, 0, chat_message("system", system));
        system = NULL;
    }
    cJSON_Delete(system);
    cJSON_AddItemToObject(chat, "messages", msgs);
    /* a last assistant turn is a prefill: the model writes on from it, but
     * not inside a forced tool call or output format, whose document would
     * begin again after it */
    if (!rc && prefill) {
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(chat, "tool_choice");
        bool forced = cJSON_IsObject(tc) || (cJSON_IsString(tc) && !strcmp(tc->valuestring,
                                                                           "required"));
        if (forced || cJSON_GetObjectItemCaseSensitive(chat, "response_format"))
            rc = bad(e, "BAD_VALUE", "messages",
                     "a last assistant message (a prefill) cannot be continued with tool_choice "
                     "any or tool, or output_config.format");
        else
            cJSON_AddTrueToObject(chat, "continue_final_message");
    }
    return rc;
}

/* ---- responses ---- */

enum block { B_NONE = 0, B_THINKING, B_TEXT, B_TOOL };

struct ant_resp {
    bool stream, omit_thinking, ended;
    char id[JOB_ID_MAX + 1];
    char *model;
    cJSON *content;             /* the blocks closed so far */
    enum block open;
    struct text cur;            /* the open block's text (B_TOOL: its input's JSON) */
    char call_id[JOB_ID_MAX + 32];
    char call_name[256];
    int call_index;             /* B_TOOL: its index in done's tool_calls */
    struct oai_tc_stream tc;    /* stream: the tool calls sent in fragments */
    const char *stop_reason;
    char *stop_sequence;        /* stop_reason stop_sequence: the string; owned */
    int64_t prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens;
};

struct ant_resp *ant_resp_create(const char *id, const char *model, bool stream,
                                 bool omit_thinking)
{
    struct ant_resp *r = calloc(1, sizeof *r);
    if (!r || !(r->model = strdup(model ? model : "")) || !(r->content = cJSON_CreateArray())) {
        ant_resp_free(r);
        return NULL;
    }
    snprintf(r->id, sizeof r->id, "%s", id);
    r->stream = stream;
    r->omit_thinking = omit_thinking;
    return r;
}

void ant_resp_free(struct ant_resp *r)
{
    if (!r)
        return;
    free(r->model);
    free(r->stop_sequence);
    cJSON_Delete(r->content);
    text_free(&r->cur);
    oai_tc_free(&r->tc);
    free(r);
}

/* c (freed) as one SSE event named by its type. */
static int sse(cJSON *c, struct text *out)
{
    const char *type = oai_str_member(c, "type");
    char *s = type ? cJSON_PrintUnformatted(c) : NULL;
    int rc = 0;
    if (!s)
        rc = -RL_ENOMEM;
    else
        text_printf(out, "event: %s\ndata: %s\n\n", type, s);
    if (!rc && out->oom)
        rc = -RL_ENOMEM;
    free(s);
    cJSON_Delete(c);
    return rc;
}

static cJSON *event(const char *type)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "type", type);
    return c;
}

/* An event about the open block: its index is the count of closed ones. */
static cJSON *block_event(const struct ant_resp *r, const char *type)
{
    cJSON *c = event(type);
    cJSON_AddNumberToObject(c, "index", cJSON_GetArraySize(r->content));
    return c;
}

static cJSON *usage(const struct ant_resp *r)
{
    cJSON *u = cJSON_CreateObject();
    int64_t cached = r->cached_tokens < r->prompt_tokens ? r->cached_tokens : r->prompt_tokens;
    cJSON_AddNumberToObject(u, "input_tokens", (double)(r->prompt_tokens - cached));
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", (double)cached);
    cJSON_AddNumberToObject(u, "output_tokens", (double)r->completion_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"),
                            "thinking_tokens", (double)r->reasoning_tokens);
    return u;
}

static cJSON *message(const struct ant_resp *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON_AddItemToObject(o, "content",
                          r->ended ? cJSON_Duplicate(r->content, 1) : cJSON_CreateArray());
    if (r->ended)
        cJSON_AddStringToObject(o, "stop_reason", r->stop_reason);
    else
        cJSON_AddNullToObject(o, "stop_reason");
    if (r->stop_sequence)
        cJSON_AddStringToObject(o, "stop_sequence", r->stop_sequence);
    else
        cJSON_AddNullToObject(o, "stop_sequence");
    cJSON_AddItemToObject(o, "usage", usage(r));
    return o;
}

/* The open block as the content array holds it. */
static cJSON *closed_block(const struct ant_resp *r)
{
    cJSON *b = cJSON_CreateObject();
    const char *s = r->cur.p ? r->cur.p : "";
    if (r->open == B_THINKING) {
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", s);
        cJSON_AddStringToObject(b, "signature", "");
    } else if (r->open == B_TEXT) {
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", s);
        cJSON_AddNullToObject(b, "citations");
    } else {
        cJSON_AddStringToObject(b, "type", "tool_use");
        cJSON_AddStringToObject(b, "id", r->call_id);
        cJSON_AddStringToObject(b, "name", r->call_name);
        cJSON *input = cJSON_Parse(s);
        if (!cJSON_IsObject(input)) { /* a worker's arguments are a JSON object */
            cJSON_Delete(input);
            input = cJSON_CreateObject();
        }
        cJSON_AddItemToObject(b, "input", input);
    }
    return b;
}

static int close_block(struct ant_resp *r, struct text *out)
{
    if (r->open == B_NONE)
        return 0;
    cJSON *b = closed_block(r);
    int rc = b ? 0 : -RL_ENOMEM;
    if (!rc && r->stream)
        rc = sse(block_event(r, "content_block_stop"), out);
    cJSON_AddItemToArray(r->content, b);
    r->open = B_NONE;
    text_clear(&r->cur);
    return rc;
}

/* Opens a block of kind k (B_TOOL: call_id and call_name set). */
static int open_block(struct ant_resp *r, enum block k, struct text *out)
{
    int rc = close_block(r, out);
    r->open = k;
    if (rc || !r->stream)
        return rc;
    cJSON *c = block_event(r, "content_block_start");
    cJSON *b = cJSON_AddObjectToObject(c, "content_block");
    if (k == B_THINKING) {
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", "");
        cJSON_AddStringToObject(b, "signature", "");
    } else if (k == B_TEXT) {
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", "");
    } else {
        cJSON_AddStringToObject(b, "type", "tool_use");
        cJSON_AddStringToObject(b, "id", r->call_id);
        cJSON_AddStringToObject(b, "name", r->call_name);
        cJSON_AddObjectToObject(b, "input");
    }
    return sse(c, out);
}

/* Text of kind k (thinking or text) onto its block, and its delta. */
static int put_text(struct ant_resp *r, enum block k, const char *s, struct text *out)
{
    if (!s || !s[0])
        return 0;
    int rc = r->open == k ? 0 : open_block(r, k, out);
    if (rc || (k == B_THINKING && r->omit_thinking))
        return rc;
    if ((rc = text_add(&r->cur, s, strlen(s))) || !r->stream)
        return rc;
    cJSON *c = block_event(r, "content_block_delta");
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    cJSON_AddStringToObject(d, "type", k == B_THINKING ? "thinking_delta" : "text_delta");
    cJSON_AddStringToObject(d, k == B_THINKING ? "thinking" : "text", s);
    return sse(c, out);
}

/* A fragment of the open tool_use block's input. */
static int put_input(struct ant_resp *r, const char *frag, struct text *out)
{
    if (!frag || !frag[0])
        return 0;
    int rc = text_add(&r->cur, frag, strlen(frag));
    if (rc || !r->stream)
        return rc;
    cJSON *c = block_event(r, "content_block_delta");
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    cJSON_AddStringToObject(d, "type", "input_json_delta");
    cJSON_AddStringToObject(d, "partial_json", frag);
    return sse(c, out);
}

static int open_call(struct ant_resp *r, int i, const char *name, struct text *out)
{
    oai_tool_call_id(r->call_id, sizeof r->call_id, r->id, i);
    snprintf(r->call_name, sizeof r->call_name, "%s", name ? name : "");
    r->call_index = i;
    return open_block(r, B_TOOL, out);
}

struct tc_ctx {
    struct ant_resp *r;
    struct text *out;
};

/* Streamed: one entry of a delta's tool_calls. A call that opens closes
 * the open block and opens its tool_use block; each fragment is an
 * input_json_delta. */
static int tool_delta(void *ctx, int i, bool opens, const char *name, const char *frag)
{
    struct ant_resp *r = ((struct tc_ctx *)ctx)->r;
    struct text *out = ((struct tc_ctx *)ctx)->out;
    int rc;
    if (opens && (rc = open_call(r, i, name, out)))
        return rc;
    if (r->open != B_TOOL || r->call_index != i)
        return 0; /* its block closed already (text came between) */
    return put_input(r, frag, out);
}

static int tool_deltas(struct ant_resp *r, const cJSON *tcs, struct text *out)
{
    struct tc_ctx c = {r, out};
    return oai_tc_each(&r->tc, tcs, tool_delta, &c);
}

int ant_start(struct ant_resp *r, struct text *out)
{
    if (!r->stream)
        return 0;
    cJSON *c = event("message_start");
    cJSON_AddItemToObject(c, "message", message(r));
    return sse(c, out);
}

int ant_delta(struct ant_resp *r, const cJSON *ev, struct text *out)
{
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(ev, "delta");
    int rc = put_text(r, B_THINKING, oai_str_member(d, "reasoning_content"), out);
    if (!rc)
        rc = put_text(r, B_TEXT, oai_str_member(d, "content"), out);
    const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(d, "tool_calls");
    if (!rc && r->stream && cJSON_IsArray(tcs))
        rc = tool_deltas(r, tcs, out);
    return rc ? rc : OAI_MORE;
}

int ant_done(struct ant_resp *r, const cJSON *ev, struct text *out, struct oai_error *e)
{
    const char *fr = oai_str_member(ev, "finish_reason");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(ev, "usage");
    r->prompt_tokens = oai_int_member(u, "prompt_tokens");
    r->completion_tokens = oai_int_member(u, "completion_tokens");
    r->reasoning_tokens = oai_int_member(u, "reasoning_tokens");
    r->cached_tokens = oai_int_member(u, "cached_prompt_tokens");
    if (!fr || !strcmp(fr, "error")) {
        oai_error_set(e, 500, "server_error", "ENGINE_ERROR", NULL, "the job ended with an error");
        return OAI_FAILED;
    }
    cJSON *calls = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(ev, "tool_calls"), 1);
    int n_calls = cJSON_IsArray(calls) ? cJSON_GetArraySize(calls) : 0;
    int rc = 0;
    if (r->open == B_TOOL) { /* the last streamed call: what its fragments lacked */
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, r->call_index),
                                                          "function");
        rc = put_input(r, oai_tc_rest(&r->tc, r->call_index, oai_str_member(f, "arguments")),
                       out);
    }
    if (!rc)
        rc = close_block(r, out);
    for (int i = 0; i < n_calls && !rc; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, i),
                                                          "function");
        const char *args = oai_str_member(f, "arguments");
        if (oai_tc_rest(&r->tc, i, args ? args : "{}"))
            continue; /* streamed: its block is out already */
        rc = open_call(r, i, oai_str_member(f, "name"), out);
        if (!rc)
            rc = put_input(r, args && args[0] ? args : "{}", out);
        if (!rc)
            rc = close_block(r, out);
    }
    /* the object holds each call's input as done has it, also for a call
     * whose streamed block closed before its last fragment */
    cJSON *b;
    cJSON_ArrayForEach(b, r->content)
    {
        const char *id = oai_str_member(b, "id");
        for (int i = 0; id && i < n_calls && !rc; i++) {
            char cid[JOB_ID_MAX + 32];
            oai_tool_call_id(cid, sizeof cid, r->id, i);
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, i),
                                                              "function");
            const char *args = oai_str_member(f, "arguments");
            cJSON *input = strcmp(id, cid) || !args ? NULL : cJSON_Parse(args);
            if (cJSON_IsObject(input))
                cJSON_ReplaceItemInObjectCaseSensitive(b, "input", input);
            else
                cJSON_Delete(input);
        }
    }
    cJSON_Delete(calls);
    if (rc)
        return rc;
    /* cancelled and deadline are redlm's own, passed through as on the
     * other doors; stop_sequence when one of stop_sequences ended it */
    const char *ms = oai_str_member(ev, "matched_stop");
    r->stop_reason = !strcmp(fr, "length")      ? "max_tokens"
                     : !strcmp(fr, "cancelled") ? "cancelled"
                     : !strcmp(fr, "deadline")  ? "deadline"
                     : n_calls                  ? "tool_use"
                     : ms                       ? "stop_sequence"
                                                : "end_turn";
    if (!strcmp(r->stop_reason, "stop_sequence") && !(r->stop_sequence = strdup(ms)))
        return -RL_ENOMEM;
    r->ended = true;
    if (r->stream) {
        cJSON *c = event("message_delta");
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        cJSON_AddStringToObject(d, "stop_reason", r->stop_reason);
        if (r->stop_sequence)
            cJSON_AddStringToObject(d, "stop_sequence", r->stop_sequence);
        else
            cJSON_AddNullToObject(d, "stop_sequence");
        cJSON_AddItemToObject(c, "usage", usage(r));
        rc = sse(c, out);
        if (!rc)
            rc = sse(event("message_stop"), out);
    }
    return rc ? rc : OAI_END;
}

char *ant_body(const struct ant_resp *r)
{
    if (!r->ended)
        return NULL;
    cJSON *o = message(r);
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

int64_t ant_total_tokens(const struct ant_resp *r)
{
    return r->ended ? r->prompt_tokens + r->completion_tokens : 0;
}

static const char *error_type(const struct oai_error *e)
{
    switch (e->status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    case 504: return "timeout_error";
    default: return e->status < 500 ? "invalid_request_error" : "api_error";
    }
}

static cJSON *error_object(const struct oai_error *e)
{
    cJSON *o = event("error");
    cJSON *x = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(x, "type", error_type(e));
    cJSON_AddStringToObject(x, "message", e->message);
    return o;
}

char *ant_error_json(const struct oai_error *e)
{
    cJSON *o = error_object(e);
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

int ant_stream_error(const struct oai_error *e, struct text *out)
{
    return sse(error_object(e), out);
}

int ant_ping(struct text *out)
{
    return sse(event("ping"), out);
}

void ant_models_list(cJSON *o)
{
    cJSON *data = cJSON_GetObjectItemCaseSensitive(o, "data");
    cJSON *m;
    cJSON_ArrayForEach(m, data)
    {
        const char *id = oai_str_member(m, "id");
        char at[32];
        cpt_iso_time(oai_int_member(m, "created") * 1000, at);
        cJSON_AddStringToObject(m, "type", "model");
        cJSON_AddStringToObject(m, "display_name", id ? id : "");
        cJSON_AddStringToObject(m, "created_at", at);
    }
    cJSON_AddBoolToObject(o, "has_more", 0);
    const char *first = oai_str_member(cJSON_GetArrayItem(data, 0), "id");
    const char *last = oai_str_member(cJSON_GetArrayItem(data, cJSON_GetArraySize(data) - 1), "id");
    if (first && last) {
        cJSON_AddStringToObject(o, "first_id", first);
        cJSON_AddStringToObject(o, "last_id", last);
    } else {
        cJSON_AddNullToObject(o, "first_id");
        cJSON_AddNullToObject(o, "last_id");
    }
}

char *ant_count_body(int64_t n)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "input_tokens", (double)n);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
