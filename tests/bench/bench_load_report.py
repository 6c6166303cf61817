"""The table and ratios of tests/bench/bench_load.sh, from the result.json
files `redlm bench` wrote under OUT. A configuration measured in turns
(r1, r2) is pooled: counts and measured windows summed, percentiles over
all its measured requests (linear interpolation between closest ranks, as
redlm bench computes them). Writes OUT/compare.dat for the comparison plot.

usage: bench_load_report.py OUT SWEEP TARGET
"""
import json
import sys

out, sweep, target = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], sys.argv[3]


def pct(v, p):
    if not v:
        return 0.0
    v = sorted(v)
    k = p / 100 * (len(v) - 1)
    i = int(k)
    return v[i] if i + 1 >= len(v) else v[i] + (k - i) * (v[i + 1] - v[i])


def levels(path):
    return json.load(open(f"{out}/{path}/result.json"))["levels"]


def pooled(lvs):
    ok = [q for lv in lvs for q in lv["requests"] if not q["warmup"] and q["error"] is None]
    win = sum(lv["window_s"] for lv in lvs)
    return {"load": lvs[0]["level"], "loop": lvs[0]["loop"], "n": len(ok),
            "req_s": sum(lv["completed"] for lv in lvs) / win if win else 0,
            "tok_s": sum(lv["output_tokens"] for lv in lvs) / win if win else 0,
            "ttft": pct([q["ttft_ms"] for q in ok], 50),
            "tpot": pct([q["tpot_ms"] for q in ok if q["tpot_ms"] is not None], 50),
            "e2e": pct([q["e2e_ms"] for q in ok], 50),
            "e2e99": pct([q["e2e_ms"] for q in ok], 99),
            "cached": sum(q["cached"] for q in ok) / len(ok) if ok else 0,
            "errors": sum(lv["n_errors"] for lv in lvs)}


def turns(name):
    return pooled(levels(f"{name}/r1") + levels(f"{name}/r2"))


rows = [("one-worker", turns(f"one-worker/c{n}")) for n in sweep]
rows += [("two-workers", turns(f"two-workers/c{n}")) for n in sweep]
rows += [("open-loop", pooled([lv])) for lv in levels("open-loop")]
rows += [(n, turns(n)) for n in ("cache-on", "cache-off")]

print(f"# redlm bench, target {target}; results and plots under {out}/<run>/")
hdr = ("run", "load", "requests", "req/s", "tok/s", "ttft p50", "tpot p50", "e2e p50", "e2e p99",
       "cached", "errors")
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for name, r in rows:
    load = f"{r['load']:g} req/s" if r["loop"] == "open" else f"{r['load']:g} clients"
    print(f"| {name} | {load} | {r['n']} | {r['req_s']:.2f} | {r['tok_s']:.1f} | {r['ttft']:.0f} ms | "
          f"{r['tpot']:.1f} ms | {r['e2e']:.0f} ms | {r['e2e99']:.0f} ms | {100 * r['cached']:.0f}% | "
          f"{r['errors']} |")
print()
one = {r["load"]: r for name, r in rows if name == "one-worker"}
two = {r["load"]: r for name, r in rows if name == "two-workers"}
with open(f"{out}/compare.dat", "w") as f:
    f.write("# clients one_tok_s two_tok_s one_e2e_p50 one_e2e_p99 two_e2e_p50 two_e2e_p99\n")
    for n in sweep:
        a, b = one[n], two[n]
        f.write(f"{n} {a['tok_s']:.3f} {b['tok_s']:.3f} {a['e2e']:.3f} {a['e2e99']:.3f} "
                f"{b['e2e']:.3f} {b['e2e99']:.3f}\n")
print("two workers / one worker, output tokens/s: " +
      ", ".join(f"{n} clients {two[n]['tok_s'] / one[n]['tok_s']:.2f}x" for n in sweep if one[n]["tok_s"]))
on, off = dict(rows)["cache-on"], dict(rows)["cache-off"]
if off["req_s"] > 0:
    print(f"result cache on / off: requests/s {on['req_s'] / off['req_s']:.2f}x, "
          f"e2e p50 {on['e2e']:.0f} vs {off['e2e']:.0f} ms, "
          f"cached {100 * on['cached']:.0f}% vs {100 * off['cached']:.0f}%")
