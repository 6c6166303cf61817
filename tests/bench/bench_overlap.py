#!/usr/bin/python3
"""Publishing off the critical path (issue 27 point 5): the step period of
a sim worker (h200, qwen3-14b) at batch 64, with Redis reached directly and
behind 1 ms of added latency each way (tests/bench/latency_proxy.py), with
publish_overlap on (the round trip runs while the next step computes) and
off (the serial loop). The step period is measured from the worker's
/metrics: seconds per generated token times the running batch, over the
window in which all 64 jobs run (tokens 25 % to 75 % of the total).

  /usr/bin/python3 tests/bench/bench_overlap.py [--tokens 400] [--reps 1]
  /usr/bin/python3 tests/bench/bench_overlap.py --backend cpu [--cpu-model DIR] [--threads 1]

--backend cpu runs a CPU worker on a real checkpoint (default: the demo
model, build/models/demo-qwen3, which `make demo` makes) instead of the sim:
its step is real matrix arithmetic on this machine's cores.

Prints one row per (overlap, latency) and the ratio of each 1 ms period to
the no-latency one of the same mode.
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import redis

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from latency_proxy import LatencyProxy  # noqa: E402
from local_cluster import free_port, wait_ping  # noqa: E402


def tokens_total(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(r"^redlm_generation_tokens_total\{[^}]*\} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def one(build, work, overlap, delay, n_tokens, backend, batch=64):
    rport = free_port()
    srv = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                            "--save", "", "--appendonly", "no", "--dir", str(work)],
                           stdout=subprocess.DEVNULL)
    wait_ping(rport)
    proxy = LatencyProxy(("127.0.0.1", rport), delay) if delay else None
    addr = f"127.0.0.1:{proxy.port if proxy else rport}"
    hp = free_port()
    log = open(work / f"w-{overlap}-{delay}.log", "w")
    if backend["name"] == "sim":
        engine = ["--backend", "sim", "--sim-profile", "h200", "--sim-model", "qwen3-14b",
                  "--model", str(ROOT / "engine" / "tokenizers" / "qwen3")]
    else:
        engine = ["--backend", "cpu", "--model", str(backend["model"]),
                  "--threads", str(backend["threads"])]
    w = subprocess.Popen([str(build / "redlm-worker"), "--redis", addr] + engine + [
                          "--no-result-cache", "--max-batch", str(batch), "--pools", "fast",
                          "--name", "b1", "--http-port", str(hp),
                          "--publish-overlap" if overlap else "--no-publish-overlap"],
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        r = redis.Redis(port=rport, decode_responses=True)
        deadline = time.time() + 60
        while "ready:" not in (work / f"w-{overlap}-{delay}.log").read_text():
            if time.time() > deadline or w.poll() is not None:
                raise RuntimeError("worker did not start")
            time.sleep(0.05)
        for i in range(batch):
            r.xadd("redlm:jobs:fast", {"job": json.dumps(
                {"id": f"b{i}", "prompt_ids": [1 + i, 2, 3], "max_tokens": n_tokens,
                 "temperature": 0, "ignore_eos": True, "cache": False})})
        total = batch * n_tokens
        marks = []
        for frac in (0.25, 0.75):
            while tokens_total(hp) < frac * total:
                time.sleep(0.005)
            marks.append((time.monotonic(), tokens_total(hp)))
        (t0, n0), (t1, n1) = marks
        return (t1 - t0) / ((n1 - n0) / batch)
    finally:
        w.terminate()
        w.wait(30)
        if proxy:
            proxy.close()
        srv.terminate()
        srv.wait(10)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--backend", choices=("sim", "cpu"), default="sim")
    ap.add_argument("--cpu-model", default=None, help="checkpoint for --backend cpu")
    ap.add_argument("--threads", type=int, default=1, help="engine threads for --backend cpu")
    args = ap.parse_args()
    backend = {"name": args.backend, "threads": args.threads,
               "model": pathlib.Path(args.cpu_model or pathlib.Path(args.build) / "models" / "demo-qwen3")}
    if args.backend == "cpu" and not (backend["model"] / "config.json").exists():
        sys.exit(f"bench_overlap: no checkpoint at {backend['model']} (make demo makes the demo model)")
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-overlap-"))
    res = {}
    for rep in range(args.reps):
        for overlap in (True, False):
            for delay in (0.0, 0.001):
                p = one(pathlib.Path(args.build), work, overlap, delay, args.tokens, backend)
                res.setdefault((overlap, delay), []).append(p)
    print("publish_overlap  added latency  step period (ms, best of reps)  vs no latency")
    for (overlap, delay), ps in res.items():
        best = min(ps)
        base = min(res[(overlap, 0.0)])
        print(f"{str(overlap).lower():<16} {delay * 1000:>5.0f} ms      {best * 1000:>10.3f}"
              f"                        {best / base:>6.3f}")


if __name__ == "__main__":
    main()
