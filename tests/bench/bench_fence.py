#!/usr/bin/python3
"""What write fencing (worker/fence.h) costs Redis per event: a private
redis-server, 64 per-request streams, 300 steps of one event each, sent as
a worker sends them (one pipeline per step), three ways, alternating, in one
run: a plain XADD per event (the unfenced worker), FENCE_EMIT with one job
per call (a worker on a Redis Cluster, where a script's keys share a slot),
and FENCE_EMIT with all 64 jobs in one call (a single instance). Redis CPU
from INFO cpu; the script text is read from worker/fence.c, so what is
measured is what ships.

  /usr/bin/python3 tests/bench/bench_fence.py [--reps 3]
"""
import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

import redis

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))
from local_cluster import free_port, wait_ping  # noqa: E402
EV = '{"type":"delta","seq":0,"content":" hello","token_ids":[1234]}'


def script(name):
    src = (ROOT / "worker/fence.c").read_text()
    m = re.search(r"static const char %s\[\] =\n(.*?);\n" % name, src, re.S)
    return "".join(json.loads(x) for x in re.findall(r'"(?:[^"\\]|\\.)*"', m.group(1)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    port = free_port()
    d = tempfile.mkdtemp(prefix="bench-fence-")
    srv = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                            "--save", "", "--appendonly", "no", "--dir", d],
                           stdout=subprocess.DEVNULL)
    try:
        wait_ping(port)
        r = redis.Redis(port=port)
        emit = r.script_load(script("emit_lua"))
        J = a.jobs

        def cpu():
            c = r.info("cpu")
            return c["used_cpu_user"] + c["used_cpu_sys"]

        res = {"xadd": [], "emit_1_job": [], f"emit_{J}_jobs": []}
        for rep in range(a.reps):
            for mode in res:
                r.flushall()
                for j in range(J):
                    r.hset(f"own:{j}", mapping={"holder": "h", "entry": "1-1", "xlen": 0,
                                                "stalls": 0, "d": 1})
                c0 = cpu()
                for st in range(a.steps):
                    pl = r.pipeline(transaction=False)
                    sid = f"0-{st + 1}"
                    if mode == "xadd":
                        for j in range(J):
                            pl.xadd(f"out:{j}", {"event": EV}, id=sid)
                    elif mode == "emit_1_job":
                        for j in range(J):
                            pl.evalsha(emit, 2, f"out:{j}", f"own:{j}", "h", "0", "", "1-1", "1",
                                       sid, EV)
                    else:
                        keys = [k for j in range(J) for k in (f"out:{j}", f"own:{j}")]
                        args = [x for j in range(J) for x in ("0", "", "1-1", "1", sid, EV)]
                        pl.evalsha(emit, len(keys), *keys, "h", *args)
                    pl.execute()
                assert all(r.xlen(f"out:{j}") == a.steps for j in range(J)), mode
                res[mode].append((cpu() - c0) / (J * a.steps) * 1e6)
        base = statistics.median(res["xadd"])
        print("| how the events are written | Redis CPU us/event (median of %d) | vs XADD |" % a.reps)
        print("|---|---|---|")
        for mode, v in res.items():
            m = statistics.median(v)
            print(f"| {mode} | {m:.2f} | {m / base:.2f}x |")
        print(json.dumps({"bench": "fence", "us_per_event": {k: statistics.median(v)
                                                               for k, v in res.items()}}))
    finally:
        srv.terminate()
        srv.wait(10)


if __name__ == "__main__":
    main()
