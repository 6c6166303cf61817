/* worker/ident.c - a job's identity at the worker: which request a job is,
 * what happens to a second request under an id that is taken, and which
 * cancel keys are meant for it (schemas/README.md, "Job identity").
 *
 * A job is one request: the entry ID its client's XADD returned (req: the
 * requests entry the dispatcher forwards in the field `req`, or the pool
 * entry itself for a job XADDed to jobs:<pool> directly) and the SHA-256
 * of its job text as sent (sha: the field `sha`, or computed here). The
 * holder record own:<id> keeps both from the first take on (fence.h,
 * FENCE_TAKE), for as long as the stream lives, so a second request under
 * the same id is known before it writes:
 *   - the same job text (FENCE_DUPLICATE): the stream already answers it;
 *     it is acknowledged without running, and nothing is written;
 *   - another text (FENCE_ID_CONFLICT): refused with ID_CONFLICT on its
 *     own stream out:<id>@<req> (a key no id can name: '@' is not an id
 *     character), never on the first job's stream; a dead letter too.
 * The first event of every stream carries the request's identity
 * (ev_stamp_request), so a client can check that what it reads answers the
 * job it sent.
 *
 * Main thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rcluster.h"
#include "worker.h"

/* "<ms>-<seq>", as Redis writes entry IDs. */
static bool entry_shaped(const char *s, size_t n)
{
    size_t i = 0, d1 = 0, d2 = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9')
        i++, d1++;
    if (i >= n || s[i] != '-' || !d1 || d1 > 20)
        return false;
    for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++)
        d2++;
    return i == n && d2 && d2 <= 20;
}

static bool sha_shaped(const char *s, size_t n)
{
    if (n != JOB_SHA_LEN)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

void w_ident_init(struct wjob *j, const struct rconn_entry *e, const char *raw, size_t raw_len)
{
    size_t n = 0;
    const char *req = rconn_entry_field(e, "req", &n);
    if (req && n < sizeof j->req && entry_shaped(req, n)) {
        memcpy(j->req, req, n);
        j->req[n] = 0;
    } else {
        snprintf(j->req, sizeof j->req, "%s", e->id);
    }
    /* a tenant's jobs share no cache with another tenant's: not the
     * prefix cache (a hit shows in cached_prompt_tokens and in timings),
     * not the result cache (cached: true) */
    const char *tenant = rconn_entry_field(e, "tenant", &n);
    j->tenant[0] = 0;
    j->cache_salt = 0;
    if (tenant && n <= JOB_TENANT_MAX) {
        memcpy(j->tenant, tenant, n);
        j->tenant[n] = 0;
        if (!job_tenant_ok(j->tenant)) {
            j->tenant[0] = 0;
        } else {
            uint64_t h = 0xcbf29ce484222325ull;
            for (size_t i = 0; i < n; i++)
                h = (h ^ (unsigned char)tenant[i]) * 0x100000001b3ull;
            j->cache_salt = h | 1; /* never 0, the shared domain */
        }
    }
    const char *sha = rconn_entry_field(e, "sha", &n);
    if (sha && sha_shaped(sha, n)) {
        memcpy(j->sha, sha, n);
        j->sha[n] = 0;
    } else {
        job_sha256(raw, raw_len, j->sha);
    }
}

void w_ident_stamp(struct wjob *j, int64_t seq, char **json, size_t *len)
{
    if (seq != 0 || !j->req[0])
        return;
    struct rl_err err;
    if (ev_stamp_request(json, j->req, j->sha, &err) == 0)
        *len = strlen(*json);
}

bool w_ident_cancel_meant(const struct wjob *j, const struct rconn_reply *r)
{
    if (!r || r->type != RCONN_STRING)
        return false;
    if (!entry_shaped(r->str, r->len))
        return true; /* "1": any instance of the id (the older protocol) */
    return strlen(j->req) == r->len && !memcmp(j->req, r->str, r->len);
}

void w_ident_refuse(struct worker *w, struct wjob *j, int code)
{
    j->ident = code;
    /* (and its byte count: the answer that follows is bounded by
     * publish_buffer_kb alone, not with what was dropped) */
    w_outbox_drop(j);
    if (j->eng_id) {
        /* the engine gives its final event for the cancel later (loop.c
         * on_event), then w_ident_apply finishes the refusal */
        struct rl_err err;
        if (!j->cancel_sent && engine_cancel(w->eng, j->eng_id, &err))
            RL_LOG(&w->log, RL_LOG_DEBUG, "job %s: cancel: %s", j->id, err.msg);
        j->cancel_sent = true;
        j->state = WJ_DROPPED;
        return;
    }
    w_ident_apply(w, j);
}

void w_ident_apply(struct worker *w, struct wjob *j)
{
    int code = j->ident;
    j->ident = 0;
    if (code == FENCE_DUPLICATE || j->on_alt) {
        /* (on its own stream out:<id>@<req> already: only another delivery
         * of this very request can hold that one, and it answers it) */
        RL_LOG(&w->log, RL_LOG_INFO, "job %s (entry %s, request %s): the same job is answered "
               "already by %s; acknowledged without running", j->id, j->entry_id, j->req,
               j->out_key);
        j->state = WJ_ACKING;
        return;
    }
    /* ID_CONFLICT: the answer goes to this request's own stream */
    char msg[1200];
    snprintf(msg, sizeof msg, "id %s: a different job owns this id while its stream %s exists; "
             "nothing was written there (this answer is on %s@%s)", j->id, j->out_key,
             j->out_key, j->req);
    char base_out[W_KEY_MAX], base_own[W_KEY_MAX];
    rcl_tagged_key(base_out, sizeof base_out, w_cluster(w), w->opt.prefix, "out:", j->id);
    rcl_tagged_key(base_own, sizeof base_own, w_cluster(w), w->opt.prefix, "own:", j->id);
    snprintf(j->out_key, sizeof j->out_key, "%.300s@%s", base_out, j->req);
    snprintf(j->own_key, sizeof j->own_key, "%.300s@%s", base_own, j->req);
    j->taken = false;
    j->resumed = false;
    j->on_alt = true;
    ev_seq_init(&j->seq);
    w_push_error(w, j, EV_CODE_ID_CONFLICT, msg);
    w_set_dead(w, j, NULL, 0, EV_CODE_ID_CONFLICT, msg); /* job_sha256 is in the message's stream */
    j->state = WJ_CLOSING;
}
