/* tests/unit/test_dmetrics.c - the dispatcher's counters as the HTTP front
 * door will serve them (disp_metrics_text) and as its heartbeat JSON (the
 * format of the notes on the key namespace), from a hand-filled struct
 * disp: exact lines, per-pool labels, readiness. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "dispatcher/disp.h"

static struct disp *make(void)
{
    struct disp *d = calloc(1, sizeof *d);
    dm_init(&d->m);
    snprintf(d->name, sizeof d->name, "d1");
    d->n_pools = 2;
    snprintf(d->pools[0].name, sizeof d->pools[0].name, "fast");
    snprintf(d->pools[1].name, sizeof d->pools[1].name, "think");
    d->t_start_ms = rl_wall_ms() - 5000;
    d->m.routed[0] = 700;
    d->m.routed[1] = 301;
    d->m.auto_routed[0] = 690;
    d->m.auto_routed[1] = 300;
    d->m.cache_hits = 12;
    d->m.cache_misses = 34;
    d->m.invalid = 5;
    d->m.overloaded = 6;
    d->m.pool_waiting[1] = 50;
    d->m.pool_wait_ms[1] = 1234;
    d->m.ratio = 0.3;
    d->m.ratio_effective = 0.1;
    d->m.adaptive = true;
    return d;
}

static void test_metrics_text(void **state)
{
    (void)state;
    struct disp *d = make();
    assert_false(disp_ready(d));
    char *t = disp_metrics_text(d);
    assert_non_null(t);
    static const char *const lines[] = {
        "# TYPE redlm_dispatcher_routed_total counter\n",
        "redlm_dispatcher_routed_total{pool=\"fast\"} 700\n",
        "redlm_dispatcher_routed_total{pool=\"think\"} 301\n",
        "redlm_dispatcher_auto_routed_total{pool=\"think\"} 300\n",
        "redlm_dispatcher_pool_waiting{pool=\"think\"} 50\n",
        "redlm_dispatcher_pool_waiting{pool=\"fast\"} 0\n",
        "redlm_dispatcher_pool_wait_seconds{pool=\"think\"} 1.234\n",
        "redlm_dispatcher_think_ratio 0.300000\n",
        "redlm_dispatcher_think_ratio_effective 0.100000\n",
        "redlm_dispatcher_cache_hits_total 12\n",
        "redlm_dispatcher_cache_misses_total 34\n",
        "redlm_dispatcher_invalid_total 5\n",
        "redlm_dispatcher_overloaded_total 6\n",
        "redlm_dispatcher_ready 0\n",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        if (!strstr(t, lines[i]))
            fail_msg("missing line %s in:\n%s", lines[i], t);
    free(t);
    pthread_mutex_lock(&d->m.mu);
    d->m.ready = true;
    pthread_mutex_unlock(&d->m.mu);
    assert_true(disp_ready(d));
    t = disp_metrics_text(d);
    assert_non_null(strstr(t, "redlm_dispatcher_ready 1\n"));
    free(t);
    pthread_mutex_destroy(&d->m.mu);
    free(d);
}

static void test_heartbeat_json(void **state)
{
    (void)state;
    struct disp *d = make();
    char *s = dm_heartbeat_json(d);
    cJSON *o = cJSON_Parse(s);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "name")->valuestring, "d1");
    assert_int_equal(cJSON_GetObjectItem(o, "pid")->valueint, getpid());
    assert_in_range(cJSON_GetObjectItem(o, "uptime_s")->valueint, 4, 6);
    assert_true(cJSON_GetObjectItem(o, "time_ms")->valuedouble > 1.6e12);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "routed"), "think")->valueint, 301);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "auto_routed"), "fast")->valueint, 690);
    assert_true(cJSON_GetObjectItem(o, "think_ratio")->valuedouble == 0.3);
    assert_true(cJSON_GetObjectItem(o, "think_ratio_effective")->valuedouble == 0.1);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(o, "adaptive")));
    static const char *const counts[] = {"cache_hits", "cache_misses", "invalid", "overloaded"};
    static const int want[] = {12, 34, 5, 6};
    for (int i = 0; i < 4; i++)
        assert_int_equal(cJSON_GetObjectItem(o, counts[i])->valueint, want[i]);
    assert_non_null(cJSON_GetObjectItem(o, "requests_per_s"));
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "pool_waiting"), "think")->valueint, 50);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "pool_wait_ms"), "think")->valueint, 1234);
    cJSON_Delete(o);
    free(s);
    pthread_mutex_destroy(&d->m.mu);
    free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_text),
        cmocka_unit_test(test_heartbeat_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
