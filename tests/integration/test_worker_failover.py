"""Nothing lost: a worker killed with SIGKILL mid-generation, and Redis
restarted (AOF) mid-run. Every job completes, every seq exactly once, and
greedy outputs equal an uninterrupted `redlm run --batch`.

Claim times are short (flags) so that the takeover happens within a
second or two.
"""
import time
import urllib.request

from conftest import (RedisServer, Client, check_stream, free_port, greedy_jobs,
                      kill_mid_generation, reference,
                      run_threads, wait_no_pending)

FAST_CLAIM = ["--claim-idle-ms", "1000", "--claim-interval-ms", "200", "--lease-renew-ms", "200"]


def test_kill9_mid_generation(workers, client, event_validator, tmp_path):
    a = workers("wa", *FAST_CLAIM, "--max-batch", "8")
    port = free_port()
    b = workers("wb", *FAST_CLAIM, "--max-batch", "8", "--http-port", str(port))
    jobs = greedy_jobs(16, seed=21, max_tokens=(150, 250), tag="k")
    ref = reference(jobs, tmp_path)
    for j in jobs:
        client.submit(j)
    key = f"{client.prefix}jobs:fast"
    # kill the victim in the middle of some of its jobs
    kill_mid_generation(client, a, jobs)
    streams = run_threads(lambda j: client.events(j["id"], timeout=60), jobs, 16)
    for job, evs, want in zip(jobs, streams, ref):
        tokens, done = check_stream(evs, event_validator)
        assert tokens == want, job["id"]
        assert done["finish_reason"] == "length"
        assert done["usage"]["completion_tokens"] == job["max_tokens"]
    assert client.r.xpending(key, "workers")["pending"] == 0
    assert "reclaimed entry" in b.log_path.read_text()
    # a resumed job's first gap is measured from its resumption: every
    # inter-token gap the survivor saw is under a minute
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    v = {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
         if l.startswith("redlm_inter_token_latency_seconds_")}
    mn = 'model_name="tiny-qwen3-a"'
    assert v[f'redlm_inter_token_latency_seconds_bucket{{{mn},le="40"}}'] == \
        v[f"redlm_inter_token_latency_seconds_count{{{mn}}}"] > 0


def test_a_slow_claim_hands_back_what_it_cannot_take_in_time(workers, redis_addr, prefix, client,
                                                              event_validator, tmp_path):
    """A dead consumer's 24 pending jobs, taken over through a Redis 40 ms
    away (tests/bench/latency_proxy.py): each takes a few round trips, so
    the batch would outlast claim_idle_ms (1 s), and the other worker's
    next claim would take the tail from the first before it got to it (the
    first then takes it back, the second is fenced: deliveries that count
    toward max_deliveries on workers that never died). A claim stops at a
    quarter of claim_idle_ms and hands the rest back: no job is taken over
    from a live worker, none dead-lettered, all complete with the reference
    tokens."""
    from latency_proxy import LatencyProxy
    host, port = redis_addr.rsplit(":", 1)
    proxy = LatencyProxy((host, int(port)), delay_s=0.02)
    try:
        key = f"{prefix}jobs:fast"
        jobs = greedy_jobs(24, seed=51, max_tokens=(4, 8), tag="sc")
        ref = reference(jobs, tmp_path)
        client.r.xgroup_create(key, "workers", id="0", mkstream=True)
        for j in jobs:
            client.submit(j)
        assert len(client.r.xreadgroup("workers", "ghost", {key: ">"}, count=100)[0][1]) == 24
        # the ghost's entries idle past claim_idle_ms, by Redis's own count
        deadline = time.time() + 30
        while min(e["time_since_delivered"] for e in client.r.xpending_range(
                key, "workers", "-", "+", 100)) < 1100:
            assert time.time() < deadline
            time.sleep(0.05)
        addr = f"127.0.0.1:{proxy.port}"
        wa = workers("wa", *FAST_CLAIM, "--max-batch", "32", addr=addr)
        wb = workers("wb", *FAST_CLAIM, "--max-batch", "32", addr=addr)
        streams = run_threads(lambda j: client.events(j["id"], timeout=120), jobs, 24)
        for job, evs, want in zip(jobs, streams, ref):
            tokens, done = check_stream(evs, event_validator)
            assert tokens == want, job["id"]
            assert done["finish_reason"] == "length", done
        logs = wa.text() + wb.text()
        assert "handed back" in logs, logs  # the claims did stop in time
        for bad in ("another worker holds it now", "its lease was taken over",
                    "TOO_MANY_DELIVERIES"):
            assert bad not in logs, logs
        wait_no_pending(client.r, prefix)
    finally:
        proxy.close()


def test_redis_restart_with_aof(workers, prefix, event_validator, tmp_path):
    srv = RedisServer(tmp_path / "redis-aof", aof=True)
    try:
        client = Client(srv.addr, prefix)
        workers("w1", "--claim-idle-ms", "5000", "--lease-renew-ms", "500", addr=srv.addr)
        workers("w2", "--claim-idle-ms", "5000", "--lease-renew-ms", "500", addr=srv.addr)
        jobs = greedy_jobs(24, seed=33, max_tokens=(100, 200), tag="a")
        ref = reference(jobs, tmp_path)
        for j in jobs[:16]:
            client.submit(j)
        deadline = time.time() + 20
        while time.time() < deadline and client.r.xlen(f"{prefix}out:a0") < 5:
            time.sleep(0.01)
        srv.stop(kill=True)  # appendfsync always: nothing acknowledged is lost
        time.sleep(0.7)
        srv.start()
        for j in jobs[16:]:
            client.submit(j)
        streams = run_threads(lambda j: client.events(j["id"], timeout=60), jobs, 24)
        for job, evs, want in zip(jobs, streams, ref):
            tokens, done = check_stream(evs, event_validator)
            assert tokens == want, job["id"]
            assert done["finish_reason"] == "length"
        wait_no_pending(client.r, prefix)
    finally:
        srv.stop()
