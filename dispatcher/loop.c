/* dispatcher/loop.c - the routing loop: read requests, decide, answer or
 * forward, acknowledge.
 *
 * One round handles up to D_BATCH entries of <prefix>requests read with
 * XREADGROUP (group "dispatchers"). Each request first finds its model
 * (models.c: the table of what live workers serve, re-read every
 * heartbeat) and with it its pools and router; then three round trips:
 *   1. (when due, at most every STATS_MS) the pools' queue state:
 *      XINFO GROUPS (last-delivered-id and lag of group "workers") and the
 *      oldest undelivered entry, for backpressure and adaptive routing;
 *   2. GET of the result-cache key of every deterministic request (the
 *      key is the worker's own: same model identity, same rendered ids);
 *   3. one MULTI ... EXEC per request, all pipelined, each ending in the
 *      XACK of its requests entry:
 *        forward:  XADD <prefix>jobs:<pool> * job <json>, XACK
 *        cached:   XADD out:<id> 0-1 .. 0-n (the cached events, done with
 *                  cached:true and this request's timings), EXPIRE, XACK
 *        invalid:  error + done(error) on out:<id>, EXPIRE, XADD dead, XACK
 *        overload: error OVERLOADED (+ retry_after_ms) + done, EXPIRE, XACK
 * On a single instance the round's write of transactions also carries the
 * next read of new requests (pair_ok, paired_round): one read event for
 * Redis where the two cost two, each round (issue 27 point 3); the loop's
 * other work waits for that read to come back (a round at most).
 * Because the XACK is inside the transaction with what it answers, a
 * request is either fully handled or still pending: never forwarded twice,
 * never lost. A round that fails part-way (Redis gone) leaves the rest
 * pending; the loop then re-reads its own pending entries (XREADGROUP 0)
 * before new ones, and a pipelined MULTI block is never re-sent on a new
 * connection half-way (rconn_batch would re-send only the unanswered part,
 * which would run outside the transaction). Entries of a dispatcher that
 * died are taken over with XAUTOCLAIM after claim_idle_ms.
 *
 * On a Redis Cluster (schemas/README.md, "Key layout on a Redis Cluster")
 * the queue keys share one slot, so forward stays one transaction; out:{id}
 * is in its request's own slot, so the cached / invalid / overload events
 * go first, outside it (events_first), and the transaction (dead letter,
 * XACK) only once they are all confirmed: a crash between the two re-sends
 * the same events under the same explicit IDs.
 *
 * The one way to duplicate: a live dispatcher stalled longer than
 * claim_idle_ms between its read and its EXEC, whose entries another one
 * claims meanwhile. The default 30 s is far above a round's milliseconds.
 * The one way to lose: Redis runs the XACK of a transaction whose XADD
 * failed at run time (transactions do not roll back); XADD fails so only
 * on a pool key of another type, which start-up refuses already (the
 * XGROUP CREATE of the workers group fails), so that needs someone to
 * replace the key while we run; it is logged as an error naming the job.
 *
 * SIGHUP is handled here too (d_reload): main.c sets flags and calls down,
 * nothing calls back up into it.
 *
 * Main thread only; the counters go to struct dmetrics under its mutex. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "disp.h"
#include "cache.h"
#include "event.h"
#include "prompt.h"
#include "qack.h"
#include "rcluster.h"
#include "xmux.h"

#define STATS_MS 100       /* pool state is at most this old when routing */
/* An intake entry ID more than this far ahead of the clock was written
 * with an explicit ID (XADD <key> <ms>-<seq>, not *): the stream's last ID
 * is reset once it is consumed (repair_intake), since at the last possible
 * ID no XADD * could ever succeed again. */
#define D_FUTURE_MS 3600000
#define D_REPAIR_MS 1000   /* the periodic check of every intake stream */
#define GROUP_REQ "dispatchers"
#define GROUP_WORKERS "workers"

enum dact { A_ACK = 1, A_REJECT, A_OVERLOAD, A_CACHE, A_FORWARD };
#define D_SKEY_MAX (D_KEY_MAX + 40) /* a pool key with its shard's tag */
/* A forward marker lives this long at most (issue 27): longer than a
 * request can stay pending with its job forwarded (until another
 * dispatcher claims it after claim_idle_ms, or its own restarts); deleted
 * at once when the XACK is confirmed (fwd_gc). */
#define D_FWD_MARK_MIN_S 3600

/* One request of a round. */
struct dreq {
    const struct rconn_entry *e;
    int stream;                   /* index into d->intake: where e was read */
    char sha[JOB_SHA_LEN + 1];    /* job_sha256 of the job text: its identity with e->id */
    bool stamped;                 /* events[0] carries the request's identity */
    enum dact act;
    int64_t t0;                   /* ms of the requests entry ID: when it was queued */
    char id[JOB_ID_MAX + 1];      /* "" when the request has no usable id */
    struct job *job;              /* NULL when it did not parse */
    const char *raw;              /* the job field, in e */
    size_t raw_len;
    struct route_decision dec;    /* dec.pool indexes d->pools */
    struct dmodel *model;         /* where it goes; NULL: the shared pools, nothing announced */
    enum ev_code code;            /* A_REJECT */
    char msg[RL_ERR_MSG_MAX];
    bool lookup;                  /* GET cache_key in round trip 2 */
    bool lora;                    /* job.model is a LoRA adapter of model (models.c) */
    char cache_key[D_KEY_MAX];
    int get_idx;
    char **events;                /* (n_events) to XADD as 0-1 .. 0-n */
    int n_events;
    int stream_ttl_s;
    char *dead;                   /* dead letter JSON */
    char *fwd;                    /* the forwarded job JSON */
    char offer[D_KEY_MAX + RCONN_NAME_MAX + 4]; /* its worker's offer stream; "" = the pool */
    int offer_pool;               /* the pool whose offer streams it may go to: dec.pool,
                                     or for an adapter on its own stream the parent's */
    int exec_idx;                 /* index of the EXEC reply in the batch */
    /* sharded forwarding (cluster, pool_shards > 1: forward_first) */
    int fwd_idx;                  /* index of its forward script's reply; -1 none */
    bool fwd_ok;                  /* the job is in its shard (now or before) */
    char mark[D_SKEY_MAX + RCONN_ID_MAX + 8]; /* its marker key */
};

static void dreq_clear(struct dreq *q)
{
    job_free(q->job);
    for (int i = 0; i < q->n_events; i++)
        free(q->events[i]);
    free(q->events);
    free(q->dead);
    free(q->fwd);
    memset(q, 0, sizeof *q);
}

static int push_event(struct dreq *q, char *json)
{
    if (!json)
        return -RL_ENOMEM;
    char **g = realloc(q->events, (size_t)(q->n_events + 1) * sizeof *g);
    if (!g) {
        free(json);
        return -RL_ENOMEM;
    }
    q->events = g;
    q->events[q->n_events++] = json;
    return 0;
}

/* done(error) after an error event, with this request's timings. */
static char *error_done(const struct dreq *q, int64_t seq, int64_t now)
{
    struct ev_done dn = {.finish_reason = EV_FINISH_ERROR,
                         .metadata = q->job ? q->job->metadata : NULL};
    int64_t t0 = q->t0 > 0 && q->t0 <= now ? q->t0 : now;
    dn.queue_ms = now - t0;
    dn.total_ms = now - t0;
    char *s = NULL;
    ev_build_done(seq, &dn, &s, NULL);
    return s;
}

static void reject(struct disp *d, struct dreq *q, enum ev_code code, const char *msg)
{
    q->act = A_REJECT;
    q->code = code;
    snprintf(q->msg, sizeof q->msg, "%s", msg);
    int64_t now = rl_wall_ms();
    if (q->id[0]) {
        char *s = NULL;
        ev_build_error(0, code, msg, &s, NULL);
        push_event(q, s);
        push_event(q, error_done(q, 1, now));
    }
    struct ev_dead dl = {.job_raw = q->raw, .job_raw_len = q->raw_len, .job_id = q->id,
                         .pool = "requests", .entry_id = q->e->id, .code = code, .message = msg,
                         .worker = d->name, .deliveries = 0, .time_ms = now};
    ev_build_dead(&dl, &q->dead, NULL);
    RL_LOG(&d->log, RL_LOG_WARN, "job %s (request %s): dead letter %s: %s",
           q->id[0] ? q->id : "-", q->e->id, ev_code_name(code), msg);
}

static void overload(struct disp *d, struct dreq *q, const struct dpool *p)
{
    q->act = A_OVERLOAD;
    char msg[256];
    snprintf(msg, sizeof msg, "pool %s has %" PRId64 " jobs waiting for a worker (max_waiting %d)",
             p->name, p->waiting, d->cfg.max_waiting);
    char *s = NULL;
    ev_build_error_retry(0, EV_CODE_OVERLOADED, msg, d->cfg.retry_after_ms, &s, NULL);
    push_event(q, s);
    push_event(q, error_done(q, 1, rl_wall_ms()));
    RL_LOG(&d->log, RL_LOG_INFO, "job %s: OVERLOADED: %s", q->id, msg);
}

/* The cached event list (the GET value) replayed as this request's:
 * checked whole first, as the worker's w_cache_replay does; the done event
 * gets cached:true, this request's timings and its own metadata. Returns
 * 0, or -RL_EFORMAT when the value is not a complete event list. */
static int replay(struct dreq *q, const char *value, size_t len, struct rl_err *err)
{
    char **ev;
    int n;
    int rc = cache_replay_events(value, len, q->cache_key, q->t0, rl_wall_ms(), q->job->metadata,
                                 &ev, &n, err);
    if (rc)
        return rc;
    for (int i = 0; i < n && !rc; i++) {
        rc = push_event(q, ev[i]); /* takes the string, also on failure */
        ev[i] = NULL;
        if (rc)
            rl_errf(err, RL_ENOMEM, "cache: out of memory");
    }
    cache_events_free(ev, n);
    return rc;
}

/* Shard s of pool p's stream (issue 27): the pool key itself for shard 0
 * and on a single instance. */
static void shard_key(const struct disp *d, int p, int s, char buf[D_SKEY_MAX])
{
    if (s == 0 || d->n_shards <= 1 ||
        rcl_shard_key_n(buf, D_SKEY_MAX, d->pools[p].key, s, d->shard_n[s]) < 0)
        snprintf(buf, D_SKEY_MAX, "%s", d->pools[p].key);
}

/* Round trip 1: XINFO GROUPS of every pool stream (every shard of each on
 * a cluster), then the oldest undelivered entry of each (and a count when
 * Redis cannot give the lag). A pool's waiting is the sum over its shards,
 * its wait the oldest shard's. */
static void refresh_stats(struct disp *d)
{
    struct rconn_batch *b = d->batch;
    struct rl_err err;
    enum { NS = D_MAX_POOLS * RCL_MAX_SHARDS };
    static char last[NS][RCONN_ID_MAX], keys[NS][D_SKEY_MAX]; /* main thread only */
    bool has_group[NS] = {false}, lag_known[NS] = {false};
    int64_t lag[NS] = {0};
    int ns = d->n_shards > 0 ? d->n_shards : 1, n = d->n_pools * ns;
    rconn_batch_reset(b);
    for (int p = 0; p < n; p++) {
        shard_key(d, p / ns, p % ns, keys[p]);
        const char *argv[3] = {"XINFO", "GROUPS", keys[p]};
        if (rconn_batch_add(b, 3, argv, NULL, &err))
            return;
    }
    if (rconn_batch_exec(d->rc, b, &err)) {
        RL_LOG(&d->log, RL_LOG_DEBUG, "pool stats: %s", err.msg);
        return;
    }
    for (int p = 0; p < n; p++) {
        const struct rconn_reply *r = rconn_batch_reply(b, p);
        strcpy(last[p], "0-0");
        if (!r || r->type != RCONN_ARRAY)
            continue; /* no such key yet: nothing waits */
        for (size_t g = 0; g < r->n_elem; g++) {
            const struct rconn_reply *gr = &r->elem[g];
            bool ours = false;
            const char *ld = NULL;
            const struct rconn_reply *lg = NULL;
            for (size_t k = 0; gr->type == RCONN_ARRAY && k + 1 < gr->n_elem; k += 2) {
                const char *f = gr->elem[k].str ? gr->elem[k].str : "";
                const struct rconn_reply *v = &gr->elem[k + 1];
                if (!strcmp(f, "name"))
                    ours = v->str && !strcmp(v->str, GROUP_WORKERS);
                else if (!strcmp(f, "last-delivered-id"))
                    ld = v->str;
                else if (!strcmp(f, "lag"))
                    lg = v;
            }
            if (!ours)
                continue;
            has_group[p] = true;
            if (ld && strlen(ld) < RCONN_ID_MAX)
                memcpy(last[p], ld, strlen(ld) + 1);
            if (lg && lg->type == RCONN_INTEGER) {
                lag_known[p] = true;
                lag[p] = lg->integer;
            }
        }
    }
    /* the oldest undelivered entry: first one after last-delivered-id; the
     * count by XRANGE when the lag is unknown (deletions in the stream),
     * capped a little above max_waiting since only "over it" matters */
    rconn_batch_reset(b);
    int cap = d->cfg.max_waiting > 0 ? d->cfg.max_waiting + 1 : 10000;
    static char start[NS][RCONN_ID_MAX + 1];
    char capbuf[32];
    snprintf(capbuf, sizeof capbuf, "%d", cap);
    int idx_first[NS], idx_count[NS];
    for (int p = 0; p < n; p++) {
        snprintf(start[p], sizeof start[p], "(%.46s", last[p]);
        const char *s = has_group[p] ? start[p] : "-";
        const char *a1[6] = {"XRANGE", keys[p], s, "+", "COUNT", "1"};
        idx_first[p] = rconn_batch_count(b);
        if (rconn_batch_add(b, 6, a1, NULL, &err))
            return;
        idx_count[p] = -1;
        if (!lag_known[p]) {
            if (has_group[p]) {
                const char *a2[6] = {"XRANGE", keys[p], s, "+", "COUNT", capbuf};
                idx_count[p] = rconn_batch_count(b);
                if (rconn_batch_add(b, 6, a2, NULL, &err))
                    return;
            } else {
                const char *a2[2] = {"XLEN", keys[p]};
                idx_count[p] = rconn_batch_count(b);
                if (rconn_batch_add(b, 2, a2, NULL, &err))
                    return;
            }
        }
    }
    if (rconn_batch_exec(d->rc, b, &err)) {
        RL_LOG(&d->log, RL_LOG_DEBUG, "pool stats: %s", err.msg);
        return;
    }
    int64_t now = rl_wall_ms();
    for (int p = 0; p < d->n_pools; p++) {
        d->pools[p].wait_ms = 0;
        d->pools[p].waiting = 0;
    }
    for (int p = 0; p < n; p++) {
        struct dpool *pl = &d->pools[p / ns];
        const struct rconn_reply *r = rconn_batch_reply(b, idx_first[p]);
        int64_t wait_ms = 0, waiting;
        if (r && r->type == RCONN_ARRAY && r->n_elem > 0 && r->elem[0].type == RCONN_ARRAY &&
            r->elem[0].n_elem > 0 && r->elem[0].elem[0].str) {
            int64_t ms = strtoll(r->elem[0].elem[0].str, NULL, 10);
            wait_ms = now > ms ? now - ms : 0;
        }
        if (lag_known[p]) {
            waiting = lag[p];
        } else {
            const struct rconn_reply *c = rconn_batch_reply(b, idx_count[p]);
            waiting = !c ? 0 : c->type == RCONN_ARRAY ? (int64_t)c->n_elem
                             : c->type == RCONN_INTEGER ? c->integer : 0;
        }
        pl->waiting += waiting;
        if (waiting > 0 && wait_ms > pl->wait_ms)
            pl->wait_ms = wait_ms;
    }
    /* adaptive routing follows the fresh waits */
    int tp = route_think_pool(d->router), fp = route_fast_pool(d->router);
    struct route_adapt a = {
        .adaptive = d->cfg.adaptive && tp >= 0 && tp != fp, .ratio = d->cfg.think_ratio,
        .min_ratio = d->cfg.adaptive_min_ratio, .max_ratio = d->cfg.adaptive_max_ratio,
        .threshold_ms = d->cfg.adaptive_wait_ms,
        .think_wait_ms = tp >= 0 ? d->pools[tp].wait_ms : 0, .fast_wait_ms = d->pools[fp].wait_ms};
    double eff = route_effective_ratio(&a);
    if (route_ratio_ppm(eff) != route_ratio_ppm(route_get_ratio(d->router)))
        RL_LOG(&d->log, RL_LOG_INFO, "adaptive: think ratio %.3f -> %.3f (wait think %" PRId64
               " ms, fast %" PRId64 " ms)", route_get_ratio(d->router), eff, a.think_wait_ms,
               a.fast_wait_ms);
    route_set_ratio(d->router, eff);
    /* each model with its own pools follows its own waits */
    for (int i = 0; i < d->n_models; i++) {
        struct dmodel *m = &d->models[i];
        if (!m->scoped || !m->router)
            continue;
        int mt = route_think_pool(m->router), mf = route_fast_pool(m->router);
        struct route_adapt ma = a;
        ma.adaptive = d->cfg.adaptive && mt >= 0 && mt != mf;
        ma.think_wait_ms = mt >= 0 ? d->pools[m->pool_idx[mt]].wait_ms : 0;
        ma.fast_wait_ms = d->pools[m->pool_idx[mf]].wait_ms;
        route_set_ratio(m->router, route_effective_ratio(&ma));
    }
    pthread_mutex_lock(&d->m.mu);
    for (int p = 0; p < d->n_pools; p++) {
        d->m.pool_waiting[p] = d->pools[p].waiting;
        d->m.pool_wait_ms[p] = d->pools[p].wait_ms;
    }
    d->m.ratio = d->cfg.think_ratio;
    d->m.ratio_effective = route_get_ratio(d->router);
    d->m.adaptive = d->cfg.adaptive;
    pthread_mutex_unlock(&d->m.mu);
    d->next_stats_ms = now + STATS_MS;
}

/* Validation, routing and the cache key: no Redis. */
static void prepare(struct disp *d, struct dreq *q)
{
    struct rl_err err = {0};
    q->t0 = rconn_id_ms(q->e->id);
    q->stream_ttl_s = d->cfg.stream_ttl_s;
    if (q->t0 > rl_wall_ms() + D_FUTURE_MS)
        d->intake[q->stream].repair = true; /* an explicit ID far ahead: repair_intake */
    if (q->e->deleted) { /* XDELed while pending: nothing to route */
        q->act = A_ACK;
        return;
    }
    /* a tenant's jobs live in its id namespace ("<tenant>:<id>"): whatever
     * id it writes, it names only its own streams */
    const char *tenant = d->intake[q->stream].tenant;
    char fallback[JOB_ID_MAX + 1], plain[RCONN_ID_MAX + 2];
    snprintf(plain, sizeof plain, "r%s", q->e->id);
    if (tenant[0])
        job_tenant_id(tenant, plain, fallback);
    else
        snprintf(fallback, sizeof fallback, "%s", plain);
    q->raw = rconn_entry_field(q->e, "job", &q->raw_len);
    job_sha256(q->raw, q->raw_len, q->sha);
    if (!q->raw) {
        snprintf(q->id, sizeof q->id, "%s", fallback);
        reject(d, q, EV_CODE_BAD_ENTRY, "the stream entry has no `job` field");
        return;
    }
    struct job_opts jo = d->jopts;
    jo.fallback_id = fallback;
    struct job_fault fault;
    if (job_parse(q->raw, q->raw_len, &jo, &q->job, &fault, &err)) {
        char guess[JOB_ID_MAX + 1];
        job_guess_id(q->raw, q->raw_len, fallback, guess);
        if (tenant[0] && guess[0])
            job_tenant_id(tenant, guess, q->id); /* "" when too long: no answer */
        else
            snprintf(q->id, sizeof q->id, "%s", guess);
        reject(d, q, fault.code, err.msg);
        return;
    }
    if (tenant[0] && !q->job->id_generated) {
        char ns[JOB_ID_MAX + 1];
        if (job_tenant_id(tenant, q->job->id, ns)) {
            char msg[RL_ERR_MSG_MAX];
            snprintf(msg, sizeof msg, "id: \"%.128s\" is too long in tenant %s's namespace "
                     "(\"%s:\" + id must be at most %d characters)", q->job->id, tenant, tenant,
                     JOB_ID_MAX);
            q->id[0] = 0; /* nowhere to answer but the dead letter */
            reject(d, q, EV_CODE_BAD_ID, msg);
            return;
        }
        snprintf(q->job->id, sizeof q->job->id, "%s", ns);
    }
    snprintf(q->id, sizeof q->id, "%s", q->job->id);
    q->stream_ttl_s = q->job->stream_ttl_s;
    enum ev_code code = EV_CODE_NONE;
    char msg[RL_ERR_MSG_MAX];
    if (d_model_pick(d, q->job, &q->model, &q->lora, &code, msg, sizeof msg)) {
        reject(d, q, code, msg);
        return;
    }
    struct dmodel *m = q->model;
    if (route_decide(m && m->scoped ? m->router : d->router, q->job, &q->dec, &code, &err)) {
        reject(d, q, code, err.msg);
        return;
    }
    if (m && m->scoped)
        q->dec.pool = m->pool_idx[q->dec.pool];
    /* an adapter some workers lack: its own stream, which only holders
     * read (the router's decision keeps its mode, spelt out below); the
     * job's pool hint named the parent's pool, not this stream */
    int lp = q->lora ? d_lora_pool(d, q->job->model) : -1;
    q->offer_pool = q->dec.pool;
    if (lp >= 0) {
        q->dec.pool = lp;
        q->job->pool[0] = 0;
        q->job->given &= ~(unsigned)JOB_F_POOL;
    }
    if (m && m->alias) {
        /* the dispatcher's own name for the shared pools: the workers
         * there announce their own, so the job must not carry this one */
        q->job->model[0] = 0;
        q->job->given &= ~(unsigned)JOB_F_MODEL;
    }
    q->act = A_FORWARD;
    if (!d->model_id[0] || !q->job->cache || !job_is_deterministic(q->job))
        return;
    /* a LoRA adapter's answers are keyed by the adapter's files
     * (worker/cache.c, modelid_lora), which only its workers have: the
     * base model's key would find the base's answer */
    if (q->lora)
        return;
    /* the fast path knows one model's tokenizer and identity: the key it
     * computes is that model's, so for another model's request it would
     * find this model's answer. Only this model's requests look it up */
    if (m && !m->alias && strcmp(m->name, d->fast_name))
        return;
    int32_t *ids = NULL;
    int n_ids = 0;
    char hex[JOB_CACHE_KEY_LEN + 1], mid[SHA256_HEX_LEN + JOB_TENANT_MAX + 16];
    if (tenant[0]) /* the worker's key for a tenant's job (worker/cache.c) */
        snprintf(mid, sizeof mid, "%s/tenant:%s", d->model_id, tenant);
    else
        snprintf(mid, sizeof mid, "%s", d->model_id);
    if (prompt_render(q->job, q->dec.mode, d->tok, &ids, &n_ids, &code, &err) ||
        job_cache_key(q->job, q->dec.mode, mid, ids, n_ids, hex, &err)) {
        /* the worker will say what is wrong with it */
        RL_LOG(&d->log, RL_LOG_DEBUG, "job %s: no cache lookup: %s", q->id, err.msg);
        free(ids);
        return;
    }
    free(ids);
    snprintf(q->cache_key, sizeof q->cache_key, "%scache:%s", d->cfg.prefix, hex);
    q->lookup = true;
}

/* Round trip 2, then the decision for each valid request. */
static void decide(struct disp *d, struct dreq *qs, int n)
{
    struct rconn_batch *b = d->batch;
    struct rl_err err;
    int n_get = 0;
    rconn_batch_reset(b);
    for (int i = 0; i < n; i++) {
        if (qs[i].act != A_FORWARD || !qs[i].lookup)
            continue;
        /* a popular request repeated within the round is fetched once */
        int same = -1;
        for (int k = i - 1; k >= 0 && same < 0; k--)
            if (qs[k].act == A_FORWARD && qs[k].lookup && !strcmp(qs[k].cache_key, qs[i].cache_key))
                same = k;
        if (same >= 0) {
            qs[i].get_idx = qs[same].get_idx;
            continue;
        }
        const char *argv[2] = {"GET", qs[i].cache_key};
        qs[i].get_idx = rconn_batch_count(b);
        if (rconn_batch_add(b, 2, argv, NULL, &err)) {
            qs[i].lookup = false;
            continue;
        }
        n_get++;
    }
    bool got = n_get > 0 && rconn_batch_exec(d->rc, b, &err) == 0;
    int64_t hits = 0, misses = 0;
    for (int i = 0; i < n; i++) {
        struct dreq *q = &qs[i];
        if (q->act != A_FORWARD)
            continue;
        if (q->lookup && got) {
            const struct rconn_reply *r = rconn_batch_reply(b, q->get_idx);
            if (r && r->type == RCONN_STRING) {
                if (replay(q, r->str, r->len, &err) == 0) {
                    q->act = A_CACHE;
                    hits++;
                    RL_LOG(&d->log, RL_LOG_DEBUG, "job %s: answered from the result cache", q->id);
                    continue;
                }
                RL_LOG(&d->log, RL_LOG_WARN, "job %s: unusable cache entry: %s", q->id, err.msg);
                for (int k = 0; k < q->n_events; k++)
                    free(q->events[k]);
                q->n_events = 0;
            }
            misses++;
        }
        struct dpool *p = &d->pools[q->dec.pool];
        if (d->cfg.max_waiting > 0 && p->waiting >= d->cfg.max_waiting) {
            overload(d, q, p);
            continue;
        }
        /* the worker gets the decision spelt out: the effective mode, so it
         * renders exactly what the cache key above was computed over */
        q->job->mode = q->dec.mode;
        q->job->given |= JOB_F_MODE;
        if (job_to_json(q->job, &q->fwd, &err)) {
            q->act = 0; /* out of memory: left pending, retried later */
            continue;
        }
        /* prefix-affine pulling (affinity.c): the worker holding the most
         * of its prompt first; only this model's jobs, whose tokens the
         * dispatcher's tokenizer gives. An adapter's job bound for its own
         * stream too: only a holder's filter has its blocks, and an offer
         * not taken falls back to the parent's pool, where a worker without
         * the adapter hands it on to the stream (worker/handoff.c) */
        struct dmodel *m = q->model;
        const char *offer = NULL;
        if (!(m && !m->alias && strcmp(m->name, d->fast_name)))
            offer = da_choose(d, q->job, q->dec.mode, d->intake[q->stream].tenant,
                              q->lora ? q->job->model : NULL, q->offer_pool);
        if (offer) {
            snprintf(q->offer, sizeof q->offer, "%s", offer);
            continue;
        }
        p->waiting++;
    }
    pthread_mutex_lock(&d->m.mu);
    d->m.cache_hits += hits;
    d->m.cache_misses += misses;
    pthread_mutex_unlock(&d->m.mu);
}

/* May the dispatcher ring the bell? Said in the log when the answer changes. */
static void bell_probe(struct disp *d)
{
    /* on a cluster a slot's bell, as the answers ring (worker/publish.c);
     * named once, when connected */
    if (!d->bell_key[0])
        rcl_bell_key(d->bell_key, sizeof d->bell_key, rconn_is_cluster(d->rc), d->cfg.prefix, 0);
    struct rl_err e;
    if (xmux_ringer_check(&d->ringer, d->rc, d->bell_key, &e))
        RL_LOG(&d->log, d->ringer.on > 0 ? RL_LOG_DEBUG : RL_LOG_WARN,
               d->ringer.on > 0 ? "ringing %s with every answer" :
                    "not ringing %s (%s): config/redis-acl.conf lets the dispatcher ring it",
               d->bell_key, e.msg);
}

/* The dispatcher's answers (refusals, OVERLOADED, cache replays) keep the
 * identity rules the workers' FENCE_TAKE keeps (worker/fence.c,
 * schemas/README.md "Job identity"): the events go to out:<id> only when
 * the holder record own:<id> is this request's, or there is no record and
 * no stream yet (then the record is made, for the stream's lifetime); the
 * same job text under another request is a duplicate (nothing written:
 * that stream answers it); anything else is ID_CONFLICT, answered on
 * out:<id>@<entry> and never on the other job's stream.
 * KEYS[1] own, KEYS[2] out, KEYS[3] out@entry, KEYS[4] (when given) the
 * bell, rung for the stream written (common/xmux.h); ARGV[1] holder, [2]
 * the request's entry ID, [3] its job_sha256, [4] the TTL, [5] n, then the
 * n events, then the two ID_CONFLICT events. Returns 0 (written), 1
 * (duplicate), 2 (conflict), or the failed XADD's error. */
static const char answer_lua[] =
    "local h = redis.call('HMGET', KEYS[1], 'req', 'sha', 'entry')\n"
    "local mine\n"
    "if h[1] then\n"
    "  mine = h[1] == ARGV[2] and h[2] == ARGV[3]\n"
    "  if not mine and h[2] == ARGV[3] then return 1 end\n"
    "elseif h[3] then\n"
    "  mine = false\n"
    "else\n"
    "  mine = redis.call('EXISTS', KEYS[2]) == 0\n"
    "  if mine then\n"
    "    redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'entry', 'r' .. ARGV[2], 'xlen', 0,\n"
    "               'stalls', 0, 'd', 1, 'req', ARGV[2], 'sha', ARGV[3])\n"
    "  end\n"
    "end\n"
    "local n = tonumber(ARGV[5])\n"
    "local key, first, count = KEYS[2], 6, n\n"
    "if not mine then key, first, count = KEYS[3], 6 + n, 2 end\n"
    "for k = 0, count - 1 do\n"
    "  local r = redis.pcall('XADD', key, '0-' .. (k + 1), 'event', ARGV[first + k])\n"
    "  if type(r) == 'table' and r.err and not string.find(r.err, 'equal or smaller', 1, true) then\n"
    "    return r\n"
    "  end\n"
    "end\n"
    "redis.call('EXPIRE', key, ARGV[4])\n"
    "if KEYS[4] then\n"
    "  redis.pcall('XADD', KEYS[4], 'MAXLEN', '~', '" XMUX_BELL_MAXLEN "', '*', key, count)\n"
    "end\n"
    "if not mine then return 2 end\n"
    "redis.call('EXPIRE', KEYS[1], ARGV[4])\n"
    "return 0\n";

/* The first event names the request (ev_stamp_request), once. */
static void stamp(struct dreq *q)
{
    struct rl_err err;
    if (!q->stamped && q->n_events > 0 && ev_stamp_request(&q->events[0], q->e->id, q->sha, &err) == 0)
        q->stamped = true;
}

static int add_events(struct disp *d, struct dreq *q, struct rl_err *err)
{
    bool cl = rconn_is_cluster(d->rc);
    char out[D_KEY_MAX + JOB_ID_MAX], own[D_KEY_MAX + JOB_ID_MAX];
    char alt[D_KEY_MAX + JOB_ID_MAX + RCONN_ID_MAX + 1], ttl[32], n[16], holder[RCONN_NAME_MAX + 16];
    rcl_tagged_key(out, sizeof out, cl, d->cfg.prefix, "out:", q->id);
    rcl_tagged_key(own, sizeof own, cl, d->cfg.prefix, "own:", q->id);
    snprintf(alt, sizeof alt, "%s@%s", out, q->e->id);
    snprintf(ttl, sizeof ttl, "%d", q->stream_ttl_s);
    snprintf(n, sizeof n, "%d", q->n_events);
    snprintf(holder, sizeof holder, "dispatcher:%s", d->name);
    char msg[RL_ERR_MSG_MAX + 64], *conflict[2] = {NULL, NULL};
    snprintf(msg, sizeof msg, "id %.128s: a different job owns this id while its stream exists; "
             "nothing was written there (this answer is on out:<id>@%s)", q->id, q->e->id);
    struct rl_err e2;
    if (ev_build_error(0, EV_CODE_ID_CONFLICT, msg, &conflict[0], &e2) == 0)
        ev_stamp_request(&conflict[0], q->e->id, q->sha, &e2);
    conflict[1] = error_done(q, 1, rl_wall_ms());
    char bell_key[D_KEY_MAX + 16]; /* the bell of out's slot (common/rcluster.h) */
    bool bell = d->ringer.on > 0 &&
                rcl_bell_key(bell_key, sizeof bell_key, cl, d->cfg.prefix,
                             rcl_key_slot(out, strlen(out))) > 0;
    int argc = 12 + q->n_events + 2, rc;
    const char **argv = malloc((size_t)argc * sizeof *argv);
    if (!argv || !conflict[0] || !conflict[1]) {
        rc = rl_errf(err, RL_ENOMEM, "dispatcher: out of memory");
        goto out;
    }
    int a = 0;
    argv[a++] = "EVAL";
    argv[a++] = answer_lua;
    argv[a++] = bell ? "4" : "3";
    argv[a++] = own;
    argv[a++] = out;
    argv[a++] = alt;
    if (bell)
        argv[a++] = bell_key;
    argv[a++] = holder;
    argv[a++] = q->e->id;
    argv[a++] = q->sha;
    argv[a++] = ttl;
    argv[a++] = n;
    for (int k = 0; k < q->n_events; k++)
        argv[a++] = q->events[k];
    argv[a++] = conflict[0];
    argv[a++] = conflict[1];
    rc = rconn_batch_add(d->batch, a, argv, NULL, err);
out:
    free(argv);
    free(conflict[0]);
    free(conflict[1]);
    return rc;
}

/* Round trip 3: one transaction per request. Returns 0, or -RL_EIO when
 * the pipeline broke (the unanswered requests stay pending). */
static bool has_events(const struct dreq *q)
{
    return q->act && q->act != A_FORWARD && q->act != A_ACK;
}

/* Cluster mode: a request's out:{id} lives in its own slot, not in the
 * queue keys' one, so its events cannot be in the transaction with the
 * XACK. They are written first, all requests' in one batch (idempotent:
 * explicit IDs), and only once every one is confirmed do the transactions
 * (XACK last) go out; until then the requests stay pending. Returns
 * false when they could not all be written. */
static bool events_first(struct disp *d, struct dreq *qs, int n, struct rl_err *err)
{
    struct rconn_batch *b = d->batch;
    rconn_batch_reset(b);
    for (int i = 0; i < n; i++) {
        if (!has_events(&qs[i]))
            continue;
        stamp(&qs[i]);
        if (add_events(d, &qs[i], err))
            return false;
    }
    if (!rconn_batch_count(b))
        return true;
    if (rconn_batch_exec(d->rc, b, err))
        return false;
    for (int i = 0; i < rconn_batch_count(b); i++) {
        const struct rconn_reply *r = rconn_batch_reply(b, i);
        if (r->type == RCONN_ERROR && !rconn_reply_is_stale_id(r)) {
            rl_errf(err, RL_EIO, "%s", r->str);
            return false;
        }
    }
    return true;
}

/* Sharded forwarding (issue 27): a cluster with pool_shards > 1 spreads
 * each pool over shards in other slots than the intake stream's, so the
 * job's XADD cannot share the XACK's transaction. Instead this script,
 * run in the shard's slot, writes the job unless the marker of its intake
 * entry is there, and leaves the marker: a dispatcher that dies after it
 * and before the XACK leaves the entry pending, and whoever forwards it
 * again (its restart, or another dispatcher's XAUTOCLAIM) computes the
 * same shard (rcl_shard_for_slot of the job's id) and finds the marker: the job
 * is in its shard once. KEYS: the shard's pool stream, the marker. ARGV:
 * the marker's TTL, then the job's field/value pairs. Returns the new
 * entry ID, or 0 when it was forwarded before. EXISTS first and SET last:
 * an XADD that fails (a key of another type) leaves no marker, and the
 * entry is forwarded again rather than lost. */
static const char fwd_lua[] =
    "if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end\n"
    "local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))\n"
    "redis.call('SET', KEYS[2], id, 'EX', ARGV[1])\n"
    "return id\n";

/* Round trip before the transactions when forwarding is sharded: the
 * forward script of every request to forward, and the DEL of the markers
 * whose XACK the last round confirmed. Sets q->fwd_ok for each job that is
 * now in its shard; the others stay pending (their XACK is not sent).
 * Returns false when the round trip failed as a whole. */
static bool forward_first(struct disp *d, struct dreq *qs, int n, struct rl_err *err)
{
    struct rconn_batch *b = d->batch;
    rconn_batch_reset(b);
    char ttl[24];
    int64_t t = (int64_t)d->cfg.claim_idle_ms / 1000 * 4;
    snprintf(ttl, sizeof ttl, "%lld", (long long)(t > D_FWD_MARK_MIN_S ? t : D_FWD_MARK_MIN_S));
    for (int i = 0; i < d->n_fwd_gc; i++) {
        const char *argv[2] = {"UNLINK", d->fwd_gc[i]};
        if (rconn_batch_add(b, 2, argv, NULL, err))
            return false;
    }
    for (int i = 0; i < n; i++) {
        struct dreq *q = &qs[i];
        q->fwd_idx = -1;
        q->fwd_ok = false;
        if (q->act != A_FORWARD)
            continue;
        const char *ikey = d->intake[q->stream].key, *rest = strchr(ikey, '}');
        /* the shard of the request's slot (out:{<id>}): a function of the
         * id, and on the master of its streams (rcl_shard_for_slot) */
        char out[D_KEY_MAX + JOB_ID_MAX + 8];
        const char *pk = d->pools[q->dec.pool].key;
        int len = rcl_tagged_key(out, sizeof out, true, d->cfg.prefix, "out:", q->id);
        int s = len < 0 ? 0
                        : rcl_shard_for_slot(rcl_key_slot(pk, strlen(pk)),
                                             rcl_key_slot(out, (size_t)len), d->n_shards);
        char skey[D_SKEY_MAX], base[D_KEY_MAX + RCONN_ID_MAX + 8], pfx[D_KEY_MAX];
        snprintf(pfx, sizeof pfx, "%.128s", d->cfg.prefix);
        snprintf(base, sizeof base, "{%s}fwd:%s:%s", pfx, rest ? rest + 1 : ikey, q->e->id);
        shard_key(d, q->dec.pool, s, skey);
        if (rcl_shard_key_n(q->mark, sizeof q->mark, base, s, d->shard_n[s]) < 0)
            continue; /* cannot be named: stays pending, logged by commit */
        const char *tenant = d->intake[q->stream].tenant;
        /* the fields as the unsharded forward writes them (commit) */
        const char *argv[14] = {"EVAL", fwd_lua, "2", skey, q->mark, ttl, "job", q->fwd,
                                "req", q->e->id, "sha", q->sha, "tenant", tenant};
        q->fwd_idx = rconn_batch_count(b);
        if (rconn_batch_add(b, tenant[0] ? 14 : 12, argv, NULL, err))
            return false;
    }
    if (!rconn_batch_count(b))
        return true;
    int rc = rconn_batch_exec(d->rc, b, err);
    /* the markers' DELs: done or not, TTL reaps what failed */
    for (int i = 0; i < d->n_fwd_gc; i++)
        free(d->fwd_gc[i]);
    d->n_fwd_gc = 0;
    for (int i = 0; i < n; i++) {
        struct dreq *q = &qs[i];
        const struct rconn_reply *r = q->fwd_idx >= 0 ? rconn_batch_reply(b, q->fwd_idx) : NULL;
        if (!r)
            continue;
        if (r->type == RCONN_STRING) {
            q->fwd_ok = true;
        } else if (r->type == RCONN_INTEGER && r->integer == 0) {
            q->fwd_ok = true;
            RL_LOG(&d->log, RL_LOG_INFO, "job %s (request %s): already forwarded (marker %s): "
                   "acknowledging it", q->id[0] ? q->id : "-", q->e->id, q->mark);
        } else {
            RL_LOG(&d->log, RL_LOG_WARN, "job %s (request %s): forward failed: %s; it stays "
                   "pending", q->id[0] ? q->id : "-", q->e->id, r->str ? r->str : "?");
        }
    }
    return rc == 0;
}

/* Keeps q's marker key for deletion with the next round's forwards. */
static void fwd_gc_add(struct disp *d, const struct dreq *q)
{
    if (d->n_fwd_gc == d->cap_fwd_gc) {
        int cap = d->cap_fwd_gc ? 2 * d->cap_fwd_gc : 64;
        char **g = realloc(d->fwd_gc, (size_t)cap * sizeof *g);
        if (!g)
            return; /* the TTL reaps it */
        d->fwd_gc = g;
        d->cap_fwd_gc = cap;
    }
    char *k = strdup(q->mark);
    if (k)
        d->fwd_gc[d->n_fwd_gc++] = k;
}

/* How long the next read of new requests may block: until the next
 * heartbeat, watchdog ping or due offer (da_next_due_ms), cfg.block_ms at
 * most. */
static int read_block_ms(struct disp *d)
{
    int64_t now = rl_wall_ms(), block = d->next_hb_ms - now;
    if (d->watchdog_usec && d->next_wd_ms - now < block)
        block = d->next_wd_ms - now; /* a blocked read must not starve the watchdog */
    if (block > d->cfg.block_ms)
        block = d->cfg.block_ms;
    int64_t due = da_next_due_ms(d);
    if (due >= 0 && due < block)
        block = due; /* ... on time, even while no request comes */
    return block < 1 ? 1 : (int)block;
}

/* Whether a round's commit may end in the next read of new requests (one
 * write, one read event in Redis: issue 27 point 3; d_run collects it,
 * paired_round): on a single instance, when that read is what the loop
 * would do next anyway, with nothing else due first (every other use of
 * the connection waits while a read is out). */
static bool pair_ok(struct disp *d)
{
    if (rconn_is_cluster(d->rc) || d->own_pending || d->own_again || !d->groups_ok ||
        (d->reload_req && *d->reload_req))
        return false;
    for (int i = 0; i < d->n_intake; i++)
        if (d->intake[i].repair)
            return false;
    int64_t now = rl_wall_ms();
    return now < d->next_hb_ms && now < d->next_claim_ms && now < d->next_repair_ms &&
           (!d->watchdog_usec || now < d->next_wd_ms) && da_next_due_ms(d) != 0;
}

static int commit(struct disp *d, struct dreq *qs, int n, struct rl_err *err)
{
    struct rconn_batch *b = d->batch;
    bool cluster = rconn_is_cluster(d->rc), events_ok = true;
    bool sharded = cluster && d->n_shards > 1;
    if (cluster && !(events_ok = events_first(d, qs, n, err)))
        RL_LOG(&d->log, RL_LOG_WARN, "events not written (%s): their requests stay pending",
               err->msg);
    if (sharded && !forward_first(d, qs, n, err))
        RL_LOG(&d->log, RL_LOG_WARN, "forwards not all confirmed (%s): those requests stay "
               "pending", err->msg);
    if (rconn_connected(d->rc))
        bell_probe(d);
    rconn_batch_reset(b);
    int n_tx = 0;
    for (int i = 0; i < n; i++) {
        struct dreq *q = &qs[i];
        q->exec_idx = -1;
        if (!q->act || (has_events(q) && !events_ok) ||
            (sharded && q->act == A_FORWARD && !q->fwd_ok)) {
            /* could not be prepared (memory) or its events not written:
             * try it again later */
            d->own_again = true;
            continue;
        }
        const char *multi[1] = {"MULTI"}, *exec[1] = {"EXEC"};
        stamp(q);
        int rc = rconn_batch_add(b, 1, multi, NULL, err);
        if (!rc && has_events(q) && !cluster)
            rc = add_events(d, q, err);
        if (!rc && q->dead) {
            const char *vals[1] = {q->dead}, *dn[1] = {"dead"};
            size_t lens[1] = {strlen(q->dead)};
            rc = rconn_batch_add_xadd(b, d->dead_key, "*", cfg_dead_maxlen(&d->cfg), 1, dn, vals, lens,
                                      err);
        }
        if (!rc && q->act == A_FORWARD && !sharded) {
            /* the job as routed, and its identity as its client knows it:
             * the requests entry ID and the hash of the text it sent */
            const char *tenant = d->intake[q->stream].tenant;
            const char *vals[4] = {q->fwd, q->e->id, q->sha, tenant};
            const char *fn[4] = {"job", "req", "sha", "tenant"};
            size_t lens[4] = {strlen(q->fwd), strlen(q->e->id), strlen(q->sha), strlen(tenant)};
            rc = rconn_batch_add_xadd(b, q->offer[0] ? q->offer : d->pools[q->dec.pool].key, "*",
                                      0, tenant[0] ? 4 : 3, fn, vals, lens, err);
        }
        /* handled: acknowledged, and deleted unless another group still
         * needs it (bounded storage, common/qack.h) */
        const char *ikey = d->intake[q->stream].key;
        const char *ack[6] = {"EVAL", qack_lua, "1", ikey, GROUP_REQ, q->e->id};
        if (!rc)
            rc = rconn_batch_add(b, 6, ack, NULL, err);
        if (!rc)
            rc = rconn_batch_add(b, 1, exec, NULL, err);
        if (rc)
            return rc; /* out of memory: nothing sent, all stay pending */
        q->exec_idx = rconn_batch_count(b) - 1;
        n_tx++;
    }
    if (!n_tx)
        return 0;
    int xrc = pair_ok(d) ? rconn_batch_exec_then_xreadgroup(d->rc, b, GROUP_REQ, d->name,
                                                            d->n_intake, d->intake_keys, D_BATCH,
                                                            read_block_ms(d), err)
                         : rconn_batch_exec(d->rc, b, err);
    int64_t routed[D_MAX_POOLS] = {0}, auto_routed[D_MAX_POOLS] = {0};
    int64_t invalid = 0, overloaded = 0, handled = 0;
    for (int i = 0; i < n; i++) {
        struct dreq *q = &qs[i];
        const struct rconn_reply *r = q->exec_idx >= 0 ? rconn_batch_reply(b, q->exec_idx) : NULL;
        if (!r)
            continue;
        if (r->type != RCONN_ARRAY && q->offer[0])
            da_unoffer(d, q->offer);
        if (r->type != RCONN_ARRAY) {
            /* EXECABORT or a nil: the transaction did not run; the entry
             * stays pending and is retried from our own PEL */
            RL_LOG(&d->log, RL_LOG_WARN, "job %s (request %s): transaction failed: %s",
                   q->id[0] ? q->id : "-", q->e->id, r->str ? r->str : "nil");
            d->own_again = true;
            continue;
        }
        for (size_t k = 0; k < r->n_elem; k++)
            if (r->elem[k].type == RCONN_ERROR && !rconn_reply_is_stale_id(&r->elem[k]))
                RL_LOG(&d->log, q->act == A_FORWARD ? RL_LOG_ERROR : RL_LOG_WARN,
                       "job %s (request %s): %s", q->id[0] ? q->id : "-", q->e->id,
                       r->elem[k].str);
        handled++;
        if (sharded && q->act == A_FORWARD)
            fwd_gc_add(d, q); /* acknowledged: its marker has done its work */
        switch (q->act) {
        case A_FORWARD:
            routed[q->dec.pool]++;
            auto_routed[q->dec.pool] += q->dec.is_auto;
            RL_LOG(&d->log, RL_LOG_DEBUG, "job %s: routed to %s (%s, %s)", q->id,
                   d->pools[q->dec.pool].name, route_reason_name(q->dec.reason),
                   q->dec.mode == JOB_MODE_THINK ? "think" : "no_think");
            break;
        case A_REJECT: invalid++; break;
        case A_OVERLOAD: overloaded++; break;
        default: break;
        }
    }
    pthread_mutex_lock(&d->m.mu);
    for (int p = 0; p < d->n_pools; p++) {
        d->m.routed[p] += routed[p];
        d->m.auto_routed[p] += auto_routed[p];
    }
    d->m.invalid += invalid;
    d->m.overloaded += overloaded;
    pthread_mutex_unlock(&d->m.mu);
    d->rate_n += handled;
    if (xrc)
        d->own_again = true;
    return xrc;
}

static void handle(struct disp *d, const struct rconn_entries *ents)
{
    if (ents->n == 0)
        return;
    struct dreq *qs = calloc((size_t)ents->n, sizeof *qs);
    struct rl_err err;
    if (!qs) {
        d->own_again = true; /* they stay pending; read again later */
        return;
    }
    if (!d->models_t_ms)
        d_models_refresh(d);
    if (rl_wall_ms() >= d->next_stats_ms)
        refresh_stats(d);
    da_refresh(d, false); /* the workers' filters, at most every affinity_refresh_ms */
    for (int i = 0; i < ents->n; i++) {
        qs[i].e = &ents->v[i];
        qs[i].stream = ents->v[i].stream >= 0 && ents->v[i].stream < d->n_intake
                           ? ents->v[i].stream : 0;
        prepare(d, &qs[i]);
    }
    decide(d, qs, ents->n);
    if (commit(d, qs, ents->n, &err))
        RL_LOG(&d->log, RL_LOG_WARN, "redis %s: %s; unanswered requests stay pending",
               rconn_addr(d->rc), err.msg);
    for (int i = 0; i < ents->n; i++)
        dreq_clear(&qs[i]);
    free(qs);
}

static void ensure_groups(struct disp *d)
{
    if (d->groups_ok)
        return;
    struct rl_err err;
    for (int i = 0; i < d->n_intake; i++)
        if (rconn_xgroup_create(d->rc, d->intake[i].key, GROUP_REQ, "0", &err)) {
            RL_LOG(&d->log, RL_LOG_DEBUG, "XGROUP CREATE %s: %s", d->intake[i].key, err.msg);
            return;
        }
    /* the workers' group too, from the start of each pool stream as the
     * worker makes it, so that the queue state can be read before any
     * worker came */
    for (int p = 0; p < d->n_pools; p++)
        for (int s = 0; s < d->n_shards; s++) {
            char k[D_SKEY_MAX];
            shard_key(d, p, s, k);
            if (rconn_xgroup_create(d->rc, k, GROUP_WORKERS, "0", &err)) {
                RL_LOG(&d->log, RL_LOG_DEBUG, "XGROUP CREATE %s: %s", k, err.msg);
                return;
            }
        }
    d->groups_ok = true;
    d->own_again = true; /* a restart under the same name finds its entries */
    d->next_own_ms = 0;
    pthread_mutex_lock(&d->m.mu);
    d->m.ready = true;
    pthread_mutex_unlock(&d->m.mu);
}

static void claim(struct disp *d)
{
    for (int i = 0; i < d->n_intake; i++) {
        struct dintake *in = &d->intake[i];
        struct rconn_entries ents = {0};
        char next[RCONN_ID_MAX];
        struct rl_err err;
        if (rconn_xautoclaim(d->rc, in->key, GROUP_REQ, d->name, d->cfg.claim_idle_ms,
                             in->claim_cursor, D_BATCH, &ents, next, NULL, &err)) {
            RL_LOG(&d->log, RL_LOG_DEBUG, "XAUTOCLAIM %s: %s", in->key, err.msg);
            return;
        }
        snprintf(in->claim_cursor, sizeof in->claim_cursor, "%s", next);
        if (ents.n) {
            RL_LOG(&d->log, RL_LOG_INFO, "took over %d requests of a dead dispatcher on %s",
                   ents.n, in->key);
            pthread_mutex_lock(&d->m.mu);
            d->m.reclaimed += ents.n;
            pthread_mutex_unlock(&d->m.mu);
            for (int k = 0; k < ents.n; k++)
                ents.v[k].stream = i;
            handle(d, &ents);
        }
        rconn_entries_free(&ents);
    }
}

/* An intake stream whose last ID is far ahead of the clock (an XADD with
 * an explicit ID such as 18446744073709551615-18446744073709551615, after
 * which every XADD * fails with "exhausted the last possible ID") is reset,
 * in one script, once no entry ahead of the clock is left in it and every
 * group has read all it holds: XSETID to <now>-<max seq> (so the next
 * XADD * gets a fresh ID above anything ever given by *) and every group's
 * last-delivered ID to the same. Entries already handled are deleted
 * (commit), so nothing is delivered twice or skipped. KEYS[1] the stream.
 * Returns 1 when it reset the stream, 0 when nothing was wrong, -1 when
 * it must wait (entries ahead of the clock, or unread, are left). */
static const char repair_lua[] =
    "local function ms(id) return tonumber(string.match(id, '^(%d+)')) end\n"
    "local function seq(id) return tonumber(string.match(id, '-(%d+)$')) end\n"
    "local function below(a, b) return ms(a) < ms(b) or (ms(a) == ms(b) and seq(a) < seq(b)) end\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local ok, info = pcall(redis.call, 'XINFO', 'STREAM', KEYS[1])\n"
    "if not ok then return 0 end\n"
    "local last\n"
    "for i = 1, #info, 2 do if info[i] == 'last-generated-id' then last = info[i + 1] end end\n"
    "if not last or ms(last) <= now + tonumber(ARGV[1]) then return 0 end\n"
    "local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)\n"
    "if top[1] and ms(top[1][1]) > now then return -1 end\n"
    "local groups = redis.call('XINFO', 'GROUPS', KEYS[1])\n"
    "local names = {}\n"
    "for _, g in ipairs(groups) do\n"
    "  local name, ld\n"
    "  for i = 1, #g, 2 do\n"
    "    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then ld = g[i + 1] end\n"
    "  end\n"
    "  if top[1] and below(ld, top[1][1]) then return -1 end\n"
    "  names[#names + 1] = name\n"
    "end\n"
    "local r = tostring(now) .. '-18446744073709551615'\n"
    "redis.call('XSETID', KEYS[1], r, 'MAXDELETEDID', r)\n"
    "for _, name in ipairs(names) do redis.call('XGROUP', 'SETID', KEYS[1], name, r) end\n"
    "return 1\n";

/* repair_lua on every intake stream that read an entry ahead of the clock
 * (at once after that round), and on all of them every D_REPAIR_MS (a
 * dispatcher may have died between the read and the repair). */
static void repair_intake(struct disp *d, bool all)
{
    char future[24];
    snprintf(future, sizeof future, "%d", D_FUTURE_MS);
    for (int i = 0; i < d->n_intake; i++) {
        struct dintake *in = &d->intake[i];
        if (!all && !in->repair)
            continue;
        const char *argv[5] = {"EVAL", repair_lua, "1", in->key, future};
        struct rconn_reply *r = NULL;
        struct rl_err err;
        if (rconn_command(d->rc, 5, argv, NULL, &r, &err)) {
            RL_LOG(&d->log, RL_LOG_WARN, "intake %s: checking its last ID: %s", in->key, err.msg);
        } else if (r && r->type == RCONN_INTEGER && r->integer == 1) {
            RL_LOG(&d->log, RL_LOG_WARN, "intake %s: an entry ID far ahead of the clock had "
                   "been written (an explicit XADD ID); the stream's last ID is reset so that "
                   "XADD * works again", in->key);
            in->repair = false;
        } else if (r && r->type == RCONN_INTEGER && r->integer == 0) {
            in->repair = false;
        } else if (r && r->type == RCONN_ERROR) {
            RL_LOG(&d->log, RL_LOG_WARN, "intake %s: checking its last ID: %s", in->key, r->str);
            in->repair = false; /* the periodic check tries again */
        }
        rconn_reply_free(r);
    }
}

static void heartbeat(struct disp *d)
{
    int64_t now = rl_wall_ms();
    if (now - d->rate_t_ms >= 500) {
        double r = (double)d->rate_n * 1000.0 / (double)(now - d->rate_t_ms);
        pthread_mutex_lock(&d->m.mu);
        d->m.requests_per_s = 0.5 * d->m.requests_per_s + 0.5 * r;
        pthread_mutex_unlock(&d->m.mu);
        d->rate_n = 0;
        d->rate_t_ms = now;
    }
    char *v = dm_heartbeat_json(d);
    if (!v)
        return;
    char key[D_KEY_MAX + RCONN_NAME_MAX], ttl[32];
    snprintf(key, sizeof key, "%sdispatcher:%s", d->cfg.prefix, d->name);
    snprintf(ttl, sizeof ttl, "%d", d->cfg.heartbeat_ttl_s);
    const char *argv[5] = {"SET", key, v, "EX", ttl};
    struct rl_err err;
    if (rconn_command(d->rc, 5, argv, NULL, NULL, &err))
        RL_LOG(&d->log, RL_LOG_DEBUG, "heartbeat: %s", err.msg);
    free(v);
}

/* A clean exit with nothing pending removes our consumer, so that
 * host+pid names do not pile up in the group. */
static void leave_group(struct disp *d)
{
    for (int i = 0; i < d->n_intake; i++) {
        struct rconn_pending *p = NULL;
        int n = 0;
        struct rl_err err;
        const char *key = d->intake[i].key;
        if (rconn_xpending(d->rc, key, GROUP_REQ, 0, "-", "+", 1, d->name, &p, &n, &err) == 0 &&
            n == 0) {
            const char *argv[5] = {"XGROUP", "DELCONSUMER", key, GROUP_REQ, d->name};
            rconn_command(d->rc, 5, argv, NULL, NULL, &err);
        }
        free(p);
    }
}

int d_router_replace(struct disp *d, const char *const *pools, int n, struct router **slot,
                     struct rl_err *err)
{
    struct route_opts o = {.pools = pools, .n_pools = n, .default_pool = d->cfg.default_pool,
                           .rules = (const char *const *)d->cfg.think_rules.v,
                           .n_rules = d->cfg.think_rules.n, .ratio = d->cfg.think_ratio};
    struct router *r;
    int rc = route_create(&r, &o, err);
    if (rc)
        return rc;
    route_free(*slot);
    *slot = r;
    return 0;
}

int d_make_router(struct disp *d, struct rl_err *err)
{
    const char *pools[D_MAX_POOLS];
    for (int p = 0; p < d->n_shared; p++)
        pools[p] = d->pools[p].name;
    int rc = d_router_replace(d, pools, d->n_shared, &d->router, err);
    if (rc)
        return rc;
    struct router *r = d->router;
    pthread_mutex_lock(&d->m.mu);
    d->m.ratio = d->cfg.think_ratio;
    d->m.ratio_effective = route_get_ratio(r);
    d->m.adaptive = d->cfg.adaptive;
    pthread_mutex_unlock(&d->m.mu);
    d->next_stats_ms = 0; /* adaptive state is recomputed at once */
    return 0;
}

/* SIGHUP: the options common/config.c's table marks live, from a fresh
 * load of the file and flags (cfg_apply_live); the rest need a restart. */
static void d_reload(struct disp *d)
{
    struct cfg fresh;
    struct rl_err err;
    enum cfg_action act;
    if (cfg_load(&fresh, d->argc, d->argv, CFG_DISPATCHER, &act, &err)) {
        RL_LOG(&d->log, RL_LOG_ERROR, "SIGHUP: keeping the old settings: %s", err.msg);
        return;
    }
    /* only the live options change; the Redis address, pools and name need
     * a restart */
    int rc = cfg_apply_live(&d->cfg, &fresh, CFG_DISPATCHER, &err);
    cfg_free(&fresh);
    if (rc) {
        RL_LOG(&d->log, RL_LOG_ERROR, "SIGHUP: keeping the old settings: %s", err.msg);
        return;
    }
    if (d_make_router(d, &err))
        RL_LOG(&d->log, RL_LOG_ERROR, "SIGHUP: keeping the old routing rules: %s", err.msg);
    else
        d_models_reroute(d);
    cfg_job_opts(&d->cfg, &d->jopts);
    int lvl = rl_log_parse_level(d->cfg.log_level);
    if (lvl >= 0)
        d->log.level = lvl;
    RL_LOG(&d->log, RL_LOG_INFO, "SIGHUP: settings reloaded (think_ratio %.3f, adaptive %s, "
           "%d think rules, max_waiting %d)", d->cfg.think_ratio, d->cfg.adaptive ? "on" : "off",
           d->cfg.think_rules.n, d->cfg.max_waiting);
}

static void read_failed(struct disp *d, const struct rl_err *err)
{
    if (strstr(err->msg, "NOGROUP"))
        d->groups_ok = false; /* Redis lost it (restarted empty) */
    d->own_again = true;      /* the read may have delivered before it broke */
    RL_LOG(&d->log, RL_LOG_DEBUG, "XREADGROUP: %s", err->msg);
}

/* Pings systemd's watchdog when due (d->watchdog_usec: under it). */
static void watchdog_tick(struct disp *d, int64_t now)
{
    if (d->watchdog_usec && now >= d->next_wd_ms) {
        sd_notify(0, "WATCHDOG=1");
        d->next_wd_ms = now + (int64_t)(d->watchdog_usec / 2000);
    }
}

/* A read's entries: handled, freed, and the intake streams one of them
 * found ahead of the clock repaired. */
static void round_of(struct disp *d, struct rconn_entries *ents)
{
    handle(d, ents);
    rconn_entries_free(ents);
    repair_intake(d, false);
}

/* The read of new requests sent with the last round's commit (pair_ok):
 * collected (in steps, so that a stop is seen) and handled as d_run's
 * own read is. Its BLOCK ends by the loop's next due time, and a commit
 * pairs only while nothing else is due, so the loop's other work (the
 * heartbeat, claims, offers, a reload) waits one round at most. */
static void paired_round(struct disp *d)
{
    watchdog_tick(d, rl_wall_ms());
    struct rconn_entries ents = {0};
    struct rl_err err;
    bool came = false;
    if (rconn_xreadgroup_collect(d->rc, d->n_intake, d->intake_keys, 100, &ents, &came, &err)) {
        read_failed(d, &err);
        return;
    }
    if (came)
        round_of(d, &ents);
}

int d_run(struct disp *d, volatile sig_atomic_t *stop, volatile sig_atomic_t *reload)
{
    bool was_up = true, notified = false;
    d->rate_t_ms = rl_wall_ms();
    d->reload_req = reload;
    while (!*stop) {
        if (rconn_awaiting(d->rc)) { /* the read that went with the last commit */
            paired_round(d);
            continue;
        }
        int64_t now = rl_wall_ms();
        if (*reload) {
            *reload = 0;
            d_reload(d);
        }
        watchdog_tick(d, now);
        struct rl_err cerr;
        if (!rconn_connected(d->rc) && rconn_ensure(d->rc, &cerr) == 0)
            d->own_again = true; /* a round may have broken off: re-read what we hold */
        if (!d->keys_cluster && rconn_is_cluster(d->rc)) {
            d_make_keys(d, true); /* the cluster layout: groups on the new keys */
            d->groups_ok = false;
        }
        ensure_groups(d);
        bool up = d->groups_ok && rconn_connected(d->rc);
        if (up != was_up) {
            RL_LOG(&d->log, up ? RL_LOG_INFO : RL_LOG_WARN, "redis %s: %s", rconn_addr(d->rc),
                   up ? "connected" : "unreachable; retrying");
            was_up = up;
        }
        pthread_mutex_lock(&d->m.mu);
        d->m.ready = up;
        pthread_mutex_unlock(&d->m.mu);
        if (!up) {
            int64_t ms = rconn_retry_in_ms(d->rc);
            struct timespec ts = {0, (long)(ms < 5 ? 5 : ms > 100 ? 100 : ms) * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        if (!notified) {
            sd_notify(0, "READY=1");
            RL_LOG(&d->log, RL_LOG_INFO, "ready: routing %s as %s, redis %s answered",
                   d->req_key, d->name, rconn_addr(d->rc));
            notified = true;
        }
        if (now >= d->next_hb_ms) {
            d_models_refresh(d);
            da_refresh(d, true);
            refresh_stats(d);
            heartbeat(d);
            d->next_hb_ms = now + d->cfg.heartbeat_interval_ms;
        }
        if (now >= d->next_claim_ms) {
            claim(d);
            d->next_claim_ms = now + d->cfg.claim_interval_ms;
        }
        if (now >= d->next_repair_ms) {
            repair_intake(d, true);
            d->next_repair_ms = now + D_REPAIR_MS;
        }
        struct rconn_entries ents = {0};
        struct rl_err err;
        da_sweep(d); /* offers past affinity_wait_ms go to their pools */
        int block = read_block_ms(d);
        if (!d->own_pending && d->own_again && now >= d->next_own_ms) {
            d->own_pending = true;
            d->own_again = false;
            d->own_stream = 0;
            for (int i = 0; i < d->n_intake; i++)
                strcpy(d->intake[i].own_cursor, "0");
            d->next_own_ms = now + 100;
        }
        /* our own pending entries: one intake stream after the other, each
         * from its cursor; new ones: every intake stream in one BLOCKing
         * read (all in the queue keys' slot on a cluster) */
        bool own = d->own_pending;
        struct dintake *oi = &d->intake[d->own_stream];
        int rrc = own ? rconn_xreadgroup(d->rc, GROUP_REQ, d->name, 1,
                                         &d->intake_keys[d->own_stream], oi->own_cursor, D_BATCH,
                                         -1, &ents, &err)
                      : rconn_xreadgroup(d->rc, GROUP_REQ, d->name, d->n_intake, d->intake_keys,
                                         ">", D_BATCH, block, &ents, &err);
        if (rrc) {
            read_failed(d, &err);
            continue;
        }
        if (own) {
            for (int k = 0; k < ents.n; k++)
                ents.v[k].stream = d->own_stream;
            if (ents.n == 0 && ++d->own_stream >= d->n_intake)
                d->own_pending = false;
            else if (ents.n)
                snprintf(oi->own_cursor, sizeof oi->own_cursor, "%s", ents.v[ents.n - 1].id);
        }
        round_of(d, &ents);
    }
    sd_notify(0, "STOPPING=1");
    RL_LOG(&d->log, RL_LOG_INFO, "stopping");
    if (rconn_awaiting(d->rc)) /* what it delivered stays pending: leave_group keeps us then */
        rconn_disconnect(d->rc);
    if (rconn_connected(d->rc) || rconn_ensure(d->rc, NULL) == 0)
        leave_group(d);
    return 0;
}
