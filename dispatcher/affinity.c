/* dispatcher/affinity.c - prefix-affine pulling (issue 27): a job goes
 * first to the worker whose prefix cache holds the most of its prompt.
 *
 * Workers publish, in their heartbeat (<prefix>worker:<name>, "affinity":
 * {"block_size", "k", "filter", "offer"}), a Bloom filter of the chained
 * KV block hashes their cache holds (common/affinity.h) and their offer
 * streams, <pool key>:w:<name>, which they read besides (and before) the
 * pool streams, with the same consumer group. The dispatcher re-reads the
 * filters every affinity_refresh_ms while requests come in (ZRANGE
 * <prefix>workers, MGET of the heartbeats: one round trip each).
 *
 * Choosing (da_choose): the job is rendered and tokenized as the worker
 * will (engine/prompt.h, the dispatcher's --model tokenizer), its full
 * blocks chained through kv_hash_block from the tenant's salt, exactly as
 * the engine registers them; each live worker that reads the pool scores
 * the run of leading blocks its filter holds. The job is offered (XADDed
 * to the offer stream instead of the pool, in the same MULTI as its
 * intake XACK, so forwarding stays exactly-once) to the best scorer when
 * it holds more than some other candidate (a prefix every worker holds,
 * such as the shared system prompt, decides nothing) and its offers not
 * yet taken are no more than the pool's waiting jobs ("with room"). Ties
 * among the best go to the one with the fewest offers waiting.
 *
 * Falling back (da_sweep, move_lua): an offer not taken within
 * affinity_wait_ms is moved, in one script (so the worker's XREADGROUP
 * sees it in one place or the other, never both), to the pool stream,
 * where any worker takes it. The offer streams of a worker whose heartbeat
 * is gone are moved at once, and so is an offer its worker took and then
 * held without a lease renewal for claim_idle_ms (it died, or stalled):
 * the moved entry carries "moved": "pending" and its deliveries, so the
 * worker that takes it resumes it from its stream like an XAUTOCLAIM's,
 * and the job's holder record (own:<id>) is pointed at the new entry in
 * the same script, so the fencing (worker/fence.h) sees one job that
 * moved, not a duplicate, and the old holder, if alive, is fenced. Every
 * moved entry keeps the ID it was first queued under ("entry0"): the
 * worker derives its seed and queue time from it. Nothing is lost while
 * some dispatcher runs: every sweep is idempotent and any dispatcher may
 * run it.
 *
 * Off (cfg affinity = false, no --model, or a Redis Cluster, where the
 * holder record is in another slot than the queue): jobs go to the pools
 * as before; offers already made are still swept.
 *
 * Main thread only; counters in struct dmetrics under its mutex. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "affinity.h"
#include "base64.h"
#include "disp.h"
#include "registry.h"
#include "kv_cache.h"
#include "prompt.h"

#define DA_SWEEP_COUNT "256" /* entries a sweep moves at most per stream */
#define GROUP_WORKERS "workers"

/* KEYS[1] the offer stream, KEYS[2] its pool stream; ARGV[1] the group,
 * [2] the wait (ms) after which an undelivered offer moves, [3]
 * claim_idle_ms, [4] the most entries moved per kind, [5] the key prefix
 * (holder records <prefix>own:<id>). Returns {moved offers, moved
 * pending, ms when the oldest remaining offer is due (-1 none), offers
 * left, the entries left in the stream (0 also when it does not exist)}.
 * An empty offer stream is left in place (the dispatcher may not DEL). */
static const char move_lua[] =
    "local function ms(id) return tonumber(string.match(id, '^(%d+)')) end\n"
    "if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0, -1, 0, 0} end\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local ld, hasg = '0-0', false\n"
    "local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[1])\n"
    "if ok then\n"
    "  for _, g in ipairs(groups) do\n"
    "    local name, l\n"
    "    for i = 1, #g, 2 do\n"
    "      if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then l = g[i + 1] end\n"
    "    end\n"
    "    if name == ARGV[1] then ld, hasg = l, true end\n"
    "  end\n"
    "end\n"
    "local function field(f, k)\n"
    "  for i = 1, #f, 2 do if f[i] == k then return f[i + 1] end end\n"
    "end\n"
    "local function copy(id, f, kind, dlv)\n"
    "  local a = {}\n"
    "  for i = 1, #f, 2 do\n"
    "    if f[i] ~= 'entry0' and f[i] ~= 'moved' and f[i] ~= 'dlv' then\n"
    "      a[#a + 1] = f[i]; a[#a + 1] = f[i + 1]\n"
    "    end\n"
    "  end\n"
    "  a[#a + 1] = 'entry0'; a[#a + 1] = field(f, 'entry0') or id\n"
    "  a[#a + 1] = 'moved'; a[#a + 1] = kind\n"
    "  if dlv then a[#a + 1] = 'dlv'; a[#a + 1] = tostring(dlv) end\n"
    "  return redis.call('XADD', KEYS[2], '*', unpack(a))\n"
    "end\n"
    "local wait, n = tonumber(ARGV[2]), tonumber(ARGV[4])\n"
    "local moved, movedp, nxt, left = 0, 0, -1, 0\n"
    "for _, e in ipairs(redis.call('XRANGE', KEYS[1], '(' .. ld, '+', 'COUNT', n)) do\n"
    "  if nxt < 0 and now - ms(e[1]) >= wait then\n"
    "    copy(e[1], e[2], 'offer', nil)\n"
    "    redis.call('XDEL', KEYS[1], e[1])\n"
    "    moved = moved + 1\n"
    "  else\n"
    "    if nxt < 0 then nxt = ms(e[1]) + wait end\n"
    "    left = left + 1\n"
    "  end\n"
    "end\n"
    "if hasg then\n"
    "  for _, p in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', tonumber(ARGV[3]), '-', '+', n)) do\n"
    "    local e = redis.call('XRANGE', KEYS[1], p[1], p[1])\n"
    "    if e[1] then\n"
    "      local nid = copy(p[1], e[1][2], 'pending', p[4])\n"
    "      local okj, j = pcall(cjson.decode, field(e[1][2], 'job') or '')\n"
    "      if okj and type(j) == 'table' and type(j.id) == 'string' then\n"
    "        local own = ARGV[5] .. 'own:' .. j.id\n"
    "        if redis.call('HGET', own, 'entry') == p[1] then redis.call('HSET', own, 'entry', nid) end\n"
    "      end\n"
    "    end\n"
    "    redis.call('XACK', KEYS[1], ARGV[1], p[1])\n"
    "    redis.call('XDEL', KEYS[1], p[1])\n"
    "    movedp = movedp + 1\n"
    "  end\n"
    "end\n"
    "return {moved, movedp, nxt, left, redis.call('XLEN', KEYS[1])}\n";

static void offer_key(const struct disp *d, int p, const char *name, char *out, size_t size)
{
    snprintf(out, size, "%.250s:w:%.120s", d->pools[p].key, name);
}

static struct daff_worker *find_or_add(struct daff *a, const char *name)
{
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->w[i].name, name))
            return &a->w[i];
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 16;
        struct daff_worker *g = realloc(a->w, (size_t)cap * sizeof *g);
        if (!g)
            return NULL;
        a->w = g;
        a->cap = cap;
    }
    struct daff_worker *w = &a->w[a->n++];
    memset(w, 0, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", name);
    return w;
}

static bool has_offers(const struct disp *d, const struct daff_worker *w)
{
    for (int p = 0; p < d->n_pools; p++)
        if (w->offer[p][0])
            return true;
    return false;
}

/* One worker's heartbeat (NULL: gone). */
static void take_heartbeat(struct disp *d, struct daff_worker *w, const char *json,
                           int64_t *hit, int64_t *miss)
{
    cJSON *hb = json ? cJSON_Parse(json) : NULL;
    const cJSON *af = hb ? cJSON_GetObjectItemCaseSensitive(hb, "affinity") : NULL;
    bool was_live = w->live;
    w->live = hb != NULL;
    if (hb) {
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(hb, "prefix_hit_tokens");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(hb, "prefix_miss_tokens");
        if (cJSON_IsNumber(h) && cJSON_IsNumber(m)) {
            *hit += (int64_t)h->valuedouble;
            *miss += (int64_t)m->valuedouble;
        }
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(af, "filter");
    const cJSON *bs = cJSON_GetObjectItemCaseSensitive(af, "block_size");
    const cJSON *offer = cJSON_GetObjectItemCaseSensitive(af, "offer");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(af, "k");
    bool usable = cJSON_IsString(f) && cJSON_IsNumber(bs) && bs->valueint > 0 &&
                  cJSON_IsArray(offer) && cJSON_IsNumber(k) && k->valueint == AFF_K;
    size_t len = usable ? strlen(f->valuestring) : 0;
    size_t nb = len / 4 * 3;
    if (usable && (nb < AFF_MIN_BYTES || nb > AFF_MAX_BYTES + 2))
        usable = false;
    if (usable) {
        uint8_t *bits = w->bits && w->nbytes >= nb ? w->bits : realloc(w->bits, nb);
        long got = bits ? b64_decode(f->valuestring, len, bits, nb) : -1;
        if (bits)
            w->bits = bits;
        if (got < AFF_MIN_BYTES || aff_size((size_t)got) != (size_t)got) {
            usable = false;
        } else {
            w->nbytes = (size_t)got;
            w->block_size = bs->valueint;
            const cJSON *st = cJSON_GetObjectItemCaseSensitive(af, "step_ms");
            w->step_ms = cJSON_IsNumber(st) && st->valuedouble > 0 && st->valuedouble < 1e6
                             ? (int)st->valuedouble : 0;
        }
    }
    if (!usable) {
        free(w->bits);
        w->bits = NULL;
        w->nbytes = 0;
    }
    /* its offer streams: those it announces; a worker that went away keeps
     * the ones it had (they are swept until empty) plus every pool's, for
     * a worker we never saw alive */
    char key[sizeof w->offer[0]];
    for (int p = 0; p < d->n_pools; p++) {
        offer_key(d, p, w->name, key, sizeof key);
        bool listed = false;
        for (const cJSON *o = usable ? offer->child : NULL; o && !listed; o = o->next)
            listed = cJSON_IsString(o) && !strcmp(o->valuestring, key);
        if (listed || (!w->live && !w->dead_keys))
            snprintf(w->offer[p], sizeof w->offer[p], "%s", key);
        else if (w->live && !w->backlog[p])
            w->offer[p][0] = 0; /* no longer read there: nothing to sweep */
    }
    w->dead_keys = !w->live;
    if (w->live != was_live && !w->live) {
        for (int p = 0; p < d->n_pools; p++)
            if (w->offer[p][0])
                w->due_ms[p] = 1; /* sweep it now: no wait for a gone worker */
    }
    cJSON_Delete(hb);
}

void da_refresh(struct disp *d, bool all)
{
    struct daff *a = &d->aff;
    a->on = d->cfg.affinity && d->tok && !rconn_is_cluster(d->rc);
    int64_t now = rl_wall_ms();
    /* without offers of our own (no tokenizer, a cluster), only the
     * heartbeat's full refresh, for sweeping other dispatchers' offers */
    if (!all && (!a->on || now < a->next_refresh_ms))
        return;
    a->next_refresh_ms = now + d->cfg.affinity_refresh_ms;
    if (!d->cfg.affinity)
        return;
    struct rl_err err;
    struct rconn_reply *names = NULL, *hbs = NULL;
    if (reg_read_heartbeats(d->rc, d->cfg.prefix, D_MAX_WORKERS, &names, &hbs, &err))
        return;
    size_t nn = names->n_elem;
    for (int i = 0; i < a->n; i++)
        a->w[i].seen = false;
    int64_t hit = 0, miss = 0;
    for (size_t i = 0; i < nn; i++) {
        const char *name = names->elem[i].str;
        if (!name || !name[0] || strlen(name) >= RCONN_NAME_MAX)
            continue;
        struct daff_worker *w = find_or_add(a, name);
        if (!w)
            break;
        const struct rconn_reply *r = &hbs->elem[i];
        take_heartbeat(d, w, r->type == RCONN_STRING ? r->str : NULL, &hit, &miss);
        w->seen = true;
    }
    /* workers no longer named, with nothing left to sweep, are forgotten */
    for (int i = 0; i < a->n;) {
        struct daff_worker *w = &a->w[i];
        if (!w->seen && !has_offers(d, w)) {
            free(w->bits);
            a->w[i] = a->w[--a->n];
        } else {
            if (!w->seen)
                w->live = false;
            i++;
        }
    }
    pthread_mutex_lock(&d->m.mu);
    d->m.fleet_hit_tokens = hit;
    d->m.fleet_miss_tokens = miss;
    pthread_mutex_unlock(&d->m.mu);
    rconn_reply_free(names);
    rconn_reply_free(hbs);
}

static void sweep_one(struct disp *d, struct daff_worker *w, int p);

/* How long an offer to w waits: affinity_wait_ms, or two of its loop
 * periods when that is longer (it reads only between engine steps, and a
 * CPU worker's step can outlast 50 ms), never past DA_WAIT_CAP_MS. */
#define DA_WAIT_CAP_MS 1000
static int wait_of(const struct disp *d, const struct daff_worker *w)
{
    int t = 2 * w->step_ms;
    if (t > DA_WAIT_CAP_MS)
        t = DA_WAIT_CAP_MS;
    return t > d->cfg.affinity_wait_ms ? t : d->cfg.affinity_wait_ms;
}

static void count(struct disp *d, int64_t *field)
{
    pthread_mutex_lock(&d->m.mu);
    (*field)++;
    pthread_mutex_unlock(&d->m.mu);
}

const char *da_choose(struct disp *d, const struct job *j, enum job_mode mode, const char *tenant,
                      const char *lora, int pool)
{
    struct daff *a = &d->aff;
    if (!a->on || pool < 0 || pool >= d->n_pools)
        return NULL;
    int cand = 0;
    for (int i = 0; i < a->n; i++)
        cand += a->w[i].live && a->w[i].bits && a->w[i].offer[pool][0];
    if (cand < 1)
        return NULL;
    int32_t *ids = NULL;
    int n_ids = 0;
    enum ev_code code;
    struct rl_err err;
    if (prompt_render(j, mode, d->tok, &ids, &n_ids, &code, &err))
        return NULL; /* the worker will say what is wrong with it */
    /* the tenant's own prefix-cache domain (worker/ident.c) */
    uint64_t salt = 0;
    if (tenant && tenant[0]) {
        uint64_t h = 0xcbf29ce484222325ull;
        for (const char *s = tenant; *s; s++)
            h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
        salt = h | 1;
    }
    /* an adapter's blocks are its own (the engine hashes them from this
     * salt: engine_request.lora), so only a worker that ran the same
     * adapter on the prompt holds them */
    salt = kv_salt_lora(salt, lora);
    uint64_t *hashes = NULL;
    int nb = 0, hashed_bs = 0;
    int best = -1, bestn = 0, others = 0, n_idx = 0;
    int *score = malloc((size_t)cand * sizeof *score), *idx = malloc((size_t)cand * sizeof *idx);
    if (!score || !idx) {
        free(score);
        free(idx);
        free(ids);
        return NULL;
    }
    for (int i = 0; i < a->n && n_idx < cand; i++) {
        struct daff_worker *w = &a->w[i];
        if (!w->live || !w->bits || !w->offer[pool][0])
            continue;
        if (w->block_size != hashed_bs) { /* the engine's blocks, this worker's size */
            free(hashes);
            hashed_bs = w->block_size;
            nb = n_ids > 0 ? (n_ids - 1) / hashed_bs : 0; /* at most what a match may reuse */
            hashes = nb ? malloc((size_t)nb * sizeof *hashes) : NULL;
            if (nb && !hashes)
                break;
            uint64_t h = salt;
            for (int b = 0; b < nb; b++)
                hashes[b] = h = kv_hash_block(h, ids + (size_t)b * (size_t)hashed_bs, hashed_bs);
        }
        idx[n_idx] = i;
        score[n_idx++] = hashes ? aff_prefix_len(w->bits, w->nbytes, hashes, nb) : 0;
    }
    free(hashes);
    free(ids);
    for (int c = 0; c < n_idx; c++)
        if (score[c] > bestn)
            bestn = score[c];
    /* the best among those holding bestn: fewest offers waiting */
    for (int c = 0; c < n_idx; c++) {
        if (score[c] < bestn) {
            others++;
            continue;
        }
        if (best < 0 || a->w[idx[c]].backlog[pool] < a->w[best].backlog[pool])
            best = idx[c];
    }
    free(score);
    free(idx);
    if (bestn == 0 || others == 0) { /* no prefix, or one everybody holds */
        count(d, &d->m.aff_no_match);
        return NULL;
    }
    struct daff_worker *w = &a->w[best];
    if (w->backlog[pool] > d->pools[pool].waiting)
        sweep_one(d, w, pool); /* the estimate counts offers since taken: read it back */
    if (w->backlog[pool] > d->pools[pool].waiting) { /* its queue is deeper than the pool's */
        count(d, &d->m.aff_deep);
        return NULL;
    }
    w->backlog[pool]++;
    int64_t due = rl_wall_ms() + wait_of(d, w) + 1;
    if (!w->due_ms[pool] || w->due_ms[pool] > due)
        w->due_ms[pool] = due;
    count(d, &d->m.aff_offers);
    return w->offer[pool];
}

void da_unoffer(struct disp *d, const char *key)
{
    struct daff *a = &d->aff;
    for (int i = 0; i < a->n; i++)
        for (int p = 0; p < d->n_pools; p++)
            if (!strcmp(a->w[i].offer[p], key)) {
                if (a->w[i].backlog[p] > 0)
                    a->w[i].backlog[p]--;
                pthread_mutex_lock(&d->m.mu);
                d->m.aff_offers--;
                pthread_mutex_unlock(&d->m.mu);
                return;
            }
}

static void sweep_one(struct disp *d, struct daff_worker *w, int p)
{
    char wait[24], idle[24];
    snprintf(wait, sizeof wait, "%d", w->live ? wait_of(d, w) : 0);
    snprintf(idle, sizeof idle, "%d", d->cfg.claim_idle_ms);
    const char *argv[10] = {"EVAL", move_lua, "2", w->offer[p], d->pools[p].key, GROUP_WORKERS,
                            wait, idle, DA_SWEEP_COUNT, d->cfg.prefix};
    struct rconn_reply *r = NULL;
    struct rl_err err;
    if (rconn_command(d->rc, 10, argv, NULL, &r, &err) || !r || r->type != RCONN_ARRAY ||
        r->n_elem != 5) {
        RL_LOG(&d->log, RL_LOG_WARN, "affinity: sweeping %s: %s", w->offer[p],
               r && r->type == RCONN_ERROR ? r->str : err.msg);
        rconn_reply_free(r);
        w->due_ms[p] = rl_wall_ms() + 100; /* tried again soon */
        return;
    }
    long long moved = r->elem[0].integer, movedp = r->elem[1].integer, nxt = r->elem[2].integer;
    long long left = r->elem[3].integer, xlen = r->elem[4].integer;
    rconn_reply_free(r);
    if (moved || movedp) {
        RL_LOG(&d->log, movedp ? RL_LOG_WARN : RL_LOG_DEBUG,
               "affinity: %lld offers not taken in time and %lld held by a worker that stopped "
               "renewing them moved from %s to %s", moved, movedp, w->offer[p], d->pools[p].key);
        pthread_mutex_lock(&d->m.mu);
        d->m.aff_fallbacks += moved;
        d->m.aff_takeovers += movedp;
        pthread_mutex_unlock(&d->m.mu);
    }
    w->backlog[p] = left;
    w->due_ms[p] = nxt > 0 ? nxt + 1 : 0;
    if (!xlen && !w->live)
        w->offer[p][0] = 0; /* gone and empty: nothing more to sweep */
}

void da_sweep(struct disp *d)
{
    struct daff *a = &d->aff;
    int64_t now = rl_wall_ms();
    bool full = now >= a->next_full_ms;
    if (full)
        a->next_full_ms = now + d->cfg.heartbeat_interval_ms;
    if (!d->cfg.affinity || rconn_is_cluster(d->rc))
        return;
    for (int i = 0; i < a->n; i++)
        for (int p = 0; p < d->n_pools; p++) {
            struct daff_worker *w = &a->w[i];
            if (!w->offer[p][0])
                continue;
            if (full || (w->due_ms[p] && now >= w->due_ms[p]))
                sweep_one(d, w, p);
        }
}

int64_t da_next_due_ms(struct disp *d)
{
    struct daff *a = &d->aff;
    int64_t now = rl_wall_ms(), best = -1;
    for (int i = 0; i < a->n; i++)
        for (int p = 0; p < d->n_pools; p++)
            if (a->w[i].offer[p][0] && a->w[i].due_ms[p]) {
                int64_t in = a->w[i].due_ms[p] - now;
                if (in < 0)
                    in = 0;
                if (best < 0 || in < best)
                    best = in;
            }
    return best;
}

void da_free(struct disp *d)
{
    for (int i = 0; i < d->aff.n; i++)
        free(d->aff.w[i].bits);
    free(d->aff.w);
    memset(&d->aff, 0, sizeof d->aff);
}
