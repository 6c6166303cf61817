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
 * A subscription in the current round is never freed under the reader:
 * xmux_unsub only marks it dead, and the reader frees it after the read.
 * That is what lets the round hold plain pointers and the argv point at
 * the subscriptions' own key and cursor strings (the cursor is written
 * only by the reader, under the lock, after the read).
 *
 * Waking the reader: anything that changes what it must read (a new
 * subscription, one drained from backpressure, the end) bumps gen. If the
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xmux.h"

#define BLOCK_MS "1000"     /* the reader's BLOCK when nothing changes */
#define COUNT_PER_KEY "512" /* entries per stream per read */
#define KICK_TRIES 2000     /* x 100 us: how long kick() waits for the read to block */

struct xmux_sub {
    struct xmux *m;
    char *key;
    char cursor[RCONN_ID_MAX];  /* the last entry held or taken (reader-written) */
    struct rconn_reply *held;   /* (n_held) entries moved out of replies, not yet taken */
    size_t n_held, cap_held;
    bool in_round, dead;
    pthread_cond_t cond;        /* entries arrived, or the reader failed */
    struct xmux_sub *prev, *next;
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
    long long cid_conn;          /* rconn_n_reconnects(rd) when cid was read */
    struct rl_err fail;          /* the last read's failure, code 0 after a good read */
    long long n_reads;
};

static void deadline_in(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static int cond_init(pthread_cond_t *c)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a))
        return -1;
    int rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC) || pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
    return rc ? -1 : 0;
}

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

static void unlink_sub(struct xmux *m, struct xmux_sub *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        m->subs = s->next;
    if (s->next)
        s->next->prev = s->prev;
}

/* One command that must answer an integer (CLIENT ID, CLIENT UNBLOCK); an
 * error reply is -RL_EUNSUPPORTED: an ACL without the command. */
static int probe(struct rconn *c, int argc, const char *const *argv, long long *val,
                 struct rl_err *err)
{
    struct rconn_reply *r = NULL;
    int rc = rconn_command(c, argc, argv, NULL, &r, err);
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
    long long conn = rconn_n_reconnects(m->rd);
    pthread_mutex_lock(&m->mu);
    bool fresh = m->cid_conn == conn;
    pthread_mutex_unlock(&m->mu);
    if (fresh)
        return 0;
    const char *argv[] = {"CLIENT", "ID"};
    long long id;
    if ((rc = probe(m->rd, 2, argv, &id, err)))
        return rc;
    pthread_mutex_lock(&m->mu);
    m->cid = id;
    m->cid_conn = rconn_n_reconnects(m->rd);
    pthread_mutex_unlock(&m->mu);
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
    if (s->n_held + es->n_elem > s->cap_held) {
        size_t cap = (s->n_held + es->n_elem) * 2;
        struct rconn_reply *h = realloc(s->held, cap * sizeof *h);
        if (!h)
            return; /* the cursor stays: the same entries come again next read */
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

/* Hands a reply's streams to the round's subscriptions (under mu). */
static void deliver(struct xmux_sub **round, int n, struct rconn_reply *r)
{
    if (!r || r->type != RCONN_ARRAY)
        return; /* nil: the BLOCK ran out, or an UNBLOCK */
    int i = 0;
    for (size_t k = 0; k < r->n_elem; k++) {
        struct rconn_reply *st = &r->elem[k];
        if (st->type != RCONN_ARRAY || st->n_elem != 2 || st->elem[0].type != RCONN_STRING)
            continue;
        while (i < n && strcmp(round[i]->key, st->elem[0].str))
            i++;
        if (i == n)
            return; /* not in argument order: nothing more can be matched */
        struct xmux_sub *s = round[i++];
        if (s->dead)
            continue;
        take_stream(s, st);
        pthread_cond_signal(&s->cond);
    }
}

static void *reader_main(void *arg)
{
    struct xmux *m = arg;
    struct xmux_sub **round = NULL;
    const char **argv = NULL;
    int cap = 0;
    pthread_mutex_lock(&m->mu);
    while (!m->stopping) {
        int n = 0;
        for (struct xmux_sub *s = m->subs; s; s = s->next)
            n += !s->dead && s->n_held < XMUX_HELD_MAX;
        if (n > cap) {
            int c2 = n * 2;
            struct xmux_sub **r2 = realloc(round, (size_t)c2 * sizeof *r2);
            if (r2)
                round = r2;
            const char **a2 = r2 ? realloc(argv, (size_t)(6 + 2 * c2) * sizeof *a2) : NULL;
            if (a2)
                argv = a2;
            if (!r2 || !a2) { /* out of memory: wait and try again */
                struct timespec ts;
                deadline_in(&ts, 100);
                pthread_cond_timedwait(&m->idle, &m->mu, &ts);
                continue;
            }
            cap = c2;
        }
        n = 0;
        for (struct xmux_sub *s = m->subs; s; s = s->next)
            if (!s->dead && s->n_held < XMUX_HELD_MAX) {
                s->in_round = true;
                round[n++] = s;
            }
        m->read_gen = m->gen;
        if (!n) {
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
            int a = 0;
            argv[a++] = "XREAD", argv[a++] = "COUNT", argv[a++] = COUNT_PER_KEY;
            argv[a++] = "BLOCK", argv[a++] = BLOCK_MS, argv[a++] = "STREAMS";
            for (int i = 0; i < n; i++)
                argv[a + i] = round[i]->key;
            for (int i = 0; i < n; i++)
                argv[a + n + i] = round[i]->cursor;
            rc = rconn_command(m->rd, a + 2 * n, argv, NULL, &r, &e);
        }

        pthread_mutex_lock(&m->mu);
        m->in_read = false;
        m->n_reads++;
        if (rc) {
            m->fail = e;
            if (!m->fail.code)
                m->fail.code = RL_EIO;
            for (struct xmux_sub *s = m->subs; s; s = s->next)
                pthread_cond_signal(&s->cond);
        } else {
            m->fail.code = 0;
            deliver(round, n, r);
        }
        for (int i = 0; i < n; i++) {
            round[i]->in_round = false;
            if (round[i]->dead) {
                unlink_sub(m, round[i]);
                sub_free(round[i]);
            }
        }
        if (rc && !m->stopping) { /* Redis is away: rconn's backoff says when to try */
            int64_t wait = rconn_retry_in_ms(m->rd);
            struct timespec ts;
            deadline_in(&ts, wait > 20 && wait < 1000 ? (int)wait : 50);
            pthread_cond_timedwait(&m->idle, &m->mu, &ts);
        }
        pthread_mutex_unlock(&m->mu);
        rconn_reply_free(r);
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
        char id[24];
        snprintf(id, sizeof id, "%lld", cid);
        const char *argv[] = {"CLIENT", "UNBLOCK", id};
        long long n = 0;
        pthread_mutex_lock(&m->ctl_mu);
        int rc = probe(m->ctl, 3, argv, &n, NULL);
        pthread_mutex_unlock(&m->ctl_mu);
        if (rc || n == 1)
            return; /* unblocked; or Redis is away (and so is the read) */
        struct timespec ts = {0, 100 * 1000};
        nanosleep(&ts, NULL);
    }
}

int xmux_create(struct xmux **out, const struct rconn_opts *o, struct rl_err *err)
{
    *out = NULL;
    struct xmux *m = calloc(1, sizeof *m);
    if (!m)
        return rl_errf(err, RL_ENOMEM, "xmux: out of memory");
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
    if (rconn_is_cluster(m->rd)) {
        rc = rl_errf(err, RL_EUNSUPPORTED,
                     "a Redis Cluster keeps each stream in a slot of its own: one read cannot "
                     "follow several");
        goto fail;
    }
    long long id = -1, n = 0;
    const char *cid[] = {"CLIENT", "ID"};
    if ((rc = probe(m->rd, 2, cid, &m->cid, err)) || (rc = probe(m->ctl, 2, cid, &id, err)))
        goto fail;
    m->cid_conn = rconn_n_reconnects(m->rd);
    char ids[24];
    snprintf(ids, sizeof ids, "%lld", id);
    const char *unb[] = {"CLIENT", "UNBLOCK", ids}; /* itself, not blocked: answers 0 */
    if ((rc = probe(m->ctl, 3, unb, &n, err)))
        goto fail;
    if (pthread_mutex_init(&m->mu, NULL) || !(mu = true) || pthread_mutex_init(&m->ctl_mu, NULL) ||
        !(ctl_mu = true) || cond_init(&m->idle) || !(idle = true)) {
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
    free(m);
}

int xmux_sub(struct xmux *m, const char *key, const char *from_id, struct xmux_sub **out,
             struct rl_err *err)
{
    *out = NULL;
    if (strlen(from_id) >= RCONN_ID_MAX)
        return rl_errf(err, RL_EINVAL, "xmux: entry id \"%.60s\" is too long", from_id);
    struct xmux_sub *s = calloc(1, sizeof *s);
    if (!s || !(s->key = strdup(key)) || cond_init(&s->cond)) {
        if (s)
            free(s->key);
        free(s);
        return rl_errf(err, RL_ENOMEM, "xmux: out of memory");
    }
    s->m = m;
    snprintf(s->cursor, sizeof s->cursor, "%s", from_id);
    pthread_mutex_lock(&m->mu);
    s->next = m->subs;
    if (m->subs)
        m->subs->prev = s;
    m->subs = s;
    unsigned long long g = ++m->gen;
    pthread_mutex_unlock(&m->mu);
    kick(m, g);
    *out = s;
    return 0;
}

int xmux_next(struct xmux_sub *s, int timeout_ms, struct rconn_reply **out, struct rl_err *err)
{
    struct xmux *m = s->m;
    *out = NULL;
    struct timespec ts;
    deadline_in(&ts, timeout_ms > 0 ? timeout_ms : 0);
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

long long xmux_n_reads(struct xmux *m)
{
    pthread_mutex_lock(&m->mu);
    long long n = m->n_reads;
    pthread_mutex_unlock(&m->mu);
    return n;
}

size_t xmux_n_held(struct xmux_sub *s)
{
    pthread_mutex_lock(&s->m->mu);
    size_t n = s->n_held;
    pthread_mutex_unlock(&s->m->mu);
    return n;
}
