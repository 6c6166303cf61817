/* tests/unit/test_openai.c - the OpenAI conversion (dispatcher/openai.c):
 * requests -> job JSON, malformed requests -> status, code, param and
 * message, events -> SSE chunks and chat.completion objects, queue errors
 * -> HTTP statuses, and the API-key file. Literal case tables; the job
 * JSON and the chunks are compared byte for byte, since clients parse
 * exactly these bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "dispatcher/openai.h"
#include "job.h"
#include "sha256.h"

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define JMSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define ID "chatcmpl-1"

/* ---- requests that convert ---- */

static const struct {
    const char *body;
    const char *job;     /* exact job JSON */
    bool stream, include_usage, logprobs;
    int top_logprobs;
} good[] = {
    {"{\"model\":\"redlm\"," MSG "}", "{\"id\":\"" ID "\"," JMSG "}", false, false, false, 0},
    {"{" MSG "}", "{\"id\":\"" ID "\"," JMSG "}", false, false, false, 0},
    {"{" MSG ",\"stream\":true}", "{\"id\":\"" ID "\"," JMSG "}", true, false, false, 0},
    {"{" MSG ",\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
     "{\"id\":\"" ID "\"," JMSG "}", true, true, false, 0},
    {"{" MSG ",\"stream\":false,\"stream_options\":null}", "{\"id\":\"" ID "\"," JMSG "}", false,
     false, false, 0},
    /* sampling fields are copied as given, in document order */
    {"{\"temperature\":0.7,\"top_p\":0.9,\"seed\":42," MSG ",\"presence_penalty\":0.5,"
     "\"frequency_penalty\":-0.5}",
     "{\"id\":\"" ID "\",\"temperature\":0.7,\"top_p\":0.9,\"seed\":42,\"presence_penalty\":0.5,"
     "\"frequency_penalty\":-0.5," JMSG "}",
     false, false, false, 0},
    {"{" MSG ",\"top_k\":20,\"min_p\":0.05,\"repetition_penalty\":1.1,\"ignore_eos\":true}",
     "{\"id\":\"" ID "\",\"top_k\":20,\"min_p\":0.05,\"repetition_penalty\":1.1,\"ignore_eos\":true," JMSG "}",
     false, false, false, 0},
    {"{" MSG ",\"top_k\":-1}", "{\"id\":\"" ID "\"," JMSG "}", false, false, false, 0},
    {"{" MSG ",\"speculative\":false}", "{\"id\":\"" ID "\",\"speculative\":false," JMSG "}",
     false, false, false, 0},
    /* stop: a string or a list */
    {"{" MSG ",\"stop\":\"\\n\\n\"}", "{\"id\":\"" ID "\",\"stop\":\"\\n\\n\"," JMSG "}", false,
     false, false, 0},
    {"{" MSG ",\"stop\":[\"a\",\"b\"]}", "{\"id\":\"" ID "\",\"stop\":[\"a\",\"b\"]," JMSG "}",
     false, false, false, 0},
    /* max tokens: either name; max_completion_tokens wins */
    {"{" MSG ",\"max_tokens\":16}", "{\"id\":\"" ID "\"," JMSG ",\"max_tokens\":16}", false, false,
     false, 0},
    {"{" MSG ",\"max_completion_tokens\":8}", "{\"id\":\"" ID "\"," JMSG ",\"max_tokens\":8}",
     false, false, false, 0},
    {"{\"max_tokens\":100," MSG ",\"max_completion_tokens\":8}",
     "{\"id\":\"" ID "\"," JMSG ",\"max_tokens\":8}", false, false, false, 0},
    /* logprobs */
    {"{" MSG ",\"logprobs\":true}", "{\"id\":\"" ID "\"," JMSG ",\"logprobs\":0}", false, false,
     true, 0},
    {"{" MSG ",\"logprobs\":true,\"top_logprobs\":3}", "{\"id\":\"" ID "\"," JMSG ",\"logprobs\":3}",
     false, false, true, 3},
    {"{" MSG ",\"logprobs\":false}", "{\"id\":\"" ID "\"," JMSG "}", false, false, false, 0},
    /* thinking switch: vLLM's chat_template_kwargs or redlm's mode */
    {"{" MSG ",\"chat_template_kwargs\":{\"enable_thinking\":false}}",
     "{\"id\":\"" ID "\"," JMSG ",\"mode\":\"no_think\"}", false, false, false, 0},
    {"{" MSG ",\"chat_template_kwargs\":{\"enable_thinking\":true}}",
     "{\"id\":\"" ID "\"," JMSG ",\"mode\":\"think\"}", false, false, false, 0},
    {"{" MSG ",\"mode\":\"think\"}", "{\"id\":\"" ID "\"," JMSG ",\"mode\":\"think\"}", false,
     false, false, 0},
    {"{" MSG ",\"mode\":\"no_think\",\"chat_template_kwargs\":{\"enable_thinking\":false}}",
     "{\"id\":\"" ID "\"," JMSG ",\"mode\":\"no_think\"}", false, false, false, 0},
    /* tools, and tool_choice none drops them */
    {"{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
     "\"tool_choice\":\"auto\",\"parallel_tool_calls\":true}",
     "{\"id\":\"" ID "\"," JMSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
     "\"parameters\":{}}}],\"tool_choice\":\"auto\"}",
     false, false, false, 0},
    {"{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"none\"}",
     "{\"id\":\"" ID "\"," JMSG "}", false, false, false, 0},
    /* nulls are absent; n 1, user, response_format text, empty logit_bias are fine */
    {"{" MSG ",\"temperature\":null,\"stop\":null,\"tools\":null,\"n\":1,\"user\":\"u\","
     "\"response_format\":{\"type\":\"text\"},\"logit_bias\":{}}",
     "{\"id\":\"" ID "\"," JMSG ",\"response_format\":{\"type\":\"text\"}}", false, false,
     false, 0},
    /* structured output: the job's own fields, passed through */
    {"{" MSG ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\","
     "\"schema\":{\"type\":\"integer\"}}}}",
     "{\"id\":\"" ID "\"," JMSG ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
     "{\"name\":\"p\",\"schema\":{\"type\":\"integer\"}}}}", false, false, false, 0},
    {"{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
     "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}",
     "{\"id\":\"" ID "\"," JMSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
     "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}", false, false, false, 0},
    /* what the SDKs echo back in an assistant turn */
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\","
     "\"refusal\":null,\"audio\":null,\"function_call\":null,\"tool_calls\":null,\"annotations\":[]},"
     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"more\"}]}]}",
     "{\"id\":\"" ID "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
     "\"content\":\"yo\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"more\"}]}]}",
     false, false, false, 0},
    {"{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
     "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
     "\"tool_call_id\":\"c1\",\"content\":\"42\"}]}",
     "{\"id\":\"" ID "\",\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
     "\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":"
     "\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}]}",
     false, false, false, 0},
};

static void test_good_requests(void **state)
{
    (void)state;
    struct oai_limits lim;
    oai_limits_default(&lim);
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        struct oai_request r;
        struct oai_error e;
        int rc = oai_parse_request(good[i].body, strlen(good[i].body), &lim, ID, 0, &r, &e);
        if (rc)
            fail_msg("case %zu: %s -> %d %s %s", i, good[i].body, e.status, e.code, e.message);
        if (strcmp(r.job, good[i].job))
            fail_msg("case %zu:\n got  %s\n want %s", i, r.job, good[i].job);
        assert_int_equal(r.job_len, strlen(good[i].job));
        assert_int_equal(r.stream, good[i].stream);
        assert_int_equal(r.include_usage, good[i].include_usage);
        assert_int_equal(r.logprobs, good[i].logprobs);
        assert_int_equal(r.top_logprobs, good[i].top_logprobs);
        oai_request_clear(&r);
    }
}

/* Without a served_model_name (lim.model NULL) the request's model goes
 * into the job for the dispatcher to route by, and is kept for the echo;
 * with one, another name is a 404 and the job carries none. */
static void test_model_into_job(void **state)
{
    (void)state;
    struct oai_limits lim;
    oai_limits_default(&lim);
    lim.model = NULL;
    struct oai_request r;
    struct oai_error e;
    const char *body = "{\"model\":\"Qwen/Qwen3-14B\",\"messages\":[{\"role\":\"user\","
                       "\"content\":\"Hi\"}]}";
    assert_int_equal(oai_parse_request(body, strlen(body), &lim, ID, 0, &r, &e), 0);
    assert_string_equal(r.model, "Qwen/Qwen3-14B");
    assert_non_null(strstr(r.job, "\"model\":\"Qwen/Qwen3-14B\""));
    oai_request_clear(&r);
    const char *none = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}";
    assert_int_equal(oai_parse_request(none, strlen(none), &lim, ID, 0, &r, &e), 0);
    assert_string_equal(r.model, "");
    assert_null(strstr(r.job, "\"model\""));
    oai_request_clear(&r);
    const char *bad = "{\"model\":\"with space\",\"messages\":[{\"role\":\"user\","
                      "\"content\":\"Hi\"}]}";
    assert_int_not_equal(oai_parse_request(bad, strlen(bad), &lim, ID, 0, &r, &e), 0);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "model");
    lim.model = "qwen3-8b";
    assert_int_not_equal(oai_parse_request(body, strlen(body), &lim, ID, 0, &r, &e), 0);
    assert_int_equal(e.status, 404);
    assert_string_equal(e.code, "model_not_found");
    const char *same = "{\"model\":\"qwen3-8b\",\"messages\":[{\"role\":\"user\","
                       "\"content\":\"Hi\"}]}";
    assert_int_equal(oai_parse_request(same, strlen(same), &lim, ID, 0, &r, &e), 0);
    assert_null(strstr(r.job, "\"model\""));
    oai_request_clear(&r);
    /* lim.adapters (the front door with served_model_name): another name
     * may be a LoRA adapter of it, so it goes into the job for the host to
     * check; the served name still carries none */
    lim.adapters = true;
    const char *lora = "{\"model\":\"sql-lora\",\"messages\":[{\"role\":\"user\","
                       "\"content\":\"Hi\"}]}";
    assert_int_equal(oai_parse_request(lora, strlen(lora), &lim, ID, 0, &r, &e), 0);
    assert_string_equal(r.model, "sql-lora");
    assert_non_null(strstr(r.job, "\"model\":\"sql-lora\""));
    oai_request_clear(&r);
    assert_int_equal(oai_parse_request(same, strlen(same), &lim, ID, 0, &r, &e), 0);
    assert_string_equal(r.model, "");
    assert_null(strstr(r.job, "\"model\""));
    oai_request_clear(&r);
    assert_int_not_equal(oai_parse_request(bad, strlen(bad), &lim, ID, 0, &r, &e), 0);
    assert_int_equal(e.status, 400);
}

static void test_deadline_written(void **state)
{
    (void)state;
    struct oai_request r;
    struct oai_error e;
    const char *b = "{" MSG "}";
    assert_int_equal(oai_parse_request(b, strlen(b), NULL, "x1", 1700000000123, &r, &e), 0);
    assert_string_equal(r.job, "{\"id\":\"x1\"," JMSG ",\"deadline_ms\":1700000000123}");
    oai_request_clear(&r);
}

/* ---- requests that are refused ---- */

static const struct {
    const char *body;
    int status;
    const char *code, *param, *message; /* message: a prefix of the sentence */
} bad[] = {
    /* the text */
    {"", 400, "INVALID_JSON", "", "body: not valid JSON"},
    {"{", 400, "INVALID_JSON", "", "body: not valid JSON"},
    {"{" MSG "} x", 400, "INVALID_JSON", "", "body: not valid JSON"},
    {"{" MSG ",\"max_tokens\":01}", 400, "INVALID_JSON", "", "body: not valid JSON (at byte"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", 400, "BAD_UTF8", "",
     "body: invalid UTF-8 at byte 39"},
    {"[]", 400, "NOT_OBJECT", "", "body: must be a JSON object"},
    {"\"hi\"", 400, "NOT_OBJECT", "", "body: must be a JSON object"},
    /* members */
    {"{" MSG ",\"temprature\":1}", 400, "UNKNOWN_FIELD", "temprature", "temprature: unknown"},
    {"{" MSG ",\"functions\":[]}", 400, "UNKNOWN_FIELD", "functions", "functions: unknown"},
    {"{" MSG ",\"seed\":1,\"seed\":2}", 400, "DUPLICATE_FIELD", "seed", "seed: given twice"},
    {"{\"model\":\"gpt-4o\"," MSG "}", 404, "model_not_found", "model", "The model `gpt-4o` does not exist"},
    {"{\"model\":7," MSG "}", 400, "BAD_TYPE", "model", "model: must be a string"},
    {"{}", 400, "MISSING_FIELD", "messages", "messages: required"},
    {"{\"messages\":null}", 400, "MISSING_FIELD", "messages", "messages: required"},
    {"{\"messages\":{}}", 400, "BAD_TYPE", "messages", "messages: must be an array"},
    {"{\"messages\":[]}", 400, "OUT_OF_RANGE", "messages", "messages:"},
    {"{" MSG ",\"stream\":\"yes\"}", 400, "BAD_TYPE", "stream", "stream: must be true or false"},
    {"{" MSG ",\"stream_options\":{\"include_usage\":true}}", 400, "BAD_VALUE", "stream_options",
     "stream_options: only allowed when stream is true"},
    {"{" MSG ",\"stream\":true,\"stream_options\":{\"x\":1}}", 400, "UNKNOWN_FIELD",
     "stream_options.x", "stream_options.x: unknown"},
    {"{" MSG ",\"stream\":true,\"stream_options\":[]}", 400, "BAD_TYPE", "stream_options",
     "stream_options: must be an object"},
    {"{" MSG ",\"max_tokens\":0}", 400, "OUT_OF_RANGE", "max_tokens",
     "max_tokens: 0 is out of range [1, 32768]"},
    {"{" MSG ",\"max_tokens\":32769}", 400, "OUT_OF_RANGE", "max_tokens",
     "max_tokens: 32769 is out of range [1, 32768]"},
    {"{" MSG ",\"max_tokens\":1.5}", 400, "BAD_TYPE", "max_tokens", "max_tokens: must be an integer"},
    {"{" MSG ",\"max_tokens\":\"9\"}", 400, "BAD_TYPE", "max_tokens", "max_tokens: must be an integer"},
    {"{" MSG ",\"max_completion_tokens\":-3}", 400, "OUT_OF_RANGE", "max_completion_tokens",
     "max_completion_tokens: -3 is out of range"},
    {"{" MSG ",\"n\":0}", 400, "OUT_OF_RANGE", "n", "n: 0 is out of range [1, 64]"},
    {"{" MSG ",\"n\":65}", 400, "OUT_OF_RANGE", "n", "n: 65 is out of range [1, 64]"},
    {"{" MSG ",\"n\":\"1\"}", 400, "BAD_TYPE", "n", "n: must be an integer"},
    {"{" MSG ",\"logprobs\":1}", 400, "BAD_TYPE", "logprobs", "logprobs: must be true or false"},
    {"{" MSG ",\"top_logprobs\":2}", 400, "BAD_VALUE", "top_logprobs",
     "top_logprobs: requires logprobs: true"},
    {"{" MSG ",\"logprobs\":true,\"top_logprobs\":21}", 400, "OUT_OF_RANGE", "top_logprobs",
     "top_logprobs: 21 is out of range [0, 20]"},
    {"{" MSG ",\"tool_choice\":\"required\"}", 400, "BAD_PARAM", "tool_choice",
     "tool_choice: forces a tool call but the job gives no tools"},
    {"{" MSG ",\"tool_choice\":{\"type\":\"function\"}}", 400, "MISSING_FIELD",
     "tool_choice.function", "tool_choice.function: required"},
    {"{" MSG ",\"parallel_tool_calls\":1}", 400, "BAD_TYPE", "parallel_tool_calls",
     "parallel_tool_calls: must be true or false"},
    {"{" MSG ",\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}}", 400, "BAD_TYPE",
     "chat_template_kwargs.enable_thinking", "chat_template_kwargs.enable_thinking: must be"},
    {"{" MSG ",\"chat_template_kwargs\":{\"thinking\":true}}", 400, "UNKNOWN_FIELD",
     "chat_template_kwargs.thinking", "chat_template_kwargs.thinking: unknown"},
    {"{" MSG ",\"chat_template_kwargs\":true}", 400, "BAD_TYPE", "chat_template_kwargs",
     "chat_template_kwargs: must be an object"},
    {"{" MSG ",\"mode\":\"think\",\"chat_template_kwargs\":{\"enable_thinking\":false}}", 400,
     "BAD_VALUE", "mode", "mode: \"think\" contradicts"},
    {"{" MSG ",\"user\":5}", 400, "BAD_TYPE", "user", "user: must be a string"},
    {"{" MSG ",\"response_format\":{\"type\":\"yaml\"}}", 400, "BAD_PARAM",
     "response_format.type", "response_format.type: \"yaml\" is not one of"},
    {"{" MSG ",\"logit_bias\":{\"x\":-100}}", 400, "BAD_VALUE", "logit_bias.x",
     "logit_bias: key \"x\" is not a token id"},
    {"{" MSG ",\"logit_bias\":{\"5\":-101}}", 400, "OUT_OF_RANGE", "logit_bias.5", "logit_bias.5"},
    {"{" MSG ",\"logit_bias\":[5]}", 400, "BAD_TYPE", "logit_bias", "logit_bias: must be an object"},
    {"{" MSG ",\"min_tokens\":-1}", 400, "OUT_OF_RANGE", "min_tokens", "min_tokens"},
    {"{" MSG ",\"stop_token_ids\":[1,\"2\"]}", 400, "BAD_TYPE", "stop_token_ids[1]",
     "stop_token_ids[1]"},
    /* fields job_parse checks, named as the client wrote them */
    {"{" MSG ",\"temperature\":2.5}", 400, "OUT_OF_RANGE", "temperature",
     "temperature: 2.5 is out of range"},
    {"{" MSG ",\"temperature\":\"hot\"}", 400, "BAD_TYPE", "temperature", "temperature:"},
    {"{" MSG ",\"top_p\":0}", 400, "OUT_OF_RANGE", "top_p", "top_p:"},
    {"{" MSG ",\"seed\":-1}", 400, "OUT_OF_RANGE", "seed", "seed:"},
    {"{" MSG ",\"top_k\":-2}", 400, "OUT_OF_RANGE", "top_k", "top_k:"},
    {"{" MSG ",\"stop\":[\"\"]}", 400, "OUT_OF_RANGE", "stop[0]", "stop[0]:"},
    {"{" MSG ",\"stop\":5}", 400, "BAD_TYPE", "stop", "stop:"},
    {"{" MSG ",\"mode\":\"deep\"}", 400, "BAD_VALUE", "mode", "mode:"},
    {"{\"messages\":[{\"role\":\"wizard\",\"content\":\"hi\"}]}", 400, "BAD_VALUE",
     "messages[0].role", "messages[0].role:"},
    {"{\"messages\":[{\"content\":\"hi\"}]}", 400, "MISSING_FIELD", "messages[0].role",
     "messages[0].role:"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
     400, "UNKNOWN_FIELD", "messages[0].content[0].image_url", "messages[0].content[0].image_url:"},
    {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\",\"temperature\":1}]}", 400,
     "UNKNOWN_FIELD", "messages[0].temperature", "messages[0].temperature:"},
    {"{" MSG ",\"tools\":[{\"type\":\"function\"}]}", 400, "MISSING_FIELD", "tools[0].function",
     "tools[0].function:"},
    {"{" MSG ",\"tools\":{}}", 400, "BAD_TYPE", "tools", "tools:"},
};

static void test_bad_requests(void **state)
{
    (void)state;
    struct oai_limits lim;
    oai_limits_default(&lim);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct oai_request r;
        struct oai_error e;
        int rc = oai_parse_request(bad[i].body, strlen(bad[i].body), &lim, ID, 0, &r, &e);
        if (rc != -RL_EINVAL)
            fail_msg("case %zu: %s accepted: %s", i, bad[i].body, r.job);
        assert_null(r.job);
        if (e.status != bad[i].status || (bad[i].code[0] && strcmp(e.code, bad[i].code)) ||
            strcmp(e.param, bad[i].param) ||
            strncmp(e.message, bad[i].message, strlen(bad[i].message)))
            fail_msg("case %zu: %s\n got  %d %s [%s] %s\n want %d %s [%s] %s", i, bad[i].body,
                     e.status, e.code, e.param, e.message, bad[i].status, bad[i].code,
                     bad[i].param, bad[i].message);
        assert_string_equal(e.type, bad[i].status == 404 ? "invalid_request_error"
                                                        : "invalid_request_error");
    }
}

static void test_limits(void **state)
{
    (void)state;
    struct oai_limits lim;
    oai_limits_default(&lim);
    lim.max_body_bytes = 64;
    lim.max_messages = 2;
    lim.max_tokens = 10;
    lim.model = "qwen3-0.6b";
    struct oai_request r;
    struct oai_error e;
    char big[200];
    memset(big, ' ', sizeof big);
    memcpy(big, "{" MSG "}", strlen("{" MSG "}"));
    assert_int_equal(oai_parse_request(big, sizeof big, &lim, ID, 0, &r, &e), -RL_EINVAL);
    assert_int_equal(e.status, 413);
    assert_string_equal(e.code, "JOB_TOO_LARGE");
    assert_string_equal(e.message, "body: 200 bytes is over the limit of 64");
    const char *three = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
                        "\"content\":\"b\"},{\"role\":\"user\",\"content\":\"c\"}]}";
    lim.max_body_bytes = 4096;
    assert_int_equal(oai_parse_request(three, strlen(three), &lim, ID, 0, &r, &e), -RL_EINVAL);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "messages");
    assert_string_equal(e.message, "messages: 3 messages is over the limit of 2");
    const char *mt = "{" MSG ",\"max_tokens\":11}";
    assert_int_equal(oai_parse_request(mt, strlen(mt), &lim, ID, 0, &r, &e), -RL_EINVAL);
    assert_string_equal(e.message, "max_tokens: 11 is out of range [1, 10]");
    const char *ok = "{\"model\":\"qwen3-0.6b\"," MSG ",\"max_tokens\":10}";
    assert_int_equal(oai_parse_request(ok, strlen(ok), &lim, ID, 0, &r, &e), 0);
    oai_request_clear(&r);
    /* the job's own size limit, below the body's: 413 from job_parse */
    struct job_opts jo;
    job_opts_default(&jo);
    jo.max_job_bytes = 40;
    lim.job = &jo;
    assert_int_equal(oai_parse_request(ok, strlen(ok), &lim, ID, 0, &r, &e), -RL_EINVAL);
    assert_int_equal(e.status, 413);
    assert_string_equal(e.code, "JOB_TOO_LARGE");
}

static void test_error_json(void **state)
{
    (void)state;
    struct oai_error e;
    oai_error_set(&e, 400, "invalid_request_error", "OUT_OF_RANGE", "temperature",
                  "temperature: 2.5 is out of range [0, 2]");
    char *s = oai_error_json(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"temperature: 2.5 is out of range [0, 2]\","
                           "\"type\":\"invalid_request_error\",\"param\":\"temperature\","
                           "\"code\":\"OUT_OF_RANGE\"}}");
    free(s);
    oai_error_set(&e, 500, "server_error", NULL, NULL, "a \"quoted\" thing");
    s = oai_error_json(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"a \\\"quoted\\\" thing\",\"type\":"
                           "\"server_error\",\"param\":null,\"code\":null}}");
    free(s);
}

/* ---- queue error events -> HTTP ---- */

static const struct {
    const char *code, *message;
    int64_t retry_after_ms;
    int status;
    const char *out_code, *param;
    int retry_after_s;
} ev_errors[] = {
    {"OVERLOADED", "pool think has 500 waiting", 2500, 503, "OVERLOADED", "", 3},
    {"OVERLOADED", "busy", 0, 503, "OVERLOADED", "", 1},
    {"OVERLOADED", "busy", 1000, 503, "OVERLOADED", "", 1},
    {"PROMPT_TOO_LONG", "prompt has 50000 tokens; the model's context is 40960", 0, 400,
     "context_length_exceeded", "messages", 0},
    {"TEMPLATE_ERROR", "messages[1]: a tool message must follow a tool call", 0, 400,
     "TEMPLATE_ERROR", "messages[1]", 0},
    {"OUT_OF_RANGE", "temperature: 2.5 is out of range [0, 2]", 0, 400, "OUT_OF_RANGE",
     "temperature", 0},
    {"MISSING_PROMPT", "job: one of messages, prompt or prompt_ids is required", 0, 400,
     "MISSING_PROMPT", "", 0},
    {"UNKNOWN_POOL", "pool: no such pool", 0, 400, "UNKNOWN_POOL", "pool", 0},
    {"JOB_TOO_LARGE", "job: 5000000 bytes is over the limit", 0, 413, "JOB_TOO_LARGE", "", 0},
    {"DEADLINE_EXCEEDED", "deadline passed before admission", 0, 504, "DEADLINE_EXCEEDED", "", 0},
    {"ENGINE_ERROR", "the backend failed", 0, 500, "ENGINE_ERROR", "", 0},
    {"INTERNAL", "bug", 0, 500, "INTERNAL", "", 0},
    {"TOO_MANY_DELIVERIES", "delivered 4 times", 0, 500, "TOO_MANY_DELIVERIES", "", 0},
    {"SOMETHING_NEW", "a code from the future", 0, 500, "SOMETHING_NEW", "", 0},
    {"MODEL_NOT_FOUND", "model: \"x\" is not served; served: a, b", 0, 404, "model_not_found",
     "model", 0},
    {"MODEL_REQUIRED", "model: several models are served (a, b); the job must name one", 0,
     400, "MODEL_REQUIRED", "model", 0},
};

static void test_event_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof ev_errors / sizeof ev_errors[0]; i++) {
        struct oai_error e;
        oai_error_from_event(ev_errors[i].code, ev_errors[i].message, ev_errors[i].retry_after_ms,
                             &e);
        if (e.status != ev_errors[i].status || strcmp(e.code, ev_errors[i].out_code) ||
            strcmp(e.param, ev_errors[i].param) || e.retry_after_s != ev_errors[i].retry_after_s ||
            strcmp(e.message, ev_errors[i].message))
            fail_msg("case %zu (%s): got %d %s [%s] retry %d", i, ev_errors[i].code, e.status,
                     e.code, e.param, e.retry_after_s);
    }
}

/* ---- events -> chunks ---- */

#define DONE_EV(seq, fr, tc)                                                                    \
    "{\"seq\":" #seq ",\"type\":\"done\",\"finish_reason\":\"" fr "\",\"usage\":{\"prompt_tokens\":"  \
    "12,\"completion_tokens\":5,\"reasoning_tokens\":2,\"cached_prompt_tokens\":8},\"cached\":false," \
    "\"timings\":{\"queue_ms\":1,\"ttft_ms\":2,\"total_ms\":3},\"tool_calls\":" tc "}"
#define HEAD "data: {\"id\":\"" ID "\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"redlm\",\"choices\":[{\"index\":0,"
#define USAGE "\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5,\"total_tokens\":17,\"prompt_tokens_details\":{\"cached_tokens\":8},\"completion_tokens_details\":{\"reasoning_tokens\":2}}"

/* A stream of events, fed one by one: what each adds to the SSE bytes. */
struct step {
    const char *event;
    int ret;
    const char *sse; /* exactly the bytes this event adds */
};

static void run_steps(const struct oai_request *req, const struct step *steps, int n,
                      const char *what)
{
    struct oai_resp *r;
    assert_int_equal(oai_resp_create(&r, ID, "redlm", 1700000000, req, NULL), 0);
    struct text b = {0};
    for (int i = 0; i < n; i++) {
        size_t before = b.n;
        struct oai_error e;
        int rc = oai_resp_feed(r, steps[i].event, strlen(steps[i].event), &b, &e);
        if (rc != steps[i].ret)
            fail_msg("%s step %d: returned %d, want %d (%s)", what, i, rc, steps[i].ret, e.message);
        size_t add = b.n - before;
        if (add != strlen(steps[i].sse) || (add && memcmp(b.p + before, steps[i].sse, add)))
            fail_msg("%s step %d:\n got  %.*s\n want %s", what, i, (int)add, b.p ? b.p + before : "",
                     steps[i].sse);
    }
    text_free(&b);
    oai_resp_free(r);
}

static void test_stream_chunks(void **state)
{
    (void)state;
    struct oai_request req = {.stream = true};
    const struct step plain[] = {
        {"{\"seq\":0,\"type\":\"delta\",\"delta\":{\"reasoning_content\":\"Let me\"},\"token_ids\":[1,2]}",
         OAI_MORE,
         HEAD "\"delta\":{\"role\":\"assistant\",\"reasoning_content\":\"Let me\",\"reasoning\":\"Let me\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"},
        {"{\"seq\":1,\"type\":\"delta\",\"delta\":{},\"token_ids\":[3]}", OAI_MORE, ""},
        {"{\"seq\":2,\"type\":\"delta\",\"delta\":{\"content\":\"Hi \\\"x\\\"\\n\"},\"token_ids\":[4]}",
         OAI_MORE,
         HEAD "\"delta\":{\"content\":\"Hi \\\"x\\\"\\n\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"},
        {DONE_EV(3, "stop", "[]"), OAI_END,
         HEAD "\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null}]}\n\ndata: [DONE]\n\n"},
        {"{\"seq\":4,\"type\":\"delta\",\"delta\":{\"content\":\"late\"},\"token_ids\":[5]}", OAI_END, ""},
    };
    run_steps(&req, plain, 5, "plain");

    /* include_usage: usage null on every chunk, then the usage chunk */
    struct oai_request ureq = {.stream = true, .include_usage = true};
    const struct step usage[] = {
        {"{\"seq\":0,\"type\":\"delta\",\"delta\":{\"content\":\"a\"},\"token_ids\":[1]}", OAI_MORE,
         HEAD "\"delta\":{\"role\":\"assistant\",\"content\":\"a\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n"},
        {DONE_EV(1, "length", "[]"), OAI_END,
         HEAD "\"delta\":{},\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}],\"usage\":null}\n\n"
         "data: {\"id\":\"" ID "\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"redlm\",\"choices\":[]," USAGE "}\n\n"
         "data: [DONE]\n\n"},
    };
    run_steps(&ureq, usage, 2, "usage");

    /* a done with nothing before it still says who speaks; tool calls get
     * their own chunk with indices and finish_reason tool_calls */
    const struct step tools[] = {
        {DONE_EV(0, "stop", "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]"),
         OAI_END,
         HEAD "\"delta\":{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"call_1_0\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"},\"index\":0}]},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
         HEAD "\"delta\":{},\"logprobs\":null,\"finish_reason\":\"tool_calls\",\"stop_reason\":null}]}\n\ndata: [DONE]\n\n"},
    };
    run_steps(&req, tools, 1, "tools");

    /* tool calls streamed (issue 29): the worker's delta.tool_calls become a
     * chunk that opens the call (id, type, name, arguments "") and one per
     * fragment; done sends only what the fragments lacked (here: nothing
     * for call 0, the tail for call 1) and call 2, never streamed, whole */
#define TC_EV(seq, tc) "{\"seq\":" #seq ",\"type\":\"delta\",\"delta\":{\"tool_calls\":" tc "},\"token_ids\":[1]}"
#define TC_CHUNK(tc) HEAD "\"delta\":{\"tool_calls\":" tc "},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
    const struct step streamed[] = {
        {"{\"seq\":0,\"type\":\"delta\",\"delta\":{\"content\":\"\"},\"token_ids\":[1]}", OAI_MORE,
         HEAD "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"},
        {TC_EV(1, "[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": \"}}]"),
         OAI_MORE,
         TC_CHUNK("[{\"index\":0,\"id\":\"call_1_0\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]")
         TC_CHUNK("[{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\\\": \"}}]")},
        {TC_EV(2, "[{\"index\":0,\"function\":{\"arguments\":\"1}\"}},{\"index\":1,\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{\"}}]"),
         OAI_MORE,
         TC_CHUNK("[{\"index\":0,\"function\":{\"arguments\":\"1}\"}}]")
         TC_CHUNK("[{\"index\":1,\"id\":\"call_1_1\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"\"}}]")
         TC_CHUNK("[{\"index\":1,\"function\":{\"arguments\":\"{\"}}]")},
        {TC_EV(3, "[{\"index\":7,\"function\":{\"arguments\":\"junk\"}}]"), OAI_MORE, ""},
        {DONE_EV(4, "stop", "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\"}},"
                            "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}},"
                            "{\"id\":\"call_3\",\"type\":\"function\",\"function\":{\"name\":\"h\",\"arguments\":\"{}\"}}]"),
         OAI_END,
         TC_CHUNK("[{\"index\":1,\"function\":{\"arguments\":\"}\"}},{\"id\":\"call_1_2\",\"type\":\"function\",\"function\":{\"name\":\"h\",\"arguments\":\"{}\"},\"index\":2}]")
         HEAD "\"delta\":{},\"logprobs\":null,\"finish_reason\":\"tool_calls\",\"stop_reason\":null}]}\n\ndata: [DONE]\n\n"},
    };
    run_steps(&req, streamed, 5, "streamed tools");
    const struct step empty[] = {
        {DONE_EV(0, "cancelled", "[]"), OAI_END,
         HEAD "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":\"cancelled\",\"stop_reason\":null}]}\n\ndata: [DONE]\n\n"},
    };
    run_steps(&req, empty, 1, "empty");

    /* logprobs: token ids as vLLM writes them, top cut to top_logprobs */
    struct oai_request lreq = {.stream = true, .logprobs = true, .top_logprobs = 1};
    const struct step lp[] = {
        {"{\"seq\":0,\"type\":\"delta\",\"delta\":{\"content\":\"x\"},\"token_ids\":[7],\"logprobs\":"
         "[{\"token_id\":7,\"logprob\":-0.5,\"top\":[{\"token_id\":7,\"logprob\":-0.5},{\"token_id\":9,\"logprob\":-1.5}]}]}",
         OAI_MORE,
         HEAD "\"delta\":{\"role\":\"assistant\",\"content\":\"x\"},\"logprobs\":{\"content\":[{\"token\":\"token_id:7\",\"logprob\":-0.5,\"bytes\":null,\"top_logprobs\":[{\"token\":\"token_id:7\",\"logprob\":-0.5,\"bytes\":null}]}]},\"finish_reason\":null}]}\n\n"},
    };
    run_steps(&lreq, lp, 1, "logprobs");

    /* errors: the event's code and message, OVERLOADED's retry */
    const struct step err[] = {
        {"{\"seq\":0,\"type\":\"error\",\"code\":\"OVERLOADED\",\"message\":\"pool fast is full\",\"retry_after_ms\":1500}",
         OAI_FAILED, ""},
        {DONE_EV(1, "error", "[]"), OAI_FAILED, ""},
    };
    run_steps(&req, err, 2, "error");
    /* broken streams */
    const struct step gap[] = {
        {"{\"seq\":1,\"type\":\"delta\",\"delta\":{\"content\":\"a\"},\"token_ids\":[1]}", OAI_FAILED, ""},
    };
    run_steps(&req, gap, 1, "gap");
    const struct step junk[] = {{"not json", OAI_FAILED, ""}};
    run_steps(&req, junk, 1, "junk");
    const struct step strange[] = {{"{\"seq\":0,\"type\":\"mystery\"}", OAI_FAILED, ""}};
    run_steps(&req, strange, 1, "strange");
}

static void test_stream_error_details(void **state)
{
    (void)state;
    struct oai_request req = {.stream = true};
    struct oai_resp *r;
    assert_int_equal(oai_resp_create(&r, ID, "redlm", 1, &req, NULL), 0);
    struct text b = {0};
    struct oai_error e;
    const char *ev = "{\"seq\":0,\"type\":\"error\",\"code\":\"OVERLOADED\",\"message\":\"pool fast is full\",\"retry_after_ms\":1500}";
    assert_int_equal(oai_resp_feed(r, ev, strlen(ev), &b, &e), OAI_FAILED);
    assert_int_equal(e.status, 503);
    assert_int_equal(e.retry_after_s, 2);
    assert_string_equal(e.code, "OVERLOADED");
    assert_string_equal(e.message, "pool fast is full");
    /* once bytes are out, the error is a chunk and [DONE] */
    assert_int_equal(oai_sse_error(&e, &b), 0);
    assert_string_equal(b.p, "data: {\"error\":{\"message\":\"pool fast is full\",\"type\":\"server_error\","
                             "\"param\":null,\"code\":\"OVERLOADED\"}}\n\ndata: [DONE]\n\n");
    text_free(&b);
    oai_resp_free(r);
}

static void test_completion_object(void **state)
{
    (void)state;
    const struct {
        struct oai_request req;
        const char *events[4];
        const char *want;
    } cases[] = {
        {{.stream = false},
         {"{\"seq\":0,\"type\":\"delta\",\"delta\":{\"reasoning_content\":\"hmm\"},\"token_ids\":[1]}",
          "{\"seq\":1,\"type\":\"delta\",\"delta\":{\"content\":\"Hel\"},\"token_ids\":[2]}",
          "{\"seq\":2,\"type\":\"delta\",\"delta\":{\"content\":\"lo\"},\"token_ids\":[3]}",
          DONE_EV(3, "stop", "[]")},
         "{\"id\":\"" ID "\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":\"redlm\","
         "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"Hello\","
         "\"reasoning_content\":\"hmm\",\"reasoning\":\"hmm\"},\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null}]," USAGE "}"},
        {{.stream = false},
         {DONE_EV(0, "stop", "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]")},
         "{\"id\":\"" ID "\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":\"redlm\","
         "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
         "[{\"id\":\"call_1_0\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]},"
         "\"logprobs\":null,\"finish_reason\":\"tool_calls\",\"stop_reason\":null}]," USAGE "}"},
        {{.stream = false, .logprobs = true, .top_logprobs = 0},
         {"{\"seq\":0,\"type\":\"delta\",\"delta\":{\"content\":\"x\"},\"token_ids\":[7],\"logprobs\":"
          "[{\"token_id\":7,\"logprob\":-0.25,\"top\":[]}]}",
          DONE_EV(1, "length", "[]")},
         "{\"id\":\"" ID "\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":\"redlm\","
         "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"x\"},\"logprobs\":"
         "{\"content\":[{\"token\":\"token_id:7\",\"logprob\":-0.25,\"bytes\":null,\"top_logprobs\":[]}]},"
         "\"finish_reason\":\"length\",\"stop_reason\":null}]," USAGE "}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct oai_resp *r;
        assert_int_equal(oai_resp_create(&r, ID, "redlm", 1700000000, &cases[i].req, NULL), 0);
        struct text b = {0};
        struct oai_error e;
        int rc = OAI_MORE;
        assert_null(oai_resp_completion(r)); /* not before done */
        for (int k = 0; k < 4 && cases[i].events[k]; k++)
            rc = oai_resp_feed(r, cases[i].events[k], strlen(cases[i].events[k]), &b, &e);
        assert_int_equal(rc, OAI_END);
        assert_int_equal(b.n, 0); /* nothing streamed */
        assert_int_equal(oai_resp_total_tokens(r), 17);
        char *s = oai_resp_completion(r);
        if (strcmp(s, cases[i].want))
            fail_msg("case %zu:\n got  %s\n want %s", i, s, cases[i].want);
        free(s);
        oai_resp_free(r);
    }
}


/* ---- the mode of requests that choose none (http_default_mode) ---- */

static void test_default_mode(void **state)
{
    (void)state;
    const struct {
        enum job_mode dflt;
        const char *body;
        const char *mode; /* the job's mode, NULL = none written */
    } cases[] = {
        {JOB_MODE_THINK, "{" MSG "}", "think"},
        {JOB_MODE_NO_THINK, "{" MSG "}", "no_think"},
        {JOB_MODE_AUTO, "{" MSG "}", NULL},
        {JOB_MODE_POOL, "{" MSG "}", NULL},
        /* soft switches, the last one winning, as the router reads them */
        {JOB_MODE_THINK, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi /no_think\"}]}", "no_think"},
        {JOB_MODE_NO_THINK, "{\"messages\":[{\"role\":\"user\",\"content\":\"/no_think hi /think\"}]}", "think"},
        {JOB_MODE_THINK, "{\"messages\":[{\"role\":\"user\",\"content\":\"a/no_think /no_thinking\"}]}", "think"},
        {JOB_MODE_THINK, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x /no_think\"}]}]}", "no_think"},
        /* explicit choices win over the switch and the default */
        {JOB_MODE_THINK, "{\"messages\":[{\"role\":\"user\",\"content\":\"x /no_think\"}],\"mode\":\"think\"}", "think"},
        {JOB_MODE_THINK, "{" MSG ",\"mode\":\"auto\"}", "auto"},
        {JOB_MODE_AUTO, "{" MSG ",\"reasoning_effort\":\"low\"}", "no_think"},
        {JOB_MODE_THINK, "{" MSG ",\"reasoning_effort\":\"none\"}", "no_think"},
        {JOB_MODE_THINK, "{" MSG ",\"reasoning_effort\":\"minimal\"}", "no_think"},
        {JOB_MODE_NO_THINK, "{" MSG ",\"reasoning_effort\":\"medium\"}", "think"},
        {JOB_MODE_NO_THINK, "{" MSG ",\"reasoning_effort\":\"high\"}", "think"},
        {JOB_MODE_THINK, "{" MSG ",\"reasoning_effort\":\"low\",\"chat_template_kwargs\":{\"enable_thinking\":false}}", "no_think"},
        {JOB_MODE_THINK, "{" MSG ",\"chat_template_kwargs\":{\"enable_thinking\":false}}", "no_think"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct oai_limits lim;
        oai_limits_default(&lim);
        lim.default_mode = cases[i].dflt;
        struct oai_request r;
        struct oai_error e;
        if (oai_parse_request(cases[i].body, strlen(cases[i].body), &lim, ID, 0, &r, &e))
            fail_msg("case %zu: %s -> %d %s", i, cases[i].body, e.status, e.message);
        cJSON *j = cJSON_Parse(r.job);
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "mode");
        if (cases[i].mode ? !cJSON_IsString(m) || strcmp(m->valuestring, cases[i].mode) : m != NULL)
            fail_msg("case %zu: %s -> %s, want mode %s", i, cases[i].body, r.job,
                     cases[i].mode ? cases[i].mode : "(none)");
        cJSON_Delete(j);
        oai_request_clear(&r);
    }
    /* reasoning_effort: the levels only, and no contradiction */
    const char *badv[] = {
        "{" MSG ",\"reasoning_effort\":\"max\"}",
        "{" MSG ",\"reasoning_effort\":3}",
        "{" MSG ",\"reasoning_effort\":\"low\",\"mode\":\"think\"}",
        "{" MSG ",\"reasoning_effort\":\"high\",\"chat_template_kwargs\":{\"enable_thinking\":false}}",
    };
    for (size_t i = 0; i < sizeof badv / sizeof badv[0]; i++) {
        struct oai_request r;
        struct oai_error e;
        assert_int_equal(oai_parse_request(badv[i], strlen(badv[i]), NULL, ID, 0, &r, &e), -RL_EINVAL);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, "reasoning_effort");
    }
}

/* ---- the harmless fields the SDKs send ---- */

static void test_harmless_fields(void **state)
{
    (void)state;
    const char *ok = "{" MSG ",\"user\":\"u\",\"service_tier\":\"auto\",\"store\":false,"
                     "\"metadata\":{\"a\":\"b\"},\"parallel_tool_calls\":false,"
                     "\"safety_identifier\":\"s\",\"prompt_cache_key\":\"k\",\"modalities\":[\"text\"]}";
    struct oai_request r;
    struct oai_error e;
    assert_int_equal(oai_parse_request(ok, strlen(ok), NULL, ID, 0, &r, &e), 0);
    assert_string_equal(r.job, "{\"id\":\"" ID "\"," JMSG "}"); /* none reaches the job */
    oai_request_clear(&r);
    const struct {
        const char *body, *code, *param;
    } badf[] = {
        {"{" MSG ",\"stor\":false}", "UNKNOWN_FIELD", "stor"},
        {"{" MSG ",\"service_teir\":\"auto\"}", "UNKNOWN_FIELD", "service_teir"},
        {"{" MSG ",\"store\":1}", "BAD_TYPE", "store"},
        {"{" MSG ",\"metadata\":{\"a\":1}}", "BAD_TYPE", "metadata"},
        {"{" MSG ",\"service_tier\":5}", "BAD_TYPE", "service_tier"},
        {"{" MSG ",\"modalities\":[\"text\",\"audio\"]}", "BAD_VALUE", "modalities"},
        /* the legacy API's own members are not chat's */
        {"{" MSG ",\"echo\":false}", "UNKNOWN_FIELD", "echo"},
        {"{" MSG ",\"prompt\":\"x\"}", "UNKNOWN_FIELD", "prompt"},
    };
    for (size_t i = 0; i < sizeof badf / sizeof badf[0]; i++) {
        assert_int_equal(oai_parse_request(badf[i].body, strlen(badf[i].body), NULL, ID, 0, &r, &e),
                         -RL_EINVAL);
        if (strcmp(e.code, badf[i].code) || strcmp(e.param, badf[i].param))
            fail_msg("case %zu: %s -> %s %s", i, badf[i].body, e.code, e.param);
    }
}

/* ---- POST /v1/completions ---- */

static void test_completion_requests(void **state)
{
    (void)state;
    const struct {
        const char *body, *job;
        bool logprobs;
        int top;
    } goodc[] = {
        {"{\"model\":\"redlm\",\"prompt\":\"Once\"}", "{\"id\":\"" ID "\",\"prompt\":\"Once\",\"mode\":\"no_think\"}", false, 0},
        {"{\"prompt\":[\"Once\"],\"max_tokens\":5}", "{\"id\":\"" ID "\",\"prompt\":\"Once\",\"max_tokens\":5,\"mode\":\"no_think\"}", false, 0},
        {"{\"prompt\":[1,2,3]}", "{\"id\":\"" ID "\",\"prompt_ids\":[1,2,3],\"mode\":\"no_think\"}", false, 0},
        {"{\"prompt\":[[4,5]],\"echo\":false,\"suffix\":null,\"best_of\":1,\"n\":1}",
         "{\"id\":\"" ID "\",\"prompt_ids\":[4,5],\"mode\":\"no_think\"}", false, 0},
        {"{\"prompt\":\"x\",\"logprobs\":3,\"temperature\":0,\"user\":\"u\"}",
         "{\"id\":\"" ID "\",\"temperature\":0,\"prompt\":\"x\",\"logprobs\":3,\"mode\":\"no_think\"}", true, 3},
        {"{\"prompt\":\"x\",\"logprobs\":0}", "{\"id\":\"" ID "\",\"prompt\":\"x\",\"logprobs\":0,\"mode\":\"no_think\"}", true, 0},
    };
    struct oai_limits lim;
    oai_limits_default(&lim);
    lim.default_mode = JOB_MODE_THINK; /* chat's default; the legacy API is never think */
    for (size_t i = 0; i < sizeof goodc / sizeof goodc[0]; i++) {
        struct oai_request r;
        struct oai_error e;
        if (oai_parse_completion(goodc[i].body, strlen(goodc[i].body), &lim, ID, 0, &r, &e))
            fail_msg("case %zu: %s -> %d %s", i, goodc[i].body, e.status, e.message);
        if (strcmp(r.job, goodc[i].job))
            fail_msg("case %zu:\n got  %s\n want %s", i, r.job, goodc[i].job);
        assert_int_equal(r.api, OAI_API_COMPLETIONS);
        assert_int_equal(r.logprobs, goodc[i].logprobs);
        assert_int_equal(r.top_logprobs, goodc[i].top);
        oai_request_clear(&r);
    }
    const struct {
        const char *body, *code, *param;
    } badc[] = {
        {"{\"max_tokens\":5}", "MISSING_FIELD", "prompt"},
        {"{" MSG "}", "UNKNOWN_FIELD", "messages"},
        {"{\"prompt\":\"x\",\"echo\":true,\"logprobs\":1}", "BAD_VALUE", "echo"},
        {"{\"prompt\":[1,2],\"echo\":true}", "BAD_VALUE", "echo"},
        {"{\"prompt\":[\"a\",[1]],\"echo\":true}", "BAD_VALUE", "echo"},
        {"{\"prompt\":\"x\",\"echo\":1}", "BAD_TYPE", "echo"},
        {"{\"prompt\":[\"a\",\"b\"],\"n\":33}", "OUT_OF_RANGE", "n"},
        {"{\"prompt\":[\"a\",\"\"]}", "OUT_OF_RANGE", "prompt"},
        {"{\"prompt\":\"x\",\"suffix\":\"end\"}", "BAD_VALUE", "suffix"},
        {"{\"prompt\":\"x\",\"best_of\":3}", "OUT_OF_RANGE", "best_of"},
        {"{\"prompt\":[\"a\",7]}", "BAD_TYPE", "prompt"},
        {"{\"prompt\":[1,\"b\"]}", "BAD_TYPE", "prompt"},
        {"{\"prompt\":7}", "BAD_TYPE", "prompt"},
        {"{\"prompt\":\"x\",\"logprobs\":true}", "BAD_TYPE", "logprobs"},
        {"{\"prompt\":\"x\",\"logprobs\":21}", "OUT_OF_RANGE", "logprobs"},
        {"{\"prompt\":\"x\",\"top_logprobs\":2}", "UNKNOWN_FIELD", "top_logprobs"},
        {"{\"prompt\":\"x\",\"reasoning_effort\":\"low\"}", "UNKNOWN_FIELD", "reasoning_effort"},
        {"{\"prompt\":\"\"}", "OUT_OF_RANGE", "prompt"},
    };
    for (size_t i = 0; i < sizeof badc / sizeof badc[0]; i++) {
        struct oai_request r;
        struct oai_error e;
        int rc = oai_parse_completion(badc[i].body, strlen(badc[i].body), &lim, ID, 0, &r, &e);
        if (rc != -RL_EINVAL || e.status != 400 || strcmp(e.code, badc[i].code) ||
            strcmp(e.param, badc[i].param))
            fail_msg("case %zu: %s -> %d %d %s %s (%s)", i, badc[i].body, rc, e.status, e.code,
                     e.param, e.message);
    }
}

/* ---- token text and bytes ---- */

#define LPEV(seq, content, ids, lps)                                                             \
    "{\"seq\":" #seq ",\"type\":\"delta\",\"delta\":{\"content\":\"" content "\"},\"token_ids\":" \
    ids ",\"logprobs\":" lps "}"
#define CHEAD "data: {\"id\":\"" ID "\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":\"redlm\",\"choices\":[{\"index\":0,"

static void test_token_text(void **state)
{
    (void)state;
    /* chat: "token" is the bytes as text; a part of a character (0xE2 0x82
     * of the euro sign) shows U+FFFD, its bytes stay true */
    struct oai_request lreq = {.stream = true, .logprobs = true, .top_logprobs = 1};
    const struct step lp[] = {
        {LPEV(0, " hi", "[7]", "[{\"token_id\":7,\"logprob\":-0.5,\"bytes\":[32,104,105],\"top\":"
              "[{\"token_id\":7,\"logprob\":-0.5,\"bytes\":[32,104,105]},{\"token_id\":9,\"logprob\":-2}]}]"),
         OAI_MORE,
         HEAD "\"delta\":{\"role\":\"assistant\",\"content\":\" hi\"},\"logprobs\":{\"content\":[{\"token\":\" hi\",\"logprob\":-0.5,\"bytes\":[32,104,105],\"top_logprobs\":[{\"token\":\" hi\",\"logprob\":-0.5,\"bytes\":[32,104,105]}]}]},\"finish_reason\":null}]}\n\n"},
        {LPEV(1, "", "[8]", "[{\"token_id\":8,\"logprob\":-1,\"bytes\":[226,130],\"top\":[]}]"), OAI_MORE,
         HEAD "\"delta\":{\"content\":\"\"},\"logprobs\":{\"content\":[{\"token\":\"\xef\xbf\xbd\",\"logprob\":-1,\"bytes\":[226,130],\"top_logprobs\":[]}]},\"finish_reason\":null}]}\n\n"},
        /* malformed bytes: the id form */
        {LPEV(2, "", "[5]", "[{\"token_id\":5,\"logprob\":-1,\"bytes\":[300],\"top\":[]}]"), OAI_MORE,
         HEAD "\"delta\":{\"content\":\"\"},\"logprobs\":{\"content\":[{\"token\":\"token_id:5\",\"logprob\":-1,\"bytes\":null,\"top_logprobs\":[]}]},\"finish_reason\":null}]}\n\n"},
    };
    run_steps(&lreq, lp, 3, "token text");

    /* completions, streamed: text chunks with the legacy logprobs */
    struct oai_request creq = {.api = OAI_API_COMPLETIONS, .stream = true, .logprobs = true,
                               .top_logprobs = 2, .include_usage = true};
    const struct step cs[] = {
        {LPEV(0, "a b", "[1,2]", "[{\"token_id\":1,\"logprob\":-0.5,\"bytes\":[97],\"top\":[{\"token_id\":1,\"logprob\":-0.5,\"bytes\":[97]},{\"token_id\":3,\"logprob\":-1,\"bytes\":[99]}]},"
              "{\"token_id\":2,\"logprob\":-0.25,\"bytes\":[32,98],\"top\":[]}]"),
         OAI_MORE,
         CHEAD "\"text\":\"a b\",\"logprobs\":{\"tokens\":[\"a\",\" b\"],\"token_logprobs\":[-0.5,-0.25],\"top_logprobs\":[{\"a\":-0.5,\"c\":-1},{}],\"text_offset\":[0,1]},\"finish_reason\":null}],\"usage\":null}\n\n"},
        {"{\"seq\":1,\"type\":\"delta\",\"delta\":{\"reasoning_content\":\"r\"},\"token_ids\":[4],\"logprobs\":[{\"token_id\":4,\"logprob\":-1,\"bytes\":[114],\"top\":[]}]}",
         OAI_MORE,
         CHEAD "\"text\":\"r\",\"logprobs\":{\"tokens\":[\"r\"],\"token_logprobs\":[-1],\"top_logprobs\":[{}],\"text_offset\":[3]},\"finish_reason\":null}],\"usage\":null}\n\n"},
        {DONE_EV(2, "length", "[]"), OAI_END,
         CHEAD "\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}],\"usage\":null}\n\n"
         "data: {\"id\":\"" ID "\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":\"redlm\",\"choices\":[]," USAGE "}\n\n"
         "data: [DONE]\n\n"},
    };
    run_steps(&creq, cs, 3, "completions stream");

    /* completions, whole */
    struct oai_request preq = {.api = OAI_API_COMPLETIONS, .logprobs = true};
    struct oai_resp *r;
    assert_int_equal(oai_resp_create(&r, ID, "redlm", 1700000000, &preq, NULL), 0);
    struct text b = {0};
    struct oai_error e;
    const char *evs[] = {
        LPEV(0, "Hel", "[1]", "[{\"token_id\":1,\"logprob\":-0.5,\"bytes\":[72,101,108],\"top\":[]}]"),
        LPEV(1, "lo", "[2]", "[{\"token_id\":2,\"logprob\":-0.25,\"bytes\":[108,111],\"top\":[]}]"),
        DONE_EV(2, "stop", "[]"),
    };
    for (int i = 0; i < 3; i++)
        oai_resp_feed(r, evs[i], strlen(evs[i]), &b, &e);
    assert_int_equal(b.n, 0);
    char *s = oai_resp_completion(r);
    assert_string_equal(s, "{\"id\":\"" ID "\",\"object\":\"text_completion\",\"created\":1700000000,"
                           "\"model\":\"redlm\",\"choices\":[{\"text\":\"Hello\",\"index\":0,\"logprobs\":"
                           "{\"tokens\":[\"Hel\",\"lo\"],\"token_logprobs\":[-0.5,-0.25],\"top_logprobs\":"
                           "[null,null],\"text_offset\":[0,3]},\"finish_reason\":\"stop\",\"stop_reason\":null}]," USAGE "}");
    free(s);
    oai_resp_free(r);
}

/* Several choices (issue 29): batched prompts and n make one job per
 * choice, "<id>-<i>", prompt i / n, seed + i % n; echo texts per choice;
 * the answer reads the jobs one after the other, each choice with its
 * index, the usage summed (the prompt once per prompt). */
static void test_several_choices(void **state)
{
    (void)state;
    struct oai_limits lim;
    oai_limits_default(&lim);
    struct oai_request q;
    struct oai_error e;
    const char *body = "{\"prompt\":[\"Once\",[7,8]],\"n\":2,\"seed\":5,\"max_tokens\":3}";
    assert_int_equal(oai_parse_completion(body, strlen(body), &lim, ID, 0, &q, &e), 0);
    assert_int_equal(q.n_jobs, 4);
    assert_int_equal(q.n_per_prompt, 2);
    assert_ptr_equal(q.job, q.jobs[0]);
    assert_null(q.echo);
    const char *want[] = {
        "{\"id\":\"" ID "-0\",\"seed\":5,\"max_tokens\":3,\"mode\":\"no_think\",\"prompt\":\"Once\"}",
        "{\"id\":\"" ID "-1\",\"seed\":6,\"max_tokens\":3,\"mode\":\"no_think\",\"prompt\":\"Once\"}",
        "{\"id\":\"" ID "-2\",\"seed\":5,\"max_tokens\":3,\"mode\":\"no_think\",\"prompt_ids\":[7,8]}",
        "{\"id\":\"" ID "-3\",\"seed\":6,\"max_tokens\":3,\"mode\":\"no_think\",\"prompt_ids\":[7,8]}",
    };
    for (int i = 0; i < 4; i++) {
        if (strcmp(q.jobs[i], want[i]))
            fail_msg("job %d:\n got  %s\n want %s", i, q.jobs[i], want[i]);
        assert_int_equal(q.job_lens[i], strlen(want[i]));
    }
    oai_request_clear(&q);
    /* one prompt: one job, the id as it is; echo keeps the prompt */
    body = "{\"prompt\":[\"Once\"],\"echo\":true}";
    assert_int_equal(oai_parse_completion(body, strlen(body), &lim, ID, 0, &q, &e), 0);
    assert_int_equal(q.n_jobs, 1);
    assert_null(q.jobs);
    assert_non_null(strstr(q.job, "\"id\":\"" ID "\""));
    assert_string_equal(q.echo[0], "Once");
    oai_request_clear(&q);
    /* chat: n alone */
    body = "{" MSG ",\"n\":3}";
    assert_int_equal(oai_parse_request(body, strlen(body), &lim, ID, 0, &q, &e), 0);
    assert_int_equal(q.n_jobs, 3);
    assert_non_null(strstr(q.jobs[2], "\"id\":\"" ID "-2\""));
    assert_null(strstr(q.jobs[2], "seed"));
    oai_request_clear(&q);

    /* the answer, not streamed: two choices, echo before each text */
    char *ech[] = {"P: ", "Q: "};
    struct oai_request cq = {.api = OAI_API_COMPLETIONS, .n_jobs = 2, .n_per_prompt = 1,
                             .echo = ech};
    struct oai_resp *r;
    assert_int_equal(oai_resp_create(&r, ID, "redlm", 1700000000, &cq, NULL), 0);
    struct text b = {0};
    const char *evs[] = {
        "{\"seq\":0,\"type\":\"delta\",\"delta\":{\"content\":\"a\"},\"token_ids\":[1]}",
        DONE_EV(1, "stop", "[]"),
        "{\"seq\":0,\"type\":\"delta\",\"delta\":{\"content\":\"b\"},\"token_ids\":[2]}",
        DONE_EV(1, "length", "[]"),
    };
    const int rcs[] = {OAI_MORE, OAI_NEXT, OAI_MORE, OAI_END};
    for (int i = 0; i < 4; i++)
        assert_int_equal(oai_resp_feed(r, evs[i], strlen(evs[i]), &b, &e), rcs[i]);
    assert_int_equal(b.n, 0);
    char *s = oai_resp_completion(r);
    assert_string_equal(s, "{\"id\":\"" ID "\",\"object\":\"text_completion\",\"created\":1700000000,"
                           "\"model\":\"redlm\",\"choices\":[{\"text\":\"P: a\",\"index\":0,"
                           "\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null},{\"text\":\"Q: b\",\"index\":1,"
                           "\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}],\"usage\":{\"prompt_tokens\":24,"
                           "\"completion_tokens\":10,\"total_tokens\":34,\"prompt_tokens_details\":"
                           "{\"cached_tokens\":16},\"completion_tokens_details\":{\"reasoning_tokens\":4}}}");
    free(s);
    assert_int_equal(oai_resp_total_tokens(r), 34);
    oai_resp_free(r);

    /* chat, streamed, n 2 (one prompt): chunks with index 0 then 1, the
     * usage once at the end, the prompt counted once */
    struct oai_request sq = {.api = OAI_API_CHAT, .stream = true, .include_usage = true,
                             .n_jobs = 2, .n_per_prompt = 2};
    assert_int_equal(oai_resp_create(&r, ID, "redlm", 1700000000, &sq, NULL), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(oai_resp_feed(r, evs[i], strlen(evs[i]), &b, &e), rcs[i]);
    assert_int_equal(text_add(&b, "", 1), 0);
    cJSON *ch0 = NULL;
    int n_done = 0, seen[2] = {0, 0};
    for (char *line = strstr(b.p, "data: "); line; line = strstr(line + 1, "data: ")) {
        if (!strncmp(line, "data: [DONE]", 12)) {
            n_done++;
            continue;
        }
        ch0 = cJSON_Parse(line + 6);
        assert_non_null(ch0);
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(ch0, "choices"), 0);
        if (c) {
            int idx = cJSON_GetObjectItem(c, "index")->valueint;
            assert_true(idx == 0 || idx == 1);
            assert_true(idx >= (seen[1] ? 1 : 0)); /* choice 0 first, then 1 */
            seen[idx]++;
        } else {
            const cJSON *u = cJSON_GetObjectItem(ch0, "usage");
            assert_int_equal(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 12);
            assert_int_equal(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 10);
        }
        cJSON_Delete(ch0);
    }
    assert_int_equal(n_done, 1);
    assert_true(seen[0] >= 2 && seen[1] >= 2); /* content and finish for each */
    text_free(&b);
    oai_resp_free(r);
}

/* ---- API keys ---- */

static void test_keys(void **state)
{
    (void)state;
    const char *file = "# comment\n\nsk-alpha-0001 acme 60 100000\r\n"
                       "  sk-beta-00002\tacme\n"
                       "sk-gamma-0003 other.team 5\n";
    struct oai_keys k;
    struct rl_err err = {0};
    assert_int_equal(oai_keys_parse(file, strlen(file), "keys", &k, &err), 0);
    assert_int_equal(k.n, 3);
    const struct oai_key *e = oai_keys_find(&k, "Bearer sk-alpha-0001");
    assert_non_null(e);
    assert_string_equal(e->tenant, "acme");
    assert_int_equal(e->rpm, 60);
    assert_int_equal(e->tpm, 100000);
    e = oai_keys_find(&k, "bearer   sk-beta-00002 ");
    assert_non_null(e);
    assert_string_equal(e->tenant, "acme");
    assert_int_equal(e->rpm, 0);
    e = oai_keys_find(&k, "Bearer sk-gamma-0003");
    assert_non_null(e);
    assert_string_equal(e->tenant, "other.team");
    assert_int_equal(e->rpm, 5);
    assert_int_equal(e->tpm, 0);
    assert_null(oai_keys_find(&k, NULL));
    assert_null(oai_keys_find(&k, ""));
    assert_null(oai_keys_find(&k, "sk-alpha-0001"));
    assert_null(oai_keys_find(&k, "Basic sk-alpha-0001"));
    /* the bare key, as x-api-key carries it */
    assert_ptr_equal(oai_keys_lookup(&k, " sk-alpha-0001 "), oai_keys_find(&k, "Bearer sk-alpha-0001"));
    assert_null(oai_keys_lookup(&k, "sk-unknown-0001"));
    assert_null(oai_keys_lookup(&k, NULL));
    assert_null(oai_keys_find(&k, "Bearer sk-alpha-0002"));
    assert_null(oai_keys_find(&k, "Bearer sk-alpha-000"));
    /* only digests are kept */
    uint8_t d[SHA256_DIGEST_LEN];
    struct sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, "sk-alpha-0001", 13);
    sha256_final(&c, d);
    assert_memory_equal(k.v[0].digest, d, sizeof d);
    oai_keys_free(&k);

    const struct {
        const char *text, *msg;
    } badk[] = {
        {"sk-alpha-0001\n", "keys:1: expected KEY TENANT [RPM [TPM]]"},
        {"\n# x\nsk-alpha-0001 a 1 2 3\n", "keys:3: expected KEY TENANT [RPM [TPM]]"},
        {"short a\n", "keys:1: a key must be 8-256 characters"},
        {"sk-alpha-0001 bad/tenant\n", "keys:1: tenant must be 1-64 characters of [A-Za-z0-9_.-]"},
        {"sk-alpha-0001 t -5\n", "keys:1: RPM and TPM must be whole numbers (0 = no limit)"},
        {"sk-alpha-0001 t 5 1e6\n", "keys:1: RPM and TPM must be whole numbers (0 = no limit)"},
        {"sk-alpha-0001 t\nsk-alpha-0001 u\n", "keys:2: the same key is listed twice"},
        {"sk-alpha-\x01" "0001 t\n", "keys:1: a key must be printable ASCII"},
    };
    for (size_t i = 0; i < sizeof badk / sizeof badk[0]; i++) {
        memset(&err, 0, sizeof err);
        if (oai_keys_parse(badk[i].text, strlen(badk[i].text), "keys", &k, &err) != -RL_EINVAL)
            fail_msg("case %zu accepted", i);
        if (strcmp(err.msg, badk[i].msg))
            fail_msg("case %zu: got \"%s\", want \"%s\"", i, err.msg, badk[i].msg);
    }
    /* an empty file is valid: nobody gets in */
    assert_int_equal(oai_keys_parse("", 0, "keys", &k, &err), 0);
    assert_int_equal(k.n, 0);
    assert_null(oai_keys_find(&k, "Bearer sk-alpha-0001"));
    oai_keys_free(&k);
}

/* http_unknown_fields = ignore (issue 29): unknown members and values that
 * are accepted but not applied are named in r.ignored, in body order; the
 * job's own fields named the HTTP way are applied: priority (vLLM's lower
 * first -> the job's higher first), the thinking budget, the client's
 * deadline when sooner, grammar; `reasoning` on an input message is the
 * job's reasoning_content. Refused again with refuse_unknown. */
static void test_ignored_fields(void **state)
{
    (void)state;
    struct oai_limits lim;
    oai_limits_default(&lim);
    lim.refuse_unknown = false;
    const char *body =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
        "\"content\":\"a\",\"reasoning\":\"r\"},{\"role\":\"user\",\"content\":\"b\"}],"
        "\"frobnicate\":1,\"min_tokens\":0,\"min_tokens2\":{},\"stop_token_ids\":[7],"
        "\"skip_special_tokens\":true,\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":true},"
        "\"chat_template_kwargs\":{\"enable_thinking\":false,\"custom\":1},"
        "\"logit_bias\":{\"5\":1},\"priority\":5,\"thinking_budget\":10,"
        "\"deadline_ms\":1000,\"guided_json\":{}}";
    struct oai_request r;
    struct oai_error e;
    assert_int_equal(oai_parse_request(body, strlen(body), &lim, ID, 2000, &r, &e), 0);
    assert_string_equal(r.ignored, "frobnicate, min_tokens2, "
                                   "stream_options.continuous_usage_stats, "
                                   "chat_template_kwargs.custom");
    /* issue 29: min_tokens, stop_token_ids and logit_bias are the job's;
     * at their neutral value (min_tokens 0) they make no member */
    assert_non_null(strstr(r.job, "\"stop_token_ids\":[7]"));
    assert_non_null(strstr(r.job, "\"logit_bias\":{\"5\":1}"));
    assert_null(strstr(r.job, "\"min_tokens\""));
    assert_null(strstr(r.job, "skip_special_tokens")); /* true: the default */
    /* vLLM's guided_json is the job's response_format */
    assert_non_null(strstr(r.job, "\"response_format\":{\"type\":\"json_schema\","
                                  "\"json_schema\":{\"name\":\"guided_json\",\"schema\":{}}}"));
    assert_true(r.include_usage);
    assert_non_null(strstr(r.job, "\"priority\":-5"));
    assert_non_null(strstr(r.job, "\"max_thinking_tokens\":10"));
    assert_non_null(strstr(r.job, "\"deadline_ms\":1000"));
    assert_non_null(strstr(r.job, "\"mode\":\"no_think\""));
    assert_non_null(strstr(r.job, "\"reasoning_content\":\"r\""));
    assert_null(strstr(r.job, "\"reasoning\""));
    assert_null(strstr(r.job, "frobnicate"));
    oai_request_clear(&r);
    /* min_tokens > 0 and completions take them too */
    const char *mt = "{\"prompt\":\"p\",\"min_tokens\":3,\"stop_token_ids\":[151643,9],"
                     "\"skip_special_tokens\":false,"
                     "\"logit_bias\":{\"9\":-100,\"10\":100}}";
    assert_int_equal(oai_parse_completion(mt, strlen(mt), &lim, ID, 0, &r, &e), 0);
    assert_non_null(strstr(r.job, "\"min_tokens\":3"));
    assert_non_null(strstr(r.job, "\"stop_token_ids\":[151643,9]"));
    assert_non_null(strstr(r.job, "\"logit_bias\":{\"9\":-100,\"10\":100}"));
    assert_non_null(strstr(r.job, "\"skip_special_tokens\":false"));
    assert_string_equal(r.ignored, "");
    oai_request_clear(&r);
    /* nothing to name: an empty list */
    const char *plain = "{" MSG ",\"min_tokens\":0,\"skip_special_tokens\":true,\"stop_token_ids\":[]}";
    assert_int_equal(oai_parse_request(plain, strlen(plain), &lim, ID, 0, &r, &e), 0);
    assert_string_equal(r.ignored, "");
    oai_request_clear(&r);
    /* refused when the deployment says so */
    lim.refuse_unknown = true;
    const char *refused[][2] = {{"{" MSG ",\"min_tokens2\":3}", "min_tokens2"},
                                {"{" MSG ",\"chat_template_kwargs\":{\"x\":1}}",
                                 "chat_template_kwargs.x"},
                                {"{" MSG ",\"guided_regex\":\"x\"}", "guided_regex"},
                                {"{" MSG ",\"frobnicate\":1}", "frobnicate"}};
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(oai_parse_request(refused[i][0], strlen(refused[i][0]), &lim, ID, 0, &r,
                                           &e), -RL_EINVAL);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, refused[i][1]);
    }
    /* guided_choice: a grammar of the strings as they are, escaped */
    const char *choice = "{" MSG ",\"guided_choice\":[\"yes\",\"a\\\"b\\\\c\\n\"]}";
    assert_int_equal(oai_parse_request(choice, strlen(choice), &lim, ID, 0, &r, &e), 0);
    cJSON *cj = cJSON_Parse(r.job);
    assert_string_equal(cJSON_GetObjectItem(cj, "grammar")->valuestring,
                        "root ::= \"yes\" | \"a\\\"b\\\\c\\x0A\"");
    cJSON_Delete(cj);
    oai_request_clear(&r);
    const char *both = "{" MSG ",\"guided_json\":\"{}\",\"response_format\":{\"type\":\"json_object\"}}";
    assert_int_equal(oai_parse_request(both, strlen(both), &lim, ID, 0, &r, &e), -RL_EINVAL);
    assert_string_equal(e.param, "guided_json");
    const char *bad_prio = "{" MSG ",\"priority\":1001}";
    assert_int_equal(oai_parse_request(bad_prio, strlen(bad_prio), &lim, ID, 0, &r, &e),
                     -RL_EINVAL);
    assert_string_equal(e.code, "OUT_OF_RANGE");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_requests),
        cmocka_unit_test(test_deadline_written),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_model_into_job),
        cmocka_unit_test(test_error_json),
        cmocka_unit_test(test_event_errors),
        cmocka_unit_test(test_stream_chunks),
        cmocka_unit_test(test_stream_error_details),
        cmocka_unit_test(test_completion_object),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_several_choices),
        cmocka_unit_test(test_default_mode),
        cmocka_unit_test(test_harmless_fields),
        cmocka_unit_test(test_completion_requests),
        cmocka_unit_test(test_token_text),
        cmocka_unit_test(test_ignored_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
