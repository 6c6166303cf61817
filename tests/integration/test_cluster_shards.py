"""Pool shards on a Redis Cluster (issue 27 point 4): a real local 3-master +
3-replica cluster (the redis_cluster fixture), real workers and dispatchers.

On a cluster each pool stream is split over pool_shards hash tags (default
3): {<prefix>}jobs:<pool> (shard 0) and {<prefix><s>.<n>}jobs:<pool>, the
dispatcher forwarding each request into the shard that follows its slot
(rcl_shard_for_slot: for a request slot, the shard on that master) with a
script that leaves a marker there, then acknowledging the request. This
test shows, on real processes:

  - the shard names the C code uses are the ones an independent Python
    implementation of the rule gives, and they sit 1 per master;
  - jobs through the dispatcher land in every shard, on every master;
  - a dispatcher SIGKILLed after its forwards and before its XACKs (made
    certain with an ACL that refuses the XACK's script on the intake stream
    until the kill) is restarted under its name: it forwards every pending
    request again, the markers refuse every duplicate (its log says so per
    request), and each job is in the shards exactly once;
  - a worker SIGKILLed mid-generation: the other one takes its shard
    entries over and resumes them;
  - every job done, token-exact against `redlm run`, seqs gapless, nothing
    pending in any shard;
  - an idle worker does not poll, and wakes at once for a job in any shard
    (test_idle_worker_wakes_on_any_shard); nor does a busy one: a standing
    read per shard (test_busy_worker_keeps_a_standing_read_per_shard);
  - a request's job lands in its slot's shard, and a busy worker prefers
    its home shard but takes a job waiting where the workers are full
    (test_jobs_go_to_their_masters_shard_and_workers_prefer_home).

Run with Debian's interpreter: /usr/bin/python3 -m pytest tests/integration
"""
import json
import signal
import time

from redis.crc import key_slot

from conftest import (check_stream, greedy_jobs, pool_shards, read_heartbeat, reference,
                      stream_events, wait_for)
from test_cluster_slots import id_in_slot, request_slots
from test_redis_budget import Monitor, checks_rode_with_reads

FAST_CLAIM = ["--claim-idle-ms", "1000", "--claim-interval-ms", "200", "--lease-renew-ms", "200"]
K = 3  # pool_shards' default
STEAL_MS = 1000  # long enough that a look taking a young job is seen doing it


def shards(prefix, pool="fast"):
    return pool_shards(prefix, pool, K)


def out_key(prefix, jid):
    return f"{prefix}out:{{{jid}}}"


def entries_by_job(rc, keys):
    """{job id: [shard index, ...]} over every entry of the shard streams."""
    seen = {}
    for i, k in enumerate(keys):
        for _, f in rc.xrange(k):
            seen.setdefault(json.loads(f["job"])["id"], []).append(i)
    return seen


def acl_all_nodes(cluster, *rules):
    for p in cluster.running():
        cluster.node(p).execute_command("ACL", "SETUSER", "dsp", *rules)


def test_shards_spread_exactly_once_and_kills(redis_cluster, workers, dispatchers, prefix,
                                              tmp_path, event_validator):
    rc = redis_cluster.client()
    keys = shards(prefix)
    # one shard per master: the slot ranges redis-cli --cluster create makes
    masters = [redis_cluster.master_of(k) for k in keys]
    assert len(set(masters)) == 3, masters

    # the dispatcher may run EVAL on the shards and markers, not on the
    # intake stream: its XACK (common/qack.c's script) is refused
    pw = tmp_path / "dsp.pw"
    pw.write_text("dsp-secret\n")
    acl_all_nodes(redis_cluster, "reset", "on", ">dsp-secret", "+@all", "-eval", "~*", "&*",
                  f"(+eval ~{{{prefix}}}jobs:* ~{{{prefix}}}fwd:* ~{{{prefix}?*}}*)")
    login = ["--redis-user", "dsp", "--redis-password-file", str(pw), "--redis-io-timeout-ms",
             "2000"]
    d1 = dispatchers("d1", "--think-ratio", "0", *login, addr=redis_cluster.seeds)
    for k in keys:  # the dispatcher made every shard and its workers group
        assert rc.exists(k), k

    jobs = greedy_jobs(60, seed=27, tag="s")
    for j in jobs:
        rc.xadd(f"{{{prefix}}}requests", {"job": json.dumps(j)})
    # every job forwarded (once) while every XACK is refused: the requests
    # stay pending on d1
    wait_for(lambda: len(entries_by_job(rc, keys)) == len(jobs), "jobs forwarded", timeout=60)
    wait_for(lambda: "transaction failed" in d1.text(), "XACKs refused", timeout=60)
    d1.kill(signal.SIGKILL)
    d1.wait()
    pend = rc.xpending(f"{{{prefix}}}requests", "dispatchers")
    assert pend["pending"] == len(jobs), pend
    seen = entries_by_job(rc, keys)
    assert all(len(v) == 1 for v in seen.values()), seen
    # spread: every shard, every master holds jobs
    used = {i for v in seen.values() for i in v}
    assert used == set(range(K)), used

    # the same dispatcher again, allowed its XACKs: it re-forwards its
    # pending requests; the markers refuse every one
    acl_all_nodes(redis_cluster, "+eval")
    d1b = dispatchers("d1", "--think-ratio", "0", *login, addr=redis_cluster.seeds)
    wait_for(lambda: rc.xpending(f"{{{prefix}}}requests", "dispatchers")["pending"] == 0,
             "requests acknowledged", timeout=60)
    assert d1b.text().count("already forwarded") >= len(jobs)
    seen = entries_by_job(rc, keys)
    assert sorted(seen) == sorted(j["id"] for j in jobs)
    assert all(len(v) == 1 for v in seen.values()), "a request was forwarded twice"

    # workers: w1 takes long jobs and is SIGKILLed mid-generation; w2
    # reclaims its entries from the shards and resumes them
    w1 = workers("wa", *FAST_CLAIM, "--max-batch", "8", addr=redis_cluster.seeds)
    long = greedy_jobs(10, seed=28, max_tokens=(150, 200), tag="L")
    for j in long:
        rc.xadd(f"{{{prefix}}}requests", {"job": json.dumps(j)})

    def mid():
        held = sum(rc.xpending_range(k, "workers", "-", "+", 100, consumername="wa") != []
                   for k in keys)
        started = sum(rc.xlen(out_key(prefix, j["id"])) >= 3 for j in long)
        return held > 0 and started >= 2
    wait_for(mid, "wa mid-generation", timeout=120)
    w1.kill(signal.SIGKILL)
    w1.wait()
    unfinished = [j["id"] for j in long
                  if not rc.xrevrange(out_key(prefix, j["id"]), count=1)
                  or json.loads(rc.xrevrange(out_key(prefix, j["id"]), count=1)[0][1]["event"])
                  ["type"] != "done"]
    assert unfinished, "the kill came too late to test resumption"
    w2 = workers("wb", *FAST_CLAIM, addr=redis_cluster.seeds)

    every = jobs + long
    ref = reference(every, tmp_path)
    for j, want in zip(every, ref):
        evs = stream_events(rc, out_key(prefix, j["id"]), 180)
        seqs = [e["seq"] for _, e in evs]
        assert seqs == list(range(len(evs))), f"{j['id']}: gaps or duplicates {seqs}"
        toks, _ = check_stream(evs, event_validator)
        assert toks == want, j["id"]
    assert "reclaimed entry" in w2.text()
    # nothing left pending in any shard
    for k in keys:
        wait_for(lambda k=k: rc.xinfo_groups(k) and all(
                     g["pending"] == 0 for g in rc.xinfo_groups(k) if g["name"] == "workers"),
                 f"{k} acknowledged", timeout=60)


def xreadgroup_calls(cluster):
    """XREADGROUP calls so far, summed over the masters (INFO commandstats)."""
    n = 0
    for p, role in cluster.roles().items():
        if role == "master":
            st = cluster.node(p).info("commandstats").get("cmdstat_xreadgroup", {})
            n += int(st.get("calls", 0))
    return n


def wait_groups(rc, keys):
    """Until every shard's pool stream has the workers' group (a worker
    creates them at start)."""
    wait_for(lambda: all(rc.exists(k) and any(g["name"] == "workers" for g in rc.xinfo_groups(k))
                         for k in keys), "the worker's groups", timeout=60)


def cancel_all(rc, prefix, ids, event_validator, ends=("cancelled",)):
    """Cancels every job of ids, then checks that each stream is whole and
    ended one of ends."""
    for jid in ids:
        rc.set(f"{prefix}cancel:{{{jid}}}", "1", ex=600)
    for jid in ids:
        _, done = check_stream(stream_events(rc, out_key(prefix, jid), 60), event_validator)
        assert done["finish_reason"] in ends, (jid, done)


def test_idle_worker_wakes_on_any_shard(redis_cluster, workers, dispatchers, prefix, tmp_path,
                                        event_validator):
    """An idle worker BLOCKs on every shard at once: it does not poll (few
    XREADGROUPs while idle, with BLOCK 8 s), and a job XADDed straight to any
    shard (shard 0 being the unsharded pool key clients write) is taken at
    once, not after another shard's BLOCK runs out."""
    rc = redis_cluster.client()
    keys = shards(prefix)
    w = workers("wi", "--block-ms", "8000", addr=redis_cluster.seeds)
    wait_groups(rc, keys)
    jobs = greedy_jobs(2 * K, seed=29, tag="i")
    ref = reference(jobs, tmp_path)
    before = xreadgroup_calls(redis_cluster)
    t0 = time.time()
    time.sleep(2)  # a measured idle period, not a moment picked
    calls = xreadgroup_calls(redis_cluster) - before
    # one BLOCKing read per shard's slot may end and be made again in 2 s,
    # and the polls after it: a worker polling would make hundreds
    assert calls <= 4 * K, f"{calls} XREADGROUPs in {time.time() - t0:.1f} s idle"
    for i, j in enumerate(jobs):
        k = keys[i % K]
        t = time.time()
        rc.xadd(k, {"job": json.dumps(j)})
        wait_for(lambda: rc.exists(out_key(prefix, j["id"])), f"{j['id']} started", timeout=30)
        took = time.time() - t
        assert took < 3.0, f"{j['id']} on shard {i % K}: first event after {took:.1f} s"
        toks, _ = check_stream(stream_events(rc, out_key(prefix, j["id"]), 60), event_validator)
        assert toks == ref[i], j["id"]
    assert "ready:" in w.text()
    # a dispatcher configured with other shards than the workers says so
    d = dispatchers("dm", "--pool-shards", "2", addr=redis_cluster.seeds)
    wait_for(lambda: f"reads {K} shards per pool, this dispatcher writes to 2" in d.text(),
             "the pool_shards mismatch logged", timeout=60)


def test_busy_worker_keeps_a_standing_read_per_shard(redis_cluster, workers, prefix, tmp_path,
                                                     event_validator):
    """A busy worker with room does not poll every step on a cluster either:
    it keeps one XREADGROUP ... BLOCK waiting per shard, each naming that
    shard's streams (one slot) on a connection of its own, sent again when
    it comes back (a job, or its BLOCK of 500 ms run out). Counted over a
    measured 2 s while a long job runs: polling a step would make hundreds.
    A job sent to any shard is still taken at once while the first runs.
    foreign_room_pct 0: every shard read alike (no home shard), the mode
    whose reads this counts; a busy worker's looks at shards not its home
    are test_jobs_go_to_their_masters_shard_and_workers_prefer_home's."""
    rc = redis_cluster.client()
    keys = shards(prefix)
    w = workers("wb", "--block-ms", "500", "--max-batch", "4", "--foreign-room-pct", "0",
                addr=redis_cluster.seeds)
    wait_groups(rc, keys)
    long = {"id": "busy-long", "prompt_ids": [3, 1, 4], "max_tokens": 40000, "temperature": 0,
            "ignore_eos": True}
    rc.xadd(keys[0], {"job": json.dumps(long)})
    wait_for(lambda: rc.xlen(out_key(prefix, long["id"])) >= 20, "the long job streaming",
             timeout=60)
    before, n0 = xreadgroup_calls(redis_cluster), rc.xlen(out_key(prefix, long["id"]))
    time.sleep(2)  # a measured busy period, not a moment picked
    calls = xreadgroup_calls(redis_cluster) - before
    steps = rc.xlen(out_key(prefix, long["id"])) - n0
    assert steps >= 20, f"only {steps} events in 2 s: the worker was not stepping"
    # each shard's read: one per BLOCK of 500 ms (5 in 2 s) and a few more
    assert calls <= K * 6 and calls < steps / 2, f"{calls} XREADGROUPs in {steps} steps"
    jobs = greedy_jobs(K, seed=31, tag="b")
    ref = reference(jobs, tmp_path)
    for i, j in enumerate(jobs):
        t = time.time()
        rc.xadd(keys[i], {"job": json.dumps(j)})
        wait_for(lambda: rc.exists(out_key(prefix, j["id"])), f"{j['id']} started", timeout=30)
        assert time.time() - t < 3.0, f"{j['id']} on shard {i} waited"
        toks, _ = check_stream(stream_events(rc, out_key(prefix, j["id"]), 60), event_validator)
        assert toks == ref[i], j["id"]
    cancel_all(rc, prefix, [long["id"]], event_validator)
    assert "ready:" in w.text()


def test_leases_renewed_on_every_shard(redis_cluster, workers, prefix, tmp_path, event_validator):
    """A worker renews the lease of a long job on every shard, whichever
    master holds it: the scripts are loaded on every master (and sent whole
    to a master that answers NOSCRIPT, in the next flush that calls them).
    Before, the lease script was loaded on one node only and every renewal
    elsewhere answered NOSCRIPT: jobs there went idle, were reclaimed each
    claim_idle_ms and hopped from worker to worker (seen in the fleet soak
    as hundreds of reclaims in a calm run). Watched while three long jobs,
    one per shard, run for more than twice claim_idle_ms: each stays
    delivered once, its idle time below claim_idle_ms (3 s: renewals every
    200 ms leave a loaded machine room)."""
    rc = redis_cluster.client()
    keys = shards(prefix)
    w = workers("wr", "--claim-idle-ms", "3000", "--claim-interval-ms", "200",
                "--lease-renew-ms", "200", addr=redis_cluster.seeds)
    wait_groups(rc, keys)
    jobs = [{"id": f"lease-{i}", "prompt_ids": [3, 1, 4 + i], "max_tokens": 40000,
             "temperature": 0, "ignore_eos": True} for i in range(K)]
    for j, k in zip(jobs, keys):
        rc.xadd(k, {"job": json.dumps(j)})
    first, seen = None, 0
    while True:  # every observation checked; the watch ends on what Redis shows
        pend = {k: rc.xpending_range(k, "workers", "-", "+", 10) for k in keys}
        running = [p for ps in pend.values() for p in ps]
        if len(running) == K:
            now = time.time()
            first = first or now
            seen += 1
            for p in running:
                assert p["times_delivered"] == 1, (p, pend)
                assert p["time_since_delivered"] < 3000, (p, pend)
            if now - first > 6.5:  # more than twice claim_idle_ms watched
                break
        assert first is None or len(running) == K, f"a job left its shard early: {pend}"
        assert time.time() - (first or time.time()) < 60
        time.sleep(0.05)
    assert seen >= 10
    for j in jobs:
        rc.set(f"{prefix}cancel:{{{j['id']}}}", "1", ex=600)
    for j in jobs:
        evs = stream_events(rc, out_key(prefix, j["id"]), 60)
        _, done = check_stream(evs, event_validator)
        assert done["finish_reason"] == "cancelled", done
    assert "reclaimed" not in w.text() and "another worker holds" not in w.text()


def shard_for_slot(slot0, slot, k=K):
    """rcl_shard_for_slot written again from its contract: the shard whose
    slot comes first at or after the request's slot, going round."""
    return min(range(k), key=lambda s: ((slot0 + (s * 16384 + k // 2) // k) - slot) % 16384)


def holder(rc, prefix, jid):
    """The worker name in a job's holder record ("<name>/<pid>/<start>")."""
    h = rc.hget(f"{prefix}own:{{{jid}}}", "holder")
    return h.split("/")[0] if h else None


def heartbeat(rc, prefix, name):
    return read_heartbeat(rc, prefix, "worker", name) or {}


def test_jobs_go_to_their_masters_shard_and_workers_prefer_home(
        redis_cluster, workers, dispatchers, prefix, tmp_path, event_validator):
    """Home shards (issue 27 point 4): the dispatcher forwards a request into
    the shard that follows its slot (the rule written again here), which
    for a request slot (a master's lowest, where clients put their ids) is
    on that master; a busy worker takes its home shard's jobs as they come
    and leaves the others' to their own busy workers, but takes a job that
    waits in another shard whose workers are full (looked for every
    steal_ms), so no job waits while a worker has room."""
    rc = redis_cluster.client()
    keys = shards(prefix)
    slot0 = key_slot(keys[0].encode())
    slots = request_slots(redis_cluster)

    # forwarding: ids anywhere follow the rule; ids on a request slot land
    # on that slot's master
    d = dispatchers("dh", "--think-ratio", "0", addr=redis_cluster.seeds)
    jobs = greedy_jobs(30, seed=37, tag="f")
    for port, s in slots.items():
        for i in range(3):
            jobs.append(dict(greedy_jobs(1, seed=38 + i, tag="x")[0],
                             id=id_in_slot(f"rs{port}-{i}", s)))
    for j in jobs:
        rc.xadd(f"{{{prefix}}}requests", {"job": json.dumps(j)})
    wait_for(lambda: len(entries_by_job(rc, keys)) == len(jobs), "jobs forwarded", timeout=60)
    seen = entries_by_job(rc, keys)
    for j in jobs:
        sl = key_slot(j["id"].encode())
        assert seen[j["id"]] == [shard_for_slot(slot0, sl)], (j["id"], sl, seen[j["id"]])
    masters = [redis_cluster.master_of(k) for k in keys]
    for port, s in slots.items():
        for i in range(3):
            jid = id_in_slot(f"rs{port}-{i}", s)
            assert masters[seen[jid][0]] == port, (jid, port, masters)
    d.stop()
    for k in keys:
        rc.delete(k)

    # preference: wa's home is shard 0, wb's shard 1; with a batch of 4 and
    # foreign_room_pct 100 a worker running anything reads only its home
    # as jobs come
    common = ["--max-batch", "4", "--foreign-room-pct", "100", "--steal-ms", str(STEAL_MS)]
    wa = workers("wa", "--home-shard", "0", *common, addr=redis_cluster.seeds)
    wait_groups(rc, keys)

    def long_job(jid):
        return {"id": jid, "prompt_ids": [3, 1, 4], "max_tokens": 40000, "temperature": 0,
                "ignore_eos": True}
    held = [long_job("L0")]
    rc.xadd(keys[0], {"job": json.dumps(held[0])})  # wa alone: it takes it
    wait_for(lambda: holder(rc, prefix, "L0") == "wa", "wa running L0", timeout=60)
    wb = workers("wb", "--home-shard", "1", *common, addr=redis_cluster.seeds)
    wait_for(lambda: heartbeat(rc, prefix, "wb").get("home_shard") == 1, "wb's home", timeout=60)
    assert heartbeat(rc, prefix, "wa").get("home_shard") == 0
    held.append(long_job("L1"))
    rc.xadd(keys[1], {"job": json.dumps(held[-1])})  # wa busy, wb idle: wb
    wait_for(lambda: holder(rc, prefix, "L1") == "wb", "wb running L1", timeout=60)

    # both busy with room: the other shards are looked at every steal_ms
    # (2 lanes each: 8 looks in a second for both) and the home's standing
    # read comes back each BLOCK of 100 ms (20 more), not every step (~1,000
    # steps a second here: thousands)
    before, n0 = xreadgroup_calls(redis_cluster), rc.xlen(out_key(prefix, "L0"))
    time.sleep(1)  # a measured busy second, not a moment picked
    calls = xreadgroup_calls(redis_cluster) - before
    steps = rc.xlen(out_key(prefix, "L0")) - n0
    assert steps >= 20, f"only {steps} events of L0 in 1 s: wa was not stepping"
    looks = 2 * 2 * 1000 / STEAL_MS
    assert calls <= 1.5 * (looks + 20) + 10, f"{calls} XREADGROUPs in 1 s ({steps} steps of wa)"

    # both busy with room: each shard's jobs go to its home worker
    short = greedy_jobs(8, seed=39, max_tokens=(6, 10), tag="p")
    ref = reference(short, tmp_path)
    for i, j in enumerate(short):
        rc.xadd(keys[i % 2], {"job": json.dumps(j)})
        evs = stream_events(rc, out_key(prefix, j["id"]), 60)
        toks, _ = check_stream(evs, event_validator)
        assert toks == ref[i], j["id"]
        assert holder(rc, prefix, j["id"]) == ("wa" if i % 2 == 0 else "wb"), j["id"]

    # wb full (L1 and three more): a job in its shard is taken by wa, whose
    # home is another, within its looks
    for i in range(3):
        held.append(long_job(f"F{i}"))
        rc.xadd(keys[1], {"job": json.dumps(held[-1])})
        wait_for(lambda i=i: holder(rc, prefix, f"F{i}") == "wb", f"wb running F{i}",
                 timeout=60)
    x = greedy_jobs(1, seed=40, max_tokens=(6, 6), tag="steal")[0]
    added_ms = int(rc.xadd(keys[1], {"job": json.dumps(x)}).split("-")[0])
    # a look takes a job only once it has waited steal_ms (by Redis's
    # clock, which named the entry): every time wa's holder record is seen,
    # read with the same master's TIME in one transaction, it is that late
    own = f"{prefix}own:{{{x['id']}}}"
    node = redis_cluster.node(redis_cluster.master_of(own))
    deadline = time.time() + 60
    while True:
        p = node.pipeline(transaction=True)
        p.time()
        p.hget(own, "holder")
        (sec, usec), h = p.execute()
        if h:
            waited = sec * 1000 + usec // 1000 - added_ms
            assert waited >= STEAL_MS, f"taken {waited} ms after it was queued"
            break
        assert time.time() < deadline, "the waiting job was not taken by wa's looks"
        time.sleep(0.01)
    toks, _ = check_stream(stream_events(rc, out_key(prefix, x["id"]), 60), event_validator)
    assert toks == reference([x], tmp_path)[0]
    assert holder(rc, prefix, x["id"]) == "wa"
    wait_for(lambda: heartbeat(rc, prefix, "wa").get("foreign_taken", 0) >= 1,
             "wa's foreign_taken", timeout=30)
    assert heartbeat(rc, prefix, "wb").get("foreign_taken", 0) == 0
    cancel_all(rc, prefix, [j["id"] for j in held], event_validator)
    assert "home shard 0 (home_shard)" in wa.text()


def looks_at(cluster, port):
    """Looks at the shards on master port so far: its TIME calls (the look
    script's first command; nothing else in these tests asks the time)."""
    st = cluster.node(port).info("commandstats").get("cmdstat_time", {})
    return int(st.get("calls", 0))


def busy_at_home(redis_cluster, workers, rc, prefix, keys, jid, *flags):
    """wa: a worker whose home is shard 0, made busy (foreign_room_pct 100:
    any job) with a long job there; returned once it holds it."""
    wa = workers("wa", "--home-shard", "0", "--foreign-room-pct", "100", *flags,
                 addr=redis_cluster.seeds)
    wait_groups(rc, keys)
    rc.xadd(keys[0], {"job": json.dumps({"id": jid, "prompt_ids": [3, 1, 4], "max_tokens": 40000,
                                         "temperature": 0, "ignore_eos": True})})
    wait_for(lambda: holder(rc, prefix, jid) == "wa", f"wa running {jid}", timeout=60)
    return wa


def busy_and_looking(redis_cluster, workers, rc, prefix, keys, jid, steal):
    """wa busy at home (busy_at_home) with one slot free beside jid, steal_ms
    steal, once its reads of the other shards from while it was idle have
    ended and it looks there (a blocked read left over would take a job at
    once)."""
    wa = busy_at_home(redis_cluster, workers, rc, prefix, keys, jid, "--max-batch", "2",
                      "--steal-ms", str(steal))
    wait_for(lambda: heartbeat(rc, prefix, "wa").get("foreign_looks", 0) >= 2, "wa's looks",
             timeout=30)
    return wa


def short_job(jid, tail, n):
    """A greedy job whose prompt ends in tail (prompts of their own: no
    answer from the result cache)."""
    return {"id": jid, "prompt_ids": [2, 7, 1, tail], "max_tokens": n, "temperature": 0,
            "ignore_eos": True}


def test_looks_at_drained_shards_slow_down(redis_cluster, workers, prefix, tmp_path,
                                           event_validator):
    """A busy worker looks at the other shards every steal_ms only while
    something waits there: a look that finds a shard drained (nothing
    undelivered at all) doubles the time to that lane's next, up to 4 x
    steal_ms (worker/loop.c look_came), since each look is a read event on
    that master paid per worker, not per token. A job that comes to such a
    shard is still taken by the looks."""
    rc = redis_cluster.client()
    keys = shards(prefix)
    steal = 100
    wa = busy_at_home(redis_cluster, workers, rc, prefix, keys, "DL0", "--max-batch", "4",
                      "--steal-ms", str(steal))
    foreign = {redis_cluster.master_of(k) for k in keys[1:]} - {redis_cluster.master_of(keys[0])}
    assert foreign, "the shards' masters"
    # wa busy with room, shards 1 and 2 empty: at most one look each
    # 2 x steal_ms on average over a measured window once backed off
    # (4 x steal_ms at the end), where looks every steal_ms would be
    # window / steal_ms each
    wait_for(lambda: rc.xlen(out_key(prefix, "DL0")) >= 20, "wa stepping", timeout=60)
    window_ms = 3000
    before = {p: looks_at(redis_cluster, p) for p in foreign}
    n0 = rc.xlen(out_key(prefix, "DL0"))
    time.sleep(window_ms / 1000)  # a measured window, not a moment picked
    looks = sum(looks_at(redis_cluster, p) - before[p] for p in foreign)
    steps = rc.xlen(out_key(prefix, "DL0")) - n0
    assert steps >= 30, f"only {steps} events of DL0 in {window_ms} ms: wa was not stepping"
    lanes = K - 1
    assert looks >= lanes, f"{looks} looks at {lanes} drained lanes in {window_ms} ms: none"
    assert looks <= lanes * (window_ms / (2 * steal) + 2), \
        f"{looks} looks at {lanes} drained lanes in {window_ms} ms (every steal_ms: " \
        f"{lanes * window_ms // steal})"
    # the worker counts them too: its heartbeat's looks, nearly all drained
    wait_for(lambda: heartbeat(rc, prefix, "wa").get("foreign_looks_drained", 0) >= lanes,
             "wa's heartbeat counting drained looks", timeout=30)
    hb = heartbeat(rc, prefix, "wa")
    assert hb["foreign_looks"] >= hb["foreign_looks_drained"] >= lanes, hb
    # a job in a shard no worker has as home: taken by wa's looks (it has room)
    x = greedy_jobs(1, seed=41, max_tokens=(6, 6), tag="drained")[0]
    rc.xadd(keys[1], {"job": json.dumps(x)})
    toks, _ = check_stream(stream_events(rc, out_key(prefix, x["id"]), 60), event_validator)
    assert toks == reference([x], tmp_path)[0]
    assert holder(rc, prefix, x["id"]) == "wa"
    cancel_all(rc, prefix, ["DL0"], event_validator)
    wa.stop()


def test_a_slow_workers_looks_take_only_jobs_older_than_two_loops(
        redis_cluster, workers, prefix, tmp_path, event_validator):
    """A look takes jobs that have waited steal_ms, or two of the worker's
    busy loop periods when those are longer, up to 4 x steal_ms
    (worker/loop.c steal_after): a shard's own full workers read again only
    at their next loop, so a fixed steal_ms shorter than that took jobs they
    were about to read, and each one made every step of its taker write a
    second master. A sim worker stepping a modelled Qwen3-14B on an L40S
    (~45 ms a step) with steal_ms 20: MONITOR on another shard's master
    shows every look, once the loop's period is known, asking for jobs 40
    ms old or more (two loops, capped at 80); a job queued there is still
    taken by the looks."""
    rc = redis_cluster.client()
    keys = shards(prefix)
    steal = 20
    wa = busy_at_home(redis_cluster, workers, rc, prefix, keys, "SL0", "--max-batch", "4",
                      "--steal-ms", str(steal), "--backend", "sim", "--sim-profile", "l40s",
                      "--sim-model", "qwen3-14b")
    # the loop's period, smoothed over its steps, settled: 30 steps
    wait_for(lambda: rc.xlen(out_key(prefix, "SL0")) >= 30, "wa stepping", timeout=60)
    t0 = time.time()
    n0 = rc.xlen(out_key(prefix, "SL0"))
    other = redis_cluster.master_of(keys[1])
    assert other != redis_cluster.master_of(keys[0]), "the shards' masters"
    mon = Monitor(f"127.0.0.1:{other}", tmp_path / "monitor.txt")

    def looks(cmds):  # EVAL <script> <n> <keys...> <group> <consumer> <count> <min age> <upto>
        return [int(a[-2]) for _, src, a in cmds
                if src != "lua" and a and a[0].upper() == "EVAL" and len(a) > 5 and a[-4] == "wa"]
    try:
        cmds = mon.until(lambda c: len(looks(c)) >= 6, "six looks at shard 1's master")
    finally:
        mon.stop()
    step_ms = (time.time() - t0) * 1000 / max(rc.xlen(out_key(prefix, "SL0")) - n0, 1)
    assert step_ms >= steal, f"wa's loop took {step_ms:.0f} ms: not slow enough to show anything"
    ages = looks(cmds)
    assert all(2 * steal <= a <= 4 * steal for a in ages), (ages, step_ms)
    # still taken: a job in shard 1, whose master no worker has as home
    x = {"id": "SL1", "prompt_ids": [2, 7], "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    rc.xadd(keys[1], {"job": json.dumps(x)})
    _, done = check_stream(stream_events(rc, out_key(prefix, "SL1"), 60), event_validator)
    assert done["finish_reason"] == "length", done
    assert holder(rc, prefix, "SL1") == "wa"
    cancel_all(rc, prefix, ["SL0"], event_validator)
    wa.stop()


def test_a_busy_worker_empties_its_home_before_looking_away(
        redis_cluster, workers, prefix, tmp_path, event_validator):
    """Home first: a busy worker looks at another shard for jobs of the
    usual age (steal_ms) only once its home shard has nothing left for it
    (worker/loop.c home_backlog). Under saturation every shard has old
    enough jobs waiting; a worker that looked anyway took, for each slot
    freed, foreign jobs beside home ones (40-47 % of a saturated cluster's
    jobs ran away from home, every step writing every master). While the
    backlog lasts it looks only for jobs that have waited W_STARVE x
    steal_ms, so that a shard without a worker of its own is not starved.
    wa (home shard 0, one slot free beside a long job, steal_ms 100): the
    test keeps three jobs waiting in wa's home shard all along, each queued
    as another starts, and queues one in shard 1, which no worker has as
    home: it starts no sooner than 2 s (20 x steal_ms) after it was queued,
    once it was queued that long before the home's next (the build before
    home first took it within a few looks: 0.2-0.5 s), and it does start
    while the backlog lasts."""
    rc = redis_cluster.client()
    keys = shards(prefix)
    steal = 100
    wa = busy_and_looking(redis_cluster, workers, rc, prefix, keys, "HL", steal)
    prompts = iter(range(3, 100000))

    def job(jid, n):
        return short_job(jid, next(prompts), n)

    queued, started = [], set()

    def feed():  # three home jobs waiting, not yet started, at every moment
        for jid in queued:
            if jid not in started and rc.xlen(out_key(prefix, jid)):
                started.add(jid)
        while len(queued) - len(started) < 3:
            queued.append(f"B{len(queued)}")
            rc.xadd(keys[0], {"job": json.dumps(job(queued[-1], 40))})
    feed()
    t_away = time.monotonic()
    rc.xadd(keys[1], {"job": json.dumps(job("BF", 4))})
    deadline = t_away + 20 * steal / 1000 + 10
    while not rc.xlen(out_key(prefix, "BF")):
        assert time.monotonic() < deadline, \
            f"BF not started in {deadline - t_away:.0f} s of home backlog: starved"
        feed()
        time.sleep(0.002)
    waited = time.monotonic() - t_away
    n_home = len(started)
    feed()
    assert len(queued) - len(started) >= 2, "the home backlog ran out: nothing shown"
    assert n_home >= 3, f"only {n_home} home jobs started meanwhile"
    assert waited >= 0.9 * 20 * steal / 1000, \
        f"BF started {waited:.2f} s after it was queued, {n_home} home jobs meanwhile"
    _, done = check_stream(stream_events(rc, out_key(prefix, "BF"), 60), event_validator)
    assert done["finish_reason"] == "length", done
    assert holder(rc, prefix, "BF") == "wa"
    cancel_all(rc, prefix, [*queued, "HL"], event_validator, ends=("length", "cancelled"))
    wa.stop()


def test_a_backlog_alike_everywhere_keeps_every_job_at_home(
        redis_cluster, workers, prefix, tmp_path, event_validator):
    """Home first, relative: while its home shard has a backlog, a busy
    worker takes a job from another shard only when it was queued W_STARVE
    x steal_ms before the home's next one (worker/loop.c home_backlog), not
    merely once it is that old: in a cluster overloaded alike every job
    waits past any fixed age, and 25-30 % of a saturated cluster's jobs
    ran away from home under the 1 s rule. wa (home shard 0, one slot free
    beside a long job, steal_ms 100): a home backlog of jobs all queued
    before BF, queued in shard 1 (no worker's home): BF starts only once
    every home job has (the 1 s rule took it 2 s after it was queued, the
    backlog still waiting), however long it waited."""
    rc = redis_cluster.client()
    keys = shards(prefix)
    steal = 100
    wa = busy_and_looking(redis_cluster, workers, rc, prefix, keys, "RL", steal)
    home = [f"R{i}" for i in range(24)]
    for i, jid in enumerate(home):
        rc.xadd(keys[0], {"job": json.dumps(short_job(jid, 100 + i, 250))})
    t_away = time.monotonic()
    rc.xadd(keys[1], {"job": json.dumps(short_job("RF", 99, 4))})
    started = {}
    deadline = t_away + 120
    while not rc.xlen(out_key(prefix, "RF")):
        assert time.monotonic() < deadline, "RF not started in 120 s"
        for jid in home:
            if jid not in started and rc.xlen(out_key(prefix, jid)):
                started[jid] = time.monotonic() - t_away
        time.sleep(0.002)
    waited = time.monotonic() - t_away
    waiting = [jid for jid in home if not rc.xlen(out_key(prefix, jid))]
    assert not waiting, (f"RF, queued after them, started {waited:.2f} s after it was queued, "
                         f"{len(waiting)} home jobs still waiting")
    # the backlog outlasted the 1 s rule's moment (2 s): the test shows it
    last = max(started.values(), default=0)
    assert last >= 1.5 * 20 * steal / 1000, f"the home backlog lasted only {last:.2f} s"
    _, done = check_stream(stream_events(rc, out_key(prefix, "RF"), 60), event_validator)
    assert done["finish_reason"] == "length", done
    cancel_all(rc, prefix, [*home, "RL"], event_validator, ends=("length", "cancelled"))
    wa.stop()


def test_a_home_jobs_admission_check_rides_with_the_read(redis_cluster, workers, prefix, tmp_path,
                                                        event_validator):
    """On a cluster a job's admission check (the GET of its cancel key)
    went alone, on the worker's main connection, while its home lane's
    standing read was sent again apart: two read events on the master that
    carries the job, each job. A job of the home shard has its cancel key
    on that shard's master (the dispatcher's home shards), so a busy
    worker's check now goes first in the write that sends the home read
    again, as on a single instance: MONITOR on that master shows each job's
    GET followed, from the same client, by the XREADGROUP, for jobs whose
    result-cache entry is looked up too (its key most often on another
    master). A job whose id is on another master is checked alone, and
    still runs."""
    rc = redis_cluster.client()
    keys = shards(prefix)
    home = redis_cluster.master_of(keys[0])
    slots = request_slots(redis_cluster)
    wa = workers("wa", "--home-shard", "0", "--max-batch", "4", "--foreign-room-pct", "100",
                 addr=redis_cluster.seeds)
    wait_groups(rc, keys)
    busy = {"id": id_in_slot("AL", slots[home]), "prompt_ids": [3, 1, 4], "max_tokens": 40000,
            "temperature": 0, "ignore_eos": True}
    rc.xadd(keys[0], {"job": json.dumps(busy)})
    wait_for(lambda: holder(rc, prefix, busy["id"]) == "wa", "wa running the long job", timeout=60)
    # three jobs, then three whose answers go to the result cache: a cache
    # entry's key is in its hash's slot, most often on another master; the
    # cancel GET still rides with the read and the cache GET goes alone
    short = greedy_jobs(6, seed=42, max_tokens=(4, 6), tag="adm")
    for k, j in enumerate(short):
        j["id"] = id_in_slot(f"adm{k}", slots[home])
        j["cache"] = k >= 3
    other = next(p for p in slots if p != home)
    away = dict(greedy_jobs(1, seed=43, max_tokens=(4, 4), tag="away")[0],
                id=id_in_slot("away", slots[other]))
    ref = reference(short + [away], tmp_path)
    ck = {j["id"]: f"{prefix}cancel:{{{j['id']}}}" for j in short}
    mon = Monitor(f"127.0.0.1:{home}", tmp_path / "monitor.txt")
    try:
        for i, j in enumerate(short + [away]):  # one at a time: each read brings one
            rc.xadd(keys[0], {"job": json.dumps(j)})
            toks, _ = check_stream(stream_events(rc, out_key(prefix, j["id"]), 60), event_validator)
            assert toks == ref[i], j["id"]
            assert holder(rc, prefix, j["id"]) == "wa"
    except BaseException:
        mon.stop()
        raise
    reads = checks_rode_with_reads(mon, list(ck.values()))
    for jid, nxt in zip(ck, reads):
        assert keys[0] in nxt, (jid, "not the home lane's read", nxt)
    cancel_all(rc, prefix, [busy["id"]], event_validator)
    wa.stop()


def test_home_shards_spread_and_a_restart_fills_its_shard(redis_cluster, workers, prefix):
    """Workers with the default home_shard started one after another take
    the shards in turn, and a worker SIGKILLed and restarted under its name
    takes the shard it left (the one the fewest live workers have as home,
    from their heartbeats), not the next of the count, which would put two
    workers on one shard and none on another."""
    rc = redis_cluster.client()
    ws = {}
    for i in range(K):
        name = f"h{i}"
        ws[name] = workers(name, addr=redis_cluster.seeds)
        wait_for(lambda n=name: heartbeat(rc, prefix, n).get("home_shard", -1) >= 0,
                 f"{name}'s heartbeat", timeout=60)
    homes = {n: heartbeat(rc, prefix, n)["home_shard"] for n in ws}
    assert sorted(homes.values()) == list(range(K)), homes
    # the one whose shard the count would not give back next (4 - 1 = 3 = 0 mod 3)
    victim = next(n for n, h in homes.items() if h != K % K)
    ws[victim].kill(signal.SIGKILL)
    ws[victim].wait()
    again = workers(victim, addr=redis_cluster.seeds)
    wait_for(lambda: f"home shard {homes[victim]} (0 of {K - 1} live workers' homes there)"
             in again.text(), f"{victim} back on shard {homes[victim]}", timeout=60)
