"""How many requests per second the dispatcher routes.

    /usr/bin/python3 tests/bench/bench_dispatcher.py [--requests 20000]

Starts its own redis-server on a free loopback port and one dispatcher
(with --model of the tiny model, so the result-cache fast path is on). For
each mix, the dispatcher is frozen (SIGSTOP), the requests stream is
pre-filled with N requests, the dispatcher is let go (SIGCONT), and the
clock runs until every request is acknowledged (group lag 0, nothing
pending). Mixes:
  route:      sampled chat requests (temperature 1, no seed): parse,
              validate, route by the ratio, forward; no cache lookup.
  cache_miss: greedy chat requests, each different: also render the chat
              template, tokenize, compute the cache key, GET (a miss), then
              forward.
  cache_hit:  the same greedy chat request N times (distinct ids) after a
              worker ran it once: render, tokenize, GET (a hit), and replay
              its events onto redlm:out:<id> (9 XADDs + EXPIRE each).
Prints one JSON line per mix.
"""
import argparse
import json
import pathlib
import signal
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "integration"))
from conftest import MODEL, Dispatcher, RedisServer, Worker, connect  # noqa: E402


def chat(text, **kw):
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 8, **kw}


def run_mix(r, d, prefix, name, jobs):
    d.signal(signal.SIGSTOP)
    time.sleep(0.05)
    p = r.pipeline(transaction=False)
    for i, j in enumerate(jobs):
        p.xadd(f"{prefix}requests", {"job": json.dumps(j)})
        if i % 1000 == 999:
            p.execute()
    p.execute()
    g = next(g for g in r.xinfo_groups(f"{prefix}requests") if g["name"] == "dispatchers")
    assert g["lag"] + g["pending"] == len(jobs), f"the dispatcher was not frozen: {g}"
    t0 = time.perf_counter()
    d.signal(signal.SIGCONT)
    while True:
        g = next(g for g in r.xinfo_groups(f"{prefix}requests") if g["name"] == "dispatchers")
        if g["lag"] == 0 and g["pending"] == 0:
            break
        time.sleep(0.002)
    dt = time.perf_counter() - t0
    print(json.dumps({"bench": "dispatcher", "mix": name, "requests": len(jobs),
                      "seconds": round(dt, 3), "requests_per_s": round(len(jobs) / dt)}),
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    a = ap.parse_args()
    n = a.requests
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-disp-"))
    srv = RedisServer(tmp / "redis")
    prefix = "b:"
    r = connect(srv.addr)
    d = Dispatcher(srv.addr, prefix, "bench", tmp,
                   ["--model", str(MODEL), "--think-ratio", "0.3", "--max-waiting", "0",
                    "--block-ms", "1000", "--heartbeat-interval-ms", "1000"])
    try:
        run_mix(r, d, prefix, "route",
                [chat(f"question {i}: what is {i} + {i}?", id=f"r{i}") for i in range(n)])
        run_mix(r, d, prefix, "cache_miss",
                [chat(f"question {i}: what is {i} + {i}?", id=f"m{i}", temperature=0)
                 for i in range(n)])
        # one run through a worker fills the cache entry the hits replay;
        # the jobs forwarded above are dropped first, or it would run them all
        for pool in ("fast", "think"):
            r.xtrim(f"{prefix}jobs:{pool}", maxlen=0, approximate=False)
        w = Worker(srv.addr, prefix, "w1", tmp, ["--threads", "1"])
        hit = chat("what is the capital of France?", temperature=0, ignore_eos=True, mode="no_think")
        r.xadd(f"{prefix}requests", {"job": json.dumps({**hit, "id": "seed"})})
        deadline = time.time() + 60
        while not any(json.loads(f["event"])["type"] == "done"
                      for _, f in r.xrange(f"{prefix}out:seed")):
            assert time.time() < deadline, ("the worker did not answer",
                                            r.xinfo_groups(f"{prefix}jobs:fast"),
                                            r.xinfo_groups(f"{prefix}requests"))
            time.sleep(0.05)
        while not r.keys(f"{prefix}cache:*") and time.time() < deadline:
            time.sleep(0.05)
        w.stop()
        run_mix(r, d, prefix, "cache_hit", [{**hit, "id": f"h{i}"} for i in range(n)])
        time.sleep(1.5)  # one more heartbeat
        hb = json.loads(r.get(f"{prefix}dispatcher:bench") or "{}")
        print(json.dumps({"bench": "dispatcher", "heartbeat": {k: hb.get(k) for k in (
            "routed", "cache_hits", "cache_misses")}}), flush=True)
    finally:
        d.stop()
        srv.stop()


if __name__ == "__main__":
    main()
