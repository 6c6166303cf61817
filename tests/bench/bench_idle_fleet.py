#!/usr/bin/python3
"""What a fleet costs Redis when it does nothing (issue 27 point 3): the work
that grows with the workers, not with the tokens.

One private redis-server pinned to core 0 (taskset), N sim workers on the
other cores with the fleet soak's settings (bench_fleet.py: claim and lease
every 200 ms, heartbeat every 500 ms, pools fast and think), no dispatcher,
no jobs. After the workers are ready and a warm-up, INFO cpu, INFO stats and
INFO commandstats are read twice, --seconds apart: Redis CPU per
worker-second, read events (round trips) per worker-second, and per
command its calls per worker-second. Everything it starts it stops, by pid.

  /usr/bin/python3 tests/bench/bench_idle_fleet.py --workers 8 --seconds 10
  /usr/bin/python3 tests/bench/bench_idle_fleet.py --build build-before ...
"""
import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import redis

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from local_cluster import free_port, stop_process, wait_ping  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "engine/tokenizers/qwen3"


def snap(r):
    cpu, st = r.info("cpu"), r.info("stats")
    cmds = {k[8:]: v["calls"] for k, v in r.info("commandstats").items()
            if k.startswith("cmdstat_")}
    return {"t": time.time(), "cpu": cpu["used_cpu_sys"] + cpu["used_cpu_user"],
            "reads": st["total_reads_processed"], "cmds": cmds}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=3)
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    a = ap.parse_args()
    n_cpu = os.cpu_count() or 2
    others = f"1-{n_cpu - 1}" if n_cpu > 1 else "0"
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="idle-fleet-"))
    port = free_port()
    procs = []
    try:
        procs.append(subprocess.Popen(
            ["taskset", "-c", "0", "redis-server", "--port", str(port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(tmp)],
            stdout=open(tmp / "redis.log", "w"), stderr=subprocess.STDOUT))
        wait_ping(port, proc=procs[0], log=tmp / "redis.log")
        r = redis.Redis(port=port, decode_responses=True)
        logs = []
        for i in range(a.workers):
            log = tmp / f"worker-{i}.log"
            logs.append(log)
            procs.append(subprocess.Popen(
                ["taskset", "-c", others, str(ROOT / a.build / "redlm-worker"), "--redis",
                 f"127.0.0.1:{port}", "--prefix", "idle:", "--model", str(TOKENIZER),
                 "--backend", "sim", "--sim-profile", "h200", "--sim-model", "qwen3-14b",
                 "--pools", "fast,think", "--name", f"w{i}", "--threads",
                 "1", "--http-port", "0", "--no-result-cache", "--claim-idle-ms", "1000",
                 "--claim-interval-ms", "200", "--lease-renew-ms", "200",
                 "--heartbeat-interval-ms", "500"],
                stdout=open(log, "w"), stderr=subprocess.STDOUT))
        deadline = time.time() + 300
        while not all("ready:" in l.read_text() for l in logs):
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                sys.exit("workers did not get ready")
            time.sleep(0.05)
        time.sleep(a.warmup)  # a measuring window, not a synchronisation
        b = snap(r)
        time.sleep(a.seconds)
        e = snap(r)
        ws = (e["t"] - b["t"]) * a.workers
        print(f"{a.workers} idle workers, {e['t'] - b['t']:.1f} s, build {a.build}:")
        print(f"Redis CPU {(e['cpu'] - b['cpu']) / ws * 1e6:.0f} us per worker-second, "
              f"{(e['reads'] - b['reads']) / ws:.1f} read events per worker-second")
        print("| command | calls/worker-s |")
        print("|---|---:|")
        for k in sorted(e["cmds"], key=lambda k: -(e["cmds"][k] - b["cmds"].get(k, 0))):
            n = e["cmds"][k] - b["cmds"].get(k, 0)
            if n > 0:
                print(f"| {k} | {n / ws:.2f} |")
    finally:
        for p in reversed(procs):  # the workers, then Redis: a draining worker's flush needs it
            stop_process(p, 15)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
