/* common/rconn.h - one Redis connection (hiredis 0.14, RESP2) that survives
 * Redis restarts, plus the stream commands the worker and dispatcher use.
 *
 * A struct rconn is used by one thread. A worker holds two: one for the
 * blocking XREADGROUP and one for everything else, so a blocked read never
 * delays publishing tokens.
 *
 * Every reply is copied out of hiredis into the owned records below and
 * the hiredis reply is freed before the call returns; callers free what
 * they get with the matching *_free. Return values: 0, or
 *   -RL_EIO     not connected / the connection broke / Redis is loading:
 *               transient, retry later (the connection is re-made with
 *               exponential backoff and jitter on the next call)
 *   -RL_EINVAL  bad arguments, or Redis answered with an error (message
 *               in err, e.g. "XACK: WRONGTYPE ...")
 *   -RL_ENOMEM
 * Against a Redis Cluster (found by asking the server at the first
 * connect) every command goes to the master of its key's slot, batches
 * are split per node, MOVED/ASK are followed and the slot map is re-read
 * after a failover; the calls and their results stay the same.
 * Job streams must never be trimmed (an unacknowledged job would be lost):
 * pass maxlen 0 for them; only out-streams and redlm:dead may be capped. */
#ifndef RL_RCONN_H
#define RL_RCONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct rconn;

#define RCONN_ID_MAX 48    /* a stream ID "ms-seq": 20 + 1 + 20 digits + NUL */
#define RCONN_NAME_MAX 128 /* consumer names we read back */

struct rconn_opts {
    const char *addr;          /* "host:port", "[v6addr]:port", "unix:/path" or "/path", or
                                * a cluster's seed list "host:port,host:port,..." */
    const char *user;          /* ACL user, NULL or "" for AUTH <password> alone */
    const char *password_file; /* NULL or "": no AUTH. Re-read at each connect, so a
                                * rotated password needs no restart */
    const char *client_name;   /* CLIENT SETNAME, NULL for none */
    int connect_timeout_ms;    /* > 0 */
    int io_timeout_ms;         /* per read/write; 0 = none. Blocking reads add
                                * their BLOCK time to it */
    int backoff_min_ms;        /* first retry delay after a failure, > 0 */
    int backoff_max_ms;        /* cap of the doubling, >= backoff_min_ms */
};

/* connect 1000 ms, io 5000 ms, backoff 50..5000 ms, addr 127.0.0.1:6379. */
void rconn_opts_default(struct rconn_opts *o);

/* Checks and copies *o (the strings too); does not connect, so a worker
 * can start while Redis is down. -RL_EINVAL for a bad address. */
int rconn_create(struct rconn **out, const struct rconn_opts *o, struct rl_err *err);
void rconn_free(struct rconn *c);

/* Connected now, or connects if the backoff allows an attempt now.
 * Returns 0 when connected; -RL_EIO when not (err says why and when the
 * next attempt is due). Every command below calls this first. */
int rconn_ensure(struct rconn *c, struct rl_err *err);
/* Calls rconn_ensure until connected or timeout_ms passes, sleeping
 * through the backoff. For start-up and tests, not the main loop. */
int rconn_wait(struct rconn *c, int timeout_ms, struct rl_err *err);
bool rconn_connected(const struct rconn *c);
/* True once the first connect found a Redis Cluster (the address may be a
 * seed list "host:port,host:port,..."; a single address is asked too).
 * Key builders use it for the cluster key layout (common/rcluster.h,
 * rcl_tagged_key; schemas/README.md "Key layout"): false before the first
 * successful connect and for a single instance, whose keys stay as they
 * were. */
bool rconn_is_cluster(const struct rconn *c);
/* Milliseconds until the next connection attempt is allowed; 0 if now or
 * already connected. A loop with nothing else to do sleeps this long. */
int64_t rconn_retry_in_ms(const struct rconn *c);
/* Drops the connection (the next call reconnects at once). */
void rconn_disconnect(struct rconn *c);
/* For a connection that sat unused (a pool's): looks, without a round
 * trip, whether the server closed it meanwhile (a Redis restart closes
 * every client socket) and drops it then, so the next call reconnects
 * instead of failing once on a dead socket. True when still connected. */
bool rconn_check_idle(struct rconn *c);
/* Successful connects after the first one: for the metrics. */
int64_t rconn_n_reconnects(const struct rconn *c);
/* The address as given, for log lines. */
const char *rconn_addr(const struct rconn *c);

/* A reply, deep-copied. type is one of enum rconn_type. */
enum rconn_type {
    RCONN_STRING = 1, RCONN_ARRAY = 2, RCONN_INTEGER = 3, RCONN_NIL = 4,
    RCONN_STATUS = 5, RCONN_ERROR = 6,
};
struct rconn_reply {
    int type;
    long long integer;          /* RCONN_INTEGER */
    char *str;                  /* STRING, STATUS, ERROR: NUL-terminated, len bytes */
    size_t len;
    size_t n_elem;              /* RCONN_ARRAY */
    struct rconn_reply *elem;   /* (n_elem) */
};
/* Frees r and everything in it; NULL is fine. */
void rconn_reply_free(struct rconn_reply *r);
/* An error reply saying an explicit XADD ID is not above the stream's
 * top: with ev_stream_id() IDs this means "already written". */
bool rconn_reply_is_stale_id(const struct rconn_reply *r);

/* Any command. lens NULL: each argv is a C string. *out (if out is
 * non-NULL) gets the reply, error replies included, which then also make
 * the return -RL_EINVAL; with out NULL the reply is dropped. */
int rconn_command(struct rconn *c, int argc, const char *const *argv, const size_t *lens,
                  struct rconn_reply **out, struct rl_err *err);

/* Keyless commands that see one node's keys (SCAN, DBSIZE) must run on
 * every master of a cluster: rconn_n_masters is 1 for a single instance
 * (before the first connect too), the masters of the slot map otherwise;
 * rconn_command_on runs a command like rconn_command on master i
 * (0 <= i < rconn_n_masters), no redirects followed. */
int rconn_n_masters(const struct rconn *c);
int rconn_command_on(struct rconn *c, int master, int argc, const char *const *argv,
                     const size_t *lens, struct rconn_reply **out, struct rl_err *err);
/* On a cluster: the master serving slot now, as an index for
 * rconn_command_on (-1 while no master is known for it); 0 for a single
 * instance. */
int rconn_slot_master(const struct rconn *c, int slot);
/* Cluster: the slot map is read again before the next command (another
 * connection of ours saw the cluster change, e.g. the one whose blocked
 * reads this one's CLIENT UNBLOCK must reach: common/xmux.c). A keyless
 * command is never redirected, so this connection would not find out. */
void rconn_map_stale(struct rconn *c);
/* Which connection serves slot now: a number that changes whenever that
 * may be another one (a reconnect, a failover, a new slot map), 0 while
 * none is open. Per connection state (a CLIENT ID) is read again when it
 * changes (common/xmux.c). A single instance: its one connection's. */
int64_t rconn_slot_conn(const struct rconn *c, int slot);
/* The request slots (common/rcluster.h, rcl_map_request_slots) of the
 * slot map as last read, up to max of them: 0 for a single instance and
 * before the first connect, where ids need no slot. */
int rconn_request_slots(const struct rconn *c, int *slots, int max);

/* Pipelining: queue commands, send them in one write, read all replies.
 * The batch keeps each command encoded, so after -RL_EIO mid-way a second
 * rconn_batch_exec re-sends exactly the commands whose replies were not
 * read (n_done tells how many were). A command that Redis ran but whose
 * reply was lost is sent again: make such commands idempotent (XADD with
 * ev_stream_id() IDs, SET, EXPIRE). */
struct rconn_batch;
int rconn_batch_create(struct rconn_batch **out, struct rl_err *err);
void rconn_batch_free(struct rconn_batch *b);
/* Empties the batch for reuse (keeps its memory). */
void rconn_batch_reset(struct rconn_batch *b);
int rconn_batch_add(struct rconn_batch *b, int argc, const char *const *argv,
                    const size_t *lens, struct rl_err *err);
/* XADD key [MAXLEN ~ maxlen] id f1 v1 ...: maxlen 0 = no trimming. */
int rconn_batch_add_xadd(struct rconn_batch *b, const char *key, const char *id, long maxlen,
                         int n_fields, const char *const *names, const char *const *values,
                         const size_t *value_lens, struct rl_err *err);
/* Sends the commands not yet answered and reads their replies. Returns 0
 * when every reply was read (check rconn_batch_n_errors for error
 * replies), -RL_EIO when the connection failed part-way. */
int rconn_batch_exec(struct rconn *c, struct rconn_batch *b, struct rl_err *err);
/* Writes the batch's commands to the connection without reading a reply,
 * so the caller can work while Redis answers; rconn_batch_exec then only
 * reads the replies (or sends everything again when the connection was
 * lost meanwhile). On a cluster it writes every node's pipeline; exec
 * reads each node's replies if that node's connection is still the one
 * written to (else those commands stay unanswered, -RL_EIO, to be sent
 * again). Between the two nothing else may use c or b. */
int rconn_batch_send(struct rconn *c, struct rconn_batch *b, struct rl_err *err);
/* rconn_batch_exec, then a standing read (as rconn_xreadgroup_send, BLOCK
 * block_ms >= 1) in the same write, left to collect with
 * rconn_xreadgroup_collect: the dispatcher's round ends in its next read
 * (issue 27: one read event in Redis where the two cost two). A single
 * instance only (-RL_EUNSUPPORTED on a cluster, nothing sent). The batch's
 * replies are read as rconn_batch_exec reads them; the read is out only
 * when they all were (0 returned). */
int rconn_batch_exec_then_xreadgroup(struct rconn *c, struct rconn_batch *b, const char *group,
                                     const char *consumer, int n_keys, const char *const *keys,
                                     int count, int block_ms, struct rl_err *err);
int rconn_batch_count(const struct rconn_batch *b);
int rconn_batch_n_done(const struct rconn_batch *b);
/* Error replies among the replies read so far. */
int rconn_batch_n_errors(const struct rconn_batch *b);
/* The reply to command i, owned by the batch, valid until reset/free;
 * NULL if not read yet. */
const struct rconn_reply *rconn_batch_reply(const struct rconn_batch *b, int i);

/* Stream records. */
struct rconn_field {
    char *name;       /* NUL-terminated, name_len bytes */
    size_t name_len;
    char *value;      /* NUL-terminated, value_len bytes (binary safe) */
    size_t value_len;
};
struct rconn_entry {
    char id[RCONN_ID_MAX];
    int stream;       /* index into the keys passed to rconn_xreadgroup; 0 otherwise */
    bool deleted;     /* listed in the PEL but the entry was XDELed: no fields */
    int n_fields;
    struct rconn_field *fields; /* (n_fields) */
};
struct rconn_entries {
    int n;
    struct rconn_entry *v; /* (n) */
    bool drained; /* an aged look (rconn_xreadgroup_send_aged) found nothing
                     undelivered at all in its streams, young or old: their
                     own workers keep up (n is 0 then) */
};
/* Frees what e holds and zeroes it. */
void rconn_entries_free(struct rconn_entries *e);
/* The value of field name, or NULL; *len gets its length. */
const char *rconn_entry_field(const struct rconn_entry *e, const char *name, size_t *len);

struct rconn_ids {
    int n;
    char (*v)[RCONN_ID_MAX]; /* (n) */
};
void rconn_ids_free(struct rconn_ids *ids);
/* The time part of a stream entry ID "<ms>-<seq>": Unix ms by the clock of
 * the Redis that added it with "*". */
int64_t rconn_id_ms(const char *id);

/* XGROUP CREATE key group start MKSTREAM; an existing group (BUSYGROUP)
 * is success. start "0" serves what was queued before any worker came. */
int rconn_xgroup_create(struct rconn *c, const char *key, const char *group, const char *start,
                        struct rl_err *err);

/* XREADGROUP GROUP group consumer COUNT count [BLOCK block_ms] STREAMS
 * keys... id...: id ">" for new entries, "0" for this consumer's own
 * pending ones. block_ms < 0: no BLOCK. A timeout gives 0 entries. Reads
 * from all n_keys streams; entries come stream by stream in key order. */
int rconn_xreadgroup(struct rconn *c, const char *group, const char *consumer, int n_keys,
                     const char *const *keys, const char *id, int count, int block_ms,
                     struct rconn_entries *out, struct rl_err *err);

/* A standing read (issue 27): a busy worker that polled for new jobs every
 * step cost Redis a read event a step (most of a coalescing worker's
 * Redis work) and put a round trip on the step's critical path. Instead it
 * sends XREADGROUP GROUP group consumer COUNT count BLOCK block_ms
 * STREAMS keys... > ... once, and looks each step, without waiting,
 * whether its reply came: Redis answers when a job arrives (or the BLOCK
 * runs out), and meanwhile costs nothing. Entries are delivered (into the
 * consumer's pending list) when Redis answers, as with any read.
 * On a cluster the keys must share a slot (-RL_EUNSUPPORTED otherwise): the
 * read goes to its master, and a redirect or a master turned replica
 * answers it with an error (-RL_EIO, the map read again before the next);
 * a worker keeps one such read per shard, each on a connection of its own.
 * block_ms -1 sends no BLOCK: Redis answers at once with what waits (a
 * look at a shard, issue 27 point 4), collected the same way. While a read awaits its reply,
 * nothing else may use c (rconn_command and the stream calls refuse with
 * -RL_EINVAL; batches must not be run on it). */
int rconn_xreadgroup_send(struct rconn *c, const char *group, const char *consumer, int n_keys,
                          const char *const *keys, int count, int block_ms, struct rl_err *err);
/* A look (as block_ms -1 above) that takes only entries at least
 * min_age_ms old by Redis's clock (their IDs' time: an XADD "*"), and,
 * with upto_ms > 0, added no later than upto_ms (Unix ms, the time in
 * their IDs), at most count a stream, collected with
 * rconn_xreadgroup_collect. Why: a worker
 * looking at another shard for jobs its home workers cannot take
 * (issue 27 point 4) would otherwise take one that arrived a moment ago,
 * while that shard's worker re-arms its read: under load on a cluster
 * that spread every worker's jobs over every master, each such job a call
 * and a wake on its master every step. Runs as one Lua script (EVAL: sent at most every
 * steal_ms, its hashing cheaper than keeping a SHA loaded per master);
 * needs TIME, XINFO GROUPS and XRANGE on the keys besides XREADGROUP
 * (config/redis-acl.conf), else its error comes back as the read's.
 * Its reply says more than XREADGROUP's: an empty array (collected as no
 * entries with drained set) when nothing waited undelivered in any of the
 * streams, nil when something did but none was old enough; so a caller can
 * look less often where nothing waits (worker/loop.c). */
int rconn_xreadgroup_send_aged(struct rconn *c, const char *group, const char *consumer,
                               int n_keys, const char *const *keys, int count, int min_age_ms,
                               int64_t upto_ms, struct rl_err *err);
/* True while a command sent (a standing read, the second of
 * rconn_command_then) awaits its reply. */
bool rconn_awaiting(const struct rconn *c);
/* Waits up to wait_ms until one of the n connections (NULL ones and those
 * awaiting nothing are skipped; 16 at most) has reply bytes to read: >0
 * then, 0 when none came (or none awaits). The replies are then read with
 * a collect that does not wait. */
int rconn_wait_any(struct rconn *const *cs, int n, int wait_ms);
/* Waits up to wait_ms (0: only looks) for that reply. *came false: not
 * yet (0 returned). *came true: the read is over, out its entries (none
 * when the BLOCK ran out), as rconn_xreadgroup gives them for the same
 * keys. -RL_EIO when the connection broke or no reply came within BLOCK
 * and the reply timeout (the connection is dropped; what Redis delivered
 * then stays in the consumer's pending list, reclaimed as any lost
 * reply's). */
int rconn_xreadgroup_collect(struct rconn *c, int n_keys, const char *const *keys, int wait_ms,
                             struct rconn_entries *out, bool *came, struct rl_err *err);

/* A pipelined pair (issue 27: common/xmux.c's reader). Writes both
 * commands in one write, reads the first's reply into *out as
 * rconn_command does, and leaves the second sent: a blocking read (BLOCK
 * block_ms) that Redis runs right after the first, with no other client's
 * command in between, so a "$" in it means "after what the first read".
 * Its reply is read by rconn_collect; until then nothing else may use c,
 * as with a standing read. One read event in Redis where two commands in
 * turn cost two. On a cluster both go to the master of the first's slot
 * (the second must be in it too); a redirect of the first is -RL_EIO with
 * the map marked stale, the second still to be collected. */
int rconn_command_then(struct rconn *c, int argc, const char *const *argv, const size_t *lens,
                       struct rconn_reply **out, int argc2, const char *const *argv2,
                       int block_ms, struct rl_err *err);
/* Like rconn_command_then, with n_cmd (1-8) commands first, their
 * replies in out[0..n_cmd) (error replies included; the first failure is
 * returned), and a standing read (as rconn_xreadgroup_send, BLOCK
 * block_ms >= 1) second, collected with rconn_xreadgroup_collect. Issue
 * 27: a worker's admission check and the re-arm of its read, one read
 * event in Redis where they cost two. On a cluster the read's keys must
 * share a slot and every command first must be served by that slot's
 * master, by the slot map as last read (-RL_EUNSUPPORTED otherwise,
 * nothing sent): the worker's check of a job from its home shard, whose
 * keys the dispatcher put on that shard's master. A slot that moved since
 * is redirected as rconn_command_then says. */
int rconn_commands_then_xreadgroup(struct rconn *c, int n_cmd, const int *argcs,
                                   const char *const *const *argvs, struct rconn_reply **out,
                                   const char *group, const char *consumer, int n_keys,
                                   const char *const *keys, int count, int block_ms,
                                   struct rl_err *err);
/* Waits up to wait_ms (0: only looks) for the reply of the command left
 * sent: *came false, not yet; true, *out its reply (NULL after a failure;
 * error replies return -RL_EINVAL as rconn_command's). -RL_EIO and the
 * connection dropped when no reply came within its BLOCK and the reply
 * timeout. */
int rconn_collect(struct rconn *c, int wait_ms, struct rconn_reply **out, bool *came,
                  struct rl_err *err);

/* XACK key group ids...; *n_acked (may be NULL) gets Redis's count. */
int rconn_xack(struct rconn *c, const char *key, const char *group, int n_ids,
               const char *const *ids, long long *n_acked, struct rl_err *err);

/* XADD key [MAXLEN ~ maxlen] id fields...; maxlen 0 = no trimming. id "*"
 * or explicit. out_id (may be NULL) gets the new ID. An explicit id not
 * above the top sets *duplicate and returns 0 (it was written before);
 * with duplicate NULL that is -RL_EINVAL. */
int rconn_xadd(struct rconn *c, const char *key, const char *id, long maxlen, int n_fields,
               const char *const *names, const char *const *values, const size_t *value_lens,
               char out_id[RCONN_ID_MAX], bool *duplicate, struct rl_err *err);

/* XAUTOCLAIM key group consumer min_idle_ms start COUNT count: takes over
 * entries idle at least min_idle_ms (their delivery count goes up by one).
 * next gets the cursor for the next call ("0-0" when the scan is done);
 * deleted (may be NULL) the IDs Redis dropped from the PEL because their
 * entries were deleted (Redis 7). */
int rconn_xautoclaim(struct rconn *c, const char *key, const char *group, const char *consumer,
                     int64_t min_idle_ms, const char *start, int count, struct rconn_entries *out,
                     char next[RCONN_ID_MAX], struct rconn_ids *deleted, struct rl_err *err);

/* XCLAIM key group consumer min_idle_ms ids... JUSTID: lease renewal. Resets
 * the idle time without counting a delivery; *claimed gets the IDs still
 * pending (an ID missing from it was acknowledged or deleted meanwhile). */
int rconn_xclaim_justid(struct rconn *c, const char *key, const char *group,
                        const char *consumer, int64_t min_idle_ms, int n_ids,
                        const char *const *ids, struct rconn_ids *claimed, struct rl_err *err);

/* XRANGE key start end [COUNT count]; count 0 = all. Reading back a
 * request's published events for resumption: XRANGE out - +. */
int rconn_xrange(struct rconn *c, const char *key, const char *start, const char *end, int count,
                 struct rconn_entries *out, struct rl_err *err);

struct rconn_pending {
    char id[RCONN_ID_MAX];
    char consumer[RCONN_NAME_MAX];
    int64_t idle_ms;
    int64_t deliveries;
};
/* XPENDING key group [IDLE min_idle_ms] start end count [consumer]:
 * min_idle_ms 0 = any, consumer NULL = all. *out is malloc'd (free()). */
int rconn_xpending(struct rconn *c, const char *key, const char *group, int64_t min_idle_ms,
                   const char *start, const char *end, int count, const char *consumer,
                   struct rconn_pending **out, int *n_out, struct rl_err *err);

/* EXPIRE key seconds; *set (may be NULL) tells whether the key existed. */
int rconn_expire(struct rconn *c, const char *key, int64_t seconds, bool *set, struct rl_err *err);
/* PUBLISH channel msg; *n_receivers may be NULL. */
int rconn_publish(struct rconn *c, const char *channel, const char *msg, size_t len,
                  long long *n_receivers, struct rl_err *err);
/* EXISTS key (the cancel check). */
int rconn_exists(struct rconn *c, const char *key, bool *exists, struct rl_err *err);

#endif
