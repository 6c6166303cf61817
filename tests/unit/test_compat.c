/* tests/unit/test_compat.c - the Responses API, Ollama's API
 * (dispatcher/compat.c), Anthropic's Messages API (dispatcher/anthropic.c)
 * and the vLLM-named metrics (dispatcher/vmetrics.c):
 * bodies -> the job JSON (through openai.c), refusals with the field the
 * client wrote, events -> Responses server-sent events and objects, Ollama
 * NDJSON lines, and the metric families. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "dispatcher/compat.h"
#include "dispatcher/fleet.h"
#include "dispatcher/rstore.h"
#include "dispatcher/vmetrics.h"

static struct oai_limits lim_any(void)
{
    struct oai_limits l;
    oai_limits_default(&l);
    l.model = NULL; /* any name, carried in the job */
    l.refuse_unknown = false;
    return l;
}

/* Parses body as api; returns the job as a cJSON object (caller frees). */
static cJSON *job_of(enum cpt_api api, const char *body, struct cpt_request *c,
                     struct oai_request *r)
{
    struct oai_limits l = lim_any();
    struct oai_error e;
    int rc = cpt_parse(api, body, strlen(body), &l, "resp_ab12", 0, r, c, &e);
    if (rc)
        fail_msg("%s refused: %d %s [%s] %s", body, e.status, e.code, e.param, e.message);
    return r->job ? cJSON_Parse(r->job) : NULL;
}

static void test_responses_requests(void **state)
{
    (void)state;
    struct cpt_request c;
    struct oai_request r;
    cJSON *j = job_of(CPT_RESPONSES,
                      "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
                      "\"input_text\",\"text\":\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]},"
                      "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\","
                      "\"arguments\":\"{}\"},{\"type\":\"function_call\",\"call_id\":\"c2\","
                      "\"name\":\"g\",\"arguments\":\"{}\"},{\"type\":\"function_call_output\","
                      "\"call_id\":\"c1\",\"output\":\"1\"},{\"type\":\"reasoning\",\"summary\":[]}],"
                      "\"instructions\":\"Be brief.\",\"max_output_tokens\":7,"
                      "\"reasoning\":{\"effort\":\"high\"},\"store\":false,"
                      "\"tools\":[{\"type\":\"function\","
                      "\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}],"
                      "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},\"stream\":true}",
                      &c, &r);
    char *s = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "messages"));
    assert_string_equal(s, "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
                           "\"content\":\"ab\"},{\"role\":\"assistant\",\"content\":null,"
                           "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
                           "{\"name\":\"f\",\"arguments\":\"{}\"}},{\"id\":\"c2\",\"type\":"
                           "\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},"
                           "{\"role\":\"tool\",\"content\":\"1\",\"tool_call_id\":\"c1\"}]");
    free(s);
    assert_int_equal(cJSON_GetObjectItem(j, "max_tokens")->valueint, 7);
    assert_string_equal(cJSON_GetObjectItem(j, "mode")->valuestring, "think");
    s = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "tool_choice"));
    assert_string_equal(s, "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}");
    free(s);
    assert_true(r.stream);
    assert_non_null(strstr(c.echo, "\"instructions\":\"Be brief.\""));
    cJSON_Delete(j);
    oai_request_clear(&r);
    cpt_request_clear(&c);
    j = job_of(CPT_RESPONSES, "{\"input\":\"x\",\"text\":{\"format\":{\"type\":"
                              "\"json_schema\",\"name\":\"n\",\"schema\":{\"type\":\"object\"},"
                              "\"strict\":true}}}", &c, &r);
    s = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "response_format"));
    assert_string_equal(s, "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
                           "\"schema\":{\"type\":\"object\"},\"strict\":true}}");
    free(s);
    cJSON_Delete(j);
    oai_request_clear(&r);
    cpt_request_clear(&c);

    /* refusals name what the client wrote */
    static const struct { const char *body, *param, *code; int status; } bad[] = {
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id",
         "previous_response_not_found", 400},
        {"{\"model\":\"m\"}", "input", "MISSING_FIELD", 400},
        {"{\"input\":[{\"type\":\"web_search_call\"}]}", "input[0].type", "BAD_VALUE", 400},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}]}",
         "input[0].content[0].type", "BAD_VALUE", 400},
        {"{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens", "OUT_OF_RANGE", 400},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0].type", "BAD_VALUE",
         400},
        {"{\"input\":\"x\",\"reasoning\":{\"effort\":\"huge\"}}", "reasoning_effort", "BAD_VALUE",
         400},
        {"[1]", "", "NOT_OBJECT", 400},
        {"{\"input\":\"x\",\"n\":2}", "n", "OUT_OF_RANGE", 400},
    };
    struct oai_limits l = lim_any();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct oai_error e;
        assert_int_equal(cpt_parse(CPT_RESPONSES, bad[i].body, strlen(bad[i].body), &l, "resp_1",
                                   0, &r, &c, &e), -RL_EINVAL);
        if (e.status != bad[i].status || strcmp(e.param, bad[i].param) ||
            strcmp(e.code, bad[i].code))
            fail_msg("case %zu: got %d %s [%s] %s", i, e.status, e.code, e.param, e.message);
        assert_null(r.job);
        assert_null(c.echo);
    }
}

static void test_ollama_requests(void **state)
{
    (void)state;
    struct cpt_request c;
    struct oai_request r;
    cJSON *j = job_of(CPT_OLLAMA_CHAT,
                      "{\"model\":\"qwen3:latest\",\"messages\":[{\"role\":\"user\",\"content\":"
                      "\"hi\",\"images\":[]},{\"role\":\"assistant\",\"content\":\"\",\"thinking\":"
                      "\"t\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},"
                      "{\"role\":\"tool\",\"content\":\"1\",\"tool_name\":\"f\"}],"
                      "\"options\":{\"num_predict\":5,\"temperature\":0.5,\"repeat_penalty\":1.2,"
                      "\"num_ctx\":8192,\"top_k\":3,\"stop\":[\"x\"]},\"format\":\"json\","
                      "\"think\":false,\"keep_alive\":\"5m\"}",
                      &c, &r);
    assert_string_equal(cJSON_GetObjectItem(j, "model")->valuestring, "qwen3");
    assert_int_equal(cJSON_GetObjectItem(j, "max_tokens")->valueint, 5);
    assert_true(cJSON_GetObjectItem(j, "repetition_penalty")->valuedouble == 1.2);
    assert_int_equal(cJSON_GetObjectItem(j, "top_k")->valueint, 3);
    assert_string_equal(cJSON_GetObjectItem(j, "mode")->valuestring, "no_think");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "response_format"), "type")
                            ->valuestring, "json_object");
    cJSON *m1 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "messages"), 1);
    assert_string_equal(cJSON_GetObjectItem(m1, "reasoning_content")->valuestring, "t");
    assert_true(r.stream); /* Ollama's default */
    assert_string_equal(r.ignored, "");
    cJSON_Delete(j);
    oai_request_clear(&r);
    cpt_request_clear(&c);

    j = job_of(CPT_OLLAMA_GENERATE, "{\"prompt\":\"Hi\",\"system\":\"S\",\"stream\":false,"
                                    "\"format\":{\"type\":\"object\"},\"context\":[1,2]}", &c, &r);
    char *s = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "messages"));
    assert_string_equal(s, "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\","
                           "\"content\":\"Hi\"}]");
    free(s);
    assert_false(r.stream);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "response_format"), "type")
                            ->valuestring, "json_schema");
    cJSON_Delete(j);
    oai_request_clear(&r);
    j = job_of(CPT_OLLAMA_GENERATE, "{\"prompt\":\"raw text\",\"raw\":true,\"think\":true}", &c,
               &r);
    assert_string_equal(cJSON_GetObjectItem(j, "prompt")->valuestring, "raw text");
    cJSON_Delete(j);
    oai_request_clear(&r);
    j = job_of(CPT_OLLAMA_GENERATE, "{\"model\":\"m\"}", &c, &r);
    assert_null(j);
    assert_true(c.load_only);

    struct oai_limits l = lim_any();
    static const char *const bad[][2] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"images\":[\"aGk=\"]}]}",
         "messages[0].images"},
        {"{\"messages\":[],\"format\":\"yaml\"}", "format"},
        {"{\"messages\":[],\"think\":\"max\"}", "think"},
        {"{\"model\":\"m\"}", "messages"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct oai_error e;
        assert_int_equal(cpt_parse(CPT_OLLAMA_CHAT, bad[i][0], strlen(bad[i][0]), &l, "o-1", 0,
                                   &r, &c, &e), -RL_EINVAL);
        assert_string_equal(e.param, bad[i][1]);
        char *ej = cpt_error_json(CPT_OLLAMA_CHAT, &e);
        cJSON *o = cJSON_Parse(ej);
        assert_true(cJSON_IsString(cJSON_GetObjectItem(o, "error")) && o->child->next == NULL);
        cJSON_Delete(o);
        free(ej);
    }
}

#define DONE "{\"seq\":3,\"type\":\"done\",\"finish_reason\":\"stop\",\"usage\":{\"prompt_tokens\":9," \
             "\"completion_tokens\":4,\"reasoning_tokens\":2,\"cached_prompt_tokens\":0},\"cached\":" \
             "false,\"timings\":{\"queue_ms\":1,\"ttft_ms\":2,\"total_ms\":5},\"tool_calls\":[{\"id\":" \
             "\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]}"
static const char *const EVENTS[] = {
    "{\"seq\":0,\"type\":\"delta\",\"delta\":{\"reasoning_content\":\"r1\"}}",
    "{\"seq\":1,\"type\":\"delta\",\"delta\":{\"reasoning_content\":\"r2\"}}",
    "{\"seq\":2,\"type\":\"delta\",\"delta\":{\"content\":\"hi\"}}",
    DONE,
};

/* Feeds EVENTS; returns the bytes written (malloc'd). */
static char *feed_all(struct cpt_resp *r)
{
    struct text out = {0};
    struct oai_error e;
    for (int i = 0; i < 4; i++)
        assert_int_equal(cpt_resp_feed(r, EVENTS[i], strlen(EVENTS[i]), &out, &e),
                         i < 3 ? OAI_MORE : OAI_END);
    text_add(&out, "", 1);
    return out.p;
}

static void test_responses_events(void **state)
{
    (void)state;
    struct cpt_request c = {.api = CPT_RESPONSES, .echo = strdup("{\"instructions\":\"I\"}")};
    struct cpt_resp *r;
    struct rl_err err = {0};
    assert_int_equal(cpt_resp_create(&r, &c, "resp_ab12", "m", 1700000000123, true, &err), 0);
    char *sse = feed_all(r);
    /* the event names, in order, each with sequence_number n */
    static const char *const names[] = {
        "response.created", "response.in_progress", "response.output_item.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"};
    const char *p = sse;
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++) {
        char want[96];
        snprintf(want, sizeof want, "event: %s\ndata: ", names[i]);
        assert_memory_equal(p, want, strlen(want));
        const char *end = strstr(p, "\n\n");
        assert_non_null(end);
        char seq[40];
        snprintf(seq, sizeof seq, "\"sequence_number\":%d}", i);
        assert_memory_equal(end - strlen(seq), seq, strlen(seq));
        p = end + 2;
    }
    assert_string_equal(p, "");
    assert_non_null(strstr(sse, "\"item_id\":\"rs_ab12_0\""));
    assert_non_null(strstr(sse, "\"item_id\":\"msg_ab12_1\""));
    assert_non_null(strstr(sse, "\"call_id\":\"call_ab12_0\"")); /* unique per request */
    free(sse);
    cpt_resp_free(r);

    assert_int_equal(cpt_resp_create(&r, &c, "resp_ab12", "m", 1700000000123, false, &err), 0);
    char *none = feed_all(r);
    assert_string_equal(none, ""); /* nothing streamed */
    free(none);
    char *body = cpt_resp_body(r);
    cJSON *o = cJSON_Parse(body);
    assert_string_equal(cJSON_GetObjectItem(o, "status")->valuestring, "completed");
    assert_string_equal(cJSON_GetObjectItem(o, "instructions")->valuestring, "I");
    assert_int_equal(cJSON_GetObjectItem(o, "created_at")->valueint, 1700000000);
    cJSON *out = cJSON_GetObjectItem(o, "output");
    assert_int_equal(cJSON_GetArraySize(out), 3);
    char *s = cJSON_PrintUnformatted(cJSON_GetArrayItem(out, 0));
    assert_string_equal(s, "{\"id\":\"rs_ab12_0\",\"type\":\"reasoning\",\"summary\":[],"
                           "\"content\":[{\"type\":\"reasoning_text\",\"text\":\"r1r2\"}]}");
    free(s);
    s = cJSON_PrintUnformatted(cJSON_GetObjectItem(o, "usage"));
    assert_string_equal(s, "{\"input_tokens\":9,\"input_tokens_details\":{\"cached_tokens\":0},"
                           "\"output_tokens\":4,\"output_tokens_details\":{\"reasoning_tokens\":2},"
                           "\"total_tokens\":13}");
    free(s);
    assert_int_equal(cpt_resp_total_tokens(r), 13);
    cJSON_Delete(o);
    free(body);
    cpt_resp_free(r);
    cpt_request_clear(&c);
}

/* A request that names a stored response: its conversation goes first
 * (after this request's instructions), a reasoning item becomes the next
 * assistant turn's reasoning_content, a message and the calls after it are
 * one turn, and what the store keeps is that conversation plus the new
 * input. The stored object says store and what it follows. */
static void test_responses_continued(void **state)
{
    (void)state;
    static const char prior[] =
        "[{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":"
        "\"input_text\",\"text\":\"Hi\"}]},{\"id\":\"rs_1\",\"type\":\"reasoning\",\"summary\":[],"
        "\"content\":[{\"type\":\"reasoning_text\",\"text\":\"hmm\"}]},{\"id\":\"msg_2\",\"type\":"
        "\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":"
        "\"output_text\",\"text\":\"Let me look.\",\"annotations\":[]}]},{\"id\":\"fc_1\",\"type\":"
        "\"function_call\",\"status\":\"completed\",\"call_id\":\"c1\",\"name\":\"f\","
        "\"arguments\":\"{}\"}]";
    static const char body[] =
        "{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"42\"}],"
        "\"previous_response_id\":\"resp_x\",\"instructions\":\"New.\"}";
    struct oai_limits l = lim_any();
    struct oai_error e;
    struct cpt_request c;
    struct oai_request r;
    struct cpt_peek pk;
    cpt_responses_peek(body, strlen(body), &pk);
    assert_true(pk.continues && !pk.background);
    assert_string_equal(pk.previous_id, "resp_x");
    assert_int_equal(cpt_parse_responses(body, strlen(body), prior, &l, "resp_y", 0, &r, &c, &e),
                     0);
    cJSON *j = cJSON_Parse(r.job);
    char *s = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "messages"));
    assert_string_equal(s, "[{\"role\":\"system\",\"content\":\"New.\"},{\"role\":\"user\","
                           "\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Let me look.\","
                           "\"reasoning_content\":\"hmm\",\"tool_calls\":[{\"id\":\"c1\",\"type\":"
                           "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                           "{\"role\":\"tool\",\"content\":\"42\",\"tool_call_id\":\"c1\"}]");
    free(s);
    cJSON_Delete(j);
    assert_string_equal(c.previous_id, "resp_x");
    assert_true(c.store);
    /* kept: the conversation, then the new input as sent */
    cJSON *in = cJSON_Parse(c.input);
    assert_int_equal(cJSON_GetArraySize(in), 5);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(in, 4), "type")->valuestring,
                        "function_call_output");
    cJSON_Delete(in);
    /* the answer says what it follows, and that it is kept */
    c.api = CPT_RESPONSES;
    struct cpt_resp *resp;
    struct rl_err err = {0};
    assert_int_equal(cpt_resp_create(&resp, &c, "resp_y", "m", 1700000000123, false, &err), 0);
    assert_null(cpt_resp_stored(resp)); /* not before it ends */
    free(feed_all(resp));
    char *obj = cpt_resp_stored(resp);
    cJSON *o = cJSON_Parse(obj);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(o, "store")));
    assert_string_equal(cJSON_GetObjectItem(o, "previous_response_id")->valuestring, "resp_x");
    cJSON_Delete(o);
    cpt_resp_free(resp);

    /* the record: ids for the items without one, the context the next
     * request continues, the listing */
    struct rst_record *rec = NULL;
    assert_int_equal(rst_new("acme", "resp_y", c.input, NULL, obj, NULL, &rec), 0);
    assert_false(rst_running(rec, NULL));
    char *text = rst_json(rec);
    cJSON *rj = cJSON_Parse(text);
    free(text);
    assert_string_equal(cJSON_GetObjectItem(rj, "owner")->valuestring, "acme");
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(rj, "input"), 4), "id")
            ->valuestring,
        "item_y_in4");
    cJSON_Delete(rj);
    char *ctx = NULL, *chain = NULL;
    int n_ctx = 0;
    assert_int_equal(rst_continue(rec, "resp_y", &ctx, &n_ctx, &chain), 0);
    cJSON *cj = cJSON_Parse(ctx);
    assert_int_equal(cJSON_GetArraySize(cj), 5 + 3); /* + reasoning, message, call */
    assert_int_equal(n_ctx, 5 + 3);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(cj, 5), "type")->valuestring,
                        "reasoning");
    cJSON_Delete(cj);
    free(ctx);
    assert_string_equal(chain, "[\"resp_y\"]"); /* the next record's chain */
    free(chain);
    char *resp_obj = rst_response(rec);
    assert_string_equal(resp_obj, obj);
    free(resp_obj);
    char msg[128], *list = NULL;
    assert_int_equal(rst_input_items(rec, "asc", 2, "rs_1", &list, msg, sizeof msg), 0);
    assert_string_equal(list, "{\"data\":[{\"id\":\"msg_2\",\"type\":\"message\",\"status\":"
                              "\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":"
                              "\"output_text\",\"text\":\"Let me look.\",\"annotations\":[]}]},"
                              "{\"id\":\"fc_1\",\"type\":\"function_call\",\"status\":\"completed\","
                              "\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"}],"
                              "\"object\":\"list\",\"first_id\":\"msg_2\",\"last_id\":\"fc_1\","
                              "\"has_more\":true}");
    free(list);
    assert_int_equal(rst_input_items(rec, NULL, 20, NULL, &list, msg, sizeof msg), 0);
    cJSON *lj = cJSON_Parse(list);
    assert_string_equal(cJSON_GetObjectItem(lj, "first_id")->valuestring, "item_y_in4");
    assert_string_equal(cJSON_GetObjectItem(lj, "last_id")->valuestring, "msg_1");
    assert_false(cJSON_IsTrue(cJSON_GetObjectItem(lj, "has_more")));
    cJSON_Delete(lj);
    free(list);
    assert_int_equal(rst_input_items(rec, "sideways", 2, NULL, &list, msg, sizeof msg),
                     -RL_EINVAL);
    assert_int_equal(rst_input_items(rec, "asc", 101, NULL, &list, msg, sizeof msg), -RL_EINVAL);
    assert_int_equal(rst_input_items(rec, "asc", 5, "msg_9", &list, msg, sizeof msg), -RL_EINVAL);
    assert_null(list);
    rst_free(rec);

    /* continuing resp_x: the record keeps its own turn (the one new
     * item) and the chain, not the conversation again */
    struct rst_origin after_x = {4, "[\"resp_x\"]", NULL};
    assert_int_equal(rst_new("acme", "resp_y", c.input, &after_x, obj, NULL, &rec), 0);
    char *text2 = rst_json(rec);
    cJSON *tj = cJSON_Parse(text2);
    free(text2);
    assert_null(cJSON_GetObjectItem(tj, "input"));
    const cJSON *ch = cJSON_GetObjectItem(tj, "chain");
    assert_int_equal(cJSON_GetArraySize(ch), 1);
    assert_string_equal(cJSON_GetArrayItem(ch, 0)->valuestring, "resp_x");
    const cJSON *turn = cJSON_GetObjectItem(tj, "turn");
    assert_int_equal(cJSON_GetArraySize(turn), 1);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(turn, 0), "type")->valuestring,
                        "function_call_output");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(turn, 0), "id")->valuestring,
                        "item_y_in0");
    cJSON_Delete(tj);
    /* its chain not read: no context that would miss it */
    assert_int_equal(rst_continue(rec, "resp_y", &ctx, &n_ctx, &chain), -RL_EINVAL);
    assert_null(ctx);
    assert_null(rst_conversation(rec));
    rst_free(rec);
    /* in a conversation: its own turn, and the conversation it was in,
     * which a previous_response_id does not continue */
    struct rst_origin in_conv = {4, NULL, "conv_1"};
    assert_int_equal(rst_new("acme", "resp_y", c.input, &in_conv, obj, NULL, &rec), 0);
    assert_string_equal(rst_conversation(rec), "conv_1");
    assert_int_equal(rst_conversation_items(rec), 4);
    char *after = rst_continue_after(rec, "[{\"id\":\"c0\"}]");
    cJSON *aj = cJSON_Parse(after);
    free(after);
    assert_int_equal(cJSON_GetArraySize(aj), 1 + 1 + 3); /* before, its turn, its output */
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(aj, 0), "id")->valuestring, "c0");
    cJSON_Delete(aj);
    assert_null(rst_continue_after(rec, "{}"));
    text2 = rst_json(rec);
    tj = cJSON_Parse(text2);
    free(text2);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(tj, "turn")), 1);
    assert_null(cJSON_GetObjectItem(tj, "chain"));
    cJSON_Delete(tj);
    assert_int_equal(rst_continue(rec, "resp_y", &ctx, &n_ctx, &chain), -RL_EINVAL);
    rst_free(rec);
    /* a chain longer than RST_CHAIN_MAX is refused */
    struct text ids = {0};
    text_printf(&ids, "[");
    for (int i = 0; i <= RST_CHAIN_MAX; i++)
        text_printf(&ids, "%s\"resp_%d\"", i ? "," : "", i);
    text_printf(&ids, "]");
    after_x.chain = ids.p;
    assert_int_equal(rst_new("acme", "resp_y", c.input, &after_x, obj, NULL, &rec), -RL_EINVAL);
    text_free(&ids);

    struct rst_record *none = NULL;
    assert_int_equal(rst_new("", "resp_z", "{}", NULL, obj, NULL, &none), -RL_EINVAL);
    assert_int_equal(rst_new("", "resp_z", "[]", NULL, "[]", NULL, &none), -RL_EINVAL);
    static const struct rst_origin wrong[] = {{1, "[]", NULL}, {1, NULL, NULL}, {1, "[1]", NULL}};
    assert_int_equal(rst_new("", "resp_z", "[]", &wrong[0], obj, NULL, &none), -RL_EINVAL);
    assert_int_equal(rst_new("", "resp_z", c.input, &wrong[1], obj, NULL, &none), -RL_EINVAL);
    assert_int_equal(rst_new("", "resp_z", c.input, &wrong[2], obj, NULL, &none), -RL_EINVAL);
    assert_null(none);
    free(obj);
    oai_request_clear(&r);
    cpt_request_clear(&c);

    /* store false; without a stored conversation, previous_response_id
     * is not found; reasoning before a user's message is no turn's */
    static const char quiet[] =
        "{\"store\":false,\"input\":[{\"type\":\"reasoning\",\"summary\":[{\"type\":"
        "\"summary_text\",\"text\":\"x\"}]},{\"role\":\"user\",\"content\":\"q\"}]}";
    assert_int_equal(cpt_parse(CPT_RESPONSES, quiet, strlen(quiet), &l, "resp_1", 0, &r, &c, &e),
                     0);
    assert_false(c.store);
    assert_null(strstr(r.job, "reasoning_content"));
    oai_request_clear(&r);
    cpt_request_clear(&c);
    assert_int_equal(cpt_parse_responses(body, strlen(body), NULL, &l, "resp_1", 0, &r, &c, &e),
                     -RL_EINVAL);
    assert_string_equal(e.code, "previous_response_not_found");
    assert_string_equal(e.message, "Previous response with id 'resp_x' not found.");
}

/* The status of the object as it stands, for a background response. */
static void assert_status(const struct cpt_resp *r, const char *want)
{
    char *s = cpt_resp_object(r);
    cJSON *o = cJSON_Parse(s);
    assert_string_equal(cJSON_GetObjectItem(o, "status")->valuestring, want);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(o, "background")));
    cJSON_Delete(o);
    free(s);
}

/* A background response: parsed (only with store), its object queued
 * before any event, in progress, then completed; failed with its error;
 * cancelled by its client before the end says so; and its record, running
 * then finished (rst_update), with what rebuilds it. */
static void test_responses_background(void **state)
{
    (void)state;
    struct oai_limits l = lim_any();
    struct oai_error e;
    struct cpt_request c;
    struct oai_request r;
    static const char body[] = "{\"input\":\"x\",\"background\":true}";
    struct cpt_peek pk;
    cpt_responses_peek(body, strlen(body), &pk);
    assert_true(pk.background && !pk.continues);
    assert_int_equal(cpt_parse(CPT_RESPONSES, body, strlen(body), &l, "resp_b", 0, &r, &c, &e),
                     0);
    assert_true(c.background && c.store);
    oai_request_clear(&r);
    cpt_request_clear(&c);
    static const char *const bad[] = {"{\"input\":\"x\",\"background\":true,\"store\":false}",
                                      "{\"input\":\"x\",\"background\":1}"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(cpt_parse(CPT_RESPONSES, bad[i], strlen(bad[i]), &l, "resp_b", 0, &r,
                                   &c, &e), -RL_EINVAL);
        assert_string_equal(e.param, "background");
    }
    c = (struct cpt_request){.api = CPT_RESPONSES, .store = true, .background = true};
    struct cpt_resp *resp;
    struct rl_err err = {0};
    struct text out = {0};
    assert_int_equal(cpt_resp_create(&resp, &c, "resp_b", "m", 1700000000123, false, &err), 0);
    assert_status(resp, "queued");
    assert_int_equal(cpt_resp_feed(resp, EVENTS[0], strlen(EVENTS[0]), &out, &e), OAI_MORE);
    assert_status(resp, "in_progress");
    char *queued = cpt_resp_object(resp);
    for (int i = 1; i < 4; i++)
        cpt_resp_feed(resp, EVENTS[i], strlen(EVENTS[i]), &out, &e);
    assert_status(resp, "completed");
    char *final = cpt_resp_stored(resp);
    assert_non_null(final);
    cpt_resp_free(resp);

    /* its record: running (the queued object holds what the answer
     * repeats: the request's fields, model, created_at), cancelled, then
     * finished */
    struct rst_running run = {.cancel = false}, back;
    struct rst_record *rec = NULL;
    assert_int_equal(rst_new("acme", "resp_b", "[]", NULL, queued, &run, &rec), 0);
    assert_true(rst_running(rec, &back));
    assert_false(back.cancel);
    run.cancel = true;
    assert_int_equal(rst_update(rec, NULL, &run), 0);
    assert_true(rst_running(rec, &back) && back.cancel);
    char *got = rst_response(rec);
    assert_string_equal(got, queued); /* kept as it was */
    free(got);
    /* what rebuilds the answer */
    assert_string_equal(rst_response_string(rec, "model"), "m");
    assert_true(rst_response_number(rec, "created_at") == 1700000000);
    assert_true(rst_response_true(rec, "background"));
    assert_null(rst_response_string(rec, "no_such_member"));
    /* not an object: refused, the record as it was */
    assert_int_equal(rst_update(rec, "[1]", NULL), -RL_EINVAL);
    assert_true(rst_running(rec, NULL));
    assert_int_equal(rst_update(rec, final, NULL), 0);
    assert_false(rst_running(rec, &back));
    got = rst_response(rec);
    assert_string_equal(got, final);
    free(got);
    char *text = rst_json(rec);
    cJSON *fj = cJSON_Parse(text);
    free(text);
    assert_string_equal(cJSON_GetObjectItem(fj, "owner")->valuestring, "acme");
    assert_null(cJSON_GetObjectItem(fj, "running"));
    cJSON_Delete(fj);
    rst_free(rec);
    free(queued);
    free(final);

    /* failed: the error object; cancelled: said before the end */
    assert_int_equal(cpt_resp_create(&resp, &c, "resp_b", "m", 1700000000123, false, &err), 0);
    static const char failed[] =
        "{\"seq\":0,\"type\":\"error\",\"code\":\"ENGINE_ERROR\",\"message\":\"broke\"}";
    assert_int_equal(cpt_resp_feed(resp, failed, strlen(failed), &out, &e), OAI_FAILED);
    assert_status(resp, "failed");
    char *fo = cpt_resp_object(resp);
    assert_non_null(strstr(fo, "\"message\":\"broke\""));
    free(fo);
    cpt_resp_free(resp);
    c.cancelled = true;
    assert_int_equal(cpt_resp_create(&resp, &c, "resp_b", "m", 1700000000123, false, &err), 0);
    assert_status(resp, "cancelled");
    cpt_resp_free(resp);
    text_free(&out);

    /* a stream resumed after event 5: the same events from 6 on, the same
     * bytes as the whole stream's tail */
    c.cancelled = false;
    assert_int_equal(cpt_resp_create(&resp, &c, "resp_b", "m", 1700000000123, true, &err), 0);
    char *whole = feed_all(resp);
    cpt_resp_free(resp);
    assert_int_equal(cpt_resp_create(&resp, &c, "resp_b", "m", 1700000000123, true, &err), 0);
    cpt_resp_resume(resp, 5);
    char *tail = feed_all(resp);
    cpt_resp_free(resp);
    assert_memory_equal(tail, "event: ", 7);
    assert_non_null(strstr(tail, "\"sequence_number\":6}"));
    assert_null(strstr(tail, "\"sequence_number\":5}"));
    assert_string_equal(strstr(whole, tail), tail);
    free(whole);
    free(tail);
}

/* An answer that is all reasoning (cut by max_output_tokens while it
 * thought): its message item is empty, not the reasoning again (the item's
 * text buffer was reused unterminated; fuzz_compat found it). */
static void test_responses_thinking_only(void **state)
{
    (void)state;
    static const char *const ev[] = {
        "{\"seq\":0,\"type\":\"delta\",\"delta\":{\"reasoning_content\":\"hmm\"}}",
        "{\"seq\":1,\"type\":\"done\",\"finish_reason\":\"length\",\"usage\":{\"prompt_tokens\":3,"
        "\"completion_tokens\":1,\"reasoning_tokens\":1}}",
    };
    struct cpt_request c = {.api = CPT_RESPONSES};
    for (int stream = 0; stream < 2; stream++) {
        struct cpt_resp *r;
        struct rl_err err = {0};
        assert_int_equal(cpt_resp_create(&r, &c, "resp_ab12", "m", 1700000000123, stream, &err), 0);
        struct text out = {0};
        struct oai_error e;
        assert_int_equal(cpt_resp_feed(r, ev[0], strlen(ev[0]), &out, &e), OAI_MORE);
        assert_int_equal(cpt_resp_feed(r, ev[1], strlen(ev[1]), &out, &e), OAI_END);
        char *body = cpt_resp_body(r);
        cJSON *o = cJSON_Parse(body);
        cJSON *items = cJSON_GetObjectItem(o, "output");
        assert_int_equal(cJSON_GetArraySize(items), 2);
        cJSON *msg = cJSON_GetArrayItem(items, 1);
        assert_string_equal(cJSON_GetObjectItem(msg, "type")->valuestring, "message");
        cJSON *part = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "content"), 0);
        assert_string_equal(cJSON_GetObjectItem(part, "text")->valuestring, "");
        assert_string_equal(cJSON_GetObjectItem(o, "status")->valuestring, "incomplete");
        cJSON_Delete(o);
        free(body);
        text_free(&out);
        cpt_resp_free(r);
    }
}

/* Tool arguments streamed by the worker (delta.tool_calls, issue 29): the
 * function_call item opens at the first fragment, each fragment is a
 * function_call_arguments.delta, done adds what they lacked ("}") and
 * closes it; not streamed, the same events give the same output item. */
static void test_responses_streamed_call(void **state)
{
    (void)state;
    static const char *const ev[] = {
        "{\"seq\":0,\"type\":\"delta\",\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\"\"}}]}}",
        "{\"seq\":1,\"type\":\"delta\",\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1\"}}]}}",
        "{\"seq\":2,\"type\":\"delta\",\"delta\":{}}",
        DONE,
    };
    struct cpt_request c = {.api = CPT_RESPONSES};
    for (int stream = 1; stream >= 0; stream--) {
        struct cpt_resp *r;
        struct rl_err err = {0};
        assert_int_equal(cpt_resp_create(&r, &c, "resp_ab12", "m", 1700000000123, stream, &err), 0);
        struct text out = {0};
        struct oai_error e;
        for (int i = 0; i < 4; i++)
            assert_int_equal(cpt_resp_feed(r, ev[i], strlen(ev[i]), &out, &e), i < 3 ? OAI_MORE : OAI_END);
        text_add(&out, "", 1);
        if (stream) {
            static const char *const names[] = {
                "response.created", "response.in_progress", "response.output_item.added",
                "response.function_call_arguments.delta", "response.function_call_arguments.delta",
                "response.function_call_arguments.delta", "response.function_call_arguments.done",
                "response.output_item.done", "response.completed"};
            static const char *const deltas[] = {"\"delta\":\"{\\\"a\\\"\"", "\"delta\":\":1\"",
                                                 "\"delta\":\"}\""};
            const char *p = out.p;
            int nd = 0;
            for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++) {
                char want[96];
                snprintf(want, sizeof want, "event: %s\ndata: ", names[i]);
                if (memcmp(p, want, strlen(want)))
                    fail_msg("event %d: %.80s", i, p);
                const char *end = strstr(p, "\n\n");
                assert_non_null(end);
                if (strstr(names[i], "arguments.delta")) {
                    const char *d = strstr(p, deltas[nd++]);
                    assert_true(d && d < end);
                }
                p = end + 2;
            }
            assert_string_equal(p, "");
            assert_non_null(strstr(out.p, "\"arguments\":\"{\\\"a\\\":1}\",\"sequence_number\":6"));
            assert_non_null(strstr(out.p, "\"item_id\":\"fc_ab12_0\""));
        } else {
            assert_string_equal(out.p, "");
        }
        char *body = cpt_resp_body(r);
        cJSON *o = cJSON_Parse(body);
        cJSON *items = cJSON_GetObjectItem(o, "output");
        assert_int_equal(cJSON_GetArraySize(items), 1);
        char *it = cJSON_PrintUnformatted(cJSON_GetArrayItem(items, 0));
        assert_string_equal(it, "{\"id\":\"fc_ab12_0\",\"type\":\"function_call\",\"status\":\"completed\","
                                "\"call_id\":\"call_ab12_0\",\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}");
        free(it);
        cJSON_Delete(o);
        free(body);
        text_free(&out);
        cpt_resp_free(r);
    }
}

/* Anthropic's Messages API (dispatcher/anthropic.c): a tool call streamed
 * by the worker is one tool_use block whose input_json_delta fragments
 * are its arguments, done adding what they lacked; the stop_reason is
 * tool_use; not streamed, the same events give the same block. */
static void test_anthropic_streamed_call(void **state)
{
    (void)state;
    static const char *const ev[] = {
        "{\"seq\":0,\"type\":\"delta\",\"delta\":{\"content\":\"ok\"}}",
        "{\"seq\":1,\"type\":\"delta\",\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\"\"}}]}}",
        "{\"seq\":2,\"type\":\"delta\",\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1\"}}]}}",
        DONE,
    };
    struct cpt_request c = {.api = CPT_ANTHROPIC};
    for (int stream = 1; stream >= 0; stream--) {
        struct cpt_resp *r;
        struct rl_err err = {0};
        assert_int_equal(cpt_resp_create(&r, &c, "msg_ab12", "m", 1700000000123, stream, &err), 0);
        struct text out = {0};
        struct oai_error e;
        for (int i = 0; i < 4; i++)
            assert_int_equal(cpt_resp_feed(r, ev[i], strlen(ev[i]), &out, &e), i < 3 ? OAI_MORE : OAI_END);
        text_add(&out, "", 1);
        if (stream) {
            static const char *const want[] = {
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_ab12\"",
                "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
                "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
                "\"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}",
                "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}",
                "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,"
                "\"content_block\":{\"type\":\"tool_use\",\"id\":\"call_ab12_0\",\"name\":\"f\",\"input\":{}}}",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,"
                "\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\"\"}}",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,"
                "\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\":1\"}}",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,"
                "\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"}\"}}",
                "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}",
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
                "\"tool_use\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":9,",
                "event: message_stop\ndata: {\"type\":\"message_stop\"}"};
            const char *p = out.p;
            for (int i = 0; i < (int)(sizeof want / sizeof want[0]); i++) {
                if (strncmp(p, want[i], strlen(want[i])))
                    fail_msg("event %d: %.200s", i, p);
                const char *end = strstr(p, "\n\n");
                assert_non_null(end);
                p = end + 2;
            }
            assert_string_equal(p, "");
        } else {
            assert_string_equal(out.p, "");
        }
        char *body = cpt_resp_body(r);
        cJSON *o = cJSON_Parse(body);
        assert_string_equal(cJSON_GetObjectItem(o, "stop_reason")->valuestring, "tool_use");
        char *blocks = cJSON_PrintUnformatted(cJSON_GetObjectItem(o, "content"));
        assert_string_equal(blocks, "[{\"type\":\"text\",\"text\":\"ok\",\"citations\":null},"
                                    "{\"type\":\"tool_use\",\"id\":\"call_ab12_0\",\"name\":\"f\","
                                    "\"input\":{\"a\":1}}]");
        free(blocks);
        assert_int_equal(cpt_resp_total_tokens(r), 13);
        cJSON_Delete(o);
        free(body);
        text_free(&out);
        cpt_resp_free(r);
    }
    /* an answer cut by max_tokens: stop_reason max_tokens; an empty one: no block */
    static const char *const cut =
        "{\"seq\":0,\"type\":\"done\",\"finish_reason\":\"length\",\"usage\":{\"prompt_tokens\":5,"
        "\"completion_tokens\":0,\"cached_prompt_tokens\":5}}";
    struct cpt_resp *r;
    struct rl_err err = {0};
    assert_int_equal(cpt_resp_create(&r, &c, "msg_ab12", "m", 1700000000123, false, &err), 0);
    struct text out = {0};
    struct oai_error e;
    assert_int_equal(cpt_resp_feed(r, cut, strlen(cut), &out, &e), OAI_END);
    char *body = cpt_resp_body(r);
    cJSON *o = cJSON_Parse(body);
    assert_string_equal(cJSON_GetObjectItem(o, "stop_reason")->valuestring, "max_tokens");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "content")), 0);
    cJSON *u = cJSON_GetObjectItem(o, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "input_tokens")->valueint, 0);
    assert_int_equal(cJSON_GetObjectItem(u, "cache_read_input_tokens")->valueint, 5);
    cJSON_Delete(o);
    free(body);
    cpt_resp_free(r);
}

/* Messages bodies -> the job: blocks, tool turns, thinking; refusals name
 * the member. */
static void test_anthropic_requests(void **state)
{
    (void)state;
    struct cpt_request c;
    struct oai_request r;
    cJSON *j = job_of(CPT_ANTHROPIC,
                      "{\"model\":\"m\",\"max_tokens\":7,\"system\":\"S\",\"thinking\":{\"type\":"
                      "\"adaptive\"},\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":"
                      "\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\","
                      "\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
                      "\"tool_use_id\":\"t1\",\"content\":\"r\"}]}],\"tools\":[{\"name\":\"f\","
                      "\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"tool\","
                      "\"name\":\"f\"}}",
                      &c, &r);
    assert_string_equal(cJSON_GetObjectItem(j, "mode")->valuestring, "think");
    assert_int_equal(cJSON_GetObjectItem(j, "max_tokens")->valueint, 7);
    char *m = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "messages"));
    assert_string_equal(m, "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"q\"},"
                           "{\"role\":\"assistant\",\"content\":[],\"tool_calls\":[{\"id\":\"t1\",\"type\":"
                           "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                           "{\"role\":\"tool\",\"content\":\"r\",\"tool_call_id\":\"t1\"}]");
    free(m);
    m = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "tool_choice"));
    assert_string_equal(m, "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}");
    free(m);
    cJSON_Delete(j);
    oai_request_clear(&r);
    cpt_request_clear(&c);
    /* a tool that failed (is_error): the model reads it in the result, as a
     * string or before the text blocks */
    j = job_of(CPT_ANTHROPIC,
               "{\"max_tokens\":7,\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":"
               "\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\","
               "\"input\":{}},{\"type\":\"tool_use\",\"id\":\"t2\",\"name\":\"f\",\"input\":{}}]},"
               "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\","
               "\"content\":\"no such file\",\"is_error\":true},{\"type\":\"tool_result\","
               "\"tool_use_id\":\"t2\",\"is_error\":true,\"content\":[{\"type\":\"text\",\"text\":"
               "\"timed out\"}]}]}]}",
               &c, &r);
    m = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "messages"));
    assert_non_null(strstr(m, "{\"role\":\"tool\",\"content\":\"Error: no such file\","
                              "\"tool_call_id\":\"t1\"}"));
    assert_non_null(strstr(m, "{\"role\":\"tool\",\"content\":[{\"type\":\"text\",\"text\":"
                              "\"Error: \"},{\"type\":\"text\",\"text\":\"timed out\"}],"
                              "\"tool_call_id\":\"t2\"}"));
    free(m);
    cJSON_Delete(j);
    oai_request_clear(&r);
    cpt_request_clear(&c);
    /* a last assistant message: a prefill, continued */
    j = job_of(CPT_ANTHROPIC, "{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
                              "{\"role\":\"assistant\",\"content\":\"{\\\"a\\\":\"}]}", &c, &r);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "continue_final_message")));
    cJSON_Delete(j);
    oai_request_clear(&r);
    cpt_request_clear(&c);
    /* count_tokens: no max_tokens needed, nothing streamed */
    j = job_of(CPT_ANTHROPIC_COUNT, "{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":"
                                    "\"user\",\"content\":\"q\"}]}", &c, &r);
    assert_false(r.stream);
    cJSON_Delete(j);
    oai_request_clear(&r);
    cpt_request_clear(&c);
    static const char *const refused[][2] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", "max_tokens"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"document\"}]}]}",
         "messages[0].content[0].type"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
         "\"content\":[{\"type\":\"server_tool_use\"}]},{\"role\":\"user\",\"content\":\"q\"}]}",
         "messages[1].content[0].type"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"tool\",\"content\":\"q\"}]}", "messages[0].role"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
         "\"content\":\"{\"}],\"output_config\":{\"format\":{\"type\":\"json_schema\",\"schema\":{}}}}",
         "messages"},
        {"{\"max_tokens\":1,\"messages\":[]}", "messages"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tool_choice\":"
         "{\"type\":\"tool\"}}", "tool_choice.name"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"mcp_servers\":[{}]}",
         "mcp_servers"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"output_config\":"
         "{\"format\":{\"type\":\"json_object\"}}}", "output_config.format"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"stop_sequences\":[1]}",
         "stop_sequences[0]"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
         "\"tool_result\",\"tool_use_id\":\"t\",\"is_error\":\"yes\"}]}]}",
         "messages[0].content[0].is_error"},
        /* found by fuzz_compat: a second system leaked the first */
        {"{\"max_tokens\":1,\"system\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
         "\"system\":\"b\"}", "system"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        struct oai_limits l = lim_any();
        struct oai_error e;
        const char *b = refused[i][0];
        int rc = cpt_parse(CPT_ANTHROPIC, b, strlen(b), &l, "msg_1", 0, &r, &c, &e);
        if (rc != -RL_EINVAL || e.status != 400 || strcmp(e.param, refused[i][1]))
            fail_msg("%s: %d %d [%s] %s", b, rc, e.status, e.param, e.message);
        char *ej = cpt_error_json(CPT_ANTHROPIC, &e);
        cJSON *o = cJSON_Parse(ej);
        assert_string_equal(cJSON_GetObjectItem(o, "type")->valuestring, "error");
        assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "type")->valuestring,
                            "invalid_request_error");
        cJSON_Delete(o);
        free(ej);
    }
}

static void test_ollama_lines(void **state)
{
    (void)state;
    struct cpt_request c = {.api = CPT_OLLAMA_CHAT};
    struct cpt_resp *r;
    struct rl_err err = {0};
    assert_int_equal(cpt_resp_create(&r, &c, "ollama-1", "m", 1700000000123, true, &err), 0);
    char *nd = feed_all(r);
    assert_string_equal(
        nd,
        "{\"model\":\"m\",\"created_at\":\"2023-11-14T22:13:20.123Z\",\"message\":{\"role\":"
        "\"assistant\",\"content\":\"\",\"thinking\":\"r1\"},\"done\":false}\n"
        "{\"model\":\"m\",\"created_at\":\"2023-11-14T22:13:20.123Z\",\"message\":{\"role\":"
        "\"assistant\",\"content\":\"\",\"thinking\":\"r2\"},\"done\":false}\n"
        "{\"model\":\"m\",\"created_at\":\"2023-11-14T22:13:20.123Z\",\"message\":{\"role\":"
        "\"assistant\",\"content\":\"hi\"},\"done\":false}\n"
        "{\"model\":\"m\",\"created_at\":\"2023-11-14T22:13:20.128Z\",\"message\":{\"role\":"
        "\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":"
        "{\"a\":1}}}]},\"done\":true,\"done_reason\":\"stop\",\"total_duration\":5000000,"
        "\"load_duration\":0,\"prompt_eval_count\":9,\"prompt_eval_duration\":2000000,"
        "\"eval_count\":4,\"eval_duration\":3000000}\n");
    free(nd);
    /* a keep-alive is a line like any other, with nothing in it */
    struct text ka = {0};
    assert_int_equal(cpt_keepalive(r, &ka), 0);
    text_add(&ka, "", 1);
    assert_string_equal(ka.p, "{\"model\":\"m\",\"created_at\":\"2023-11-14T22:13:20.123Z\","
                              "\"message\":{\"role\":\"assistant\",\"content\":\"\"},"
                              "\"done\":false}\n");
    text_free(&ka);
    /* an error after the first line: one {"error"} line */
    struct text out = {0};
    struct oai_error e;
    oai_error_set(&e, 500, "server_error", "ENGINE_ERROR", NULL, "the backend failed");
    assert_int_equal(cpt_stream_error(r, &e, &out), 0);
    text_add(&out, "", 1);
    assert_string_equal(out.p, "{\"error\":\"the backend failed\"}\n");
    text_free(&out);
    cpt_resp_free(r);
}

static void test_vmetrics(void **state)
{
    (void)state;
    struct vmetrics *m = vm_create();
    vm_move(m, "a", VM_NONE, VM_WAITING);
    vm_move(m, "a", VM_WAITING, VM_RUNNING);
    vm_first_token(m, "a", 0.03);
    vm_move(m, "b", VM_NONE, VM_WAITING);
    vm_done(m, "a", 1.2, 10, 5, "length");
    vm_move(m, "a", VM_RUNNING, VM_NONE);
    struct text b = {0};
    vm_render(m, NULL, 0, &b);
    text_add(&b, "", 1);
    static const char *const want[] = {
        "vllm:num_requests_running{model_name=\"a\"} 0\n",
        "vllm:num_requests_waiting{model_name=\"b\"} 1\n",
        "vllm:time_to_first_token_seconds_bucket{le=\"0.02\",model_name=\"a\"} 0\n",
        "vllm:time_to_first_token_seconds_bucket{le=\"0.04\",model_name=\"a\"} 1\n",
        "vllm:e2e_request_latency_seconds_bucket{le=\"1\",model_name=\"a\"} 0\n",
        "vllm:e2e_request_latency_seconds_bucket{le=\"1.5\",model_name=\"a\"} 1\n",
        "vllm:e2e_request_latency_seconds_count{model_name=\"a\"} 1\n",
        "vllm:prompt_tokens_total{model_name=\"a\"} 10\n",
        "vllm:generation_tokens_total{model_name=\"a\"} 5\n",
        "vllm:request_success_total{finished_reason=\"length\",model_name=\"a\"} 1\n",
        "# TYPE vllm:time_to_first_token_seconds histogram\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(b.p, want[i]))
            fail_msg("missing: %s", want[i]);
    text_free(&b);
    vm_free(m);
}

/* The fleet's rows merged into the page: the gauges are the larger of the
 * front door's and the fleet's; a model only the fleet knows gets rows. */
static void test_vmetrics_fleet(void **state)
{
    (void)state;
    struct vmetrics *m = vm_create();
    vm_move(m, "a", VM_NONE, VM_WAITING);
    vm_move(m, "a", VM_NONE, VM_WAITING);
    struct vm_fleet f[2] = {{.model = "a", .n_workers = 1, .running = 3, .waiting = 1,
                             .kv_blocks = 100, .kv_used = 25, .prefix_queries = 40,
                             .prefix_hits = 16, .preemptions = 2},
                            {.model = "c", .n_workers = 1, .running = 1, .kv_blocks = 10}};
    struct text b = {0};
    vm_render(m, f, 2, &b);
    text_add(&b, "", 1);
    static const char *const want[] = {
        "vllm:num_requests_running{model_name=\"a\"} 3\n",
        "vllm:num_requests_waiting{model_name=\"a\"} 2\n",
        "vllm:num_requests_running{model_name=\"c\"} 1\n",
        "vllm:kv_cache_usage_perc{model_name=\"a\"} 0.250000\n",
        "vllm:kv_cache_usage_perc{model_name=\"c\"} 0.000000\n",
        "vllm:prefix_cache_queries_total{model_name=\"a\"} 40\n",
        "vllm:prefix_cache_hits_total{model_name=\"a\"} 16\n",
        "vllm:num_preemptions_total{model_name=\"a\"} 2\n",
        "vllm:e2e_request_latency_seconds_count{model_name=\"c\"} 0\n",
        "# TYPE vllm:prefix_cache_queries_total counter\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(b.p, want[i]))
            fail_msg("missing: %s", want[i]);
    text_free(&b);
    vm_free(m);
}

/* Every histogram family from the fleet's sums where a worker reports
 * them (each from its own fields: a count and a sum apiece), from the front
 * door's own otherwise; the front door never sees prefill or decode. */
static void test_vmetrics_histograms(void **state)
{
    (void)state;
    struct vmetrics *m = vm_create();
    vm_first_token(m, "a", 0.03);
    vm_done(m, "a", 1.2, 30, 40, "stop");
    vm_first_token(m, "b", 0.03);
    vm_done(m, "b", 1.2, 30, 40, "stop");
    struct vm_fleet f = {.model = "a", .n_workers = 1, .hist = true};
    f.ttft_n = 101, f.e2e_n = 102, f.tpot_n = 103, f.plen_n = 104, f.glen_n = 105;
    f.qt_n = 106, f.pt_n = 107, f.dt_n = 108;
    f.ttft_sum = 1.5, f.e2e_sum = 2.5, f.tpot_sum = 3.5, f.plen_sum = 4.5, f.glen_sum = 5.5;
    f.qt_sum = 6.5, f.pt_sum = 7.5, f.dt_sum = 8.5;
    f.e2e[0] = 11, f.qt[0] = 12, f.pt[0] = 13, f.dt[0] = 14, f.glen[0] = 15;
    struct text b = {0};
    vm_render(m, &f, 1, &b);
    text_add(&b, "", 1);
    static const char *const want[] = {
        "vllm:time_to_first_token_seconds_count{model_name=\"a\"} 101\n",
        "vllm:e2e_request_latency_seconds_count{model_name=\"a\"} 102\n",
        "vllm:time_per_output_token_seconds_count{model_name=\"a\"} 103\n",
        "vllm:request_prompt_tokens_count{model_name=\"a\"} 104\n",
        "vllm:request_generation_tokens_count{model_name=\"a\"} 105\n",
        "vllm:request_queue_time_seconds_count{model_name=\"a\"} 106\n",
        "vllm:request_prefill_time_seconds_count{model_name=\"a\"} 107\n",
        "vllm:request_decode_time_seconds_count{model_name=\"a\"} 108\n",
        "vllm:time_to_first_token_seconds_sum{model_name=\"a\"} 1.500000\n",
        "vllm:request_decode_time_seconds_sum{model_name=\"a\"} 8.500000\n",
        "vllm:e2e_request_latency_seconds_bucket{le=\"0.3\",model_name=\"a\"} 11\n",
        "vllm:request_queue_time_seconds_bucket{le=\"0.3\",model_name=\"a\"} 12\n",
        "vllm:request_prefill_time_seconds_bucket{le=\"0.3\",model_name=\"a\"} 13\n",
        "vllm:request_decode_time_seconds_bucket{le=\"0.3\",model_name=\"a\"} 14\n",
        "vllm:request_generation_tokens_bucket{le=\"1\",model_name=\"a\"} 15\n",
        /* b: no worker reports it, the front door's own */
        "vllm:time_to_first_token_seconds_count{model_name=\"b\"} 1\n",
        "vllm:request_prompt_tokens_sum{model_name=\"b\"} 30.000000\n",
        "vllm:request_generation_tokens_count{model_name=\"b\"} 1\n",
        "vllm:time_per_output_token_seconds_count{model_name=\"b\"} 0\n",
        "vllm:request_prefill_time_seconds_count{model_name=\"b\"} 0\n",
        "# HELP vllm:request_decode_time_seconds Seconds from the first token to the job's end, "
        "one per finished job (the workers' sums; empty where no worker reports them).\n"
        "# TYPE vllm:request_decode_time_seconds histogram\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(b.p, want[i]))
            fail_msg("missing: %s", want[i]);
    text_free(&b);
    vm_free(m);
}

/* One reading of heartbeats (JSON texts, n of them, named w0, w1...). */
static void fleet_read(struct fleet *f, const char *const *hbs, const char *const *names, int n)
{
    fleet_begin(f);
    for (int i = 0; i < n; i++) {
        cJSON *hb = cJSON_Parse(hbs[i]);
        assert_non_null(hb);
        assert_int_equal(fleet_observe(f, names[i], "q", hb), 0);
        cJSON_Delete(hb);
    }
    fleet_end(f);
}

/* Gauges are the live workers' sums; counters never go down when a
 * worker restarts (its totals drop) or leaves (its heartbeat expires). */
static void test_fleet_counters(void **state)
{
    (void)state;
    struct fleet *f = fleet_create();
    struct vm_fleet r[VM_MODELS];
    const char *names[] = {"w1", "w2"};
    const char *one[] = {
        "{\"model\":\"q\",\"running\":2,\"waiting\":1,\"kv_blocks\":10,\"kv_used\":4,"
        "\"prefix_hit_tokens\":5,\"prefix_miss_tokens\":15,\"preemptions\":1}",
        "{\"model\":\"q\",\"running\":1,\"kv_blocks\":30,\"kv_used\":6,"
        "\"prefix_hit_tokens\":0,\"prefix_miss_tokens\":7}"};
    fleet_read(f, one, names, 2);
    assert_int_equal(fleet_rows(f, r, VM_MODELS), 1);
    assert_string_equal(r[0].model, "q");
    assert_int_equal(r[0].n_workers, 2);
    assert_int_equal(r[0].running, 3);
    assert_int_equal(r[0].waiting, 1);
    assert_int_equal(r[0].kv_blocks, 40);
    assert_int_equal(r[0].kv_used, 10);
    assert_int_equal(r[0].prefix_queries, 27);
    assert_int_equal(r[0].prefix_hits, 5);
    assert_int_equal(r[0].preemptions, 1);
    /* w1 restarted (its totals start again), w2 is gone */
    const char *two[] = {"{\"model\":\"q\",\"prefix_hit_tokens\":1,\"prefix_miss_tokens\":2}"};
    fleet_read(f, two, names, 1);
    assert_int_equal(fleet_rows(f, r, VM_MODELS), 1);
    assert_int_equal(r[0].n_workers, 1);
    assert_int_equal(r[0].running, 0);
    assert_int_equal(r[0].kv_blocks, 0);
    assert_int_equal(r[0].prefix_queries, 27 + 3);
    assert_int_equal(r[0].prefix_hits, 5 + 1);
    assert_int_equal(r[0].preemptions, 1);
    /* nobody left: the counters stay */
    fleet_read(f, NULL, NULL, 0);
    assert_int_equal(fleet_rows(f, r, VM_MODELS), 1);
    assert_int_equal(r[0].n_workers, 0);
    assert_int_equal(r[0].prefix_queries, 30);
    /* w2's heartbeat comes back with the totals it had: counted once */
    const char *names2[] = {"w2"};
    const char *back[] = {"{\"model\":\"q\",\"running\":1,\"prefix_miss_tokens\":9}"};
    fleet_read(f, back, names2, 1);
    assert_int_equal(fleet_rows(f, r, VM_MODELS), 1);
    assert_int_equal(r[0].n_workers, 1);
    assert_int_equal(r[0].running, 1);
    assert_int_equal(r[0].prefix_queries, 30 + 2);
    fleet_free(f);
}

/* A heartbeat's histograms: TTFT buckets all b (the first 3: 0), e2e
 * buckets all b, n jobs, sums s seconds each; tpot: 2n gaps, buckets 2b
 * (the first 2: 0), sum 2s; prompt_len: buckets b (the first 4: 0), sum
 * 10n tokens; gen_len: buckets all b, sum s tokens. */
static char *hb_hist(int64_t b, int64_t n, double s)
{
    static char t[4][4096];
    static int k;
    char *o = t[k++ % 4];
    size_t z = sizeof t[0];
    int at = snprintf(o, z, "{\"model\":\"q\",\"ttft_buckets\":[");
    for (int i = 0; i < VB_N_TTFT; i++)
        at += snprintf(o + at, z - (size_t)at, "%s%lld", i ? "," : "",
                       (long long)(i < 3 ? 0 : b));
    at += snprintf(o + at, z - (size_t)at, "],\"ttft_count\":%lld,\"ttft_sum\":%g,"
                   "\"e2e_buckets\":[", (long long)n, s);
    for (int i = 0; i < VB_N_E2E; i++)
        at += snprintf(o + at, z - (size_t)at, "%s%lld", i ? "," : "", (long long)b);
    at += snprintf(o + at, z - (size_t)at, "],\"e2e_count\":%lld,\"e2e_sum\":%g,"
                   "\"tpot_buckets\":[", (long long)n, s);
    for (int i = 0; i < VB_N_TPOT; i++)
        at += snprintf(o + at, z - (size_t)at, "%s%lld", i ? "," : "",
                       (long long)(i < 2 ? 0 : 2 * b));
    at += snprintf(o + at, z - (size_t)at, "],\"tpot_count\":%lld,\"tpot_sum\":%g,"
                   "\"prompt_len_buckets\":[", (long long)(2 * n), 2 * s);
    for (int i = 0; i < VB_N_LEN; i++)
        at += snprintf(o + at, z - (size_t)at, "%s%lld", i ? "," : "",
                       (long long)(i < 4 ? 0 : b));
    at += snprintf(o + at, z - (size_t)at, "],\"prompt_len_count\":%lld,\"prompt_len_sum\":%lld,"
                   "\"gen_len_buckets\":[", (long long)n, (long long)(10 * n));
    for (int i = 0; i < VB_N_LEN; i++)
        at += snprintf(o + at, z - (size_t)at, "%s%lld", i ? "," : "", (long long)b);
    /* queue, prefill, decode times: the same jobs as e2e, their sums a
     * quarter, a quarter and a half of e2e's */
    at += snprintf(o + at, z - (size_t)at, "],\"gen_len_count\":%lld,\"gen_len_sum\":%g,"
                   "\"queue_time_buckets\":[", (long long)n, s);
    for (int i = 0; i < VB_N_E2E; i++)
        at += snprintf(o + at, z - (size_t)at, "%s%lld", i ? "," : "", (long long)b);
    at += snprintf(o + at, z - (size_t)at, "],\"queue_time_count\":%lld,\"queue_time_sum\":%g,"
                   "\"prefill_time_buckets\":[", (long long)n, s / 4);
    for (int i = 0; i < VB_N_E2E; i++)
        at += snprintf(o + at, z - (size_t)at, "%s%lld", i ? "," : "", (long long)b);
    at += snprintf(o + at, z - (size_t)at,
                   "],\"prefill_time_count\":%lld,\"prefill_time_sum\":%g,"
                   "\"decode_time_buckets\":[", (long long)n, s / 4);
    for (int i = 0; i < VB_N_E2E; i++)
        at += snprintf(o + at, z - (size_t)at, "%s%lld", i ? "," : "",
                       (long long)(i < 5 ? 0 : b));
    snprintf(o + at, z - (size_t)at, "],\"decode_time_count\":%lld,\"decode_time_sum\":%g}",
             (long long)n, s / 2);
    return o;
}

/* The workers' latency histograms summed per model like the counters:
 * bucket by bucket, never down when a worker restarts or leaves; a
 * malformed one counts as none; rendered instead of the front door's. */
static void test_fleet_hist(void **state)
{
    (void)state;
    struct fleet *f = fleet_create();
    struct vm_fleet r[VM_MODELS];
    const char *names[] = {"w1", "w2"};
    /* no histograms (older workers): none in the row */
    const char *old[] = {"{\"model\":\"q\"}"};
    fleet_read(f, old, names, 1);
    assert_int_equal(fleet_rows(f, r, VM_MODELS), 1);
    assert_false(r[0].hist);
    const char *one[] = {hb_hist(2, 3, 1.5), hb_hist(4, 4, 2.0)};
    fleet_read(f, one, names, 2);
    assert_int_equal(fleet_rows(f, r, VM_MODELS), 1);
    assert_true(r[0].hist);
    assert_int_equal(r[0].ttft[0], 0);
    assert_int_equal(r[0].ttft[3], 6);
    assert_int_equal(r[0].ttft[VB_N_TTFT - 1], 6);
    assert_int_equal(r[0].ttft_n, 7);
    assert_int_equal(r[0].e2e[0], 6);
    assert_int_equal(r[0].e2e_n, 7);
    assert_true(r[0].ttft_sum > 3.49 && r[0].ttft_sum < 3.51);
    assert_int_equal(r[0].tpot[1], 0);
    assert_int_equal(r[0].tpot[2], 12);
    assert_int_equal(r[0].tpot_n, 14);
    assert_true(r[0].tpot_sum > 6.99 && r[0].tpot_sum < 7.01);
    assert_int_equal(r[0].plen[3], 0);
    assert_int_equal(r[0].plen[4], 6);
    assert_int_equal(r[0].plen_n, 7);
    assert_true(r[0].plen_sum > 69.99 && r[0].plen_sum < 70.01);
    assert_int_equal(r[0].glen[0], 6);
    assert_int_equal(r[0].glen_n, 7);
    assert_int_equal(r[0].qt[0], 6);
    assert_int_equal(r[0].qt_n, 7);
    assert_true(r[0].qt_sum > 0.87 && r[0].qt_sum < 0.88);
    assert_int_equal(r[0].pt_n, 7);
    assert_true(r[0].pt_sum > 0.87 && r[0].pt_sum < 0.88);
    assert_int_equal(r[0].dt[4], 0);
    assert_int_equal(r[0].dt[5], 6);
    assert_int_equal(r[0].dt_n, 7);
    assert_true(r[0].dt_sum > 1.74 && r[0].dt_sum < 1.76);
    /* a heartbeat with TTFT/e2e but none of the newer three counts as
     * reporting none (a row's histograms count the same jobs): w2's last
     * totals stay */
    char partial[4096];
    snprintf(partial, sizeof partial, "%s", hb_hist(5, 5, 3.0));
    *strstr(partial, ",\"tpot_buckets\"") = 0;
    strcat(partial, "}");
    const char *part[] = {one[0], partial};
    fleet_read(f, part, names, 2);
    assert_int_equal(fleet_rows(f, r, VM_MODELS), 1);
    assert_int_equal(r[0].ttft_n, 7);
    assert_int_equal(r[0].tpot_n, 14);
    /* nor does one with all but decode_time */
    snprintf(partial, sizeof partial, "%s", hb_hist(5, 5, 3.0));
    *strstr(partial, ",\"decode_time_buckets\"") = 0;
    strcat(partial, "}");
    fleet_read(f, part, names, 2);
    assert_int_equal(fleet_rows(f, r, VM_MODELS), 1);
    assert_int_equal(r[0].ttft_n, 7);
    assert_int_equal(r[0].qt_n, 7);
    /* w1 restarted (one job since), w2 is gone: nothing goes down */
    const char *two[] = {hb_hist(1, 1, 0.25)};
    fleet_read(f, two, names, 1);
    assert_int_equal(fleet_rows(f, r, VM_MODELS), 1);
    assert_int_equal(r[0].ttft[3], 6 + 1);
    assert_int_equal(r[0].ttft_n, 7 + 1);
    assert_int_equal(r[0].e2e[VB_N_E2E - 1], 6 + 1);
    assert_true(r[0].e2e_sum > 3.74 && r[0].e2e_sum < 3.76);
    assert_int_equal(r[0].tpot_n, 14 + 2);
    assert_int_equal(r[0].plen_n, 7 + 1);
    assert_int_equal(r[0].glen[VB_N_LEN - 1], 6 + 1);
    assert_true(r[0].glen_sum > 3.74 && r[0].glen_sum < 3.76);
    assert_int_equal(r[0].qt_n, 7 + 1);
    assert_int_equal(r[0].dt[VB_N_E2E - 1], 6 + 1);
    assert_true(r[0].dt_sum > 1.87 && r[0].dt_sum < 1.88);
    /* a bad heartbeat (buckets not cumulative, too few) counts as none:
     * w1's totals stay counted */
    const char *bad[] = {"{\"model\":\"q\",\"ttft_buckets\":[3,1],\"ttft_count\":3,"
                         "\"ttft_sum\":1,\"e2e_buckets\":[],\"e2e_count\":3,\"e2e_sum\":1}"};
    fleet_read(f, bad, names, 1);
    assert_int_equal(fleet_rows(f, r, VM_MODELS), 1);
    assert_true(r[0].hist);
    assert_int_equal(r[0].ttft_n, 8);
    /* the page shows the fleet's, not the front door's own observation */
    struct vmetrics *m = vm_create();
    vm_first_token(m, "q", 0.002);
    vm_done(m, "q", 0.4, 1, 1, "stop");
    struct text b = {0};
    vm_render(m, r, 1, &b);
    text_add(&b, "", 1);
    static const char *const want[] = {
        "vllm:time_to_first_token_seconds_bucket{le=\"0.005\",model_name=\"q\"} 0\n",
        "vllm:time_to_first_token_seconds_bucket{le=\"0.02\",model_name=\"q\"} 7\n",
        "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"q\"} 8\n",
        "vllm:time_to_first_token_seconds_count{model_name=\"q\"} 8\n",
        "vllm:time_to_first_token_seconds_sum{model_name=\"q\"} 3.750000\n",
        "vllm:e2e_request_latency_seconds_count{model_name=\"q\"} 8\n",
        "# TYPE vllm:time_per_output_token_seconds histogram\n",
        "vllm:time_per_output_token_seconds_bucket{le=\"0.025\",model_name=\"q\"} 0\n",
        "vllm:time_per_output_token_seconds_bucket{le=\"80\",model_name=\"q\"} 14\n",
        "vllm:time_per_output_token_seconds_count{model_name=\"q\"} 16\n",
        "# TYPE vllm:request_prompt_tokens histogram\n",
        "vllm:request_prompt_tokens_bucket{le=\"10\",model_name=\"q\"} 0\n",
        "vllm:request_prompt_tokens_bucket{le=\"20\",model_name=\"q\"} 7\n",
        "vllm:request_prompt_tokens_count{model_name=\"q\"} 8\n",
        "vllm:request_prompt_tokens_sum{model_name=\"q\"} 80.000000\n",
        "# TYPE vllm:request_generation_tokens histogram\n",
        "vllm:request_generation_tokens_bucket{le=\"100000\",model_name=\"q\"} 7\n",
        "vllm:request_generation_tokens_bucket{le=\"+Inf\",model_name=\"q\"} 8\n",
        "# TYPE vllm:request_queue_time_seconds histogram\n",
        "vllm:request_queue_time_seconds_bucket{le=\"0.3\",model_name=\"q\"} 7\n",
        "vllm:request_queue_time_seconds_count{model_name=\"q\"} 8\n",
        "# TYPE vllm:request_prefill_time_seconds histogram\n",
        "vllm:request_prefill_time_seconds_count{model_name=\"q\"} 8\n",
        "# TYPE vllm:request_decode_time_seconds histogram\n",
        "vllm:request_decode_time_seconds_bucket{le=\"1.5\",model_name=\"q\"} 0\n",
        "vllm:request_decode_time_seconds_bucket{le=\"2\",model_name=\"q\"} 7\n",
        "vllm:request_decode_time_seconds_sum{model_name=\"q\"} 1.875000\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(b.p, want[i]))
            fail_msg("missing: %s\n%s", want[i], b.p);
    text_free(&b);
    /* without the fleet's, the front door's own */
    struct vm_fleet none = {.model = "q"};
    vm_render(m, &none, 1, &b);
    text_add(&b, "", 1);
    assert_non_null(strstr(b.p, "vllm:time_to_first_token_seconds_count{model_name=\"q\"} 1\n"));
    /* lengths from the front door's done events; no token gaps seen there */
    assert_non_null(strstr(b.p, "vllm:request_prompt_tokens_bucket{le=\"1\",model_name=\"q\"} 1\n"));
    assert_non_null(strstr(b.p, "vllm:request_generation_tokens_count{model_name=\"q\"} 1\n"));
    assert_non_null(strstr(b.p, "vllm:time_per_output_token_seconds_count{model_name=\"q\"} 0\n"));
    /* nor any admission: queue/prefill/decode times empty */
    assert_non_null(strstr(b.p, "vllm:request_queue_time_seconds_count{model_name=\"q\"} 0\n"));
    assert_non_null(strstr(b.p, "vllm:request_decode_time_seconds_count{model_name=\"q\"} 0\n"));
    text_free(&b);
    vm_free(m);
    fleet_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_responses_requests),
        cmocka_unit_test(test_ollama_requests),
        cmocka_unit_test(test_responses_events),
        cmocka_unit_test(test_responses_streamed_call),
        cmocka_unit_test(test_responses_thinking_only),
        cmocka_unit_test(test_responses_continued),
        cmocka_unit_test(test_responses_background),
        cmocka_unit_test(test_ollama_lines),
        cmocka_unit_test(test_anthropic_requests),
        cmocka_unit_test(test_anthropic_streamed_call),
        cmocka_unit_test(test_vmetrics),
        cmocka_unit_test(test_vmetrics_fleet),
        cmocka_unit_test(test_vmetrics_histograms),
        cmocka_unit_test(test_fleet_counters),
        cmocka_unit_test(test_fleet_hist),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
