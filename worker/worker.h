/* worker/worker.h - the records the worker's files share: the worker, and
 * one job it holds from delivery until its XACK.
 *
 * This header is private to worker/ (main, loop, publish, resume, cache,
 * metrics): the worker is one program, and its parts work on one set of
 * records, so they are spelt out here rather than hidden behind handles.
 * Nothing outside worker/ includes it.
 *
 * A job's life (struct wjob.state):
 *   WJ_RUNNING   submitted to the engine; its events go into the outbox
 *   WJ_CLOSING   done (or the final error) is in the outbox: no more events
 *   WJ_ACKING    every event, the dead letter and the cache entry are
 *                confirmed by Redis; the XACK goes out with the next flush
 *   (freed)      once the XACK's reply is read.
 *   WJ_DROPPED   another worker took the job over (fence.h): nothing more
 *                is written or acknowledged; freed once the engine has
 *                delivered the cancel's final event.
 * Jobs are only ever acknowledged after their last event is confirmed, so
 * a worker that dies at any point leaves the job pending for another to
 * reclaim and resume.
 *
 * Threading: everything here belongs to the main thread, except struct
 * wmetrics, which the HTTP thread reads under its mutex. */
#ifndef RL_WORKER_H
#define RL_WORKER_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "clock.h"
#include "chat.h"
#include "config.h"
#include "engine.h"
#include "err.h"
#include "event.h"
#include "fence.h"
#include "job.h"
#include "lora.h"
#include "log.h"
#include "modelref.h"
#include "rcluster.h"
#include "rconn.h"
#include "text.h"
#include "wopts.h"
#include "xmux.h"

#define W_KEY_MAX 384 /* <prefix>jobs:<served name>:<pool> fits */
/* the pools, then our offer streams; or on a cluster the pools' shards
 * (at most 64 in all: one XREADGROUP's keys, main.c) */
#define W_MAX_STREAMS 64
/* A foreign lane whose looks find nothing waiting is looked at half as
 * often each time, down to once every this many steal_ms (loop.c,
 * look_came) */
#define W_LOOK_BACKOFF 4
/* While its home shard has a backlog a busy worker still looks at the
 * others every W_LOOK_BACKOFF steal_ms, for jobs that have waited this
 * many steal_ms (1 s by default): a shard with no worker of its own (fewer
 * workers than shards, or its own all dead) is never starved by home
 * first (loop.c home_backlog) */
#define W_STARVE 20

/* One event waiting for Redis to confirm its XADD. */
struct wout {
    int64_t seq;
    char *json;      /* the `event` field, malloc'd */
    size_t len;
    bool is_done;    /* EXPIRE the stream after it */
};

enum wj_state { WJ_RUNNING = 1, WJ_CLOSING, WJ_ACKING, WJ_DROPPED,
                WJ_HANDING /* for an adapter held elsewhere: moved to its stream (handoff.c) */ };

struct wjob {
    enum wj_state state;
    struct job *job;              /* NULL for a job that did not parse */
    char id[JOB_ID_MAX + 1];      /* "" when no usable id (no events then) */
    int pool;                     /* index into worker.pools */
    char entry_id[RCONN_ID_MAX];  /* its entry in the pool stream */
    char entry0[RCONN_ID_MAX];    /* the entry it was first queued as, when the dispatcher
                                     moved it from an offer stream ("" = entry_id): its
                                     derived seed and queue time (issue 27) */
    char out_key[W_KEY_MAX];      /* <prefix>out:<id> */
    char own_key[W_KEY_MAX];      /* <prefix>own:<id>, the holder record (fence.h) */
    int64_t deliveries;
    bool resumed;                 /* taken over (XAUTOCLAIM, or our own PEL on restart) */
    bool taken;                   /* FENCE_TAKE made us the holder */
    bool fenced;                  /* told FENCED or lost: drop after this flush's replies */
    int64_t stalls;               /* deliveries in a row that published nothing (FENCE_TAKE) */
    /* identity (ident.c): the request this job is, and a refusal of it */
    char req[RCONN_ID_MAX];       /* the entry ID its client's XADD returned */
    char sha[JOB_SHA_LEN + 1];    /* job_sha256 of the job text as sent */
    int ident;                    /* FENCE_DUPLICATE / FENCE_ID_CONFLICT to apply; 0 = none */
    bool on_alt;                  /* answering on out:<id>@<req> (refused: ident.c) */
    char tenant[JOB_TENANT_MAX + 1]; /* the tenant it came from ("" = none): its own
                                     prefix-cache domain and result-cache keys */
    uint64_t cache_salt;          /* engine_request.cache_salt: 0, or the tenant's */
    int lora;                     /* the adapter its model names (worker.lora_id's index,
                                     engine_lora_name's), -1 = the base model */
    char *hand_key;               /* WJ_HANDING: the adapter's stream it goes to (owned) */

    uint64_t eng_id;              /* engine request id, 0 when not in the engine */
    bool cancel_sent;             /* engine_cancel called */
    int64_t lease_gone_ms;        /* monotonic: first seen without its client lease; 0 = seen */
    int64_t next_check_ms;        /* monotonic: its next standalone cancel/lease check
                                     (a job that emits is checked in its FENCE_EMIT) */
    struct ev_seq seq;
    int stream_ttl_s;

    struct wout *out;             /* (n_out) the outbox, in seq order */
    int n_out, cap_out;
    size_t out_bytes;             /* JSON bytes in the outbox (publish_buffer_kb bounds it) */
    int n_refused;                /* flushes in a row whose emit Redis refused (not OOM) */
    int64_t retry_ms;             /* monotonic: no emit before (its back-off), 0 = now */
    bool release;                 /* given up: FENCE_RELEASE its entry with the next flush */
    char *dead;                   /* dead letter JSON waiting for its XADD, or NULL */

    /* result cache: the full event list of a deterministic job, kept
     * until done so it can be written in one SET */
    bool cache_fill;
    char cache_key[W_KEY_MAX];
    char **hist;                  /* (n_hist) copies of every event */
    int n_hist, cap_hist;
    char *cache_value;            /* the SET value, built at done */

    /* the job text as sent, kept from admission to the first engine
     * event when it has a constraint: compiled while the job already
     * runs, a refused one is answered like an admission refusal, whose
     * dead letter carries the text (loop.c on_event) */
    char *raw;                    /* (raw_len) owned, or NULL */
    size_t raw_len;

    /* prompt and resumption */
    int32_t *ids;                 /* (n_ids) rendered prompt, owned */
    int n_ids;
    int n_prev;                   /* tokens already published by an earlier worker */
    int prev_reasoning;           /* of those, inside <think> */

    /* tool calls, parsed from content when the job has tools */
    struct chat_parser *parser;
    cJSON *tool_calls;            /* array, owned */

    /* coalescing (coalesce_ms > 0): deltas not yet sent, to go out as one
     * delta event; t_hold is when the oldest came (0 = nothing held) */
    int32_t *hold_ids;            /* (n_hold) token ids, owned */
    int n_hold, cap_hold;
    struct text hold_content, hold_reasoning;
    int64_t t_hold;
    /* its done (and the last delta) waits in the outbox for the batch's
     * coalescing clock (loop.c w_hold_due): one emit call a tick, not one
     * more for every job that ends between ticks */
    bool out_wait;

    /* when its XACK was first due (monotonic ms; 0 = not yet): it rides
     * with the next flush that sends anything else (publish.c, RIDE_MS) */
    int64_t t_ack_due;

    /* timings, ms on the Unix clock */
    int64_t t_enqueued, t_admitted, t_first, t_last_tok;
    int n_gen;                    /* tokens this worker generated */
    double t_submit_s;            /* engine_now() at engine_submit, for the
                                     in-engine time to first token (debug log) */
};

/* Counters and histograms behind /metrics, in base units (seconds,
 * tokens) as Prometheus wants them. A histogram's bucket bounds are one of
 * the static tables in metrics.c, named by le. */
#define WM_MAX_BUCKETS 24
struct whist {
    const double *le;               /* (n_le) upper bounds, ascending */
    int n_le;
    int64_t bucket[WM_MAX_BUCKETS]; /* counts <= le[i], not cumulative (render sums) */
    int64_t count;
    double sum;
};

struct wmetrics {
    pthread_mutex_t mu;
    /* latency, seconds: queue_wait = XADD to admission, ttft = XADD to the
     * first token, inter_token = between two tokens of one job, e2e = XADD
     * to done, prefill = admission to the first token, decode = first token
     * to done */
    struct whist queue_wait, ttft, inter_token, e2e, prefill, decode;
    struct whist prompt_len, gen_len;  /* tokens per finished job */
    /* per finished job at vLLM's request-latency bounds, for the heartbeat
     * (vllm:request_queue_time/prefill_time/decode_time_seconds): queue_wait
     * and prefill above are observed earlier and at finer bounds */
    struct whist v_queue, v_prefill, v_decode;
    int64_t lora_jobs[LORA_MAX_ADAPTERS]; /* jobs finished per adapter (worker.lora_id's index) */
    int64_t prompt_tokens, tokens_out, jobs_done, cache_hits, cache_misses, reclaimed, fenced,
        redis_reconnects;
    int64_t finished[EV_FINISH_ERROR + 1]; /* jobs by finish reason */
    int64_t preemptions;                   /* the engine's count since start */
    int64_t errors[EV_CODE_COUNT];
    int running, waiting, compiling, kv_blocks, kv_used;
    int64_t prefix_hit_tokens, prefix_miss_tokens;
    int64_t grammar_cache_bytes;           /* the engine's compiled constraints */
    int64_t affinity_taken;                /* jobs read from our offer streams */
    int64_t handed_off;                    /* jobs for adapters held elsewhere, moved
                                              to their streams (handoff.c) */
    int64_t foreign_taken;                 /* jobs read from shards not our home */
    int64_t foreign_looks;                 /* looks at those shards (aged reads) */
    int64_t foreign_looks_drained;         /* of them, ones that found nothing waiting */
    /* memory pressure (publish.c): Redis refusing writes with OOM */
    bool redis_oom;                        /* now: admission stopped */
    int64_t redis_oom_total;               /* times it started refusing */
    bool reclaiming;                       /* now: no new entry read, handed-back
                                              jobs claimed first (reclaim_first) */
    int64_t jobs_given_up;                 /* left pending: their events could not be stored */
    int64_t events_buffered;               /* events in outboxes, not yet stored */
    int64_t spec_drafted, spec_accepted;
    double tokens_per_s;
    bool ready, draining, redis_up;
    char model_name[256];                  /* the model_name label: the model dir's basename */
};

struct wmetrics_server; /* the libmicrohttpd daemon */
struct w_lorart;        /* lorart.c */
struct cJSON;

struct worker {
    struct wopts opt;
    struct cfg cfg;               /* the loaded options opt is copied from;
                                     SIGHUP applies live ones to it */
    int argc;                     /* the flags, kept for SIGHUP's re-parse */
    char **argv;
    struct rl_log log;
    struct engine *eng;
    struct job_opts jopts;
    char model_id[SHA256_HEX_LEN + 1];
    struct modelref model;        /* the resolved --model; model.name is the served name */
    /* LoRA adapters (lora_modules, main.c): adapter i is the engine's
     * (engine_lora_name/rank), served as a model name beside model.name;
     * lora_id[i] is its result-cache identity (modelid_lora), so that its
     * answers never meet the base model's or another adapter's */
    int n_loras;                  /* grows on SIGHUP (w_lora_reload): changed under m.mu,
                                     which the metrics page reads it under */
    char lora_id[LORA_MAX_ADAPTERS][SHA256_HEX_LEN + 1];
    char *lora_dir[LORA_MAX_ADAPTERS]; /* where adapter i came from (owned) */
    struct w_lorart *rt;          /* runtime adapters (lorart.c), owned */

    struct rconn *rc;             /* publish, ack, claim, cancel checks */
    struct rconn_opts rc_opts;    /* how rc and the lanes' connections were made */
    /* The standing reads (loop.c), the blocking XREADGROUPs: one lane on a
     * single instance, one per pool shard on a cluster (a read names one
     * slot's streams), each on a connection of its own, owned. A lane's
     * reply is matched against the streams it was sent with, and stream i
     * is pool stream idx[i]. */
    struct w_lane {
        struct rconn *rc;
        const char *keys[W_MAX_STREAMS];
        int idx[W_MAX_STREAMS], n;
        int want;                 /* the most jobs its read out may bring (COUNT x n) */
        int64_t next_look_ms;     /* a foreign lane's next look without BLOCK */
        int look_every_ms;        /* and the time between its looks (0: steal_after();
                                     longer while they find the shard drained) */
        bool aged;                /* the read out is a look at aged jobs only */
        bool starved_only;        /* ... at jobs W_STARVE x steal_ms older than the home's
                                     next (home backlog) */
        int64_t sent_ms;          /* monotonic: when its read out was sent */
        bool came_full;           /* its last read brought all it asked of some stream:
                                     more may wait there (the home lane: loop.c home_backlog) */
        int64_t head_ms;          /* with came_full: the time in the ID of the last entry
                                     such a stream brought (the earliest of them): what
                                     waits after it was queued no earlier */
    } lane[RCL_MAX_SHARDS];
    int n_lanes;
    /* Home shards (issue 27 point 4, loop.c stand_send_all): on a cluster
     * with pool_shards > 1 the lane this worker prefers (-1: every lane
     * alike), and the room (jobs) from which it reads the others as
     * their jobs come rather than every steal_ms */
    int home_lane;
    int foreign_room;
    /* a look at a foreign lane takes only jobs that waited steal_ms
     * (rconn_xreadgroup_send_aged) until Redis refuses that script (an
     * ACL from before it): plain looks from then on */
    bool plain_looks;
    struct rconn_batch *batch;
    struct fence fence;           /* the fencing scripts' SHA1s */
    bool checks_apart;            /* an ACL refused FENCE_EMIT with the check keys in it
                                     (an older config/redis-acl.conf): checks go alone */
    char holder[FENCE_HOLDER_MAX];/* this process as a job's holder (fence_holder) */

    /* [0, n_cfg_pools): the configured pools, then [n_cfg_pools,
     * n_base_pools) the streams of the LoRA adapters this worker started
     * with (<pool scope>lora@<name>: lora_stream[i - n_cfg_pools] names
     * it), which only workers holding the adapter read, so that the
     * dispatcher can send an adapter's jobs where a worker without it never
     * takes them (dispatcher/models.c); with affinity on, then
     * [n_base_pools, n_pools) this worker's offer streams, one per pool
     * (pools[n_base_pools + p] = pools[p], pool_keys = <pool key>:w:<name>),
     * so that leases, claims of our own PEL, acks and group creation cover
     * them as they cover the pools (issue 27, loop.c) */
    char pools[W_MAX_STREAMS][64];
    char pool_keys[W_MAX_STREAMS][W_KEY_MAX]; /* <prefix>jobs:<pool>[:w:<name>] */
    const char *pool_names[W_MAX_STREAMS];     /* -> pools[i] */
    const char *pool_key_ptrs[W_MAX_STREAMS];  /* -> pool_keys[i] */
    int n_pools;
    int n_base_pools;
    int n_cfg_pools;
    /* the adapters given streams (the first n_lora_streams of lora_modules
     * at start, in its order: those the stream limit leaves room for) */
    char lora_stream[W_MAX_STREAMS][MODELREF_NAME_MAX + 1];
    int n_lora_streams;
    int n_lora_specs;             /* lora_stream's names known (<= W_MAX_STREAMS) */
    long shard_n[RCL_MAX_SHARDS]; /* the shards' hash tags (rcl_shard_n), [0] unused */
    bool relayout;                /* adapters loaded by SIGHUP wait for their streams:
                                     no standing read is sent until w_relayout */
    /* handoff.c: whether a live worker reads adapter hand_name's stream,
     * as the registry said at hand_t_ms (asked once a second at most) */
    char hand_name[MODELREF_NAME_MAX + 1];
    bool hand_read;
    int64_t hand_t_ms;
    /* Redis Cluster (issue 27): [0, n_base_pools * n_shards) are the pools'
     * shards, stream i being shard i / n_base_pools of pool i % n_base_pools
     * (pools[i] its name); n_shards is 1 on a single instance, and with
     * affinity, which is off on a cluster */
    int n_shards;
    /* prefix-affine pulling (issue 27): the filter of the block hashes the
     * KV cache holds, as last published (aff_bits) */
    bool affinity;
    uint8_t *aff_bits, *aff_scratch; /* (aff_bytes) each, owned */
    size_t aff_bytes;
    int64_t aff_next_ms;          /* next recompute (wall ms) */
    bool aff_dirty;               /* the engine stepped since the last recompute */
    double step_ms;               /* loop iterations that stepped the engine, smoothed:
                                     how long an offer may wait for our next read */
    int64_t t_step_ms;            /* when the last stepping iteration began; 0 = idle */
    int64_t hold_tick_ms;         /* coalescing: when the held deltas last went out (wall ms) */
    /* the bell asked about before ringing (common/xmux.h), so that shared
     * readers read only the streams written: <prefix>bell, or on a cluster
     * a slot's (each emit rings its jobs' slot's); named by the first
     * probe, once connected */
    char bell_key[W_KEY_MAX];
    struct xmux_ringer ringer;    /* whether this worker may ring it */
    bool groups_ok;               /* XGROUP CREATE done since the last NOGROUP */

    int last_prompt_len;          /* rendered length of the last job admitted */
    int32_t rerank_ids[2];        /* the tokenizer's "yes" and "no" (rerank jobs'
                                     score ids), -1 when it lacks one */
    struct wjob **jobs;           /* (n_jobs) every job we hold */
    int n_jobs, cap_jobs;

    int64_t next_claim_ms, next_lease_ms, next_hb_ms, next_wd_ms;
    int64_t next_prune_ms;        /* the registry's pruning, once a minute (publish.c) */
    /* Redis at maxmemory (noeviction) refuses every write that would grow
     * it: publish.c then holds events back and retries with back-off,
     * loop.c admits nothing new (schemas/README.md, "Memory pressure") */
    bool redis_oom;
    int64_t oom_since_ms;         /* monotonic, when the refusals began */
    int64_t oom_retry_ms;         /* monotonic: next attempt to write */
    int oom_backoff_ms;           /* the wait after the next refusal */
    int admit_cap;                /* after memory pressure: most jobs in the engine
                                     (halved per episode, +1 per job finished), so
                                     the half-written streams Redis must hold stay
                                     few and the jobs given up finish; 0 = no cap */
    /* after memory pressure or a job given up: jobs handed back (their
     * streams half written, holding Redis memory no reader can free before
     * their done) are claimed before any new entry is read; cleared by a
     * claim pass that scanned every pool's PEL to its end and found none
     * (resume.c w_claim) */
    bool reclaim_first;
    signed char reclaim_scan[W_MAX_STREAMS]; /* pool p: 0 not yet, 1 clean since 0-0, 2 done */
    char claim_cursor[W_MAX_STREAMS][RCONN_ID_MAX];
    /* the most entries one XAUTOCLAIM takes (0: the room): what the last
     * claim got through within its time (resume.c w_claim) */
    int claim_count;
    uint64_t watchdog_usec;
    int64_t t_start_ms;
    double tok_rate;              /* tokens/s, exponentially smoothed */
    int64_t rate_t_ms, rate_tokens;

    struct wmetrics m;
    struct wmetrics_server *http;
    struct flush *flush;          /* the round trip in flight (publish.c), or NULL */
};

/* loop.c */
/* Runs until *stop is set and the drain is over. Returns 0, or negative
 * when the engine itself failed. */
int w_run(struct worker *w, volatile sig_atomic_t *stop, volatile sig_atomic_t *reload,
          struct rl_err *err);
/* Takes the entry (from a read or a claim) into the worker: validates it,
 * checks cancellation and the cache, submits it or answers it at once.
 * pair_lane: the lane whose standing read brought it as its last entry,
 * whose next read then goes with the admission check (loop.c
 * precheck_paired); -1 for none. */
int w_admit(struct worker *w, int pool, const struct rconn_entry *e, int64_t deliveries,
            bool resumed, int pair_lane);
/* How many jobs to read or claim now: the engine's room (engine_can_admit
 * at the last admitted prompt's length) capped by free batch slots. */
int w_admissible(struct worker *w);
/* Redis is a cluster: per-request keys carry their id as a hash tag
 * (rcl_tagged_key). Known once either connection has connected. */
bool w_cluster(const struct worker *w);
/* The pools' own streams, [0, w_n_queue_streams) of pool_keys: every shard
 * of every pool; above them, the offer streams (none on a cluster). */
int w_n_queue_streams(const struct worker *w);
void w_job_free(struct wjob *j);
/* Coalescing: once coalesce_ms has passed since the last time (at once
 * when `all`), sends every job's held-back deltas as one delta event each,
 * into the outbox; the loop calls it before every flush. */
void w_hold_due(struct worker *w, int64_t now_ms, bool all);
/* Forgets what j holds back, unsent (a job another worker took over). */
void w_hold_clear(struct wjob *j);
int w_jobs_add(struct worker *w, struct wjob *j);
/* Answers MODEL_NOT_FOUND to j, whose model is neither this worker's nor
 * one of its adapters (raw: the job text, for the dead letter). */
void w_reject_model(struct worker *w, struct wjob *j, const char *raw, size_t raw_len);

/* main.c: gives the adapters loaded since the layout (SIGHUP) streams of
 * their own, the streams after them moving up: held jobs, claim cursors
 * and reclaim scans follow their streams by key, and the new streams'
 * groups are made by the next ensure_groups. Called with no flush and no
 * standing read in flight (their replies are matched by stream index). */
void w_relayout(struct worker *w);
/* main.c: the key of pool stream `pool` (a configured pool's name, or
 * lora@<adapter>), shard 0, in this worker's scope (<prefix>jobs:<pool>,
 * or jobs:<model>:<pool> with pool_scope = model). */
void w_queue_key(const struct worker *w, const char *pool, bool cluster, char out[W_KEY_MAX]);

/* handoff.c */
/* For j (read from pool stream `pool`, its model an adapter this worker
 * lacks): when some live worker of this model reads that adapter's
 * stream, j becomes WJ_HANDING, to be moved there by the next flush
 * (w_publish: one script, XADD there and the XACK here) instead of
 * failing; keeps the job text (raw). The caller offers a first delivery,
 * or on a single instance one taken over (whose holder record the move
 * points at the new entry). Returns true when so. */
bool w_handoff_try(struct worker *w, struct wjob *j, int pool, const char *raw, size_t raw_len);
/* EVAL w_handoff_lua 2|3 <from> <to> [<holder record>] <group> <entry ID>
 * <consumer> <field> <value> ...: 1 when moved (the holder record, when
 * given and naming the entry, then names the new one), 0 when the entry is
 * no longer this consumer's pending one (then nothing was written). */
extern const char w_handoff_lua[];

/* publish.c */
/* Appends an event to j's outbox (taking json), and to its cache history. */
int w_push_event(struct wjob *j, char *json);
/* Drops everything of j not yet stored: its outbox, its dead letter, the
 * result-cache entry it was filling and the deltas it holds back. For a
 * job that will not write to its stream again, or not what it had. */
void w_outbox_drop(struct wjob *j);
/* Builds and queues an error event followed by done(error). */
int w_push_error(struct worker *w, struct wjob *j, enum ev_code code, const char *msg);
/* What a one-pass job's done event carries beside the usage. */
struct w_answer {
    const float *embedding; /* an embedding job's vector (n_embedding floats), borrowed */
    int n_embedding;
    bool has_score;         /* a rerank job's relevance */
    double score;
    const char *matched_stop; /* the stop string the answer ended at, borrowed; NULL */
};
/* Builds and queues a done event with the usage and timings of j, and
 * what the engine said of the answer: a one-pass job's vector or score,
 * the stop string it ended at (a: borrowed for the call; NULL when the job
 * did not finish in the engine). */
int w_push_done(struct worker *w, struct wjob *j, enum ev_finish fin,
                const struct engine_usage *u, const struct w_answer *a);
/* Writes a dead letter for j into its pending slot (sent with the flush). */
int w_set_dead(struct worker *w, struct wjob *j, const char *raw, size_t raw_len,
               enum ev_code code, const char *msg);
/* One pipelined round trip: every outbox event, dead letters, acks, cache
 * writes, the cancel checks of running jobs, and (when due) lease renewal
 * and the heartbeat. Returns 0, or -RL_EIO when Redis is unreachable (what
 * was not confirmed stays queued). */
int w_flush(struct worker *w, struct rl_err *err);
/* The same round trip in two halves, so the engine steps while Redis
 * answers (loop.c): start builds the pipeline and writes it (settling at
 * once when there is nothing to send); finish reads the replies and applies
 * them. Between the two, nothing else may use w->rc or w->batch; events
 * pushed meanwhile wait for the next start. finish does nothing when none
 * is in flight. */
int w_flush_start(struct worker *w, struct rl_err *err);
int w_flush_finish(struct worker *w, struct rl_err *err);
bool w_has_pending(const struct worker *w);
/* j's cancel key was just read (admission): its next standalone check is
 * due a check interval from now (publish.c CHECK_MS). */
void w_checked_now(struct wjob *j);
/* Redis refused a write for memory (n_ev events of n_jobs jobs wait):
 * enters the out-of-memory state (logged once, metrics, no admission) or
 * doubles its back-off. */
void w_oom_seen(struct worker *w, int n_ev, int n_jobs);
/* Whether an error message is Redis's OOM refusal. */
bool w_is_oom(const char *msg);

/* resume.c */
/* XAUTOCLAIM idle jobs of dead consumers on every pool and admit them,
 * resuming from what was already published. */
int w_claim(struct worker *w, struct rl_err *err);
/* Our own pending entries (a restart under the same name). */
int w_claim_own(struct worker *w, struct rl_err *err);
/* Jobs were handed back (given up), or may have been (memory pressure):
 * from now on claims go before new reads (reclaim_first). */
void w_reclaim_first(struct worker *w);
/* Reads back out_key and prepares j to continue: n_prev, seq, and the
 * prompt extended by the published tokens. Returns 1 when the stream
 * already holds done (nothing to run), 2 when it holds an error without
 * its done, 3 when another request owns the id (j->ident says how:
 * ident.c), 0 to run, negative on failure. */
int w_resume_prepare(struct worker *w, struct wjob *j, struct rl_err *err);

/* ident.c: a job's identity (schemas/README.md, "Job identity") */
/* Sets j->req and j->sha from entry e (its `req` and `sha` fields when the
 * dispatcher forwarded it, else e's own ID and the hash of raw). */
void w_ident_init(struct wjob *j, const struct rconn_entry *e, const char *raw, size_t raw_len);
/* The first event (seq 0) of j's stream gets the request's identity:
 * *json (and *len) replaced in place; left as is on failure. */
void w_ident_stamp(struct wjob *j, int64_t seq, char **json, size_t *len);
/* Whether cancel key value r (a GET reply) cancels j: its own request's
 * entry ID, or a value that names no entry ("1"); not another's. */
bool w_ident_cancel_meant(const struct wjob *j, const struct rconn_reply *r);
/* FENCE_TAKE answered FENCE_DUPLICATE or FENCE_ID_CONFLICT for j: nothing
 * of it is written to its stream; a job in the engine is cancelled first
 * (WJ_DROPPED until its final event, then w_ident_apply). */
void w_ident_refuse(struct worker *w, struct wjob *j, int code);
/* Finishes the refusal: a duplicate is acknowledged, a conflict answered
 * with ID_CONFLICT on out:<id>@<req>. */
void w_ident_apply(struct worker *w, struct wjob *j);

/* main.c: the index of the adapter served as name, -1 when none is. */
int w_lora_find(const struct worker *w, const char *name);
/* Loads the PEFT adapter in dir as name (a new index, or the one a
 * dropped adapter of that name had) with its result-cache identity;
 * returns its index or a negative rl_code (err filled). Main thread. */
int w_lora_load(struct worker *w, const char *name, const char *dir, struct rl_err *err);
/* w_lora_load in two: the slow part, any thread (the adapter's files read
 * and hashed: *out owned by the caller), then, on the main thread between
 * steps, the engine's slot and the tables (on success the engine owns a;
 * returns the index, or a negative rl_code and the caller still owns a). */
int w_lora_prepare(const struct worker *w, const char *dir, char id[SHA256_HEX_LEN + 1],
                   struct lora_adapter **out, struct rl_err *err);
int w_lora_install(struct worker *w, const char *name, const char *dir,
                   const char id[SHA256_HEX_LEN + 1], struct lora_adapter *a, struct rl_err *err);

/* lorart.c: LoRA adapters loaded and unloaded at runtime through the
 * fleet's wish, <prefix>loras:<model> (see there). Main thread. */
int w_lorart_create(struct worker *w);              /* -RL_ENOMEM */
void w_lorart_free(struct worker *w);
/* The wish's key; whether the heartbeat should read it (not when the ACL
 * refused it once). */
void w_lorart_key(const struct worker *w, char out[W_KEY_MAX]);
bool w_lorart_wanted(const struct worker *w);
/* The wish as read (an HGETALL reply, or its error): noted, followed by
 * the next w_lorart_step. */
void w_lorart_reply(struct worker *w, const struct rconn_reply *r);
/* Between steps: loads and unloads what the wish changed, frees the
 * weights of unloaded adapters whose jobs are done. */
void w_lorart_step(struct worker *w);
/* SIGHUP (lora_dirs may have changed): the wishes that failed are tried
 * again. */
void w_lorart_retry(struct worker *w);
/* At start, once Redis answers: reads the wish and follows it, so a new
 * worker serves what the fleet serves before it reads its first job. */
int w_lorart_start(struct worker *w);
/* Adapter i: unloaded (not served; w_lora_find skips it); its lora_path
 * when the wish loaded it (NULL: lora_modules's); forgotten as a runtime
 * adapter (w_lora_load of lora_modules's). */
bool w_lora_gone(const struct worker *w, int i);
const char *w_lorart_path(const struct worker *w, int i);
void w_lorart_forget(struct worker *w, int i);
/* Adds lora_failed (the wishes this worker could not follow) to o. */
void w_lorart_heartbeat(const struct worker *w, struct cJSON *o);
/* SIGHUP: loads the adapters lora_modules names now and the worker does not
 * serve yet (the loop thread, between steps); an adapter whose directory
 * changed or that left the list is logged and kept until a restart (jobs
 * may be running with it). Errors are logged, never fatal. */
void w_lora_reload(struct worker *w);

/* cache.c (the model identity is modelid_compute, common/modelid.h) */
/* Sets j->cache_fill / cache_key for a deterministic job with cache on. */
int w_cache_key(struct worker *w, struct wjob *j, struct rl_err *err);
/* Replays a cached event list (the GET reply) into j's outbox with
 * cached:true. Returns 0, or -RL_EFORMAT when the value is unusable. */
int w_cache_replay(struct worker *w, struct wjob *j, const char *value, size_t len,
                   struct rl_err *err);
/* Builds j->cache_value from j->hist. */
int w_cache_build(struct wjob *j, struct rl_err *err);

/* metrics.c */
/* Zeroes m and gives each histogram its bucket table. */
void wm_init(struct wmetrics *m);
/* model: the model path, whose last component becomes the model_name
 * label of every sample. Called before the metrics thread starts. */
void wm_set_model(struct wmetrics *m, const char *model);
/* Adds one observation v (seconds or tokens). Caller holds m->mu. */
void wm_observe(struct whist *h, double v);
void wm_error(struct wmetrics *m, enum ev_code code);
int wm_start(struct worker *w, struct rl_err *err);
void wm_stop(struct worker *w);
/* The heartbeat value: JSON with pools, running, free KV blocks, tokens/s,
 * and the counters since start (jobs_done, tokens_out, cache hits/misses). */
char *wm_heartbeat_json(struct worker *w);

#endif
