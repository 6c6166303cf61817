/* dispatcher/disp.h - the records the dispatcher's files share (private
 * to dispatcher/, as worker/worker.h is to the worker).
 *
 * Threading: everything belongs to the main thread, except struct
 * dmetrics, which other threads (the HTTP front door) read under its
 * mutex through dispatcher.h. */
#ifndef RL_DISP_H
#define RL_DISP_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "clock.h"
#include "config.h"
#include "dispatcher.h"
#include "job.h"
#include "log.h"
#include "rconn.h"
#include "route.h"
#include "sha256.h"

#define D_MAX_POOLS 16
#define D_KEY_MAX 256
#define D_BATCH 256 /* requests read and routed per round */

/* Counters behind /metrics and the heartbeat; guarded by mu. */
struct dmetrics {
    pthread_mutex_t mu;
    int64_t routed[D_MAX_POOLS];      /* forwarded to each pool */
    int64_t auto_routed[D_MAX_POOLS]; /* of those, decided by rule or ratio */
    int64_t cache_hits, cache_misses, invalid, overloaded, reclaimed;
    int64_t pool_waiting[D_MAX_POOLS];
    int64_t pool_wait_ms[D_MAX_POOLS];
    double ratio, ratio_effective;
    double requests_per_s;
    bool adaptive;
    bool ready;
};

/* Queue state of one pool stream, from XINFO GROUPS + XRANGE. */
struct dpool {
    char name[JOB_POOL_MAX + 1];
    char key[D_KEY_MAX];          /* <prefix>jobs:<pool> */
    int64_t waiting;              /* entries not yet delivered to the workers group */
    int64_t wait_ms;              /* age of the oldest of them; 0 when none */
};

struct disp {
    struct cfg cfg;               /* live options; SIGHUP swaps the live ones */
    int argc;
    char **argv;
    struct rl_log log;
    char name[RCONN_NAME_MAX];    /* consumer name in the dispatchers group */
    struct job_opts jopts;
    struct router *router;

    struct rconn *rc;
    struct rconn_batch *batch;
    char req_key[D_KEY_MAX];      /* <prefix>requests */
    char dead_key[D_KEY_MAX];     /* <prefix>dead */
    struct dpool pools[D_MAX_POOLS];
    int n_pools;
    bool groups_ok;
    /* Our own pending entries (read, not yet acknowledged: after a start
     * under the same name, or a round that failed) are read again, from
     * own_cursor on, before new ones; a pass ends when such a read comes
     * back empty. A failure during a pass asks for another one
     * (own_again), which starts no sooner than next_own_ms, so an entry
     * that keeps failing cannot spin the loop. */
    bool own_pending, own_again;
    char own_cursor[RCONN_ID_MAX];
    int64_t next_own_ms;

    /* the result-cache fast path: off when model is "" */
    struct tokenizer *tok;
    char model_id[SHA256_HEX_LEN + 1];

    int64_t t_start_ms;
    int64_t next_stats_ms, next_hb_ms, next_claim_ms, next_wd_ms;
    char claim_cursor[RCONN_ID_MAX];
    uint64_t watchdog_usec;
    int64_t rate_t_ms, rate_n;    /* requests handled since rate_t_ms */

    struct dmetrics m;
};

/* loop.c: runs until *stop; SIGHUP (*reload) re-reads the options. */
int d_run(struct disp *d, volatile sig_atomic_t *stop, volatile sig_atomic_t *reload);
/* loop.c: re-makes the router from d->cfg (start, and SIGHUP's reload). */
int d_make_router(struct disp *d, struct rl_err *err);

/* metrics.c */
void dm_init(struct dmetrics *m);
/* The heartbeat JSON (KEYS.md); malloc'd. */
char *dm_heartbeat_json(struct disp *d);

#endif
