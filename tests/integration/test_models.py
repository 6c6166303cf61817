"""Models by name (issue 15, section 2), against a real redis-server and real
worker and dispatcher processes:

  - `--model` takes a Hugging Face repo id (with @revision) resolved offline
    in a Hugging Face cache tree the test builds (refs/<rev> -> snapshots/
    <hash>/, files as symlinks into blobs/, as huggingface_hub leaves them),
    found through $HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub; a
    miss names where it looked (worker, dispatcher and `redlm run`);
  - the served name (repo id, directory name, --served-model-name) is in
    the worker heartbeat; GET /v1/models lists what live workers serve;
    /v1/models/<id> of an unknown id and a chat request for one are 404
    model_not_found naming what is served;
  - two random checkpoints of different shapes, served as Qwen/Qwen3-0.6B
    and Qwen/Qwen3-14B with their own pools on one Redis: every job runs on
    its own model (its greedy tokens equal `redlm run` on that checkpoint),
    the think/fast split holds per model, a job naming no model is refused
    MODEL_REQUIRED, one naming an unknown model MODEL_NOT_FOUND, and the
    result cache never answers one model's job with the other's tokens;
  - a single-model deployment (shared pools, no served_model_name on the
    dispatcher) works as before: jobs without `model` run, and /v1/models
    lists the worker's model.
"""
import hashlib
import http.client
import json
import os
import pathlib
import subprocess
import time

import pytest

from conftest import (CLI, DISPATCHER, Daemon, MODEL, WORKER, connect, free_port, read_heartbeat,
                      tap)
from conftest import job_events as events

SMALL = {  # Qwen/Qwen3-0.6B stands in as this shape
    "repo": "Qwen/Qwen3-0.6B", "seed": "1",
    "shape": ["--hidden", "64", "--intermediate", "128", "--heads", "2", "--kv-heads", "1",
              "--head-dim", "32", "--layers", "2"]}
BIG = {  # and Qwen/Qwen3-14B as this one: another shape, other weights
    "repo": "Qwen/Qwen3-14B", "seed": "2",
    "shape": ["--hidden", "96", "--intermediate", "192", "--heads", "3", "--kv-heads", "1",
              "--head-dim", "32", "--layers", "3"]}


def mkmodel(out, spec):
    cfg = json.loads((MODEL / "config.json").read_text())
    subprocess.run([str(CLI), "mkmodel", "--shape", "tiny", *spec["shape"],
                    "--vocab", str(cfg["vocab_size"]), "--bos", str(cfg["bos_token_id"]),
                    "--eos", str(cfg["eos_token_id"]), "--dtype", "bf16", "--seed", spec["seed"],
                    "--untied",  # tied random weights tend to repeat the prompt's last token
                    "--tokenizer", str(MODEL), "--out", str(out)],
                   check=True, capture_output=True, timeout=120)


def hub_add(hub, repo, src, refs=("main",)):
    """Puts checkpoint src into the cache tree hub as huggingface_hub does:
    blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/<sha256>,
    refs/<name> = <commit>. Returns (commit, snapshot dir)."""
    folder = hub / ("models--" + repo.replace("/", "--"))
    commit = hashlib.sha1((repo + str(src)).encode()).hexdigest()
    snap = folder / "snapshots" / commit
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(pathlib.Path(src).iterdir()):
        if f.name == "reference.json":
            continue
        data = f.read_bytes()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (folder / "refs").mkdir(exist_ok=True)
    for r in refs:
        (folder / "refs" / r).write_text(commit)  # no newline, as the hub writes it
    return commit, snap


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A Hugging Face cache with the two random checkpoints (made once)."""
    if not CLI.exists() or not WORKER.exists() or not DISPATCHER.exists():
        pytest.skip("build/ lacks redlm, redlm-worker or redlm-dispatcher (run make)")
    if not (MODEL / "config.json").exists():
        pytest.skip(f"tiny model missing at {MODEL}")
    base = tmp_path_factory.mktemp("hf")
    hub = base / "hub"
    out = {}
    for spec in (SMALL, BIG):
        src = base / "made" / spec["repo"].split("/")[1]
        mkmodel(src, spec)
        out[spec["repo"]] = hub_add(hub, spec["repo"], src)
    return {"hub": hub, "snap": out}


def run_greedy(model, ids, n=6, env=None):
    """`redlm run` on model (a directory or a repo id): greedy tokens."""
    p = subprocess.run([str(CLI), "run", "-m", str(model), "--tokens", ",".join(map(str, ids)),
                        "-n", str(n), "--temperature", "0", "--ignore-eos", "--threads", "1"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["tokens"]


class Proc(Daemon):
    """A worker or dispatcher with an environment of the test's (Daemon
    starts with ours); ready at its "ready:" line."""

    def __init__(self, args, log_path, env, timeout=60):
        self.kind = pathlib.Path(args[0]).name
        self.start(args, log_path, self.logged_ready, timeout, env=env, cwd=None)


@pytest.fixture
def procs(redis_addr, prefix, tmp_path):
    """{"worker": (name, model, *flags, env=), "dispatcher": (*flags, env=, http_port=)};
    every process is stopped at the end."""
    started = []

    def worker(name, model, *extra, env=None):
        w = Proc([str(WORKER), "--redis", redis_addr, "--prefix", prefix, "--model", str(model),
                  "--name", name, "--threads", "1", "--block-ms", "100",
                  "--heartbeat-interval-ms", "300", "--http-port", "0", *extra],
                 tmp_path / f"worker-{name}.log", env)
        started.append(w)
        return w

    def dispatcher(*extra, env=None, http_port=None):
        args = [str(DISPATCHER), "--redis", redis_addr, "--prefix", prefix, "--name", "d1",
                "--http-port", "0", "--block-ms", "100", "--heartbeat-interval-ms", "200",
                *extra]
        if http_port:
            args += ["--http", str(http_port)]
        d = Proc(args, tmp_path / "dispatcher.log", env)
        started.append(d)
        return d

    yield {"worker": worker, "dispatcher": dispatcher}
    for p in started:
        p.stop()


def env_with(**kv):
    e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    e.update({k: str(v) for k, v in kv.items()})
    return e


def heartbeat(r, prefix, name, timeout=10):
    return read_heartbeat(r, prefix, "worker", name, timeout)


def tokens(evs):
    return [t for e in evs if e["type"] == "delta" for t in e["token_ids"]]


def http_req(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data) if data else None


def wait_models(port, want, timeout=15):
    deadline = time.time() + timeout
    while True:
        st, m = http_req(port, "GET", "/v1/models")
        ids = sorted(x["id"] for x in m["data"]) if st == 200 else None
        if ids == sorted(want) or time.time() > deadline:
            return st, m
        time.sleep(0.1)


# ---------------------------------------------------------------------------

def test_hub_repo_id_resolved_offline(hub, procs, redis_addr, prefix, tmp_path):
    r = connect(redis_addr)
    repo = SMALL["repo"]
    commit, snap = hub["snap"][repo]
    ids = [5, 17, 42, 99]
    ref = run_greedy(snap, ids)
    # redlm run: $HF_HUB_CACHE, then $HF_HOME/hub, then ~/.cache/huggingface/hub
    hub_dir = hub["hub"]
    assert run_greedy(repo, ids, env=env_with(HF_HUB_CACHE=hub_dir)) == ref
    assert run_greedy(repo, ids, env=env_with(HF_HOME=hub_dir.parent)) == ref
    home = tmp_path / "home"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "hub").symlink_to(hub_dir)
    assert run_greedy(repo, ids, env=env_with(HOME=home)) == ref
    # @revision: a branch under refs/, and a commit hash with no ref file
    folder = hub_dir / ("models--" + repo.replace("/", "--"))
    (folder / "refs" / "v1.0").write_text(commit + "\n")
    assert run_greedy(f"{repo}@v1.0", ids, env=env_with(HF_HUB_CACHE=hub_dir)) == ref
    assert run_greedy(f"{repo}@{commit}", ids, env=env_with(HF_HUB_CACHE=hub_dir)) == ref

    # the worker: loads the snapshot, serves it under the repo id
    w = procs["worker"]("hub1", repo, "--pools", "fast", env=env_with(HF_HUB_CACHE=hub_dir))
    hb = heartbeat(r, prefix, "hub1")
    assert hb["model"] == repo and hb["model_owned_by"] == "Qwen"
    assert pathlib.Path(hb["model_dir"]) == snap
    assert isinstance(hb["model_created"], (int, float)) and hb["model_created"] > 0
    assert hb["pool_scope"] == "shared"
    assert "hub1" in r.zrange(f"{prefix}workers", 0, -1)
    r.xadd(f"{prefix}jobs:fast", {"job": json.dumps(
        {"id": "hub-1", "prompt_ids": ids, "max_tokens": 6, "temperature": 0,
         "ignore_eos": True, "model": repo})})
    evs = events(r, prefix, "hub-1")
    assert evs[-1]["finish_reason"] == "length" and tokens(evs) == ref
    # a job that names another model is refused by the worker, not run
    r.xadd(f"{prefix}jobs:fast", {"job": json.dumps(
        {"id": "hub-2", "prompt_ids": ids, "max_tokens": 2, "model": "Qwen/Qwen3-14B"})})
    evs = events(r, prefix, "hub-2")
    assert evs[0]["type"] == "error" and evs[0]["code"] == "MODEL_NOT_FOUND"
    assert repo in evs[0]["message"] and "Qwen/Qwen3-14B" in evs[0]["message"]
    dead = [json.loads(f["dead"]) for _, f in r.xrange(f"{prefix}dead")]
    assert any(d["id"] == "hub-2" and d["code"] == "MODEL_NOT_FOUND" for d in dead)
    assert w.proc.poll() is None


def test_hub_miss_says_where_it_looked(hub, procs, tmp_path):
    hub_dir = hub["hub"]
    # redlm run, with each of the three places
    for env, place in [(env_with(HF_HUB_CACHE=hub_dir), str(hub_dir)),
                       (env_with(HF_HOME=tmp_path / "hfhome"), str(tmp_path / "hfhome" / "hub")),
                       (env_with(HOME=tmp_path / "h"),
                        str(tmp_path / "h" / ".cache" / "huggingface" / "hub"))]:
        p = subprocess.run([str(CLI), "run", "-m", "Qwen/Qwen3-32B", "--tokens", "1", "-n", "1"],
                           capture_output=True, text=True, timeout=60, env=env)
        assert p.returncode != 0
        assert place in p.stderr and "models--Qwen--Qwen3-32B/refs/main" in p.stderr, p.stderr
    p = subprocess.run([str(CLI), "run", "-m", "Qwen/Qwen3-0.6B@nope", "--tokens", "1", "-n", "1"],
                       capture_output=True, text=True, timeout=60,
                       env=env_with(HF_HUB_CACHE=hub_dir))
    assert p.returncode != 0 and "refs/nope" in p.stderr, p.stderr
    # the worker and the dispatcher stop at start with the same sentence
    for prog in (WORKER, DISPATCHER):
        p = subprocess.run([str(prog), "--model", "Qwen/Qwen3-32B", "--http-port", "0",
                            "--redis", "127.0.0.1:1"],
                           capture_output=True, text=True, timeout=60,
                           env=env_with(HF_HUB_CACHE=hub_dir))
        assert p.returncode != 0
        out = p.stdout + p.stderr
        assert str(hub_dir) in out and "$HF_HUB_CACHE" in out and \
            "models--Qwen--Qwen3-32B" in out, out
    # a path that does not exist is not taken for a repo id
    p = subprocess.run([str(CLI), "run", "-m", str(tmp_path / "nowhere"), "--tokens", "1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "no such directory" in p.stderr, p.stderr


def test_two_models_one_redis(hub, procs, redis_addr, prefix, tmp_path):
    r = connect(redis_addr)
    env = env_with(HF_HUB_CACHE=hub["hub"])
    a, b = SMALL["repo"], BIG["repo"]
    port = free_port()
    # the pool streams keep what was routed, counted below
    tap(r, *[f"{prefix}jobs:{m}:{p}" for m in (a, b) for p in ("fast", "think")])
    procs["worker"]("wa", a, "--pool-scope", "model", env=env)
    wb = procs["worker"]("wb", b, "--pool-scope", "model", "--heartbeat-ttl-s", "2", env=env)
    procs["dispatcher"]("--model", a, "--think-ratio", "0.5", env=env, http_port=port)

    # /v1/models: what the live workers serve
    st, m = wait_models(port, [a, b])
    assert st == 200 and m["object"] == "list"
    assert sorted(x["id"] for x in m["data"]) == [a, b], m
    for x in m["data"]:
        assert x["object"] == "model" and x["owned_by"] == "Qwen"
        assert isinstance(x["created"], int) and x["created"] > 0
    st, one = http_req(port, "GET", f"/v1/models/{b}")
    assert st == 200 and one["id"] == b
    st, e = http_req(port, "GET", "/v1/models/Qwen/Qwen3-32B")
    assert st == 404 and e["error"]["code"] == "model_not_found"
    assert a in e["error"]["message"] and b in e["error"]["message"]
    st, e = http_req(port, "POST", "/v1/chat/completions",
                     {"model": "Qwen/Qwen3-32B", "messages": [{"role": "user", "content": "Hi"}]})
    assert st == 404 and e["error"]["code"] == "model_not_found" and e["error"]["param"] == "model"
    assert a in e["error"]["message"] and b in e["error"]["message"]
    assert r.xlen(f"{prefix}requests") == 0  # refused at the door

    # each model's jobs run on that model: greedy tokens equal `redlm run`
    # on its checkpoint (the two random models never agree on them)
    ids = [7, 8, 9, 10, 11]
    ref = {a: run_greedy(hub["snap"][a][1], ids, 8), b: run_greedy(hub["snap"][b][1], ids, 8)}
    assert ref[a] != ref[b]
    jobs = []
    for i in range(20):  # interleaved a, b, a, b: one shared split would send
        for mdl in (a, b):  # all of a to one pool and all of b to the other
            jid = f"j{i}-{mdl.split('-')[1]}"
            jobs.append((jid, mdl))
            r.xadd(f"{prefix}requests", {"job": json.dumps(
                {"id": jid, "model": mdl, "prompt_ids": ids, "max_tokens": 8,
                 "temperature": 0, "ignore_eos": True, "cache": False, "mode": "auto"})})
    for jid, mdl in jobs:
        evs = events(r, prefix, jid)
        assert evs[-1]["finish_reason"] == "length", evs
        assert tokens(evs) == ref[mdl], (jid, mdl)
    # the think/fast split per model: half of each model's auto requests
    for mdl in (a, b):
        n_think = r.xlen(f"{prefix}jobs:{mdl}:think")
        n_fast = r.xlen(f"{prefix}jobs:{mdl}:fast")
        assert (n_think, n_fast) == (10, 10), (mdl, n_think, n_fast)
    assert not r.exists(f"{prefix}jobs:fast") or r.xlen(f"{prefix}jobs:fast") == 0
    hb = {n: heartbeat(r, prefix, n) for n in ("wa", "wb")}
    assert hb["wa"]["model"] == a and hb["wb"]["model"] == b
    assert hb["wa"]["pool_scope"] == "model"

    # no model named while two are served: MODEL_REQUIRED; an unknown one:
    # MODEL_NOT_FOUND; both as error event + dead letter, nothing forwarded
    before = r.xlen(f"{prefix}jobs:{a}:fast") + r.xlen(f"{prefix}jobs:{b}:fast")
    r.xadd(f"{prefix}requests", {"job": json.dumps({"id": "nomodel", "prompt_ids": ids})})
    r.xadd(f"{prefix}requests", {"job": json.dumps(
        {"id": "badmodel", "prompt_ids": ids, "model": "Qwen/Qwen3-32B"})})
    e1, e2 = events(r, prefix, "nomodel"), events(r, prefix, "badmodel")
    assert e1[0]["code"] == "MODEL_REQUIRED" and a in e1[0]["message"] and b in e1[0]["message"]
    assert e2[0]["code"] == "MODEL_NOT_FOUND" and "Qwen/Qwen3-32B" in e2[0]["message"]
    assert e1[-1]["finish_reason"] == "error" and e2[-1]["finish_reason"] == "error"
    dead = {json.loads(f["dead"])["id"]: json.loads(f["dead"])
            for _, f in r.xrange(f"{prefix}dead")}
    assert dead["nomodel"]["code"] == "MODEL_REQUIRED"
    assert dead["badmodel"]["code"] == "MODEL_NOT_FOUND"
    assert r.xlen(f"{prefix}jobs:{a}:fast") + r.xlen(f"{prefix}jobs:{b}:fast") == before
    # HTTP without a model while two are served: 400 MODEL_REQUIRED
    st, e = http_req(port, "POST", "/v1/chat/completions",
                     {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert st == 400 and e["error"]["code"] == "MODEL_REQUIRED", e

    # the result cache never crosses models: the same deterministic job,
    # first to a (fills a's entry), then b (must run: another model), then
    # both again (each answered from its own entry, with its own tokens)
    def cached_run(jid, mdl):
        r.xadd(f"{prefix}requests", {"job": json.dumps(
            {"id": jid, "model": mdl, "prompt_ids": ids, "max_tokens": 8, "temperature": 0,
             "ignore_eos": True, "mode": "no_think"})})
        evs = events(r, prefix, jid)
        return evs[-1]["cached"], tokens(evs)
    assert cached_run("c1", a) == (False, ref[a])
    assert cached_run("c2", b) == (False, ref[b])
    assert cached_run("c3", a) == (True, ref[a])
    assert cached_run("c4", b) == (True, ref[b])

    # `redlm enqueue --model` names it too
    p = subprocess.run([str(CLI), "enqueue", "--redis", redis_addr, "--prefix", prefix,
                        "--model", b, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", "8",
                        "--temperature", "0", "--ignore-eos", "--no-cache", "--mode", "no_think"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert tokens(events(r, prefix, p.stdout.strip())) == ref[b]

    # `redlm chat --model` too; without it, with two models served, the
    # turn is refused MODEL_REQUIRED
    def chat(*flags):
        return subprocess.run([str(CLI), "chat", "--redis", redis_addr, "--prefix", prefix,
                               "--max-tokens", "3", "--mode", "no_think", "--color", "never",
                               *flags], input="Hi\n/exit\n", capture_output=True, text=True,
                              timeout=60)
    p = chat("--model", b)
    assert p.returncode == 0 and "MODEL_REQUIRED" not in p.stdout + p.stderr, p
    assert "[done] finish_reason=length" in p.stderr and "completion_tokens=3" in p.stderr, p
    p = chat()
    assert "MODEL_REQUIRED" in p.stdout + p.stderr, p

    # `redlm bench --model`: every request answered by that model
    p = subprocess.run([str(CLI), "bench", "--redis", redis_addr, "--prefix", prefix,
                        "--model", b, "--clients", "1", "--requests", "3", "--output-len", "2",
                        "--no-plots", "--out", str(tmp_path / "lb" / "r.json")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lv = json.loads(p.stdout)["levels"][0]
    assert lv["completed"] == 3 and not lv.get("errors"), lv

    # the example web backend with --model (and without: the error event)
    server = pathlib.Path(__file__).resolve().parents[2] / "examples" / "web"
    for flags, ok in ((["--model", b], True), ([], False)):
        web = subprocess.Popen(["/usr/bin/python3", str(server / "server.py"), "--redis",
                                redis_addr, "--prefix", prefix, "--listen", "127.0.0.1:0", *flags],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            url = web.stdout.readline().split("listening on ", 1)[1].split()[0]
            p = subprocess.run(["/usr/bin/python3", str(server / "ask.py"), url, "Hi",
                                "--max-tokens", "3"], capture_output=True, text=True, timeout=60)
        finally:
            web.terminate()
            web.wait(10)
        assert (p.returncode == 0) == ok, p
        assert ("MODEL_REQUIRED" in p.stdout + p.stderr) != ok, p

    # a non-streamed HTTP completion for the big model, echoing its name
    st, c = http_req(port, "POST", "/v1/chat/completions",
                     {"model": b, "messages": [{"role": "user", "content": "Hi"}],
                      "max_tokens": 4, "temperature": 0})
    assert st == 200 and c["model"] == b and c["object"] == "chat.completion", c

    # a job queued by hand on b's stream that names a: b's worker refuses it
    r.xadd(f"{prefix}jobs:{b}:fast", {"job": json.dumps(
        {"id": "wrongq", "model": a, "prompt_ids": ids, "max_tokens": 2})})
    evs = events(r, prefix, "wrongq")
    assert evs[0]["code"] == "MODEL_NOT_FOUND"

    # `redlm stats` names each model's pools as their streams do
    p = subprocess.run([str(CLI), "stats", "--json", "--redis", redis_addr, "--prefix", prefix],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    pools = {x["name"]: x for x in json.loads(p.stdout)["pools"]}
    for mdl in (a, b):
        for pool in ("fast", "think"):
            assert pools[f"{mdl}:{pool}"]["workers"] == 1, pools.keys()
            assert pools[f"{mdl}:{pool}"]["key"] == f"{prefix}jobs:{mdl}:{pool}"
    assert pools.get("fast", {"workers": 0})["workers"] == 0  # nobody reads the shared one

    # the big model's last worker stops: once its heartbeat expires it is no
    # longer served; a job for it is MODEL_NOT_FOUND, and one naming no model
    # goes to the one model left
    wb.stop()
    st, m = wait_models(port, [a])
    assert [x["id"] for x in m["data"]] == [a], m
    r.xadd(f"{prefix}requests", {"job": json.dumps(
        {"id": "gone", "model": b, "prompt_ids": ids, "max_tokens": 2})})
    assert events(r, prefix, "gone")[0]["code"] == "MODEL_NOT_FOUND"
    r.xadd(f"{prefix}requests", {"job": json.dumps(
        {"id": "onlyone", "prompt_ids": ids, "max_tokens": 8, "temperature": 0,
         "ignore_eos": True, "cache": False, "mode": "no_think"})})
    assert tokens(events(r, prefix, "onlyone")) == ref[a]


def test_single_model_unchanged(procs, redis_addr, prefix, tmp_path):
    """Shared pools, a model directory, no served_model_name anywhere: jobs
    without `model` are routed and run as before, and the front door serves
    the directory's name."""
    if not DISPATCHER.exists() or not WORKER.exists():
        pytest.skip("not built")
    r = connect(redis_addr)
    tap(r, f"{prefix}jobs:fast")  # handled entries stay for the check below
    port = free_port()
    procs["worker"]("s1", MODEL)
    procs["dispatcher"](http_port=port)
    st, m = wait_models(port, [MODEL.name])
    assert st == 200 and [x["id"] for x in m["data"]] == [MODEL.name]
    assert m["data"][0]["owned_by"] == "redlm"
    r.xadd(f"{prefix}requests", {"job": json.dumps(
        {"id": "plain", "prompt_ids": [1, 2, 3], "max_tokens": 3, "mode": "no_think"})})
    evs = events(r, prefix, "plain")
    assert evs[-1]["type"] == "done" and evs[-1]["finish_reason"] in ("length", "stop")
    assert r.xlen(f"{prefix}jobs:fast") == 1  # the shared pool, as always
    st, c = http_req(port, "POST", "/v1/chat/completions",
                     {"model": MODEL.name, "messages": [{"role": "user", "content": "Hi"}],
                      "max_tokens": 3})
    assert st == 200 and c["model"] == MODEL.name, c
    # and without `model` at all: the one model served
    st, c = http_req(port, "POST", "/v1/chat/completions",
                     {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
    assert st == 200 and c["model"] == MODEL.name, c

    # --served-model-name: a second worker of the same pools under another
    # name; both names are served, and the shared pools still count as one
    # destination, so a job without `model` is not refused
    procs["worker"]("s2", MODEL, "--served-model-name", "tiny-alias")
    assert heartbeat(r, prefix, "s2")["model"] == "tiny-alias"
    st, m = wait_models(port, [MODEL.name, "tiny-alias"])
    assert sorted(x["id"] for x in m["data"]) == sorted([MODEL.name, "tiny-alias"])
    r.xadd(f"{prefix}requests", {"job": json.dumps(
        {"id": "plain2", "prompt_ids": [1, 2, 3], "max_tokens": 3, "mode": "no_think"})})
    assert events(r, prefix, "plain2")[-1]["finish_reason"] in ("length", "stop")
    # a served name must be one clients can send
    p = subprocess.run([str(WORKER), "--model", str(MODEL), "--served-model-name", "bad name",
                        "--http-port", "0", "--redis", redis_addr], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and "served_model_name" in p.stdout + p.stderr
