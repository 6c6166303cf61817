/* worker/fence.c - the fencing scripts (fence.h) and how they are sent. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fence.h"
#include "qack.h"
#include "xmux.h"

/* KEYS[1] own, KEYS[2] out; ARGV[1] holder, ARGV[2] pool entry, ARGV[3]
 * "1" for a fresh delivery, ARGV[4] its delivery count, ARGV[5] the
 * request (the entry ID its client's XADD returned), ARGV[6] the job's
 * SHA-256 (job_sha256). First the job's identity (schemas/README.md, "Job
 * identity"): the record names the request that owns the id; another
 * request with the same job text returns -2 (a duplicate: the stream
 * already answers it), with another text -3 (ID_CONFLICT), and so does a
 * stream no record covers (written by an older version: not ours to
 * write); the same request on another pool entry (forwarded twice) is a
 * duplicate too. Then the holder: -1 when a fresh delivery finds its
 * entry held by another worker, else the stalls: deliveries in a row that
 * published nothing (the stream did not grow since the last take), which
 * max_deliveries bounds. An entry never taken before counts every earlier
 * delivery as a stall. */
static const char take_lua[] =
    "local h = redis.call('HMGET', KEYS[1], 'holder', 'entry', 'xlen', 'stalls', 'd', 'req',\n"
    "                     'sha')\n"
    "if h[2] then\n"
    "  local other\n"
    "  if h[6] then other = h[6] ~= ARGV[5] or h[7] ~= ARGV[6]\n"
    "  else other = h[2] ~= ARGV[2] end\n"
    "  if other then\n"
    "    if h[7] == ARGV[6] then return -2 end\n"
    "    return -3\n"
    "  end\n"
    "  if h[2] ~= ARGV[2] then return -2 end\n"
    "elseif redis.call('EXISTS', KEYS[2]) == 1 then\n"
    "  return -3\n"
    "end\n"
    "local same = h[2] == ARGV[2]\n"
    "if ARGV[3] == '1' and same and h[1] ~= ARGV[1] then return -1 end\n"
    "local n = redis.call('XLEN', KEYS[2])\n"
    "local d = tonumber(ARGV[4])\n"
    "local stalls = d - 1\n"
    "if same then\n"
    "  if n > tonumber(h[3]) then stalls = 0\n"
    "  else stalls = tonumber(h[4]) + d - tonumber(h[5]) end\n"
    "end\n"
    "if stalls < 0 then stalls = 0 end\n"
    "redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'entry', ARGV[2], 'xlen', n,\n"
    "           'stalls', stalls, 'd', d, 'req', ARGV[5], 'sha', ARGV[6])\n"
    "return stalls\n";

/* Several jobs in one call, because the Lua entry costs Redis more than
 * the XADD itself (BENCHMARKS.md): KEYS per job are out, own, then c check
 * keys (c = 0, 1: cancel:<id>, 2: cancel:<id> and lease:<id>, all in the
 * job's hash-tag slot), and last the bell when ARGV[2] is "1" (when the
 * ACL lets us: common/xmux.h; on a cluster the bell of the jobs' slot,
 * common/rcluster.h rcl_bell_key): once the events are written
 * it gets one entry naming every stream written, in the same script, so a
 * shared reader blocked on the bell never misses them (a refused ring is
 * ignored: the reader's sweep finds them). ARGV[1] the holder, ARGV[2] the
 * bell flag, then per job: the TTL to set
 * on both keys after done ("0": not yet), the pub/sub channel ("" for
 * none), its pool entry, the number of events n, c, and n (entry ID, event
 * JSON) pairs. The record must name both the holder and the entry: two
 * jobs of one worker under one id (the second refused by FENCE_TAKE, its
 * events not yet dropped) never both write. Per job, one reply element:
 * the number of its events now in the stream (all of them; a resend after
 * a lost reply counts as written), FENCED when the caller is not its
 * holder, or "XADD <k>: <error>" when its event k failed (the k before it
 * are written, none after it is tried: no gap); then c more: the cancel
 * key's value (nil when absent or unreadable) and the lease key's EXISTS
 * (nil when unreadable). The checks ride here so that a job that emits
 * costs no separate GET/EXISTS command (issue 27, publish.c). On a
 * cluster a call carries the jobs of one slot, as a script's keys must
 * share it (publish.c, queue_emits). */
static const char emit_lua[] =
    "local res, a, j, rung = {}, 3, 1, {}\n"
    "local nk = #KEYS - tonumber(ARGV[2])\n"
    "while j <= nk do\n"
    "  local ttl, chan, entry, n = ARGV[a], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3])\n"
    "  local c = tonumber(ARGV[a + 4])\n"
    "  a = a + 5\n"
    "  local h = redis.call('HMGET', KEYS[j + 1], 'holder', 'entry')\n"
    "  if h[1] ~= ARGV[1] or h[2] ~= entry then\n"
    "    res[#res + 1] = redis.error_reply('FENCED another worker holds this job')\n"
    "  else\n"
    "    local k, bad = 0, nil\n"
    "    while k < n and not bad do\n"
    "      local ev = ARGV[a + 2 * k + 1]\n"
    "      local r = redis.pcall('XADD', KEYS[j], ARGV[a + 2 * k], 'event', ev)\n"
    "      if type(r) == 'table' and r.err then\n"
    "        if not string.find(r.err, 'equal or smaller', 1, true) then bad = r.err end\n"
    "      elseif chan ~= '' then\n"
    "        redis.call('PUBLISH', chan, ev)\n"
    "      end\n"
    "      if not bad then k = k + 1 end\n"
    "    end\n"
    "    if bad then\n"
    "      res[#res + 1] = redis.error_reply('XADD ' .. k .. ': ' .. bad)\n"
    "    else\n"
    "      if ttl ~= '0' then\n"
    "        redis.call('EXPIRE', KEYS[j], ttl)\n"
    "        redis.call('EXPIRE', KEYS[j + 1], ttl)\n"
    "      end\n"
    "      res[#res + 1] = k\n"
    "      if k > 0 then rung[#rung + 1] = KEYS[j]; rung[#rung + 1] = k end\n"
    "    end\n"
    "  end\n"
    "  for q = 1, c do\n"
    "    local r = redis.pcall(q == 1 and 'GET' or 'EXISTS', KEYS[j + 1 + q])\n"
    "    if type(r) == 'table' then r = false end\n"
    "    res[#res + 1] = r\n"
    "  end\n"
    "  j = j + 2 + c\n"
    "  a = a + 2 * n\n"
    "end\n"
    "if nk < #KEYS and #rung > 0 then\n"
    "  redis.pcall('XADD', KEYS[#KEYS], 'MAXLEN', '~', '" XMUX_BELL_MAXLEN "', '*', unpack(rung))\n"
    "end\n"
    "return res\n";

/* KEYS the pools; ARGV[1] group, ARGV[2] consumer, then per pool the
 * number of its entries n and n entry IDs. Renews the ones the consumer
 * owns; returns, per pool, an array of the others (taken over, or no
 * longer pending). Every pool in one call on a single instance (issue 27:
 * a script call costs more than its commands), one per call on a cluster. */
static const char lease_lua[] =
    "local res, a = {}, 3\n"
    "for k = 1, #KEYS do\n"
    "  local n, lost = tonumber(ARGV[a]), {}\n"
    "  for i = a + 1, a + n do\n"
    "    local p = redis.call('XPENDING', KEYS[k], ARGV[1], ARGV[i], ARGV[i], 1)\n"
    "    if p[1] and p[1][2] == ARGV[2] then\n"
    "      redis.call('XCLAIM', KEYS[k], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')\n"
    "    else\n"
    "      lost[#lost + 1] = ARGV[i]\n"
    "    end\n"
    "  end\n"
    "  a = a + 1 + n\n"
    "  res[k] = lost\n"
    "end\n"
    "return res\n";

/* KEYS[1] pool; ARGV[1] group, ARGV[2] consumer, ARGV[3] entry, ARGV[4]
 * idle ms. A job given up (publish.c: Redis would not store its events):
 * if the consumer still owns the entry, it is made idle for ARGV[4] ms
 * (claimable at once) and its delivery count is put back by one, so the
 * delivery that follows is not taken for a worker that died without
 * publishing (max_deliveries, FENCE_TAKE's stalls). XPENDING and XCLAIM
 * are not refused under maxmemory. Returns 1, or 0 when it is not ours. */
static const char release_lua[] =
    "local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)\n"
    "if not (p[1] and p[1][2] == ARGV[2]) then return 0 end\n"
    "local d = tonumber(p[1][4]) - 1\n"
    "if d < 0 then d = 0 end\n"
    "redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[4],\n"
    "           'RETRYCOUNT', d, 'JUSTID')\n"
    "return 1\n";

static const char *const bodies[FENCE_N_SCRIPTS] = {take_lua, emit_lua, lease_lua, release_lua,
                                                     qack_lua};

int fence_load(struct fence *f, struct rconn *c, struct rl_err *err)
{
    if (f->sha[FENCE_N_SCRIPTS - 1][0] || f->tried_on == rconn_n_reconnects(c) + 1)
        return 0;
    f->tried_on = rconn_n_reconnects(c) + 1;
    for (int s = 0; s < FENCE_N_SCRIPTS; s++) {
        if (f->sha[s][0])
            continue;
        const char *argv[3] = {"SCRIPT", "LOAD", bodies[s]};
        char sha[41] = "";
        /* every master of a cluster: a script that one lacks would answer
         * NOSCRIPT there until a flush sends its body to that very node */
        for (int m = 0; m < rconn_n_masters(c); m++) {
            struct rconn_reply *r = NULL;
            int rc = rconn_command_on(c, m, 3, argv, NULL, &r, err);
            if (!rc && r && r->type == RCONN_STRING && r->len == 40)
                memcpy(sha, r->str, 41);
            else if (!rc)
                rc = rl_errf(err, RL_EINVAL, "SCRIPT LOAD: unexpected reply");
            rconn_reply_free(r);
            if (rc)
                return rc;
        }
        memcpy(f->sha[s], sha, sizeof sha);
    }
    f->tried_on = 0;
    return 0;
}

void fence_begin(struct fence *f)
{
    memcpy(f->eval_now, f->eval_next, sizeof f->eval_now);
}

int fence_cmd(struct fence *f, enum fence_script s, int n_keys, const char **argv,
              char *nbuf)
{
    snprintf(nbuf, 12, "%d", n_keys);
    if (f->eval_now[s]) /* this flush sends the body: every call of s in it */
        f->eval_next[s] = false;
    bool eval = f->eval_now[s] || !f->sha[s][0];
    argv[0] = eval ? "EVAL" : "EVALSHA";
    argv[1] = eval ? bodies[s] : f->sha[s];
    argv[2] = nbuf;
    return 3;
}

int fence_take_cmd(struct fence *f, const char **argv, struct fence_take_buf *b,
                   const char *own_key, const char *out_key, const char *holder,
                   const char *entry, bool fresh, int64_t deliveries, const char *req,
                   const char *sha)
{
    int a = fence_cmd(f, FENCE_TAKE, 2, argv, b->nk);
    snprintf(b->d, sizeof b->d, "%lld", (long long)(deliveries > 0 ? deliveries : 1));
    argv[a++] = own_key;
    argv[a++] = out_key;
    argv[a++] = holder;
    argv[a++] = entry;
    argv[a++] = fresh ? "1" : "0";
    argv[a++] = b->d;
    argv[a++] = req;
    argv[a++] = sha;
    return a;
}

int fence_release_cmd(struct fence *f, const char **argv, struct fence_release_buf *b,
                      const char *pool_key, const char *group, const char *consumer,
                      const char *entry, int idle_ms)
{
    int a = fence_cmd(f, FENCE_RELEASE, 1, argv, b->nk);
    snprintf(b->idle, sizeof b->idle, "%d", idle_ms);
    argv[a++] = pool_key;
    argv[a++] = group;
    argv[a++] = consumer;
    argv[a++] = entry;
    argv[a++] = b->idle;
    return a;
}

bool fence_noscript(struct fence *f, enum fence_script s, const struct rconn_reply *r)
{
    if (r && r->type == RCONN_ERROR && !strncmp(r->str, "NOSCRIPT", 8)) {
        f->eval_next[s] = true;
        return true;
    }
    return false;
}

bool fence_is_fenced(const struct rconn_reply *r)
{
    return r && r->type == RCONN_ERROR && strstr(r->str, "FENCED") != NULL;
}

void fence_holder(char *out, const char *worker_name, long long start_ms)
{
    snprintf(out, FENCE_HOLDER_MAX, "%.128s/%ld/%lld", worker_name, (long)getpid(), start_ms);
}
