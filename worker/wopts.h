/* worker/wopts.h - the worker's flat copy of its options.
 *
 * The options themselves (names, defaults, bounds, help, which ones
 * SIGHUP may change) live in one table in common/config.c, shared with the
 * dispatcher; this is the worker's view of a loaded struct cfg, copied
 * into fixed fields so that the worker's files read plain values and no
 * pointer into a struct cfg outlives a reload. */
#ifndef RL_WOPTS_H
#define RL_WOPTS_H

#include <stdbool.h>

#include "err.h"

#define WOPTS_MAX_POOLS 8
#define WOPTS_STR_MAX 256

struct wopts {
    char redis[WOPTS_STR_MAX];       /* host:port or unix:/path */
    char redis_user[WOPTS_STR_MAX];
    char redis_password_file[WOPTS_STR_MAX];
    int redis_connect_timeout_ms, redis_io_timeout_ms, redis_backoff_max_ms;
    char prefix[64];                 /* key prefix, "redlm:" */
    char group[64];                  /* consumer group on every pool stream: "workers" */
    char name[WOPTS_STR_MAX];        /* consumer name */
    char pools[WOPTS_STR_MAX];       /* comma list in priority order */
    char model[WOPTS_STR_MAX];       /* as given: a directory or a repo id (modelref.h) */
    char served_name[WOPTS_STR_MAX]; /* served_model_name; "" = derived from model */
    bool pool_scope_model;           /* pool_scope = model: streams jobs:<name>:<pool> */
    char backend[16];
    char sim_profile[16];           /* sim backend: device profile */
    char sim_model[WOPTS_STR_MAX];  /* sim backend: model shape; "" = model's */
    char log_level[16];
    char metrics_addr[64];           /* metrics_bind: 127.0.0.1 unless configured */
    int device;                      /* engine_options.device (CUDA) */
    int threads;
    int mmap_weights;                /* engine_options.mmap_weights (CPU) */
    char quantize[8];                /* engine_options.quantize (CPU): "none" | "q8_0" */
    int kv_mb;                       /* 0: the engine's default */
    int kv_reserve_mb;               /* CUDA: device memory left free */
    int kv_prefault;                 /* engine_options.kv_prefault */
    int max_batch;
    int token_budget;
    int prefill_chunk;
    char speculative[16];            /* "off" or "ngram" */
    int spec_tokens;
    int spec_max_rows;
    int max_compiling;            /* resolved: never 0 */
    int grammar_compile_threads;
    int grammar_cache_mb;
    int read_block_ms;       /* XREADGROUP BLOCK when idle */
    int claim_idle_ms;       /* XAUTOCLAIM jobs idle longer than this */
    int claim_interval_ms;   /* how often to look for them */
    int lease_renew_ms;      /* XCLAIM JUSTID on our jobs this often */
    int max_deliveries;      /* more deliveries than this: dead letter */
    int cache_ttl_s;         /* 0: no result cache */
    int heartbeat_ms;
    int heartbeat_ttl_s;
    int metrics_port;        /* 0: no HTTP endpoint */
    int drain_timeout_s;
    int dead_maxlen;
    int max_job_kb;
    int default_max_tokens;
    int max_max_tokens;
    int default_stream_ttl_s;
    int max_stream_ttl_s;
    int coalesce_ms;         /* coalesce_ms: deltas held back at most this long; 0 = off */
    bool publish;            /* also PUBLISH every event on <prefix>tok:<id> */
    bool publish_overlap;    /* flush while the next step computes (loop.c) */
    int publish_buffer_kb;   /* a job's unstored events kept at most (KiB); past it: given up */
};

/* Defaults (common/config.c's table). */
void wopts_default(struct wopts *o);

struct cfg;

/* Loads defaults, -c FILE and the flags (argv after argv[0]) through
 * cfg_load. keep (may be NULL) receives the loaded struct cfg, which
 * wopts_reload needs (the caller cfg_frees it). Returns 0, 1 when --help
 * or --print-config was handled (the caller exits 0), or a negative code
 * naming the flag, or the file, line and reason of a bad config. */
int wopts_parse_args(struct wopts *o, struct cfg *keep, int argc, char **argv,
                     struct rl_err *err);

/* SIGHUP: loads the file and flags again and takes from them exactly the
 * options common/config.c's table marks live (cfg_apply_live) into *keep,
 * then rebuilds *o from *keep; every other option keeps its running value
 * (the model, Redis, pools, name and engine sizes need a restart). On
 * error *o and *keep are unchanged. */
int wopts_reload(struct wopts *o, struct cfg *keep, int argc, char **argv, struct rl_err *err);

/* Splits o->pools into names (at most WOPTS_MAX_POOLS). Returns the count,
 * or -RL_EINVAL for an empty or bad list. */
int wopts_pools(const struct wopts *o, char bufs[WOPTS_MAX_POOLS][64], struct rl_err *err);

#endif
