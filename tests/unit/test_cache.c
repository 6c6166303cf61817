/* tests/unit/test_cache.c - replaying a result-cache value (common/cache.c),
 * which the worker and the dispatcher share: the done event gets cached,
 * the new request's timings and metadata, every other event is sent as it
 * was stored; a value that is not a complete event list replays nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <cjson/cJSON.h>

#include "cache.h"

static const char *good =
    "[{\"seq\":0,\"type\":\"delta\",\"delta\":{\"content\":\"Hi\"},\"token_ids\":[5]},"
    "{\"seq\":1,\"type\":\"done\",\"finish_reason\":\"stop\",\"cached\":false,"
    "\"timings\":{\"queue_ms\":1,\"ttft_ms\":2,\"total_ms\":3},\"metadata\":{\"old\":1}}]";

static void test_replay_rewrites_done(void **state)
{
    (void)state;
    struct rl_err err = {0};
    cJSON *meta = cJSON_Parse("{\"user\":\"u7\"}");
    char **ev;
    int n;
    assert_int_equal(cache_replay_events(good, strlen(good), "k", 1000, 1250, meta, &ev, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(ev[0], "{\"seq\":0,\"type\":\"delta\",\"delta\":{\"content\":\"Hi\"},\"token_ids\":[5]}");
    assert_string_equal(ev[1], "{\"seq\":1,\"type\":\"done\",\"finish_reason\":\"stop\",\"cached\":true,"
                               "\"timings\":{\"queue_ms\":250,\"ttft_ms\":250,\"total_ms\":250},"
                               "\"metadata\":{\"user\":\"u7\"}}");
    cache_events_free(ev, n);
    /* no metadata of its own: the stored one goes; t0 in the future: 0 ms */
    assert_int_equal(cache_replay_events(good, strlen(good), "k", 9999, 1250, NULL, &ev, &n, &err), 0);
    assert_null(strstr(ev[1], "metadata"));
    assert_non_null(strstr(ev[1], "\"queue_ms\":0"));
    cache_events_free(ev, n);
    cJSON_Delete(meta);
}

static void test_replay_refuses_incomplete(void **state)
{
    (void)state;
    static const char *bad[] = {
        "", "{}", "[]", "not json",
        "[{\"seq\":0,\"type\":\"delta\"}]",                                    /* no done */
        "[{\"seq\":0,\"type\":\"done\"},{\"seq\":1,\"type\":\"done\"}]",       /* done twice */
        "[{\"seq\":1,\"type\":\"done\"}]",                                     /* starts at 1 */
        "[{\"seq\":0,\"type\":\"delta\"},{\"seq\":2,\"type\":\"done\"}]",      /* a gap */
        "[{\"seq\":0},{\"seq\":1,\"type\":\"done\"}]",                         /* no type */
        "[{\"seq\":\"0\",\"type\":\"delta\"},{\"seq\":1,\"type\":\"done\"}]",  /* seq a string */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct rl_err err = {0};
        char **ev = (char **)1;
        int n = -1;
        int rc = cache_replay_events(bad[i], strlen(bad[i]), "cache-key-x", 1, 2, NULL, &ev, &n, &err);
        if (rc != -RL_EFORMAT)
            fail_msg("case %zu: rc %d", i, rc);
        assert_null(ev);
        assert_int_equal(n, 0);
        assert_non_null(strstr(err.msg, "cache-key-x"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_rewrites_done),
        cmocka_unit_test(test_replay_refuses_incomplete),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
