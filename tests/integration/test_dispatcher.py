"""The dispatcher against a real redis-server: the ratio split of auto
requests, explicit modes, soft switches and rules, adaptive routing under a
synthetic backlog, backpressure (OVERLOADED), malformed requests, the
result-cache fast path with a real worker, kill -9 with reclaim by a second
dispatcher, the heartbeat and SIGHUP.

Run with Debian's interpreter: /usr/bin/python3 -m pytest tests/integration
"""
import json
import signal
import time

import pytest

from conftest import MODEL, RedisServer, check_stream, connect, read_heartbeat, stream_events

ROOT_SCHEMAS = __import__("conftest").SCHEMAS


def send(r, prefix, job=None, raw=None):
    """XADD one request; returns its entry ID."""
    return r.xadd(f"{prefix}requests", {"job": raw if raw is not None else json.dumps(job)})


def send_many(r, prefix, jobs):
    p = r.pipeline(transaction=False)
    for j in jobs:
        p.xadd(f"{prefix}requests", {"job": json.dumps(j)})
    return p.execute()


def pool_jobs(r, prefix, pool):
    """The jobs forwarded to pool, parsed."""
    return [json.loads(f["job"]) for _, f in r.xrange(f"{prefix}jobs:{pool}")]


def wait_handled(r, prefix, n_total, timeout=30):
    """Until every request was read and acknowledged and n_total landed on
    the pools (forwarded) or elsewhere (the caller counts)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        info = r.xinfo_groups(f"{prefix}requests")
        g = next((g for g in info if g["name"] == "dispatchers"), None)
        if g and g["pending"] == 0 and g["lag"] == 0:
            n = r.xlen(f"{prefix}jobs:fast") + r.xlen(f"{prefix}jobs:think")
            if n >= n_total:
                return
        time.sleep(0.02)
    raise AssertionError(f"requests not all handled within {timeout}s")


def heartbeat(r, prefix, name, timeout=5):
    return read_heartbeat(r, prefix, "dispatcher", name, timeout)


def wait_hb(r, prefix, name, pred, timeout=10):
    deadline = time.time() + timeout
    hb = None
    while time.time() < deadline:
        hb = heartbeat(r, prefix, name)
        if pred(hb):
            return hb
        time.sleep(0.05)
    raise AssertionError(f"heartbeat never matched; last {hb}")


def events(r, prefix, jid, timeout=30):
    return stream_events(r, f"{prefix}out:{jid}", timeout)


def test_1000_auto_requests_split_300_700(dispatchers, redis_addr, prefix):
    d = dispatchers("d1", "--think-ratio", "0.3")
    assert "result-cache fast path off" in d.text()  # no --model
    r = connect(redis_addr)
    jobs = [{"id": f"a{i}", "prompt_ids": [1, 2, i % 700]} for i in range(1000)]
    for k in range(0, 1000, 100):  # in chunks, so several rounds are involved
        send_many(r, prefix, jobs[k:k + 100])
    wait_handled(r, prefix, 1000)
    think, fast = pool_jobs(r, prefix, "think"), pool_jobs(r, prefix, "fast")
    assert 299 <= len(think) <= 301, len(think)
    assert len(think) + len(fast) == 1000
    # nothing lost, nothing twice; ids kept; the decision spelt out as the mode
    assert sorted(j["id"] for j in think + fast) == sorted(j["id"] for j in jobs)
    assert all(j["mode"] == "think" for j in think)
    assert all(j["mode"] == "no_think" for j in fast)
    # smooth: every run of 10 consecutive requests (in request order) has 3 think
    order = {j["id"]: "think" for j in think}
    seq = [order.get(f"a{i}") == "think" for i in range(1000)]
    assert all(2 <= sum(seq[i:i + 10]) <= 4 for i in range(991))
    hb = wait_hb(r, prefix, "d1", lambda h: sum(h["routed"].values()) == 1000)
    assert hb["routed"] == {"fast": len(fast), "think": len(think)}
    assert hb["auto_routed"] == hb["routed"]
    assert hb["think_ratio"] == 0.3 and hb["think_ratio_effective"] == 0.3
    assert hb["adaptive"] is False and hb["pid"] == d.proc.pid
    for k in ("name", "time_ms", "uptime_s", "cache_hits", "cache_misses", "invalid", "overloaded",
              "requests_per_s", "pool_waiting", "pool_wait_ms"):
        assert k in hb, k
    assert hb["pool_waiting"]["think"] == len(think)  # no worker took them
    assert 0 < r.ttl(f"{prefix}dispatcher:d1") <= 10


def test_two_dispatchers_share_the_requests(dispatchers, redis_addr, prefix):
    """Two copies consume the same group: each routes a part, none twice;
    each keeps its own split, so the total is within two of the ratio."""
    r = connect(redis_addr)
    dispatchers("d1", "--think-ratio", "0.3")
    dispatchers("d2", "--think-ratio", "0.3")
    n = 2000
    jobs = [{"id": f"s{i}", "prompt_ids": [1]} for i in range(n)]
    for k in range(0, n, 50):  # small bursts, so both get some
        send_many(r, prefix, jobs[k:k + 50])
        time.sleep(0.002)
    wait_handled(r, prefix, n)
    think, fast = pool_jobs(r, prefix, "think"), pool_jobs(r, prefix, "fast")
    ids = [j["id"] for j in think + fast]
    assert len(ids) == n and len(set(ids)) == n
    assert 598 <= len(think) <= 602, len(think)
    h1 = wait_hb(r, prefix, "d1", lambda h: True)
    h2 = wait_hb(r, prefix, "d2", lambda h: True)
    deadline = time.time() + 5
    while sum(h1["routed"].values()) + sum(h2["routed"].values()) < n:
        assert time.time() < deadline
        time.sleep(0.1)
        h1, h2 = heartbeat(r, prefix, "d1"), heartbeat(r, prefix, "d2")
    assert sum(h1["routed"].values()) > 0 and sum(h2["routed"].values()) > 0


def test_modes_switches_rules_and_pools(dispatchers, redis_addr, prefix):
    dispatchers("d1", "--think-ratio", "0", "--pools", "fast,think,batch",
                "--think-rules", r"(?i)\bprove\b")
    r = connect(redis_addr)

    def user(text, **kw):
        return {"messages": [{"role": "user", "content": text}], **kw}

    cases = [  # (job, pool, forwarded mode)
        (user("hi"), "fast", "no_think"),
        (user("hi", mode="auto"), "fast", "no_think"),
        (user("hi", mode="think"), "think", "think"),
        (user("hi /think", mode="no_think"), "fast", "no_think"),   # explicit beats the switch
        (user("hi /think"), "think", "think"),                       # soft switch
        (user("hi /think then /no_think"), "fast", "no_think"),      # the last one wins
        (user("/thinking is not a switch"), "fast", "no_think"),
        (user("Prove that 7 is prime"), "think", "think"),           # rule
        (user("prove it /no_think"), "fast", "no_think"),            # the switch beats the rule
        ({"prompt": "please PROVE this"}, "think", "think"),         # rules see prompts too
        ({"prompt": "raw /think"}, "fast", "no_think"),              # but no switch in raw text
        (user("prove", pool="batch"), "batch", "no_think"),          # a named pool wins
        (user("hi", pool="think", mode="no_think"), "think", "no_think"),
        ({"prompt_ids": [5], "mode": "think"}, "think", "think"),
    ]
    for i, (job, _, _) in enumerate(cases):
        send(r, prefix, {"id": f"m{i}", **job})
    deadline = time.time() + 20
    while sum(r.xlen(f"{prefix}jobs:{p}") for p in ("fast", "think", "batch")) < len(cases):
        assert time.time() < deadline
        time.sleep(0.02)
    where = {}
    for pool in ("fast", "think", "batch"):
        for j in pool_jobs(r, prefix, pool):
            where[j["id"]] = (pool, j["mode"])
    for i, (job, pool, mode) in enumerate(cases):
        assert where[f"m{i}"] == (pool, mode), (job, where[f"m{i}"])
    hb = wait_hb(r, prefix, "d1", lambda h: sum(h["routed"].values()) == len(cases))
    assert hb["auto_routed"] == {"fast": 4, "think": 2, "batch": 0}  # ratio + rule decisions


def test_adaptive_shift_and_return(dispatchers, redis_addr, prefix):
    r = connect(redis_addr)
    dispatchers("d1", "--think-ratio", "0.5", "--adaptive", "--adaptive-wait-ms", "300",
                "--adaptive-min-ratio", "0", "--adaptive-max-ratio", "1")
    think_key = f"{prefix}jobs:think"
    # a backlog on think that no worker takes
    p = r.pipeline(transaction=False)
    for i in range(50):
        p.xadd(think_key, {"job": json.dumps({"id": f"bl{i}", "prompt_ids": [1]})})
    p.execute()
    hb = wait_hb(r, prefix, "d1", lambda h: h["think_ratio_effective"] == 0)
    assert hb["think_ratio"] == 0.5 and hb["adaptive"] is True
    assert hb["pool_waiting"]["think"] == 50 and hb["pool_wait_ms"]["think"] > 300
    send_many(r, prefix, [{"id": f"x{i}", "prompt_ids": [2]} for i in range(100)])
    wait_handled(r, prefix, 150)
    assert r.xlen(think_key) == 50  # all 100 auto requests went to fast
    assert r.xlen(f"{prefix}jobs:fast") == 100
    # the backlog clears (a worker takes and acknowledges it): the ratio returns
    got = r.xreadgroup("workers", "fake-worker", {think_key: ">"}, count=1000)
    ids = [eid for eid, _ in got[0][1]]
    assert len(ids) == 50
    r.xack(think_key, "workers", *ids)
    wait_hb(r, prefix, "d1", lambda h: h["think_ratio_effective"] == 0.5)
    send_many(r, prefix, [{"id": f"y{i}", "prompt_ids": [3]} for i in range(100)])
    wait_handled(r, prefix, 250)
    assert r.xlen(think_key) - 50 == 50  # half of the new ones
    # the other way: fast backed up -> auto requests move to think (max 1).
    # First a worker takes everything forwarded so far.
    for pool in ("fast", "think"):
        r.xreadgroup("workers", "fake-worker", {f"{prefix}jobs:{pool}": ">"}, count=10000)
    p = r.pipeline(transaction=False)
    for i in range(20):
        p.xadd(f"{prefix}jobs:fast", {"job": json.dumps({"id": f"fb{i}", "prompt_ids": [1]})})
    p.execute()
    wait_hb(r, prefix, "d1", lambda h: h["think_ratio_effective"] == 1)
    # deleting the backlog clears it too (the lag is then counted by XRANGE)
    fast_ids = [eid for eid, f in r.xrange(f"{prefix}jobs:fast")
                if json.loads(f["job"])["id"].startswith("fb")]
    r.xdel(f"{prefix}jobs:fast", *fast_ids)
    hb = wait_hb(r, prefix, "d1", lambda h: h["think_ratio_effective"] == 0.5)
    assert hb["pool_waiting"] == {"fast": 0, "think": 0}


def test_backpressure_overloaded(dispatchers, redis_addr, prefix, event_validator):
    r = connect(redis_addr)
    dispatchers("d1", "--max-waiting", "5", "--retry-after-ms", "1234", "--think-ratio", "0")
    p = r.pipeline(transaction=False)
    for i in range(5):
        p.xadd(f"{prefix}jobs:fast", {"job": json.dumps({"id": f"bl{i}", "prompt_ids": [1]})})
    p.execute()
    time.sleep(0.3)
    send(r, prefix, {"id": "o1", "prompt_ids": [1, 2], "metadata": {"k": 1}})
    evs = events(r, prefix, "o1")
    _, done = check_stream(evs, event_validator)
    err = evs[0][1]
    assert err["type"] == "error" and err["code"] == "OVERLOADED"
    assert err["retry_after_ms"] == 1234 and "fast" in err["message"]
    assert done["finish_reason"] == "error" and done["metadata"] == {"k": 1}
    assert r.xlen(f"{prefix}jobs:fast") == 5  # never forwarded
    assert r.ttl(f"{prefix}out:o1") > 0
    # the think pool is not full: a think request still goes through
    send(r, prefix, {"id": "t1", "prompt_ids": [1, 2], "mode": "think"})
    wait_handled(r, prefix, 6)
    assert [j["id"] for j in pool_jobs(r, prefix, "think")] == ["t1"]
    wait_hb(r, prefix, "d1", lambda h: h["overloaded"] == 1 and
            h["routed"] == {"fast": 0, "think": 1})
    assert r.xlen(f"{prefix}dead") == 0  # overload is not a bad job


def test_malformed_requests(dispatchers, redis_addr, prefix, event_validator, dead_validator):
    r = connect(redis_addr)
    dispatchers("d1")
    corpus = json.loads((ROOT_SCHEMAS / "examples" / "jobs-invalid.json").read_text())
    cases = [(c["job"], c["code"]) for c in corpus[:60]]
    cases += [('{"prompt_ids":[1,2],"pool":"nope"}', "UNKNOWN_POOL"),
              ('{"prompt_ids":[1],"mode":"fast"}', "BAD_VALUE"),
              ('{"id":"named","prompt_ids":[1],"temperature":3}', "OUT_OF_RANGE")]
    sent = [(send(r, prefix, raw=raw), raw, code) for raw, code in cases]
    r.xadd(f"{prefix}requests", {"notjob": "x"})  # BAD_ENTRY
    send(r, prefix, {"id": "good", "prompt_ids": [1]})
    deadline = time.time() + 20
    while r.xlen(f"{prefix}dead") < len(cases) + 1:
        assert time.time() < deadline, r.xlen(f"{prefix}dead")
        time.sleep(0.05)
    wait_handled(r, prefix, 1)
    by_entry = {}
    for _, f in r.xrange(f"{prefix}dead"):
        dl = json.loads(f["dead"])
        dead_validator.validate(dl)
        by_entry[dl["entry_id"]] = dl
    assert len(by_entry) == len(cases) + 1
    for entry, raw, code in sent:
        dl = by_entry[entry]
        assert dl["job"] == raw and dl["code"] == code and dl["worker"] == "d1"
        assert dl["pool"] == "requests"
        # the client hears about it on its id (or r<entry ID> when it gave none)
        jid = dl["id"]
        if jid:
            evs = events(r, prefix, jid, timeout=5)
            check_stream(evs, event_validator)
            assert evs[0][1]["code"] == code and evs[-1][1]["finish_reason"] == "error"
    assert by_entry[sent[-1][0]]["id"] == "named"
    # never forwarded: only the good one is on a pool
    assert [j["id"] for j in pool_jobs(r, prefix, "fast") + pool_jobs(r, prefix, "think")] == ["good"]
    wait_hb(r, prefix, "d1", lambda h: h["invalid"] == len(cases) + 1 and
            sum(h["routed"].values()) == 1)


def test_cache_fast_path(dispatchers, workers, redis_addr, prefix, event_validator):
    if not (MODEL / "tokenizer.json").exists():
        pytest.skip("tiny model has no tokenizer")
    r = connect(redis_addr)
    d = dispatchers("d1", "--model", str(MODEL), "--think-ratio", "0")
    assert "fast path on" in d.text()
    w = workers("w1")
    chat = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 10,
            "temperature": 0, "ignore_eos": True}
    text = {"prompt": "once upon", "max_tokens": 6, "seed": 3, "temperature": 0.7}
    send(r, prefix, {**chat, "id": "c1", "metadata": {"n": 1}})
    send(r, prefix, {**text, "id": "p1"})
    first = [events(r, prefix, "c1"), events(r, prefix, "p1")]
    for evs in first:
        _, done = check_stream(evs, event_validator)
        assert done["cached"] is False
    # the worker writes the cache entry with its XACK; wait for both
    deadline = time.time() + 10
    while len(r.keys(f"{prefix}cache:*")) < 2:
        assert time.time() < deadline
        time.sleep(0.05)
    w.stop()
    n_fast = r.xlen(f"{prefix}jobs:fast")
    send(r, prefix, {**chat, "id": "c2", "metadata": {"n": 2}})
    send(r, prefix, {**text, "id": "p2"})
    second = [events(r, prefix, "c2", timeout=10), events(r, prefix, "p2", timeout=10)]
    strip = lambda e: {k: v for k, v in e.items() if k not in ("cached", "timings", "metadata", "request")}
    for a, b in zip(first, second):
        _, done = check_stream(b, event_validator)
        assert done["cached"] is True
        assert [strip(e) for _, e in a] == [strip(e) for _, e in b]
    assert second[0][-1][1]["metadata"] == {"n": 2}
    assert r.xlen(f"{prefix}jobs:fast") == n_fast  # no worker involved
    assert 0 < r.ttl(f"{prefix}out:c2") <= 3600
    # a different mode renders other ids: a miss, forwarded
    send(r, prefix, {**chat, "id": "c3", "mode": "think"})
    wait_handled(r, prefix, n_fast + 1)
    assert [j["id"] for j in pool_jobs(r, prefix, "think")] == ["c3"]
    wait_hb(r, prefix, "d1", lambda h: h["cache_hits"] == 2 and h["cache_misses"] == 3)


def test_kill9_loses_nothing(dispatchers, redis_addr, prefix):
    """Dispatcher A is frozen with requests read but not handled, then
    killed -9; B takes them over with XAUTOCLAIM: every request lands once."""
    r = connect(redis_addr)
    n = 3000
    jobs = [{"id": f"k{i}", "prompt_ids": [1, i % 500]} for i in range(n)]
    for k in range(0, n, 500):
        send_many(r, prefix, jobs[k:k + 500])
    a = dispatchers("dA", "--claim-idle-ms", "1000", "--claim-interval-ms", "100")
    pending = 0
    for _ in range(300):  # freeze it between a read and its EXEC
        a.signal(signal.SIGSTOP)
        pending = r.xpending(f"{prefix}requests", "dispatchers")["pending"]
        if pending:
            # a pipeline already on its way still runs: only entries that
            # stay pending while it is frozen are really stuck
            time.sleep(0.2)
            pending = r.xpending(f"{prefix}requests", "dispatchers")["pending"]
            if pending:
                break
        a.signal(signal.SIGCONT)
        time.sleep(0.002)
    assert pending > 0, "never caught the dispatcher mid-round"
    a.signal(signal.SIGKILL)
    a.wait()
    b = dispatchers("dB", "--claim-idle-ms", "1000", "--claim-interval-ms", "100")
    wait_handled(r, prefix, n, timeout=60)
    got = [j["id"] for p in ("fast", "think") for j in pool_jobs(r, prefix, p)]
    assert len(got) == n and len(set(got)) == n
    # B routed at least what A held when it died
    wait_hb(r, prefix, "dB", lambda h: sum(h["routed"].values()) >= pending)
    assert "took over" in b.text()


def test_redis_killed_mid_routing(dispatchers, prefix, tmp_path):
    """Redis (appendfsync always) is killed -9 while the dispatcher routes
    and started again: the dispatcher reconnects, re-reads what it held,
    and every request lands exactly once."""
    srv = RedisServer(tmp_path / "redis-aof", aof=True)
    try:
        r = connect(srv.addr)
        d = dispatchers("d1", addr=srv.addr)
        n = 4000
        jobs = [{"id": f"q{i}", "prompt_ids": [1, i % 500]} for i in range(n)]
        send_many(r, prefix, jobs)
        deadline = time.time() + 20
        while r.xlen(f"{prefix}jobs:fast") + r.xlen(f"{prefix}jobs:think") < 200:
            assert time.time() < deadline
            time.sleep(0.002)
        srv.stop(kill=True)
        time.sleep(0.5)
        srv.start()
        r = connect(srv.addr)
        assert r.xlen(f"{prefix}jobs:fast") + r.xlen(f"{prefix}jobs:think") < n  # mid-way
        wait_handled(r, prefix, n, timeout=60)
        got = [j["id"] for p in ("fast", "think") for j in pool_jobs(r, prefix, p)]
        assert len(got) == n and len(set(got)) == n
        assert "connected" in d.text()
    finally:
        srv.stop()


def test_sighup_reload_and_sigterm(dispatchers, redis_addr, prefix, tmp_path):
    r = connect(redis_addr)
    conf = tmp_path / "d.conf"
    conf.write_text("think_ratio = 0.2;\nthink_rules = [];\n")
    d = dispatchers("d1", "-c", str(conf))
    assert heartbeat(r, prefix, "d1")["think_ratio"] == 0.2
    conf.write_text("think_ratio = 0.6;\nthink_rules = [\"urgent\"];\n")
    d.signal(signal.SIGHUP)
    wait_hb(r, prefix, "d1", lambda h: h["think_ratio"] == 0.6)
    send(r, prefix, {"id": "u1", "prompt": "urgent: please"})
    wait_handled(r, prefix, 1)
    assert [j["id"] for j in pool_jobs(r, prefix, "think")] == ["u1"]
    # a bad reload keeps the running settings
    conf.write_text("think_ratio = 7;\n")
    d.signal(signal.SIGHUP)
    deadline = time.time() + 5
    while "keeping the old settings" not in d.text():
        assert time.time() < deadline
        time.sleep(0.05)
    assert heartbeat(r, prefix, "d1")["think_ratio"] == 0.6
    d.signal(signal.SIGTERM)
    assert d.wait(10) == 0
    assert "stopping" in d.text()
    # a clean exit with nothing pending leaves no consumer behind
    assert r.xinfo_consumers(f"{prefix}requests", "dispatchers") == []


def test_systemd_notify(redis_addr, prefix, tmp_path):
    """READY=1 once connected, WATCHDOG=1 pings at half of WATCHDOG_USEC
    (even while idle in a 5 s blocking read), STOPPING=1 on SIGTERM: read
    from a NOTIFY_SOCKET of our own."""
    import os
    import socket
    import subprocess
    from conftest import DISPATCHER
    if not DISPATCHER.exists():
        pytest.skip("dispatcher not built")
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10)
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="200000")
    log = open(tmp_path / "d.log", "w")
    p = subprocess.Popen([str(DISPATCHER), "--redis", redis_addr, "--prefix", prefix,
                          "--name", "sd", "--http-port", "0", "--block-ms", "5000",
                          "--heartbeat-interval-ms", "5000", "--heartbeat-ttl-s", "10"],
                         env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        got = []
        while "READY=1" not in got:
            got.append(sock.recv(4096).decode())
        t0 = time.time()
        while got.count("WATCHDOG=1") < 5:
            got.append(sock.recv(4096).decode())
        assert time.time() - t0 < 1.5, got  # 5 pings at ~100 ms, not one per blocked read
        p.terminate()
        assert p.wait(10) == 0
        rest = []
        sock.settimeout(1)
        try:
            while True:
                rest.append(sock.recv(4096).decode())
        except socket.timeout:
            pass
        assert "STOPPING=1" in rest, rest
    finally:
        if p.poll() is None:
            p.kill()
        log.close()
        sock.close()
