/* tests/fuzz/fuzz_rerank.c - libFuzzer target for the rerank and score
 * endpoints (dispatcher/rerank.c).
 *
 * The input's first byte picks what is fuzzed, the rest is the text:
 *   0-127   a body (bit 0: /v1/rerank or /v1/score; bit 2: refuse unknown
 *           members; bit 3: any model name) for rr_parse. A refused body
 *           has a status in {400, 404, 413}, a message, no job and no
 *           documents kept; an accepted one has n_docs jobs that job_parse
 *           accepts again, each a rerank job under "<id>" (one) or
 *           "<id>-<i>" (several), top_n in [1, n_docs], and the documents
 *           kept exactly when rerank returns them.
 *   128-255 the rest split at newlines into events fed to the answer of the
 *           API of bit 0 (bits 3-4: 1 to 4 documents; bit 2: top_n 1): the
 *           body exists exactly after OAI_END and is a JSON object; a
 *           rerank body's results are sorted by score, highest first.
 *
 *   make fuzz && build-fuzz/fuzz/fuzz_rerank -max_total_time=60 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatcher/rerank.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static cJSON *json_or_die(const char *s)
{
    cJSON *c = s ? cJSON_Parse(s) : NULL;
    if (!cJSON_IsObject(c))
        abort();
    return c;
}

static void fuzz_request(const char *s, size_t n, uint8_t sel)
{
    struct oai_limits lim;
    oai_limits_default(&lim);
    lim.max_body_bytes = 1 << 16;
    lim.refuse_unknown = sel & 4;
    lim.model = (sel & 8) ? NULL : "redlm";
    struct oai_request r;
    struct rr_request c;
    struct oai_error e;
    enum rr_api api = (sel & 1) ? RR_SCORE : RR_RERANK;
    int rc = rr_parse(api, s, n, &lim, "fz-1", 0, &r, &c, &e);
    if (rc) {
        if (r.job || r.jobs || r.n_jobs || c.docs || !e.message[0] ||
            (e.status != 400 && e.status != 404 && e.status != 413 &&
             !(rc == -RL_ENOMEM && e.status == 500)))
            abort();
        char *j = oai_error_json(&e);
        cJSON_Delete(json_or_die(j));
        free(j);
        return;
    }
    if (c.n_docs < 1 || c.n_docs > RR_DOCUMENTS_MAX || r.n_jobs != c.n_docs ||
        (c.n_docs > 1) != (r.jobs != NULL) || c.top_n < 1 || c.top_n > c.n_docs ||
        (c.docs != NULL) != (api == RR_RERANK && c.return_documents))
        abort();
    for (int i = 0; i < c.n_docs; i++) {
        const char *t = r.jobs ? r.jobs[i] : r.job;
        char id[32];
        if (r.jobs)
            snprintf(id, sizeof id, "fz-1-%d", i);
        else
            snprintf(id, sizeof id, "fz-1");
        struct job *job = NULL;
        if (job_parse(t, strlen(t), NULL, &job, NULL, NULL) || strcmp(job->id, id) ||
            job->task != JOB_TASK_RERANK || (c.docs && strcmp(c.docs[i], job->document)))
            abort();
        job_free(job);
    }
    oai_request_clear(&r);
    rr_request_clear(&c);
}

static void fuzz_events(const char *s, size_t n, uint8_t sel)
{
    int docs = 1 + ((sel >> 3) & 3);
    struct rr_request c = {.api = (sel & 1) ? RR_SCORE : RR_RERANK, .n_docs = docs,
                           .top_n = (sel & 4) ? 1 : docs};
    char *texts[4] = {"a", "b", "c", "d"};
    c.docs = texts;
    c.return_documents = true;
    struct rr_resp *r = NULL;
    struct rl_err err = {0};
    if (rr_resp_create(&r, &c, "fz-1", "m", 1, &err))
        return;
    struct oai_error e;
    int last = OAI_MORE;
    size_t i = 0;
    while (i <= n && (last == OAI_MORE || last == OAI_NEXT)) {
        const char *nl = memchr(s + i, '\n', n - i);
        size_t len = nl ? (size_t)(nl - (s + i)) : n - i;
        last = rr_resp_feed(r, s + i, len, &e);
        if (last < 0)
            break;
        if (last == OAI_FAILED && (!e.message[0] || e.status < 400))
            abort();
        i += len + 1;
    }
    char *body = rr_resp_body(r);
    if ((last == OAI_END) != (body != NULL))
        abort();
    if (body) {
        cJSON *o = json_or_die(body);
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(o, "results");
        double prev = 2;
        for (const cJSON *x = res ? res->child : NULL; x; x = x->next) {
            const cJSON *sc = cJSON_GetObjectItemCaseSensitive(x, "relevance_score");
            if (!cJSON_IsNumber(sc) || sc->valuedouble > prev || sc->valuedouble < 0)
                abort();
            prev = sc->valuedouble;
        }
        if (c.api == RR_RERANK && cJSON_GetArraySize(res) != c.top_n)
            abort();
        cJSON_Delete(o);
    }
    free(body);
    rr_resp_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *s = (const char *)data + 1;
    if (data[0] < 128)
        fuzz_request(s, size - 1, data[0]);
    else
        fuzz_events(s, size - 1, data[0]);
    return 0;
}
