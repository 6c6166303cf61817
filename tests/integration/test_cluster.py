"""Redis Cluster (issue 19): workers, the dispatcher and the CLI against a
real local 3-master + 3-replica cluster (redis-server --cluster-enabled yes
on free loopback ports, joined by redis-cli --cluster create; the fixture
starts and kills it per test), given as a seed list --redis a,b,c.

  - the protocol path: jobs through the dispatcher and straight to a pool,
    events on out:{id}, cancellation by cancel:{id}, a result-cache hit,
    and the per-request keys spread over more than one master;
  - kill -9 of a worker mid-generation: the other one resumes, token-exact;
  - CLUSTER FAILOVER on the replica of the master that holds the pool
    stream, mid-run: no job lost, no event duplicated, tokens exact.

Run with Debian's interpreter: /usr/bin/python3 -m pytest tests/integration
"""
import json
import signal
import subprocess
import time

import pytest
from conftest import (CLI, MODEL, check_stream, greedy_jobs, pool_shards, reference, stream_events,
                      tap)

FAST_CLAIM = ["--claim-idle-ms", "1000", "--claim-interval-ms", "200", "--lease-renew-ms", "200"]


def out_key(prefix, jid):
    """The cluster layout: a request's keys carry its id as hash tag."""
    return f"{prefix}out:{{{jid}}}"


def qkey(prefix, rest):
    """The cluster layout of the queue keys: one slot per prefix."""
    return f"{{{prefix}}}{rest}"


def events(rc, prefix, jid, timeout=60):
    """Every event of jid up to done, read from out:{jid}."""
    return stream_events(rc, out_key(prefix, jid), timeout)


def wait_started(rc, prefix, jobs, timeout=60):
    """Until every job has published a few events: mid-generation."""
    deadline = time.time() + timeout
    while not all(rc.xlen(out_key(prefix, j["id"])) >= 3 for j in jobs):
        assert time.time() < deadline, "jobs never started"
        time.sleep(0.02)


def submit(rc, prefix, job, pool="fast"):
    return rc.xadd(qkey(prefix, f"jobs:{pool}"), {"job": json.dumps(job)})


def master_of(cluster, key):
    """The port of the master that serves key's slot."""
    return cluster.master_of(key)


def test_protocol_on_cluster(redis_cluster, workers, dispatchers, prefix, tmp_path,
                             event_validator):
    rc = redis_cluster.client()
    tap(rc, *pool_shards(prefix))  # keeps the pool's entries (every shard), counted by stats below
    w = workers("w1", addr=redis_cluster.seeds)
    d = dispatchers("d1", "--model", str(MODEL), "--think-ratio", "0", addr=redis_cluster.seeds)
    assert "fast path on" in d.text()

    # greedy jobs, half through the dispatcher, half straight to the pool
    jobs = greedy_jobs(8, seed=19, tag="p")
    for i, j in enumerate(jobs):
        if i % 2:
            submit(rc, prefix, j)
        else:
            rc.xadd(qkey(prefix, "requests"), {"job": json.dumps(j)})
    ref = reference(jobs, tmp_path)
    for j, want in zip(jobs, ref):
        toks, done = check_stream(events(rc, prefix, j["id"]), event_validator)
        assert toks == want, j["id"]
        assert done["finish_reason"] == "length"
    # today's untagged keys were not written
    assert not rc.exists(f"{prefix}out:{jobs[0]['id']}")
    # the per-request keys spread over the shards
    owners = {master_of(redis_cluster, out_key(prefix, j["id"])) for j in jobs}
    assert len(owners) >= 2, owners

    # cancellation: cancel:{id} lands in the slot the worker checks
    long = {"id": "long", "prompt_ids": [1, 2, 3], "max_tokens": 5000, "temperature": 0,
            "ignore_eos": True, "cache": False}
    submit(rc, prefix, long)
    deadline = time.time() + 30
    while rc.xlen(out_key(prefix, "long")) < 3:
        assert time.time() < deadline, "the long job never started"
        time.sleep(0.02)
    subprocess.run([str(CLI), "cancel", "long", "--redis", redis_cluster.seeds,
                    "--prefix", prefix], check=True, timeout=30)
    assert rc.exists(f"{prefix}cancel:{{long}}")
    evs = events(rc, prefix, "long")
    _, done = check_stream(evs, event_validator)
    assert done["finish_reason"] == "cancelled"
    assert len(evs) < 5000

    # a result-cache hit: the worker fills the entry, the dispatcher answers
    chat = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 6,
            "temperature": 0, "ignore_eos": True}
    rc.xadd(qkey(prefix, "requests"), {"job": json.dumps({**chat, "id": "c1"})})
    _, done = check_stream(events(rc, prefix, "c1"), event_validator)
    assert done["cached"] is False
    deadline = time.time() + 10
    while not list(rc.scan_iter(match=f"{prefix}cache:*", target_nodes="primaries")):
        assert time.time() < deadline, "no cache entry written"
        time.sleep(0.05)
    w.stop()
    rc.xadd(qkey(prefix, "requests"), {"job": json.dumps({**chat, "id": "c2"})})
    _, done = check_stream(events(rc, prefix, "c2", timeout=15), event_validator)
    assert done["cached"] is True

    # redlm stats sees the whole cluster (SCAN on every master)
    out = subprocess.run([str(CLI), "stats", "--json", "--redis", redis_cluster.seeds,
                          "--prefix", prefix], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    pools = {p["name"]: p for p in json.loads(out.stdout)["pools"]}
    assert pools["fast"]["key"] == qkey(prefix, "jobs:fast")
    assert pools["fast"]["length"] == 10  # 8 greedy, long, c1 (c2 was a cache hit)
    assert pools["fast"]["shards"] == 3  # summed over the pool's shards (issue 27)


def n_unfinished(rc, prefix, jobs):
    """Jobs whose out stream has no done event yet."""
    n = 0
    for j in jobs:
        last = rc.xrevrange(out_key(prefix, j["id"]), count=1)
        n += not last or json.loads(last[0][1]["event"])["type"] != "done"
    return n


def run_and_check(rc, prefix, jobs, ref, validator, timeout=180):
    """Every job done, seq gapless without repeats, tokens exact."""
    for j, want in zip(jobs, ref):
        evs = events(rc, prefix, j["id"], timeout=timeout)
        seqs = [e["seq"] for _, e in evs]
        assert seqs == list(range(len(evs))), f"{j['id']}: gaps or duplicates {seqs}"
        toks, _ = check_stream(evs, validator)
        assert toks == want, j["id"]


def test_kill9_resume_on_cluster(redis_cluster, workers, prefix, tmp_path, event_validator):
    rc = redis_cluster.client()
    w1 = workers("w1", *FAST_CLAIM, "--max-batch", "6", addr=redis_cluster.seeds)
    # long enough that the kill lands mid-run on a fast, quiet machine too
    jobs = greedy_jobs(6, seed=7, max_tokens=(600, 800), tag="k")
    for j in jobs:
        submit(rc, prefix, j)
    wait_started(rc, prefix, jobs)
    w1.kill(signal.SIGKILL)
    w1.wait()
    assert n_unfinished(rc, prefix, jobs) > 0, "the kill came too late to test resumption"
    workers("w2", *FAST_CLAIM, addr=redis_cluster.seeds)
    ref = reference(jobs, tmp_path)
    run_and_check(rc, prefix, jobs, ref, event_validator)


def test_failover_mid_run(redis_cluster, workers, prefix, tmp_path, event_validator):
    rc = redis_cluster.client()
    w = workers("w1", *FAST_CLAIM, "--max-batch", "8", addr=redis_cluster.seeds)
    # long enough to outlast the failover (WAIT, the vote, the new map)
    first = greedy_jobs(4, seed=11, max_tokens=(2000, 3000), tag="f")
    second = greedy_jobs(4, seed=12, max_tokens=(100, 200), tag="g")
    jobs = first + second
    for j in first:
        submit(rc, prefix, j)
    wait_started(rc, prefix, first)
    # fail over the master of the pool stream (and its consumer group),
    # the worker frozen meanwhile (SIGSTOP): its jobs are then certainly
    # mid-run when it wakes to a changed map, with reads blocked on the old
    # master answered UNBLOCKED and writes answered MOVED (a running worker
    # on a fast machine finished jobs of 3,000 tokens before the vote)
    old = master_of(redis_cluster, qkey(prefix, "jobs:fast"))
    new = redis_cluster.replica_of(old)
    w.signal(signal.SIGSTOP)
    try:
        # WAIT: the replica has every write so far, so the manual failover is
        # the lossless kind (the test checks our client, not Redis's async replication)
        redis_cluster.node(old).execute_command("WAIT", 1, 2000)
        redis_cluster.node(new).execute_command("CLUSTER", "FAILOVER")
        deadline = time.time() + 30
        while redis_cluster.roles().get(new) != "master":
            assert time.time() < deadline, "failover did not happen"
            time.sleep(0.05)
        assert n_unfinished(rc, prefix, first) > 0, "the jobs ended before the failover"
    finally:
        w.signal(signal.SIGCONT)
    redis_cluster.wait_ok()
    while master_of(redis_cluster, qkey(prefix, "jobs:fast")) != new:  # the news spreads
        assert time.time() < deadline, "the slot map never showed the new master"
        time.sleep(0.05)
    for j in second:  # queued on the new master
        submit(redis_cluster.client(), prefix, j)
    ref = reference(jobs, tmp_path)
    run_and_check(redis_cluster.client(), prefix, jobs, ref, event_validator)
    # the worker kept its group on the new master and acknowledged everything
    g = redis_cluster.node(new).xinfo_groups(qkey(prefix, "jobs:fast"))
    assert g and g[0]["pending"] == 0, g
    # the jobs queued after the failover were read from the new master
    assert g[0]["last-delivered-id"] == redis_cluster.node(new).xinfo_stream(
        qkey(prefix, "jobs:fast"))["last-generated-id"]
