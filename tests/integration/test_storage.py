"""Bounded storage (issue 26): what the queue holds leaves Redis once it is
handled, so memory returns to where it started.

- 2,000 jobs through the dispatcher and a worker (short stream TTLs):
  once their streams expire, Redis's used_memory is within 1 MB of its
  value before them. The dispatcher deletes each requests entry with its
  XACK, the worker each pool entry with its XACK; streams and holder
  records expire stream_ttl_s after done.
- A refused 50 MB job, on the requests stream or straight on a pool,
  leaves nothing but its (bounded) dead letter.
- Dead letters are bounded in bytes (dead_max_mb): every letter is at most
  EV_DEAD_LETTER_MAX bytes and the stream is trimmed to fit.
Each test has its own redis-server, so used_memory is only its own.
"""
import json

import pytest

from conftest import (Dispatcher, RedisServer, Worker, connect, stream_events, wait_for,
                     wait_no_pending)

MB = 1 << 20


@pytest.fixture
def own_redis(tmp_path):
    srv = RedisServer(tmp_path / "redis")
    yield srv
    srv.stop()


def used(r):
    return r.info("memory")["used_memory"]


def settled(r, n_keys):
    """used_memory once the key space is back to n_keys keys."""
    wait_for(lambda: r.dbsize() <= n_keys,
             f"the key space to shrink to {n_keys} keys", timeout=120)
    return used(r)


def start(own_redis, tmp_path, prefix, extra_w=(), extra_d=()):
    d = Dispatcher(own_redis.addr, prefix, "sd", tmp_path, ["--think-ratio", "0", *extra_d])
    w = Worker(own_redis.addr, prefix, "sw", tmp_path,
               ["--max-batch", "64", "--heartbeat-interval-ms", "100", *extra_w])
    return d, w


def job(i, ttl=1, pad=600):
    # metadata pads each job to ~1 KB: it travels with the job and comes
    # back in its done event, so a queue that keeps jobs shows at once
    return json.dumps({"id": f"s{i}", "prompt_ids": [1 + i % 50, 2], "max_tokens": 1,
                       "temperature": 0, "cache": False, "stream_ttl_s": ttl,
                       "metadata": {"pad": "p" * pad}})


def test_2000_jobs_leave_nothing_behind(own_redis, tmp_path, prefix):
    r = connect(own_redis.addr)
    d, w = start(own_redis, tmp_path, prefix)
    try:
        req = f"{prefix}requests"
        # warm: every stream, group and consumer exists before the baseline
        for i in range(20):
            r.xadd(req, {"job": job(10_000 + i)})
        for i in range(20):
            stream_events(r, f"{prefix}out:s{10_000 + i}")
        base_keys = r.dbsize() - 40  # their out:* and own:* expire
        m0 = settled(r, base_keys)
        pipe = r.pipeline(transaction=False)
        for i in range(2000):
            pipe.xadd(req, {"job": job(i)})
        pipe.execute()
        wait_for(lambda: json.loads(r.get(f"{prefix}worker:sw") or "{}").get("jobs_done", 0)
                 >= 2020, "2,020 jobs done", timeout=600)
        wait_no_pending(r, prefix)
        assert r.xlen(req) == 0 and r.xlen(f"{prefix}jobs:fast") == 0
        m1 = settled(r, base_keys)
        assert m1 - m0 <= MB, f"used_memory {m0} before, {m1} after 2,000 jobs"
    finally:
        w.stop()
        d.stop()


def test_refused_50mb_job_leaves_nothing(own_redis, tmp_path, prefix):
    r = connect(own_redis.addr)
    d, w = start(own_redis, tmp_path, prefix)
    try:
        r.xadd(f"{prefix}requests", {"job": job(1)})
        stream_events(r, f"{prefix}out:s1")
        n0 = r.dbsize() - 2
        m0 = settled(r, n0)
        for key in (f"{prefix}requests", f"{prefix}jobs:fast"):
            big = connect(own_redis.addr)  # its query buffer goes with it
            big.xadd(key, {"job": '{"id":"huge","prompt":"' + "x" * (50 * MB) + '"}'})
            big.close()
            wait_for(lambda: r.xlen(key) == 0, f"{key} to empty", timeout=120)
        wait_for(lambda: r.xlen(f"{prefix}dead") == 2, "two dead letters", timeout=60)
        letters = [json.loads(f["dead"]) for _, f in r.xrange(f"{prefix}dead")]
        assert [l["code"] for l in letters] == ["JOB_TOO_LARGE", "JOB_TOO_LARGE"]
        assert all(l["job_truncated"] and l["job_bytes"] > 50 * MB for l in letters)
        # the two refusals answered where the client reads (one id: the
        # second is the first's duplicate or conflict, never a mixed stream)
        evs = stream_events(r, f"{prefix}out:huge", timeout=30)
        assert evs[0][1]["code"] == "JOB_TOO_LARGE"
        m1 = used(r)
        assert m1 - m0 <= MB, f"used_memory {m0} before, {m1} after the refused 50 MB jobs"
        wait_no_pending(r, prefix)
    finally:
        w.stop()
        d.stop()


def test_dead_letters_bounded_in_bytes(own_redis, tmp_path, prefix):
    """dead_max_mb 1: 300 refusals of 16 KB jobs made of control characters
    (each escaped to 6 bytes in JSON) keep the dead-letter stream near
    1 MiB, every letter at most 20 KiB."""
    r = connect(own_redis.addr)
    w = Worker(own_redis.addr, prefix, "dw", tmp_path, ["--dead-max-mb", "1"])
    try:
        raw = '{"id":"d","prompt":"' + "\x01" * 16000 + '"}'
        pipe = r.pipeline(transaction=False)
        for _ in range(300):
            pipe.xadd(f"{prefix}jobs:fast", {"job": raw})
        pipe.execute()
        wait_for(lambda: r.xlen(f"{prefix}jobs:fast") == 0, "the refusals", timeout=120)
        for _, f in r.xrange(f"{prefix}dead"):
            assert len(f["dead"].encode()) <= 20480
        size = r.memory_usage(f"{prefix}dead", samples=0)
        assert size <= 1.25 * MB, f"dead letters hold {size} bytes"
        assert r.xlen(f"{prefix}dead") <= 1 * MB // 20480 + 1
    finally:
        w.stop()
