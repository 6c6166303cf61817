/* dispatcher/openai.c - OpenAI Chat Completions <-> redlm jobs and events.
 *
 * Requests. A body is checked in the order job_parse checks a job, so the
 * two report alike: size (413), UTF-8 and strict JSON lexing (shared with
 * job.c through job_check_text), syntax, object shape, then each member in
 * document order (unknown name, duplicate, type, bounds of the fields this
 * file owns), then the rules across members. The OpenAI names that the
 * job protocol shares (temperature, top_p, seed, stop, the penalties,
 * top_k, min_p, repetition_penalty, ignore_eos, mode, messages, tools) are
 * copied into the job as they came, and job_parse() then checks them with
 * the very code the dispatcher and the worker run: one definition of "a
 * valid temperature", and its error names the field the client wrote. The
 * renamed ones (max_completion_tokens, logprobs + top_logprobs,
 * chat_template_kwargs.enable_thinking) are checked here. JSON null means
 * "absent" for every optional member, as OpenAI treats it, and null
 * members inside messages are dropped (clients that append the assistant
 * message they got back send "refusal": null and the like).
 *
 * Responses. Each event of redlm:out:<id> maps to at most one SSE chunk,
 * produced at once; the done event adds a tool-call chunk when the model
 * called tools, the final chunk with finish_reason, the usage chunk when
 * asked for, and "data: [DONE]". An error event ends the response: the
 * HTTP layer turns it into a status when no byte was sent yet, and into an
 * error chunk (oai_sse_error) otherwise. Logprobs show each token's text
 * and UTF-8 bytes, which the worker writes into the event (`bytes`, from
 * its tokenizer), so the front door needs no tokenizer of its own; a token
 * that is part of a character shows U+FFFD as text and its true bytes.
 * Events without bytes (a worker whose model has no tokenizer) fall back
 * to "token_id:N", the form vLLM uses with --return-tokens-as-token-ids.
 *
 * The legacy text API (POST /v1/completions) shares all of it: the same
 * member table (each member says which endpoints take it), the same job,
 * and text_completion objects on the way back.
 *
 * The mode. A chat request chooses thinking explicitly with mode,
 * chat_template_kwargs.enable_thinking or reasoning_effort (none, minimal
 * and low: no_think), or with a /think or /no_think soft switch in its last
 * user message; one that does none of these gets the deployment's
 * http_default_mode, which is the model's own default (Qwen3: think) unless
 * the deployment asks for auto routing; so the same question never thinks
 * or not by chance.
 *
 * Everything here runs on the calling thread with no shared state; the
 * HTTP layer calls it from its connection threads. */
#include "openai.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"
#include "route.h"
#include "sha256.h"
#include "tokenizer.h"

/* ---- buffers ---- */

void oai_limits_default(struct oai_limits *l)
{
    memset(l, 0, sizeof *l);
    l->max_body_bytes = 4u << 20;
    l->max_messages = 1024;
    l->max_tokens = 32768;
    l->model = "redlm";
    l->refuse_unknown = true;
}

/* ---- errors ---- */

static const char T_INVALID[] = "invalid_request_error";
static const char T_SERVER[] = "server_error";

void oai_error_set(struct oai_error *e, int status, const char *type, const char *code,
                   const char *param, const char *fmt, ...)
{
    memset(e, 0, sizeof *e);
    e->status = status;
    e->type = type;
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

char *oai_error_json(const struct oai_error *e)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    if (!o) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type ? e->type : T_SERVER);
    if (e->param[0])
        cJSON_AddStringToObject(o, "param", e->param);
    else
        cJSON_AddNullToObject(o, "param");
    if (e->code[0])
        cJSON_AddStringToObject(o, "code", e->code);
    else
        cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

void oai_error_from_event(const char *code, const char *message, int64_t retry_after_ms,
                          struct oai_error *e)
{
    enum ev_code c = ev_code_from_name(code ? code : "");
    const char *msg = message && message[0] ? message : "the request failed";
    if (code && !strcmp(code, "OVERLOADED")) {
        /* the dispatcher's backpressure: the queue is full for now. 503,
         * not 429: the client is within its own limits, the service is
         * not; both make the OpenAI SDKs retry after Retry-After */
        oai_error_set(e, 503, T_SERVER, "OVERLOADED", NULL, "%s", msg);
        e->retry_after_s = retry_after_ms > 0 ? (int)((retry_after_ms + 999) / 1000) : 1;
        return;
    }
    switch (c) {
    case EV_CODE_MODEL_NOT_FOUND: /* the dispatcher found no worker of the model */
        oai_error_set(e, 404, T_INVALID, "model_not_found", "model", "%s", msg);
        return;
    case EV_CODE_JOB_TOO_LARGE:
        oai_error_set(e, 413, T_INVALID, code, NULL, "%s", msg);
        return;
    case EV_CODE_PROMPT_TOO_LONG:
        oai_error_set(e, 400, T_INVALID, "context_length_exceeded", "messages", "%s", msg);
        return;
    case EV_CODE_BAD_ENTRY: case EV_CODE_BAD_UTF8: case EV_CODE_INVALID_JSON:
    case EV_CODE_NOT_OBJECT: case EV_CODE_UNKNOWN_FIELD: case EV_CODE_DUPLICATE_FIELD:
    case EV_CODE_BAD_TYPE: case EV_CODE_OUT_OF_RANGE: case EV_CODE_BAD_VALUE:
    case EV_CODE_BAD_ID: case EV_CODE_MISSING_PROMPT: case EV_CODE_CONFLICTING_PROMPT:
    case EV_CODE_MISSING_FIELD: case EV_CODE_UNKNOWN_POOL: case EV_CODE_INVALID_TOKEN:
    case EV_CODE_TEMPLATE_ERROR: case EV_CODE_MODEL_REQUIRED: case EV_CODE_BAD_PARAM: {
        /* job.c's sentences start with the field path ("temperature: 2.5
         * is out of range"); a path holds no blank, and "job: ..." names
         * the job as a whole */
        char param[JOB_FIELD_MAX] = "";
        const char *colon = strstr(msg, ": ");
        if (colon && colon > msg && (size_t)(colon - msg) < sizeof param &&
            !memchr(msg, ' ', (size_t)(colon - msg)) && strncmp(msg, "job", 3)) {
            memcpy(param, msg, (size_t)(colon - msg));
            param[colon - msg] = 0;
        }
        if (c == EV_CODE_BAD_PARAM && (!param[0] || param[0] == '/'))
            /* the grammar compiler's sentences start with a JSON pointer
             * into the schema, or "grammar LINE:COL" */
            snprintf(param, sizeof param, "%s", !strncmp(msg, "grammar", 7) ? "grammar"
                                                : "response_format");
        oai_error_set(e, 400, T_INVALID, code, param, "%s", msg);
        return;
    }
    case EV_CODE_DEADLINE_EXCEEDED:
        oai_error_set(e, 504, T_SERVER, code, NULL, "%s", msg);
        return;
    default:
        oai_error_set(e, 500, T_SERVER, code && code[0] ? code : "INTERNAL", NULL, "%s", msg);
        return;
    }
}

/* ---- requests ---- */

enum kind {
    K_MODEL, K_MESSAGES, K_STREAM, K_STREAM_OPTIONS, K_MAX_TOKENS, K_MAX_COMPLETION_TOKENS,
    K_COPY, K_COPY_SET, K_TOP_K, K_N, K_LOGPROBS, K_TOP_LOGPROBS, K_TOOLS, K_TOOL_CHOICE,
    K_BOOL_IGNORED,
    K_CTK, K_MODE, K_STRING_IGNORED, K_RESPONSE_FORMAT, K_EFFORT,
    K_METADATA_IGNORED, K_MODALITIES, K_PROMPT, K_ECHO, K_SUFFIX, K_BEST_OF,
    K_PRIORITY, K_DEADLINE, K_SKIP_SPECIAL, K_THINK_BUDGET,
    K_GUIDED_JSON, K_GUIDED_CHOICE,
};

/* Which endpoint takes a member: chat, completions or both. */
#define A_CHAT (1u << OAI_API_CHAT)
#define A_COMPL (1u << OAI_API_COMPLETIONS)
#define A_BOTH (A_CHAT | A_COMPL)

/* Every member a request may have. Anything else is UNKNOWN_FIELD, so a
 * misspelt parameter ("temprature") is an error, never silently dropped.
 * The harmless ones the official SDKs send, which change nothing about
 * the answer, are accepted with their type checked and then ignored:
 * user, service_tier, store, metadata, parallel_tool_calls,
 * safety_identifier, prompt_cache_key, modalities (["text"] only)
 * (schemas/README.md lists them). */
static const struct {
    const char *name;
    enum kind kind;
    unsigned apis;
} fields[] = {
    {"model", K_MODEL, A_BOTH},
    {"messages", K_MESSAGES, A_CHAT},
    {"prompt", K_PROMPT, A_COMPL},
    {"stream", K_STREAM, A_BOTH},
    {"stream_options", K_STREAM_OPTIONS, A_BOTH},
    {"max_tokens", K_MAX_TOKENS, A_BOTH},
    {"max_completion_tokens", K_MAX_COMPLETION_TOKENS, A_CHAT},
    {"temperature", K_COPY, A_BOTH},
    {"top_p", K_COPY, A_BOTH},
    {"seed", K_COPY, A_BOTH},
    {"stop", K_COPY, A_BOTH},
    {"presence_penalty", K_COPY, A_BOTH},
    {"frequency_penalty", K_COPY, A_BOTH},
    {"min_p", K_COPY, A_BOTH},              /* extension, as vLLM */
    {"repetition_penalty", K_COPY, A_BOTH}, /* extension, as vLLM */
    {"ignore_eos", K_COPY, A_BOTH},         /* extension, as vLLM */
    {"speculative", K_COPY, A_BOTH},        /* extension: false = plain decoding (issue 18) */
    {"top_k", K_TOP_K, A_BOTH},             /* extension, as vLLM (-1 = off) */
    {"n", K_N, A_BOTH},
    {"best_of", K_BEST_OF, A_COMPL},
    {"echo", K_ECHO, A_COMPL},
    {"suffix", K_SUFFIX, A_COMPL},
    {"logprobs", K_LOGPROBS, A_BOTH},       /* chat: bool; completions: 0..20 */
    {"top_logprobs", K_TOP_LOGPROBS, A_CHAT},
    {"tools", K_TOOLS, A_CHAT},
    {"tool_choice", K_TOOL_CHOICE, A_CHAT},
    {"chat_template_kwargs", K_CTK, A_CHAT}, /* extension, as vLLM: enable_thinking */
    {"reasoning_effort", K_EFFORT, A_CHAT},
    {"mode", K_MODE, A_CHAT},                /* extension: redlm's think / no_think / auto */
    {"response_format", K_RESPONSE_FORMAT, A_CHAT},
    {"logit_bias", K_COPY_SET, A_BOTH},         /* the job's; checked by job_parse (issue 29) */
    /* the job's own, over HTTP (issue 29) */
    {"priority", K_PRIORITY, A_BOTH},               /* vLLM's: lower first */
    {"max_thinking_tokens", K_THINK_BUDGET, A_CHAT}, /* the thinking budget */
    {"thinking_budget", K_THINK_BUDGET, A_CHAT},     /* its other name */
    {"deadline_ms", K_DEADLINE, A_BOTH},            /* Unix ms; the sooner one wins */
    {"grammar", K_COPY, A_BOTH},                    /* schemas/grammar.md */
    /* vLLM's guided decoding, as the constraints the job has */
    {"guided_json", K_GUIDED_JSON, A_BOTH},     /* response_format json_schema */
    {"guided_choice", K_GUIDED_CHOICE, A_BOTH}, /* a grammar of the choices */
    /* vLLM's, the job's own (issue 29) */
    {"min_tokens", K_COPY_SET, A_BOTH},
    {"stop_token_ids", K_COPY_SET, A_BOTH},
    {"skip_special_tokens", K_SKIP_SPECIAL, A_BOTH},
    /* vLLM's prefill: the last (assistant) message is continued; vLLM asks
     * add_generation_prompt false beside it, which adds nothing here */
    {"continue_final_message", K_COPY, A_CHAT},
    {"add_generation_prompt", K_BOOL_IGNORED, A_CHAT},
    /* accepted and ignored */
    {"user", K_STRING_IGNORED, A_BOTH},
    {"service_tier", K_STRING_IGNORED, A_BOTH},
    {"safety_identifier", K_STRING_IGNORED, A_BOTH},
    {"prompt_cache_key", K_STRING_IGNORED, A_BOTH},
    {"store", K_BOOL_IGNORED, A_BOTH},
    {"parallel_tool_calls", K_BOOL_IGNORED, A_CHAT},
    {"metadata", K_METADATA_IGNORED, A_BOTH},
    {"modalities", K_MODALITIES, A_CHAT},
};
#define N_FIELDS ((int)(sizeof fields / sizeof fields[0]))
_Static_assert(N_FIELDS <= 64, "the seen mask is 64 bits");

/* job[k] = a copy of v; v NULL adds nothing. false: out of memory. */
static bool add_copy(cJSON *job, const char *k, const cJSON *v)
{
    if (!v)
        return true;
    cJSON *c = cJSON_Duplicate(v, 1);
    if (c && cJSON_AddItemToObject(job, k, c))
        return true;
    cJSON_Delete(c);
    return false;
}

int oai_bad_request(struct oai_error *e, const char *code, const char *param, const char *fmt, ...)
{
    char msg[RL_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    oai_error_set(e, 400, T_INVALID, code, param, "%s", msg);
    return -RL_EINVAL;
}

int oai_walk_members(const cJSON *root, const struct oai_member *table, int n, unsigned api_bit,
                     const struct oai_limits *lim, struct oai_request *out, struct oai_error *e,
                     int (*take)(void *ctx, int tag, const char *name, const cJSON *v),
                     void *ctx)
{
    uint64_t seen = 0; /* tables have fewer than 64 members */
    const struct oai_member *rest = n && !table[n - 1].name ? &table[n - 1] : NULL;
    for (const cJSON *v = root->child; v; v = v->next) {
        int k = 0;
        while (k < n && (!table[k].name || strcmp(table[k].name, v->string)))
            k++;
        if ((k == n || !(table[k].apis & api_bit)) && rest) {
            int rc = cJSON_IsNull(v) ? 0 : take(ctx, rest->tag, v->string, v);
            if (rc)
                return rc;
            continue;
        }
        if (k == n || !(table[k].apis & api_bit)) {
            if (oai_not_applied(lim, out, v->string, "UNKNOWN_FIELD",
                                "unknown or unsupported parameter", e))
                return -RL_EINVAL;
            continue;
        }
        if (seen & (1ull << k))
            return oai_bad_request(e, "DUPLICATE_FIELD", table[k].name, "%s: given twice",
                                   table[k].name);
        seen |= 1ull << k;
        if (cJSON_IsNull(v))
            continue;
        int rc = take(ctx, table[k].tag, table[k].name, v);
        if (rc)
            return rc;
    }
    return 0;
}

int oai_onepass_event(const char *event, size_t len, int64_t *next_seq, const char *what,
                      cJSON **done, struct oai_error *e)
{
    *done = NULL;
    cJSON *ev = event ? cJSON_ParseWithLength(event, len) : NULL;
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(ev, "seq");
    const char *type = oai_str_member(ev, "type");
    int rc = OAI_FAILED;
    if (!cJSON_IsObject(ev) || !cJSON_IsNumber(seq) || !type ||
        seq->valuedouble != (double)*next_seq) {
        oai_error_set(e, 502, "server_error", "BAD_EVENT", NULL,
                      "event %lld of %s's job is not a valid event", (long long)*next_seq, what);
    } else if (++*next_seq, !strcmp(type, "error")) {
        const cJSON *ra = cJSON_GetObjectItemCaseSensitive(ev, "retry_after_ms");
        oai_error_from_event(oai_str_member(ev, "code"), oai_str_member(ev, "message"),
                             cJSON_IsNumber(ra) && ra->valuedouble > 0 && ra->valuedouble < 1e9
                                 ? (int64_t)ra->valuedouble : 0,
                             e);
    } else if (!strcmp(type, "done")) {
        *done = ev;
        return OAI_END;
    } else if (!strcmp(type, "delta")) {
        rc = OAI_MORE; /* a one-pass job writes none; nothing in one to keep */
    } else {
        oai_error_set(e, 502, "server_error", "BAD_EVENT", NULL,
                      "event type \"%.20s\" is unknown", type);
    }
    cJSON_Delete(ev);
    return rc;
}

int oai_seal_job(cJSON *j, const struct oai_limits *lim, int64_t deadline_ms, char **text,
                 struct job_fault *fault, struct rl_err *jerr)
{
    *text = NULL;
    bool ok = j && cJSON_AddStringToObject(j, "mode", "no_think");
    if (ok && deadline_ms > 0)
        ok = cJSON_AddNumberToObject(j, "deadline_ms", (double)deadline_ms) != NULL;
    if (ok && lim->client_lease_ms > 0)
        ok = cJSON_AddNumberToObject(j, "client_lease_ms", lim->client_lease_ms) != NULL;
    if (ok && lim->stream_ttl_s > 0)
        ok = cJSON_AddNumberToObject(j, "stream_ttl_s", lim->stream_ttl_s) != NULL;
    char *t = ok ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!t)
        return -RL_ENOMEM;
    struct job *jb = NULL;
    int rc = job_parse(t, strlen(t), lim->job, &jb, fault, jerr);
    if (rc) {
        free(t);
        return rc;
    }
    job_free(jb);
    *text = t;
    return 0;
}

int oai_lay_out_jobs(struct oai_request *out, int n, const char *id,
                     int (*build)(void *ctx, int i, const char *jid, char **text), void *ctx)
{
    out->n_jobs = n;
    out->n_per_prompt = 1;
    if (n == 1) {
        int rc = build(ctx, 0, id, &out->job);
        if (!rc)
            out->job_len = strlen(out->job);
        return rc;
    }
    if (!(out->jobs = calloc((size_t)n, sizeof *out->jobs)) ||
        !(out->job_lens = calloc((size_t)n, sizeof *out->job_lens)))
        return -RL_ENOMEM;
    for (int i = 0; i < n; i++) {
        char jid[JOB_ID_MAX + 1];
        snprintf(jid, sizeof jid, "%.100s-%d", id, i);
        int rc = build(ctx, i, jid, &out->jobs[i]);
        if (rc)
            return rc;
        out->job_lens[i] = strlen(out->jobs[i]);
    }
    out->job = out->jobs[0];
    out->job_len = out->job_lens[0];
    return 0;
}

bool oai_is_integer(const cJSON *v)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && floor(v->valuedouble) == v->valuedouble;
}

/* A positive token count bounded by the limit. */
static int get_tokens(const cJSON *v, const char *name, int max, int *out, struct oai_error *e)
{
    if (!cJSON_IsNumber(v))
        return oai_bad_request(e, "BAD_TYPE", name, "%s: must be an integer", name);
    if (!oai_is_integer(v))
        return oai_bad_request(e, "BAD_TYPE", name, "%s: must be an integer, not %g", name,
                               v->valuedouble);
    if (v->valuedouble < 1 || v->valuedouble > max)
        return oai_bad_request(e, "OUT_OF_RANGE", name, "%s: %.0f is out of range [1, %d]", name,
                               v->valuedouble, max);
    *out = (int)v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *v, const char *name, bool *out, struct oai_error *e)
{
    if (!cJSON_IsBool(v))
        return oai_bad_request(e, "BAD_TYPE", name, "%s: must be true or false", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* The copy of messages that goes into the job: null members dropped
 * (except content, which may be null on an assistant turn with tool
 * calls), and empty annotations arrays that the SDKs echo back. */
static cJSON *clean_messages(const cJSON *m)
{
    cJSON *c = cJSON_Duplicate(m, 1);
    if (!c)
        return NULL;
    for (cJSON *msg = c->child; msg; msg = msg->next) {
        if (!cJSON_IsObject(msg))
            continue;
        for (cJSON *f = msg->child, *next; f; f = next) {
            next = f->next;
            bool drop = (cJSON_IsNull(f) && f->string && strcmp(f->string, "content")) ||
                        (f->string && !strcmp(f->string, "annotations") && cJSON_IsArray(f) &&
                         !f->child);
            if (drop)
                cJSON_Delete(cJSON_DetachItemViaPointer(msg, f));
        }
        /* current vLLM's name of an earlier turn's reasoning */
        cJSON *rs = cJSON_GetObjectItemCaseSensitive(msg, "reasoning");
        if (rs && cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content"))
            cJSON_DeleteItemFromObjectCaseSensitive(msg, "reasoning");
        else if (rs)
            cJSON_AddItemToObject(msg, "reasoning_content",
                                  cJSON_DetachItemViaPointer(msg, rs));
    }
    return c;
}

void oai_request_clear(struct oai_request *r)
{
    if (r->jobs) {
        for (int i = 0; i < r->n_jobs; i++)
            free(r->jobs[i]);
        free(r->jobs);
    } else {
        free(r->job);
    }
    free(r->job_lens);
    for (int i = 0; r->echo && i < r->n_jobs; i++)
        free(r->echo[i]);
    free(r->echo);
    memset(r, 0, sizeof *r);
}

/* What a job_parse fault looks like to the client: the job field is
 * renamed back to the request field it came from. */
int oai_model_name(const cJSON *v, const struct oai_limits *lim, bool ollama_tag,
                   char out[JOB_MODEL_MAX + 1], struct oai_error *e)
{
    out[0] = 0;
    if (!cJSON_IsString(v))
        return oai_bad_request(e, "BAD_TYPE", "model", "model: must be a string");
    const char *name = v->valuestring, *served = lim->model;
    size_t n = strlen(name);
    if (ollama_tag && n > 7 && !strcmp(name + n - 7, ":latest"))
        n -= 7;
    int shown = n < 200 ? (int)n : 200;
    bool other = served && (n != strlen(served) || strncmp(name, served, n));
    if (other && !lim->adapters) {
        oai_error_set(e, 404, T_INVALID, "model_not_found", "model",
                      "The model `%.*s` does not exist; this server serves `%.200s`.", shown,
                      name, served);
        return -RL_EINVAL;
    }
    if (served && !other)
        return 0;
    if (n > JOB_MODEL_MAX) { /* no model has such a name */
        oai_error_set(e, 404, T_INVALID, "model_not_found", "model",
                      "The model `%.*s` does not exist.", shown, name);
        return -RL_EINVAL;
    }
    memcpy(out, name, n);
    out[n] = 0;
    return 0;
}

bool oai_fault_settled(const struct job_fault *f, const struct rl_err *jerr, const char *own,
                       struct oai_error *e)
{
    if (!strcmp(f->field, "id") || !strcmp(f->field, "deadline_ms") ||
        (own && !strcmp(f->field, own))) {
        oai_error_set(e, 500, T_SERVER, "INTERNAL", NULL, "the front door built a bad job: %s",
                      jerr->msg);
        return true;
    }
    if (f->code == EV_CODE_JOB_TOO_LARGE) {
        oai_error_set(e, 413, T_INVALID, ev_code_name(f->code), NULL, "%s", jerr->msg);
        return true;
    }
    return false;
}

static void job_fault_error(const struct job_fault *f, const struct rl_err *jerr,
                            const char *max_tokens_name, struct oai_error *e)
{
    if (oai_fault_settled(f, jerr, NULL, e))
        return;
    const char *code = ev_code_name(f->code);
    const char *param = f->field;
    const char *msg = jerr->msg;
    if (!strcmp(param, "max_tokens") && strcmp(max_tokens_name, "max_tokens")) {
        /* "max_tokens: ..." -> "max_completion_tokens: ..." */
        oai_error_set(e, 400, T_INVALID, code, max_tokens_name, "%s%s", max_tokens_name,
                      msg + (strncmp(msg, "max_tokens", 10) ? 0 : 10));
        return;
    }
    oai_error_set(e, 400, T_INVALID, code, param, "%s", msg);
}

/* reasoning_effort: the OpenAI levels, as a thinking switch. */
static int effort_mode(const cJSON *v, int *think, struct oai_error *e)
{
    static const char *const off[] = {"none", "minimal", "low"};
    static const char *const on[] = {"medium", "high", "xhigh"};
    if (!cJSON_IsString(v))
        return oai_bad_request(e, "BAD_TYPE", "reasoning_effort",
                               "reasoning_effort: must be a string");
    for (int i = 0; i < 3; i++) {
        if (!strcmp(v->valuestring, off[i])) {
            *think = 0;
            return 0;
        }
        if (!strcmp(v->valuestring, on[i])) {
            *think = 1;
            return 0;
        }
    }
    return oai_bad_request(e, "BAD_VALUE", "reasoning_effort",
                           "reasoning_effort: \"%.20s\" is not one of none, minimal, low "
                           "(no thinking), medium, high, xhigh (thinking)", v->valuestring);
}

/* The completions prompt: a string, token ids, or a list holding one of
 * those; copied into the job as prompt or prompt_ids. */
/* A list of prompts (strings or token-id lists): batched, one choice each. */
static bool prompt_is_list(const cJSON *v)
{
    return cJSON_IsArray(v) && v->child && (cJSON_IsString(v->child) || cJSON_IsArray(v->child));
}

/* Writes one prompt p (a string or token ids) into job as prompt or
 * prompt_ids, replacing what is there. */
static int put_one_prompt(const cJSON *p, cJSON *job, struct oai_error *e)
{
    cJSON_DeleteItemFromObjectCaseSensitive(job, "prompt");
    cJSON_DeleteItemFromObjectCaseSensitive(job, "prompt_ids");
    if (cJSON_IsString(p)) {
        cJSON *c = cJSON_CreateString(p->valuestring);
        if (!c || !cJSON_AddItemToObject(job, "prompt", c)) {
            cJSON_Delete(c);
            return -RL_ENOMEM;
        }
        return 0;
    }
    if (!cJSON_IsArray(p))
        return oai_bad_request(e, "BAD_TYPE", "prompt",
                               "prompt: must be a string or an array of token ids");
    const cJSON *t;
    cJSON_ArrayForEach(t, p)
    {
        if (!oai_is_integer(t))
            return oai_bad_request(e, "BAD_TYPE", "prompt", "prompt: token ids must be integers");
    }
    cJSON *c = cJSON_Duplicate(p, 1);
    if (!c || !cJSON_AddItemToObject(job, "prompt_ids", c)) {
        cJSON_Delete(c);
        return -RL_ENOMEM;
    }
    return 0;
}

/* The prompt member: one prompt, or a list of them (each checked here;
 * the job gets the first, expand_jobs the others). */
static int put_prompt(const cJSON *v, cJSON *job, struct oai_error *e)
{
    if (!prompt_is_list(v))
        return put_one_prompt(v, job, e);
    int n = cJSON_GetArraySize(v);
    if (n > OAI_CHOICES_MAX)
        return oai_bad_request(e, "OUT_OF_RANGE", "prompt",
                               "prompt: %d prompts is over the limit of %d",
                               n, OAI_CHOICES_MAX);
    const cJSON *p;
    cJSON_ArrayForEach(p, v)
    {
        int rc = put_one_prompt(p, job, e);
        if (rc)
            return rc;
    }
    return put_one_prompt(v->child, job, e);
}

/* What one request's parse carries from step to step: the inputs, the job
 * being built, and the members the walk keeps for the rules across them
 * (which can only be checked once every member is seen). Borrowed pointers
 * point into the parsed body, which outlives the steps. */
struct parse_state {
    enum oai_api api;
    const struct oai_limits *lim;
    struct oai_request *out;
    struct oai_error *e;
    cJSON *job; /* owned by parse_request */
    const cJSON *messages, *prompt, *tools, *tool_choice, *stream_options, *response_format;
    const cJSON *mode;
    int max_tokens, max_completion_tokens;
    const char *max_tokens_name; /* the request's name for the job's max_tokens */
    int enable_thinking;         /* -1 absent, else 0/1 */
    int effort;                  /* reasoning_effort: -1 absent, else 0/1 */
    bool logprobs, top_logprobs_given;
    int top_logprobs;
    int64_t deadline_ms;         /* the request's own deadline_ms, 0 = none */
    int n;                       /* choices per prompt (n), 1 when absent */
    bool echo;                   /* completions: the prompt before each text */
    cJSON *guided_rf;            /* guided_json as a response_format, owned; or NULL */
};

int oai_not_applied(const struct oai_limits *lim, struct oai_request *out, const char *name,
                    const char *code, const char *why, struct oai_error *e)
{
    if (lim->refuse_unknown) {
        oai_error_set(e, 400, T_INVALID, code, name, "%.80s: %s", name, why);
        return -RL_EINVAL;
    }
    char *g = out->ignored;
    size_t n = strlen(g), room = sizeof out->ignored;
    if (n + 2 + strlen(name) + 6 > room) { /* keep room for ", ..." */
        if (!strstr(g, ", ...") && n + 6 <= room)
            strcat(g, ", ...");
        return 0;
    }
    snprintf(g + n, room - n, "%s%s", n ? ", " : "", name);
    return 0;
}

/* A member (or value) accepted but not applied (oai_not_applied). */
static int not_applied(struct parse_state *ps, const char *name, const char *code,
                       const char *why)
{
    return oai_not_applied(ps->lim, ps->out, name, code, why, ps->e);
}

/* An object of boolean switches, the shape of stream_options and
 * chat_template_kwargs: `key` (true, false or null) is the one applied,
 * *out -1 when absent or null, else 0 or 1. Any other member is accepted
 * and named (stream_options.continuous_usage_stats, chat_template_kwargs
 * of other templates), or refused (refuse_unknown). */
static int get_flags(struct parse_state *ps, const cJSON *v, const char *name, const char *key,
                     int *out)
{
    *out = -1;
    if (!cJSON_IsObject(v))
        return oai_bad_request(ps->e, "BAD_TYPE", name, "%s: must be an object", name);
    for (const cJSON *o = v->child; o; o = o->next) {
        char p[JOB_FIELD_MAX];
        snprintf(p, sizeof p, "%s.%.60s", name, o->string);
        bool b = false;
        if (strcmp(o->string, key)) {
            if (not_applied(ps, p, "UNKNOWN_FIELD", "unknown or unsupported parameter"))
                return -RL_EINVAL;
            continue;
        }
        if (cJSON_IsNull(o))
            continue;
        if (get_bool(o, p, &b, ps->e))
            return -RL_EINVAL;
        *out = b;
    }
    return 0;
}

/* An integer in [lo, hi], else a 400 naming it. */
static int get_int(const cJSON *v, const char *name, double lo, double hi, struct oai_error *e)
{
    if (!oai_is_integer(v))
        return oai_bad_request(e, "BAD_TYPE", name, "%s: must be an integer", name);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return oai_bad_request(e, "OUT_OF_RANGE", name, "%s: %.0f is out of range [%.0f, %.0f]",
                               name, v->valuedouble, lo, hi);
    return 0;
}

/* The job's own members that HTTP names (or means) otherwise, and vLLM's
 * that are accepted with the value that changes nothing. */
static int take_extension(struct parse_state *ps, enum kind kind, const char *name,
                          const cJSON *v)
{
    struct oai_error *e = ps->e;
    switch (kind) {
    case K_PRIORITY:
        /* vLLM's: lower is served first; the job's (-1000..1000): higher first */
        if (get_int(v, name, -1000, 1000, e))
            return -RL_EINVAL;
        return cJSON_AddNumberToObject(ps->job, "priority", v->valuedouble ? -v->valuedouble : 0)
                   ? 0 : -RL_ENOMEM;
    case K_DEADLINE:
        if (get_int(v, name, 0, 9007199254740991.0, e))
            return -RL_EINVAL;
        ps->deadline_ms = (int64_t)v->valuedouble;
        return 0;
    case K_THINK_BUDGET:
        if (cJSON_GetObjectItemCaseSensitive(ps->job, "max_thinking_tokens"))
            return oai_bad_request(e, "DUPLICATE_FIELD", name,
                                   "%s: the thinking budget is given twice (max_thinking_tokens, "
                                   "thinking_budget)", name);
        return cJSON_AddItemToObject(ps->job, "max_thinking_tokens", cJSON_Duplicate(v, 1))
                   ? 0 : -RL_ENOMEM;
    case K_GUIDED_JSON: {
        /* a schema object, or its JSON text (vLLM takes both) */
        cJSON *schema = cJSON_IsString(v) ? cJSON_Parse(v->valuestring) : cJSON_Duplicate(v, 1);
        if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema)) {
            cJSON_Delete(schema);
            return oai_bad_request(e, "BAD_TYPE", name,
                                   "%s: must be a JSON schema (an object or its text)",
                                   name);
        }
        cJSON *rf = cJSON_CreateObject(), *js = NULL;
        if (!rf || !cJSON_AddStringToObject(rf, "type", "json_schema") ||
            !(js = cJSON_AddObjectToObject(rf, "json_schema")) ||
            !cJSON_AddStringToObject(js, "name", "guided_json") ||
            !cJSON_AddItemToObject(js, "schema", schema)) {
            cJSON_Delete(rf);
            return -RL_ENOMEM;
        }
        cJSON_Delete(ps->guided_rf);
        ps->guided_rf = rf;
        return 0;
    }
    case K_GUIDED_CHOICE: {
        /* root ::= "a" | "b": the answer is one of the strings, as they are */
        if (!cJSON_IsArray(v) || !v->child)
            return oai_bad_request(e, "BAD_TYPE", name, "%s: must be a non-empty array of strings",
                                   name);
        struct text g = {0};
        int rc = text_add(&g, "root ::=", 8);
        const cJSON *c;
        cJSON_ArrayForEach(c, v)
        {
            if (!cJSON_IsString(c) || !c->valuestring[0]) {
                text_free(&g);
                return oai_bad_request(e, "BAD_TYPE", name,
                                       "%s: each choice must be a non-empty string",
                                       name);
            }
            rc = rc ? rc : text_add(&g, c == v->child ? " \"" : " | \"", c == v->child ? 2 : 4);
            for (const unsigned char *p = (const unsigned char *)c->valuestring; *p && !rc; p++) {
                char esc[8];
                if (*p == '"' || *p == '\\')
                    snprintf(esc, sizeof esc, "\\%c", *p);
                else if (*p < 0x20 || *p == 0x7f)
                    snprintf(esc, sizeof esc, "\\x%02X", *p);
                else
                    snprintf(esc, sizeof esc, "%c", *p);
                rc = text_add(&g, esc, strlen(esc));
            }
            rc = rc ? rc : text_add(&g, "\"", 1);
        }
        if (!rc && !cJSON_AddStringToObject(ps->job, "grammar", g.p))
            rc = -RL_ENOMEM;
        text_free(&g);
        return rc;
    }
    default: { /* K_SKIP_SPECIAL: the job's; true (the default) makes no member */
        bool b = false;
        if (get_bool(v, name, &b, e))
            return -RL_EINVAL;
        return b || cJSON_AddFalseToObject(ps->job, "skip_special_tokens") ? 0 : -RL_ENOMEM;
    }
    }
}

/* The steps below return 0, -RL_EINVAL with ps->e filled, or -RL_ENOMEM
 * with ps->e untouched (parse_request writes the one out-of-memory error). */

/* model: the one served name, or (lim->model NULL) any name, carried in
 * the job for the dispatcher to route by. */
static int take_model(struct parse_state *ps, enum kind kind, const char *name, const cJSON *v)
{
    int rc = oai_model_name(v, ps->lim, false, ps->out->model, ps->e);
    if (rc || !ps->out->model[0])
        return rc;
    return cJSON_AddStringToObject(ps->job, "model", ps->out->model) ? 0 : -RL_ENOMEM;
}

/* messages or prompt: kept for build_job, which copies the one given. */
static int take_input(struct parse_state *ps, enum kind kind, const char *name, const cJSON *v)
{
    if (kind == K_PROMPT) {
        ps->prompt = v; /* put_prompt checks it */
        return 0;
    }
    if (!cJSON_IsArray(v))
        return oai_bad_request(ps->e, "BAD_TYPE", "messages", "messages: must be an array");
    ps->messages = v;
    return 0;
}

/* The numbers of sampling and length. Most are the job's own fields,
 * copied as they are for job_parse to check, so both places agree. */
static int take_sampling(struct parse_state *ps, enum kind kind, const char *name,
                         const cJSON *v)
{
    struct oai_error *e = ps->e;
    switch (kind) {
    case K_MAX_TOKENS:
        return get_tokens(v, name, ps->lim->max_tokens, &ps->max_tokens, e);
    case K_MAX_COMPLETION_TOKENS:
        return get_tokens(v, name, ps->lim->max_tokens, &ps->max_completion_tokens, e);
    case K_N:
        if (get_int(v, name, 1, OAI_CHOICES_MAX, e))
            return -RL_EINVAL;
        ps->n = (int)v->valuedouble;
        return 0;
    case K_TOP_K:
        /* -1 is vLLM's "off"; the job's off is 0, its default. Any other
         * value is the job's top_k, checked there. */
        if (cJSON_IsNumber(v) && v->valuedouble == -1)
            return 0;
        return add_copy(ps->job, name, v) ? 0 : -RL_ENOMEM;
    case K_COPY_SET:
        /* the job's, copied unless neutral (0, [], {}), so a request that
         * names them at that value makes the same job as one without */
        if ((cJSON_IsNumber(v) && v->valuedouble == 0) ||
            ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child))
            return 0;
        return add_copy(ps->job, name, v) ? 0 : -RL_ENOMEM;
    default: /* K_COPY */
        return add_copy(ps->job, name, v) ? 0 : -RL_ENOMEM;
    }
}

/* A 0..JOB_LOGPROBS_MAX count of alternatives per token. */
static int get_logprobs_count(const cJSON *v, const char *name, int *out, struct oai_error *e)
{
    if (!oai_is_integer(v))
        return oai_bad_request(e, "BAD_TYPE", name, "%s: must be an integer", name);
    if (v->valuedouble < 0 || v->valuedouble > JOB_LOGPROBS_MAX)
        return oai_bad_request(e, "OUT_OF_RANGE", name, "%s: %g is out of range [0, %d]", name,
                               v->valuedouble, JOB_LOGPROBS_MAX);
    *out = (int)v->valuedouble;
    return 0;
}

/* logprobs (chat: a switch; completions: the legacy count, 0 = the chosen
 * token's only) and chat's top_logprobs. */
static int take_logprobs(struct parse_state *ps, enum kind kind, const char *name,
                         const cJSON *v)
{
    if (kind == K_TOP_LOGPROBS) {
        if (get_logprobs_count(v, name, &ps->top_logprobs, ps->e))
            return -RL_EINVAL;
        ps->top_logprobs_given = true;
        return 0;
    }
    if (ps->api == OAI_API_CHAT)
        return get_bool(v, name, &ps->logprobs, ps->e);
    if (get_logprobs_count(v, name, &ps->top_logprobs, ps->e))
        return -RL_EINVAL;
    ps->logprobs = true;
    return 0;
}

/* tools, tool_choice and response_format: the job's own fields, kept for
 * build_job; job_parse checks them (and that a forced call has its tools). */
static int take_constraints(struct parse_state *ps, enum kind kind, const char *name,
                            const cJSON *v)
{
    if (kind == K_TOOLS)
        ps->tools = v;
    else if (kind == K_TOOL_CHOICE)
        ps->tool_choice = v;
    else
        ps->response_format = v;
    return 0;
}

/* The three ways to ask for thinking or not: mode, reasoning_effort and
 * chat_template_kwargs.enable_thinking; check_across makes them agree. */
static int take_thinking(struct parse_state *ps, enum kind kind, const char *name,
                         const cJSON *v)
{
    if (kind == K_MODE) {
        ps->mode = v; /* the job's own field: job_parse checks it */
        return 0;
    }
    if (kind == K_EFFORT)
        return effort_mode(v, &ps->effort, ps->e);
    return get_flags(ps, v, name, "enable_thinking", &ps->enable_thinking);
}

/* stream, and stream_options (checked against stream once both are seen). */
static int take_stream(struct parse_state *ps, enum kind kind, const char *name,
                       const cJSON *v)
{
    if (kind == K_STREAM)
        return get_bool(v, name, &ps->out->stream, ps->e);
    int usage;
    if (get_flags(ps, v, name, "include_usage", &usage))
        return -RL_EINVAL;
    ps->stream_options = v;
    if (usage >= 0)
        ps->out->include_usage = usage;
    return 0;
}

/* Members accepted only with the value that changes nothing (echo false,
 * suffix "", best_of 1, modalities ["text"]) or with their
 * type checked and then ignored. */
static int take_ignored(struct parse_state *ps, enum kind kind, const char *name,
                        const cJSON *v)
{
    struct oai_error *e = ps->e;
    bool b = false;
    switch (kind) {
    case K_ECHO:
        return get_bool(v, name, &ps->echo, e);
    case K_SUFFIX:
        if (!cJSON_IsString(v))
            return oai_bad_request(e, "BAD_TYPE", name, "suffix: must be a string");
        if (v->valuestring[0])
            return oai_bad_request(e, "BAD_VALUE", name,
                                   "suffix: fill-in-the-middle is not supported: Qwen3 was "
                                   "not trained for it (its <|fim_*|> tokens are unused); "
                                   "give none or \"\"");
        return 0;
    case K_BEST_OF:
        if (!oai_is_integer(v) || v->valuedouble != 1)
            return oai_bad_request(e, "OUT_OF_RANGE", name,
                                   "best_of: only 1 is supported (use n for several choices)");
        return 0;
    case K_METADATA_IGNORED: {
        bool ok = cJSON_IsObject(v);
        for (const cJSON *m = ok ? v->child : NULL; m; m = m->next)
            ok = ok && cJSON_IsString(m);
        return ok ? 0 : oai_bad_request(e, "BAD_TYPE", name,
                                        "metadata: must be an object of strings");
    }
    case K_MODALITIES: {
        bool ok = cJSON_IsArray(v);
        for (const cJSON *m = ok ? v->child : NULL; m; m = m->next)
            ok = ok && cJSON_IsString(m) && !strcmp(m->valuestring, "text");
        return ok ? 0 : oai_bad_request(e, "BAD_VALUE", name,
                                        "modalities: only [\"text\"] is supported");
    }
    case K_STRING_IGNORED:
        return cJSON_IsString(v) ? 0 : oai_bad_request(e, "BAD_TYPE", name, "%s: must be a string",
                                                       name);
    default: /* K_BOOL_IGNORED */
        return get_bool(v, name, &b, e);
    }
}

/* The step of each kind's family: one per family of members, all with
 * the same contract, so a new member is a row in fields and an entry here. */
typedef int take_fn(struct parse_state *ps, enum kind kind, const char *name, const cJSON *v);
static take_fn *const take_step[] = {
    [K_MODEL] = take_model,
    [K_MESSAGES] = take_input, [K_PROMPT] = take_input,
    [K_MAX_TOKENS] = take_sampling, [K_MAX_COMPLETION_TOKENS] = take_sampling,
    [K_COPY] = take_sampling, [K_COPY_SET] = take_sampling, [K_TOP_K] = take_sampling,
    [K_N] = take_sampling,
    [K_LOGPROBS] = take_logprobs, [K_TOP_LOGPROBS] = take_logprobs,
    [K_TOOLS] = take_constraints, [K_TOOL_CHOICE] = take_constraints,
    [K_RESPONSE_FORMAT] = take_constraints,
    [K_CTK] = take_thinking, [K_MODE] = take_thinking, [K_EFFORT] = take_thinking,
    [K_STREAM] = take_stream, [K_STREAM_OPTIONS] = take_stream,
    [K_ECHO] = take_ignored, [K_SUFFIX] = take_ignored, [K_BEST_OF] = take_ignored,
    [K_BOOL_IGNORED] = take_ignored,
    [K_STRING_IGNORED] = take_ignored, [K_METADATA_IGNORED] = take_ignored,
    [K_MODALITIES] = take_ignored,
    [K_PRIORITY] = take_extension, [K_DEADLINE] = take_extension,
    [K_THINK_BUDGET] = take_extension, [K_SKIP_SPECIAL] = take_extension,
    [K_GUIDED_JSON] = take_extension, [K_GUIDED_CHOICE] = take_extension,
};

/* Every member of the body against the fields table, in body order, so the
 * first bad member is the one reported. */
static int walk_members(struct parse_state *ps, const cJSON *root)
{
    uint64_t seen = 0;
    for (const cJSON *v = root->child; v; v = v->next) {
        int k = 0;
        while (k < N_FIELDS && strcmp(fields[k].name, v->string))
            k++;
        if (k == N_FIELDS || !(fields[k].apis & (1u << ps->api))) {
            /* vLLM ignores what it does not know; http_unknown_fields */
            if (not_applied(ps, v->string, "UNKNOWN_FIELD", "unknown or unsupported parameter"))
                return -RL_EINVAL;
            continue;
        }
        const char *name = fields[k].name;
        if (seen & (1ull << k))
            return oai_bad_request(ps->e, "DUPLICATE_FIELD", name, "%s: given twice", name);
        seen |= 1ull << k;
        if (cJSON_IsNull(v))
            continue; /* null = absent, as OpenAI reads it */
        enum kind kind = fields[k].kind;
        if ((size_t)kind >= sizeof take_step / sizeof take_step[0] || !take_step[kind])
            abort(); /* a kind with no step: a broken table */
        int rc = take_step[kind](ps, kind, name, v);
        if (rc)
            return rc;
    }
    return 0;
}

/* The rules across members; then enable_thinking falls back to
 * reasoning_effort, which agrees with it by now. */
static int check_across(struct parse_state *ps)
{
    struct oai_error *e = ps->e;
    if (ps->api == OAI_API_COMPLETIONS && !ps->prompt)
        return oai_bad_request(e, "MISSING_FIELD", "prompt", "prompt: required");
    if (ps->api == OAI_API_CHAT && !ps->messages)
        return oai_bad_request(e, "MISSING_FIELD", "messages", "messages: required");
    int n_msg = ps->messages ? cJSON_GetArraySize(ps->messages) : 0;
    if (n_msg > ps->lim->max_messages)
        return oai_bad_request(e, "OUT_OF_RANGE", "messages",
                               "messages: %d messages is over the limit of %d", n_msg,
                               ps->lim->max_messages);
    if (ps->stream_options && !ps->out->stream)
        return oai_bad_request(e, "BAD_VALUE", "stream_options",
                               "stream_options: only allowed when stream is true");
    if (ps->top_logprobs_given && !ps->logprobs)
        return oai_bad_request(e, "BAD_VALUE", "top_logprobs",
                               "top_logprobs: requires logprobs: true");
    int n_prompts = prompt_is_list(ps->prompt) ? cJSON_GetArraySize(ps->prompt) : 1;
    if (n_prompts * ps->n > OAI_CHOICES_MAX)
        return oai_bad_request(e, "OUT_OF_RANGE", "n",
                               "n: %d prompts times n %d is over %d choices",
                               n_prompts, ps->n, OAI_CHOICES_MAX);
    if (ps->echo && ps->logprobs)
        return oai_bad_request(e, "BAD_VALUE", "echo",
                               "echo: not with logprobs (redlm computes no prompt logprobs)");
    if (ps->echo && ps->prompt) {
        const cJSON *p = prompt_is_list(ps->prompt) ? ps->prompt->child : ps->prompt;
        for (; p; p = prompt_is_list(ps->prompt) ? p->next : NULL)
            if (!cJSON_IsString(p))
                return oai_bad_request(e, "BAD_VALUE", "echo",
                                       "echo: only with text prompts (the front door does not turn "
                                       "token ids back into text)");
    }
    const cJSON *mode = ps->mode;
    int think = ps->enable_thinking;
    const char *mode_s = cJSON_IsString(mode) ? mode->valuestring : NULL;
    if (mode_s && think >= 0 && strcmp(mode_s, think ? "think" : "no_think"))
        return oai_bad_request(e, "BAD_VALUE", "mode",
                               "mode: \"%.20s\" contradicts "
                               "chat_template_kwargs.enable_thinking: %s",
                               mode_s, think ? "true" : "false");
    int effort = ps->effort;
    if (effort >= 0 && ((think >= 0 && effort != think) ||
                        (mode_s && !strcmp(mode_s, effort ? "no_think" : "think"))))
        return oai_bad_request(e, "BAD_VALUE", "reasoning_effort",
                               "reasoning_effort: contradicts %s",
                               think >= 0 ? "chat_template_kwargs.enable_thinking" : "mode");
    if (think < 0)
        ps->enable_thinking = effort;
    return 0;
}

/* The job's members from what the walk kept: the input, tools and
 * constraints, max_tokens, logprobs, mode and the deadline. */
static int build_job(struct parse_state *ps, int64_t deadline_ms)
{
    cJSON *job = ps->job;
    if (ps->prompt) {
        int rc = put_prompt(ps->prompt, job, ps->e);
        if (rc)
            return rc;
    } else {
        cJSON *m = clean_messages(ps->messages);
        if (!m || !cJSON_AddItemToObject(job, "messages", m)) {
            cJSON_Delete(m);
            return -RL_ENOMEM;
        }
    }
    /* tool_choice "none": the template shows no tools, as OpenAI's model
     * calls none */
    const cJSON *tc = ps->tool_choice;
    bool no_tools = cJSON_IsString(tc) && !strcmp(tc->valuestring, "none");
    if (ps->guided_rf && ps->response_format)
        return oai_bad_request(ps->e, "BAD_PARAM", "guided_json",
                               "guided_json: give it or response_format, not both");
    if ((!no_tools && (!add_copy(job, "tools", ps->tools) || !add_copy(job, "tool_choice", tc))) ||
        !add_copy(job, "response_format", ps->guided_rf ? ps->guided_rf : ps->response_format))
        return -RL_ENOMEM;
    int max_tokens = ps->max_tokens;
    ps->max_tokens_name = "max_tokens";
    if (ps->max_completion_tokens) { /* the newer name wins, as OpenAI reads them */
        max_tokens = ps->max_completion_tokens;
        ps->max_tokens_name = "max_completion_tokens";
    }
    if (max_tokens && !cJSON_AddNumberToObject(job, "max_tokens", max_tokens))
        return -RL_ENOMEM;
    if (ps->logprobs && !cJSON_AddNumberToObject(job, "logprobs", ps->top_logprobs))
        return -RL_ENOMEM;
    if (ps->mode) {
        if (!add_copy(job, "mode", ps->mode))
            return -RL_ENOMEM;
    } else if (ps->enable_thinking >= 0) {
        if (!cJSON_AddStringToObject(job, "mode", ps->enable_thinking ? "think" : "no_think"))
            return -RL_ENOMEM;
    } else if (ps->api == OAI_API_COMPLETIONS) {
        /* raw text is continued as it is, never with a <think> block */
        if (!cJSON_AddStringToObject(job, "mode", "no_think"))
            return -RL_ENOMEM;
    }
    if (ps->deadline_ms > 0 && (deadline_ms <= 0 || ps->deadline_ms < deadline_ms))
        deadline_ms = ps->deadline_ms; /* the client's, when sooner */
    if (deadline_ms > 0 && !cJSON_AddNumberToObject(job, "deadline_ms", (double)deadline_ms))
        return -RL_ENOMEM;
    if (ps->lim->client_lease_ms > 0 &&
        !cJSON_AddNumberToObject(job, "client_lease_ms", ps->lim->client_lease_ms))
        return -RL_ENOMEM;
    if (ps->lim->stream_ttl_s > 0 &&
        !cJSON_AddNumberToObject(job, "stream_ttl_s", ps->lim->stream_ttl_s))
        return -RL_ENOMEM;
    return 0;
}

/* The job as text, checked by job_parse (the code the dispatcher and the
 * worker run, so a job the front door sends is one they take), with the
 * deployment's default mode added where the request chose none. *text is
 * malloc'd, the caller's. */
static int finish_job(struct parse_state *ps, char **text)
{
    const struct oai_limits *lim = ps->lim;
    char *t = cJSON_PrintUnformatted(ps->job);
    if (!t)
        return -RL_ENOMEM;
    struct job *j = NULL;
    struct job_fault fault;
    struct rl_err jerr = {0};
    int rc = job_parse(t, strlen(t), lim->job, &j, &fault, &jerr);
    if (rc) {
        free(t);
        if (rc != -RL_ENOMEM)
            job_fault_error(&fault, &jerr, ps->max_tokens_name, ps->e);
        return rc;
    }
    /* No explicit choice: a /think or /no_think in the last user message
     * (as the router would read it), else the deployment's default mode.
     * Left out under the default "auto", so the router's rules and
     * think_ratio decide. */
    if (!(j->given & JOB_F_MODE) && j->input == JOB_INPUT_MESSAGES &&
        (lim->default_mode == JOB_MODE_THINK || lim->default_mode == JOB_MODE_NO_THINK)) {
        size_t ulen = 0;
        char *u = route_user_text(j, &ulen);
        enum route_switch sw = route_soft_switch(u, ulen);
        free(u);
        bool think = sw == ROUTE_SWITCH_NONE ? lim->default_mode == JOB_MODE_THINK
                                             : sw == ROUTE_SWITCH_THINK;
        free(t);
        t = NULL;
        if (cJSON_AddStringToObject(ps->job, "mode", think ? "think" : "no_think"))
            t = cJSON_PrintUnformatted(ps->job);
    }
    job_free(j);
    *text = t;
    return t ? 0 : -RL_ENOMEM;
}

/* Several choices: one job per (prompt, sample), id "<id>-<i>", each
 * checked by job_parse like the first; sample j of a seeded request gets
 * seed + j, so the n samples differ as vLLM's do. Fills out->jobs,
 * job_lens, echo. */
static int expand_jobs(struct parse_state *ps, const char *id, struct oai_request *out)
{
    const cJSON *list = prompt_is_list(ps->prompt) ? ps->prompt : NULL;
    int n_prompts = list ? cJSON_GetArraySize(list) : 1, n = ps->n > 1 ? ps->n : 1;
    int total = n_prompts * n;
    out->n_jobs = total;
    out->n_per_prompt = n;
    if (ps->echo)
        if (!(out->echo = calloc((size_t)total, sizeof *out->echo)))
            return -RL_ENOMEM;
    if (total > 1 && (!(out->jobs = calloc((size_t)total, sizeof *out->jobs)) ||
                      !(out->job_lens = calloc((size_t)total, sizeof *out->job_lens))))
        return -RL_ENOMEM;
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(ps->job, "seed");
    double seed0 = cJSON_IsNumber(seed) ? seed->valuedouble : -1;
    for (int k = 0; k < total; k++) {
        const cJSON *p = list ? cJSON_GetArrayItem(list, k / n) : ps->prompt;
        if (ps->echo && p && cJSON_IsString(p) && !(out->echo[k] = strdup(p->valuestring)))
            return -RL_ENOMEM;
        if (total == 1)
            break;
        cJSON *j = cJSON_Duplicate(ps->job, 1);
        char kid[JOB_ID_MAX + 1];
        snprintf(kid, sizeof kid, "%.100s-%d", id, k);
        int rc = j ? 0 : -RL_ENOMEM;
        if (!rc && !cJSON_ReplaceItemInObjectCaseSensitive(j, "id", cJSON_CreateString(kid)))
            rc = -RL_ENOMEM;
        if (!rc && p)
            rc = put_one_prompt(p, j, ps->e);
        if (!rc && seed0 >= 0 && k % n) {
            double sk = fmod(seed0 + k % n, 9007199254740992.0);
            if (!cJSON_ReplaceItemInObjectCaseSensitive(j, "seed", cJSON_CreateNumber(sk)))
                rc = -RL_ENOMEM;
        }
        char *t = rc ? NULL : cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        if (!rc && !t)
            rc = -RL_ENOMEM;
        if (rc)
            return rc;
        struct job *jb = NULL;
        struct job_fault fault;
        struct rl_err jerr = {0};
        if ((rc = job_parse(t, strlen(t), ps->lim->job, &jb, &fault, &jerr))) {
            free(t);
            if (rc != -RL_ENOMEM)
                job_fault_error(&fault, &jerr, ps->max_tokens_name, ps->e);
            return rc;
        }
        job_free(jb);
        out->jobs[k] = t;
        out->job_lens[k] = strlen(t);
    }
    return 0;
}

/* The body as a JSON object: its size, its text (job_check_text, as the
 * job's strings are checked), its syntax. *buf (the NUL-terminated copy)
 * and *root are the caller's to free, whatever the result. */
int oai_parse_body(const char *body, size_t len, const struct oai_limits *lim, char **buf,
                   cJSON **root, struct oai_error *e)
{
    if (len > lim->max_body_bytes) {
        oai_error_set(e, 413, T_INVALID, "JOB_TOO_LARGE", NULL,
                      "body: %zu bytes is over the limit of %zu", len, lim->max_body_bytes);
        return -RL_EINVAL;
    }
    struct job_fault fault;
    struct rl_err jerr = {0};
    if (job_check_text(body, len, "body", &fault, &jerr))
        return oai_bad_request(e, ev_code_name(fault.code), NULL, "%s", jerr.msg);
    char *b = *buf = malloc(len + 1);
    if (!b)
        return -RL_ENOMEM;
    memcpy(b, body, len);
    b[len] = 0;
    const char *end = NULL;
    *root = cJSON_ParseWithOpts(b, &end, 1);
    if (!*root) {
        size_t at = end && end >= b ? (size_t)(end - b) : 0;
        return oai_bad_request(e, "INVALID_JSON", NULL,
                               "body: not valid JSON (at byte %zu of %zu)", at, len);
    }
    if (!cJSON_IsObject(*root))
        return oai_bad_request(e, "NOT_OBJECT", NULL, "body: must be a JSON object");
    return 0;
}

/* The driver of the steps: body -> members -> rules across them -> job ->
 * job_parse. On failure *out is cleared but for stream, so the caller
 * knows how the client wanted its error. */
static int parse_request(enum oai_api api, const char *body, size_t len,
                         const struct oai_limits *lim, const char *id, int64_t deadline_ms,
                         struct oai_request *out, struct oai_error *e)
{
    struct oai_limits dl;
    if (!lim) {
        oai_limits_default(&dl);
        lim = &dl;
    }
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    struct parse_state ps = {
        .api = api, .lim = lim, .out = out, .e = e, .enable_thinking = -1, .effort = -1, .n = 1,
    };
    char *buf = NULL, *text = NULL;
    cJSON *root = NULL;
    int rc = oai_parse_body(body, len, lim, &buf, &root, e);
    if (!rc && (!(ps.job = cJSON_CreateObject()) || !cJSON_AddStringToObject(ps.job, "id", id)))
        rc = -RL_ENOMEM;
    out->api = api;
    if (!rc)
        rc = walk_members(&ps, root);
    if (!rc)
        rc = check_across(&ps);
    if (!rc)
        rc = build_job(&ps, deadline_ms);
    if (!rc)
        rc = finish_job(&ps, &text);
    if (!rc)
        rc = expand_jobs(&ps, id, out);
    if (rc == -RL_ENOMEM)
        oai_error_set(e, 500, T_SERVER, "INTERNAL", NULL, "out of memory");
    if (rc) {
        bool stream = out->stream;
        free(text);
        oai_request_clear(out);
        out->stream = stream;
    } else {
        if (out->jobs) { /* several choices: job is the first of them */
            free(text);
            text = out->jobs[0];
        }
        out->job = text;
        out->job_len = strlen(text);
        out->logprobs = ps.logprobs;
        out->top_logprobs = ps.top_logprobs;
    }
    cJSON_Delete(ps.job);
    cJSON_Delete(ps.guided_rf);
    cJSON_Delete(root);
    free(buf);
    return rc;
}

int oai_parse_request(const char *body, size_t len, const struct oai_limits *lim, const char *id,
                      int64_t deadline_ms, struct oai_request *out, struct oai_error *e)
{
    return parse_request(OAI_API_CHAT, body, len, lim, id, deadline_ms, out, e);
}

int oai_parse_completion(const char *body, size_t len, const struct oai_limits *lim,
                         const char *id, int64_t deadline_ms, struct oai_request *out,
                         struct oai_error *e)
{
    return parse_request(OAI_API_COMPLETIONS, body, len, lim, id, deadline_ms, out, e);
}

/* ---- responses ---- */

struct oai_resp {
    char id[JOB_ID_MAX + 1];
    char *model;
    int64_t created;
    enum oai_api api;
    bool stream, include_usage, logprobs;
    int top_logprobs;
    int64_t next_seq;          /* the seq the next event must have */
    int state;                 /* OAI_MORE, OAI_END, OAI_FAILED */
    struct oai_error failure;  /* when state is OAI_FAILED */
    bool role_sent;
    /* non-stream accumulation */
    struct text content, reasoning;
    cJSON *lp_content;         /* chat: array of OpenAI logprob entries, or NULL */
    cJSON *lp_legacy;          /* completions: {tokens, token_logprobs, top_logprobs,
                                  text_offset}, or NULL */
    int64_t text_offset;       /* completions: bytes of text before the next token */
    /* several choices (n > 1, batched prompts): one job each, read one
     * after the other; the fields above and below are the current one's,
     * but for the usage, which sums */
    int n_choices, n_per_prompt, cur;
    char **echo;               /* (n_choices) completions' echo text, or NULL; owned */
    bool echo_sent;            /* stream: the current choice's echo is out */
    cJSON *choices;            /* non-stream: the finished choices' objects */
    /* from done */
    cJSON *tool_calls;         /* array (possibly empty) */
    struct oai_tc_stream tc;   /* stream: tool calls sent in fragments */
    const char *finish;        /* the OpenAI finish_reason, static */
    char *stop_reason;         /* vLLM's: the stop string the choice ended at
                                  (done's matched_stop), NULL; owned */
    int64_t prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens;
};

int oai_resp_create(struct oai_resp **out, const char *id, const char *model, int64_t created,
                    const struct oai_request *req, struct rl_err *err)
{
    struct oai_resp *r = calloc(1, sizeof *r);
    if (!r || !(r->model = strdup(model ? model : ""))) {
        free(r);
        return rl_errf(err, RL_ENOMEM, "oai_resp_create: out of memory");
    }
    snprintf(r->id, sizeof r->id, "%s", id);
    r->created = created;
    r->api = req->api;
    r->stream = req->stream;
    r->include_usage = req->include_usage;
    r->logprobs = req->logprobs;
    r->top_logprobs = req->top_logprobs;
    r->n_choices = req->n_jobs > 1 ? req->n_jobs : 1;
    r->n_per_prompt = req->n_per_prompt > 1 ? req->n_per_prompt : 1;
    bool oom = !(r->choices = cJSON_CreateArray());
    if (!oom && req->echo) {
        oom = !(r->echo = calloc((size_t)r->n_choices, sizeof *r->echo));
        for (int i = 0; !oom && i < r->n_choices; i++)
            oom = req->echo[i] && !(r->echo[i] = strdup(req->echo[i]));
    }
    if (oom) {
        oai_resp_free(r);
        return rl_errf(err, RL_ENOMEM, "oai_resp_create: out of memory");
    }
    *out = r;
    return 0;
}

void oai_resp_free(struct oai_resp *r)
{
    if (!r)
        return;
    free(r->model);
    free(r->stop_reason);
    text_free(&r->content);
    text_free(&r->reasoning);
    cJSON_Delete(r->lp_content);
    cJSON_Delete(r->lp_legacy);
    cJSON_Delete(r->tool_calls);
    cJSON_Delete(r->choices);
    for (int i = 0; r->echo && i < r->n_choices; i++)
        free(r->echo[i]);
    free(r->echo);
    oai_tc_free(&r->tc);
    free(r);
}

static int fail(struct oai_resp *r, struct oai_error *e)
{
    r->state = OAI_FAILED;
    r->failure = *e;
    return OAI_FAILED;
}

/* A chunk's frame: id, object, created, model, and choices[0] with index
 * (returned through *choice), or no choices (usage chunk). */
static cJSON *chunk_new(const struct oai_resp *r, cJSON **choice)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", r->id);
    cJSON_AddStringToObject(c, "object",
                            r->api == OAI_API_COMPLETIONS ? "text_completion" : "chat.completion.chunk");
    cJSON_AddNumberToObject(c, "created", (double)r->created);
    cJSON_AddStringToObject(c, "model", r->model);
    cJSON *choices = cJSON_AddArrayToObject(c, "choices");
    if (choice) {
        *choice = cJSON_CreateObject();
        cJSON_AddNumberToObject(*choice, "index", r->cur);
        cJSON_AddItemToArray(choices, *choice);
    }
    return c;
}

/* Writes one SSE event, "data: <json>\n\n". */
static int sse_data(const char *json, struct text *sse)
{
    int rc = text_add(sse, "data: ", 6);
    if (!rc)
        rc = text_add(sse, json, strlen(json));
    if (!rc)
        rc = text_add(sse, "\n\n", 2);
    return rc;
}

/* Writes c as one SSE event and frees c. */
static int sse_put(cJSON *c, struct text *sse)
{
    char *s = c ? cJSON_PrintUnformatted(c) : NULL;
    cJSON_Delete(c);
    if (!s)
        return -RL_ENOMEM;
    int rc = sse_data(s, sse);
    free(s);
    return rc;
}

static cJSON *usage_json(const struct oai_resp *r)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)r->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)r->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(r->prompt_tokens + r->completion_tokens));
    cJSON *pd = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(pd, "cached_tokens", (double)r->cached_tokens);
    cJSON *cd = cJSON_AddObjectToObject(u, "completion_tokens_details");
    cJSON_AddNumberToObject(cd, "reasoning_tokens", (double)r->reasoning_tokens);
    return u;
}

/* A token as OpenAI shows it, from one entry of an event's logprobs (or
 * of its top list): *text is the token's bytes as UTF-8 text (a part of a
 * character, or any invalid byte, becomes U+FFFD), *bytes a copy of the
 * bytes as an array of ints, *n their count. Events without bytes (a
 * worker with no tokenizer) give vLLM's --return-tokens-as-token-ids form,
 * "token_id:N", with bytes null. *logprob is the entry's logprob. *text is
 * malloc'd. Returns 0 or -1 (not a usable entry: no token_id or logprob
 * number; or out of memory). */
static int token_of(const cJSON *entry, double *logprob, char **text, cJSON **bytes, size_t *n)
{
    const cJSON *tid = cJSON_GetObjectItemCaseSensitive(entry, "token_id");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(entry, "bytes");
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(entry, "logprob");
    *text = NULL;
    *bytes = NULL;
    *n = 0;
    if (!cJSON_IsNumber(l) || !cJSON_IsNumber(tid))
        return -1;
    *logprob = l->valuedouble;
    int nb = cJSON_IsArray(b) ? cJSON_GetArraySize(b) : -1;
    char *raw = nb >= 0 ? malloc((size_t)nb + 1) : NULL;
    int i = 0;
    const cJSON *x;
    if (raw) {
        cJSON_ArrayForEach(x, b)
        {
            if (!oai_is_integer(x) || x->valuedouble < 0 || x->valuedouble > 255)
                break;
            raw[i++] = (char)(int)x->valuedouble;
        }
    }
    if (raw && i == nb) {
        size_t tl;
        *text = tok_utf8_sanitize(raw, (size_t)nb, &tl);
        *bytes = cJSON_Duplicate(b, 1);
        *n = (size_t)nb;
    } else {
        char tok[40];
        snprintf(tok, sizeof tok, "token_id:%.0f", tid->valuedouble);
        *text = strdup(tok);
        *bytes = cJSON_CreateNull();
    }
    free(raw);
    if (!*text || !*bytes) {
        free(*text);
        cJSON_Delete(*bytes);
        *text = NULL;
        *bytes = NULL;
        return -1;
    }
    return 0;
}

/* {token, logprob, bytes} of one event entry (token_of), or NULL when the
 * entry is not usable. */
static cJSON *entry_object(const cJSON *entry)
{
    double logprob;
    char *tok;
    cJSON *bytes;
    size_t nb;
    if (token_of(entry, &logprob, &tok, &bytes, &nb))
        return NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "token", tok);
    free(tok);
    cJSON_AddNumberToObject(o, "logprob", logprob);
    cJSON_AddItemToObject(o, "bytes", bytes);
    return o;
}

/* The OpenAI chat logprob entries of one delta event's logprobs array:
 * {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}. */
static cJSON *logprob_entries(const struct oai_resp *r, const cJSON *lps)
{
    cJSON *arr = cJSON_CreateArray();
    const cJSON *lp;
    cJSON_ArrayForEach(lp, lps)
    {
        cJSON *o = entry_object(lp);
        if (!o)
            continue;
        cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
        const cJSON *t;
        int n = 0;
        cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(lp, "top"))
        {
            cJSON *x = n < r->top_logprobs ? entry_object(t) : NULL;
            if (!x)
                continue;
            cJSON_AddItemToArray(top, x);
            n++;
        }
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

/* The legacy completions form of one delta's logprobs, appended to *acc
 * (created when NULL): tokens, token_logprobs, top_logprobs (an object
 * token -> logprob per position) and text_offset (bytes into the text;
 * r->text_offset carries it from delta to delta). Returns 0 or -RL_ENOMEM. */
static int legacy_logprobs(struct oai_resp *r, const cJSON *lps, cJSON **acc)
{
    if (!*acc) {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddArrayToObject(o, "tokens") ||
            !cJSON_AddArrayToObject(o, "token_logprobs") ||
            !cJSON_AddArrayToObject(o, "top_logprobs") || !cJSON_AddArrayToObject(o, "text_offset")) {
            cJSON_Delete(o);
            return -RL_ENOMEM;
        }
        *acc = o;
    }
    cJSON *toks = cJSON_GetObjectItemCaseSensitive(*acc, "tokens");
    cJSON *lpa = cJSON_GetObjectItemCaseSensitive(*acc, "token_logprobs");
    cJSON *tops = cJSON_GetObjectItemCaseSensitive(*acc, "top_logprobs");
    cJSON *offs = cJSON_GetObjectItemCaseSensitive(*acc, "text_offset");
    const cJSON *lp;
    cJSON_ArrayForEach(lp, lps)
    {
        double logprob;
        char *tok;
        cJSON *bytes;
        size_t nb;
        if (token_of(lp, &logprob, &tok, &bytes, &nb))
            continue;
        cJSON_Delete(bytes);
        cJSON_AddItemToArray(toks, cJSON_CreateString(tok));
        cJSON_AddItemToArray(lpa, cJSON_CreateNumber(logprob));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)r->text_offset));
        r->text_offset += nb ? (int64_t)nb : (int64_t)strlen(tok);
        free(tok);
        if (r->top_logprobs > 0) {
            cJSON *m = cJSON_CreateObject();
            const cJSON *t;
            int n = 0;
            cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(lp, "top"))
            {
                if (n >= r->top_logprobs || token_of(t, &logprob, &tok, &bytes, &nb))
                    continue;
                cJSON_Delete(bytes);
                if (!cJSON_GetObjectItemCaseSensitive(m, tok)) /* two ids, one text: the first */
                    cJSON_AddNumberToObject(m, tok, logprob);
                free(tok);
                n++;
            }
            cJSON_AddItemToArray(tops, m);
        } else {
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
        }
    }
    return 0;
}

const char *oai_str_member(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int64_t oai_int_member(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 9e15 ? (int64_t)v->valuedouble : 0;
}

/* A completions delta: the text (reasoning, should a think block come,
 * then content: the legacy API has one text) and the legacy logprobs. */
static int feed_text_delta(struct oai_resp *r, const char *content, const char *reasoning,
                           const cJSON *lps, bool want_lp, struct text *sse)
{
    struct text t = {0};
    const char *echo = r->stream && !r->echo_sent && r->echo ? r->echo[r->cur] : NULL;
    r->echo_sent = true; /* (non-stream: compl_choice prepends it) */
    if ((echo && text_add(&t, echo, strlen(echo))) ||
        (reasoning && text_add(&t, reasoning, strlen(reasoning))) ||
        (content && text_add(&t, content, strlen(content)))) {
        text_free(&t);
        return -RL_ENOMEM;
    }
    int rc = OAI_MORE;
    if (!r->stream) {
        if ((t.n && text_add(&r->content, t.p, t.n)) ||
            (want_lp && legacy_logprobs(r, lps, &r->lp_legacy)))
            rc = -RL_ENOMEM;
        text_free(&t);
        return rc;
    }
    if (!t.n && !want_lp) {
        text_free(&t);
        return OAI_MORE;
    }
    cJSON *choice;
    cJSON *c = chunk_new(r, &choice);
    cJSON_AddStringToObject(choice, "text", t.p ? t.p : "");
    text_free(&t);
    cJSON *l = NULL;
    if (want_lp && legacy_logprobs(r, lps, &l)) {
        cJSON_Delete(c);
        return -RL_ENOMEM;
    }
    if (l)
        cJSON_AddItemToObject(choice, "logprobs", l);
    else
        cJSON_AddNullToObject(choice, "logprobs");
    cJSON_AddNullToObject(choice, "finish_reason");
    if (r->include_usage)
        cJSON_AddNullToObject(c, "usage");
    rc = sse_put(c, sse);
    return rc ? rc : OAI_MORE;
}

static int feed_tool_deltas(struct oai_resp *r, const cJSON *tcs, struct text *sse);

static int feed_delta(struct oai_resp *r, const cJSON *ev, struct text *sse)
{
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(ev, "delta");
    const char *content = oai_str_member(d, "content");
    const char *reasoning = oai_str_member(d, "reasoning_content");
    const cJSON *lps = cJSON_GetObjectItemCaseSensitive(ev, "logprobs");
    bool want_lp = r->logprobs && cJSON_IsArray(lps) && lps->child;
    if (r->api == OAI_API_COMPLETIONS)
        return feed_text_delta(r, content, reasoning, lps, want_lp, sse);
    if (!r->stream) {
        if (content && text_add(&r->content, content, strlen(content)))
            return -RL_ENOMEM;
        if (reasoning && text_add(&r->reasoning, reasoning, strlen(reasoning)))
            return -RL_ENOMEM;
        if (want_lp) {
            if (!r->lp_content && !(r->lp_content = cJSON_CreateArray()))
                return -RL_ENOMEM;
            cJSON *a = logprob_entries(r, lps);
            for (cJSON *x = a ? a->child : NULL, *next; x; x = next) {
                next = x->next;
                cJSON_AddItemToArray(r->lp_content, cJSON_DetachItemViaPointer(a, x));
            }
            cJSON_Delete(a);
        }
        return OAI_MORE;
    }
    bool has_text = (content && content[0]) || (reasoning && reasoning[0]);
    const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(d, "tool_calls");
    bool has_tc = cJSON_IsArray(tcs) && tcs->child;
    if (!has_text && !want_lp && (r->role_sent || has_tc)) {
        /* nothing a client could see (a partial character), or only tool calls */
        int rc = has_tc ? feed_tool_deltas(r, tcs, sse) : 0;
        return rc ? rc : OAI_MORE;
    }
    cJSON *choice;
    cJSON *c = chunk_new(r, &choice);
    cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
    if (!r->role_sent) {
        cJSON_AddStringToObject(delta, "role", "assistant");
        r->role_sent = true;
    }
    if (content || !reasoning)
        cJSON_AddStringToObject(delta, "content", content ? content : "");
    if (reasoning) { /* vLLM's older name and its current one */
        cJSON_AddStringToObject(delta, "reasoning_content", reasoning);
        cJSON_AddStringToObject(delta, "reasoning", reasoning);
    }
    if (want_lp) {
        cJSON *l = cJSON_AddObjectToObject(choice, "logprobs");
        cJSON_AddItemToObject(l, "content", logprob_entries(r, lps));
    } else {
        cJSON_AddNullToObject(choice, "logprobs");
    }
    cJSON_AddNullToObject(choice, "finish_reason");
    if (r->include_usage)
        cJSON_AddNullToObject(c, "usage");
    int rc = sse_put(c, sse);
    if (!rc && has_tc)
        rc = feed_tool_deltas(r, tcs, sse);
    return rc ? rc : OAI_MORE;
}

void oai_tool_call_id(char *out, size_t n, const char *request_id, int i)
{
    const char *u = strrchr(request_id, '_'), *d = strrchr(request_id, '-');
    const char *tail = u && (!d || u > d) ? u + 1 : d ? d + 1 : request_id;
    snprintf(out, n, "call_%.100s_%d", tail, i);
}

void oai_tool_call_ids(cJSON *tool_calls, const char *request_id)
{
    int i = 0;
    cJSON *t;
    cJSON_ArrayForEach(t, tool_calls)
    {
        char id[JOB_ID_MAX + 32];
        oai_tool_call_id(id, sizeof id, request_id, i++);
        cJSON *s = cJSON_CreateString(id);
        if (!s)
            continue;
        if (cJSON_GetObjectItemCaseSensitive(t, "id"))
            cJSON_ReplaceItemInObjectCaseSensitive(t, "id", s);
        else
            cJSON_AddItemToObject(t, "id", s);
    }
}

static cJSON *compl_choice(const struct oai_resp *r);
static cJSON *chat_choice(const struct oai_resp *r);

/* The current choice is over and another follows: keep its object (not
 * streamed), then start the next from nothing. */
static int next_choice(struct oai_resp *r)
{
    if (!r->stream) {
        cJSON *ch = r->api == OAI_API_COMPLETIONS ? compl_choice(r) : chat_choice(r);
        if (!ch || !cJSON_AddItemToArray(r->choices, ch)) {
            cJSON_Delete(ch);
            return -RL_ENOMEM;
        }
    }
    text_free(&r->content);
    text_free(&r->reasoning);
    cJSON_Delete(r->lp_content);
    cJSON_Delete(r->lp_legacy);
    cJSON_Delete(r->tool_calls);
    r->lp_content = r->lp_legacy = r->tool_calls = NULL;
    r->text_offset = 0;
    r->role_sent = r->echo_sent = false;
    r->finish = NULL;
    r->next_seq = 0;
    oai_tc_free(&r->tc); /* the next choice's calls are streamed afresh */
    r->cur++;
    return OAI_NEXT;
}

int oai_tc_entry(struct oai_tc_stream *s, const cJSON *entry, int *index, bool *opens,
                 const char **name, const char **frag)
{
    const cJSON *ix = cJSON_GetObjectItemCaseSensitive(entry, "index");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(entry, "function");
    *name = oai_str_member(f, "name");
    *frag = oai_str_member(f, "arguments");
    if (!*frag)
        *frag = "";
    if (!cJSON_IsNumber(ix) || ix->valuedouble < 0 || ix->valuedouble > 1e6)
        return 0;
    int i = (int)ix->valuedouble;
    *index = i;
    *opens = false;
    if (*name && i <= s->n) {
        /* a new call; or index i again after a block that turned out
         * malformed: its sent fragments cannot be taken back */
        if (i == s->n) {
            struct text *a = realloc(s->args, (size_t)(s->n + 1) * sizeof *a);
            if (!a)
                return -RL_ENOMEM;
            s->args = a;
            s->args[s->n++] = (struct text){0};
        }
        s->args[i].n = 0;
        *opens = true;
    } else if (i >= s->n) {
        return 0;
    }
    if (**frag && text_add(&s->args[i], *frag, strlen(*frag)))
        return -RL_ENOMEM;
    return 1;
}

int oai_tc_each(struct oai_tc_stream *s, const cJSON *tool_calls, oai_tc_fn fn, void *ctx)
{
    const cJSON *t;
    cJSON_ArrayForEach(t, tool_calls)
    {
        int i, rc;
        bool opens;
        const char *name, *frag;
        if ((rc = oai_tc_entry(s, t, &i, &opens, &name, &frag)) < 0)
            return rc;
        if (rc && (rc = fn(ctx, i, opens, name, frag)))
            return rc;
    }
    return 0;
}

const char *oai_tc_rest(const struct oai_tc_stream *s, int i, const char *final)
{
    if (i >= s->n || !final)
        return NULL;
    const struct text *b = &s->args[i];
    if (strlen(final) < b->n || (b->n && memcmp(final, b->p, b->n)))
        return NULL;
    return final + b->n;
}

void oai_tc_free(struct oai_tc_stream *s)
{
    for (int i = 0; i < s->n; i++)
        text_free(&s->args[i]);
    free(s->args);
    *s = (struct oai_tc_stream){0};
}

/* One chunk whose delta holds tool_calls entries (takes arr). */
static int tool_chunk(struct oai_resp *r, cJSON *arr, struct text *sse)
{
    cJSON *choice;
    cJSON *c = chunk_new(r, &choice);
    cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
    if (!r->role_sent) {
        cJSON_AddStringToObject(delta, "role", "assistant");
        r->role_sent = true;
    }
    cJSON_AddItemToObject(delta, "tool_calls", arr);
    cJSON_AddNullToObject(choice, "logprobs");
    cJSON_AddNullToObject(choice, "finish_reason");
    if (r->include_usage)
        cJSON_AddNullToObject(c, "usage");
    return sse_put(c, sse);
}

static cJSON *tool_entry(int index, const char *id, const char *name, const char *args)
{
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "index", index);
    if (id) {
        cJSON_AddStringToObject(x, "id", id);
        cJSON_AddStringToObject(x, "type", "function");
    }
    cJSON *f = cJSON_AddObjectToObject(x, "function");
    if (name)
        cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", args);
    return x;
}

struct tc_ctx {
    struct oai_resp *r;
    struct text *sse;
};

/* One entry of a delta's tool_calls, as OpenAI streams them: a chunk that
 * opens the call (index, id, type, name, arguments ""), then a chunk of
 * its fragment. */
static int tool_delta(void *ctx, int i, bool opens, const char *name, const char *frag)
{
    struct oai_resp *r = ((struct tc_ctx *)ctx)->r;
    struct text *sse = ((struct tc_ctx *)ctx)->sse;
    int rc;
    if (opens) {
        /* the id feed_done gives the call: choices after the first
         * have ids of their own */
        char cid[JOB_ID_MAX + 16], id[JOB_ID_MAX + 48];
        snprintf(cid, sizeof cid, r->cur ? "%s" "c%d" : "%s", r->id, r->cur);
        oai_tool_call_id(id, sizeof id, cid, i);
        cJSON *arr = cJSON_CreateArray();
        cJSON_AddItemToArray(arr, tool_entry(i, id, name, ""));
        if ((rc = tool_chunk(r, arr, sse)))
            return rc;
    }
    if (*frag) {
        cJSON *arr = cJSON_CreateArray();
        cJSON_AddItemToArray(arr, tool_entry(i, NULL, NULL, frag));
        if ((rc = tool_chunk(r, arr, sse)))
            return rc;
    }
    return 0;
}

static int feed_tool_deltas(struct oai_resp *r, const cJSON *tcs, struct text *sse)
{
    struct tc_ctx c = {r, sse};
    return oai_tc_each(&r->tc, tcs, tool_delta, &c);
}

/* vLLM's stop_reason beside finish_reason: the stop string the choice
 * ended at, or null (an end-of-turn or stop token, a length cut). */
static void add_stop_reason(cJSON *choice, const struct oai_resp *r)
{
    if (r->stop_reason)
        cJSON_AddStringToObject(choice, "stop_reason", r->stop_reason);
    else
        cJSON_AddNullToObject(choice, "stop_reason");
}

static int feed_done(struct oai_resp *r, const cJSON *ev, struct text *sse,
                     struct oai_error *e)
{
    const char *fr = oai_str_member(ev, "finish_reason");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(ev, "tool_calls");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(ev, "usage");
    /* several choices: the completion tokens of all; the prompt (and its
     * cache hits) once per prompt, as OpenAI counts n */
    if (r->cur % r->n_per_prompt == 0) {
        r->prompt_tokens += oai_int_member(u, "prompt_tokens");
        r->cached_tokens += oai_int_member(u, "cached_prompt_tokens");
    }
    r->completion_tokens += oai_int_member(u, "completion_tokens");
    r->reasoning_tokens += oai_int_member(u, "reasoning_tokens");
    cJSON_Delete(r->tool_calls);
    if (!(r->tool_calls = cJSON_IsArray(tc) ? cJSON_Duplicate(tc, 1) : cJSON_CreateArray()))
        return -RL_ENOMEM;
    /* choices after the first: ids of their own ("call_<tail>c<i>_<k>") */
    char cid[JOB_ID_MAX + 16];
    snprintf(cid, sizeof cid, r->cur ? "%s" "c%d" : "%s", r->id, r->cur);
    oai_tool_call_ids(r->tool_calls, cid);
    bool tools = r->tool_calls->child != NULL;
    const char *ms = oai_str_member(ev, "matched_stop");
    free(r->stop_reason);
    r->stop_reason = NULL;
    if (ms && !(r->stop_reason = strdup(ms)))
        return -RL_ENOMEM;
    if (!fr || !strcmp(fr, "error")) {
        oai_error_set(e, 500, T_SERVER, "ENGINE_ERROR", NULL, "the job ended with an error");
        return fail(r, e);
    }
    /* stop/length as OpenAI; "tool_calls" when the model called tools;
     * cancelled and deadline are redlm's own and passed through */
    r->finish = !strcmp(fr, "stop") ? (tools ? "tool_calls" : "stop")
                : !strcmp(fr, "length") ? "length"
                : !strcmp(fr, "cancelled") ? "cancelled"
                : !strcmp(fr, "deadline") ? "deadline" : "stop";
    bool last = r->cur >= r->n_choices - 1;
    if (last)
        r->state = OAI_END;
    if (!r->stream)
        return last ? OAI_END : next_choice(r);
    int rc = 0;
    cJSON *choice, *c, *delta;
    if (r->api == OAI_API_COMPLETIONS) {
        c = chunk_new(r, &choice);
        const char *echo = !r->echo_sent && r->echo ? r->echo[r->cur] : NULL;
        cJSON_AddStringToObject(choice, "text", echo ? echo : "");
        cJSON_AddNullToObject(choice, "logprobs");
        cJSON_AddStringToObject(choice, "finish_reason", r->finish);
        add_stop_reason(choice, r);
        if (r->include_usage)
            cJSON_AddNullToObject(c, "usage");
        if ((rc = sse_put(c, sse)))
            return rc;
        goto usage;
    }
    if (tools) {
        /* calls streamed in fragments get what is left of their arguments,
         * the others come whole, as before streaming existed */
        cJSON *arr = cJSON_CreateArray();
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, r->tool_calls)
        {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
            const char *rest = oai_tc_rest(&r->tc, i, oai_str_member(f, "arguments"));
            cJSON *x = NULL;
            if (rest && *rest)
                x = tool_entry(i, NULL, NULL, rest);
            else if (!rest && (x = cJSON_Duplicate(t, 1)))
                cJSON_AddItemToObject(x, "index", cJSON_CreateNumber(i));
            if (x)
                cJSON_AddItemToArray(arr, x);
            i++;
        }
        if (arr && arr->child) {
            if ((rc = tool_chunk(r, arr, sse)))
                return rc;
        } else {
            cJSON_Delete(arr);
        }
    }
    c = chunk_new(r, &choice);
    delta = cJSON_AddObjectToObject(choice, "delta");
    if (!r->role_sent) {
        cJSON_AddStringToObject(delta, "role", "assistant");
        cJSON_AddStringToObject(delta, "content", "");
        r->role_sent = true;
    }
    cJSON_AddNullToObject(choice, "logprobs");
    cJSON_AddStringToObject(choice, "finish_reason", r->finish);
    add_stop_reason(choice, r);
    if (r->include_usage)
        cJSON_AddNullToObject(c, "usage");
    if ((rc = sse_put(c, sse)))
        return rc;
usage:
    if (!last)
        return next_choice(r);
    if (r->include_usage) {
        c = chunk_new(r, NULL);
        cJSON_AddItemToObject(c, "usage", usage_json(r));
        if ((rc = sse_put(c, sse)))
            return rc;
    }
    if ((rc = text_add(sse, "data: [DONE]\n\n", 14)))
        return rc;
    return OAI_END;
}

int oai_resp_feed(struct oai_resp *r, const char *event, size_t len, struct text *sse,
                  struct oai_error *e)
{
    if (r->state == OAI_FAILED) {
        *e = r->failure;
        return OAI_FAILED;
    }
    if (r->state == OAI_END)
        return OAI_END;
    cJSON *ev = event ? cJSON_ParseWithLength(event, len) : NULL;
    int rc;
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(ev, "seq");
    const char *type = oai_str_member(ev, "type");
    if (!cJSON_IsObject(ev) || !cJSON_IsNumber(seq) || !type) {
        oai_error_set(e, 502, T_SERVER, "BAD_EVENT", NULL,
                      "event %lld of the job is not a valid event", (long long)r->next_seq);
        rc = fail(r, e);
        goto done;
    }
    if (seq->valuedouble != (double)r->next_seq) {
        oai_error_set(e, 502, T_SERVER, "BAD_EVENT", NULL, "event seq %.0f, expected %lld",
                      seq->valuedouble, (long long)r->next_seq);
        rc = fail(r, e);
        goto done;
    }
    r->next_seq++;
    if (!strcmp(type, "delta")) {
        rc = feed_delta(r, ev, sse);
    } else if (!strcmp(type, "done")) {
        rc = feed_done(r, ev, sse, e);
    } else if (!strcmp(type, "error")) {
        const cJSON *ra = cJSON_GetObjectItemCaseSensitive(ev, "retry_after_ms");
        oai_error_from_event(oai_str_member(ev, "code"), oai_str_member(ev, "message"),
                             cJSON_IsNumber(ra) && ra->valuedouble > 0 && ra->valuedouble < 1e9
                                 ? (int64_t)ra->valuedouble : 0,
                             e);
        rc = fail(r, e);
    } else {
        oai_error_set(e, 502, T_SERVER, "BAD_EVENT", NULL, "event type \"%.20s\" is unknown", type);
        rc = fail(r, e);
    }
done:
    cJSON_Delete(ev);
    return rc;
}

int oai_sse_error(const struct oai_error *e, struct text *sse)
{
    char *s = oai_error_json(e);
    if (!s)
        return -RL_ENOMEM;
    int rc = sse_data(s, sse);
    if (!rc)
        rc = text_add(sse, "data: [DONE]\n\n", 14);
    free(s);
    return rc;
}

/* The whole object of a request that was not streamed ("chat.completion",
 * "text_completion"): the choices before the current one, then choice,
 * which it takes (freed on failure too). */
static char *completion_object(const struct oai_resp *r, const char *object, cJSON *choice)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", r->id);
    cJSON_AddStringToObject(c, "object", object);
    cJSON_AddNumberToObject(c, "created", (double)r->created);
    cJSON_AddStringToObject(c, "model", r->model);
    cJSON *choices = cJSON_AddItemToObject(c, "choices", cJSON_Duplicate(r->choices, 1))
                         ? cJSON_GetObjectItemCaseSensitive(c, "choices") : NULL;
    if (!choices || !choice || !cJSON_AddItemToArray(choices, choice)) {
        cJSON_Delete(choice);
        cJSON_Delete(c);
        return NULL;
    }
    cJSON_AddItemToObject(c, "usage", usage_json(r));
    char *s = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    return s;
}

/* The current choice of a completions request as a choices[] entry. */
static cJSON *compl_choice(const struct oai_resp *r)
{
    cJSON *ch = cJSON_CreateObject();
    if (!ch)
        return NULL;
    const char *echo = r->echo ? r->echo[r->cur] : NULL;
    if (echo) {
        struct text t = {0};
        if (text_add(&t, echo, strlen(echo)) ||
            (r->content.n && text_add(&t, r->content.p, r->content.n))) {
            text_free(&t);
            cJSON_Delete(ch);
            return NULL;
        }
        cJSON_AddStringToObject(ch, "text", t.p);
        text_free(&t);
    } else {
        cJSON_AddStringToObject(ch, "text", r->content.p ? r->content.p : "");
    }
    cJSON_AddNumberToObject(ch, "index", r->cur);
    if (r->logprobs && r->lp_legacy) {
        cJSON_AddItemToObject(ch, "logprobs", cJSON_Duplicate(r->lp_legacy, 1));
    } else if (r->logprobs) {
        cJSON *l = cJSON_AddObjectToObject(ch, "logprobs");
        cJSON_AddArrayToObject(l, "tokens");
        cJSON_AddArrayToObject(l, "token_logprobs");
        cJSON_AddArrayToObject(l, "top_logprobs");
        cJSON_AddArrayToObject(l, "text_offset");
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    cJSON_AddStringToObject(ch, "finish_reason", r->finish);
    add_stop_reason(ch, r);
    return ch;
}

char *oai_resp_completion(const struct oai_resp *r)
{
    if (r->state != OAI_END)
        return NULL;
    if (r->api == OAI_API_COMPLETIONS)
        return completion_object(r, "text_completion", compl_choice(r));
    return completion_object(r, "chat.completion", chat_choice(r));
}

/* The current choice of a chat request as a choices[] entry. */
static cJSON *chat_choice(const struct oai_resp *r)
{
    cJSON *ch = cJSON_CreateObject();
    if (!ch)
        return NULL;
    cJSON_AddNumberToObject(ch, "index", r->cur);
    cJSON *m = cJSON_AddObjectToObject(ch, "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    bool tools = r->tool_calls && r->tool_calls->child;
    if (r->content.n || !tools)
        cJSON_AddStringToObject(m, "content", r->content.p ? r->content.p : "");
    else
        cJSON_AddNullToObject(m, "content");
    if (r->reasoning.n) {
        cJSON_AddStringToObject(m, "reasoning_content", r->reasoning.p);
        cJSON_AddStringToObject(m, "reasoning", r->reasoning.p);
    }
    if (tools)
        cJSON_AddItemToObject(m, "tool_calls", cJSON_Duplicate(r->tool_calls, 1));
    if (r->logprobs) {
        cJSON *l = cJSON_AddObjectToObject(ch, "logprobs");
        cJSON_AddItemToObject(l, "content",
                              r->lp_content ? cJSON_Duplicate(r->lp_content, 1) : cJSON_CreateArray());
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    cJSON_AddStringToObject(ch, "finish_reason", r->finish);
    add_stop_reason(ch, r);
    return ch;
}

int64_t oai_resp_total_tokens(const struct oai_resp *r)
{
    return r->state == OAI_END ? r->prompt_tokens + r->completion_tokens : 0;
}

/* ---- API keys ---- */

static bool tenant_ok(const char *s, size_t n)
{
    if (n < 1 || n > OAI_TENANT_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

void oai_keys_free(struct oai_keys *k)
{
    free(k->v);
    k->v = NULL;
    k->n = 0;
}

/* A rate: digits only, 0 .. 10^12. */
static int parse_rate(const char *s, size_t n, int64_t *out)
{
    if (n < 1 || n > 12)
        return -1;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

int oai_keys_parse(const char *text, size_t len, const char *path, struct oai_keys *out,
                   struct rl_err *err)
{
    struct oai_keys k = {0};
    int cap = 0, line = 0, rc = 0;
    for (size_t pos = 0; pos < len && !rc;) {
        const char *ls = text + pos;
        const char *nl = memchr(ls, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - ls) : len - pos;
        pos += ll + (nl ? 1 : 0);
        line++;
        if (ll && ls[ll - 1] == '\r')
            ll--;
        /* split on blanks */
        const char *tok[5];
        size_t tl[5];
        int nt = 0;
        for (size_t i = 0; i < ll;) {
            while (i < ll && (ls[i] == ' ' || ls[i] == '\t'))
                i++;
            if (i >= ll)
                break;
            size_t st = i;
            while (i < ll && ls[i] != ' ' && ls[i] != '\t')
                i++;
            if (nt == 5) {
                nt++;
                break;
            }
            tok[nt] = ls + st;
            tl[nt++] = i - st;
        }
        if (nt == 0 || tok[0][0] == '#')
            continue;
        if (nt < 2 || nt > 4) {
            rc = rl_errf(err, RL_EINVAL, "%s:%d: expected KEY TENANT [RPM [TPM]]", path, line);
            break;
        }
        if (tl[0] < 8 || tl[0] > 256) {
            rc = rl_errf(err, RL_EINVAL, "%s:%d: a key must be 8-256 characters", path, line);
            break;
        }
        for (size_t i = 0; i < tl[0]; i++)
            if ((unsigned char)tok[0][i] < 0x21 || (unsigned char)tok[0][i] > 0x7e) {
                rc = rl_errf(err, RL_EINVAL, "%s:%d: a key must be printable ASCII", path, line);
                break;
            }
        if (rc)
            break;
        if (!tenant_ok(tok[1], tl[1])) {
            rc = rl_errf(err, RL_EINVAL, "%s:%d: tenant must be 1-%d characters of [A-Za-z0-9_.-]",
                         path, line, OAI_TENANT_MAX);
            break;
        }
        struct oai_key e = {0};
        memcpy(e.tenant, tok[1], tl[1]);
        if ((nt > 2 && parse_rate(tok[2], tl[2], &e.rpm)) ||
            (nt > 3 && parse_rate(tok[3], tl[3], &e.tpm))) {
            rc = rl_errf(err, RL_EINVAL,
                         "%s:%d: RPM and TPM must be whole numbers (0 = no limit)", path, line);
            break;
        }
        struct sha256_ctx sc;
        sha256_init(&sc);
        sha256_update(&sc, tok[0], tl[0]);
        sha256_final(&sc, e.digest);
        for (int i = 0; i < k.n; i++)
            if (!memcmp(k.v[i].digest, e.digest, sizeof e.digest)) {
                rc = rl_errf(err, RL_EINVAL, "%s:%d: the same key is listed twice", path, line);
                break;
            }
        if (rc)
            break;
        if (k.n == cap) {
            int nc = cap ? cap * 2 : 16;
            struct oai_key *g = realloc(k.v, (size_t)nc * sizeof *g);
            if (!g) {
                rc = rl_errf(err, RL_ENOMEM, "%s: out of memory", path);
                break;
            }
            k.v = g;
            cap = nc;
        }
        k.v[k.n++] = e;
    }
    if (rc) {
        oai_keys_free(&k);
        return rc;
    }
    *out = k;
    return 0;
}

const struct oai_key *oai_keys_find(const struct oai_keys *k, const char *authorization)
{
    if (!authorization || strncasecmp(authorization, "Bearer ", 7))
        return NULL;
    return oai_keys_lookup(k, authorization + 7);
}

const struct oai_key *oai_keys_lookup(const struct oai_keys *k, const char *key)
{
    if (!key)
        return NULL;
    while (*key == ' ')
        key++;
    size_t n = strlen(key);
    while (n && (key[n - 1] == ' ' || key[n - 1] == '\t'))
        n--;
    if (n < 8 || n > 256)
        return NULL;
    uint8_t d[SHA256_DIGEST_LEN];
    struct sha256_ctx sc;
    sha256_init(&sc);
    sha256_update(&sc, key, n);
    sha256_final(&sc, d);
    const struct oai_key *found = NULL;
    for (int i = 0; i < k->n; i++) {
        unsigned diff = 0;
        for (int b = 0; b < SHA256_DIGEST_LEN; b++)
            diff |= (unsigned)(k->v[i].digest[b] ^ d[b]);
        if (!diff)
            found = &k->v[i]; /* no break: every entry costs the same */
    }
    return found;
}
