/* tests/unit/test_event.c - event and dead-letter JSON, the code table.
 *
 * The events built here are compared with schemas/examples/events.json and
 * dead-letters.json, which tests/integration/test_schemas.py validates
 * against the schemas: so what the C code writes is what the schemas allow.
 * REDLM_WRITE_EXAMPLES=1 rewrites the two files from this code instead.
 * Run from the repository root (tests/run_tests.sh does). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"
#include <cjson/cJSON.h>

#include "event.h"

/* One request's events: two deltas, an error, and a done; then a second
 * request with logprobs and tool calls. */
static int build_events(char **out, int max)
{
    int n = 0;
    struct ev_seq seq;
    ev_seq_init(&seq);
    const int32_t ids1[] = {151667, 8420}, ids2[] = {785, 6722, 315};
    struct ev_delta d1 = {.reasoning_content = "Let me think", .reasoning_len = 12,
                          .token_ids = ids1, .n_token_ids = 2};
    struct ev_delta d2 = {.content = "The \"answer\"\n\xc3\xa9\xf0\x9f\x98\x80", .content_len = 19,
                          .token_ids = ids2, .n_token_ids = 3};
    assert_int_equal(ev_build_delta(ev_seq_take(&seq), &d1, &out[n++], NULL), 0);
    assert_int_equal(ev_build_delta(ev_seq_take(&seq), &d2, &out[n++], NULL), 0);
    cJSON *meta = cJSON_Parse("{\"user\":\"u-17\",\"trace\":{\"span\":\"ab12\"}}");
    struct ev_done done = {.finish_reason = EV_FINISH_STOP, .prompt_tokens = 12,
                           .completion_tokens = 5, .reasoning_tokens = 2,
                           .cached_prompt_tokens = 8, .cached = false, .queue_ms = 3,
                           .ttft_ms = 41, .total_ms = 97, .metadata = meta};
    assert_int_equal(ev_build_done(ev_seq_take(&seq), &done, &out[n++], NULL), 0);

    /* a job rejected before it ran: error at seq 0, then done "error" */
    ev_seq_init(&seq);
    assert_int_equal(ev_build_error(ev_seq_take(&seq), EV_CODE_OUT_OF_RANGE,
                                    "temperature: 2.5 is out of range [0, 2]", &out[n++], NULL), 0);
    struct ev_done derr = {.finish_reason = EV_FINISH_ERROR};
    assert_int_equal(ev_build_done(ev_seq_take(&seq), &derr, &out[n++], NULL), 0);

    /* logprobs, a tool call, cached replay */
    ev_seq_init(&seq);
    const int32_t one[] = {17}, top_ids[] = {17, 18};
    const float top_lp[] = {-0.25f, -1.5f};
    struct ev_logprob lp = {.token_id = 17, .logprob = -0.25f, .n_top = 2, .top_ids = top_ids,
                            .top_logprobs = top_lp};
    struct ev_delta d3 = {.content = "4", .content_len = 1, .token_ids = one, .n_token_ids = 1,
                          .logprobs = &lp};
    assert_int_equal(ev_build_delta(ev_seq_take(&seq), &d3, &out[n++], NULL), 0);
    cJSON *tc = cJSON_Parse("[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"add\","
                            "\"arguments\":\"{\\\"a\\\":2,\\\"b\\\":2}\"}}]");
    struct ev_done d4 = {.finish_reason = EV_FINISH_LENGTH, .prompt_tokens = 40,
                         .completion_tokens = 1, .cached = true, .tool_calls = tc};
    assert_int_equal(ev_build_done(ev_seq_take(&seq), &d4, &out[n++], NULL), 0);
    const char *fins[] = {"cancelled", "deadline"};
    for (int i = 0; i < 2; i++) {
        struct ev_done dc = {.finish_reason = i ? EV_FINISH_DEADLINE : EV_FINISH_CANCELLED,
                             .prompt_tokens = 3};
        assert_int_equal(ev_build_done(0, &dc, &out[n], NULL), 0);
        assert_non_null(strstr(out[n++], fins[i]));
    }
    /* the dispatcher's answer to a full pool */
    assert_int_equal(ev_build_error_retry(0, EV_CODE_OVERLOADED, "pool think has 500 jobs "
                                          "waiting for a worker (max_waiting 500)", 1000,
                                          &out[n++], NULL), 0);
    assert_int_equal(ev_build_done(1, &derr, &out[n++], NULL), 0);
    /* a job that ran with speculative decoding: its counts in timings */
    const int32_t sids[] = {603, 1378, 2326};
    struct ev_delta sd = {.content = "one two three", .content_len = 13, .token_ids = sids,
                          .n_token_ids = 3};
    assert_int_equal(ev_build_delta(0, &sd, &out[n++], NULL), 0);
    struct ev_done ds = {.finish_reason = EV_FINISH_LENGTH, .prompt_tokens = 30,
                         .completion_tokens = 3, .cached_prompt_tokens = 16, .queue_ms = 1,
                         .ttft_ms = 35, .total_ms = 60, .speculated = true,
                         .spec_drafted = 4, .spec_accepted = 2};
    assert_int_equal(ev_build_done(1, &ds, &out[n++], NULL), 0);
    /* a stop string ended the answer: matched_stop names it; any other
     * finish leaves it out */
    struct ev_done dm = {.finish_reason = EV_FINISH_STOP, .prompt_tokens = 5,
                         .completion_tokens = 2, .matched_stop = "\nUser:"};
    assert_int_equal(ev_build_done(0, &dm, &out[n], NULL), 0);
    assert_non_null(strstr(out[n++], "\"matched_stop\":\"\\nUser:\""));
    dm.finish_reason = EV_FINISH_LENGTH;
    assert_int_equal(ev_build_done(0, &dm, &out[n], NULL), 0);
    assert_null(strstr(out[n++], "matched_stop"));
    /* a tool call streamed (issue 29): the opening fragment, the next one,
     * and done with the whole call, whose arguments the fragments make */
    cJSON *t0 = cJSON_Parse("[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":"
                            "{\"name\":\"add\",\"arguments\":\"{\\\"a\\\": 2, \"}}]");
    cJSON *t1 = cJSON_Parse("[{\"index\":0,\"function\":{\"arguments\":\"\\\"b\\\": 2}\"}}]");
    cJSON *tcd = cJSON_Parse("[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
                             "\"add\",\"arguments\":\"{\\\"a\\\": 2, \\\"b\\\": 2}\"}}]");
    assert_true(t0 && t1 && tcd);
    const int32_t tids[] = {90, 91};
    struct ev_delta td0 = {.token_ids = tids, .n_token_ids = 1, .tool_calls = t0};
    struct ev_delta td1 = {.token_ids = tids + 1, .n_token_ids = 1, .tool_calls = t1};
    assert_int_equal(ev_build_delta(0, &td0, &out[n++], NULL), 0);
    assert_int_equal(ev_build_delta(1, &td1, &out[n++], NULL), 0);
    struct ev_done dt = {.finish_reason = EV_FINISH_STOP, .prompt_tokens = 50,
                         .completion_tokens = 2, .tool_calls = tcd};
    assert_int_equal(ev_build_done(2, &dt, &out[n++], NULL), 0);
    cJSON_Delete(t0);
    cJSON_Delete(t1);
    cJSON_Delete(tcd);
    cJSON_Delete(meta);
    cJSON_Delete(tc);
    assert_true(n <= max);
    return n;
}

static int build_dead(char **out)
{
    int n = 0;
    struct ev_dead a = {.job_raw = "{\"prompt\":\"x\",\"temprature\":1}", .job_raw_len = 29,
                        .job_id = "", .pool = "fast", .entry_id = "1700000000000-0",
                        .code = EV_CODE_UNKNOWN_FIELD, .message = "temprature: unknown field",
                        .worker = "gpu0", .deliveries = 1, .time_ms = 1700000000123};
    assert_int_equal(ev_build_dead(&a, &out[n++], NULL), 0);
    struct ev_dead b = {.job_raw = "{\"id\":\"j9\",\"prompt\":\"x\"}", .job_raw_len = 24,
                        .job_id = "j9", .pool = "think", .entry_id = "1700000000001-4",
                        .code = EV_CODE_TOO_MANY_DELIVERIES, .worker = "gpu1",
                        .deliveries = 4, .time_ms = 1700000009999};
    assert_int_equal(ev_build_dead(&b, &out[n++], NULL), 0);
    struct ev_dead c = {.job_raw = NULL, .pool = "fast", .entry_id = "1-1",
                        .code = EV_CODE_BAD_ENTRY, .worker = "dispatcher", .time_ms = 1};
    assert_int_equal(ev_build_dead(&c, &out[n++], NULL), 0);
    return n;
}

/* Strict UTF-8 (RFC 3629), the test's own: 1 when s[0..n) is valid. */
static int utf8_valid(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], cp, min;
        size_t k;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xE0) == 0xC0) { k = 2; min = 0x80; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { k = 3; min = 0x800; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { k = 4; min = 0x10000; cp = c & 0x07; }
        else return 0;
        if (i + k > n)
            return 0;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += k;
    }
    return 1;
}

/* Dead letters of hostile jobs are valid JSON text in UTF-8 (issue 14):
 * broken bytes and NULs become U+FFFD and are counted, a huge job is cut
 * below EV_DEAD_JOB_MAX (never inside a character) with its size noted,
 * and a message cut inside a character is repaired too. */
static void test_dead_letter_repairs(void **state)
{
    (void)state;
    static const char raw[] = "{\"prompt\":\"\xff\xc0\xaf a\0b \xe2\x82\xed\xa0\x80\"}";
    struct ev_dead d = {.job_raw = raw, .job_raw_len = sizeof raw - 1, .job_id = "",
                        .pool = "fast", .entry_id = "1-1", .code = EV_CODE_BAD_UTF8,
                        .message = "temp\xc3: cut", .worker = "w", .time_ms = 1};
    char *out = NULL;
    assert_int_equal(ev_build_dead(&d, &out, NULL), 0);
    assert_true(utf8_valid((const unsigned char *)out, strlen(out)));
    cJSON *o = cJSON_Parse(out);
    assert_non_null(o);
    const char *want = "{\"prompt\":\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd a\xef\xbf\xbd"
                       "b \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"}";
    assert_string_equal(cJSON_GetObjectItem(o, "job")->valuestring, want);
    assert_int_equal(cJSON_GetObjectItem(o, "job_replaced_bytes")->valueint, 9);
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(o, "job_truncated")));
    assert_int_equal(cJSON_GetObjectItem(o, "job_bytes")->valueint, (int)sizeof raw - 1);
    assert_string_equal(cJSON_GetObjectItem(o, "message")->valuestring, "temp\xef\xbf\xbd: cut");
    cJSON_Delete(o);
    free(out);

    /* 10 MB of two-byte characters, one byte off so no cut lands evenly */
    size_t big = 10u << 20;
    char *huge = malloc(big + 1);
    assert_non_null(huge);
    huge[0] = 'x';
    for (size_t i = 1; i + 1 < big; i += 2)
        memcpy(huge + i, "\xc3\xa9", 2);
    huge[big - 1] = 'y';
    d.job_raw = huge;
    d.job_raw_len = big;
    d.message = "job: 10485760 bytes is over the limit";
    assert_int_equal(ev_build_dead(&d, &out, NULL), 0);
    assert_true(strlen(out) < EV_DEAD_JOB_MAX + 1024);
    assert_true(utf8_valid((const unsigned char *)out, strlen(out)));
    o = cJSON_Parse(out);
    assert_non_null(o);
    const char *job = cJSON_GetObjectItem(o, "job")->valuestring;
    assert_true(strlen(job) <= EV_DEAD_JOB_MAX && strlen(job) > EV_DEAD_JOB_MAX - 4);
    assert_memory_equal(job, huge, strlen(job));
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(o, "job_truncated")));
    assert_int_equal(cJSON_GetObjectItem(o, "job_bytes")->valuedouble, (double)big);
    assert_int_equal(cJSON_GetObjectItem(o, "job_replaced_bytes")->valueint, 0);
    cJSON_Delete(o);
    free(out);
    free(huge);

    /* error events repair their message the same way */
    assert_int_equal(ev_build_error(0, EV_CODE_UNKNOWN_FIELD, "\xe2\x82: unknown field", &out,
                                    NULL), 0);
    assert_true(utf8_valid((const unsigned char *)out, strlen(out)));
    assert_non_null(strstr(out, "\xef\xbf\xbd\xef\xbf\xbd: unknown field"));
    free(out);
}

/* Compares built strings with a file holding a JSON array of the same
 * documents, one per line; or writes the file. */
static void check_file(const char *path, char **docs, int n)
{
    if (getenv("REDLM_WRITE_EXAMPLES")) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fprintf(f, "[\n");
        for (int i = 0; i < n; i++)
            fprintf(f, "  %s%s\n", docs[i], i + 1 < n ? "," : "");
        fprintf(f, "]\n");
        fclose(f);
        return;
    }
    char *text = tu_slurp(path, NULL);
    if (!text)
        fail_msg("%s: cannot read", path);
    cJSON *arr = cJSON_Parse(text);
    assert_true(cJSON_IsArray(arr));
    assert_int_equal(cJSON_GetArraySize(arr), n);
    for (int i = 0; i < n; i++) {
        char *want = cJSON_PrintUnformatted(cJSON_GetArrayItem(arr, i));
        if (strcmp(want, docs[i]))
            fail_msg("%s[%d]:\n  file %s\n  code %s", path, i, want, docs[i]);
        free(want);
    }
    cJSON_Delete(arr);
    free(text);
}

static void test_events_match_examples(void **state)
{
    (void)state;
    char *ev[24];
    int n = build_events(ev, 24);
    check_file(tu_repo_file("schemas/examples/events.json"), ev, n);
    char *dead[4];
    int m = build_dead(dead);
    check_file(tu_repo_file("schemas/examples/dead-letters.json"), dead, m);
    for (int i = 0; i < n; i++)
        free(ev[i]);
    for (int i = 0; i < m; i++)
        free(dead[i]);
}

static void test_exact_shapes(void **state)
{
    (void)state;
    char *s = NULL;
    const int32_t ids[] = {1};
    struct ev_delta d = {.content = "hi", .content_len = 2, .token_ids = ids, .n_token_ids = 1};
    assert_int_equal(ev_build_delta(7, &d, &s, NULL), 0);
    assert_string_equal(s, "{\"seq\":7,\"type\":\"delta\",\"delta\":{\"content\":\"hi\"},\"token_ids\":[1]}");
    free(s);
    assert_int_equal(ev_build_error(0, EV_CODE_UNKNOWN_POOL, NULL, &s, NULL), 0);
    assert_string_equal(s, "{\"seq\":0,\"type\":\"error\",\"code\":\"UNKNOWN_POOL\",\"message\":\"the job "
                           "names a pool that no worker is configured to serve\"}");
    free(s);
    assert_int_equal(ev_build_error_retry(0, EV_CODE_OVERLOADED, "pool think has 12 waiting jobs",
                                          1500, &s, NULL), 0);
    assert_string_equal(s, "{\"seq\":0,\"type\":\"error\",\"code\":\"OVERLOADED\",\"message\":"
                           "\"pool think has 12 waiting jobs\",\"retry_after_ms\":1500}");
    free(s);
    assert_int_equal(ev_build_error_retry(0, EV_CODE_OVERLOADED, NULL, -1, &s, NULL), -RL_EINVAL);
    struct ev_done dn = {.finish_reason = EV_FINISH_STOP, .total_ms = 1700000000123};
    assert_int_equal(ev_build_done(3, &dn, &s, NULL), 0);
    assert_string_equal(s, "{\"seq\":3,\"type\":\"done\",\"finish_reason\":\"stop\",\"usage\":{"
                           "\"prompt_tokens\":0,\"completion_tokens\":0,\"reasoning_tokens\":0,"
                           "\"cached_prompt_tokens\":0},\"cached\":false,\"timings\":{\"queue_ms\":0,"
                           "\"ttft_ms\":0,\"total_ms\":1700000000123},\"tool_calls\":[]}");
    free(s);
    /* an embedding: base64 of little-endian float32, and its length */
    const float vec[3] = {1.0f, -0.5f, 0.25f};
    struct ev_done de = {.finish_reason = EV_FINISH_STOP, .embedding = vec, .n_embedding = 3};
    assert_int_equal(ev_build_done(0, &de, &s, NULL), 0);
    /* 00 00 80 3f | 00 00 00 bf | 00 00 80 3e */
    assert_non_null(strstr(s, "\"embedding\":\"AACAPwAAAL8AAIA+\",\"dimensions\":3"));
    free(s);
    struct ev_done ds = {.finish_reason = EV_FINISH_STOP, .has_score = true, .score = 0.25};
    assert_int_equal(ev_build_done(0, &ds, &s, NULL), 0);
    assert_non_null(strstr(s, "\"score\":0.25"));
    free(s);
    /* content given with a length is cut there, not at a NUL */
    struct ev_delta cut = {.content = "abcdef", .content_len = 3, .token_ids = ids, .n_token_ids = 1};
    assert_int_equal(ev_build_delta(0, &cut, &s, NULL), 0);
    assert_non_null(strstr(s, "\"content\":\"abc\""));
    free(s);
}

/* Token bytes: written as ints when the worker has them, left out when
 * not (top entries alike), so old readers and new ones both parse. */
static void test_delta_token_bytes(void **state)
{
    (void)state;
    const int32_t ids[] = {17, 18}, top_ids[] = {17, 99};
    const float top_lp[] = {-0.25f, -1.5f};
    const char *top_b[] = {"\xe2\x82", NULL};
    const size_t top_nb[] = {2, 0};
    struct ev_logprob lp[2] = {
        {.token_id = 17, .logprob = -0.25f, .n_top = 2, .top_ids = top_ids,
         .top_logprobs = top_lp, .bytes = "\xe2\x82", .n_bytes = 2, .top_bytes = top_b,
         .top_n_bytes = top_nb},
        {.token_id = 18, .logprob = -0.5f, .bytes = " hi", .n_bytes = 3},
    };
    struct ev_delta d = {.content = "x", .content_len = 1, .token_ids = ids, .n_token_ids = 2,
                         .logprobs = lp};
    char *s;
    assert_int_equal(ev_build_delta(3, &d, &s, NULL), 0);
    assert_string_equal(s, "{\"seq\":3,\"type\":\"delta\",\"delta\":{\"content\":\"x\"},"
                           "\"token_ids\":[17,18],\"logprobs\":[{\"token_id\":17,\"logprob\":-0.25,"
                           "\"bytes\":[226,130],\"top\":[{\"token_id\":17,\"logprob\":-0.25,"
                           "\"bytes\":[226,130]},{\"token_id\":99,\"logprob\":-1.5}]},"
                           "{\"token_id\":18,\"logprob\":-0.5,\"bytes\":[32,104,105],\"top\":[]}]}");
    free(s);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    char *s = (char *)1;
    struct rl_err err = {0};
    struct ev_delta d = {.n_token_ids = 1};
    assert_int_equal(ev_build_delta(0, &d, &s, &err), -RL_EINVAL);
    assert_null(s);
    assert_int_equal(ev_build_delta(-1, &(struct ev_delta){0}, &s, &err), -RL_EINVAL);
    assert_int_equal(ev_build_error(0, EV_CODE_NONE, "x", &s, &err), -RL_EINVAL);
    assert_int_equal(ev_build_error(0, EV_CODE_COUNT, "x", &s, &err), -RL_EINVAL);
    struct ev_done dn = {.finish_reason = (enum ev_finish)99};
    assert_int_equal(ev_build_done(0, &dn, &s, &err), -RL_EINVAL);
    cJSON *notarr = cJSON_CreateObject();
    struct ev_done d2 = {.tool_calls = notarr};
    assert_int_equal(ev_build_done(0, &d2, &s, &err), -RL_EINVAL);
    cJSON_Delete(notarr);
    assert_int_equal(ev_build_dead(&(struct ev_dead){.code = EV_CODE_NONE}, &s, &err), -RL_EINVAL);
}

static void test_parse_round_trip(void **state)
{
    (void)state;
    char *ev[24];
    int n = build_events(ev, 24);
    struct ev_info info;
    assert_int_equal(ev_parse(ev[1], strlen(ev[1]), &info, NULL), 0);
    assert_int_equal(info.type, EV_TYPE_DELTA);
    assert_int_equal(info.seq, 1);
    assert_int_equal(info.n_token_ids, 3);
    assert_int_equal(info.token_ids[2], 315);
    ev_info_clear(&info);
    assert_int_equal(ev_parse(ev[2], strlen(ev[2]), &info, NULL), 0);
    assert_int_equal(info.type, EV_TYPE_DONE);
    assert_int_equal(info.finish_reason, EV_FINISH_STOP);
    ev_info_clear(&info);
    assert_int_equal(ev_parse(ev[3], strlen(ev[3]), &info, NULL), 0);
    assert_int_equal(info.type, EV_TYPE_ERROR);
    assert_int_equal(info.code, EV_CODE_OUT_OF_RANGE);
    ev_info_clear(&info);
    assert_int_equal(ev_parse(ev[5], strlen(ev[5]), &info, NULL), 0);
    assert_int_equal(info.seq, 0);
    ev_info_clear(&info);
    for (int i = 0; i < n; i++)
        free(ev[i]);
    const char *bad[] = {"", "[]", "{\"type\":\"delta\"}", "{\"seq\":-1,\"type\":\"delta\",\"token_ids\":[]}",
                         "{\"seq\":1,\"type\":\"tick\"}", "{\"seq\":1,\"type\":\"delta\"}",
                         "{\"seq\":1,\"type\":\"done\",\"finish_reason\":\"eos\"}",
                         "{\"seq\":1.5,\"type\":\"done\",\"finish_reason\":\"stop\"}",
                         "{\"seq\":1,\"type\":\"delta\",\"token_ids\":[\"a\"]}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct rl_err err = {0};
        assert_int_equal(ev_parse(bad[i], strlen(bad[i]), &info, &err), -RL_EFORMAT);
        assert_null(info.token_ids);
    }
}

static void test_seq_and_stream_ids(void **state)
{
    (void)state;
    struct ev_seq s;
    ev_seq_init(&s);
    assert_int_equal(ev_seq_take(&s), 0);
    assert_int_equal(ev_seq_take(&s), 1);
    ev_seq_resume(&s, 41);
    assert_int_equal(ev_seq_take(&s), 42);
    ev_seq_resume(&s, -1);
    assert_int_equal(ev_seq_take(&s), 0);
    char buf[EV_STREAM_ID_MAX];
    assert_string_equal(ev_stream_id(0, buf), "0-1");
    assert_string_equal(ev_stream_id(9007199254740991ll, buf), "0-9007199254740992");
    assert_string_equal(ev_finish_name(EV_FINISH_DEADLINE), "deadline");
    assert_null(ev_finish_name((enum ev_finish)5));
}

/* The C table, schemas/errors.json and their order agree. */
static void test_codes_match_errors_json(void **state)
{
    (void)state;
    char *text = tu_slurp(tu_repo_file("schemas/errors.json"), NULL);
    if (!text)
        fail_msg("schemas/errors.json: cannot read");
    cJSON *root = cJSON_Parse(text);
    cJSON *codes = cJSON_GetObjectItemCaseSensitive(root, "codes");
    assert_int_equal(cJSON_GetArraySize(codes), EV_CODE_COUNT - 1);
    for (int i = 1; i < EV_CODE_COUNT; i++) {
        cJSON *e = cJSON_GetArrayItem(codes, i - 1);
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "code"));
        const char *meaning = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "meaning"));
        assert_non_null(name);
        assert_string_equal(name, ev_code_name((enum ev_code)i));
        assert_string_equal(meaning, ev_code_meaning((enum ev_code)i));
        assert_int_equal(ev_code_from_name(name), i);
    }
    assert_int_equal(ev_code_from_name("NO_SUCH_CODE"), EV_CODE_NONE);
    assert_string_equal(ev_code_name(EV_CODE_COUNT), "INTERNAL");
    cJSON_Delete(root);
    free(text);
}

/* The identity stamp of a stream's first event, and the byte bound of a
 * dead letter whatever its job holds (issue 26). */
static void test_stamp_and_dead_letter_bound(void **state)
{
    (void)state;
    char *e = NULL;
    assert_int_equal(ev_build_error(0, EV_CODE_ID_CONFLICT, "taken", &e, NULL), 0);
    assert_int_equal(ev_stamp_request(&e, "1700-3", "ab", NULL), 0);
    assert_string_equal(e, "{\"seq\":0,\"type\":\"error\",\"code\":\"ID_CONFLICT\","
                           "\"message\":\"taken\",\"request\":{\"entry\":\"1700-3\","
                           "\"job_sha256\":\"ab\"}}");
    char *bad = strdup("[1]");
    struct rl_err err = {0};
    assert_int_equal(ev_stamp_request(&bad, "1-1", "ab", &err), -RL_EFORMAT);
    assert_string_equal(bad, "[1]"); /* left as it was */
    free(bad);
    free(e);
    /* 64 KiB of control characters: each escaped to 6 bytes */
    size_t n = 65536;
    char *job = malloc(n);
    memset(job, 1, n);
    struct ev_dead d = {.job_raw = job, .job_raw_len = n, .job_id = "x", .pool = "fast",
                        .entry_id = "1-1", .code = EV_CODE_INVALID_JSON, .message = "m",
                        .worker = "w", .deliveries = 1, .time_ms = 1};
    char *out = NULL;
    assert_int_equal(ev_build_dead(&d, &out, NULL), 0);
    assert_true(strlen(out) <= EV_DEAD_LETTER_MAX);
    assert_non_null(strstr(out, "\"job_truncated\":true"));
    assert_non_null(strstr(out, "\"job_bytes\":65536"));
    free(out);
    free(job);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_match_examples),
        cmocka_unit_test(test_exact_shapes),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_delta_token_bytes),
        cmocka_unit_test(test_parse_round_trip),
        cmocka_unit_test(test_seq_and_stream_ids),
        cmocka_unit_test(test_codes_match_errors_json),
        cmocka_unit_test(test_dead_letter_repairs),
        cmocka_unit_test(test_stamp_and_dead_letter_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
