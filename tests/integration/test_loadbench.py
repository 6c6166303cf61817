"""`redlm bench` against a real redis-server and a real worker on the tiny
model: the result JSON counts what the workers did (done events and their
completion tokens on the out streams), percentiles are ordered, repeated
prompts come back from the result cache when it is on and never when it is
off, errors are counted by their protocol code, the open loop runs, the
PNG plots are real PNG files (when gnuplot is installed), and the command
refuses a non-loopback Redis and a missing dispatcher.

Run with Debian's interpreter: /usr/bin/python3 -m pytest tests/integration/test_loadbench.py
"""
import json
import shutil
import subprocess

import pytest

from conftest import CLI, MODEL, connect, tap

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench(redis_addr, prefix, out, *extra, timeout=120):
    args = [str(CLI), "bench", "--redis", redis_addr, "--prefix", prefix, "--out", str(out),
            "--timeout", "60", *extra]
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    full = json.loads(out.read_text())
    return summary, full, p.stderr


def out_streams(r, prefix):
    """{job id: [events]} of every out stream under prefix."""
    streams = {}
    for key in r.scan_iter(match=f"{prefix}out:*", count=1000):
        jid = key[len(prefix) + 4:]
        streams[jid] = [json.loads(f["event"]) for _, f in r.xrange(key)]
    return streams


def ordered(s):
    return s["min"] <= s["p50"] <= s["p90"] <= s["p99"] <= s["max"]


@pytest.mark.parametrize("read", ["shared", "all", "own"])
def test_counts_match_the_workers(workers, client, redis_addr, prefix, tmp_path, read):
    """Every event of every request counted, whether the requests are read
    by one shared XREAD (the default, as the front door reads) or each by
    its own."""
    workers("w1")
    out = tmp_path / "res" / "result.json"
    summary, full, table = bench(redis_addr, prefix, out, "--target", "pool:fast", "--clients", "4",
                                 "--requests", "20", "--repeat", "0.5", "--hot", "1",
                                 "--output-len", "4..12", "--prompt-len", "3..12", "--seed", "3",
                                 "--read", read)
    assert "req/s" in table  # the table on stderr
    (lv,) = full["levels"]
    assert lv["read"] == read and full["options"]["read"] == read
    assert (lv["shared_reads"] > 0) == (read != "own")  # the shared reader's own count
    assert summary["levels"][0]["completed"] == lv["completed"]
    assert "requests" not in summary["levels"][0]  # the summary leaves the records out

    streams = out_streams(client.r, prefix)
    dones = {jid: evs[-1] for jid, evs in streams.items() if evs and evs[-1]["type"] == "done"}
    assert len(streams) == 20 and len(dones) == 20
    assert lv["issued"] == lv["measured"] == lv["completed"] == 20
    assert lv["n_errors"] == 0 and lv["errors"] == {}
    assert lv["output_tokens"] == sum(d["usage"]["completion_tokens"] for d in dones.values())
    assert lv["delta_tokens"] == lv["output_tokens"]
    assert lv["prompt_tokens"] == sum(d["usage"]["prompt_tokens"] for d in dones.values())
    # ignore_eos: every request got exactly the max_tokens it asked for
    recs = {q["id"]: q for q in lv["requests"]}
    assert set(recs) == set(dones)
    for jid, q in recs.items():
        assert q["completion_tokens"] == q["max_tokens"] == dones[jid]["usage"]["completion_tokens"]
        assert q["events"] == len(streams[jid])
        assert q["cached"] == dones[jid]["cached"]
        assert q["error"] is None and q["finish_reason"] == "length"
        assert 0 <= q["ttft_ms"] <= q["e2e_ms"]

    for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert lv[name]["n"] > 0 and ordered(lv[name]), (name, lv[name])
    assert lv["e2e_ms"]["n"] == 20
    # half the requests repeat one greedy prompt: after the first, the cache answers
    repeated = [q for q in lv["requests"] if q["repeated"]]
    cached = [q for q in lv["requests"] if q["cached"]]
    assert len(repeated) >= 5
    assert 1 <= len(cached) <= len(repeated) - 1
    assert all(q["repeated"] for q in cached)
    assert lv["cached"] == len(cached)
    assert lv["cached_fraction"] == pytest.approx(len(cached) / 20)
    assert lv["requests_per_s"] > 0 and lv["output_tokens_per_s"] > 0
    assert sum(lv["timeline"]["requests"]) == 20
    assert sum(lv["timeline"]["output_tokens"]) == lv["output_tokens"]

    if shutil.which("gnuplot"):
        assert len(full["plots"]) == 2
        for png in full["plots"]:
            data = open(png, "rb").read()
            assert data[:8] == PNG_MAGIC and len(data) > 1000, png
    else:
        assert full["plots"] == []


def test_cache_off_never_cached(workers, client, redis_addr, prefix, tmp_path):
    tap(client.r, f"{prefix}jobs:fast", f"{prefix}jobs:think")  # counted below
    workers("w1", "--no-result-cache")
    out = tmp_path / "result.json"
    _, full, _ = bench(redis_addr, prefix, out, "--target", "pools", "--clients", "2",
                       "--requests", "12", "--repeat", "0.7", "--hot", "1", "--think", "0.5",
                       "--output-len", "4", "--prompt-len", "4", "--no-plots")
    (lv,) = full["levels"]
    assert lv["completed"] == 12 and lv["cached"] == 0 and lv["cached_fraction"] == 0
    assert any(q["repeated"] for q in lv["requests"])
    assert full["plots"] == []
    modes = {q["mode"] for q in lv["requests"]}
    assert modes <= {"think", "no_think"}
    # --target pools: think jobs went to the think pool, the others to fast
    r = client.r
    n_think = sum(q["mode"] == "think" for q in lv["requests"])
    assert r.xlen(f"{prefix}jobs:think") == n_think
    assert r.xlen(f"{prefix}jobs:fast") == 12 - n_think


def test_errors_by_code_and_open_loop(workers, redis_addr, prefix, tmp_path):
    workers("w1")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2, 3]}\n\n"a plain user message"\n'
                       '{"prompt_ids": [1, 99999], "max_tokens": 3}\n')
    out = tmp_path / "result.json"
    _, full, _ = bench(redis_addr, prefix, out, "--target", "pool:fast", "--rate", "40",
                       "--clients", "8", "--requests", "24", "--prompts", str(prompts),
                       "--output-len", "3", "--warmup", "4", "--no-plots")
    (lv,) = full["levels"]
    assert lv["loop"] == "open" and lv["rate"] == 40
    assert lv["issued"] == 24 and lv["measured"] == 20 and lv["warmup"] == 4
    assert lv["n_errors"] > 0 and set(lv["errors"]) == {"INVALID_TOKEN"}
    assert lv["completed"] + lv["n_errors"] == 20
    bad = [q for q in lv["requests"] if q["error"]]
    assert all(q["error"] == "INVALID_TOKEN" and q["completion_tokens"] == 0 for q in bad)
    # open loop: arrival times come from the Poisson process, not from completions
    sched = sorted(q["sched_ms"] for q in lv["requests"])
    assert sched == sorted(set(sched)) and sched[-1] > 0


def test_refusals(built, redis_addr, prefix, tmp_path):
    def run(*args):
        return subprocess.run([str(CLI), "bench", *args], capture_output=True, text=True, timeout=30)

    p = run("--redis", "10.1.2.3:6379")
    assert p.returncode == 2 and "not a loopback address" in p.stderr
    p = run("--redis", redis_addr, "--prefix", prefix, "--requests", "1")
    assert p.returncode == 1 and "no dispatcher heartbeat" in p.stderr
    p = run("--redis", redis_addr, "--prefix", prefix, "--target", "pool:fast")
    assert p.returncode == 1 and "no worker heartbeat" in p.stderr
    p = run("--redis", redis_addr, "--auto", "0.5", "--target", "pool:fast")
    assert p.returncode == 2 and "--auto needs --target dispatcher" in p.stderr
    p = run("--redis", redis_addr, "--output-len", "9..3")
    assert p.returncode == 2 and "--output-len" in p.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "temperature": 1}\n')
    p = run("--redis", redis_addr, "--prompts", str(bad))
    assert p.returncode == 1 and "bad.jsonl:1" in p.stderr and "temperature" in p.stderr
    p = run("--help")
    assert p.returncode == 0 and "--sweep" in p.stdout


def test_timeout_cancels(built, redis_addr, prefix, tmp_path):
    """Nobody serves the pool: each request times out, is counted TIMEOUT and
    cancelled through <prefix>cancel:<id>, and the command still reports."""
    out = tmp_path / "result.json"
    _, full, _ = bench(redis_addr, prefix, out, "--target", "pool:nobody", "--no-check",
                       "--clients", "2", "--requests", "3", "--timeout", "0.5", "--no-plots")
    (lv,) = full["levels"]
    assert lv["completed"] == 0 and lv["errors"] == {"TIMEOUT": 3}
    r = connect(redis_addr)
    for q in lv["requests"]:
        assert q["error"] == "TIMEOUT" and q["e2e_ms"] >= 500
        assert r.get(f"{prefix}cancel:{q['id']}") == "1"
        assert 0 < r.ttl(f"{prefix}cancel:{q['id']}") <= 600
    assert r.xlen(f"{prefix}jobs:nobody") == 3


def test_through_the_dispatcher(workers, dispatchers, client, redis_addr, prefix, tmp_path):
    """The default target: jobs go to <prefix>requests, the dispatcher routes
    them by mode (auto: no mode, its ratio decides) and answers repeated
    greedy prompts from the result cache itself once a worker has filled it."""
    tap(client.r, f"{prefix}requests")  # counted below
    workers("w1")
    dispatchers("d1", "--model", str(MODEL))
    out = tmp_path / "result.json"
    _, full, _ = bench(redis_addr, prefix, out, "--clients", "4", "--requests", "20",
                       "--think", "0.3", "--auto", "0.3", "--repeat", "0.5", "--hot", "1",
                       "--output-len", "4..8", "--prompt-len", "3..8", "--seed", "4", "--no-plots")
    assert full["target"] == "dispatcher"
    (lv,) = full["levels"]
    assert lv["completed"] == 20 and lv["n_errors"] == 0
    r = client.r
    assert r.xlen(f"{prefix}requests") == 20
    streams = out_streams(r, prefix)
    dones = [evs[-1] for evs in streams.values() if evs and evs[-1]["type"] == "done"]
    assert len(dones) == 20
    assert lv["output_tokens"] == sum(d["usage"]["completion_tokens"] for d in dones)
    assert lv["cached"] == sum(d["cached"] for d in dones) >= 1
    pool_of = {}
    for pool in ("fast", "think"):
        for _, f in r.xrange(f"{prefix}jobs:{pool}"):
            pool_of[json.loads(f["job"])["id"]] = pool
    assert len(pool_of) <= 20 - 1  # at least one answered by the cache, never forwarded
    modes = {q["mode"] for q in lv["requests"]}
    assert modes <= {"think", "no_think", "auto"} and "auto" in modes
    for q in lv["requests"]:
        if q["id"] in pool_of and q["mode"] != "auto":
            assert pool_of[q["id"]] == ("think" if q["mode"] == "think" else "fast"), q


def test_plots_separate_axes_whole_buckets_and_units(workers, redis_addr, prefix, tmp_path):
    """The table's header names its units; the plots draw tokens/s and
    requests/s on axes of their own (no second y axis), and the timeline
    stops at the last whole second: the level ends inside its last bucket,
    which would otherwise show as a false drop."""
    if not shutil.which("gnuplot"):
        pytest.skip("gnuplot not installed (apt-get install gnuplot-nox, or make deps)")
    workers("w1")
    out = tmp_path / "res" / "result.json"
    # open loop at 10 req/s: the level lasts about 2.5 s and ends mid-second
    summary, full, table = bench(redis_addr, prefix, out, "--target", "pool:fast", "--rate", "10",
                                 "--requests", "25", "--output-len", "30..40", "--prompt-len", "3..6",
                                 "--seed", "4", "--repeat", "0")
    header = table.splitlines()[[i for i, l in enumerate(table.splitlines()) if "tok/s" in l][0]]
    for col in ("rate (req/s)", "req/s", "tok/s", "ttft p50 (ms)", "ttft p99 (ms)", "tpot p50 (ms/tok)",
                "e2e p50 (ms)", "e2e p99 (ms)"):
        assert col in header, (col, header)
    gp = (out.parent / "plots.gp").read_text()
    assert "axes x1y2" not in gp and "y2tics" not in gp
    assert "set ylabel 'output tokens/s'" in gp and "set ylabel 'completed requests/s'" in gp
    (lv,) = full["levels"]
    tl = lv["timeline"]
    end = tl["end_s"]
    assert len(tl["requests"]) - 1 <= end < len(tl["requests"])  # the JSON keeps the partial one
    blocks = [b for b in (out.parent / "timeline.dat").read_text().split("\n\n\n") if b.strip()]
    rows = [list(map(float, l.split())) for l in blocks[0].splitlines() if l and not l.startswith("#")]
    whole = int(end) if end >= 1 else 1
    assert max(r[0] for r in rows) == (whole if end >= 1 else pytest.approx(end, abs=1e-3))
    # the rows are the JSON's whole buckets, per second
    for b in range(whole if end >= 1 else 0):
        assert rows[2 * b][1] == tl["requests"][b] and rows[2 * b][2] == tl["output_tokens"][b]
    for png in full["plots"]:
        assert open(png, "rb").read()[:8] == PNG_MAGIC
