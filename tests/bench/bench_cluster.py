"""A worker fleet on one Redis vs on a 3-master Redis Cluster (issue 19).

    /usr/bin/python3 tests/bench/bench_cluster.py [--workers 2] [--sweep 8,32,96] [--requests 600] [--reps 3]

In one run: starts both backends (a redis-server, and 3 masters + 3
replicas joined by redis-cli --cluster create, on free loopback ports), a
fleet of --workers CPU workers with the tiny model on each (given the seed
list on the cluster), then `redlm bench --target pool:fast` closed-loop at
each --sweep level of clients, short prompts and --output-len tokens,
alternating the backends --reps times (each rep in the other order, since
the shared machine's load drifts), and prints per level the medians of
requests/s and p50/p99 end-to-end latency and of the cluster/single ratio;
the saturation rate is the median of each rep's best level.
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
from conftest import CLI, RedisServer, Worker  # noqa: E402
from local_cluster import RedisCluster  # noqa: E402  (one copy, shared with bench_fleet.py)


def bench(addr, args, tmp, label, seed):
    """One redlm bench sweep against the fleet on addr; a new seed per rep
    keeps the result cache cold (every request runs)."""
    out = pathlib.Path(tmp) / f"{label}.json"
    subprocess.run([str(CLI), "bench", "--redis", addr, "--prefix", PREFIX,
                    "--target", "pool:fast", "--sweep", args.sweep,
                    "--requests", str(args.requests), "--warmup", "8",
                    "--prompt-len", "8", "--output-len", str(args.output_len),
                    "--temperature", "0", "--seed", str(seed), "--no-plots", "--label", label, "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=900)
    return json.loads(out.read_text())


PREFIX = "bench:"


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
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        single = cluster = None
        fleets = []
        try:
            single = RedisServer(pathlib.Path(tmp) / "single")
            cluster = RedisCluster(pathlib.Path(tmp) / "cluster")
            addrs = {"single": single.addr, "cluster": cluster.seeds}
            for name, addr in addrs.items():
                fleets += [Worker(addr, PREFIX, f"{name}{i}", tmp, ("--max-batch", "32"),
                                  pools="fast") for i in range(args.workers)]
            # the machine's load changes under us: alternate the backends,
            # each rep in the other order, and take the median per level
            res = {"single": [], "cluster": []}
            for rep in range(args.reps):
                order = ["single", "cluster"] if rep % 2 == 0 else ["cluster", "single"]
                for name in order:
                    res[name].append(summary(bench(addrs[name], args, tmp, f"{name}{rep}", rep + 1)))
        finally:
            for w in fleets:
                w.stop()
            if single:
                single.stop()
            if cluster:
                cluster.stop()
    med = lambda v: sorted(v)[len(v) // 2]
    best = {}
    for name in res:
        best[name] = med([max(lv["requests_per_s"] for lv in r) for r in res[name]])
    for li, lv in enumerate(res["single"][0]):
        row = {"clients": lv["clients"]}
        for name in res:
            row[name] = {k: med([r[li][k] for r in res[name]])
                         for k in ("requests_per_s", "e2e_p50_ms", "e2e_p99_ms")}
            row[name]["errors"] = sum(r[li]["errors"] for r in res[name])
        row["ratio_requests_per_s"] = round(med([c[li]["requests_per_s"] / s[li]["requests_per_s"]
                                                 for s, c in zip(res["single"], res["cluster"])]), 3)
        print(json.dumps(row))
    print(json.dumps({"saturation_requests_per_s_median": best,
                      "ratio": round(best["cluster"] / best["single"], 3), "reps": args.reps}))


if __name__ == "__main__":
    main()
