/* dispatcher/embed.c - the embedding endpoints <-> redlm embedding jobs
 * (embed.h).
 *
 * Requests. A body is checked as openai.c checks one (oai_parse_body: size,
 * text, syntax, object), then member by member in body order (unknown
 * names follow http_unknown_fields through oai_not_applied, so every API
 * of the front door treats them alike), then its inputs: every input is
 * checked before any job is built, so the first bad one is reported and
 * nothing is queued. Each input becomes one job {"task": "embed",
 * "prompt" | "prompt_ids", "dimensions", "truncate", "model",
 * "mode": "no_think", "deadline_ms", "client_lease_ms"} that job_parse()
 * accepts, the code the dispatcher and the worker run; its faults are
 * renamed back to the member the client wrote (prompt, prompt_ids ->
 * input; prompt on Ollama's older API). The mode is
 * no_think for the reason completions use it: an embedding has no
 * thinking to route for, so it goes to the fast pool and leaves the
 * think ratio's count alone.
 *
 * Too long. The front door has no tokenizer to count or cut tokens: a
 * prompt longer than the model's context is the worker's to find. Ollama's
 * APIs truncate by default (truncate true, or absent), so their jobs carry
 * the job's truncate, and the worker keeps the prompt's first tokens and
 * its last (the pooled one); OpenAI's API does not (OpenAI answers 400),
 * nor does /api/embed with truncate false: the worker's PROMPT_TOO_LONG,
 * a 400 whose message names the limit.
 *
 * Responses. Each job's stream holds one done event carrying the vector
 * as base64 of little-endian float32 values. It is decoded and checked
 * (length 4 x dimensions, every value finite) whatever the output format,
 * so a client never gets a vector the float form could not print; base64
 * output is then the event's string as it is (OpenAI's SDKs ask for
 * base64 by default and decode exactly this), float output the values
 * printed with %.9g, which reads back to the same float32.
 *
 * Everything here runs on the calling thread with no shared state. */
#include "embed.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "event.h"
#include "job.h"

static const char T_INVALID[] = "invalid_request_error";
static const char T_SERVER[] = "server_error";

/* The name of the input member on api. */
static const char *input_name(enum emb_api api)
{
    return api == EMB_OLLAMA_LEGACY ? "prompt" : "input";
}

/* ---- requests ---- */

/* What the walk over the members keeps. Borrowed pointers point into the
 * parsed body, which outlives the parse. */
struct emb_parse {
    enum emb_api api;
    const struct oai_limits *lim;
    struct oai_request *out;
    struct emb_request *c;
    struct oai_error *e;
    const cJSON *input;         /* the input member, or NULL */
    int dimensions;             /* 0 = the model's size */
    bool truncate;              /* the jobs' truncate: Ollama's default true */
    bool raw;                   /* the jobs' normalize false: vLLM's normalize
                                   false; Ollama's legacy /api/embeddings
                                   (its vectors were never unit length) */
    /* the jobs being built (oai_lay_out_jobs): the inputs, their count,
     * the deadline each carries */
    const cJSON *const *items;
    int n;
    int64_t deadline_ms;
};

/* model: the one served name (404 for another), or (lim->model NULL) any
 * name, carried in the jobs for the dispatcher to route by (http.c checks
 * it is served). Ollama's clients add ":latest" to a name without a tag. */
static int take_model(struct emb_parse *ps, const cJSON *v)
{
    return oai_model_name(v, ps->lim, ps->api != EMB_OPENAI, ps->out->model, ps->e);
}

static int take_dimensions(struct emb_parse *ps, const cJSON *v)
{
    if (!oai_is_integer(v))
        return oai_bad_request(ps->e, "BAD_TYPE", "dimensions", "dimensions: must be an integer");
    if (v->valuedouble < 1 || v->valuedouble > JOB_DIMENSIONS_MAX)
        return oai_bad_request(ps->e, "OUT_OF_RANGE", "dimensions",
                               "dimensions: %.0f is out of range [1, %d]", v->valuedouble,
                               JOB_DIMENSIONS_MAX);
    ps->dimensions = (int)v->valuedouble;
    return 0;
}

/* The members each API knows; any other goes to oai_not_applied. */
enum member {
    M_MODEL, M_INPUT, M_ENCODING, M_DIMENSIONS, M_USER, M_TRUNCATE, M_KEEP_ALIVE, M_OPTIONS,
    M_NORMALIZE,
};
#define ON_OPENAI (1u << EMB_OPENAI)
#define ON_EMBED (1u << EMB_OLLAMA_EMBED)
#define ON_LEGACY (1u << EMB_OLLAMA_LEGACY)
static const struct oai_member members[] = {
    {"model", M_MODEL, ON_OPENAI | ON_EMBED | ON_LEGACY},
    {"input", M_INPUT, ON_OPENAI | ON_EMBED},
    {"prompt", M_INPUT, ON_LEGACY},
    {"encoding_format", M_ENCODING, ON_OPENAI},
    {"dimensions", M_DIMENSIONS, ON_OPENAI | ON_EMBED},
    /* OpenAI's end-user id: checked, changes nothing (as on chat) */
    {"user", M_USER, ON_OPENAI},
    /* Ollama's: truncate (default true) is the job's; keep_alive and the
     * runner's options change nothing, the workers keep their model loaded
     * (as compat.c takes them) */
    {"truncate", M_TRUNCATE, ON_EMBED},
    {"keep_alive", M_KEEP_ALIVE, ON_EMBED | ON_LEGACY},
    {"options", M_OPTIONS, ON_EMBED | ON_LEGACY},
    /* vLLM's: false for the vector as the model gives it */
    {"normalize", M_NORMALIZE, ON_OPENAI},
};
#define N_MEMBERS ((int)(sizeof members / sizeof members[0]))

static int take_member(void *ctx, int m, const char *name, const cJSON *v)
{
    struct emb_parse *ps = ctx;
    switch ((enum member)m) {
    case M_MODEL:
        return take_model(ps, v);
    case M_INPUT:
        ps->input = v; /* checked by check_inputs, once every member is in */
        return 0;
    case M_ENCODING:
        if (!cJSON_IsString(v))
            return oai_bad_request(ps->e, "BAD_TYPE", name, "encoding_format: must be a string");
        if (!strcmp(v->valuestring, "base64"))
            ps->c->base64 = true;
        else if (strcmp(v->valuestring, "float"))
            return oai_bad_request(ps->e, "BAD_VALUE", name,
                                   "encoding_format: \"%.20s\" is not float or base64",
                                   v->valuestring);
        return 0;
    case M_DIMENSIONS:
        return take_dimensions(ps, v);
    case M_USER:
        return cJSON_IsString(v) ? 0 : oai_bad_request(ps->e, "BAD_TYPE", name,
                                                       "user: must be a string");
    case M_TRUNCATE:
        if (!cJSON_IsBool(v))
            return oai_bad_request(ps->e, "BAD_TYPE", name, "truncate: must be true or false");
        ps->truncate = cJSON_IsTrue(v);
        return 0;
    case M_OPTIONS:
        return cJSON_IsObject(v) ? 0 : oai_bad_request(ps->e, "BAD_TYPE", name,
                                                       "options: must be an object");
    case M_KEEP_ALIVE:
        return 0;
    case M_NORMALIZE:
        if (!cJSON_IsBool(v))
            return oai_bad_request(ps->e, "BAD_TYPE", name, "normalize: must be true or false");
        ps->raw = cJSON_IsFalse(v);
        return 0;
    }
    abort(); /* a member with no case: a broken table */
}

/* A list of token ids, checked as integers (job_parse checks their range
 * and the vocabulary is the worker's). */
static bool is_id_list(const cJSON *v)
{
    if (!cJSON_IsArray(v) || !v->child)
        return false;
    for (const cJSON *t = v->child; t; t = t->next)
        if (!oai_is_integer(t))
            return false;
    return true;
}

/* The inputs as one list of items (each a string or a token-id list), in
 * order, into *items (malloc'd, borrowed pointers) and *n. OpenAI: a
 * string, a list of strings, a list of token ids (one input) or a list of
 * those; Ollama's embed: a string or a list of strings; Ollama's legacy: a
 * string. Empty text is refused on OpenAI (as OpenAI does) and inside an
 * Ollama list; no input at all on Ollama is load_only (*n = 0). */
static int check_inputs(struct emb_parse *ps, const cJSON ***items, int *n)
{
    const char *name = input_name(ps->api);
    const cJSON *in = ps->input;
    struct oai_error *e = ps->e;
    *items = NULL;
    *n = 0;
    if (ps->api != EMB_OPENAI && (!in || (cJSON_IsString(in) && !in->valuestring[0]) ||
                                  (ps->api == EMB_OLLAMA_EMBED && cJSON_IsArray(in) &&
                                   !in->child))) {
        ps->c->load_only = true;
        return 0;
    }
    if (!in)
        return oai_bad_request(e, "MISSING_FIELD", name, "%s: required", name);
    const char *shape = ps->api == EMB_OPENAI
                            ? "must be a string, an array of strings, an array of token ids or "
                              "an array of arrays of token ids"
                        : ps->api == EMB_OLLAMA_EMBED ? "must be a string or an array of strings"
                                                      : "must be a string";
    bool list = cJSON_IsArray(in) && (ps->api == EMB_OLLAMA_EMBED ||
                                      (ps->api == EMB_OPENAI && in->child &&
                                       !cJSON_IsNumber(in->child)));
    if (!cJSON_IsString(in) && !(ps->api == EMB_OPENAI && cJSON_IsArray(in)) && !list)
        return oai_bad_request(e, "BAD_TYPE", name, "%s: %s", name, shape);
    int count = list ? cJSON_GetArraySize(in) : 1;
    if (cJSON_IsArray(in) && !in->child)
        return oai_bad_request(e, "BAD_VALUE", name, "%s: must not be an empty array", name);
    if (count > EMB_INPUTS_MAX)
        return oai_bad_request(e, "OUT_OF_RANGE", name, "%s: %d inputs is over the limit of %d",
                               name, count, EMB_INPUTS_MAX);
    /* every item's shape: all strings or (OpenAI) all token-id lists, as
     * the first is */
    if (list && !cJSON_IsString(in->child) &&
        !(ps->api == EMB_OPENAI && cJSON_IsArray(in->child)))
        return oai_bad_request(e, "BAD_TYPE", name, "%s: %s", name, shape);
    bool texts = list ? cJSON_IsString(in->child) : cJSON_IsString(in);
    int i = 0;
    for (const cJSON *it = list ? in->child : in; it; it = list ? it->next : NULL, i++) {
        char at[32] = "";
        if (list)
            snprintf(at, sizeof at, "[%d]", i);
        if (texts && !cJSON_IsString(it))
            return oai_bad_request(e, "BAD_TYPE", name, "%s%s: %s", name, at,
                                   list ? "every input must be a string, as the first is" : shape);
        if (texts && !it->valuestring[0])
            return oai_bad_request(e, "BAD_VALUE", name, "%s%s: must not be empty", name, at);
        if (!texts && cJSON_IsArray(it) && !it->child)
            return oai_bad_request(e, "BAD_VALUE", name, "%s%s: must not be an empty array", name,
                                   at);
        if (!texts && !is_id_list(it))
            return oai_bad_request(e, "BAD_TYPE", name, "%s%s: %s", name, at,
                                   list ? "every input must be an array of integer token "
                                          "ids, as the first is"
                                        : "token ids must be integers");
    }
    if (!(*items = calloc((size_t)count, sizeof **items)))
        return -RL_ENOMEM;
    i = 0;
    for (const cJSON *it = list ? in->child : in; it; it = list ? it->next : NULL)
        (*items)[i++] = it;
    *n = count;
    return 0;
}

/* A job_parse fault as the client sees it: prompt and prompt_ids are the
 * input member; an input of several is named by its index. */
static void fault_error(const struct emb_parse *ps, const struct job_fault *f,
                        const struct rl_err *jerr, int i, int n, struct oai_error *e)
{
    if (oai_fault_settled(f, jerr, NULL, e))
        return;
    const char *code = ev_code_name(f->code);
    const char *param = f->field;
    if (!strncmp(param, "prompt", 6))
        param = input_name(ps->api);
    if (n > 1)
        oai_error_set(e, 400, T_INVALID, code, param, "%s[%d]: %s", input_name(ps->api), i,
                      jerr->msg);
    else
        oai_error_set(e, 400, T_INVALID, code, param, "%s", jerr->msg);
}

/* The job of input i of n, checked by job_parse; *text malloc'd. */
static int build_job(void *ctx, int i, const char *jid, char **text)
{
    struct emb_parse *ps = ctx;
    const cJSON *in = ps->items[i];
    *text = NULL;
    cJSON *j = cJSON_CreateObject();
    bool ok = j && cJSON_AddStringToObject(j, "id", jid) &&
              cJSON_AddStringToObject(j, "task", "embed");
    if (ok && ps->out->model[0]) /* the request's model, when any is taken */
        ok = cJSON_AddStringToObject(j, "model", ps->out->model) != NULL;
    if (ok) {
        cJSON *p = cJSON_Duplicate(in, 1);
        ok = p && cJSON_AddItemToObject(j, cJSON_IsString(in) ? "prompt" : "prompt_ids", p);
        if (!ok)
            cJSON_Delete(p);
    }
    if (ok && ps->dimensions)
        ok = cJSON_AddNumberToObject(j, "dimensions", ps->dimensions) != NULL;
    if (ok && ps->truncate)
        ok = cJSON_AddTrueToObject(j, "truncate") != NULL;
    if (ok && ps->raw)
        ok = cJSON_AddFalseToObject(j, "normalize") != NULL;
    if (!ok) {
        cJSON_Delete(j);
        return -RL_ENOMEM;
    }
    struct job_fault fault;
    struct rl_err jerr = {0};
    int rc = oai_seal_job(j, ps->lim, ps->deadline_ms, text, &fault, &jerr);
    if (rc && rc != -RL_ENOMEM)
        fault_error(ps, &fault, &jerr, i, ps->n, ps->e);
    return rc;
}

int emb_parse(enum emb_api api, const char *body, size_t len, const struct oai_limits *lim,
              const char *id, int64_t deadline_ms, struct oai_request *out,
              struct emb_request *c, struct oai_error *e)
{
    struct oai_limits dl;
    if (!lim) {
        oai_limits_default(&dl);
        lim = &dl;
    }
    memset(out, 0, sizeof *out);
    memset(c, 0, sizeof *c);
    memset(e, 0, sizeof *e);
    c->api = api;
    /* Ollama truncates unless told not to (its /api/embed's default; its
     * older /api/embeddings has no switch and truncates as well); OpenAI
     * answers a text too long with a 400 */
    struct emb_parse ps = {.api = api, .lim = lim, .out = out, .c = c, .e = e,
                           .truncate = api != EMB_OPENAI, .raw = api == EMB_OLLAMA_LEGACY};
    char *buf = NULL;
    cJSON *root = NULL;
    const cJSON **items = NULL;
    int n = 0;
    int rc = oai_parse_body(body, len, lim, &buf, &root, e);
    if (!rc)
        rc = oai_walk_members(root, members, N_MEMBERS, 1u << api, lim, out, e, take_member,
                              &ps);
    if (!rc)
        rc = check_inputs(&ps, &items, &n);
    if (!rc && !c->load_only) {
        ps.items = items;
        ps.n = n;
        ps.deadline_ms = deadline_ms;
        rc = oai_lay_out_jobs(out, n, id, build_job, &ps);
    }
    if (rc == -RL_ENOMEM)
        oai_error_set(e, 500, T_SERVER, "INTERNAL", NULL, "out of memory");
    if (rc) {
        oai_request_clear(out);
        memset(c, 0, sizeof *c);
        c->api = api;
    } else {
        c->n_inputs = n;
    }
    free(items);
    cJSON_Delete(root);
    free(buf);
    return rc;
}

/* ---- responses ---- */

struct emb_resp {
    enum emb_api api;
    bool base64;
    char *model;
    int n;                /* the jobs */
    int cur;              /* the job being read */
    char **vecs;          /* (n) each finished job's vector: its base64 string (base64
                             output) or its values as a JSON array's text; owned */
    int64_t next_seq;     /* the seq the current job's next event must have */
    int state;            /* OAI_MORE, OAI_END, OAI_FAILED */
    struct oai_error failure;
    int64_t prompt_tokens; /* summed over the jobs */
};

int emb_resp_create(struct emb_resp **out, const struct emb_request *c, const char *model,
                    struct rl_err *err)
{
    struct emb_resp *r = calloc(1, sizeof *r);
    int n = c->n_inputs > 0 ? c->n_inputs : 1;
    if (!r || !(r->model = strdup(model ? model : "")) ||
        !(r->vecs = calloc((size_t)n, sizeof *r->vecs))) {
        emb_resp_free(r);
        return rl_errf(err, RL_ENOMEM, "emb_resp_create: out of memory");
    }
    r->api = c->api;
    r->base64 = c->base64 && c->api == EMB_OPENAI;
    r->n = n;
    *out = r;
    return 0;
}

void emb_resp_free(struct emb_resp *r)
{
    if (!r)
        return;
    for (int i = 0; r->vecs && i < r->n; i++)
        free(r->vecs[i]);
    free(r->vecs);
    free(r->model);
    free(r);
}

static int fail(struct emb_resp *r, struct oai_error *e)
{
    r->state = OAI_FAILED;
    r->failure = *e;
    return OAI_FAILED;
}

/* The values of s (base64 of n little-endian float32) as a JSON array's
 * text, malloc'd into *out. Returns 0, -RL_EFORMAT (not n finite float32
 * values) or -RL_ENOMEM. */
static int vector_text(const char *s, int n, bool keep_base64, char **out)
{
    *out = NULL;
    size_t nb = (size_t)n * 4, sl = strlen(s);
    /* base64 of nb bytes is exactly b64_len(nb) characters */
    if (sl != b64_len(nb))
        return -RL_EFORMAT;
    uint8_t *b = malloc(nb);
    if (!b)
        return -RL_ENOMEM;
    if (b64_decode(s, sl, b, nb) != (long)nb) {
        free(b);
        return -RL_EFORMAT;
    }
    struct text t = {0};
    int rc = keep_base64 ? 0 : text_add(&t, "[", 1);
    for (int i = 0; i < n && !rc; i++) {
        uint32_t u = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
                     (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24;
        float f;
        memcpy(&f, &u, 4);
        if (!isfinite(f)) {
            rc = -RL_EFORMAT;
            break;
        }
        if (keep_base64)
            continue;
        char num[32];
        int k = snprintf(num, sizeof num, "%s%.9g", i ? "," : "", (double)f);
        rc = text_add(&t, num, (size_t)k);
    }
    free(b);
    if (!rc && keep_base64) {
        *out = strdup(s);
        return *out ? 0 : -RL_ENOMEM;
    }
    if (!rc)
        rc = text_add(&t, "]", 1);
    if (!rc && !(*out = strdup(t.p)))
        rc = -RL_ENOMEM;
    text_free(&t);
    return rc;
}

static int feed_done(struct emb_resp *r, const cJSON *ev, struct oai_error *e)
{
    const char *fr = oai_str_member(ev, "finish_reason");
    const char *emb = oai_str_member(ev, "embedding");
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(ev, "dimensions");
    if (fr && !strcmp(fr, "error")) {
        oai_error_set(e, 500, T_SERVER, "ENGINE_ERROR", NULL, "the job ended with an error");
        return fail(r, e);
    }
    if (!emb && fr && !strcmp(fr, "deadline")) {
        oai_error_set(e, 504, T_SERVER, ev_code_name(EV_CODE_DEADLINE_EXCEEDED), NULL,
                      "the embedding job passed its deadline");
        return fail(r, e);
    }
    if (!emb || !oai_is_integer(dims) || dims->valuedouble < 1 ||
        dims->valuedouble > JOB_DIMENSIONS_MAX) {
        oai_error_set(e, 502, T_SERVER, "BAD_EVENT", NULL,
                      "the done event of input %d has no embedding and dimensions (a worker "
                      "from before embedding jobs?)", r->cur);
        return fail(r, e);
    }
    int rc = vector_text(emb, (int)dims->valuedouble, r->base64, &r->vecs[r->cur]);
    if (rc == -RL_ENOMEM)
        return rc;
    if (rc) {
        oai_error_set(e, 502, T_SERVER, "BAD_EVENT", NULL,
                      "the embedding of input %d is not %.0f finite float32 values in base64",
                      r->cur, dims->valuedouble);
        return fail(r, e);
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(ev, "usage");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
    if (cJSON_IsNumber(pt) && pt->valuedouble > 0 && pt->valuedouble < 9e15)
        r->prompt_tokens += (int64_t)pt->valuedouble;
    if (++r->cur < r->n) {
        r->next_seq = 0; /* the next job's stream, from its start */
        return OAI_NEXT;
    }
    r->state = OAI_END;
    return OAI_END;
}

int emb_resp_feed(struct emb_resp *r, const char *event, size_t len, struct oai_error *e)
{
    if (r->state == OAI_FAILED) {
        *e = r->failure;
        return OAI_FAILED;
    }
    if (r->state == OAI_END)
        return OAI_END;
    char what[32];
    snprintf(what, sizeof what, "input %d", r->cur);
    cJSON *done;
    int rc = oai_onepass_event(event, len, &r->next_seq, what, &done, e);
    if (rc == OAI_MORE)
        return OAI_MORE;
    if (rc == OAI_FAILED) {
        /* the job's prompt is this API's input (PROMPT_TOO_LONG names
         * messages, INVALID_TOKEN prompt_ids) */
        if (!strcmp(e->param, "messages") || !strncmp(e->param, "prompt", 6))
            snprintf(e->param, sizeof e->param, "%s", input_name(r->api));
        return fail(r, e);
    }
    rc = feed_done(r, done, e);
    cJSON_Delete(done);
    return rc;
}

/* Vector i as a JSON item: the base64 string, or the array's text as it
 * is (cJSON prints a raw item verbatim: %.9g, not its own %.17g). */
static cJSON *vector_item(const struct emb_resp *r, int i)
{
    return r->base64 ? cJSON_CreateString(r->vecs[i]) : cJSON_CreateRaw(r->vecs[i]);
}

char *emb_resp_body(const struct emb_resp *r, int64_t total_ms)
{
    if (r->state != OAI_END)
        return NULL;
    cJSON *o = cJSON_CreateObject();
    bool ok = o != NULL;
    if (ok && r->api == EMB_OPENAI) {
        cJSON *data = NULL, *u = NULL;
        ok = cJSON_AddStringToObject(o, "object", "list") &&
             (data = cJSON_AddArrayToObject(o, "data"));
        for (int i = 0; ok && i < r->n; i++) {
            cJSON *d = cJSON_CreateObject(), *v = vector_item(r, i);
            ok = d && v && cJSON_AddItemToArray(data, d);
            if (!ok) {
                cJSON_Delete(d);
                cJSON_Delete(v);
                break;
            }
            ok = cJSON_AddStringToObject(d, "object", "embedding") &&
                 cJSON_AddNumberToObject(d, "index", i) && cJSON_AddItemToObject(d, "embedding", v);
        }
        ok = ok && cJSON_AddStringToObject(o, "model", r->model) &&
             (u = cJSON_AddObjectToObject(o, "usage")) &&
             cJSON_AddNumberToObject(u, "prompt_tokens", (double)r->prompt_tokens) &&
             cJSON_AddNumberToObject(u, "total_tokens", (double)r->prompt_tokens);
    } else if (ok && r->api == EMB_OLLAMA_EMBED) {
        cJSON *a = NULL;
        ok = cJSON_AddStringToObject(o, "model", r->model) &&
             (a = cJSON_AddArrayToObject(o, "embeddings"));
        for (int i = 0; ok && i < r->n; i++) {
            cJSON *v = vector_item(r, i);
            ok = v && cJSON_AddItemToArray(a, v);
            if (!ok)
                cJSON_Delete(v);
        }
        /* nanoseconds, as Ollama counts; no model is loaded by a request */
        ok = ok && cJSON_AddNumberToObject(o, "total_duration", (double)total_ms * 1e6) &&
             cJSON_AddNumberToObject(o, "load_duration", 0) &&
             cJSON_AddNumberToObject(o, "prompt_eval_count", (double)r->prompt_tokens);
    } else if (ok) {
        cJSON *v = vector_item(r, 0);
        ok = v && cJSON_AddItemToObject(o, "embedding", v);
        if (!ok)
            cJSON_Delete(v);
    }
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

int64_t emb_resp_total_tokens(const struct emb_resp *r)
{
    return r->state == OAI_END ? r->prompt_tokens : 0;
}

char *emb_empty_body(enum emb_api api, const char *model)
{
    cJSON *o = cJSON_CreateObject();
    bool ok = o != NULL;
    if (ok && api == EMB_OLLAMA_LEGACY)
        ok = cJSON_AddArrayToObject(o, "embedding") != NULL;
    else if (ok)
        ok = cJSON_AddStringToObject(o, "model", model ? model : "") &&
             cJSON_AddArrayToObject(o, "embeddings");
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *emb_error_json(enum emb_api api, const struct oai_error *e)
{
    if (api == EMB_OPENAI)
        return oai_error_json(e);
    cJSON *o = cJSON_CreateObject();
    char *s = o && cJSON_AddStringToObject(o, "error", e->message) ? cJSON_PrintUnformatted(o)
                                                                    : NULL;
    cJSON_Delete(o);
    return s;
}
