"""Speculative decoding through the real worker, the real redis-server and the
tiny model: a worker with speculative = ngram streams the same tokens and
logprobs as `redlm run --batch` without speculation (greedy and seeded
jobs, prompts that repeat themselves so prompt lookup drafts), a job's
"speculative": false, drafted/accepted counts in the done event's timings
and in /metrics, a bad "speculative" value as an error event plus dead
letter, and the CLI's `run --speculative` and `bench-engine --speculative`.

Run with Debian's interpreter: /usr/bin/python3 -m pytest tests/integration
"""
import json
import random
import struct
import subprocess
import time
import urllib.request

import pytest

from conftest import CLI, MODEL, check_stream, free_port


def spec_jobs(n, seed):
    """Jobs whose prompts repeat a span (prompt lookup finds drafts there):
    greedy and seeded sampling, some with logprobs."""
    rnd = random.Random(seed)
    jobs = []
    for i in range(n):
        span = [rnd.randrange(0, 736) for _ in range(rnd.randint(4, 12))]
        ids = span * rnd.randint(2, 4) + span[: rnd.randint(1, len(span))]
        j = {"id": f"sp{seed}-{i}", "prompt_ids": ids, "max_tokens": rnd.randint(8, 24),
             "ignore_eos": True, "cache": False}
        if i % 2:
            j.update(temperature=0.8, top_k=40, seed=1000 + i, logprobs=2,
                     repetition_penalty=1.1)
        else:
            j.update(temperature=0, logprobs=0)
        jobs.append(j)
    return jobs


def plain_reference(jobs, tmp_path):
    """(tokens, logprobs) of each job from `redlm run --batch`, speculation off."""
    path = tmp_path / "spec-ref.jsonl"
    keep = ("prompt_ids", "max_tokens", "temperature", "top_k", "seed", "logprobs",
            "repetition_penalty", "ignore_eos")
    with open(path, "w") as f:
        for j in jobs:
            line = {k: j[k] for k in keep if k in j}
            if "logprobs" in line:
                line["logprobs"] = True
            f.write(json.dumps(line) + "\n")
    out = subprocess.run([str(CLI), "run", "-m", str(MODEL), "--batch", str(path),
                          "--threads", "1"], capture_output=True, text=True, check=True,
                         timeout=300)
    lines = [json.loads(l) for l in out.stdout.splitlines() if l.strip()]
    assert len(lines) == len(jobs)
    return [(l["tokens"], l["logprobs"]) for l in lines]


def stream_logprobs(events):
    lps = []
    for _, ev in events:
        if ev["type"] == "delta" and "logprobs" in ev:
            lps += [x["logprob"] for x in ev["logprobs"]]
    return lps


def f32(xs):
    return [struct.unpack("<f", struct.pack("<f", x))[0] for x in xs]


def metric(text, name):
    # every worker sample carries its model_name label (issue 20)
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(None, 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_worker_speculative_same_tokens(workers, client, event_validator, tmp_path):
    """The same jobs on a speculating worker and on a plain one (pools of
    their own): the same tokens and logprobs; greedy ones also equal
    `redlm run --batch`."""
    port = free_port()
    workers("spec", "--speculative", "ngram", "--spec-tokens", "3", "--http-port", str(port),
            pools="fast")
    workers("plain", pools="plainpool")
    jobs = spec_jobs(12, seed=3)
    jobs.append({**jobs[0], "id": "sp-off", "speculative": False})
    ref = plain_reference([j for j in jobs if j["temperature"] == 0], tmp_path)
    for j in jobs:
        client.submit(j, pool="fast")
        client.submit({**j, "id": "p-" + j["id"]}, pool="plainpool")
    plain = {}
    for j in jobs:
        evs = client.events("p-" + j["id"], timeout=120)
        tokens, done = check_stream(evs, event_validator)
        assert "spec_drafted" not in done["timings"]
        plain[j["id"]] = (tokens, stream_logprobs(evs))
    greedy = iter(ref)
    drafted = accepted = 0
    for j in jobs:
        evs = client.events(j["id"], timeout=120)
        tokens, done = check_stream(evs, event_validator)
        assert (tokens, stream_logprobs(evs)) == plain[j["id"]], j["id"]
        if j["temperature"] == 0:
            want, want_lp = next(greedy)
            assert tokens == want, j["id"]
            # the same float32 values (each side prints them its own way)
            assert f32(stream_logprobs(evs)) == f32(want_lp), j["id"]
        t = done["timings"]
        if j["id"] == "sp-off":  # it asked for plain decoding: no counts
            assert "spec_drafted" not in t
            continue
        assert "spec_drafted" in t and "spec_accepted" in t and "spec_acceptance" in t
        assert 0 <= t["spec_accepted"] <= t["spec_drafted"]
        if t["spec_drafted"]:
            assert abs(t["spec_acceptance"] - t["spec_accepted"] / t["spec_drafted"]) < 1e-4
        drafted += t["spec_drafted"]
        accepted += t["spec_accepted"]
    assert drafted > 0, "prompt lookup drafted nothing on repeating prompts"
    # the counters reach the totals (the loop refreshes them every pass)
    deadline = time.time() + 10
    while True:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        d = metric(text, "redlm_spec_drafted_tokens_total")
        a = metric(text, "redlm_spec_accepted_tokens_total")
        if (d, a) == (drafted, accepted) or time.time() > deadline:
            break
        time.sleep(0.1)
    assert (d, a) == (drafted, accepted)


def test_bad_speculative_field(workers, client, event_validator, dead_validator):
    workers("bad", "--speculative", "ngram")
    client.submit({"id": "bs", "prompt_ids": [1, 2], "max_tokens": 2, "speculative": "yes"})
    evs = client.events("bs", timeout=20)
    check_stream(evs, event_validator)
    err = evs[0][1]
    assert err["type"] == "error" and err["code"] == "BAD_TYPE"
    assert "speculative" in err["message"]
    deadline = time.time() + 10
    while not client.r.xlen(f"{client.prefix}dead") and time.time() < deadline:
        time.sleep(0.05)
    d = json.loads(client.r.xrange(f"{client.prefix}dead")[-1][1]["dead"])
    dead_validator.validate(d)
    assert d["code"] == "BAD_TYPE"


def test_cli_run_speculative(built):
    span = [17, 300, 42, 9, 501]
    ids = ",".join(str(x) for x in span * 4)
    base = [str(CLI), "run", "-m", str(MODEL), "--tokens", ids, "-n", "24", "--ignore-eos",
            "--threads", "1"]
    plain = json.loads(subprocess.run(base, capture_output=True, text=True, check=True,
                                      timeout=120).stdout)
    spec = json.loads(subprocess.run(base + ["--speculative", "ngram", "--spec-tokens", "3"],
                                     capture_output=True, text=True, check=True,
                                     timeout=120).stdout)
    assert spec["tokens"] == plain["tokens"]
    assert spec["spec"]["mode"] == "ngram" and spec["spec"]["drafted"] > 0
    bad = subprocess.run(base + ["--speculative", "eagle"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode != 0 and "--speculative" in bad.stderr


def test_bench_engine_speculative_oracle(built):
    def bench(*extra):
        out = subprocess.run([str(CLI), "bench-engine", "-m", str(MODEL), "--prompt", "16",
                              "--gen", "24", "--batch", "2", "--reps", "1", "--threads", "1",
                              *extra], capture_output=True, text=True, check=True, timeout=120)
        return json.loads(out.stdout.strip().split("\n")[-1])  # not at U+2028 etc.
    full = bench("--speculative", "oracle", "--spec-correct", "100")
    assert full["identical"] is True
    assert full["acceptance"] == 1.0
    none = bench("--speculative", "oracle", "--spec-correct", "0")
    assert none["identical"] is True
    assert none["acceptance"] == 0.0
    # a single draft token, a miss, another, a miss, then the off-switch's
    # pause of 8 steps and one probe (spec.c): 3 draft rows in 24 tokens
    assert none["drafted_per_token"] == pytest.approx(3 / 24, abs=1e-3)
    assert none["lookup_us_per_call"] > 0
    rep = bench("--speculative", "ngram", "--repeat")
    assert rep["identical"] is True and rep["source"] == "ngram"
