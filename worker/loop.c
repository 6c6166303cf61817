/* worker/loop.c - the pull loop: read what the engine can take, step the
 * engine, turn its events into protocol events, flush.
 *
 * One iteration:
 *   1. timers: reclaim idle jobs of dead consumers (resume.c), systemd
 *      watchdog, SIGHUP reload;
 *   2. admission: k = engine_can_admit() capped by free batch slots; when
 *      nothing runs and nothing waits to be sent, XREADGROUP BLOCKs (on its
 *      own connection, so a blocked read never holds up publishing);
 *      otherwise it polls without BLOCK, pool by pool in priority order, so
 *      a busy worker takes only what it can run and never hoards jobs;
 *   3. w_flush_start(): the events so far, acks and cancel checks, written
 *      as one pipeline (publish.c), without waiting for the replies;
 *   4. engine_step(): every running request advances one token (or one
 *      prefill chunk), while Redis answers;
 *   5. w_flush_finish(): the replies read and applied.
 * While Redis refuses writes for memory (maxmemory, noeviction), nothing
 * new is read or claimed (w_admissible is 0): the running jobs go on, their
 * events held in their outboxes until Redis takes them (publish.c).
 * Redis being away never stops the engine: reads fail fast, the outbox
 * keeps what was not confirmed, and the next successful flush sends it.
 *
 * Admission is transport work: parse the job (common/job.c), render its
 * prompt (engine/prompt.c), then hand the request to engine_check(), the
 * engine's one validator, before anything else is done for it. A job that
 * does not parse, names another pool, cannot be rendered, or that the
 * engine refuses (its code comes back in rl_err.code: PROMPT_TOO_LONG,
 * INVALID_TOKEN, ...) gets an error event, a dead letter and an XACK; the
 * loop goes on. Sampling fields the job did not give reach the engine as
 * "unset": the engine alone applies the model's defaults. Main thread
 * only. */
#include <inttypes.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "affinity.h"
#include "clock.h"
#include "prompt.h"
#include "rcluster.h"
#include "worker.h"
#include "text.h"

void w_job_free(struct wjob *j)
{
    if (!j)
        return;
    job_free(j->job);
    for (int i = 0; i < j->n_out; i++)
        free(j->out[i].json);
    free(j->out);
    free(j->dead);
    for (int i = 0; i < j->n_hist; i++)
        free(j->hist[i]);
    free(j->hist);
    free(j->cache_value);
    free(j->ids);
    free(j->raw);
    free(j->hand_key);
    free(j->hold_ids);
    text_free(&j->hold_content);
    text_free(&j->hold_reasoning);
    chat_parser_free(j->parser);
    cJSON_Delete(j->tool_calls);
    free(j);
}

int w_jobs_add(struct worker *w, struct wjob *j)
{
    if (w->n_jobs == w->cap_jobs) {
        int cap = w->cap_jobs ? 2 * w->cap_jobs : 32;
        struct wjob **g = realloc(w->jobs, (size_t)cap * sizeof *g);
        if (!g)
            return -RL_ENOMEM;
        w->jobs = g;
        w->cap_jobs = cap;
    }
    w->jobs[w->n_jobs++] = j;
    return 0;
}

bool w_cluster(const struct worker *w)
{
    return rconn_is_cluster(w->rc) || rconn_is_cluster(w->lane[0].rc);
}

int w_n_queue_streams(const struct worker *w)
{
    return w->n_base_pools * (w->n_shards > 1 ? w->n_shards : 1);
}

static void set_id(struct worker *w, struct wjob *j, const char *id)
{
    snprintf(j->id, sizeof j->id, "%s", id);
    if (id[0]) {
        rcl_tagged_key(j->out_key, sizeof j->out_key, w_cluster(w), w->opt.prefix, "out:", id);
        rcl_tagged_key(j->own_key, sizeof j->own_key, w_cluster(w), w->opt.prefix, "own:", id);
    } else {
        j->out_key[0] = j->own_key[0] = 0;
    }
}

/* Renders the job's prompt into j->ids, as the engine itself would (chat
 * template + chat_tokenize, through engine/prompt.c, which the
 * dispatcher's cache fast path shares), so that the cache key, the
 * engine's checks and resumption all see the very ids the engine runs.
 * Returns 0 or fills *code. */
static int render(struct worker *w, struct wjob *j, enum ev_code *code, struct rl_err *err)
{
    const struct job *jb = j->job;
    return prompt_render(jb, job_mode_on(jb, w->pools[j->pool]),
                         engine_get_tokenizer(w->eng), &j->ids, &j->n_ids, code, err);
}

/* Answers a job that will not run: error event + done(error) + dead
 * letter, acknowledged once all three are confirmed. A job taken over
 * that has not been read back yet is first (w_resume_prepare): its answer
 * goes on after what its stream holds, since one at seq 0 would meet the
 * earlier worker's events there and be dropped, leaving its client
 * without a done; one already answered is only acknowledged. */
static void reject(struct worker *w, struct wjob *j, const char *raw, size_t raw_len,
                   enum ev_code code, const char *msg)
{
    if (j->resumed && !j->taken && j->out_key[0]) {
        struct rl_err e2;
        int r = w_resume_prepare(w, j, &e2);
        if (r == 1) { /* its done is there */
            j->state = WJ_ACKING;
            return;
        }
        if (r == 2) { /* its error is there, not its done */
            w_push_done(w, j, EV_FINISH_ERROR, NULL, NULL);
            return;
        }
        if (r == 3) { /* another request owns the id (ident.c) */
            w_ident_refuse(w, j, j->ident);
            return;
        }
        if (r < 0)
            RL_LOG(&w->log, RL_LOG_WARN, "job %s: reading its stream back: %s", j->id, e2.msg);
    }
    w_push_error(w, j, code, msg);
    w_set_dead(w, j, raw, raw_len, code, msg);
    j->state = WJ_CLOSING;
}

void w_reject_model(struct worker *w, struct wjob *j, const char *raw, size_t raw_len)
{
    /* queued where another model's jobs go (a shared pool, or by hand):
     * running it on these weights would answer for the wrong model */
    char msg[RL_ERR_MSG_MAX], names[256] = "";
    for (int i = 0; i < w->n_loras; i++) {
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s\"%s\"", i ? ", " : "",
                 engine_lora_name(w->eng, i));
    }
    snprintf(msg, sizeof msg, "model: the job asks for \"%.128s\"; this worker (pool %s) serves "
             "\"%s\"%s%s", j->job->model, w->pools[j->pool], w->model.name,
             w->n_loras ? " and its LoRA adapters " : "", names);
    reject(w, j, raw, raw_len, EV_CODE_MODEL_NOT_FOUND, msg);
}

/* The seed of a job that gives none: FNV-1a over its id, "\n" and its
 * pool entry ID, both the same for every worker that ever runs this
 * delivery, so a resumed job continues the one stream it started (the
 * engine's own default, derived from its request counter, differs per
 * worker). Kept to 53 bits, so the same job with "seed": <this> in it,
 * which the protocol can carry exactly, runs the same tokens. */
static uint64_t derived_seed(const struct wjob *j)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *s = j->id; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    h = (h ^ '\n') * 0x100000001b3ull;
    /* the entry it was first queued as: a job the dispatcher moved from an
     * offer stream to its pool keeps its seed (issue 27) */
    for (const char *s = j->entry0[0] ? j->entry0 : j->entry_id; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h & ((1ull << 53) - 1);
}

/* job.h's constraint kinds are engine.h's, value for value */
_Static_assert((int)JOB_CONSTRAINT_JSON_OBJECT == (int)ENGINE_CONSTRAINT_JSON_OBJECT &&
               (int)JOB_CONSTRAINT_JSON_SCHEMA == (int)ENGINE_CONSTRAINT_JSON_SCHEMA &&
               (int)JOB_CONSTRAINT_GRAMMAR == (int)ENGINE_CONSTRAINT_GRAMMAR &&
               (int)JOB_CONSTRAINT_TOOL_CALL == (int)ENGINE_CONSTRAINT_TOOL_CALL,
               "constraint kinds");

/* The engine request of j as it stands (prompt, what is left of
 * max_tokens and the thinking budget after a resume). The job's unset
 * sampling fields (< 0, job.h) stay unset here: the engine fills them. */
static void build_request(struct worker *w, struct wjob *j, struct engine_request *rq)
{
    const struct job *jb = j->job;
    struct engine_request r;
    engine_request_init(&r);
    r.prompt_ids = j->ids;
    r.n_prompt = j->n_ids;
    r.mode = job_mode_on(jb, w->pools[j->pool]) == JOB_MODE_THINK ? ENGINE_MODE_THINK
                                                                    : ENGINE_MODE_NO_THINK;
    r.temperature = (float)jb->temperature;
    r.top_p = (float)jb->top_p;
    r.top_k = jb->top_k;
    r.min_p = (float)jb->min_p;
    r.presence_penalty = (float)jb->presence_penalty;
    r.frequency_penalty = (float)jb->frequency_penalty;
    r.repetition_penalty = (float)jb->repetition_penalty;
    r.has_seed = true;
    r.seed = jb->has_seed ? jb->seed : derived_seed(j);
    r.n_logprobs = jb->logprobs;
    r.max_tokens = jb->max_tokens - j->n_prev;
    r.n_resumed = j->n_prev; /* penalties and the RNG stream go on from there */
    r.stop = (const char *const *)jb->stop;
    r.n_stop = jb->n_stop;
    r.ignore_eos = jb->ignore_eos;
    r.stop_ids = jb->stop_ids;
    r.n_stop_ids = jb->n_stop_ids;
    /* a resumed job's earlier output counts towards min_tokens, as towards max_tokens */
    r.min_tokens = jb->min_tokens > j->n_prev ? jb->min_tokens - j->n_prev : 0;
    r.bias_ids = jb->bias_ids;
    r.bias = jb->bias;
    r.n_bias = jb->n_bias;
    r.keep_special = !jb->skip_special;
    r.no_speculative = !jb->speculative;
    r.constraint = (enum engine_constraint)jb->constraint;
    r.constraint_src = jb->constraint_src;
    r.constraint_len = jb->constraint_src ? strlen(jb->constraint_src) : 0;
    r.tool_name = jb->tool_name[0] ? jb->tool_name : NULL;
    if (jb->max_thinking_tokens >= 0) {
        int left = jb->max_thinking_tokens - j->prev_reasoning;
        r.max_thinking_tokens = left > 0 ? left : 0;
    }
    r.priority = jb->priority;
    if (jb->deadline_ms > 0) {
        double left = (double)(jb->deadline_ms - rl_wall_ms()) / 1000.0;
        double d = engine_now() + left;
        r.deadline = d > 1e-6 ? d : 1e-6; /* <= 0 would mean "none" */
    }
    r.user = j;
    r.embed = jb->task == JOB_TASK_EMBED;
    r.embed_dims = jb->dimensions;
    r.embed_truncate = jb->truncate;
    r.embed_raw = jb->no_normalize;
    if (jb->task == JOB_TASK_RERANK) {
        r.score_ids = w->rerank_ids;
        r.n_score = 2;
    }
    r.cache_salt = j->cache_salt; /* a tenant's own prefix-cache domain (ident.c) */
    /* the adapter the job's model names: the engine salts its prefix-cache
     * blocks with it (kv_salt_lora), the dispatcher's affinity hashes alike */
    r.lora = j->lora >= 0 ? engine_lora_name(w->eng, j->lora) : NULL;
    *rq = r;
}

/* The protocol code of an engine refusal (engine_check's err->code). */
static enum ev_code refusal_code(const struct rl_err *err)
{
    return err->code > EV_CODE_NONE && err->code < EV_CODE_COUNT ? (enum ev_code)err->code
                                                                   : EV_CODE_ENGINE_ERROR;
}

static int submit(struct worker *w, struct wjob *j, struct rl_err *err)
{
    struct engine_request r;
    build_request(w, j, &r);
    j->t_submit_s = engine_now();
    return engine_submit(w->eng, &r, &j->eng_id, err);
}

static int stand_block_ms(const struct worker *w, bool block);
static int lane_count(struct worker *w, int l, int share);
static bool reads_every_lane(const struct worker *w, int room);

/* Notes lane ln's read as sent: COUNT count a stream, a look (aged) or a
 * standing read, now. */
static void lane_sent(struct w_lane *ln, int count, bool aged)
{
    ln->want = count * ln->n;
    ln->aged = aged;
    ln->sent_ms = rl_mono_ms();
}

/* The admission check as the first of a pair on lane l (standing_read):
 * the GET of the cancel key (and of the cache entry), then the lane's next
 * standing read, in one write. The read comes back only when a job
 * arrives, so the check went alone before: two read events for Redis each
 * admission, now one (issue 27 point 3). The read is sent as
 * stand_send_all would after this admission: the room less this job's
 * slot. On a single instance the lane's connection reaches every key. On
 * a cluster (point 4) only a busy worker's home lane, its one standing
 * read (the whole room is its share), and only when the keys are on that
 * lane's master (rconn_commands_then_xreadgroup): a job of a home shard
 * has its streams and cancel key there (the dispatcher's home shards), so
 * its check saves a read event on the master that carries the job, as on
 * a single instance. false when not paired (no lane, no room left, another
 * lane, keys elsewhere, or the check failed: the caller checks alone, and
 * stand_send_all sends the read if it is not out). */
static bool precheck_paired(struct worker *w, int l, int n, const int *argcs,
                            const char *const *const *argvs, struct rconn_reply **out)
{
    /* no read while the streams wait to be laid out again (w_relayout):
     * under a steady load the read paired with each admission was always
     * out, and an adapter loaded meanwhile never got its stream */
    if (l < 0 || w->relayout || rconn_awaiting(w->lane[l].rc))
        return false;
    int room = w_admissible(w) - 1;
    if (room <= 0)
        return false;
    if (w_cluster(w) && (l != w->home_lane || reads_every_lane(w, room)))
        return false;
    struct w_lane *ln = &w->lane[l];
    int count = lane_count(w, l, room);
    struct rl_err err;
    int rc = rconn_commands_then_xreadgroup(ln->rc, n, argcs, argvs, out, w->opt.group,
                                            w->opt.name, ln->n, ln->keys, count,
                                            stand_block_ms(w, true), &err);
    if (rconn_awaiting(ln->rc)) /* the read went, whatever the check's answer */
        lane_sent(ln, count, false);
    if (rc) {
        for (int i = 0; i < n; i++) {
            rconn_reply_free(out[i]);
            out[i] = NULL;
        }
        RL_LOG(&w->log, RL_LOG_DEBUG, "admission check with the read: %s", err.msg);
        return false;
    }
    return true;
}

/* Whether two one-key commands go to the same master of c's slot map (on
 * a single instance: always). */
static bool same_master(const struct rconn *c, const char *const *a, const char *const *b)
{
    int m = rconn_slot_master(c, rcl_command_slot(2, a, NULL));
    return m >= 0 && m == rconn_slot_master(c, rcl_command_slot(2, b, NULL));
}

/* GET <prefix>cancel:<id> (meant for this request: ident.c) and GET of
 * the cache entry, in one round trip (with the lane's next read when it
 * can: precheck_paired). A Redis failure here counts as "not cancelled,
 * not cached": the per-step check catches a cancel soon after. */
static void precheck(struct worker *w, struct wjob *j, int pair_lane, bool *cancelled,
                     char **cached, size_t *cached_len)
{
    *cancelled = false;
    *cached = NULL;
    struct rl_err err;
    char ck[W_KEY_MAX + 16];
    rcl_tagged_key(ck, sizeof ck, w_cluster(w), w->opt.prefix, "cancel:", j->id);
    /* two GETs, not an MGET: an ACL lets the worker read each of the two
     * keys, but no one command read both */
    const char *a1[2] = {"GET", ck}, *a2[2] = {"GET", j->cache_key};
    const char *const *argvs[2] = {a1, a2};
    const int argcs[2] = {2, 2};
    int n = j->cache_fill ? 2 : 1;
    /* on a cluster the cache entry's key is in its hash's slot, most often
     * on another master than the cancel key's: the cancel GET still rides
     * with the read, the cache GET goes alone to its own master */
    int n_pair = n == 2 && w_cluster(w) && !same_master(w->rc, a1, a2) ? 1 : n;
    struct rconn_reply *pr[2] = {NULL, NULL};
    const struct rconn_reply *r[2] = {NULL, NULL};
    if (precheck_paired(w, pair_lane, n_pair, argcs, argvs, pr)) {
        r[0] = pr[0], r[1] = pr[1];
        if (n_pair < n && rconn_command(w->rc, argcs[1], argvs[1], NULL, &pr[1], &err) == 0)
            r[1] = pr[1];
    } else {
        rconn_batch_reset(w->batch);
        for (int i = 0; i < n; i++)
            if (rconn_batch_add(w->batch, argcs[i], argvs[i], NULL, &err))
                return;
        if (rconn_batch_exec(w->rc, w->batch, &err))
            return;
        for (int i = 0; i < n; i++)
            r[i] = rconn_batch_reply(w->batch, i);
    }
    *cancelled = w_ident_cancel_meant(j, r[0]);
    if (r[0] && r[0]->type != RCONN_ERROR)
        w_checked_now(j); /* no second GET of it in the very next flush */
    if (j->cache_fill && r[1] && r[1]->type == RCONN_STRING) {
        *cached = malloc(r[1]->len + 1);
        if (*cached) {
            memcpy(*cached, r[1]->str, r[1]->len + 1);
            *cached_len = r[1]->len;
        }
    }
    rconn_reply_free(pr[0]);
    rconn_reply_free(pr[1]);
}

int w_admit(struct worker *w, int pool, const struct rconn_entry *e, int64_t deliveries,
            bool resumed, int pair_lane)
{
    struct wjob *j = calloc(1, sizeof *j);
    if (!j)
        return -RL_ENOMEM;
    j->pool = pool;
    j->lora = -1;
    j->state = WJ_CLOSING;
    j->deliveries = deliveries;
    j->resumed = resumed;
    snprintf(j->entry_id, sizeof j->entry_id, "%s", e->id);
    j->t_enqueued = strtoll(e->id, NULL, 10);
    size_t e0n = 0;
    const char *e0 = rconn_entry_field(e, "entry0", &e0n);
    if (e0 && e0n > 0 && e0n < sizeof j->entry0) { /* moved from an offer stream */
        memcpy(j->entry0, e0, e0n);
        j->entry0[e0n] = 0;
        j->t_enqueued = strtoll(j->entry0, NULL, 10);
    }
    j->t_admitted = rl_wall_ms();
    j->stream_ttl_s = w->opt.default_stream_ttl_s;
    ev_seq_init(&j->seq);
    if (w_jobs_add(w, j)) {
        free(j);
        return -RL_ENOMEM;
    }
    if (e->deleted) { /* XDELed while pending: nothing left to run */
        j->state = WJ_ACKING;
        return 0;
    }
    size_t raw_len = 0;
    const char *raw = rconn_entry_field(e, "job", &raw_len);
    w_ident_init(j, e, raw, raw_len);
    if (!raw) {
        reject(w, j, NULL, 0, EV_CODE_BAD_ENTRY, "the stream entry has no `job` field");
        return 0;
    }
    char fallback[RCONN_ID_MAX + 2];
    snprintf(fallback, sizeof fallback, "j%s", e->id);
    struct job_opts jo = w->jopts;
    jo.fallback_id = fallback;
    struct job_fault fault;
    struct rl_err err;
    if (job_parse(raw, raw_len, &jo, &j->job, &fault, &err)) {
        char id[JOB_ID_MAX + 1];
        job_guess_id(raw, raw_len, NULL, id);
        set_id(w, j, id);
        reject(w, j, raw, raw_len, fault.code, err.msg);
        return 0;
    }
    set_id(w, j, j->job->id);
    j->stream_ttl_s = j->job->stream_ttl_s;
    if (job_check_pool(j->job, w->pools[pool], w->pool_names, w->n_pools, &fault, &err)) {
        reject(w, j, raw, raw_len, fault.code, err.msg);
        return 0;
    }
    if (j->job->model[0] && strcmp(j->job->model, w->model.name) &&
        (j->lora = w_lora_find(w, j->job->model)) < 0) {
        /* an adapter that other workers hold, queued in the pools before
         * the dispatcher knew this worker lacks it: to its stream */
        if (((!resumed && deliveries <= 1) || (resumed && !w_cluster(w))) &&
            w_handoff_try(w, j, pool, raw, raw_len))
            return 0;
        w_reject_model(w, j, raw, raw_len);
        return 0;
    }
    enum ev_code code = EV_CODE_NONE;
    if (render(w, j, &code, &err)) {
        reject(w, j, raw, raw_len, code, err.msg);
        return 0;
    }
    if (j->job->task == JOB_TASK_RERANK && (w->rerank_ids[0] < 0 || w->rerank_ids[1] < 0)) {
        reject(w, j, raw, raw_len, EV_CODE_BAD_PARAM,
               "task rerank: this model's tokenizer has no single \"yes\" and \"no\" tokens "
               "(a Qwen3-Reranker's has)");
        return 0;
    }
    struct engine_request rq;
    build_request(w, j, &rq);
    if (engine_check(w->eng, &rq, &err)) {
        reject(w, j, raw, raw_len, refusal_code(&err), err.msg);
        return 0;
    }
    /* what the engine will hold of it: a truncated embedding's prompt is
     * longer than any the pool can take, and an estimate that long would
     * admit nothing ever again */
    int ctx = engine_n_context(w->eng);
    w->last_prompt_len = j->n_ids < ctx ? j->n_ids : ctx - 1;
    if (resumed) {
        int r = w_resume_prepare(w, j, &err);
        if (r < 0 && w_is_oom(err.msg)) {
            /* Redis is out of memory (its FENCE_TAKE refused): hand the
             * entry back as it was (publish.c), admit nothing more */
            w_oom_seen(w, 0, 0);
            j->state = 0;
            j->release = true;
            return 0;
        }
        if (r < 0) { /* cannot read it back now: leave it pending for a later claim */
            RL_LOG(&w->log, RL_LOG_WARN, "job %s: resume: %s", j->id, err.msg);
            w->n_jobs--;
            w_job_free(j);
            return 0;
        }
        if (r == 1) { /* done already published: only the XACK was missing */
            j->state = WJ_ACKING;
            return 0;
        }
        if (r == 2) { /* an error was published but not its done */
            w_push_done(w, j, EV_FINISH_ERROR, NULL, NULL);
            return 0;
        }
        if (r == 3) { /* another request owns the id (ident.c) */
            w_ident_refuse(w, j, j->ident);
            return 0;
        }
        if (j->n_prev >= j->job->max_tokens) { /* it died right after its last token */
            struct engine_usage u = {.prompt_tokens = j->n_ids};
            w_push_done(w, j, EV_FINISH_LENGTH, &u, NULL);
            return 0;
        }
        if (j->stalls >= w->opt.max_deliveries) {
            /* counted by the holder record (fence.h): deliveries in a row
             * that published nothing, so a job that makes progress on
             * every delivery (workers too starved to renew their leases,
             * not killed by it) is not taken for poison */
            char msg[224];
            snprintf(msg, sizeof msg, "the job was delivered %" PRId64 " times, the last %" PRId64
                     " of them to workers that died before publishing anything (max_deliveries "
                     "%d)", deliveries, j->stalls, w->opt.max_deliveries);
            reject(w, j, raw, raw_len, EV_CODE_TOO_MANY_DELIVERIES, msg);
            return 0;
        }
    }
    if (j->job->deadline_ms > 0 && rl_wall_ms() >= j->job->deadline_ms) {
        w_push_done(w, j, EV_FINISH_DEADLINE, NULL, NULL);
        wm_error(&w->m, EV_CODE_DEADLINE_EXCEEDED);
        return 0;
    }
    if (!resumed && w_cache_key(w, j, &err))
        RL_LOG(&w->log, RL_LOG_WARN, "job %s: no cache key: %s", j->id, err.msg);
    bool cancelled;
    char *cached = NULL;
    size_t cached_len = 0;
    precheck(w, j, pair_lane, &cancelled, &cached, &cached_len);
    if (cancelled) {
        free(cached);
        j->cache_fill = false;
        w_push_done(w, j, EV_FINISH_CANCELLED, NULL, NULL);
        return 0;
    }
    if (cached) {
        j->cache_fill = false; /* the replay is not a new entry */
        int rc = w_cache_replay(w, j, cached, cached_len, &err);
        free(cached);
        if (rc == 0) {
            pthread_mutex_lock(&w->m.mu);
            w->m.cache_hits++;
            pthread_mutex_unlock(&w->m.mu);
            j->cache_fill = false;
            j->state = WJ_CLOSING;
            RL_LOG(&w->log, RL_LOG_DEBUG, "job %s: answered from the result cache", j->id);
            return 0;
        }
        RL_LOG(&w->log, RL_LOG_WARN, "job %s: unusable cache entry: %s", j->id, err.msg);
    } else if (j->cache_fill) {
        pthread_mutex_lock(&w->m.mu);
        w->m.cache_misses++;
        pthread_mutex_unlock(&w->m.mu);
    }
    if (j->job->tools) {
        struct chat_parser_opts po = {.think_open = false, .no_tools = false};
        if (chat_parser_create(&j->parser, &po, &err) == 0)
            j->tool_calls = cJSON_CreateArray();
    }
    if (j->job->constraint != JOB_CONSTRAINT_NONE && (j->raw = malloc(raw_len + 1))) {
        memcpy(j->raw, raw, raw_len);
        j->raw[raw_len] = 0;
        j->raw_len = raw_len;
    }
    if (submit(w, j, &err)) {
        j->cache_fill = false;
        reject(w, j, raw, raw_len, refusal_code(&err), err.msg);
        return 0;
    }
    j->state = WJ_RUNNING;
    pthread_mutex_lock(&w->m.mu);
    wm_observe(&w->m.queue_wait, (double)(j->t_admitted > j->t_enqueued
                                              ? j->t_admitted - j->t_enqueued : 0) / 1000.0);
    pthread_mutex_unlock(&w->m.mu);
    RL_LOG(&w->log, RL_LOG_DEBUG, "job %s: admitted from %s (%d prompt tokens%s)", j->id,
           w->pools[pool], j->n_ids, resumed ? ", resumed" : "");
    return 0;
}

/* Content through the tool-call parser: plain text stays content, each
 * complete <tool_call> block becomes an entry of the done event's
 * tool_calls, and the arguments of a call being generated go into *deltas
 * (created on demand, caller deletes) as the delta event's tool_calls: a
 * call's index is its position in the done event's tool_calls, and its
 * first fragment carries id, type and name. */
static void parse_content(struct wjob *j, const char *text, size_t len, bool finish,
                          struct text *content, cJSON **deltas)
{
    const struct chat_event *ce = NULL;
    size_t n_ce = 0;
    struct rl_err err;
    for (int pass = 0; pass < 2; pass++) {
        /* finish only at the end: it flushes what the parser holds back (a
         * "<" that may start <tool_call>), and its events would be lost */
        if (pass == 1 && !finish)
            break;
        int rc = pass == 0 ? chat_parser_feed(j->parser, text, len, &ce, &n_ce, &err)
                           : chat_parser_finish(j->parser, &ce, &n_ce, &err);
        if (rc)
            continue;
        for (size_t i = 0; i < n_ce; i++) {
            if (ce[i].type == CHAT_EVENT_TOOL_DELTA && j->tool_calls) {
                int index = cJSON_GetArraySize(j->tool_calls);
                if (!*deltas && !(*deltas = cJSON_CreateArray()))
                    continue;
                cJSON *last = cJSON_GetArrayItem(*deltas, cJSON_GetArraySize(*deltas) - 1);
                cJSON *li = last ? cJSON_GetObjectItemCaseSensitive(last, "index") : NULL;
                cJSON *lf = last ? cJSON_GetObjectItemCaseSensitive(last, "function") : NULL;
                cJSON *la = lf ? cJSON_GetObjectItemCaseSensitive(lf, "arguments") : NULL;
                if (!ce[i].name && cJSON_IsNumber(li) && li->valueint == index && cJSON_IsString(la)) {
                    /* the same call's next fragment in this event: joined */
                    size_t a = strlen(la->valuestring), b = strlen(ce[i].arguments);
                    char *m = malloc(a + b + 1);
                    if (m) {
                        memcpy(m, la->valuestring, a);
                        memcpy(m + a, ce[i].arguments, b + 1);
                        cJSON *ns = cJSON_CreateString(m);
                        if (ns)
                            cJSON_ReplaceItemInObjectCaseSensitive(lf, "arguments", ns);
                        free(m);
                    }
                    continue;
                }
                cJSON *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
                if (!c || !f) {
                    cJSON_Delete(c);
                    cJSON_Delete(f);
                    continue;
                }
                cJSON_AddNumberToObject(c, "index", index);
                if (ce[i].name) {
                    char cid[32];
                    snprintf(cid, sizeof cid, "call_%d", index + 1);
                    cJSON_AddStringToObject(c, "id", cid);
                    cJSON_AddStringToObject(c, "type", "function");
                    cJSON_AddStringToObject(f, "name", ce[i].name);
                }
                cJSON_AddStringToObject(f, "arguments", ce[i].arguments);
                cJSON_AddItemToObject(c, "function", f);
                cJSON_AddItemToArray(*deltas, c);
            } else if (ce[i].type == CHAT_EVENT_TOOL_DELTA) {
                continue;
            } else if (ce[i].type == CHAT_EVENT_TOOL_CALL && j->tool_calls) {
                char cid[32];
                snprintf(cid, sizeof cid, "call_%d", cJSON_GetArraySize(j->tool_calls) + 1);
                cJSON *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
                cJSON_AddStringToObject(c, "id", cid);
                cJSON_AddStringToObject(c, "type", "function");
                cJSON_AddStringToObject(f, "name", ce[i].name);
                cJSON_AddStringToObject(f, "arguments", ce[i].arguments);
                cJSON_AddItemToObject(c, "function", f);
                cJSON_AddItemToArray(j->tool_calls, c);
            } else {
                text_add(content, ce[i].text, ce[i].len);
            }
        }
    }
}

static enum ev_finish map_finish(enum engine_finish f)
{
    switch (f) {
    case ENGINE_FINISH_LENGTH: return EV_FINISH_LENGTH;
    case ENGINE_FINISH_CANCELLED: return EV_FINISH_CANCELLED;
    case ENGINE_FINISH_DEADLINE: return EV_FINISH_DEADLINE;
    case ENGINE_FINISH_ERROR: return EV_FINISH_ERROR;
    default: return EV_FINISH_STOP;
    }
}

/* One delta event of j, with the next seq, into its outbox. */
static void emit_delta(struct worker *w, struct wjob *j, const struct ev_delta *d)
{
    char *json;
    struct rl_err err;
    if (ev_build_delta(ev_seq_take(&j->seq), d, &json, &err) == 0)
        w_push_event(j, json);
    else
        RL_LOG(&w->log, RL_LOG_ERROR, "job %s: %s", j->id, err.msg);
}

/* Coalescing. A delta is a run of tokens with their text, so consecutive
 * deltas of one job concatenate into one that a client reads exactly as it
 * would read them apart (schemas/README.md). Holding them back changes
 * nothing for resumption: a job's tokens count as published only once
 * their event is in the stream, so a worker that dies holding some makes
 * its successor generate them again, token-exact. Logprob deltas are not
 * held (their per-token arrays would have to be merged too). The bound is
 * time, not the reader's lag (and a job's first delta is never held): knowing a reader is behind would cost Redis
 * a command per stream per step, more than coalescing saves. */
static void hold_release(struct worker *w, struct wjob *j)
{
    if (!j->t_hold)
        return;
    struct ev_delta d = {
        .content = j->hold_content.n ? j->hold_content.p : NULL,
        .content_len = j->hold_content.n,
        .reasoning_content = j->hold_reasoning.n ? j->hold_reasoning.p : NULL,
        .reasoning_len = j->hold_reasoning.n, .token_ids = j->hold_ids, .n_token_ids = j->n_hold};
    emit_delta(w, j, &d);
    w_hold_clear(j);
}

void w_hold_clear(struct wjob *j)
{
    j->n_hold = 0;
    j->hold_content.n = j->hold_reasoning.n = 0;
    j->t_hold = 0;
}

/* Takes d into j's hold; false (and nothing held changed) when d is not to
 * be held: coalescing off, logprobs, the job's first tokens, or no memory. */
static bool hold_take(struct worker *w, struct wjob *j, const struct ev_delta *d, int64_t now)
{
    if (w->opt.coalesce_ms <= 0 || d->logprobs || d->tool_calls || !j->t_first)
        return false; /* the first tokens go at once: coalescing never adds to TTFT */
    if (j->n_hold + d->n_token_ids > j->cap_hold) {
        int cap = j->cap_hold ? j->cap_hold : 16;
        while (cap < j->n_hold + d->n_token_ids)
            cap *= 2;
        int32_t *g = realloc(j->hold_ids, (size_t)cap * sizeof *g);
        if (!g)
            return false;
        j->hold_ids = g;
        j->cap_hold = cap;
    }
    size_t nc = j->hold_content.n, nr = j->hold_reasoning.n;
    if (text_add(&j->hold_content, d->content ? d->content : "", d->content_len) ||
        text_add(&j->hold_reasoning, d->reasoning_content ? d->reasoning_content : "",
                 d->reasoning_len)) {
        j->hold_content.n = nc; /* back to what was held */
        j->hold_reasoning.n = nr;
        j->hold_content.oom = j->hold_reasoning.oom = false;
        return false;
    }
    if (d->n_token_ids)
        memcpy(j->hold_ids + j->n_hold, d->token_ids, (size_t)d->n_token_ids * sizeof *d->token_ids);
    j->n_hold += d->n_token_ids;
    if (!j->t_hold)
        j->t_hold = now;
    return true;
}

/* One clock for the whole batch, not one per job: every held delta goes
 * out in the same flush, so a coalescing worker writes once per
 * coalesce_ms (one emit call, one wake of each reader) instead of every
 * step for whichever jobs happened to come due then. No delta waits
 * longer than coalesce_ms either way. */
void w_hold_due(struct worker *w, int64_t now_ms, bool all)
{
    if (!all && now_ms - w->hold_tick_ms < w->opt.coalesce_ms)
        return;
    w->hold_tick_ms = now_ms;
    for (int i = 0; i < w->n_jobs; i++) {
        struct wjob *j = w->jobs[i];
        if (j->t_hold)
            hold_release(w, j);
        j->out_wait = false;
    }
}

/* Milliseconds to the next coalescing tick when a finished job waits for
 * it (out_wait), else -1: an idle worker's blocking read ends by then. */
static int tick_in(const struct worker *w, int64_t now_ms)
{
    if (w->opt.coalesce_ms <= 0)
        return -1;
    for (int i = 0; i < w->n_jobs; i++)
        if (w->jobs[i]->out_wait) {
            int64_t ms = w->hold_tick_ms + w->opt.coalesce_ms - now_ms;
            return ms < 1 ? 1 : (int)ms;
        }
    return -1;
}

static void on_event(struct worker *w, const struct engine_event *ev)
{
    struct wjob *j = ev->user;
    if (j && j->state == WJ_DROPPED) { /* taken over: only its end matters */
        if (ev->finish != ENGINE_FINISH_NONE) {
            j->eng_id = 0;
            if (j->ident)
                w_ident_apply(w, j); /* refused by its identity: answered, then acked */
            else
                j->state = 0; /* freed by the next flush */
        }
        return;
    }
    if (!j || j->state != WJ_RUNNING)
        return;
    if (ev->finish == ENGINE_FINISH_ERROR && ev->refused > EV_CODE_NONE &&
        ev->refused < EV_CODE_COUNT) {
        /* its constraint did not compile (the engine's compile threads):
         * answered as at admission, dead letter included */
        j->eng_id = 0;
        j->cache_fill = false;
        reject(w, j, j->raw ? j->raw : "", j->raw ? j->raw_len : 0, (enum ev_code)ev->refused,
               ev->error);
        return;
    }
    free(j->raw); /* it runs: no refusal to come */
    j->raw = NULL;
    int64_t now = rl_wall_ms();
    bool fin = ev->finish != ENGINE_FINISH_NONE;
    struct text content = {0};
    cJSON *tc_deltas = NULL; /* the delta's tool_calls */
    if (j->parser)
        parse_content(j, ev->content, ev->n_content, fin, &content, &tc_deltas);
    else
        text_add(&content, ev->content, ev->n_content);
    if (ev->n_tokens > 0 || content.n || ev->n_reasoning || tc_deltas) {
        struct ev_logprob *lp = NULL;
        int32_t *top_ids = NULL;
        float *top_lp = NULL;
        const char **top_b = NULL; /* each token's bytes (owned by the tokenizer) */
        size_t *top_nb = NULL;
        if (ev->logprobs && ev->n_tokens > 0) {
            const struct tokenizer *tok = engine_get_tokenizer(w->eng);
            int nt = ev->top ? ev->n_top : 0;
            size_t cells = (size_t)ev->n_tokens * (size_t)(nt ? nt : 1);
            lp = calloc((size_t)ev->n_tokens, sizeof *lp);
            top_ids = calloc(cells, sizeof *top_ids);
            top_lp = calloc(cells, sizeof *top_lp);
            top_b = calloc(cells, sizeof *top_b);
            top_nb = calloc(cells, sizeof *top_nb);
            if (lp && top_ids && top_lp && top_b && top_nb) {
                for (int i = 0; i < ev->n_tokens; i++) {
                    lp[i].token_id = ev->tokens[i];
                    lp[i].logprob = ev->logprobs[i] <= 0 ? ev->logprobs[i] : 0;
                    lp[i].n_top = nt;
                    if (tok)
                        lp[i].bytes = tok_token_bytes(tok, ev->tokens[i], &lp[i].n_bytes);
                    for (int k = 0; k < nt; k++) {
                        top_ids[i * nt + k] = ev->top[i * nt + k].id;
                        float l = ev->top[i * nt + k].logprob;
                        top_lp[i * nt + k] = l <= 0 ? l : 0;
                        if (tok)
                            top_b[i * nt + k] = tok_token_bytes(tok, ev->top[i * nt + k].id,
                                                                &top_nb[i * nt + k]);
                    }
                    lp[i].top_ids = top_ids + i * nt;
                    lp[i].top_logprobs = top_lp + i * nt;
                    if (tok) {
                        lp[i].top_bytes = top_b + i * nt;
                        lp[i].top_n_bytes = top_nb + i * nt;
                    }
                }
            } else {
                free(lp);
                lp = NULL;
            }
        }
        struct ev_delta d = {
            .content = content.n ? content.p : NULL, .content_len = content.n,
            .reasoning_content = ev->n_reasoning ? ev->reasoning : NULL,
            .reasoning_len = ev->n_reasoning, .token_ids = ev->tokens,
            .n_token_ids = ev->n_tokens, .logprobs = lp, .tool_calls = tc_deltas};
        if (!hold_take(w, j, &d, now)) {
            hold_release(w, j); /* what was held goes first, in order */
            emit_delta(w, j, &d);
        } /* else held: out at the next tick (w_hold_due), or below if it ended */
        free(lp);
        free(top_ids);
        free(top_lp);
        free(top_b);
        free(top_nb);
        if (ev->n_tokens > 0) {
            pthread_mutex_lock(&w->m.mu);
            if (!j->t_first) {
                wm_observe(&w->m.ttft, (double)(now - (j->t_enqueued ? j->t_enqueued : now)) / 1000.0);
                wm_observe(&w->m.prefill, (double)(now > j->t_admitted ? now - j->t_admitted : 0) / 1000.0);
            } else {
                /* a step that brings several tokens spreads its gap over them */
                double gap = (double)(now - j->t_last_tok) / 1000.0 / ev->n_tokens;
                for (int i = 0; i < ev->n_tokens; i++)
                    wm_observe(&w->m.inter_token, gap);
            }
            w->m.tokens_out += ev->n_tokens;
            pthread_mutex_unlock(&w->m.mu);
            if (!j->t_first) {
                j->t_first = now;
                /* engine-only TTFT, which tests/bench/bench_worker.py
                 * subtracts from what a client sees through Redis */
                RL_LOG(&w->log, RL_LOG_DEBUG, "job %s: engine ttft %.3f ms", j->id,
                       (engine_now() - j->t_submit_s) * 1000.0);
            }
            j->t_last_tok = now;
            j->n_gen += ev->n_tokens;
            w->rate_tokens += ev->n_tokens;
        }
    }
    free(content.p);
    cJSON_Delete(tc_deltas);
    if (!fin)
        return;
    hold_release(w, j); /* before done or error */
    /* a job that ends between ticks waits for the next one, as its last
     * delta would have: with jobs ending every few steps, sending each done
     * at once made nearly every step an emit call and a wake of every
     * reader, coalescing or not (issue 27 point 3). Its first token and an
     * error still go at once; no event waits longer than coalesce_ms. */
    j->out_wait = w->opt.coalesce_ms > 0 && j->t_first && ev->finish != ENGINE_FINISH_ERROR;
    j->eng_id = 0;
    if (ev->finish != ENGINE_FINISH_STOP && ev->finish != ENGINE_FINISH_LENGTH)
        j->cache_fill = false;
    if (ev->finish == ENGINE_FINISH_ERROR) {
        RL_LOG(&w->log, RL_LOG_ERROR, "job %s: engine error: %s", j->id,
               ev->error ? ev->error : "?");
        w_push_error(w, j, EV_CODE_ENGINE_ERROR, ev->error);
    } else {
        struct w_answer a = {.embedding = ev->embedding, .n_embedding = ev->n_embedding,
                             .matched_stop = ev->stop};
        if (ev->scores && ev->n_scores == 2) {
            /* Qwen3-Reranker's relevance: P("yes") of the two answers it
             * was taught, a softmax over their logits alone */
            a.has_score = true;
            a.score = 1.0 / (1.0 + exp((double)ev->scores[1] - (double)ev->scores[0]));
        }
        w_push_done(w, j, map_finish(ev->finish), &ev->usage, &a);
    }
    pthread_mutex_lock(&w->m.mu);
    w->m.jobs_done++;
    w->m.finished[map_finish(ev->finish)]++;
    if (j->lora >= 0 && j->lora < LORA_MAX_ADAPTERS)
        w->m.lora_jobs[j->lora]++;
    int64_t t0 = j->t_enqueued && j->t_enqueued <= now ? j->t_enqueued : now;
    wm_observe(&w->m.e2e, (double)(now - t0) / 1000.0);
    {
        /* the heartbeat's queue/prefill/decode split of e2e: XADD ->
         * admission -> first token -> end, each clamped into [t0, now] so
         * the three add up to e2e (a job that never got a token: all its
         * time after admission is prefill) */
        int64_t ta = j->t_admitted ? j->t_admitted : now;
        ta = ta < t0 ? t0 : (ta > now ? now : ta);
        int64_t tf = j->t_first ? j->t_first : now;
        tf = tf < ta ? ta : (tf > now ? now : tf);
        wm_observe(&w->m.v_queue, (double)(ta - t0) / 1000.0);
        wm_observe(&w->m.v_prefill, (double)(tf - ta) / 1000.0);
        wm_observe(&w->m.v_decode, (double)(now - tf) / 1000.0);
    }
    if (j->t_first)
        wm_observe(&w->m.decode, (double)(now > j->t_first ? now - j->t_first : 0) / 1000.0);
    wm_observe(&w->m.prompt_len, ev->usage.prompt_tokens);
    wm_observe(&w->m.gen_len, ev->usage.completion_tokens);
    w->m.prompt_tokens += ev->usage.prompt_tokens;
    pthread_mutex_unlock(&w->m.mu);
    RL_LOG(&w->log, RL_LOG_DEBUG, "job %s: %s after %d tokens", j->id,
           engine_finish_name(ev->finish), ev->usage.completion_tokens);
}

/* SIGHUP: the options the config table marks live, from a fresh load of
 * the file and flags (wopts_reload); the rest keep their running values. */
static void apply_reload(struct worker *w)
{
    struct rl_err err;
    if (wopts_reload(&w->opt, &w->cfg, w->argc, w->argv, &err)) {
        RL_LOG(&w->log, RL_LOG_ERROR, "SIGHUP: keeping the old settings: %s", err.msg);
        return;
    }
    int lvl = rl_log_parse_level(w->opt.log_level);
    if (lvl >= 0)
        w->log.level = lvl;
    cfg_job_opts(&w->cfg, &w->jopts);
    w_lora_reload(w); /* adapters added to lora_modules load now */
    w_lorart_retry(w); /* runtime ones that failed, with lora_dirs as they are now */
    RL_LOG(&w->log, RL_LOG_INFO, "SIGHUP: settings reloaded");
}

static void ensure_groups(struct worker *w)
{
    if (w->groups_ok)
        return;
    struct rl_err err;
    for (int p = 0; p < w->n_pools; p++)
        if (rconn_xgroup_create(w->rc, w->pool_keys[p], w->opt.group, "0", &err)) {
            RL_LOG(&w->log, RL_LOG_DEBUG, "XGROUP CREATE %s: %s", w->pool_keys[p], err.msg);
            return;
        }
    w->groups_ok = true;
}

static void read_failed(struct worker *w, const struct rl_err *err)
{
    if (strstr(err->msg, "NOGROUP")) {
        w->groups_ok = false; /* Redis lost the group (restarted without data) */
        ensure_groups(w);
    }
    RL_LOG(&w->log, RL_LOG_DEBUG, "XREADGROUP: %s", err->msg);
}

/* One entry read from stream p. An entry the dispatcher moved out of a
 * dead (or stalled) worker's offer stream after it had been delivered
 * there ("moved": "pending", "dlv": its deliveries) is a takeover like an
 * XAUTOCLAIM's: resumed from what its stream holds. */
static void admit_read(struct worker *w, int p, const struct rconn_entry *e, int pair_lane)
{
    size_t n = 0;
    const char *mv = rconn_entry_field(e, "moved", &n);
    bool pend = mv && n == 7 && !memcmp(mv, "pending", 7);
    int64_t dl = 1;
    if (pend) {
        char buf[24];
        const char *d = rconn_entry_field(e, "dlv", &n);
        if (d && n < sizeof buf) {
            memcpy(buf, d, n);
            buf[n] = 0;
            dl = strtoll(buf, NULL, 10) + 1;
            if (dl < 1)
                dl = 1;
        }
    }
    if (p >= w_n_queue_streams(w)) { /* from our offer stream */
        pthread_mutex_lock(&w->m.mu);
        w->m.affinity_taken++;
        pthread_mutex_unlock(&w->m.mu);
    } else if (w->home_lane >= 0 && p / w->n_base_pools != w->home_lane) {
        pthread_mutex_lock(&w->m.mu);
        w->m.foreign_taken++;
        pthread_mutex_unlock(&w->m.mu);
    }
    w_admit(w, p, e, dl, pend, pair_lane);
}

/* The streams lane l's standing read names; keys[i] is pool stream
 * idx[i]. Returns how many. First our offer streams (jobs offered to us
 * for the prefix we hold, issue 27: only with affinity, so only on a single
 * instance, whose one lane is lane 0), then every pool's shard l (one
 * slot's streams on a cluster; the pools themselves on a single instance). */
static int lane_streams(struct worker *w, int l, const char **keys, int *idx)
{
    int n = 0;
    for (int i = w_n_queue_streams(w); i < w->n_pools; i++) {
        keys[n] = w->pool_key_ptrs[i];
        idx[n++] = i;
    }
    for (int p = 0; p < w->n_base_pools; p++) {
        int s = p + l * w->n_base_pools;
        keys[n] = w->pool_key_ptrs[s];
        idx[n++] = s;
    }
    return n;
}

/* The standing reads (rconn_xreadgroup_send): a worker with room keeps an
 * XREADGROUP ... BLOCK waiting in Redis on each lane (one on a single
 * instance, one per pool shard on a cluster, each on a connection of its
 * own: a cluster read names one slot's streams) and looks, each step,
 * whether one came back, waiting up to wait_ms (an idle worker's block
 * time; 0 while it steps) for any of them. Redis answers when a job
 * arrives, so a busy worker does not poll every step: a read event a step
 * saved (most of a coalescing worker's Redis work, issue 27 point 3; on a
 * cluster one per shard a step, point 4), and no round trip on the step's
 * critical path (point 5). A full worker has no read out, so it takes
 * nothing while it has no room (the pull model).
 *
 * The room is shared out: a lane is sent with a share of what the reads
 * already out may not bring (stand_send_all), COUNT being per stream, so
 * all of them together bring at most the room plus a rounding (< a stream
 * per lane); every lane keeps a read out while there is room at all (one
 * job a stream at least), so a job in any shard is seen at once (but for
 * a busy worker's foreign lanes on a cluster: lane_mode below). The room
 * only grows while reads wait (admissions come from them), but the KV
 * estimate may shrink: a job taken beyond it waits its turn in the
 * engine's queue. */
static int stand_block_ms(const struct worker *w, bool block)
{
    return !block ? -1 : w->opt.read_block_ms > 0 ? w->opt.read_block_ms : 1000;
}

/* Names lane l's streams for its next read (keys, idx, n) and returns the
 * COUNT that brings at most share jobs, plus a rounding (COUNT is per
 * stream). */
static int lane_count(struct worker *w, int l, int share)
{
    struct w_lane *ln = &w->lane[l];
    ln->n = lane_streams(w, l, ln->keys, ln->idx);
    return (share + ln->n - 1) / ln->n;
}

/* W_LOOK_BACKOFF x steal_ms: the longest time between a foreign lane's
 * looks, and the most steal_after() stretches to. */
static int look_most(const struct worker *w)
{
    return w->cfg.steal_ms * W_LOOK_BACKOFF;
}

/* How old a job waiting in a foreign shard must be for a look to take it,
 * and the time between looks before any backoff: steal_ms, or two of this
 * worker's busy loop periods when that is longer, up to W_LOOK_BACKOFF x
 * steal_ms. A shard's own workers with room take its jobs as they come
 * (their standing reads); a full one sends its read again once a job ends,
 * at its next loop. Where loops take longer than steal_ms / 2 (a slow
 * model, a saturated Redis: 60 ms at the capped soak's cap) a fixed
 * steal_ms took jobs that their own workers would have read within a loop,
 * and every step of the thief then wrote a second master for them (an emit
 * call, a read event and a reader woken there: issue 27 point 4). The
 * loops of a fleet's workers are alike; this worker's stands for theirs. */
static int steal_after(const struct worker *w)
{
    double two = 2 * w->step_ms;
    int most = look_most(w);
    return two <= w->cfg.steal_ms ? w->cfg.steal_ms : two >= most ? most : (int)two;
}

static bool stand_send(struct worker *w, int l, int share, bool block)
{
    struct rl_err err;
    struct w_lane *ln = &w->lane[l];
    int count = lane_count(w, l, share);
    bool aged = !block && !w->plain_looks;
    int min_age = steal_after(w);
    int64_t upto = 0; /* any time */
    if (ln->starved_only) { /* home_backlog: 1 ms after the epoch at the least */
        upto = w->lane[w->home_lane].head_ms - (int64_t)w->cfg.steal_ms * W_STARVE;
        upto = upto > 1 ? upto : 1;
    }
    if (!(aged ? rconn_xreadgroup_send_aged(ln->rc, w->opt.group, w->opt.name, ln->n, ln->keys,
                                            count, min_age, upto, &err)
               : rconn_xreadgroup_send(ln->rc, w->opt.group, w->opt.name, ln->n, ln->keys,
                                       count, stand_block_ms(w, block), &err))) {
        lane_sent(ln, count, aged);
        return true;
    }
    read_failed(w, &err);
    return false;
}

/* A look at aged jobs refused by Redis for a reason other than a lost
 * group or connection (its script's commands not in this worker's ACL, a
 * Redis without them): plain looks from then on, which take what waits
 * however young. */
static void aged_look_failed(struct worker *w, const struct rl_err *err)
{
    if (err->code == RL_EIO || strstr(err->msg, "NOGROUP") || w->plain_looks)
        return;
    w->plain_looks = true;
    RL_LOG(&w->log, RL_LOG_WARN, "looks at other shards take any waiting job from now on "
           "(the aged read was refused: %s; config/redis-acl.conf has what it needs)", err->msg);
}

/* Home shards (issue 27 point 4): a job's pool shard is the one on the
 * master of its own streams (the dispatcher's rcl_shard_for_slot), so a
 * worker whose jobs come from one shard writes one master a step: one
 * emit call and one reader woken there, where jobs from every shard cost
 * a call and a wake on every master. A worker with little room therefore
 * keeps its standing read on its home lane only; a foreign lane is looked
 * at every steal_ms without BLOCK, which brings only what no standing
 * read took as it came (Redis serves blocked reads within the XADD): jobs
 * whose home workers are full. With foreign_room or more free it reads
 * every lane as it comes, so that a job never waits for a shard's own
 * workers while another worker idles; so does a worker that holds no job
 * (its room may be less than foreign_room when the KV cache bounds it:
 * it must not look every steal_ms while idle): reads_every_lane. Whether
 * lane l gets a read now (lane_mode): 1 a standing one, -1 a look, 0 none
 * yet. */
static bool reads_every_lane(const struct worker *w, int room)
{
    return w->home_lane < 0 || room >= w->foreign_room || w->n_jobs == 0;
}

/* The time between a foreign lane's looks now (look_came below). */
static int look_every(const struct worker *w, const struct w_lane *ln)
{
    return ln->look_every_ms > 0 ? ln->look_every_ms : steal_after(w);
}

/* Home first: whether the home shard may still hold jobs undelivered to
 * anyone, so that a busy worker's room goes there rather than to a look.
 * Under saturation every shard has jobs waiting, old enough for a look;
 * a worker that looked anyway took, for each slot freed, as many foreign
 * jobs as home ones, while its home's jobs waited for other workers'
 * looks: at 512 clients on 384 slots 40-47 % of the cluster's jobs ran
 * away from home and every step wrote every master (BENCHMARKS.md, "Home
 * first"). The home lane's last read brought all it asked of a stream:
 * more may wait; a read out there unanswered for steal_after() has found
 * nothing (a read of a shard that has some returns within a round trip),
 * and one that brought less than it asked found the shard drained. While
 * it lasts the other lanes are still looked at, every W_LOOK_BACKOFF x
 * steal_ms, for jobs queued W_STARVE x steal_ms before the home's next
 * one (after the last the home read brought: head_ms), by the times in
 * their IDs (each master's clock: NTP keeps them well within that margin):
 * a shard whose own workers are gone, or that has none (fewer workers than
 * shards), is not left to wait for the end of every backlog, and in a
 * cluster saturated alike, where every shard's next job waited about as
 * long, none runs away. A fixed age (1 s) did not tell the two apart: past
 * it every job of an overloaded cluster was old enough, and 25-30 % ran
 * away from home again (BENCHMARKS.md, "Home first"). */
static bool home_backlog(const struct worker *w, int64_t now)
{
    const struct w_lane *h = &w->lane[w->home_lane];
    if (!h->came_full)
        return false;
    return !rconn_awaiting(h->rc) || now - h->sent_ms < steal_after(w);
}

static int lane_mode(struct worker *w, int l, int room, int64_t now)
{
    struct w_lane *ln = &w->lane[l];
    if (l == w->home_lane || reads_every_lane(w, room))
        return 1;
    if (now < ln->next_look_ms)
        return 0;
    ln->starved_only = home_backlog(w, now);
    ln->next_look_ms = now + (ln->starved_only ? look_most(w) : look_every(w, ln));
    return -1;
}

/* Looks paced by what they find (issue 27 point 4). Every busy worker
 * looks at every other shard, so a shard is looked at by (workers - its
 * own) / steal_ms a second, each look a read event on its master (~20 us
 * of Redis CPU on this host, more than the script it runs): a cost per
 * worker, not per token, and nearly always for nothing, since a shard's
 * own workers keep up but for moments. A look that finds nothing
 * undelivered there at all (rconn_entries.drained) doubles the time to
 * the lane's next look, up to W_LOOK_BACKOFF x steal_ms; one that finds
 * anything waiting, young or old, or a read there that brings a job, puts
 * it back to steal_after(). The bound on a job's wait while a worker has
 * room grows from 2 to W_LOOK_BACKOFF x steal_ms: a job that came just
 * after a drained look is taken at the next (old enough by then); one that
 * is too young at it, one steal_after() later (with loops slower than
 * steal_ms / 2, up to twice that bound). */
static void look_came(struct worker *w, struct w_lane *ln, const struct rconn_entries *ents)
{
    if (ln->aged) {
        pthread_mutex_lock(&w->m.mu);
        w->m.foreign_looks++;
        w->m.foreign_looks_drained += ents->drained;
        pthread_mutex_unlock(&w->m.mu);
    }
    if (!ln->aged || ents->n > 0 || !ents->drained) {
        ln->look_every_ms = 0;
        return;
    }
    int every = look_every(w, ln), most = look_most(w);
    ln->look_every_ms = every < most / 2 ? 2 * every : most;
    ln->next_look_ms = rl_mono_ms() + ln->look_every_ms;
}

/* Milliseconds until a foreign lane's next look (an idle wait must not
 * outlast it), or -1 when none is due: no home, or room enough to read
 * every lane as it comes. */
static int next_look_in(const struct worker *w, int room, int64_t now)
{
    if (room <= 0 || reads_every_lane(w, room))
        return -1;
    int64_t next = -1;
    for (int l = 0; l < w->n_lanes; l++)
        if (l != w->home_lane && !rconn_awaiting(w->lane[l].rc) &&
            (next < 0 || w->lane[l].next_look_ms < next))
            next = w->lane[l].next_look_ms;
    return next < 0 ? -1 : next > now ? (int)(next - now) : 0;
}

/* Sends a read on every lane that has none out (and may have one now,
 * lane_mode), sharing room less what the reads out may still bring. */
static void stand_send_all(struct worker *w, int room)
{
    if (room <= 0 || w->relayout) /* its replies would meet another layout */
        return;
    int64_t now = rl_mono_ms();
    int idle = 0, promised = 0, mode[RCL_MAX_SHARDS];
    for (int l = 0; l < w->n_lanes; l++) {
        mode[l] = 0;
        if (rconn_awaiting(w->lane[l].rc))
            promised += w->lane[l].want;
        else if ((mode[l] = lane_mode(w, l, room, now)) != 0)
            idle++;
    }
    if (!idle)
        return;
    int avail = room - promised;
    int share = avail > idle ? (avail + idle - 1) / idle : 1;
    for (int l = 0; l < w->n_lanes; l++)
        if (mode[l])
            stand_send(w, l, share, mode[l] > 0);
}

/* Whether a standing read awaits its reply on some lane. */
static bool stand_out(const struct worker *w)
{
    for (int l = 0; l < w->n_lanes; l++)
        if (rconn_awaiting(w->lane[l].rc))
            return true;
    return false;
}

/* Whether a read brought COUNT entries of some stream it named (more may
 * wait there); *head_ms gets the time in the ID of the last entry such a
 * stream brought, the earliest of them. */
static bool came_full(const struct w_lane *ln, const struct rconn_entries *ents, int64_t *head_ms)
{
    int per = ln->n > 0 ? ln->want / ln->n : 0, got[W_MAX_STREAMS] = {0};
    bool full = false;
    *head_ms = 0;
    for (int i = 0; per > 0 && i < ents->n; i++) {
        int s = ents->v[i].stream;
        if (s < 0 || s >= ln->n || ++got[s] != per)
            continue;
        int64_t ms = rconn_id_ms(ents->v[i].id);
        if (!full || ms < *head_ms)
            *head_ms = ms;
        full = true;
    }
    return full;
}

static void standing_read(struct worker *w, int k, int wait_ms, bool draining)
{
    if (!draining)
        stand_send_all(w, k);
    struct rconn *rcs[RCL_MAX_SHARDS];
    for (int l = 0; l < w->n_lanes; l++)
        rcs[l] = w->lane[l].rc;
    int look = draining ? -1 : next_look_in(w, k, rl_mono_ms());
    if (look >= 0 && wait_ms > look)
        wait_ms = look > 0 ? look : 1;
    if (wait_ms > 0 && !rconn_wait_any(rcs, w->n_lanes, wait_ms))
        return;
    bool came_any = false;
    for (int l = 0; l < w->n_lanes; l++) {
        struct w_lane *ln = &w->lane[l];
        if (!rconn_awaiting(ln->rc))
            continue;
        struct rl_err err;
        struct rconn_entries ents = {0};
        bool came = false;
        if (rconn_xreadgroup_collect(ln->rc, ln->n, ln->keys, 0, &ents, &came, &err)) {
            if (ln->aged)
                aged_look_failed(w, &err);
            read_failed(w, &err);
            continue;
        }
        if (!came)
            continue;
        came_any = true;
        if (ln->aged || ents.n > 0)
            look_came(w, ln, &ents);
        ln->came_full = came_full(ln, &ents, &ln->head_ms);
        for (int i = 0; i < ents.n; i++) /* delivered to us: taken even when draining */
            /* the last one's admission check goes with this lane's next
             * read (precheck_paired: on a cluster the home lane's) */
            admit_read(w, ln->idx[ents.v[i].stream], &ents.v[i],
                       i == ents.n - 1 && !draining ? l : -1);
        rconn_entries_free(&ents);
    }
    if (came_any && !draining)
        stand_send_all(w, w_admissible(w));
}

static void aff_add_cb(void *ctx, uint64_t h)
{
    struct worker *w = ctx;
    aff_add(w->aff_scratch, w->aff_bytes, h);
}

/* Prefix-affine pulling (issue 27): every affinity_refresh_ms the filter
 * of the blocks the KV cache holds is recomputed (O(KV blocks)); when it
 * changed, the heartbeat that carries it (metrics.c) goes out with this
 * iteration's flush instead of at its interval, so the dispatcher sees a
 * conversation's blocks before its next turn comes. At most one early
 * heartbeat per affinity_refresh_ms. */
static void aff_refresh(struct worker *w, int64_t now, bool idle)
{
    /* going idle after work: at once, so the blocks of the jobs that just
     * ended are announced before the (blocking) read, not after it */
    if (!w->affinity || (now < w->aff_next_ms && !(idle && w->aff_dirty)))
        return;
    w->aff_dirty = false;
    w->aff_next_ms = now + w->cfg.affinity_refresh_ms;
    memset(w->aff_scratch, 0, w->aff_bytes);
    engine_each_cached_block(w->eng, aff_add_cb, w);
    if (!memcmp(w->aff_scratch, w->aff_bits, w->aff_bytes))
        return;
    uint8_t *t = w->aff_bits;
    w->aff_bits = w->aff_scratch;
    w->aff_scratch = t;
    w->next_hb_ms = now;
}

/* How many jobs to read now. A job's prompt length is known only once it
 * is read and rendered, so the engine is asked about the real length of
 * the last job admitted (1 before the first); what is already waiting in
 * the engine counts with its real length (sched_can_admit), so a longer
 * job read on this estimate only waits its turn there. */
int w_admissible(struct worker *w)
{
    if (w->redis_oom) /* Redis out of memory: finish what runs first (publish.c) */
        return 0;
    struct engine_stats st;
    engine_get_stats(w->eng, &st);
    /* jobs waiting for a compile hold no slot (engine.h), so they are
     * bounded apart; a job's constraint is known only once it is read, so
     * no read may take more than the bound leaves (each could be one) and
     * at the bound the worker reads nothing, leaving the pool's jobs to
     * workers that can start them */
    int k = engine_can_admit(w->eng, w->last_prompt_len > 0 ? w->last_prompt_len : 1);
    if (k > w->opt.max_compiling - st.n_compiling)
        k = w->opt.max_compiling - st.n_compiling;
    int slots = st.max_batch - st.n_slots_used; /* < 0: compiles ended into a full batch */
    if (w->admit_cap > 0 && w->admit_cap - st.n_slots_used < slots) /* publish.c */
        slots = w->admit_cap - st.n_slots_used;
    int n = k < slots ? k : slots;
    return n > 0 ? n : 0;
}

static void update_metrics(struct worker *w, bool draining)
{
    struct engine_stats st;
    engine_get_stats(w->eng, &st);
    int64_t now = rl_mono_ms();
    if (now - w->rate_t_ms >= 1000) {
        double r = (double)w->rate_tokens * 1000.0 / (double)(now - w->rate_t_ms);
        w->tok_rate = 0.5 * w->tok_rate + 0.5 * r;
        w->rate_tokens = 0;
        w->rate_t_ms = now;
    }
    pthread_mutex_lock(&w->m.mu);
    w->m.running = st.n_running;
    w->m.waiting = st.n_waiting;
    w->m.compiling = st.n_compiling;
    w->m.grammar_cache_bytes = (int64_t)st.grammar_cache_bytes;
    w->m.kv_blocks = st.kv_blocks;
    w->m.kv_used = st.kv_used;
    w->m.prefix_hit_tokens = st.prefix_hit_tokens;
    w->m.prefix_miss_tokens = st.prefix_miss_tokens;
    w->m.spec_drafted = st.spec_drafted;
    w->m.spec_accepted = st.spec_accepted;
    w->m.preemptions = st.n_preemptions;
    w->m.tokens_per_s = w->tok_rate;
    w->m.draining = draining;
    w->m.redis_up = rconn_connected(w->rc);
    w->m.redis_reconnects = rconn_n_reconnects(w->rc);
    pthread_mutex_unlock(&w->m.mu);
}

int w_run(struct worker *w, volatile sig_atomic_t *stop, volatile sig_atomic_t *reload,
          struct rl_err *err)
{
    bool draining = false;
    int64_t drain_until = 0;
    bool was_up = true;
    w->rate_t_ms = rl_mono_ms();
    ensure_groups(w);
    w_claim_own(w, err);
    w->next_claim_ms = 0;
    for (;;) {
        int64_t now = rl_wall_ms();
        if (*reload) {
            *reload = 0;
            apply_reload(w);
        }
        w_lorart_step(w); /* runtime adapters: loads, unloads (lorart.c) */
        if (w->relayout && !w->flush && !stand_out(w))
            w_relayout(w);
        if (*stop && !draining) {
            draining = true;
            drain_until = rl_mono_ms() + (int64_t)w->opt.drain_timeout_s * 1000;
            RL_LOG(&w->log, RL_LOG_INFO, "draining: %d jobs held, %d s at most", w->n_jobs,
                   w->opt.drain_timeout_s);
            sd_notify(0, "STOPPING=1");
        }
        if (draining) {
            /* a standing read may still bring jobs delivered to us: they
             * are run, not left pending, so it is waited for (its BLOCK) */
            if (w->n_jobs == 0 && !stand_out(w))
                break;
            if (rl_mono_ms() >= drain_until) {
                RL_LOG(&w->log, RL_LOG_WARN, "drain timeout: leaving %d jobs pending for "
                       "another worker to resume", w->n_jobs);
                break;
            }
        }
        ensure_groups(w);
        /* after memory pressure, jobs handed back go first: a claim
         * whenever there is room, and no new entry read until none is
         * left (resume.c w_reclaim_first) */
        if (!draining && (now >= w->next_claim_ms || w->reclaim_first)) {
            w_claim(w, err);
            w->next_claim_ms = now + w->opt.claim_interval_ms;
        }
        if (w->watchdog_usec && now >= w->next_wd_ms) {
            sd_notify(0, "WATCHDOG=1");
            w->next_wd_ms = now + (int64_t)(w->watchdog_usec / 2000);
        }
        int active = engine_n_active(w->eng);
        if (!draining) {
            int k = w->reclaim_first ? 0 : w_admissible(w);
            bool idle = active == 0 && !w_has_pending(w);
            aff_refresh(w, now, idle);
            int block = w->opt.read_block_ms;
            if (idle)
                w->t_step_ms = 0; /* a period ends with the work */
            /* a heartbeat due now (a changed filter) goes out first */
            if (w->affinity && w->next_hb_ms <= now)
                block = 1;
            int tick = tick_in(w, now); /* a done waiting for the clock */
            if (tick >= 0 && tick < block)
                block = tick;
            /* an idle worker must still ping the watchdog on time: a BLOCK
             * longer than the time to the next ping would let systemd kill it */
            if (w->watchdog_usec && w->next_wd_ms - now < block)
                block = w->next_wd_ms > now ? (int)(w->next_wd_ms - now) : 1; /* BLOCK 0 waits forever */
            standing_read(w, k, idle ? block : 0, false);
            active = engine_n_active(w->eng);
        } else if (stand_out(w)) {
            standing_read(w, 0, active ? 0 : 20, true);
            active = engine_n_active(w->eng);
        }
        /* the last step's events go out now, and the engine computes the
         * next step while Redis answers: the round trip is off the
         * critical path (issue 27). Its replies are applied before anything
         * else is sent, so the order rules hold: seq order per job, done
         * last, XACK only once done is stored (publish.c). */
        if (w->opt.coalesce_ms > 0 && w->opt.publish_overlap)
            w_hold_due(w, rl_wall_ms(), draining);
        int frc = w->opt.publish_overlap ? w_flush_start(w, err) : 0;
        if (active > 0) {
            const struct engine_event *evs;
            int n_ev = 0;
            /* the loop's period while busy (step + flush + reads), which
             * the heartbeat announces for the dispatcher's offer wait */
            if (w->t_step_ms)
                w->step_ms = 0.9 * w->step_ms + 0.1 * (double)(now - w->t_step_ms);
            w->t_step_ms = now;
            if (engine_step(w->eng, &evs, &n_ev, err)) {
                RL_LOG(&w->log, RL_LOG_ERROR, "engine: %s", err->msg);
                struct rl_err e2;
                w_flush_finish(w, &e2);
                return -err->code;
            }
            for (int i = 0; i < n_ev; i++)
                on_event(w, &evs[i]);
            w->aff_dirty = true; /* the KV cache may hold new blocks */
        }
        int frc2;
        if (w->opt.publish_overlap) {
            frc2 = w_flush_finish(w, err);
        } else { /* the serial loop: this step's events, and wait for Redis */
            if (w->opt.coalesce_ms > 0)
                w_hold_due(w, rl_wall_ms(), draining);
            frc2 = w_flush(w, err);
        }
        frc = frc ? frc : frc2;
        bool up = frc == 0 && rconn_connected(w->rc);
        if (up != was_up) {
            RL_LOG(&w->log, up ? RL_LOG_INFO : RL_LOG_WARN, "redis %s: %s", rconn_addr(w->rc),
                   up ? "connected" : err->msg);
            was_up = up;
        }
        update_metrics(w, draining);
        if (!up && engine_n_active(w->eng) == 0) {
            /* nothing to compute: wait for the reconnect instead of spinning */
            int64_t ms = rconn_retry_in_ms(w->rc);
            if (ms < 5)
                ms = 5;
            if (ms > 100)
                ms = 100;
            struct timespec ts = {0, (long)ms * 1000000L};
            nanosleep(&ts, NULL);
        } else if (draining && engine_n_active(w->eng) == 0 && w_has_pending(w)) {
            struct timespec ts = {0, 1000000L};
            nanosleep(&ts, NULL);
        } else if (w->redis_oom && engine_n_active(w->eng) == 0) {
            /* nothing to compute, nothing to admit: sleep to the next write
             * attempt (publish.c's back-off) instead of spinning */
            int64_t ms = w->oom_retry_ms - rl_mono_ms();
            if (ms < 1)
                ms = 1;
            if (ms > 100)
                ms = 100;
            struct timespec ts = {0, (long)ms * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    return 0;
}
