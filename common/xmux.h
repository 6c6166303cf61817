/* common/xmux.h - one blocking XREAD shared by every stream a process follows.
 *
 * A process that follows many request streams at once (the front door: one
 * per HTTP request; `redlm bench`: one per client) used to hold a blocked
 * XREAD per stream, so Redis paid a read event, a command and a reply write
 * for every token of every stream: the largest single cost per delivered
 * token in issue 27's breakdown (5.8 us of XREAD command, about as much
 * again in Redis's event loop). The mux reads all of them with one
 * XREAD BLOCK on a connection of its own: a worker's flush writes a whole
 * batch's events in one call, and the mux's one read takes them all.
 *
 * Threads: xmux_create starts a reader thread. Any thread may subscribe; a
 * subscription belongs to the thread that made it until it ends it. A new
 * subscription cuts the reader's BLOCK short with CLIENT UNBLOCK (from a
 * second connection), so its first event never waits for the BLOCK time;
 * but one made with XMUX_UNWRITTEN while the reader blocks on the bell
 * alone, whose first write will ring the bell anyway (xmux_sub).
 *
 * Ordering: a subscription gets its stream's entries in stream order, each
 * once, from the one after from_id on; entries come as XREAD would have
 * returned them. Backpressure: a subscription holding XMUX_HELD_MAX entries
 * not yet taken is left out of the read until its owner takes them (the
 * entries wait in Redis, not in our memory).
 *
 * The bell: with a bell key, the reader blocks on that one stream instead
 * of on every stream it follows, and reads only the streams the bell
 * names. Blocking on n streams costs Redis ~0.6-0.9 us per stream per
 * read (each is registered and unregistered), and Redis 7.0 answers such a
 * read with only the first stream that became ready, so a flush of k
 * streams cost two reads naming all n. Every writer of the followed
 * streams rings the bell in the same script or transaction as its events:
 * XADD <bell> MAXLEN ~ XMUX_BELL_MAXLEN * <key> <n> [<key> <n> ...], one
 * entry per write naming the streams written (the value is unused). A
 * writer that does not ring (an older version, an ACL that lets it write
 * the streams but not the bell) is caught by a read of every followed
 * stream each XMUX_SWEEP_MS: its news, which no ring named, comes then
 * (late, never lost), and the reader gives the bell up and blocks on every
 * stream from then on (xmux_stats). Nothing is lost to the bell's
 * trimming either: a read of it is capped at fewer entries than it keeps,
 * so one that comes back full may have missed some, and then every stream
 * is read.
 *
 * On a Redis Cluster one XREAD reads one slot, and an out stream sits in
 * its id's: a reader there follows the streams of one slot (xmux_opts.slot;
 * xmux_sub refuses the others), its CLIENT ID and UNBLOCK go to that
 * slot's master (asked again whenever another connection serves the slot:
 * a failover, a new slot map), and its bell is that slot's (writers ring
 * the bell of the slot they write, common/rcluster.h rcl_bell_key). A caller keeps one reader per request slot
 * (common/rcluster.h, rcl_map_request_slots) for the ids it chose there,
 * and reads any other stream on its own. xmux_create refuses a cluster
 * without a slot, and an ACL without CLIENT ID and CLIENT UNBLOCK, with
 * -RL_EUNSUPPORTED: callers then read each stream on its own.
 */
#ifndef RL_XMUX_H
#define RL_XMUX_H

#include <stdbool.h>

#include "err.h"
#include "rconn.h"

#define XMUX_HELD_MAX 4096 /* entries held for one subscription before its stream is skipped */
/* The bell's length (MAXLEN ~): more than one read takes (COUNT_PER_KEY_N,
 * 512, xmux.c), so that a reader that fell further behind finds its read
 * full and reads every stream. Not more: an entry names every stream one
 * flush wrote (about 30 bytes each, up to a batch's worth), and the bell
 * is memory no reader frees; at 4096 it grew to 450 KB in a 2-worker test
 * under maxmemory and took what the streams needed (CI, 2026-12-06). */
#define XMUX_BELL_MAXLEN "1024"
#define XMUX_SWEEP_MS 1000      /* with a bell: every stream read this often regardless */
#define XMUX_KEY_MAX 192        /* a bell's key */

struct xmux;
struct xmux_sub;

struct xmux_opts {
    const char *bell; /* the bell stream's key (copied); NULL: block on every stream */
    int sweep_ms;     /* with a bell: every stream is read this often; 0: XMUX_SWEEP_MS */
    int slot;         /* on a cluster: the slot of every stream followed (needed there);
                         ignored on a single instance */
};

/* Opens two connections with *o (its strings are copied; the reader's is
 * named "<client_name>-xmux", or "xmux"), checks CLIENT ID and CLIENT
 * UNBLOCK (and XREAD of the bell), and starts the reader. xo NULL: no
 * bell. -RL_EUNSUPPORTED for a cluster without xo->slot or an ACL that
 * refuses one of those (err says which), -RL_EIO when Redis cannot be reached now (try again
 * later). */
int xmux_create(struct xmux **out, const struct rconn_opts *o, const struct xmux_opts *xo,
                struct rl_err *err);
/* For writers: whether a writer may ring the bell, asked once per
 * connection (an ACL may change with a restart) by ringing it from a
 * script, as the writers do (a ring that names no followed stream is
 * harmless). A writer that may not must not name the bell in its scripts.
 * Zeroed: not asked yet. */
struct xmux_ringer {
    int on;         /* 1 may ring, -1 may not (the ACL), 0 not asked yet */
    long long conn; /* rconn_n_reconnects(c) + 1 when last answered */
};
/* Asks unless c's connection was asked already; true when the answer
 * changed, with *why saying what refused it when it is now -1. Redis away
 * or busy: unchanged, asked again at the next call. */
bool xmux_ringer_check(struct xmux_ringer *rg, struct rconn *c, const char *bell,
                       struct rl_err *why);

/* Stops and joins the reader. Every subscription must have been ended. */
void xmux_free(struct xmux *m);

/* flags of xmux_sub. XMUX_UNWRITTEN: nothing has written key yet, nor
 * will before this call returns (the caller subscribes before it submits
 * the job that writes it). Then, on the bell, the reader's read is not cut
 * short for it (a CLIENT UNBLOCK and a read fewer, each job: issue 27):
 * the stream's first write rings the bell. Wrong about it, the caller
 * still gets every entry, later (with the reader's next round, at the
 * latest after sweep_ms). */
#define XMUX_UNWRITTEN 1u

/* Follows key from the entry after from_id ("0-0": from the start). *out
 * is owned by the caller until xmux_unsub. -RL_EINVAL on a cluster for a
 * key outside the reader's slot. */
int xmux_sub(struct xmux *m, const char *key, const char *from_id, unsigned flags,
             struct xmux_sub **out, struct rl_err *err);
/* Waits up to timeout_ms for entries. Returns 0 with *out a reply shaped as
 * XREAD's ([[key, [[id, [field, value, ...]], ...]]], every entry held so
 * far; the caller frees it) or NULL when none came in time; -RL_EIO when the
 * reader's last read failed and nothing is held (err says why; the reader
 * keeps trying, so waiting again is right). */
int xmux_next(struct xmux_sub *s, int timeout_ms, struct rconn_reply **out, struct rl_err *err);
/* The key s follows (owned by s). */
const char *xmux_sub_key(const struct xmux_sub *s);
/* Ends s and frees it with any entries still held; NULL is fine. */
void xmux_unsub(struct xmux_sub *s);

/* What the reader has done so far (for tests and metrics). */
struct xmux_stats {
    long long reads; /* reads made */
    long long named; /* streams named in them, the bell not counted */
    bool bell_on;    /* still on the bell: false without one, and once a read
                        found news in a stream that no ring had named (a
                        writer that does not ring, e.g. an older worker): it
                        then blocks on every stream, for as long as it runs */
};
void xmux_stats(struct xmux *m, struct xmux_stats *out);
/* Entries held for s, not yet taken. */
size_t xmux_n_held(struct xmux_sub *s);

/* The readers one process needs, made together (the front door, `redlm
 * bench`): on a single instance one; on a cluster one per request slot
 * (common/rcluster.h) of the slot map at creation, for the ids the process
 * chooses there (xmux_set_slots). With bell, each is on the bell of its
 * slot (rcl_bell_key of prefix) when the ACL lets it read it, else all
 * block on every stream. */
struct xmux_set;
/* *note (may be NULL) gets why the bell was not used when it was refused
 * (code 0 otherwise). -RL_EUNSUPPORTED when no reader can be had (an ACL
 * without CLIENT ID / CLIENT UNBLOCK): every stream is then read on its
 * own; -RL_EIO when Redis cannot be reached now. */
int xmux_set_create(struct xmux_set **out, const struct rconn_opts *o, const char *prefix,
                    bool bell, struct rl_err *note, struct rl_err *err);
/* Stops every reader (every subscription must have been ended); NULL is fine. */
void xmux_set_free(struct xmux_set *s);
/* Follows key on the reader of its slot, as xmux_sub. *out NULL (and 0
 * returned) when no reader has that slot (an id not chosen on a request
 * slot, on a cluster): the caller reads that stream on its own. */
int xmux_set_sub(struct xmux_set *s, const char *key, const char *from_id, unsigned flags,
                 struct xmux_sub **out, struct rl_err *err);
/* The request slots ids are chosen on (*slots owned by s): 0 on a single
 * instance, where any id will do. */
int xmux_set_slots(const struct xmux_set *s, const int **slots);
/* Every reader's xmux_stats summed; bell_on: every reader is still on its
 * bell. */
void xmux_set_stats(struct xmux_set *s, struct xmux_stats *out);

#endif
