/* common/rconn.c - a hiredis 0.14 connection that reconnects by itself, and
 * the stream commands, with replies copied into owned records.
 *
 * Who calls: the worker's main thread, on two connections: one for
 * publish, ack, claim and cancel checks, a second one only for the
 * XREADGROUP that BLOCKs when the worker is idle (so a blocked read never
 * holds a reply the other connection is waiting for; there is no reader
 * thread); the dispatcher's main thread; the redlm CLI. A struct rconn is
 * used by one thread at a time.
 *
 * Connection state: `ctx` is NULL while disconnected. Any I/O or protocol
 * error from hiredis makes the context unusable (hiredis says so), so we
 * free it at once and the next call reconnects: the first attempt right
 * away, then after each failure a delay that doubles from backoff_min to
 * backoff_max, with "equal jitter" (a uniform pick in [d/2, d]) so that a
 * fleet of workers cut off by one Redis restart does not come back in
 * lock step. A successful connect (TCP or unix socket, AUTH, CLIENT
 * SETNAME) resets the delay. Calls made while a delay runs fail fast with
 * -RL_EIO: the worker's loop must keep its engine stepping, never sleep
 * in here.
 *
 * Redis errors that only mean "not now" (LOADING while an AOF is replayed
 * after a restart, BUSY, TRYAGAIN, MASTERDOWN, UNBLOCKED when a failover
 * demotes the master a read was blocked on) come back as -RL_EIO too,
 * with the connection kept, so callers treat them like an outage.
 *
 * Cluster. The address may be a seed list "host:port,host:port,...". At
 * the first connect the first reachable seed is asked HELLO 2 (its "mode"): a
 * single instance (or a server older than 6 that refuses HELLO, or a unix
 * socket, never asked) keeps the one-context path above, unchanged, with no extra round
 * trip per command. A cluster gets a slot map from CLUSTER SLOTS and one
 * context per master, made when a command first needs it. Each command is
 * routed by the slot of its key (common/rcluster.c); MOVED updates that
 * slot and marks the map stale (re-read on the next call: a failover moves
 * every slot of a master at once), ASK sends ASKING + the command to the
 * named node once; a lost node, CLUSTERDOWN, TRYAGAIN or UNBLOCKED return -RL_EIO
 * like an outage, and the map is re-read, with the same backoff, before
 * the next command. A batch is split per node: each node gets its own
 * pipeline, replies are put back in command order; a keyless command
 * (MULTI, EXEC) goes with its neighbours, so a transaction whose keys share
 * a hash tag stays on one node. XREADGROUP over pools on several nodes is
 * split the same way (rconn_xreadgroup). MGET is split into GETs.
 *
 * Only what hiredis 0.14 and Redis 7.0 offer is used: RESP2 replies,
 * redisCommandArgv, redisAppendFormattedCommand, redisSetTimeout,
 * XAUTOCLAIM (6.2+) and XPENDING IDLE (6.2+). */
#include "rconn.h"
#include "clock.h"
#include "rcluster.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#define RCONN_N_AUX 64 /* extra cluster connections (aux_ctx) */

struct rconn {
    char *addr;          /* as given */
    char *host;          /* TCP host, NULL for a unix socket */
    int port;
    char *path;          /* unix socket path, or NULL */
    char *user, *password_file, *client_name;
    int connect_timeout_ms, io_timeout_ms, backoff_min_ms, backoff_max_ms;

    redisContext *ctx;   /* NULL while disconnected */
    int n_failures;      /* consecutive failed attempts */
    int64_t next_try_ms; /* monotonic ms before which we do not try */
    int64_t n_connects;
    uint64_t rng;        /* xorshift64 state for the jitter */

    /* cluster mode (see "Cluster" above); unused for a single instance */
    int n_seeds;
    char (*seeds)[RCL_HOST_MAX + 8]; /* (n_seeds) "host:port" as given */
    bool discovered;     /* asked the server whether it is a cluster */
    bool cluster;
    bool stale;          /* a redirect or a lost node: re-read the map */
    bool down;           /* the last re-read found no node answering */
    struct rcl_map *map; /* cluster only: slot -> master */
    redisContext *node_ctx[RCL_MAX_NODES]; /* by map node index, NULL = not connected */
    int64_t node_serial[RCL_MAX_NODES]; /* which open made node_ctx[i] (n_node_opens then) */
    int64_t n_node_opens;
    int64_t node_retry_ms[RCL_MAX_NODES]; /* a node's connect failed: not before this */
    int block_ms;        /* > 0 while a BLOCKing read runs: widens the node's timeout */
    int64_t out_since_ms; /* > 0: a read sent by rconn_xreadgroup_send awaits its reply */
    int out_block_ms;     /* its BLOCK */
    redisContext *out_ctx; /* the connection it was sent on */
    int out_node;         /* cluster: that connection's node (-1: the single instance's) */
    char out_what[16];    /* its command's name, for errors */
    /* extra connections to masters, by address and role (aux_ctx): the
     * BLOCKing reads of a second slot on one master, and CLIENT UNBLOCK
     * (cl_xreadgroup_par) */
    struct { char name[RCL_HOST_MAX + 24]; redisContext *ctx; } aux[RCONN_N_AUX];
};

void rconn_opts_default(struct rconn_opts *o)
{
    memset(o, 0, sizeof *o);
    o->addr = "127.0.0.1:6379";
    o->connect_timeout_ms = 1000;
    o->io_timeout_ms = 5000;
    o->backoff_min_ms = 50;
    o->backoff_max_ms = 5000;
}

static struct timeval tv_ms(int ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    return tv;
}

static char *dup_or_null(const char *s)
{
    return s && s[0] ? strdup(s) : NULL;
}

/* Splits a TCP "host:port" or "[v6]:port" into *host (malloc'd) and *port. */
static int split_hostport(const char *addr, char **host, int *port_out, struct rl_err *err)
{
    const char *colon, *hs = addr, *he;
    if (addr[0] == '[') { /* [v6]:port */
        he = strchr(addr, ']');
        if (!he || he[1] != ':')
            return rl_errf(err, RL_EINVAL, "redis address \"%s\": want [v6addr]:port", addr);
        hs = addr + 1;
        colon = he + 1;
    } else {
        colon = strrchr(addr, ':');
        he = colon;
    }
    if (!colon || he == hs)
        return rl_errf(err, RL_EINVAL, "redis address \"%s\": want host:port or a unix socket path",
                       addr);
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end || port < 1 || port > 65535)
        return rl_errf(err, RL_EINVAL, "redis address \"%s\": port must be 1-65535", addr);
    *host = strndup(hs, (size_t)(he - hs));
    *port_out = (int)port;
    return *host ? 0 : -RL_ENOMEM;
}

/* Splits addr into host/port, a unix path, or a seed list (each entry
 * checked; host/port get the first). */
static int parse_addr(struct rconn *c, const char *addr, struct rl_err *err)
{
    if (!addr || !addr[0])
        return rl_errf(err, RL_EINVAL, "redis address is empty");
    if (!strncmp(addr, "unix:", 5) || addr[0] == '/' || addr[0] == '.') {
        const char *p = !strncmp(addr, "unix:", 5) ? addr + 5 : addr;
        if (!p[0])
            return rl_errf(err, RL_EINVAL, "redis address \"%s\": empty socket path", addr);
        c->path = strdup(p);
        return c->path ? 0 : -RL_ENOMEM;
    }
    c->seeds = calloc(RCL_MAX_NODES, sizeof *c->seeds);
    if (!c->seeds)
        return -RL_ENOMEM;
    int n = rcl_split_seeds(addr, c->seeds, RCL_MAX_NODES, err);
    if (n < 0)
        return n;
    c->n_seeds = n;
    for (int i = 0; i < n; i++) {
        char *h = NULL;
        int port, rc = split_hostport(c->seeds[i], &h, &port, err);
        if (rc)
            return rc;
        if (i == 0)
            c->host = h, c->port = port;
        else
            free(h);
    }
    return 0;
}

int rconn_create(struct rconn **out, const struct rconn_opts *o, struct rl_err *err)
{
    *out = NULL;
    if (!o || o->connect_timeout_ms <= 0 || o->io_timeout_ms < 0 || o->backoff_min_ms <= 0 ||
        o->backoff_max_ms < o->backoff_min_ms)
        return rl_errf(err, RL_EINVAL, "rconn_create: bad timeouts or backoff");
    struct rconn *c = calloc(1, sizeof *c);
    if (!c)
        return rl_errf(err, RL_ENOMEM, "rconn_create: out of memory");
    int rc = parse_addr(c, o->addr, err);
    if (rc)
        goto fail;
    c->addr = strdup(o->addr);
    c->user = dup_or_null(o->user);
    c->password_file = dup_or_null(o->password_file);
    c->client_name = dup_or_null(o->client_name);
    if (!c->addr || (o->user && o->user[0] && !c->user) ||
        (o->password_file && o->password_file[0] && !c->password_file) ||
        (o->client_name && o->client_name[0] && !c->client_name)) {
        rc = rl_errf(err, RL_ENOMEM, "rconn_create: out of memory");
        goto fail;
    }
    if (c->user && !c->password_file) {
        rc = rl_errf(err, RL_EINVAL, "redis user \"%s\" needs a password file", c->user);
        goto fail;
    }
    c->connect_timeout_ms = o->connect_timeout_ms;
    c->io_timeout_ms = o->io_timeout_ms;
    c->backoff_min_ms = o->backoff_min_ms;
    c->backoff_max_ms = o->backoff_max_ms;
    if (getrandom(&c->rng, sizeof c->rng, 0) != sizeof c->rng)
        c->rng = (uint64_t)rl_mono_ms() ^ (uintptr_t)c;
    c->rng |= 1;
    *out = c;
    return 0;
fail:
    rconn_free(c);
    return rc ? rc : -RL_ENOMEM;
}

void rconn_free(struct rconn *c)
{
    if (!c)
        return;
    if (c->ctx)
        redisFree(c->ctx);
    free(c->addr);
    free(c->host);
    free(c->path);
    free(c->user);
    free(c->password_file);
    free(c->client_name);
    free(c->seeds);
    for (int i = 0; i < RCL_MAX_NODES; i++) {
        if (c->node_ctx[i])
            redisFree(c->node_ctx[i]);
    }
    for (int i = 0; i < RCONN_N_AUX; i++)
        if (c->aux[i].ctx)
            redisFree(c->aux[i].ctx);
    free(c->map);
    free(c);
}

bool rconn_connected(const struct rconn *c)
{
    return c->cluster ? c->map && !c->down : c->ctx != NULL;
}
bool rconn_is_cluster(const struct rconn *c) { return c->cluster; }
int64_t rconn_n_reconnects(const struct rconn *c) { return c->n_connects > 1 ? c->n_connects - 1 : 0; }
const char *rconn_addr(const struct rconn *c) { return c->addr; }

int64_t rconn_retry_in_ms(const struct rconn *c)
{
    if (rconn_connected(c) && !c->stale)
        return 0;
    int64_t d = c->next_try_ms - rl_mono_ms();
    return d > 0 ? d : 0;
}

void rconn_disconnect(struct rconn *c)
{
    c->out_since_ms = 0; /* a reply awaited is lost with the socket */
    c->out_ctx = NULL;
    if (c->ctx) {
        redisFree(c->ctx);
        c->ctx = NULL;
    }
    for (int i = 0; i < RCL_MAX_NODES; i++)
        if (c->node_ctx[i]) {
            redisFree(c->node_ctx[i]);
            c->node_ctx[i] = NULL;
        }
    for (int i = 0; i < RCONN_N_AUX; i++)
        if (c->aux[i].ctx) {
            redisFree(c->aux[i].ctx);
            c->aux[i].ctx = NULL;
        }
    if (c->cluster)
        c->stale = true;
    c->next_try_ms = 0; /* a deliberate or first drop: retry at once */
}

/* True when ctx's socket shows the server closed it (EOF, reset) or holds
 * bytes nobody asked for: either way the context cannot be trusted. */
static bool ctx_broken(const redisContext *ctx)
{
    struct pollfd p = {.fd = ctx->fd, .events = POLLIN | POLLRDHUP};
    return poll(&p, 1, 0) > 0 && p.revents != 0;
}

bool rconn_check_idle(struct rconn *c)
{
    bool broken = c->ctx && ctx_broken(c->ctx);
    for (int i = 0; i < RCL_MAX_NODES && !broken; i++)
        broken = c->node_ctx[i] && ctx_broken(c->node_ctx[i]);
    if (broken)
        rconn_disconnect(c);
    return !broken && rconn_connected(c);
}

/* After a failed attempt: the next one waits min * 2^(failures-1), capped,
 * jittered to [d/2, d]. */
static void schedule_retry(struct rconn *c)
{
    c->n_failures++;
    int64_t d = c->backoff_min_ms;
    for (int i = 1; i < c->n_failures && d < c->backoff_max_ms; i++)
        d *= 2;
    if (d > c->backoff_max_ms)
        d = c->backoff_max_ms;
    c->rng ^= c->rng << 13;
    c->rng ^= c->rng >> 7;
    c->rng ^= c->rng << 17;
    int64_t half = d / 2;
    c->next_try_ms = rl_mono_ms() + half + (int64_t)(c->rng % (uint64_t)(d - half + 1));
}

/* Reads the password: the whole file less trailing whitespace. */
static int read_password(const char *path, char *buf, size_t cap, struct rl_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return rl_errf(err, RL_EIO, "redis password file %s: %s", path, strerror(errno));
    size_t n = fread(buf, 1, cap - 1, f);
    int bad = ferror(f) || !feof(f);
    fclose(f);
    if (bad)
        return rl_errf(err, RL_EIO, "redis password file %s: unreadable or over %zu bytes", path,
                       cap - 1);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--;
    buf[n] = 0;
    if (!n)
        return rl_errf(err, RL_EIO, "redis password file %s: empty", path);
    return 0;
}

/* One command on a fresh context during connect: 0 or a message in err. */
static int setup_cmd(redisContext *ctx, const char *what, int argc, const char **argv,
                     struct rl_err *err)
{
    redisReply *r = redisCommandArgv(ctx, argc, argv, NULL);
    if (!r)
        return rl_errf(err, RL_EIO, "%s: %s", what, ctx->errstr[0] ? ctx->errstr : "connection lost");
    int rc = 0;
    if (r->type == REDIS_REPLY_ERROR)
        rc = rl_errf(err, RL_EIO, "%s: %.*s", what, (int)r->len, r->str);
    freeReplyObject(r);
    return rc;
}

static int copy_reply(struct rconn_reply *dst, const redisReply *src);
static void clear_reply(struct rconn_reply *r);

/* A fresh context to host:port (or the unix path), with the timeout,
 * AUTH and CLIENT SETNAME done; name is the address for messages. */
static int open_ctx(struct rconn *c, const char *host, int port, const char *path,
                    const char *name, redisContext **out, struct rl_err *err)
{
    *out = NULL;
    struct timeval ct = tv_ms(c->connect_timeout_ms);
    redisContext *ctx = path ? redisConnectUnixWithTimeout(path, ct)
                             : redisConnectWithTimeout(host, port, ct);
    char pw[1024];
    int rc = 0;
    if (!ctx)
        return rl_errf(err, RL_ENOMEM, "redis %s: cannot allocate a context", name);
    if (ctx->err) {
        rc = rl_errf(err, RL_EIO, "redis %s: %s", name, ctx->errstr);
        goto fail;
    }
    if (c->io_timeout_ms > 0 && redisSetTimeout(ctx, tv_ms(c->io_timeout_ms)) != REDIS_OK) {
        rc = rl_errf(err, RL_EIO, "redis %s: cannot set timeout: %s", name, ctx->errstr);
        goto fail;
    }
    if (!path)
        redisEnableKeepAlive(ctx); /* notice a dead peer on idle connections */
    if (c->password_file) {
        if ((rc = read_password(c->password_file, pw, sizeof pw, err)))
            goto fail;
        const char *argv[3] = {"AUTH", c->user ? c->user : pw, pw};
        rc = setup_cmd(ctx, "AUTH", c->user ? 3 : 2, argv, err);
        memset(pw, 0, sizeof pw);
        if (rc) {
            rl_err_wrap(err, "redis %s", name);
            goto fail;
        }
    }
    if (c->client_name) {
        const char *argv[3] = {"CLIENT", "SETNAME", c->client_name};
        if ((rc = setup_cmd(ctx, "CLIENT SETNAME", 3, argv, err))) {
            rl_err_wrap(err, "redis %s", name);
            goto fail;
        }
    }
    *out = ctx;
    return 0;
fail:
    redisFree(ctx);
    return rc;
}

static void connected(struct rconn *c)
{
    c->n_failures = 0;
    c->next_try_ms = 0;
    c->n_connects++;
}

/* The node index the map gives slot (-1: any master: the first one with a
 * context, else the first one). */
static int node_of(const struct rconn *c, int slot)
{
    if (slot >= 0)
        return c->map->slot_node[slot];
    for (int i = 0; i < c->map->n_nodes; i++)
        if (c->node_ctx[i])
            return i;
    return c->map->n_nodes ? 0 : -1;
}

/* Re-reads the slot map from the first node that answers: those we hold a
 * context to, then the seeds. Keeps the contexts of masters that stay (by
 * address), frees the others. */
static int refresh_map(struct rconn *c, struct rl_err *err)
{
    static struct rcl_map fresh_zero;
    struct rcl_map *fresh = malloc(sizeof *fresh);
    if (!fresh)
        return rl_errf(err, RL_ENOMEM, "redis cluster: out of memory");
    *fresh = fresh_zero;
    int rc = -RL_EIO;
    rl_errf(err, RL_EIO, "redis cluster %s: no node reachable", c->addr);
    int n_try = (c->map ? c->map->n_nodes : 0) + c->n_seeds;
    for (int t = 0; t < n_try && rc; t++) {
        char host[RCL_HOST_MAX + 8];
        int port = 0;
        redisContext *ctx = NULL;
        bool own = false;
        if (c->map && t < c->map->n_nodes) {
            snprintf(host, sizeof host, "%s", c->map->nodes[t].host);
            port = c->map->nodes[t].port;
            ctx = c->node_ctx[t];
        } else {
            char *h = NULL;
            if (split_hostport(c->seeds[t - (c->map ? c->map->n_nodes : 0)], &h, &port, NULL))
                continue;
            snprintf(host, sizeof host, "%s", h);
            free(h);
        }
        if (!ctx) {
            char name[RCL_HOST_MAX + 16];
            snprintf(name, sizeof name, "%s:%d", host, port);
            if (open_ctx(c, host, port, NULL, name, &ctx, err))
                continue;
            own = true;
        }
        redisReply *r = redisCommand(ctx, "CLUSTER SLOTS");
        struct rconn_reply cp = {0};
        if (r && !copy_reply(&cp, r) && !rcl_map_parse(fresh, &cp, host, err)) {
            if (rcl_map_n_uncovered(fresh))
                rl_errf(err, RL_EIO, "redis cluster %s:%d: %d slots have no master", host, port,
                        rcl_map_n_uncovered(fresh));
            else
                rc = 0;
        } else if (r && r->type == REDIS_REPLY_ERROR) { /* an ACL without +cluster|slots */
            rl_errf(err, RL_EIO, "redis cluster %s:%d: CLUSTER SLOTS: %s", host, port, r->str);
        } else if (!r) {
            rl_errf(err, RL_EIO, "redis cluster %s:%d: CLUSTER SLOTS: %s", host, port,
                    ctx->errstr[0] ? ctx->errstr : "connection lost");
            if (!own && c->map) { /* our context broke */
                redisFree(ctx);
                c->node_ctx[t] = NULL;
            }
            own = false, ctx = NULL;
        }
        clear_reply(&cp);
        if (r)
            freeReplyObject(r);
        if (own) /* a seed's context: masters get theirs when first used */
            redisFree(ctx);
    }
    if (rc) {
        free(fresh);
        return rc;
    }
    /* carry contexts over to the new node numbering */
    redisContext *keep[RCL_MAX_NODES] = {0};
    int64_t keep_serial[RCL_MAX_NODES] = {0};
    for (int i = 0; c->map && i < c->map->n_nodes; i++) {
        if (!c->node_ctx[i])
            continue;
        int n = -1;
        for (int k = 0; k < fresh->n_nodes; k++)
            if (fresh->nodes[k].port == c->map->nodes[i].port &&
                !strcmp(fresh->nodes[k].host, c->map->nodes[i].host))
                n = k;
        if (n >= 0)
            keep[n] = c->node_ctx[i], keep_serial[n] = c->node_serial[i];
        else
            redisFree(c->node_ctx[i]);
        c->node_ctx[i] = NULL;
    }
    memcpy(c->node_ctx, keep, sizeof keep);
    memcpy(c->node_serial, keep_serial, sizeof keep_serial);
    memset(c->node_retry_ms, 0, sizeof c->node_retry_ms); /* the numbering changed */
    free(c->map);
    c->map = fresh;
    c->stale = false;
    return 0;
}

/* The first connect: the first reachable seed says whether it is a
 * cluster. A single instance keeps that context. */
static int discover(struct rconn *c, struct rl_err *err)
{
    int rc = -RL_EIO;
    for (int i = 0; i < c->n_seeds; i++) {
        char *host = NULL;
        int port;
        redisContext *ctx = NULL;
        if ((rc = split_hostport(c->seeds[i], &host, &port, err)))
            return rc;
        rc = open_ctx(c, host, port, NULL, c->seeds[i], &ctx, err);
        if (rc) {
            free(host);
            continue;
        }
        /* HELLO 2 (Redis 6+) says "mode" "cluster" or "standalone", and
         * every authenticated user may send it, so least-privilege ACL
         * users (config/redis-acl.conf) need nothing more; an older server
         * refuses it and is taken as single */
        redisReply *r = redisCommand(ctx, "HELLO 2");
        if (!r) {
            rc = rl_errf(err, RL_EIO, "redis %s: HELLO: %s", c->seeds[i],
                         ctx->errstr[0] ? ctx->errstr : "connection lost");
            redisFree(ctx);
            free(host);
            continue;
        }
        bool cl = false;
        for (size_t k = 0; r->type == REDIS_REPLY_ARRAY && k + 1 < r->elements; k += 2) {
            const redisReply *f = r->element[k], *v = r->element[k + 1];
            if (f->type == REDIS_REPLY_STRING && !strcmp(f->str, "mode"))
                cl = (v->type == REDIS_REPLY_STRING || v->type == REDIS_REPLY_STATUS) &&
                     !strcmp(v->str, "cluster");
        }
        freeReplyObject(r);
        if (!cl) {
            free(host);
            if (c->n_seeds > 1) {
                redisFree(ctx);
                return rl_errf(err, RL_EINVAL, "redis %s: a list of addresses needs a Redis "
                               "Cluster; %s is a single instance", c->addr, c->seeds[i]);
            }
            c->ctx = ctx;
            c->discovered = true;
            connected(c);
            return 0;
        }
        redisFree(ctx); /* refresh_map opens what it needs */
        free(host);
        c->cluster = true;
        c->discovered = true;
        if ((rc = refresh_map(c, err)) == 0)
            connected(c);
        else
            c->stale = true;
        return rc;
    }
    return rc;
}

static int try_connect(struct rconn *c, struct rl_err *err)
{
    if (c->cluster) {
        int rc = refresh_map(c, err);
        if (!rc)
            connected(c);
        return rc;
    }
    if (!c->discovered && !c->path)
        return discover(c, err);
    redisContext *ctx = NULL;
    int rc = open_ctx(c, c->host, c->port, c->path, c->addr, &ctx, err);
    if (rc)
        return rc;
    c->ctx = ctx;
    connected(c);
    return 0;
}

int rconn_ensure(struct rconn *c, struct rl_err *err)
{
    if (c->cluster && c->map && c->stale) {
        /* a stale map still routes most slots: re-read it when the backoff
         * allows, keep using it meanwhile unless no node answered */
        int64_t wait = rconn_retry_in_ms(c);
        if (c->next_try_ms > rl_mono_ms())
            return c->down ? rl_errf(err, RL_EIO, "redis cluster %s: no node answers; next "
                                     "attempt in %lld ms", c->addr, (long long)wait) : 0;
        int rc = refresh_map(c, err);
        c->down = rc != 0;
        if (rc) {
            schedule_retry(c);
            return rc;
        }
        c->n_failures = 0;
        c->next_try_ms = 0;
        return 0;
    }
    if (rconn_connected(c))
        return 0;
    int64_t wait = rconn_retry_in_ms(c);
    if (wait > 0)
        return rl_errf(err, RL_EIO, "redis %s: not connected; next attempt in %lld ms", c->addr,
                       (long long)wait);
    int rc = try_connect(c, err);
    if (rc == -RL_EIO)
        schedule_retry(c);
    return rc;
}

int rconn_wait(struct rconn *c, int timeout_ms, struct rl_err *err)
{
    int64_t until = rl_mono_ms() + timeout_ms;
    for (;;) {
        int rc = rconn_ensure(c, err);
        if (rc != -RL_EIO)
            return rc;
        int64_t left = until - rl_mono_ms();
        if (left <= 0)
            return rc;
        int64_t d = rconn_retry_in_ms(c);
        if (d > left)
            d = left;
        if (d < 1)
            d = 1;
        struct timespec ts = {.tv_sec = d / 1000, .tv_nsec = (d % 1000) * 1000000};
        nanosleep(&ts, NULL);
    }
}

/* The context broke: drop it, first retry at once. */
static int lost(struct rconn *c, const char *what, struct rl_err *err)
{
    int rc = rl_errf(err, RL_EIO, "redis %s: %s: %s", c->addr, what,
                     c->ctx && c->ctx->errstr[0] ? c->ctx->errstr : "connection lost");
    rconn_disconnect(c);
    return rc;
}

/* Deep copy of a hiredis reply into *dst. */
static int copy_reply(struct rconn_reply *dst, const redisReply *src)
{
    memset(dst, 0, sizeof *dst);
    dst->type = src->type;
    switch (src->type) {
    case REDIS_REPLY_INTEGER:
        dst->integer = src->integer;
        return 0;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
        dst->str = malloc(src->len + 1);
        if (!dst->str)
            return -RL_ENOMEM;
        memcpy(dst->str, src->str, src->len);
        dst->str[src->len] = 0;
        dst->len = src->len;
        return 0;
    case REDIS_REPLY_ARRAY:
        if (!src->elements)
            return 0;
        dst->elem = calloc(src->elements, sizeof *dst->elem);
        if (!dst->elem)
            return -RL_ENOMEM;
        dst->n_elem = src->elements;
        for (size_t i = 0; i < src->elements; i++)
            if (copy_reply(&dst->elem[i], src->element[i]))
                return -RL_ENOMEM;
        return 0;
    default:
        return 0;
    }
}

static void clear_reply(struct rconn_reply *r)
{
    for (size_t i = 0; i < r->n_elem; i++)
        clear_reply(&r->elem[i]);
    free(r->elem);
    free(r->str);
    memset(r, 0, sizeof *r);
}

void rconn_reply_free(struct rconn_reply *r)
{
    if (!r)
        return;
    clear_reply(r);
    free(r);
}

bool rconn_reply_is_stale_id(const struct rconn_reply *r)
{
    return r && r->type == RCONN_ERROR && r->str && strstr(r->str, "equal or smaller");
}

static bool transient_error(const char *s)
{
    /* UNBLOCKED: a blocked XREAD/XREADGROUP on a master that a failover just
     * turned into a replica ("instance state changed"); the same read on the
     * new master, after the map is re-read, is all it takes */
    static const char *const pfx[] = {"LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN",
                                      "UNBLOCKED"};
    /* whole first word: BUSYGROUP is not BUSY */
    for (size_t i = 0; i < sizeof pfx / sizeof pfx[0]; i++) {
        size_t n = strlen(pfx[i]);
        if (!strncmp(s, pfx[i], n) && (s[n] == ' ' || !s[n]))
            return true;
    }
    return false;
}

/* ---- cluster routing ---- */

/* Node n's context, connecting when there is none. A failed connect marks
 * the map stale and starts the backoff: a master that died is replaced by
 * its replica only in a fresh map. */
static int node_ctx(struct rconn *c, int n, redisContext **out, struct rl_err *err)
{
    if (!c->node_ctx[n]) {
        const struct rcl_node *nd = &c->map->nodes[n];
        if (c->node_retry_ms[n] > rl_mono_ms())
            return rl_errf(err, RL_EIO, "redis %s:%d: unreachable; next attempt in %lld ms",
                           nd->host, nd->port, (long long)(c->node_retry_ms[n] - rl_mono_ms()));
        char name[RCL_HOST_MAX + 16];
        snprintf(name, sizeof name, "%s:%d", nd->host, nd->port);
        int rc = open_ctx(c, nd->host, nd->port, NULL, name, &c->node_ctx[n], err);
        if (rc) {
            c->stale = true;
            if (rc == -RL_EIO) {
                schedule_retry(c);
                c->node_retry_ms[n] = c->next_try_ms;
            }
            return rc;
        }
        c->node_retry_ms[n] = 0;
        c->node_serial[n] = ++c->n_node_opens;
    }
    *out = c->node_ctx[n];
    if (c->io_timeout_ms > 0)
        redisSetTimeout(*out, tv_ms(c->io_timeout_ms + (c->block_ms > 0 ? c->block_ms : 0)));
    return 0;
}

static int node_lost(struct rconn *c, int n, const char *what, struct rl_err *err)
{
    redisContext *ctx = c->node_ctx[n];
    int rc = rl_errf(err, RL_EIO, "redis %s:%d: %s: %s", c->map->nodes[n].host,
                     c->map->nodes[n].port, what,
                     ctx && ctx->errstr[0] ? ctx->errstr : "connection lost");
    if (ctx)
        redisFree(ctx);
    c->node_ctx[n] = NULL;
    c->stale = true;
    if (c->out_since_ms && c->out_ctx == ctx) { /* its reply is lost with it */
        c->out_since_ms = 0;
        c->out_ctx = NULL;
    }
    return rc;
}

/* Follows a redirect reply: MOVED updates the slot (and marks the map
 * stale), ASK names the node for one retry. Returns the node to retry on,
 * -1 when r is no redirect, -2 when the named node does not fit the map. */
static int follow_redirect(struct rconn *c, int from, const redisReply *r, int *ask)
{
    int slot, port;
    char host[RCL_HOST_MAX];
    enum rcl_redirect k = r->type == REDIS_REPLY_ERROR
                              ? rcl_parse_redirect(r->str, &slot, host, &port) : RCL_NONE;
    if (k == RCL_NONE)
        return -1;
    if (!host[0])
        snprintf(host, sizeof host, "%s", c->map->nodes[from].host);
    int to = rcl_map_node(c->map, host, port);
    if (to < 0)
        return -2;
    if (k == RCL_MOVED) {
        c->map->slot_node[slot] = (int16_t)to;
        c->stale = true;
        *ask = 0;
    } else {
        *ask = 1;
    }
    return to;
}

/* Sends one encoded command to the master of slot (-1: any), following up
 * to 5 redirects. *out gets the hiredis reply (the caller frees it). */
static int cl_send(struct rconn *c, int slot, const char *cmd, size_t len, const char *what,
                   redisReply **out, struct rl_err *err)
{
    *out = NULL;
    int n = node_of(c, slot), ask = 0;
    for (int hop = 0; hop < 6; hop++) {
        if (n < 0) {
            c->stale = true;
            return rl_errf(err, RL_EIO, "redis cluster %s: no master known for slot %d", c->addr,
                           slot);
        }
        redisContext *ctx;
        int rc = node_ctx(c, n, &ctx, err);
        if (rc)
            return rc;
        if (ask && redisAppendCommand(ctx, "ASKING") != REDIS_OK)
            return node_lost(c, n, "ASKING", err);
        if (redisAppendFormattedCommand(ctx, cmd, len) != REDIS_OK)
            return node_lost(c, n, what, err);
        void *v = NULL;
        if (ask) {
            if (redisGetReply(ctx, &v) != REDIS_OK || !v)
                return node_lost(c, n, "ASKING", err);
            freeReplyObject(v);
            v = NULL;
        }
        if (redisGetReply(ctx, &v) != REDIS_OK || !v)
            return node_lost(c, n, what, err);
        redisReply *r = v;
        int to = follow_redirect(c, n, r, &ask);
        if (to == -1) {
            if (r->type == REDIS_REPLY_ERROR && transient_error(r->str))
                c->stale = true; /* CLUSTERDOWN, TRYAGAIN, UNBLOCKED: the map may have changed */
            *out = r;
            return 0;
        }
        freeReplyObject(r);
        if (to == -2)
            return rl_errf(err, RL_EIO, "redis cluster %s: %s: redirected past %d masters",
                           c->addr, what, RCL_MAX_NODES);
        n = to;
    }
    return rl_errf(err, RL_EIO, "redis cluster %s: %s: too many redirects", c->addr, what);
}

/* MGET over keys of several slots: one GET each, the replies gathered
 * into one array, as a single instance would answer. */
static int cl_mget(struct rconn *c, int argc, const char *const *argv, const size_t *lens,
                   redisReply **out, struct rl_err *err)
{
    *out = NULL;
    redisReply *arr = calloc(1, sizeof *arr);
    redisReply **el = calloc((size_t)argc, sizeof *el);
    int rc = 0;
    if (!arr || !el) {
        rc = rl_errf(err, RL_ENOMEM, "MGET: out of memory");
        goto fail;
    }
    arr->type = REDIS_REPLY_ARRAY;
    arr->element = el;
    for (int i = 1; i < argc; i++) {
        const char *ga[2] = {"GET", argv[i]};
        size_t gl[2] = {3, lens ? lens[i] : strlen(argv[i])};
        char *cmd = NULL;
        int len = redisFormatCommandArgv(&cmd, 2, ga, gl);
        if (len < 0) {
            rc = rl_errf(err, RL_ENOMEM, "MGET: out of memory");
            goto fail;
        }
        rc = cl_send(c, rcl_key_slot(argv[i], gl[1]), cmd, (size_t)len, "MGET", &el[i - 1], err);
        free(cmd);
        if (rc)
            goto fail;
        arr->elements++;
    }
    *out = arr;
    return 0;
fail:
    if (arr)
        freeReplyObject(arr); /* frees the elements read so far */
    else
        free(el);
    return rc;
}

/* One command in cluster mode; *out gets the hiredis reply. */
static int cl_command(struct rconn *c, int argc, const char *const *argv, const size_t *lens,
                      redisReply **out, struct rl_err *err)
{
    if (argc > 2 && !strcasecmp(argv[0], "MGET"))
        return cl_mget(c, argc, argv, lens, out, err);
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, (const char **)argv, lens);
    if (len < 0)
        return rl_errf(err, RL_ENOMEM, "redis %s: cannot encode the command", argv[0]);
    int rc = cl_send(c, rcl_command_slot(argc, argv, lens), cmd, (size_t)len, argv[0], out, err);
    free(cmd);
    return rc;
}

static int own_reply(redisReply *r, const char *what, struct rconn_reply **out,
                     struct rl_err *err);

/* Runs one command and hands back the copied reply (always, when one was
 * read). Error replies return -RL_EINVAL (or -RL_EIO when transient). */
static int run(struct rconn *c, int argc, const char *const *argv, const size_t *lens,
               struct rconn_reply **out, struct rl_err *err)
{
    *out = NULL;
    if (c->out_since_ms)
        return rl_errf(err, RL_EINVAL, "redis %s: a read sent earlier awaits its reply", argv[0]);
    int rc = rconn_ensure(c, err);
    if (rc)
        return rc;
    redisReply *r = NULL;
    if (c->cluster) {
        if ((rc = cl_command(c, argc, argv, lens, &r, err)))
            return rc;
    } else if (!(r = redisCommandArgv(c->ctx, argc, (const char **)argv, lens))) {
        return lost(c, argv[0], err);
    }
    return own_reply(r, argv[0], out, err);
}

int rconn_command(struct rconn *c, int argc, const char *const *argv, const size_t *lens,
                  struct rconn_reply **out, struct rl_err *err)
{
    if (argc < 1 || !argv)
        return rl_errf(err, RL_EINVAL, "rconn_command: no command");
    struct rconn_reply *r = NULL;
    int rc = run(c, argc, argv, lens, &r, err);
    if (out)
        *out = r;
    else
        rconn_reply_free(r);
    return rc;
}

int rconn_n_masters(const struct rconn *c)
{
    return c->cluster && c->map ? c->map->n_nodes : 1;
}

int rconn_slot_master(const struct rconn *c, int slot)
{
    if (!c->cluster || !c->map)
        return 0;
    return slot < 0 || slot >= RCL_N_SLOTS ? -1 : c->map->slot_node[slot];
}

void rconn_map_stale(struct rconn *c)
{
    if (c->cluster)
        c->stale = true;
}

int64_t rconn_slot_conn(const struct rconn *c, int slot)
{
    if (!c->cluster || !c->map)
        return c->ctx ? c->n_connects : 0;
    int n = slot >= 0 && slot < RCL_N_SLOTS ? c->map->slot_node[slot] : -1;
    return n >= 0 && c->node_ctx[n] ? c->node_serial[n] : 0;
}

int rconn_request_slots(const struct rconn *c, int *slots, int max)
{
    return c->cluster && c->map ? rcl_map_request_slots(c->map, slots, max) : 0;
}

int rconn_command_on(struct rconn *c, int master, int argc, const char *const *argv,
                     const size_t *lens, struct rconn_reply **out, struct rl_err *err)
{
    if (!c->cluster)
        return rconn_command(c, argc, argv, lens, out, err);
    if (out)
        *out = NULL;
    int rc = rconn_ensure(c, err);
    if (rc)
        return rc;
    if (argc < 1 || master < 0 || master >= c->map->n_nodes)
        return rl_errf(err, RL_EINVAL, "rconn_command_on: no command or no master %d", master);
    redisContext *ctx;
    if ((rc = node_ctx(c, master, &ctx, err)))
        return rc;
    redisReply *r = redisCommandArgv(ctx, argc, (const char **)argv, lens);
    if (!r)
        return node_lost(c, master, argv[0], err);
    struct rconn_reply *cp = calloc(1, sizeof *cp);
    if (!cp || copy_reply(cp, r)) {
        freeReplyObject(r);
        rconn_reply_free(cp);
        return rl_errf(err, RL_ENOMEM, "redis %s: out of memory copying a reply", argv[0]);
    }
    freeReplyObject(r);
    if (cp->type == RCONN_ERROR)
        rc = rl_errf(err, transient_error(cp->str) ? RL_EIO : RL_EINVAL, "%s: %s", argv[0],
                     cp->str);
    if (out)
        *out = cp;
    else
        rconn_reply_free(cp);
    return rc;
}

/* ---- pipelining ---- */

struct rconn_batch {
    int n, cap;
    char **cmd;             /* (n) RESP-encoded by redisFormatCommandArgv */
    int *cmd_len;           /* (n) */
    struct rconn_reply *replies; /* (cap); [0, n_done) are valid, and in cluster
                                  * mode any later one whose done[] is set */
    int *slot;              /* (n) the key's slot, -1 for none (cluster routing) */
    unsigned char *done;    /* (n) reply i was read */
    int n_done;
    int n_errors;
    int64_t sent_on;        /* 1 + the connection count when rconn_batch_send wrote
                               it (0: not sent): exec then only reads the replies */
    /* a cluster's batch written by rconn_batch_send: exec reads the nodes'
     * replies if their connections are still the ones written to */
    int *node;              /* (n) each command's node then; NULL: not sent */
    int n_used, used[RCL_MAX_NODES]; /* the nodes written, in order of first use */
    int64_t serial[RCL_MAX_NODES];   /* their connections (node_serial), 0: write failed */
    int send_rc;            /* the write's failure, reported by exec */
};

int rconn_batch_create(struct rconn_batch **out, struct rl_err *err)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : rl_errf(err, RL_ENOMEM, "rconn_batch_create: out of memory");
}

void rconn_batch_reset(struct rconn_batch *b)
{
    for (int i = 0; i < b->n; i++)
        free(b->cmd[i]);
    for (int i = 0; i < b->n; i++)
        if (b->done[i])
            clear_reply(&b->replies[i]);
    b->n = b->n_done = b->n_errors = 0;
    b->sent_on = 0;
    free(b->node);
    b->node = NULL;
}

void rconn_batch_free(struct rconn_batch *b)
{
    if (!b)
        return;
    rconn_batch_reset(b);
    free(b->cmd);
    free(b->cmd_len);
    free(b->replies);
    free(b->slot);
    free(b->done);
    free(b);
}

int rconn_batch_add(struct rconn_batch *b, int argc, const char *const *argv,
                    const size_t *lens, struct rl_err *err)
{
    if (argc < 1)
        return rl_errf(err, RL_EINVAL, "rconn_batch_add: no command");
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 16;
        char **cmd = realloc(b->cmd, sizeof *cmd * (size_t)cap);
        if (cmd)
            b->cmd = cmd;
        int *len = realloc(b->cmd_len, sizeof *len * (size_t)cap);
        if (len)
            b->cmd_len = len;
        struct rconn_reply *rep = realloc(b->replies, sizeof *rep * (size_t)cap);
        if (rep)
            b->replies = rep;
        int *slot = realloc(b->slot, sizeof *slot * (size_t)cap);
        if (slot)
            b->slot = slot;
        unsigned char *done = realloc(b->done, (size_t)cap);
        if (done)
            b->done = done;
        if (!cmd || !len || !rep || !slot || !done)
            return rl_errf(err, RL_ENOMEM, "rconn_batch_add: out of memory");
        b->cap = cap;
    }
    char *s = NULL;
    int n = redisFormatCommandArgv(&s, argc, (const char **)argv, lens);
    if (n < 0 || !s)
        return rl_errf(err, RL_ENOMEM, "rconn_batch_add: cannot encode %s", argv[0]);
    b->cmd[b->n] = s;
    b->cmd_len[b->n] = n;
    b->slot[b->n] = rcl_command_slot(argc, argv, lens);
    b->done[b->n] = 0;
    b->n++;
    return 0;
}

int rconn_batch_add_xadd(struct rconn_batch *b, const char *key, const char *id, long maxlen,
                         int n_fields, const char *const *names, const char *const *values,
                         const size_t *value_lens, struct rl_err *err)
{
    if (n_fields < 1 || n_fields > 64)
        return rl_errf(err, RL_EINVAL, "XADD %s: 1-64 fields", key);
    const char *argv[6 + 2 * 64];
    size_t lens[6 + 2 * 64];
    char ml[24];
    int a = 0;
    argv[a] = "XADD", lens[a++] = 4;
    argv[a] = key, lens[a++] = strlen(key);
    if (maxlen > 0) {
        snprintf(ml, sizeof ml, "%ld", maxlen);
        argv[a] = "MAXLEN", lens[a++] = 6;
        argv[a] = "~", lens[a++] = 1;
        argv[a] = ml, lens[a++] = strlen(ml);
    }
    argv[a] = id ? id : "*", lens[a] = strlen(argv[a]), a++;
    for (int i = 0; i < n_fields; i++) {
        argv[a] = names[i], lens[a++] = strlen(names[i]);
        argv[a] = values[i], lens[a++] = value_lens ? value_lens[i] : strlen(values[i]);
    }
    return rconn_batch_add(b, a, argv, lens, err);
}

/* Stores reply r (freed here) as command i's. */
static int store_reply(struct rconn_batch *b, int i, redisReply *r)
{
    struct rconn_reply *dst = &b->replies[i];
    int rc = copy_reply(dst, r);
    freeReplyObject(r);
    if (rc) {
        clear_reply(dst);
        return -RL_ENOMEM;
    }
    b->done[i] = 1;
    b->n_errors += dst->type == RCONN_ERROR;
    return 0;
}

/* Command i of b is the argument-less name (MULTI, EXEC), as encoded. */
static bool batch_is(const struct rconn_batch *b, int i, const char *name)
{
    char enc[32];
    int n = snprintf(enc, sizeof enc, "*1\r\n$%zu\r\n%s\r\n", strlen(name), name);
    return b->cmd_len[i] == n && !strncasecmp(b->cmd[i], enc, (size_t)n);
}

/* The node each unanswered command goes to: its key's master; a keyless
 * one goes with the next keyed command (MULTI) or else the previous one
 * (EXEC), so a transaction stays on its node. */
static void cl_route(const struct rconn *c, const struct rconn_batch *b, int *node)
{
    int prev = -1;
    for (int i = 0; i < b->n; i++) {
        node[i] = b->slot[i] >= 0 ? node_of(c, b->slot[i]) : -2;
        if (node[i] != -2)
            prev = node[i];
        else if (prev >= 0)
            node[i] = prev;
    }
    for (int i = b->n - 1, next = -1; i >= 0; i--) {
        if (b->slot[i] >= 0)
            next = node[i];
        else if (next >= 0 && (node[i] == -2 || batch_is(b, i, "MULTI")))
            node[i] = next;
        if (node[i] == -2)
            node[i] = node_of(c, -1);
    }
}

/* Cluster batch, first half: routes every unanswered command (node[],
 * b->n of them) and writes one pipeline per node, in command order within
 * each, all before any reply is read, so the nodes work in parallel (one
 * round trip, not one per node). used[]/n_used: the nodes, in order of
 * first use; ctxs[u]: the connection written to, NULL where the write
 * failed (its commands stay unanswered: -RL_EIO). */
static int cl_write(struct rconn *c, struct rconn_batch *b, int *node, int *used, int *n_used,
                    redisContext **ctxs, struct rl_err *err)
{
    cl_route(c, b, node);
    int rc = 0;
    *n_used = 0;
    for (int i = 0; i < b->n; i++) {
        if (b->done[i])
            continue;
        if (node[i] < 0) {
            c->stale = true;
            rc = rc ? rc : rl_errf(err, RL_EIO, "redis cluster %s: a slot has no master", c->addr);
            continue;
        }
        int u = 0;
        while (u < *n_used && used[u] != node[i])
            u++;
        if (u == *n_used)
            used[(*n_used)++] = node[i];
    }
    for (int u = 0; u < *n_used; u++) {
        int n = used[u], nrc = node_ctx(c, n, &ctxs[u], err), wdone = 0;
        for (int i = 0; i < b->n && !nrc; i++)
            if (node[i] == n && !b->done[i] &&
                redisAppendFormattedCommand(ctxs[u], b->cmd[i], (size_t)b->cmd_len[i]) != REDIS_OK)
                nrc = node_lost(c, n, "pipeline", err);
        while (!nrc && !wdone)
            if (redisBufferWrite(ctxs[u], &wdone) != REDIS_OK)
                nrc = node_lost(c, n, "pipeline", err);
        if (nrc) {
            rc = rc ? rc : nrc;
            ctxs[u] = NULL;
        }
    }
    return rc;
}

/* Second half: reads every written node's replies, then sends the
 * redirected commands again one by one. rc: the first half's. */
static int cl_read(struct rconn *c, struct rconn_batch *b, const int *node, const int *used,
                   int n_used, redisContext **ctxs, int rc, struct rl_err *err)
{
    for (int u = 0; u < n_used; u++) {
        int n = used[u], nrc = 0;
        if (!ctxs[u])
            continue;
        for (int i = 0; i < b->n && !nrc; i++) {
            if (node[i] != n || b->done[i])
                continue;
            void *v = NULL;
            if (redisGetReply(ctxs[u], &v) != REDIS_OK || !v) {
                nrc = node_lost(c, n, "pipeline", err);
            } else if (store_reply(b, i, v)) {
                node_lost(c, n, "pipeline", NULL); /* replies in flight would mispair */
                nrc = rl_errf(err, RL_ENOMEM, "pipeline: out of memory copying a reply");
            }
        }
        rc = rc ? rc : nrc;
    }
    /* redirected commands (not inside a transaction, where Redis aborts the
     * whole EXEC and the caller sees that) are sent again on their own */
    bool in_multi = false;
    for (int i = 0; i < b->n && !rc; i++) {
        if (batch_is(b, i, "MULTI"))
            in_multi = true;
        else if (batch_is(b, i, "EXEC"))
            in_multi = false;
        struct rconn_reply *r = &b->replies[i];
        if (in_multi || !b->done[i] || r->type != RCONN_ERROR ||
            (strncmp(r->str, "MOVED ", 6) && strncmp(r->str, "ASK ", 4)))
            continue;
        clear_reply(r);
        b->done[i] = 0;
        b->n_errors--;
        redisReply *nr = NULL;
        if ((rc = cl_send(c, b->slot[i], b->cmd[i], (size_t)b->cmd_len[i], "pipeline", &nr, err)))
            break;
        if (store_reply(b, i, nr))
            rc = rl_errf(err, RL_ENOMEM, "pipeline: out of memory copying a reply");
    }
    while (b->n_done < b->n && b->done[b->n_done])
        b->n_done++;
    return rc;
}

/* Cluster batch: written (unless rconn_batch_send did, on connections that
 * are still open) and read. */
static int cl_batch_exec(struct rconn *c, struct rconn_batch *b, struct rl_err *err)
{
    redisContext *ctxs[RCL_MAX_NODES];
    int used[RCL_MAX_NODES], n_used = 0, rc;
    int *node = b->node;
    b->node = NULL;
    if (node) { /* written by rconn_batch_send: the same connections, or their commands lost */
        rc = b->send_rc;
        n_used = b->n_used;
        memcpy(used, b->used, sizeof used);
        for (int u = 0; u < n_used; u++) {
            int n = used[u];
            ctxs[u] = b->serial[u] && n < c->map->n_nodes && c->node_ctx[n] &&
                              c->node_serial[n] == b->serial[u] ? c->node_ctx[n] : NULL;
            if (!ctxs[u] && b->serial[u])
                rc = rc ? rc : rl_errf(err, RL_EIO, "redis cluster %s: a node's connection "
                                       "was lost before its replies were read", c->addr);
        }
        if (b->send_rc) /* its message was overwritten since: say what it was */
            rl_errf(err, -b->send_rc, "redis cluster %s: a node's pipeline could not be "
                    "written (a node lost, or a slot without a master)", c->addr);
    } else if (!(node = malloc(sizeof *node * (size_t)b->n))) {
        return rl_errf(err, RL_ENOMEM, "pipeline: out of memory");
    } else {
        rc = cl_write(c, b, node, used, &n_used, ctxs, err);
    }
    rc = cl_read(c, b, node, used, n_used, ctxs, rc, err);
    free(node);
    return rc;
}

int rconn_batch_send(struct rconn *c, struct rconn_batch *b, struct rl_err *err)
{
    if (b->n_done == b->n || b->sent_on)
        return 0;
    int rc = rconn_ensure(c, err);
    if (rc)
        return rc;
    if (c->cluster) { /* every node's pipeline written; exec reads them (cl_batch_exec) */
        redisContext *ctxs[RCL_MAX_NODES];
        free(b->node);
        if (!(b->node = malloc(sizeof *b->node * (size_t)b->n)))
            return rl_errf(err, RL_ENOMEM, "pipeline: out of memory");
        b->send_rc = cl_write(c, b, b->node, b->used, &b->n_used, ctxs, err);
        for (int u = 0; u < b->n_used; u++)
            b->serial[u] = ctxs[u] ? c->node_serial[b->used[u]] : 0;
        return 0; /* a failure is exec's to report: those commands stay unanswered */
    }
    for (int i = b->n_done; i < b->n; i++)
        if (redisAppendFormattedCommand(c->ctx, b->cmd[i], (size_t)b->cmd_len[i]) != REDIS_OK)
            return lost(c, "pipeline", err);
    int wdone = 0;
    while (!wdone)
        if (redisBufferWrite(c->ctx, &wdone) != REDIS_OK)
            return lost(c, "pipeline", err);
    b->sent_on = c->n_connects + 1;
    return 0;
}

/* Appends b's commands not yet answered to the single instance's output
 * buffer (written by the first reply read). */
static int batch_append(struct rconn *c, struct rconn_batch *b, struct rl_err *err)
{
    for (int i = b->n_done; i < b->n; i++)
        if (redisAppendFormattedCommand(c->ctx, b->cmd[i], (size_t)b->cmd_len[i]) != REDIS_OK)
            return lost(c, "pipeline", err);
    return 0;
}

/* Reads the single instance's replies to b's commands not yet answered
 * (appended to c->ctx already). */
static int batch_replies(struct rconn *c, struct rconn_batch *b, struct rl_err *err)
{
    while (b->n_done < b->n) {
        void *v = NULL;
        if (redisGetReply(c->ctx, &v) != REDIS_OK || !v)
            return lost(c, "pipeline", err);
        redisReply *r = v;
        struct rconn_reply *dst = &b->replies[b->n_done];
        if (copy_reply(dst, r)) {
            clear_reply(dst);
            memset(dst, 0, sizeof *dst);
            freeReplyObject(r);
            /* the replies still in flight would pair with the wrong commands */
            rconn_disconnect(c);
            return rl_errf(err, RL_ENOMEM, "pipeline: out of memory copying a reply");
        }
        freeReplyObject(r);
        if (dst->type == RCONN_ERROR)
            b->n_errors++;
        b->done[b->n_done++] = 1;
    }
    return 0;
}

int rconn_batch_exec(struct rconn *c, struct rconn_batch *b, struct rl_err *err)
{
    if (b->n_done == b->n)
        return 0;
    /* sent by rconn_batch_send on this very connection: only read */
    bool sent = b->sent_on && b->sent_on == c->n_connects + 1 && c->ctx && !c->cluster;
    b->sent_on = 0;
    /* a cluster's batch written by rconn_batch_send: its node numbers hold
     * only while the map is not read again, so no rconn_ensure first */
    int rc = sent || (c->cluster && b->node) ? 0 : rconn_ensure(c, err);
    if (rc)
        return rc;
    if (c->cluster)
        return cl_batch_exec(c, b, err);
    if (!sent && (rc = batch_append(c, b, err)))
        return rc;
    return batch_replies(c, b, err);
}

static void await_reply(struct rconn *c, redisContext *ctx, int n, int block_ms,
                        const char *what);
static int xreadgroup_argv(const char **argv, char *cnt, char *blk, const char *group,
                           const char *consumer, int n_keys, const char *const *keys,
                           const char *id, int count, int block_ms);

/* The argv (10 + 2 * 64 at most) of a standing read sent second in a
 * pair (the rconn_*_then_xreadgroup calls): its argc, or -RL_EINVAL
 * unless 1-64 keys, count >= 1 and BLOCK >= 1. */
static int paired_read_argv(const char **argv, char *cnt, char *blk, const char *group,
                            const char *consumer, int n_keys, const char *const *keys, int count,
                            int block_ms, struct rl_err *err)
{
    if (n_keys < 1 || n_keys > 64 || count < 1 || block_ms < 1)
        return rl_errf(err, RL_EINVAL, "XREADGROUP (paired): 1-64 keys, count >= 1, BLOCK >= 1");
    return xreadgroup_argv(argv, cnt, blk, group, consumer, n_keys, keys, ">", count, block_ms);
}

int rconn_batch_exec_then_xreadgroup(struct rconn *c, struct rconn_batch *b, const char *group,
                                     const char *consumer, int n_keys, const char *const *keys,
                                     int count, int block_ms, struct rl_err *err)
{
    const char *argv[10 + 2 * 64];
    char cnt[16], blk[16];
    int a = paired_read_argv(argv, cnt, blk, group, consumer, n_keys, keys, count, block_ms, err);
    if (a < 0)
        return a;
    if (c->out_since_ms)
        return rl_errf(err, RL_EINVAL, "pipeline: a read sent earlier awaits its reply");
    b->sent_on = 0;
    int rc = rconn_ensure(c, err);
    if (rc)
        return rc;
    if (c->cluster)
        return rl_errf(err, RL_EUNSUPPORTED, "pipeline then XREADGROUP: a single instance only");
    if ((rc = batch_append(c, b, err)))
        return rc;
    if (redisAppendCommandArgv(c->ctx, a, argv, NULL) != REDIS_OK)
        return lost(c, "pipeline", err);
    /* the batch's replies (the first redisGetReply writes everything);
     * the read's stays to collect */
    if ((rc = batch_replies(c, b, err)))
        return rc;
    await_reply(c, c->ctx, -1, block_ms, "XREADG (paired)");
    return 0;
}

int rconn_batch_count(const struct rconn_batch *b) { return b->n; }
int rconn_batch_n_done(const struct rconn_batch *b) { return b->n_done; }
int rconn_batch_n_errors(const struct rconn_batch *b) { return b->n_errors; }

const struct rconn_reply *rconn_batch_reply(const struct rconn_batch *b, int i)
{
    return i >= 0 && i < b->n_done ? &b->replies[i] : NULL;
}

/* ---- streams ---- */

void rconn_entries_free(struct rconn_entries *e)
{
    if (!e)
        return;
    for (int i = 0; i < e->n; i++) {
        for (int k = 0; k < e->v[i].n_fields; k++) {
            free(e->v[i].fields[k].name);
            free(e->v[i].fields[k].value);
        }
        free(e->v[i].fields);
    }
    free(e->v);
    e->n = 0;
    e->v = NULL;
    e->drained = false;
}

int64_t rconn_id_ms(const char *id)
{
    return strtoll(id, NULL, 10);
}

void rconn_ids_free(struct rconn_ids *ids)
{
    if (!ids)
        return;
    free(ids->v);
    ids->v = NULL;
    ids->n = 0;
}

const char *rconn_entry_field(const struct rconn_entry *e, const char *name, size_t *len)
{
    for (int i = 0; i < e->n_fields; i++)
        if (!strcmp(e->fields[i].name, name)) {
            if (len)
                *len = e->fields[i].value_len;
            return e->fields[i].value;
        }
    return NULL;
}

static int copy_id(char dst[RCONN_ID_MAX], const struct rconn_reply *r)
{
    if (!r || (r->type != RCONN_STRING && r->type != RCONN_STATUS) || r->len >= RCONN_ID_MAX)
        return -1;
    memcpy(dst, r->str, r->len + 1);
    return 0;
}

/* Moves the entries of one reply array ([[id, [f, v, ...]], ...]) into
 * out, moving strings rather than copying them again. */
static int take_entries(struct rconn_reply *arr, int stream, struct rconn_entries *out,
                        const char *cmd, struct rl_err *err)
{
    if (arr->type == RCONN_NIL)
        return 0;
    if (arr->type != RCONN_ARRAY)
        return rl_errf(err, RL_EFORMAT, "%s: entries are not an array", cmd);
    if (!arr->n_elem)
        return 0;
    struct rconn_entry *v = realloc(out->v, sizeof *v * ((size_t)out->n + arr->n_elem));
    if (!v)
        return rl_errf(err, RL_ENOMEM, "%s: out of memory", cmd);
    out->v = v;
    for (size_t i = 0; i < arr->n_elem; i++) {
        struct rconn_reply *e = &arr->elem[i];
        struct rconn_entry *d = &out->v[out->n];
        memset(d, 0, sizeof *d);
        d->stream = stream;
        if (e->type != RCONN_ARRAY || e->n_elem != 2 || copy_id(d->id, &e->elem[0]))
            return rl_errf(err, RL_EFORMAT, "%s: malformed entry", cmd);
        struct rconn_reply *f = &e->elem[1];
        out->n++;
        if (f->type == RCONN_NIL) { /* in the PEL, but XDELed */
            d->deleted = true;
            continue;
        }
        if (f->type != RCONN_ARRAY || f->n_elem % 2)
            return rl_errf(err, RL_EFORMAT, "%s: malformed fields of %s", cmd, d->id);
        if (!f->n_elem)
            continue;
        d->fields = calloc(f->n_elem / 2, sizeof *d->fields);
        if (!d->fields)
            return rl_errf(err, RL_ENOMEM, "%s: out of memory", cmd);
        for (size_t k = 0; k + 1 < f->n_elem; k += 2) {
            struct rconn_field *fd = &d->fields[d->n_fields];
            if (f->elem[k].type != RCONN_STRING || f->elem[k + 1].type != RCONN_STRING)
                return rl_errf(err, RL_EFORMAT, "%s: non-string field in %s", cmd, d->id);
            fd->name = f->elem[k].str, fd->name_len = f->elem[k].len;
            fd->value = f->elem[k + 1].str, fd->value_len = f->elem[k + 1].len;
            f->elem[k].str = f->elem[k + 1].str = NULL;
            d->n_fields++;
        }
    }
    return 0;
}

static int take_ids(const struct rconn_reply *arr, struct rconn_ids *out, const char *cmd,
                    struct rl_err *err)
{
    out->n = 0;
    out->v = NULL;
    if (arr->type != RCONN_ARRAY)
        return rl_errf(err, RL_EFORMAT, "%s: IDs are not an array", cmd);
    if (!arr->n_elem)
        return 0;
    out->v = calloc(arr->n_elem, sizeof *out->v);
    if (!out->v)
        return rl_errf(err, RL_ENOMEM, "%s: out of memory", cmd);
    for (size_t i = 0; i < arr->n_elem; i++) {
        if (copy_id(out->v[out->n], &arr->elem[i])) {
            rconn_ids_free(out);
            return rl_errf(err, RL_EFORMAT, "%s: malformed ID", cmd);
        }
        out->n++;
    }
    return 0;
}

int rconn_xgroup_create(struct rconn *c, const char *key, const char *group, const char *start,
                        struct rl_err *err)
{
    const char *argv[] = {"XGROUP", "CREATE", key, group, start ? start : "0", "MKSTREAM"};
    struct rconn_reply *r = NULL;
    int rc = run(c, 6, argv, NULL, &r, err);
    if (rc == -RL_EINVAL && r && !strncmp(r->str, "BUSYGROUP", 9))
        rc = 0;
    if (rc == -RL_EINVAL)
        rl_err_wrap(err, "%s", key);
    rconn_reply_free(r);
    return rc;
}

/* Moves the entries of an XREADGROUP reply r (nil: none) over keys into
 * out, each numbered by its key's index. */
static int xread_entries(struct rconn_reply *r, int n_keys, const char *const *keys,
                         struct rconn_entries *out, struct rl_err *err)
{
    if (r->type == RCONN_NIL)
        return 0;
    if (r->type != RCONN_ARRAY)
        return rl_errf(err, RL_EFORMAT, "XREADGROUP: reply is not an array");
    int rc = 0;
    for (size_t s = 0; s < r->n_elem && !rc; s++) {
        struct rconn_reply *sr = &r->elem[s];
        if (sr->type != RCONN_ARRAY || sr->n_elem != 2 || sr->elem[0].type != RCONN_STRING)
            return rl_errf(err, RL_EFORMAT, "XREADGROUP: malformed stream reply");
        int idx = 0;
        while (idx < n_keys && strcmp(keys[idx], sr->elem[0].str))
            idx++;
        if (idx == n_keys)
            return rl_errf(err, RL_EFORMAT, "XREADGROUP: reply for a key not asked for");
        rc = take_entries(&sr->elem[1], idx, out, "XREADGROUP", err);
    }
    return rc;
}

/* XREADGROUP's argv (10 + 2 * n_keys at most) into argv; cnt and blk are
 * the caller's buffers (16 bytes). Returns argc. */
static int xreadgroup_argv(const char **argv, char *cnt, char *blk, const char *group,
                           const char *consumer, int n_keys, const char *const *keys,
                           const char *id, int count, int block_ms)
{
    int a = 0;
    snprintf(cnt, 16, "%d", count);
    argv[a++] = "XREADGROUP", argv[a++] = "GROUP", argv[a++] = group, argv[a++] = consumer;
    argv[a++] = "COUNT", argv[a++] = cnt;
    if (block_ms >= 0) {
        snprintf(blk, 16, "%d", block_ms);
        argv[a++] = "BLOCK", argv[a++] = blk;
    }
    argv[a++] = "STREAMS";
    for (int i = 0; i < n_keys; i++)
        argv[a++] = keys[i];
    for (int i = 0; i < n_keys; i++)
        argv[a++] = id;
    return a;
}

/* One XREADGROUP as asked (all keys on one node in cluster mode). */
static int xreadgroup_one(struct rconn *c, const char *group, const char *consumer, int n_keys,
                          const char *const *keys, const char *id, int count, int block_ms,
                          struct rconn_entries *out, struct rl_err *err)
{
    const char *argv[10 + 2 * 64];
    char cnt[16], blk[16];
    int a = xreadgroup_argv(argv, cnt, blk, group, consumer, n_keys, keys, id, count, block_ms);
    int rc = rconn_ensure(c, err);
    if (rc)
        return rc;
    /* the socket timeout must outlast the BLOCK, or hiredis would call a
     * quiet queue a dead connection */
    bool widened = block_ms > 0 && c->io_timeout_ms > 0;
    if (widened && c->cluster)
        c->block_ms = block_ms; /* node_ctx() widens the node's context */
    else if (widened)
        redisSetTimeout(c->ctx, tv_ms(c->io_timeout_ms + block_ms));
    struct rconn_reply *r = NULL;
    rc = run(c, a, argv, NULL, &r, err);
    c->block_ms = 0;
    if (widened && c->ctx)
        redisSetTimeout(c->ctx, tv_ms(c->io_timeout_ms));
    if (!rc)
        rc = xread_entries(r, n_keys, keys, out, err);
    rconn_reply_free(r);
    if (rc)
        rconn_entries_free(out);
    return rc;
}

/* Moves the entries of part to the end of out, their stream renumbered
 * through idx. */
static int append_entries(struct rconn_entries *out, struct rconn_entries *part, const int *idx,
                          struct rl_err *err)
{
    if (!part->n)
        return 0;
    struct rconn_entry *v = realloc(out->v, sizeof *v * (size_t)(out->n + part->n));
    if (!v) {
        rconn_entries_free(part);
        return rl_errf(err, RL_ENOMEM, "XREADGROUP: out of memory");
    }
    out->v = v;
    for (int k = 0; k < part->n; k++) {
        v[out->n] = part->v[k];
        v[out->n++].stream = idx[part->v[k].stream];
    }
    free(part->v);
    part->v = NULL;
    part->n = 0;
    return 0;
}

/* An extra connection to node n for `role` ("ctl" for CLIENT UNBLOCK,
 * "b1", "b2" ... for the BLOCKing reads of a second, third ... slot on
 * the node), opened when first needed and kept by address, so that a
 * re-read map's renumbering does not matter. NULL when it cannot be had. */
static redisContext *aux_ctx(struct rconn *c, int n, const char *role)
{
    char name[RCL_HOST_MAX + 24];
    snprintf(name, sizeof name, "%s:%d/%s", c->map->nodes[n].host, c->map->nodes[n].port, role);
    int free_i = -1;
    for (int i = 0; i < RCONN_N_AUX; i++) {
        if (c->aux[i].ctx && !strcmp(c->aux[i].name, name))
            return c->aux[i].ctx;
        if (!c->aux[i].ctx && free_i < 0)
            free_i = i;
    }
    if (free_i < 0)
        return NULL;
    struct rl_err e;
    if (open_ctx(c, c->map->nodes[n].host, c->map->nodes[n].port, NULL, name,
                 &c->aux[free_i].ctx, &e))
        return NULL;
    snprintf(c->aux[free_i].name, sizeof c->aux[free_i].name, "%s", name);
    return c->aux[free_i].ctx;
}

/* Frees the connection ctx, whether node n's own or an extra one (a read
 * we could not finish or cut short: what it delivered stays pending for
 * this consumer, taken back by XAUTOCLAIM after claim_idle_ms). */
static void ctx_drop(struct rconn *c, int n, redisContext *ctx)
{
    if (c->node_ctx[n] == ctx) {
        c->node_ctx[n] = NULL;
    } else {
        for (int i = 0; i < RCONN_N_AUX; i++)
            if (c->aux[i].ctx == ctx)
                c->aux[i].ctx = NULL;
    }
    redisFree(ctx);
}

/* Keys grouped by slot (a cluster command's keys must share one). */
struct slot_group {
    int slot, node;
    int n_keys;
    int idx[64];                  /* into the caller's keys */
    const char *keys[64];
};

static int group_by_slot(struct rconn *c, int n_keys, const char *const *keys,
                         struct slot_group *g, int *n_groups, struct rl_err *err)
{
    int ng = 0;
    for (int i = 0; i < n_keys; i++) {
        int slot = rcl_key_slot(keys[i], strlen(keys[i]));
        int n = node_of(c, slot);
        if (n < 0) {
            c->stale = true;
            return rl_errf(err, RL_EIO, "redis cluster %s: no master known for %s", c->addr,
                           keys[i]);
        }
        int k = 0;
        while (k < ng && g[k].slot != slot)
            k++;
        if (k == ng)
            g[ng++] = (struct slot_group){.slot = slot, .node = n};
        g[k].idx[g[k].n_keys] = i;
        g[k].keys[g[k].n_keys++] = keys[i];
    }
    *n_groups = ng;
    return 0;
}

/* Cluster, BLOCKing, keys in several slots (issue 27: a pool's shards):
 * one read per slot, all sent at once (a master holding several of the
 * slots gets them on as many connections: a connection blocked in one
 * read runs nothing else), each preceded by CLIENT ID in the same write;
 * then poll() waits for the first answer. The reads still blocked are
 * then cut short with CLIENT UNBLOCK <id> from one more connection to
 * their master (aux_ctx "ctl"): each answers nil at once, or the entries
 * it had delivered before the unblock came, which are returned too (they
 * are this consumer's now). So an idle worker sleeps in one poll()
 * instead of polling, and a job queued in any shard wakes it at once. A
 * read that cannot be cut short (no CLIENT ID or UNBLOCK, e.g. an ACL
 * without them) has its connection dropped instead. Entries are returned
 * when any read gave some, even if another failed (a MOVED marks the map
 * stale). */
static int cl_xreadgroup_par(struct rconn *c, const char *group, const char *consumer,
                             struct slot_group *g, int ng, const char *id, int count,
                             int block_ms, struct rconn_entries *out, struct rl_err *err)
{
    enum { IDLE, SENT, DONE };
    int state[64] = {0}, used[RCL_MAX_NODES] = {0};
    long long cid[64];
    redisContext *ctx[64] = {0};
    int rc = 0, n_sent = 0;
    char cnt[16], blk[16];
    snprintf(cnt, sizeof cnt, "%d", count);
    snprintf(blk, sizeof blk, "%d", block_ms);
    for (int m = 0; m < ng; m++) {
        const char *argv[10 + 2 * 64];
        int a = 0;
        argv[a++] = "XREADGROUP", argv[a++] = "GROUP", argv[a++] = group;
        argv[a++] = consumer, argv[a++] = "COUNT", argv[a++] = cnt;
        argv[a++] = "BLOCK", argv[a++] = blk, argv[a++] = "STREAMS";
        for (int i = 0; i < g[m].n_keys; i++)
            argv[a++] = g[m].keys[i];
        for (int i = 0; i < g[m].n_keys; i++)
            argv[a++] = id;
        cid[m] = -1;
        int n = g[m].node;
        if (used[n]++ == 0) {
            c->block_ms = block_ms; /* node_ctx() widens the node's timeout */
            int r = node_ctx(c, n, &ctx[m], err);
            c->block_ms = 0;
            if (r) {
                rc = r;
                ctx[m] = NULL;
                continue;
            }
        } else {
            char role[16];
            snprintf(role, sizeof role, "b%d", used[n] - 1);
            if (!(ctx[m] = aux_ctx(c, n, role))) {
                rc = rl_errf(err, RL_EIO, "redis %s:%d: no extra connection for a read",
                             c->map->nodes[n].host, c->map->nodes[n].port);
                continue;
            }
            if (c->io_timeout_ms > 0)
                redisSetTimeout(ctx[m], tv_ms(c->io_timeout_ms + block_ms));
        }
        int done = 0;
        if (redisAppendCommand(ctx[m], "CLIENT ID") != REDIS_OK ||
            redisAppendCommandArgv(ctx[m], a, argv, NULL) != REDIS_OK)
            goto lost;
        while (!done)
            if (redisBufferWrite(ctx[m], &done) != REDIS_OK)
                goto lost;
        state[m] = SENT;
        n_sent++;
        continue;
    lost:
        rc = rl_errf(err, RL_EIO, "redis %s:%d: XREADGROUP: %s", c->map->nodes[n].host,
                     c->map->nodes[n].port, ctx[m]->errstr[0] ? ctx[m]->errstr : "lost");
        ctx_drop(c, n, ctx[m]);
        c->stale = true;
        ctx[m] = NULL;
    }
    /* CLIENT ID answers at once: read it on each (blocking read, due now) */
    for (int m = 0; m < ng; m++) {
        if (state[m] != SENT)
            continue;
        void *v = NULL;
        if (redisGetReply(ctx[m], &v) != REDIS_OK || !v) {
            rc = rl_errf(err, RL_EIO, "redis cluster: CLIENT ID: connection lost");
            ctx_drop(c, g[m].node, ctx[m]);
            state[m] = DONE, n_sent--;
            continue;
        }
        redisReply *r = v;
        if (r->type == REDIS_REPLY_INTEGER)
            cid[m] = r->integer;
        freeReplyObject(r);
    }
    int64_t deadline = rl_mono_ms() + block_ms + (c->io_timeout_ms > 0 ? c->io_timeout_ms : 60000);
    bool unblocked = false;
    while (n_sent > 0) {
        struct pollfd pf[64];
        int pm[64], np = 0;
        bool buffered[64] = {0}, any_buffered = false;
        for (int m = 0; m < ng; m++)
            if (state[m] == SENT) {
                /* bytes hiredis already read with CLIENT ID's reply: the
                 * socket may have nothing more to say, so poll() would not
                 * tell us */
                buffered[np] = ctx[m]->reader && ctx[m]->reader->pos < ctx[m]->reader->len;
                any_buffered |= buffered[np];
                pf[np] = (struct pollfd){.fd = ctx[m]->fd, .events = POLLIN};
                pm[np++] = m;
            }
        int64_t wait = any_buffered ? 0 : deadline - rl_mono_ms();
        int pr = poll(pf, (nfds_t)np, wait > 0 ? (int)wait : 0);
        if (pr < 0 && errno == EINTR)
            continue;
        for (int i = 0; i < np && pr >= 0; i++)
            if (buffered[i])
                pf[i].revents |= POLLIN, pr++;
        if (pr <= 0) { /* past BLOCK + io timeout: those connections are dead */
            for (int i = 0; i < np; i++) {
                ctx_drop(c, g[pm[i]].node, ctx[pm[i]]);
                state[pm[i]] = DONE, n_sent--;
            }
            c->stale = true;
            rc = rl_errf(err, RL_EIO, "redis cluster %s: XREADGROUP: no answer", c->addr);
            break;
        }
        for (int i = 0; i < np; i++) {
            int m = pm[i];
            if (!pf[i].revents)
                continue;
            void *v = NULL;
            state[m] = DONE, n_sent--;
            if (redisGetReply(ctx[m], &v) != REDIS_OK || !v) {
                rc = rl_errf(err, RL_EIO, "redis cluster: XREADGROUP: connection lost");
                ctx_drop(c, g[m].node, ctx[m]);
                c->stale = true;
                continue;
            }
            redisReply *hr = v;
            if (hr->type == REDIS_REPLY_ERROR) {
                int slot, port;
                char host[RCL_HOST_MAX];
                if (rcl_parse_redirect(hr->str, &slot, host, &port) != RCL_NONE ||
                    transient_error(hr->str)) {
                    c->stale = true; /* a slot moved or a failover: re-read the map */
                    rc = rl_errf(err, RL_EIO, "XREADGROUP: %s", hr->str);
                } else {
                    rc = rl_errf(err, RL_EINVAL, "XREADGROUP: %s", hr->str);
                }
                freeReplyObject(hr);
                continue;
            }
            struct rconn_reply cp = {0};
            int prc = copy_reply(&cp, hr);
            freeReplyObject(hr);
            struct rconn_entries part = {0};
            if (prc)
                prc = rl_errf(err, RL_ENOMEM, "XREADGROUP: out of memory");
            else
                prc = xread_entries(&cp, g[m].n_keys, g[m].keys, &part, err);
            clear_reply(&cp);
            if (!prc)
                prc = append_entries(out, &part, g[m].idx, err);
            else
                rconn_entries_free(&part);
            if (prc)
                rc = prc;
        }
        if (unblocked || n_sent == 0)
            continue;
        /* the first answer is in: cut the other reads short */
        unblocked = true;
        for (int m = 0; m < ng; m++) {
            if (state[m] != SENT)
                continue;
            redisContext *cc = cid[m] > 0 ? aux_ctx(c, g[m].node, "ctl") : NULL;
            redisReply *ur = cc ? redisCommand(cc, "CLIENT UNBLOCK %lld", cid[m]) : NULL;
            bool ok = ur && ur->type == REDIS_REPLY_INTEGER;
            if (ur)
                freeReplyObject(ur);
            else if (cc)
                ctx_drop(c, g[m].node, cc); /* the control connection broke */
            if (!ok) {
                ctx_drop(c, g[m].node, ctx[m]);
                state[m] = DONE, n_sent--;
            }
            /* 0 = it was answering already: its reply is on the way */
        }
        deadline = rl_mono_ms() + (c->io_timeout_ms > 0 ? c->io_timeout_ms : 60000);
    }
    if (out->n)
        return 0; /* what was delivered is ours: never dropped for another's error */
    if (rc)
        rconn_entries_free(out);
    return rc;
}

/* Cluster: the keys grouped by slot. One slot: one read, as asked.
 * Several, without BLOCK: a read per slot, in turn, until count entries
 * came; with BLOCK: all at once (cl_xreadgroup_par). */
static int cl_xreadgroup(struct rconn *c, const char *group, const char *consumer, int n_keys,
                         const char *const *keys, const char *id, int count, int block_ms,
                         struct rconn_entries *out, struct rl_err *err)
{
    struct slot_group *g = malloc(64 * sizeof *g);
    int ng = 0, rc;
    if (!g)
        return rl_errf(err, RL_ENOMEM, "XREADGROUP: out of memory");
    if ((rc = group_by_slot(c, n_keys, keys, g, &ng, err)))
        goto out;
    if (ng == 1) {
        rc = xreadgroup_one(c, group, consumer, n_keys, keys, id, count, block_ms, out, err);
        goto out;
    }
    if (block_ms > 0) {
        rc = cl_xreadgroup_par(c, group, consumer, g, ng, id, count, block_ms, out, err);
        goto out;
    }
    for (int m = 0; m < ng && !rc && out->n < count; m++) {
        struct rconn_entries part = {0};
        rc = xreadgroup_one(c, group, consumer, g[m].n_keys, g[m].keys, id, count - out->n,
                            block_ms, &part, err);
        if (!rc)
            rc = append_entries(out, &part, g[m].idx, err);
    }
    if (rc && out->n)
        rc = 0; /* delivered to us: keep them */
    if (rc)
        rconn_entries_free(out);
out:
    free(g);
    return rc;
}

int rconn_xreadgroup(struct rconn *c, const char *group, const char *consumer, int n_keys,
                     const char *const *keys, const char *id, int count, int block_ms,
                     struct rconn_entries *out, struct rl_err *err)
{
    out->n = 0;
    out->v = NULL;
    if (n_keys < 1 || n_keys > 64 || count < 1)
        return rl_errf(err, RL_EINVAL, "XREADGROUP: 1-64 keys and count >= 1");
    int rc = rconn_ensure(c, err);
    if (rc)
        return rc;
    if (c->cluster)
        return cl_xreadgroup(c, group, consumer, n_keys, keys, id, count, block_ms, out, err);
    return xreadgroup_one(c, group, consumer, n_keys, keys, id, count, block_ms, out, err);
}

/* The connection broke that node n (-1: the single instance) serves us
 * on: dropped, on a cluster that node's alone. */
static int conn_lost(struct rconn *c, int n, const char *what, struct rl_err *err)
{
    return n >= 0 && c->cluster ? node_lost(c, n, what, err) : lost(c, what, err);
}

/* The connection a command left awaiting its reply goes on: the single
 * instance's, or on a cluster that of slot's master (no redirect followed;
 * *node its map index, -1 on a single instance). */
static int out_conn(struct rconn *c, int slot, redisContext **ctx, int *node, struct rl_err *err)
{
    *ctx = c->ctx;
    *node = -1;
    if (!c->cluster)
        return 0;
    if ((*node = node_of(c, slot)) < 0) {
        c->stale = true;
        return rl_errf(err, RL_EIO, "redis cluster %s: no master known for slot %d", c->addr,
                       slot);
    }
    return node_ctx(c, *node, ctx, err);
}

/* A command written to ctx (node n) now awaits its reply. */
static void await_reply(struct rconn *c, redisContext *ctx, int n, int block_ms, const char *what)
{
    c->out_since_ms = rl_mono_ms();
    c->out_block_ms = block_ms;
    c->out_ctx = ctx;
    c->out_node = n;
    snprintf(c->out_what, sizeof c->out_what, "%s", what);
}

/* Writes a read (argv, a entries) of keys (one slot on a cluster) to
 * their node and leaves it awaiting its reply: what rconn_xreadgroup_send
 * and rconn_xreadgroup_send_aged share. */
static int send_read(struct rconn *c, int n_keys, const char *const *keys, int a,
                     const char **argv, int block_ms, const char *what, struct rl_err *err)
{
    if (c->out_since_ms)
        return rl_errf(err, RL_EINVAL, "%s: a read sent earlier awaits its reply", what);
    int rc = rconn_ensure(c, err);
    if (rc)
        return rc;
    int slot = c->cluster ? rcl_key_slot(keys[0], strlen(keys[0])) : 0;
    for (int i = 1; c->cluster && i < n_keys; i++)
        if (rcl_key_slot(keys[i], strlen(keys[i])) != slot)
            return rl_errf(err, RL_EUNSUPPORTED,
                           "%s: a standing read on a cluster names one slot's streams", what);
    redisContext *ctx;
    int n;
    if ((rc = out_conn(c, slot, &ctx, &n, err)))
        return rc;
    int done = 0;
    if (redisAppendCommandArgv(ctx, a, argv, NULL) != REDIS_OK)
        return conn_lost(c, n, what, err);
    while (!done)
        if (redisBufferWrite(ctx, &done) != REDIS_OK)
            return conn_lost(c, n, what, err);
    await_reply(c, ctx, n, block_ms > 0 ? block_ms : 0, what);
    return 0;
}

int rconn_xreadgroup_send(struct rconn *c, const char *group, const char *consumer, int n_keys,
                          const char *const *keys, int count, int block_ms, struct rl_err *err)
{
    if (n_keys < 1 || n_keys > 64 || count < 1 || (block_ms < 1 && block_ms != -1))
        return rl_errf(err, RL_EINVAL, "XREADGROUP: 1-64 keys, count >= 1 and BLOCK >= 1 "
                       "(or -1: none)");
    const char *argv[10 + 2 * 64];
    char cnt[16], blk[16];
    int a = xreadgroup_argv(argv, cnt, blk, group, consumer, n_keys, keys, ">", count, block_ms);
    return send_read(c, n_keys, keys, a, argv, block_ms, "XREADGROUP", err);
}

/* KEYS the streams, ARGV[1] the group, [2] the consumer, [3] COUNT per
 * stream, [4] the age in ms, [5] the latest ID time in ms (0: any). Per
 * stream: the entries after the group's last delivered one (none
 * delivered yet: XREADGROUP's ">") whose IDs (Redis's clock when they
 * were added) are at least that old and no later than [5], delivered
 * by one XREADGROUP of just that many; the replies' stream elements
 * together: XREADGROUP's reply. None taken: nil when some stream held an
 * undelivered entry (too young), an empty array when none held any (the
 * drained flag of rconn_xreadgroup_collect). A missing key or group reads
 * as XREADGROUP does (its NOGROUP error), and so does any error. */
static const char aged_read_lua[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local age, upto, res, waiting = tonumber(ARGV[4]), tonumber(ARGV[5]), {}, false\n"
    "for i = 1, #KEYS do\n"
    "  local last, n = nil, 0\n"
    "  local gs = redis.pcall('XINFO', 'GROUPS', KEYS[i])\n"
    "  if type(gs) == 'table' and not gs.err then\n"
    "    for _, g in ipairs(gs) do\n"
    "      local name, ld\n"
    "      for j = 1, #g, 2 do\n"
    "        if g[j] == 'name' then name = g[j + 1]\n"
    "        elseif g[j] == 'last-delivered-id' then ld = g[j + 1] end\n"
    "      end\n"
    "      if name == ARGV[1] then last = ld end\n"
    "    end\n"
    "  end\n"
    "  if last then\n"
    "    for _, e in ipairs(redis.call('XRANGE', KEYS[i], '(' .. last, '+', 'COUNT', ARGV[3])) do\n"
    "      waiting = true\n"
    "      local ms = tonumber(string.match(e[1], '^%d+'))\n"
    "      if now - ms < age or (upto > 0 and ms > upto) then break end\n"
    "      n = n + 1\n"
    "    end\n"
    "  else\n"
    "    n = tonumber(ARGV[3])\n"
    "  end\n"
    "  if n > 0 then\n"
    "    local r = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', n, 'STREAMS',\n"
    "                          KEYS[i], '>')\n"
    "    if type(r) == 'table' and r.err then return r end\n"
    "    if r then res[#res + 1] = r[1] end\n"
    "  end\n"
    "end\n"
    "if #res > 0 then return res end\n"
    "if waiting then return false end\n"
    "return {}\n";

int rconn_xreadgroup_send_aged(struct rconn *c, const char *group, const char *consumer,
                               int n_keys, const char *const *keys, int count, int min_age_ms,
                               int64_t upto_ms, struct rl_err *err)
{
    if (n_keys < 1 || n_keys > 64 || count < 1 || min_age_ms < 0)
        return rl_errf(err, RL_EINVAL, "aged XREADGROUP: 1-64 keys, count >= 1, age >= 0");
    const char *argv[3 + 64 + 5];
    char nk[12], cnt[16], age[16], upto[24];
    snprintf(nk, sizeof nk, "%d", n_keys);
    snprintf(cnt, sizeof cnt, "%d", count);
    snprintf(age, sizeof age, "%d", min_age_ms);
    snprintf(upto, sizeof upto, "%lld", (long long)(upto_ms > 0 ? upto_ms : 0));
    int a = 0;
    argv[a++] = "EVAL", argv[a++] = aged_read_lua, argv[a++] = nk;
    for (int i = 0; i < n_keys; i++)
        argv[a++] = keys[i];
    argv[a++] = group, argv[a++] = consumer, argv[a++] = cnt, argv[a++] = age, argv[a++] = upto;
    return send_read(c, n_keys, keys, a, argv, -1, "aged XREADGROUP", err);
}

bool rconn_awaiting(const struct rconn *c) { return c->out_since_ms > 0; }

int rconn_wait_any(struct rconn *const *cs, int n, int wait_ms)
{
    struct pollfd pfd[16];
    int np = 0;
    for (int i = 0; i < n && np < 16; i++) {
        const redisContext *ctx = cs[i] && cs[i]->out_since_ms ? cs[i]->out_ctx : NULL;
        if (!ctx)
            continue;
        if (ctx->reader && ctx->reader->pos < ctx->reader->len)
            return 1; /* a reply (or part of one) is read already */
        pfd[np].fd = ctx->fd;
        pfd[np].events = POLLIN;
        pfd[np++].revents = 0;
    }
    if (!np)
        return 0;
    int r = poll(pfd, (nfds_t)np, wait_ms > 0 ? wait_ms : 0);
    return r > 0 ? r : 0;
}

/* Waits up to wait_ms (0: only looks) for the reply of the command left
 * sent (out_since_ms). *r NULL: not yet. The reply must come within its
 * BLOCK and a round trip: later, the connection is taken for dead, as a
 * blocking call's timeout would. */
static int collect_raw(struct rconn *c, int wait_ms, const char *what, redisReply **out,
                       struct rl_err *err)
{
    *out = NULL;
    redisContext *ctx = c->out_ctx;
    if (!c->out_since_ms || !ctx)
        return rl_errf(err, RL_EINVAL, "%s: no command awaits its reply", what);
    int64_t until = rl_mono_ms() + (wait_ms > 0 ? wait_ms : 0);
    int64_t dead = c->out_since_ms + c->out_block_ms + (c->io_timeout_ms > 0 ? c->io_timeout_ms : 0);
    void *r = NULL;
    for (;;) {
        if (redisGetReplyFromReader(ctx, &r) == REDIS_ERR) /* what is buffered: no wait */
            return conn_lost(c, c->out_node, what, err);
        if (r)
            break;
        int64_t now = rl_mono_ms();
        if (c->io_timeout_ms > 0 && now >= dead) {
            rl_errf(err, RL_EIO, "redis %s: %s: no reply after %lld ms", c->addr, what,
                    (long long)(now - c->out_since_ms));
            conn_lost(c, c->out_node, what, NULL);
            return -RL_EIO;
        }
        if (wait_ms > 0 && until > dead && c->io_timeout_ms > 0)
            until = dead;
        struct pollfd pfd = {.fd = ctx->fd, .events = POLLIN};
        int left = until > now ? (int)(until - now) : 0;
        int pr = poll(&pfd, 1, left);
        if (pr < 0 && errno != EINTR)
            return conn_lost(c, c->out_node, what, err);
        if (pr > 0 && redisBufferRead(ctx) != REDIS_OK)
            return conn_lost(c, c->out_node, what, err);
        if (pr == 0 && rl_mono_ms() >= until && (c->io_timeout_ms <= 0 || rl_mono_ms() < dead))
            return 0; /* not yet */
    }
    c->out_since_ms = 0;
    c->out_ctx = NULL;
    if (c->cluster && ((redisReply *)r)->type == REDIS_REPLY_ERROR)
        c->stale = true; /* MOVED, or its master turned replica (UNBLOCKED): read the map */
    *out = r;
    return 0;
}

int rconn_xreadgroup_collect(struct rconn *c, int n_keys, const char *const *keys, int wait_ms,
                             struct rconn_entries *out, bool *came, struct rl_err *err)
{
    out->n = 0;
    out->v = NULL;
    out->drained = false;
    *came = false;
    redisReply *r = NULL;
    int rc = collect_raw(c, wait_ms, "XREADGROUP", &r, err);
    if (rc || !r)
        return rc;
    *came = true;
    struct rconn_reply cp;
    rc = copy_reply(&cp, r);
    freeReplyObject(r);
    if (rc) {
        clear_reply(&cp);
        return rl_errf(err, RL_ENOMEM, "XREADGROUP: out of memory copying a reply");
    }
    if (cp.type == RCONN_ERROR)
        rc = rl_errf(err, transient_error(cp.str) || (c->cluster && (!strncmp(cp.str, "MOVED ", 6) ||
                          !strncmp(cp.str, "ASK ", 4))) ? RL_EIO : RL_EINVAL,
                     "XREADGROUP: %s", cp.str);
    else
        rc = xread_entries(&cp, n_keys, keys, out, err);
    /* XREADGROUP itself answers nil, never an empty array: only an aged
     * look's script does, for streams with nothing undelivered */
    out->drained = !rc && cp.type == RCONN_ARRAY && cp.n_elem == 0;
    clear_reply(&cp);
    if (rc)
        rconn_entries_free(out);
    return rc;
}

/* A copied reply, error replies -RL_EINVAL (-RL_EIO when transient), as
 * run() hands them back. */
static int own_reply(redisReply *r, const char *what, struct rconn_reply **out,
                     struct rl_err *err)
{
    struct rconn_reply *cp = malloc(sizeof *cp);
    if (!cp || copy_reply(cp, r)) {
        if (cp) {
            clear_reply(cp);
            free(cp);
        }
        freeReplyObject(r);
        return rl_errf(err, RL_ENOMEM, "redis %s: out of memory copying a reply", what);
    }
    freeReplyObject(r);
    *out = cp;
    if (cp->type == RCONN_ERROR)
        return rl_errf(err, transient_error(cp->str) ? RL_EIO : RL_EINVAL, "%s: %s", what,
                       cp->str);
    return 0;
}

#define COMMANDS_THEN_MAX 8 /* commands ahead of the one left sent (rconn.h) */

/* n commands, then a second command left sent (its reply collected
 * later), in one write to the master of the first command's slot; the n
 * replies into out[] (each NULL until read). A redirect of the first is
 * -RL_EIO with the map marked stale; the second is collected either way. */
static int commands_then(struct rconn *c, int n_cmd, const int *argcs,
                         const char *const *const *argvs, const size_t *lens0,
                         struct rconn_reply **out, int argc2, const char *const *argv2,
                         int block_ms, struct rl_err *err)
{
    for (int i = 0; i < n_cmd && i < COMMANDS_THEN_MAX; i++)
        out[i] = NULL;
    if (n_cmd < 1 || n_cmd > COMMANDS_THEN_MAX || argcs[0] < 1 || argc2 < 1 || block_ms < 0)
        return rl_errf(err, RL_EINVAL, "rconn_command_then: 1-%d commands, then one",
                       COMMANDS_THEN_MAX);
    const char *what0 = argvs[0][0];
    if (c->out_since_ms)
        return rl_errf(err, RL_EINVAL, "redis %s: a command sent earlier awaits its reply", what0);
    int rc = rconn_ensure(c, err);
    if (rc)
        return rc;
    redisContext *ctx; /* all to the master of the first's slot */
    int n;
    if ((rc = out_conn(c, c->cluster ? rcl_command_slot(argcs[0], argvs[0], lens0) : 0, &ctx, &n,
                       err)))
        return rc;
    for (int i = 0; i < n_cmd; i++)
        if (redisAppendCommandArgv(ctx, argcs[i], (const char **)argvs[i], i ? NULL : lens0) !=
            REDIS_OK)
            return conn_lost(c, n, what0, err);
    if (redisAppendCommandArgv(ctx, argc2, (const char **)argv2, NULL) != REDIS_OK)
        return conn_lost(c, n, what0, err);
    void *v[COMMANDS_THEN_MAX] = {NULL};
    for (int i = 0; i < n_cmd; i++)
        if (redisGetReply(ctx, &v[i]) != REDIS_OK || !v[i]) { /* the first writes them all */
            for (int k = 0; k < i; k++)
                freeReplyObject(v[k]);
            return conn_lost(c, n, what0, err);
        }
    char what[16];
    snprintf(what, sizeof what, "%.6s (paired)", argv2[0]);
    await_reply(c, ctx, n, block_ms, what);
    int ask = 0;
    if (n >= 0 && follow_redirect(c, n, v[0], &ask) != -1) {
        /* the slot moved (or is moving): the second, in the same slot, is
         * redirected too, or served here; either way it is collected, and
         * the caller reads again on the map read anew */
        c->stale = true;
        rl_errf(err, RL_EIO, "redis cluster %s: %s: redirected (%s)", c->addr, what0,
                ((redisReply *)v[0])->str);
        for (int i = 0; i < n_cmd; i++)
            freeReplyObject(v[i]);
        return -RL_EIO;
    }
    int first = 0;
    for (int i = 0; i < n_cmd; i++) {
        struct rl_err e2;
        int r = own_reply(v[i], argvs[i][0], &out[i], i && first ? &e2 : err);
        if (r && !first)
            first = r;
    }
    return first;
}

int rconn_command_then(struct rconn *c, int argc, const char *const *argv, const size_t *lens,
                       struct rconn_reply **out, int argc2, const char *const *argv2,
                       int block_ms, struct rl_err *err)
{
    const char *const *argvs[1] = {argv};
    return commands_then(c, 1, &argc, argvs, lens, out, argc2, argv2, block_ms, err);
}

int rconn_commands_then_xreadgroup(struct rconn *c, int n_cmd, const int *argcs,
                                   const char *const *const *argvs, struct rconn_reply **out,
                                   const char *group, const char *consumer, int n_keys,
                                   const char *const *keys, int count, int block_ms,
                                   struct rl_err *err)
{
    for (int i = 0; i < n_cmd && i < COMMANDS_THEN_MAX; i++)
        out[i] = NULL;
    if (n_cmd < 1 || n_cmd > COMMANDS_THEN_MAX)
        return rl_errf(err, RL_EINVAL, "XREADGROUP (paired): 1-%d commands first",
                       COMMANDS_THEN_MAX);
    const char *argv2[10 + 2 * 64];
    char cnt[16], blk[16];
    int a = paired_read_argv(argv2, cnt, blk, group, consumer, n_keys, keys, count, block_ms, err);
    if (a < 0)
        return a;
    int rc = rconn_ensure(c, err);
    if (rc)
        return rc;
    if (c->cluster) { /* all go to one master: the read's, serving every key */
        int slot = rcl_key_slot(keys[0], strlen(keys[0])), node = rconn_slot_master(c, slot);
        bool one = node >= 0;
        for (int i = 0; one && i < n_cmd; i++) {
            int s = rcl_command_slot(argcs[i], argvs[i], NULL);
            one = s == slot || (s >= 0 && rconn_slot_master(c, s) == node);
        }
        for (int i = 1; one && i < n_keys; i++)
            one = rcl_key_slot(keys[i], strlen(keys[i])) == slot;
        if (!one)
            return rl_errf(err, RL_EUNSUPPORTED, "%s then XREADGROUP: not one master's keys",
                           argvs[0][0]);
    }
    return commands_then(c, n_cmd, argcs, argvs, NULL, out, a, argv2, block_ms, err);
}

int rconn_collect(struct rconn *c, int wait_ms, struct rconn_reply **out, bool *came,
                  struct rl_err *err)
{
    *out = NULL;
    *came = false;
    redisReply *r = NULL;
    int rc = collect_raw(c, wait_ms, c->out_what, &r, err);
    if (rc || !r)
        return rc;
    *came = true;
    return own_reply(r, c->out_what, out, err);
}

int rconn_xack(struct rconn *c, const char *key, const char *group, int n_ids,
               const char *const *ids, long long *n_acked, struct rl_err *err)
{
    if (n_ids < 1)
        return rl_errf(err, RL_EINVAL, "XACK %s: no IDs", key);
    const char **argv = malloc(sizeof *argv * (size_t)(3 + n_ids));
    if (!argv)
        return rl_errf(err, RL_ENOMEM, "XACK: out of memory");
    argv[0] = "XACK", argv[1] = key, argv[2] = group;
    memcpy(argv + 3, ids, sizeof *argv * (size_t)n_ids);
    struct rconn_reply *r = NULL;
    int rc = run(c, 3 + n_ids, argv, NULL, &r, err);
    free(argv);
    if (!rc && n_acked)
        *n_acked = r->integer;
    rconn_reply_free(r);
    return rc;
}

int rconn_xadd(struct rconn *c, const char *key, const char *id, long maxlen, int n_fields,
               const char *const *names, const char *const *values, const size_t *value_lens,
               char out_id[RCONN_ID_MAX], bool *duplicate, struct rl_err *err)
{
    if (duplicate)
        *duplicate = false;
    struct rconn_batch b = {0};
    int rc = rconn_batch_add_xadd(&b, key, id, maxlen, n_fields, names, values, value_lens, err);
    if (!rc)
        rc = rconn_batch_exec(c, &b, err);
    if (!rc) {
        const struct rconn_reply *r = &b.replies[0];
        if (rconn_reply_is_stale_id(r) && duplicate) {
            *duplicate = true;
        } else if (r->type == RCONN_ERROR) {
            rc = rl_errf(err, transient_error(r->str) ? RL_EIO : RL_EINVAL, "XADD %s: %s", key, r->str);
        } else if (out_id && copy_id(out_id, r)) {
            rc = rl_errf(err, RL_EFORMAT, "XADD %s: reply is not an ID", key);
        }
    }
    rconn_batch_reset(&b);
    free(b.cmd);
    free(b.cmd_len);
    free(b.replies);
    free(b.slot);
    free(b.done);
    free(b.node);
    return rc;
}

int rconn_xautoclaim(struct rconn *c, const char *key, const char *group, const char *consumer,
                     int64_t min_idle_ms, const char *start, int count, struct rconn_entries *out,
                     char next[RCONN_ID_MAX], struct rconn_ids *deleted, struct rl_err *err)
{
    out->n = 0;
    out->v = NULL;
    if (deleted)
        deleted->n = 0, deleted->v = NULL;
    char idle[24], cnt[16];
    snprintf(idle, sizeof idle, "%lld", (long long)min_idle_ms);
    snprintf(cnt, sizeof cnt, "%d", count > 0 ? count : 100);
    const char *argv[] = {"XAUTOCLAIM", key, group, consumer, idle, start ? start : "0-0",
                          "COUNT", cnt};
    struct rconn_reply *r = NULL;
    int rc = run(c, 8, argv, NULL, &r, err);
    if (rc)
        goto done;
    /* [cursor, entries] in 6.2, [cursor, entries, deleted IDs] from 7.0 */
    if (r->type != RCONN_ARRAY || r->n_elem < 2 || copy_id(next, &r->elem[0])) {
        rc = rl_errf(err, RL_EFORMAT, "XAUTOCLAIM %s: malformed reply", key);
        goto done;
    }
    if ((rc = take_entries(&r->elem[1], 0, out, "XAUTOCLAIM", err)))
        goto done;
    if (deleted && r->n_elem >= 3)
        rc = take_ids(&r->elem[2], deleted, "XAUTOCLAIM", err);
done:
    rconn_reply_free(r);
    if (rc)
        rconn_entries_free(out);
    return rc;
}

int rconn_xclaim_justid(struct rconn *c, const char *key, const char *group,
                        const char *consumer, int64_t min_idle_ms, int n_ids,
                        const char *const *ids, struct rconn_ids *claimed, struct rl_err *err)
{
    claimed->n = 0;
    claimed->v = NULL;
    if (n_ids < 1)
        return rl_errf(err, RL_EINVAL, "XCLAIM %s: no IDs", key);
    const char **argv = malloc(sizeof *argv * (size_t)(6 + n_ids));
    if (!argv)
        return rl_errf(err, RL_ENOMEM, "XCLAIM: out of memory");
    char idle[24];
    snprintf(idle, sizeof idle, "%lld", (long long)min_idle_ms);
    argv[0] = "XCLAIM", argv[1] = key, argv[2] = group, argv[3] = consumer, argv[4] = idle;
    memcpy(argv + 5, ids, sizeof *argv * (size_t)n_ids);
    argv[5 + n_ids] = "JUSTID";
    struct rconn_reply *r = NULL;
    int rc = run(c, 6 + n_ids, argv, NULL, &r, err);
    free(argv);
    if (!rc)
        rc = take_ids(r, claimed, "XCLAIM", err);
    rconn_reply_free(r);
    return rc;
}

int rconn_xrange(struct rconn *c, const char *key, const char *start, const char *end, int count,
                 struct rconn_entries *out, struct rl_err *err)
{
    out->n = 0;
    out->v = NULL;
    char cnt[16];
    snprintf(cnt, sizeof cnt, "%d", count);
    const char *argv[] = {"XRANGE", key, start ? start : "-", end ? end : "+", "COUNT", cnt};
    struct rconn_reply *r = NULL;
    int rc = run(c, count > 0 ? 6 : 4, argv, NULL, &r, err);
    if (!rc)
        rc = take_entries(r, 0, out, "XRANGE", err);
    rconn_reply_free(r);
    if (rc)
        rconn_entries_free(out);
    return rc;
}

int rconn_xpending(struct rconn *c, const char *key, const char *group, int64_t min_idle_ms,
                   const char *start, const char *end, int count, const char *consumer,
                   struct rconn_pending **out, int *n_out, struct rl_err *err)
{
    *out = NULL;
    *n_out = 0;
    const char *argv[10];
    char idle[24], cnt[16];
    int a = 0;
    argv[a++] = "XPENDING", argv[a++] = key, argv[a++] = group;
    if (min_idle_ms > 0) {
        snprintf(idle, sizeof idle, "%lld", (long long)min_idle_ms);
        argv[a++] = "IDLE", argv[a++] = idle;
    }
    snprintf(cnt, sizeof cnt, "%d", count > 0 ? count : 100);
    argv[a++] = start ? start : "-", argv[a++] = end ? end : "+", argv[a++] = cnt;
    if (consumer)
        argv[a++] = consumer;
    struct rconn_reply *r = NULL;
    int rc = run(c, a, argv, NULL, &r, err);
    if (rc)
        goto done;
    if (r->type != RCONN_ARRAY) {
        rc = rl_errf(err, RL_EFORMAT, "XPENDING %s: reply is not an array", key);
        goto done;
    }
    if (!r->n_elem)
        goto done;
    *out = calloc(r->n_elem, sizeof **out);
    if (!*out) {
        rc = rl_errf(err, RL_ENOMEM, "XPENDING: out of memory");
        goto done;
    }
    for (size_t i = 0; i < r->n_elem; i++) {
        const struct rconn_reply *e = &r->elem[i];
        struct rconn_pending *p = &(*out)[i];
        if (e->type != RCONN_ARRAY || e->n_elem != 4 || copy_id(p->id, &e->elem[0]) ||
            e->elem[1].type != RCONN_STRING || e->elem[1].len >= RCONN_NAME_MAX ||
            e->elem[2].type != RCONN_INTEGER || e->elem[3].type != RCONN_INTEGER) {
            rc = rl_errf(err, RL_EFORMAT, "XPENDING %s: malformed entry", key);
            goto done;
        }
        memcpy(p->consumer, e->elem[1].str, e->elem[1].len + 1);
        p->idle_ms = e->elem[2].integer;
        p->deliveries = e->elem[3].integer;
    }
    *n_out = (int)r->n_elem;
done:
    if (rc) {
        free(*out);
        *out = NULL;
        *n_out = 0;
    }
    rconn_reply_free(r);
    return rc;
}

int rconn_expire(struct rconn *c, const char *key, int64_t seconds, bool *set, struct rl_err *err)
{
    char s[24];
    snprintf(s, sizeof s, "%lld", (long long)seconds);
    const char *argv[] = {"EXPIRE", key, s};
    struct rconn_reply *r = NULL;
    int rc = run(c, 3, argv, NULL, &r, err);
    if (!rc && set)
        *set = r->integer == 1;
    rconn_reply_free(r);
    return rc;
}

int rconn_publish(struct rconn *c, const char *channel, const char *msg, size_t len,
                  long long *n_receivers, struct rl_err *err)
{
    const char *argv[] = {"PUBLISH", channel, msg};
    size_t lens[] = {7, strlen(channel), len};
    struct rconn_reply *r = NULL;
    int rc = run(c, 3, argv, lens, &r, err);
    if (!rc && n_receivers)
        *n_receivers = r->integer;
    rconn_reply_free(r);
    return rc;
}

int rconn_exists(struct rconn *c, const char *key, bool *exists, struct rl_err *err)
{
    const char *argv[] = {"EXISTS", key};
    struct rconn_reply *r = NULL;
    int rc = run(c, 2, argv, NULL, &r, err);
    if (!rc)
        *exists = r->integer > 0;
    rconn_reply_free(r);
    return rc;
}
