"""The worker's overhead over the bare engine, with the tiny model.

    /usr/bin/python3 tests/bench/bench_worker.py [--threads 1] [--jobs 256] [--gen 64]

Starts its own redis-server on a free loopback port and one worker, then
prints JSON lines:
  ttft_overhead: N sequential jobs (32 random prompt ids, max_tokens 1).
    through_redis_ms: client XADD -> first delta read back (XREAD BLOCK);
    engine_ms: engine_submit -> first token, from the worker's debug log
    ("engine ttft"), for the same jobs; overhead = their difference per job.
    Medians (and p90).
  events: JOBS jobs of GEN tokens submitted at once; events written per
    second from the first XADD to the last done, read by 16 client threads.
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "integration"))
from conftest import MODEL, RedisServer, Worker, connect  # noqa: E402


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ttft-jobs", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=256)
    ap.add_argument("--gen", type=int, default=64)
    a = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-worker-"))
    srv = RedisServer(tmp / "redis")
    prefix = "b:"
    w = Worker(srv.addr, prefix, "bench", tmp,
               ["--log-level", "debug", "--threads", str(a.threads), "--block-ms", "1000"])
    r = connect(srv.addr)
    import random
    rnd = random.Random(1)
    try:
        # TTFT: one job at a time, the worker idle (blocked in XREADGROUP) before each
        through = {}
        for i in range(a.ttft_jobs):
            jid = f"t{i}"
            job = json.dumps({"id": jid, "prompt_ids": [rnd.randrange(736) for _ in range(32)],
                              "max_tokens": 1, "temperature": 0, "ignore_eos": True,
                              "cache": False})
            key = f"{prefix}out:{jid}"
            t0 = time.perf_counter()
            r.xadd(f"{prefix}jobs:fast", {"job": job})
            while True:
                res = r.xread({key: "0-0"}, block=5000, count=1)
                if res:
                    break
            through[jid] = (time.perf_counter() - t0) * 1000
            # let the worker go back to its blocking read, as an idle worker would be
            while r.xlen(key) < 2:
                time.sleep(0.0005)
            time.sleep(0.002)
        time.sleep(0.2)
        eng = {m.group(1): float(m.group(2))
               for m in re.finditer(r"job (t\d+): engine ttft ([\d.]+) ms", w.log_path.read_text())}
        over = [through[k] - eng[k] for k in through if k in eng]
        print(json.dumps({"bench": "worker_ttft", "jobs": len(over), "prompt": 32,
                          "through_redis_ms_p50": round(statistics.median(through.values()), 3),
                          "engine_ms_p50": round(statistics.median(eng.values()), 3),
                          "overhead_ms_p50": round(statistics.median(over), 3),
                          "overhead_ms_p90": round(pct(over, 0.9), 3)}))

        # events/s under load
        ids = [f"e{i}" for i in range(a.jobs)]
        counts = {}
        t0 = time.perf_counter()
        pipe = r.pipeline(transaction=False)
        for jid in ids:
            pipe.xadd(f"{prefix}jobs:fast", {"job": json.dumps(
                {"id": jid, "prompt_ids": [rnd.randrange(736) for _ in range(16)],
                 "max_tokens": a.gen, "temperature": 0, "ignore_eos": True, "cache": False})})
        pipe.execute()
        lock = threading.Lock()
        it = iter(ids)

        def reader():
            rr = connect(srv.addr)
            while True:
                with lock:
                    jid = next(it, None)
                if jid is None:
                    return
                key, last, n = f"{prefix}out:{jid}", "0-0", 0
                while True:
                    res = rr.xread({key: last}, block=5000, count=1000)
                    done = False
                    for _, ents in res:
                        for eid, f in ents:
                            last, n = eid, n + 1
                            done = done or '"type":"done"' in f["event"]
                    if done:
                        break
                counts[jid] = n

        ts = [threading.Thread(target=reader) for _ in range(16)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        dt = time.perf_counter() - t0
        n_ev = sum(counts.values())
        print(json.dumps({"bench": "worker_events", "jobs": a.jobs, "gen": a.gen,
                          "threads": a.threads, "events": n_ev, "seconds": round(dt, 3),
                          "events_per_s": round(n_ev / dt, 1),
                          "tokens_per_s": round(a.jobs * a.gen / dt, 1)}))
    finally:
        w.stop()
        srv.stop()


if __name__ == "__main__":
    main()
