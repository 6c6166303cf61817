"""Plain jobs beside a burst of new JSON Schemas, through a real worker.

    /usr/bin/python3 tests/bench/bench_compile_slots.py [--model DIR] [--max-batch 4]
        [--schemas 4] [--plain 4] [--rounds 5] [--threads 2] [--compile-threads 1]
        [--worker PATH]

Starts its own redis-server on a free loopback port and one worker of
--max-batch slots and one compile thread. Each round queues, in one
transaction, --schemas jobs with a schema the worker has not seen (near the
compiler's state limit: a few hundred ms each to compile) and then --plain
jobs without one (16 tokens). A plain job's TTFT is the time from the
transaction to its first event, read back from Redis. A round of plain jobs
alone first gives the baseline. Prints one JSON line per case: TTFT
p50 / max of the plain jobs, and of the schema jobs.

A job waiting for its compile holds no batch slot (engine.h): the plain
jobs start at once. --worker runs another build's worker for comparison
(before that change the schema jobs held the slots while they compiled).
"""
import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "integration"))
from conftest import WORKER, Daemon, RedisServer, connect  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


class BenchWorker(Daemon):
    kind = "worker"

    def __init__(self, exe, addr, model, logdir, a):
        self.start([str(exe), "--redis", addr, "--model", str(model), "--pools", "fast",
                    "--name", "bw", "--threads", str(a.threads), "--prefix", "b:",
                    "--block-ms", "100", "--http-port", "0", "--result-cache", "false",
                    "--max-batch", str(a.max_batch)] +
                   (["--grammar-compile-threads", str(a.compile_threads)] if a.compile_threads else []),
                   pathlib.Path(logdir) / "worker.log", self.logged_ready, timeout=120)


def schema_job(jid, length):
    return {"id": jid, "prompt": "x", "max_tokens": 4, "cache": False,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "near_limit", "schema": {
                    "type": "array", "prefixItems": [{"type": "string", "maxLength": length}]}}}}


def plain_job(jid):
    return {"id": jid, "prompt": "x", "max_tokens": 16, "ignore_eos": True, "temperature": 0,
            "cache": False}


def run_round(r, jobs):
    """Queues jobs in one transaction; each job's TTFT in ms (first event)."""
    keys = {f"b:out:{j['id']}": j["id"] for j in jobs}
    last = {k: "0-0" for k in keys}
    first, done = {}, set()
    with r.pipeline(transaction=True) as p:
        for j in jobs:
            p.xadd("b:jobs:fast", {"job": json.dumps(j)})
        t0 = time.perf_counter()
        p.execute()
    deadline = time.time() + 300
    while len(done) < len(keys):
        if time.time() > deadline:
            raise RuntimeError(f"jobs not done in 300 s: {sorted(set(keys) - done)}")
        res = r.xread({k: last[k] for k in keys if k not in done}, block=1000)
        now = time.perf_counter()
        for key, entries in res or []:
            for eid, fields in entries:
                last[key] = eid
                first.setdefault(keys[key], (now - t0) * 1000)
                if json.loads(fields["event"]).get("type") == "done":
                    done.add(key)
    return first


def summary(case, ttft, schemas, plain):
    pl = [ttft[k] for k in plain]
    sc = [ttft[k] for k in schemas]
    out = {"bench": "compile_slots", "case": case, "plain_ttft_ms_p50": round(statistics.median(pl), 1),
           "plain_ttft_ms_max": round(max(pl), 1)}
    if sc:
        out.update({"schema_ttft_ms_p50": round(statistics.median(sc), 1),
                    "schema_ttft_ms_max": round(max(sc), 1)})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "build/models/tiny-256-vocab-tok"))
    ap.add_argument("--worker", default=str(WORKER))
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--schemas", type=int, default=4)
    ap.add_argument("--plain", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile-threads", type=int, default=1,
                    help="0: the worker's default (a build without the option)")
    a = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-compile-slots-"))
    srv = RedisServer(tmp / "redis")
    w = None
    try:
        w = BenchWorker(a.worker, srv.addr, a.model, tmp, a)
        r = connect(srv.addr)
        alone, behind = {}, {}
        for rnd in range(a.rounds):
            plain = [plain_job(f"a{rnd}-{i}") for i in range(a.plain)]
            alone.update(run_round(r, plain))
            # every round's schemas are new texts: each compiles
            schemas = [schema_job(f"s{rnd}-{i}", 2000 - 8 * (rnd * a.schemas + i))
                       for i in range(a.schemas)]
            plain = [plain_job(f"p{rnd}-{i}") for i in range(a.plain)]
            behind.update(run_round(r, schemas + plain))
        print(json.dumps(summary("plain jobs alone", alone, [], list(alone))))
        print(json.dumps(summary(f"behind {a.schemas} new schemas", behind,
                                 [k for k in behind if k.startswith("s")],
                                 [k for k in behind if k.startswith("p")]) |
                         {"max_batch": a.max_batch, "rounds": a.rounds, "worker": a.worker}))
    finally:
        if w:
            w.stop()
        srv.stop()


if __name__ == "__main__":
    main()
