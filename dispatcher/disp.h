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
#include "modelref.h"
#include "rcluster.h"
#include "rconn.h"
#include "route.h"
#include "sha256.h"
#include "xmux.h"

#define D_MAX_POOLS 64 /* the shared pools, then every served model's own */
#define D_MAX_MODELS 16
#define D_KEY_MAX 384 /* <prefix>jobs:<model>:<pool> and :lora@<adapter> fit */
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
    /* prefix-affine pulling (issue 27, affinity.c) */
    int64_t aff_offers;       /* jobs offered to the worker holding their prefix */
    int64_t aff_fallbacks;    /* offers moved to the pool: not taken within affinity_wait_ms */
    int64_t aff_takeovers;    /* offers moved after their worker took them and died */
    int64_t aff_no_match;     /* forwarded to the pool: no single worker holds more */
    int64_t aff_deep;         /* forwarded to the pool: the worker's offers already deeper */
    int64_t fleet_hit_tokens, fleet_miss_tokens; /* live workers' prefix-cache counters */
};

/* Queue state of one pool stream, from XINFO GROUPS + XRANGE. */
struct dpool {
    char name[D_KEY_MAX];         /* "fast", or "<model>:fast" for a model's own pool */
    char key[D_KEY_MAX];          /* <prefix>jobs:<pool> or <prefix>jobs:<model>:<pool> */
    int64_t waiting;              /* entries not yet delivered to the workers group */
    int64_t wait_ms;              /* age of the oldest of them; 0 when none */
};

/* One intake stream: the shared <prefix>requests (index 0) or a tenant's
 * <prefix>requests:<tenant> (option tenants), each with the group
 * "dispatchers". */
#define D_MAX_INTAKE 33 /* requests and 32 tenants */
struct dintake {
    char key[D_KEY_MAX];
    char tenant[JOB_TENANT_MAX + 1]; /* "" for the shared stream */
    char claim_cursor[RCONN_ID_MAX];  /* XAUTOCLAIM's */
    char own_cursor[RCONN_ID_MAX];    /* the pass over our own pending entries */
    bool repair;                      /* an entry ID ahead of the clock was read: check it */
};

/* One served model, from the workers' heartbeats (models.c). A model whose
 * workers run pool_scope = model has streams and a router of its own (so
 * its think/fast split and backpressure are its own); one whose workers
 * share the pools uses d->router and the shared pools. */
struct dmodel {
    char name[MODELREF_NAME_MAX + 1];
    char owned_by[MODELREF_NAME_MAX + 1];
    int64_t created;              /* Unix seconds */
    int64_t max_model_len;        /* the least max_model_len of its workers' heartbeats; 0 = none */
    bool scoped;                  /* pool_scope = model: its own streams */
    bool alias;                   /* the dispatcher's served_model_name, not a worker's */
    struct router *router;        /* scoped: owned; else NULL (d->router) */
    int pool_idx[D_MAX_POOLS];    /* scoped: the router's pool i is d->pools[pool_idx[i]] */
    int n_pools;
    char pool_sig[512];           /* scoped: the pool names it was built for */
    int n_workers;                /* live workers announcing it (models.c, each refresh) */
    /* what its weights are, as the first heartbeat of the refresh said
     * (model_format, model_quantization, model_parameters): "" / 0 when a
     * worker from before did not say */
    char format[16];
    char quant[24];
    int64_t params;
};

/* One LoRA adapter a live worker serves beside its model (heartbeat
 * lora_adapters, models.c): a model name whose jobs go where its parent's
 * go, by the parent's router, carrying the adapter's name as `model`. */
#define D_MAX_LORAS 256
struct dlora {
    char name[MODELREF_NAME_MAX + 1];
    char parent[MODELREF_NAME_MAX + 1]; /* the served name of its base model */
    int rank;                           /* as the first heartbeat naming it said */
    int holders;                        /* live workers announcing it, of its parent's */
    int of;                             /* ... n_workers, at the last refresh */
    int readers;                        /* ... of the holders, those reading its stream */
    int pool;                           /* d->pools index of its stream; -1 none yet */
};

/* One worker as affinity.c knows it from its heartbeat. */
struct daff_worker {
    char name[RCONN_NAME_MAX];
    bool live;                    /* its heartbeat was there at the last refresh */
    bool seen;                    /* named in <prefix>workers at the last refresh */
    bool dead_keys;               /* gone: every pool's offer key was set for sweeping */
    uint8_t *bits;                /* (nbytes) its filter, owned; NULL = none */
    size_t nbytes;
    int block_size;
    int step_ms;                  /* its busy loop's period: it reads offers between steps */
    /* its offer stream for each of d->pools: "" when it serves none there */
    char offer[D_MAX_POOLS][D_KEY_MAX + RCONN_NAME_MAX + 4];
    int64_t backlog[D_MAX_POOLS]; /* offers there not yet delivered (estimate) */
    int64_t due_ms[D_MAX_POOLS];  /* its next sweep (wall ms); 0 = none due */
};

struct daff {
    bool on;                      /* cfg.affinity, a tokenizer, not a cluster */
    struct daff_worker *w;        /* (n) */
    int n, cap;
    int64_t next_refresh_ms, next_full_ms;
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
    char req_key[D_KEY_MAX];      /* <prefix>requests (= intake[0].key) */
    struct dintake intake[D_MAX_INTAKE]; /* [0] the shared stream, then the tenants' */
    const char *intake_keys[D_MAX_INTAKE]; /* -> intake[i].key */
    int n_intake;
    int own_stream;               /* the intake stream the own pass is reading */
    int64_t next_repair_ms;       /* the periodic intake check (repair_intake) */
    char dead_key[D_KEY_MAX];     /* <prefix>dead */
    /* the bell asked about before ringing (common/xmux.h): <prefix>bell, or
     * on a cluster a slot's (each answer rings its stream's slot's); named
     * by the first probe, once connected ("" until then) */
    char bell_key[D_KEY_MAX];
    struct xmux_ringer ringer;    /* whether it may ring */
    struct dpool pools[D_MAX_POOLS]; /* [0, n_shared): the configured pools */
    int n_pools, n_shared;
    /* the served models (models.c); refreshed at every heartbeat, and at
     * once (at most every 100 ms) when a job names one not in the table */
    struct dmodel models[D_MAX_MODELS];
    int n_models;
    int64_t models_t_ms;          /* when the table was read; 0 = never */
    struct dlora loras[D_MAX_LORAS]; /* the LoRA adapters, by the same refresh */
    int n_loras;
    bool loras_warned;            /* logged once: an adapter table overflow */
    bool pools_warned;            /* logged once: the pool table full (models.c) */
    pthread_mutex_t models_mu;    /* guards models_json, read by the HTTP threads */
    char *models_json;            /* [{"id","object","created","owned_by"}...], malloc'd */
    struct fleet *fleet;          /* the workers' figures for /metrics (fleet.h); owned */
    char fast_name[MODELREF_NAME_MAX + 1]; /* served name of the fast path's model */
    bool shared_warned;           /* logged once: several names on the shared pools */
    bool fleet_warned;            /* logged once: more workers than fleet.h tells apart */
    bool groups_ok;
    bool keys_cluster;            /* the keys above are in the cluster layout (d_make_keys) */
    /* pool shards (issue 27): on a cluster each pool stream key above is
     * shard 0 of n_shards (cfg.pool_shards; 1 on a single instance), the
     * others named by rcl_shard_key; a request is forwarded into the
     * shard of its id's slot (rcl_shard_for_slot) by a script that
     * leaves a marker there (loop.c, forward_first); markers whose XACK
     * is confirmed are deleted with the next round's forwards (fwd_gc) */
    int n_shards;
    long shard_n[RCL_MAX_SHARDS]; /* each shard's tag number (rcl_shard_n), found once */
    bool shards_warned;           /* logged once: a worker's pool_shards differs */
    char **fwd_gc;                /* (n_fwd_gc) marker keys, malloc'd */
    int n_fwd_gc, cap_fwd_gc;
    /* Our own pending entries (read, not yet acknowledged: after a start
     * under the same name, or a round that failed) are read again, from
     * own_cursor on, before new ones; a pass ends when such a read comes
     * back empty. A failure during a pass asks for another one
     * (own_again), which starts no sooner than next_own_ms, so an entry
     * that keeps failing cannot spin the loop. */
    bool own_pending, own_again;   /* cursors: intake[].own_cursor */
    int64_t next_own_ms;

    /* the result-cache fast path: off when model is "" */
    struct tokenizer *tok;
    char model_id[SHA256_HEX_LEN + 1];

    int64_t t_start_ms;
    int64_t next_stats_ms, next_hb_ms, next_claim_ms, next_wd_ms;
    /* d_run's SIGHUP flag, seen by commit (pair_ok): a reload waits for no
     * paired read */
    volatile sig_atomic_t *reload_req;
    char claim_cursor[RCONN_ID_MAX];
    uint64_t watchdog_usec;
    int64_t rate_t_ms, rate_n;    /* requests handled since rate_t_ms */

    struct dmetrics m;
    struct daff aff;
};

/* loop.c: runs until *stop; SIGHUP (*reload) re-reads the options. */
int d_run(struct disp *d, volatile sig_atomic_t *stop, volatile sig_atomic_t *reload);
/* loop.c: re-makes the router from d->cfg (start, and SIGHUP's reload). */
int d_make_router(struct disp *d, struct rl_err *err);
/* loop.c: a router over pools (n names) with the configured think rules
 * and ratio; on success it replaces *slot (the old one freed), on failure
 * *slot is kept. */
int d_router_replace(struct disp *d, const char *const *pools, int n, struct router **slot,
                     struct rl_err *err);

/* models.c */
/* Re-reads the served models: ZRANGE <prefix>workers, MGET of their
 * heartbeats; creates the streams, groups and routers of models with
 * their own pools. Keeps the old table when Redis fails. */
void d_models_refresh(struct disp *d);
#define D_MAX_WORKERS 1000 /* heartbeats read per refresh (reg_read_heartbeats) */
/* The destination of j: *m = the model (NULL: the shared pools, nothing
 * announced); when j's model is a LoRA adapter, *m is its parent and
 * *lora true (the job keeps the adapter's name as its model). Returns 0,
 * or -RL_EINVAL with *code MODEL_NOT_FOUND / MODEL_REQUIRED and msg
 * filled. */
int d_model_pick(struct disp *d, const struct job *j, struct dmodel **m, bool *lora,
                 enum ev_code *code, char *msg, size_t size);
/* The d->pools index of LoRA adapter name's own stream when its jobs go
 * there: while some live worker of its parent lacks it and some holder
 * reads the stream (workers started with it: worker/main.c). -1: its
 * parent's pools, as the router says (every worker holds it, so any may
 * take it, and prefix-affine offers apply). */
int d_lora_pool(const struct disp *d, const char *name);
void d_models_free(struct disp *d);
/* The routers of models are re-made from d->cfg (SIGHUP). */
void d_models_reroute(struct disp *d);

/* affinity.c: prefix-affine pulling (issue 27) */
/* Re-reads the workers' filters when affinity_refresh_ms has passed (all:
 * now). */
void da_refresh(struct disp *d, bool all);
/* The offer stream for job j (mode rendered, intake tenant, LoRA adapter
 * lora or NULL: the prefix-cache domain kv_salt_lora gives) routed to pool:
 * the key of the one live worker whose filter holds more of its prompt's
 * leading blocks than any other's, whose offers are not deeper than the
 * pool's queue; NULL for the pool. Counts the offer as made. */
const char *da_choose(struct disp *d, const struct job *j, enum job_mode mode, const char *tenant,
                      const char *lora, int pool);
/* The offer to key did not go out (its transaction failed). */
void da_unoffer(struct disp *d, const char *key);
/* Moves offers not taken within affinity_wait_ms (and those of dead
 * workers) to their pools: the streams due now, and all every heartbeat. */
void da_sweep(struct disp *d);
/* ms until the next sweep is due (the read's BLOCK is capped by it); -1 = none. */
int64_t da_next_due_ms(struct disp *d);
void da_free(struct disp *d);

/* metrics.c */
void dm_init(struct dmetrics *m);
/* The heartbeat JSON (KEYS.md); malloc'd. */
char *dm_heartbeat_json(struct disp *d);

/* Builds the shared pools' keys, req_key and dead_key: today's layout,
 * or the cluster one ({<prefix>} hash tag) once the connection found a
 * cluster (main.c; d_run calls it again then). */
void d_make_keys(struct disp *d, bool cluster);

#endif
