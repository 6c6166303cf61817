#!/usr/bin/python3
"""A fleet whose workers carry different LoRA adapters (`make bench-lora-fleet`).

One private redis-server, one redlm-dispatcher and N CPU workers on the
tiny model (tests/data/models/tiny-qwen3-a), with a random rank-8 adapter
`a` of it made by `redlm mkmodel --lora-of`. The trace: J greedy jobs, half
naming `a`, half the base model, sent through the dispatcher's requests
stream by C clients in a closed loop (each sends its next job when the last
one ended). Phases, each on freshly started processes and a fresh prefix:

  uniform   every worker holds a: a's jobs go to the pools, as before
  mixed     one worker of N holds a: a's jobs go to its stream, jobs:lora@a,
            which only that worker reads (dispatcher/models.c)
  before    the same fleet on the binaries of --before DIR (a build of the
            tree before adapter streams): a's jobs go to the pools, where
            the workers without a answer MODEL_NOT_FOUND
  handoff   one worker of N holds a, and a's jobs are put straight into the
            pool jobs:fast (as those queued there while every worker held a
            are found by a worker without it that joins): the workers
            without a move them to a's stream (worker/handoff.c)
  runtime   no worker starts with a; while the clients run the base model's
            half of the trace, a control loop loads a through the front door
            (POST /v1/load_lora_adapter, the workers' lora_dirs holding it),
            sends a's jobs, and unloads it, --cycles times: each call's
            latency (to every worker serving it, or none), a's jobs done and
            failed, and the base jobs' TTFT beside the loads, to compare with
            the uniform phase's (common/lorafleet.c, worker/lorart.c)

Per phase: a's jobs done and failed, the base's done and failed, the
jobs moved by hand-off, jobs/s, and client-side TTFT (XADD to the first
delta) p50 / p99 of a's jobs and of the base's. Output: a table on stdout
and $OUT/lora_fleet.json (OUT defaults to /tmp/bench-lora-fleet).
Everything it starts it stops.

  /usr/bin/python3 tests/bench/bench_lora_fleet.py --workers 4 --jobs 160 [--before DIR]
"""
import argparse
import http.client
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time

import redis

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_affinity import Procs, pct  # noqa: E402
from local_cluster import free_port, start_redis, stop_process  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("BUILD", ROOT / "build"))
MODEL = ROOT / "tests/data/models/tiny-qwen3-a"


def make_adapter(out):
    adapter = out / "adapter-a"
    if not (adapter / "adapter_config.json").exists():
        subprocess.run([str(BUILD / "redlm"), "mkmodel", "--lora-of", str(MODEL), "--lora-rank", "8",
                        "--lora-alpha", "16", "--seed", "7", "--out", str(adapter)], check=True,
                       stdout=subprocess.DEVNULL)
    return adapter


def job(i, lora, max_tokens):
    j = {"id": f"j{i}", "prompt_ids": [7 + i % 50, 8, 9, 10 + i % 7, 11], "max_tokens": max_tokens,
         "temperature": 0, "ignore_eos": True, "cache": False, "mode": "no_think"}
    if lora:
        j["model"] = "a"
    return j


def read_job(rc, prefix, jid, t0, timeout=120):
    """(first delta's time - t0, last event) of jid's stream."""
    key, last, ttft = f"{prefix}out:{jid}", "0-0", None
    deadline = time.time() + timeout
    while time.time() < deadline:
        for _, entries in rc.xread({key: last}, block=500, count=1000) or []:
            for eid, f in entries:
                last = eid
                ev = json.loads(f["event"])
                if ev["type"] == "delta" and ttft is None:
                    ttft = time.time() - t0
                if ev["type"] == "done":
                    return ttft, ev
    return ttft, {"type": "done", "finish_reason": "lost"}


def start_fleet(procs, name, build, prefix, addr, r, n_workers, worker_extra, disp_extra):
    """n_workers CPU workers (worker_extra(i): more flags of worker i) and a
    dispatcher, once each has its heartbeat and the dispatcher's model
    table has seen them."""
    for i in range(n_workers):
        procs.start(f"{name}-w{i}", [str(build / "redlm-worker"), "--redis", addr, "--model",
                                     str(MODEL), "--pools", "fast,think", "--name", f"w{i}",
                                     "--threads", "1", "--prefix", prefix, "--http-port", "0",
                                     "--no-result-cache", *worker_extra(i)])
    procs.start(f"{name}-d", [str(build / "redlm-dispatcher"), "--redis", addr, "--prefix", prefix,
                              "--name", "d", "--http-port", "0", *disp_extra])
    deadline = time.time() + 300
    while time.time() < deadline:
        if r.exists(f"{prefix}dispatcher:d") and \
                all(r.exists(f"{prefix}worker:w{i}") for i in range(n_workers)):
            break
        time.sleep(0.1)
    else:
        raise RuntimeError(f"{name}: the fleet did not come up")
    time.sleep(1.5)  # the dispatcher's model table refreshed with every heartbeat


def run_phase(args, name, build, holders, queued, adapter, r, addr, procs):
    prefix = f"bl{name}{int(time.time() * 1000) % 100000}:"
    jobs = [job(i, i % 2 == 0, args.max_tokens) for i in range(args.jobs)]
    start_fleet(procs, name, build, prefix, addr, r, args.workers,
                lambda i: ["--lora", f"a={adapter}"] if i < holders else [], [])
    results, lock = [], threading.Lock()
    todo = list(jobs)
    t_start = time.time()

    def client():
        rc = redis.Redis.from_url(f"redis://{addr}", decode_responses=True)
        while True:
            with lock:
                if not todo:
                    return
                j = todo.pop(0)
            t0 = time.time()
            rc.xadd(f"{prefix}jobs:fast" if queued and "model" in j else f"{prefix}requests",
                    {"job": json.dumps(j)})
            ttft, done = read_job(rc, prefix, j["id"], t0)
            with lock:
                results.append(("model" in j, ttft, done))

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t_start
    moved = 0
    for i in range(args.workers):
        hb = json.loads(r.get(f"{prefix}worker:w{i}") or "{}")
        moved += int(hb.get("handed_off", 0))

    def ok(d):
        return d.get("finish_reason") in ("length", "stop")

    row = {"phase": name, "workers": args.workers, "holders": holders, "jobs": len(results),
           "a_done": sum(1 for a, _, d in results if a and ok(d)),
           "a_failed": sum(1 for a, _, d in results if a and not ok(d)),
           "base_done": sum(1 for a, _, d in results if not a and ok(d)),
           "base_failed": sum(1 for a, _, d in results if not a and not ok(d)),
           "handed_off": moved, "jobs_per_s": len(jobs) / wall,
           "a_ttft_p50_ms": 1000 * pct([t for a, t, d in results if a and t and ok(d)], 0.5),
           "a_ttft_p99_ms": 1000 * pct([t for a, t, d in results if a and t and ok(d)], 0.99),
           "base_ttft_p50_ms": 1000 * pct([t for a, t, d in results if not a and t], 0.5),
           "base_ttft_p99_ms": 1000 * pct([t for a, t, d in results if not a and t], 0.99)}
    procs.stop_all()
    return row


def post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = c.getresponse()
    data = resp.read().decode()
    c.close()
    return resp.status, data


def run_runtime(args, adapter, r, addr, procs):
    """The runtime phase (the module's doc)."""
    prefix = f"blruntime{int(time.time() * 1000) % 100000}:"
    root = adapter.parent / "lora-root"
    root.mkdir(exist_ok=True)
    if not (root / "a").exists():  # a copy: a link out of lora_dirs is refused
        shutil.copytree(adapter, root / "a")
    port = free_port()
    start_fleet(procs, "runtime", BUILD, prefix, addr, r, args.workers,
                lambda i: ["--lora-dirs", str(root)], ["--http", str(port), "--runtime-lora"])
    base_jobs = [job(i, False, args.max_tokens) for i in range(1, args.jobs, 2)]
    results, lock, todo = [], threading.Lock(), list(base_jobs)
    loads, unloads, a_results = [], [], []
    stop = threading.Event()

    def client():
        rc = redis.Redis.from_url(f"redis://{addr}", decode_responses=True)
        while not stop.is_set():
            with lock:
                j = todo.pop(0) if todo else None
            if j is None:  # the base trace goes round until the cycles are done
                with lock:
                    j = dict(base_jobs[len(results) % len(base_jobs)])
                    j["id"] = f"r{len(results)}-{threading.get_ident() % 10000}"
            t0 = time.time()
            rc.xadd(f"{prefix}requests", {"job": json.dumps(j)})
            ttft, done = read_job(rc, prefix, j["id"], t0)
            with lock:
                results.append((t0, ttft, done))

    def control():
        rc = redis.Redis.from_url(f"redis://{addr}", decode_responses=True)
        for c in range(args.cycles):
            t = time.time()
            st, text = post(port, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "a"})
            loads.append((time.time() - t, st))
            for k in range(args.cycle_jobs):
                j = job(10000 + c * 100 + k, True, args.max_tokens)
                t0 = time.time()
                rc.xadd(f"{prefix}requests", {"job": json.dumps(j)})
                a_results.append(read_job(rc, prefix, j["id"], t0))
            t = time.time()
            st, text = post(port, "/v1/unload_lora_adapter", {"lora_name": "a"})
            unloads.append((time.time() - t, st))
        stop.set()

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    t_start = time.time()
    for t in threads:
        t.start()
    ctl = threading.Thread(target=control)
    ctl.start()
    ctl.join()
    for t in threads:
        t.join()
    wall = time.time() - t_start

    def ok(d):
        return d.get("finish_reason") in ("length", "stop")

    row = {"phase": "runtime", "workers": args.workers, "holders": 0, "jobs": len(results),
           "a_done": sum(1 for _, d in a_results if ok(d)),
           "a_failed": sum(1 for _, d in a_results if not ok(d)),
           "base_done": sum(1 for _, _, d in results if ok(d)),
           "base_failed": sum(1 for _, _, d in results if not ok(d)),
           "handed_off": 0, "jobs_per_s": len(results) / wall,
           "a_ttft_p50_ms": 1000 * pct([t for t, d in a_results if t and ok(d)], 0.5),
           "a_ttft_p99_ms": 1000 * pct([t for t, d in a_results if t and ok(d)], 0.99),
           "base_ttft_p50_ms": 1000 * pct([t for _, t, _ in results if t], 0.5),
           "base_ttft_p99_ms": 1000 * pct([t for _, t, _ in results if t], 0.99),
           "loads": [{"s": round(t, 3), "status": st} for t, st in loads],
           "unloads": [{"s": round(t, 3), "status": st} for t, st in unloads]}
    procs.stop_all()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=160)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--before", help="a build folder of the tree before adapter streams")
    ap.add_argument("--cycles", type=int, default=5, help="runtime phase: loads and unloads")
    ap.add_argument("--cycle-jobs", type=int, default=8, help="runtime phase: a's jobs per load")
    args = ap.parse_args()
    out = pathlib.Path(os.environ.get("OUT", "/tmp/bench-lora-fleet"))
    logdir = out / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    adapter = make_adapter(out)
    redis_proc, addr, r = start_redis(logdir)
    plan = [("uniform", BUILD, args.workers, False), ("mixed", BUILD, 1, False)]
    if args.before:
        plan.append(("before", pathlib.Path(args.before), 1, False))
    plan.append(("handoff", BUILD, 1, True))
    rows = []
    procs = Procs(logdir)
    try:
        for name, build, holders, queued in plan:
            print(f"phase {name}: {holders} of {args.workers} workers hold a", file=sys.stderr,
                  flush=True)
            rows.append(run_phase(args, name, build, holders, queued, adapter, r, addr, procs))
        if args.cycles > 0:
            print(f"phase runtime: a loaded and unloaded {args.cycles} times", file=sys.stderr,
                  flush=True)
            rows.append(run_runtime(args, adapter, r, addr, procs))
    finally:
        procs.stop_all()
        stop_process(redis_proc, 10)
    print(f"{'phase':8} {'hold':>4} {'jobs':>5} {'a ok':>5} {'a fail':>6} {'base ok':>7} "
          f"{'b fail':>6} {'moved':>5} {'jobs/s':>7} {'a ttft p50':>10} {'p99':>8} "
          f"{'base p50':>9} {'p99':>8}")
    for x in rows:
        print(f"{x['phase']:8} {x['holders']:>2}/{x['workers']:<1} {x['jobs']:>5} {x['a_done']:>5} "
              f"{x['a_failed']:>6} {x['base_done']:>7} {x['base_failed']:>6} {x['handed_off']:>5} "
              f"{x['jobs_per_s']:>7.1f} {x['a_ttft_p50_ms']:>8.1f}ms {x['a_ttft_p99_ms']:>6.1f}ms "
              f"{x['base_ttft_p50_ms']:>7.1f}ms {x['base_ttft_p99_ms']:>6.1f}ms")
    for x in rows:
        if x["phase"] == "runtime":
            ls, us = sorted(v["s"] for v in x["loads"]), sorted(v["s"] for v in x["unloads"])
            print(f"runtime: {len(ls)} loads, {pct(ls, 0.5):.2f} s median, {ls[-1]:.2f} s max "
                  f"(statuses {sorted(set(v['status'] for v in x['loads']))}); {len(us)} unloads, "
                  f"{pct(us, 0.5):.2f} s median, {us[-1]:.2f} s max "
                  f"(statuses {sorted(set(v['status'] for v in x['unloads']))})")
    (out / "lora_fleet.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
