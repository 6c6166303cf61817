/* dispatcher/rerank.c - the rerank and score endpoints <-> redlm rerank
 * jobs (rerank.h).
 *
 * Requests. A body is checked as openai.c checks one (oai_parse_body: size,
 * text, syntax, object), then member by member in body order (unknown
 * names follow http_unknown_fields through oai_not_applied, as on every
 * API of the front door), then its texts: every document is checked before
 * any job is built, so the first bad one is reported and nothing is queued.
 * Each document becomes one job {"task": "rerank", "query", "document",
 * "instruction", "model", "mode": "no_think", "deadline_ms",
 * "client_lease_ms"} that job_parse() accepts, the code the dispatcher and
 * the worker run; its faults are renamed back to the member the client
 * wrote (query -> query or text_1, document -> documents or text_2). The
 * mode is no_think for the reason embed.c gives: a relevance score has no
 * thinking to route for, so it goes to the fast pool.
 *
 * One request, many copies. The query (and the instruction) is written
 * into every job, so n documents cost n copies of it: a body of a long
 * query and many short documents could turn into jobs far larger than the
 * body. The copies beyond the first are held to one more body's worth
 * (max_body_kb), a 413 otherwise, so what a request queues stays within
 * about twice what it sent.
 *
 * The score API pairs text_1 with text_2: one text_1 for every text_2 (a
 * string, or a list of one: vLLM's 1:N), or one per text_2 (N:N, pair i is
 * text_1[i] with text_2[i]). The job is the same rerank job: text_1 is its
 * query, text_2 its document.
 *
 * Responses. Each job's stream holds one done event carrying "score", the
 * model's P("yes") against "no" (Qwen3-Reranker's relevance), which must be
 * a number in [0, 1]; anything else is a broken worker, 502. Rerank sorts
 * the documents by score, highest first, the lower index first on a tie
 * (so equal scores keep the caller's order, and the answer is the same
 * whatever the sort), and keeps top_n; score answers in input order.
 *
 * Everything here runs on the calling thread with no shared state. */
#include "rerank.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"
#include "job.h"

static const char T_INVALID[] = "invalid_request_error";
static const char T_SERVER[] = "server_error";

/* The member that holds the query, and the one that holds the documents,
 * on api: what a job's query and document are called to the client. */
static const char *query_name(enum rr_api api)
{
    return api == RR_SCORE ? "text_1" : "query";
}

static const char *docs_name(enum rr_api api)
{
    return api == RR_SCORE ? "text_2" : "documents";
}

void rr_request_clear(struct rr_request *c)
{
    for (int i = 0; c->docs && i < c->n_docs; i++)
        free(c->docs[i]);
    free(c->docs);
    enum rr_api api = c->api;
    memset(c, 0, sizeof *c);
    c->api = api;
}

/* ---- requests ---- */

/* What the walk over the members keeps. Borrowed pointers point into the
 * parsed body, which outlives the parse. */
struct rr_parse {
    enum rr_api api;
    const struct oai_limits *lim;
    struct oai_request *out;
    struct rr_request *c;
    struct oai_error *e;
    const cJSON *query, *docs;     /* query / text_1, documents / text_2, or NULL */
    const char *instruction;       /* NULL: the worker's default */
    double top_n;                  /* 0 = absent */
    /* the jobs being built (oai_lay_out_jobs): each pair's texts, their
     * count, the deadline each carries */
    const char *const *pair_queries, *const *pair_docs;
    int n;
    int64_t deadline_ms;
};

/* model: the one served name (404 for another), or (lim->model NULL) any
 * name, carried in the jobs for the dispatcher to route by (http.c checks
 * it is served), as embed.c takes it for OpenAI's API. */
static int take_model(struct rr_parse *ps, const cJSON *v)
{
    return oai_model_name(v, ps->lim, false, ps->out->model, ps->e);
}

/* The members each API knows; any other goes to oai_not_applied. */
enum member { M_MODEL, M_QUERY, M_DOCS, M_TOP_N, M_RETURN_DOCS, M_INSTRUCTION };
#define ON_RERANK (1u << RR_RERANK)
#define ON_SCORE (1u << RR_SCORE)
static const struct oai_member members[] = {
    {"model", M_MODEL, ON_RERANK | ON_SCORE},
    {"query", M_QUERY, ON_RERANK},
    {"documents", M_DOCS, ON_RERANK},
    {"top_n", M_TOP_N, ON_RERANK},
    {"return_documents", M_RETURN_DOCS, ON_RERANK},
    {"text_1", M_QUERY, ON_SCORE},
    {"text_2", M_DOCS, ON_SCORE},
    /* redlm's: the task the reranker is told (Qwen3-Reranker's
     * "Instruct:" line), the same for every document */
    {"instruction", M_INSTRUCTION, ON_RERANK | ON_SCORE},
};
#define N_MEMBERS ((int)(sizeof members / sizeof members[0]))

static int take_member(void *ctx, int m, const char *name, const cJSON *v)
{
    struct rr_parse *ps = ctx;
    switch ((enum member)m) {
    case M_MODEL:
        return take_model(ps, v);
    case M_QUERY:
        ps->query = v; /* checked by check_texts, once every member is in */
        return 0;
    case M_DOCS:
        ps->docs = v;
        return 0;
    case M_TOP_N:
        if (!oai_is_integer(v))
            return oai_bad_request(ps->e, "BAD_TYPE", name, "top_n: must be an integer");
        if (v->valuedouble < 1)
            return oai_bad_request(ps->e, "OUT_OF_RANGE", name,
                                   "top_n: %.0f is out of range (at least 1; more than the "
                                   "documents is all of them)", v->valuedouble);
        ps->top_n = v->valuedouble;
        return 0;
    case M_RETURN_DOCS:
        if (!cJSON_IsBool(v))
            return oai_bad_request(ps->e, "BAD_TYPE", name,
                                   "return_documents: must be true or false");
        ps->c->return_documents = cJSON_IsTrue(v);
        return 0;
    case M_INSTRUCTION:
        if (!cJSON_IsString(v))
            return oai_bad_request(ps->e, "BAD_TYPE", name, "instruction: must be a string");
        ps->instruction = v->valuestring;
        return 0;
    }
    abort(); /* a member with no case: a broken table */
}

/* One text of member name (at: "" or "[i]"): a non-empty string, or on
 * rerank's documents also {"text": a non-empty string} (Jina's and
 * Cohere's document object), whose other members follow
 * http_unknown_fields. *out borrows the text. */
static int take_text(struct rr_parse *ps, const cJSON *v, const char *name, const char *at,
                     bool doc_object, const char **out)
{
    struct oai_error *e = ps->e;
    const cJSON *t = v;
    if (doc_object && cJSON_IsObject(v)) {
        /* the text first: an object without one (an image document) is
         * refused for that, whatever else it holds */
        t = NULL;
        for (const cJSON *m = v->child; m; m = m->next) {
            if (strcmp(m->string, "text"))
                continue;
            if (t)
                return oai_bad_request(e, "DUPLICATE_FIELD", name, "%s%s.text: given twice",
                                       name, at);
            t = m;
        }
        if (!t)
            return oai_bad_request(e, "MISSING_FIELD", name, "%s%s.text: required", name, at);
        if (!cJSON_IsString(t))
            return oai_bad_request(e, "BAD_TYPE", name, "%s%s.text: must be a string", name, at);
        for (const cJSON *m = v->child; m; m = m->next) {
            if (m == t)
                continue;
            char path[JOB_FIELD_MAX];
            snprintf(path, sizeof path, "%s%s.%.40s", name, at, m->string);
            if (oai_not_applied(ps->lim, ps->out, path, "UNKNOWN_FIELD",
                                "unknown member of a document (only text is read)", e))
                return -RL_EINVAL;
        }
    }
    if (!cJSON_IsString(t))
        return oai_bad_request(e, "BAD_TYPE", name, "%s%s: must be a string%s", name, at,
                               doc_object ? " or an object with a string \"text\"" : "");
    if (!t->valuestring[0])
        return oai_bad_request(e, "BAD_VALUE", name, "%s%s: must not be empty", name, at);
    *out = t->valuestring;
    return 0;
}

/* A member that holds texts: rerank's query (one string), rerank's
 * documents (a list of strings or {text} objects), the score API's text_1
 * and text_2 (a string or a list of strings). Each text is checked and
 * borrowed into *texts (malloc'd, *n of them). */
static int take_texts(struct rr_parse *ps, const cJSON *v, const char *name, bool list_only,
                      bool string_only, bool doc_object, const char ***texts, int *n)
{
    struct oai_error *e = ps->e;
    *texts = NULL;
    *n = 0;
    if (!v)
        return oai_bad_request(e, "MISSING_FIELD", name, "%s: required", name);
    if (!cJSON_IsArray(v) && (list_only || !cJSON_IsString(v)))
        return oai_bad_request(e, "BAD_TYPE", name, "%s: must be %s", name,
                               string_only ? "a string"
                               : list_only ? "an array of strings or of {\"text\": string} "
                                             "objects"
                                           : "a string or an array of strings");
    if (cJSON_IsArray(v) && string_only)
        return oai_bad_request(e, "BAD_TYPE", name, "%s: must be a string", name);
    int count = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 1;
    if (count == 0)
        return oai_bad_request(e, "BAD_VALUE", name, "%s: must not be an empty array", name);
    if (count > RR_DOCUMENTS_MAX)
        return oai_bad_request(e, "OUT_OF_RANGE", name, "%s: %d texts is over the limit of %d",
                               name, count, RR_DOCUMENTS_MAX);
    if (!(*texts = calloc((size_t)count, sizeof **texts)))
        return -RL_ENOMEM;
    int i = 0;
    for (const cJSON *it = cJSON_IsArray(v) ? v->child : v; it;
         it = cJSON_IsArray(v) ? it->next : NULL, i++) {
        char at[24] = "";
        if (cJSON_IsArray(v))
            snprintf(at, sizeof at, "[%d]", i);
        int rc = take_text(ps, it, name, at, doc_object, &(*texts)[i]);
        if (rc) {
            free(*texts);
            *texts = NULL;
            return rc;
        }
    }
    *n = count;
    return 0;
}

/* The pairs: *queries and *docs (malloc'd, *n each, borrowed texts), query
 * i to be scored against document i. */
static int check_texts(struct rr_parse *ps, const char ***queries, const char ***docs, int *n)
{
    enum rr_api api = ps->api;
    const char *qn = query_name(api), *dn = docs_name(api);
    const char **q = NULL, **d = NULL;
    int nq = 0, nd = 0;
    *queries = *docs = NULL;
    *n = 0;
    int rc = take_texts(ps, ps->query, qn, false, api == RR_RERANK, false, &q, &nq);
    if (!rc)
        rc = take_texts(ps, ps->docs, dn, api == RR_RERANK, false, api == RR_RERANK, &d, &nd);
    if (!rc && nq != 1 && nq != nd)
        rc = oai_bad_request(ps->e, "BAD_VALUE", qn,
                             "%s: %d texts for the %d of %s; give one (scored against each) or "
                             "one per text of %s", qn, nq, nd, dn, dn);
    /* the copies of the query and the instruction beyond the first: at
     * most one more body's worth (the essay) */
    size_t rep = (nq == 1 && q ? strlen(q[0]) : 0) +
                 (ps->instruction ? strlen(ps->instruction) : 0);
    if (!rc && nd > 1 && rep > ps->lim->max_body_bytes / (size_t)(nd - 1)) {
        oai_error_set(ps->e, 413, T_INVALID, ev_code_name(EV_CODE_JOB_TOO_LARGE), qn,
                      "%s: its %zu bytes (with the instruction's), copied into each of %d jobs, "
                      "add %zu bytes, over the limit of one body's worth (%zu); send a shorter "
                      "%s or fewer texts", qn, rep, nd, rep * (size_t)(nd - 1),
                      ps->lim->max_body_bytes, qn);
        rc = -RL_EINVAL;
    }
    if (!rc && nq == 1 && nd > 1) { /* one query for every document */
        const char **all = calloc((size_t)nd, sizeof *all);
        if (!all) {
            rc = -RL_ENOMEM;
        } else {
            for (int i = 0; i < nd; i++)
                all[i] = q[0];
            free(q);
            q = all;
        }
    }
    if (rc) {
        free(q);
        free(d);
        return rc;
    }
    *queries = q;
    *docs = d;
    *n = nd;
    return 0;
}

/* A job_parse fault as the client sees it: query and document are this
 * API's members; a job of several is named by its index. The front door's
 * own members (id, deadline_ms, task) at fault are its bug, a 500. */
static void fault_error(const struct rr_parse *ps, const struct job_fault *f,
                        const struct rl_err *jerr, int i, int n, struct oai_error *e)
{
    if (oai_fault_settled(f, jerr, "task", e))
        return;
    const char *code = ev_code_name(f->code);
    const char *param = !strcmp(f->field, "query")      ? query_name(ps->api)
                        : !strcmp(f->field, "document") ? docs_name(ps->api)
                                                        : f->field;
    if (n > 1)
        oai_error_set(e, 400, T_INVALID, code, param, "%s[%d]: %s", docs_name(ps->api), i,
                      jerr->msg);
    else
        oai_error_set(e, 400, T_INVALID, code, param, "%s", jerr->msg);
}

/* The job of pair i of n, checked by job_parse; *text malloc'd. */
static int build_job(void *ctx, int i, const char *jid, char **text)
{
    struct rr_parse *ps = ctx;
    const char *query = ps->pair_queries[i], *doc = ps->pair_docs[i];
    *text = NULL;
    cJSON *j = cJSON_CreateObject();
    bool ok = j && cJSON_AddStringToObject(j, "id", jid) &&
              cJSON_AddStringToObject(j, "task", "rerank");
    if (ok && ps->out->model[0]) /* the request's model, when any is taken */
        ok = cJSON_AddStringToObject(j, "model", ps->out->model) != NULL;
    ok = ok && cJSON_AddStringToObject(j, "query", query) &&
         cJSON_AddStringToObject(j, "document", doc);
    if (ok && ps->instruction)
        ok = cJSON_AddStringToObject(j, "instruction", ps->instruction) != NULL;
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

/* The documents' texts for the answer (rerank, return_documents). */
static int keep_docs(struct rr_request *c, const char *const *docs, int n)
{
    if (!(c->docs = calloc((size_t)n, sizeof *c->docs)))
        return -RL_ENOMEM;
    c->n_docs = n; /* rr_request_clear frees what was copied */
    for (int i = 0; i < n; i++)
        if (!(c->docs[i] = strdup(docs[i])))
            return -RL_ENOMEM;
    return 0;
}

int rr_parse(enum rr_api api, const char *body, size_t len, const struct oai_limits *lim,
             const char *id, int64_t deadline_ms, struct oai_request *out, struct rr_request *c,
             struct oai_error *e)
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
    c->return_documents = api == RR_RERANK; /* Jina's and vLLM's default */
    struct rr_parse ps = {.api = api, .lim = lim, .out = out, .c = c, .e = e};
    char *buf = NULL;
    cJSON *root = NULL;
    const char **queries = NULL, **docs = NULL;
    int n = 0;
    int rc = oai_parse_body(body, len, lim, &buf, &root, e);
    if (!rc)
        rc = oai_walk_members(root, members, N_MEMBERS, 1u << api, lim, out, e, take_member,
                              &ps);
    if (!rc)
        rc = check_texts(&ps, &queries, &docs, &n);
    if (!rc) {
        ps.pair_queries = queries;
        ps.pair_docs = docs;
        ps.n = n;
        ps.deadline_ms = deadline_ms;
        rc = oai_lay_out_jobs(out, n, id, build_job, &ps);
    }
    if (!rc && api == RR_RERANK && c->return_documents)
        rc = keep_docs(c, docs, n);
    if (rc == -RL_ENOMEM)
        oai_error_set(e, 500, T_SERVER, "INTERNAL", NULL, "out of memory");
    if (rc) {
        oai_request_clear(out);
        rr_request_clear(c);
    } else {
        c->n_docs = n;
        c->top_n = api == RR_RERANK && ps.top_n >= 1 && ps.top_n < n ? (int)ps.top_n : n;
        if (api == RR_SCORE)
            c->return_documents = false;
    }
    free(queries);
    free(docs);
    cJSON_Delete(root);
    free(buf);
    return rc;
}

/* ---- responses ---- */

struct rr_resp {
    enum rr_api api;
    char *id, *model;
    int64_t created;
    int n;                /* the jobs */
    int top_n;
    char *const *docs;    /* (n) borrowed from the rr_request, or NULL */
    int cur;              /* the job being read */
    double *scores;       /* (n) each finished job's score */
    int64_t next_seq;     /* the seq the current job's next event must have */
    int state;            /* OAI_MORE, OAI_END, OAI_FAILED */
    struct oai_error failure;
    int64_t prompt_tokens; /* summed over the jobs */
};

int rr_resp_create(struct rr_resp **out, const struct rr_request *c, const char *id,
                   const char *model, int64_t created, struct rl_err *err)
{
    struct rr_resp *r = calloc(1, sizeof *r);
    int n = c->n_docs > 0 ? c->n_docs : 1;
    if (!r || !(r->id = strdup(id ? id : "")) || !(r->model = strdup(model ? model : "")) ||
        !(r->scores = calloc((size_t)n, sizeof *r->scores))) {
        rr_resp_free(r);
        return rl_errf(err, RL_ENOMEM, "rr_resp_create: out of memory");
    }
    r->api = c->api;
    r->created = created;
    r->n = n;
    r->top_n = c->top_n >= 1 && c->top_n < n ? c->top_n : n;
    r->docs = c->return_documents && c->n_docs == n ? c->docs : NULL;
    *out = r;
    return 0;
}

void rr_resp_free(struct rr_resp *r)
{
    if (!r)
        return;
    free(r->scores);
    free(r->model);
    free(r->id);
    free(r);
}

static int fail(struct rr_resp *r, struct oai_error *e)
{
    r->state = OAI_FAILED;
    r->failure = *e;
    return OAI_FAILED;
}

static int feed_done(struct rr_resp *r, const cJSON *ev, struct oai_error *e)
{
    const char *fr = oai_str_member(ev, "finish_reason");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(ev, "score");
    if (fr && !strcmp(fr, "error")) {
        oai_error_set(e, 500, T_SERVER, "ENGINE_ERROR", NULL, "the job ended with an error");
        return fail(r, e);
    }
    if (!s && fr && !strcmp(fr, "deadline")) {
        oai_error_set(e, 504, T_SERVER, ev_code_name(EV_CODE_DEADLINE_EXCEEDED), NULL,
                      "the rerank job passed its deadline");
        return fail(r, e);
    }
    /* a probability: NaN fails both comparisons */
    if (!cJSON_IsNumber(s) || !(s->valuedouble >= 0 && s->valuedouble <= 1)) {
        oai_error_set(e, 502, T_SERVER, "BAD_EVENT", NULL,
                      "the done event of %s %d has no score in [0, 1] (a worker from before "
                      "rerank jobs?)", r->api == RR_SCORE ? "pair" : "document", r->cur);
        return fail(r, e);
    }
    r->scores[r->cur] = s->valuedouble;
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(ev, "usage");
    r->prompt_tokens += oai_int_member(u, "prompt_tokens");
    if (++r->cur < r->n) {
        r->next_seq = 0; /* the next job's stream, from its start */
        return OAI_NEXT;
    }
    r->state = OAI_END;
    return OAI_END;
}

/* The worker's error, as this API names things: the job's prompt (which
 * PROMPT_TOO_LONG names messages) and document are the documents member,
 * its query the query member, and a BAD_PARAM (which openai.c reads as the
 * grammar's: a rerank job has none) is the model's, one that cannot rerank
 * (no single "yes" and "no" tokens); with several documents the message
 * leads with the index of the one at fault. */
static void rename_error(const struct rr_resp *r, struct oai_error *e)
{
    const char *p = e->param;
    if (!strcmp(e->code, "BAD_PARAM") &&
        (!strcmp(p, "response_format") || !strcmp(p, "grammar") || !p[0]))
        snprintf(e->param, sizeof e->param, "model");
    else if (!strcmp(p, "messages") || !strncmp(p, "prompt", 6) || !strcmp(p, "document"))
        snprintf(e->param, sizeof e->param, "%s", docs_name(r->api));
    else if (!strcmp(p, "query"))
        snprintf(e->param, sizeof e->param, "%s", query_name(r->api));
    if (r->n > 1) { /* the index before the message, which loses its end if it must */
        char pre[32];
        size_t k = (size_t)snprintf(pre, sizeof pre, "%s[%d]: ", docs_name(r->api), r->cur);
        size_t m = strlen(e->message);
        if (k + m >= sizeof e->message)
            m = sizeof e->message - 1 - k;
        memmove(e->message + k, e->message, m);
        memcpy(e->message, pre, k);
        e->message[k + m] = 0;
    }
}

int rr_resp_feed(struct rr_resp *r, const char *event, size_t len, struct oai_error *e)
{
    if (r->state == OAI_FAILED) {
        *e = r->failure;
        return OAI_FAILED;
    }
    if (r->state == OAI_END)
        return OAI_END;
    char what[32];
    snprintf(what, sizeof what, "%s %d", r->api == RR_SCORE ? "pair" : "document", r->cur);
    cJSON *done;
    int rc = oai_onepass_event(event, len, &r->next_seq, what, &done, e);
    if (rc == OAI_MORE)
        return OAI_MORE;
    if (rc == OAI_FAILED) {
        if (strcmp(e->code, "BAD_EVENT"))
            rename_error(r, e); /* the worker's, in this API's words */
        return fail(r, e);
    }
    rc = feed_done(r, done, e);
    cJSON_Delete(done);
    return rc;
}

/* A result's place in the ranking. */
struct ranked {
    double score;
    int index;
};

/* Highest score first; a tie keeps the caller's order (the lower index
 * first), so the order is total and qsort's instability cannot show. */
static int by_score(const void *a, const void *b)
{
    const struct ranked *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static bool add_results(const struct rr_resp *r, cJSON *o)
{
    struct ranked *k = malloc((size_t)r->n * sizeof *k);
    cJSON *a = k ? cJSON_AddArrayToObject(o, "results") : NULL;
    bool ok = a != NULL;
    for (int i = 0; ok && i < r->n; i++)
        k[i] = (struct ranked){r->scores[i], i};
    if (ok)
        qsort(k, (size_t)r->n, sizeof *k, by_score);
    for (int i = 0; ok && i < r->top_n; i++) {
        cJSON *d = cJSON_CreateObject(), *doc = NULL;
        ok = d && cJSON_AddItemToArray(a, d);
        if (!ok) {
            cJSON_Delete(d);
            break;
        }
        ok = cJSON_AddNumberToObject(d, "index", k[i].index) &&
             cJSON_AddNumberToObject(d, "relevance_score", k[i].score);
        if (ok && r->docs)
            ok = (doc = cJSON_AddObjectToObject(d, "document")) &&
                 cJSON_AddStringToObject(doc, "text", r->docs[k[i].index]);
    }
    free(k);
    return ok;
}

char *rr_resp_body(const struct rr_resp *r)
{
    if (r->state != OAI_END)
        return NULL;
    cJSON *o = cJSON_CreateObject(), *u = NULL, *data = NULL;
    bool ok = o && cJSON_AddStringToObject(o, "id", r->id);
    if (ok && r->api == RR_RERANK) {
        ok = cJSON_AddStringToObject(o, "model", r->model) &&
             (u = cJSON_AddObjectToObject(o, "usage")) &&
             cJSON_AddNumberToObject(u, "total_tokens", (double)r->prompt_tokens) &&
             add_results(r, o);
    } else if (ok) {
        ok = cJSON_AddStringToObject(o, "object", "list") &&
             cJSON_AddNumberToObject(o, "created", (double)r->created) &&
             cJSON_AddStringToObject(o, "model", r->model) &&
             (data = cJSON_AddArrayToObject(o, "data"));
        for (int i = 0; ok && i < r->n; i++) {
            cJSON *d = cJSON_CreateObject();
            ok = d && cJSON_AddItemToArray(data, d);
            if (!ok) {
                cJSON_Delete(d);
                break;
            }
            ok = cJSON_AddNumberToObject(d, "index", i) &&
                 cJSON_AddStringToObject(d, "object", "score") &&
                 cJSON_AddNumberToObject(d, "score", r->scores[i]);
        }
        ok = ok && (u = cJSON_AddObjectToObject(o, "usage")) &&
             cJSON_AddNumberToObject(u, "prompt_tokens", (double)r->prompt_tokens) &&
             cJSON_AddNumberToObject(u, "total_tokens", (double)r->prompt_tokens);
    }
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

int64_t rr_resp_total_tokens(const struct rr_resp *r)
{
    return r->state == OAI_END ? r->prompt_tokens : 0;
}
