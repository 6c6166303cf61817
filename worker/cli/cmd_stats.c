/* worker/cli/cmd_stats.c - `redlm stats` (one snapshot of the system, as a
 * table or --json) and `redlm top` (the same, redrawn every second).
 *
 * Everything comes from Redis, so the command needs no access to the
 * machines it describes:
 *   workers      <prefix>worker:* heartbeats (SET EX by each worker): pools,
 *                running/waiting sequences, KV blocks, tokens/s and counters
 *   dispatchers  <prefix>dispatcher:* heartbeats, the same way
 *   pools        every pool a worker serves plus every <prefix>jobs:* stream:
 *                XLEN, and from XINFO GROUPS of group `workers` the entries
 *                not yet delivered (lag: "waiting") and delivered but not
 *                acknowledged ("pending"); the oldest waiting entry's age
 *                comes from its stream ID, which is Redis's clock at XADD
 *   requests     <prefix>requests, group `dispatchers`, the same way
 *   dead         XLEN <prefix>dead and the newest dead letter
 * Ages are measured against Redis's TIME, the clock the stream IDs use, so
 * a client with a skewed clock still reads them right.
 *
 * The snapshot is built as one JSON object (what --json prints); the table
 * and top's screen are rendered from that object, so the three never
 * disagree. A heartbeat is only as fresh as its interval: counters lag
 * the work by up to one heartbeat, and `age_ms` says by how much.
 *
 * top puts the terminal in non-canonical mode without echo and switches to
 * the alternate screen; every way out (q, Ctrl-C, SIGTERM, an error)
 * passes through one restore. The signal handlers only set a flag (the
 * file's one global). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli_redis.h"
#include "cli_util.h"
#include "cmds.h"
#include "text.h"

#define MAX_KEYS 4096 /* heartbeats / pool streams listed at most */

static volatile sig_atomic_t g_quit;

static void on_quit(int sig)
{
    (void)sig;
    g_quit = 1;
}

/* ---- collecting ---- */

struct keys {
    int n;
    char **v; /* (n) malloc'd */
};

static void keys_free(struct keys *k)
{
    for (int i = 0; i < k->n; i++)
        free(k->v[i]);
    free(k->v);
    k->n = 0;
    k->v = NULL;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int keys_add(struct keys *k, const char *s)
{
    for (int i = 0; i < k->n; i++)
        if (!strcmp(k->v[i], s))
            return 0;
    if (k->n >= MAX_KEYS)
        return 0;
    char **g = realloc(k->v, (size_t)(k->n + 1) * sizeof *g);
    if (!g)
        return -1;
    k->v = g;
    if (!(k->v[k->n] = strdup(s)))
        return -1;
    k->n++;
    return 0;
}

/* SCAN ... MATCH pattern [TYPE type]: every key, sorted. */
static int scan_keys(struct rconn *c, const char *pattern, const char *type, struct keys *out,
                     struct rl_err *err)
{
    memset(out, 0, sizeof *out);
    /* a cluster's keys are spread over its masters: SCAN each */
    for (int m = 0; m < rconn_n_masters(c); m++) {
        char cursor[32] = "0";
        do {
            const char *argv[] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000", "TYPE", type};
            struct rconn_reply *r = NULL;
            int rc = rconn_command_on(c, m, type ? 8 : 6, argv, NULL, &r, err);
            if (rc) {
                rconn_reply_free(r);
                keys_free(out);
                return rc;
            }
            if (r->type != RCONN_ARRAY || r->n_elem != 2 || r->elem[0].type != RCONN_STRING ||
                r->elem[1].type != RCONN_ARRAY) {
                rconn_reply_free(r);
                keys_free(out);
                return rl_errf(err, RL_EFORMAT, "SCAN: unexpected reply");
            }
            snprintf(cursor, sizeof cursor, "%s", r->elem[0].str);
            for (size_t i = 0; i < r->elem[1].n_elem; i++)
                if (r->elem[1].elem[i].type == RCONN_STRING && keys_add(out, r->elem[1].elem[i].str)) {
                    rconn_reply_free(r);
                    keys_free(out);
                    return rl_errf(err, RL_ENOMEM, "out of memory");
                }
            rconn_reply_free(r);
        } while (strcmp(cursor, "0") && out->n < MAX_KEYS);
    }
    if (out->n)
        qsort(out->v, (size_t)out->n, sizeof *out->v, cmp_str);
    return 0;
}

static int simple(struct rconn *c, int argc, const char *const *argv, struct rconn_reply **r,
                  struct rl_err *err)
{
    *r = NULL;
    int rc = rconn_command(c, argc, argv, NULL, r, err);
    if (rc) {
        rconn_reply_free(*r);
        *r = NULL;
    }
    return rc;
}

static double num(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* The heartbeats under pattern, parsed, with key and age_ms added. */
static int heartbeats(struct rconn *c, const char *pattern, int64_t now, cJSON *arr,
                      struct rl_err *err)
{
    struct keys k;
    int rc = scan_keys(c, pattern, "string", &k, err);
    if (rc || !k.n)
        return rc;
    const char **argv = malloc((size_t)(k.n + 1) * sizeof *argv);
    if (!argv) {
        keys_free(&k);
        return rl_errf(err, RL_ENOMEM, "out of memory");
    }
    argv[0] = "MGET";
    for (int i = 0; i < k.n; i++)
        argv[i + 1] = k.v[i];
    struct rconn_reply *r;
    rc = simple(c, k.n + 1, argv, &r, err);
    free(argv);
    for (size_t i = 0; !rc && r->type == RCONN_ARRAY && i < r->n_elem; i++) {
        if (r->elem[i].type != RCONN_STRING)
            continue; /* expired between SCAN and MGET */
        cJSON *o = cJSON_ParseWithLength(r->elem[i].str, r->elem[i].len);
        if (!cJSON_IsObject(o)) { /* not ours to judge: shown as unreadable */
            cJSON_Delete(o);
            o = cJSON_CreateObject();
            cJSON_AddBoolToObject(o, "unreadable", 1);
        }
        cJSON_DeleteItemFromObjectCaseSensitive(o, "key");
        cJSON_AddStringToObject(o, "key", k.v[i]);
        if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "time_ms"))) {
            cJSON_DeleteItemFromObjectCaseSensitive(o, "age_ms");
            cJSON_AddNumberToObject(o, "age_ms", (double)(now - (int64_t)num(o, "time_ms")));
        }
        cJSON_AddItemToArray(arr, o);
    }
    rconn_reply_free(r);
    keys_free(&k);
    return rc;
}

/* Length, waiting, pending and ages of one stream for consumer group
 * `group`, as a JSON object. */
static int stream_stats(struct rconn *c, const char *key, const char *group, int64_t now,
                        cJSON *o, struct rl_err *err)
{
    struct rconn_reply *r;
    const char *xlen[] = {"XLEN", key};
    int rc = simple(c, 2, xlen, &r, err);
    if (rc)
        return rc;
    long long length = r->integer;
    rconn_reply_free(r);
    cJSON_AddNumberToObject(o, "length", (double)length);

    bool has_group = false, has_lag = false;
    long long pending = 0, consumers = 0, lag = 0;
    char last[RCONN_ID_MAX] = "0-0";
    const char *xinfo[] = {"XINFO", "GROUPS", key};
    {
        struct rl_err e2;
        /* a missing stream is an error reply (no such key): no group then */
        if (!simple(c, 3, xinfo, &r, &e2)) {
            for (size_t g = 0; r->type == RCONN_ARRAY && g < r->n_elem; g++) {
                const struct rconn_reply *gr = &r->elem[g];
                bool mine = false;
                for (size_t k = 0; gr->type == RCONN_ARRAY && k + 1 < gr->n_elem; k += 2)
                    if (gr->elem[k].type == RCONN_STRING && !strcmp(gr->elem[k].str, "name") &&
                        gr->elem[k + 1].type == RCONN_STRING && !strcmp(gr->elem[k + 1].str, group))
                        mine = true;
                if (!mine)
                    continue;
                has_group = true;
                for (size_t k = 0; k + 1 < gr->n_elem; k += 2) {
                    const char *f = gr->elem[k].str;
                    const struct rconn_reply *v = &gr->elem[k + 1];
                    if (!f)
                        continue;
                    if (!strcmp(f, "pending") && v->type == RCONN_INTEGER)
                        pending = v->integer;
                    else if (!strcmp(f, "consumers") && v->type == RCONN_INTEGER)
                        consumers = v->integer;
                    else if (!strcmp(f, "lag") && v->type == RCONN_INTEGER)
                        has_lag = true, lag = v->integer;
                    else if (!strcmp(f, "last-delivered-id") && v->type == RCONN_STRING)
                        snprintf(last, sizeof last, "%s", v->str);
                }
            }
            rconn_reply_free(r);
        }
    }
    /* the oldest entry not yet delivered to the group */
    char after[RCONN_ID_MAX + 1];
    snprintf(after, sizeof after, "(%s", last);
    const char *xr[] = {"XRANGE", key, has_group ? after : "-", "+", "COUNT", "1"};
    long long waiting = has_group ? lag : length;
    int64_t oldest_wait = 0;
    if ((rc = simple(c, 6, xr, &r, err)))
        return rc;
    if (r->type == RCONN_ARRAY && r->n_elem && r->elem[0].type == RCONN_ARRAY &&
        r->elem[0].n_elem && r->elem[0].elem[0].type == RCONN_STRING)
        oldest_wait = now - rconn_id_ms(r->elem[0].elem[0].str);
    else
        waiting = 0;
    rconn_reply_free(r);
    if (has_group && !has_lag && oldest_wait) {
        /* lag is unknown after XDEL: count what is left after last (bounded) */
        const char *xc[] = {"XRANGE", key, after, "+", "COUNT", "100000"};
        if ((rc = simple(c, 6, xc, &r, err)))
            return rc;
        waiting = r->type == RCONN_ARRAY ? (long long)r->n_elem : 0;
        rconn_reply_free(r);
    }
    int64_t oldest_pending = 0;
    if (has_group && pending > 0) {
        const char *xp[] = {"XPENDING", key, group};
        if ((rc = simple(c, 3, xp, &r, err)))
            return rc;
        if (r->type == RCONN_ARRAY && r->n_elem >= 2 && r->elem[1].type == RCONN_STRING)
            oldest_pending = now - rconn_id_ms(r->elem[1].str);
        rconn_reply_free(r);
    }
    cJSON_AddBoolToObject(o, "group", has_group);
    cJSON_AddNumberToObject(o, "waiting", (double)waiting);
    cJSON_AddNumberToObject(o, "oldest_wait_ms", (double)(oldest_wait > 0 ? oldest_wait : 0));
    cJSON_AddNumberToObject(o, "pending", (double)pending);
    cJSON_AddNumberToObject(o, "oldest_pending_ms",
                            (double)(oldest_pending > 0 ? oldest_pending : 0));
    cJSON_AddNumberToObject(o, "consumers", (double)consumers);
    return 0;
}

/* Whether key is a pool shard of prefix on a cluster (issue 27,
 * rcl_shard_key): "{<prefix><s>.<n>}jobs:<name>". Returns the "jobs:..."
 * rest, or NULL. */
static const char *shard_rest(const char *key, const char *prefix)
{
    size_t pl = strlen(prefix);
    if (key[0] != '{' || strncmp(key + 1, prefix, pl))
        return NULL;
    const char *t = key + 1 + pl, *q = t;
    while (*q >= '0' && *q <= '9')
        q++;
    if (q == t || *q++ != '.')
        return NULL;
    const char *r = q;
    while (*q >= '0' && *q <= '9')
        q++;
    if (q == r || *q != '}' || strncmp(q + 1, "jobs:", 5))
        return NULL;
    return q + 1;
}

/* Adds a shard's stream_stats (sh) into its pool's (o): counts summed,
 * ages and consumers the largest. */
static void add_shard(cJSON *o, const cJSON *sh)
{
    static const char *const sum[] = {"length", "waiting", "pending"};
    static const char *const max[] = {"oldest_wait_ms", "oldest_pending_ms", "consumers"};
    for (size_t i = 0; i < 3; i++) {
        cJSON *a = cJSON_GetObjectItemCaseSensitive(o, sum[i]);
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(sh, sum[i]);
        if (cJSON_IsNumber(a) && cJSON_IsNumber(b))
            cJSON_SetNumberValue(a, a->valuedouble + b->valuedouble);
        a = cJSON_GetObjectItemCaseSensitive(o, max[i]);
        b = cJSON_GetObjectItemCaseSensitive(sh, max[i]);
        if (cJSON_IsNumber(a) && cJSON_IsNumber(b) && b->valuedouble > a->valuedouble)
            cJSON_SetNumberValue(a, b->valuedouble);
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sh, "group")))
        cJSON_ReplaceItemInObjectCaseSensitive(o, "group", cJSON_CreateTrue());
}

static double ratio(double a, double b)
{
    return a + b > 0 ? a / (a + b) : -1;
}

/* The pool name of pool as worker w reads it: "<model>:<pool>" when its
 * heartbeat says pool_scope "model" (schemas/README.md), else pool. */
static const char *worker_pool(const cJSON *w, const char *pool, char *buf, size_t size)
{
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(w, "pool_scope");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(w, "model");
    if (!cJSON_IsString(sc) || strcmp(sc->valuestring, "model") || !cJSON_IsString(m))
        return pool;
    snprintf(buf, size, "%s:%s", m->valuestring, pool);
    return buf;
}

/* Builds the key <prefix><a><b> into key and records it as o's "key". */
static int add_key(cJSON *o, char key[CLI_KEY_MAX], const char *prefix, const char *a,
                   const char *b, struct rl_err *err)
{
    int rc = cli_key(key, prefix, a, b, err);
    if (!rc)
        cJSON_AddStringToObject(o, "key", key);
    return rc;
}

/* The whole snapshot (see the essay). *out is the caller's (cJSON_Delete). */
static int collect(struct rconn *c, const char *prefix, const char *addr, cJSON **out,
                   struct rl_err *err)
{
    *out = NULL;
    struct rconn_reply *r;
    const char *tm[] = {"TIME"};
    int rc = simple(c, 1, tm, &r, err);
    if (rc)
        return rc;
    int64_t now = 0;
    if (r->type == RCONN_ARRAY && r->n_elem == 2 && r->elem[0].str && r->elem[1].str)
        now = strtoll(r->elem[0].str, NULL, 10) * 1000 + strtoll(r->elem[1].str, NULL, 10) / 1000;
    rconn_reply_free(r);

    cJSON *o = cJSON_CreateObject();
    if (!o)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    cJSON_AddStringToObject(o, "redis", addr);
    cJSON_AddStringToObject(o, "prefix", prefix);
    cJSON_AddNumberToObject(o, "time_ms", (double)now);
    cJSON *workers = cJSON_AddArrayToObject(o, "workers");
    cJSON *disps = cJSON_AddArrayToObject(o, "dispatchers");
    cJSON *pools = cJSON_AddArrayToObject(o, "pools");
    char pat[CLI_KEY_MAX], key[CLI_KEY_MAX];
    struct keys names = {0}, streams = {0}, shard_keys = {0};
    if ((rc = cli_key(pat, prefix, "worker:*", NULL, err)) ||
        (rc = heartbeats(c, pat, now, workers, err)) ||
        (rc = cli_key(pat, prefix, "dispatcher:*", NULL, err)) ||
        (rc = heartbeats(c, pat, now, disps, err)))
        goto fail;

    /* pools: what workers serve, what dispatchers routed to, what exists.
     * A worker with pool_scope "model" reads jobs:<model>:<pool>, so its
     * pools are named "<model>:<pool>" (as the stream keys and the
     * dispatcher's metrics name them) */
    const cJSON *w;
    char pname[512];
    cJSON_ArrayForEach(w, workers) {
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(w, "pools"))
            if (cJSON_IsString(p) && keys_add(&names, worker_pool(w, p->valuestring, pname,
                                                                  sizeof pname)))
                goto oom;
    }
    cJSON_ArrayForEach(w, disps) {
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(w, "routed"))
            if (p->string && keys_add(&names, p->string))
                goto oom;
    }
    /* the queue keys: {<prefix>}... in a cluster (rcl_queue_key) */
    char qp[CLI_KEY_MAX];
    snprintf(qp, sizeof qp, rconn_is_cluster(c) ? "{%.200s}" : "%.200s", prefix);
    if ((rc = cli_key(pat, qp, "jobs:*", NULL, err)) ||
        (rc = scan_keys(c, pat, "stream", &streams, err)))
        goto fail;
    size_t plen = strlen(qp) + 5;
    for (int i = 0; i < streams.n; i++)
        if (strlen(streams.v[i]) > plen && !strstr(streams.v[i] + plen, ":w:") &&
            keys_add(&names, streams.v[i] + plen)) /* not a worker's offer stream (issue 27) */
            goto oom;
    /* a cluster's pool shards (issue 27): counted into their pools */
    if (rconn_is_cluster(c)) {
        char sp[CLI_KEY_MAX];
        snprintf(sp, sizeof sp, "{%.200s*}jobs:*", prefix);
        if ((rc = scan_keys(c, sp, "stream", &shard_keys, err)))
            goto fail;
    }
    if (names.n)
        qsort(names.v, (size_t)names.n, sizeof *names.v, cmp_str);
    for (int i = 0; i < names.n; i++) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddItemToArray(pools, p);
        cJSON_AddStringToObject(p, "name", names.v[i]);
        if ((rc = add_key(p, key, qp, "jobs:", names.v[i], err)))
            goto fail;
        int n_workers = 0;
        cJSON_ArrayForEach(w, workers) {
            const cJSON *q;
            cJSON_ArrayForEach(q, cJSON_GetObjectItemCaseSensitive(w, "pools"))
                n_workers += cJSON_IsString(q) &&
                             !strcmp(worker_pool(w, q->valuestring, pname, sizeof pname),
                                     names.v[i]);
        }
        cJSON_AddNumberToObject(p, "workers", n_workers);
        if ((rc = stream_stats(c, key, "workers", now, p, err)))
            goto fail;
        int n_shards = 1;
        for (int k = 0; k < shard_keys.n; k++) {
            const char *rest = shard_rest(shard_keys.v[k], prefix);
            if (!rest || strcmp(rest + 5, names.v[i]))
                continue;
            cJSON *sh = cJSON_CreateObject();
            if (!sh)
                goto oom;
            rc = stream_stats(c, shard_keys.v[k], "workers", now, sh, err);
            if (!rc)
                add_shard(p, sh);
            cJSON_Delete(sh);
            if (rc)
                goto fail;
            n_shards++;
        }
        cJSON_AddNumberToObject(p, "shards", n_shards);
    }
    keys_free(&shard_keys);

    cJSON *req = cJSON_AddObjectToObject(o, "requests");
    if ((rc = add_key(req, key, qp, "requests", NULL, err)))
        goto fail;
    if ((rc = stream_stats(c, key, "dispatchers", now, req, err)))
        goto fail;

    cJSON *dead = cJSON_AddObjectToObject(o, "dead");
    if ((rc = add_key(dead, key, qp, "dead", NULL, err)))
        goto fail;
    const char *xl[] = {"XLEN", key};
    if ((rc = simple(c, 2, xl, &r, err)))
        goto fail;
    cJSON_AddNumberToObject(dead, "count", (double)r->integer);
    rconn_reply_free(r);
    const char *xr[] = {"XREVRANGE", key, "+", "-", "COUNT", "1"};
    if ((rc = simple(c, 6, xr, &r, err)))
        goto fail;
    if (r->type == RCONN_ARRAY && r->n_elem && r->elem[0].type == RCONN_ARRAY &&
        r->elem[0].n_elem == 2 && r->elem[0].elem[1].type == RCONN_ARRAY) {
        const struct rconn_reply *f = &r->elem[0].elem[1];
        for (size_t k = 0; k + 1 < f->n_elem; k += 2)
            if (f->elem[k].str && !strcmp(f->elem[k].str, "dead") && f->elem[k + 1].str) {
                cJSON *d = cJSON_Parse(f->elem[k + 1].str), *last = cJSON_CreateObject();
                const cJSON *v;
                if ((v = cJSON_GetObjectItemCaseSensitive(d, "code")) && cJSON_IsString(v))
                    cJSON_AddStringToObject(last, "code", v->valuestring);
                if ((v = cJSON_GetObjectItemCaseSensitive(d, "id")) && cJSON_IsString(v))
                    cJSON_AddStringToObject(last, "id", v->valuestring);
                if ((v = cJSON_GetObjectItemCaseSensitive(d, "pool")) && cJSON_IsString(v))
                    cJSON_AddStringToObject(last, "pool", v->valuestring);
                cJSON_AddNumberToObject(last, "age_ms",
                                        (double)(now - rconn_id_ms(r->elem[0].elem[0].str)));
                cJSON_AddItemToObject(dead, "last", last);
                cJSON_Delete(d);
            }
    }
    rconn_reply_free(r);

    /* totals over the heartbeats */
    double jobs = 0, toks = 0, tps = 0, hits = 0, misses = 0, phit = 0, pmiss = 0, running = 0;
    cJSON_ArrayForEach(w, workers) {
        jobs += num(w, "jobs_done"), toks += num(w, "tokens_out"), tps += num(w, "tokens_per_s");
        hits += num(w, "cache_hits"), misses += num(w, "cache_misses");
        phit += num(w, "prefix_hit_tokens"), pmiss += num(w, "prefix_miss_tokens");
        running += num(w, "running");
    }
    double dhits = 0, dmiss = 0;
    cJSON_ArrayForEach(w, disps) dhits += num(w, "cache_hits"), dmiss += num(w, "cache_misses");
    cJSON *t = cJSON_AddObjectToObject(o, "totals");
    cJSON_AddNumberToObject(t, "workers", cJSON_GetArraySize(workers));
    cJSON_AddNumberToObject(t, "dispatchers", cJSON_GetArraySize(disps));
    cJSON_AddNumberToObject(t, "running", running);
    cJSON_AddNumberToObject(t, "jobs_done", jobs);
    cJSON_AddNumberToObject(t, "tokens_out", toks);
    cJSON_AddNumberToObject(t, "tokens_per_s", (double)(int64_t)(tps * 10) / 10.0);
    cJSON_AddNumberToObject(t, "cache_hits", hits);
    cJSON_AddNumberToObject(t, "cache_misses", misses);
    /* -1 where nothing was looked up yet: null in JSON */
    double rr = ratio(hits, misses), pr = ratio(phit, pmiss), dr = ratio(dhits, dmiss);
    if (rr >= 0) cJSON_AddNumberToObject(t, "cache_hit_rate", rr);
    else cJSON_AddNullToObject(t, "cache_hit_rate");
    if (pr >= 0) cJSON_AddNumberToObject(t, "prefix_hit_rate", pr);
    else cJSON_AddNullToObject(t, "prefix_hit_rate");
    cJSON_AddNumberToObject(t, "dispatcher_cache_hits", dhits);
    cJSON_AddNumberToObject(t, "dispatcher_cache_misses", dmiss);
    if (dr >= 0) cJSON_AddNumberToObject(t, "dispatcher_cache_hit_rate", dr);
    else cJSON_AddNullToObject(t, "dispatcher_cache_hit_rate");
    double waiting = 0, pending = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, pools) waiting += num(p, "waiting"), pending += num(p, "pending");
    cJSON_AddNumberToObject(t, "waiting", waiting);
    cJSON_AddNumberToObject(t, "pending", pending);
    keys_free(&names);
    keys_free(&streams);
    *out = o;
    return 0;
oom:
    rc = rl_errf(err, RL_ENOMEM, "out of memory");
fail:
    keys_free(&names);
    keys_free(&streams);
    keys_free(&shard_keys);
    cJSON_Delete(o);
    return rc;
}

/* ---- rendering ---- */

/* "850ms", "12.3s", "4m05s", "2h13m", "3d04h"; "-" for 0. */
static const char *dur(char buf[24], double ms)
{
    if (ms <= 0)
        return "-";
    double s = ms / 1000;
    if (ms < 1000)
        snprintf(buf, 24, "%.0fms", ms);
    else if (s < 60)
        snprintf(buf, 24, "%.1fs", s);
    else if (s < 3600)
        snprintf(buf, 24, "%dm%02ds", (int)s / 60, (int)s % 60);
    else if (s < 86400)
        snprintf(buf, 24, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
    else
        snprintf(buf, 24, "%dd%02dh", (int)(s / 86400), (int)s % 86400 / 3600);
    return buf;
}

static const char *pct(char buf[16], const cJSON *t, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, name);
    if (!cJSON_IsNumber(v))
        return "-";
    snprintf(buf, 16, "%.0f%%", v->valuedouble * 100);
    return buf;
}

static void stream_row(struct text *t, const char *name, const cJSON *p)
{
    char a[24], b[24];
    text_printf(t, "%-16s %8.0f %8.0f %10s %8.0f %10s %9.0f\n", name, num(p, "length"), num(p, "waiting"),
        dur(a, num(p, "oldest_wait_ms")), num(p, "pending"), dur(b, num(p, "oldest_pending_ms")),
        num(p, "consumers"));
}

/* The table. bold: ANSI bold section titles (a terminal). */
static void render(struct text *t, const cJSON *s, bool bold)
{
    const char *B = bold ? "\033[1m" : "", *N = bold ? "\033[0m" : "";
    const cJSON *tot = cJSON_GetObjectItemCaseSensitive(s, "totals");
    char d1[24], d2[24], p1[16], p2[16], p3[16];
    time_t now = (time_t)(num(s, "time_ms") / 1000);
    struct tm tmv;
    char when[32];
    gmtime_r(&now, &tmv);
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tmv);
    const cJSON *ra = cJSON_GetObjectItemCaseSensitive(s, "redis");
    const cJSON *pf = cJSON_GetObjectItemCaseSensitive(s, "prefix");
    text_printf(t, "%sredlm%s  redis %s  prefix %s  %s\n", B, N, cJSON_IsString(ra) ? ra->valuestring : "",
        cJSON_IsString(pf) ? pf->valuestring : "", when);
    text_printf(t, "tokens/s %.1f   jobs done %.0f   tokens out %.0f   running %.0f   waiting %.0f   "
           "pending %.0f\n",
        num(tot, "tokens_per_s"), num(tot, "jobs_done"), num(tot, "tokens_out"), num(tot, "running"),
        num(tot, "waiting"), num(tot, "pending"));
    text_printf(t, "result cache %.0f hits / %.0f misses (%s)   prefix cache %s   dispatcher cache %s\n\n",
        num(tot, "cache_hits"), num(tot, "cache_misses"), pct(p1, tot, "cache_hit_rate"),
        pct(p2, tot, "prefix_hit_rate"), pct(p3, tot, "dispatcher_cache_hit_rate"));

    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(s, "workers");
    text_printf(t, "%sWORKERS %d%s\n", B, cJSON_GetArraySize(ws), N);
    if (cJSON_GetArraySize(ws))
        text_printf(t, "%-16s %-14s %4s %5s %5s %5s %13s %8s %8s %9s %7s %7s\n", "name", "pools", "run",
            "wait", "comp", "held", "kv free/total", "tok/s", "done", "tokens", "uptime", "seen");
    const cJSON *w;
    cJSON_ArrayForEach(w, ws) {
        char pools[64] = "", kv[32];
        const cJSON *p, *nm = cJSON_GetObjectItemCaseSensitive(w, "name");
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(w, "pools"))
            if (cJSON_IsString(p) && strlen(pools) + strlen(p->valuestring) + 2 < sizeof pools)
                strcat(strcat(pools, pools[0] ? "," : ""), p->valuestring);
        snprintf(kv, sizeof kv, "%.0f/%.0f", num(w, "kv_free_blocks"), num(w, "kv_blocks"));
        text_printf(t, "%-16.16s %-14.14s %4.0f %5.0f %5.0f %5.0f %13s %8.1f %8.0f %9.0f %7s %7s\n",
            cJSON_IsString(nm) ? nm->valuestring : "?", pools, num(w, "running"), num(w, "waiting"),
            num(w, "compiling"), num(w, "held"), kv, num(w, "tokens_per_s"), num(w, "jobs_done"), num(w, "tokens_out"),
            dur(d1, num(w, "uptime_s") * 1000), dur(d2, num(w, "age_ms")));
    }
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(s, "dispatchers");
    text_printf(t, "\n%sDISPATCHERS %d%s\n", B, cJSON_GetArraySize(ds), N);
    if (cJSON_GetArraySize(ds))
        text_printf(t, "%-16s %8s %9s %8s %11s %8s %7s %7s\n", "name", "req/s", "routed", "invalid",
            "overloaded", "think", "uptime", "seen");
    cJSON_ArrayForEach(w, ds) {
        double routed = 0;
        const cJSON *p, *nm = cJSON_GetObjectItemCaseSensitive(w, "name");
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(w, "routed"))
            routed += cJSON_IsNumber(p) ? p->valuedouble : 0;
        text_printf(t, "%-16.16s %8.1f %9.0f %8.0f %11.0f %8.2f %7s %7s\n",
            cJSON_IsString(nm) ? nm->valuestring : "?", num(w, "requests_per_s"), routed,
            num(w, "invalid"), num(w, "overloaded"), num(w, "think_ratio_effective"),
            dur(d1, num(w, "uptime_s") * 1000), dur(d2, num(w, "age_ms")));
    }
    text_printf(t, "\n%sSTREAMS%s\n%-16s %8s %8s %10s %8s %10s %9s\n", B, N, "stream", "length", "waiting",
        "oldest", "pending", "oldest pnd", "consumers");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "requests");
    if (num(req, "length") > 0 || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(req, "group")))
        stream_row(t, "requests", req);
    cJSON_ArrayForEach(w, cJSON_GetObjectItemCaseSensitive(s, "pools")) {
        char name[80];
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(w, "name");
        snprintf(name, sizeof name, "jobs:%s", cJSON_IsString(nm) ? nm->valuestring : "?");
        stream_row(t, name, w);
    }
    const cJSON *dead = cJSON_GetObjectItemCaseSensitive(s, "dead");
    const cJSON *last = cJSON_GetObjectItemCaseSensitive(dead, "last");
    text_printf(t, "\n%sDEAD LETTERS %.0f%s", B, num(dead, "count"), N);
    if (last) {
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(last, "code");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(last, "id");
        text_printf(t, "   last: %s%s%s, %s ago", cJSON_IsString(code) ? code->valuestring : "?",
            cJSON_IsString(id) && id->valuestring[0] ? " job " : "",
            cJSON_IsString(id) ? id->valuestring : "", dur(d1, num(last, "age_ms")));
    }
    text_printf(t, "\n");
}

/* ---- the commands ---- */

struct stats_args {
    struct cli_redis_args ra;
    bool json;
    int interval_ms;
    int iterations; /* top: 0 = until q */
};

static int stats_parse(int argc, char **argv, struct stats_args *a, bool top, struct rl_err *err)
{
    memset(a, 0, sizeof *a);
    cli_redis_args_default(&a->ra);
    a->interval_ms = 1000;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int took = cli_redis_flag(&a->ra, argc, argv, &i, err);
        long x;
        int rc = 0;
        if (took < 0)
            return took;
        if (took)
            continue;
        if (!top && !strcmp(f, "--json"))
            a->json = true;
        else if (top && !strcmp(f, "--interval") && i + 1 < argc) {
            if (!(rc = cli_parse_int(argv[++i], 100, 3600000, &x, f, err)))
                a->interval_ms = (int)x;
        } else if (top && (!strcmp(f, "-n") || !strcmp(f, "--iterations")) && i + 1 < argc) {
            if (!(rc = cli_parse_int(argv[++i], 1, 1 << 30, &x, f, err)))
                a->iterations = (int)x;
        } else if (!strcmp(f, "-h") || !strcmp(f, "--help"))
            return 1;
        else
            rc = rl_errf(err, RL_EINVAL, "unknown option %s (or it needs a value)", f);
        if (rc)
            return rc;
    }
    return 0;
}

/* stats_parse for redlm stats (top false) or redlm top; on a bad command
 * line or --help says why and the usage, and returns the exit status (2 or
 * 0); -1 when the command goes on. */
static int stats_args_get(int argc, char **argv, struct stats_args *a, bool top)
{
    struct rl_err err = {0};
    int rc = stats_parse(argc, argv, a, top, &err);
    if (!rc)
        return -1;
    if (rc < 0)
        fprintf(stderr, "redlm %s: %s\n", top ? "top" : "stats", err.msg);
    if (top)
        fprintf(stderr, "usage: redlm top [--interval MS] [-n ITERATIONS]\n"
                        "redlm stats, redrawn every second; q or Ctrl-C quits.\n%s",
                cli_redis_help);
    else
        fprintf(stderr, "usage: redlm stats [--json]\n"
                        "Workers, dispatchers, streams and dead letters, from Redis.\n%s",
                cli_redis_help);
    return rc > 0 ? 0 : 2;
}

int cmd_stats(int argc, char **argv)
{
    struct stats_args a;
    struct rl_err err = {0};
    int rc = stats_args_get(argc, argv, &a, false);
    if (rc >= 0)
        return rc;
    struct rconn *c;
    cJSON *s = NULL;
    if ((rc = cli_redis_connect(&c, &a.ra, "redlm-stats", &err)) ||
        (rc = collect(c, a.ra.prefix, a.ra.addr, &s, &err))) {
        fprintf(stderr, "redlm stats: %s\n", err.msg);
        rconn_free(c);
        return 1;
    }
    if (a.json) {
        char *j = cJSON_PrintUnformatted(s);
        if (j)
            printf("%s\n", j);
        free(j);
    } else {
        struct text t = {0};
        render(&t, s, isatty(STDOUT_FILENO));
        if (t.p)
            fputs(t.p, stdout);
        free(t.p);
    }
    cJSON_Delete(s);
    rconn_free(c);
    return 0;
}

/* Bytes of line (n bytes) that fill at most cols columns (0 = no limit):
 * escape sequences take none, a UTF-8 character one. */
static size_t clip(const char *line, size_t n, int cols)
{
    if (cols <= 0)
        return n;
    int w = 0;
    size_t i = 0;
    while (i < n) {
        if (line[i] == '\033' && i + 1 < n && line[i + 1] == '[') {
            i += 2;
            while (i < n && !(line[i] >= '@' && line[i] <= '~'))
                i++;
            i++;
            continue;
        }
        if (((unsigned char)line[i] & 0xC0) != 0x80 && w++ == cols)
            return i;
        i++;
    }
    return n;
}

int cmd_top(int argc, char **argv)
{
    struct stats_args a;
    struct rl_err err = {0};
    int rc = stats_args_get(argc, argv, &a, true);
    if (rc >= 0)
        return rc;
    struct rconn *c;
    if (cli_redis_open(&c, &a.ra, "top"))
        return 1;
    cli_on_signal(SIGINT, on_quit);
    cli_on_signal(SIGTERM, on_quit);
    bool in_tty = isatty(STDIN_FILENO), out_tty = isatty(STDOUT_FILENO);
    struct termios saved;
    bool raw = false;
    if (in_tty && tcgetattr(STDIN_FILENO, &saved) == 0) {
        struct termios t = saved;
        t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        t.c_cc[VMIN] = 0;
        t.c_cc[VTIME] = 0;
        raw = tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0;
    }
    if (out_tty)
        fputs("\033[?1049h\033[?25l", stdout); /* alternate screen, cursor hidden */
    int status = 0;
    for (int it = 0; !g_quit && (!a.iterations || it < a.iterations); it++) {
        cJSON *s = NULL;
        struct text t = {0};
        if (collect(c, a.ra.prefix, a.ra.addr, &s, &err) == 0)
            render(&t, s, out_tty);
        else /* Redis away: say so and keep trying, as a monitor should */
            text_printf(&t, "redlm top: %s\n(retrying every %d ms; q quits)\n", err.msg, a.interval_ms);
        cJSON_Delete(s);
        int rows = 0, cols = 0;
        if (out_tty) {
            struct winsize ws;
            if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0)
                rows = ws.ws_row, cols = ws.ws_col;
            fputs("\033[H", stdout); /* home; each line erases its rest */
        }
        int line = 0;
        for (char *p = t.p, *e; p && *p && (!rows || line < rows - 1); p = e + 1, line++) {
            e = strchr(p, '\n');
            if (!e)
                e = p + strlen(p);
            /* no wrapping: a wrapped line would push the screen down */
            fwrite(p, 1, clip(p, (size_t)(e - p), cols), stdout);
            fputs(out_tty ? "\033[0m\033[K\n" : "\n", stdout);
            if (!*e)
                break;
        }
        if (out_tty)
            fputs("\033[2m(q quits)\033[0m\033[K\033[J", stdout);
        else
            fputs("\n", stdout);
        fflush(stdout);
        free(t.p);
        /* wait out the interval, watching for q */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            int left = a.interval_ms - (int)((t1.tv_sec - t0.tv_sec) * 1000 +
                                             (t1.tv_nsec - t0.tv_nsec) / 1000000);
            if (left <= 0 || g_quit || (a.iterations && it + 1 >= a.iterations))
                break;
            struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
            int pr = in_tty ? poll(&pfd, 1, left) : poll(NULL, 0, left);
            if (pr > 0) {
                char ch;
                ssize_t n = read(STDIN_FILENO, &ch, 1);
                if (n == 1 && (ch == 'q' || ch == 'Q' || ch == 3))
                    g_quit = 1;
                if (n == 0) /* stdin closed */
                    in_tty = false;
            } else if (pr < 0 && errno != EINTR)
                break;
        }
    }
    if (out_tty)
        fputs("\033[?25h\033[?1049l", stdout);
    fflush(stdout);
    if (raw)
        tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    rconn_free(c);
    return status;
}
