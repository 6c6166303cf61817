"""The worker against a real redis-server with the tiny model: load, schema,
seq, greedy equality with `redlm run --batch`, malformed jobs, cancellation,
deadlines, the result cache, heartbeat, metrics and SIGTERM drain.

Run with Debian's interpreter: /usr/bin/python3 -m pytest tests/integration
"""
import json
import signal
import subprocess
import time
import urllib.request

import pytest

from conftest import (MODEL, WORKER, check_stream, connect, free_port, greedy_jobs,
                      promtool_check, reference, run_threads)

ROOT_SCHEMAS = __import__("conftest").SCHEMAS


def wait_len(r, key, n, timeout=20):
    deadline = time.time() + timeout
    while r.xlen(key) < n:
        assert time.time() < deadline, f"{key}: fewer than {n} events after {timeout}s"
        time.sleep(0.005)


def test_200_jobs_20_threads(workers, client, event_validator, tmp_path):
    workers("w1")
    jobs = greedy_jobs(200, seed=5)
    ref = reference(jobs, tmp_path)

    def one(job):
        client.submit(job, pool="fast" if int(job["id"][1:]) % 3 else "think")
        return client.events(job["id"], timeout=120)

    streams = run_threads(one, jobs, 20)
    for job, evs, want in zip(jobs, streams, ref):
        tokens, done = check_stream(evs, event_validator)
        assert tokens == want, job["id"]
        assert done["finish_reason"] == "length"
        assert done["usage"]["completion_tokens"] == job["max_tokens"]
        assert done["usage"]["prompt_tokens"] == len(job["prompt_ids"])
        assert done["cached"] is False
    r = client.r
    for pool in ("fast", "think"):
        assert r.xpending(f"{client.prefix}jobs:{pool}", "workers")["pending"] == 0


def test_text_and_chat_jobs(workers, client, event_validator):
    workers("w1")
    client.submit({"id": "chat1", "messages": [{"role": "user", "content": "hello"}],
                   "max_tokens": 6, "temperature": 0, "metadata": {"k": [1, 2]}})
    client.submit({"id": "text1", "prompt": "once upon", "max_tokens": 5, "temperature": 0.8,
                   "seed": 7, "logprobs": 2})
    _, done = check_stream(client.events("chat1"), event_validator)
    assert done["metadata"] == {"k": [1, 2]}
    evs = client.events("text1")
    check_stream(evs, event_validator)
    deltas = [e for _, e in evs if e["type"] == "delta"]
    assert all(len(d["logprobs"]) == len(d["token_ids"]) for d in deltas)


def malformed_cases():
    corpus = json.loads((ROOT_SCHEMAS / "examples" / "jobs-invalid.json").read_text())
    cases = [(c["job"], c["code"]) for c in corpus[:92]]
    cases += [
        ('{"prompt_ids":[1,2],"max_tokens":1048576}', "PROMPT_TOO_LONG"),
        ('{"prompt_ids":[1,99999],"max_tokens":2}', "INVALID_TOKEN"),
        ('{"prompt_ids":[1,2],"pool":"nope"}', "UNKNOWN_POOL"),
        ('{"prompt_ids":[1,2],"pool":"think"}', "UNKNOWN_POOL"),
        ('{"messages":[{"role":"user"}],"max_tokens":2}', None),
        ('{"prompt_ids":[1],"temperature":-1}', "OUT_OF_RANGE"),
        ('{"prompt_ids":[1],"top_k":"5"}', "BAD_TYPE"),
        ('{"prompt_ids":[1],"mode":"fast"}', "BAD_VALUE"),
    ]
    return cases[:100]


def with_id(raw, i):
    """The job with an id put first, when it is a JSON object without one:
    then its client can read the error event too."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return raw, None
    if not isinstance(doc, dict) or "id" in doc or not raw.lstrip().startswith("{"):
        return raw, None
    body = raw.lstrip()[1:]
    jid = f"bad{i}"
    sep = "" if body.lstrip().startswith("}") else ","
    return '{"id":"%s"%s%s' % (jid, sep, body), jid


def test_100_malformed_jobs(workers, client, event_validator, dead_validator, tmp_path):
    workers("w1")
    cases = malformed_cases()
    assert len(cases) == 100
    good = greedy_jobs(20, seed=9, tag="ok")
    ref = reference(good, tmp_path)
    sent = []  # (entry id, raw, code, job id)
    for i, (raw, code) in enumerate(cases):
        raw2, jid = with_id(raw, i)
        sent.append((client.submit(None, raw=raw2), raw2, code, jid))
        if i % 5 == 0:
            client.submit(good[i // 5])
    client.r.xadd(f"{client.prefix}jobs:fast", {"notjob": "x"})  # BAD_ENTRY
    for job, want in zip(good, ref):
        tokens, _ = check_stream(client.events(job["id"]), event_validator)
        assert tokens == want
    # every bad job: a dead letter with its code, and the error event when it has an id
    deadline = time.time() + 30
    while time.time() < deadline:
        dead = client.r.xrange(f"{client.prefix}dead")
        if len(dead) >= 101:
            break
        time.sleep(0.1)
    by_entry = {}
    for _, f in dead:
        d = json.loads(f["dead"])
        dead_validator.validate(d)
        by_entry[d["entry_id"]] = d
    assert len(by_entry) == 101
    assert any(d["code"] == "BAD_ENTRY" for d in by_entry.values())
    for entry, raw, code, jid in sent:
        d = by_entry[entry]
        assert d["job"] == raw
        assert d["worker"] == "w1"
        if code:
            assert d["code"] == code, (raw, d)
        else:
            assert d["code"] in ("MISSING_FIELD", "TEMPLATE_ERROR"), d
        assert d["message"]
        if jid and d["code"] not in ("INVALID_JSON", "BAD_UTF8", "JOB_TOO_LARGE"):
            evs = client.events(jid, timeout=10)
            check_stream(evs, event_validator)
            err = evs[0][1]
            assert err["type"] == "error" and err["code"] == d["code"]
            assert evs[-1][1]["finish_reason"] == "error"
    assert client.r.xpending(f"{client.prefix}jobs:fast", "workers")["pending"] == 0


def test_cancel_frees_slot(workers, client, event_validator):
    workers("w1", "--max-batch", "1")
    client.submit({"id": "long", "prompt_ids": [1, 2, 3], "max_tokens": 30000,
                   "temperature": 0, "ignore_eos": True})
    client.submit({"id": "next", "prompt_ids": [4, 5], "max_tokens": 3, "temperature": 0,
                   "ignore_eos": True})
    r = connect(client.addr)
    key = f"{client.prefix}out:long"
    wait_len(r, key, 5)
    # SET and XLEN in one transaction: the count is exact at the moment the
    # cancel exists, however late this process gets the CPU
    t0 = time.time()
    p = r.pipeline(transaction=True)
    p.set(f"{client.prefix}cancel:long", 1, ex=600)
    p.xlen(key)
    n_at_cancel = p.execute()[1]
    evs = client.events("long")
    took = time.time() - t0
    _, done = check_stream(evs, event_validator)
    assert done["finish_reason"] == "cancelled"
    # the check rides in the emit every 50 ms (worker/publish.c CHECK_MS):
    # stopped within that, a step and a round trip, nowhere near the end
    assert took < 0.8, took
    assert n_at_cancel < len(evs) < 30000, (n_at_cancel, len(evs))
    _, done2 = check_stream(client.events("next"), event_validator)
    assert done2["finish_reason"] == "length"
    # cancelled before admission: done at once, nothing generated
    r.set(f"{client.prefix}cancel:pre", 1, ex=600)
    client.submit({"id": "pre", "prompt_ids": [1], "max_tokens": 50})
    evs = client.events("pre")
    _, done = check_stream(evs, event_validator)
    assert done["finish_reason"] == "cancelled" and len(evs) == 1


def test_deadline(workers, client, event_validator):
    workers("w1")
    now = int(time.time() * 1000)
    client.submit({"id": "dl", "prompt_ids": [1, 2], "max_tokens": 30000,
                   "temperature": 0, "ignore_eos": True, "deadline_ms": now + 300})
    client.submit({"id": "dl0", "prompt_ids": [1, 2], "max_tokens": 5,
                   "deadline_ms": now - 1000})
    t0 = time.time()
    _, done = check_stream(client.events("dl"), event_validator)
    assert done["finish_reason"] == "deadline"
    assert time.time() - t0 < 5
    _, done = check_stream(client.events("dl0"), event_validator)
    assert done["finish_reason"] == "deadline"


def test_result_cache(workers, client, event_validator):
    workers("w1")
    job = {"prompt_ids": [7, 8, 9, 10], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    client.submit({**job, "id": "c1", "metadata": {"n": 1}})
    first = client.events("c1")
    client.submit({**job, "id": "c2", "metadata": {"n": 2}})
    second = client.events("c2")
    check_stream(first, event_validator)
    check_stream(second, event_validator)
    a, b = first[-1][1], second[-1][1]
    assert a["cached"] is False and b["cached"] is True
    assert b["metadata"] == {"n": 2}
    strip = lambda e: {k: v for k, v in e.items() if k not in ("cached", "timings", "metadata", "request")}
    assert [strip(e) for _, e in first] == [strip(e) for _, e in second]
    # a sampled job without a seed is never cached
    client.submit({"id": "s1", "prompt_ids": [7, 8], "max_tokens": 4, "temperature": 1})
    client.submit({"id": "s2", "prompt_ids": [7, 8], "max_tokens": 4, "temperature": 1})
    assert client.events("s1")[-1][1]["cached"] is False
    assert client.events("s2")[-1][1]["cached"] is False
    # cache: false opts out
    client.submit({**job, "id": "c3", "cache": False})
    assert client.events("c3")[-1][1]["cached"] is False


def test_heartbeat_metrics_and_drain(workers, client, event_validator):
    port = free_port()
    w = workers("hb", "--http-port", str(port), "--heartbeat-ttl-s", "3")
    hb_key = f"{client.prefix}worker:hb"
    deadline = time.time() + 5
    while not client.r.exists(hb_key) and time.time() < deadline:
        time.sleep(0.05)
    hb = json.loads(client.r.get(hb_key))
    assert hb["pools"] == ["fast", "think"] and "kv_free_blocks" in hb and "tokens_per_s" in hb
    assert 0 < client.r.ttl(hb_key) <= 3
    base = f"http://127.0.0.1:{port}"
    assert urllib.request.urlopen(base + "/healthz", timeout=5).status == 200
    client.submit({"id": "m1", "prompt_ids": [1, 2], "max_tokens": 4, "temperature": 0})
    client.events("m1")
    text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    for name in ("redlm_generation_tokens_total", "redlm_ttft_seconds_bucket",
                 "redlm_queue_wait_seconds", "redlm_inter_token_latency_seconds",
                 "redlm_running", "redlm_kv_usage_ratio",
                 "redlm_result_cache_hits_total", "redlm_prefix_cache_hit_tokens_total"):
        assert name in text, name
    # SIGTERM mid-job: the job finishes, then exit 0
    client.submit({"id": "drain", "prompt_ids": [1, 2], "max_tokens": 300, "temperature": 0,
                   "ignore_eos": True})
    key = f"{client.prefix}out:drain"
    wait_len(client.r, key, 2)
    w.kill(signal.SIGTERM)
    assert w.wait(30) == 0
    _, done = check_stream(client.events("drain", timeout=5), event_validator)
    assert done["finish_reason"] == "length"
    assert client.r.xpending(f"{client.prefix}jobs:fast", "workers")["pending"] == 0


def test_too_many_deliveries(workers, client, event_validator, dead_validator):
    """A job that keeps killing its workers goes to the dead letters."""
    r = client.r
    key = f"{client.prefix}jobs:fast"
    r.xgroup_create(key, "workers", id="0", mkstream=True)
    entry = client.submit({"id": "poison", "prompt_ids": [1], "max_tokens": 3})
    for i in range(4):  # four deliveries to consumers that then vanish
        r.xreadgroup("workers", f"ghost{i}", {key: ">" if i == 0 else "0"}, count=1)
        if i:
            r.xclaim(key, "workers", f"ghost{i}", 0, [entry])
    workers("w1", "--claim-idle-ms", "1000", "--claim-interval-ms", "100", "--lease-renew-ms", "300",
            "--max-deliveries", "3")
    evs = client.events("poison", timeout=10)
    check_stream(evs, event_validator)
    assert evs[0][1]["code"] == "TOO_MANY_DELIVERIES"
    dead = [json.loads(f["dead"]) for _, f in r.xrange(f"{client.prefix}dead")]
    assert dead[-1]["code"] == "TOO_MANY_DELIVERIES" and dead[-1]["deliveries"] > 3


def test_model_without_tokenizer_warns(workers, client, tmp_path, event_validator):
    """A model directory with no tokenizer.json: the worker says at start
    that only prompt_ids jobs will work, serves those, and refuses a chat
    job with a clear error (not a crash)."""
    bare = tmp_path / "bare-model"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        (bare / f).symlink_to(MODEL / f)
    w = workers("notok", "--model", str(bare))
    log = w.text()
    assert "has no tokenizer.json: only prompt_ids jobs will work" in log, log
    client.submit({"id": "ids", "prompt_ids": [1, 2], "max_tokens": 2, "temperature": 0})
    _, done = check_stream(client.events("ids"), event_validator)
    assert done["finish_reason"] == "length"
    client.submit({"id": "chat", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 2})
    evs = [e for _, e in client.events("chat")]
    assert evs[0]["type"] == "error" and evs[0]["code"] == "BAD_VALUE"
    assert "no tokenizer.json" in evs[0]["message"]
    assert evs[-1]["type"] == "done" and evs[-1]["finish_reason"] == "error"
    assert client.r.xlen(f"{client.prefix}dead") == 1


@pytest.mark.parametrize("name,kind,needle", [
    # a GGUF file is read as one (issue 28): this one is cut short
    ("Qwen3-0.6B-Q8_0.gguf", "file", "Qwen3-0.6B-Q8_0.gguf: file is 8 bytes, shorter than the GGUF header"),
    ("repo", "dir", "has no config.json: expected a Hugging Face Qwen3 checkpoint directory"),
])
def test_model_path_not_a_checkpoint(built, redis_addr, tmp_path, name, kind, needle):
    """A broken .gguf file or a folder that is not a checkpoint: the worker
    exits non-zero with a sentence about what is wrong or what it expects."""
    path = tmp_path / name
    if kind == "file":
        path.write_bytes(b"GGUF\x03\x00\x00\x00")
    else:
        (path / "models" / "tiny").mkdir(parents=True)
    out = subprocess.run([str(WORKER), "--redis", redis_addr, "--model", str(path), "--threads", "1"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert needle in out.stderr, out.stderr
    assert "Not a directory" not in out.stderr


def metric_values(text):
    """{sample name with labels: value} of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def test_metrics_promtool_and_vllm_set(workers, client):
    """The worker's /metrics passes promtool (HELP and TYPE on every family,
    base units), carries model_name, and counts what vLLM's set counts:
    prompt/generation tokens, finish reasons, e2e/prefill/decode times,
    length histograms, TTFT and queue buckets past 60 s."""
    port = free_port()
    workers("pm", "--http-port", str(port))
    client.submit({"id": "p1", "prompt_ids": [1, 2, 3], "max_tokens": 5, "temperature": 0,
                   "ignore_eos": True})
    client.events("p1")
    client.submit({"id": "p2", "prompt_ids": [4, 5], "max_tokens": 2, "temperature": 0,
                   "ignore_eos": True})
    client.events("p2")
    base = f"http://127.0.0.1:{port}"
    text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    promtool_check(text)
    assert "_ms" not in text
    v = metric_values(text)
    mn = 'model_name="tiny-qwen3-a"'
    assert v[f"redlm_prompt_tokens_total{{{mn}}}"] == 5
    assert v[f"redlm_generation_tokens_total{{{mn}}}"] == 7
    assert v[f'redlm_requests_finished_total{{{mn},finished_reason="length"}}'] == 2
    assert v[f'redlm_requests_finished_total{{{mn},finished_reason="stop"}}'] == 0
    for h in ("e2e_request_latency", "request_prefill_time", "request_decode_time", "ttft",
              "queue_wait"):
        assert v[f"redlm_{h}_seconds_count{{{mn}}}"] == 2, h
    # one gap per token after each job's first
    assert v[f"redlm_inter_token_latency_seconds_count{{{mn}}}"] == 5
    assert v[f'redlm_request_prompt_tokens_bucket{{{mn},le="2"}}'] == 1
    assert v[f'redlm_request_prompt_tokens_bucket{{{mn},le="5"}}'] == 2
    assert v[f"redlm_request_generation_tokens_sum{{{mn}}}"] == 7
    for h in ("ttft", "queue_wait"):
        assert f'redlm_{h}_seconds_bucket{{{mn},le="60"}}' in v
        assert any(k.startswith(f"redlm_{h}_seconds_bucket") and 'le="' in k and
                   k.split('le="')[1][:-2] not in ("+Inf",) and float(k.split('le="')[1][:-2]) > 60
                   for k in v), h
    assert f"redlm_preemptions_total{{{mn}}}" in v


def test_metrics_count_preemptions(workers, client):
    """A KV pool of 1 MiB (about 500 tokens of tiny-qwen3-a) and four jobs
    that together need twice that: the scheduler preempts, and /metrics
    says how often."""
    port = free_port()
    workers("pre", "--http-port", str(port), "--kv-budget-mb", "1")
    ids = [f"pre{i}" for i in range(4)]
    for i, jid in enumerate(ids):
        client.submit({"id": jid, "prompt_ids": [1 + i] * 40, "max_tokens": 200,
                       "temperature": 0, "ignore_eos": True})
    for jid in ids:
        assert client.events(jid, timeout=120)[-1][1]["finish_reason"] == "length"
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    v = metric_values(text)
    mn = 'model_name="tiny-qwen3-a"'
    assert v[f"redlm_preemptions_total{{{mn}}}"] >= 1, text
    assert v[f'redlm_requests_finished_total{{{mn},finished_reason="length"}}'] == 4
