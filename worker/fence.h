/* worker/fence.h - one writer per job: the Lua scripts that fence a job's
 * event stream to the worker that holds it.
 *
 * Why: a worker that misses its lease renewals (starved of CPU, paused,
 * cut off from Redis for longer than claim_idle_ms) is taken for dead and
 * its jobs are reclaimed, but it is not dead: it goes on generating. Two
 * writers on one stream are safe only while both write the same events at
 * the same seqs (the explicit IDs refuse the second copy); an error event
 * from one, or deltas coalesced differently, interleave with the other's
 * and the client reads a stream no single run produced.
 *
 * So every job has a holder record, the hash <prefix>own:<id> (cluster:
 * own:{<id>}, in the slot of out:{<id>}):
 *   holder  the worker process that may write (fence_holder: name, pid,
 *           start time), entry  the pool entry it holds, and for
 *           max_deliveries: xlen (the stream's length when it was taken),
 *           stalls (deliveries in a row that published nothing), d (the
 *           delivery count then).
 *   FENCE_TAKE  first checks the job's identity: the record also names
 *           the request that owns the id (req: the entry ID its client's
 *           XADD returned; sha: job_sha256 of its text), so a second
 *           request under the same id is told apart (duplicate or
 *           conflict) before it writes anything. Then it makes the caller
 *           the holder. A resumed job takes it
 *           unconditionally and reads the stream afterwards, so whatever
 *           the old holder wrote before is resumed and nothing after can
 *           land; a fresh delivery takes it only if no other holder has
 *           this entry (someone reclaimed it while we had not yet started).
 *   FENCE_EMIT  XADDs a job's unconfirmed events (and EXPIREs after done,
 *           PUBLISHes when configured) only if the caller is the holder;
 *           otherwise that job's answer is FENCED and nothing of it is
 *           written. One call carries every job of a flush on a single
 *           instance (on a cluster, every job of one slot: ids chosen on
 *           the request slots share one, common/rcluster.h). It also reads, for
 *           a job whose check is due, its cancel key and its client's
 *           lease key (same hash tag, so same slot): the per-step cancel
 *           check costs no command of its own (publish.c).
 *   FENCE_LEASE renews, with XCLAIM JUSTID, only the entries the caller
 *           still owns in the pools' pending lists, and names the others:
 *           a renewal never takes a job back from the worker that
 *           reclaimed it. Every pool in one call on a single instance (one
 *           pool per call on a cluster).
 *   FENCE_RELEASE hands back an entry the caller still owns: a job it
 *           gave up because Redis would not store its events (publish.c)
 *           becomes claimable at once, and that delivery does not count
 *           toward max_deliveries.
 * A worker told FENCED or "lost" stops the job at once and forgets it
 * (no event, no XACK): its new holder finishes it.
 *
 * The scripts run by EVALSHA; the SHA1s come from SCRIPT LOAD once Redis
 * answers (on a cluster, on every master). Until then, and after a
 * NOSCRIPT (a Redis that restarted, a failed-over master, a master that
 * joined), that script is sent whole by EVAL, which loads it again, in
 * the next flush that calls it: every call of it in that flush, so that
 * each node it goes to loads it. Main thread only. */
#ifndef RL_FENCE_H
#define RL_FENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "rconn.h"

/* FENCE_ACK is common/qack.h's QACK_LUA (XACK + XDEL of a finished job's
 * entry), loaded with the others so a job's end costs an EVALSHA, not its
 * body sent and hashed again (issue 27). */
enum fence_script {
    FENCE_TAKE, FENCE_EMIT, FENCE_LEASE, FENCE_RELEASE, FENCE_ACK, FENCE_N_SCRIPTS
};

#define FENCE_HOLDER_MAX 192

struct fence {
    char sha[FENCE_N_SCRIPTS][41]; /* "" until SCRIPT LOAD answered */
    bool eval_next[FENCE_N_SCRIPTS]; /* a NOSCRIPT was seen: EVAL in the next flush
                                        that calls it */
    bool eval_now[FENCE_N_SCRIPTS];  /* this flush sends its body (fence_begin) */
    int64_t tried_on;              /* 1 + c's reconnect count at the last failed load */
};

/* SCRIPT LOAD of every script on c (on a cluster, on every master: a
 * script is called on whichever master holds its keys) while a SHA1 is
 * missing, at most once per
 * connection, so a refused load (an ACL without SCRIPT LOAD) does not cost
 * every flush a round trip. Returns 0 (loaded, or not tried again on this
 * connection), or the error; missing SHA1s make fence_cmd send bodies. */
int fence_load(struct fence *f, struct rconn *c, struct rl_err *err);

/* Buffers for the text arguments of fence_take_cmd; live as long as argv. */
struct fence_take_buf {
    char nk[12], d[24];
};

/* The whole FENCE_TAKE call into argv (FENCE_TAKE_ARGC entries): the
 * holder record own_key and stream out_key of pool entry `entry`, taken
 * for holder; fresh for a first delivery (taken only if no other worker
 * holds it), else unconditionally; deliveries is the entry's delivery
 * count; req and sha the job's identity (the client's entry ID and
 * job_sha256). Returns argc. Its answer: the stalls (>= 0), or
 * FENCE_TAKEN_BY_OTHER, FENCE_DUPLICATE (another request with the same job
 * text owns the id: its stream is this job's answer), FENCE_ID_CONFLICT
 * (a different job owns the id). */
#define FENCE_TAKE_ARGC 11
enum { FENCE_TAKEN_BY_OTHER = -1, FENCE_DUPLICATE = -2, FENCE_ID_CONFLICT = -3 };
int fence_take_cmd(struct fence *f, const char **argv, struct fence_take_buf *b,
                   const char *own_key, const char *out_key, const char *holder,
                   const char *entry, bool fresh, int64_t deliveries, const char *req,
                   const char *sha);

/* Buffers for the text arguments of fence_release_cmd; live as long as
 * argv. */
struct fence_release_buf {
    char nk[12], idle[24];
};

/* The whole FENCE_RELEASE call into argv (FENCE_RELEASE_ARGC entries):
 * pool entry `entry` of stream pool_key, if consumer still owns it in
 * group, made idle idle_ms (claimable at once when that is claim_idle_ms)
 * without counting this delivery. Returns argc; answers 1 (handed back)
 * or 0 (no longer ours). */
#define FENCE_RELEASE_ARGC 8
int fence_release_cmd(struct fence *f, const char **argv, struct fence_release_buf *b,
                      const char *pool_key, const char *group, const char *consumer,
                      const char *entry, int idle_ms);

/* Called once per flush before any fence_cmd: decides EVAL or EVALSHA
 * of each script for this flush. */
void fence_begin(struct fence *f);

/* Fills argv[0..2] with the head of a call of script s with n_keys keys:
 * EVALSHA <sha> <n> or EVAL <body> <n>. nbuf (>= 12 bytes) holds the
 * number's text and must live as long as argv. Returns 3. */
int fence_cmd(struct fence *f, enum fence_script s, int n_keys, const char **argv,
              char *nbuf);

/* The reply r answered a fence_cmd of script s: true when it is NOSCRIPT
 * (and the next flush that calls s sends its body). */
bool fence_noscript(struct fence *f, enum fence_script s, const struct rconn_reply *r);

/* FENCE_EMIT's refusal: the caller no longer holds the job. */
bool fence_is_fenced(const struct rconn_reply *r);

/* This process's holder name: "<worker>/<pid>/<start ms>", unique even
 * when a worker restarts under the same name. out has FENCE_HOLDER_MAX
 * bytes. */
void fence_holder(char *out, const char *worker_name, long long start_ms);

#endif
