"""LoRA adapters loaded and unloaded at runtime for a whole fleet (vLLM's
POST /v1/load_lora_adapter and /v1/unload_lora_adapter on the front door,
common/lorafleet.c; worker/lorart.c), against a real redis-server and
real worker and dispatcher processes.

What is proved:

  - a load answers once every live worker of the model serves the adapter,
    which then answers exactly what the merged checkpoint answers, by the
    queue and by HTTP, on every worker; a worker started later serves it
    before its first job;
  - a worker without lora_dirs, or with a path outside them, says why in
    its heartbeat and the caller reads it: partly served (200 naming the
    worker), or not at all (400, the wish withdrawn so a retry starts
    clean); the adapter's jobs then go only to the workers holding it;
  - an unload answers once no live worker serves it; the job that runs with
    it finishes, every seq once; later jobs for it are MODEL_NOT_FOUND;
  - loaded again under its name from another directory, it answers the new
    weights: neither the prefix cache nor the result caches give the old
    ones' answer;
  - the routes are off (404) without runtime_lora, and bad bodies, names
    already served, and lora_modules's adapters are refused by name.

Waits are on observable state (heartbeats, events, HTTP answers), never
fixed sleeps.
"""
import http.client
import json
import shutil
import signal
import subprocess
import threading

import pytest

from conftest import CLI, connect, free_port, job_events, read_heartbeat, tap, wait_for
from test_lora import (PROMPTS, RANK, answer, chat, greedy, http_req, models, procs,  # noqa: F401
                       run, tokens)


def post(port, path, body, headers=None):
    """(status, text) of a POST; an error's JSON is decoded."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", path, body=json.dumps(body) if not isinstance(body, str) else body,
              headers={"Content-Type": "application/json", **(headers or {})})
    resp = c.getresponse()
    data = resp.read().decode()
    c.close()
    return resp.status, json.loads(data) if resp.status >= 400 else data


def load(port, name, path, **kw):
    return post(port, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, **kw})


def adapters(r, prefix, name):
    hb = read_heartbeat(r, prefix, "worker", name) or {}
    return {a["name"]: a for a in hb.get("lora_adapters", [])}


@pytest.fixture(scope="module")
def roots(models, tmp_path_factory):
    """A lora_dirs tree: sql/ (the test adapter), v2/ (another adapter of
    the same base, seed 9), and outside it a copy that must not load."""
    d = tmp_path_factory.mktemp("lora-roots")
    root = d / "adapters"
    root.mkdir()
    shutil.copytree(models["adapter"], root / "sql")
    run("mkmodel", "--lora-of", models["base"], "--lora-rank", RANK, "--lora-alpha", 2 * RANK,
        "--lora-std", "0.1", "--seed", "9", "--out", root / "v2")
    shutil.copytree(models["adapter"], d / "outside")
    return {"root": root, "outside": d / "outside"}


def test_load_and_unload_across_the_fleet(models, roots, procs, redis_addr, prefix):
    r = connect(redis_addr)
    base = models["base"].name
    port, off_port = free_port(), free_port()
    dirs = ("--lora-dirs", roots["root"])
    claim = ("--claim-idle-ms", "1500", "--lease-renew-ms", "300", "--claim-interval-ms", "300")
    w1 = procs["worker"]("w1", models["base"], *dirs, *claim, "--lora", f"c={models['adapter']}")
    w2 = procs["worker"]("w2", models["base"], *dirs, *claim)
    ref = procs["worker"]("ref", models["merged"], "--pools", "ref")
    d = procs["dispatcher"]("--runtime-lora", "--runtime-lora-timeout-s", "30", http_port=port)
    procs["dispatcher"](http_port=off_port, name="d2")
    ids = PROMPTS[2]
    want = tokens(answer(r, prefix, greedy("ref", ids, n=12, cache=False), pool="ref"))
    ref_chat = None

    # off unless runtime_lora is on, as vLLM without its switch
    st, e = post(off_port, "/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": "sql"})
    assert st == 404 and e["error"]["code"] == "not_found", e
    assert read_heartbeat(r, prefix, "worker", "w1", timeout=10)["lora_adapters"][0]["name"] == "c"
    read_heartbeat(r, prefix, "worker", "w2", timeout=10)

    # refused by name before anything is wished
    for body, param in [({"lora_path": "sql"}, "lora_name"),
                        ({"lora_name": "a b", "lora_path": "sql"}, "lora_name"),
                        ({"lora_name": "sql"}, "lora_path"),
                        ({"lora_name": "sql", "lora_path": "sql", "load_inplace": True},
                         "load_inplace"),
                        ({"lora_name": "sql", "lora_path": "sql", "model": "nope"}, "model"),
                        ({"lora_name": "c", "lora_path": "sql"}, "lora_name"),
                        ({"lora_name": base, "lora_path": "sql"}, "lora_name"),
                        # two base models are served (ref's merged): which?
                        ({"lora_name": "sql", "lora_path": "sql"}, "model"),
                        ({"lora_name": "sql", "lora_path": "sql", "model": "c"}, "model")]:
        st, e = post(port, "/v1/load_lora_adapter", body)
        assert st in (400, 404) and e["error"]["param"] == param, (body, e)
    st, e = post(port, "/v1/load_lora_adapter", "[1")
    assert st == 400, e
    assert r.hlen(f"{prefix}loras:{base}") == 0

    # the load: every live worker serves it when the call returns, also
    # while they are busy (a read paired with each admission once kept the
    # new adapter's stream from being laid out for as long as jobs came)
    busy, done_busy = threading.Event(), []

    def base_jobs(c):
        rc = connect(redis_addr)
        for i in range(10000):
            if busy.is_set():
                return
            j = greedy(f"busy{c}-{i}", PROMPTS[0], base, n=16, cache=False, mode="no_think")
            rc.xadd(f"{prefix}requests", {"job": json.dumps(j)})
            done_busy.append(job_events(rc, prefix, j["id"])[-1]["type"])
    clients = [threading.Thread(target=base_jobs, args=(c,)) for c in range(3)]
    for t in clients:
        t.start()
    wait_for(lambda: len(done_busy) >= 6, "the workers busy")
    st, text = load(port, "sql", "sql", model=base)
    busy.set()
    for t in clients:
        t.join()
    assert set(done_busy) == {"done"}
    assert st == 200 and text.startswith("Success: LoRA adapter 'sql' added successfully."), text
    assert "Served by" not in text, text
    for w in ("w1", "w2"):
        a = adapters(r, prefix, w)["sql"]
        assert a["lora_path"] == "sql" and a["rank"] == RANK, a
    assert r.hgetall(f"{prefix}loras:{base}") == {"sql": "sql"}
    # its own stream, once the worker laid its streams out again
    wait_for(lambda: all(adapters(r, prefix, w)["sql"].get("stream") for w in ("w1", "w2")),
             "sql's stream on both")
    # the merged checkpoint's answer, on each worker (each reads its own pool)
    for i, w in enumerate(("w1", "w2")):
        evs = answer(r, prefix, greedy(f"s{i}", ids, "sql", n=12, cache=False),
                     stream=f"{prefix}jobs:lora@sql")
        assert tokens(evs) == want, (w, tokens(evs), want)
    st, m = http_req(port, "GET", "/v1/models")
    assert {x["id"]: x.get("parent") for x in m["data"]}.get("sql") == base, m
    ref_chat = chat(port, "sql", "Which module renders prompts?")
    # a second load of the name is refused, the first stays
    st, e = load(port, "sql", "v2", model=base)
    assert st == 400 and e["error"]["code"] == "lora_already_loaded", e
    assert r.hget(f"{prefix}loras:{base}", "sql") == "sql"

    # what cannot load anywhere: 400 with the workers' reasons, withdrawn
    for path, says in [(str(roots["outside"]), "outside this worker's lora_dirs"),
                       ("../" + roots["outside"].name, "outside this worker's lora_dirs"),
                       ("nowhere", "no such directory")]:
        st, e = load(port, "bad", path, model=base)
        assert st == 400 and e["error"]["code"] == "lora_load_failed", e
        assert says in e["error"]["message"] and "w1: " in e["error"]["message"], e
        assert not r.hexists(f"{prefix}loras:{base}", "bad")

    # a worker started now serves it before its first job; one without
    # lora_dirs says why, and the call names it
    procs["worker"]("w3", models["base"], *dirs, *claim)
    first = read_heartbeat(r, prefix, "worker", "w3", timeout=10)
    assert [a for a in first["lora_adapters"] if a["name"] == "sql"][0]["lora_path"] == "sql"
    # (its heartbeat outlives it by heartbeat_ttl_s: short, as it stops below)
    w4 = procs["worker"]("w4", models["base"], *claim, "--heartbeat-ttl-s", "2")
    hb4 = read_heartbeat(r, prefix, "worker", "w4", timeout=10)
    assert hb4["lora_failed"] == [{"name": "sql", "lora_path": "sql", "error":
                                   "this worker loads no adapters at runtime (its lora_dirs "
                                   "is empty)"}], hb4
    st, text = load(port, "other", "v2", model=base)
    assert st == 200 and "Served by 3 of the 4 live workers" in text and "w4: " in text, text
    # the fleet does not agree on it: its jobs go to its stream, w4 takes none
    wait_for(lambda: f"LoRA adapter other is served by 3 of the 4 live workers of {base}: its "
             f"jobs go to {prefix}jobs:lora@other" in d.text(), "other routed to its stream", 15)
    tap(r, f"{prefix}jobs:lora@other")
    for i in range(4):
        r.xadd(f"{prefix}requests", {"job": json.dumps(
            greedy(f"o{i}", ids, "other", n=12, cache=False, mode="no_think"))})
    evs_o = [job_events(r, prefix, f"o{i}") for i in range(4)]
    outs = [tokens(e) for e in evs_o]
    assert all(e[-1]["type"] == "done" for e in evs_o), [e[:2] for e in evs_o]
    want_v2 = outs[0]
    assert all(o == want_v2 for o in outs) and want_v2 != want, outs
    assert sorted(json.loads(f["job"])["id"] for _, f in r.xrange(f"{prefix}jobs:lora@other")) \
        == [f"o{i}" for i in range(4)]
    assert read_heartbeat(r, prefix, "worker", "w4")["jobs_done"] == 0
    w4.stop()

    # unload while a long job runs with it: the call returns once nobody
    # serves it; the job finishes, every seq once; later jobs are refused
    r.xadd(f"{prefix}requests", {"job": json.dumps(
        greedy("long", ids, "sql", n=1500, cache=False, mode="no_think"))})
    wait_for(lambda: r.xlen(f"{prefix}out:long") >= 3, "the long job streaming", 30)
    st, text = post(port, "/v1/unload_lora_adapter", {"lora_name": "sql"})
    assert st == 200 and text == "Success: LoRA adapter 'sql' removed successfully.\n", text
    assert not any("sql" in adapters(r, prefix, w) for w in ("w1", "w2", "w3"))
    evs = job_events(r, prefix, "long", timeout=120)
    assert evs[-1]["type"] == "done" and evs[-1]["usage"]["completion_tokens"] == 1500, evs[-1]
    assert [e["seq"] for e in evs] == list(range(len(evs)))
    assert tokens(evs)[:12] == want
    for w in (w1, w2):
        wait_for(lambda: "runtime LoRA adapter sql: unloaded" in w.text(), "the weights freed")
    st, e = http_req(port, "POST", "/v1/chat/completions",
                     {"model": "sql", "messages": [{"role": "user", "content": "Hi"}]})
    assert st == 404 and e["error"]["code"] == "model_not_found", e
    # queued for it (in its stream) before the dispatcher knew: answered
    r.xadd(f"{prefix}jobs:lora@sql", {"job": json.dumps(greedy("late", ids, "sql"))})
    late = job_events(r, prefix, "late")
    assert late[0]["type"] == "error" and late[0]["code"] == "MODEL_NOT_FOUND", late
    st, e = post(port, "/v1/unload_lora_adapter", {"lora_name": "sql"})
    assert st == 404 and e["error"]["code"] == "lora_not_found", e
    st, e = post(port, "/v1/unload_lora_adapter", {"lora_name": "c"})
    assert st == 400 and "lora_modules" in e["error"]["message"], e

    # loaded again under its name from v2: v2's answers, by the queue and by
    # HTTP (whose result cache held sql's old answer to the same request)
    st, text = load(port, "sql", "v2", model=base)
    assert st == 200, text
    for i in range(3):
        evs = answer(r, prefix, greedy(f"n{i}", ids, "sql", n=12, cache=False),
                     stream=f"{prefix}jobs:lora@sql")
        assert tokens(evs) == want_v2, (tokens(evs), want_v2)
    again = chat(port, "sql", "Which module renders prompts?")
    assert again != ref_chat and again == chat(port, "other", "Which module renders prompts?")
    assert r.xpending(f"{prefix}jobs:lora@sql", "workers")["pending"] == 0


def test_redlm_lora_without_a_front_door(models, roots, procs, redis_addr, prefix, tmp_path):
    """`redlm lora` does what the front door's routes do, for a fleet fed by
    the queue alone: the same wish, the same wait, the same refusals; list
    shows the wish and each worker's adapters and failures."""
    r = connect(redis_addr)

    def lora(*args):
        p = subprocess.run([str(CLI), "lora", *map(str, args), "--redis", redis_addr,
                            "--prefix", prefix], capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout, p.stderr

    procs["worker"]("w1", models["base"], "--lora-dirs", roots["root"])
    conf = tmp_path / "w2.conf"
    conf.write_text("lora_dirs = [];\n")
    w2 = procs["worker"]("w2", models["base"], "-c", conf)  # no lora_dirs, for now
    ref = procs["worker"]("ref", models["merged"], "--pools", "ref")
    ids = PROMPTS[1]
    want = tokens(answer(r, prefix, greedy("ref", ids, cache=False), pool="ref"))
    ref.stop()
    wait_for(lambda: read_heartbeat(r, prefix, "worker", "ref") is None, "ref's heartbeat gone",
             15)
    read_heartbeat(r, prefix, "worker", "w2", timeout=10)
    rc, out, err = lora("load", "sql", "sql", "--timeout", "20")
    assert rc == 0 and "added successfully. Served by 1 of the 2 live workers" in out, (out, err)
    assert "w2: this worker loads no adapters at runtime" in out
    # a job for it, straight to its stream: w1's answer, the merged checkpoint's
    wait_for(lambda: (read_heartbeat(r, prefix, "worker", "w1") or {}).get("lora_adapters"),
             "w1 serving sql")
    evs = answer(r, prefix, greedy("s", ids, "sql", cache=False), stream=f"{prefix}jobs:lora@sql")
    assert tokens(evs) == want
    rc, out, err = lora("load", "sql", "v2")
    assert rc == 1 and "has already been loaded" in err, (out, err)
    rc, out, err = lora("load", "bad", "nowhere", "--timeout", "20")
    assert rc == 1 and "no such directory" in err and "w1: " in err, (out, err)
    rc, out, _ = lora("list", "--json")
    m = json.loads(out)["models"]
    assert [x["model"] for x in m] == [models["base"].name] and m[0]["wished"] == {"sql": "sql"}
    by = {w["name"]: w for w in m[0]["workers"]}
    assert [a["name"] for a in by["w1"]["adapters"]] == ["sql"] and by["w2"]["adapters"] == []
    assert by["w2"]["failed"][0]["name"] == "sql"
    rc, out, _ = lora("list")
    assert "loaded at runtime: sql (sql)" in out and "failed sql: this worker loads" in out, out
    # lora_dirs given to w2 and SIGHUP: what failed there is tried again
    conf.write_text(f'lora_dirs = ["{roots["root"]}"];\n')
    w2.signal(signal.SIGHUP)
    wait_for(lambda: [a.get("lora_path") for a in (read_heartbeat(r, prefix, "worker", "w2") or {})
                      .get("lora_adapters", [])] == ["sql"], "w2 serving sql after SIGHUP", 15)
    assert "lora_failed" not in read_heartbeat(r, prefix, "worker", "w2")
    rc, out, err = lora("unload", "sql")
    assert rc == 0 and out == "Success: LoRA adapter 'sql' removed successfully.\n", (out, err)
    for w in ("w1", "w2"):
        assert "sql" not in [a["name"] for a in
                             read_heartbeat(r, prefix, "worker", w).get("lora_adapters", [])]
    rc, out, err = lora("unload", "sql")
    assert rc == 1 and "cannot be found" in err
    assert lora("frobnicate")[0] == 2 and lora("load", "x")[0] == 2


def test_only_the_operators_keys_load_adapters(procs, tmp_path):
    """With API keys on, runtime_lora_tenants names who may load and unload:
    a client's key gets 403 before anything is wished, no key 401, an
    operator's key passes (here to "no live worker")."""
    keys = tmp_path / "keys"
    keys.write_text("sk-ops-000000001 ops\nsk-team-00000001 team\n")
    port = free_port()
    procs["dispatcher"]("--runtime-lora", "--api-keys-file", keys, "--runtime-lora-tenants",
                        "ops", http_port=port)
    body = {"lora_name": "sql", "lora_path": "sql"}
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        st, e = post(port, path, body, {"Authorization": "Bearer sk-team-00000001"})
        assert st == 403 and e["error"]["code"] == "permission_denied", e
        assert "tenant team" in e["error"]["message"]
        st, e = post(port, path, body)
        assert st == 401, e
    st, e = post(port, "/v1/load_lora_adapter", body, {"Authorization": "Bearer sk-ops-000000001"})
    assert st == 503 and e["error"]["code"] == "no_workers", e
