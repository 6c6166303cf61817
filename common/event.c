/* common/event.c - JSON for the events, the dead letters and the codes.
 *
 * The worker calls these from its main thread once per step per running
 * request (deltas) and once per finished request (done or error); the
 * dispatcher calls ev_build_error/ev_build_dead for jobs it rejects. The
 * output is compact JSON built with cJSON, so strings are escaped
 * correctly whatever bytes the model produced; field order is fixed
 * (seq, type, ...) so that event lists replayed from the result cache are
 * byte-identical to the ones first published.
 *
 * The code table below is the single source of the stable error codes;
 * schemas/errors.json mirrors it and tests/unit/test_event.c checks that
 * the two agree, so a client-side table generated from the schema never
 * drifts from what workers send. */
#include "event.h"
#include "base64.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    const char *meaning;
} codes[EV_CODE_COUNT] = {
    [EV_CODE_NONE] = {"", "no error"},
    [EV_CODE_BAD_ENTRY] = {"BAD_ENTRY", "the stream entry has no `job` field"},
    [EV_CODE_JOB_TOO_LARGE] = {"JOB_TOO_LARGE", "the job text is longer than the configured limit"},
    [EV_CODE_BAD_UTF8] = {"BAD_UTF8", "the job text is not valid UTF-8"},
    [EV_CODE_INVALID_JSON] = {"INVALID_JSON", "the job text does not parse as JSON"},
    [EV_CODE_NOT_OBJECT] = {"NOT_OBJECT", "the job is valid JSON but not an object"},
    [EV_CODE_UNKNOWN_FIELD] = {"UNKNOWN_FIELD", "a field the protocol does not define (misspelt parameters are never ignored)"},
    [EV_CODE_DUPLICATE_FIELD] = {"DUPLICATE_FIELD", "the same field appears twice in one object"},
    [EV_CODE_BAD_TYPE] = {"BAD_TYPE", "a field has the wrong JSON type (for example a string where an integer is required)"},
    [EV_CODE_OUT_OF_RANGE] = {"OUT_OF_RANGE", "a number, length or count is outside its documented bounds"},
    [EV_CODE_BAD_VALUE] = {"BAD_VALUE", "a string field is not one of its allowed values, or a string holds \\u0000 (NUL), which would cut it short"},
    [EV_CODE_BAD_ID] = {"BAD_ID", "id is not 1-128 characters of [A-Za-z0-9_.:-]"},
    [EV_CODE_MISSING_PROMPT] = {"MISSING_PROMPT", "the job has none of messages, prompt and prompt_ids"},
    [EV_CODE_CONFLICTING_PROMPT] = {"CONFLICTING_PROMPT", "the job has more than one of messages, prompt and prompt_ids, or tools without messages"},
    [EV_CODE_MISSING_FIELD] = {"MISSING_FIELD", "a required field inside a message or tool is absent"},
    [EV_CODE_UNKNOWN_POOL] = {"UNKNOWN_POOL", "the job names a pool that no worker is configured to serve"},
    [EV_CODE_PROMPT_TOO_LONG] = {"PROMPT_TOO_LONG", "the rendered prompt plus max_tokens does not fit the model's context"},
    [EV_CODE_INVALID_TOKEN] = {"INVALID_TOKEN", "a prompt_ids entry is not a token of the model's vocabulary"},
    [EV_CODE_TEMPLATE_ERROR] = {"TEMPLATE_ERROR", "the messages cannot be rendered with the model's chat template"},
    [EV_CODE_TOO_MANY_DELIVERIES] = {"TOO_MANY_DELIVERIES", "the job went to max_deliveries workers in a row that died before publishing anything"},
    [EV_CODE_CANCELLED] = {"CANCELLED", "the job was cancelled; clients see a done event with finish_reason cancelled, the code names the reason in dead letters and metrics"},
    [EV_CODE_DEADLINE_EXCEEDED] = {"DEADLINE_EXCEEDED", "deadline_ms passed; clients see a done event with finish_reason deadline, the code names the reason in dead letters and metrics"},
    [EV_CODE_ENGINE_ERROR] = {"ENGINE_ERROR", "the inference engine failed on this request"},
    [EV_CODE_INTERNAL] = {"INTERNAL", "a bug in redlm: a broken invariant reported instead of crashing"},
    [EV_CODE_OVERLOADED] = {"OVERLOADED", "the pool's queue holds more waiting jobs than the dispatcher's max_waiting; retry after retry_after_ms"},
    [EV_CODE_MODEL_NOT_FOUND] = {"MODEL_NOT_FOUND", "the job (or HTTP request) names a model no live worker serves; the message lists the models that are served"},
    [EV_CODE_MODEL_REQUIRED] = {"MODEL_REQUIRED", "several models are served and the job names none; it must say which in `model`"},
    [EV_CODE_BAD_PARAM] = {"BAD_PARAM", "a constraint (response_format, grammar or tool_choice) cannot be compiled: an unsupported keyword (the message names it and its JSON pointer), a schema no string satisfies, a schema too large or too deeply nested, or an invalid grammar (line:column)"},
    [EV_CODE_ID_CONFLICT] = {"ID_CONFLICT", "the job's id is taken by a different job (another `job` text) whose stream still exists; nothing was written to that stream: the refusal is on out:<id>@<entry>, and the id is free again once that stream expires"},
};

const char *ev_code_name(enum ev_code code)
{
    if ((int)code < 0 || code >= EV_CODE_COUNT)
        return "INTERNAL";
    return codes[code].name;
}

const char *ev_code_meaning(enum ev_code code)
{
    if ((int)code < 0 || code >= EV_CODE_COUNT)
        return codes[EV_CODE_INTERNAL].meaning;
    return codes[code].meaning;
}

enum ev_code ev_code_from_name(const char *name)
{
    if (!name || !name[0])
        return EV_CODE_NONE;
    for (int i = 1; i < EV_CODE_COUNT; i++)
        if (!strcmp(codes[i].name, name))
            return (enum ev_code)i;
    return EV_CODE_NONE;
}

const char *ev_finish_name(enum ev_finish f)
{
    static const char *const names[] = {"stop", "length", "cancelled", "deadline", "error"};
    if ((int)f < 0 || (size_t)f >= sizeof names / sizeof names[0])
        return NULL;
    return names[f];
}

char *ev_stream_id(int64_t seq, char buf[EV_STREAM_ID_MAX])
{
    snprintf(buf, EV_STREAM_ID_MAX, "0-%" PRId64, seq + 1);
    return buf;
}

/* cJSON stores numbers as doubles: exact for |n| < 2^53, which every count
 * and millisecond we write stays far below. */
static int add_int(cJSON *o, const char *k, int64_t v)
{
    return cJSON_AddItemToObject(o, k, cJSON_CreateNumber((double)v)) ? 0 : -1;
}

/* A token's bytes as "bytes": [int, ...]; nothing when s is NULL. Returns
 * 0 or -1 (out of memory). */
static int add_bytes(cJSON *o, const char *s, size_t n)
{
    if (!s)
        return 0;
    cJSON *a = cJSON_AddArrayToObject(o, "bytes");
    if (!a)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (!cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)s[i])))
            return -1;
    return 0;
}

/* cJSON takes NUL-terminated strings; content arrives with a length and is
 * not NUL-terminated inside the decoder's buffer. */
static cJSON *str_n(const char *s, size_t n)
{
    char *tmp = malloc(n + 1);
    if (!tmp)
        return NULL;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    cJSON *j = cJSON_CreateString(tmp);
    free(tmp);
    return j;
}

/* Length of the well-formed UTF-8 character (RFC 3629: no overlongs, no
 * surrogates, nothing past U+10FFFF) at s[0..n), or 0 when the bytes
 * there are not one. NUL counts as not one: cJSON strings end at it. */
static size_t utf8_char(const unsigned char *s, size_t n)
{
    unsigned c = s[0], min, cp;
    size_t k;
    if (c == 0)
        return 0;
    if (c < 0x80)
        return 1;
    if ((c & 0xE0) == 0xC0) { k = 2; min = 0x80; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { k = 3; min = 0x800; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { k = 4; min = 0x10000; cp = c & 0x07; }
    else return 0;
    if (k > n)
        return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return k;
}

/* A JSON string of the first bytes of s[0..n) that fit in max output
 * bytes (0: no bound), as valid UTF-8 whatever came in: every byte that
 * does not start a well-formed character (and every NUL) becomes U+FFFD,
 * and a cut never splits a character. *n_bad gets the bytes replaced,
 * *cut whether input was left out. NULL when out of memory. */
static cJSON *str_clean(const char *s, size_t n, size_t max, size_t *n_bad, bool *cut)
{
    size_t cap = max && max < n * 3 ? max : n * 3; /* U+FFFD is 3 bytes */
    char *tmp = malloc(cap + 1);
    if (!tmp)
        return NULL;
    size_t o = 0, i = 0, bad = 0;
    while (i < n) {
        size_t k = utf8_char((const unsigned char *)s + i, n - i);
        size_t w = k ? k : 3;
        if (o + w > cap)
            break;
        if (k) {
            memcpy(tmp + o, s + i, k);
            i += k;
        } else {
            memcpy(tmp + o, "\xef\xbf\xbd", 3);
            i++;
            bad++;
        }
        o += w;
    }
    tmp[o] = 0;
    if (n_bad)
        *n_bad = bad;
    if (cut)
        *cut = i < n;
    cJSON *j = cJSON_CreateString(tmp);
    free(tmp);
    return j;
}

/* A message sentence as a JSON string: messages quote the job ("%.80s:
 * unknown field"), and a cut may fall inside a character. */
static cJSON *str_msg(const char *m)
{
    return str_clean(m, strlen(m), 0, NULL, NULL);
}

static int finish(cJSON *root, char **out, struct rl_err *err)
{
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s)
        return rl_errf(err, RL_ENOMEM, "event: out of memory serialising");
    *out = s;
    return 0;
}

/* Starts {"seq": n, "type": t}. */
static cJSON *head(int64_t seq, const char *type)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    if (add_int(o, "seq", seq) || !cJSON_AddStringToObject(o, "type", type)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

int ev_build_delta(int64_t seq, const struct ev_delta *d, char **out, struct rl_err *err)
{
    *out = NULL;
    if (seq < 0 || !d || d->n_token_ids < 0 || (d->n_token_ids && !d->token_ids))
        return rl_errf(err, RL_EINVAL, "ev_build_delta: bad arguments (seq %" PRId64 ")", seq);
    cJSON *o = head(seq, "delta");
    if (!o)
        goto oom;
    cJSON *delta = cJSON_AddObjectToObject(o, "delta");
    if (!delta)
        goto oom;
    if (d->content) {
        cJSON *s = str_n(d->content, d->content_len);
        if (!s || !cJSON_AddItemToObject(delta, "content", s))
            goto oom;
    }
    if (d->reasoning_content) {
        cJSON *s = str_n(d->reasoning_content, d->reasoning_len);
        if (!s || !cJSON_AddItemToObject(delta, "reasoning_content", s))
            goto oom;
    }
    if (d->tool_calls) {
        cJSON *t = cJSON_Duplicate(d->tool_calls, 1);
        if (!t || !cJSON_AddItemToObject(delta, "tool_calls", t)) {
            cJSON_Delete(t);
            goto oom;
        }
    }
    cJSON *ids = cJSON_AddArrayToObject(o, "token_ids");
    if (!ids)
        goto oom;
    for (int i = 0; i < d->n_token_ids; i++)
        if (!cJSON_AddItemToArray(ids, cJSON_CreateNumber(d->token_ids[i])))
            goto oom;
    if (d->logprobs) {
        cJSON *lps = cJSON_AddArrayToObject(o, "logprobs");
        if (!lps)
            goto oom;
        for (int i = 0; i < d->n_token_ids; i++) {
            const struct ev_logprob *lp = &d->logprobs[i];
            cJSON *e = cJSON_CreateObject();
            if (!e || !cJSON_AddItemToArray(lps, e) || add_int(e, "token_id", lp->token_id) ||
                !cJSON_AddNumberToObject(e, "logprob", lp->logprob) ||
                add_bytes(e, lp->bytes, lp->n_bytes))
                goto oom;
            cJSON *top = cJSON_AddArrayToObject(e, "top");
            if (!top)
                goto oom;
            for (int k = 0; k < lp->n_top; k++) {
                cJSON *t = cJSON_CreateObject();
                if (!t || !cJSON_AddItemToArray(top, t) || add_int(t, "token_id", lp->top_ids[k]) ||
                    !cJSON_AddNumberToObject(t, "logprob", lp->top_logprobs[k]) ||
                    (lp->top_bytes &&
                     add_bytes(t, lp->top_bytes[k], lp->top_bytes[k] ? lp->top_n_bytes[k] : 0)))
                    goto oom;
            }
        }
    }
    return finish(o, out, err);
oom:
    cJSON_Delete(o);
    return rl_errf(err, RL_ENOMEM, "ev_build_delta: out of memory (seq %" PRId64 ")", seq);
}

/* `embedding` as the little-endian bytes of its float32 values in base64
 * (a third of the text of decimal floats, and exact), and `dimensions`. */
static int add_embedding(cJSON *o, const float *v, int n)
{
    size_t nb = (size_t)n * 4;
    uint8_t *b = malloc(nb ? nb : 1);
    char *s = b ? malloc(b64_len(nb) + 1) : NULL;
    int rc = -1;
    if (s) {
        for (int i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &v[i], 4);
            for (int k = 0; k < 4; k++)
                b[4 * i + k] = (uint8_t)(u >> (8 * k));
        }
        b64_encode_to(b, nb, s);
        rc = cJSON_AddStringToObject(o, "embedding", s) && !add_int(o, "dimensions", n) ? 0 : -1;
    }
    free(s);
    free(b);
    return rc;
}

int ev_build_done(int64_t seq, const struct ev_done *d, char **out, struct rl_err *err)
{
    *out = NULL;
    const char *fin = d ? ev_finish_name(d->finish_reason) : NULL;
    if (seq < 0 || !fin)
        return rl_errf(err, RL_EINVAL, "ev_build_done: bad arguments (seq %" PRId64 ")", seq);
    if (d->tool_calls && !cJSON_IsArray(d->tool_calls))
        return rl_errf(err, RL_EINVAL, "ev_build_done: tool_calls must be an array");
    if (d->metadata && !cJSON_IsObject(d->metadata))
        return rl_errf(err, RL_EINVAL, "ev_build_done: metadata must be an object");
    cJSON *o = head(seq, "done");
    if (!o || !cJSON_AddStringToObject(o, "finish_reason", fin))
        goto oom;
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    if (!u || add_int(u, "prompt_tokens", d->prompt_tokens) ||
        add_int(u, "completion_tokens", d->completion_tokens) ||
        add_int(u, "reasoning_tokens", d->reasoning_tokens) ||
        add_int(u, "cached_prompt_tokens", d->cached_prompt_tokens))
        goto oom;
    if (!cJSON_AddBoolToObject(o, "cached", d->cached))
        goto oom;
    cJSON *t = cJSON_AddObjectToObject(o, "timings");
    if (!t || add_int(t, "queue_ms", d->queue_ms) || add_int(t, "ttft_ms", d->ttft_ms) ||
        add_int(t, "total_ms", d->total_ms))
        goto oom;
    if (d->speculated) {
        /* the rate as a fraction with 4 decimals; 0 when nothing was drafted */
        double rate = d->spec_drafted > 0
                          ? (double)(int64_t)(10000.0 * (double)d->spec_accepted /
                                                  (double)d->spec_drafted + 0.5) / 10000.0
                          : 0.0;
        if (add_int(t, "spec_drafted", d->spec_drafted) ||
            add_int(t, "spec_accepted", d->spec_accepted) ||
            !cJSON_AddNumberToObject(t, "spec_acceptance", rate))
            goto oom;
    }
    cJSON *tc = d->tool_calls ? cJSON_Duplicate(d->tool_calls, 1) : cJSON_CreateArray();
    if (!tc || !cJSON_AddItemToObject(o, "tool_calls", tc))
        goto oom;
    if (d->metadata) {
        cJSON *m = cJSON_Duplicate(d->metadata, 1);
        if (!m || !cJSON_AddItemToObject(o, "metadata", m))
            goto oom;
    }
    if (d->embedding && add_embedding(o, d->embedding, d->n_embedding))
        goto oom;
    if (d->has_score && !cJSON_AddNumberToObject(o, "score", d->score))
        goto oom;
    if (d->matched_stop && d->finish_reason == EV_FINISH_STOP &&
        !cJSON_AddStringToObject(o, "matched_stop", d->matched_stop))
        goto oom;
    return finish(o, out, err);
oom:
    cJSON_Delete(o);
    return rl_errf(err, RL_ENOMEM, "ev_build_done: out of memory (seq %" PRId64 ")", seq);
}

int ev_build_error(int64_t seq, enum ev_code code, const char *message, char **out,
                   struct rl_err *err)
{
    *out = NULL;
    if (seq < 0 || code <= EV_CODE_NONE || code >= EV_CODE_COUNT)
        return rl_errf(err, RL_EINVAL, "ev_build_error: bad seq %" PRId64 " or code %d", seq,
                       (int)code);
    cJSON *o = head(seq, "error");
    if (!o || !cJSON_AddStringToObject(o, "code", ev_code_name(code)) ||
        !cJSON_AddItemToObject(o, "message", str_msg(message ? message : ev_code_meaning(code)))) {
        cJSON_Delete(o);
        return rl_errf(err, RL_ENOMEM, "ev_build_error: out of memory");
    }
    return finish(o, out, err);
}

int ev_build_error_retry(int64_t seq, enum ev_code code, const char *message,
                         int64_t retry_after_ms, char **out, struct rl_err *err)
{
    *out = NULL;
    if (seq < 0 || code <= EV_CODE_NONE || code >= EV_CODE_COUNT || retry_after_ms < 0)
        return rl_errf(err, RL_EINVAL, "ev_build_error_retry: bad seq %" PRId64 ", code %d or "
                       "retry_after_ms %" PRId64, seq, (int)code, retry_after_ms);
    cJSON *o = head(seq, "error");
    if (!o || !cJSON_AddStringToObject(o, "code", ev_code_name(code)) ||
        !cJSON_AddItemToObject(o, "message", str_msg(message ? message : ev_code_meaning(code))) ||
        add_int(o, "retry_after_ms", retry_after_ms)) {
        cJSON_Delete(o);
        return rl_errf(err, RL_ENOMEM, "ev_build_error_retry: out of memory");
    }
    return finish(o, out, err);
}

/* One try of ev_build_dead with the job text cut before job_max bytes. */
static int build_dead(const struct ev_dead *d, size_t job_max, char **out, struct rl_err *err)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        goto oom;
    size_t n_bad = 0;
    bool cut = false;
    cJSON *job = d->job_raw ? str_clean(d->job_raw, d->job_raw_len, job_max, &n_bad, &cut)
                            : cJSON_CreateNull();
    if (!job || !cJSON_AddItemToObject(o, "job", job))
        goto oom;
    const char *msg = d->message ? d->message : ev_code_meaning(d->code);
    if (!cJSON_AddStringToObject(o, "id", d->job_id ? d->job_id : "") ||
        !cJSON_AddStringToObject(o, "pool", d->pool ? d->pool : "") ||
        !cJSON_AddStringToObject(o, "entry_id", d->entry_id ? d->entry_id : "") ||
        !cJSON_AddStringToObject(o, "code", ev_code_name(d->code)) ||
        !cJSON_AddItemToObject(o, "message", str_msg(msg)) ||
        !cJSON_AddStringToObject(o, "worker", d->worker ? d->worker : "") ||
        add_int(o, "deliveries", d->deliveries) || add_int(o, "time_ms", d->time_ms))
        goto oom;
    /* what the job field is not: the whole text, or the bytes as they came */
    if (d->job_raw && (cut || n_bad) &&
        (add_int(o, "job_bytes", (int64_t)d->job_raw_len) ||
         !cJSON_AddBoolToObject(o, "job_truncated", cut) ||
         add_int(o, "job_replaced_bytes", (int64_t)n_bad)))
        goto oom;
    return finish(o, out, err);
oom:
    cJSON_Delete(o);
    return rl_errf(err, RL_ENOMEM, "ev_build_dead: out of memory");
}

int ev_build_dead(const struct ev_dead *d, char **out, struct rl_err *err)
{
    *out = NULL;
    if (!d || d->code <= EV_CODE_NONE || d->code >= EV_CODE_COUNT)
        return rl_errf(err, RL_EINVAL, "ev_build_dead: bad code");
    /* escaping may grow the job up to 6 times (\u0001): cut it shorter
     * until the letter fits EV_DEAD_LETTER_MAX */
    for (size_t job_max = EV_DEAD_JOB_MAX;; job_max /= 2) {
        int rc = build_dead(d, job_max, out, err);
        if (rc || strlen(*out) <= EV_DEAD_LETTER_MAX || job_max == 0)
            return rc;
        free(*out);
        *out = NULL;
    }
}

int ev_stamp_request(char **json, const char *entry, const char *sha, struct rl_err *err)
{
    cJSON *o = cJSON_Parse(*json);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return rl_errf(err, RL_EFORMAT, "event: not a JSON object");
    }
    cJSON *r = cJSON_CreateObject();
    if (!r || !cJSON_AddItemToObject(o, "request", r) ||
        !cJSON_AddStringToObject(r, "entry", entry ? entry : "") ||
        !cJSON_AddStringToObject(r, "job_sha256", sha ? sha : "")) {
        if (r && !cJSON_GetObjectItemCaseSensitive(o, "request"))
            cJSON_Delete(r);
        cJSON_Delete(o);
        return rl_errf(err, RL_ENOMEM, "event: out of memory");
    }
    char *s = NULL;
    int rc = finish(o, &s, err);
    if (rc)
        return rc;
    free(*json);
    *json = s;
    return 0;
}

void ev_info_clear(struct ev_info *info)
{
    if (!info)
        return;
    free(info->token_ids);
    memset(info, 0, sizeof *info);
}

int ev_parse(const char *json, size_t len, struct ev_info *out, struct rl_err *err)
{
    memset(out, 0, sizeof *out);
    cJSON *o = cJSON_ParseWithLength(json, len);
    int rc = 0;
    if (!cJSON_IsObject(o)) {
        rc = rl_errf(err, RL_EFORMAT, "event: not a JSON object");
        goto done;
    }
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(o, "seq");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "type");
    if (!cJSON_IsNumber(seq) || seq->valuedouble < 0 ||
        seq->valuedouble != (double)(int64_t)seq->valuedouble) {
        rc = rl_errf(err, RL_EFORMAT, "event: seq missing or not a non-negative integer");
        goto done;
    }
    out->seq = (int64_t)seq->valuedouble;
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    if (!strcmp(t, "delta")) {
        out->type = EV_TYPE_DELTA;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "token_ids");
        if (!cJSON_IsArray(ids)) {
            rc = rl_errf(err, RL_EFORMAT, "event %" PRId64 ": delta without token_ids", out->seq);
            goto done;
        }
        int n = cJSON_GetArraySize(ids);
        out->token_ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
        if (!out->token_ids) {
            rc = rl_errf(err, RL_ENOMEM, "event: out of memory");
            goto done;
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, ids) {
            if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > INT32_MAX) {
                rc = rl_errf(err, RL_EFORMAT, "event %" PRId64 ": bad token id", out->seq);
                goto done;
            }
            out->token_ids[out->n_token_ids++] = (int32_t)it->valuedouble;
        }
    } else if (!strcmp(t, "done")) {
        out->type = EV_TYPE_DONE;
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "finish_reason");
        int found = 0;
        for (int i = 0; cJSON_IsString(f) && ev_finish_name((enum ev_finish)i); i++)
            if (!strcmp(f->valuestring, ev_finish_name((enum ev_finish)i))) {
                out->finish_reason = (enum ev_finish)i;
                found = 1;
            }
        if (!found) {
            rc = rl_errf(err, RL_EFORMAT, "event %" PRId64 ": bad finish_reason", out->seq);
            goto done;
        }
    } else if (!strcmp(t, "error")) {
        out->type = EV_TYPE_ERROR;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "code");
        out->code = ev_code_from_name(cJSON_IsString(c) ? c->valuestring : NULL);
    } else {
        rc = rl_errf(err, RL_EFORMAT, "event %" PRId64 ": unknown type \"%.40s\"", out->seq, t);
    }
done:
    if (rc)
        ev_info_clear(out);
    cJSON_Delete(o);
    return rc;
}
