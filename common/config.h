/* common/config.h - the options of the worker and the dispatcher.
 *
 * One table in config.c holds every option (name, type, default, bounds,
 * help, where it lives in struct cfg, whether SIGHUP can change it). The
 * libconfig file loader, the command-line flags, --help and the documented
 * sample file config/redlm.conf are all driven by that table, so they
 * cannot disagree. Precedence: defaults < file (-c FILE) < flags. The
 * worker runs with no file at all. */
#ifndef RL_CONFIG_H
#define RL_CONFIG_H

#include <stdbool.h>
#include <stdio.h>

#include "err.h"

struct job_opts;
struct rconn_opts;

/* A list of strings ("fast", "think"), owned by the struct cfg. */
struct cfg_strlist {
    int n;
    char **v; /* (n) NUL-terminated */
};

/* Every option, after loading. Strings and lists are owned by the struct
 * (cfg_free); see config/redlm.conf or --help for each option's meaning,
 * default and bounds. */
struct cfg {
    /* Redis */
    char *redis;                  /* host:port, [v6]:port, unix:/path or /path */
    char *redis_user;             /* ACL user, "" = none */
    char *redis_password_file;    /* "" = no AUTH */
    int redis_connect_timeout_ms;
    int redis_io_timeout_ms;
    int redis_backoff_max_ms;
    char *prefix;                 /* key prefix, "redlm:" */
    /* what this worker serves */
    struct cfg_strlist pools;     /* in the order they are read */
    char *name;                   /* consumer name; "" = the host name */
    char *default_pool;           /* dispatcher: jobs naming no pool go here */
    /* engine */
    char *model;                  /* model directory or Hugging Face repo id (modelref.h) */
    struct cfg_strlist lora_modules; /* worker: "NAME=DIR" LoRA adapters (modelref_lora_parse); may be empty */
    struct cfg_strlist lora_dirs; /* worker: where runtime adapters may come from; empty = none */
    bool runtime_lora;            /* dispatcher: POST /v1/load_lora_adapter and /v1/unload_lora_adapter */
    int runtime_lora_timeout_s;   /* dispatcher: how long those wait for the workers */
    struct cfg_strlist runtime_lora_tenants; /* dispatcher: with API keys, who may call them; empty = every key */
    char *served_model_name;      /* "" = derived from model (modelref.h) */
    char *pool_scope;             /* "shared" (jobs:<pool>) or "model" (jobs:<name>:<pool>) */
    char *backend;                /* "cpu", "cuda" or "sim" */
    int device;                   /* CUDA device ordinal */
    char *sim_profile;            /* sim: "h200", "h100", "a100", "l40s" */
    char *sim_model;              /* sim: built-in shape or config.json; "" = model's */
    int threads;                  /* 0 = one per core */
    bool mmap_weights;            /* CPU: weights used in place from the file mapping */
    char *quantize;               /* CPU: "none" or "q8_0" (BF16 checkpoints quantized at load) */
    int kv_budget_mb;             /* 0 = the engine's default, 1 GiB */
    bool kv_prefault;             /* commit the KV pool at start */
    int kv_reserve_mb;            /* CUDA: left free when sizing KV from the device */
    int max_batch;                /* running requests */
    int max_batch_tokens;         /* tokens per step */
    int prefill_chunk;            /* prompt tokens per request per step */
    char *speculative;            /* "off" or "ngram" */
    int spec_tokens;              /* draft tokens per request per step */
    int spec_max_rows;            /* no drafts in a step of this many tokens; 0 = backend's */
    int max_compiling;            /* requests waiting for a compile; 0 = 2 x max_batch */
    int grammar_compile_threads;  /* 0 = the engine's default */
    int grammar_cache_mb;         /* compiled constraints' memory */
    /* jobs */
    int default_max_tokens;
    int max_job_kb;
    int stream_ttl_s;
    int coalesce_ms;              /* hold token deltas up to this long; 0 = off */
    bool publish_overlap;         /* flush while the next step computes */
    int publish_buffer_kb;        /* a job's unstored events kept at most; past it: given up */
    int max_stream_ttl_s;
    bool result_cache;
    int cache_ttl_s;
    bool publish_channel;
    int dead_maxlen;              /* cap of redlm:dead; 0 = none */
    /* queue */
    int block_ms;
    int pool_shards;              /* cluster: hash tags per pool stream (rcl_shard_key) */
    int home_shard;               /* cluster: the shard a worker prefers, -1 = next of {<prefix>}homes */
    int foreign_room_pct;         /* below this % free: other shards only polled */
    int steal_ms;                 /* their poll interval */
    int claim_idle_ms;
    int claim_interval_ms;
    int lease_renew_ms;
    int max_deliveries;
    /* process */
    int drain_timeout_s;
    int heartbeat_interval_ms;
    int heartbeat_ttl_s;
    int http_port;                /* 127.0.0.1 only; 0 = off */
    char *metrics_bind;           /* worker: the address http_port listens on, 127.0.0.1 */
    char *log_level;              /* error|warn|info|debug */
    /* dispatcher routing */
    double think_ratio;           /* [0, 1]: share of auto requests sent to think */
    bool adaptive;                /* shift auto requests away from a backed-up pool */
    int adaptive_wait_ms;         /* queue wait that counts as backed up */
    double adaptive_min_ratio;    /* bounds of the effective ratio */
    double adaptive_max_ratio;
    struct cfg_strlist think_rules; /* PCRE2 patterns; may be empty */
    int max_waiting;              /* OVERLOADED above this many waiting jobs; 0 = off */
    int retry_after_ms;           /* told to overloaded clients */
    /* dispatcher: the OpenAI-compatible HTTP front door (dispatcher/http.c) */
    int http;                     /* port; 0 = off */
    char *http_bind;              /* listen address, 127.0.0.1 */
    char *api_keys_file;          /* "" = no authentication */
    int max_body_kb;
    int max_messages;
    int http_max_tokens;
    int http_max_connections;     /* one thread each */
    int http_timeout_s;           /* a request's deadline; 0 = none */
    int http_idle_timeout_s;
    bool http_shared_reader;
    char *http_default_mode;      /* think|no_think|auto: chat requests that choose none */
    struct cfg_strlist http_cors_origins; /* allowed Origin values, "*" = any; empty = CORS off */
    int http_header_timeout_s;    /* request line + headers within this of connecting */
    int http_min_body_rate;       /* bytes/s a request body must keep up; 0 = off */
    int http_max_connections_per_ip; /* 0 = no limit */
    int http_max_pending;         /* waiting connections with the full deadline; 0 = no cap */
    int http_max_pending_per_ip;  /* the same per client address; 0 = no cap */
    int http_auth_failures_per_min; /* per client address; 0 = no limit */
    int http_client_lease_ms;     /* jobs' client lease; 0 = off */
    char *http_unknown_fields;    /* ignore|refuse: unknown request fields (issue 29) */
    int responses_store_ttl_s;    /* stored Responses' TTL (dispatcher/rstore.h); 0 = none */
    int responses_store_max_kb;   /* the largest input a stored response keeps */
    int conversation_ttl_s;       /* Conversations' TTL (dispatcher/convo.h); 0 = none */
    /* issue 26: tenants and bounded dead letters */
    struct cfg_strlist tenants;   /* dispatcher: also read <prefix>requests:<tenant>; may be empty */
    int dead_max_mb;              /* redlm:dead holds at most about this many MiB; 0 = no cap */
    /* issue 27: prefix-affine pulling */
    bool affinity;                /* offers by prefix (dispatcher), filter + offer streams (worker) */
    int affinity_wait_ms;         /* dispatcher: an offer's wait before any worker may take it */
    int affinity_filter_bytes;    /* worker: the published filter's size */
    int affinity_refresh_ms;      /* worker: filter recompute; dispatcher: filter re-read */
};

/* Which program an option is for (--help shows only the program's own;
 * a file may hold both programs' options). */
enum cfg_who { CFG_WORKER = 1u << 0, CFG_DISPATCHER = 1u << 1, CFG_BOTH = 3u };

/* What cfg_load found on the command line besides options. */
enum cfg_action { CFG_RUN = 0, CFG_HELP, CFG_PRINT_CONFIG };

/* Fills *c with the defaults. cfg_free releases it. Returns 0 or
 * -RL_ENOMEM. */
int cfg_defaults(struct cfg *c, struct rl_err *err);
void cfg_free(struct cfg *c);

/* Applies a libconfig file over *c. Every setting must be a known option
 * of the right type within bounds; errors read "FILE:LINE: reason". On
 * error *c is unchanged. */
int cfg_load_file(struct cfg *c, const char *path, struct rl_err *err);

/* Applies flags over *c: --opt VALUE, --opt=VALUE (underscores in option
 * names may be written as dashes), --opt / --no-opt for booleans. Only
 * the options of who are accepted as flags. -c/--config FILE, -h/--help
 * and --print-config are recognised and skipped (cfg_load handles them).
 * On error *c is unchanged. */
int cfg_apply_args(struct cfg *c, int argc, char **argv, unsigned who, struct rl_err *err);

/* The whole sequence for program who (CFG_WORKER or CFG_DISPATCHER):
 * defaults, the file from -c/--config if any, the flags, then the checks
 * across options. *action says whether --help (then nothing else is
 * checked) or --print-config was asked for. On error *c is left empty
 * (cfg_free is still safe). */
int cfg_load(struct cfg *c, int argc, char **argv, unsigned who, enum cfg_action *action,
             struct rl_err *err);

/* The checks across options that matter to who (lease_renew_ms <
 * claim_idle_ms, default_pool in pools for the dispatcher, ...). */
int cfg_check(const struct cfg *c, unsigned who, struct rl_err *err);

/* SIGHUP: copies into *dst the options marked live from *src (a freshly
 * loaded config), then runs cfg_check; the others keep their values. On
 * error *dst is unchanged. */
int cfg_apply_live(struct cfg *dst, const struct cfg *src, unsigned who, struct rl_err *err);

/* The usage text for prog, listing the options for who. */
void cfg_print_help(FILE *f, const char *prog, unsigned who);

/* The documented sample file, every option at its default: what
 * config/redlm.conf holds (a unit test keeps the two equal). */
void cfg_write_sample(FILE *f);

/* c->name, or the host name when it is empty. */
void cfg_worker_name(const struct cfg *c, char *buf, size_t size);

/* Fills the option records of the modules the options are for. The
 * strings point into *c and live as long as it. */
void cfg_job_opts(const struct cfg *c, struct job_opts *o);
/* The MAXLEN of XADD <prefix>dead: dead_maxlen, or fewer so that the
 * letters (each at most EV_DEAD_LETTER_MAX bytes) stay within dead_max_mb;
 * 0 = no cap. */
long cfg_dead_maxlen(const struct cfg *c);
void cfg_rconn_opts(const struct cfg *c, struct rconn_opts *o);

#endif
