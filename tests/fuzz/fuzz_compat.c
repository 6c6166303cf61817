/* tests/fuzz/fuzz_compat.c - libFuzzer target for the Responses API,
 * Ollama's API (dispatcher/compat.c) and Anthropic's Messages API
 * (dispatcher/anthropic.c).
 *
 * The input's first byte picks what is fuzzed, the rest is the text:
 *   0-127   a body (bits 0-1: /v1/responses, /api/chat, /api/generate,
 *           /v1/messages; with bit 4 /v1/messages/count_tokens, or for
 *           /v1/responses a stored conversation continued:
 *           cpt_parse_responses) for cpt_parse. An accepted Responses body
 *           keeps its conversation as a JSON array of items. A refused body has a status in {400, 404, 413} and a
 *           message, and its error body (OpenAI's object, Ollama's
 *           {"error"} or Anthropic's) is valid JSON; an accepted one a job
 *           that job_parse accepts again, or (generate) load_only with no
 *           job.
 *   128-255 the rest split at newlines into events fed to one streamed and
 *           one plain answer of the API of bits 0-1: the bytes of the stream
 *           are Responses SSE events ("event: <type>\ndata: <JSON whose type
 *           is that>\n\n"; Anthropic's too) or NDJSON lines of JSON objects, and a body
 *           exists exactly after OAI_END (bit 4: a background response,
 *           bit 5: one its client cancelled; its object as it stands is
 *           valid JSON at the end of any events). A Responses answer with store
 *           gives the object to keep exactly then, and its record
 *           (rstore.h) is valid JSON whose context and listing are too.
 *
 *   make fuzz && build-fuzz/fuzz/fuzz_compat -max_total_time=60 */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatcher/compat.h"
#include "dispatcher/rstore.h"

/* A stored conversation, as rst_context gives one: a user's message, the
 * answer's reasoning, text and call, the call's output. */
static const char PRIOR[] =
    "[{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":"
    "\"input_text\",\"text\":\"Hi\"}]},{\"id\":\"rs_1\",\"type\":\"reasoning\","
    "\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"hmm\"}]},"
    "{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":"
    "\"output_text\",\"text\":\"Let me look.\"}]},{\"id\":\"fc_1\",\"type\":"
    "\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
    "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"42\"}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static enum cpt_api api_of(uint8_t sel)
{
    static const enum cpt_api apis[] = {CPT_RESPONSES, CPT_OLLAMA_CHAT, CPT_OLLAMA_GENERATE,
                                        CPT_ANTHROPIC};
    return apis[sel & 3];
}

static bool sse_api(enum cpt_api api)
{
    return api == CPT_RESPONSES || api == CPT_ANTHROPIC;
}

static void json_or_die(const char *s, size_t n)
{
    cJSON *c = cJSON_ParseWithLength(s, n);
    if (!cJSON_IsObject(c))
        abort();
    cJSON_Delete(c);
}

static void check_stream(enum cpt_api api, const struct text *b)
{
    size_t i = 0;
    while (i < b->n) {
        const char *p = b->p + i;
        if (!sse_api(api)) {
            const char *nl = memchr(p, '\n', b->n - i);
            if (!nl)
                abort();
            json_or_die(p, (size_t)(nl - p));
            i += (size_t)(nl - p) + 1;
            continue;
        }
        if (b->n - i < 7 || memcmp(p, "event: ", 7))
            abort();
        const char *d = strstr(p, "\ndata: ");
        const char *end = d ? strstr(d, "\n\n") : NULL;
        if (!end)
            abort();
        cJSON *c = cJSON_ParseWithLength(d + 7, (size_t)(end - d - 7));
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "type");
        if (!cJSON_IsString(t) || strlen(t->valuestring) != (size_t)(d - p - 7) ||
            memcmp(t->valuestring, p + 7, (size_t)(d - p - 7)))
            abort();
        cJSON_Delete(c);
        i = (size_t)(end - b->p) + 2;
    }
}

static void fuzz_request(const char *s, size_t n, uint8_t sel)
{
    struct oai_limits lim;
    oai_limits_default(&lim);
    lim.max_body_bytes = 1 << 16;
    lim.refuse_unknown = sel & 4;
    lim.model = (sel & 8) ? NULL : "redlm";
    struct oai_request r;
    struct cpt_request c;
    struct oai_error e;
    enum cpt_api api = api_of(sel);
    if (api == CPT_ANTHROPIC && (sel & 16))
        api = CPT_ANTHROPIC_COUNT;
    bool prior = api == CPT_RESPONSES && (sel & 16);
    int rc = prior ? cpt_parse_responses(s, n, PRIOR, &lim, "fz-1", 0, &r, &c, &e)
                   : cpt_parse(api, s, n, &lim, "fz-1", 0, &r, &c, &e);
    if (rc) {
        if (r.job || c.echo || c.input || !e.message[0] ||
            (e.status != 400 && e.status != 404 && e.status != 413 &&
             !(rc == -RL_ENOMEM && e.status == 500)))
            abort();
        char *j = cpt_error_json(api, &e);
        if (!j)
            abort();
        json_or_die(j, strlen(j));
        free(j);
        return;
    }
    if (c.load_only) {
        if (r.job)
            abort();
    } else {
        struct job *job = NULL;
        if (job_parse(r.job, r.job_len, NULL, &job, NULL, NULL) || strcmp(job->id, "fz-1"))
            abort();
        job_free(job);
    }
    if (api == CPT_RESPONSES) {
        cJSON *in = c.input ? cJSON_Parse(c.input) : NULL;
        if (!cJSON_IsArray(in) || (prior && cJSON_GetArraySize(in) < 5))
            abort();
        cJSON_Delete(in);
    }
    oai_request_clear(&r);
    cpt_request_clear(&c);
}

static void fuzz_events(const char *s, size_t n, uint8_t sel)
{
    struct cpt_request c = {.api = api_of(sel), .store = true, .background = sel & 16,
                            .cancelled = sel & 32};
    for (int stream = 0; stream < 2; stream++) {
        struct cpt_resp *r = NULL;
        struct rl_err err = {0};
        if (cpt_resp_create(&r, &c, "resp_fz1", "m", 1700000000000, stream, &err))
            return;
        struct text out = {0};
        struct oai_error e;
        int last = OAI_MORE;
        size_t i = 0;
        while (i <= n && last == OAI_MORE) {
            const char *nl = memchr(s + i, '\n', n - i);
            size_t len = nl ? (size_t)(nl - (s + i)) : n - i;
            last = cpt_resp_feed(r, s + i, len, &out, &e);
            if (last < 0)
                break;
            i += len + 1;
        }
        if (last == OAI_FAILED && stream && out.n && cpt_stream_error(r, &e, &out))
            abort();
        check_stream(c.api, &out);
        if (!stream && out.n)
            abort();
        char *body = cpt_resp_body(r);
        if ((last == OAI_END) != (body != NULL))
            abort();
        if (body)
            json_or_die(body, strlen(body));
        free(body);
        char *now = cpt_resp_object(r); /* a background response as read while it runs */
        if ((c.api == CPT_RESPONSES) != (now != NULL))
            abort();
        if (now)
            json_or_die(now, strlen(now));
        free(now);
        char *kept = cpt_resp_stored(r);
        if ((c.api == CPT_RESPONSES && last == OAI_END) != (kept != NULL))
            abort();
        struct rst_record *rec = NULL;
        char *text = NULL, *ctx = NULL, *chain = NULL, *list = NULL, msg[128];
        int n_ctx;
        if (kept && (rst_new("t", "resp_fz1", PRIOR, NULL, kept, NULL, &rec) ||
                     rst_continue(rec, "resp_fz1", &ctx, &n_ctx, &chain) ||
                     rst_input_items(rec, "asc", 3, "rs_1", &list, msg, sizeof msg) ||
                     !(text = rst_json(rec))))
            abort();
        if (rec) {
            json_or_die(text, strlen(text));
            cJSON *cj = cJSON_Parse(ctx); /* the context is an array of items */
            if (!cJSON_IsArray(cj))
                abort();
            cJSON_Delete(cj);
            json_or_die(list, strlen(list));
        }
        free(list);
        free(ctx);
        free(chain);
        free(text);
        rst_free(rec);
        free(kept);
        text_free(&out);
        cpt_resp_free(r);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] < 128)
        fuzz_request(s, n, data[0]);
    else
        fuzz_events(s, n, data[0]);
    return 0;
}
