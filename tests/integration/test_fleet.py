"""The fleet soak, small (issue 19 part 2): a redis-server of the test's own,
2 dispatchers and 6 sim workers (engine/sim/: a modelled H200 serving
Qwen3-14B, real scheduler, KV cache, sampler, worker and protocol) take an
open-loop stream of requests through `redlm:requests`: both modes, prompt ids
and chat messages, short and long outputs, greedy and seeded sampled jobs,
and prompts that repeat (prefix-cache hits). While it runs, a quarter of the
workers (2 of 6) are killed with SIGKILL mid-generation and started again,
one dispatcher is restarted, and Redis itself is stopped (SIGSTOP) for 2 s,
longer than the workers' claim_idle_ms.

Every job must end with done (0 lost), its events must carry seq 0..n at
entry IDs 0-1..0-(n+1) without a repeat (0 duplicated) or a hole (0 out of
order), and its token ids must equal those of the same job in a calm run
before the faults (0 mismatches: resume is token-exact). The test also
checks that the kills really hit jobs in the middle (some job resumed after
published tokens), so it cannot pass by missing them.
tests/bench/bench_fleet.sh is the large version (64 workers, rising rates).
"""
import json
import random
import re
import signal
import threading
import time

import pytest
from conftest import (QWEN3_TOKENIZER, RedisServer, connect, held_mid_generation, pool_shards,
                      run_threads, stream_events)

SIM = ["--backend", "sim", "--sim-profile", "h200", "--sim-model", "qwen3-14b",
       "--model", str(QWEN3_TOKENIZER), "--no-result-cache", "--max-batch", "16",
       "--claim-idle-ms", "1000", "--claim-interval-ms", "200", "--lease-renew-ms", "200"]
N_WORKERS = 6
HOT = [[random.Random(k).randrange(256, 5000) for _ in range(40)] for k in range(3)]


def fleet_jobs(n, tag):
    """n requests; the same n (and the same fields) for every tag."""
    rnd = random.Random(19)
    jobs = []
    for i in range(n):
        mode = "think" if i % 3 == 0 else "no_think"
        j = {"id": f"{tag}{i}", "mode": mode, "max_tokens": rnd.choice([20, 60, 150, 300]),
             "ignore_eos": True}
        if i % 4 == 0:
            j["messages"] = [{"role": "user", "content": f"question {rnd.randrange(10**6)}"}]
        elif i % 4 == 1:
            j["prompt_ids"] = HOT[i % len(HOT)]          # repeated prompt: prefix cache
        else:
            j["prompt_ids"] = [rnd.randrange(256, 5000) for _ in range(rnd.randint(4, 200))]
        if i % 2:
            j.update(temperature=0.8, top_p=0.95, seed=rnd.randrange(1 << 40))
        else:
            j["temperature"] = 0
        jobs.append(j)
    return jobs


def read_all(r, key):
    """The events at key up to done, or what came within 120 s (a lost job)."""
    return stream_events(r, key, 120, partial=True)


def tally(jobs, streams, validator):
    """(tokens per job, lost, duplicated, out of order)."""
    tokens, lost, dup, order = [], 0, 0, 0
    for j, evs in zip(jobs, streams):
        seqs = [ev["seq"] for _, ev in evs]
        dup += len(seqs) - len(set(seqs))
        order += sum(1 for i, (eid, ev) in enumerate(evs)
                     if ev["seq"] != i or eid != f"0-{i + 1}")
        if not evs or evs[-1][1]["type"] != "done":
            lost += 1
        for _, ev in evs:
            validator.validate(ev)
        tokens.append([t for _, ev in evs if ev["type"] == "delta" for t in ev["token_ids"]])
    return tokens, lost, dup, order


def submit_open_loop(r, key, jobs, rate):
    """XADDs jobs to redlm:requests at `rate` per second (open loop: the
    schedule does not wait for answers; a stopped Redis delays the rest)."""
    t0 = time.time()
    for i, j in enumerate(jobs):
        delay = t0 + i / rate - time.time()
        if delay > 0:
            time.sleep(delay)
        r.xadd(key, {"job": json.dumps(j)})


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server this test may stop; set up before (so torn down after)
    the workers and dispatchers that use it."""
    srv = RedisServer(tmp_path / "redis")
    yield srv
    srv.stop()


def test_fleet_faults_token_exact(own_redis, workers, dispatchers, prefix, event_validator):
    srv = own_redis
    addr = srv.addr
    r = connect(addr)
    # the dispatchers know the model: prefix-affine pulling (issue 27, on by
    # default) offers the repeated prompts to their holders, faults and all
    aff = ("--model", str(QWEN3_TOKENIZER))
    ds = [dispatchers("d1", *aff, addr=addr), dispatchers("d2", *aff, addr=addr)]
    ws = [workers(f"w{i}", *SIM, addr=addr) for i in range(N_WORKERS)]
    n = 60

    calm = fleet_jobs(n, "calm")
    submit_open_loop(r, f"{prefix}requests", calm, 40)
    streams = run_threads(lambda j: read_all(connect(addr), f"{prefix}out:{j['id']}"), calm, 16)
    want, lost, dup, order = tally(calm, streams, event_validator)
    assert (lost, dup, order) == (0, 0, 0)
    assert all(len(t) == j["max_tokens"] for j, t in zip(calm, want))

    jobs = fleet_jobs(n, "f")
    sender = threading.Thread(target=submit_open_loop, args=(connect(addr), f"{prefix}requests", jobs, 8))
    sender.start()
    # a quarter of the workers die holding jobs in mid-generation ...
    def keys_of(w):  # the pools and w's offer streams (prefix-affine pulling)
        return [f"{prefix}jobs:{p}{o}" for p in ("fast", "think") for o in ("", f":w:{w.name}")]
    victims = kill_workers_mid_generation(r, ws, 2, keys_of,  # a quarter of 6
                                          lambda i: f"{prefix}out:{i}")
    time.sleep(0.5)
    ws += [workers(f"{w.name}b", *SIM, addr=addr) for w in victims]
    # ... a dispatcher restarts ...
    ds[0].stop()
    ds.append(dispatchers("d1b", *aff, addr=addr))
    # ... and Redis stops for 2 s, past claim_idle_ms
    time.sleep(0.5)
    srv.proc.send_signal(signal.SIGSTOP)
    time.sleep(2.0)
    srv.proc.send_signal(signal.SIGCONT)
    sender.join(60)
    assert not sender.is_alive()

    streams = run_threads(lambda j: read_all(connect(addr), f"{prefix}out:{j['id']}"), jobs, 16)
    got, lost, dup, order = tally(jobs, streams, event_validator)
    mismatched = [j["id"] for j, a, b in zip(jobs, got, want) if a != b]
    assert (lost, dup, order, len(mismatched)) == (0, 0, 0, 0), mismatched
    assert_resumed(ws, "f")
    offers = [json.loads(v)["affinity"]["offers"] for v in
              (r.get(f"{prefix}dispatcher:{d.name}") for d in ds) if v]
    print("affinity offers per dispatcher:", offers)
    assert sum(offers) > 0, "no job was offered: the affinity path did not run"


def kill_workers_mid_generation(r, ws, n, keys_of, out_key, min_tokens=2, timeout=60):
    """SIGKILLs the first n workers of ws seen (as pending entries of
    keys_of(worker), read from Redis rather than the clock) holding a job
    that has published at least min_tokens tokens, no done, and at least
    half its max_tokens still to go, each at once when seen, so that every
    kill lands in the middle of a job however slow the machine is and
    wherever the load went. Returns the workers killed (reaped); fails the
    test when fewer than n such moments come within timeout."""
    deadline = time.time() + timeout
    killed, seen = [], {}
    while len(killed) < n and time.time() < deadline:
        for w in ws:
            if w not in killed and len(killed) < n and \
                    held_mid_generation(r, keys_of(w), w.name, out_key, min_tokens, seen):
                w.kill(signal.SIGKILL)
                killed.append(w)
        time.sleep(0.01)
    for w in killed:
        w.wait(10)
    assert len(killed) == n, (f"only {[w.name for w in killed]} of {n} workers were seen holding "
                              f"a job mid-generation within {timeout}s: (tokens, done) of the jobs "
                              f"held: {seen}")
    return killed


def assert_resumed(ws, tag):
    """Some job of tag was resumed after published tokens: the faults hit
    jobs mid-generation, so a pass cannot come from missing them."""
    resumed = {}
    for w in ws:
        for m in re.finditer(rf"job ({tag}\d+): resuming after (\d+) published tokens", w.text()):
            resumed[m.group(1)] = max(resumed.get(m.group(1), 0), int(m.group(2)))
    print("resumed mid-generation:", sorted(resumed.items()))
    assert any(v > 0 for v in resumed.values()), "no job was resumed mid-generation"


def test_fleet_cluster_kill9_failover(redis_cluster, workers, dispatchers, prefix,
                                      event_validator):
    """The soak small on a 3-master + 3-replica cluster: 4 sim workers and a
    dispatcher on the seed list, 60 jobs calm, then the same 60 open-loop
    through a kill -9 of a quarter of the workers (1 of 4, restarted) and a
    CLUSTER FAILOVER of the master that holds the queue slot ({prefix}
    requests and jobs:*, with their groups) while jobs stream on every
    master. Every stream is read from its key's master: 0 lost, 0 duplicated,
    0 out of order, 0 tokens different from the calm run."""
    c = redis_cluster
    rc = c.client()
    requests = f"{{{prefix}}}requests"
    dispatchers("d1", addr=c.seeds)
    ws = [workers(f"w{i}", *SIM, addr=c.seeds) for i in range(4)]
    n = 60

    def streams_of(jobs):
        return run_threads(lambda j: read_all(c.client(), f"{prefix}out:{{{j['id']}}}"), jobs, 8)

    calm = fleet_jobs(n, "calm")
    submit_open_loop(rc, requests, calm, 40)
    want, lost, dup, order = tally(calm, streams_of(calm), event_validator)
    assert (lost, dup, order) == (0, 0, 0)
    assert all(len(t) == j["max_tokens"] for j, t in zip(calm, want))

    jobs = fleet_jobs(n, "c")
    sender = threading.Thread(target=submit_open_loop, args=(c.client(), requests, jobs, 8))
    sender.start()
    keys = [k for p in ("fast", "think") for k in pool_shards(prefix, p)]
    victim, = kill_workers_mid_generation(rc, ws, 1, lambda w: keys,
                                          lambda i: f"{prefix}out:{{{i}}}")
    time.sleep(0.5)
    ws.append(workers(f"{victim.name}b", *SIM, addr=c.seeds))
    old = c.master_of(requests)
    new = c.failover(old)  # WAIT, then CLUSTER FAILOVER on its replica
    assert sender.is_alive(), "the failover came after the last job was sent: too late to test"
    sender.join(60)
    assert not sender.is_alive()

    got, lost, dup, order = tally(jobs, streams_of(jobs), event_validator)
    mismatched = [j["id"] for j, a, b in zip(jobs, got, want) if a != b]
    assert (lost, dup, order, len(mismatched)) == (0, 0, 0, 0), mismatched
    assert_resumed(ws, "c")
    # the queue slot moved, and its groups on the new master hold nothing
    assert c.master_of(requests) == new
    for pool in ("fast", "think"):
        for g in c.node(new).xinfo_groups(f"{{{prefix}}}jobs:{pool}"):
            assert g["pending"] == 0, (pool, g)
