/* worker/resume.c - taking over jobs whose worker died, and resuming them
 * so that the client sees every token exactly once.
 *
 * A job stays in its pool's pending list (PEL) until a worker XACKs it
 * after its done event. A live worker renews its claim on what it holds
 * every lease_renew_ms (publish.c), so an entry idle longer than
 * claim_idle_ms belongs to a worker that is gone. w_claim() takes such
 * entries over with XAUTOCLAIM, on start and every claim_interval_ms, no
 * more than the engine can admit, on the pools whose claimer lease it
 * holds (one claimer per pool: take_claimers); w_claim_own() re-reads this consumer's
 * own PEL after a restart under the same name.
 *
 * Resumption (w_resume_prepare): XRANGE <prefix>out:<id> - + gives the
 * events the dead worker managed to publish: that stream is the resume
 * record. Their token ids are appended to the rendered prompt and handed
 * to the engine as resumed output (engine_request.n_resumed): the
 * frequency and presence penalties count them as output, and the RNG
 * stream starts at draw n_prev, since the engine spends exactly one draw
 * per output token (sampled or forced), counted from the job's first
 * output token. max_tokens and the thinking budget shrink by what was
 * spent, and seq goes on from one past the last published event. So the
 * continuation is, token for token, what an uninterrupted run gives, for
 * every sampling setting (the engine is batch-invariant on the CPU
 * backend; a job without a seed gets one derived from its id and entry,
 * loop.c, so it too has one stream to continue). The token ids are all
 * the record needs, so streams written before this rule resume the same
 * way. A worker that takes a job over first makes itself its holder
 * (fence.h), then reads the stream: the worker it was taken from, if
 * still alive, can write nothing after that read, so the record is
 * complete and the two never interleave.
 * Text held back by the engine's streaming decoder or the tool-call
 * parser at the moment of death (a partial UTF-8 character, a possible
 * stop-string prefix, an unfinished <tool_call>) is not recovered.
 *
 * Main thread only; uses the main connection. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "tokenizer.h"
#include "worker.h"

static int64_t deliveries_of(struct worker *w, const char *key, const char *id)
{
    struct rconn_pending *pe = NULL;
    int n = 0;
    struct rl_err err;
    int64_t d = 1;
    if (rconn_xpending(w->rc, key, w->opt.group, 0, id, id, 1, NULL, &pe, &n, &err) == 0 && n > 0)
        d = pe[0].deliveries;
    free(pe);
    return d;
}

static bool held(const struct worker *w, int pool, const char *id)
{
    for (int i = 0; i < w->n_jobs; i++)
        if (w->jobs[i]->pool == pool && w->jobs[i]->state != WJ_DROPPED &&
            w->jobs[i]->state != 0 && !strcmp(w->jobs[i]->entry_id, id))
            return true;
    return false;
}

/* One claimer per pool (issue 27): XAUTOCLAIM scans the pending list, and
 * every worker running it every claim_interval_ms made Redis's claim work
 * grow with the fleet, not with the jobs to reclaim. So a worker with room
 * first takes the short lease <prefix>claimer:<pool key> (SET NX PX
 * claim_interval_ms; the pool key's hash tag keeps it in the pool's slot;
 * on a cluster one per shard, each shard being a pool stream of its own),
 * all pools' in one round trip, and claims only the pools whose lease it
 * got: about one XAUTOCLAIM per pool per interval, fleet-wide. The lease
 * is never renewed or released: it simply expires, so a claimer that dies
 * (or fills up) is replaced within one interval by the next worker whose
 * timer fires, and an idle entry is reclaimed within claim_idle_ms +
 * 2 x claim_interval_ms at most. Our own offer streams (issue 27) are not
 * claimed here at all: an entry idle there for claim_idle_ms (a job given
 * up, one whose resume failed) is moved to its pool by the dispatcher's
 * sweep (dispatcher/affinity.c), "moved": "pending", and resumed by
 * whoever reads it; w_claim_own covers them after a restart. won[p] says
 * which pools to claim; a refused SET (an ACL without it, a read-only
 * replica) claims as before. */
static void take_claimers(struct worker *w, bool *won)
{
    struct rl_err err;
    char keys[W_MAX_STREAMS][W_KEY_MAX + 64], px[24];
    snprintf(px, sizeof px, "%d", w->opt.claim_interval_ms);
    rconn_batch_reset(w->batch);
    int n = 0;
    for (int p = 0; p < w_n_queue_streams(w); p++) { /* every shard of every pool */
        won[p] = false;
        snprintf(keys[p], sizeof keys[p], "%sclaimer:%s", w->opt.prefix, w->pool_keys[p]);
        const char *argv[6] = {"SET", keys[p], w->holder, "NX", "PX", px};
        if (rconn_batch_add(w->batch, 6, argv, NULL, &err))
            return;
        n++;
    }
    if (rconn_batch_exec(w->rc, w->batch, &err) && rconn_batch_n_done(w->batch) < n)
        return; /* Redis away: the XAUTOCLAIM would fail too */
    for (int p = 0; p < n; p++) {
        const struct rconn_reply *r = rconn_batch_reply(w->batch, p);
        won[p] = r && r->type != RCONN_NIL;
        if (r && r->type == RCONN_ERROR)
            RL_LOG(&w->log, RL_LOG_DEBUG, "claimer lease %s: %s", keys[p], r->str);
    }
}

/* Hands the claimed entries [from, n) of pool p back untaken (but those
 * we hold and run: a lease we were late to renew): FENCE_RELEASE each
 * (claimable at once, this delivery not counted), in one pipeline. Best
 * effort: an entry not handed back stays ours and pending, and is claimed
 * again after claim_idle_ms, as a dead worker's would be. */
static void release_claimed(struct worker *w, int p, const struct rconn_entries *ents, int from)
{
    struct rconn_batch *b = NULL;
    struct rl_err err;
    if (rconn_batch_create(&b, &err))
        return;
    for (int attempt = 0; attempt < 2; attempt++) {
        rconn_batch_reset(b);
        for (int i = from; i < ents->n; i++) {
            if (held(w, p, ents->v[i].id))
                continue;
            const char *argv[FENCE_RELEASE_ARGC];
            struct fence_release_buf rb;
            int a = fence_release_cmd(&w->fence, argv, &rb, w->pool_keys[p], w->opt.group,
                                      w->opt.name, ents->v[i].id, w->opt.claim_idle_ms);
            if (rconn_batch_add(b, a, argv, NULL, &err))
                goto out;
        }
        if (!rconn_batch_count(b) || rconn_batch_exec(w->rc, b, &err))
            break;
        bool again = false;
        for (int i = 0; i < rconn_batch_count(b); i++)
            again |= fence_noscript(&w->fence, FENCE_RELEASE, rconn_batch_reply(b, i));
        if (!again)
            break;
        fence_begin(&w->fence); /* the body this time */
    }
out:
    rconn_batch_free(b);
}

/* Memory pressure (schemas/README.md): a job given up holds its half
 * written stream in Redis, and no reader frees a stream before its done.
 * Admitting a new job instead of resuming it starts one more such stream;
 * under a tight maxmemory that became a livelock (CI, 2026-12-06): each
 * time a reader freed a little memory, new jobs' first events took it,
 * until Redis held a hundred half-written streams and could finish none.
 * The claim used to wait for its interval (claim_interval_ms, and a claim
 * that found no room pushed it one interval further), while the standing
 * read took new entries the moment a slot freed. So after pressure every
 * worker claims first: it reads no new entry (loop.c) and claims whenever
 * it has room, every pool itself whoever holds the claimer lease, until a
 * scan of each pool's pending list from its start to its end finds
 * nothing to take. (A standing read already out when pressure began may
 * still bring new jobs, at most its COUNT; it is out only while its
 * streams are empty, so they are not a backlog's.) A claim Redis refuses
 * for good (an ACL without XAUTOCLAIM) ends this at once: waiting for it
 * would stop the worker reading jobs for ever. */
void w_reclaim_first(struct worker *w)
{
    w->reclaim_first = true;
    pthread_mutex_lock(&w->m.mu);
    w->m.reclaiming = true;
    pthread_mutex_unlock(&w->m.mu);
    for (int p = 0; p < W_MAX_STREAMS; p++) {
        w->reclaim_scan[p] = 0;
        snprintf(w->claim_cursor[p], RCONN_ID_MAX, "0-0");
    }
}

/* Ends reclaim_first, saying why: none left to claim (refusal NULL), or
 * Redis's refusal of the claim. */
static void reclaim_end(struct worker *w, const char *refusal)
{
    w->reclaim_first = false;
    pthread_mutex_lock(&w->m.mu);
    w->m.reclaiming = false;
    pthread_mutex_unlock(&w->m.mu);
    if (refusal)
        RL_LOG(&w->log, RL_LOG_WARN, "cannot claim the jobs handed back first (XAUTOCLAIM: %s): "
               "reading new jobs again", refusal);
    else
        RL_LOG(&w->log, RL_LOG_INFO, "no job handed back is left to claim: reading new jobs again");
}

/* After pool p's XAUTOCLAIM from cursor `from` to `next` that admitted
 * `taken` entries: whether every pool is now scanned clean to its end,
 * which ends reclaim_first. */
static void reclaim_scanned(struct worker *w, int p, const char *from, const char *next,
                            int taken)
{
    if (!w->reclaim_first || w->reclaim_scan[p] == 2)
        return;
    if (!strcmp(from, "0-0"))
        w->reclaim_scan[p] = 1;
    if (taken)
        w->reclaim_scan[p] = 0;
    if (w->reclaim_scan[p] == 1 && !strcmp(next, "0-0"))
        w->reclaim_scan[p] = 2;
    for (int q = 0; q < w_n_queue_streams(w); q++)
        if (w->reclaim_scan[q] != 2)
            return;
    reclaim_end(w, NULL);
}

int w_claim(struct worker *w, struct rl_err *err)
{
    bool won[W_MAX_STREAMS];
    if (w_admissible(w) <= 0)
        return 0;
    if (w->reclaim_first) /* every worker scans every pool: w_reclaim_first */
        for (int p = 0; p < w_n_queue_streams(w); p++)
            won[p] = true;
    else
        take_claimers(w, won);
    /* A claim takes each entry over a few round trips at a time
     * (deliveries, admission, FENCE_TAKE, the stream read back) while the
     * loop renews nobody's lease. On a slow or saturated Redis a batch of
     * dozens outlasted claim_idle_ms: the next claimer took its tail before
     * we got to it, a delivery more each time, until max_deliveries
     * dead-lettered jobs no dead worker held, and our running jobs' leases
     * lapsed too. So a claim stops at a quarter of claim_idle_ms, hands the
     * rest back (claimable at once, not counted), and the next one takes
     * no more than this one got through. */
    int64_t until = rl_mono_ms() + w->opt.claim_idle_ms / 4;
    for (int p = 0; p < w->n_pools; p++) {
        int k = w_admissible(w);
        if (k <= 0)
            return 0;
        if (w->claim_count > 0 && k > w->claim_count)
            k = w->claim_count;
        if (p >= w_n_queue_streams(w) || !won[p])
            continue; /* another worker claims this pool this interval; our offer
                         streams: the dispatcher's sweep moves their idle entries */
        if (!w->claim_cursor[p][0])
            snprintf(w->claim_cursor[p], RCONN_ID_MAX, "0-0");
        struct rconn_entries ents = {0};
        struct rconn_ids deleted = {0};
        char next[RCONN_ID_MAX], from[RCONN_ID_MAX];
        snprintf(from, sizeof from, "%s", w->claim_cursor[p]);
        int rc = rconn_xautoclaim(w->rc, w->pool_keys[p], w->opt.group, w->opt.name,
                                  w->opt.claim_idle_ms, w->claim_cursor[p], k, &ents, next,
                                  &deleted, err);
        rconn_ids_free(&deleted);
        if (rc) {
            RL_LOG(&w->log, RL_LOG_DEBUG, "XAUTOCLAIM %s: %s", w->pool_keys[p], err->msg);
            /* refused for good (an ACL without XAUTOCLAIM): claiming first
             * would stop this worker reading jobs for ever; Redis away or
             * busy (-RL_EIO) is waited out */
            if (w->reclaim_first && rc != -RL_EIO)
                reclaim_end(w, err->msg);
            return rc;
        }
        snprintf(w->claim_cursor[p], RCONN_ID_MAX, "%s", next);
        int taken = 0;
        for (int i = 0; i < ents.n; i++) {
            if (i > 0 && rl_mono_ms() >= until) {
                RL_LOG(&w->log, RL_LOG_INFO, "claim on %s: %d of %d entries taken within "
                       "claim_idle_ms / 4, the rest handed back", w->pools[p], i, ents.n);
                release_claimed(w, p, &ents, i);
                w->claim_count = i;
                /* the next claim's scan starts at what we handed back, not
                 * after the batch (the cursor would pass it until it wraps) */
                snprintf(w->claim_cursor[p], RCONN_ID_MAX, "%s", ents.v[i].id);
                reclaim_scanned(w, p, from, w->claim_cursor[p], i);
                rconn_entries_free(&ents);
                return 0;
            }
            if (held(w, p, ents.v[i].id))
                continue; /* ours and still running (a lease we were late to renew) */
            int64_t d = deliveries_of(w, w->pool_keys[p], ents.v[i].id);
            RL_LOG(&w->log, RL_LOG_INFO, "reclaimed entry %s on %s (delivery %" PRId64 ")",
                   ents.v[i].id, w->pools[p], d);
            pthread_mutex_lock(&w->m.mu);
            w->m.reclaimed++;
            pthread_mutex_unlock(&w->m.mu);
            w_admit(w, p, &ents.v[i], d, true, -1);
            taken++;
        }
        reclaim_scanned(w, p, from, next, taken);
        if (w->claim_count > 0 && ents.n >= w->claim_count)
            w->claim_count = w->claim_count < 4096 ? 2 * w->claim_count : 0; /* all in time */
        rconn_entries_free(&ents);
    }
    return 0;
}

int w_claim_own(struct worker *w, struct rl_err *err)
{
    for (int p = 0; p < w->n_pools; p++) {
        const char *key = w->pool_keys[p];
        struct rconn_entries ents = {0};
        int rc = rconn_xreadgroup(w->rc, w->opt.group, w->opt.name, 1, &key, "0",
                                  w->opt.max_batch, -1, &ents, err);
        if (rc)
            return rc;
        for (int i = 0; i < ents.n; i++) {
            if (held(w, p, ents.v[i].id))
                continue;
            int64_t d = deliveries_of(w, key, ents.v[i].id);
            RL_LOG(&w->log, RL_LOG_INFO, "resuming our own pending entry %s on %s",
                   ents.v[i].id, w->pools[p]);
            w_admit(w, p, &ents.v[i], d, true, -1);
        }
        rconn_entries_free(&ents);
    }
    return 0;
}

/* FENCE_TAKE, unconditionally, before the stream is read: from here on the
 * worker we took the job from can write nothing more to it, so what the
 * XRANGE below returns is all it ever published (fence.h). Fills
 * j->stalls. Returns 0, 1 when another request owns the id (j->ident:
 * FENCE_DUPLICATE or FENCE_ID_CONFLICT), or negative. */
static int take_over(struct worker *w, struct wjob *j, struct rl_err *err)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        const char *argv[FENCE_TAKE_ARGC];
        struct fence_take_buf b;
        int a = fence_take_cmd(&w->fence, argv, &b, j->own_key, j->out_key, w->holder,
                               j->entry_id, false, j->deliveries, j->req, j->sha);
        struct rconn_reply *r = NULL;
        int rc = rconn_command(w->rc, a, argv, NULL, &r, err);
        if (r && r->type == RCONN_INTEGER && r->integer < 0) {
            j->ident = (int)r->integer; /* another request owns the id: ident.c */
            rconn_reply_free(r);
            return 1;
        }
        if (r && r->type == RCONN_INTEGER) {
            j->stalls = r->integer;
            j->taken = true;
            rconn_reply_free(r);
            return 0;
        }
        bool again = fence_noscript(&w->fence, FENCE_TAKE, r);
        rconn_reply_free(r);
        if (!again)
            return rc ? rc : rl_errf(err, RL_EINVAL, "taking the holder record: unexpected reply");
        fence_begin(&w->fence); /* the body this time */
    }
    return rl_errf(err, RL_EINVAL, "taking the holder record: NOSCRIPT twice");
}

int w_resume_prepare(struct worker *w, struct wjob *j, struct rl_err *err)
{
    if (!j->out_key[0])
        return 0;
    int rc = take_over(w, j, err);
    if (rc)
        return rc > 0 ? 3 : rc;
    struct rconn_entries ents = {0};
    rc = rconn_xrange(w->rc, j->out_key, "-", "+", 0, &ents, err);
    if (rc)
        return rc;
    int64_t last = -1;
    bool done = false, error = false;
    int n_tok = 0, cap = 0;
    int32_t *tok = NULL;
    for (int i = 0; i < ents.n && !done; i++) {
        size_t len;
        const char *v = rconn_entry_field(&ents.v[i], "event", &len);
        struct ev_info info;
        if (!v || ev_parse(v, len, &info, err))
            continue;
        if (info.seq != last + 1) {
            RL_LOG(&w->log, RL_LOG_WARN, "job %s: published events jump from seq %" PRId64
                   " to %" PRId64, j->id, last, info.seq);
        }
        last = info.seq;
        if (info.type == EV_TYPE_DONE)
            done = true;
        else if (info.type == EV_TYPE_ERROR)
            error = true;
        else if (info.n_token_ids > 0) {
            if (n_tok + info.n_token_ids > cap) {
                cap = (n_tok + info.n_token_ids) * 2;
                int32_t *g = realloc(tok, (size_t)cap * sizeof *g);
                if (!g) {
                    ev_info_clear(&info);
                    rc = rl_errf(err, RL_ENOMEM, "resume: out of memory");
                    goto out;
                }
                tok = g;
            }
            memcpy(tok + n_tok, info.token_ids, (size_t)info.n_token_ids * sizeof *tok);
            n_tok += info.n_token_ids;
        }
        ev_info_clear(&info);
    }
    ev_seq_resume(&j->seq, last);
    if (done) {
        rc = 1;
        goto out;
    }
    if (error) {
        rc = 2;
        goto out;
    }
    if (n_tok > 0) {
        int32_t *g = realloc(j->ids, ((size_t)j->n_ids + (size_t)n_tok) * sizeof *g);
        if (!g) {
            rc = rl_errf(err, RL_ENOMEM, "resume: out of memory");
            goto out;
        }
        j->ids = g;
        /* reasoning tokens so far: those after the last <think> that no
         * </think> has closed, counted the way the engine counts them */
        const struct tokenizer *t = engine_get_tokenizer(w->eng);
        int32_t open = t ? tok_find(t, "<think>", 7) : -1;
        int32_t close = t ? tok_find(t, "</think>", 8) : -1;
        bool in_think = false;
        for (int i = j->n_ids - 1; i >= 0 && open >= 0; i--) {
            if (j->ids[i] == close)
                break;
            if (j->ids[i] == open) {
                in_think = true;
                break;
            }
        }
        for (int i = 0; i < n_tok; i++) {
            if (tok[i] == open || in_think)
                j->prev_reasoning++;
            if (tok[i] == open)
                in_think = true;
            else if (tok[i] == close)
                in_think = false;
        }
        memcpy(j->ids + j->n_ids, tok, (size_t)n_tok * sizeof *tok);
        j->n_ids += n_tok;
        j->n_prev = n_tok;
    }
    j->t_first = n_tok > 0 ? j->t_admitted : 0;
    j->t_last_tok = j->t_first; /* the first gap is measured from here, not from 1970 */
    RL_LOG(&w->log, RL_LOG_INFO, "job %s: resuming after %d published tokens at seq %" PRId64,
           j->id, n_tok, j->seq.next);
    rc = 0;
out:
    free(tok);
    rconn_entries_free(&ents);
    return rc;
}
