/* worker/wopts.h - the worker's options: one table (name, type, default,
 * bounds, field, help) from which the libconfig loader, the command-line
 * flags, --help and --print-config all come.
 *
 * This is the worker's private table until common/config.h (the table
 * shared with the dispatcher) lands; the option names are the ones that
 * file documents, so moving over changes no config file. */
#ifndef RL_WOPTS_H
#define RL_WOPTS_H

#include <stdbool.h>
#include <stdio.h>

#include "err.h"

#define WOPTS_MAX_POOLS 8
#define WOPTS_STR_MAX 256

struct wopts {
    char config_file[WOPTS_STR_MAX]; /* "" when running on flags alone */
    char redis[WOPTS_STR_MAX];       /* host:port or unix:/path */
    char redis_user[WOPTS_STR_MAX];
    char redis_password_file[WOPTS_STR_MAX];
    char prefix[64];                 /* key prefix, "redlm:" */
    char group[64];                  /* consumer group on every pool stream */
    char name[WOPTS_STR_MAX];        /* consumer name; "" = host-pid */
    char pools[WOPTS_STR_MAX];       /* comma list in priority order */
    char model[WOPTS_STR_MAX];
    char backend[16];
    char log_level[16];
    char metrics_addr[64];
    int threads;
    int kv_mb;
    int max_batch;
    int token_budget;
    int read_block_ms;       /* XREADGROUP BLOCK when idle */
    int claim_idle_ms;       /* XAUTOCLAIM jobs idle longer than this */
    int claim_interval_ms;   /* how often to look for them */
    int lease_renew_ms;      /* XCLAIM JUSTID on our running jobs this often */
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
    bool publish;            /* also PUBLISH every event on <prefix>tok:<id> */
};

/* Fills every field with its table default. */
void wopts_default(struct wopts *o);

/* Parses argv (after argv[0]): -c/--config FILE is loaded first, then the
 * other flags override it. Returns 0, 1 when --help or --print-config was
 * handled (the caller exits 0), or -RL_EINVAL naming the flag, or the file,
 * line and reason of a bad config. */
int wopts_parse_args(struct wopts *o, int argc, char **argv, struct rl_err *err);

/* Loads a libconfig file over *o. Unknown settings are errors. */
int wopts_load_file(struct wopts *o, const char *path, struct rl_err *err);

/* Splits o->pools into names (at most WOPTS_MAX_POOLS, each static inside
 * bufs). Returns the count, or -RL_EINVAL for an empty or bad list. */
int wopts_pools(const struct wopts *o, char bufs[WOPTS_MAX_POOLS][64], struct rl_err *err);

/* Writes a documented sample config with every option at its default. */
void wopts_print_config(FILE *f);

#endif
