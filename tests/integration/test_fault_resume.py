"""Token-exact resumption under injected faults (issue 14).

Real processes against a real redis-server with appendonly + appendfsync
always: two CPU workers share a mix of greedy, seeded sampled (temperature
with top-p, top-k, min-p) and penalised (frequency, presence, repetition)
jobs (and unseeded sampled ones, whose seed the worker derives from id and
entry ID), and one fault is injected per test:

  - kill -9 of the worker holding jobs in mid-generation;
  - a Redis restart that lasts longer than claim_idle_ms, with one worker
    stalled (SIGSTOP) through it, so the other reclaims its entries while
    it still runs them and both write the same streams;
  - a drain timeout: SIGTERM with --drain-timeout-s 0, which leaves the
    worker's jobs pending for the other one to resume.

Every job must end with done (0 lost), its seqs must run 0..n without a hole
(0 gaps) or a repeat (0 duplicates), and its token ids must equal an
uninterrupted `redlm run --batch` of the same jobs (0 token mismatches).
Each test also checks that the fault really hit non-greedy jobs in the
middle (a resume after > 0 published tokens), so it cannot pass by luck.
Before the fix (fresh RNG stream on resume, earlier output counted as
prompt by the penalties) the kill -9 and drain tests fail on exactly the
resumed sampled and penalised jobs.
"""
import json
import random
import re
import signal
import subprocess
import time
import uuid

import pytest

from conftest import (CLI, MODEL, Client, RedisServer, held_mid_generation, run_threads,
                      wait_no_pending)

FAST_CLAIM = ["--claim-idle-ms", "1000", "--claim-interval-ms", "200", "--lease-renew-ms", "200",
              "--max-batch", "6"]

# (name, sampling fields); every job spells out every field, so the worker
# (protocol defaults) and `redlm run --batch` (engine defaults) run the same
KINDS = [
    ("greedy", {"temperature": 0}),
    ("top_p", {"temperature": 0.9, "top_p": 0.9}),
    ("top_k", {"temperature": 0.9, "top_k": 20}),
    ("min_p", {"temperature": 1.0, "min_p": 0.05}),
    ("frequency", {"temperature": 0, "frequency_penalty": 0.8}),
    ("presence", {"temperature": 0.7, "presence_penalty": 1.2}),
    ("repetition", {"temperature": 0.8, "repetition_penalty": 1.3}),
    ("all", {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.02,
             "frequency_penalty": 0.4, "presence_penalty": 0.4, "repetition_penalty": 1.1}),
    ("unseeded", {"temperature": 0.9, "top_k": 50}),
]


def derived_seed(job_id, entry_id):
    """The seed the worker gives a job without one (worker/loop.c): FNV-1a
    over id, "\\n", pool entry ID, kept to 53 bits."""
    h = 0xcbf29ce484222325
    for b in job_id.encode() + b"\n" + entry_id.encode():
        h = ((h ^ b) * 0x100000001b3) & (2**64 - 1)
    return h & (2**53 - 1)
NEUTRAL = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "frequency_penalty": 0.0,
           "presence_penalty": 0.0, "repetition_penalty": 1.0}


def mixed_jobs(n, seed, tag, max_tokens=(120, 200)):
    rnd = random.Random(seed)
    jobs = []
    for i in range(n):
        kind, fields = KINDS[i % len(KINDS)]
        j = {"id": f"{tag}{i}", "prompt_ids": [rnd.randrange(0, 736)
                                              for _ in range(rnd.randint(4, 24))],
             "max_tokens": rnd.randint(*max_tokens), "ignore_eos": True, "cache": False,
             "seed": rnd.randrange(1 << 40), **NEUTRAL, **fields}
        if kind == "unseeded":
            del j["seed"]
        jobs.append((kind, j))
    return jobs


def plan_entries(jobs):
    """The pool entry ID each job will be XADDed under (submit_all), chosen
    beforehand so that the reference can give an unseeded job the seed the
    worker will derive."""
    t = int(time.time() * 1000)
    return {j["id"]: f"{t}-{i + 1}" for i, (_, j) in enumerate(jobs)}


def submit_all(client, jobs, entries):
    for _, j in jobs:
        client.r.xadd(f"{client.prefix}jobs:fast", {"job": json.dumps(j)}, id=entries[j["id"]])


def reference(jobs, tmp_path, entries):
    """Token ids of an uninterrupted run of every job, in order; entries
    gives the pool entry IDs the unseeded jobs' seeds derive from."""
    path = tmp_path / f"ref-{uuid.uuid4().hex[:6]}.jsonl"
    keep = ("prompt_ids", "max_tokens", "ignore_eos", *NEUTRAL)
    with open(path, "w") as f:
        for _, j in jobs:
            line = {k: j[k] for k in keep}
            line["seed"] = j["seed"] if "seed" in j else derived_seed(j["id"],
                                                                       entries[j["id"]])
            f.write(json.dumps(line) + "\n")
    out = subprocess.run([str(CLI), "run", "-m", str(MODEL), "--batch", str(path), "--threads",
                          "1"], capture_output=True, text=True, check=True, timeout=300)
    lines = [json.loads(l) for l in out.stdout.splitlines() if l.strip()]
    assert len(lines) == len(jobs)
    return [l["tokens"] for l in lines]


def resume_points(*workers):
    """{job id: published tokens it was resumed after}, from the workers' logs."""
    pts = {}
    for w in workers:
        for m in re.finditer(r"job (\S+): resuming after (\d+) published tokens", w.text()):
            pts[m.group(1)] = max(pts.get(m.group(1), 0), int(m.group(2)))
    return pts


def read_all(client, job_id, timeout):
    """Every event of job_id up to done, as (entry id, event); stops early
    (without done) at the timeout, so a lost job is counted, not raised."""
    return client.events(job_id, timeout, partial=True)


def audit(client, jobs, ref, validator, workers, timeout=90):
    """Counts lost jobs, gaps, duplicates and token mismatches over every
    job, and says which ones, with their kind and where the workers' logs
    say it was resumed."""
    streams = run_threads(lambda kj: read_all(client, kj[1]["id"], timeout), jobs, 16)
    resumed = resume_points(*workers)
    lost, gaps, dups, mism = [], [], [], []
    for (kind, job), evs, want in zip(jobs, streams, ref):
        jid = job["id"]
        for _, ev in evs:
            validator.validate(ev)
        if not evs or evs[-1][1]["type"] != "done":
            lost.append(jid)
            continue
        seqs = [ev["seq"] for _, ev in evs]
        if len(set(seqs)) != len(seqs):
            dups.append(jid)
        if sorted(set(seqs)) != list(range(len(set(seqs)))) or \
                [eid for eid, _ in evs] != [f"0-{s + 1}" for s in seqs]:
            gaps.append(jid)
        tokens = [t for _, ev in evs if ev["type"] == "delta" for t in ev["token_ids"]]
        done = evs[-1][1]
        if tokens != want or done["usage"]["completion_tokens"] != job["max_tokens"]:
            first = next((i for i, (a, b) in enumerate(zip(tokens, want)) if a != b),
                         min(len(tokens), len(want)))
            mism.append(f"{jid} ({kind}, resumed at {resumed.get(jid, '-')}, "
                        f"first difference at {first})")
    report = (f"lost {len(lost)} {lost}, gaps {len(gaps)} {gaps}, duplicates {len(dups)} "
              f"{dups}, token mismatches {len(mism)}/{len(jobs)} {mism}")
    assert not (lost or gaps or dups or mism), report


def hit_mid_generation(jobs, resumed):
    """The fault interrupted at least one non-greedy job after some tokens."""
    kinds = {j["id"]: k for k, j in jobs}
    hit = sorted(f"{jid}={n}" for jid, n in resumed.items()
                 if n > 0 and kinds.get(jid, "greedy") != "greedy")
    assert hit, f"no sampled or penalised job was resumed mid-generation: {resumed}"
    return hit


def wait_streams(client, jobs, victim_log_min=5, who=None, n=3, timeout=20):
    """Waits until n jobs have at least victim_log_min events (and, when who
    is given, that worker holds some entry)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        started = [j["id"] for _, j in jobs
                   if client.r.xlen(f"{client.prefix}out:{j['id']}") >= victim_log_min]
        held = True
        if who:
            held = bool(client.r.xpending_range(f"{client.prefix}jobs:fast", "workers", "-", "+",
                                                100, consumername=who))
        if len(started) >= n and held:
            return
        time.sleep(0.01)


@pytest.fixture
def aof_redis(tmp_path):
    """A redis-server of the test's own with appendonly + appendfsync always."""
    srv = RedisServer(tmp_path / "redis-aof", aof=True)
    yield srv
    srv.stop()


def start_mixed(workers, srv, prefix, tmp_path, seed, tag, a_flags=(), b_flags=(), wait=True):
    """Workers wa and wb on srv, 27 mixed jobs, their uninterrupted
    reference, all submitted, and (with wait) a wait until wa holds some of
    them in mid-generation: (client, wa, wb, jobs, ref)."""
    client = Client(srv.addr, prefix)
    a = workers("wa", *FAST_CLAIM, *a_flags, addr=srv.addr)
    b = workers("wb", *FAST_CLAIM, *b_flags, addr=srv.addr)
    jobs = mixed_jobs(27, seed=seed, tag=tag)
    entries = plan_entries(jobs)
    ref = reference(jobs, tmp_path, entries)
    submit_all(client, jobs, entries)
    if wait:
        wait_streams(client, jobs, who="wa", n=6)
    return client, a, b, jobs, ref


def wait_sampled_mid_generation(client, jobs, who="wa", min_tokens=2, timeout=120):
    """Waits, reading the events in Redis rather than the clock, until who
    holds (as a pending entry of the pool) a non-greedy job that has
    published at least min_tokens tokens, no done, and at least half its
    max_tokens still to go (conftest.held_mid_generation), so that a kill
    that follows at once lands in the middle of that job whatever the load.
    Returns its id; fails the test when no such moment comes within
    timeout."""
    key = f"{client.prefix}jobs:fast"
    sampled = {j["id"] for kind, j in jobs if kind != "greedy"}
    deadline = time.time() + timeout
    seen = {}
    while time.time() < deadline:
        for j in held_mid_generation(client.r, [key], who, lambda i: f"{client.prefix}out:{i}",
                                     min_tokens, seen):
            if j["id"] in sampled:
                return j["id"]
        time.sleep(0.01)
    raise AssertionError(f"{who} never held a sampled job mid-generation within {timeout}s: "
                         f"(tokens, done) of the jobs it held: {seen}")


def test_kill9_mixed_sampling_token_exact(workers, prefix, event_validator, tmp_path, aof_redis):
    client, a, b, jobs, ref = start_mixed(workers, aof_redis, prefix, tmp_path, 1401, "k",
                                          wait=False)
    # the kill moment comes from the events in Redis, not from elapsed
    # time: under load a timed wait could kill wa before any sampled job
    # of its own had a token out, or after they were all done
    victim = wait_sampled_mid_generation(client, jobs)
    a.kill(signal.SIGKILL)
    a.wait(10)
    audit(client, jobs, ref, event_validator, [b])
    hit = hit_mid_generation(jobs, resume_points(b))
    assert any(h.startswith(f"{victim}=") for h in hit), (victim, hit)
    assert client.r.xpending(f"{prefix}jobs:fast", "workers")["pending"] == 0


def test_redis_restart_past_claim_idle_token_exact(workers, prefix, event_validator, tmp_path,
                                                   aof_redis):
    srv = aof_redis
    # wb has room to take all of wa's jobs over besides its own
    client, a, b, jobs, ref = start_mixed(workers, srv, prefix, tmp_path, 1402, "r",
                                          b_flags=("--max-batch", "32"))
    # wa stalls through the outage (a frozen VM, a long page-in), so
    # that its leases are surely past claim_idle_ms when Redis is back
    # and wb takes its entries over while wa still runs them: two
    # workers on one job, both writing its stream
    a.signal(signal.SIGSTOP)
    srv.stop(kill=True)  # appendfsync always: nothing acknowledged is lost
    time.sleep(1.2)      # > claim_idle_ms
    srv.start()
    deadline = time.time() + 10
    while "reclaimed entry" not in b.text() and time.time() < deadline:
        time.sleep(0.02)
    a.signal(signal.SIGCONT)
    assert "reclaimed entry" in b.text()
    audit(client, jobs, ref, event_validator, [a, b])
    hit_mid_generation(jobs, resume_points(b))
    wait_no_pending(client.r, prefix)


def test_drain_timeout_handover_token_exact(workers, prefix, event_validator, tmp_path,
                                            aof_redis):
    client, a, b, jobs, ref = start_mixed(workers, aof_redis, prefix, tmp_path, 1403, "d",
                                          a_flags=("--drain-timeout-s", "0"))
    a.kill(signal.SIGTERM)
    assert a.wait(15) == 0
    assert "drain timeout" in a.text()
    audit(client, jobs, ref, event_validator, [b])
    hit_mid_generation(jobs, resume_points(b))
    assert client.r.xpending(f"{prefix}jobs:fast", "workers")["pending"] == 0
