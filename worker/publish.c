/* worker/publish.c - the outbox and the one round trip per step.
 *
 * Every event a job produces goes into that job's outbox (struct wout)
 * and stays there until Redis has confirmed its XADD. w_flush() sends, in
 * one pipeline: every unconfirmed event of every job (XADD with the
 * explicit ID 0-<seq+1>, then EXPIRE after done, then PUBLISH when
 * configured) with a finished job's result-cache SET ahead of its done,
 * pending dead letters, the XACK of jobs whose events are all confirmed, one EXISTS per running job for cancellation,
 * and, when due, the XCLAIM JUSTID lease renewal and the heartbeat SET.
 *
 * Why it is safe to resend everything that was not confirmed: event IDs
 * are explicit and monotone, so an XADD that did land before a connection
 * broke is refused on resend with "equal or smaller", which we count as
 * confirmed; EXPIRE, SET and XACK are idempotent. Dead letters use "*"
 * and may, after a lost reply, appear twice; they are diagnostics.
 * A job is acknowledged only in the flush after its last event was
 * confirmed, so an XACK never overtakes an event.
 *
 * Called by the main thread only (loop.c), once per loop iteration. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker.h"

int w_push_event(struct wjob *j, char *json)
{
    if (!j->out_key[0]) { /* no usable id: nowhere to write */
        free(json);
        return 0;
    }
    if (j->n_out == j->cap_out) {
        int cap = j->cap_out ? 2 * j->cap_out : 8;
        struct wout *o = realloc(j->out, (size_t)cap * sizeof *o);
        if (!o) {
            free(json);
            return -RL_ENOMEM;
        }
        j->out = o;
        j->cap_out = cap;
    }
    struct ev_info info;
    struct rl_err err;
    int64_t seq = j->seq.next - 1;
    bool is_done = false;
    if (ev_parse(json, strlen(json), &info, &err) == 0) {
        seq = info.seq;
        is_done = info.type == EV_TYPE_DONE;
        ev_info_clear(&info);
    }
    j->out[j->n_out++] = (struct wout){.seq = seq, .json = json, .len = strlen(json),
                                       .is_done = is_done};
    if (j->cache_fill) {
        if (j->n_hist == j->cap_hist) {
            int cap = j->cap_hist ? 2 * j->cap_hist : 16;
            char **h = realloc(j->hist, (size_t)cap * sizeof *h);
            if (!h) {
                j->cache_fill = false; /* no cache entry, the job itself goes on */
                return 0;
            }
            j->hist = h;
            j->cap_hist = cap;
        }
        char *copy = strdup(json);
        if (!copy)
            j->cache_fill = false;
        else
            j->hist[j->n_hist++] = copy;
    }
    return 0;
}

int w_push_done(struct worker *w, struct wjob *j, enum ev_finish fin,
                const struct engine_usage *u)
{
    int64_t now = rl_wall_ms();
    struct ev_done d = {.finish_reason = fin, .tool_calls = j->tool_calls,
                        .metadata = j->job ? j->job->metadata : NULL};
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
    return w_push_done(w, j, EV_FINISH_ERROR, NULL);
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

bool w_has_pending(const struct worker *w)
{
    for (int i = 0; i < w->n_jobs; i++) {
        const struct wjob *j = w->jobs[i];
        if (j->n_out || j->dead || j->state != WJ_RUNNING)
            return true;
    }
    return false;
}

enum item_kind { IT_EVENT, IT_OTHER, IT_DEAD, IT_ACK, IT_CANCEL, IT_CACHE };
struct item {
    enum item_kind kind;
    struct wjob *j;
    int idx; /* outbox index of an IT_EVENT */
};

static int add_item(struct item **v, int *n, int *cap, struct item it)
{
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 64;
        struct item *g = realloc(*v, (size_t)c * sizeof *g);
        if (!g)
            return -RL_ENOMEM;
        *v = g;
        *cap = c;
    }
    (*v)[(*n)++] = it;
    return 0;
}

static void remove_job(struct worker *w, int i)
{
    w_job_free(w->jobs[i]);
    w->jobs[i] = w->jobs[--w->n_jobs];
}

int w_flush(struct worker *w, struct rl_err *err)
{
    struct rconn_batch *b = w->batch;
    struct item *items = NULL;
    int n_items = 0, cap_items = 0, rc = 0;
    int64_t now = rl_wall_ms();
    bool lease = now >= w->next_lease_ms, hb = now >= w->next_hb_ms;
    char buf[W_KEY_MAX + WOPTS_STR_MAX + 64], idbuf[EV_STREAM_ID_MAX], ttl[32];
    const char *names[1] = {"event"};

    rconn_batch_reset(b);
    for (int i = 0; i < w->n_jobs; i++) {
        struct wjob *j = w->jobs[i];
        /* The result-cache entry goes out ahead of the done event, in the
         * same pipeline: a client that has read done and sends the same
         * job again must find it (one flush later, that job's GET could run
         * first). The entry is the complete answer whether or not the done
         * XADD lands; a broken pipeline resends it with the events. */
        if (j->state != WJ_RUNNING && j->cache_fill && !j->cache_value) {
            struct rl_err e2;
            if (w_cache_build(j, &e2)) {
                RL_LOG(&w->log, RL_LOG_WARN, "job %s: no cache entry: %s", j->id, e2.msg);
                j->cache_fill = false;
            }
        }
        if (j->cache_value) {
            snprintf(ttl, sizeof ttl, "%d", w->opt.cache_ttl_s);
            const char *argv[5] = {"SET", j->cache_key, j->cache_value, "EX", ttl};
            if ((rc = rconn_batch_add(b, 5, argv, NULL, err)) ||
                (rc = add_item(&items, &n_items, &cap_items, (struct item){IT_CACHE, j, 0})))
                goto out;
        }
        for (int k = 0; k < j->n_out; k++) {
            struct wout *o = &j->out[k];
            const char *vals[1] = {o->json};
            size_t lens[1] = {o->len};
            ev_stream_id(o->seq, idbuf);
            if ((rc = rconn_batch_add_xadd(b, j->out_key, idbuf, 0, 1, names, vals, lens, err)) ||
                (rc = add_item(&items, &n_items, &cap_items, (struct item){IT_EVENT, j, k})))
                goto out;
            if (o->is_done) {
                snprintf(ttl, sizeof ttl, "%d", j->stream_ttl_s);
                const char *argv[3] = {"EXPIRE", j->out_key, ttl};
                if ((rc = rconn_batch_add(b, 3, argv, NULL, err)) ||
                    (rc = add_item(&items, &n_items, &cap_items, (struct item){IT_OTHER, j, 0})))
                    goto out;
            }
            if (w->opt.publish) {
                snprintf(buf, sizeof buf, "%stok:%s", w->opt.prefix, j->id);
                const char *argv[3] = {"PUBLISH", buf, o->json};
                size_t l[3] = {7, strlen(buf), o->len};
                if ((rc = rconn_batch_add(b, 3, argv, l, err)) ||
                    (rc = add_item(&items, &n_items, &cap_items, (struct item){IT_OTHER, j, 0})))
                    goto out;
            }
        }
        if (j->dead) {
            snprintf(buf, sizeof buf, "%sdead", w->opt.prefix);
            const char *vals[1] = {j->dead};
            const char *dn[1] = {"dead"};
            size_t lens[1] = {strlen(j->dead)};
            if ((rc = rconn_batch_add_xadd(b, buf, "*", w->opt.dead_maxlen, 1, dn, vals, lens,
                                           err)) ||
                (rc = add_item(&items, &n_items, &cap_items, (struct item){IT_DEAD, j, 0})))
                goto out;
        }
        if (j->state == WJ_ACKING) {
            const char *argv[4] = {"XACK", w->pool_keys[j->pool], w->opt.group, j->entry_id};
            if ((rc = rconn_batch_add(b, 4, argv, NULL, err)) ||
                (rc = add_item(&items, &n_items, &cap_items, (struct item){IT_ACK, j, 0})))
                goto out;
        }
        if (j->state == WJ_RUNNING && j->eng_id && !j->cancel_sent && j->id[0]) {
            snprintf(buf, sizeof buf, "%scancel:%s", w->opt.prefix, j->id);
            const char *argv[2] = {"EXISTS", buf};
            if ((rc = rconn_batch_add(b, 2, argv, NULL, err)) ||
                (rc = add_item(&items, &n_items, &cap_items, (struct item){IT_CANCEL, j, 0})))
                goto out;
        }
    }
    if (lease) {
        /* one XCLAIM ... JUSTID per pool over every job we hold there, so a
         * long generation is never taken for a dead consumer's */
        for (int p = 0; p < w->n_pools; p++) {
            int n = 0;
            for (int i = 0; i < w->n_jobs; i++)
                n += w->jobs[i]->pool == p && w->jobs[i]->state != WJ_ACKING;
            if (!n)
                continue;
            const char **argv = malloc((size_t)(n + 6) * sizeof *argv);
            if (!argv) {
                rc = rl_errf(err, RL_ENOMEM, "flush: out of memory");
                goto out;
            }
            int a = 0;
            argv[a++] = "XCLAIM";
            argv[a++] = w->pool_keys[p];
            argv[a++] = w->opt.group;
            argv[a++] = w->opt.name;
            argv[a++] = "0";
            for (int i = 0; i < w->n_jobs; i++)
                if (w->jobs[i]->pool == p && w->jobs[i]->state != WJ_ACKING)
                    argv[a++] = w->jobs[i]->entry_id;
            argv[a++] = "JUSTID";
            rc = rconn_batch_add(b, a, argv, NULL, err);
            free(argv);
            if (rc || (rc = add_item(&items, &n_items, &cap_items,
                                     (struct item){IT_OTHER, NULL, 0})))
                goto out;
        }
    }
    if (hb) {
        char *v = wm_heartbeat_json(w);
        if (v) {
            snprintf(buf, sizeof buf, "%sworker:%s", w->opt.prefix, w->opt.name);
            snprintf(ttl, sizeof ttl, "%d", w->opt.heartbeat_ttl_s);
            const char *argv[5] = {"SET", buf, v, "EX", ttl};
            rc = rconn_batch_add(b, 5, argv, NULL, err);
            free(v);
            if (rc || (rc = add_item(&items, &n_items, &cap_items,
                                     (struct item){IT_OTHER, NULL, 0})))
                goto out;
        }
    }
    if (rconn_batch_count(b) == 0)
        goto out;

    int xrc = rconn_batch_exec(w->rc, b, err);
    int n_done = rconn_batch_n_done(b);
    if (xrc == 0 || n_done > 0) {
        if (lease)
            w->next_lease_ms = now + w->opt.lease_renew_ms;
        if (hb)
            w->next_hb_ms = now + w->opt.heartbeat_ms;
    }
    for (int i = 0; i < n_done && i < n_items; i++) {
        const struct rconn_reply *r = rconn_batch_reply(b, i);
        struct item *it = &items[i];
        bool is_err = r && r->type == RCONN_ERROR;
        switch (it->kind) {
        case IT_EVENT: {
            struct wout *o = &it->j->out[it->idx];
            if (!is_err || rconn_reply_is_stale_id(r)) {
                free(o->json);
                o->json = NULL; /* confirmed */
            } else if (++o->n_fail >= 20) {
                RL_LOG(&w->log, RL_LOG_ERROR, "job %s: XADD seq %" PRId64 " failed %d times (%s); dropped",
                       it->j->id, o->seq, o->n_fail, r->str);
                free(o->json);
                o->json = NULL;
            } else {
                RL_LOG(&w->log, RL_LOG_WARN, "job %s: XADD seq %" PRId64 ": %s", it->j->id, o->seq,
                       r->str);
            }
            break;
        }
        case IT_CACHE: /* best effort: a refused SET is logged, not retried */
            if (is_err)
                RL_LOG(&w->log, RL_LOG_WARN, "job %s: cache SET: %s", it->j->id, r->str);
            free(it->j->cache_value);
            it->j->cache_value = NULL;
            it->j->cache_fill = false;
            break;
        case IT_DEAD:
            if (!is_err) {
                free(it->j->dead);
                it->j->dead = NULL;
            } else {
                RL_LOG(&w->log, RL_LOG_WARN, "job %s: dead letter XADD: %s", it->j->id, r->str);
            }
            break;
        case IT_ACK:
            if (!is_err) {
                it->j->state = 0; /* marks it for removal below */
            } else {
                RL_LOG(&w->log, RL_LOG_WARN, "job %s: XACK: %s", it->j->id, r->str);
            }
            break;
        case IT_CANCEL:
            if (r && r->type == RCONN_INTEGER && r->integer > 0 && it->j->eng_id &&
                !it->j->cancel_sent) {
                struct rl_err e2;
                RL_LOG(&w->log, RL_LOG_INFO, "job %s: cancelled by its cancel key", it->j->id);
                it->j->cancel_sent = true;
                if (engine_cancel(w->eng, it->j->eng_id, &e2))
                    RL_LOG(&w->log, RL_LOG_DEBUG, "job %s: cancel: %s", it->j->id, e2.msg);
            }
            break;
        case IT_OTHER:
            if (is_err)
                RL_LOG(&w->log, RL_LOG_WARN, "flush: %s", r->str);
            break;
        }
    }
    /* compact outboxes, advance jobs, drop acknowledged ones */
    for (int i = 0; i < w->n_jobs; i++) {
        struct wjob *j = w->jobs[i];
        int k2 = 0;
        for (int k = 0; k < j->n_out; k++)
            if (j->out[k].json)
                j->out[k2++] = j->out[k];
        j->n_out = k2;
    }
    for (int i = 0; i < w->n_jobs;) {
        struct wjob *j = w->jobs[i];
        if (j->state == 0) {
            remove_job(w, i);
            continue;
        }
        if (j->state == WJ_CLOSING && j->n_out == 0 && !j->dead) {
            j->state = WJ_ACKING; /* acknowledged with the next flush */
        }
        i++;
    }
    rc = xrc;
out:
    free(items);
    return rc;
}
