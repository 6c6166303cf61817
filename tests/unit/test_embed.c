/* tests/unit/test_embed.c - the embedding endpoints (dispatcher/embed.c):
 * OpenAI's POST /v1/embeddings and Ollama's /api/embed and /api/embeddings
 * bodies -> embedding jobs (one per input, in order, each one job_parse
 * accepts), every refusal with its status, code and param, and done events
 * (built by the worker's own ev_build_done) -> the response objects:
 * floats that read back to the same float32, base64 passed on as it is,
 * several inputs in order with their indices, usage summed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "base64.h"
#include "dispatcher/embed.h"
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
static cJSON *jobs_of(enum emb_api api, const char *body, const struct oai_limits *l,
                      struct oai_request *r, struct emb_request *c)
{
    struct oai_error e;
    int rc = emb_parse(api, body, strlen(body), l, "embd-ab12", 1700000000000, r, c, &e);
    if (rc)
        fail_msg("%s refused: %d %s [%s] %s", body, e.status, e.code, e.param, e.message);
    assert_false(r->stream);
    cJSON *a = cJSON_CreateArray();
    int n = r->n_jobs > 1 ? r->n_jobs : 1;
    for (int i = 0; i < n && !c->load_only; i++) {
        const char *t = r->n_jobs > 1 ? r->jobs[i] : r->job;
        assert_int_equal(strlen(t), r->n_jobs > 1 ? r->job_lens[i] : r->job_len);
        /* every job is one the dispatcher and the worker take */
        struct job *j = NULL;
        struct job_fault f;
        struct rl_err err = {0};
        if (job_parse(t, strlen(t), NULL, &j, &f, &err))
            fail_msg("job_parse refused %s: %s", t, err.msg);
        assert_int_equal(j->task, JOB_TASK_EMBED);
        job_free(j);
        cJSON_AddItemToArray(a, cJSON_Parse(t));
    }
    return a;
}

static void test_openai_requests(void **state)
{
    (void)state;
    struct oai_limits l = lim_any();
    l.client_lease_ms = 5000;
    struct oai_request r;
    struct emb_request c;
    /* one string: one job under the request's own id */
    cJSON *a = jobs_of(EMB_OPENAI, "{\"model\":\"m\",\"input\":\"hello\"}", &l, &r, &c);
    assert_int_equal(cJSON_GetArraySize(a), 1);
    char *s = cJSON_PrintUnformatted(a->child);
    assert_string_equal(s, "{\"id\":\"embd-ab12\",\"task\":\"embed\",\"model\":\"m\","
                           "\"prompt\":\"hello\",\"mode\":\"no_think\","
                           "\"deadline_ms\":1700000000000,\"client_lease_ms\":5000}");
    free(s);
    assert_string_equal(r.model, "m");
    assert_false(c.base64);
    assert_int_equal(c.n_inputs, 1);
    assert_int_equal(c.api, EMB_OPENAI);
    assert_string_equal(r.ignored, "");
    cJSON_Delete(a);
    oai_request_clear(&r);

    /* several strings: one job each, in order, ids <id>-<i>; dimensions
     * and base64 carried; user accepted and not named */
    a = jobs_of(EMB_OPENAI, "{\"input\":[\"a\",\"b\",\"c\"],\"encoding_format\":\"base64\","
                            "\"dimensions\":8,\"user\":\"u1\"}", &l, &r, &c);
    assert_int_equal(cJSON_GetArraySize(a), 3);
    assert_int_equal(r.n_jobs, 3);
    assert_ptr_equal(r.job, r.jobs[0]);
    assert_true(c.base64);
    assert_int_equal(c.n_inputs, 3);
    for (int i = 0; i < 3; i++) {
        cJSON *j = cJSON_GetArrayItem(a, i);
        char id[32], p[2] = {(char)('a' + i), 0};
        snprintf(id, sizeof id, "embd-ab12-%d", i);
        assert_string_equal(cJSON_GetObjectItem(j, "id")->valuestring, id);
        assert_string_equal(cJSON_GetObjectItem(j, "prompt")->valuestring, p);
        assert_int_equal(cJSON_GetObjectItem(j, "dimensions")->valueint, 8);
        assert_null(cJSON_GetObjectItem(j, "model"));
    }
    assert_string_equal(r.ignored, "");
    cJSON_Delete(a);
    oai_request_clear(&r);

    /* token ids: one input; a list of id lists: one each */
    a = jobs_of(EMB_OPENAI, "{\"input\":[1,2,3]}", &l, &r, &c);
    assert_int_equal(cJSON_GetArraySize(a), 1);
    s = cJSON_PrintUnformatted(cJSON_GetObjectItem(a->child, "prompt_ids"));
    assert_string_equal(s, "[1,2,3]");
    free(s);
    cJSON_Delete(a);
    oai_request_clear(&r);
    a = jobs_of(EMB_OPENAI, "{\"input\":[[5],[6,7]],\"encoding_format\":\"float\"}", &l, &r, &c);
    assert_int_equal(cJSON_GetArraySize(a), 2);
    s = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetArrayItem(a, 1), "prompt_ids"));
    assert_string_equal(s, "[6,7]");
    free(s);
    assert_false(c.base64);
    cJSON_Delete(a);
    oai_request_clear(&r);

    /* a list of one is one job under the plain id; null members are absent */
    a = jobs_of(EMB_OPENAI, "{\"input\":[\"x\"],\"dimensions\":null,\"encoding_format\":null}",
                &l, &r, &c);
    assert_string_equal(cJSON_GetObjectItem(a->child, "id")->valuestring, "embd-ab12");
    assert_null(cJSON_GetObjectItem(a->child, "dimensions"));
    assert_null(r.jobs);
    cJSON_Delete(a);
    oai_request_clear(&r);

    /* unknown members: named under http_unknown_fields = ignore */
    a = jobs_of(EMB_OPENAI, "{\"input\":\"x\",\"frobnicate\":1,\"truncate\":true}", &l, &r, &c);
    assert_string_equal(r.ignored, "frobnicate, truncate");
    cJSON_Delete(a);
    oai_request_clear(&r);

    /* the served name: the job carries none */
    l.model = "qwen";
    a = jobs_of(EMB_OPENAI, "{\"model\":\"qwen\",\"input\":\"x\"}", &l, &r, &c);
    assert_null(cJSON_GetObjectItem(a->child, "model"));
    assert_string_equal(r.model, "");
    cJSON_Delete(a);
    oai_request_clear(&r);
}

/* The limit: EMB_INPUTS_MAX inputs are taken, one more is refused. */
static void test_openai_input_limit(void **state)
{
    (void)state;
    struct oai_limits l = lim_any();
    for (int n = EMB_INPUTS_MAX; n <= EMB_INPUTS_MAX + 1; n++) {
        cJSON *o = cJSON_CreateObject(), *in = cJSON_AddArrayToObject(o, "input");
        for (int i = 0; i < n; i++) {
            char t[16];
            snprintf(t, sizeof t, "t%d", i);
            cJSON_AddItemToArray(in, cJSON_CreateString(t));
        }
        char *body = cJSON_PrintUnformatted(o);
        struct oai_request r;
        struct emb_request c;
        struct oai_error e;
        int rc = emb_parse(EMB_OPENAI, body, strlen(body), &l, "embd-x", 0, &r, &c, &e);
        if (n == EMB_INPUTS_MAX) {
            assert_int_equal(rc, 0);
            assert_int_equal(r.n_jobs, n);
            assert_non_null(strstr(r.jobs[n - 1], "\"id\":\"embd-x-2047\""));
            assert_non_null(strstr(r.jobs[n - 1], "\"prompt\":\"t2047\""));
        } else {
            assert_int_equal(rc, -RL_EINVAL);
            assert_int_equal(e.status, 400);
            assert_string_equal(e.code, "OUT_OF_RANGE");
            assert_string_equal(e.param, "input");
            assert_null(r.jobs);
        }
        oai_request_clear(&r);
        free(body);
        cJSON_Delete(o);
    }
}

struct refusal {
    enum emb_api api;
    const char *body;
    bool refuse_unknown;
    const char *served;
    int status;
    const char *code;
    const char *param; /* "" = null */
};

static const struct refusal refusals[] = {
    /* the body */
    {EMB_OPENAI, "[1]", false, NULL, 400, "NOT_OBJECT", ""},
    {EMB_OPENAI, "{\"input\":", false, NULL, 400, "INVALID_JSON", ""},
    /* input */
    {EMB_OPENAI, "{}", false, NULL, 400, "MISSING_FIELD", "input"},
    {EMB_OPENAI, "{\"input\":null}", false, NULL, 400, "MISSING_FIELD", "input"},
    {EMB_OPENAI, "{\"input\":\"\"}", false, NULL, 400, "BAD_VALUE", "input"},
    {EMB_OPENAI, "{\"input\":[]}", false, NULL, 400, "BAD_VALUE", "input"},
    {EMB_OPENAI, "{\"input\":[\"a\",\"\"]}", false, NULL, 400, "BAD_VALUE", "input"},
    {EMB_OPENAI, "{\"input\":[[1],[]]}", false, NULL, 400, "BAD_VALUE", "input"},
    {EMB_OPENAI, "{\"input\":[\"a\",1]}", false, NULL, 400, "BAD_TYPE", "input"},
    {EMB_OPENAI, "{\"input\":[[1],\"a\"]}", false, NULL, 400, "BAD_TYPE", "input"},
    {EMB_OPENAI, "{\"input\":[1,2.5]}", false, NULL, 400, "BAD_TYPE", "input"},
    {EMB_OPENAI, "{\"input\":[{}]}", false, NULL, 400, "BAD_TYPE", "input"},
    {EMB_OPENAI, "{\"input\":7}", false, NULL, 400, "BAD_TYPE", "input"},
    {EMB_OPENAI, "{\"input\":[-1]}", false, NULL, 400, "OUT_OF_RANGE", "input"},
    {EMB_OPENAI, "{\"input\":[[1],[-1]]}", false, NULL, 400, "OUT_OF_RANGE", "input"},
    /* encoding_format, dimensions */
    {EMB_OPENAI, "{\"input\":\"a\",\"encoding_format\":\"int8\"}", false, NULL, 400, "BAD_VALUE",
     "encoding_format"},
    {EMB_OPENAI, "{\"input\":\"a\",\"encoding_format\":1}", false, NULL, 400, "BAD_TYPE",
     "encoding_format"},
    {EMB_OPENAI, "{\"input\":\"a\",\"dimensions\":0}", false, NULL, 400, "OUT_OF_RANGE",
     "dimensions"},
    {EMB_OPENAI, "{\"input\":\"a\",\"dimensions\":16385}", false, NULL, 400, "OUT_OF_RANGE",
     "dimensions"},
    {EMB_OPENAI, "{\"input\":\"a\",\"dimensions\":2.5}", false, NULL, 400, "BAD_TYPE",
     "dimensions"},
    {EMB_OPENAI, "{\"input\":\"a\",\"dimensions\":\"8\"}", false, NULL, 400, "BAD_TYPE",
     "dimensions"},
    /* the rest */
    {EMB_OPENAI, "{\"input\":\"a\",\"user\":5}", false, NULL, 400, "BAD_TYPE", "user"},
    {EMB_OPENAI, "{\"input\":\"a\",\"input\":\"b\"}", false, NULL, 400, "DUPLICATE_FIELD",
     "input"},
    {EMB_OPENAI, "{\"input\":\"a\",\"frobnicate\":1}", true, NULL, 400, "UNKNOWN_FIELD",
     "frobnicate"},
    {EMB_OPENAI, "{\"input\":\"a\",\"model\":5}", false, NULL, 400, "BAD_TYPE", "model"},
    {EMB_OPENAI, "{\"input\":\"a\",\"model\":\"other\"}", false, "qwen", 404, "model_not_found",
     "model"},
    /* Ollama's /api/embed */
    {EMB_OLLAMA_EMBED, "{\"input\":[\"a\",\"\"]}", false, NULL, 400, "BAD_VALUE", "input"},
    {EMB_OLLAMA_EMBED, "{\"input\":[1,2]}", false, NULL, 400, "BAD_TYPE", "input"},
    {EMB_OLLAMA_EMBED, "{\"input\":[\"a\",2]}", false, NULL, 400, "BAD_TYPE", "input"},
    {EMB_OLLAMA_EMBED, "{\"input\":{}}", false, NULL, 400, "BAD_TYPE", "input"},
    {EMB_OLLAMA_EMBED, "{\"input\":\"a\",\"truncate\":\"yes\"}", false, NULL, 400, "BAD_TYPE",
     "truncate"},
    {EMB_OLLAMA_EMBED, "{\"input\":\"a\",\"options\":[]}", false, NULL, 400, "BAD_TYPE",
     "options"},
    {EMB_OLLAMA_EMBED, "{\"input\":\"a\",\"dimensions\":-3}", false, NULL, 400, "OUT_OF_RANGE",
     "dimensions"},
    {EMB_OLLAMA_EMBED, "{\"input\":\"a\",\"encoding_format\":\"float\"}", true, NULL, 400,
     "UNKNOWN_FIELD", "encoding_format"},
    {EMB_OLLAMA_EMBED, "{\"model\":\"other:latest\",\"input\":\"a\"}", false, "qwen", 404,
     "model_not_found", "model"},
    /* Ollama's /api/embeddings */
    {EMB_OLLAMA_LEGACY, "{\"prompt\":[\"a\"]}", false, NULL, 400, "BAD_TYPE", "prompt"},
    {EMB_OLLAMA_LEGACY, "{\"prompt\":\"a\",\"input\":\"b\"}", true, NULL, 400, "UNKNOWN_FIELD",
     "input"},
    {EMB_OLLAMA_LEGACY, "{\"prompt\":\"a\",\"dimensions\":4}", true, NULL, 400, "UNKNOWN_FIELD",
     "dimensions"},
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
        struct emb_request c;
        struct oai_error e;
        int rc = emb_parse(t->api, t->body, strlen(t->body), &l, "embd-x", 0, &r, &c, &e);
        if (rc != -RL_EINVAL || e.status != t->status || strcmp(e.code, t->code) ||
            strcmp(e.param, t->param))
            fail_msg("%s: rc %d, %d %s [%s] %s; expected %d %s [%s]", t->body, rc, e.status,
                     e.code, e.param, e.message, t->status, t->code, t->param);
        assert_true(e.message[0]);
        assert_null(r.job);
        assert_null(r.jobs);
        assert_int_equal(r.n_jobs, 0);
        /* the error bodies are JSON of each API's shape */
        char *s = emb_error_json(t->api, &e);
        cJSON *o = cJSON_Parse(s);
        const cJSON *er = cJSON_GetObjectItem(o, "error");
        if (t->api == EMB_OPENAI)
            assert_string_equal(cJSON_GetObjectItem(er, "code")->valuestring, t->code);
        else
            assert_string_equal(er->valuestring, e.message);
        cJSON_Delete(o);
        free(s);
    }
    /* a body over the limit: 413 */
    struct oai_limits l = lim_any();
    l.max_body_bytes = 8;
    struct oai_request r;
    struct emb_request c;
    struct oai_error e;
    const char *b = "{\"input\":\"hello\"}";
    assert_int_equal(emb_parse(EMB_OPENAI, b, strlen(b), &l, "x", 0, &r, &c, &e), -RL_EINVAL);
    assert_int_equal(e.status, 413);
}

static void test_ollama_requests(void **state)
{
    (void)state;
    struct oai_limits l = lim_any();
    struct oai_request r;
    struct emb_request c;
    cJSON *a = jobs_of(EMB_OLLAMA_EMBED,
                       "{\"model\":\"qwen:latest\",\"input\":[\"a\",\"b\"],\"truncate\":false,"
                       "\"dimensions\":4,\"keep_alive\":\"5m\",\"options\":{\"num_ctx\":8}}",
                       &l, &r, &c);
    assert_int_equal(cJSON_GetArraySize(a), 2);
    assert_string_equal(cJSON_GetObjectItem(a->child, "model")->valuestring, "qwen");
    assert_int_equal(cJSON_GetObjectItem(a->child, "dimensions")->valueint, 4);
    assert_string_equal(cJSON_GetObjectItem(a->child->next, "prompt")->valuestring, "b");
    assert_null(cJSON_GetObjectItem(a->child, "truncate")); /* truncate false: none */
    assert_string_equal(r.ignored, "");
    assert_false(c.load_only);
    cJSON_Delete(a);
    oai_request_clear(&r);
    /* Ollama truncates unless told not to: the job's truncate */
    a = jobs_of(EMB_OLLAMA_EMBED, "{\"input\":\"one\"}", &l, &r, &c);
    assert_int_equal(cJSON_GetArraySize(a), 1);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(a->child, "truncate")));
    cJSON_Delete(a);
    oai_request_clear(&r);
    a = jobs_of(EMB_OLLAMA_EMBED, "{\"input\":\"one\",\"truncate\":true}", &l, &r, &c);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(a->child, "truncate")));
    cJSON_Delete(a);
    oai_request_clear(&r);
    a = jobs_of(EMB_OLLAMA_LEGACY, "{\"model\":\"qwen\",\"prompt\":\"p\",\"keep_alive\":0}", &l,
                &r, &c);
    assert_string_equal(cJSON_GetObjectItem(a->child, "prompt")->valuestring, "p");
    assert_string_equal(cJSON_GetObjectItem(a->child, "id")->valuestring, "embd-ab12");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(a->child, "truncate")));
    /* the legacy endpoint's vectors were never unit length */
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(a->child, "normalize")));
    cJSON_Delete(a);
    oai_request_clear(&r);
    /* vLLM's normalize on /v1: false is the job's; true (the default) adds nothing */
    a = jobs_of(EMB_OPENAI, "{\"input\":\"x\",\"normalize\":false}", &l, &r, &c);
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(a->child, "normalize")));
    cJSON_Delete(a);
    oai_request_clear(&r);
    a = jobs_of(EMB_OPENAI, "{\"input\":\"x\",\"normalize\":true}", &l, &r, &c);
    assert_null(cJSON_GetObjectItem(a->child, "normalize"));
    cJSON_Delete(a);
    oai_request_clear(&r);
    a = jobs_of(EMB_OLLAMA_EMBED, "{\"input\":\"x\"}", &l, &r, &c);
    assert_null(cJSON_GetObjectItem(a->child, "normalize")); /* /api/embed: unit, as Ollama's */
    cJSON_Delete(a);
    oai_request_clear(&r);
    /* no input: Ollama's way to load a model, answered at once */
    static const struct {
        enum emb_api api;
        const char *body, *answer;
    } empty[] = {
        {EMB_OLLAMA_EMBED, "{\"model\":\"m\"}", "{\"model\":\"m\",\"embeddings\":[]}"},
        {EMB_OLLAMA_EMBED, "{\"model\":\"m\",\"input\":\"\"}", "{\"model\":\"m\",\"embeddings\":[]}"},
        {EMB_OLLAMA_EMBED, "{\"model\":\"m\",\"input\":[]}", "{\"model\":\"m\",\"embeddings\":[]}"},
        {EMB_OLLAMA_LEGACY, "{\"model\":\"m\",\"prompt\":\"\"}", "{\"embedding\":[]}"},
        {EMB_OLLAMA_LEGACY, "{\"model\":\"m\"}", "{\"embedding\":[]}"},
    };
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
        a = jobs_of(empty[i].api, empty[i].body, &l, &r, &c);
        assert_true(c.load_only);
        assert_null(r.job);
        char *s = emb_empty_body(c.api, r.model);
        assert_string_equal(s, empty[i].answer);
        free(s);
        cJSON_Delete(a);
        oai_request_clear(&r);
    }
}

/* ---- responses ---- */

/* The done event a worker writes for vector v (n values). */
static char *done_event(int64_t seq, const float *v, int n, int64_t prompt_tokens)
{
    struct ev_done d = {.finish_reason = EV_FINISH_STOP, .prompt_tokens = prompt_tokens,
                        .total_ms = 3, .embedding = v, .n_embedding = n};
    char *s = NULL;
    struct rl_err err = {0};
    assert_int_equal(ev_build_done(seq, &d, &s, &err), 0);
    return s;
}

static int feed(struct emb_resp *r, const char *ev, struct oai_error *e)
{
    return emb_resp_feed(r, ev, strlen(ev), e);
}

/* Values that test %.9g: ones %.6g would lose, a subnormal, -0, a big one. */
static const float V1[] = {0.1f, -0.33333334f, 1.17549435e-38f, 1.0e-45f, -0.0f,
                           0.123456789f, 3.4028235e38f, 0.5f};
static const float V2[] = {0.6f, 0.8f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};

static struct emb_resp *resp_of(enum emb_api api, bool base64, int n)
{
    struct emb_request c = {.api = api, .base64 = base64, .n_inputs = n};
    struct emb_resp *r = NULL;
    struct rl_err err = {0};
    assert_int_equal(emb_resp_create(&r, &c, "qwen", &err), 0);
    return r;
}

/* Reads the float array a back as float32 and compares bit for bit. */
static void same_floats(const cJSON *a, const float *v, int n)
{
    assert_int_equal(cJSON_GetArraySize(a), n);
    int i = 0;
    for (const cJSON *x = a->child; x; x = x->next, i++) {
        float f = (float)x->valuedouble;
        if (memcmp(&f, &v[i], 4))
            fail_msg("value %d: %.9g read back as %.9g", i, (double)v[i], (double)f);
    }
}

static void test_openai_float_and_base64(void **state)
{
    (void)state;
    struct oai_error e;
    for (int b64 = 0; b64 < 2; b64++) {
        struct emb_resp *r = resp_of(EMB_OPENAI, b64, 2);
        char *d0 = done_event(0, V1, 8, 5), *d1 = done_event(0, V2, 8, 7);
        assert_null(emb_resp_body(r, 1));
        assert_int_equal(emb_resp_total_tokens(r), 0);
        assert_int_equal(feed(r, d0, &e), OAI_NEXT);
        assert_int_equal(feed(r, d1, &e), OAI_END);
        assert_int_equal(feed(r, d1, &e), OAI_END); /* after the end: the same */
        assert_int_equal(emb_resp_total_tokens(r), 12);
        char *s = emb_resp_body(r, 9);
        cJSON *o = cJSON_Parse(s);
        assert_non_null(o);
        assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "list");
        assert_string_equal(cJSON_GetObjectItem(o, "model")->valuestring, "qwen");
        const cJSON *u = cJSON_GetObjectItem(o, "usage");
        assert_int_equal(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 12);
        assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, 12);
        const cJSON *data = cJSON_GetObjectItem(o, "data");
        assert_int_equal(cJSON_GetArraySize(data), 2);
        for (int i = 0; i < 2; i++) {
            const cJSON *d = cJSON_GetArrayItem(data, i);
            const float *v = i ? V2 : V1;
            assert_string_equal(cJSON_GetObjectItem(d, "object")->valuestring, "embedding");
            assert_int_equal(cJSON_GetObjectItem(d, "index")->valueint, i);
            const cJSON *em = cJSON_GetObjectItem(d, "embedding");
            if (b64) {
                /* the done event's string as it is */
                cJSON *ev = cJSON_Parse(i ? d1 : d0);
                assert_string_equal(em->valuestring,
                                    cJSON_GetObjectItem(ev, "embedding")->valuestring);
                cJSON_Delete(ev);
                uint8_t raw[32];
                assert_int_equal(b64_decode(em->valuestring, strlen(em->valuestring), raw, 32),
                                 32);
                assert_memory_equal(raw, v, 32); /* little-endian float32 (this host's order) */
            } else {
                same_floats(em, v, 8);
            }
        }
        if (!b64) /* %.9g, not cJSON's 17 digits */
            assert_non_null(strstr(s, "[0.100000001,-0.333333343,"));
        cJSON_Delete(o);
        free(s);
        free(d0);
        free(d1);
        emb_resp_free(r);
    }
}

static void test_ollama_bodies(void **state)
{
    (void)state;
    struct oai_error e;
    struct emb_resp *r = resp_of(EMB_OLLAMA_EMBED, true /* ignored: Ollama prints floats */, 2);
    char *d0 = done_event(0, V2, 8, 2), *d1 = done_event(0, V1, 8, 3);
    assert_int_equal(feed(r, d0, &e), OAI_NEXT);
    assert_int_equal(feed(r, d1, &e), OAI_END);
    char *s = emb_resp_body(r, 25);
    cJSON *o = cJSON_Parse(s);
    assert_string_equal(cJSON_GetObjectItem(o, "model")->valuestring, "qwen");
    const cJSON *em = cJSON_GetObjectItem(o, "embeddings");
    same_floats(cJSON_GetArrayItem(em, 0), V2, 8);
    same_floats(cJSON_GetArrayItem(em, 1), V1, 8);
    assert_true(cJSON_GetObjectItem(o, "total_duration")->valuedouble == 25e6);
    assert_int_equal(cJSON_GetObjectItem(o, "load_duration")->valueint, 0);
    assert_int_equal(cJSON_GetObjectItem(o, "prompt_eval_count")->valueint, 5);
    cJSON_Delete(o);
    free(s);
    emb_resp_free(r);

    r = resp_of(EMB_OLLAMA_LEGACY, false, 1);
    assert_int_equal(feed(r, d0, &e), OAI_END);
    s = emb_resp_body(r, 1);
    o = cJSON_Parse(s);
    assert_int_equal(cJSON_GetArraySize(o), 1);
    same_floats(cJSON_GetObjectItem(o, "embedding"), V2, 8);
    cJSON_Delete(o);
    free(s);
    emb_resp_free(r);
    free(d0);
    free(d1);
}

static void test_event_failures(void **state)
{
    (void)state;
    struct oai_error e;
    char *ev = NULL;
    struct rl_err err = {0};

    /* the worker's error: status and code from the event, param the
     * input member of each API */
    static const struct {
        enum emb_api api;
        enum ev_code code;
        const char *msg;
        int status;
        const char *ecode, *param;
    } errs[] = {
        {EMB_OPENAI, EV_CODE_PROMPT_TOO_LONG, "prompt has 50 tokens; the model's context is 40",
         400, "context_length_exceeded", "input"},
        {EMB_OLLAMA_LEGACY, EV_CODE_PROMPT_TOO_LONG, "prompt has 50 tokens", 400,
         "context_length_exceeded", "prompt"},
        {EMB_OPENAI, EV_CODE_INVALID_TOKEN, "prompt_ids[0]: 999999 is past the vocabulary", 400,
         "INVALID_TOKEN", "input"},
        {EMB_OLLAMA_EMBED, EV_CODE_BAD_VALUE, "dimensions: 9000 is more than the model's 1024",
         400, "BAD_VALUE", "dimensions"},
        {EMB_OPENAI, EV_CODE_OVERLOADED, "queue full", 503, "OVERLOADED", ""},
        {EMB_OPENAI, EV_CODE_MODEL_NOT_FOUND, "no worker serves x", 404, "model_not_found",
         "model"},
    };
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        struct emb_resp *r = resp_of(errs[i].api, false, 2);
        char *d0 = done_event(0, V1, 8, 1);
        assert_int_equal(feed(r, d0, &e), OAI_NEXT);
        assert_int_equal(ev_build_error(0, errs[i].code, errs[i].msg, &ev, &err), 0);
        assert_int_equal(feed(r, ev, &e), OAI_FAILED);
        if (e.status != errs[i].status || strcmp(e.code, errs[i].ecode) ||
            strcmp(e.param, errs[i].param))
            fail_msg("%s: %d %s [%s]", errs[i].msg, e.status, e.code, e.param);
        struct oai_error again;
        assert_int_equal(feed(r, d0, &again), OAI_FAILED); /* and stays failed */
        assert_string_equal(again.message, e.message);
        assert_null(emb_resp_body(r, 1));
        free(ev);
        free(d0);
        emb_resp_free(r);
    }

    /* broken events: 502 BAD_EVENT */
    static const char *const broken[] = {
        "not json",
        "{\"seq\":1,\"type\":\"done\",\"finish_reason\":\"stop\"}",     /* seq skips */
        "{\"seq\":0,\"type\":\"mystery\"}",
        "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"stop\"}",     /* no embedding */
        "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"stop\",\"embedding\":\"AAAAAA==\","
        "\"dimensions\":2}",                                            /* 4 bytes, not 8 */
        "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"stop\",\"embedding\":\"!!!!\","
        "\"dimensions\":1}",                                            /* not base64 */
        "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"stop\",\"embedding\":\"AADAfw==\","
        "\"dimensions\":1}",                                            /* NaN */
        "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"stop\",\"embedding\":\"AACAfw==\","
        "\"dimensions\":1}",                                            /* +inf */
        "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"stop\",\"embedding\":\"AAAAAA==\","
        "\"dimensions\":0}",
    };
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        for (int b64 = 0; b64 < 2; b64++) {
            struct emb_resp *r = resp_of(EMB_OPENAI, b64, 1);
            assert_int_equal(feed(r, broken[i], &e), OAI_FAILED);
            if (e.status != 502 || strcmp(e.code, "BAD_EVENT"))
                fail_msg("%s: %d %s", broken[i], e.status, e.code);
            emb_resp_free(r);
        }
    }

    /* a done that ended in error or past its deadline */
    struct emb_resp *r = resp_of(EMB_OPENAI, false, 1);
    assert_int_equal(feed(r, "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"error\"}", &e),
                     OAI_FAILED);
    assert_int_equal(e.status, 500);
    emb_resp_free(r);
    r = resp_of(EMB_OPENAI, false, 1);
    assert_int_equal(feed(r, "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"deadline\"}", &e),
                     OAI_FAILED);
    assert_int_equal(e.status, 504);
    assert_string_equal(e.code, "DEADLINE_EXCEEDED");
    emb_resp_free(r);

    /* a stray delta is skipped; the done after it counts */
    r = resp_of(EMB_OPENAI, false, 1);
    char *d1 = done_event(1, V2, 8, 4);
    assert_int_equal(feed(r, "{\"seq\":0,\"type\":\"delta\",\"delta\":{\"content\":\"\"}}", &e),
                     OAI_MORE);
    assert_int_equal(feed(r, d1, &e), OAI_END);
    assert_int_equal(emb_resp_total_tokens(r), 4);
    free(d1);
    emb_resp_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_requests),
        cmocka_unit_test(test_openai_input_limit),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_ollama_requests),
        cmocka_unit_test(test_openai_float_and_base64),
        cmocka_unit_test(test_ollama_bodies),
        cmocka_unit_test(test_event_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
