/* dispatcher/route.h - where a request goes: the routing policy of the
 * dispatcher, with no Redis in it, so every rule is unit-tested as a pure
 * function (tests/unit/test_route.c).
 *
 * A request lands on one pool, decided in this order (first match wins):
 *   1. it names a pool (`pool`): that pool, which must exist;
 *   2. an explicit mode think / no_think: the think pool / the fast pool;
 *   3. a soft switch /think or /no_think in the last user message (as
 *      Qwen3 documents it; the last one in the message wins);
 *   4. a think rule (PCRE2 pattern) matching the last user message (or
 *      the prompt text): the think pool;
 *   5. otherwise (mode auto, or absent) the ratio splitter: a share
 *      `ratio` of these requests goes to think, the rest to the fast pool.
 * The think pool is the pool named "think" (the one job_mode_on runs in
 * think mode); the fast pool is default_pool, or, if that is "think", the
 * first other pool. Without a "think" pool everything goes to the fast one. */
#ifndef RL_ROUTE_H
#define RL_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "job.h"

/* Ratios are held as integer parts per million, so the splitter's
 * arithmetic is exact and its guarantee holds for any run length. */
#define ROUTE_PPM 1000000

/* The smooth split: a Bresenham accumulator. Each auto request adds
 * ratio_ppm; when the sum reaches ROUTE_PPM the request goes to think and
 * ROUTE_PPM is taken off. After k requests the think count is
 * floor((acc0 + k * ratio_ppm) / ROUTE_PPM), so over ANY window of n
 * consecutive requests (same ratio) it is floor or ceil of n * ratio: never
 * more than one away. acc starts at ROUTE_PPM / 2 (round to nearest). */
struct route_split {
    int64_t acc; /* [0, ROUTE_PPM) */
};
void route_split_init(struct route_split *s);
/* One auto request: true = think. ratio_ppm in [0, ROUTE_PPM]. */
bool route_split_next(struct route_split *s, int ratio_ppm);
/* r in [0, 1] -> parts per million, rounded; out of range is clamped. */
int route_ratio_ppm(double r);

/* A soft switch in text: ROUTE_SWITCH_THINK for "/think", _NO_THINK for
 * "/no_think", the last one in the text winning; NONE when there is none.
 * A switch must stand alone: at the start or after whitespace, and at the
 * end or before a character that is not [A-Za-z0-9_] ("/thinking" and
 * "a/think" are not switches). */
enum route_switch { ROUTE_SWITCH_NONE = 0, ROUTE_SWITCH_THINK, ROUTE_SWITCH_NO_THINK };
enum route_switch route_soft_switch(const char *text, size_t len);

/* The text rules and soft switches look at: the content of the last
 * message with role "user" (a string, or the "text" parts of a content
 * array joined with "\n"), or the prompt of a prompt job. NULL (and
 * *len 0) for prompt_ids jobs and messages without a user turn. Returns
 * a malloc'd NUL-terminated string, or NULL. */
char *route_user_text(const struct job *j, size_t *len);

/* The adaptive shift, a pure function of the configured ratio, its
 * bounds, the threshold and the two pools' queue waits (ms, age of the
 * oldest job no worker has taken; 0 when none waits):
 *   off, or neither pool past threshold, or both: the configured ratio;
 *   only think past it: min_ratio (auto requests move to fast), but never
 *     above the configured ratio;
 *   only fast past it: max_ratio (they move to think), never below it.
 * "Past" is strictly greater. */
struct route_adapt {
    bool adaptive;
    double ratio, min_ratio, max_ratio;
    int64_t threshold_ms;
    int64_t think_wait_ms, fast_wait_ms;
};
double route_effective_ratio(const struct route_adapt *a);

/* Why a request went where it went (metrics, debug log). */
enum route_reason {
    ROUTE_BY_POOL = 1, ROUTE_BY_MODE, ROUTE_BY_SWITCH, ROUTE_BY_RULE, ROUTE_BY_RATIO,
};
const char *route_reason_name(enum route_reason r);

struct route_decision {
    int pool;                 /* index into the router's pools */
    enum job_mode mode;       /* effective: JOB_MODE_THINK or JOB_MODE_NO_THINK */
    enum route_reason reason;
    bool is_auto;             /* decided by rule or ratio (counted as auto_routed) */
};

struct route_opts {
    const char *const *pools; /* (n_pools) names; copied */
    int n_pools;
    const char *default_pool; /* must be one of pools */
    const char *const *rules; /* (n_rules) PCRE2 patterns; compiled, not kept */
    int n_rules;
    double ratio;             /* configured think share, [0, 1] */
};

/* A router: the pools, the compiled rules and the split state. Used by
 * one thread (the dispatcher's main loop). */
struct router;

/* Compiles the rules (a bad pattern: -RL_EINVAL naming it and the offset
 * of the error) and checks the pools. */
int route_create(struct router **out, const struct route_opts *o, struct rl_err *err);
void route_free(struct router *r);
/* The ratio the splitter uses from now on (adaptive routing moves it);
 * the split state is kept, so the within-one guarantee holds over every
 * stretch of constant ratio. */
void route_set_ratio(struct router *r, double ratio);
double route_get_ratio(const struct router *r);
int route_think_pool(const struct router *r); /* -1 when there is none */
int route_fast_pool(const struct router *r);
const char *route_pool_name(const struct router *r, int pool);
int route_n_pools(const struct router *r);

/* Decides j's pool and effective mode. A pool named by the job that is
 * not configured: -RL_EINVAL with *code = EV_CODE_UNKNOWN_POOL. */
int route_decide(struct router *r, const struct job *j, struct route_decision *d,
                 enum ev_code *code, struct rl_err *err);

#endif
