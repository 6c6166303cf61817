"""A worker fleet on one Redis vs on a 3-master Redis Cluster (issue 19).

    /usr/bin/python3 tests/bench/bench_cluster.py [--workers 2] [--sweep 8,32,96] [--requests 600]

For each backend in one run: starts it (a redis-server, or 3 masters + 3
replicas joined by redis-cli --cluster create, on free loopback ports), a
fleet of --workers CPU workers with the tiny model (given the seed list on
the cluster), then `redlm bench --target pool:fast` closed-loop at each --sweep level of
clients, short prompts and --output-len tokens, and prints per level and
backend requests/s, output tokens/s, p50/p99 end-to-end latency, and the
cluster/single ratio; the saturation rate is the best level's requests/s.
The tiny model keeps the engine cheap, so the figures are dominated by the
Redis round trips: the client writes, the worker's reads, acks, event XADDs.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "integration"))
from conftest import CLI, RedisCluster, RedisServer, Worker  # noqa: E402


def run(addr, args, tmp, label):
    prefix = "bench:"
    ws = [Worker(addr, prefix, f"w{i}", tmp, ("--max-batch", "32"), pools="fast")
          for i in range(args.workers)]
    try:
        out = pathlib.Path(tmp) / f"{label}.json"
        subprocess.run([str(CLI), "bench", "--redis", addr, "--prefix", prefix,
                        "--target", "pool:fast", "--sweep", args.sweep,
                        "--requests", str(args.requests), "--warmup", "8",
                        "--prompt-len", "8", "--output-len", str(args.output_len),
                        "--temperature", "0", "--no-plots", "--label", label, "--out", str(out)],
                       check=True, capture_output=True, text=True, timeout=900)
        return json.loads(out.read_text())
    finally:
        for w in ws:
            w.stop()


def summary(res):
    """Per level: the figures the table needs."""
    levels = res["levels"] if "levels" in res else [res]
    return [{"clients": lv["clients"], "completed": lv["completed"], "errors": lv["n_errors"],
             "requests_per_s": round(lv["requests_per_s"], 1),
             "output_tokens_per_s": round(lv["output_tokens_per_s"], 1),
             "e2e_p50_ms": lv["e2e_ms"]["p50"], "e2e_p99_ms": lv["e2e_ms"]["p99"]}
            for lv in levels]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sweep", default="8,32,96")
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--output-len", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        single = RedisServer(pathlib.Path(tmp) / "single")
        try:
            a = summary(run(single.addr, args, tmp, "single"))
        finally:
            single.stop()
        cluster = RedisCluster(pathlib.Path(tmp) / "cluster")
        try:
            b = summary(run(cluster.seeds, args, tmp, "cluster"))
        finally:
            cluster.stop()
    for x, y in zip(a, b):
        print(json.dumps({"clients": x["clients"], "single": x, "cluster": y,
                          "ratio_requests_per_s": round(y["requests_per_s"] / x["requests_per_s"], 3)}))
    best = lambda v: max(lv["requests_per_s"] for lv in v)
    print(json.dumps({"saturation_requests_per_s": {"single": best(a), "cluster": best(b)},
                      "ratio": round(best(b) / best(a), 3)}))


if __name__ == "__main__":
    main()
