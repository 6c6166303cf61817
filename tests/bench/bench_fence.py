#!/usr/bin/python3
"""What write fencing (worker/fence.h) costs Redis per event: a private
redis-server, 64 per-request streams, 300 steps of one event each, sent as
a worker sends them (one pipeline per step), four ways, alternating, in one
run: a plain XADD per event (the unfenced worker), FENCE_EMIT with one job
per call (a worker on a Redis Cluster whose jobs each sit in a slot of
their own), FENCE_EMIT with all 64 jobs in one call (a single instance, or
a cluster's request slot), and the same with every job's cancel check
folded in (what every step cost before the check went to once per
CHECK_MS, worker/publish.c). The emits ring the bell, as a worker's do.
Redis CPU from INFO cpu; the script text is read from worker/fence.c, so
what is measured is what ships.

  /usr/bin/python3 tests/bench/bench_fence.py [--reps 3] [--pin]
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

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
    ap.add_argument("--pin", action="store_true",
                    help="redis-server on core 0, this client on the others")
    ap.add_argument("--cluster-mode", action="store_true",
                    help="the server a one-node Redis Cluster holding every slot, every key in "
                         "one slot (a hash tag), as a cluster master runs the script")
    a = ap.parse_args()
    port = free_port()
    d = tempfile.mkdtemp(prefix="bench-fence-")
    srv = subprocess.Popen([*(["taskset", "-c", "0"] if a.pin else []), "redis-server", "--port",
                            str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                            "--dir", d, *(["--cluster-enabled", "yes"] if a.cluster_mode else [])],
                           stdout=subprocess.DEVNULL)
    try:
        if a.pin:
            os.sched_setaffinity(0, set(range(1, os.cpu_count())))
        wait_ping(port)
        r = redis.Redis(port=port)
        if a.cluster_mode:
            r.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            while r.execute_command("CLUSTER", "INFO").split(b"\r\n")[0] != b"cluster_state:ok":
                time.sleep(0.05)
        emit = r.script_load(script("emit_lua"))
        J = a.jobs
        T = "{t}" if a.cluster_mode else ""  # one slot for every key

        def cpu():
            c = r.info("cpu")
            return c["used_cpu_user"] + c["used_cpu_sys"]

        def emit_call(pl, jobs, sid, checked):
            """FENCE_EMIT as publish.c queue_emit writes it: per job its out
            and holder keys (and cancel key when checked), the bell last;
            ARGV the holder, the bell flag, per job TTL, channel, entry,
            event count, check count, then its (ID, event) pairs."""
            keys = [k for j in jobs for k in (f"{T}out:{j}", f"{T}own:{j}",
                                              *((f"{T}cancel:{j}",) if checked else ()))]
            args = [x for j in jobs for x in ("0", "", "1-1", "1", "1" if checked else "0",
                                              sid, EV)]
            pl.evalsha(emit, len(keys) + 1, *keys, f"{T}bell", "h", "1", *args)

        res = {"xadd": [], "emit_1_job": [], f"emit_{J}_jobs": [], f"emit_{J}_jobs_checked": []}
        for rep in range(a.reps):
            for mode in res:
                r.flushall()
                for j in range(J):
                    r.hset(f"{T}own:{j}", mapping={"holder": "h", "entry": "1-1"})
                c0 = cpu()
                for st in range(a.steps):
                    pl = r.pipeline(transaction=False)
                    sid = f"0-{st + 1}"
                    if mode == "xadd":
                        for j in range(J):
                            pl.xadd(f"{T}out:{j}", {"event": EV}, id=sid)
                    elif mode == "emit_1_job":
                        for j in range(J):
                            emit_call(pl, [j], sid, False)
                    else:
                        emit_call(pl, range(J), sid, mode.endswith("checked"))
                    replies = pl.execute()
                    if mode != "xadd":  # each job's one event written (a check's answer: nil)
                        checked = mode.endswith("checked")
                        assert all(x[::2 if checked else 1] == [1] * (len(x) // (1 + checked))
                                   for x in replies), (mode, replies)
                assert all(r.xlen(f"{T}out:{j}") == a.steps for j in range(J)), mode
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
