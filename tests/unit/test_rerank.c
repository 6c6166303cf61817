/* tests/unit/test_rerank.c - the rerank and score endpoints
 * (dispatcher/rerank.c): rerank bodies (Jina's and Cohere's, as vLLM
 * serves them) and vLLM's score bodies -> rerank jobs (one per document, in
 * order, each one job_parse accepts, the text exact), every refusal with
 * its status, code and param, and done events carrying scores (built by
 * the worker's own ev_build_done) -> the response objects: rerank's results
 * by relevance with ties in index order, cut to top_n, with or without the
 * documents; score's in input order, pairs as the body paired them; the
 * worker's errors renamed to the API's members. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "dispatcher/rerank.h"
#include "event.h"

static struct oai_limits lim_any(void)
{
    struct oai_limits l;
    oai_limits_default(&l);
    l.model = NULL; /* any name, carried in the job */
    l.refuse_unknown = false;
    return l;
}

/* Parses body (must succeed); returns the jobs as a cJSON array. */
static cJSON *jobs_of(enum rr_api api, const char *body, const struct oai_limits *l,
                      struct oai_request *r, struct rr_request *c)
{
    struct oai_error e;
    int rc = rr_parse(api, body, strlen(body), l, "rerank-ab12", 1700000000000, r, c, &e);
    if (rc)
        fail_msg("%s refused: %d %s [%s] %s", body, e.status, e.code, e.param, e.message);
    assert_false(r->stream);
    assert_int_equal(r->n_jobs, c->n_docs);
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < c->n_docs; i++) {
        const char *t = r->n_jobs > 1 ? r->jobs[i] : r->job;
        assert_int_equal(strlen(t), r->n_jobs > 1 ? r->job_lens[i] : r->job_len);
        /* every job is one the dispatcher and the worker take */
        struct job *j = NULL;
        struct job_fault f;
        struct rl_err err = {0};
        if (job_parse(t, strlen(t), NULL, &j, &f, &err))
            fail_msg("job_parse refused %s: %s", t, err.msg);
        assert_int_equal(j->task, JOB_TASK_RERANK);
        job_free(j);
        cJSON_AddItemToArray(a, cJSON_Parse(t));
    }
    return a;
}

static const char *str_of(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void test_rerank_requests(void **state)
{
    (void)state;
    struct oai_limits l = lim_any();
    l.client_lease_ms = 5000;
    struct oai_request r;
    struct rr_request c;
    /* one document: one job under the request's own id, the text exact */
    cJSON *a = jobs_of(RR_RERANK, "{\"model\":\"m\",\"query\":\"what is redis?\","
                                  "\"documents\":[\"Redis is a store.\"]}", &l, &r, &c);
    assert_int_equal(cJSON_GetArraySize(a), 1);
    char *s = cJSON_PrintUnformatted(a->child);
    assert_string_equal(s, "{\"id\":\"rerank-ab12\",\"task\":\"rerank\",\"model\":\"m\","
                           "\"query\":\"what is redis?\",\"document\":\"Redis is a store.\","
                           "\"mode\":\"no_think\",\"deadline_ms\":1700000000000,"
                           "\"client_lease_ms\":5000}");
    free(s);
    assert_null(r.jobs);
    assert_string_equal(r.model, "m");
    assert_int_equal(c.api, RR_RERANK);
    assert_int_equal(c.n_docs, 1);
    assert_int_equal(c.top_n, 1);
    assert_true(c.return_documents); /* the default */
    assert_string_equal(c.docs[0], "Redis is a store.");
    assert_string_equal(r.ignored, "");
    cJSON_Delete(a);
    oai_request_clear(&r);
    rr_request_clear(&c);

    /* several: strings and {text} objects, in order, ids <id>-<i>; the
     * instruction in every job; top_n kept; the texts kept for the answer */
    a = jobs_of(RR_RERANK, "{\"query\":\"q\",\"documents\":[\"a\",{\"text\":\"b\"},\"c\"],"
                           "\"top_n\":2,\"instruction\":\"Find code.\"}", &l, &r, &c);
    assert_int_equal(cJSON_GetArraySize(a), 3);
    assert_int_equal(r.n_jobs, 3);
    assert_ptr_equal(r.job, r.jobs[0]);
    assert_int_equal(c.top_n, 2);
    for (int i = 0; i < 3; i++) {
        cJSON *j = cJSON_GetArrayItem(a, i);
        char id[32], d[2] = {(char)('a' + i), 0};
        snprintf(id, sizeof id, "rerank-ab12-%d", i);
        assert_string_equal(str_of(j, "id"), id);
        assert_string_equal(str_of(j, "query"), "q");
        assert_string_equal(str_of(j, "document"), d);
        assert_string_equal(str_of(j, "instruction"), "Find code.");
        assert_null(cJSON_GetObjectItem(j, "model"));
        assert_string_equal(c.docs[i], d);
    }
    cJSON_Delete(a);
    oai_request_clear(&r);
    rr_request_clear(&c);
    assert_null(c.docs);

    /* top_n past the count is the count; return_documents false keeps no
     * text; an empty instruction is passed on (the worker's to read) */
    a = jobs_of(RR_RERANK, "{\"query\":\"q\",\"documents\":[\"a\",\"b\"],\"top_n\":99,"
                           "\"return_documents\":false,\"instruction\":\"\"}", &l, &r, &c);
    assert_int_equal(c.top_n, 2);
    assert_false(c.return_documents);
    assert_null(c.docs);
    assert_string_equal(str_of(a->child, "instruction"), "");
    cJSON_Delete(a);
    oai_request_clear(&r);
    rr_request_clear(&c);

    /* null members are absent; unknown members (and a document object's)
     * are named under http_unknown_fields = ignore */
    a = jobs_of(RR_RERANK, "{\"query\":\"q\",\"documents\":[\"a\",{\"text\":\"b\",\"title\":1}],"
                           "\"top_n\":null,\"return_documents\":null,\"instruction\":null,"
                           "\"max_tokens_per_doc\":512,\"rank_fields\":[\"text\"]}", &l, &r, &c);
    assert_int_equal(c.top_n, 2);
    assert_true(c.return_documents);
    assert_null(cJSON_GetObjectItem(a->child, "instruction"));
    assert_string_equal(r.ignored, "max_tokens_per_doc, rank_fields, documents[1].title");
    cJSON_Delete(a);
    oai_request_clear(&r);
    rr_request_clear(&c);

    /* the served name: the job carries none */
    l.model = "qwen";
    a = jobs_of(RR_RERANK, "{\"model\":\"qwen\",\"query\":\"q\",\"documents\":[\"d\"]}", &l, &r,
                &c);
    assert_null(cJSON_GetObjectItem(a->child, "model"));
    assert_string_equal(r.model, "");
    cJSON_Delete(a);
    oai_request_clear(&r);
    rr_request_clear(&c);
}

static void test_score_requests(void **state)
{
    (void)state;
    struct oai_limits l = lim_any();
    struct oai_request r;
    struct rr_request c;
    static const struct {
        const char *body;
        int n;
        const char *pairs[4][2]; /* query, document of job i */
    } cases[] = {
        {"{\"text_1\":\"q\",\"text_2\":\"d\"}", 1, {{"q", "d"}}},
        {"{\"text_1\":\"q\",\"text_2\":[\"a\",\"b\",\"c\"]}", 3, {{"q", "a"}, {"q", "b"}, {"q", "c"}}},
        {"{\"text_1\":[\"q\"],\"text_2\":[\"a\",\"b\"]}", 2, {{"q", "a"}, {"q", "b"}}},
        {"{\"text_1\":[\"q1\",\"q2\",\"q3\"],\"text_2\":[\"a\",\"b\",\"c\"]}", 3,
         {{"q1", "a"}, {"q2", "b"}, {"q3", "c"}}},
        {"{\"text_1\":[\"q\"],\"text_2\":\"d\"}", 1, {{"q", "d"}}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cJSON *a = jobs_of(RR_SCORE, cases[k].body, &l, &r, &c);
        assert_int_equal(cJSON_GetArraySize(a), cases[k].n);
        assert_int_equal(c.api, RR_SCORE);
        assert_false(c.return_documents);
        assert_null(c.docs);
        for (int i = 0; i < cases[k].n; i++) {
            cJSON *j = cJSON_GetArrayItem(a, i);
            assert_string_equal(str_of(j, "query"), cases[k].pairs[i][0]);
            assert_string_equal(str_of(j, "document"), cases[k].pairs[i][1]);
        }
        cJSON_Delete(a);
        oai_request_clear(&r);
        rr_request_clear(&c);
    }
    /* the job's text exact, with the instruction; top_n is rerank's */
    cJSON *a = jobs_of(RR_SCORE, "{\"model\":\"m\",\"text_1\":\"q\",\"text_2\":\"d\","
                                 "\"instruction\":\"Judge.\",\"top_n\":1}", &l, &r, &c);
    char *s = cJSON_PrintUnformatted(a->child);
    assert_string_equal(s, "{\"id\":\"rerank-ab12\",\"task\":\"rerank\",\"model\":\"m\","
                           "\"query\":\"q\",\"document\":\"d\",\"instruction\":\"Judge.\","
                           "\"mode\":\"no_think\",\"deadline_ms\":1700000000000}");
    free(s);
    assert_string_equal(r.ignored, "top_n");
    cJSON_Delete(a);
    oai_request_clear(&r);
    rr_request_clear(&c);
}

/* The limit: RR_DOCUMENTS_MAX documents are taken, one more is refused;
 * on the score API the same for text_2. */
static void test_document_limit(void **state)
{
    (void)state;
    struct oai_limits l = lim_any();
    for (int api = RR_RERANK; api <= RR_SCORE; api++)
        for (int n = RR_DOCUMENTS_MAX; n <= RR_DOCUMENTS_MAX + 1; n++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, api == RR_SCORE ? "text_1" : "query", "q");
            cJSON *in = cJSON_AddArrayToObject(o, api == RR_SCORE ? "text_2" : "documents");
            for (int i = 0; i < n; i++) {
                char t[16];
                snprintf(t, sizeof t, "t%d", i);
                cJSON_AddItemToArray(in, cJSON_CreateString(t));
            }
            char *body = cJSON_PrintUnformatted(o);
            struct oai_request r;
            struct rr_request c;
            struct oai_error e;
            int rc = rr_parse(api, body, strlen(body), &l, "rr-x", 0, &r, &c, &e);
            if (n == RR_DOCUMENTS_MAX) {
                assert_int_equal(rc, 0);
                assert_int_equal(r.n_jobs, n);
                assert_non_null(strstr(r.jobs[n - 1], "\"id\":\"rr-x-1023\""));
                assert_non_null(strstr(r.jobs[n - 1], "\"document\":\"t1023\""));
            } else {
                assert_int_equal(rc, -RL_EINVAL);
                assert_int_equal(e.status, 400);
                assert_string_equal(e.code, "OUT_OF_RANGE");
                assert_string_equal(e.param, api == RR_SCORE ? "text_2" : "documents");
                assert_null(r.jobs);
                assert_null(c.docs);
            }
            oai_request_clear(&r);
            rr_request_clear(&c);
            free(body);
            cJSON_Delete(o);
        }
}

struct refusal {
    enum rr_api api;
    const char *body;
    bool refuse_unknown;
    const char *served;
    int status;
    const char *code;
    const char *param; /* "" = null */
};

static const struct refusal refusals[] = {
    /* the body */
    {RR_RERANK, "[1]", false, NULL, 400, "NOT_OBJECT", ""},
    {RR_RERANK, "{\"query\":", false, NULL, 400, "INVALID_JSON", ""},
    /* query */
    {RR_RERANK, "{\"documents\":[\"d\"]}", false, NULL, 400, "MISSING_FIELD", "query"},
    {RR_RERANK, "{\"query\":null,\"documents\":[\"d\"]}", false, NULL, 400, "MISSING_FIELD",
     "query"},
    {RR_RERANK, "{\"query\":\"\",\"documents\":[\"d\"]}", false, NULL, 400, "BAD_VALUE", "query"},
    {RR_RERANK, "{\"query\":5,\"documents\":[\"d\"]}", false, NULL, 400, "BAD_TYPE", "query"},
    {RR_RERANK, "{\"query\":[\"q\"],\"documents\":[\"d\"]}", false, NULL, 400, "BAD_TYPE",
     "query"},
    /* documents */
    {RR_RERANK, "{\"query\":\"q\"}", false, NULL, 400, "MISSING_FIELD", "documents"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[]}", false, NULL, 400, "BAD_VALUE",
     "documents"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":\"d\"}", false, NULL, 400, "BAD_TYPE",
     "documents"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[\"a\",\"\"]}", false, NULL, 400, "BAD_VALUE",
     "documents"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[\"a\",7]}", false, NULL, 400, "BAD_TYPE",
     "documents"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[[\"a\"]]}", false, NULL, 400, "BAD_TYPE",
     "documents"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[{\"title\":\"a\"}]}", false, NULL, 400,
     "MISSING_FIELD", "documents"},
    /* an image document: refused for its missing text, not its image */
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[{\"image\":\"x.png\"}]}", true, NULL, 400,
     "MISSING_FIELD", "documents"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[{\"text\":1}]}", false, NULL, 400, "BAD_TYPE",
     "documents"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[{\"text\":\"\"}]}", false, NULL, 400,
     "BAD_VALUE", "documents"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[{\"text\":\"a\",\"text\":\"b\"}]}", false, NULL,
     400, "DUPLICATE_FIELD", "documents"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[{\"text\":\"a\",\"title\":\"t\"}]}", true, NULL,
     400, "UNKNOWN_FIELD", "documents[0].title"},
    /* top_n, return_documents, instruction */
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[\"d\"],\"top_n\":0}", false, NULL, 400,
     "OUT_OF_RANGE", "top_n"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[\"d\"],\"top_n\":-2}", false, NULL, 400,
     "OUT_OF_RANGE", "top_n"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[\"d\"],\"top_n\":1.5}", false, NULL, 400,
     "BAD_TYPE", "top_n"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[\"d\"],\"top_n\":\"3\"}", false, NULL, 400,
     "BAD_TYPE", "top_n"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[\"d\"],\"return_documents\":1}", false, NULL,
     400, "BAD_TYPE", "return_documents"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[\"d\"],\"instruction\":[]}", false, NULL, 400,
     "BAD_TYPE", "instruction"},
    /* the rest */
    {RR_RERANK, "{\"query\":\"q\",\"query\":\"r\",\"documents\":[\"d\"]}", false, NULL, 400,
     "DUPLICATE_FIELD", "query"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[\"d\"],\"frobnicate\":1}", true, NULL, 400,
     "UNKNOWN_FIELD", "frobnicate"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[\"d\"],\"text_1\":\"x\"}", true, NULL, 400,
     "UNKNOWN_FIELD", "text_1"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[\"d\"],\"model\":5}", false, NULL, 400,
     "BAD_TYPE", "model"},
    {RR_RERANK, "{\"query\":\"q\",\"documents\":[\"d\"],\"model\":\"other\"}", false, "qwen",
     404, "model_not_found", "model"},
    /* the score API */
    {RR_SCORE, "{\"text_2\":\"d\"}", false, NULL, 400, "MISSING_FIELD", "text_1"},
    {RR_SCORE, "{\"text_1\":\"q\"}", false, NULL, 400, "MISSING_FIELD", "text_2"},
    {RR_SCORE, "{\"text_1\":\"\",\"text_2\":\"d\"}", false, NULL, 400, "BAD_VALUE", "text_1"},
    {RR_SCORE, "{\"text_1\":\"q\",\"text_2\":\"\"}", false, NULL, 400, "BAD_VALUE", "text_2"},
    {RR_SCORE, "{\"text_1\":[],\"text_2\":\"d\"}", false, NULL, 400, "BAD_VALUE", "text_1"},
    {RR_SCORE, "{\"text_1\":\"q\",\"text_2\":[]}", false, NULL, 400, "BAD_VALUE", "text_2"},
    {RR_SCORE, "{\"text_1\":7,\"text_2\":\"d\"}", false, NULL, 400, "BAD_TYPE", "text_1"},
    {RR_SCORE, "{\"text_1\":\"q\",\"text_2\":[\"a\",{\"text\":\"b\"}]}", false, NULL, 400,
     "BAD_TYPE", "text_2"},
    {RR_SCORE, "{\"text_1\":[\"q\",\"\"],\"text_2\":[\"a\",\"b\"]}", false, NULL, 400,
     "BAD_VALUE", "text_1"},
    /* mismatched lengths: 2 for 3, and N for 1 (vLLM's 1:1, 1:N, N:N) */
    {RR_SCORE, "{\"text_1\":[\"q\",\"r\"],\"text_2\":[\"a\",\"b\",\"c\"]}", false, NULL, 400,
     "BAD_VALUE", "text_1"},
    {RR_SCORE, "{\"text_1\":[\"q\",\"r\"],\"text_2\":\"a\"}", false, NULL, 400, "BAD_VALUE",
     "text_1"},
    {RR_SCORE, "{\"text_1\":\"q\",\"text_2\":\"d\",\"documents\":[\"x\"]}", true, NULL, 400,
     "UNKNOWN_FIELD", "documents"},
    {RR_SCORE, "{\"text_1\":\"q\",\"text_2\":\"d\",\"model\":\"other\"}", false, "qwen", 404,
     "model_not_found", "model"},
};

static void test_refusals(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        const struct refusal *t = &refusals[i];
        struct oai_limits l = lim_any();
        l.refuse_unknown = t->refuse_unknown;
        l.model = t->served;
        struct oai_request r;
        struct rr_request c;
        struct oai_error e;
        int rc = rr_parse(t->api, t->body, strlen(t->body), &l, "rr-x", 0, &r, &c, &e);
        if (rc != -RL_EINVAL || e.status != t->status || strcmp(e.code, t->code) ||
            strcmp(e.param, t->param))
            fail_msg("%s: rc %d, %d %s [%s] %s; expected %d %s [%s]", t->body, rc, e.status,
                     e.code, e.param, e.message, t->status, t->code, t->param);
        assert_true(e.message[0]);
        assert_null(r.job);
        assert_null(r.jobs);
        assert_int_equal(r.n_jobs, 0);
        assert_null(c.docs);
        /* the error body is OpenAI's error object */
        char *s = oai_error_json(&e);
        cJSON *o = cJSON_Parse(s);
        const cJSON *er = cJSON_GetObjectItem(o, "error");
        assert_string_equal(str_of(er, "code"), t->code);
        cJSON_Delete(o);
        free(s);
    }
    /* the index of the bad document is in the message */
    struct oai_limits l = lim_any();
    struct oai_request r;
    struct rr_request c;
    struct oai_error e;
    const char *b = "{\"query\":\"q\",\"documents\":[\"a\",\"b\",{\"text\":2}]}";
    assert_int_equal(rr_parse(RR_RERANK, b, strlen(b), &l, "x", 0, &r, &c, &e), -RL_EINVAL);
    assert_non_null(strstr(e.message, "documents[2].text"));
    /* a body over the limit: 413 */
    l.max_body_bytes = 8;
    b = "{\"query\":\"q\",\"documents\":[\"d\"]}";
    assert_int_equal(rr_parse(RR_RERANK, b, strlen(b), &l, "x", 0, &r, &c, &e), -RL_EINVAL);
    assert_int_equal(e.status, 413);
}

/* The query is copied into every job: the copies past the first may add
 * at most one more body's worth (max_body_bytes), else 413 naming it. */
static void test_query_copies(void **state)
{
    (void)state;
    struct oai_limits l = lim_any();
    l.max_body_bytes = 4096;
    char body[4096];
    /* a 100-byte query over 40 documents: 3900 bytes of copies, taken */
    char q[101];
    memset(q, 'q', 100);
    q[100] = 0;
    struct { int n; const char *member; int status; } cases[] = {
        {40, "query", 0}, {42, "query", 413}, {42, "text_1", 413},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        bool score = !strcmp(cases[k].member, "text_1");
        int n = snprintf(body, sizeof body, "{\"%s\":\"%s\",\"%s\":[", cases[k].member, q,
                         score ? "text_2" : "documents");
        for (int i = 0; i < cases[k].n; i++)
            n += snprintf(body + n, sizeof body - (size_t)n, "%s\"d\"", i ? "," : "");
        n += snprintf(body + n, sizeof body - (size_t)n, "]}");
        struct oai_request r;
        struct rr_request c;
        struct oai_error e;
        int rc = rr_parse(score ? RR_SCORE : RR_RERANK, body, (size_t)n, &l, "x", 0, &r, &c,
                          &e);
        if (!cases[k].status) {
            assert_int_equal(rc, 0);
            assert_int_equal(r.n_jobs, cases[k].n);
        } else {
            assert_int_equal(rc, -RL_EINVAL);
            assert_int_equal(e.status, 413);
            assert_string_equal(e.code, "JOB_TOO_LARGE");
            assert_string_equal(e.param, cases[k].member);
            assert_non_null(strstr(e.message, "add 4100 bytes, over the limit of one body's "
                                              "worth (4096)"));
        }
        oai_request_clear(&r);
        rr_request_clear(&c);
    }
    /* pairs copy nothing but the instruction: N:N of the same sizes is taken */
    int n = snprintf(body, sizeof body, "{\"text_1\":[");
    for (int i = 0; i < 30; i++)
        n += snprintf(body + n, sizeof body - (size_t)n, "%s\"%.60s\"", i ? "," : "", q);
    n += snprintf(body + n, sizeof body - (size_t)n, "],\"text_2\":[");
    for (int i = 0; i < 30; i++)
        n += snprintf(body + n, sizeof body - (size_t)n, "%s\"d\"", i ? "," : "");
    n += snprintf(body + n, sizeof body - (size_t)n, "]}");
    struct oai_request r;
    struct rr_request c;
    struct oai_error e;
    assert_int_equal(rr_parse(RR_SCORE, body, (size_t)n, &l, "x", 0, &r, &c, &e), 0);
    assert_int_equal(r.n_jobs, 30);
    oai_request_clear(&r);
    rr_request_clear(&c);
}

/* ---- responses ---- */

/* The done event a worker writes for a rerank job (the worker's own
 * ev_build_done). */
static char *done_event(int64_t seq, double score, int64_t prompt_tokens)
{
    struct ev_done d = {.finish_reason = EV_FINISH_STOP, .prompt_tokens = prompt_tokens,
                        .total_ms = 3, .has_score = true, .score = score};
    char *s = NULL;
    struct rl_err err = {0};
    assert_int_equal(ev_build_done(seq, &d, &s, &err), 0);
    return s;
}

static int feed(struct rr_resp *r, const char *ev, struct oai_error *e)
{
    return rr_resp_feed(r, ev, strlen(ev), e);
}

/* An answer to a parsed body, fed one done event per job with these
 * scores (prompt tokens i + 10 for job i); returns the body parsed. */
static cJSON *answer(enum rr_api api, const char *body, const double *scores, int64_t *tokens)
{
    struct oai_limits l = lim_any();
    struct oai_request q;
    struct rr_request c;
    struct oai_error e;
    assert_int_equal(rr_parse(api, body, strlen(body), &l, "rerank-9", 0, &q, &c, &e), 0);
    struct rr_resp *r = NULL;
    struct rl_err err = {0};
    assert_int_equal(rr_resp_create(&r, &c, "rerank-9", "qwen", 1700000000, &err), 0);
    assert_null(rr_resp_body(r));
    *tokens = 0;
    for (int i = 0; i < c.n_docs; i++) {
        char *d = done_event(0, scores[i], 10 + i);
        assert_int_equal(rr_resp_total_tokens(r), 0);
        assert_int_equal(feed(r, d, &e), i + 1 < c.n_docs ? OAI_NEXT : OAI_END);
        *tokens += 10 + i;
        free(d);
    }
    assert_int_equal(rr_resp_total_tokens(r), *tokens);
    char *s = rr_resp_body(r);
    cJSON *o = cJSON_Parse(s);
    assert_non_null(o);
    free(s);
    rr_resp_free(r);
    rr_request_clear(&c);
    oai_request_clear(&q);
    return o;
}

static void test_rerank_answers(void **state)
{
    (void)state;
    int64_t tokens;
    /* ties (0.5 at 1 and 3) keep the lower index first */
    static const double sc[] = {0.25, 0.5, 0.875, 0.5, 0.0};
    cJSON *o = answer(RR_RERANK, "{\"query\":\"q\",\"documents\":[\"a\",{\"text\":\"b\"},"
                                 "\"c\",\"d\",\"e\"]}", sc, &tokens);
    assert_int_equal(cJSON_GetArraySize(o), 4);
    assert_string_equal(str_of(o, "id"), "rerank-9");
    assert_string_equal(str_of(o, "model"), "qwen");
    const cJSON *u = cJSON_GetObjectItem(o, "usage");
    assert_int_equal(cJSON_GetArraySize(u), 1);
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, tokens);
    assert_int_equal(tokens, 10 + 11 + 12 + 13 + 14);
    const cJSON *res = cJSON_GetObjectItem(o, "results");
    static const int order[] = {2, 1, 3, 0, 4};
    static const char *const text[] = {"a", "b", "c", "d", "e"};
    assert_int_equal(cJSON_GetArraySize(res), 5);
    for (int i = 0; i < 5; i++) {
        const cJSON *x = cJSON_GetArrayItem(res, i);
        int k = order[i];
        assert_int_equal(cJSON_GetObjectItem(x, "index")->valueint, k);
        assert_true(cJSON_GetObjectItem(x, "relevance_score")->valuedouble == sc[k]);
        /* a {text} document and a string one alike */
        assert_string_equal(str_of(cJSON_GetObjectItem(x, "document"), "text"), text[k]);
    }
    cJSON_Delete(o);

    /* top_n: the best ones; return_documents false: no document */
    o = answer(RR_RERANK, "{\"query\":\"q\",\"documents\":[\"a\",\"b\",\"c\",\"d\",\"e\"],"
                          "\"top_n\":2,\"return_documents\":false}", sc, &tokens);
    res = cJSON_GetObjectItem(o, "results");
    assert_int_equal(cJSON_GetArraySize(res), 2);
    for (int i = 0; i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(res, i);
        assert_int_equal(cJSON_GetObjectItem(x, "index")->valueint, order[i]);
        assert_null(cJSON_GetObjectItem(x, "document"));
        assert_int_equal(cJSON_GetArraySize(x), 2);
    }
    cJSON_Delete(o);

    /* a score printed back exactly */
    static const double one[] = {0.123456789012345678};
    o = answer(RR_RERANK, "{\"query\":\"q\",\"documents\":[\"only\"],\"top_n\":5}", one, &tokens);
    res = cJSON_GetObjectItem(o, "results");
    assert_int_equal(cJSON_GetArraySize(res), 1);
    assert_true(cJSON_GetObjectItem(res->child, "relevance_score")->valuedouble == one[0]);
    cJSON_Delete(o);
}

static void test_score_answers(void **state)
{
    (void)state;
    int64_t tokens;
    static const double sc[] = {0.25, 1.0, 0.0};
    cJSON *o = answer(RR_SCORE, "{\"model\":\"m\",\"text_1\":[\"q1\",\"q2\",\"q3\"],"
                                "\"text_2\":[\"a\",\"b\",\"c\"]}", sc, &tokens);
    assert_string_equal(str_of(o, "id"), "rerank-9");
    assert_string_equal(str_of(o, "object"), "list");
    assert_int_equal((int64_t)cJSON_GetObjectItem(o, "created")->valuedouble, 1700000000);
    assert_string_equal(str_of(o, "model"), "qwen");
    const cJSON *u = cJSON_GetObjectItem(o, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 33);
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, 33);
    const cJSON *data = cJSON_GetObjectItem(o, "data");
    assert_int_equal(cJSON_GetArraySize(data), 3);
    for (int i = 0; i < 3; i++) { /* input order, not by score */
        const cJSON *d = cJSON_GetArrayItem(data, i);
        assert_int_equal(cJSON_GetObjectItem(d, "index")->valueint, i);
        assert_string_equal(str_of(d, "object"), "score");
        assert_true(cJSON_GetObjectItem(d, "score")->valuedouble == sc[i]);
    }
    cJSON_Delete(o);
}

static struct rr_resp *resp_of(enum rr_api api, int n)
{
    struct rr_request c = {.api = api, .n_docs = n, .top_n = n};
    struct rr_resp *r = NULL;
    struct rl_err err = {0};
    assert_int_equal(rr_resp_create(&r, &c, "rerank-1", "qwen", 0, &err), 0);
    return r;
}

static void test_event_failures(void **state)
{
    (void)state;
    struct oai_error e;
    char *ev = NULL;
    struct rl_err err = {0};

    /* the worker's error: status and code from the event, param this
     * API's member, the message led by the index of several */
    static const struct {
        enum rr_api api;
        int n;
        enum ev_code code;
        const char *msg;
        int status;
        const char *ecode, *param, *lead;
    } errs[] = {
        {RR_RERANK, 2, EV_CODE_PROMPT_TOO_LONG, "prompt has 50 tokens; the model's context is 40",
         400, "context_length_exceeded", "documents", "documents[1]: prompt has 50"},
        {RR_SCORE, 2, EV_CODE_PROMPT_TOO_LONG, "prompt has 50 tokens", 400,
         "context_length_exceeded", "text_2", "text_2[1]: "},
        {RR_RERANK, 1, EV_CODE_PROMPT_TOO_LONG, "prompt has 50 tokens", 400,
         "context_length_exceeded", "documents", "prompt has 50"},
        {RR_RERANK, 2, EV_CODE_BAD_VALUE, "query: not for this model", 400, "BAD_VALUE", "query",
         "documents[1]: query: "},
        {RR_SCORE, 2, EV_CODE_BAD_VALUE, "document: not for this model", 400, "BAD_VALUE",
         "text_2", "text_2[1]: document"},
        {RR_SCORE, 2, EV_CODE_BAD_VALUE, "query: no", 400, "BAD_VALUE", "text_1", "text_2[1]: "},
        {RR_RERANK, 2, EV_CODE_BAD_VALUE, "task: \"rerank\" is not generate or embed", 400,
         "BAD_VALUE", "task", "documents[1]: task"},
        /* a model that cannot rerank: the worker's BAD_PARAM names it */
        {RR_RERANK, 1, EV_CODE_BAD_PARAM, "task rerank: this model's tokenizer has no single "
         "\"yes\" and \"no\" tokens", 400, "BAD_PARAM", "model", "task rerank: "},
        {RR_SCORE, 2, EV_CODE_BAD_PARAM, "task rerank: no yes", 400, "BAD_PARAM", "model",
         "text_2[1]: task"},
        {RR_RERANK, 2, EV_CODE_OVERLOADED, "queue full", 503, "OVERLOADED", "", "documents[1]: "},
        {RR_RERANK, 2, EV_CODE_MODEL_NOT_FOUND, "no worker serves x", 404, "model_not_found",
         "model", "documents[1]: no worker"},
    };
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        struct rr_resp *r = resp_of(errs[i].api, errs[i].n);
        char *d0 = done_event(0, 0.5, 1);
        if (errs[i].n > 1)
            assert_int_equal(feed(r, d0, &e), OAI_NEXT);
        assert_int_equal(ev_build_error(0, errs[i].code, errs[i].msg, &ev, &err), 0);
        assert_int_equal(feed(r, ev, &e), OAI_FAILED);
        if (e.status != errs[i].status || strcmp(e.code, errs[i].ecode) ||
            strcmp(e.param, errs[i].param) || strncmp(e.message, errs[i].lead,
                                                      strlen(errs[i].lead)))
            fail_msg("%s: %d %s [%s] %s", errs[i].msg, e.status, e.code, e.param, e.message);
        struct oai_error again;
        assert_int_equal(feed(r, d0, &again), OAI_FAILED); /* and stays failed */
        assert_string_equal(again.message, e.message);
        assert_null(rr_resp_body(r));
        free(ev);
        free(d0);
        rr_resp_free(r);
    }

    /* a message at the size limit keeps the index and loses its end */
    char big[600];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    struct rr_resp *r = resp_of(RR_RERANK, 2);
    char *d0 = done_event(0, 0.5, 1);
    assert_int_equal(feed(r, d0, &e), OAI_NEXT);
    free(d0);
    char *bev = malloc(1024);
    snprintf(bev, 1024, "{\"seq\":0,\"type\":\"error\",\"code\":\"INTERNAL\",\"message\":\"%s\"}",
             big);
    assert_int_equal(feed(r, bev, &e), OAI_FAILED);
    assert_int_equal(strncmp(e.message, "documents[1]: xxx", 17), 0);
    assert_int_equal(strlen(e.message), sizeof e.message - 1);
    free(bev);
    rr_resp_free(r);

    /* broken events: 502 BAD_EVENT */
    static const char *const broken[] = {
        "not json",
        "{\"seq\":1,\"type\":\"done\",\"finish_reason\":\"stop\",\"score\":0.5}", /* seq skips */
        "{\"seq\":0,\"type\":\"mystery\"}",
        "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"stop\"}",                  /* no score */
        "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"stop\",\"score\":\"0.5\"}",
        "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"stop\",\"score\":1.5}",
        "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"stop\",\"score\":-0.01}",
        "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"stop\",\"score\":null}",
        "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"stop\",\"embedding\":\"AAAAAA==\","
        "\"dimensions\":1}", /* an embedding worker's answer */
    };
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        for (int api = RR_RERANK; api <= RR_SCORE; api++) {
            r = resp_of(api, 1);
            assert_int_equal(feed(r, broken[i], &e), OAI_FAILED);
            if (e.status != 502 || strcmp(e.code, "BAD_EVENT"))
                fail_msg("%s: %d %s", broken[i], e.status, e.code);
            rr_resp_free(r);
        }
    }

    /* the ends of the range are scores */
    for (int k = 0; k < 2; k++) {
        r = resp_of(RR_RERANK, 1);
        char *d = done_event(0, k, 1);
        assert_int_equal(feed(r, d, &e), OAI_END);
        free(d);
        rr_resp_free(r);
    }

    /* a done that ended in error or past its deadline */
    r = resp_of(RR_RERANK, 1);
    assert_int_equal(feed(r, "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"error\"}", &e),
                     OAI_FAILED);
    assert_int_equal(e.status, 500);
    rr_resp_free(r);
    r = resp_of(RR_SCORE, 1);
    assert_int_equal(feed(r, "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"deadline\"}", &e),
                     OAI_FAILED);
    assert_int_equal(e.status, 504);
    assert_string_equal(e.code, "DEADLINE_EXCEEDED");
    rr_resp_free(r);

    /* a stray delta is skipped; the done after it counts */
    r = resp_of(RR_RERANK, 1);
    char *d1 = done_event(1, 0.75, 4);
    assert_int_equal(feed(r, "{\"seq\":0,\"type\":\"delta\",\"delta\":{\"content\":\"\"}}", &e),
                     OAI_MORE);
    assert_int_equal(feed(r, d1, &e), OAI_END);
    assert_int_equal(rr_resp_total_tokens(r), 4);
    free(d1);
    rr_resp_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rerank_requests),
        cmocka_unit_test(test_score_requests),
        cmocka_unit_test(test_document_limit),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_query_copies),
        cmocka_unit_test(test_rerank_answers),
        cmocka_unit_test(test_score_answers),
        cmocka_unit_test(test_event_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
