/* dispatcher/compat.c - the Responses API and Ollama's API <-> redlm jobs
 * and events (compat.h).
 *
 * Requests are rewritten into the Chat Completions body they mean and
 * parsed by openai.c, so there is one definition of every field and the
 * job is the one job_parse accepts; what only these APIs have (input
 * items, instructions, text.format, reasoning.effort; Ollama's options,
 * format, think) is mapped here. Fields these APIs define that change
 * nothing about the answer (store, include, truncation; keep_alive and the
 * runner's options) are accepted and dropped.
 *
 * Responses are built by one state machine for both the stream and the
 * object: a reasoning item opens with the first reasoning text, a message
 * item with the first answer text (closing the reasoning item), function
 * calls come with done; in stream mode each step also writes its events. */
#include "compat.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "anthropic.h"
#include "event.h"

static const char T_INVALID[] = "invalid_request_error";

static int bad(struct oai_error *e, const char *code, const char *param, const char *msg)
{
    oai_error_set(e, 400, T_INVALID, code, param, "%s: %s", param, msg);
    return -RL_EINVAL;
}

void cpt_request_clear(struct cpt_request *c)
{
    free(c->echo);
    free(c->input);
    memset(c, 0, sizeof *c);
}

void cpt_iso_time(int64_t ms, char out[32])
{
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    char d[24];
    strftime(d, sizeof d, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, 32, "%s.%03dZ", d, (int)(ms % 1000));
}

/* ---- requests: the Responses API ---- */

/* The text of a content: a string, or the text parts of an array
 * (input_text, output_text, text) joined. malloc'd into *out. */
static int content_text(const cJSON *c, const char *param, char **out, struct oai_error *e)
{
    if (cJSON_IsString(c))
        return (*out = strdup(c->valuestring)) ? 0 : -RL_ENOMEM;
    if (cJSON_IsNull(c) || !c)
        return (*out = strdup("")) ? 0 : -RL_ENOMEM;
    if (!cJSON_IsArray(c))
        return bad(e, "BAD_TYPE", param, "must be a string or an array of content parts");
    struct text b = {0};
    int i = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c)
    {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(p, "text");
        bool text = cJSON_IsString(t) &&
                    (!strcmp(t->valuestring, "input_text") ||
                     !strcmp(t->valuestring, "output_text") || !strcmp(t->valuestring, "text"));
        if (!text || !cJSON_IsString(x)) {
            text_free(&b);
            char pp[JOB_FIELD_MAX];
            snprintf(pp, sizeof pp, "%.60s[%d].type", param, i);
            return bad(e, "BAD_VALUE", pp,
                       "only text parts (input_text, output_text) are supported");
        }
        if (text_add(&b, x->valuestring, strlen(x->valuestring))) {
            text_free(&b);
            return -RL_ENOMEM;
        }
        i++;
    }
    if (text_reserve(&b, 0)) /* no parts: "" */
        return -RL_ENOMEM;
    *out = b.p;
    return 0;
}

static cJSON *message(const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    if (content)
        cJSON_AddStringToObject(m, "content", content);
    else
        cJSON_AddNullToObject(m, "content");
    return m;
}

/* The chat messages that input items become. A reasoning item's text
 * waits for the assistant turn after it and becomes its reasoning_content:
 * Qwen3's template shows the thinking of the turns after the last user
 * message, so a tool loop continued from a stored response (or sent whole)
 * keeps its thinking in view. */
struct turns {
    cJSON *msgs;
    char *reasoning; /* malloc'd; NULL when none waits */
};

/* The text of a reasoning item: its content (reasoning_text parts), else
 * its summary (summary_text), as the Responses API returns either.
 * malloc'd; NULL when it has none (or out of memory). */
static char *reasoning_text(const cJSON *it)
{
    struct text b = {0};
    static const char *const lists[] = {"content", "summary"};
    for (int k = 0; k < 2 && !b.n; k++) {
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(it, lists[k]))
        {
            const char *x = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "text"));
            if (x && text_add(&b, x, strlen(x))) {
                text_free(&b);
                return NULL;
            }
        }
    }
    if (!b.n || text_reserve(&b, 0)) {
        text_free(&b);
        return NULL;
    }
    return b.p;
}

/* A new assistant message, with the reasoning that waits for it. */
static cJSON *assistant_turn(struct turns *t, const char *content)
{
    cJSON *m = message("assistant", content);
    if (t->reasoning) {
        cJSON_AddStringToObject(m, "reasoning_content", t->reasoning);
        free(t->reasoning);
        t->reasoning = NULL;
    }
    cJSON_AddItemToArray(t->msgs, m);
    return m;
}

/* One input item (where[i]: its name in errors) onto the chat messages. */
static int input_item(const cJSON *it, const char *where, int i, struct turns *t,
                      struct oai_error *e)
{
    char p[JOB_FIELD_MAX];
    snprintf(p, sizeof p, "%s[%d]", where, i);
    if (!cJSON_IsObject(it))
        return bad(e, "BAD_TYPE", p, "must be an object");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
    const char *ts = cJSON_IsString(type) ? type->valuestring : "message";
    if (!strcmp(ts, "reasoning")) {
        char *r = reasoning_text(it); /* an empty one (encrypted only) changes nothing */
        if (r) {
            free(t->reasoning);
            t->reasoning = r;
        }
        return 0;
    }
    if (!strcmp(ts, "message")) {
        static const char *const roles[] = {"user", "system", "developer", "assistant"};
        bool ok = false;
        for (int k = 0; k < 4 && cJSON_IsString(role); k++)
            ok = ok || !strcmp(role->valuestring, roles[k]);
        if (!ok) {
            snprintf(p, sizeof p, "%s[%d].role", where, i);
            return bad(e, "BAD_VALUE", p, "must be user, system, developer or assistant");
        }
        snprintf(p, sizeof p, "%s[%d].content", where, i);
        char *text = NULL;
        int rc = content_text(cJSON_GetObjectItemCaseSensitive(it, "content"), p, &text, e);
        if (rc)
            return rc;
        if (!strcmp(role->valuestring, "assistant")) {
            assistant_turn(t, text);
        } else {
            free(t->reasoning); /* thinking before a user's turn is no turn's */
            t->reasoning = NULL;
            cJSON_AddItemToArray(t->msgs, message(role->valuestring, text));
        }
        free(text);
        return 0;
    }
    if (!strcmp(ts, "function_call")) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(it, "arguments");
        const cJSON *cid = cJSON_GetObjectItemCaseSensitive(it, "call_id");
        if (!cJSON_IsString(name) || !cJSON_IsString(args))
            return bad(e, "BAD_TYPE", p, "a function_call needs name and arguments strings");
        /* consecutive calls are one assistant turn, and so are a message
         * and the calls right after it (one answer's output items) */
        cJSON *last = cJSON_GetArrayItem(t->msgs, cJSON_GetArraySize(t->msgs) - 1);
        cJSON *calls = last ? cJSON_GetObjectItemCaseSensitive(last, "tool_calls") : NULL;
        const cJSON *lr = last ? cJSON_GetObjectItemCaseSensitive(last, "role") : NULL;
        bool joins = !t->reasoning && cJSON_IsString(lr) && !strcmp(lr->valuestring, "assistant");
        if (!joins) {
            last = assistant_turn(t, NULL);
            calls = NULL;
        }
        if (!calls)
            calls = cJSON_AddArrayToObject(last, "tool_calls");
        cJSON *c = cJSON_CreateObject();
        if (cJSON_IsString(cid))
            cJSON_AddStringToObject(c, "id", cid->valuestring);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        cJSON_AddStringToObject(f, "arguments", args->valuestring);
        cJSON_AddItemToArray(calls, c);
        return 0;
    }
    if (!strcmp(ts, "function_call_output")) {
        const cJSON *cid = cJSON_GetObjectItemCaseSensitive(it, "call_id");
        snprintf(p, sizeof p, "%s[%d].output", where, i);
        char *text = NULL;
        int rc = content_text(cJSON_GetObjectItemCaseSensitive(it, "output"), p, &text, e);
        if (rc)
            return rc;
        cJSON *m = message("tool", text);
        free(text);
        if (cJSON_IsString(cid))
            cJSON_AddStringToObject(m, "tool_call_id", cid->valuestring);
        cJSON_AddItemToArray(t->msgs, m);
        return 0;
    }
    snprintf(p, sizeof p, "%s[%d].type", where, i);
    return bad(e, "BAD_VALUE", p,
               "only message, function_call, function_call_output and reasoning items are "
               "supported");
}

/* text.format -> response_format. */
static int text_format(const cJSON *text, cJSON *chat, struct oai_error *e)
{
    if (!cJSON_IsObject(text))
        return bad(e, "BAD_TYPE", "text", "must be an object");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(text, "format");
    if (!f || cJSON_IsNull(f))
        return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(f, "type");
    if (!cJSON_IsObject(f) || !cJSON_IsString(t))
        return bad(e, "BAD_TYPE", "text.format", "must be an object with a type");
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    cJSON_AddStringToObject(rf, "type", t->valuestring);
    if (!strcmp(t->valuestring, "json_schema")) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
        cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
        cJSON_AddStringToObject(js, "name", cJSON_IsString(n) ? n->valuestring : "response");
        static const char *const keep[] = {"schema", "description", "strict"};
        for (int k = 0; k < 3; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(f, keep[k]);
            if (v)
                cJSON_AddItemToObject(js, keep[k], cJSON_Duplicate(v, 1));
        }
    }
    return 0;
}

/* Responses tools ({type: function, name, description, parameters,
 * strict}) -> chat tools. */
static int tools_of(const cJSON *tools, cJSON *chat, struct oai_error *e)
{
    if (!cJSON_IsArray(tools))
        return bad(e, "BAD_TYPE", "tools", "must be an array");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        char p[JOB_FIELD_MAX];
        snprintf(p, sizeof p, "tools[%d].type", i++);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            return bad(e, "BAD_VALUE", p, "only function tools are supported");
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(c, "function");
        static const char *const keep[] = {"name", "description", "parameters", "strict"};
        for (int k = 0; k < 4; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, keep[k]);
            if (v && !cJSON_IsNull(v))
                cJSON_AddItemToObject(f, keep[k], cJSON_Duplicate(v, 1));
        }
        cJSON_AddItemToArray(out, c);
    }
    return 0;
}

/* A Responses body's conversation: its id, given as a string or as
 * {"id": string}; NULL when v is neither. */
static const char *conversation_id(const cJSON *v)
{
    return cJSON_IsObject(v) ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(v, "id"))
                             : cJSON_GetStringValue(v);
}

/* The members of a Responses body that are not chat's: mapped into chat
 * and echo, or dropped. Everything else is copied into the chat body as it
 * came (temperature, top_p, and the extensions openai.c knows). */
static int responses_members(const cJSON *root, const cJSON *prior, cJSON *chat, cJSON *echo,
                             struct cpt_request *c, struct turns *t, struct oai_error *e)
{
    const cJSON *instr = cJSON_GetObjectItemCaseSensitive(root, "instructions");
    if (cJSON_IsString(instr) && instr->valuestring[0])
        cJSON_AddItemToArray(t->msgs, message("system", instr->valuestring));
    else if (instr && !cJSON_IsNull(instr) && !cJSON_IsString(instr))
        return bad(e, "BAD_TYPE", "instructions", "must be a string");
    /* the stored conversation first: its instructions are not carried */
    const cJSON *conv = cJSON_GetObjectItemCaseSensitive(root, "conversation");
    bool in_conv = conv && !cJSON_IsNull(conv);
    if (in_conv && cJSON_GetObjectItemCaseSensitive(root, "previous_response_id") &&
        !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(root, "previous_response_id")))
        return bad(e, "BAD_VALUE", "conversation",
                   "conversation and previous_response_id cannot both be given");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, prior)
    {
        int rc = input_item(it, in_conv ? "conversation" : "previous_response_id", i++, t, e);
        if (rc)
            return rc;
    }
    for (const cJSON *v = root->child; v; v = v->next) {
        const char *k = v->string;
        int rc = 0;
        if (cJSON_IsNull(v))
            continue;
        if (!strcmp(k, "input")) {
            if (cJSON_IsString(v)) {
                free(t->reasoning);
                t->reasoning = NULL;
                cJSON_AddItemToArray(t->msgs, message("user", v->valuestring));
            } else if (cJSON_IsArray(v)) {
                i = 0;
                cJSON_ArrayForEach(it, v)
                {
                    if ((rc = input_item(it, "input", i++, t, e)))
                        return rc;
                }
            } else {
                return bad(e, "BAD_TYPE", "input", "must be a string or an array of items");
            }
        } else if (!strcmp(k, "instructions")) {
            cJSON_AddItemToObject(echo, k, cJSON_Duplicate(v, 1));
        } else if (!strcmp(k, "previous_response_id")) {
            if (!cJSON_IsString(v))
                return bad(e, "BAD_TYPE", k, "must be a string");
            if (!prior) { /* the caller found no record (or keeps none) */
                oai_error_set(e, 400, T_INVALID, "previous_response_not_found", k,
                              "Previous response with id '%.128s' not found.", v->valuestring);
                return -RL_EINVAL;
            }
            snprintf(c->previous_id, sizeof c->previous_id, "%s", v->valuestring);
            cJSON_AddItemToObject(echo, k, cJSON_Duplicate(v, 1));
        } else if (!strcmp(k, "conversation")) {
            const char *cid = conversation_id(v);
            if (!cid)
                return bad(e, "BAD_TYPE", k, "must be a conversation id or {\"id\": id}");
            if (!prior) { /* the caller found none (or keeps none) */
                oai_error_set(e, 400, T_INVALID, "not_found", k,
                              "Conversation with id '%.128s' not found.", cid);
                return -RL_EINVAL;
            }
            snprintf(c->conversation, sizeof c->conversation, "%s", cid);
            cJSON *o = cJSON_AddObjectToObject(echo, k);
            if (!o || !cJSON_AddStringToObject(o, "id", cid))
                return -RL_ENOMEM;
        } else if (!strcmp(k, "store")) {
            if (!cJSON_IsBool(v))
                return bad(e, "BAD_TYPE", k, "must be a boolean");
            c->store = cJSON_IsTrue(v);
        } else if (!strcmp(k, "background")) {
            if (!cJSON_IsBool(v))
                return bad(e, "BAD_TYPE", k, "must be a boolean");
            c->background = cJSON_IsTrue(v);
        } else if (!strcmp(k, "prompt")) {
            return bad(e, "BAD_VALUE", k, "stored prompts are not supported");
        } else if (!strcmp(k, "max_output_tokens")) {
            cJSON_AddItemToObject(chat, "max_tokens", cJSON_Duplicate(v, 1));
            cJSON_AddItemToObject(echo, k, cJSON_Duplicate(v, 1));
        } else if (!strcmp(k, "text")) {
            if ((rc = text_format(v, chat, e)))
                return rc;
            cJSON_AddItemToObject(echo, k, cJSON_Duplicate(v, 1));
        } else if (!strcmp(k, "reasoning")) {
            if (!cJSON_IsObject(v))
                return bad(e, "BAD_TYPE", k, "must be an object");
            const cJSON *ef = cJSON_GetObjectItemCaseSensitive(v, "effort");
            if (ef && !cJSON_IsNull(ef))
                cJSON_AddItemToObject(chat, "reasoning_effort", cJSON_Duplicate(ef, 1));
            cJSON_AddItemToObject(echo, k, cJSON_Duplicate(v, 1));
        } else if (!strcmp(k, "tools")) {
            if ((rc = tools_of(v, chat, e)))
                return rc;
            cJSON_AddItemToObject(echo, k, cJSON_Duplicate(v, 1));
        } else if (!strcmp(k, "tool_choice")) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(v, "name");
            if (cJSON_IsObject(v) && cJSON_IsString(name)) { /* {type: function, name} */
                cJSON *tc = cJSON_AddObjectToObject(chat, k);
                cJSON_AddStringToObject(tc, "type", "function");
                cJSON_AddStringToObject(cJSON_AddObjectToObject(tc, "function"), "name",
                                        name->valuestring);
            } else {
                cJSON_AddItemToObject(chat, k, cJSON_Duplicate(v, 1));
            }
            cJSON_AddItemToObject(echo, k, cJSON_Duplicate(v, 1));
        } else if (!strcmp(k, "include") || !strcmp(k, "truncation") ||
                   !strcmp(k, "stream_options") || !strcmp(k, "top_logprobs") ||
                   !strcmp(k, "max_tool_calls")) {
            /* change nothing here: nothing is stored, nothing to include */
        } else {
            if (!strcmp(k, "temperature") || !strcmp(k, "top_p") || !strcmp(k, "metadata") ||
                !strcmp(k, "parallel_tool_calls"))
                cJSON_AddItemToObject(echo, k, cJSON_Duplicate(v, 1));
            cJSON_AddItemToObject(chat, k, cJSON_Duplicate(v, 1));
        }
    }
    if (!cJSON_GetObjectItemCaseSensitive(root, "input"))
        return bad(e, "MISSING_FIELD", "input", "required");
    if (!t->msgs->child)
        return bad(e, "BAD_VALUE", "input", "holds no message");
    return 0;
}

/* The conversation as the store keeps it (rstore.h): prior's items, then
 * the input's (a string input is one user message item). */
static char *stored_input(const cJSON *root, const cJSON *prior)
{
    cJSON *all = prior ? cJSON_Duplicate(prior, 1) : cJSON_CreateArray();
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(root, "input");
    if (cJSON_IsString(in)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "type", "message");
        cJSON_AddStringToObject(m, "role", "user");
        cJSON *part = cJSON_CreateObject();
        cJSON_AddStringToObject(part, "type", "input_text");
        cJSON_AddStringToObject(part, "text", in->valuestring);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(m, "content"), part);
        cJSON_AddItemToArray(all, m);
    } else {
        const cJSON *it;
        cJSON_ArrayForEach(it, in)
        {
            cJSON_AddItemToArray(all, cJSON_Duplicate(it, 1));
        }
    }
    char *s = all ? cJSON_PrintUnformatted(all) : NULL;
    cJSON_Delete(all);
    return s;
}

static int responses_to_chat(const cJSON *root, const cJSON *prior, cJSON *chat, cJSON *echo,
                             struct cpt_request *c, struct oai_error *e)
{
    struct turns t = {cJSON_AddArrayToObject(chat, "messages"), NULL};
    c->store = true; /* OpenAI's default */
    int rc = t.msgs ? responses_members(root, prior, chat, echo, c, &t, e) : -RL_ENOMEM;
    free(t.reasoning);
    if (!rc && c->background && !c->store) /* nothing could be read back */
        rc = bad(e, "BAD_VALUE", "background", "a background response must be stored (store: "
                 "false asks for none)");
    if (!rc && !(c->input = stored_input(root, prior)))
        rc = -RL_ENOMEM;
    return rc;
}

/* ---- requests: Ollama ---- */

/* Ollama's options -> the chat fields. The runner's own (num_ctx, num_gpu,
 * mirostat ...) change nothing here and are dropped, as Ollama drops the
 * ones it does not know. */
static int ollama_options(const cJSON *o, cJSON *chat, struct oai_error *e)
{
    if (!cJSON_IsObject(o))
        return bad(e, "BAD_TYPE", "options", "must be an object");
    static const char *const same[] = {"temperature", "top_p", "top_k", "min_p", "seed",
                                       "presence_penalty", "frequency_penalty", "stop"};
    for (const cJSON *v = o->child; v; v = v->next) {
        if (cJSON_IsNull(v))
            continue;
        const char *k = v->string;
        bool done = false;
        for (size_t i = 0; i < sizeof same / sizeof same[0] && !done; i++) {
            if (!strcmp(k, same[i])) {
                cJSON_DeleteItemFromObjectCaseSensitive(chat, k);
                cJSON_AddItemToObject(chat, k, cJSON_Duplicate(v, 1));
                done = true;
            }
        }
        if (done)
            continue;
        if (!strcmp(k, "num_predict")) {
            if (!cJSON_IsNumber(v))
                return bad(e, "BAD_TYPE", "options.num_predict", "must be an integer");
            if (v->valuedouble > 0) /* -1: no limit, -2: fill the context */
                cJSON_AddNumberToObject(chat, "max_tokens", v->valuedouble);
        } else if (!strcmp(k, "repeat_penalty")) {
            cJSON_AddItemToObject(chat, "repetition_penalty", cJSON_Duplicate(v, 1));
        }
    }
    return 0;
}

/* format: "json", a schema, or "" -> response_format. */
static int ollama_format(const cJSON *f, cJSON *chat, struct oai_error *e)
{
    if (cJSON_IsString(f)) {
        if (!f->valuestring[0])
            return 0;
        if (strcmp(f->valuestring, "json"))
            return bad(e, "BAD_VALUE", "format", "must be \"json\" or a JSON schema");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(chat, "response_format"), "type",
                                "json_object");
        return 0;
    }
    if (!cJSON_IsObject(f))
        return bad(e, "BAD_TYPE", "format", "must be \"json\" or a JSON schema");
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    cJSON_AddStringToObject(js, "name", "format");
    cJSON_AddItemToObject(js, "schema", cJSON_Duplicate(f, 1));
    return 0;
}

/* Ollama's messages -> chat messages: thinking is reasoning_content, tool
 * calls get their OpenAI shape, images are refused. */
static int ollama_messages(const cJSON *ms, cJSON *chat, struct oai_error *e)
{
    if (!cJSON_IsArray(ms))
        return bad(e, "BAD_TYPE", "messages", "must be an array");
    cJSON *out = cJSON_AddArrayToObject(chat, "messages");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, ms)
    {
        char p[JOB_FIELD_MAX];
        if (!cJSON_IsObject(m)) {
            snprintf(p, sizeof p, "messages[%d]", i);
            return bad(e, "BAD_TYPE", p, "must be an object");
        }
        const cJSON *imgs = cJSON_GetObjectItemCaseSensitive(m, "images");
        if (cJSON_IsArray(imgs) && imgs->child) {
            snprintf(p, sizeof p, "messages[%d].images", i);
            return bad(e, "BAD_VALUE", p, "images are not supported (the model reads text)");
        }
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(out, c);
        for (const cJSON *f = m->child; f; f = f->next) {
            const char *k = f->string;
            if (!strcmp(k, "images") || !strcmp(k, "tool_name") || cJSON_IsNull(f))
                continue;
            if (!strcmp(k, "thinking")) {
                cJSON_AddItemToObject(c, "reasoning_content", cJSON_Duplicate(f, 1));
            } else if (!strcmp(k, "tool_calls") && cJSON_IsArray(f)) {
                cJSON *calls = cJSON_AddArrayToObject(c, "tool_calls");
                const cJSON *t;
                int nt = 0;
                cJSON_ArrayForEach(t, f)
                {
                    if (!cJSON_IsObject(t)) {
                        snprintf(p, sizeof p, "messages[%d].tool_calls[%d]", i, nt);
                        return bad(e, "BAD_TYPE", p, "must be an object");
                    }
                    nt++;
                    cJSON *x = cJSON_Duplicate(t, 1);
                    if (!cJSON_GetObjectItemCaseSensitive(x, "type"))
                        cJSON_AddStringToObject(x, "type", "function");
                    /* Ollama's own fields of a call */
                    cJSON_DeleteItemFromObjectCaseSensitive(x, "index");
                    cJSON *fn = cJSON_GetObjectItemCaseSensitive(x, "function");
                    cJSON_DeleteItemFromObjectCaseSensitive(fn, "index");
                    cJSON_AddItemToArray(calls, x);
                }
            } else {
                cJSON_AddItemToObject(c, k, cJSON_Duplicate(f, 1));
            }
        }
        if (!cJSON_GetObjectItemCaseSensitive(c, "content"))
            cJSON_AddStringToObject(c, "content", "");
        i++;
    }
    return 0;
}

/* The Ollama body -> chat (or, raw generate, completions) body. */
static int ollama_to_chat(enum cpt_api api, const cJSON *root, cJSON *chat, bool *raw,
                          struct cpt_request *c, struct oai_error *e)
{
    const cJSON *prompt = NULL, *system = NULL;
    bool stream = true; /* Ollama streams unless told not to */
    for (const cJSON *v = root->child; v; v = v->next) {
        const char *k = v->string;
        int rc = 0;
        if (cJSON_IsNull(v))
            continue;
        if (!strcmp(k, "model")) {
            if (!cJSON_IsString(v))
                return bad(e, "BAD_TYPE", "model", "must be a string");
            /* "name:latest" is the name Ollama's clients add a tag to */
            size_t n = strlen(v->valuestring);
            char *s = strdup(v->valuestring);
            if (!s)
                return -RL_ENOMEM;
            if (n > 7 && !strcmp(s + n - 7, ":latest"))
                s[n - 7] = 0;
            cJSON_AddStringToObject(chat, "model", s);
            free(s);
        } else if (!strcmp(k, "messages") && api == CPT_OLLAMA_CHAT) {
            rc = ollama_messages(v, chat, e);
        } else if (!strcmp(k, "prompt") && api == CPT_OLLAMA_GENERATE) {
            if (!cJSON_IsString(v))
                return bad(e, "BAD_TYPE", "prompt", "must be a string");
            prompt = v;
        } else if (!strcmp(k, "system") && api == CPT_OLLAMA_GENERATE) {
            if (!cJSON_IsString(v))
                return bad(e, "BAD_TYPE", "system", "must be a string");
            system = v;
        } else if (!strcmp(k, "raw") && api == CPT_OLLAMA_GENERATE) {
            *raw = cJSON_IsTrue(v);
        } else if ((!strcmp(k, "suffix") || !strcmp(k, "template")) &&
                   api == CPT_OLLAMA_GENERATE) {
            if (!cJSON_IsString(v) || v->valuestring[0])
                return bad(e, "BAD_VALUE", k,
                           "not supported (the model's own chat template is used)");
        } else if (!strcmp(k, "images") && api == CPT_OLLAMA_GENERATE) {
            if (!cJSON_IsArray(v) || v->child)
                return bad(e, "BAD_VALUE", k, "images are not supported (the model reads text)");
        } else if (!strcmp(k, "context") && api == CPT_OLLAMA_GENERATE) {
            /* an earlier answer's context: none is given out, none is needed */
        } else if (!strcmp(k, "stream")) {
            if (!cJSON_IsBool(v))
                return bad(e, "BAD_TYPE", "stream", "must be true or false");
            stream = cJSON_IsTrue(v);
        } else if (!strcmp(k, "format")) {
            rc = ollama_format(v, chat, e);
        } else if (!strcmp(k, "options")) {
            rc = ollama_options(v, chat, e);
        } else if (!strcmp(k, "think")) {
            if (cJSON_IsBool(v))
                cJSON_AddStringToObject(chat, "mode", cJSON_IsTrue(v) ? "think" : "no_think");
            else if (cJSON_IsString(v) && (!strcmp(v->valuestring, "low") ||
                                           !strcmp(v->valuestring, "medium") ||
                                           !strcmp(v->valuestring, "high")))
                cJSON_AddStringToObject(chat, "mode", "think");
            else
                return bad(e, "BAD_VALUE", "think", "must be true, false, low, medium or high");
        } else if (!strcmp(k, "keep_alive")) {
            /* the workers keep their model loaded: nothing to do */
        } else if (!strcmp(k, "tools") && api == CPT_OLLAMA_CHAT) {
            cJSON_AddItemToObject(chat, k, cJSON_Duplicate(v, 1));
        } else {
            /* as Ollama's own server: fields it does not know change nothing
             * (openai.c's policy on unknown fields applies) */
            cJSON_AddItemToObject(chat, k, cJSON_Duplicate(v, 1));
        }
        if (rc)
            return rc;
    }
    cJSON_AddBoolToObject(chat, "stream", stream);
    if (api == CPT_OLLAMA_GENERATE) {
        if (!prompt || !prompt->valuestring[0]) {
            c->load_only = true;
            return 0;
        }
        if (*raw) {
            cJSON_DeleteItemFromObjectCaseSensitive(chat, "mode");
            cJSON_AddStringToObject(chat, "prompt", prompt->valuestring);
        } else {
            cJSON *ms = cJSON_AddArrayToObject(chat, "messages");
            if (system && system->valuestring[0])
                cJSON_AddItemToArray(ms, message("system", system->valuestring));
            cJSON_AddItemToArray(ms, message("user", prompt->valuestring));
        }
    } else if (!cJSON_GetObjectItemCaseSensitive(chat, "messages")) {
        return bad(e, "MISSING_FIELD", "messages", "required");
    }
    return 0;
}

/* An error about chat's member `chat` (or an entry of it, "stop[0]") as
 * one about the member the client sent, `client`: param and the message's
 * leading "<param>: ". */
static void rename_param(struct oai_error *e, const char *chat, const char *client)
{
    size_t n = strlen(chat);
    if (strncmp(e->param, chat, n) || (e->param[n] && e->param[n] != '['))
        return;
    char p[JOB_FIELD_MAX], m[RL_ERR_MSG_MAX];
    size_t pn = strlen(e->param);
    snprintf(p, sizeof p, "%s%s", client, e->param + n);
    if (!strncmp(e->message, e->param, pn) && e->message[pn] == ':') {
        snprintf(m, sizeof m, "%s%s", p, e->message + pn);
        snprintf(e->message, sizeof e->message, "%s", m);
    }
    snprintf(e->param, sizeof e->param, "%s", p);
}

static int parse(enum cpt_api api, const char *body, size_t len, const char *prior_json,
                 const struct oai_limits *lim, const char *id, int64_t deadline_ms,
                 struct oai_request *out, struct cpt_request *c, struct oai_error *e)
{
    memset(out, 0, sizeof *out);
    memset(c, 0, sizeof *c);
    memset(e, 0, sizeof *e);
    c->api = api;
    if (lim && len > lim->max_body_bytes)
        /* openai.c words the 413 */
        return oai_parse_request(body, len, lim, id, deadline_ms, out, e);
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        /* openai.c words the error (invalid text, JSON, not an object) */
        int rc = oai_parse_request(body, len, lim, id, deadline_ms, out, e);
        if (!rc) { /* cannot be: it is not an object */
            oai_request_clear(out);
            oai_error_set(e, 400, T_INVALID, "INVALID_JSON", NULL, "body: not a JSON object");
            rc = -RL_EINVAL;
        }
        return rc;
    }
    cJSON *chat = cJSON_CreateObject();
    cJSON *echo = cJSON_CreateObject();
    cJSON *prior = prior_json ? cJSON_Parse(prior_json) : NULL;
    bool raw = false;
    int rc = !chat || !echo || (prior_json && !cJSON_IsArray(prior)) ? -RL_ENOMEM
             : api == CPT_RESPONSES ? responses_to_chat(root, prior, chat, echo, c, e)
             : api == CPT_ANTHROPIC || api == CPT_ANTHROPIC_COUNT
                 ? ant_to_chat(root, api == CPT_ANTHROPIC ? ANT_MESSAGES : ANT_COUNT_TOKENS, chat,
                               &c->omit_thinking, e)
                 : ollama_to_chat(api, root, chat, &raw, c, e);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(chat, "stream");
    out->stream = cJSON_IsTrue(st);
    if (!rc && c->load_only) {
        out->stream = false;
    } else if (!rc) {
        char *text = cJSON_PrintUnformatted(chat);
        if (!text)
            rc = -RL_ENOMEM;
        else
            rc = (raw ? oai_parse_completion : oai_parse_request)(text, strlen(text), lim, id,
                                                                  deadline_ms, out, e);
        free(text);
        if (!rc && out->n_jobs > 1) { /* one answer per request on these APIs */
            oai_error_set(e, 400, T_INVALID, "OUT_OF_RANGE", "n",
                          "n: only 1 on this API (POST /v1/chat/completions takes more)");
            rc = -RL_EINVAL;
        }
        if (rc == -RL_EINVAL && api == CPT_RESPONSES)
            rename_param(e, "max_tokens", "max_output_tokens");
        if (rc == -RL_EINVAL && api >= CPT_ANTHROPIC) {
            rename_param(e, "stop", "stop_sequences");
            rename_param(e, "continue_final_message", "messages"); /* a prefill's */
        }
    }
    if (!rc && api == CPT_RESPONSES && !(c->echo = cJSON_PrintUnformatted(echo)))
        rc = -RL_ENOMEM;
    if (rc == -RL_ENOMEM)
        oai_error_set(e, 500, "server_error", "INTERNAL", NULL, "out of memory");
    if (rc) {
        bool s = out->stream;
        oai_request_clear(out);
        out->stream = s;
        cpt_request_clear(c);
    }
    cJSON_Delete(chat);
    cJSON_Delete(echo);
    cJSON_Delete(prior);
    cJSON_Delete(root);
    return rc;
}

int cpt_parse(enum cpt_api api, const char *body, size_t len, const struct oai_limits *lim,
              const char *id, int64_t deadline_ms, struct oai_request *out,
              struct cpt_request *c, struct oai_error *e)
{
    return parse(api, body, len, NULL, lim, id, deadline_ms, out, c, e);
}

int cpt_parse_responses(const char *body, size_t len, const char *prior,
                        const struct oai_limits *lim, const char *id, int64_t deadline_ms,
                        struct oai_request *out, struct cpt_request *c, struct oai_error *e)
{
    return parse(CPT_RESPONSES, body, len, prior, lim, id, deadline_ms, out, c, e);
}

void cpt_responses_peek(const char *body, size_t len, struct cpt_peek *out)
{
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_ParseWithLength(body, len);
    const char *v =
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "previous_response_id"));
    out->continues = v != NULL;
    if (v && strlen(v) < sizeof out->previous_id) /* a longer one names nothing: not found */
        snprintf(out->previous_id, sizeof out->previous_id, "%s", v);
    out->background = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "background"));
    const char *cid = conversation_id(cJSON_GetObjectItemCaseSensitive(root, "conversation"));
    out->in_conversation = cid != NULL;
    if (cid && strlen(cid) < sizeof out->conversation)
        snprintf(out->conversation, sizeof out->conversation, "%s", cid);
    cJSON_Delete(root);
}

/* ---- responses ---- */

enum open_item { OPEN_NONE = 0, OPEN_REASONING, OPEN_MESSAGE, OPEN_CALL };

struct cpt_resp {
    enum cpt_api api;
    bool stream;
    char id[JOB_ID_MAX + 1];
    const char *tail;          /* id's unique part, for item ids */
    char *model;
    int64_t created_ms;
    cJSON *echo;               /* Responses: the request fields to echo */
    bool store;                /* Responses: stored when it ends (cpt_request's) */
    bool background;           /* Responses: its client does not wait (cpt_request's) */
    bool cancelled;            /* ... and cancelled it (cpt_request's) */
    int64_t next_seq;          /* the job event seq expected */
    int state;
    struct oai_error failure;
    /* Responses */
    int64_t seqno;             /* sequence_number of the next SSE event */
    int64_t resume_after;      /* events numbered up to this one are not written */
    bool started;              /* response.created written */
    cJSON *items;              /* the output items closed so far */
    enum open_item open;
    char item_id[96];
    struct text cur;        /* the open item's text (OPEN_CALL: its arguments) */
    bool had_message;
    struct oai_tc_stream tc;   /* stream: tool calls sent in fragments */
    int call_index;            /* OPEN_CALL: the call's index in done's tool_calls */
    char call_name[256];       /* OPEN_CALL: its function name */
    /* both */
    struct text content, reasoning; /* the whole answer */
    cJSON *tool_calls;
    const char *finish;        /* done's finish_reason */
    int64_t prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens;
    int64_t ttft_ms, total_ms;
    struct ant_resp *ant;      /* Anthropic: the whole answer is its */
};

int cpt_resp_create(struct cpt_resp **out, const struct cpt_request *c, const char *id,
                    const char *model, int64_t created_ms, bool stream, struct rl_err *err)
{
    struct cpt_resp *r = calloc(1, sizeof *r);
    if (!r || !(r->model = strdup(model ? model : "")) || !(r->items = cJSON_CreateArray()) ||
        (c->echo && !(r->echo = cJSON_Parse(c->echo))) ||
        (c->api == CPT_ANTHROPIC &&
         !(r->ant = ant_resp_create(id, model, stream, c->omit_thinking)))) {
        cpt_resp_free(r);
        return rl_errf(err, RL_ENOMEM, "cpt_resp_create: out of memory");
    }
    r->api = c->api;
    r->stream = stream;
    r->store = c->store;
    r->background = c->background;
    r->cancelled = c->cancelled;
    snprintf(r->id, sizeof r->id, "%s", id);
    const char *t = strrchr(r->id, '_');
    const char *d = strrchr(r->id, '-');
    r->tail = (t && (!d || t > d) ? t : d) ? (t && (!d || t > d) ? t : d) + 1 : r->id;
    r->created_ms = created_ms;
    r->resume_after = -1;
    *out = r;
    return 0;
}

void cpt_resp_resume(struct cpt_resp *r, int64_t after)
{
    r->resume_after = after;
}

void cpt_resp_free(struct cpt_resp *r)
{
    if (!r)
        return;
    free(r->model);
    ant_resp_free(r->ant);
    cJSON_Delete(r->echo);
    cJSON_Delete(r->items);
    cJSON_Delete(r->tool_calls);
    oai_tc_free(&r->tc);
    text_free(&r->cur);
    text_free(&r->content);
    text_free(&r->reasoning);
    free(r);
}

static int fail(struct cpt_resp *r, struct oai_error *e)
{
    r->state = OAI_FAILED;
    r->failure = *e;
    return OAI_FAILED;
}

/* Writes c (freed) as one Responses SSE event: its type as the event name,
 * sequence_number added. */
static int sse_event(struct cpt_resp *r, cJSON *c, struct text *out)
{
    if (!c)
        return -RL_ENOMEM;
    int64_t n = r->seqno++;
    if (n <= r->resume_after) { /* the client has it: a stream resumed after it */
        cJSON_Delete(c);
        return 0;
    }
    cJSON_AddNumberToObject(c, "sequence_number", (double)n);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "type");
    char *s = cJSON_PrintUnformatted(c);
    int rc = !s ? -RL_ENOMEM : text_add(out, "event: ", 7);
    if (!rc)
        rc = text_add(out, t->valuestring, strlen(t->valuestring));
    if (!rc)
        rc = text_add(out, "\ndata: ", 7);
    if (!rc)
        rc = text_add(out, s, strlen(s));
    if (!rc)
        rc = text_add(out, "\n\n", 2);
    free(s);
    cJSON_Delete(c);
    return rc;
}

static cJSON *ev_new(const char *type)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "type", type);
    return c;
}

static cJSON *usage_json(const struct cpt_resp *r)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", (double)r->prompt_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens",
                            (double)r->cached_tokens);
    cJSON_AddNumberToObject(u, "output_tokens", (double)r->completion_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"),
                            "reasoning_tokens", (double)r->reasoning_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(r->prompt_tokens + r->completion_tokens));
    return u;
}

static void echo_or(cJSON *o, const cJSON *echo, const char *k, cJSON *dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(echo, k);
    if (v) {
        cJSON_Delete(dflt);
        cJSON_AddItemToObject(o, k, cJSON_Duplicate(v, 1));
    } else {
        cJSON_AddItemToObject(o, k, dflt);
    }
}

/* The response object in its state: in_progress with the items so far,
 * or (after done) completed / incomplete with usage. */
static cJSON *response_object(const struct cpt_resp *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)(r->created_ms / 1000));
    /* a background response is read while it runs: queued until its
     * first event; one cancelled says so, as OpenAI's does */
    const char *status = r->background && !r->next_seq ? "queued" : "in_progress";
    const char *why = NULL;
    if (r->state == OAI_END) {
        status = !strcmp(r->finish, "stop")                          ? "completed"
                 : r->background && !strcmp(r->finish, "cancelled") ? "cancelled"
                                                                      : "incomplete";
        why = !strcmp(r->finish, "length") ? "max_output_tokens" : r->finish;
    } else if (r->state == OAI_FAILED) {
        status = "failed";
    } else if (r->background && r->cancelled) {
        status = "cancelled"; /* the job stops within its worker's next check */
    }
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddBoolToObject(o, "background", r->background);
    if (r->state == OAI_FAILED) {
        cJSON *err = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(err, "code", r->failure.code);
        cJSON_AddStringToObject(err, "message", r->failure.message);
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    if (!strcmp(status, "incomplete"))
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "incomplete_details"), "reason", why);
    else
        cJSON_AddNullToObject(o, "incomplete_details");
    echo_or(o, r->echo, "conversation", cJSON_CreateNull());
    echo_or(o, r->echo, "instructions", cJSON_CreateNull());
    echo_or(o, r->echo, "max_output_tokens", cJSON_CreateNull());
    echo_or(o, r->echo, "metadata", cJSON_CreateObject());
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON_AddItemToObject(o, "output", r->state == OAI_END || r->started
                                           ? cJSON_Duplicate(r->items, 1) : cJSON_CreateArray());
    echo_or(o, r->echo, "parallel_tool_calls", cJSON_CreateTrue());
    echo_or(o, r->echo, "previous_response_id", cJSON_CreateNull());
    cJSON *reasoning = cJSON_CreateObject();
    cJSON_AddNullToObject(reasoning, "effort");
    cJSON_AddNullToObject(reasoning, "summary");
    echo_or(o, r->echo, "reasoning", reasoning);
    cJSON_AddBoolToObject(o, "store", r->store);
    echo_or(o, r->echo, "temperature", cJSON_CreateNull());
    cJSON *text = cJSON_CreateObject();
    cJSON_AddStringToObject(cJSON_AddObjectToObject(text, "format"), "type", "text");
    echo_or(o, r->echo, "text", text);
    echo_or(o, r->echo, "tool_choice", cJSON_CreateString("auto"));
    echo_or(o, r->echo, "tools", cJSON_CreateArray());
    echo_or(o, r->echo, "top_p", cJSON_CreateNull());
    cJSON_AddStringToObject(o, "truncation", "disabled");
    if (r->state == OAI_END)
        cJSON_AddItemToObject(o, "usage", usage_json(r));
    else
        cJSON_AddNullToObject(o, "usage");
    cJSON_AddNullToObject(o, "user");
    return o;
}

static cJSON *reasoning_item(const struct cpt_resp *r, const char *text, bool done)
{
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", r->item_id);
    cJSON_AddStringToObject(it, "type", "reasoning");
    cJSON_AddArrayToObject(it, "summary");
    cJSON *content = cJSON_AddArrayToObject(it, "content");
    if (done) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "reasoning_text");
        cJSON_AddStringToObject(p, "text", text);
        cJSON_AddItemToArray(content, p);
    }
    return it;
}

static cJSON *text_part(const char *text)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "output_text");
    cJSON_AddStringToObject(p, "text", text);
    cJSON_AddArrayToObject(p, "annotations");
    cJSON_AddArrayToObject(p, "logprobs");
    return p;
}

static cJSON *message_item(const struct cpt_resp *r, const char *text, bool done)
{
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", r->item_id);
    cJSON_AddStringToObject(it, "type", "message");
    cJSON_AddStringToObject(it, "status", done ? "completed" : "in_progress");
    cJSON_AddStringToObject(it, "role", "assistant");
    cJSON *content = cJSON_AddArrayToObject(it, "content");
    if (done)
        cJSON_AddItemToArray(content, text_part(text));
    return it;
}

/* An event naming the open item: item_id, output_index (, content_index). */
static cJSON *item_event(const struct cpt_resp *r, const char *type, bool part)
{
    cJSON *c = ev_new(type);
    cJSON_AddStringToObject(c, "item_id", r->item_id);
    cJSON_AddNumberToObject(c, "output_index", cJSON_GetArraySize(r->items));
    if (part)
        cJSON_AddNumberToObject(c, "content_index", 0);
    return c;
}

/* A function_call item (status completed or in_progress). */
static cJSON *call_item(const struct cpt_resp *r, const char *id, const char *call_id,
                        const char *name, const char *args, bool done)
{
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", "function_call");
    cJSON_AddStringToObject(it, "status", done ? "completed" : "in_progress");
    cJSON_AddStringToObject(it, "call_id", call_id);
    cJSON_AddStringToObject(it, "name", name);
    cJSON_AddStringToObject(it, "arguments", args);
    (void)r;
    return it;
}

/* Closes the open function_call item (streamed): what the fragments lacked
 * of final (done's arguments; NULL before done: the fragments are the
 * arguments), then its done events. */
static int close_call(struct cpt_resp *r, const char *final, struct text *out)
{
    const char *rest = final ? oai_tc_rest(&r->tc, r->call_index, final) : NULL;
    int rc = 0;
    cJSON *c;
    if (rest && *rest) {
        c = item_event(r, "response.function_call_arguments.delta", false);
        cJSON_AddStringToObject(c, "delta", rest);
        rc = sse_event(r, c, out);
        if (!rc)
            rc = text_add(&r->cur, rest, strlen(rest));
    }
    if (!rc)
        rc = text_reserve(&r->cur, 0); /* no fragment at all: "" */
    if (rc)
        return rc;
    char cid[JOB_ID_MAX + 32];
    oai_tool_call_id(cid, sizeof cid, r->id, r->call_index);
    cJSON *item = call_item(r, r->item_id, cid, r->call_name, r->cur.p, true);
    c = item_event(r, "response.function_call_arguments.done", false);
    cJSON_AddStringToObject(c, "arguments", r->cur.p);
    rc = sse_event(r, c, out);
    if (!rc) {
        c = item_event(r, "response.output_item.done", false);
        cJSON_DeleteItemFromObjectCaseSensitive(c, "item_id");
        cJSON_AddItemToObject(c, "item", cJSON_Duplicate(item, 1));
        rc = sse_event(r, c, out);
    }
    cJSON_AddItemToArray(r->items, item);
    r->open = OPEN_NONE;
    text_clear(&r->cur);
    return rc;
}

/* Closes the open item: its done events, and onto items. */
static int close_item(struct cpt_resp *r, struct text *out)
{
    if (r->open == OPEN_NONE)
        return 0;
    if (r->open == OPEN_CALL)
        return close_call(r, NULL, out);
    if (text_reserve(&r->cur, 0)) /* no text at all: "" */
        return -RL_ENOMEM;
    const char *text = r->cur.p;
    cJSON *item = r->open == OPEN_REASONING ? reasoning_item(r, text, true)
                                            : message_item(r, text, true);
    int rc = 0;
    if (r->stream) {
        cJSON *c;
        if (r->open == OPEN_REASONING) {
            c = item_event(r, "response.reasoning_text.done", true);
            cJSON_AddStringToObject(c, "text", text);
            rc = sse_event(r, c, out);
        } else {
            c = item_event(r, "response.output_text.done", true);
            cJSON_AddStringToObject(c, "text", text);
            cJSON_AddArrayToObject(c, "logprobs");
            rc = sse_event(r, c, out);
            if (!rc) {
                c = item_event(r, "response.content_part.done", true);
                cJSON_AddItemToObject(c, "part", text_part(text));
                rc = sse_event(r, c, out);
            }
        }
        if (!rc) {
            c = item_event(r, "response.output_item.done", false);
            cJSON_DeleteItemFromObjectCaseSensitive(c, "item_id");
            cJSON_AddItemToObject(c, "item", cJSON_Duplicate(item, 1));
            rc = sse_event(r, c, out);
        }
    }
    cJSON_AddItemToArray(r->items, item);
    r->open = OPEN_NONE;
    text_clear(&r->cur);
    return rc;
}

/* Opens an item of kind k: its added events. */
static int open_item(struct cpt_resp *r, enum open_item k, struct text *out)
{
    int rc = close_item(r, out);
    if (rc)
        return rc;
    snprintf(r->item_id, sizeof r->item_id, "%s_%s_%d", k == OPEN_REASONING ? "rs" : "msg",
             r->tail, cJSON_GetArraySize(r->items));
    r->open = k;
    if (k == OPEN_MESSAGE)
        r->had_message = true;
    if (!r->stream)
        return 0;
    cJSON *c = item_event(r, "response.output_item.added", false);
    cJSON_DeleteItemFromObjectCaseSensitive(c, "item_id");
    cJSON_AddItemToObject(c, "item", k == OPEN_REASONING ? reasoning_item(r, "", false)
                                                          : message_item(r, "", false));
    rc = sse_event(r, c, out);
    if (!rc && k == OPEN_MESSAGE) {
        c = item_event(r, "response.content_part.added", true);
        cJSON *p = text_part("");
        cJSON_DeleteItemFromObjectCaseSensitive(p, "logprobs");
        cJSON_AddItemToObject(c, "part", p);
        rc = sse_event(r, c, out);
    }
    return rc;
}

static int start(struct cpt_resp *r, struct text *out)
{
    if (r->started || r->api != CPT_RESPONSES)
        return 0;
    r->started = true;
    if (!r->stream)
        return 0;
    cJSON *c = ev_new("response.created");
    cJSON_AddItemToObject(c, "response", response_object(r));
    int rc = sse_event(r, c, out);
    if (!rc) {
        c = ev_new("response.in_progress");
        cJSON_AddItemToObject(c, "response", response_object(r));
        rc = sse_event(r, c, out);
    }
    return rc;
}

/* Responses: one text delta, reasoning or answer. */
static int responses_text(struct cpt_resp *r, enum open_item k, const char *s,
                          struct text *out)
{
    if (!s || !s[0])
        return 0;
    int rc = r->open == k ? 0 : open_item(r, k, out);
    if (rc || (rc = text_add(&r->cur, s, strlen(s))))
        return rc;
    if (!r->stream)
        return 0;
    cJSON *c = item_event(r, k == OPEN_REASONING ? "response.reasoning_text.delta"
                                                 : "response.output_text.delta", true);
    cJSON_AddStringToObject(c, "delta", s);
    if (k == OPEN_MESSAGE)
        cJSON_AddArrayToObject(c, "logprobs");
    return sse_event(r, c, out);
}

struct tc_ctx {
    struct cpt_resp *r;
    struct text *out;
};

/* Responses, streamed: one entry of a delta's tool_calls. A call that
 * opens closes the open item and opens its function_call item
 * (output_item.added, arguments ""); each fragment is a
 * response.function_call_arguments.delta. */
static int responses_tool_delta(void *ctx, int i, bool opens, const char *name,
                                const char *frag)
{
    struct cpt_resp *r = ((struct tc_ctx *)ctx)->r;
    struct text *out = ((struct tc_ctx *)ctx)->out;
    int rc;
    if (opens) {
        if ((rc = close_item(r, out)))
            return rc;
        snprintf(r->item_id, sizeof r->item_id, "fc_%s_%d", r->tail,
                 cJSON_GetArraySize(r->items));
        snprintf(r->call_name, sizeof r->call_name, "%s", name);
        r->call_index = i;
        r->open = OPEN_CALL;
        text_clear(&r->cur);
        char cid[JOB_ID_MAX + 32];
        oai_tool_call_id(cid, sizeof cid, r->id, i);
        cJSON *c = item_event(r, "response.output_item.added", false);
        cJSON_DeleteItemFromObjectCaseSensitive(c, "item_id");
        cJSON_AddItemToObject(c, "item", call_item(r, r->item_id, cid, name, "", false));
        if ((rc = sse_event(r, c, out)))
            return rc;
    } else if (r->open != OPEN_CALL || r->call_index != i) {
        return 0; /* its item closed already (text came between) */
    }
    if (!*frag)
        return 0;
    if ((rc = text_add(&r->cur, frag, strlen(frag))))
        return rc;
    cJSON *c = item_event(r, "response.function_call_arguments.delta", false);
    cJSON_AddStringToObject(c, "delta", frag);
    return sse_event(r, c, out);
}

static int responses_tool_deltas(struct cpt_resp *r, const cJSON *tcs, struct text *out)
{
    struct tc_ctx c = {r, out};
    return oai_tc_each(&r->tc, tcs, responses_tool_delta, &c);
}

/* One Ollama NDJSON line (stream) or object: the text of this step, or the
 * final one with the counts. */
static cJSON *ollama_object(const struct cpt_resp *r, const char *content, const char *thinking,
                            bool done)
{
    cJSON *o = cJSON_CreateObject();
    char at[32];
    cpt_iso_time(r->created_ms + (done ? r->total_ms : 0), at);
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON_AddStringToObject(o, "created_at", at);
    if (r->api == CPT_OLLAMA_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(o, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", content ? content : "");
        if (thinking && thinking[0])
            cJSON_AddStringToObject(m, "thinking", thinking);
        if (done && r->tool_calls && r->tool_calls->child) {
            cJSON *calls = cJSON_AddArrayToObject(m, "tool_calls");
            const cJSON *t;
            cJSON_ArrayForEach(t, r->tool_calls)
            {
                const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
                const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
                const cJSON *a = cJSON_GetObjectItemCaseSensitive(f, "arguments");
                cJSON *args = cJSON_IsString(a) ? cJSON_Parse(a->valuestring) : NULL;
                if (!cJSON_IsObject(args)) {
                    cJSON_Delete(args);
                    args = cJSON_CreateObject();
                }
                cJSON *x = cJSON_CreateObject();
                cJSON *xf = cJSON_AddObjectToObject(x, "function");
                cJSON_AddStringToObject(xf, "name", cJSON_IsString(n) ? n->valuestring : "");
                cJSON_AddItemToObject(xf, "arguments", args);
                cJSON_AddItemToArray(calls, x);
            }
        }
    } else {
        cJSON_AddStringToObject(o, "response", content ? content : "");
        if (thinking && thinking[0])
            cJSON_AddStringToObject(o, "thinking", thinking);
    }
    cJSON_AddBoolToObject(o, "done", done);
    if (done) {
        cJSON_AddStringToObject(o, "done_reason", r->finish);
        /* nanoseconds, as Ollama counts */
        cJSON_AddNumberToObject(o, "total_duration", (double)r->total_ms * 1e6);
        cJSON_AddNumberToObject(o, "load_duration", 0);
        cJSON_AddNumberToObject(o, "prompt_eval_count", (double)r->prompt_tokens);
        cJSON_AddNumberToObject(o, "prompt_eval_duration", (double)r->ttft_ms * 1e6);
        cJSON_AddNumberToObject(o, "eval_count", (double)r->completion_tokens);
        cJSON_AddNumberToObject(o, "eval_duration",
                                (double)(r->total_ms > r->ttft_ms ? r->total_ms - r->ttft_ms : 0) *
                                    1e6);
    }
    return o;
}

static int ndjson_put(cJSON *o, struct text *out)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    int rc = !s ? -RL_ENOMEM : text_add(out, s, strlen(s));
    if (!rc)
        rc = text_add(out, "\n", 1);
    free(s);
    return rc;
}

static int feed_delta(struct cpt_resp *r, const cJSON *ev, struct text *out)
{
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(ev, "delta");
    const char *content = oai_str_member(d, "content");
    const char *reasoning = oai_str_member(d, "reasoning_content");
    if ((content && text_add(&r->content, content, strlen(content))) ||
        (reasoning && text_add(&r->reasoning, reasoning, strlen(reasoning))))
        return -RL_ENOMEM;
    int rc = 0;
    if (r->api == CPT_RESPONSES) {
        rc = responses_text(r, OPEN_REASONING, reasoning, out);
        if (!rc)
            rc = responses_text(r, OPEN_MESSAGE, content, out);
        const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(d, "tool_calls");
        if (!rc && r->stream && cJSON_IsArray(tcs))
            rc = responses_tool_deltas(r, tcs, out);
        return rc ? rc : OAI_MORE;
    }
    if (r->stream && ((content && content[0]) || (reasoning && reasoning[0])))
        rc = ndjson_put(ollama_object(r, content, reasoning, false), out);
    return rc ? rc : OAI_MORE;
}

/* Responses: the function calls, the last item, response.completed. */
static int responses_done(struct cpt_resp *r, struct text *out)
{
    int rc = 0;
    if (!r->had_message && !(r->tool_calls && r->tool_calls->child))
        rc = open_item(r, OPEN_MESSAGE, out); /* an empty answer is an empty message */
    if (!rc && r->open == OPEN_CALL) { /* the last streamed call gets done's arguments */
        const cJSON *last = cJSON_GetArrayItem(r->tool_calls, r->call_index);
        rc = close_call(r, oai_str_member(cJSON_GetObjectItemCaseSensitive(last, "function"),
                                      "arguments"), out);
    }
    if (!rc)
        rc = close_item(r, out);
    const cJSON *t;
    int ci = -1;
    cJSON_ArrayForEach(t, r->tool_calls)
    {
        if (rc)
            return rc;
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const char *name = oai_str_member(f, "name");
        const char *args = oai_str_member(f, "arguments");
        const char *cid = oai_str_member(t, "id");
        if (oai_tc_rest(&r->tc, ++ci, args))
            continue; /* streamed: its item is out already */
        snprintf(r->item_id, sizeof r->item_id, "fc_%s_%d", r->tail,
                 cJSON_GetArraySize(r->items));
        cJSON *it = cJSON_CreateObject();
        cJSON_AddStringToObject(it, "id", r->item_id);
        cJSON_AddStringToObject(it, "type", "function_call");
        cJSON_AddStringToObject(it, "status", "completed");
        cJSON_AddStringToObject(it, "call_id", cid ? cid : r->item_id);
        cJSON_AddStringToObject(it, "name", name ? name : "");
        cJSON_AddStringToObject(it, "arguments", args ? args : "{}");
        if (r->stream) {
            cJSON *c = item_event(r, "response.output_item.added", false);
            cJSON_DeleteItemFromObjectCaseSensitive(c, "item_id");
            cJSON *added = cJSON_Duplicate(it, 1);
            cJSON_ReplaceItemInObjectCaseSensitive(added, "arguments", cJSON_CreateString(""));
            cJSON_ReplaceItemInObjectCaseSensitive(added, "status",
                                                   cJSON_CreateString("in_progress"));
            cJSON_AddItemToObject(c, "item", added);
            rc = sse_event(r, c, out);
            if (!rc) {
                c = item_event(r, "response.function_call_arguments.delta", false);
                cJSON_AddStringToObject(c, "delta", args ? args : "{}");
                rc = sse_event(r, c, out);
            }
            if (!rc) {
                c = item_event(r, "response.function_call_arguments.done", false);
                cJSON_AddStringToObject(c, "arguments", args ? args : "{}");
                rc = sse_event(r, c, out);
            }
            if (!rc) {
                c = item_event(r, "response.output_item.done", false);
                cJSON_DeleteItemFromObjectCaseSensitive(c, "item_id");
                cJSON_AddItemToObject(c, "item", cJSON_Duplicate(it, 1));
                rc = sse_event(r, c, out);
            }
        }
        cJSON_AddItemToArray(r->items, it);
    }
    if (rc || !r->stream)
        return rc;
    r->state = OAI_END;
    cJSON *c = ev_new(!strcmp(r->finish, "stop") ? "response.completed" : "response.incomplete");
    cJSON_AddItemToObject(c, "response", response_object(r));
    return sse_event(r, c, out);
}

static int feed_done(struct cpt_resp *r, const cJSON *ev, struct text *out,
                     struct oai_error *e)
{
    const char *fr = oai_str_member(ev, "finish_reason");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(ev, "tool_calls");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(ev, "usage");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(ev, "timings");
    r->prompt_tokens = oai_int_member(u, "prompt_tokens");
    r->completion_tokens = oai_int_member(u, "completion_tokens");
    r->reasoning_tokens = oai_int_member(u, "reasoning_tokens");
    r->cached_tokens = oai_int_member(u, "cached_prompt_tokens");
    r->ttft_ms = oai_int_member(tm, "ttft_ms");
    r->total_ms = oai_int_member(tm, "total_ms");
    if (!(r->tool_calls = cJSON_IsArray(tc) ? cJSON_Duplicate(tc, 1) : cJSON_CreateArray()))
        return -RL_ENOMEM;
    oai_tool_call_ids(r->tool_calls, r->id);
    if (!fr || !strcmp(fr, "error")) {
        oai_error_set(e, 500, "server_error", "ENGINE_ERROR", NULL, "the job ended with an error");
        return fail(r, e);
    }
    r->finish = !strcmp(fr, "length") ? "length" : !strcmp(fr, "cancelled") ? "cancelled"
                : !strcmp(fr, "deadline") ? "deadline" : "stop";
    int rc = 0;
    if (r->api == CPT_RESPONSES) {
        rc = responses_done(r, out);
    } else if (r->stream) {
        r->state = OAI_END; /* the counts are final */
        rc = ndjson_put(ollama_object(r, "", NULL, true), out);
    }
    if (rc)
        return rc;
    r->state = OAI_END;
    return OAI_END;
}

int cpt_resp_feed(struct cpt_resp *r, const char *event, size_t len, struct text *out,
                  struct oai_error *e)
{
    if (r->state == OAI_FAILED) {
        *e = r->failure;
        return OAI_FAILED;
    }
    if (r->state == OAI_END)
        return OAI_END;
    cJSON *ev = event ? cJSON_ParseWithLength(event, len) : NULL;
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(ev, "seq");
    const char *type = oai_str_member(ev, "type");
    int rc;
    if (!cJSON_IsObject(ev) || !cJSON_IsNumber(seq) || !type ||
        seq->valuedouble != (double)r->next_seq) {
        oai_error_set(e, 502, "server_error", "BAD_EVENT", NULL,
                      "event %lld of the job is not a valid event", (long long)r->next_seq);
        rc = fail(r, e);
        goto done;
    }
    r->next_seq++;
    if (!strcmp(type, "error")) {
        const cJSON *ra = cJSON_GetObjectItemCaseSensitive(ev, "retry_after_ms");
        oai_error_from_event(oai_str_member(ev, "code"), oai_str_member(ev, "message"),
                             cJSON_IsNumber(ra) && ra->valuedouble > 0 && ra->valuedouble < 1e9
                                 ? (int64_t)ra->valuedouble : 0,
                             e);
        rc = fail(r, e);
        goto done;
    }
    /* the first event that is not an error opens the response */
    if ((rc = start(r, out)))
        goto done;
    if (r->ant && (!strcmp(type, "delta") || !strcmp(type, "done"))) {
        if (r->next_seq == 1 && (rc = ant_start(r->ant, out)))
            goto done;
        rc = !strcmp(type, "delta") ? ant_delta(r->ant, ev, out) : ant_done(r->ant, ev, out, e);
        if (rc == OAI_FAILED)
            rc = fail(r, e);
        else if (rc == OAI_END)
            r->state = OAI_END;
    } else if (!strcmp(type, "delta")) {
        rc = feed_delta(r, ev, out);
    } else if (!strcmp(type, "done")) {
        rc = feed_done(r, ev, out, e);
    } else {
        oai_error_set(e, 502, "server_error", "BAD_EVENT", NULL, "event type \"%.20s\" is unknown",
                      type);
        rc = fail(r, e);
    }
done:
    cJSON_Delete(ev);
    return rc;
}

char *cpt_error_json(enum cpt_api api, const struct oai_error *e)
{
    if (api == CPT_RESPONSES)
        return oai_error_json(e);
    if (api == CPT_ANTHROPIC || api == CPT_ANTHROPIC_COUNT)
        return ant_error_json(e);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", e->message);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

int cpt_stream_error(const struct cpt_resp *r, const struct oai_error *e, struct text *out)
{
    if (r->ant)
        return ant_stream_error(e, out);
    if (r->api != CPT_RESPONSES) {
        char *s = cpt_error_json(r->api, e);
        int rc = !s ? -RL_ENOMEM : text_add(out, s, strlen(s));
        if (!rc)
            rc = text_add(out, "\n", 1);
        free(s);
        return rc;
    }
    cJSON *c = ev_new("error");
    cJSON_AddStringToObject(c, "code", e->code[0] ? e->code : "server_error");
    cJSON_AddStringToObject(c, "message", e->message);
    if (e->param[0])
        cJSON_AddStringToObject(c, "param", e->param);
    else
        cJSON_AddNullToObject(c, "param");
    /* sequence numbers go on from the last event: r is logically const */
    return sse_event((struct cpt_resp *)r, c, out);
}

int cpt_keepalive(const struct cpt_resp *r, struct text *out)
{
    if (r->ant)
        return ant_ping(out);
    if (r->api == CPT_RESPONSES)
        return text_add(out, ": keep-alive\n\n", 14);
    return ndjson_put(ollama_object(r, "", NULL, false), out);
}

char *cpt_resp_body(const struct cpt_resp *r)
{
    if (r->state != OAI_END)
        return NULL;
    if (r->ant)
        return ant_body(r->ant);
    cJSON *o;
    if (r->api == CPT_RESPONSES) {
        o = response_object(r);
    } else {
        o = ollama_object(r, r->content.p ? r->content.p : "",
                          r->reasoning.p ? r->reasoning.p : "", true);
    }
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *cpt_resp_stored(const struct cpt_resp *r)
{
    if (!r->store || r->state != OAI_END)
        return NULL;
    return cpt_resp_object(r);
}

char *cpt_resp_object(const struct cpt_resp *r)
{
    if (r->api != CPT_RESPONSES)
        return NULL;
    cJSON *o = response_object(r);
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

int64_t cpt_resp_total_tokens(const struct cpt_resp *r)
{
    if (r->ant)
        return ant_total_tokens(r->ant);
    return r->state == OAI_END ? r->prompt_tokens + r->completion_tokens : 0;
}

char *cpt_ollama_loaded(const char *model, int64_t created_ms)
{
    char at[32];
    cpt_iso_time(created_ms, at);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddStringToObject(o, "created_at", at);
    cJSON_AddStringToObject(o, "response", "");
    cJSON_AddBoolToObject(o, "done", 1);
    cJSON_AddStringToObject(o, "done_reason", "load");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
