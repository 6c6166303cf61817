#!/usr/bin/python3
"""Memory pressure (issue 26 point 3), against real processes this script
starts and stops: two redlm-workers (the sim backend) on a Redis whose
`maxmemory` (noeviction) is set, under load, to a little more than it
already holds, and more jobs than that memory can take.

  /usr/bin/python3 tests/bench/attack_memory.py [--redis HOST:PORT] [--jobs 600]

Until the first OOM refusal (INFO errorstats) and a job given up (the
workers' /metrics), nothing frees memory; then a reader reads every stream
to its done and DELs it, as a client that is done with its answer would,
and the workers must go on. Redis is at its limit again and again while
the reader catches up.

run(redis_addr, build, workdir) -> dict is what tests/bench/attacks.py
calls; the counters it returns, each of which must be 0:
  jobs_lost        jobs whose stream has no done when the run ends
  gaps             streams whose seqs skip or repeat, whose entry IDs are
                   not 0-<seq+1>, that carry fewer or more tokens than
                   max_tokens, or whose done's usage.completion_tokens
                   differs from the tokens delivered
  mixed_streams    streams with events after done, or two done events
  wrong_submitter  streams whose first event names another request
  honest_refused   jobs answered with an error event
and extras: the OOM refusals Redis counted, the workers' out-of-memory
episodes and jobs given up (left pending, resumed), the seconds it took.
"""
import argparse
import hashlib
import json
import pathlib
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import redis

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))
from local_cluster import free_port, stop_process, wait_ping  # noqa: E402

TOKENIZER = ROOT / "engine" / "tokenizers" / "qwen3"
PREFIX = "mem:"


def metrics(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)\{model_name=\"[^\"]*\"\} (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def oom_refusals(r):
    v = r.info("errorstats").get("errorstat_OOM", 0)
    if isinstance(v, dict):
        return int(v.get("count", 0))
    return int(str(v).split("=")[-1]) if v else 0


def wait_for(what, fn, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if fn():
            return
        time.sleep(0.02)
    raise RuntimeError(f"timed out waiting for {what}")


def run(redis_addr, build, workdir, n_jobs=600):
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    host, port = redis_addr.rsplit(":", 1)
    r = redis.Redis(host=host, port=int(port), decode_responses=True)
    t0 = time.time()
    rnd = random.Random(26)
    sent = {}  # id -> (entry, sha256, max_tokens)
    for i in range(n_jobs):
        jid = f"m{i}"
        n = rnd.randint(30, 60)
        text = json.dumps({"id": jid, "prompt_ids": [rnd.randrange(0, 736) for _ in range(8)],
                           "max_tokens": n, "temperature": 0, "ignore_eos": True,
                           "cache": False, "stream_ttl_s": 600})
        entry = r.xadd(f"{PREFIX}jobs:fast", {"job": text})
        sent[jid] = (entry, hashlib.sha256(text.encode()).hexdigest(), n)
    ports = [free_port(), free_port()]
    procs = []
    try:
        for i, hp in enumerate(ports):
            log = open(workdir / f"worker-m{i}.log", "w")
            procs.append(subprocess.Popen(
                [str(pathlib.Path(build) / "redlm-worker"), "--redis", redis_addr,
                 "--backend", "sim", "--sim-profile", "h200", "--sim-model", "qwen3-14b",
                 "--model", str(TOKENIZER), "--no-result-cache", "--prefix", PREFIX,
                 "--pools", "fast", "--name", f"m{i}", "--threads", "1",
                 "--max-batch", "8", "--publish-buffer-kb", "1", "--http-port", str(hp),
                 "--block-ms", "100", "--claim-idle-ms", "1000", "--claim-interval-ms", "200",
                 "--lease-renew-ms", "200"], stdout=log, stderr=subprocess.STDOUT))
        for i in range(len(ports)):
            wait_for("worker ready", lambda i=i: "ready:" in (workdir / f"worker-m{i}.log").read_text())
        base = r.info("memory")["used_memory"]
        wait_for("streams written", lambda: r.info("memory")["used_memory"] - base > 600 * 1024)
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", str(r.info("memory")["used_memory"] + 300 * 1024))
        wait_for("OOM refusals", lambda: oom_refusals(r) > 0)
        wait_for("a job given up", lambda: sum(metrics(p).get("redlm_jobs_given_up_total", 0)
                                               for p in ports) >= 1)
        # the reader: each stream read to its done, then deleted
        last = {f"{PREFIX}out:{i}": "0-0" for i in sent}
        evs = {k: [] for k in last}
        deadline = time.time() + 300
        while last and time.time() < deadline:
            for key, entries in r.xread(dict(last), block=200, count=1000) or []:
                for eid, f in entries:
                    evs[key].append((eid, json.loads(f["event"])))
                    last[key] = eid
                if evs[key][-1][1]["type"] == "done":
                    r.delete(key, key.replace(f"{PREFIX}out:", f"{PREFIX}own:", 1))
                    del last[key]
        c = {"jobs_lost": 0, "gaps": 0, "mixed_streams": 0, "wrong_submitter": 0,
             "honest_refused": 0}
        for jid, (entry, sha, n) in sent.items():
            es = evs[f"{PREFIX}out:{jid}"]
            dones = [e for _, e in es if e["type"] == "done"]
            if not dones:
                c["jobs_lost"] += 1
                continue
            if len(dones) > 1 or es[-1][1]["type"] != "done":
                c["mixed_streams"] += 1
            if es[0][1].get("request") != {"entry": entry, "job_sha256": sha}:
                c["wrong_submitter"] += 1
            if any(e["type"] == "error" for _, e in es):
                c["honest_refused"] += 1
            toks = sum(len(e.get("token_ids", [])) for _, e in es if e["type"] == "delta")
            if [e["seq"] for _, e in es] != list(range(len(es))) or \
                    [eid for eid, _ in es] != [f"0-{k + 1}" for k in range(len(es))] or \
                    toks != n or dones[-1]["usage"]["completion_tokens"] != toks:
                c["gaps"] += 1
        ms = [metrics(p) for p in ports]
        c["oom_refusals"] = oom_refusals(r)
        c["oom_episodes"] = int(sum(m.get("redlm_redis_oom_total", 0) for m in ms))
        c["jobs_given_up"] = int(sum(m.get("redlm_jobs_given_up_total", 0) for m in ms))
        c["jobs"] = n_jobs
        c["seconds"] = round(time.time() - t0, 1)
        return c
    finally:
        for p in procs:
            stop_process(p, 30)
        try:
            r.config_set("maxmemory", "0")
        except redis.exceptions.RedisError:
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis", help="HOST:PORT of a redis-server to use (default: one of ours)")
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--jobs", type=int, default=600)
    args = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="attack-memory-"))
    own = None
    try:
        addr = args.redis
        if not addr:
            port = free_port()
            own = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                    "--dir", str(work), "--save", "", "--appendonly", "no"],
                                   stdout=subprocess.DEVNULL)
            wait_ping(port)
            addr = f"127.0.0.1:{port}"
        res = run(addr, args.build, work, args.jobs)
        width = max(len(k) for k in res)
        for k, v in res.items():
            print(f"{k:<{width}}  {v}")
        return 1 if any(res[k] for k in ("jobs_lost", "gaps", "mixed_streams",
                                          "wrong_submitter", "honest_refused")) else 0
    finally:
        if own:
            own.terminate()
            own.wait(10)
        print(f"logs in {work}")


if __name__ == "__main__":
    sys.exit(main())
