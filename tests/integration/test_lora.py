"""LoRA adapters served by the worker and routed by the dispatcher, against
a real redis-server and real worker and dispatcher processes.

The models: a random F32 checkpoint (tiny shape, the tiny model's
tokenizer), a random PEFT adapter for it (`redlm mkmodel --lora-of`), and
the reference, the base with the adapter merged into its weights
(`redlm mkmodel --merge-lora`). What is proved:

  - a worker started with `--lora a=DIR` answers a greedy job for model `a`
    with exactly the tokens a worker on the merged checkpoint gives, and a
    job for the base model (by name or naming none) with the base's tokens,
    which differ; an embedding job for `a` gives the merged checkpoint's
    vector; its heartbeat announces the adapter and its rank; a job
    for a name it does not serve is MODEL_NOT_FOUND naming what it serves;
  - the result cache never crosses base and adapter, neither in the worker
    nor in the dispatcher's fast path: the same deterministic job for the
    base and for the adapter each get their own answer, cached or not;
  - the dispatcher routes an adapter to its base model's pools with the
    adapter's name kept as the job's model; GET /v1/models lists it with
    "parent" (also in the single-model mode, where the parent is the one
    name the door shows); /api/tags lists it; POST /v1/chat/completions with
    "model": "a" answers what the merged checkpoint answers; an unknown
    name is 404 model_not_found / MODEL_NOT_FOUND;
  - prefix-affine pulling hashes an adapter's prompts as the engine does
    (kv_salt_lora): the turns of an adapter conversation are offered to the
    worker holding its history and served from its prefix cache;
  - where only some workers hold an adapter, its jobs go to its own stream,
    which only they read: none lands on a worker without it, and a holder
    killed mid-job is resumed by another holder;
  - a bad adapter (missing directory, malformed NAME=DIR, the served name,
    a name given twice) stops the worker at start with a message naming it.

Waits are on observable state (heartbeats, events, HTTP answers), never
fixed sleeps.
"""
import base64
import http.client
import json
import struct
import subprocess
import time

import pytest

from conftest import (CLI, DISPATCHER, MODEL, WORKER, Daemon, connect, free_port, job_events,
                      pool_shards, read_heartbeat, stream_events, tap, wait_for,
                      wait_no_pending)

SHAPE = ["--hidden", "64", "--intermediate", "128", "--heads", "2", "--kv-heads", "1",
         "--head-dim", "32", "--layers", "2"]
RANK = 8
PROMPTS = [[7, 8, 9, 10, 11], [100, 3, 250, 17], [42, 42, 5, 600, 31, 2, 9], [1, 2]]


def run(*args, timeout=180):
    p = subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"redlm {' '.join(map(str, args))}: {p.stdout}{p.stderr}"
    return p


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{"base", "adapter", "merged"}: directories, made once."""
    if not CLI.exists() or not WORKER.exists() or not DISPATCHER.exists():
        pytest.skip("build/ lacks redlm, redlm-worker or redlm-dispatcher (run make)")
    if not (MODEL / "config.json").exists():
        pytest.skip(f"tiny model missing at {MODEL}")
    d = tmp_path_factory.mktemp("lora")
    cfg = json.loads((MODEL / "config.json").read_text())
    base, adapter, merged = d / "base", d / "adapter", d / "merged"
    run("mkmodel", "--shape", "tiny", *SHAPE, "--vocab", cfg["vocab_size"],
        "--bos", cfg["bos_token_id"], "--eos", cfg["eos_token_id"], "--dtype", "f32",
        "--seed", "1", "--untied", "--tokenizer", MODEL, "--out", base)
    # a strong adapter (mkmodel's default std, 0.02, leaves a long prompt's
    # greedy tokens as the base's): every answer below tells the two apart
    run("mkmodel", "--lora-of", base, "--lora-rank", RANK, "--lora-alpha", 2 * RANK,
        "--lora-std", "0.1", "--seed", "7", "--out", adapter)
    run("mkmodel", "--merge-lora", adapter, "--from", base, "--out", merged)
    # the same adapter as llama.cpp's GGUF adapter file (same seed: same values)
    gguf = d / "adapter.gguf"
    run("mkmodel", "--lora-of", base, "--lora-rank", RANK, "--lora-alpha", 2 * RANK,
        "--lora-std", "0.1", "--seed", "7", "--out", gguf)
    return {"base": base, "adapter": adapter, "merged": merged, "gguf": gguf}


class Proc(Daemon):
    """A worker or dispatcher, ready at its "ready:" line."""

    def __init__(self, args, log_path, timeout=60):
        self.kind = args[0].rsplit("/", 1)[-1]
        self.start(args, log_path, self.logged_ready, timeout)


@pytest.fixture
def procs(redis_addr, prefix, tmp_path):
    """{"worker": (name, model, *flags), "dispatcher": (*flags, http_port=)};
    every process is stopped at the end."""
    started = []

    def worker(name, model, *extra):
        w = Proc([str(WORKER), "--redis", redis_addr, "--prefix", prefix, "--model", str(model),
                  "--name", name, "--threads", "1", "--block-ms", "100",
                  "--heartbeat-interval-ms", "300", "--http-port", "0", *map(str, extra)],
                 tmp_path / f"worker-{name}.log")
        w.name = name
        started.append(w)
        return w

    def dispatcher(*extra, http_port=None, name="d1"):
        args = [str(DISPATCHER), "--redis", redis_addr, "--prefix", prefix, "--name", name,
                "--http-port", "0", "--block-ms", "100", "--heartbeat-interval-ms", "200",
                *map(str, extra)]
        if http_port:
            args += ["--http", str(http_port)]
        d = Proc(args, tmp_path / f"dispatcher-{name}.log")
        d.name = name
        started.append(d)
        return d

    yield {"worker": worker, "dispatcher": dispatcher}
    for p in started:
        p.stop()


def tokens(evs):
    return [t for e in evs if e["type"] == "delta" for t in e["token_ids"]]


def greedy(jid, ids, model=None, n=8, **kw):
    j = {"id": jid, "prompt_ids": ids, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    if model:
        j["model"] = model
    j.update(kw)
    return j


def answer(r, prefix, job, pool="fast", stream=None):
    """Sends job (to the pool stream, or to `stream`) and returns its events."""
    r.xadd(stream or f"{prefix}jobs:{pool}", {"job": json.dumps(job)})
    return job_events(r, prefix, job["id"], timeout=60)


def http_req(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"})
    resp = c.getresponse()
    data = resp.read()
    c.close()
    return resp.status, json.loads(data) if data else None


def wait_models(port, want, timeout=15):
    """GET /v1/models once it lists exactly the ids want."""
    def listed():
        st, m = http_req(port, "GET", "/v1/models")
        return m if st == 200 and sorted(x["id"] for x in m["data"]) == sorted(want) else None
    return wait_for(listed, f"/v1/models listing {want}", timeout, every=0.05)


def chat(port, model, text, n=8):
    st, body = http_req(port, "POST", "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": text}], "max_tokens": n,
        "temperature": 0, "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}})
    assert st == 200, body
    msg = body["choices"][0]["message"]
    return (msg.get("reasoning_content") or "") + "|" + (msg.get("content") or "")


# ---------------------------------------------------------------------------

def test_worker_serves_the_adapter_as_its_merged_checkpoint(models, procs, redis_addr, prefix):
    r = connect(redis_addr)
    base = models["base"].name
    # the reference: a worker on the merged checkpoint, reading its own pool
    procs["worker"]("ref", models["merged"], "--pools", "ref")
    mport = free_port()
    procs["worker"]("wl", models["base"], "--pools", "fast", "--lora",
                    f"a={models['adapter']}", "--lora", f"g={models['gguf']}", "--http-port", mport)
    hb = read_heartbeat(r, prefix, "worker", "wl", timeout=10)
    assert hb["model"] == base
    assert hb["lora_adapters"] == [{"name": "a", "rank": RANK, "stream": True},
                                   {"name": "g", "rank": RANK, "stream": True}], hb
    assert "lora_adapters" not in read_heartbeat(r, prefix, "worker", "ref", timeout=10)

    for i, ids in enumerate(PROMPTS):
        want = tokens(answer(r, prefix, greedy(f"ref{i}", ids, cache=False), pool="ref"))
        got = answer(r, prefix, greedy(f"a{i}", ids, "a", cache=False))
        assert got[-1]["finish_reason"] == "length", got[-1]
        assert tokens(got) == want, (ids, tokens(got), want)
        # the GGUF file of the same adapter answers the same
        assert tokens(answer(r, prefix, greedy(f"g{i}", ids, "g", cache=False))) == want
        named = tokens(answer(r, prefix, greedy(f"b{i}", ids, base, cache=False)))
        plain = tokens(answer(r, prefix, greedy(f"p{i}", ids, cache=False)))
        assert named == plain and len(plain) == 8
        assert plain != want, f"the adapter changes nothing on {ids}: pick a stronger one"

    # an embedding job may name the adapter too: the engine applies it to
    # every row, so the vector is the merged checkpoint's, not the base's
    def embedding(jid, model, pool="fast"):
        j = {"id": jid, "task": "embed", "prompt_ids": PROMPTS[0], "cache": False}
        if model:
            j["model"] = model
        evs = answer(r, prefix, j, pool=pool)
        assert evs[-1]["type"] == "done" and "embedding" in evs[-1], evs[-1]
        return struct.unpack(f"<{evs[-1]['dimensions']}f", base64.b64decode(evs[-1]["embedding"]))
    ea, er, eb = embedding("ea", "a"), embedding("er", None, "ref"), embedding("eb", None)
    assert max(abs(x - y) for x, y in zip(ea, er)) < 1e-4, (ea[:4], er[:4])
    assert max(abs(x - y) for x, y in zip(ea, eb)) > 1e-3

    # its /metrics counts the jobs each adapter finished: the four
    # generations and the embedding above, none of the base's (counted
    # just after the done event is handed to the publisher: polled)
    def lora_lines():
        c = http.client.HTTPConnection("127.0.0.1", mport, timeout=10)
        c.request("GET", "/metrics")
        page = c.getresponse().read().decode()
        c.close()
        return [l for l in page.splitlines() if l.startswith("redlm_lora_requests_total")]
    want = [f'redlm_lora_requests_total{{model_name="{base}",lora_name="a"}} 5',
            f'redlm_lora_requests_total{{model_name="{base}",lora_name="g"}} 4']
    wait_for(lambda: lora_lines() == want, f"{want} on /metrics", 10, every=0.05)

    # a name this worker does not serve: refused, naming what it serves
    evs = answer(r, prefix, greedy("nf", PROMPTS[0], "b"))
    assert evs[0]["type"] == "error" and evs[0]["code"] == "MODEL_NOT_FOUND", evs
    assert '"b"' in evs[0]["message"] and '"a"' in evs[0]["message"]
    assert base in evs[0]["message"]
    dead = [json.loads(f["dead"]) for _, f in r.xrange(f"{prefix}dead")]
    assert any(d["id"] == "nf" and d["code"] == "MODEL_NOT_FOUND" for d in dead)
    wait_no_pending(r, prefix, pools=("fast", "ref"))


def test_result_cache_never_crosses_base_and_adapter(models, procs, redis_addr, prefix):
    r = connect(redis_addr)
    base = models["base"].name
    procs["worker"]("wl", models["base"], "--pools", "fast,think", "--lora",
                    f"a={models['adapter']}")
    read_heartbeat(r, prefix, "worker", "wl", timeout=10)
    ids = PROMPTS[2]
    # the worker's own cache: base first, then the adapter, then each again
    b1 = answer(r, prefix, greedy("b1", ids, base))
    a1 = answer(r, prefix, greedy("a1", ids, "a"))
    assert not b1[-1]["cached"] and not a1[-1]["cached"]
    assert tokens(a1) != tokens(b1)
    a2 = answer(r, prefix, greedy("a2", ids, "a"))
    b2 = answer(r, prefix, greedy("b2", ids))  # no model: the base, the same key as b1
    assert a2[-1]["cached"] and tokens(a2) == tokens(a1)
    assert b2[-1]["cached"] and tokens(b2) == tokens(b1)
    # an adapter first this time: its entry does not answer the base
    a3 = answer(r, prefix, greedy("a3", PROMPTS[3], "a"))
    b3 = answer(r, prefix, greedy("b3", PROMPTS[3], base))
    assert not a3[-1]["cached"] and not b3[-1]["cached"] and tokens(a3) != tokens(b3)

    # the dispatcher's fast path (it has the base model): it answers the base
    # from the cache, never the adapter from the base's entry
    d = procs["dispatcher"]("--model", models["base"], "--no-affinity")
    hits0 = read_heartbeat(r, prefix, "dispatcher", d.name, timeout=10)["cache_hits"]
    req = f"{prefix}requests"
    db = answer(r, prefix, greedy("db", ids, base, mode="no_think"), stream=req)
    da = answer(r, prefix, greedy("da", ids, "a", mode="no_think"), stream=req)
    assert tokens(db) == tokens(b1) and tokens(da) == tokens(a1)
    assert db[-1]["cached"] and da[-1]["cached"]  # the base by the dispatcher, a by the worker
    wait_for(lambda: read_heartbeat(r, prefix, "dispatcher", d.name)["cache_hits"] >= hits0 + 1,
             "the dispatcher's cache hit counted")
    assert read_heartbeat(r, prefix, "dispatcher", d.name)["cache_hits"] == hits0 + 1
    wait_no_pending(r, prefix)


def test_dispatcher_routes_and_lists_adapters(models, procs, redis_addr, prefix):
    r = connect(redis_addr)
    base = models["base"].name
    port = free_port()
    tap(r, f"{prefix}jobs:{base}:fast", f"{prefix}jobs:{base}:think")
    procs["worker"]("wl", models["base"], "--pool-scope", "model", "--lora",
                    f"a={models['adapter']}")
    # the reference caches its answers too: its checkpoint has the base's
    # config, tokenizer, file names and sizes, and only the weight bytes
    # the identity samples (common/modelid.c) keep its entries apart from
    # the base's, which the base's answers below then show
    procs["worker"]("ref", models["merged"], "--pool-scope", "model", "--served-model-name",
                    "merged")
    procs["dispatcher"]("--model", models["base"], "--think-ratio", "0.5", http_port=port)

    m = wait_models(port, [base, "merged", "a"])
    by = {x["id"]: x for x in m["data"]}
    assert by["a"]["parent"] == base and by["a"]["object"] == "model", by["a"]
    assert "parent" not in by[base]
    assert by["a"]["max_model_len"] == by[base]["max_model_len"]
    st, one = http_req(port, "GET", "/v1/models/a")
    assert st == 200 and one["parent"] == base
    st, tags = http_req(port, "GET", "/api/tags")
    t = {x["name"]: x for x in tags["models"]}
    assert st == 200 and t["a"]["details"]["parent_model"] == base
    # what the weights are, from the workers' heartbeats: an adapter shows its base's
    for name in (base, "a"):
        d = t[name]["details"]
        assert (d["format"], d["quantization_level"]) == ("safetensors", "F32"), d
        assert d["parameter_size"].endswith("K") and d["parameter_size"] == t[base]["details"]["parameter_size"]

    # HTTP: the adapter answers what the merged checkpoint answers
    for text in ("Hello there", "Which module renders prompts?"):
        want = chat(port, "merged", text)
        assert chat(port, "a", text) == want
        assert chat(port, base, text) != want
    st, e = http_req(port, "POST", "/v1/chat/completions",
                     {"model": "b", "messages": [{"role": "user", "content": "Hi"}]})
    assert st == 404 and e["error"]["code"] == "model_not_found", e
    assert "`a`" in e["error"]["message"]

    # the queue: adapter jobs go to the base's pools by the base's split,
    # carrying the adapter's name; an unknown name is refused
    for i in range(4):
        r.xadd(f"{prefix}requests", {"job": json.dumps(greedy(f"q{i}", PROMPTS[0], "a",
                                                              mode="auto", cache=False))})
    for i in range(4):
        assert job_events(r, prefix, f"q{i}")[-1]["finish_reason"] == "length"
    fwd = {p: [json.loads(f["job"]) for _, f in r.xrange(f"{prefix}jobs:{base}:{p}")]
           for p in ("fast", "think")}
    mine = [j for p in fwd for j in fwd[p] if j["id"].startswith("q")]
    assert len(mine) == 4 and all(j["model"] == "a" for j in mine), mine
    # the base's router split them (the only auto requests it saw): 2 and 2
    assert sum(j["id"].startswith("q") for j in fwd["think"]) == 2, fwd
    evs = answer(r, prefix, greedy("nf", PROMPTS[0], "b"), stream=f"{prefix}requests")
    assert evs[0]["code"] == "MODEL_NOT_FOUND" and "a (LoRA of " in evs[0]["message"], evs


def test_single_model_front_door_serves_adapters(models, procs, redis_addr, prefix):
    """served_model_name on the dispatcher (the single-model mode: jobs for
    it carry no model): adapters are served beside that name, and their
    jobs carry the adapter's name."""
    r = connect(redis_addr)
    port = free_port()
    tap(r, f"{prefix}jobs:fast")
    procs["worker"]("wl", models["base"], "--pools", "fast,think", "--lora",
                    f"a={models['adapter']}")
    ref = procs["worker"]("ref", models["merged"], "--pools", "ref")
    procs["dispatcher"]("--served-model-name", "qwen", http_port=port)
    m = wait_for(lambda: (lambda s, b: b if s == 200 and len(b["data"]) == 2 else None)(
        *http_req(port, "GET", "/v1/models")), "the adapter listed")
    by = {x["id"]: x for x in m["data"]}
    assert sorted(by) == ["a", "qwen"] and by["a"]["parent"] == "qwen", by
    ids = PROMPTS[1]
    want = tokens(answer(r, prefix, greedy("ref", ids, cache=False), pool="ref"))
    ref.stop()
    # by the queue: the adapter's name travels with the job
    a = answer(r, prefix, greedy("qa", ids, "a", cache=False, mode="no_think"),
               stream=f"{prefix}requests")
    q = answer(r, prefix, greedy("qq", ids, "qwen", cache=False, mode="no_think"),
               stream=f"{prefix}requests")
    assert tokens(a) == want and tokens(q) != want
    fwd = {json.loads(f["job"])["id"]: json.loads(f["job"])
           for _, f in r.xrange(f"{prefix}jobs:fast")}
    assert fwd["qa"]["model"] == "a" and "model" not in fwd["qq"], fwd
    # by HTTP: "a" answers, "qwen" is the base, another name is refused
    assert chat(port, "a", "Hello there") != chat(port, "qwen", "Hello there")
    st, e = http_req(port, "POST", "/v1/chat/completions",
                     {"model": "b", "messages": [{"role": "user", "content": "Hi"}]})
    assert st == 404 and e["error"]["code"] == "model_not_found", e



@pytest.mark.parametrize("others", [0, 1], ids=["every-worker", "a-worker-without"])
def test_adapter_turns_land_on_the_worker_holding_them(models, procs, redis_addr, prefix,
                                                        others):
    """Prefix-affine pulling with adapter jobs: the dispatcher's hashes of an
    adapter's prompt (kv_salt_lora) are the engine's, so every turn after
    the first is offered to the worker that ran the earlier ones and found
    in its prefix cache; the base model's same prompt is not (its blocks
    are another domain). Also where another worker lacks the adapter (its
    jobs bound for the adapter's own stream): the offers go to the holder
    of the history all the same."""
    r = connect(redis_addr)
    flags = ("--lora", f"a={models['adapter']}", "--heartbeat-ttl-s", "2")
    procs["worker"]("wa", models["base"], *flags)
    procs["worker"]("wb", models["base"], *flags)
    for i in range(others):
        procs["worker"](f"wn{i}", models["base"], "--heartbeat-ttl-s", "2")
    d = procs["dispatcher"]("--model", models["base"], "--affinity-refresh-ms", "20",
                            "--affinity-wait-ms", "5000")
    if others:
        wait_for(lambda: f"its jobs go to {prefix}jobs:lora@a, which 2 of them read" in d.text(),
                 "the dispatcher naming a's stream", 15)
    system = ("You are a careful assistant for the redlm project. Answer briefly and name "
              "the module you mean. " * 4)
    msgs = [{"role": "system", "content": system}]
    usages = []

    def settled():
        """Each worker's heartbeat (its filter) written after now, then a
        dispatcher heartbeat after those: it re-read the filters before
        writing it (as test_affinity.py waits)."""
        t0 = time.time() * 1000
        for n in ["wa", "wb"] + [f"wn{i}" for i in range(others)]:
            wait_for(lambda: (read_heartbeat(r, prefix, "worker", n) or {}).get("time_ms", 0) >
                     t0 + 150, f"worker {n}'s heartbeat")
        t1 = time.time() * 1000
        wait_for(lambda: (read_heartbeat(r, prefix, "dispatcher", d.name) or {})
                 .get("time_ms", 0) > t1, "a dispatcher heartbeat after them")

    for t in range(4):
        msgs.append({"role": "user", "content": f"Turn {t}: which module renders prompts?"})
        settled()
        evs = answer(r, prefix, {"id": f"t{t}", "model": "a", "messages": msgs, "max_tokens": 5,
                                 "temperature": 0, "mode": "no_think", "cache": False},
                     stream=f"{prefix}requests")
        assert evs[-1]["type"] == "done", evs[-3:]
        usages.append(evs[-1]["usage"])
        text = "".join(e.get("delta", {}).get("content", "") or ""
                       for e in evs if e["type"] == "delta")
        msgs.append({"role": "assistant", "content": text})
    for i, u in enumerate(usages[1:], 1):
        assert u["cached_prompt_tokens"] >= usages[i - 1]["prompt_tokens"] - 32, (i, usages)
    settled()
    aff = read_heartbeat(r, prefix, "dispatcher", d.name)["affinity"]
    assert aff["offers"] >= 3 and aff["fallbacks"] == 0, aff
    ha, hb = (read_heartbeat(r, prefix, "worker", n) for n in ("wa", "wb"))
    assert sorted([ha["jobs_done"], hb["jobs_done"]]) == [0, 4], (ha, hb)
    holder = "wa" if ha["jobs_done"] else "wb"
    # the last turn's prompt for the base model, put straight into the
    # holder's offer stream: the adapter's blocks are no base blocks
    evs = answer(r, prefix, {"id": "base", "model": models["base"].name, "messages": msgs[:-1],
                             "max_tokens": 2, "temperature": 0, "mode": "no_think",
                             "cache": False}, stream=f"{prefix}jobs:fast:w:{holder}")
    assert evs[-1]["usage"]["cached_prompt_tokens"] == 0, evs[-1]
    again = answer(r, prefix, {"id": "again", "model": "a", "messages": msgs[:-1],
                               "max_tokens": 2, "temperature": 0, "mode": "no_think",
                               "cache": False}, stream=f"{prefix}jobs:fast:w:{holder}")
    assert again[-1]["usage"]["cached_prompt_tokens"] >= usages[-1]["prompt_tokens"] - 32
    wait_no_pending(r, prefix)


@pytest.mark.parametrize("flags, says", [
    (["--lora", "bad=/nonexistent/adapter"], ["lora bad", "/nonexistent/adapter"]),
    (["--lora", "noequals"], ["noequals", "NAME=DIR"]),
    (["--lora", "a=/x", "--lora", "a=/y"], ["lora a", "twice"]),
    (["--lora", ".hidden=/x"], [".hidden", "[A-Za-z0-9._:/-]"]),
])
def test_bad_adapter_stops_the_worker(models, redis_addr, prefix, flags, says):
    p = subprocess.run([str(WORKER), "--redis", redis_addr, "--prefix", prefix, "--model",
                        str(models["base"]), "--name", "bad", "--threads", "1", "--http-port", "0",
                        *flags], capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    for s in says:
        assert s in out, out
    assert "ready:" not in out


def test_adapter_named_as_the_model_stops_the_worker(models, redis_addr, prefix, tmp_path):
    base = models["base"].name
    p = subprocess.run([str(WORKER), "--redis", redis_addr, "--prefix", prefix, "--model",
                        str(models["base"]), "--name", "bad", "--threads", "1", "--http-port", "0",
                        "--lora", f"{base}={models['adapter']}"],
                       capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and f"lora {base}" in out and "served name" in out, out
    # and a directory that is no adapter: the engine's refusal, named
    (tmp_path / "empty").mkdir()
    p = subprocess.run([str(WORKER), "--redis", redis_addr, "--prefix", prefix, "--model",
                        str(models["base"]), "--name", "bad", "--threads", "1", "--http-port", "0",
                        "--lora", f"e={tmp_path / 'empty'}"],
                       capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "lora e" in out and str(tmp_path / "empty") in out, out


def test_ollama_model_with_an_adapter_layer(models, redis_addr, prefix, tmp_path):
    """An Ollama model made with a Modelfile's ADAPTER (a manifest with a
    model layer and an application/vnd.ollama.image.adapter layer, both GGUF
    blobs): a worker given `--model ollama:ft` serves it as ft:latest with
    the adapter applied to every job, exactly as a worker serving the base
    GGUF with the adapter named per job answers, and its result-cache
    entries are not the base's."""
    import hashlib
    import os
    gguf_base = tmp_path / "base.gguf"
    cfg = json.loads((MODEL / "config.json").read_text())
    run("mkmodel", "--shape", "tiny", *SHAPE, "--vocab", cfg["vocab_size"],
        "--bos", cfg["bos_token_id"], "--eos", cfg["eos_token_id"], "--dtype", "q8_0",
        "--seed", "1", "--untied", "--tokenizer", MODEL, "--out", gguf_base)
    store = tmp_path / "ollama"
    (store / "blobs").mkdir(parents=True)
    layers = []
    for path, mt in ((gguf_base, "model"), (models["gguf"], "adapter")):
        data = path.read_bytes()
        dg = hashlib.sha256(data).hexdigest()
        (store / "blobs" / f"sha256-{dg}").write_bytes(data)
        layers.append({"mediaType": f"application/vnd.ollama.image.{mt}",
                       "digest": f"sha256:{dg}", "size": len(data)})
    man = store / "manifests" / "registry.ollama.ai" / "library" / "ft" / "latest"
    man.parent.mkdir(parents=True)
    man.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))

    r = connect(redis_addr)
    env = dict(os.environ, OLLAMA_MODELS=str(store))
    started = []
    try:
        def worker(name, model, *extra, env=None):
            w = Daemon()
            w.start([str(WORKER), "--redis", redis_addr, "--prefix", prefix, "--model", str(model),
                     "--name", name, "--threads", "1", "--block-ms", "100", "--http-port", "0",
                     "--heartbeat-interval-ms", "300", *map(str, extra)],
                    tmp_path / f"worker-{name}.log", w.logged_ready, env=env)
            started.append(w)
            return w
        worker("ft", "ollama:ft", "--pools", "ft", env=env)
        worker("ref", gguf_base, "--pools", "ref", "--lora", f"a={models['gguf']}")
        worker("plain", gguf_base, "--pools", "plain")
        hb = read_heartbeat(r, prefix, "worker", "ft", timeout=10)
        assert hb["model"] == "ft:latest" and "lora_adapters" not in hb, hb
        for i, ids in enumerate(PROMPTS[:2]):
            # deterministic jobs naming no model: the same text on every pool
            ft = answer(r, prefix, greedy(f"ft{i}", ids), pool="ft")
            ref = answer(r, prefix, greedy(f"ref{i}", ids, "a"), pool="ref")
            assert tokens(ft) == tokens(ref) and len(tokens(ft)) == 8
            assert not ft[-1]["cached"]
            named = answer(r, prefix, greedy(f"ftn{i}", ids, "ft:latest"), pool="ft")
            assert tokens(named) == tokens(ft)
            # the base GGUF alone, the same job text as ft's: its own answer,
            # never ft's cache entry; ft's own repeat is
            pl = answer(r, prefix, greedy(f"pl{i}", ids), pool="plain")
            assert not pl[-1]["cached"] and tokens(pl) != tokens(ft)
            again = answer(r, prefix, greedy(f"ft2{i}", ids), pool="ft")
            assert again[-1]["cached"] and tokens(again) == tokens(ft)
        wait_no_pending(r, prefix, pools=("ft", "ref", "plain"))
    finally:
        for w in started:
            w.stop()
    # a program that serves no adapter refuses the model rather than its base
    p = subprocess.run([str(CLI), "bench-engine", "-m", "ollama:ft", "--prompt", "4", "--gen", "2"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode != 0 and "application/vnd.ollama.image.adapter" in p.stderr, p.stderr


def test_sighup_loads_the_adapters_added(models, procs, redis_addr, prefix, tmp_path):
    """lora_modules is live: after SIGHUP the worker loads the adapters added
    to its config file (announced in the next heartbeat, answering at once);
    a bad one added is logged and skipped, the worker serving on; one that
    left the list stays served until a restart."""
    import signal
    r = connect(redis_addr)
    conf = tmp_path / "worker.conf"
    conf.write_text(f'lora_modules = ["a={models["adapter"]}"];\n')
    w = procs["worker"]("wh", models["base"], "-c", conf, "--pools", "fast")
    assert [x["name"] for x in read_heartbeat(r, prefix, "worker", "wh", timeout=10)
            ["lora_adapters"]] == ["a"]
    ids = PROMPTS[0]
    want = tokens(answer(r, prefix, greedy("a0", ids, "a", cache=False)))
    nf = answer(r, prefix, greedy("g0", ids, "g", cache=False))
    assert nf[0]["type"] == "error" and nf[0]["code"] == "MODEL_NOT_FOUND", nf

    conf.write_text(f'lora_modules = ["a={models["adapter"]}", "g={models["gguf"]}", '
                    f'"bad={tmp_path}/nowhere"];\n')
    w.signal(signal.SIGHUP)
    # g announced, and read from a stream of its own once the worker has
    # laid its streams out again (worker/main.c w_relayout)
    wait_for(lambda: (read_heartbeat(r, prefix, "worker", "wh") or {}).get("lora_adapters") ==
             [{"name": "a", "rank": RANK, "stream": True}, {"name": "g", "rank": RANK,
                                                            "stream": True}],
             "the heartbeat announcing g and its stream", 15)
    assert tokens(answer(r, prefix, greedy("g1", ids, "g", cache=False))) == want
    assert "lora bad" in w.text() and "not served" in w.text()

    conf.write_text(f'lora_modules = ["g={models["gguf"]}"];\n')  # a left the list
    w.signal(signal.SIGHUP)
    wait_for(lambda: "lora a left lora_modules" in w.text(), "a's warning", 15)
    assert tokens(answer(r, prefix, greedy("a1", ids, "a", cache=False))) == want
    assert w.proc.poll() is None
    wait_no_pending(r, prefix, pools=("fast",))


def test_adapter_jobs_go_to_the_workers_holding_it(models, procs, redis_addr, prefix):
    """Two workers of one model, one started with adapter a (a rollout in
    progress, or a fleet where only some GPUs carry an adapter): the
    dispatcher says so and sends a's jobs to a's own stream (jobs:lora@a),
    which only workers holding a read: none fails with MODEL_NOT_FOUND on
    the other, all are a's answer, and the base model's jobs still go to
    the pools. A holder killed in the middle of a job loses nothing: a
    worker started with a resumes it from that stream (its claimer), every
    seq once, and the worker without a never takes it. Once every live
    worker holds a, its jobs go to the pools again."""
    r = connect(redis_addr)
    claim = ("--claim-idle-ms", "1500", "--lease-renew-ms", "300", "--claim-interval-ms", "300",
             "--heartbeat-ttl-s", "2")
    lora = ("--lora", f"a={models['adapter']}")
    w1 = procs["worker"]("w1", models["base"], *lora, *claim)
    # w2 also reads a pool of its own: jobs queued in the pools for a (as
    # while every worker held it) are put there, where only it finds them
    w2 = procs["worker"]("w2", models["base"], "--pools", "fast,think,extra", *claim)
    stream = f"{prefix}jobs:lora@a"
    tap(r, stream, f"{prefix}jobs:fast")
    assert read_heartbeat(r, prefix, "worker", "w1", timeout=10)["lora_adapters"] == \
        [{"name": "a", "rank": RANK, "stream": True}]
    assert not [p for p in read_heartbeat(r, prefix, "worker", "w1")["pools"] if "@" in p]
    d = procs["dispatcher"]()
    wait_for(lambda: "LoRA adapter a is served by 1 of the 2 live workers" in d.text() and
             f"its jobs go to {stream}, which 1 of them read" in d.text(),
             "the dispatcher naming a's stream", 15)
    assert "fail with MODEL_NOT_FOUND" not in d.text()
    req = f"{prefix}requests"
    ids = PROMPTS[2]
    for i in range(6):
        r.xadd(req, {"job": json.dumps(greedy(f"a{i}", ids, "a", cache=False, mode="no_think"))})
    r.xadd(req, {"job": json.dumps(greedy("b0", ids, models["base"].name, cache=False,
                                          mode="no_think"))})
    answers = [job_events(r, prefix, f"a{i}") for i in range(6)]
    for evs in answers:
        assert evs[-1]["type"] == "done", evs[-2:]
    want = tokens(answers[0])
    assert all(tokens(evs) == want for evs in answers), [tokens(e) for e in answers]
    base = job_events(r, prefix, "b0")
    assert base[-1]["type"] == "done" and tokens(base) != want
    sent = [json.loads(f["job"])["id"] for _, f in r.xrange(stream)]
    assert sorted(sent) == [f"a{i}" for i in range(6)], sent
    assert "b0" in [json.loads(f["job"])["id"] for _, f in r.xrange(f"{prefix}jobs:fast")]

    def jobs_done(name):
        """name's jobs_done, from a heartbeat written after now."""
        t = time.time() * 1000
        return wait_for(lambda: (lambda h: h if h and h["time_ms"] > t else None)(
            read_heartbeat(r, prefix, "worker", name)), f"{name}'s heartbeat")["jobs_done"]
    done_w1, done_w2 = jobs_done("w1"), jobs_done("w2")
    assert done_w1 + done_w2 == 7 and done_w1 >= 6, (done_w1, done_w2)

    # jobs for a that w2 reads from a pool are moved to a's stream (one
    # script: there, and acknowledged here) with what they are known by;
    # one for an adapter nobody holds is still MODEL_NOT_FOUND
    queued = {}
    for i in range(3):
        queued[f"q{i}"] = r.xadd(f"{prefix}jobs:extra", {"job": json.dumps(
            greedy(f"q{i}", ids, "a", cache=False, mode="no_think"))})
    r.xadd(f"{prefix}jobs:extra", {"job": json.dumps(greedy("zz", ids, "zz", cache=False))})
    for i in range(3):
        assert tokens(job_events(r, prefix, f"q{i}")) == want
    nf = job_events(r, prefix, "zz")
    assert nf[0]["type"] == "error" and nf[0]["code"] == "MODEL_NOT_FOUND", nf
    moved = {json.loads(f["job"])["id"]: f for _, f in r.xrange(stream)
             if f.get("moved") == "handoff"}
    assert sorted(moved) == sorted(queued), moved
    assert all(moved[k]["entry0"] == queued[k] for k in queued), moved
    assert jobs_done("w2") == done_w2 and \
        read_heartbeat(r, prefix, "worker", "w2")["handed_off"] == 3
    assert "moved to " + stream in w2.text()
    assert r.xlen(f"{prefix}jobs:extra") == 0

    # the holder dies in the middle of a's job: a worker started with a
    # takes it over from the stream; w2 never does
    r.xadd(req, {"job": json.dumps(greedy("long", ids, "a", n=1500, cache=False,
                                          mode="no_think"))})
    wait_for(lambda: r.xlen(f"{prefix}out:long") >= 3, "the long job streaming", 30)
    w1.signal(19)  # SIGSTOP: it holds what it read and publishes nothing
    assert r.xpending(stream, "workers")["pending"] == 1
    w1.kill()
    w1.wait()
    procs["worker"]("w3", models["base"], *lora, *claim)
    evs = job_events(r, prefix, "long", timeout=120)
    assert evs[-1]["type"] == "done" and evs[-1]["usage"]["completion_tokens"] == 1500, evs[-1]
    seqs = [e["seq"] for e in evs]
    assert seqs == list(range(len(seqs))), seqs
    assert tokens(evs)[:len(want)] == want
    assert jobs_done("w2") == done_w2 and jobs_done("w3") == 1
    assert r.xpending(stream, "workers")["pending"] == 0

    # the fleet agrees (w2 gone): a's jobs go to the pools again
    w2.stop()
    wait_for(lambda: "LoRA adapter a: every live worker of" in d.text(),
             "the dispatcher seeing the fleet agree", 20)
    r.xadd(req, {"job": json.dumps(greedy("a9", ids, "a", cache=False, mode="no_think"))})
    assert tokens(job_events(r, prefix, "a9")) == want
    assert "a9" in [json.loads(f["job"])["id"] for _, f in r.xrange(f"{prefix}jobs:fast")]
    assert r.xlen(stream) == 10
    wait_no_pending(r, prefix)


def test_taken_over_adapter_job_is_handed_on(models, procs, redis_addr, prefix):
    """A job for a taken from a pool by a holder that dies mid-way and
    reclaimed by a worker without a: on a single instance it is moved to
    a's stream as a takeover ("moved": "pending" with its deliveries, its
    holder record pointed at the new entry, in one script), and the holder
    reading that stream resumes it from what its stream holds: every token
    once, seqs 0..n-1, one done."""
    import signal
    r = connect(redis_addr)
    claim = ("--claim-idle-ms", "1500", "--lease-renew-ms", "300", "--claim-interval-ms", "300",
             "--heartbeat-ttl-s", "2")
    lora = ("--lora", f"a={models['adapter']}")
    stream = f"{prefix}jobs:lora@a"
    tap(r, stream)
    w1 = procs["worker"]("w1", models["base"], *lora, "--pools", "extra", *claim)
    n = 4000
    first = r.xadd(f"{prefix}jobs:extra", {"job": json.dumps(
        greedy("t", PROMPTS[0], "a", n=n, cache=False, mode="no_think"))})
    wait_for(lambda: r.xlen(f"{prefix}out:t") >= 3, "the job streaming", 30)
    w1.signal(signal.SIGSTOP)  # it holds the entry, publishes nothing
    assert r.hget(f"{prefix}own:t", "entry") == first
    w1.kill()
    w1.wait()
    # the holder that resumes it reads a's stream, not the pool; the one
    # that reclaims it from the pool lacks a
    procs["worker"]("w3", models["base"], *lora, "--pools", "fast", *claim)
    wait_for(lambda: (read_heartbeat(r, prefix, "worker", "w3") or {}).get("lora_adapters") ==
             [{"name": "a", "rank": RANK, "stream": True}], "w3 reading a's stream", 15)
    w2 = procs["worker"]("w2", models["base"], "--pools", "extra", *claim)
    evs = job_events(r, prefix, "t", timeout=180)
    assert evs[-1]["type"] == "done" and evs[-1]["usage"]["completion_tokens"] == n, evs[-1]
    assert [e["seq"] for e in evs] == list(range(len(evs)))
    assert len(tokens(evs)) == n
    moved = [(i, f) for i, f in r.xrange(stream) if f.get("moved") == "pending"]
    assert len(moved) == 1 and moved[0][1]["entry0"] == first and int(moved[0][1]["dlv"]) >= 2, \
        moved
    assert r.hget(f"{prefix}own:t", "entry") == moved[0][0]
    assert "moved to " + stream in w2.text()
    wait_no_pending(r, prefix, pools=("extra", "lora@a"))


def test_taken_over_job_nobody_serves_is_answered(models, procs, redis_addr, prefix):
    """The same takeover once no live worker holds a (the holder's heartbeat
    gone): the worker without a answers MODEL_NOT_FOUND on the job's
    stream after what the dead holder published (seqs 0..n-1, then error
    and done), not at seq 0, where it met the earlier events and was
    dropped, leaving the client without a done."""
    import signal
    r = connect(redis_addr)
    claim = ("--claim-idle-ms", "1500", "--lease-renew-ms", "300", "--claim-interval-ms", "300",
             "--heartbeat-ttl-s", "2")
    w1 = procs["worker"]("w1", models["base"], "--lora", f"a={models['adapter']}", "--pools",
                         "extra", *claim)
    r.xadd(f"{prefix}jobs:extra", {"job": json.dumps(
        greedy("t", PROMPTS[0], "a", n=4000, cache=False, mode="no_think"))})
    wait_for(lambda: r.xlen(f"{prefix}out:t") >= 3, "the job streaming", 30)
    w1.signal(signal.SIGSTOP)
    w1.kill()
    w1.wait()
    wait_for(lambda: not r.exists(f"{prefix}worker:w1"), "w1's heartbeat gone", 15)
    w2 = procs["worker"]("w2", models["base"], "--pools", "extra", *claim)
    evs = job_events(r, prefix, "t", timeout=60)
    assert [e["seq"] for e in evs] == list(range(len(evs)))
    assert evs[-2]["type"] == "error" and evs[-2]["code"] == "MODEL_NOT_FOUND", evs[-2:]
    assert evs[-1]["type"] == "done" and evs[-1]["finish_reason"] == "error", evs[-1]
    assert len(evs) > 4  # after the dead holder's deltas
    assert "MODEL_NOT_FOUND" in w2.text()
    wait_no_pending(r, prefix, pools=("extra",))


def test_adapter_stream_of_a_model_with_its_own_pools(models, procs, redis_addr, prefix):
    """pool_scope = model: the adapter's stream is the model's too,
    jobs:<model>:lora@a, named alike by the worker and the dispatcher."""
    r = connect(redis_addr)
    base = models["base"].name
    procs["worker"]("w1", models["base"], "--pool-scope", "model", "--lora",
                    f"a={models['adapter']}")
    procs["worker"]("w2", models["base"], "--pool-scope", "model")
    stream = f"{prefix}jobs:{base}:lora@a"
    tap(r, stream)
    d = procs["dispatcher"]()
    wait_for(lambda: f"its jobs go to {stream}, which 1 of them read" in d.text(),
             "the dispatcher naming a's stream", 15)
    for i in range(4):
        r.xadd(f"{prefix}requests", {"job": json.dumps(greedy(f"s{i}", PROMPTS[3], "a",
                                                              cache=False, mode="no_think"))})
    answers = [job_events(r, prefix, f"s{i}") for i in range(4)]
    assert all(evs[-1]["type"] == "done" for evs in answers), [evs[-1] for evs in answers]
    assert sorted(json.loads(f["job"])["id"] for _, f in r.xrange(stream)) == \
        [f"s{i}" for i in range(4)]


LONG = 12000  # long enough to outlast the SIGHUP and the new layout


def test_sighup_adapter_gets_its_stream(models, procs, redis_addr, prefix, tmp_path):
    """An adapter loaded by SIGHUP gets a stream of its own: the worker lays
    its streams out again once no read of its is out (the jobs it holds
    meanwhile keep running and are acknowledged on their streams), its
    heartbeat says "stream", and the dispatcher, seeing another worker
    without it, sends its jobs there: none fails on the other worker."""
    import signal
    r = connect(redis_addr)
    conf = tmp_path / "worker.conf"
    conf.write_text("lora_modules = [];\n")
    w1 = procs["worker"]("w1", models["base"], "-c", conf)
    procs["worker"]("w2", models["base"])
    d = procs["dispatcher"]()
    req = f"{prefix}requests"
    # a long base job held by w1 across the new layout, from its offer
    # stream for fast, whose index the adapter's stream moves up: it must
    # still be acknowledged there
    offer = f"{prefix}jobs:fast:w:w1"
    assert offer in read_heartbeat(r, prefix, "worker", "w1")["affinity"]["offer"]
    r.xadd(offer, {"job": json.dumps(
        greedy("long", PROMPTS[1], models["base"].name, n=LONG, cache=False, mode="no_think"))})
    wait_for(lambda: r.xlen(f"{prefix}out:long") >= 3, "the long job streaming", 30)
    conf.write_text(f'lora_modules = ["a={models["adapter"]}"];\n')
    w1.signal(signal.SIGHUP)
    wait_for(lambda: (read_heartbeat(r, prefix, "worker", "w1") or {}).get("lora_adapters") ==
             [{"name": "a", "rank": RANK, "stream": True}], "w1 announcing a's stream", 15)
    assert "read from streams of their own now" in w1.text()
    assert not [f for _, f in r.xrange(f"{prefix}out:long")
                if json.loads(f["event"])["type"] == "done"], \
        "the long job ended before the new layout: it proves nothing"
    wait_for(lambda: f"its jobs go to {prefix}jobs:lora@a, which 1 of them read" in d.text(),
             "the dispatcher naming a's stream", 15)
    for i in range(4):
        r.xadd(req, {"job": json.dumps(greedy(f"a{i}", PROMPTS[2], "a", cache=False,
                                              mode="no_think"))})
    answers = [job_events(r, prefix, f"a{i}") for i in range(4)]
    assert all(evs[-1]["type"] == "done" for evs in answers), [evs[-1] for evs in answers]
    assert len({tuple(tokens(evs)) for evs in answers}) == 1
    long = job_events(r, prefix, "long", timeout=180)
    assert long[-1]["type"] == "done" and long[-1]["usage"]["completion_tokens"] == LONG
    assert [e["seq"] for e in long] == list(range(len(long)))
    wait_for(lambda: r.xpending(offer, "workers")["pending"] == 0 and r.xlen(offer) == 0,
             "the long job acknowledged on the offer stream", 15)
    wait_no_pending(r, prefix)

def test_adapter_stream_on_a_cluster(models, redis_cluster, prefix, tmp_path):
    """On a Redis Cluster an adapter's stream is sharded like a pool (the
    worker and the dispatcher derive the same shard keys from
    {<prefix>}jobs:lora@a): a's jobs through the dispatcher land in its
    shards, are all served by the one worker holding a, and none by the
    other; a job for a in shard s of a pool only the other reads is moved
    to a's shard s (the hand-off script runs in that slot)."""
    rc = redis_cluster.client()
    shards = pool_shards(prefix, "lora@a")
    tap(rc, *shards)
    common = ["--redis", redis_cluster.seeds, "--prefix", prefix, "--block-ms", "100",
              "--heartbeat-interval-ms", "300", "--http-port", "0"]
    started = []
    try:
        for name, extra in (("w1", ["--lora", f"a={models['adapter']}"]),
                            ("w2", ["--pools", "fast,think,extra"])):
            started.append(Proc([str(WORKER), *common, "--model", str(models["base"]), "--name",
                                 name, "--threads", "1", *extra], tmp_path / f"worker-{name}.log"))
        d = Proc([str(DISPATCHER), *common, "--name", "d1"], tmp_path / "dispatcher.log")
        started.append(d)
        wait_for(lambda: "LoRA adapter a is served by 1 of the 2 live workers" in d.text() and
                 "jobs:lora@a, which 1 of them read" in d.text(), "the dispatcher naming a's stream",
                 30)
        jobs = [greedy(f"c{i}", PROMPTS[i % 2], "a", cache=False, mode="no_think")
                for i in range(6)]
        for j in jobs:
            rc.xadd(f"{{{prefix}}}requests", {"job": json.dumps(j)})
        for j in jobs:
            evs = [ev for _, ev in stream_events(rc, f"{prefix}out:{{{j['id']}}}", 60)]
            assert evs[-1]["type"] == "done", evs[-2:]
        sent = sorted(json.loads(f["job"])["id"] for k in shards for _, f in rc.xrange(k))
        assert sent == sorted(j["id"] for j in jobs), sent
        # a's jobs in each shard of a pool only w2 reads: each moved to a's
        # stream of the same shard (the slot the script runs in)
        extra = pool_shards(prefix, "extra")
        for s, k in enumerate(extra):
            rc.xadd(k, {"job": json.dumps(greedy(f"h{s}", PROMPTS[0], "a", cache=False,
                                                 mode="no_think"))})
        for s in range(len(extra)):
            evs = [ev for _, ev in stream_events(rc, f"{prefix}out:{{h{s}}}", 60)]
            assert evs[-1]["type"] == "done", evs[-2:]
        for s, k in enumerate(shards):
            moved = [json.loads(f["job"])["id"] for _, f in rc.xrange(k)
                     if f.get("moved") == "handoff"]
            assert moved == [f"h{s}"], (k, moved)
        assert "MODEL_NOT_FOUND" not in started[1].text()
    finally:
        for p in started:
            p.stop()
