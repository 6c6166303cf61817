"""Redis's work per token (issue 27 point 3): what a worker sends Redis
grows with the events it writes, not with its steps, its jobs or the fleet.

MONITOR (redis-cli monitor, on the test's Redis) shows every command a
worker sends, and, marked "lua", every command its scripts run:

- the cancel check (GET cancel:<id>) and the client-lease check (EXISTS
  lease:<id>) of a job that emits ride inside its FENCE_EMIT call, once
  every 50 ms rather than every step: the script runs them, the worker
  sends no GET of its own, and a cancel still stops the job within that
  bound;
- a running job with nothing to emit (coalesce_ms holds its deltas) gets a
  standalone GET at most every 50 ms, not every step, and a cancel still
  stops it within that bound, long before its next coalesced delta;
- a client lease that stops being renewed still cancels its job, with the
  check folded into the emit and with it standalone;
- every pool's lease renewal in one FENCE_LEASE call on a single instance;
- every pool's lease renewal goes in one FENCE_LEASE call on a single
  instance, and keeps the jobs from going idle;
- one claimer per pool: of 4 workers with room, one at a time holds the
  lease claimer:<pool key> and runs XAUTOCLAIM on that pool, about once a
  claim interval for the whole fleet; kill the job's worker and the
  claimer and the job is still resumed to its end, gapless;
- a worker with no room (max_batch reached) reads no job: no XREADGROUP,
  no claimer lease, until a slot frees;
- a coalescing worker releases every job's held deltas at one tick: one
  FENCE_EMIT call carries them all, once per coalesce_ms, whenever the jobs
  started; a job that ends between ticks sends its done with the next tick,
  not in a call of its own;
- a job's FENCE_TAKE rides in the pipeline of its first events and its XACK
  with the next flush's other commands: no round trip of their own;
- a job's admission check (GET of its cancel key) goes in one write with
  the standing read sent again after it, on that read's connection;
- a dispatcher's round (its transactions) goes in one write with its next
  read of new requests.
"""
import json
import pathlib
import re
import signal
import subprocess
import time

import pytest

from conftest import check_stream, connect, wait_for

LINE = re.compile(r'^(\d+\.\d+) \[\d+ ([^\]]+)\] (.*)$')
ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


class Monitor:
    """redis-cli monitor into a file, parsed on demand: a list of (time,
    source, args), source "lua" for a script's commands, else the client's
    address."""

    def __init__(self, addr, path):
        host, port = addr.rsplit(":", 1)
        self.path = pathlib.Path(path)
        self.out = open(self.path, "w")
        self.proc = subprocess.Popen(["redis-cli", "-h", host, "-p", port, "monitor"],
                                     stdout=self.out, stderr=subprocess.STDOUT)
        wait_for(lambda: self.path.read_text().startswith("OK"), "MONITOR to start", 10)

    def commands(self):
        out = []
        for line in self.path.read_text().splitlines():
            m = LINE.match(line)
            if m:
                out.append((float(m.group(1)), m.group(2), ARG.findall(m.group(3))))
        return out

    def until(self, cond, what, timeout=30):
        """Waits until cond(commands) is true; returns the commands."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            cmds = self.commands()
            if cond(cmds):
                return cmds
            time.sleep(0.05)
        raise AssertionError(f"MONITOR never saw {what}")

    def sync(self, r, timeout=30):
        """Every command Redis ran before now, as MONITOR shows them: MONITOR
        reaches its client later than the commands reach their streams, so
        "the events are in Redis" does not mean "redis-cli has printed
        them". An ECHO of a marker through r runs after them all; once the
        marker is in the file, so is everything before it."""
        marker = f"monitor-sync-{time.monotonic_ns()}"
        r.echo(marker)
        cmds = self.until(lambda c: any(marker in a for _, _, a in c), f"the marker {marker}",
                          timeout)
        return [c for c in cmds if marker not in c[2]]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.out.close()


def calls(cmds, name, key, lua):
    """(time, args) of the commands `name` on `key`, by scripts (lua) or sent."""
    return [(t, a) for t, src, a in cmds
            if a and a[0].upper() == name and len(a) > 1 and a[1] == key
            and (src == "lua") == lua]


def send(r, prefix, job):
    """XADD one request to the dispatchers' intake."""
    return r.xadd(f"{prefix}requests", {"job": json.dumps(job)})


def long_job(jid, n=30000, **kw):
    return {"id": jid, "prompt_ids": [1, 2, 3], "max_tokens": n, "temperature": 0,
            "ignore_eos": True, **kw}


def cancel_now(r, prefix, jid):
    """Sets the cancel key and reads the stream's length in one transaction:
    the count is exact at the moment the cancel exists."""
    p = r.pipeline(transaction=True)
    p.set(f"{prefix}cancel:{jid}", 1, ex=600)
    p.xlen(f"{prefix}out:{jid}")
    return p.execute()[1]


def test_checks_ride_in_the_emit_script(workers, client, redis_addr, prefix, tmp_path,
                                        event_validator):
    workers("w1", "--max-batch", "2")
    r = connect(redis_addr)
    client.submit(long_job("long"))
    out, ck = f"{prefix}out:long", f"{prefix}cancel:long"
    wait_for(lambda: r.xlen(out) >= 5, "the job's first events")
    mon = Monitor(redis_addr, tmp_path / "monitor.txt")
    try:
        cmds = mon.until(lambda c: len(calls(c, "GET", ck, True)) >= 24,
                         "24 cancel checks inside the emit script")
    finally:
        mon.stop()
    inside, apart = calls(cmds, "GET", ck, True), calls(cmds, "GET", ck, False)
    window = inside[-1][0] - inside[0][0]
    # decoding, every flush carries an event: no GET of its own, except a
    # flush that had none (every 50 ms at most)
    assert len(apart) <= window / 0.05 + 1, (len(apart), len(inside), window)
    # inside, once every 50 ms (the worker's clock against Redis's arrival
    # times: a little jitter either way), not with every step's emit: the
    # tiny model steps in about a millisecond, and each step's FENCE_EMIT
    # is the worker's one script call then
    gaps = [b[0] - a[0] for a, b in zip(inside, inside[1:])]
    assert sum(gaps) / len(gaps) >= 0.045, gaps
    assert min(gaps) >= 0.02, gaps
    emits = [t for t, src, a in cmds if src != "lua" and a and a[0].upper() == "EVALSHA"
             and out in a and inside[0][0] <= t <= inside[-1][0]]
    assert len(emits) >= 3 * len(inside), (len(emits), len(inside))
    t0 = time.time()
    n_at_cancel = cancel_now(r, prefix, "long")
    evs = client.events("long")
    took = time.time() - t0
    _, done = check_stream(evs, event_validator)
    assert done["finish_reason"] == "cancelled"
    # within the check interval, a step and a round trip
    assert took < 0.8, took
    assert len(evs) > n_at_cancel, (n_at_cancel, len(evs))


def test_job_with_nothing_to_emit_is_checked_every_50ms(workers, client, redis_addr, prefix,
                                                         tmp_path, event_validator):
    # coalescing holds a job's deltas for 1 s: most steps emit nothing
    workers("w1", "--max-batch", "2", "--coalesce-ms", "1000")
    r = connect(redis_addr)
    client.submit(long_job("held"))
    ck = f"{prefix}cancel:held"
    mon = Monitor(redis_addr, tmp_path / "monitor.txt")
    try:
        cmds = mon.until(lambda c: len(calls(c, "GET", ck, False)) >= 12,
                         "12 standalone cancel checks")
    finally:
        mon.stop()
    apart = [t for t, _ in calls(cmds, "GET", ck, False)]
    gaps = [b - a for a, b in zip(apart, apart[1:])]
    # every 50 ms at most (the worker's clock against Redis's arrival times:
    # a little jitter either way), not every step (the tiny model steps in
    # about a millisecond)
    assert sum(gaps) / len(gaps) >= 0.045, gaps
    assert min(gaps) >= 0.02, gaps
    evs_before = r.xlen(f"{prefix}out:held")
    t0 = time.time()
    cancel_now(r, prefix, "held")
    evs = client.events("held")
    took = time.time() - t0
    _, done = check_stream(evs, event_validator)
    assert done["finish_reason"] == "cancelled"
    # within the check interval, a step and a round trip: well before the
    # held deltas' 1 s would have let a folded check see it
    assert took < 0.8, took
    assert len(evs) - evs_before <= 3, (evs_before, len(evs))


def test_client_lease_expiry_cancels(workers, client, redis_addr, prefix, tmp_path,
                                     event_validator):
    """Folded (coalesce 0: the EXISTS runs in the emit script) and
    standalone (coalesce 1000: nothing to emit most steps)."""
    r = connect(redis_addr)
    for name, coalesce in (("folded", "0"), ("apart", "1000")):
        w = workers(f"w-{name}", "--max-batch", "2", "--coalesce-ms", coalesce)
        jid, lk = f"lease-{name}", f"{prefix}lease:lease-{name}"
        r.set(lk, "1", px=3000)
        mon = Monitor(redis_addr, tmp_path / f"monitor-{name}.txt")
        try:
            client.submit(long_job(jid, client_lease_ms=1000))
            # folded: the script's EXISTS; apart: the worker's own
            mon.until(lambda c: len(calls(c, "EXISTS", lk, coalesce == "0")) >= 5,
                      f"5 lease checks ({name})")
        finally:
            mon.stop()
        # the lease lives: the job runs on
        assert r.exists(lk) and r.xlen(f"{prefix}out:{jid}") > 0
        wait_for(lambda: not r.exists(lk), "the lease to expire", 10)
        t0 = time.time()
        evs = client.events(jid)
        took = time.time() - t0
        _, done = check_stream(evs, event_validator)
        assert done["finish_reason"] == "cancelled"
        # missing for one whole lease (1 s), seen by a check every 50 ms
        assert took < 1.0 + 1.5, took
        assert "its client's lease expired" in w.text()
        w.stop()


def test_one_claimer_per_pool(workers, client, redis_addr, prefix, tmp_path, event_validator):
    fast = ["--claim-interval-ms", "200", "--claim-idle-ms", "1000", "--lease-renew-ms", "200",
            "--max-batch", "4"]
    ws = {n: workers(n, *fast) for n in ("c1", "c2", "c3", "c4")}
    r = connect(redis_addr)
    pools = [f"{prefix}jobs:fast", f"{prefix}jobs:think"]
    mon = Monitor(redis_addr, tmp_path / "monitor.txt")
    try:
        cmds = mon.until(lambda c: len(c) > 1 and c[-1][0] - c[0][0] >= 2.0, "2 s of traffic")
    finally:
        mon.stop()
    window = cmds[-1][0] - cmds[0][0]
    for pool in pools:
        claims = [(t, src) for t, src, a in cmds
                  if a and a[0].upper() == "XAUTOCLAIM" and a[1] == pool]
        leases = [(t, src) for t, src, a in cmds if a and a[0].upper() == "SET"
                  and a[1] == f"{prefix}claimer:{pool}"]
        # every worker asks for the lease each interval (4 x 10 in 2 s) ...
        assert len({src for _, src in leases}) == 4, leases
        # ... and about one of them claims: not 4 per interval
        assert 0.3 * window / 0.2 <= len(claims) <= window / 0.2 + 2, (len(claims), window)
    # crash safety: kill the job's worker, and the claimer if another one
    client.submit(long_job("crash", n=1500))
    out = f"{prefix}out:crash"
    wait_for(lambda: r.xlen(out) >= 20, "the job's first events")
    held = r.xpending_range(pools[0], "workers", "-", "+", 10)
    victims = {held[0]["consumer"]}
    holder = r.get(f"{prefix}claimer:{pools[0]}")
    if holder:
        victims.add(holder.split("/")[0])
    for n in victims:
        ws[n].kill(signal.SIGKILL)
        ws[n].wait(10)
    evs = client.events("crash", timeout=120)
    _, done = check_stream(evs, event_validator)
    assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 1500
    assert any("reclaimed entry" in w.text() for n, w in ws.items() if n not in victims)


def emits_of(cmds, out):
    """The FENCE_EMIT calls a worker sent for the job whose stream is out."""
    return sum(1 for _, src, a in cmds if src != "lua" and a and a[0].upper() == "EVALSHA"
               and out in a)


def watch_100_emits(client, redis_addr, tmp_path, jid):
    """Starts the long job jid, and once it runs, MONITORs Redis until its
    worker has sent 100 emits: the commands seen meanwhile."""
    r = connect(redis_addr)
    client.submit(long_job(jid))
    out = f"{client.prefix}out:{jid}"
    wait_for(lambda: r.xlen(out) >= 5, "the job's first events")
    mon = Monitor(redis_addr, tmp_path / "monitor.txt")
    try:
        return mon.until(lambda c: emits_of(c, out) >= 100, "100 emits")
    finally:
        mon.stop()


def test_full_worker_reads_nothing(workers, client, redis_addr, prefix, tmp_path,
                                   event_validator):
    workers("w1", "--max-batch", "1", "--claim-interval-ms", "100")
    r = connect(redis_addr)
    cmds = watch_100_emits(client, redis_addr, tmp_path, "only")  # full throughout
    mine = [a[0].upper() for _, src, a in cmds if src != "lua" and a and prefix in " ".join(a)]
    assert "XREADGROUP" not in mine and "XAUTOCLAIM" not in mine, sorted(set(mine))
    assert not any(a[0].upper() == "SET" and "claimer:" in a[1] for _, _, a in cmds if a)
    cancel_now(r, prefix, "only")
    _, done = check_stream(client.events("only"), event_validator)
    assert done["finish_reason"] == "cancelled"
    # room again: it reads (BLOCKs) for the next job
    client.submit(long_job("next", n=3))
    _, done = check_stream(client.events("next"), event_validator)
    assert done["finish_reason"] == "length"


def test_busy_worker_keeps_one_standing_read(workers, client, redis_addr, prefix, tmp_path,
                                             event_validator):
    """A worker with a job running and room for more does not poll for new
    jobs every step (each poll a round trip on the step's critical path and
    an event Redis pays for): it keeps one XREADGROUP ... BLOCK waiting in
    Redis over both pools and its offer streams, sent again when it comes
    back (a job, or its BLOCK of 100 ms run out). A job then sent to either
    pool is still taken while the first runs."""
    workers("w1", "--max-batch", "4")
    r = connect(redis_addr)
    cmds = watch_100_emits(client, redis_addr, tmp_path, "busy")
    emits = emits_of(cmds, f"{prefix}out:busy")
    polls = [a for _, src, a in cmds if src != "lua" and a and a[0].upper() == "XREADGROUP"]
    # every read names both pools and both offer streams, and blocks
    for a in polls:
        streams = a[a.index("STREAMS") + 1:]
        keys = streams[:len(streams) // 2]
        assert sorted(keys) == sorted([f"{prefix}jobs:fast", f"{prefix}jobs:think",
                                       f"{prefix}jobs:fast:w:w1", f"{prefix}jobs:think:w:w1"]), a
        assert "BLOCK" in [x.upper() for x in a], a
    # one a BLOCK (100 ms) at most, where a poll a step made about one an emit
    span = cmds[-1][0] - cmds[0][0]
    assert len(polls) <= span / 0.1 + 2 and len(polls) < 0.5 * emits, (len(polls), emits, span)
    for pool, mode in (("think", "think"), ("fast", "no_think")):
        client.submit(long_job(f"also-{pool}", n=3, mode=mode))
        _, done = check_stream(client.events(f"also-{pool}"), event_validator)
        assert done["finish_reason"] == "length"
    cancel_now(r, prefix, "busy")
    _, done = check_stream(client.events("busy"), event_validator)
    assert done["finish_reason"] == "cancelled"


def test_lease_renewal_is_one_call_for_all_pools(workers, client, redis_addr, prefix, tmp_path,
                                                 event_validator):
    workers("w1", "--max-batch", "4", "--lease-renew-ms", "200", "--claim-idle-ms", "1000")
    r = connect(redis_addr)
    client.submit(long_job("lf"), pool="fast")
    client.submit(dict(long_job("lt"), mode="think"), pool="think")
    pools = [f"{prefix}jobs:fast", f"{prefix}jobs:think"]
    for jid in ("lf", "lt"):
        wait_for(lambda: r.xlen(f"{prefix}out:{jid}") >= 5, f"{jid}'s first events")
    mon = Monitor(redis_addr, tmp_path / "monitor.txt")

    def renewals(cmds):
        return [(t, a) for t, src, a in cmds if src != "lua" and a and a[0].upper() == "EVALSHA"
                and pools[0] in a and pools[1] in a]
    try:
        cmds = mon.until(lambda c: len(renewals(c)) >= 4, "4 lease renewals")
    finally:
        mon.stop()
    # both pools' jobs in one FENCE_LEASE call, never one call per pool
    single = [a for t, src, a in cmds if src != "lua" and a and a[0].upper() == "EVALSHA"
              and (pools[0] in a) != (pools[1] in a) and "workers" in a]
    assert not single, single[:2]
    # and it renews: neither entry goes idle for the claim_idle_ms of 1 s
    for pool in pools:
        pend = r.xpending_range(pool, "workers", "-", "+", 10)
        assert len(pend) == 1 and pend[0]["time_since_delivered"] < 1000, pend
    for jid in ("lf", "lt"):
        cancel_now(r, prefix, jid)
        _, done = check_stream(client.events(jid), event_validator)
        assert done["finish_reason"] == "cancelled"


def test_coalescing_one_tick_for_the_batch(workers, client, redis_addr, prefix, tmp_path):
    """Jobs that start at different steps have their held deltas sent in the
    same emit call (one clock for the batch, not one per job), so a busy
    coalescing worker makes one emit call, and each reader one wake, per
    coalesce_ms; with a clock per job the calls came every few steps, each
    with whichever jobs were due."""
    workers("w1", "--max-batch", "4", "--coalesce-ms", "40")
    r = connect(redis_addr)
    ids = ["t0", "t1", "t2"]
    outs = [f"{prefix}out:{i}" for i in ids]
    for i, jid in enumerate(ids):  # each starts a few steps after the last
        client.submit(long_job(jid))
        wait_for(lambda: r.xlen(outs[i]) >= 2, f"{jid} streaming")
    mon = Monitor(redis_addr, tmp_path / "monitor.txt")
    try:
        cmds = mon.until(lambda c: sum(1 for _, src, a in c if src != "lua" and a
                                       and a[0].upper() == "EVALSHA" and outs[0] in a) >= 15,
                         "15 emits of the first job")
    finally:
        mon.stop()
    for jid in ids:
        r.set(f"{prefix}cancel:{jid}", 1, ex=600)
    emits = [a for _, src, a in cmds if src != "lua" and a and a[0].upper() == "EVALSHA"
             and any(o in a for o in outs)]
    named = [tuple(o in a for o in outs) for a in emits]
    # the call that was in flight when MONITOR started may be the tail of one
    assert all(n == (True, True, True) for n in named[1:]), named
    times = [t for t, src, a in cmds if src != "lua" and a and a[0].upper() == "EVALSHA"
             and outs[0] in a]
    # once per coalesce_ms, not every step: the worker spaces its ticks 40 ms
    # apart at least, Redis sees them up to one call's delay closer
    assert (len(times) - 1) * 0.040 <= times[-1] - times[0] + 0.030, times


# short jobs (id: tokens) that end while long ones stream
SHORTS = {"s3": 3, "s5": 5, "s8": 8, "s13": 13}


def stream_longs(client, r, prefix, n):
    """n jobs of 30,000 tokens, each streaming before the next starts."""
    longs = [f"l{i}" for i in range(n)]
    for jid in longs:
        client.submit(long_job(jid))
        wait_for(lambda: r.xlen(f"{prefix}out:{jid}") >= 2, f"{jid} streaming")
    return longs


def submit_shorts(client):
    for k, (jid, n) in enumerate(SHORTS.items()):
        client.submit(long_job(jid, n, prompt_ids=[5 + k, 6, 7]))


def end_longs_check_shorts(client, r, prefix, longs, validator):
    """Cancels the long jobs; every short stream is whole: gapless, done
    last, all its tokens."""
    for jid in longs:
        r.set(f"{prefix}cancel:{jid}", 1, ex=600)
    for jid, n in SHORTS.items():
        tokens, done = check_stream(client.events(jid), validator)
        assert len(tokens) == n and done["finish_reason"] == "length"


def test_coalescing_a_done_waits_for_the_tick(workers, client, redis_addr, prefix, tmp_path,
                                              event_validator):
    """A job that ends between ticks sends its done (and its last delta)
    with the batch's next tick, not in a call of its own at the step it
    ended: with jobs ending every few steps, a done sent at once made nearly
    every step an emit call and a wake of every reader, coalescing or not.
    The streams stay whole: seq gapless, done last."""
    workers("w1", "--max-batch", "8", "--coalesce-ms", "40")
    r = connect(redis_addr)
    longs = stream_longs(client, r, prefix, 3)
    louts = [f"{prefix}out:{i}" for i in longs]
    mon = Monitor(redis_addr, tmp_path / "monitor.txt")
    try:
        submit_shorts(client)

        def ended(jid):
            last = r.xrevrange(f"{prefix}out:{jid}", count=1)
            return bool(last) and "finish_reason" in last[0][1]["event"]
        wait_for(lambda: all(ended(j) for j in SHORTS), "the short jobs done", 60)
        cmds = mon.sync(r)
    finally:
        mon.stop()
    end_longs_check_shorts(client, r, prefix, longs, event_validator)
    # only the short jobs end while MONITOR runs: every done it saw went in
    # a call that also carried the long jobs' held deltas, i.e. at a tick
    with_done = [a for _, src, a in cmds if src != "lua" and a and a[0].upper() == "EVALSHA"
                 and any("finish_reason" in x for x in a)]
    assert with_done, "no emit call carried a done"
    assert all(all(o in a for o in louts) for a in with_done), \
        [[o for o in louts if o in a] for a in with_done]


@pytest.mark.parametrize("coalesce", ["0", "40"])
def test_take_and_ack_ride_with_other_commands(workers, client, redis_addr, prefix, tmp_path,
                                              event_validator, coalesce):
    """A job's FENCE_TAKE and its XACK each made a round trip of their own
    (a wake of Redis a job, twice): the TAKE now goes in the pipeline of the
    job's first events, in front of them, and the XACK with the next flush
    that sends anything else. With two long jobs streaming, MONITOR shows
    each short job's TAKE followed by an emit call that carries its first
    event, and each XACK after a later emit than the one that carried its
    done. Coalesce 0 (an emit every step) tells the TAKE's place apart
    (before: in the flush ahead of the first event's); coalesce 40 the
    XACK's (before: alone, in the flush right after its done's tick)."""
    workers("w1", "--max-batch", "8", "--coalesce-ms", coalesce)
    r = connect(redis_addr)
    longs = stream_longs(client, r, prefix, 2)
    mon = Monitor(redis_addr, tmp_path / "monitor.txt")
    try:
        submit_shorts(client)
        pool = [k for k in r.scan_iter(f"{prefix}jobs:*") if r.type(k) == "stream"]
        # every short job finished and acknowledged (its pool entry deleted)
        cmds = mon.until(lambda c: sum(1 for _, src, a in c if src != "lua" and len(a) == 6
                                       and a[0].upper() == "EVALSHA" and a[2] == "1"
                                       and a[3] in pool) >= len(SHORTS), "the XACKs", 60)
    finally:
        mon.stop()
    end_longs_check_shorts(client, r, prefix, longs, event_validator)
    sent = [(src, a) for _, src, a in cmds if src != "lua" and a]
    for jid in SHORTS:
        own, out = f"{prefix}own:{jid}", f"{prefix}out:{jid}"
        take = [i for i, (_, a) in enumerate(sent)
                if a[0].upper() == "EVALSHA" and len(a) > 4 and a[2] == "2" and a[3] == own]
        assert len(take) == 1, (jid, len(take))
        src = sent[take[0]][0]
        # the next emit call (FENCE_EMIT: its first key is an out stream)
        after = next(a for s, a in sent[take[0] + 1:] if s == src and
                     a[0].upper() == "EVALSHA" and len(a) > 3 and a[3].startswith(f"{prefix}out:"))
        assert out in after, (jid, "the TAKE's flush did not carry its first event")
        if coalesce == "0":  # it emits every step: its check rides in the emit
            gets = [a for s, a in sent if a[0].upper() == "GET"
                    and a[1] == f"{prefix}cancel:{jid}"]
            assert len(gets) == 1, (jid, "the admission's GET, then no other", len(gets))
        emits = [i for i, (s, a) in enumerate(sent) if s == src and a[0].upper() == "EVALSHA"
                 and out in a]
        entry = r.hget(own, "entry")  # its pool entry, in the holder record
        acks = [i for i, (s, a) in enumerate(sent) if s == src and len(a) == 6
                and a[3] in pool and a[5] == entry]
        assert len(acks) == 1, (jid, len(acks))
        before = [i for i, (s, _) in enumerate(sent[:acks[0]]) if s == src][-1]
        assert before != emits[-1], f"{jid}: its XACK came alone, right after its done"


def checks_rode_with_reads(mon, keys):
    """Each of keys (cancel keys, in the order their jobs were admitted) was
    read by one GET, followed from the same client by an XREADGROUP (a
    result-cache GET may come between: a check too): the admission check
    went in one write with the standing read sent again. Waits until
    MONITOR shows the last one's read, then stops mon. Returns the
    XREADGROUPs found, in keys' order."""
    last = keys[-1]

    def read_after_last_check(c):
        at = [i for i, (_, _, a) in enumerate(c) if a and a[0].upper() == "GET"
              and a[1:2] == [last]]
        return bool(at) and any(a and a[0].upper() == "XREADGROUP" and s == c[at[0]][1]
                                for _, s, a in c[at[0] + 1:])
    try:
        cmds = mon.until(read_after_last_check, "the read after the last job's check")
    finally:
        mon.stop()
    sent = [(src, a) for _, src, a in cmds if src != "lua" and a]
    reads = []
    for key in keys:
        gets = [i for i, (_, a) in enumerate(sent) if a[0].upper() == "GET" and a[1:2] == [key]]
        assert len(gets) == 1, (key, len(gets))
        src = sent[gets[0]][0]
        nxt = next((a for s, a in sent[gets[0] + 1:] if s == src and a[0].upper() != "GET"),
                   [""])
        assert nxt[0].upper() == "XREADGROUP", (key, "its check went alone", nxt[:4])
        reads.append(nxt)
    return reads


def test_admission_check_rides_with_the_next_read(workers, client, redis_addr, prefix, tmp_path,
                                                  event_validator):
    """A job's admission check (the GET of its cancel key) went alone, and
    the worker's standing read, answered by that job, was sent again apart:
    two round trips, two read events for Redis, each job. The check now
    goes first in the write that sends the read again, on the read's own
    connection: MONITOR shows each job's one GET (and its cache entry's)
    followed, from the same client, by the XREADGROUP; and a job cancelled
    before it is admitted still ends at once with nothing generated."""
    workers("w1", "--max-batch", "4")
    jobs = [f"adm{k}" for k in range(3)]
    mon = Monitor(redis_addr, tmp_path / "monitor.txt")
    try:
        for jid in jobs:  # one at a time: each read brings one job
            client.submit(long_job(jid, 2))
            check_stream(client.events(jid), event_validator)
    except BaseException:
        mon.stop()
        raise
    checks_rode_with_reads(mon, [f"{prefix}cancel:{jid}" for jid in jobs])
    r = connect(redis_addr)
    r.set(f"{prefix}cancel:pre", 1, ex=600)
    client.submit(long_job("pre", 50))
    evs = client.events("pre")
    _, done = check_stream(evs, event_validator)
    assert done["finish_reason"] == "cancelled" and len(evs) == 1


def test_dispatcher_round_ends_in_its_next_read(dispatchers, redis_addr, prefix):
    """A dispatcher's round was: a read of new requests, answered when one
    comes; the transactions that forward them; then the next read, sent
    apart: two read events for Redis of the dispatcher's own each round.
    The next read now goes in the write of the round's transactions. With
    requests sent one at a time (the client's XADD, then its blocking read
    of the pool, answered by the forward: two events of the client's own),
    Redis reads about three events a request, where it read four."""
    dispatchers("d1")
    r = connect(redis_addr)
    pool = f"{prefix}jobs:fast"
    job = {"messages": [{"role": "user", "content": "hi"}], "mode": "no_think",
           "temperature": 0.7, "max_tokens": 4}

    def one(last):
        send(r, prefix, {**job, "id": f"rt{time.time_ns()}"})
        got = r.xread({pool: last}, count=1, block=10000)
        assert got, "the request was not forwarded"
        return got[0][1][-1][0]
    last = "0-0"
    for _ in range(3):  # its first rounds (the first read, stats, models) done
        last = one(last)
    n = 40
    reads0 = int(r.info("stats")["total_reads_processed"])
    for _ in range(n):
        last = one(last)
    reads = int(r.info("stats")["total_reads_processed"]) - reads0 - 1  # less the INFO
    # 2 the client's + 1 the dispatcher's a request; its periodic work
    # (stats every 100 ms, heartbeat, claims) adds a few over the run
    assert reads <= 3.5 * n, (reads, n)
