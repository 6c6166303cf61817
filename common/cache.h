/* common/cache.h - the result cache's stored value, as both readers of it
 * replay it: the worker (a cache hit at admission) and the dispatcher (its
 * fast path, no worker involved).
 *
 * The value under <prefix>cache:<key> is the JSON array of a finished
 * job's events exactly as they were published, seq 0..n-1, ending with its
 * done event. A replay sends the same events under the same seq numbers;
 * only the done event changes: cached becomes true, timings are the new
 * request's (queue = ttft = total = the time it waited), and metadata is
 * the new request's own. Both readers must replay alike, or a request would
 * look different depending on who answered it. */
#ifndef RL_CACHE_H
#define RL_CACHE_H

#include <stdint.h>

#include "err.h"

struct cJSON;

/* Checks the whole value before producing anything (a truncated or foreign
 * value replays nothing), then rewrites it for the new request: t0 is when
 * it was enqueued (ignored when <= 0 or later than now, Unix ms), metadata
 * its metadata or NULL (borrowed). On success *events is a malloc'd array
 * of *n malloc'd event strings, in seq order (cache_events_free). Returns 0,
 * -RL_EFORMAT naming key when the value is not a complete event list, or
 * -RL_ENOMEM. */
int cache_replay_events(const char *value, size_t len, const char *key, int64_t t0, int64_t now,
                        const struct cJSON *metadata, char ***events, int *n,
                        struct rl_err *err);

void cache_events_free(char **events, int n);

#endif
