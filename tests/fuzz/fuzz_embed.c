/* tests/fuzz/fuzz_embed.c - libFuzzer target for the embedding endpoints
 * (dispatcher/embed.c).
 *
 * The input's first byte picks what is fuzzed, the rest is the text:
 *   0-127   a body (bits 0-1: /v1/embeddings, /api/embed, /api/embeddings;
 *           bit 2: refuse unknown members; bit 3: any model name) for
 *           emb_parse. A refused body has a status in {400, 404, 413}, a
 *           message, no job, and an error body of valid JSON; an accepted
 *           one is load_only with no job, or n_inputs jobs that job_parse
 *           accepts again, each an embedding job under "<id>" (one) or
 *           "<id>-<i>" (several).
 *   128-255 the rest split at newlines into events fed to the answer of the
 *           API of bits 0-1 (bit 2: base64; bits 3-4: 1 to 4 inputs): the
 *           body exists exactly after OAI_END and is a JSON object.
 *
 *   make fuzz && build-fuzz/fuzz/fuzz_embed -max_total_time=60 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatcher/embed.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static enum emb_api api_of(uint8_t sel)
{
    return (sel & 3) == 1 ? EMB_OLLAMA_EMBED : (sel & 3) == 2 ? EMB_OLLAMA_LEGACY : EMB_OPENAI;
}

static void json_or_die(const char *s)
{
    cJSON *c = s ? cJSON_Parse(s) : NULL;
    if (!cJSON_IsObject(c))
        abort();
    cJSON_Delete(c);
}

static void fuzz_request(const char *s, size_t n, uint8_t sel)
{
    struct oai_limits lim;
    oai_limits_default(&lim);
    lim.max_body_bytes = 1 << 16;
    lim.refuse_unknown = sel & 4;
    lim.model = (sel & 8) ? NULL : "redlm";
    struct oai_request r;
    struct emb_request c;
    struct oai_error e;
    enum emb_api api = api_of(sel);
    int rc = emb_parse(api, s, n, &lim, "fz-1", 0, &r, &c, &e);
    if (rc) {
        if (r.job || r.jobs || r.n_jobs || !e.message[0] ||
            (e.status != 400 && e.status != 404 && e.status != 413 &&
             !(rc == -RL_ENOMEM && e.status == 500)))
            abort();
        char *j = emb_error_json(api, &e);
        json_or_die(j);
        free(j);
        return;
    }
    if (c.load_only) {
        if (r.job || api == EMB_OPENAI)
            abort();
        char *b = emb_empty_body(api, r.model);
        json_or_die(b);
        free(b);
    } else {
        if (c.n_inputs < 1 || c.n_inputs > EMB_INPUTS_MAX || r.n_jobs != c.n_inputs ||
            (c.n_inputs > 1) != (r.jobs != NULL))
            abort();
        for (int i = 0; i < c.n_inputs; i++) {
            const char *t = r.jobs ? r.jobs[i] : r.job;
            char id[32];
            if (r.jobs)
                snprintf(id, sizeof id, "fz-1-%d", i);
            else
                snprintf(id, sizeof id, "fz-1");
            struct job *job = NULL;
            if (job_parse(t, strlen(t), NULL, &job, NULL, NULL) || strcmp(job->id, id) ||
                job->task != JOB_TASK_EMBED)
                abort();
            job_free(job);
        }
    }
    oai_request_clear(&r);
}

static void fuzz_events(const char *s, size_t n, uint8_t sel)
{
    struct emb_request c = {.api = api_of(sel), .base64 = sel & 4, .n_inputs = 1 + ((sel >> 3) & 3)};
    struct emb_resp *r = NULL;
    struct rl_err err = {0};
    if (emb_resp_create(&r, &c, "m", &err))
        return;
    struct oai_error e;
    int last = OAI_MORE;
    size_t i = 0;
    while (i <= n && (last == OAI_MORE || last == OAI_NEXT)) {
        const char *nl = memchr(s + i, '\n', n - i);
        size_t len = nl ? (size_t)(nl - (s + i)) : n - i;
        last = emb_resp_feed(r, s + i, len, &e);
        if (last < 0)
            break;
        if (last == OAI_FAILED && (!e.message[0] || e.status < 400))
            abort();
        i += len + 1;
    }
    char *body = emb_resp_body(r, 5);
    if ((last == OAI_END) != (body != NULL))
        abort();
    if (body)
        json_or_die(body);
    free(body);
    emb_resp_free(r);
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
