#!/usr/bin/python3
"""What a runtime LoRA load costs the streams a worker is serving
(`make bench-lora-stall`).

One private redis-server, one CPU worker on a random checkpoint of the
0.6B shape (`redlm mkmodel`, made once under $OUT) with lora_dirs holding a
random rank-R adapter of it on every projection, one dispatcher with
runtime_lora. A greedy job streams; once it has 30 tokens the adapter is
loaded through the front door (POST /v1/load_lora_adapter). The client
timestamps each delta as it arrives (XREAD), and the table gives the
job's token gaps before the load and while it lasts (the longest is the
stall), the load call's time, and the worker's own account of reading the
adapter. --build DIR runs another build (a tree before the adapter was
read off the worker's loop, for the comparison in BENCHMARKS.md).

  /usr/bin/python3 tests/bench/bench_lora_stall.py [--rank 256] [--build DIR]
"""
import argparse
import http.client
import json
import os
import pathlib
import statistics
import subprocess
import sys
import threading
import time

import redis

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_affinity import Procs  # noqa: E402
from local_cluster import free_port, start_redis, stop_process  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("BUILD", ROOT / "build"))


def make(out, rank):
    base, root = out / "q06", out / "adapters"
    if not (base / "config.json").exists():
        subprocess.run([str(BUILD / "redlm"), "mkmodel", "--shape", "qwen3-0.6b", "--dtype", "bf16",
                        "--tokenizer", str(ROOT / "engine/tokenizers/qwen3"), "--out", str(base)],
                       check=True, stdout=subprocess.DEVNULL)
    ad = root / f"r{rank}"
    if not (ad / "adapter_config.json").exists():
        subprocess.run([str(BUILD / "redlm"), "mkmodel", "--lora-of", str(base), "--lora-rank",
                        str(rank), "--dtype", "bf16", "--out", str(ad)], check=True,
                       stdout=subprocess.DEVNULL)
    return base, root, ad.name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rank", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", help="the build folder whose worker and dispatcher run")
    args = ap.parse_args()
    build = pathlib.Path(args.build) if args.build else BUILD
    out = pathlib.Path(os.environ.get("OUT", "/tmp/bench-lora-stall"))
    logdir = out / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    base, root, name = make(out, args.rank)
    redis_proc, addr, r = start_redis(logdir)
    procs = Procs(logdir)
    prefix, port = "stall:", free_port()
    try:
        procs.start("worker", [str(build / "redlm-worker"), "--redis", addr, "--prefix", prefix,
                               "--model", str(base), "--name", "w0", "--threads", str(args.threads),
                               "--http-port", "0", "--no-result-cache", "--lora-dirs", str(root)])
        procs.start("dispatcher", [str(build / "redlm-dispatcher"), "--redis", addr, "--prefix",
                                   prefix, "--name", "d", "--http-port", "0", "--http", str(port),
                                   "--runtime-lora"])
        deadline = time.time() + 300
        while not r.exists(f"{prefix}worker:w0") or not r.exists(f"{prefix}dispatcher:d"):
            if time.time() > deadline:
                raise RuntimeError("the worker did not come up")
            time.sleep(0.2)
        arrivals = []

        def reader():
            rc, last = redis.Redis.from_url(f"redis://{addr}", decode_responses=True), "0-0"
            while True:
                try:
                    got = rc.xread({f"{prefix}out:long": last}, block=2000) or []
                except redis.exceptions.ConnectionError:
                    return  # the benchmark is over: its redis-server stopped
                for _, es in got:
                    for i, f in es:
                        last, e = i, json.loads(f["event"])
                        if e["type"] == "delta":
                            arrivals.append(time.time())
                        if e["type"] == "done":
                            return
        th = threading.Thread(target=reader, daemon=True)
        th.start()
        job = {"id": "long", "prompt_ids": [7, 8, 9, 10], "max_tokens": 2000, "temperature": 0,
               "ignore_eos": True, "cache": False}
        r.xadd(f"{prefix}jobs:fast", {"job": json.dumps(job)})
        while len(arrivals) < 30:
            time.sleep(0.05)
        t0 = time.time()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        c.request("POST", "/v1/load_lora_adapter", json.dumps({"lora_name": "big",
                                                                "lora_path": name}))
        resp = c.getresponse()
        body = resp.read().decode().strip()
        t1 = time.time()
        n = len(arrivals)
        while len(arrivals) < n + 5:  # the gap that spans the load's end
            time.sleep(0.05)
        ts = list(arrivals)
        gaps = [(a, b - a) for a, b in zip(ts, ts[1:])]
        before = [g for a, g in gaps if a < t0]
        during = [g for a, g in gaps if t0 <= a + g and a <= t1]
        read = [ln.strip() for ln in open(logdir / "worker.log") if "LoRA adapter \"big\"" in ln]
        row = {"rank": args.rank, "build": str(build), "load_status": resp.status,
               "load_s": round(t1 - t0, 2), "answer": body,
               "gap_before_median_ms": round(1000 * statistics.median(before)),
               "gap_during_median_ms": round(1000 * statistics.median(during)),
               "gap_during_max_ms": round(1000 * max(during)), "gaps_during": len(during),
               "worker": read}
        print(json.dumps(row, indent=1))
        (out / "lora_stall.json").write_text(json.dumps(row, indent=1))
    finally:
        procs.stop_all()
        stop_process(redis_proc, 10)


if __name__ == "__main__":
    main()
