/* common/xmux.c - one blocking XREAD shared by every stream a process
 * follows (xmux.h).
 *
 * The reader thread loops: under the lock it makes a round of the live
 * subscriptions not held back by backpressure, notes the generation it saw
 * and that it is reading, then (unlocked) sends one
 * XREAD COUNT n BLOCK ms STREAMS k1 .. kn c1 .. cn, one (key, cursor) pair
 * per subscription: two subscriptions of one key simply appear twice,
 * which Redis answers positionally. Back under the lock it hands each
 * stream of the reply to its subscription by walking the round in order
 * (XREAD answers in argument order and leaves out the streams with
 * nothing new), moving the entries out of the reply rather than copying
 * them, and signals the owner's condition variable.
 *
 * With a bell (xmux.h) and more than BLOCK_ALL_MAX streams, a round is
 * only the subscriptions marked dirty (new, named by the bell, capped by
 * COUNT last time, back from backpressure, or all of them at a sweep or
 * after a failed read), read without BLOCK with the bell first; with none
 * dirty the read blocks on the bell alone. A stream in a round that
 * answered is clean afterwards even when it had nothing: anything written
 * to it after the read was made rings the bell again. With fewer streams
 * the reader blocks on all of them, as without a bell.
 *
 * The read of a round goes out with the blocking read of
 * the bell that would follow it (rconn_command_then), so a round costs
 * Redis one read event, not two (issue 27: an event is worth ~20 us of
 * its CPU on our VM, more than the commands). That second read starts at
 * the bell cursor the first one starts at: a ring the first one answered
 * makes it answer at once, and ring() skips the entries taken already.
 * Only work the bell will not announce (a stream capped by COUNT) has the
 * reader cut its own second read short with CLIENT UNBLOCK. On a cluster
 * the pair goes to the master of the reader's slot; after a failed pair
 * (a redirect) the next read goes alone, following redirects.
 *
 * A subscription in the current round is never freed under the reader:
 * xmux_unsub only marks it dead, and the reader frees it after the read.
 * That is what lets the round hold plain pointers and the argv point at
 * the subscriptions' own key and cursor strings (the cursor is written
 * only by the reader, under the lock, after the read).
 *
 * Waking the reader: anything that changes what it must read (a new
 * subscription, but one of an unwritten stream while on the bell alone:
 * xmux_sub; one drained from backpressure, the end) bumps gen. If the
 * reader is in a read made from an older gen, kick() sends CLIENT UNBLOCK
 * <its id> from the control connection; the read answers nil at once and
 * the next round includes the change. UNBLOCK answers 0 when the reader's
 * XREAD has not reached Redis yet (it is between taking the round and
 * blocking): kick() then waits 100 us and tries again, until the reader
 * has moved on. So a new request's first event is never held back by the
 * BLOCK time, which can then be long (an idle front door reads once a
 * second).
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "rcluster.h"
#include "xmux.h"

#define BLOCK_MS 1000       /* the reader's BLOCK when nothing changes (at most) */
#define COUNT_PER_KEY_N 512 /* entries per stream per read (the bell's too: < its MAXLEN) */
#define STR_(x) #x
#define STR(x) STR_(x)
#define COUNT_PER_KEY STR(COUNT_PER_KEY_N)
#define KICK_TRIES 2000     /* x 100 us: how long kick() waits for the read to block */
#define N_BUCKETS 1024      /* subscriptions by key, for the keys a bell names */
/* Even with a bell, up to BLOCK_ALL_MAX streams are blocked on directly, as
 * without one: a flush that writes one of them is then answered by the one
 * read it wakes, where the bell costs a wake and a read (a blocked read
 * costs Redis ~0.7 us per stream it names, a read ~20 us of event loop on
 * our VM). Above it the reader blocks on the bell alone, until the streams
 * are down to BLOCK_ALL_MIN (so that it does not flap at the border). */
#define BLOCK_ALL_MAX 24
#define BLOCK_ALL_MIN 16

struct xmux_sub {
    struct xmux *m;
    char *key;
    char cursor[RCONN_ID_MAX];  /* the last entry held or taken (reader-written) */
    struct rconn_reply *held;   /* (n_held) entries moved out of replies, not yet taken */
    size_t n_held, cap_held;
    bool in_round, dead;
    bool dirty;                 /* with a bell: to be read (named by the bell, new, ...) */
    bool unwritten;             /* dirty only as new and XMUX_UNWRITTEN: read with the next
                                   round, never a reason to cut a blocked read short */
    bool swept;                 /* dirty only because a sweep reads every stream */
    pthread_cond_t cond;        /* entries arrived, or the reader failed */
    struct xmux_sub *prev, *next;
    struct xmux_sub *hnext;     /* the next in its key's bucket */
};

struct xmux {
    struct rconn *rd, *ctl;      /* the reader's connection; the control one (ctl_mu) */
    pthread_mutex_t mu, ctl_mu;
    pthread_cond_t idle;         /* the reader waits here with nothing to read */
    pthread_t thread;
    struct xmux_sub *subs;       /* every subscription, dead ones included until freed */
    unsigned long long gen;      /* bumped by every change the reader must see */
    unsigned long long read_gen; /* the gen the current read was made from */
    bool in_read, stopping;
    long long cid;               /* the reader connection's CLIENT ID (stale until the
                                    reader reads it again after a reconnect: an UNBLOCK
                                    then answers 0 and kick() tries again) */
    long long cid_conn;          /* rconn_slot_conn(rd, slot) when cid was read */
    bool cluster;                /* every stream in one slot, CLIENT ID/UNBLOCK on its master */
    int slot;
    struct rl_err fail;          /* the last read's failure, code 0 after a good read */
    long long n_reads, n_named;
    char *bell;                  /* NULL: block on every stream */
    bool bell_on;                /* false once a writer was caught not ringing */
    char bell_cursor[RCONN_ID_MAX]; /* the last bell entry read (reader-only) */
    bool bell_only;              /* blocking on the bell alone (BLOCK_ALL_MAX) */
    bool bell_synced;            /* bell_cursor read since the reader last left it */
    bool rang;                   /* the last reply named a stream on the bell's new entries */
    int64_t next_sweep_ms;       /* with a bell: when every stream is read next */
    int sweep_ms;
    int block_ms;                /* BLOCK_MS, or half the connection's reply timeout */
    struct xmux_sub *bucket[N_BUCKETS];
};

static void sub_free(struct xmux_sub *s)
{
    if (s->n_held) { /* the entries held: one array reply frees them all */
        struct rconn_reply *box = malloc(sizeof *box);
        if (box) {
            *box = (struct rconn_reply){.type = RCONN_ARRAY, .elem = s->held, .n_elem = s->n_held};
            rconn_reply_free(box);
            s->held = NULL;
        }
    }
    free(s->held);
    free(s->key);
    pthread_cond_destroy(&s->cond);
    free(s);
}

static size_t bucket_of(const char *key)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h & (N_BUCKETS - 1);
}

/* Marks every subscription of key to be read (under mu), but those of the
 * round just read when `fresh` (see ring). */
static void mark_key(struct xmux *m, const char *key, bool fresh)
{
    for (struct xmux_sub *s = m->bucket[bucket_of(key)]; s; s = s->hnext)
        if (!strcmp(s->key, key)) {
            s->swept = false; /* rung for: its news is accounted for */
            if (!(fresh && s->in_round))
                s->dirty = true, s->unwritten = false;
        }
}

/* Marks every subscription to be read: for a cause (swept false), or by
 * the sweep, which notes the ones that had no other cause. */
static void mark_all(struct xmux *m, bool sweep)
{
    for (struct xmux_sub *s = m->subs; s; s = s->next) {
        s->swept = sweep ? !s->dirty || s->swept : false;
        s->dirty = true;
    }
}

static void unlink_sub(struct xmux *m, struct xmux_sub *s)
{
    for (struct xmux_sub **p = &m->bucket[bucket_of(s->key)]; *p; p = &(*p)->hnext)
        if (*p == s) {
            *p = s->hnext;
            break;
        }
    if (s->prev)
        s->prev->next = s->next;
    else
        m->subs = s->next;
    if (s->next)
        s->next->prev = s->prev;
}

/* One command that must answer an integer (CLIENT ID, CLIENT UNBLOCK); an
 * error reply is -RL_EUNSUPPORTED: an ACL without the command. On a
 * cluster it goes to the master of the reader's slot, where its reads
 * block. */
static int probe(const struct xmux *m, struct rconn *c, int argc, const char *const *argv,
                 long long *val, struct rl_err *err)
{
    struct rconn_reply *r = NULL;
    int rc = m->cluster ? rconn_command_on(c, rconn_slot_master(c, m->slot), argc, argv, NULL,
                                           &r, err)
                        : rconn_command(c, argc, argv, NULL, &r, err);
    if (rc == -RL_EINVAL && r && r->type == RCONN_ERROR)
        rc = rl_errf(err, RL_EUNSUPPORTED, "%s %s: %s", argv[0], argv[1], r->str);
    else if (!rc && (!r || r->type != RCONN_INTEGER))
        rc = rl_errf(err, RL_EUNSUPPORTED, "%s %s: not an integer reply", argv[0], argv[1]);
    else if (!rc)
        *val = r->integer;
    rconn_reply_free(r);
    return rc;
}

/* CLIENT ID of the reader's connection, read again after a reconnect (the
 * id is per connection). Called by the reader only. */
static int refresh_cid(struct xmux *m, struct rl_err *err)
{
    int rc = rconn_ensure(m->rd, err);
    if (rc)
        return rc;
    long long conn = rconn_slot_conn(m->rd, m->slot);
    pthread_mutex_lock(&m->mu);
    bool fresh = conn && m->cid_conn == conn;
    pthread_mutex_unlock(&m->mu);
    if (fresh)
        return 0;
    const char *argv[] = {"CLIENT", "ID"};
    long long id;
    if ((rc = probe(m, m->rd, 2, argv, &id, err)))
        return rc;
    pthread_mutex_lock(&m->mu);
    bool moved = m->cluster && m->cid_conn; /* not the first: maybe another master */
    m->cid = id;
    m->cid_conn = rconn_slot_conn(m->rd, m->slot);
    pthread_mutex_unlock(&m->mu);
    if (moved) { /* the UNBLOCKs must follow: their connection reads the map again */
        pthread_mutex_lock(&m->ctl_mu);
        rconn_map_stale(m->ctl);
        pthread_mutex_unlock(&m->ctl_mu);
    }
    return 0;
}

/* Moves the entries of one reply stream ([key, [entry, ...]]) to s. */
static void take_stream(struct xmux_sub *s, struct rconn_reply *st)
{
    if (st->type != RCONN_ARRAY || st->n_elem != 2 || st->elem[1].type != RCONN_ARRAY)
        return;
    struct rconn_reply *es = &st->elem[1];
    if (!es->n_elem)
        return;
    if (es->n_elem >= COUNT_PER_KEY_N)
        s->dirty = true, s->swept = false; /* capped by COUNT: more may be waiting */
    if (s->n_held + es->n_elem > s->cap_held) {
        size_t cap = (s->n_held + es->n_elem) * 2;
        struct rconn_reply *h = realloc(s->held, cap * sizeof *h);
        if (!h) {
            s->dirty = true, s->swept = false; /* the cursor stays: they come again */
            return;
        }
        s->held = h;
        s->cap_held = cap;
    }
    const struct rconn_reply *last = &es->elem[es->n_elem - 1];
    if (last->type == RCONN_ARRAY && last->n_elem == 2 && last->elem[0].type == RCONN_STRING)
        snprintf(s->cursor, sizeof s->cursor, "%s", last->elem[0].str);
    memcpy(s->held + s->n_held, es->elem, es->n_elem * sizeof *es->elem);
    s->n_held += es->n_elem;
    /* the entries are s's now: leave the reply an empty array */
    free(es->elem);
    es->elem = NULL;
    es->n_elem = 0;
}

/* Whether stream entry ID a ("ms-seq") is before b. */
static bool id_before(const char *a, const char *b)
{
    char *e;
    unsigned long long am = strtoull(a, &e, 10), as = *e == '-' ? strtoull(e + 1, NULL, 10) : 0;
    unsigned long long bm = strtoull(b, &e, 10), bs = *e == '-' ? strtoull(e + 1, NULL, 10) : 0;
    return am < bm || (am == bm && as < bs);
}

/* Marks the streams the bell's new entries name ([bell, [entry, ...]]),
 * under mu; every stream when the read came back full, for then entries
 * may have been trimmed unread (the bell keeps more than a read takes).
 * fresh: the reply is one moment's snapshot of the bell and the round's
 * streams (a read without BLOCK), so a ring in it is for a write the same
 * reply already holds: the round's streams need no read again for it
 * (unless capped by COUNT: take_stream). */
static void ring(struct xmux *m, const struct rconn_reply *st, bool fresh)
{
    if (st->n_elem != 2 || st->elem[1].type != RCONN_ARRAY)
        return;
    const struct rconn_reply *es = &st->elem[1];
    for (size_t i = 0; i < es->n_elem; i++) {
        const struct rconn_reply *e = &es->elem[i];
        if (e->type != RCONN_ARRAY || e->n_elem != 2 || e->elem[0].type != RCONN_STRING)
            continue;
        /* a pair's blocking read starts where its first read did, so it
         * may answer again with rings the first one took */
        if (m->bell_cursor[0] && !id_before(m->bell_cursor, e->elem[0].str))
            continue;
        m->rang = true;
        snprintf(m->bell_cursor, sizeof m->bell_cursor, "%s", e->elem[0].str);
        const struct rconn_reply *fv = &e->elem[1];
        for (size_t k = 0; fv->type == RCONN_ARRAY && k < fv->n_elem; k += 2)
            if (fv->elem[k].type == RCONN_STRING)
                mark_key(m, fv->elem[k].str, fresh);
    }
    if (es->n_elem >= COUNT_PER_KEY_N)
        mark_all(m, false);
}

/* The ID of the first entry of a reply stream ([key, [[id, ...], ...]]). */
static const char *first_id(const struct rconn_reply *st)
{
    const struct rconn_reply *es = &st->elem[1];
    if (es->type != RCONN_ARRAY || !es->n_elem || es->elem[0].type != RCONN_ARRAY ||
        !es->elem[0].n_elem || es->elem[0].elem[0].type != RCONN_STRING)
        return NULL;
    return es->elem[0].elem[0].str;
}

/* Hands a reply's streams to the round's subscriptions, and the bell's
 * entries to ring() (under mu). sync: the read had no BLOCK, so its reply
 * is one moment's snapshot of the bell and the streams; and a writer rings
 * in the same script as it writes: news in a stream that only the sweep
 * had marked, which the bell does not name, was written by a writer that
 * does not ring. Then the bell is given up for blocking on every stream
 * (bell_on, which xmux_stats reports). */
static void deliver(struct xmux *m, struct xmux_sub **round, int n, struct rconn_reply *r,
                    bool sync)
{
    if (!r || r->type != RCONN_ARRAY)
        return; /* nil: the BLOCK ran out, or an UNBLOCK */
    int i = 0;
    bool judge = m->bell_on && sync; /* not when the bell came back full (naming cut off) */
    for (size_t k = 0; k < r->n_elem; k++) {
        struct rconn_reply *st = &r->elem[k];
        if (st->type != RCONN_ARRAY || st->n_elem != 2 || st->elem[0].type != RCONN_STRING)
            continue;
        if (m->bell_on && k == 0 && !strcmp(st->elem[0].str, m->bell)) { /* named first */
            ring(m, st, sync);
            judge = st->elem[1].type == RCONN_ARRAY && st->elem[1].n_elem < COUNT_PER_KEY_N;
            continue;
        }
        /* XREAD leaves out the streams with nothing new, so a key named
         * twice (two subscriptions, two cursors) may come back once: it is
         * the first one whose cursor is before its first entry (any such
         * cursor had news, and came back). Served from a BLOCK it is always
         * the first occurrence's: Redis blocks on a key once, with the
         * first cursor named for it. */
        const char *f = first_id(st);
        while (i < n && (strcmp(round[i]->key, st->elem[0].str) ||
                         (f && !id_before(round[i]->cursor, f))))
            i++;
        if (i == n)
            return; /* not in argument order: nothing more can be matched */
        struct xmux_sub *s = round[i++];
        if (judge && s->swept && st->elem[1].type == RCONN_ARRAY && st->elem[1].n_elem)
            m->bell_on = false;
        if (s->dead)
            continue;
        take_stream(s, st);
        pthread_cond_signal(&s->cond);
    }
}

/* The bell's last entry ID, so that the next read takes only what comes
 * after; "0-0" when it is empty or cannot be read that way (that read
 * then comes back full, and every stream is read: slower, right). When
 * Redis cannot answer now the cursor stays as it was: the read that
 * follows fails too, and this is asked again after it. */
static void bell_start(struct xmux *m)
{
    const char *argv[] = {"XREVRANGE", m->bell, "+", "-", "COUNT", "1"};
    struct rconn_reply *r = NULL;
    int rc = rconn_command(m->rd, 6, argv, NULL, &r, NULL);
    if (rc != -RL_EIO || !m->bell_cursor[0])
        snprintf(m->bell_cursor, sizeof m->bell_cursor, "0-0");
    if (!rc && r && r->type == RCONN_ARRAY && r->n_elem == 1 && r->elem[0].type == RCONN_ARRAY &&
        r->elem[0].n_elem == 2 && r->elem[0].elem[0].type == RCONN_STRING)
        snprintf(m->bell_cursor, sizeof m->bell_cursor, "%s", r->elem[0].elem[0].str);
    rconn_reply_free(r);
}

/* A read failed (under mu): its owners hear of it, and every stream is
 * read again once Redis is back. */
static void read_failed(struct xmux *m, const struct rl_err *e)
{
    m->fail = *e;
    if (!m->fail.code)
        m->fail.code = RL_EIO;
    for (struct xmux_sub *s = m->subs; s; s = s->next)
        pthread_cond_signal(&s->cond);
    mark_all(m, false);     /* anything may have come while Redis was away */
    m->bell_synced = false; /* and it may be another Redis, its bell elsewhere */
}

/* Redis is away (under mu): rconn's backoff says when to try again. */
static void failed_wait(struct xmux *m)
{
    if (m->stopping)
        return;
    int64_t wait = rconn_retry_in_ms(m->rd);
    struct timespec ts;
    rl_mono_deadline(&ts, wait > 20 && wait < 1000 ? (int)wait : 50);
    pthread_cond_timedwait(&m->idle, &m->mu, &ts);
}

/* CLIENT UNBLOCK cid from the control connection: 1 when a read was cut
 * short, 0 when none was blocked, -1 when Redis could not be asked. */
static int unblock(struct xmux *m, long long cid)
{
    char id[24];
    snprintf(id, sizeof id, "%lld", cid);
    const char *argv[] = {"CLIENT", "UNBLOCK", id};
    long long n = 0;
    pthread_mutex_lock(&m->ctl_mu);
    int rc = probe(m, m->ctl, 3, argv, &n, NULL);
    pthread_mutex_unlock(&m->ctl_mu);
    return rc ? -1 : (int)n;
}

static void *reader_main(void *arg)
{
    struct xmux *m = arg;
    struct xmux_sub **round = NULL;
    const char **argv = NULL;
    int cap = 0;
    char block[24];
    bool sync = false; /* the read had no BLOCK */
    bool unpaired = false; /* the last pair failed: the next read goes alone (it follows
                              a cluster's ASK, which a pair does not) */
    pthread_mutex_lock(&m->mu);
    while (!m->stopping) {
        if (rconn_awaiting(m->rd)) {
            /* the bell's blocking read, sent with the last read, is out;
             * in_read and read_gen stay as the pair set them: a kick cuts
             * it short as any other read */
            pthread_mutex_unlock(&m->mu);
            struct rl_err e = {0};
            struct rconn_reply *r = NULL;
            bool came = false;
            int rc;
            do
                rc = rconn_collect(m->rd, 1 << 30, &r, &came, &e);
            while (!rc && !came);
            pthread_mutex_lock(&m->mu);
            m->in_read = false;
            m->n_reads++;
            if (rc) {
                read_failed(m, &e);
                failed_wait(m);
            } else {
                deliver(m, NULL, 0, r, false);
            }
            pthread_mutex_unlock(&m->mu);
            rconn_reply_free(r);
            pthread_mutex_lock(&m->mu);
            continue;
        }
        int n = 0, n_live = 0;
        for (struct xmux_sub *s = m->subs; s; s = s->next)
            n_live += !s->dead && s->n_held < XMUX_HELD_MAX;
        m->bell_only = m->bell_on &&
                       (n_live > BLOCK_ALL_MAX || (m->bell_only && n_live > BLOCK_ALL_MIN));
        int64_t now = rl_mono_ms();
        if (m->bell_only && now >= m->next_sweep_ms) { /* writers that do not ring */
            mark_all(m, true);
            m->next_sweep_ms = now + m->sweep_ms;
        }
        if (!m->bell_only) {
            m->bell_synced = false;
        } else if (!m->bell_synced) {
            /* onto the bell: its last entry first, then every stream read
             * once; whatever is written after the first rings the bell */
            pthread_mutex_unlock(&m->mu);
            bell_start(m);
            pthread_mutex_lock(&m->mu);
            mark_all(m, false);
            m->bell_synced = true;
            continue;
        }
        bool all = !m->bell_only;
        for (struct xmux_sub *s = m->subs; s; s = s->next)
            n += !s->dead && s->n_held < XMUX_HELD_MAX && (all || s->dirty);
        if (n > cap) {
            int c2 = n * 2;
            struct xmux_sub **r2 = realloc(round, (size_t)c2 * sizeof *r2);
            if (r2)
                round = r2;
            const char **a2 = r2 ? realloc(argv, (size_t)(8 + 2 * c2) * sizeof *a2) : NULL;
            if (a2)
                argv = a2;
            if (!r2 || !a2) { /* out of memory: wait and try again */
                struct timespec ts;
                rl_mono_deadline(&ts, 100);
                pthread_cond_timedwait(&m->idle, &m->mu, &ts);
                continue;
            }
            cap = c2;
        }
        n = 0;
        for (struct xmux_sub *s = m->subs; s; s = s->next)
            if (!s->dead && s->n_held < XMUX_HELD_MAX && (all || s->dirty)) {
                s->in_round = true;
                round[n++] = s;
            }
        m->read_gen = m->gen;
        if (!n_live) {
            while (m->gen == m->read_gen && !m->stopping)
                pthread_cond_wait(&m->idle, &m->mu);
            continue;
        }
        m->in_read = true;
        pthread_mutex_unlock(&m->mu);

        struct rl_err e = {0};
        struct rconn_reply *r = NULL;
        int rc = refresh_cid(m, &e);
        if (!rc) {
            /* on the bell: the bell first, then the streams to be read, and
             * no BLOCK; with none to read, a BLOCK on the bell alone, up to
             * the next sweep. Else a BLOCK on every stream */
            int a = 0, nb = all ? 0 : 1;
            argv[a++] = "XREAD", argv[a++] = "COUNT", argv[a++] = COUNT_PER_KEY;
            sync = !all && n;
            int64_t left = all ? m->block_ms : m->next_sweep_ms - rl_mono_ms();
            if (left > m->block_ms)
                left = m->block_ms;
            if (left < 1)
                left = 1;
            snprintf(block, sizeof block, "%lld", (long long)left);
            if (!sync)
                argv[a++] = "BLOCK", argv[a++] = block;
            argv[a++] = "STREAMS";
            if (nb)
                argv[a++] = m->bell;
            for (int i = 0; i < n; i++)
                argv[a + i] = round[i]->key;
            a += n;
            if (nb)
                argv[a++] = m->bell_cursor;
            for (int i = 0; i < n; i++)
                argv[a + i] = round[i]->cursor;
            if (sync && !unpaired) {
                /* the read that follows this one, blocked on the bell, goes
                 * with it: one read event for Redis a round, not two. It
                 * starts where this one's bell does, so a ring this one
                 * answers makes it answer at once (ring() skips what this
                 * one took) and the streams it names are read next */
                const char *then[] = {"XREAD",  "COUNT",  COUNT_PER_KEY, "BLOCK",
                                      block,    "STREAMS", m->bell,      m->bell_cursor};
                rc = rconn_command_then(m->rd, a + n, argv, NULL, &r, 8, then, (int)left, &e);
                unpaired = rc != 0;
            } else {
                rc = rconn_command(m->rd, a + n, argv, NULL, &r, &e);
                unpaired = false;
            }
        }

        bool pair_out = rconn_awaiting(m->rd); /* its second read */
        pthread_mutex_lock(&m->mu);
        m->in_read = pair_out;
        m->n_reads++;
        m->n_named += n;
        m->rang = false;
        if (rc) {
            read_failed(m, &e);
        } else {
            m->fail.code = 0;
            /* read now: clean, unless the reply says otherwise (a stream
             * capped by COUNT, the bell naming it again). A stream that
             * had nothing was read too: what comes later rings the bell */
            for (int i = 0; i < n; i++)
                round[i]->dirty = round[i]->unwritten = false;
            deliver(m, round, n, r, sync);
            for (int i = 0; i < n; i++)
                round[i]->swept = false;
        }
        bool cut = false; /* the pair's blocking read would sit on work to do */
        if (pair_out && !m->rang)
            for (struct xmux_sub *s = m->subs; s && !cut; s = s->next)
                cut = !s->dead && s->dirty && !s->unwritten && s->n_held < XMUX_HELD_MAX;
        for (int i = 0; i < n; i++) {
            round[i]->in_round = false;
            if (round[i]->dead) {
                unlink_sub(m, round[i]);
                sub_free(round[i]);
            }
        }
        if (rc && !pair_out)
            failed_wait(m);
        long long cid = m->cid;
        pthread_mutex_unlock(&m->mu);
        rconn_reply_free(r);
        if (cut)
            unblock(m, cid);
        pthread_mutex_lock(&m->mu);
    }
    pthread_mutex_unlock(&m->mu);
    free(round);
    free(argv);
    return NULL;
}

/* Makes sure the reader sees gen `want` (every change up to it): wakes it
 * from its idle wait, and cuts short a read made from an older gen. */
static void kick(struct xmux *m, unsigned long long want)
{
    pthread_mutex_lock(&m->mu);
    pthread_cond_signal(&m->idle);
    pthread_mutex_unlock(&m->mu);
    for (int t = 0; t < KICK_TRIES; t++) {
        pthread_mutex_lock(&m->mu);
        bool need = m->in_read && m->read_gen < want;
        long long cid = m->cid;
        pthread_mutex_unlock(&m->mu);
        if (!need)
            return;
        if (unblock(m, cid) != 0)
            return; /* unblocked; or Redis is away (and so is the read) */
        struct timespec ts = {0, 100 * 1000};
        nanosleep(&ts, NULL);
    }
}

int xmux_create(struct xmux **out, const struct rconn_opts *o, const struct xmux_opts *xo,
                struct rl_err *err)
{
    *out = NULL;
    struct xmux *m = calloc(1, sizeof *m);
    if (!m)
        return rl_errf(err, RL_ENOMEM, "xmux: out of memory");
    m->sweep_ms = xo && xo->sweep_ms > 0 ? xo->sweep_ms : XMUX_SWEEP_MS;
    /* rconn waits io_timeout_ms for a reply: a BLOCK as long would read as
     * a dead connection */
    m->block_ms = o->io_timeout_ms > 0 && o->io_timeout_ms / 2 < BLOCK_MS
                      ? (o->io_timeout_ms / 2 > 0 ? o->io_timeout_ms / 2 : 1) : BLOCK_MS;
    m->slot = xo ? xo->slot : 0;
    if (xo && xo->bell && !(m->bell = strdup(xo->bell))) {
        free(m);
        return rl_errf(err, RL_ENOMEM, "xmux: out of memory");
    }
    int rc = 0;
    bool mu = false, ctl_mu = false, idle = false;
    /* named, so that CLIENT LIST tells the shared reader from the rest */
    char name[RCONN_NAME_MAX];
    snprintf(name, sizeof name, "%.100s%sxmux", o->client_name ? o->client_name : "",
             o->client_name && o->client_name[0] ? "-" : "");
    struct rconn_opts ro = *o;
    ro.client_name = name;
    if ((rc = rconn_create(&m->rd, &ro, err)) || (rc = rconn_create(&m->ctl, o, err)))
        goto fail;
    if ((rc = rconn_ensure(m->rd, err)) || (rc = rconn_ensure(m->ctl, err)))
        goto fail;
    if ((m->cluster = rconn_is_cluster(m->rd))) {
        if (!xo || xo->slot < 0 || xo->slot >= RCL_N_SLOTS) {
            rc = rl_errf(err, RL_EUNSUPPORTED,
                         "on a Redis Cluster one read follows the streams of one slot: "
                         "xmux_opts.slot names it");
            goto fail;
        }
        if (m->bell && rcl_key_slot(m->bell, strlen(m->bell)) != m->slot) {
            rc = rl_errf(err, RL_EINVAL, "xmux: the bell %.100s is not in slot %d", m->bell,
                         m->slot);
            goto fail;
        }
    }
    long long id = -1, n = 0;
    const char *cid[] = {"CLIENT", "ID"};
    if ((rc = probe(m, m->rd, 2, cid, &m->cid, err)) ||
        (rc = probe(m, m->ctl, 2, cid, &id, err)))
        goto fail;
    m->cid_conn = rconn_slot_conn(m->rd, m->slot);
    char ids[24];
    snprintf(ids, sizeof ids, "%lld", id);
    const char *unb[] = {"CLIENT", "UNBLOCK", ids}; /* itself, not blocked: answers 0 */
    if ((rc = probe(m, m->ctl, 3, unb, &n, err)))
        goto fail;
    if (m->bell) { /* may the reader read the bell? (an older ACL does not let it) */
        const char *rd[] = {"XREAD", "COUNT", "1", "STREAMS", m->bell, "0-0"};
        struct rconn_reply *r = NULL;
        rc = rconn_command(m->rd, 6, rd, NULL, &r, err);
        if (rc == -RL_EINVAL && r && r->type == RCONN_ERROR)
            rc = rl_errf(err, RL_EUNSUPPORTED, "XREAD %s: %s", m->bell, r->str);
        rconn_reply_free(r);
        if (rc)
            goto fail;
        m->bell_on = true;
        m->next_sweep_ms = rl_mono_ms() + m->sweep_ms;
    }
    if (pthread_mutex_init(&m->mu, NULL) || !(mu = true) || pthread_mutex_init(&m->ctl_mu, NULL) ||
        !(ctl_mu = true) || rl_cond_init_mono(&m->idle) || !(idle = true)) {
        rc = rl_errf(err, RL_ENOMEM, "xmux: cannot make its locks");
        goto fail;
    }
    if (pthread_create(&m->thread, NULL, reader_main, m)) {
        rc = rl_errf(err, RL_ENOMEM, "xmux: cannot start the reader thread");
        goto fail;
    }
    *out = m;
    return 0;
fail:
    if (idle)
        pthread_cond_destroy(&m->idle);
    if (ctl_mu)
        pthread_mutex_destroy(&m->ctl_mu);
    if (mu)
        pthread_mutex_destroy(&m->mu);
    rconn_free(m->rd);
    rconn_free(m->ctl);
    free(m->bell);
    free(m);
    return rc;
}

void xmux_free(struct xmux *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    m->stopping = true;
    unsigned long long g = ++m->gen;
    pthread_mutex_unlock(&m->mu);
    kick(m, g);
    pthread_join(m->thread, NULL);
    while (m->subs) { /* never ended by their owners (they must be): freed, not leaked */
        struct xmux_sub *s = m->subs;
        unlink_sub(m, s);
        sub_free(s);
    }
    pthread_cond_destroy(&m->idle);
    pthread_mutex_destroy(&m->ctl_mu);
    pthread_mutex_destroy(&m->mu);
    rconn_free(m->rd);
    rconn_free(m->ctl);
    free(m->bell);
    free(m);
}

int xmux_sub(struct xmux *m, const char *key, const char *from_id, unsigned flags,
             struct xmux_sub **out, struct rl_err *err)
{
    *out = NULL;
    if (strlen(from_id) >= RCONN_ID_MAX)
        return rl_errf(err, RL_EINVAL, "xmux: entry id \"%.60s\" is too long", from_id);
    if (m->cluster && rcl_key_slot(key, strlen(key)) != m->slot)
        return rl_errf(err, RL_EINVAL, "xmux: %.100s is not in slot %d, the one this reader follows",
                       key, m->slot);
    struct xmux_sub *s = calloc(1, sizeof *s);
    if (!s || !(s->key = strdup(key)) || rl_cond_init_mono(&s->cond)) {
        if (s)
            free(s->key);
        free(s);
        return rl_errf(err, RL_ENOMEM, "xmux: out of memory");
    }
    s->m = m;
    snprintf(s->cursor, sizeof s->cursor, "%s", from_id);
    s->dirty = true;
    pthread_mutex_lock(&m->mu);
    s->next = m->subs;
    if (m->subs)
        m->subs->prev = s;
    m->subs = s;
    size_t b = bucket_of(s->key);
    s->hnext = m->bucket[b];
    m->bucket[b] = s;
    /* On the bell alone, a stream that nothing has written yet needs no
     * read now: its first write rings the bell, which wakes the reader
     * with the stream named (the ring is answered after this insert, as
     * the write follows the caller's submit). Cutting the read short
     * would cost Redis a CLIENT UNBLOCK and a read, a job (issue 27).
     * It is still read with the next round, so a caller wrong about
     * XMUX_UNWRITTEN gets its entries then (at the latest at the sweep),
     * not never, and they do not count against the bell (not swept).
     * Blocked on every stream instead, the read does not name it: cut
     * short as any new subscription. */
    s->unwritten = (flags & XMUX_UNWRITTEN) && m->bell_only;
    unsigned long long g = s->unwritten ? 0 : ++m->gen;
    pthread_mutex_unlock(&m->mu);
    if (g)
        kick(m, g);
    *out = s;
    return 0;
}

int xmux_next(struct xmux_sub *s, int timeout_ms, struct rconn_reply **out, struct rl_err *err)
{
    struct xmux *m = s->m;
    *out = NULL;
    struct timespec ts;
    rl_mono_deadline(&ts, timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&m->mu);
    long long reads0 = m->n_reads;
    /* a failure ends the wait when a read fails after it began (one that
     * failed before may have been followed by a good one by then) */
    while (!s->n_held && !m->stopping && !(m->fail.code && m->n_reads != reads0))
        if (pthread_cond_timedwait(&s->cond, &m->mu, &ts) == ETIMEDOUT)
            break;
    if (!s->n_held) {
        int rc = m->fail.code ? rl_errf(err, m->fail.code, "%s", m->fail.msg) : 0;
        pthread_mutex_unlock(&m->mu);
        return rc;
    }
    bool was_full = s->n_held >= XMUX_HELD_MAX;
    struct rconn_reply *r = calloc(1, sizeof *r);
    struct rconn_reply *st = calloc(1, sizeof *st);
    struct rconn_reply *kv = calloc(2, sizeof *kv);
    char *k = strdup(s->key);
    if (!r || !st || !kv || !k) {
        pthread_mutex_unlock(&m->mu);
        free(r), free(st), free(kv), free(k);
        return rl_errf(err, RL_ENOMEM, "xmux: out of memory");
    }
    kv[0] = (struct rconn_reply){.type = RCONN_STRING, .str = k, .len = strlen(k)};
    kv[1] = (struct rconn_reply){.type = RCONN_ARRAY, .elem = s->held, .n_elem = s->n_held};
    *st = (struct rconn_reply){.type = RCONN_ARRAY, .elem = kv, .n_elem = 2};
    *r = (struct rconn_reply){.type = RCONN_ARRAY, .elem = st, .n_elem = 1};
    s->held = NULL;
    s->n_held = s->cap_held = 0;
    if (was_full) /* skipped while full: its stream waits in Redis */
        s->dirty = true, s->swept = false;
    unsigned long long g = was_full ? ++m->gen : 0;
    pthread_mutex_unlock(&m->mu);
    if (was_full)
        kick(m, g); /* its stream is read again */
    *out = r;
    return 0;
}

const char *xmux_sub_key(const struct xmux_sub *s)
{
    return s->key;
}

void xmux_unsub(struct xmux_sub *s)
{
    if (!s)
        return;
    struct xmux *m = s->m;
    pthread_mutex_lock(&m->mu);
    if (s->in_round) {
        s->dead = true; /* the reader frees it after its read */
    } else {
        unlink_sub(m, s);
        sub_free(s);
    }
    pthread_mutex_unlock(&m->mu);
}

/* 0: a writer on c may ring bell; -RL_EUNSUPPORTED: the ACL refuses it
 * (err says how); -RL_EIO: Redis is away or busy (ask again). */
static int ring_probe(struct rconn *c, const char *bell, struct rl_err *err)
{
    const char *argv[] = {"EVAL",
                          "return redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', "
                          "'probe', '0')",
                          "1", bell, XMUX_BELL_MAXLEN};
    struct rconn_reply *r = NULL;
    int rc = rconn_command(c, 5, argv, NULL, &r, err);
    if (rc == -RL_EINVAL && r && r->type == RCONN_ERROR) {
        /* the ACL's refusals; anything else (OOM, BUSY, LOADING) passes */
        bool acl = !strncmp(r->str, "NOPERM", 6) || strstr(r->str, "The user executing");
        rc = rl_errf(err, acl ? RL_EUNSUPPORTED : RL_EIO, "ringing %s: %s", bell, r->str);
    }
    rconn_reply_free(r);
    return rc;
}

bool xmux_ringer_check(struct xmux_ringer *rg, struct rconn *c, const char *bell,
                       struct rl_err *why)
{
    long long conn = rconn_n_reconnects(c) + 1;
    if (rg->conn == conn)
        return false;
    int rc = ring_probe(c, bell, why);
    if (rc && rc != -RL_EUNSUPPORTED)
        return false;
    int on = rc ? -1 : 1;
    bool changed = on != rg->on;
    rg->on = on;
    rg->conn = conn;
    return changed;
}

void xmux_stats(struct xmux *m, struct xmux_stats *out)
{
    pthread_mutex_lock(&m->mu);
    *out = (struct xmux_stats){.reads = m->n_reads, .named = m->n_named, .bell_on = m->bell_on};
    pthread_mutex_unlock(&m->mu);
}

size_t xmux_n_held(struct xmux_sub *s)
{
    pthread_mutex_lock(&s->m->mu);
    size_t n = s->n_held;
    pthread_mutex_unlock(&s->m->mu);
    return n;
}

struct xmux_set {
    int n;                          /* readers: 1 on a single instance */
    struct xmux *mux[RCL_MAX_NODES];
    int slot[RCL_MAX_NODES];        /* the request slots (cluster only) */
    bool cluster;
};

int xmux_set_create(struct xmux_set **out, const struct rconn_opts *o, const char *prefix,
                    bool bell, struct rl_err *note, struct rl_err *err)
{
    *out = NULL;
    if (note)
        note->code = 0;
    struct xmux_set *s = calloc(1, sizeof *s);
    if (!s)
        return rl_errf(err, RL_ENOMEM, "xmux: out of memory");
    struct rconn *c = NULL; /* asked once: a cluster? its request slots */
    int rc = rconn_create(&c, o, err);
    if (!rc && !(rc = rconn_ensure(c, err)) && (s->cluster = rconn_is_cluster(c)))
        s->n = rconn_request_slots(c, s->slot, RCL_MAX_NODES);
    rconn_free(c);
    if (!rc && !s->cluster)
        s->n = 1;
    /* on the bell when the ACL lets the reader read it; else without */
    for (int i = 0; !rc && bell && i < s->n; i++) {
        char key[XMUX_KEY_MAX];
        struct xmux_opts xo = {.bell = key, .slot = s->slot[i]};
        if (rcl_bell_key(key, sizeof key, s->cluster, prefix, s->slot[i]) < 0)
            rc = rl_errf(err, RL_EINVAL, "xmux: the prefix \"%.60s\" is too long", prefix);
        else
            rc = xmux_create(&s->mux[i], o, &xo, err);
        if (rc == -RL_EUNSUPPORTED) {
            if (note)
                *note = *err;
            bell = false;
            for (int k = 0; k < i; k++)
                xmux_free(s->mux[k]), s->mux[k] = NULL;
            rc = 0;
        }
    }
    for (int i = 0; !rc && !bell && i < s->n; i++) {
        struct xmux_opts xo = {.slot = s->slot[i]};
        rc = xmux_create(&s->mux[i], o, &xo, err);
    }
    if (!rc && s->cluster && !s->n)
        rc = rl_errf(err, RL_EIO, "xmux: the cluster's slot map names no master");
    if (rc) {
        xmux_set_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void xmux_set_free(struct xmux_set *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n; i++)
        xmux_free(s->mux[i]);
    free(s);
}

int xmux_set_sub(struct xmux_set *s, const char *key, const char *from_id, unsigned flags,
                 struct xmux_sub **out, struct rl_err *err)
{
    *out = NULL;
    int slot = s->cluster ? rcl_key_slot(key, strlen(key)) : 0;
    for (int i = 0; i < s->n; i++)
        if (!s->cluster || s->slot[i] == slot)
            return xmux_sub(s->mux[i], key, from_id, flags, out, err);
    return 0;
}

int xmux_set_slots(const struct xmux_set *s, const int **slots)
{
    *slots = s->slot;
    return s->cluster ? s->n : 0;
}

void xmux_set_stats(struct xmux_set *s, struct xmux_stats *out)
{
    *out = (struct xmux_stats){0};
    for (int i = 0; i < s->n; i++) {
        struct xmux_stats st;
        xmux_stats(s->mux[i], &st);
        out->reads += st.reads;
        out->named += st.named;
        out->bell_on = (i == 0 || out->bell_on) && st.bell_on;
    }
}
