/* common/registry.h - reading the fleet's registry of workers: the sorted
 * set <prefix>workers (member = worker name, score = its last heartbeat,
 * written by worker/publish.c) and each member's heartbeat
 * <prefix>worker:<name> (schemas/README.md). The dispatcher reads it for
 * its model table and affinity filters, a cluster worker once at start for
 * its home shard. */
#ifndef RL_REGISTRY_H
#define RL_REGISTRY_H

#include "err.h"
#include "rconn.h"

/* The first max registered workers (ZRANGE) and their heartbeats (one
 * MGET, one reply per name: nil for an expired one), in two round trips.
 * The caller frees both replies; both are NULL on failure, then err is
 * filled (-RL_EFORMAT when the registry is not a sorted set). With no
 * worker registered *hbs is NULL on success too (no MGET is sent). */
int reg_read_heartbeats(struct rconn *c, const char *prefix, int max,
                        struct rconn_reply **names, struct rconn_reply **hbs, struct rl_err *err);

/* reg_read_heartbeats, then fn(ctx, name, hb) for each live worker whose
 * heartbeat is JSON (expired and malformed ones are skipped; hb is freed
 * once fn returns). Returns 0, or reg_read_heartbeats' error. */
struct cJSON;
int reg_each_heartbeat(struct rconn *c, const char *prefix, int max,
                       void (*fn)(void *ctx, const char *name, const struct cJSON *hb), void *ctx,
                       struct rl_err *err);

#endif
