#!/usr/bin/python3
"""The multi-turn benchmark of prefix-affine pulling (issue 27 point 2;
`make bench-affinity`).

One private redis-server, one redlm-dispatcher (with --model, so it can
render and hash prompts) and N CPU workers on the tiny model
(tests/data/models/tiny-qwen3-a). The trace: C conversations sharing one
system prompt (with tools), each of 6-10 turns (drawn with --seed), all
running at once, so their turns arrive interleaved: each conversation sends
its next turn as soon as the previous one is done (greedy, so every phase
sends the very same prompts). Phases, each on freshly started workers
(empty caches) and a fresh key prefix, in one run:

  one      1 worker, the whole trace: the hit rate to match
  off      N workers, affinity off (workers and dispatcher --no-affinity)
  on       N workers, affinity on (the defaults)
  nr-off   N workers, affinity off, a trace with no reuse (every job a
           distinct single-turn prompt, no shared system prompt)
  nr-on    the same with affinity on

Per phase: prompt tokens served from the prefix cache / prompt tokens (from
every done event's usage), client-side TTFT (XADD to the first delta) p50
and p99 over all turns and over turns >= 3, jobs/s and output tokens/s, and
with affinity on the dispatcher's offers, fallbacks and no-match counts.
Then the issue's ratios: fleet hit rate on / one worker (target >= 0.90),
TTFT p50 of turns >= 3 off / on (target >= 2), and no-reuse throughput
on / off (target > 0.98). Output: a table on stdout and $OUT/affinity.json
(OUT defaults to /tmp/bench-affinity). Everything it starts it stops.

  /usr/bin/python3 tests/bench/bench_affinity.py --workers 4 --conversations 12
"""
import argparse
import json
import os
import pathlib
import random
import subprocess
import sys
import threading
import time

import redis

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from local_cluster import start_redis, stop_process, stop_processes  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("BUILD", ROOT / "build"))
MODEL = ROOT / "tests/data/models/tiny-qwen3-a"
TOKENIZER = ROOT / "engine/tokenizers/qwen3"  # the sim workers' (and their dispatcher's) model

SYSTEM = ("You are the support assistant of a company that sells garden tools. Be brief and "
          "exact. Quote the catalogue number of every tool you mention, say when an item is "
          "out of stock, and never promise a delivery date the warehouse has not confirmed. "
          "Prices are in euros and include VAT. Returns are accepted within thirty days with "
          "the receipt. ")
TOOLS = [{"type": "function", "function": {
    "name": "lookup_item", "description": "Find a catalogue item by name or number.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "description": "name or catalogue number"},
        "in_stock_only": {"type": "boolean"}}, "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "order_status", "description": "The status of an order by its number.",
        "parameters": {"type": "object", "properties": {
            "order": {"type": "string"}}, "required": ["order"]}}}]
WORDS = ("spade rake hoe shears trowel hose reel barrow pruner fork mower edger sprinkler "
         "gloves seed tray compost sieve ladder twine stake").split()


def pct(v, q):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]


class Procs:
    def __init__(self, logdir):
        self.logdir = logdir
        self.p = []

    def start(self, name, args):
        log = open(self.logdir / f"{name}.log", "w")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        proc.bench_name = name
        self.p.append((proc, log))
        return proc

    def cpu_s(self, suffix):
        """CPU seconds (user + system) so far of the processes whose name
        ends in suffix (/proc/<pid>/stat)."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for proc, _ in self.p:
            if not proc.bench_name.endswith(suffix) or proc.poll() is not None:
                continue
            try:
                f = pathlib.Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(f[11]) + int(f[12])) / tick
            except (OSError, IndexError, ValueError):
                pass
        return total

    def stop_all(self):
        stop_processes([proc for proc, _ in self.p], 30)
        for _, log in self.p:
            log.close()
        self.p = []


def user_turn(rng, c, t, n_words):
    a, b = rng.choice(WORDS), rng.choice(WORDS)
    notes = " ".join(rng.choice(WORDS) for _ in range(n_words))
    return (f"Customer {c}, message {t}: do you have the {a} and a matching {b}? I need "
            f"catalogue numbers and whether they ship this week. My order notes: {notes}")


def make_trace(seed, n_conv, min_turns, max_turns, n_words):
    rng = random.Random(seed)
    return [[user_turn(rng, c, t, n_words) for t in range(rng.randint(min_turns, max_turns))]
            for c in range(n_conv)]


def make_noreuse(seed, n_jobs, lanes=8):
    """n_jobs distinct prompts (no shared prefix beyond the template's
    first tokens) in `lanes` closed-loop lanes, each job on its own."""
    rng = random.Random(seed + 1)
    out = [[] for _ in range(lanes)]
    for i in range(n_jobs):
        words = " ".join(rng.choice(WORDS) for _ in range(60))
        out[i % lanes].append(f"{rng.random():.12f} {i} {words}")
    return out


def run_phase(args, name, affinity, trace, shared, n_workers, r, addr, procs, logdir):
    prefix = f"ba{name.replace('-', '')}{int(time.time() * 1000) % 100000}:"
    aff = [] if affinity else ["--no-affinity"]
    model = pathlib.Path(args.model)
    backend = []
    if args.backend == "sim":  # a modelled H200 serving Qwen3-14B (engine/sim/)
        model = TOKENIZER
        backend = ["--backend", "sim", "--sim-profile", "h200", "--sim-model", "qwen3-14b"]
    for i in range(n_workers):
        procs.start(f"{name}-w{i}", [str(BUILD / "redlm-worker"), "--redis", addr, "--model",
                                     str(model), "--pools", "fast,think", "--name", f"w{i}",
                                     "--threads", "1", "--prefix", prefix, "--http-port", "0",
                                     "--no-result-cache", *backend, *aff])
    procs.start(f"{name}-d", [str(BUILD / "redlm-dispatcher"), "--redis", addr, "--model",
                              str(model), "--prefix", prefix, "--name", "d", "--http-port", "0",
                              *aff])
    deadline = time.time() + 300
    while time.time() < deadline:
        if r.zcard(f"{prefix}workers") >= n_workers and r.exists(f"{prefix}dispatcher:d") and \
                all(r.exists(f"{prefix}worker:w{i}") for i in range(n_workers)):
            break
        time.sleep(0.1)
    else:
        raise RuntimeError(f"{name}: the fleet did not come up (logs in {logdir})")
    results = []  # (conv, turn, prompt_tokens, cached, completion_tokens, ttft_s)
    lock = threading.Lock()
    errors = []

    def conversation(c, turns):
        rc = redis.Redis.from_url(f"redis://{addr}", decode_responses=True)
        msgs = [{"role": "system", "content": SYSTEM}] if shared else []
        for t, text in enumerate(turns):
            if not shared:
                msgs = []  # no reuse: every job on its own
            msgs.append({"role": "user", "content": text})
            jid = f"{prefix}c{c}t{t}"
            job = {"id": jid, "messages": msgs, "max_tokens": args.max_tokens, "temperature": 0,
                   "mode": "no_think"}
            if shared:
                job["tools"] = TOOLS
            t0 = time.time()
            rc.xadd(f"{prefix}requests", {"job": json.dumps(job)})
            last, first, reply, done = "0-0", None, [], None
            while done is None:
                res = rc.xread({f"{prefix}out:{jid}": last}, block=60000, count=1000)
                if not res:
                    errors.append(f"{jid}: no events in 60 s")
                    return
                for _, entries in res:
                    for eid, f in entries:
                        last = eid
                        ev = json.loads(f["event"])
                        if ev["type"] == "delta":
                            if first is None:
                                first = time.time()
                            reply.append(ev.get("delta", {}).get("content") or "")
                        elif ev["type"] == "error":
                            errors.append(f"{jid}: {ev}")
                        elif ev["type"] == "done":
                            done = ev
            u = done.get("usage") or {}
            with lock:
                results.append((c, t, u.get("prompt_tokens", 0), u.get("cached_prompt_tokens", 0),
                                u.get("completion_tokens", 0), (first or time.time()) - t0))
            msgs.append({"role": "assistant", "content": "".join(reply)})

    cpu0_d, cpu0_w = procs.cpu_s("-d"), sum(procs.cpu_s(f"-w{i}") for i in range(n_workers))
    t_start = time.time()
    threads = [threading.Thread(target=conversation, args=(c, turns)) for c, turns in enumerate(trace)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.time() - t_start
    cpu_d = procs.cpu_s("-d") - cpu0_d
    cpu_w = sum(procs.cpu_s(f"-w{i}") for i in range(n_workers)) - cpu0_w
    dh = {}
    if affinity:
        t_end = time.time() * 1000
        deadline = time.time() + 10
        while time.time() < deadline:
            dh = json.loads(r.get(f"{prefix}dispatcher:d") or "{}")
            if dh.get("time_ms", 0) > t_end:
                break
            time.sleep(0.05)
    procs.stop_all()
    if errors:
        raise RuntimeError(f"{name}: {errors[:3]}")
    prompt = sum(x[2] for x in results)
    cached = sum(x[3] for x in results)
    late = [x[5] for x in results if x[1] >= 2]
    every = [x[5] for x in results]
    a = dh.get("affinity", {})
    return {
        "phase": name, "workers": n_workers, "affinity": affinity, "jobs": len(results),
        "prompt_tokens": prompt, "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "ttft_p50_ms": pct(every, 0.5) * 1000, "ttft_p99_ms": pct(every, 0.99) * 1000,
        "ttft3_p50_ms": pct(late, 0.5) * 1000, "ttft3_p99_ms": pct(late, 0.99) * 1000,
        "wall_s": wall, "jobs_per_s": len(results) / wall,
        "out_tok_per_s": sum(x[4] for x in results) / wall,
        "dispatcher_cpu_us_per_job": cpu_d * 1e6 / max(1, len(results)),
        "worker_cpu_ms_per_job": cpu_w * 1e3 / max(1, len(results)),
        "offers": a.get("offers", 0), "fallbacks": a.get("fallbacks", 0),
        "no_match": a.get("no_match", 0), "deep": a.get("deep", 0),
        "fleet_hit_ratio_dispatcher": (a.get("fleet_prefix_hit_tokens", 0) /
                                       max(1, a.get("fleet_prefix_hit_tokens", 0) +
                                           a.get("fleet_prefix_miss_tokens", 0))),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("cpu", "sim"), default="cpu",
                    help="cpu: the tiny model; sim: modelled H200s serving Qwen3-14B (use --workers 16)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--model", default=str(MODEL),
                    help="CPU workers' model (default the tiny one; `redlm mkmodel` makes larger)")
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--min-turns", type=int, default=6)
    ap.add_argument("--max-turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--user-words", type=int, default=60,
                    help="words of order notes pasted into every user turn (history growth)")
    ap.add_argument("--noreuse-jobs", type=int, default=160)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--phases", default="one,off,on,nr-off,nr-on,nr-off,nr-on,nr-off,nr-on",
                    help="phases in order; the no-reuse pair three times, averaged")
    args = ap.parse_args()
    out = pathlib.Path(os.environ.get("OUT", "/tmp/bench-affinity"))
    out.mkdir(parents=True, exist_ok=True)
    logdir = out / "logs"
    logdir.mkdir(exist_ok=True)
    redis_proc, addr, r = start_redis(logdir)
    trace = make_trace(args.seed, args.conversations, args.min_turns, args.max_turns,
                       args.user_words)
    noreuse = make_noreuse(args.seed, args.noreuse_jobs)
    plan = {"one": (True, trace, True, 1), "off": (False, trace, True, args.workers),
            "on": (True, trace, True, args.workers),
            "nr-off": (False, noreuse, False, args.workers),
            "nr-on": (True, noreuse, False, args.workers)}
    rows = []
    procs = Procs(logdir)
    try:
        for name in args.phases.split(","):
            aff, tr, shared, nw = plan[name]
            print(f"phase {name}: {nw} workers, affinity {'on' if aff else 'off'}, "
                  f"{sum(len(c) for c in tr)} jobs", file=sys.stderr, flush=True)
            rows.append(run_phase(args, name, aff, tr, shared, nw, r, addr, procs, logdir))
    finally:
        procs.stop_all()
        stop_process(redis_proc, 10)
    hdr = (f"{'phase':7} {'wk':>3} {'jobs':>5} {'prompt':>7} {'cached':>7} {'hit':>6} "
           f"{'ttft p50':>9} {'p99':>8} {'t>=3 p50':>9} {'p99':>8} {'jobs/s':>7} {'tok/s':>7} "
           f"{'offers':>6} {'fallb':>5} {'nomatch':>7} {'deep':>5} {'disp us/job':>11} {'wk ms/job':>9}")
    print(hdr)
    for x in rows:
        print(f"{x['phase']:7} {x['workers']:>3} {x['jobs']:>5} {x['prompt_tokens']:>7} "
              f"{x['cached_tokens']:>7} {x['hit_rate']:>6.3f} {x['ttft_p50_ms']:>7.1f}ms "
              f"{x['ttft_p99_ms']:>6.1f}ms {x['ttft3_p50_ms']:>7.1f}ms {x['ttft3_p99_ms']:>6.1f}ms "
              f"{x['jobs_per_s']:>7.2f} {x['out_tok_per_s']:>7.1f} {x['offers']:>6} "
              f"{x['fallbacks']:>5} {x['no_match']:>7} {x['deep']:>5} "
              f"{x['dispatcher_cpu_us_per_job']:>11.0f} {x['worker_cpu_ms_per_job']:>9.2f}")
    by = {x["phase"]: x for x in rows}
    for ph in ("nr-off", "nr-on"):  # repeated phases: their mean throughput
        xs = [x for x in rows if x["phase"] == ph]
        if len(xs) > 1:
            by[ph] = dict(xs[-1], jobs_per_s=sum(x["jobs_per_s"] for x in xs) / len(xs),
                          dispatcher_cpu_us_per_job=sum(x["dispatcher_cpu_us_per_job"]
                                                        for x in xs) / len(xs))
    ratios = {}
    if "one" in by and "on" in by and by["one"]["hit_rate"]:
        ratios["hit_on_over_one"] = by["on"]["hit_rate"] / by["one"]["hit_rate"]
    if "one" in by and "off" in by and by["one"]["hit_rate"]:
        ratios["hit_off_over_one"] = by["off"]["hit_rate"] / by["one"]["hit_rate"]
    if "off" in by and "on" in by and by["on"]["ttft3_p50_ms"]:
        ratios["ttft3_p50_off_over_on"] = by["off"]["ttft3_p50_ms"] / by["on"]["ttft3_p50_ms"]
    if "nr-off" in by and "nr-on" in by and by["nr-off"]["jobs_per_s"]:
        ratios["noreuse_jobs_per_s_on_over_off"] = by["nr-on"]["jobs_per_s"] / by["nr-off"]["jobs_per_s"]
    if "nr-off" in by and "nr-on" in by:
        ratios["noreuse_dispatcher_us_per_job_on_minus_off"] = (
            by["nr-on"]["dispatcher_cpu_us_per_job"] - by["nr-off"]["dispatcher_cpu_us_per_job"])
    for k, v in ratios.items():
        print(f"{k} = {v:.3f}")
    (out / "affinity.json").write_text(json.dumps({"args": vars(args), "rows": rows,
                                                   "ratios": ratios}, indent=1))
    print(f"written: {out / 'affinity.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
