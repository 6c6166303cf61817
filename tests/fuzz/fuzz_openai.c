/* tests/fuzz/fuzz_openai.c - libFuzzer target for the HTTP front door's
 * conversion code (dispatcher/openai.c).
 *
 * The input's first byte picks what is fuzzed, the rest is the text:
 *   0-127   a POST /v1/chat/completions body (oai_parse_request; bit 6
 *           set: a POST /v1/completions body, oai_parse_completion; bit 5:
 *           http_default_mode think, else none; bit 4: unknown fields
 *           ignored and named, else refused). Checks,
 *           besides the sanitizers' own: a refused body has a status in
 *           {400, 404, 413} and a non-empty message, and its error object
 *           is valid JSON; an accepted body yields a job that job_parse
 *           accepts again, with the id given.
 *   128-191 the rest is split at newlines into events fed to one stream
 *           response, then to one non-stream response (oai_resp_feed):
 *           every SSE byte produced is "data: <valid JSON>\n\n" or the
 *           [DONE] line, and a completion exists exactly after OAI_END
 *           (bit 5 of the selector: the completions API's answers).
 *   192-255 an API-keys file (oai_keys_parse), then a lookup of each line.
 *
 *   make fuzz && build-fuzz/fuzz/fuzz_openai -max_total_time=60 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatcher/openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_sse(const struct text *b)
{
    size_t i = 0;
    while (i < b->n) {
        if (b->n - i < 6 || memcmp(b->p + i, "data: ", 6))
            abort();
        const char *end = strstr(b->p + i, "\n\n");
        if (!end)
            abort();
        size_t len = (size_t)(end - (b->p + i)) - 6;
        const char *js = b->p + i + 6;
        if (!(len == 6 && !memcmp(js, "[DONE]", 6))) {
            cJSON *c = cJSON_ParseWithLength(js, len);
            if (!cJSON_IsObject(c))
                abort();
            cJSON_Delete(c);
        }
        i = (size_t)(end - b->p) + 2;
    }
}

static void fuzz_request(const char *s, size_t n, uint8_t sel)
{
    struct oai_limits lim;
    oai_limits_default(&lim);
    lim.max_body_bytes = 1 << 16;
    lim.default_mode = (sel & 32) ? JOB_MODE_THINK : JOB_MODE_POOL;
    lim.refuse_unknown = !(sel & 16); /* http_unknown_fields: refuse, or ignore and name */
    struct oai_request r;
    struct oai_error e;
    int rc = ((sel & 64) ? oai_parse_completion : oai_parse_request)(
        s, n, &lim, "fz-1", (n & 1) ? 1700000000000 : 0, &r, &e);
    if (rc) {
        if (r.job || !e.message[0] || (e.status != 400 && e.status != 404 && e.status != 413 &&
                                       !(rc == -RL_ENOMEM && e.status == 500)))
            abort();
        char *j = oai_error_json(&e);
        cJSON *c = j ? cJSON_Parse(j) : NULL;
        if (!c)
            abort();
        cJSON_Delete(c);
        free(j);
        return;
    }
    struct job *job = NULL;
    if (job_parse(r.job, r.job_len, NULL, &job, NULL, NULL) || strcmp(job->id, "fz-1"))
        abort();
    job_free(job);
    oai_request_clear(&r);
}

static void fuzz_events(const char *s, size_t n, uint8_t sel)
{
    for (int stream = 0; stream < 2; stream++) {
        struct oai_request req = {.api = (sel & 32) ? OAI_API_COMPLETIONS : OAI_API_CHAT,
                                  .stream = stream, .include_usage = sel & 1,
                                  .logprobs = (sel >> 1) & 1, .top_logprobs = (sel >> 2) & 7};
        struct oai_resp *r;
        if (oai_resp_create(&r, "fz", "m", 1, &req, NULL))
            return;
        struct text b = {0};
        int rc = OAI_MORE;
        for (size_t i = 0; i < n;) {
            const char *nl = memchr(s + i, '\n', n - i);
            size_t len = nl ? (size_t)(nl - (s + i)) : n - i;
            struct oai_error e;
            rc = oai_resp_feed(r, s + i, len, &b, &e);
            if (rc == OAI_FAILED && (e.status < 400 || !e.message[0])) {
                abort();
            }
            if (rc == OAI_FAILED && stream && oai_sse_error(&e, &b))
                abort();
            i += len + 1;
        }
        check_sse(&b);
        if (!stream && b.n)
            abort();
        char *c = oai_resp_completion(r);
        if ((c != NULL) != (rc == OAI_END))
            abort();
        if (c) {
            cJSON *j = cJSON_Parse(c);
            if (!j)
                abort();
            cJSON_Delete(j);
        }
        free(c);
        text_free(&b);
        oai_resp_free(r);
    }
}

static void fuzz_keys(const char *s, size_t n)
{
    struct oai_keys k;
    if (oai_keys_parse(s, n, "keys", &k, NULL))
        return;
    for (size_t i = 0; i < n;) {
        const char *nl = memchr(s + i, '\n', n - i);
        size_t len = nl ? (size_t)(nl - (s + i)) : n - i;
        char auth[300];
        snprintf(auth, sizeof auth, "Bearer %.*s", (int)(len < 280 ? len : 280), s + i);
        const struct oai_key *e = oai_keys_find(&k, auth);
        if (e && !e->tenant[0])
            abort();
        i += len + 1;
    }
    oai_keys_free(&k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] < 128)
        fuzz_request(s, n, data[0]);
    else if (data[0] < 192)
        fuzz_events(s, n, data[0]);
    else
        fuzz_keys(s, n);
    return 0;
}
