/* tests/unit/test_job.c - the job codec: 100+ malformed jobs each with its
 * precise code and field, valid jobs with defaults, round trips, the
 * cache key. */
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

#include "job.h"

#define P "\"prompt\":\"hi\""
#define M "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

/* One malformed job, the code it must get and the field it must name. */
static const struct {
    const char *json;
    enum ev_code code;
    const char *field;
} bad_jobs[] = {
    /* the text as a whole */
    {"", EV_CODE_INVALID_JSON, ""},
    {"{", EV_CODE_INVALID_JSON, ""},
    {"{\"prompt\":\"hi\",}", EV_CODE_INVALID_JSON, ""},
    {"{\"prompt\":'hi'}", EV_CODE_INVALID_JSON, ""},
    {"{" P "} trailing", EV_CODE_INVALID_JSON, ""},
    {"{" P "}{}", EV_CODE_INVALID_JSON, ""},
    {"{prompt:\"hi\"}", EV_CODE_INVALID_JSON, ""},
    {"{\"prompt\":\"\\ud800\"}", EV_CODE_INVALID_JSON, ""},
    {"{\"prompt\":\"a\x01" "b\"}", EV_CODE_INVALID_JSON, ""},
    {"\x01{" P "}", EV_CODE_INVALID_JSON, ""},
    {"{" P ",\"top_p\":1.}", EV_CODE_INVALID_JSON, ""},
    {"{" P ",\"top_p\":-.5}", EV_CODE_INVALID_JSON, ""},
    {"{" P ",\"top_p\":1e}", EV_CODE_INVALID_JSON, ""},
    {"{\"max_tokens\":01," P "}", EV_CODE_INVALID_JSON, ""},
    {"{\"prompt\":\"\xff\"}", EV_CODE_BAD_UTF8, ""},
    {"{\"prompt\":\"\xc0\xaf\"}", EV_CODE_BAD_UTF8, ""},
    {"{\"prompt\":\"\xed\xa0\x80\"}", EV_CODE_BAD_UTF8, ""},
    {"{\"prompt\":\"\xe2\x82\"}", EV_CODE_BAD_UTF8, ""},
    {"{\"prompt\":\"\xf4\x90\x80\x80\"}", EV_CODE_BAD_UTF8, ""},
    {"[]", EV_CODE_NOT_OBJECT, ""},
    {"\"hi\"", EV_CODE_NOT_OBJECT, ""},
    {"42", EV_CODE_NOT_OBJECT, ""},
    {"null", EV_CODE_NOT_OBJECT, ""},
    {"[{" P "}]", EV_CODE_NOT_OBJECT, ""},
    /* members */
    {"{" P ",\"temprature\":0.5}", EV_CODE_UNKNOWN_FIELD, "temprature"},
    {"{" P ",\"n\":2}", EV_CODE_UNKNOWN_FIELD, "n"},
    {"{" P ",\"Temperature\":0.5}", EV_CODE_UNKNOWN_FIELD, "Temperature"},
    {"{" P ",\"stream\":true}", EV_CODE_UNKNOWN_FIELD, "stream"},
    {"{" P ",\"\":1}", EV_CODE_UNKNOWN_FIELD, ""},
    {"{" P ",\"prompt\":\"again\"}", EV_CODE_DUPLICATE_FIELD, "prompt"},
    {"{" P ",\"seed\":1,\"seed\":2}", EV_CODE_DUPLICATE_FIELD, "seed"},
    /* prompt choice */
    {"{}", EV_CODE_MISSING_PROMPT, ""},
    {"{\"max_tokens\":5}", EV_CODE_MISSING_PROMPT, ""},
    {"{" P "," M "}", EV_CODE_CONFLICTING_PROMPT, ""},
    {"{" P ",\"prompt_ids\":[1]}", EV_CODE_CONFLICTING_PROMPT, ""},
    {"{" M ",\"prompt_ids\":[1]}", EV_CODE_CONFLICTING_PROMPT, ""},
    {"{" P ",\"tools\":[]}", EV_CODE_CONFLICTING_PROMPT, "tools"},
    /* id */
    {"{" P ",\"id\":42}", EV_CODE_BAD_TYPE, "id"},
    {"{" P ",\"id\":\"\"}", EV_CODE_BAD_ID, "id"},
    {"{" P ",\"id\":\"a b\"}", EV_CODE_BAD_ID, "id"},
    {"{" P ",\"id\":\"a/b\"}", EV_CODE_BAD_ID, "id"},
    {"{" P ",\"id\":\"caf\xc3\xa9\"}", EV_CODE_BAD_ID, "id"},
    {"{" P ",\"id\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}",
     EV_CODE_BAD_ID, "id"},
    {"{" P ",\"id\":\"a*\"}", EV_CODE_BAD_ID, "id"},
    /* NUL: cJSON would cut the string there (issue 14) */
    {"{" P ",\"id\":\"req-42\\u0000zz\"}", EV_CODE_BAD_ID, "id"},
    {"{\"id\":\"\\u0000\"," P "}", EV_CODE_BAD_ID, "id"},
    {"{" P ",\"id\" : \"a\\u0000\"}", EV_CODE_BAD_ID, "id"},
    {"{\"prompt\":\"a\\u0000b\",\"id\":\"x\\u0000\"}", EV_CODE_BAD_ID, "id"},
    {"{\"prompt\":\"a\\u0000b\"}", EV_CODE_BAD_VALUE, ""},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\\u0000there\"}]}", EV_CODE_BAD_VALUE, ""},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"id\":\"\\u0000\"}]}", EV_CODE_BAD_VALUE, ""},
    {"{" P ",\"stop\":[\"\\u0000\"]}", EV_CODE_BAD_VALUE, ""},
    /* pool */
    {"{" P ",\"pool\":1}", EV_CODE_BAD_TYPE, "pool"},
    {"{" P ",\"pool\":\"\"}", EV_CODE_OUT_OF_RANGE, "pool"},
    {"{" P ",\"pool\":\"a:b\"}", EV_CODE_BAD_VALUE, "pool"},
    /* prompt */
    {"{\"prompt\":\"\"}", EV_CODE_OUT_OF_RANGE, "prompt"},
    {"{\"prompt\":1}", EV_CODE_BAD_TYPE, "prompt"},
    {"{\"prompt\":[\"a\"]}", EV_CODE_BAD_TYPE, "prompt"},
    {"{\"prompt\":null}", EV_CODE_BAD_TYPE, "prompt"},
    /* prompt_ids */
    {"{\"prompt_ids\":[]}", EV_CODE_OUT_OF_RANGE, "prompt_ids"},
    {"{\"prompt_ids\":\"1 2\"}", EV_CODE_BAD_TYPE, "prompt_ids"},
    {"{\"prompt_ids\":[1,\"2\"]}", EV_CODE_BAD_TYPE, "prompt_ids[1]"},
    {"{\"prompt_ids\":[1,2.5]}", EV_CODE_BAD_TYPE, "prompt_ids[1]"},
    {"{\"prompt_ids\":[-1]}", EV_CODE_OUT_OF_RANGE, "prompt_ids[0]"},
    {"{\"prompt_ids\":[1,2,4294967296]}", EV_CODE_OUT_OF_RANGE, "prompt_ids[2]"},
    {"{\"prompt_ids\":[[1]]}", EV_CODE_BAD_TYPE, "prompt_ids[0]"},
    /* messages */
    {"{\"messages\":\"hi\"}", EV_CODE_BAD_TYPE, "messages"},
    {"{\"messages\":{}}", EV_CODE_BAD_TYPE, "messages"},
    {"{\"messages\":[]}", EV_CODE_OUT_OF_RANGE, "messages"},
    {"{\"messages\":[\"hi\"]}", EV_CODE_BAD_TYPE, "messages[0]"},
    {"{\"messages\":[{\"content\":\"hi\"}]}", EV_CODE_MISSING_FIELD, "messages[0].role"},
    {"{\"messages\":[{\"role\":\"user\"}]}", EV_CODE_MISSING_FIELD, "messages[0].content"},
    {"{\"messages\":[{\"role\":\"robot\",\"content\":\"hi\"}]}", EV_CODE_BAD_VALUE, "messages[0].role"},
    {"{\"messages\":[{\"role\":1,\"content\":\"hi\"}]}", EV_CODE_BAD_TYPE, "messages[0].role"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":5}]}", EV_CODE_BAD_TYPE, "messages[0].content"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":null}]}", EV_CODE_BAD_TYPE, "messages[0].content"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\",\"x\":1}]}",
     EV_CODE_UNKNOWN_FIELD, "messages[1].x"},
    {"{\"messages\":[{\"role\":\"user\",\"role\":\"user\",\"content\":\"b\"}]}", EV_CODE_DUPLICATE_FIELD,
     "messages[0].role"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
     EV_CODE_UNKNOWN_FIELD, "messages[0].content[0].image_url"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}", EV_CODE_BAD_VALUE,
     "messages[0].content[0].type"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]}", EV_CODE_MISSING_FIELD,
     "messages[0].content[0].type"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", EV_CODE_MISSING_FIELD,
     "messages[0].content[0].text"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":1}]}]}", EV_CODE_BAD_TYPE,
     "messages[0].content[0].text"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":[\"a\"]}]}", EV_CODE_BAD_TYPE, "messages[0].content[0]"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"name\":\"\"}]}", EV_CODE_OUT_OF_RANGE,
     "messages[0].name"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"tool_calls\":[]}]}", EV_CODE_BAD_VALUE,
     "messages[0].tool_calls"},
    {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":{}}]}", EV_CODE_BAD_TYPE, "messages[0].tool_calls"},
    {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\"}]}]}", EV_CODE_MISSING_FIELD,
     "messages[0].tool_calls[0].function"},
    {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"fn\",\"function\":{\"name\":\"f\"}}]}]}",
     EV_CODE_BAD_VALUE, "messages[0].tool_calls[0].type"},
    {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]}",
     EV_CODE_MISSING_FIELD, "messages[0].tool_calls[0].function.name"},
    {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":3}}]}]}",
     EV_CODE_BAD_TYPE, "messages[0].tool_calls[0].function.arguments"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"tool_call_id\":\"c1\"}]}", EV_CODE_BAD_VALUE,
     "messages[0].tool_call_id"},
    {"{\"messages\":[{\"role\":\"tool\",\"content\":\"a\",\"tool_call_id\":7}]}", EV_CODE_BAD_TYPE,
     "messages[0].tool_call_id"},
    {"{\"messages\":[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":[]}]}", EV_CODE_BAD_TYPE,
     "messages[0].reasoning_content"},
    /* tools */
    {"{" M ",\"tools\":{}}", EV_CODE_BAD_TYPE, "tools"},
    {"{" M ",\"tools\":[1]}", EV_CODE_BAD_TYPE, "tools[0]"},
    {"{" M ",\"tools\":[{\"function\":{\"name\":\"f\"}}]}", EV_CODE_MISSING_FIELD, "tools[0].type"},
    {"{" M ",\"tools\":[{\"type\":\"code\",\"function\":{\"name\":\"f\"}}]}", EV_CODE_BAD_VALUE, "tools[0].type"},
    {"{" M ",\"tools\":[{\"type\":\"function\"}]}", EV_CODE_MISSING_FIELD, "tools[0].function"},
    {"{" M ",\"tools\":[{\"type\":\"function\",\"function\":{}}]}", EV_CODE_MISSING_FIELD, "tools[0].function.name"},
    {"{" M ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]}",
     EV_CODE_BAD_TYPE, "tools[0].function.parameters"},
    {"{" M ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"params\":{}}}]}",
     EV_CODE_UNKNOWN_FIELD, "tools[0].function.params"},
    {"{" M ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":\"yes\"}}]}",
     EV_CODE_BAD_TYPE, "tools[0].function.strict"},
    /* mode */
    {"{" P ",\"mode\":\"fast\"}", EV_CODE_BAD_VALUE, "mode"},
    {"{" P ",\"mode\":\"THINK\"}", EV_CODE_BAD_VALUE, "mode"},
    {"{" P ",\"mode\":true}", EV_CODE_BAD_TYPE, "mode"},
    /* max_tokens */
    {"{" P ",\"max_tokens\":0}", EV_CODE_OUT_OF_RANGE, "max_tokens"},
    {"{" P ",\"max_tokens\":-5}", EV_CODE_OUT_OF_RANGE, "max_tokens"},
    {"{" P ",\"max_tokens\":1.5}", EV_CODE_BAD_TYPE, "max_tokens"},
    {"{" P ",\"max_tokens\":\"100\"}", EV_CODE_BAD_TYPE, "max_tokens"},
    {"{" P ",\"max_tokens\":1e300}", EV_CODE_OUT_OF_RANGE, "max_tokens"},
    {"{" P ",\"max_tokens\":null}", EV_CODE_BAD_TYPE, "max_tokens"},
    /* sampling */
    {"{" P ",\"temperature\":-0.1}", EV_CODE_OUT_OF_RANGE, "temperature"},
    {"{" P ",\"temperature\":2.5}", EV_CODE_OUT_OF_RANGE, "temperature"},
    {"{" P ",\"temperature\":\"0.7\"}", EV_CODE_BAD_TYPE, "temperature"},
    {"{" P ",\"temperature\":true}", EV_CODE_BAD_TYPE, "temperature"},
    {"{" P ",\"top_p\":0}", EV_CODE_OUT_OF_RANGE, "top_p"},
    {"{" P ",\"top_p\":1.01}", EV_CODE_OUT_OF_RANGE, "top_p"},
    {"{" P ",\"top_p\":[0.5]}", EV_CODE_BAD_TYPE, "top_p"},
    {"{" P ",\"top_k\":-1}", EV_CODE_OUT_OF_RANGE, "top_k"},
    {"{" P ",\"top_k\":2.5}", EV_CODE_BAD_TYPE, "top_k"},
    {"{" P ",\"top_k\":1000001}", EV_CODE_OUT_OF_RANGE, "top_k"},
    {"{" P ",\"min_p\":-0.5}", EV_CODE_OUT_OF_RANGE, "min_p"},
    {"{" P ",\"min_p\":1.5}", EV_CODE_OUT_OF_RANGE, "min_p"},
    {"{" P ",\"presence_penalty\":2.1}", EV_CODE_OUT_OF_RANGE, "presence_penalty"},
    {"{" P ",\"presence_penalty\":\"high\"}", EV_CODE_BAD_TYPE, "presence_penalty"},
    {"{" P ",\"frequency_penalty\":-3}", EV_CODE_OUT_OF_RANGE, "frequency_penalty"},
    {"{" P ",\"frequency_penalty\":{}}", EV_CODE_BAD_TYPE, "frequency_penalty"},
    {"{" P ",\"repetition_penalty\":0}", EV_CODE_OUT_OF_RANGE, "repetition_penalty"},
    {"{" P ",\"repetition_penalty\":2.5}", EV_CODE_OUT_OF_RANGE, "repetition_penalty"},
    {"{" P ",\"seed\":-1}", EV_CODE_OUT_OF_RANGE, "seed"},
    {"{" P ",\"seed\":1.5}", EV_CODE_BAD_TYPE, "seed"},
    {"{" P ",\"seed\":\"42\"}", EV_CODE_BAD_TYPE, "seed"},
    {"{" P ",\"seed\":18446744073709551615}", EV_CODE_OUT_OF_RANGE, "seed"},
    /* the front end's client lease (issue 26) */
    {"{" P ",\"client_lease_ms\":999}", EV_CODE_OUT_OF_RANGE, "client_lease_ms"},
    {"{" P ",\"client_lease_ms\":3600001}", EV_CODE_OUT_OF_RANGE, "client_lease_ms"},
    {"{" P ",\"client_lease_ms\":true}", EV_CODE_BAD_TYPE, "client_lease_ms"},
    /* stop */
    {"{" P ",\"stop\":5}", EV_CODE_BAD_TYPE, "stop"},
    {"{" P ",\"stop\":\"\"}", EV_CODE_OUT_OF_RANGE, "stop"},
    {"{" P ",\"stop\":[\"a\",\"\"]}", EV_CODE_OUT_OF_RANGE, "stop[1]"},
    {"{" P ",\"stop\":[\"a\",3]}", EV_CODE_BAD_TYPE, "stop[1]"},
    {"{" P ",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
     EV_CODE_OUT_OF_RANGE, "stop"},
    {"{" P ",\"stop\":{\"a\":1}}", EV_CODE_BAD_TYPE, "stop"},
    {"{" P ",\"stop\":null}", EV_CODE_BAD_TYPE, "stop"},
    /* flags and limits */
    {"{" P ",\"ignore_eos\":1}", EV_CODE_BAD_TYPE, "ignore_eos"},
    {"{" P ",\"ignore_eos\":\"true\"}", EV_CODE_BAD_TYPE, "ignore_eos"},
    {"{" P ",\"max_thinking_tokens\":-1}", EV_CODE_OUT_OF_RANGE, "max_thinking_tokens"},
    {"{" P ",\"max_thinking_tokens\":\"lots\"}", EV_CODE_BAD_TYPE, "max_thinking_tokens"},
    {"{" P ",\"logprobs\":21}", EV_CODE_OUT_OF_RANGE, "logprobs"},
    {"{" P ",\"logprobs\":-1}", EV_CODE_OUT_OF_RANGE, "logprobs"},
    {"{" P ",\"logprobs\":\"yes\"}", EV_CODE_BAD_TYPE, "logprobs"},
    {"{" P ",\"logprobs\":0.5}", EV_CODE_BAD_TYPE, "logprobs"},
    {"{" P ",\"priority\":1001}", EV_CODE_OUT_OF_RANGE, "priority"},
    {"{" P ",\"priority\":\"high\"}", EV_CODE_BAD_TYPE, "priority"},
    {"{" P ",\"deadline_ms\":-1}", EV_CODE_OUT_OF_RANGE, "deadline_ms"},
    {"{" P ",\"deadline_ms\":1.5}", EV_CODE_BAD_TYPE, "deadline_ms"},
    {"{" P ",\"deadline_ms\":\"soon\"}", EV_CODE_BAD_TYPE, "deadline_ms"},
    {"{" P ",\"cache\":\"no\"}", EV_CODE_BAD_TYPE, "cache"},
    {"{" P ",\"cache\":0}", EV_CODE_BAD_TYPE, "cache"},
    {"{" P ",\"stream_ttl_s\":0}", EV_CODE_OUT_OF_RANGE, "stream_ttl_s"},
    {"{" P ",\"stream_ttl_s\":604801}", EV_CODE_OUT_OF_RANGE, "stream_ttl_s"},
    {"{" P ",\"stream_ttl_s\":\"1h\"}", EV_CODE_BAD_TYPE, "stream_ttl_s"},
    {"{" P ",\"metadata\":\"x\"}", EV_CODE_BAD_TYPE, "metadata"},
    {"{" P ",\"metadata\":[1]}", EV_CODE_BAD_TYPE, "metadata"},
    {"{" P ",\"metadata\":null}", EV_CODE_BAD_TYPE, "metadata"},
    /* issue 29: min_tokens, stop_token_ids, logit_bias */
    {"{" P ",\"min_tokens\":-1}", EV_CODE_OUT_OF_RANGE, "min_tokens"},
    {"{" P ",\"min_tokens\":1.5}", EV_CODE_BAD_TYPE, "min_tokens"},
    {"{" P ",\"max_tokens\":8,\"min_tokens\":9}", EV_CODE_BAD_VALUE, "min_tokens"}, /* vLLM refuses it too */
    {"{" P ",\"stop_token_ids\":5}", EV_CODE_BAD_TYPE, "stop_token_ids"},
    {"{" P ",\"stop_token_ids\":[1,-2]}", EV_CODE_OUT_OF_RANGE, "stop_token_ids[1]"},
    {"{" P ",\"stop_token_ids\":[\"1\"]}", EV_CODE_BAD_TYPE, "stop_token_ids[0]"},
    {"{" P ",\"logit_bias\":[1]}", EV_CODE_BAD_TYPE, "logit_bias"},
    {"{" P ",\"logit_bias\":{\"x\":1}}", EV_CODE_BAD_VALUE, "logit_bias.x"},
    {"{" P ",\"logit_bias\":{\"-1\":1}}", EV_CODE_BAD_VALUE, "logit_bias.-1"},
    {"{" P ",\"logit_bias\":{\"01\":1}}", EV_CODE_BAD_VALUE, "logit_bias.01"},
    {"{" P ",\"logit_bias\":{\"3000000000\":1}}", EV_CODE_BAD_VALUE, "logit_bias.3000000000"},
    {"{" P ",\"logit_bias\":{\"5\":101}}", EV_CODE_OUT_OF_RANGE, "logit_bias.5"},
    {"{" P ",\"logit_bias\":{\"5\":\"1\"}}", EV_CODE_BAD_TYPE, "logit_bias.5"},
    {"{" P ",\"logit_bias\":{\"5\":1,\"5\":2}}", EV_CODE_BAD_VALUE, "logit_bias.5"},
};
#define N_BAD ((int)(sizeof bad_jobs / sizeof bad_jobs[0]))

static void test_bad_jobs(void **state)
{
    (void)state;
    assert_true(N_BAD >= 100);
    int failures = 0;
    for (int i = 0; i < N_BAD; i++) {
        struct job *j = (struct job *)1;
        struct job_fault f;
        struct rl_err err = {0};
        int rc = job_parse(bad_jobs[i].json, strlen(bad_jobs[i].json), NULL, &j, &f, &err);
        if (rc != -RL_EINVAL || j != NULL || f.code != bad_jobs[i].code ||
            strcmp(f.field, bad_jobs[i].field) || !err.msg[0]) {
            print_error("case %d: %s\n  want %s field \"%s\"\n  got rc %d %s field \"%s\": %s\n", i,
                        bad_jobs[i].json, ev_code_name(bad_jobs[i].code), bad_jobs[i].field, rc,
                        ev_code_name(f.code), f.field, err.msg);
            failures++;
        }
        job_free(rc ? NULL : j);
    }
    assert_int_equal(failures, 0);
}

static void test_messages_name_the_field(void **state)
{
    (void)state;
    const char *s = "{" P ",\"temperature\":2.5}";
    struct job *j = NULL;
    struct job_fault f;
    struct rl_err err = {0};
    assert_int_equal(job_parse(s, strlen(s), NULL, &j, &f, &err), -RL_EINVAL);
    assert_string_equal(err.msg, "temperature: 2.5 is out of range [0, 2]");
}

static void test_size_limit_and_no_entry(void **state)
{
    (void)state;
    struct job_opts o;
    job_opts_default(&o);
    o.max_job_bytes = 16;
    struct job *j = NULL;
    struct job_fault f;
    const char *s = "{\"prompt\":\"0123456789\"}";
    assert_int_equal(job_parse(s, strlen(s), &o, &j, &f, NULL), -RL_EINVAL);
    assert_int_equal(f.code, EV_CODE_JOB_TOO_LARGE);
    assert_int_equal(job_parse(NULL, 0, &o, &j, &f, NULL), -RL_EINVAL);
    assert_int_equal(f.code, EV_CODE_BAD_ENTRY);
    o.max_job_bytes = 1 << 20;
    o.max_max_tokens = 100;
    s = "{\"prompt\":\"x\",\"max_tokens\":101}";
    assert_int_equal(job_parse(s, strlen(s), &o, &j, &f, NULL), -RL_EINVAL);
    assert_int_equal(f.code, EV_CODE_OUT_OF_RANGE);
}

static struct job *ok(const char *s, const struct job_opts *o)
{
    struct job *j = NULL;
    struct job_fault f;
    struct rl_err err = {0};
    int rc = job_parse(s, strlen(s), o, &j, &f, &err);
    if (rc)
        fail_msg("%s: %s %s: %s", s, ev_code_name(f.code), f.field, err.msg);
    return j;
}

static void test_defaults(void **state)
{
    (void)state;
    struct job_opts o;
    job_opts_default(&o);
    o.fallback_id = "r1700000000000-3";
    struct job *j = ok("{\"prompt\":\"hello\"}", &o);
    assert_string_equal(j->id, "r1700000000000-3");
    assert_true(j->id_generated);
    assert_int_equal(j->input, JOB_INPUT_PROMPT);
    assert_string_equal(j->prompt, "hello");
    assert_int_equal(j->prompt_len, 5);
    assert_int_equal(j->mode, JOB_MODE_POOL);
    assert_int_equal(j->max_tokens, o.default_max_tokens);
    /* unset: the engine applies the model's defaults (issue 15, section 3) */
    assert_true(j->temperature == -1.0 && j->top_p == -1.0 && j->top_k == -1 && j->min_p == -1.0);
    assert_true(j->repetition_penalty == 1.0 && j->presence_penalty == 0.0);
    assert_false(j->has_seed);
    assert_int_equal(j->n_stop, 0);
    assert_int_equal(j->max_thinking_tokens, -1);
    assert_int_equal(j->logprobs, -1);
    assert_true(j->cache);
    assert_int_equal(j->stream_ttl_s, o.default_stream_ttl_s);
    assert_null(j->metadata);
    assert_int_equal(j->given, 0);
    assert_false(job_is_deterministic(j));
    assert_int_equal(job_mode_on(j, "think"), JOB_MODE_THINK);
    assert_int_equal(job_mode_on(j, "fast"), JOB_MODE_NO_THINK);
    job_free(j);

    /* no fallback: 32 random hex digits, different each time */
    struct job *a = ok("{\"prompt\":\"x\"}", NULL), *b = ok("{\"prompt\":\"x\"}", NULL);
    assert_int_equal(strlen(a->id), 32);
    assert_string_not_equal(a->id, b->id);
    job_free(a);
    job_free(b);
}

static const char *full_job =
    "{\"id\":\"job-1.a:b_C\",\"pool\":\"think\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"what is 2+2?\"}]},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
    "\"function\":{\"name\":\"add\",\"arguments\":\"{\\\"a\\\":2,\\\"b\\\":2}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"4\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"add\",\"description\":\"adds\","
    "\"parameters\":{\"type\":\"object\"},\"strict\":true}}],"
    "\"mode\":\"think\",\"max_tokens\":256,\"temperature\":0.6,\"top_p\":0.95,\"top_k\":20,"
    "\"min_p\":0.05,\"presence_penalty\":0.5,\"frequency_penalty\":-0.25,\"repetition_penalty\":1.1,"
    "\"seed\":9007199254740991,\"stop\":[\"</s>\",\"\\n\\n\"],\"ignore_eos\":true,"
    "\"max_thinking_tokens\":128,\"logprobs\":5,\"priority\":-7,\"deadline_ms\":1700000000123,"
    "\"cache\":false,\"stream_ttl_s\":60,\"metadata\":{\"user\":\"u1\",\"tags\":[1,{\"x\":null}]}}";

static void test_full_job(void **state)
{
    (void)state;
    struct job *j = ok(full_job, NULL);
    assert_string_equal(j->id, "job-1.a:b_C");
    assert_false(j->id_generated);
    assert_string_equal(j->pool, "think");
    assert_int_equal(j->input, JOB_INPUT_MESSAGES);
    assert_int_equal(cJSON_GetArraySize(j->messages), 4);
    assert_int_equal(cJSON_GetArraySize(j->tools), 1);
    assert_int_equal(j->mode, JOB_MODE_THINK);
    assert_int_equal(j->max_tokens, 256);
    assert_true(j->temperature == 0.6 && j->top_p == 0.95 && j->top_k == 20 && j->min_p == 0.05);
    assert_true(j->presence_penalty == 0.5 && j->frequency_penalty == -0.25);
    assert_true(j->repetition_penalty == 1.1);
    assert_true(j->has_seed);
    assert_true(j->seed == 9007199254740991ull);
    assert_int_equal(j->n_stop, 2);
    assert_string_equal(j->stop[1], "\n\n");
    assert_true(j->ignore_eos);
    assert_int_equal(j->max_thinking_tokens, 128);
    assert_int_equal(j->logprobs, 5);
    assert_int_equal(j->priority, -7);
    assert_true(j->deadline_ms == 1700000000123ll);
    assert_false(j->cache);
    assert_int_equal(j->stream_ttl_s, 60);
    assert_non_null(j->metadata);
    assert_true(job_is_deterministic(j));

    const char *pools[] = {"fast", "think"};
    struct job_fault f;
    assert_int_equal(job_check_pool(j, "think", pools, 2, &f, NULL), 0);
    assert_int_equal(job_check_pool(j, "fast", pools, 2, &f, NULL), -RL_EINVAL);
    assert_int_equal(f.code, EV_CODE_UNKNOWN_POOL);
    assert_int_equal(job_check_pool(j, "think", pools, 1, &f, NULL), -RL_EINVAL);
    assert_int_equal(f.code, EV_CODE_UNKNOWN_POOL);
    job_free(j);
    j = ok("{\"prompt\":\"x\"}", NULL);
    assert_int_equal(job_check_pool(j, "batch", pools, 2, &f, NULL), -RL_EINVAL);
    assert_int_equal(f.code, EV_CODE_UNKNOWN_POOL);
    assert_int_equal(job_check_pool(j, "fast", pools, 2, &f, NULL), 0);
    job_free(j);
}

/* Other accepted spellings: stop as one string, logprobs as a bool, 1.0
 * as an integer, a stream without a trailing NUL, whitespace. */
static void test_accepted_forms(void **state)
{
    (void)state;
    struct job *j = ok(" {\"prompt_ids\":[1, 2.0, 2147483647],\"stop\":\"END\",\"logprobs\":true,"
                       "\"max_tokens\":8.0,\"temperature\":0,\"cache\":true} \n", NULL);
    assert_int_equal(j->input, JOB_INPUT_IDS);
    assert_int_equal(j->n_prompt_ids, 3);
    assert_int_equal(j->prompt_ids[2], 2147483647);
    assert_int_equal(j->n_stop, 1);
    assert_string_equal(j->stop[0], "END");
    assert_int_equal(j->logprobs, 0);
    assert_int_equal(j->max_tokens, 8);
    assert_true(job_is_deterministic(j));
    job_free(j);

    char buf[] = "{\"prompt\":\"abc\"}XXXX";
    struct job *k = NULL;
    assert_int_equal(job_parse(buf, 16, NULL, &k, NULL, NULL), 0);
    assert_string_equal(k->prompt, "abc");
    job_free(k);

    j = ok("{\"messages\":[{\"role\":\"user\",\"content\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}],\"logprobs\":false}", NULL);
    assert_int_equal(j->logprobs, -1);
    job_free(j);
}

/* What each constraint parses into, and the rules across members that the
 * schema cannot say (tests/integration/test_schemas.py checks the rest). */
static void test_constraints(void **state)
{
    (void)state;
    struct job *j = ok("{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\","
                       "\"json_schema\":{\"name\":\"p\",\"schema\":{\"type\": \"integer\"}}}}", NULL);
    assert_int_equal(j->constraint, JOB_CONSTRAINT_JSON_SCHEMA);
    assert_string_equal(j->constraint_src, "{\"type\":\"integer\"}");
    job_free(j);
    j = ok("{\"prompt\":\"x\",\"response_format\":{\"type\":\"text\"}}", NULL);
    assert_int_equal(j->constraint, JOB_CONSTRAINT_NONE);
    job_free(j);
    j = ok("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":"
           "\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"required\"}", NULL);
    assert_int_equal(j->constraint, JOB_CONSTRAINT_TOOL_CALL);
    assert_string_equal(j->tool_name, "");
    assert_non_null(strstr(j->constraint_src, "\"name\":\"f\""));
    job_free(j);
    j = ok("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":"
           "\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"auto\"}", NULL);
    assert_int_equal(j->constraint, JOB_CONSTRAINT_NONE);
    job_free(j);
    static const struct {
        const char *job, *field, *msg;
    } bad_cases[] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":\"function\","
         "\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":"
         "{\"name\":\"g\"}}}", "tool_choice", "not among the tools"},
        {"{\"prompt\":\"x\",\"grammar\":\"root ::= \\\"a\\\"\",\"response_format\":{\"type\":"
         "\"json_object\"}}", "grammar", "only one constraint"},
    };
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        struct job *b = NULL;
        struct job_fault f;
        struct rl_err err = {0};
        assert_int_equal(job_parse(bad_cases[i].job, strlen(bad_cases[i].job), NULL, &b, &f, &err),
                         -RL_EINVAL);
        assert_int_equal(f.code, EV_CODE_BAD_PARAM);
        assert_string_equal(f.field, bad_cases[i].field);
        assert_non_null(strstr(err.msg, bad_cases[i].msg));
    }
    /* a schema over the size bound, and one nested past cJSON's reach */
    size_t n = JOB_CONSTRAINT_MAX + 100;
    char *big = malloc(n + 200);
    int at = snprintf(big, 200, "{\"id\":\"big\",\"prompt\":\"x\",\"response_format\":{\"type\":"
                      "\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"description\":\"");
    memset(big + at, 'x', n);
    strcpy(big + at + n, "\"}}}}");
    struct job *b = NULL;
    struct job_fault f;
    struct rl_err err = {0};
    assert_int_equal(job_parse(big, strlen(big), NULL, &b, &f, &err), -RL_EINVAL);
    assert_int_equal(f.code, EV_CODE_BAD_PARAM);
    assert_string_equal(f.field, "response_format.json_schema.schema");
    free(big);
    char *deep = malloc(8 * 1000 + 200);
    at = sprintf(deep, "{\"id\":\"deep-1\",\"prompt\":\"x\",\"response_format\":");
    for (int i = 0; i < 1000; i++)
        at += sprintf(deep + at, "{\"a\":");
    at += sprintf(deep + at, "1");
    for (int i = 0; i < 1000; i++)
        deep[at++] = '}';
    strcpy(deep + at, "}");
    assert_int_equal(job_parse(deep, strlen(deep), NULL, &b, &f, &err), -RL_EINVAL);
    assert_int_equal(f.code, EV_CODE_BAD_PARAM);
    assert_string_equal(f.field, "response_format");
    char id[JOB_ID_MAX + 1];
    job_guess_id(deep, strlen(deep), NULL, id); /* still answered on its own stream */
    assert_string_equal(id, "deep-1");
    free(deep);
}

static void test_round_trip(void **state)
{
    (void)state;
    const char *inputs[] = {full_job, "{\"id\":\"a\",\"prompt\":\"x\"}",
                            "{\"prompt_ids\":[5,6],\"logprobs\":false,\"seed\":0}",
                            "{\"id\":\"b\",\"prompt\":\"x\",\"mode\":\"auto\"}",
                            "{\"id\":\"l\",\"prompt\":\"x\",\"client_lease_ms\":5000}",
                            "{\"id\":\"f\",\"prompt\":\"x\",\"min_tokens\":3,"
                            "\"stop_token_ids\":[7,151643],\"logit_bias\":{\"10\":-100,\"0\":2.5},"
                            "\"skip_special_tokens\":false}",
                            "{\"id\":\"g\",\"prompt\":\"x\",\"stop_token_ids\":[],\"logit_bias\":{}}",
                            /* the constraints, as given */
                            "{\"id\":\"c\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\","
                            "\"json_schema\":{\"name\":\"p\",\"strict\":true,\"schema\":{\"type\":\"object\"}}}}",
                            "{\"id\":\"d\",\"prompt\":\"x\",\"grammar\":\"root ::= \\\"a\\\"\"}",
                            "{\"id\":\"e\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                            "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                            "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}"};
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
        struct job *a = ok(inputs[i], NULL);
        char *s1 = NULL, *s2 = NULL;
        assert_int_equal(job_to_json(a, &s1, NULL), 0);
        struct job *b = ok(s1, NULL);
        assert_int_equal(job_to_json(b, &s2, NULL), 0);
        assert_string_equal(s1, s2);
        assert_string_equal(a->id, b->id);
        assert_int_equal(a->given | JOB_F_ID, b->given); /* the id is always written */
        char k1[JOB_CACHE_KEY_LEN + 1], k2[JOB_CACHE_KEY_LEN + 1];
        int32_t ids[] = {1, 2, 3};
        assert_int_equal(job_cache_key(a, JOB_MODE_NO_THINK, "m", ids, 3, k1, NULL), 0);
        assert_int_equal(job_cache_key(b, JOB_MODE_NO_THINK, "m", ids, 3, k2, NULL), 0);
        assert_string_equal(k1, k2);
        free(s1);
        free(s2);
        job_free(a);
        job_free(b);
    }
}

/* mode "auto": the dispatcher's to decide; a worker runs it as if the
 * mode were absent (the pool's own), and it survives a round trip. */
static void test_mode_auto(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        enum job_mode mode;
        bool given;
        enum job_mode on_think, on_fast;
    } cases[] = {
        {"{\"prompt\":\"x\"}", JOB_MODE_POOL, false, JOB_MODE_THINK, JOB_MODE_NO_THINK},
        {"{\"prompt\":\"x\",\"mode\":\"auto\"}", JOB_MODE_AUTO, true, JOB_MODE_THINK, JOB_MODE_NO_THINK},
        {"{\"prompt\":\"x\",\"mode\":\"think\"}", JOB_MODE_THINK, true, JOB_MODE_THINK, JOB_MODE_THINK},
        {"{\"prompt\":\"x\",\"mode\":\"no_think\"}", JOB_MODE_NO_THINK, true, JOB_MODE_NO_THINK, JOB_MODE_NO_THINK},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct job *j = ok(cases[i].json, NULL);
        assert_int_equal(j->mode, cases[i].mode);
        assert_int_equal(!!(j->given & JOB_F_MODE), cases[i].given);
        assert_int_equal(job_mode_on(j, "think"), cases[i].on_think);
        assert_int_equal(job_mode_on(j, "fast"), cases[i].on_fast);
        char *s = NULL;
        assert_int_equal(job_to_json(j, &s, NULL), 0);
        assert_int_equal(strstr(s, "\"mode\":\"auto\"") != NULL, cases[i].mode == JOB_MODE_AUTO);
        free(s);
        job_free(j);
    }
    struct job_fault f;
    struct job *j = NULL;
    const char *bad_mode = "{\"prompt\":\"x\",\"mode\":\"Auto\"}";
    assert_int_equal(job_parse(bad_mode, strlen(bad_mode), NULL, &j, &f, NULL), -RL_EINVAL);
    assert_int_equal(f.code, EV_CODE_BAD_VALUE);
    assert_null(j);
}

static void key_of(const char *json, const char *model, const int32_t *ids, int n,
                   char out[JOB_CACHE_KEY_LEN + 1])
{
    struct job *j = ok(json, NULL);
    assert_int_equal(job_cache_key(j, JOB_MODE_NO_THINK, model, ids, n, out, NULL), 0);
    assert_int_equal(strlen(out), JOB_CACHE_KEY_LEN);
    job_free(j);
}

static void test_cache_key(void **state)
{
    (void)state;
    int32_t ids[] = {10, 20, 30}, ids2[] = {10, 20, 31};
    char base[65], k[65];
    key_of("{\"prompt\":\"x\",\"temperature\":0}", "qwen3-0.6b", ids, 3, base);
    /* what must not matter */
    const char *same[] = {
        "{\"prompt\":\"x\",\"temperature\":0,\"id\":\"other\"}",
        "{\"prompt\":\"x\",\"temperature\":0,\"priority\":5}",
        "{\"prompt\":\"x\",\"temperature\":0,\"metadata\":{\"a\":1}}",
        "{\"prompt\":\"x\",\"temperature\":0,\"stream_ttl_s\":5,\"cache\":true}",
        "{\"prompt\":\"x\",\"temperature\":-0.0}",
        "{\"prompt\":\"different text, same rendered ids\",\"temperature\":0}",
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        key_of(same[i], "qwen3-0.6b", ids, 3, k);
        assert_string_equal(k, base);
    }
    /* what must */
    const char *differ[] = {
        "{\"prompt\":\"x\",\"temperature\":0,\"max_tokens\":5}",
        "{\"prompt\":\"x\",\"temperature\":0.5}",
        "{\"prompt\":\"x\",\"temperature\":0,\"top_p\":0.9}",
        "{\"prompt\":\"x\",\"temperature\":0,\"top_k\":3}",
        "{\"prompt\":\"x\",\"temperature\":0,\"min_p\":0.1}",
        "{\"prompt\":\"x\",\"temperature\":0,\"presence_penalty\":0.1}",
        "{\"prompt\":\"x\",\"temperature\":0,\"frequency_penalty\":0.1}",
        "{\"prompt\":\"x\",\"temperature\":0,\"repetition_penalty\":1.1}",
        "{\"prompt\":\"x\",\"temperature\":0,\"seed\":0}",
        "{\"prompt\":\"x\",\"temperature\":0,\"stop\":\"a\"}",
        "{\"prompt\":\"x\",\"temperature\":0,\"stop\":[\"ab\"]}",
        "{\"prompt\":\"x\",\"temperature\":0,\"stop\":[\"a\",\"b\"]}",
        "{\"prompt\":\"x\",\"temperature\":0,\"ignore_eos\":true}",
        "{\"prompt\":\"x\",\"temperature\":0,\"max_thinking_tokens\":0}",
        "{\"prompt\":\"x\",\"temperature\":0,\"logprobs\":0}",
        "{\"prompt\":\"x\",\"temperature\":0,\"min_tokens\":2}",
        "{\"prompt\":\"x\",\"temperature\":0,\"stop_token_ids\":[5]}",
        "{\"prompt\":\"x\",\"temperature\":0,\"stop_token_ids\":[6]}",
        "{\"prompt\":\"x\",\"temperature\":0,\"logit_bias\":{\"5\":1}}",
        "{\"prompt\":\"x\",\"temperature\":0,\"logit_bias\":{\"5\":2}}",
        "{\"prompt\":\"x\",\"temperature\":0,\"logit_bias\":{\"6\":1}}",
        "{\"prompt\":\"x\",\"temperature\":0,\"skip_special_tokens\":false}",
        /* the constraint: its kind and its source */
        "{\"prompt\":\"x\",\"temperature\":0,\"response_format\":{\"type\":\"json_object\"}}",
        "{\"prompt\":\"x\",\"temperature\":0,\"response_format\":{\"type\":\"json_schema\","
        "\"json_schema\":{\"name\":\"a\",\"schema\":{\"type\":\"integer\"}}}}",
        "{\"prompt\":\"x\",\"temperature\":0,\"response_format\":{\"type\":\"json_schema\","
        "\"json_schema\":{\"name\":\"a\",\"schema\":{\"type\":\"string\"}}}}",
        "{\"prompt\":\"x\",\"temperature\":0,\"grammar\":\"root ::= \\\"a\\\"\"}",
    };
    char seen[sizeof differ / sizeof differ[0]][65];
    for (size_t i = 0; i < sizeof differ / sizeof differ[0]; i++) {
        key_of(differ[i], "qwen3-0.6b", ids, 3, seen[i]);
        assert_string_not_equal(seen[i], base);
        for (size_t k2 = 0; k2 < i; k2++)
            assert_string_not_equal(seen[i], seen[k2]);
    }
    key_of("{\"prompt\":\"x\",\"temperature\":0}", "qwen3-8b", ids, 3, k);
    assert_string_not_equal(k, base);
    /* the effective mode: unset fields take per-mode defaults, and a raw
     * prompt's ids do not say the mode */
    struct job *jm = ok("{\"prompt\":\"x\",\"temperature\":0}", NULL);
    assert_int_equal(job_cache_key(jm, JOB_MODE_THINK, "qwen3-0.6b", ids, 3, k, NULL), 0);
    assert_string_not_equal(k, base);
    job_free(jm);
    /* unset is not the value the card would give */
    char unset_k[65], given_k[65];
    key_of("{\"prompt\":\"x\",\"seed\":1}", "qwen3-0.6b", ids, 3, unset_k);
    key_of("{\"prompt\":\"x\",\"seed\":1,\"temperature\":0.7,\"top_p\":0.8,\"top_k\":20,"
           "\"min_p\":0}", "qwen3-0.6b", ids, 3, given_k);
    assert_string_not_equal(unset_k, given_k);
    key_of("{\"prompt\":\"x\",\"temperature\":0}", "qwen3-0.6b", ids2, 3, k);
    assert_string_not_equal(k, base);
    key_of("{\"prompt\":\"x\",\"temperature\":0}", "qwen3-0.6b", ids, 2, k);
    assert_string_not_equal(k, base);

    /* pinned (v4 since issue 29 added min_tokens, stop_token_ids and
     * logit_bias, skip_special_tokens): the key must be stable across builds and machines, since
     * every worker shares the cache; changing it needs a version bump */
    assert_string_equal(base, "b67a702e3a713d237b8ae4b2df6b3722fca89df832e11a39fa0fc53562b29f4c");
}

/* The shared corpus: schemas/examples/jobs-invalid.json holds bad jobs
 * (as strings) with code and field, and tests/integration/test_schemas.py
 * checks each also fails job.schema.json; jobs-valid.json must pass both.
 * So the C parser and the schema agree on the same documents. */
static void test_shared_corpus(void **state)
{
    (void)state;
    char *text = tu_slurp(tu_repo_file("schemas/examples/jobs-invalid.json"), NULL);
    if (!text)
        fail_msg("schemas/examples/jobs-invalid.json: cannot read");
    cJSON *arr = cJSON_Parse(text);
    assert_true(cJSON_GetArraySize(arr) >= 100);
    int i = 0, failures = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        const char *job = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "job"));
        const char *code = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "code"));
        const char *field = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "field"));
        assert_non_null(job);
        struct job *j = NULL;
        struct job_fault f;
        struct rl_err err = {0};
        int rc = job_parse(job, strlen(job), NULL, &j, &f, &err);
        if (rc != -RL_EINVAL || strcmp(ev_code_name(f.code), code) || strcmp(f.field, field)) {
            print_error("jobs-invalid.json[%d] %s: want %s \"%s\", got %s \"%s\"\n", i, job, code,
                        field, ev_code_name(f.code), f.field);
            failures++;
        }
        job_free(j);
    }
    cJSON_Delete(arr);
    free(text);
    assert_int_equal(failures, 0);

    text = tu_slurp(tu_repo_file("schemas/examples/jobs-valid.json"), NULL);
    assert_non_null(text);
    arr = cJSON_Parse(text);
    assert_true(cJSON_GetArraySize(arr) > 0);
    for (const cJSON *e = arr->child; e; e = e->next) {
        char *s = cJSON_PrintUnformatted(e);
        job_free(ok(s, NULL));
        free(s);
    }
    cJSON_Delete(arr);
    free(text);
}

/* Where a refused job's error goes: its own valid id, the fallback when it
 * names none, nowhere when it names a bad one or is not an object. */
static void test_guess_id(void **state)
{
    (void)state;
    static const struct {
        const char *raw, *fallback, *want;
    } cases[] = {
        {"{\"id\":\"job-1.a:b_c\",\"temperature\":9}", "r1-0", "job-1.a:b_c"},
        {"{\"temperature\":9}", "r1-0", "r1-0"},
        {"{\"temperature\":9}", NULL, ""},
        {"{\"id\":\"bad id\"}", "r1-0", ""},
        {"{\"id\":\"\"}", "r1-0", ""},
        {"{\"id\":7}", "r1-0", ""},
        {"[{\"id\":\"x\"}]", "r1-0", "r1-0"},
        {"not json", "r1-0", "r1-0"},
        /* an id cut at a NUL must never answer as the shorter id */
        {"{\"id\":\"req-42\\u0000zz\"}", "r1-0", ""},
        {"{\"prompt\":\"\\u0000\",\"id\":\"req-42\"}", "r1-0", "req-42"},
        {"{\"prompt\":\"\\\\u0000\",\"id\":\"req-43\"}", "r1-0", "req-43"},
        {NULL, "r1-0", "r1-0"},
        /* not JSON to cJSON, but the id is there: Python's NaN, a lone
         * surrogate, a typo after it (issue 26: errors where the client looks) */
        {"{\"id\": \"nan-1\", \"temperature\": NaN}", "r1-0", "nan-1"},
        {"{\"id\": \"s1\", \"prompt\": \"a\\ud800\"}", "r1-0", "s1"},
        {"{\"prompt_ids\": [1], \"id\": \"t1\" \"x\"}", "r1-0", "t1"},
        {"{\"a\": {\"id\": \"inner\"}, NaN}", "r1-0", "r1-0"},
        {"{\"id\": \"bad id\", NaN}", "r1-0", ""},
        /* the text ends inside a string, after a backslash (tests/fuzz/fuzz_job:
         * the scan stepped past the end and compared a byte beyond it) */
        {"{\"\\", "r1-0", "r1-0"},
        {"{\"prompt\":\"a\\", "r1-0", "r1-0"},
        {"{\"id\":\"\\", "r1-0", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[JOB_ID_MAX + 1] = "junk";
        /* the bytes alone, without a terminator: as a Redis reply's may
         * be, and so that make asan sees a read past them */
        size_t n = cases[i].raw ? strlen(cases[i].raw) : 0;
        char *raw = cases[i].raw ? malloc(n ? n : 1) : NULL;
        if (raw)
            memcpy(raw, cases[i].raw, n);
        job_guess_id(raw, n, cases[i].fallback, out);
        free(raw);
        if (strcmp(out, cases[i].want))
            fail_msg("case %zu: \"%s\", want \"%s\"", i, out, cases[i].want);
    }
    char long_id[JOB_ID_MAX + 20];
    snprintf(long_id, sizeof long_id, "{\"id\":\"%0*d\"}", JOB_ID_MAX + 1, 0);
    char out[JOB_ID_MAX + 1];
    job_guess_id(long_id, strlen(long_id), "r1-0", out);
    assert_string_equal(out, "");
    /* the same past cJSON (the scan's path): 128 is an id, 129 is none
     * (tests/fuzz/fuzz_job: the scan copied 129 bytes and their NUL into
     * the 129-byte answer, one byte past it) */
    for (int n = JOB_ID_MAX; n <= JOB_ID_MAX + 1; n++) {
        char raw[JOB_ID_MAX + 40];
        snprintf(raw, sizeof raw, "{\"prompt\":-\"hi\",\"id\":\"%0*d\"}", n, 7);
        struct { char out[JOB_ID_MAX + 1]; char canary[8]; } g;
        memset(g.canary, 'c', sizeof g.canary);
        job_guess_id(raw, strlen(raw), "r1-0", g.out);
        assert_int_equal(strlen(g.out), n == JOB_ID_MAX ? JOB_ID_MAX : 0);
        assert_memory_equal(g.canary, "cccccccc", 8);
    }
    /* an escaped backslash before "u0000" is text, not a NUL: accepted whole */
    const char *lit = "{\"prompt\":\"a\\\\u0000b\"}";
    struct job *j = NULL;
    struct rl_err err = {0};
    assert_int_equal(job_parse(lit, strlen(lit), NULL, &j, NULL, &err), 0);
    assert_string_equal(j->prompt, "a\\u0000b");
    job_free(j);
}

/* Tenant namespaces, job hashes and the sentences for Python's JSON. */
static void test_identity_helpers(void **state)
{
    (void)state;
    char out[JOB_ID_MAX + 1];
    assert_int_equal(job_tenant_id("acme", "req-1", out), 0);
    assert_string_equal(out, "acme:req-1");
    assert_int_equal(job_tenant_id("acme", "acme:req-1", out), 0); /* already in it */
    assert_string_equal(out, "acme:req-1");
    assert_int_equal(job_tenant_id("acme", "acme2:x", out), 0); /* another's: prefixed */
    assert_string_equal(out, "acme:acme2:x");
    char id[JOB_ID_MAX + 1];
    memset(id, 'a', JOB_ID_MAX - 4);
    id[JOB_ID_MAX - 4] = 0;
    assert_int_equal(job_tenant_id("acme", id, out), -1);
    assert_string_equal(out, "");
    assert_true(job_tenant_ok("client2") && job_tenant_ok("a_b-c"));
    assert_false(job_tenant_ok("") || job_tenant_ok("a:b") || job_tenant_ok("a.b") ||
                 job_tenant_ok("123456789012345678901234567890123"));
    char sha[JOB_SHA_LEN + 1];
    job_sha256("abc", 3, sha);
    assert_string_equal(sha, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    static const struct {
        const char *raw, *has;
    } msgs[] = {
        {"{\"id\":\"a\",\"temperature\":NaN}", "NaN at byte 24 is not a JSON number"},
        {"{\"id\":\"a\",\"top_p\":-Infinity}", "-Infinity at byte 18"},
        {"{\"id\":\"a\",\"top_p\":Infinity}", "Infinity at byte 18"},
        {"{\"id\":\"a\",\"prompt\":\"x\\ud800\"}", "lone UTF-16 surrogate (\\ud800)"},
        {"{\"id\":\"a\",\"prompt\":\"\\udc00\\ud800\"}", "lone UTF-16 surrogate (\\udc00)"},
    };
    for (size_t i = 0; i < sizeof msgs / sizeof msgs[0]; i++) {
        struct job *j = NULL;
        struct job_fault f;
        struct rl_err err = {0};
        assert_int_equal(job_parse(msgs[i].raw, strlen(msgs[i].raw), NULL, &j, &f, &err),
                         -RL_EINVAL);
        assert_int_equal(f.code, EV_CODE_INVALID_JSON);
        if (!strstr(err.msg, msgs[i].has))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err.msg, msgs[i].has);
    }
    /* a surrogate pair is one character, and fine */
    const char *pair = "{\"prompt\":\"\\ud83d\\ude00\"}";
    struct job *j = NULL;
    struct rl_err err = {0};
    assert_int_equal(job_parse(pair, strlen(pair), NULL, &j, NULL, &err), 0);
    assert_string_equal(j->prompt, "\xf0\x9f\x98\x80");
    job_free(j);
}

/* issue 29's fields land in the struct as given. */
static void test_issue29_fields(void **state)
{
    (void)state;
    struct job *j = ok("{\"prompt\":\"x\",\"min_tokens\":4,\"stop_token_ids\":[9,2],"
                       "\"logit_bias\":{\"151645\":-100,\"7\":0.5}}", NULL);
    assert_int_equal(j->min_tokens, 4);
    assert_int_equal(j->n_stop_ids, 2);
    assert_int_equal(j->stop_ids[0], 9);
    assert_int_equal(j->stop_ids[1], 2);
    assert_int_equal(j->n_bias, 2);
    assert_int_equal(j->bias_ids[0], 151645);
    assert_true(j->bias[0] == -100.0f);
    assert_int_equal(j->bias_ids[1], 7);
    assert_true(j->bias[1] == 0.5f);
    job_free(j);
    j = ok("{\"prompt\":\"x\"}", NULL);
    assert_int_equal(j->min_tokens, 0);
    assert_int_equal(j->n_stop_ids, 0);
    assert_int_equal(j->n_bias, 0);
    assert_true(j->skip_special);
    job_free(j);
    j = ok("{\"prompt\":\"x\",\"skip_special_tokens\":false}", NULL);
    assert_false(j->skip_special);
    job_free(j);
}

/* task "embed": what it keeps, what it writes back, and a cache key of
 * its own (an embedding must never answer a generating job, nor one of
 * other dimensions). */
static void test_embed_jobs(void **state)
{
    (void)state;
    struct job *j = ok("{\"prompt\":\"x\"}", NULL);
    assert_int_equal(j->task, JOB_TASK_GENERATE);
    assert_int_equal(j->dimensions, 0);
    assert_false(job_is_deterministic(j)); /* unset temperature: sampled */
    job_free(j);
    j = ok("{\"task\":\"embed\",\"prompt_ids\":[1,2],\"dimensions\":64,\"priority\":3}", NULL);
    assert_int_equal(j->task, JOB_TASK_EMBED);
    assert_int_equal(j->dimensions, 64);
    assert_int_equal(j->input, JOB_INPUT_IDS);
    assert_true(job_is_deterministic(j)); /* no sampling: cacheable */
    char *back = NULL;
    assert_int_equal(job_to_json(j, &back, NULL), 0);
    assert_non_null(strstr(back, "\"task\":\"embed\""));
    assert_non_null(strstr(back, "\"dimensions\":64"));
    struct job *j2 = ok(back, NULL);
    assert_int_equal(j2->task, JOB_TASK_EMBED);
    assert_int_equal(j2->dimensions, 64);
    free(back);
    job_free(j2);
    job_free(j);

    int32_t ids[] = {10, 20, 30};
    char gen[65], emb[65], emb64[65], emb32[65];
    key_of("{\"prompt\":\"x\",\"temperature\":0}", "m", ids, 3, gen);
    key_of("{\"prompt\":\"x\",\"task\":\"embed\"}", "m", ids, 3, emb);
    key_of("{\"prompt\":\"x\",\"task\":\"embed\",\"dimensions\":64}", "m", ids, 3, emb64);
    key_of("{\"prompt\":\"x\",\"task\":\"embed\",\"dimensions\":32}", "m", ids, 3, emb32);
    assert_string_not_equal(gen, emb);
    assert_string_not_equal(emb, emb64);
    assert_string_not_equal(emb64, emb32);
    /* "generate" spelt out is the default: the same key as before */
    char gen2[65];
    key_of("{\"prompt\":\"x\",\"temperature\":0,\"task\":\"generate\"}", "m", ids, 3, gen2);
    assert_string_equal(gen, gen2);
    /* normalize false: a key of its own; true spelt out is the default */
    char raw[65], unit[65];
    key_of("{\"prompt\":\"x\",\"task\":\"embed\",\"normalize\":false}", "m", ids, 3, raw);
    key_of("{\"prompt\":\"x\",\"task\":\"embed\",\"normalize\":true}", "m", ids, 3, unit);
    assert_string_not_equal(raw, emb);
    assert_string_equal(unit, emb);
    j = ok("{\"task\":\"embed\",\"prompt\":\"x\",\"normalize\":false}", NULL);
    assert_true(j->no_normalize);
    back = NULL;
    assert_int_equal(job_to_json(j, &back, NULL), 0);
    assert_non_null(strstr(back, "\"normalize\":false"));
    free(back);
    job_free(j);
    /* a generating job has nothing to normalize: refused by name */
    struct job_fault f;
    struct rl_err err = {0};
    const char *gn = "{\"prompt\":\"x\",\"normalize\":true}";
    assert_int_not_equal(job_parse(gn, strlen(gn), NULL, &j, &f, &err), 0);
    assert_string_equal(f.field, "normalize");
    const char *bt = "{\"task\":\"embed\",\"prompt\":\"x\",\"normalize\":1}";
    assert_int_not_equal(job_parse(bt, strlen(bt), NULL, &j, &f, &err), 0);
    assert_int_equal(f.code, EV_CODE_BAD_TYPE);
}

/* continue_final_message (vLLM's prefill): messages ending with the
 * assistant's, no constraint; written back only when true. */
static void test_continue_final(void **state)
{
    (void)state;
    struct job *j = ok("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":"
                       "\"assistant\",\"content\":\"{\"}],\"continue_final_message\":true}", NULL);
    assert_true(j->continue_final);
    char *back = NULL;
    assert_int_equal(job_to_json(j, &back, NULL), 0);
    assert_non_null(strstr(back, "\"continue_final_message\":true"));
    free(back);
    job_free(j);
    j = ok("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"continue_final_message\":false}",
           NULL);
    assert_false(j->continue_final);
    assert_int_equal(job_to_json(j, &back, NULL), 0);
    assert_null(strstr(back, "continue_final_message"));
    free(back);
    job_free(j);
    static const char *const refused[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"continue_final_message\":true}",
        "{\"prompt\":\"q\",\"continue_final_message\":true}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":"
        "\"{\"}],\"continue_final_message\":true,\"response_format\":{\"type\":\"json_object\"}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"continue_final_message\":1}",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        struct job_fault f;
        struct rl_err err = {0};
        if (!job_parse(refused[i], strlen(refused[i]), NULL, &j, &f, &err))
            fail_msg("accepted: %s", refused[i]);
        assert_string_equal(f.field, "continue_final_message");
    }
}

/* task "rerank": query, document and instruction kept and written back;
 * always cacheable, with a key of its own. */
static void test_rerank_jobs(void **state)
{
    (void)state;
    struct job *j = ok("{\"task\":\"rerank\",\"query\":\"q?\",\"document\":\"d.\","
                       "\"instruction\":\"find\"}", NULL);
    assert_int_equal(j->task, JOB_TASK_RERANK);
    assert_int_equal(j->input, JOB_INPUT_RERANK);
    assert_string_equal(j->query, "q?");
    assert_string_equal(j->document, "d.");
    assert_string_equal(j->instruction, "find");
    assert_true(job_is_deterministic(j));
    char *back = NULL;
    assert_int_equal(job_to_json(j, &back, NULL), 0);
    struct job *j2 = ok(back, NULL);
    assert_string_equal(j2->query, "q?");
    assert_string_equal(j2->document, "d.");
    assert_string_equal(j2->instruction, "find");
    free(back);
    job_free(j2);
    job_free(j);
    int32_t ids[] = {10, 20, 30};
    char gen[65], emb[65], rr[65];
    key_of("{\"prompt\":\"x\",\"temperature\":0}", "m", ids, 3, gen);
    key_of("{\"prompt\":\"x\",\"task\":\"embed\"}", "m", ids, 3, emb);
    key_of("{\"task\":\"rerank\",\"query\":\"a\",\"document\":\"b\"}", "m", ids, 3, rr);
    assert_string_not_equal(rr, gen);
    assert_string_not_equal(rr, emb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rerank_jobs),
        cmocka_unit_test(test_embed_jobs),
        cmocka_unit_test(test_continue_final),
        cmocka_unit_test(test_bad_jobs),
        cmocka_unit_test(test_messages_name_the_field),
        cmocka_unit_test(test_size_limit_and_no_entry),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_full_job),
        cmocka_unit_test(test_accepted_forms),
        cmocka_unit_test(test_constraints),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_mode_auto),
        cmocka_unit_test(test_cache_key),
        cmocka_unit_test(test_shared_corpus),
        cmocka_unit_test(test_guess_id),
        cmocka_unit_test(test_identity_helpers),
        cmocka_unit_test(test_issue29_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
