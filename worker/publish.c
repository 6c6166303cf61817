/* worker/publish.c - the outbox and the one round trip per step.
 *
 * Every event a job produces goes into that job's outbox (struct wout)
 * and stays there until Redis has confirmed its XADD. w_flush() sends, in
 * one pipeline: for every job not yet its holder, FENCE_TAKE (fence.h);
 * a finished job's result-cache SET ahead of its done; FENCE_EMIT of every
 * job with unconfirmed events, in one call (on a cluster, one per slot):
 * their XADDs with the explicit IDs 0-<seq+1>, the EXPIRE after done,
 * the PUBLISH when configured, all only while this worker holds the job,
 * and, every CHECK_MS, reading its cancel key and its client's lease key;
 * pending dead letters; the XACK of jobs whose events are all confirmed;
 * a GET of the cancel key (and EXISTS of the lease) of a running job that
 * emits nothing this flush, every CHECK_MS at most;
 * and, when due, the FENCE_LEASE renewal and the heartbeat.
 *
 * Why it is safe to resend everything that was not confirmed: event IDs
 * are explicit and monotone, so an XADD that did land before a connection
 * broke is refused on resend with "equal or smaller", which FENCE_EMIT
 * counts as written; EXPIRE, SET and XACK are idempotent. Dead letters use
 * "*" and may, after a lost reply, appear twice; they are diagnostics. A
 * job is acknowledged only in the flush after its last event was
 * confirmed, so an XACK never overtakes an event. A job whose emit comes
 * back FENCED, or whose lease renewal finds it owned by another consumer,
 * is dropped after the replies are read (drop_job).
 *
 * Memory pressure (schemas/README.md, "Memory pressure"). A Redis at
 * maxmemory with noeviction refuses every command that may grow it (XADD,
 * HSET, SET), but not XACK, XCLAIM, EXPIRE or reads. FENCE_EMIT stops a
 * job's events at the first refused XADD, and an event leaves the outbox
 * only once Redis confirms it, so seq N+1 never lands before N and done
 * never before the last delta: nothing is ever dropped. On an OOM refusal
 * the worker says so once (log, /healthz, metrics, heartbeat), admits no
 * new job (loop.c), and retries with back-off (5 ms doubling to 500 ms),
 * each retry a probe of at most PROBE_EVENTS events per job; the first
 * write Redis takes again ends it. Another refusal (NOPERM, READONLY,
 * LOADING...) backs off that job alone. A job whose unstored events pass
 * publish_buffer_kb, or whose deadline passes while they cannot be
 * stored, is given up (give_up): cancelled here, never acknowledged, its
 * entry handed back (FENCE_RELEASE) for a worker to resume from its last
 * stored event; so the stream goes on without a gap, later.
 *
 * The round trip comes in two halves (issue 27): w_flush_start builds the
 * pipeline and writes it, w_flush_finish reads and applies the replies;
 * loop.c runs the next engine step between them (publish_overlap), so the
 * step does not wait for Redis. Events pushed meanwhile wait for the next
 * start; nothing else uses the connection or the batch in between; and the
 * replies are applied before anything else is sent, so every rule above
 * holds as with one w_flush.
 *
 * Called by the main thread only (loop.c), once per loop iteration. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "fence.h"
#include "rcluster.h"
#include "worker.h"
#include "xmux.h"

/* Room for element n of the array v of *cap elements of size bytes,
 * doubling from first: v itself when it has room, the grown array (*cap
 * updated), or NULL when out of memory (v is then unchanged and still the
 * caller's). */
static void *grow(void *v, int n, int *cap, size_t size, int first)
{
    if (n < *cap)
        return v;
    int c = *cap ? 2 * *cap : first;
    void *g = realloc(v, (size_t)c * size);
    if (g)
        *cap = c;
    return g;
}

int w_push_event(struct wjob *j, char *json)
{
    if (!j->out_key[0]) { /* no usable id: nowhere to write */
        free(json);
        return 0;
    }
    struct wout *o = grow(j->out, j->n_out, &j->cap_out, sizeof *o, 8);
    if (!o) {
        free(json);
        return -RL_ENOMEM;
    }
    j->out = o;
    struct ev_info info;
    struct rl_err err;
    int64_t seq = j->seq.next - 1;
    bool is_done = false;
    if (ev_parse(json, strlen(json), &info, &err) == 0) {
        seq = info.seq;
        is_done = info.type == EV_TYPE_DONE;
        ev_info_clear(&info);
    }
    struct wout *slot = &j->out[j->n_out++];
    *slot = (struct wout){.seq = seq, .json = json, .len = strlen(json), .is_done = is_done};
    if (j->cache_fill) {
        char **h = grow(j->hist, j->n_hist, &j->cap_hist, sizeof *h, 16);
        if (!h) {
            j->cache_fill = false; /* no cache entry, the job itself goes on */
            return 0;
        }
        j->hist = h;
        char *copy = strdup(json);
        if (!copy)
            j->cache_fill = false;
        else
            j->hist[j->n_hist++] = copy;
    }
    /* the cache keeps the event as the engine made it; the stream's first
     * event names this request (ident.c) */
    w_ident_stamp(j, seq, &slot->json, &slot->len);
    j->out_bytes += slot->len;
    return 0;
}

void w_outbox_drop(struct wjob *j)
{
    for (int k = 0; k < j->n_out; k++)
        free(j->out[k].json);
    j->n_out = 0;
    j->out_bytes = 0;
    free(j->dead);
    j->dead = NULL;
    free(j->cache_value);
    j->cache_value = NULL;
    j->cache_fill = false;
    w_hold_clear(j);
}

int w_push_done(struct worker *w, struct wjob *j, enum ev_finish fin,
                const struct engine_usage *u, const struct w_answer *a)
{
    int64_t now = rl_wall_ms();
    struct ev_done d = {.finish_reason = fin, .tool_calls = j->tool_calls,
                        .metadata = j->job ? j->job->metadata : NULL};
    if (a) {
        d.embedding = a->embedding;
        d.n_embedding = a->n_embedding;
        d.has_score = a->has_score;
        d.score = a->score;
        d.matched_stop = a->matched_stop;
    }
    if (u) {
        /* a resumed request was submitted as prompt + earlier tokens: give
         * the client the counts of the request it sent */
        d.prompt_tokens = u->prompt_tokens - j->n_prev;
        if (d.prompt_tokens < 0)
            d.prompt_tokens = 0;
        d.completion_tokens = u->completion_tokens + j->n_prev;
        d.reasoning_tokens = u->reasoning_tokens + j->prev_reasoning;
        d.cached_prompt_tokens = u->cached_prompt_tokens < d.prompt_tokens
                                     ? u->cached_prompt_tokens : d.prompt_tokens;
        d.speculated = strcmp(w->opt.speculative, "off") && j->job && j->job->speculative;
        d.spec_drafted = u->spec_drafted;
        d.spec_accepted = u->spec_accepted;
    } else if (j->job) {
        d.prompt_tokens = j->n_ids - j->n_prev > 0 ? j->n_ids - j->n_prev : 0;
    }
    int64_t t0 = j->t_enqueued > 0 && j->t_enqueued <= now ? j->t_enqueued : now;
    int64_t ta = j->t_admitted ? j->t_admitted : now;
    d.queue_ms = ta > t0 ? ta - t0 : 0;
    d.ttft_ms = j->t_first ? (j->t_first > t0 ? j->t_first - t0 : 0) : 0;
    d.total_ms = now - t0;
    char *json;
    struct rl_err err;
    int rc = ev_build_done(ev_seq_take(&j->seq), &d, &json, &err);
    if (rc)
        return rc;
    j->state = WJ_CLOSING;
    return w_push_event(j, json);
}

int w_push_error(struct worker *w, struct wjob *j, enum ev_code code, const char *msg)
{
    char *json;
    struct rl_err err;
    wm_error(&w->m, code);
    int rc = ev_build_error(ev_seq_take(&j->seq), code, msg, &json, &err);
    if (rc)
        return rc;
    if ((rc = w_push_event(j, json)))
        return rc;
    j->cache_fill = false;
    return w_push_done(w, j, EV_FINISH_ERROR, NULL, NULL);
}

int w_set_dead(struct worker *w, struct wjob *j, const char *raw, size_t raw_len,
               enum ev_code code, const char *msg)
{
    struct ev_dead d = {.job_raw = raw, .job_raw_len = raw_len, .job_id = j->id,
                        .pool = w->pools[j->pool], .entry_id = j->entry_id, .code = code,
                        .message = msg, .worker = w->opt.name, .deliveries = j->deliveries,
                        .time_ms = rl_wall_ms()};
    struct rl_err err;
    free(j->dead);
    j->dead = NULL;
    RL_LOG(&w->log, RL_LOG_WARN, "job %s (entry %s on %s): dead letter %s: %s",
           j->id[0] ? j->id : "-", j->entry_id, w->pools[j->pool], ev_code_name(code), msg);
    return ev_build_dead(&d, &j->dead, &err);
}

/* j's outbox waits for the coalescing tick (out_wait; coalesce_ms may
 * have been set to 0 by a reload since: then it waits no more). */
static bool waits_tick(const struct worker *w, const struct wjob *j)
{
    return j->out_wait && w->opt.coalesce_ms > 0;
}

bool w_has_pending(const struct worker *w)
{
    for (int i = 0; i < w->n_jobs; i++) {
        const struct wjob *j = w->jobs[i];
        /* a finished job waiting for the coalescing clock is not pending:
         * the loop waits for the tick, it does not spin (loop.c) */
        if (waits_tick(w, j) && !j->dead && !j->release)
            continue;
        if (j->n_out || j->dead || j->release || j->state != WJ_RUNNING)
            return true;
    }
    return false;
}

/* ---- w_flush: queue every command, send once, apply the replies --------- */

/* What a command of the flush was for: reply i answers items[i]. */
enum item_kind {
    IT_TAKE, IT_EMIT, IT_LEASE, IT_OTHER, IT_DEAD, IT_ACK, IT_CANCEL, IT_CACHE, IT_CLIENT, IT_HAND,
    IT_HB, IT_RELEASE, IT_LORAS
};

/* Events per job in one FENCE_EMIT: a backlog (Redis was away or full)
 * goes out in slices, so no one script call holds Redis for long; while
 * Redis refuses writes for memory, a retry sends only a probe's worth, as
 * its arguments take Redis memory too. */
#define EMIT_EVENTS_MAX 256
#define PROBE_EVENTS 8
/* The back-off between write attempts while Redis is out of memory, and
 * for one job whose writes Redis refuses otherwise. */
#define BACKOFF_MIN_MS 5
#define BACKOFF_MAX_MS 500
/* A running job's cancel key (and its client's lease key) is read in its
 * FENCE_EMIT of the first step it emits in once CHECK_MS has passed, so a
 * decoding job is checked every CHECK_MS at no command of its own; one with
 * nothing to emit (prefill, deltas held by coalesce_ms, a backlog backing
 * off) gets a standalone GET (and EXISTS) every CHECK_MS, or up to
 * CHECK_MS / 2 later when its held deltas are due by then (their emit
 * carries it: a worker that coalesces flushes once per coalesce_ms, not
 * once more for the check). A cancel therefore stops a job within CHECK_MS
 * + a step + a round trip while it emits, within 1.5 x CHECK_MS + a step +
 * a round trip otherwise (issue 27: per event, not per step per job). Not
 * every step: inside the script a check is a pcall, a GET and a reply
 * element, about a fifth of what a job's one-event emit costs Redis
 * (tests/bench/bench_fence.py: ~1.2 us of ~6), paid for every token when
 * each step carries it; a cancel is rare, and 50 ms late is no loss. */
#define CHECK_MS 50
/* A job's FENCE_TAKE and its XACK are riders: neither has to reach Redis
 * in the flush that could first send it, and each alone made a round
 * trip, i.e. a wake of Redis, of its own (after admission, the step
 * before the first token; after the done, the step after its tick). The
 * TAKE goes with the job's first events (always in front of them) or once
 * the job has run RIDE_MS without any (a long prefill); the XACK with the
 * next flush that sends anything else, or after RIDE_MS, or at once when
 * the engine runs nothing (no later flush is coming). Issue 27 point 3:
 * Redis's read events are per job as much as per token. */
#define RIDE_MS 50
#define CHECK_KEY_MAX (W_KEY_MAX + 64) /* <prefix>cancel:<id>, lease:<id> */
struct item {
    enum item_kind kind;
    struct wjob *j;
    int idx; /* IT_EMIT: its first job in flush.emits */
    int n;   /* IT_EMIT: how many jobs it carries */
    uint64_t pools; /* IT_LEASE: its pools, bit p for pool stream p */
};

/* A job whose unconfirmed events go in an IT_EMIT, and how many. */
struct emit {
    struct wjob *j;
    int n_ev;
    int n_check; /* 0; 1: its cancel key read too; 2: and its client's lease key */
    int slot;    /* its keys' slot on a cluster (its id's), 0 on a single instance */
    int order;   /* its place in the flush's job order, kept within a slot */
};

/* One flush being built: the pipeline and, in the same order, the items. */
struct flush {
    struct rconn_batch *b;
    struct item *items; /* (cap_items) owned here, freed by w_flush */
    int n_items, cap_items;
    struct emit *emits; /* (cap_emits) owned here, freed by w_flush */
    int n_emits, cap_emits;
    bool probe;         /* Redis was out of memory: PROBE_EVENTS per job */
    int n_writes;       /* commands queued that Redis refuses when out of memory */
    int n_oom;          /* replies: refused for memory (OOM) */
    int n_stored;       /* replies: such a write done */
    int64_t now;        /* wall clock when it was built */
    bool lease, hb;     /* it renews the leases / writes the heartbeat */
    struct rl_err *err;
};

/* Redis refused the command for memory: maxmemory reached under
 * noeviction ("OOM command not allowed when used memory > 'maxmemory'"),
 * directly or inside FENCE_EMIT ("XADD <k>: OOM ..."). */
static bool is_oom(const char *msg)
{
    return msg && (!strncmp(msg, "OOM", 3) || strstr(msg, ": OOM") != NULL);
}

static int add_item(struct flush *f, struct item it)
{
    struct item *g = grow(f->items, f->n_items, &f->cap_items, sizeof *g, 64);
    if (!g)
        return -RL_ENOMEM;
    f->items = g;
    f->items[f->n_items++] = it;
    return 0;
}

/* Queues one command (argv as rconn_batch_add takes it) and its item. */
static int queue_cmd(struct flush *f, struct item it, int argc, const char *const *argv,
                     const size_t *lens)
{
    int rc = rconn_batch_add(f->b, argc, argv, lens, f->err);
    return rc ? rc : add_item(f, it);
}

/* Queues an XADD of one field and its item. */
static int queue_xadd(struct flush *f, struct item it, const char *key, const char *id,
                      long maxlen, const char *field, const char *value, size_t len)
{
    const char *names[1] = {field}, *vals[1] = {value};
    size_t lens[1] = {len};
    int rc = rconn_batch_add_xadd(f->b, key, id, maxlen, 1, names, vals, lens, f->err);
    return rc ? rc : add_item(f, it);
}

/* The result-cache entry goes out ahead of the done event, in the same
 * pipeline: a client that has read done and sends the same job again must
 * find it (one flush later, that job's GET could run first). The entry is
 * the complete answer whether or not the done XADD lands; a broken
 * pipeline resends it with the events. */
static int queue_cache(struct worker *w, struct flush *f, struct wjob *j)
{
    if (j->state != WJ_RUNNING && j->cache_fill && !j->cache_value) {
        struct rl_err e2;
        if (w_cache_build(j, &e2)) {
            RL_LOG(&w->log, RL_LOG_WARN, "job %s: no cache entry: %s", j->id, e2.msg);
            j->cache_fill = false;
        }
    }
    if (!j->cache_value)
        return 0;
    char ttl[32];
    snprintf(ttl, sizeof ttl, "%d", w->opt.cache_ttl_s);
    const char *argv[5] = {"SET", j->cache_key, j->cache_value, "EX", ttl};
    f->n_writes++;
    return queue_cmd(f, (struct item){IT_CACHE, j, 0, 0, 0}, 5, argv, NULL);
}

/* FENCE_TAKE for a job that has not made this worker its holder yet, in
 * front of its first writes: a fresh delivery takes it only if no other
 * worker has (fence.h); a resumed one was taken before its stream was
 * read (resume.c), except when it was refused before that. */
static int queue_take(struct worker *w, struct flush *f, struct wjob *j)
{
    if (j->taken || !j->out_key[0] || j->state == WJ_DROPPED || j->fenced ||
        (j->n_out == 0 && j->state != WJ_RUNNING))
        return 0;
    /* nothing to write yet: rides with its first events (RIDE_MS) */
    if (j->n_out == 0 && j->t_admitted && f->now - j->t_admitted < RIDE_MS)
        return 0;
    const char *argv[FENCE_TAKE_ARGC];
    struct fence_take_buf b;
    int a = fence_take_cmd(&w->fence, argv, &b, j->own_key, j->out_key, w->holder, j->entry_id,
                           !j->resumed, j->deliveries, j->req, j->sha);
    f->n_writes++;
    return queue_cmd(f, (struct item){IT_TAKE, j, 0, 0, 0}, a, argv, NULL);
}

void w_checked_now(struct wjob *j)
{
    j->next_check_ms = rl_mono_ms() + CHECK_MS;
}

/* Whether j is a running job whose cancel key (and client lease) is read. */
static bool checked(const struct wjob *j)
{
    return j->state == WJ_RUNNING && j->eng_id && !j->cancel_sent && j->id[0];
}

/* The keys j's check reads (1 or 2): cancel:<id>, then lease:<id> when its
 * client holds a lease; in its hash-tag slot on a cluster. */
static int check_keys(const struct worker *w, const struct wjob *j, char (*keys)[CHECK_KEY_MAX])
{
    rcl_tagged_key(keys[0], CHECK_KEY_MAX, w_cluster(w), w->opt.prefix, "cancel:", j->id);
    if (!(j->job && j->job->client_lease_ms > 0))
        return 1;
    rcl_tagged_key(keys[1], CHECK_KEY_MAX, w_cluster(w), w->opt.prefix, "lease:", j->id);
    return 2;
}

/* Notes j's unconfirmed events (the first EMIT_EVENTS_MAX, or
 * PROBE_EVENTS) for the next FENCE_EMIT (queue_emit), unless j is backing
 * off a refusal; a running job's cancel check, when due, rides along
 * (*folded). */
static int collect_events(struct worker *w, struct flush *f, struct wjob *j, int64_t mono,
                          bool *folded)
{
    *folded = false;
    if (j->n_out == 0 || j->state == WJ_DROPPED || j->fenced || mono < j->retry_ms ||
        waits_tick(w, j))
        return 0;
    struct emit *g = grow(f->emits, f->n_emits, &f->cap_emits, sizeof *g, 64);
    if (!g)
        return rl_errf(f->err, RL_ENOMEM, "flush: out of memory");
    f->emits = g;
    int n = j->n_out, cap = f->probe ? PROBE_EVENTS : EMIT_EVENTS_MAX, n_check = 0;
    if (checked(j) && !w->checks_apart && mono >= j->next_check_ms) {
        char keys[2][CHECK_KEY_MAX];
        n_check = check_keys(w, j, keys);
        j->next_check_ms = mono + CHECK_MS;
        *folded = true;
    }
    int slot = w_cluster(w) ? rcl_key_slot(j->out_key, strlen(j->out_key)) : 0;
    f->emits[f->n_emits] = (struct emit){j, n < cap ? n : cap, n_check, slot, f->n_emits};
    f->n_emits++;
    f->n_writes++;
    return 0;
}

/* May this worker ring the bell? Said in the log when the answer changes. */
static void bell_probe(struct worker *w)
{
    /* on a cluster a bell of a slot (any: the ACL's pattern is what is
     * asked), as the emits ring: an ACL granting the single instance's bell
     * alone would refuse every emit script that names one. Named once:
     * called when connected, so whether Redis is a cluster is known */
    if (!w->bell_key[0])
        rcl_bell_key(w->bell_key, sizeof w->bell_key, w_cluster(w), w->opt.prefix, 0);
    struct rl_err e;
    if (xmux_ringer_check(&w->ringer, w->rc, w->bell_key, &e))
        RL_LOG(&w->log, w->ringer.on > 0 ? RL_LOG_DEBUG : RL_LOG_WARN,
               w->ringer.on > 0 ? "ringing %s with every emit" :
                    "not ringing %s (%s): the front door's shared reader reads this "
                    "worker's streams only once a second, until it blocks on every "
                    "stream again; config/redis-acl.conf lets workers ring it",
               w->bell_key, e.msg);
}

/* One FENCE_EMIT over the jobs collected since the last: per job its
 * keys, then its TTL after done (or "0"), pub/sub channel (or ""), the
 * number of events and their (entry ID, JSON) pairs (fence.c). */
static int queue_emit(struct worker *w, struct flush *f, int first, int end)
{
    int n_jobs = end - first;
    if (n_jobs <= 0)
        return 0;
    int n_ev = 0, n_keys = 0;
    for (int g = first; g < end; g++) {
        n_ev += f->emits[g].n_ev;
        n_keys += 2 + f->emits[g].n_check;
    }
    /* the bell of the streams' slot: on a cluster every call's jobs share one */
    char bell_key[W_KEY_MAX + 16];
    bool bell = w->ringer.on > 0 && rcl_bell_key(bell_key, sizeof bell_key, w_cluster(w),
                                                  w->opt.prefix, f->emits[first].slot) > 0;
    int n = 6 + n_keys + 5 * n_jobs + 2 * n_ev;
    const char **argv = malloc((size_t)n * sizeof *argv);
    size_t *lens = malloc((size_t)n * sizeof *lens);
    char(*ids)[EV_STREAM_ID_MAX] = malloc((size_t)(n_ev ? n_ev : 1) * sizeof *ids);
    /* per job: TTL, event count, check count, channel, check keys */
    char(*nums)[3][24] = malloc((size_t)n_jobs * sizeof *nums);
    char(*chans)[W_KEY_MAX + WOPTS_STR_MAX + 64] = malloc((size_t)n_jobs * sizeof *chans);
    char(*cks)[2][CHECK_KEY_MAX] = malloc((size_t)n_jobs * sizeof *cks);
    char nk[12];
    int rc = 0;
    if (!argv || !lens || !ids || !nums || !chans || !cks) {
        rc = rl_errf(f->err, RL_ENOMEM, "flush: out of memory");
        goto out;
    }
    int a = fence_cmd(&w->fence, FENCE_EMIT, n_keys + bell, argv, nk);
    for (int g = first; g < end; g++) {
        const struct emit *em = &f->emits[g];
        argv[a++] = em->j->out_key;
        argv[a++] = em->j->own_key;
        if (em->n_check)
            check_keys(w, em->j, cks[g - first]);
        for (int c = 0; c < em->n_check; c++)
            argv[a++] = cks[g - first][c];
    }
    if (bell)
        argv[a++] = bell_key;
    argv[a++] = w->holder;
    argv[a++] = bell ? "1" : "0";
    for (int i = 0; i < a; i++)
        lens[i] = strlen(argv[i]);
    for (int g = first, e = 0; g < end; g++) {
        struct wjob *j = f->emits[g].j;
        int q = g - first;
        snprintf(nums[q][0], sizeof nums[q][0], "0");
        for (int k = 0; k < f->emits[g].n_ev; k++)
            if (j->out[k].is_done)
                snprintf(nums[q][0], sizeof nums[q][0], "%d", j->stream_ttl_s);
        snprintf(nums[q][1], sizeof nums[q][1], "%d", f->emits[g].n_ev);
        snprintf(nums[q][2], sizeof nums[q][2], "%d", f->emits[g].n_check);
        chans[q][0] = 0;
        if (w->opt.publish)
            rcl_tagged_key(chans[q], sizeof chans[q], w_cluster(w), w->opt.prefix, "tok:", j->id);
        /* the pool entry too: the holder record must be this job's, not
         * only this process's (another job of ours may own the id: ident.c) */
        const char *head[5] = {nums[q][0], chans[q], j->entry_id, nums[q][1], nums[q][2]};
        for (int h = 0; h < 5; h++) {
            lens[a] = strlen(head[h]);
            argv[a++] = head[h];
        }
        for (int k = 0; k < f->emits[g].n_ev; k++, e++) {
            ev_stream_id(j->out[k].seq, ids[e]);
            lens[a] = strlen(ids[e]);
            argv[a++] = ids[e];
            lens[a] = j->out[k].len;
            argv[a++] = j->out[k].json;
        }
    }
    rc = queue_cmd(f, (struct item){.kind = IT_EMIT, .idx = first, .n = n_jobs}, a, argv, lens);
out:
    free(argv);
    free(lens);
    free(ids);
    free(nums);
    free(chans);
    free(cks);
    return rc;
}

static int by_slot(const void *a, const void *b)
{
    const struct emit *x = a, *y = b;
    return x->slot != y->slot ? (x->slot > y->slot) - (x->slot < y->slot)
                              : (x->order > y->order) - (x->order < y->order);
}

/* Every emit of the flush, after every job's other commands (a job's
 * FENCE_TAKE and result-cache SET come before its events; its XACK waits
 * for the flush after its last event is confirmed, so none is in this
 * one): one FENCE_EMIT for all of them on a single instance; on a cluster,
 * where a script's keys share one slot, one per slot. Jobs whose ids share
 * a slot (the request slots, common/rcluster.h) thus cost one call per
 * master a step, as on a single instance, and ids of a slot each one call
 * per job. */
static int queue_emits(struct worker *w, struct flush *f)
{
    if (!w_cluster(w))
        return queue_emit(w, f, 0, f->n_emits);
    if (f->n_emits > 1) /* none: emits may be NULL, which qsort may not take */
        qsort(f->emits, (size_t)f->n_emits, sizeof *f->emits, by_slot);
    int rc = 0;
    for (int g = 0, end; g < f->n_emits && !rc; g = end) {
        for (end = g + 1; end < f->n_emits && f->emits[end].slot == f->emits[g].slot; end++)
            ;
        rc = queue_emit(w, f, g, end);
    }
    return rc;
}

/* The XACK of a finished job and the XDEL of its entry once no group needs
 * it (common/qack.h): the pool streams hold only jobs not yet finished
 * (bounded storage, schemas/README.md), and a refused 50 MB job leaves
 * nothing. Its reply is the XACK's (IT_ACK). */
static int queue_ack(struct worker *w, struct flush *f, struct wjob *j)
{
    const char *argv[6];
    char nk[12];
    int a = fence_cmd(&w->fence, FENCE_ACK, 1, argv, nk);
    argv[a++] = w->pool_keys[j->pool];
    argv[a++] = w->opt.group;
    argv[a++] = j->entry_id;
    return queue_cmd(f, (struct item){IT_ACK, j, 0, 0, 0}, a, argv, NULL);
}

/* j, for an adapter another worker reads the stream of, moved there
 * (handoff.c): its fields as the dispatcher forwarded them, and entry0,
 * so that it keeps its identity, seed and queue time. Its reply is
 * IT_HAND's. */
static int queue_handoff(struct worker *w, struct flush *f, struct wjob *j)
{
    /* a job taken over: the holder record follows it (handoff.c) */
    bool pend = j->resumed;
    const char *argv[24] = {"EVAL", w_handoff_lua, pend ? "3" : "2", w->pool_keys[j->pool],
                            j->hand_key};
    size_t lens[24] = {0};
    int a = 5, raw_at;
    if (pend)
        argv[a++] = j->own_key;
    argv[a++] = w->opt.group;
    argv[a++] = j->entry_id;
    argv[a++] = w->opt.name;
    argv[a++] = "job";
    raw_at = a;
    argv[a++] = j->raw;
    char dlv[24];
    snprintf(dlv, sizeof dlv, "%lld", (long long)j->deliveries);
    const char *e0 = j->entry0[0] ? j->entry0 : j->entry_id;
    const char *kv[] = {"entry0", e0, "moved", pend ? "pending" : "handoff", "dlv", pend ? dlv : "",
                        "req", j->req, "sha", j->sha, "tenant", j->tenant};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i += 2)
        if (kv[i + 1][0]) {
            argv[a++] = kv[i];
            argv[a++] = kv[i + 1];
        }
    for (int i = 0; i < a; i++)
        lens[i] = i == raw_at ? j->raw_len : strlen(argv[i]);
    return queue_cmd(f, (struct item){IT_HAND, j, 0, 0, 0}, a, argv, lens);
}

/* The XACKs due (RIDE_MS): with the rest of a flush that sends anything,
 * or once one has waited RIDE_MS, or at once when nothing runs. Queued
 * last: each job's done was confirmed by an earlier flush, so its order
 * against this flush's other commands does not matter. */
static int queue_acks(struct worker *w, struct flush *f, int64_t mono)
{
    bool now = rconn_batch_count(f->b) > 0 || engine_n_active(w->eng) == 0;
    for (int i = 0; i < w->n_jobs; i++) {
        struct wjob *j = w->jobs[i];
        int rc;
        if (j->state == WJ_HANDING && (rc = queue_handoff(w, f, j)))
            return rc;
        if (j->state != WJ_ACKING)
            continue;
        if (!j->t_ack_due)
            j->t_ack_due = mono;
        if ((now || mono - j->t_ack_due >= RIDE_MS) && (rc = queue_ack(w, f, j)))
            return rc;
    }
    return 0;
}

/* j's pending dead letter and, while it runs with nothing emitted in this
 * flush (folded: its FENCE_EMIT reads them), the GET of its cancel key and
 * the EXISTS of its client's lease, every CHECK_MS at most. */
static int queue_job_state(struct worker *w, struct flush *f, struct wjob *j, bool writes,
                           bool folded, int64_t mono)
{
    char buf[W_KEY_MAX + WOPTS_STR_MAX + 64];
    int rc;
    if (j->dead && writes) {
        f->n_writes++;
        rcl_queue_key(buf, sizeof buf, w_cluster(w), w->opt.prefix, "dead");
        if ((rc = queue_xadd(f, (struct item){IT_DEAD, j, 0, 0, 0}, buf, "*", w->opt.dead_maxlen,
                             "dead", j->dead, strlen(j->dead))))
            return rc;
    }
    /* deltas held by coalesce_ms whose emit (which will carry the check)
     * is due within CHECK_MS / 2: no round trip of its own meanwhile */
    bool emit_soon = j->t_hold && w->opt.coalesce_ms > 0 &&
                     w->hold_tick_ms + w->opt.coalesce_ms - f->now <= CHECK_MS / 2;
    if (checked(j) && !folded && !emit_soon && mono >= j->next_check_ms) {
        char keys[2][CHECK_KEY_MAX];
        int n_check = check_keys(w, j, keys);
        j->next_check_ms = mono + CHECK_MS;
        const char *argv[2] = {"GET", keys[0]}; /* whose cancel it is: ident.c */
        if ((rc = queue_cmd(f, (struct item){IT_CANCEL, j, 0, 0, 0}, 2, argv, NULL)))
            return rc;
        if (n_check > 1) { /* its client's front end alive? */
            const char *la[2] = {"EXISTS", keys[1]};
            if ((rc = queue_cmd(f, (struct item){IT_CLIENT, j, 0, 0, 0}, 2, la, NULL)))
                return rc;
        }
    }
    return 0;
}

/* A lease is renewed only for what this worker still owns, so a long
 * generation is never taken for a dead consumer's, and a renewal never
 * takes a job back from the worker that reclaimed it: FENCE_LEASE over
 * every job held, one call for all pools on a single instance, one per
 * pool on a cluster (fence.h). */
_Static_assert(W_MAX_STREAMS <= 64, "IT_LEASE's pools are bits of a uint64_t");
static bool leased(const struct wjob *j, int pool)
{
    return j->pool == pool && (j->state == WJ_RUNNING || j->state == WJ_CLOSING) && !j->fenced;
}

static int queue_lease(struct worker *w, struct flush *f)
{
    bool cluster = w_cluster(w); /* a script's keys share one slot: one pool per call */
    int n_jobs[W_MAX_STREAMS] = {0}, n_ids = 0;
    uint64_t mask = 0;
    for (int p = 0; p < w->n_pools; p++) {
        for (int i = 0; i < w->n_jobs; i++)
            n_jobs[p] += leased(w->jobs[i], p);
        n_ids += n_jobs[p];
    }
    if (!n_ids)
        return 0;
    const char **argv = malloc((size_t)(n_ids + 4 * w->n_pools + 6) * sizeof *argv);
    char(*counts)[12] = malloc((size_t)w->n_pools * sizeof *counts);
    int rc = 0;
    if (!argv || !counts) {
        rc = rl_errf(f->err, RL_ENOMEM, "flush: out of memory");
        goto out;
    }
    for (int p0 = 0; p0 < w->n_pools;) {
        /* the pools of this call: [p0, p1) with jobs, all of them when not a cluster */
        int p1 = p0, n_keys = 0;
        mask = 0;
        for (; p1 < w->n_pools && (!cluster || n_keys == 0); p1++)
            if (n_jobs[p1]) {
                mask |= UINT64_C(1) << p1;
                n_keys++;
            }
        p0 = p1;
        if (!n_keys)
            break;
        char nk[12];
        int a = fence_cmd(&w->fence, FENCE_LEASE, n_keys, argv, nk);
        for (int p = 0; p < w->n_pools; p++)
            if (mask & (UINT64_C(1) << p))
                argv[a++] = w->pool_keys[p];
        argv[a++] = w->opt.group;
        argv[a++] = w->opt.name;
        for (int p = 0; p < w->n_pools; p++) {
            if (!(mask & (UINT64_C(1) << p)))
                continue;
            snprintf(counts[p], sizeof counts[p], "%d", n_jobs[p]);
            argv[a++] = counts[p];
            for (int i = 0; i < w->n_jobs; i++)
                if (leased(w->jobs[i], p))
                    argv[a++] = w->jobs[i]->entry_id;
        }
        if ((rc = queue_cmd(f, (struct item){IT_LEASE, NULL, 0, 0, mask}, a, argv, NULL)))
            break;
    }
out:
    free(argv);
    free(counts);
    return rc;
}

/* The heartbeat SET <prefix>worker:<name> (nothing when it cannot be
 * built). While Redis is out of memory the SET is refused, so an EXPIRE
 * (which it takes) keeps the last value alive: the worker stays in the
 * dispatcher's view; without writes, only that. */
static int queue_heartbeat(struct worker *w, struct flush *f, bool writes)
{
    char buf[W_KEY_MAX + WOPTS_STR_MAX + 64], ttl[32];
    snprintf(buf, sizeof buf, "%sworker:%s", w->opt.prefix, w->opt.name);
    snprintf(ttl, sizeof ttl, "%d", w->opt.heartbeat_ttl_s);
    int rc;
    if (w->redis_oom) {
        const char *ea[3] = {"EXPIRE", buf, ttl};
        if ((rc = queue_cmd(f, (struct item){IT_OTHER, NULL, 0, 0, 0}, 3, ea, NULL)))
            return rc;
    }
    if (!writes)
        return 0;
    char *v = wm_heartbeat_json(w);
    if (!v)
        return 0;
    const char *argv[5] = {"SET", buf, v, "EX", ttl};
    f->n_writes++;
    rc = queue_cmd(f, (struct item){IT_HB, NULL, 0, 0, 0}, 5, argv, NULL);
    free(v);
    if (rc)
        return rc;
    /* the fleet's runtime adapters (lorart.c), read in the same round trip */
    if (w_lorart_wanted(w)) {
        char lk[W_KEY_MAX];
        w_lorart_key(w, lk);
        const char *la[2] = {"HGETALL", lk};
        if ((rc = queue_cmd(f, (struct item){IT_LORAS, NULL, 0, 0, 0}, 2, la, NULL)))
            return rc;
    }
    /* the registry of workers (schemas/README.md): the dispatcher reads its
     * members' heartbeats instead of SCANning the key space; names silent
     * for a day are pruned, which a minute's delay does not change: once a
     * minute, not with every heartbeat (issue 27: per worker-second work) */
    char reg[W_KEY_MAX], score[32], old[32];
    int64_t now = rl_wall_ms();
    snprintf(reg, sizeof reg, "%sworkers", w->opt.prefix);
    snprintf(score, sizeof score, "%lld", (long long)now);
    snprintf(old, sizeof old, "(%lld", (long long)(now - 86400000));
    const char *za[4] = {"ZADD", reg, score, w->opt.name};
    const char *zr[4] = {"ZREMRANGEBYSCORE", reg, "-inf", old};
    if ((rc = queue_cmd(f, (struct item){IT_OTHER, NULL, 0, 0, 0}, 4, za, NULL)) ||
        now < w->next_prune_ms)
        return rc;
    w->next_prune_ms = now + 60000;
    return queue_cmd(f, (struct item){IT_OTHER, NULL, 0, 0, 0}, 4, zr, NULL);
}

/* FENCE_RELEASE of a job given up (give_up): its entry, if still ours,
 * is claimable at once and this delivery does not count as a stall. */
static int queue_release(struct worker *w, struct flush *f, struct wjob *j)
{
    j->release = false;
    const char *argv[FENCE_RELEASE_ARGC];
    struct fence_release_buf b;
    int a = fence_release_cmd(&w->fence, argv, &b, w->pool_keys[j->pool], w->opt.group,
                              w->opt.name, j->entry_id, w->opt.claim_idle_ms);
    return queue_cmd(f, (struct item){IT_RELEASE, j, 0, 0, 0}, a, argv, NULL);
}

/* The value r of j's cancel key (GET, or read by FENCE_EMIT): a cancel
 * meant for this request stops it in the engine. */
/* A hand-off's reply: moved (gone from here), no longer ours (taken over
 * meanwhile: gone from here too), or refused (an ACL without XADD on the
 * queue, Redis out of memory): then answered MODEL_NOT_FOUND, as a worker
 * without the adapter did before. No reply (the connection lost): tried
 * again with the next flush, which the script makes harmless. */
static void apply_handoff(struct worker *w, struct wjob *j, const struct rconn_reply *r)
{
    if (!r)
        return;
    if (r->type == RCONN_INTEGER && r->integer == 1) {
        RL_LOG(&w->log, RL_LOG_INFO, "job %s: model %s is a LoRA adapter this worker lacks: "
               "moved to %s, which workers holding it read", j->id, j->job->model, j->hand_key);
        pthread_mutex_lock(&w->m.mu);
        w->m.handed_off++;
        pthread_mutex_unlock(&w->m.mu);
        j->state = 0;
    } else if (r->type == RCONN_INTEGER) {
        RL_LOG(&w->log, RL_LOG_DEBUG, "job %s: entry %s is no longer ours; not moved", j->id,
               j->entry_id);
        j->state = 0;
    } else {
        RL_LOG(&w->log, RL_LOG_WARN, "job %s: moving it to %s: %s; answered MODEL_NOT_FOUND",
               j->id, j->hand_key, r->type == RCONN_ERROR && r->str ? r->str : "unexpected reply");
        w_reject_model(w, j, j->raw, j->raw_len);
    }
}

static void apply_cancel(struct worker *w, struct wjob *j, const struct rconn_reply *r)
{
    if (w_ident_cancel_meant(j, r) && j->eng_id && !j->cancel_sent) {
        struct rl_err e2;
        RL_LOG(&w->log, RL_LOG_INFO, "job %s: cancelled by its cancel key", j->id);
        j->cancel_sent = true;
        if (engine_cancel(w->eng, j->eng_id, &e2))
            RL_LOG(&w->log, RL_LOG_DEBUG, "job %s: cancel: %s", j->id, e2.msg);
    }
}

/* EXISTS r of j's client lease key. The front end renews the lease every
 * third of client_lease_ms; one missing for a whole lease more (a Redis
 * that came back without it gets that long to see it renewed) means the
 * front end died. */
static void apply_client(struct worker *w, struct wjob *j, const struct rconn_reply *r)
{
    if (!r || r->type != RCONN_INTEGER || !j->eng_id || j->cancel_sent)
        return;
    if (r->integer > 0) {
        j->lease_gone_ms = 0;
    } else if (!j->lease_gone_ms) {
        j->lease_gone_ms = rl_mono_ms();
    } else if (rl_mono_ms() - j->lease_gone_ms >= j->job->client_lease_ms) {
        struct rl_err e2;
        RL_LOG(&w->log, RL_LOG_WARN, "job %s: cancelled: its client's lease expired (the "
               "front end that queued it is gone)", j->id);
        j->cancel_sent = true;
        if (engine_cancel(w->eng, j->eng_id, &e2))
            RL_LOG(&w->log, RL_LOG_DEBUG, "job %s: cancel: %s", j->id, e2.msg);
    }
}

/* One job's answer e from an IT_EMIT that carried n of its events
 * (fence.c): confirmed, FENCED, or "XADD <k>: <error>" with the k before
 * it confirmed. Nothing after a refused event was written, and nothing
 * unconfirmed is ever dropped: it is sent again, after a back-off. */
static void apply_emit_job(struct worker *w, struct flush *f, struct wjob *j, int n,
                           const struct rconn_reply *e)
{
    int ok = n;
    const char *why = NULL;
    if (e->type == RCONN_ERROR) {
        if (fence_is_fenced(e)) {
            /* before our own FENCE_TAKE has answered (a refused or lost
             * take), FENCED only means "not yet": the next flush takes */
            if (j->taken)
                j->fenced = true;
            return;
        }
        ok = strncmp(e->str, "XADD ", 5) ? 0 : atoi(e->str + 5);
        why = e->str;
    } else if (e->type != RCONN_INTEGER) {
        ok = 0;
        why = "unexpected reply";
    }
    for (int k = 0; k < ok && k < n && k < j->n_out; k++) {
        struct wout *o = &j->out[k];
        j->out_bytes -= o->len;
        free(o->json);
        o->json = NULL; /* confirmed */
    }
    if (ok > 0 || !why)
        f->n_stored++;
    if (!why) {
        if (j->n_refused)
            RL_LOG(&w->log, RL_LOG_INFO, "job %s: Redis stores its events again", j->id);
        j->n_refused = 0;
        j->retry_ms = 0;
        return;
    }
    if (is_oom(why)) {
        f->n_oom++; /* the worker's back-off, reported once (note_writes) */
        return;
    }
    /* another refusal: this job alone waits, its later events held back */
    if (j->n_refused++ == 0)
        RL_LOG(&w->log, RL_LOG_WARN, "job %s: XADD seq %" PRId64 " refused: %s; retrying with "
               "back-off, its later events held back", j->id,
               ok < j->n_out ? j->out[ok].seq : (int64_t)-1, why);
    int64_t b = (int64_t)BACKOFF_MIN_MS << (j->n_refused < 8 ? j->n_refused : 8);
    j->retry_ms = rl_mono_ms() + (b < BACKOFF_MAX_MS ? b : BACKOFF_MAX_MS);
}

/* An IT_EMIT's reply: one element per job, or one error for all (a
 * NOSCRIPT: sent again, whole, with the next flush). */
static void apply_emit(struct worker *w, struct flush *f, const struct item *it,
                       const struct rconn_reply *r)
{
    if (!r || fence_noscript(&w->fence, FENCE_EMIT, r))
        return; /* no reply: resent with the next flush */
    if (r->type == RCONN_ERROR && !strncmp(r->str, "NOPERM", 6) && !w->checks_apart)
        for (int g = 0; g < it->n; g++)
            if (f->emits[it->idx + g].n_check) {
                /* an ACL from before the checks were folded in (its eval
                 * selector lacks cancel:* and lease:*): send them apart */
                RL_LOG(&w->log, RL_LOG_WARN, "FENCE_EMIT refused with the cancel and lease "
                       "keys in it (%s): checking them with GET/EXISTS instead; update the "
                       "worker's ACL (config/redis-acl.conf)", r->str);
                w->checks_apart = true;
                break;
            }
    size_t e = 0; /* per job: its answer, then its n_check check replies */
    for (int g = 0; g < it->n; g++) {
        const struct emit *em = &f->emits[it->idx + g];
        if (r->type != RCONN_ARRAY) { /* one error for all: no check read either */
            apply_emit_job(w, f, em->j, em->n_ev, r);
            continue;
        }
        if (e < r->n_elem)
            apply_emit_job(w, f, em->j, em->n_ev, &r->elem[e]);
        e++;
        for (int c = 0; c < em->n_check; c++, e++)
            if (e < r->n_elem) {
                if (c == 0)
                    apply_cancel(w, em->j, &r->elem[e]);
                else
                    apply_client(w, em->j, &r->elem[e]);
            }
    }
}

/* FENCE_LEASE's answer for the pools of mask (one array each, in pool
 * order): the entries it did not renew belong to another worker now (or
 * to nobody: acknowledged by the one that finished them). */
static void apply_lease(struct worker *w, uint64_t mask, const struct rconn_reply *r)
{
    if (!r || fence_noscript(&w->fence, FENCE_LEASE, r))
        return;
    if (r->type != RCONN_ARRAY) {
        RL_LOG(&w->log, RL_LOG_WARN, "lease renewal: %s",
               r->type == RCONN_ERROR ? r->str : "unexpected reply");
        return;
    }
    size_t k = 0;
    for (int p = 0; p < w->n_pools; p++) {
        if (!(mask & (UINT64_C(1) << p)))
            continue;
        const struct rconn_reply *lost = k < r->n_elem ? &r->elem[k] : NULL;
        k++;
        if (!lost || lost->type != RCONN_ARRAY)
            continue;
        for (size_t e = 0; e < lost->n_elem; e++)
            for (int i = 0; i < w->n_jobs; i++) {
                struct wjob *j = w->jobs[i];
                if (leased(j, p) && lost->elem[e].str && !strcmp(j->entry_id, lost->elem[e].str)) {
                    RL_LOG(&w->log, RL_LOG_WARN, "job %s (entry %s): its lease was taken over",
                           j->id[0] ? j->id : "-", j->entry_id);
                    j->fenced = true;
                }
            }
    }
}

/* What reply r (NULL: none came) means for the item that asked: a holder
 * record taken, events confirmed, leases renewed, a dead letter sent, a
 * job acknowledged (state 0 marks it for removal), a cancel key found. */
static void apply_reply(struct worker *w, struct flush *f, struct item *it,
                        const struct rconn_reply *r)
{
    bool is_err = r && r->type == RCONN_ERROR;
    if (is_err && it->kind != IT_EMIT && is_oom(r->str)) { /* reported once: note_writes */
        f->n_oom++;
        return;
    }
    switch (it->kind) {
    case IT_TAKE:
        if (!r || fence_noscript(&w->fence, FENCE_TAKE, r))
            break;
        if (r->type == RCONN_INTEGER)
            f->n_stored++;
        if (r->type == RCONN_INTEGER && r->integer <= FENCE_DUPLICATE) {
            it->j->ident = (int)r->integer; /* another request owns the id: settle_jobs */
        } else if (r->type == RCONN_INTEGER && r->integer < 0) {
            it->j->fenced = true; /* reclaimed before we had started */
        } else if (r->type == RCONN_INTEGER) {
            it->j->taken = true; /* (its stalls matter only to a resumed job: resume.c) */
        } else {
            RL_LOG(&w->log, RL_LOG_WARN, "job %s: taking the holder record: %s", it->j->id,
                   is_err ? r->str : "unexpected reply");
        }
        break;
    case IT_EMIT:
        apply_emit(w, f, it, r);
        break;
    case IT_LEASE:
        apply_lease(w, it->pools, r);
        break;
    case IT_CACHE: /* best effort: a refused SET is logged, not retried */
        if (is_err)
            RL_LOG(&w->log, RL_LOG_WARN, "job %s: cache SET: %s", it->j->id, r->str);
        free(it->j->cache_value);
        it->j->cache_value = NULL;
        it->j->cache_fill = false;
        break;
    case IT_DEAD:
        if (r && !is_err)
            f->n_stored++;
        if (r && !is_err) {
            free(it->j->dead);
            it->j->dead = NULL;
        } else {
            RL_LOG(&w->log, RL_LOG_WARN, "job %s: dead letter XADD: %s", it->j->id, r->str);
        }
        break;
    case IT_ACK:
        if (fence_noscript(&w->fence, FENCE_ACK, r))
            break; /* still ACKING: again, by EVAL, with the next flush */
        if (!is_err) {
            it->j->state = 0; /* marks it for removal below */
            if (w->admit_cap > 0 && ++w->admit_cap >= w->opt.max_batch)
                w->admit_cap = 0; /* back to full admission */
        } else {
            RL_LOG(&w->log, RL_LOG_WARN, "job %s: XACK: %s", it->j->id, r->str);
        }
        break;
    case IT_HAND:
        apply_handoff(w, it->j, r);
        break;
    case IT_CANCEL:
        apply_cancel(w, it->j, r);
        break;
    case IT_CLIENT:
        apply_client(w, it->j, r);
        break;
    case IT_HB:
        if (r && !is_err)
            f->n_stored++;
        /* fall through */
    case IT_OTHER:
        if (is_err)
            RL_LOG(&w->log, RL_LOG_WARN, "flush: %s", r->str);
        break;
    case IT_LORAS:
        w_lorart_reply(w, r);
        break;
    case IT_RELEASE:
        if (fence_noscript(&w->fence, FENCE_RELEASE, r))
            it->j->release = true; /* again with the next flush */
        else if (is_err)
            RL_LOG(&w->log, RL_LOG_DEBUG, "job %s: releasing entry %s: %s", it->j->id,
                   it->j->entry_id, r->str);
        break;
    }
}

static void remove_job(struct worker *w, int i)
{
    w_job_free(w->jobs[i]);
    w->jobs[i] = w->jobs[--w->n_jobs];
}

/* Stops j here and forgets what it holds unsent: its outbox, dead
 * letter, cache entry and held deltas. A job still in the engine is
 * cancelled and waits for the cancel's final event (loop.c: WJ_DROPPED)
 * before it is freed; one that is not goes with the next settle_jobs. */
static void stop_job(struct worker *w, struct wjob *j)
{
    w_outbox_drop(j);
    j->fenced = false;
    if (!j->eng_id) {
        j->state = 0; /* removed by settle_jobs */
        return;
    }
    struct rl_err err;
    if (!j->cancel_sent && engine_cancel(w->eng, j->eng_id, &err))
        RL_LOG(&w->log, RL_LOG_DEBUG, "job %s: cancel: %s", j->id, err.msg);
    j->cancel_sent = true;
    j->state = WJ_DROPPED;
}

/* Another worker holds j now (fence.h): stop generating, send nothing
 * more, never acknowledge; its new holder resumes from what reached the
 * stream and finishes it. */
static void drop_job(struct worker *w, struct wjob *j)
{
    RL_LOG(&w->log, RL_LOG_WARN, "job %s (entry %s): another worker holds it now; stopping it "
           "here after %d tokens", j->id[0] ? j->id : "-", j->entry_id, j->n_gen);
    pthread_mutex_lock(&w->m.mu);
    w->m.fenced++;
    pthread_mutex_unlock(&w->m.mu);
    stop_job(w, j);
}

/* Redis will not store j's events and j cannot wait any longer (more than
 * publish_buffer_kb of them, or its deadline passed): stop it here, never
 * acknowledge it, and hand its entry back (FENCE_RELEASE with the next
 * flush). Whoever claims it next (this worker too, once Redis takes
 * writes again) resumes it from the last event in its stream (resume.c),
 * so the client reads one gapless stream, later. */
static void give_up(struct worker *w, struct wjob *j, const char *why)
{
    RL_LOG(&w->log, RL_LOG_WARN, "job %s (entry %s): given up (%s): %d events (%zu bytes) Redis "
           "has not stored; left pending, unacknowledged, to be resumed from its last stored "
           "event", j->id[0] ? j->id : "-", j->entry_id, why, j->n_out, j->out_bytes);
    pthread_mutex_lock(&w->m.mu);
    w->m.jobs_given_up++;
    pthread_mutex_unlock(&w->m.mu);
    j->release = true;
    stop_job(w, j);
    w_reclaim_first(w);
}

/* Gives up every job that has waited too long for Redis to store its
 * events: over publish_buffer_kb of them, or past its deadline while
 * Redis refuses (or is away). */
static void give_up_due(struct worker *w)
{
    size_t bound = (size_t)w->opt.publish_buffer_kb * 1024;
    int64_t now = rl_wall_ms();
    bool away = !rconn_connected(w->rc);
    for (int i = 0; i < w->n_jobs; i++) {
        struct wjob *j = w->jobs[i];
        if ((j->state != WJ_RUNNING && j->state != WJ_CLOSING) || !j->n_out || j->fenced)
            continue;
        bool blocked = w->redis_oom || j->n_refused || away;
        if (j->out_bytes > bound)
            give_up(w, j, "publish_buffer_kb");
        else if (blocked && j->job && j->job->deadline_ms > 0 && now >= j->job->deadline_ms)
            give_up(w, j, "its deadline passed");
    }
}

/* After the replies: drop what another worker took, compact outboxes,
 * remove acknowledged and finished dropped jobs, and move a closing job
 * whose events are all confirmed to ACKING (acknowledged with the next
 * flush). */
static void settle_jobs(struct worker *w)
{
    for (int i = 0; i < w->n_jobs; i++) {
        struct wjob *j = w->jobs[i];
        if (j->fenced)
            drop_job(w, j);
        else if (j->ident && j->state != WJ_DROPPED)
            w_ident_refuse(w, j, j->ident); /* nothing of it reaches its id's stream */
        int k2 = 0;
        for (int k = 0; k < j->n_out; k++)
            if (j->out[k].json)
                j->out[k2++] = j->out[k];
        j->n_out = k2;
    }
    for (int i = 0; i < w->n_jobs;) {
        struct wjob *j = w->jobs[i];
        if (j->state == 0 && !j->release) {
            remove_job(w, i);
            continue;
        }
        if (j->state == WJ_CLOSING && j->n_out == 0 && !j->dead)
            j->state = WJ_ACKING; /* acknowledged with the next flush */
        i++;
    }
}

void w_oom_seen(struct worker *w, int n_ev, int n_jobs)
{
    int64_t now = rl_mono_ms();
    if (!w->redis_oom) {
        /* multiplicative decrease, as TCP does for congestion: Redis holds
         * every running job's half-written stream, which no reader can
         * free before its done */
        struct engine_stats st;
        engine_get_stats(w->eng, &st);
        int cap = w->admit_cap > 0 && w->admit_cap < st.n_slots_used ? w->admit_cap
                                                                      : st.n_slots_used;
        w->admit_cap = cap / 2 > 1 ? cap / 2 : 1;
        w->redis_oom = true;
        w_reclaim_first(w); /* what is given up meanwhile goes first */
        w->oom_since_ms = now;
        w->oom_backoff_ms = BACKOFF_MIN_MS;
        RL_LOG(&w->log, RL_LOG_WARN, "redis %s is out of memory (maxmemory with "
               "noeviction): admitting no new jobs; %d events of %d jobs held back, "
               "retried with back-off", rconn_addr(w->rc), n_ev, n_jobs);
        pthread_mutex_lock(&w->m.mu);
        w->m.redis_oom = true;
        w->m.redis_oom_total++;
        pthread_mutex_unlock(&w->m.mu);
    }
    w->oom_retry_ms = now + w->oom_backoff_ms;
    w->oom_backoff_ms = w->oom_backoff_ms * 2 < BACKOFF_MAX_MS ? w->oom_backoff_ms * 2
                                                               : BACKOFF_MAX_MS;
}

bool w_is_oom(const char *msg)
{
    return is_oom(msg);
}

/* What this flush's writes met: OOM refusals start (or prolong, with a
 * doubled back-off) the out-of-memory state, reported once; a write Redis
 * took while none was refused ends it. */
static void note_writes(struct worker *w, const struct flush *f)
{
    int64_t now = rl_mono_ms();
    int n_ev = 0, n_jobs = 0;
    if (f->n_oom || (w->redis_oom && f->n_stored))
        for (int i = 0; i < w->n_jobs; i++) {
            n_ev += w->jobs[i]->n_out;
            n_jobs += w->jobs[i]->n_out > 0;
        }
    if (f->n_oom) {
        w_oom_seen(w, n_ev, n_jobs);
    } else if (w->redis_oom && f->n_stored) {
        w->redis_oom = false;
        /* the jobs given up meanwhile (handed back, claimable at once) go
         * before new ones: their streams are half written, and they hold
         * Redis memory until they end */
        w->next_claim_ms = 0;
        RL_LOG(&w->log, RL_LOG_INFO, "redis %s stores again after %lld ms out of memory: "
               "admitting jobs; %d events of %d jobs still to send", rconn_addr(w->rc),
               (long long)(now - w->oom_since_ms), n_ev, n_jobs);
        pthread_mutex_lock(&w->m.mu);
        w->m.redis_oom = false;
        pthread_mutex_unlock(&w->m.mu);
    }
}

/* The gauge of events waiting to be stored. */
static void count_buffered(struct worker *w)
{
    int64_t buffered = 0;
    for (int i = 0; i < w->n_jobs; i++)
        buffered += w->jobs[i]->n_out;
    pthread_mutex_lock(&w->m.mu);
    w->m.events_buffered = buffered;
    pthread_mutex_unlock(&w->m.mu);
}

static void flush_free(struct flush *f)
{
    if (!f)
        return;
    free(f->items);
    free(f->emits);
    free(f);
}

int w_flush_start(struct worker *w, struct rl_err *err)
{
    if (w->flush) /* one in flight at a time: its replies first */
        return 0;
    struct flush *f = calloc(1, sizeof *f);
    if (!f)
        return rl_errf(err, RL_ENOMEM, "flush: out of memory");
    f->b = w->batch;
    f->err = err;
    int64_t now = rl_wall_ms(), mono = rl_mono_ms();
    f->now = now;
    f->lease = now >= w->next_lease_ms;
    f->hb = now >= w->next_hb_ms;
    /* out of memory: writes (and so admission) wait for the back-off */
    bool writes = !w->redis_oom || mono >= w->oom_retry_ms;
    int rc = 0;

    f->probe = w->redis_oom;
    if (rconn_connected(w->rc)) {
        struct rl_err e2; /* not loaded at start: until it is, bodies go by EVAL */
        fence_load(&w->fence, w->rc, &e2);
        bell_probe(w);
    }
    fence_begin(&w->fence);
    rconn_batch_reset(f->b);
    for (int i = 0; i < w->n_jobs && !rc; i++) {
        struct wjob *j = w->jobs[i];
        bool folded = false; /* its cancel check rides in its FENCE_EMIT */
        if (j->release && (rc = queue_release(w, f, j)))
            break;
        if (writes && ((rc = queue_take(w, f, j)) || (rc = queue_cache(w, f, j)) ||
                       (rc = collect_events(w, f, j, mono, &folded))))
            break;
        rc = queue_job_state(w, f, j, writes, folded, mono);
    }
    if (!rc)
        rc = queue_emits(w, f);
    if (!rc && f->lease)
        rc = queue_lease(w, f);
    /* the heartbeat is the probe when nothing else would find out whether
     * Redis takes writes again */
    if (!rc && (f->hb || (w->redis_oom && writes && f->n_writes == 0)))
        rc = queue_heartbeat(w, f, writes);
    if (!rc)
        rc = queue_acks(w, f, mono);
    if (rc || rconn_batch_count(f->b) == 0) {
        settle_jobs(w); /* finished dropped jobs go even when nothing is sent */
        give_up_due(w);
        count_buffered(w);
        flush_free(f);
        return rc;
    }
    w->flush = f;
    /* written now, read by w_flush_finish: the engine steps meanwhile; a
     * failure here is met again, and reported, by the exec there */
    struct rl_err e3;
    rconn_batch_send(w->rc, f->b, &e3);
    return 0;
}

int w_flush_finish(struct worker *w, struct rl_err *err)
{
    struct flush *f = w->flush;
    if (!f)
        return 0;
    w->flush = NULL;
    f->err = err;
    int xrc = rconn_batch_exec(w->rc, f->b, err);
    int n_done = rconn_batch_n_done(f->b);
    if (xrc == 0 || n_done > 0) {
        if (f->lease)
            w->next_lease_ms = f->now + w->opt.lease_renew_ms;
        if (f->hb)
            w->next_hb_ms = f->now + w->opt.heartbeat_ms;
    }
    for (int i = 0; i < n_done && i < f->n_items; i++)
        apply_reply(w, f, &f->items[i], rconn_batch_reply(f->b, i));
    note_writes(w, f);
    settle_jobs(w);
    give_up_due(w);
    count_buffered(w);
    flush_free(f);
    return xrc;
}

int w_flush(struct worker *w, struct rl_err *err)
{
    int rc = w_flush_start(w, err);
    int rc2 = w_flush_finish(w, err);
    return rc ? rc : rc2;
}
