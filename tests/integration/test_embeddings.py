"""The embedding endpoints of the front door (dispatcher/embed.c), end to end
through a real redis-server and dispatcher:

  - with the test playing the worker (so what the worker sends is known
    exactly): POST /v1/embeddings answers floats that read back to the very
    float32 values the done event carried, and base64 that is the event's
    string as it is; several inputs come back in input order with their
    indices and summed usage, one job each (ids <id>-<i>, task embed, mode
    no_think, dimensions carried); a worker's error is the status and param
    of OpenAI's error object (PROMPT_TOO_LONG -> 400 input); Ollama's
    /api/embed and /api/embeddings answer their shapes, and no input is the
    empty answer at once (Ollama's model load), with no job;
  - refusals before anything is queued: empty input, empty list, over 2048
    inputs, bad encoding_format, dimensions out of range, a model nobody
    serves, unknown members under http_unknown_fields = refuse;
  - with a real worker on the tiny model: unit vectors, float and base64
    agree bit for bit, `dimensions` gives the renormalised prefix of the
    full vector, the same text twice gives the same vector and two texts
    differ, a batch equals its inputs one by one; Ollama's endpoints; a
    text past the context: OpenAI's 400 naming the limit, Ollama's
    truncation by default (and its 400 with truncate false);
  - the clients users embed with: the AI SDK's embed/embedMany with
    @ai-sdk/openai's embedding model (floats) and LangChain's
    OpenAIEmbeddings (base64 through the openai client), from
    tests/integration/node-clients.
"""
import base64
import json
import math
import re
import struct
import subprocess
import threading
import time

import pytest

from conftest import connect, job_events, tap
from test_clients import node_clients
from test_http import MODEL_NAME, front  # noqa: F401 (front is a fixture)

KEY = "sk-test-0123456789"


# ---- helpers ----

def floats_of(b64):
    """A done event's / base64 answer's vector: little-endian float32, as a
    web backend decodes it (numpy.frombuffer(base64.b64decode(s), '<f4'))."""
    raw = base64.b64decode(b64)
    assert len(raw) % 4 == 0
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def b64_of(values):
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def f32(x):
    """x rounded to float32, as a float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def unit(v):
    n = norm(v)
    return [f32(x / n) for x in v]


def embed_post(f, body, path="/v1/embeddings", headers=None):
    status, h, data = f.request("POST", path, body, headers)
    return status, h, json.loads(data) if data.strip() else None


def pool_jobs(r, prefix):
    """Every job the dispatcher forwarded, by id."""
    jobs = {}
    for pool in ("fast", "think"):
        for _, fields in r.xrange(f"{prefix}jobs:{pool}"):
            j = json.loads(fields["job"])
            jobs[j["id"]] = j
    return jobs


def play_jobs(r, prefix, n, answer, timeout=20):
    """Plays the worker for the next n jobs: waits for each in the pools and
    writes answer(job) (a list of event dicts) to its stream. Returns the
    jobs answered, in the order they were seen."""
    done, order = set(), []
    deadline = time.time() + timeout
    while len(order) < n and time.time() < deadline:
        for job in pool_jobs(r, prefix).values():
            if job["id"] in done or r.exists(f"{prefix}out:{job['id']}"):
                continue
            done.add(job["id"])
            order.append(job)
            for i, e in enumerate(answer(job)):
                r.xadd(f"{prefix}out:{job['id']}", {"event": json.dumps(e)}, id=f"0-{i + 1}")
        time.sleep(0.02)
    assert len(order) == n, f"{len(order)} of {n} jobs came"
    return order


def done_event(values, prompt_tokens, seq=0):
    return {"seq": seq, "type": "done", "finish_reason": "stop",
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0,
                      "reasoning_tokens": 0, "cached_prompt_tokens": 0},
            "cached": False, "timings": {"queue_ms": 0, "ttft_ms": 1, "total_ms": 1},
            "tool_calls": [], "embedding": b64_of(values), "dimensions": len(values)}


def played_vector(job):
    """The played worker's vector for a job: a function of its prompt, with
    values that need all nine digits to read back as the same float32."""
    p = job.get("prompt") or "".join(map(str, job.get("prompt_ids", [])))
    v = [f32(math.sin(len(p) + k * 0.7 + ord(p[0]) / 3.0)) for k in range(8)]
    return v[:job.get("dimensions", 8)]


def played(job):
    p = job.get("prompt") or job.get("prompt_ids")
    return [done_event(played_vector(job), len(p))]


def in_thread(fn, *args):
    box = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 (re-raised in join)
            box["error"] = e
    t = threading.Thread(target=run)
    t.start()

    def join():
        t.join()
        if "error" in box:
            raise box["error"]
        return box.get("value")
    return join


# ---- the test playing the worker ----

def test_openai_shape_played(front, redis_addr, prefix):  # noqa: F811
    tap(connect(redis_addr), f"{prefix}jobs:fast", f"{prefix}jobs:think")
    f = front()
    r = connect(redis_addr)
    texts = ["alpha", "be", "gamma ray", "d"]
    for fmt in ("float", "base64"):
        join = in_thread(play_jobs, r, prefix, len(texts), played)
        status, h, body = embed_post(f, {"model": MODEL_NAME, "input": texts,
                                         "encoding_format": fmt, "dimensions": 6,
                                         "user": "u-1"})
        jobs = join()
        assert status == 200, body
        assert h["Content-Type"] == "application/json"
        rid = h["X-Request-Id"]
        assert rid.startswith("embd-")
        assert body["object"] == "list" and body["model"] == MODEL_NAME
        assert body["usage"] == {"prompt_tokens": sum(map(len, texts)),
                                 "total_tokens": sum(map(len, texts))}
        assert [d["index"] for d in body["data"]] == [0, 1, 2, 3]
        byid = {j["id"]: j for j in jobs}
        for i, (t, d) in enumerate(zip(texts, body["data"])):
            job = byid[f"{rid}-{i}"]
            # the embedding job's members only (job_parse refuses others)
            assert set(job) <= {"id", "task", "prompt", "dimensions", "mode", "deadline_ms",
                                "client_lease_ms", "model"}, job
            assert {k: job[k] for k in ("id", "task", "prompt", "dimensions", "mode")} == \
                {"id": f"{rid}-{i}", "task": "embed", "prompt": t, "dimensions": 6,
                 "mode": "no_think"}
            want = played_vector(job)
            assert d["object"] == "embedding"
            if fmt == "base64":
                # the done event's string as it is
                ev = job_events(r, prefix, job["id"])[-1]
                assert d["embedding"] == ev["embedding"]
                assert floats_of(d["embedding"]) == want
            else:
                # %.9g: every value reads back to the same float32
                assert [f32(x) for x in d["embedding"]] == want


def test_errors_played(front, redis_addr, prefix):  # noqa: F811
    f = front()
    r = connect(redis_addr)
    too_long = [{"seq": 0, "type": "error", "code": "PROMPT_TOO_LONG",
                 "message": "prompt has 50000 tokens; the model's context is 40960"},
                {"seq": 1, "type": "done", "finish_reason": "error",
                 "usage": {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0,
                           "cached_prompt_tokens": 0}, "cached": False,
                 "timings": {"queue_ms": 0, "ttft_ms": 0, "total_ms": 0}, "tool_calls": []}]
    join = in_thread(play_jobs, r, prefix, 1, lambda job: too_long)
    status, _, body = embed_post(f, {"model": MODEL_NAME, "input": "x" * 10})
    join()
    assert status == 400, body
    assert body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["param"] == "input"
    assert "40960" in body["error"]["message"]
    # the same on Ollama's API: {"error": "..."}
    join = in_thread(play_jobs, r, prefix, 1, lambda job: too_long)
    status, _, body = embed_post(f, {"model": MODEL_NAME, "input": "x"}, "/api/embed")
    join()
    assert status == 400 and "40960" in body["error"]
    # the second of two inputs fails: the request fails
    join = in_thread(play_jobs, r, prefix, 2,
                     lambda job: too_long if job["id"].endswith("-1") else played(job))
    status, _, body = embed_post(f, {"model": MODEL_NAME, "input": ["a", "b"]})
    join()
    assert status == 400 and body["error"]["param"] == "input"
    # a done without an embedding (a worker from before embedding jobs): 502
    no_vec = [{k: v for k, v in done_event([1.0], 1).items()
               if k not in ("embedding", "dimensions")}]
    join = in_thread(play_jobs, r, prefix, 1, lambda job: no_vec)
    status, _, body = embed_post(f, {"model": MODEL_NAME, "input": "a"})
    join()
    assert status == 502 and body["error"]["code"] == "BAD_EVENT"


def test_ollama_played(front, redis_addr, prefix):  # noqa: F811
    tap(connect(redis_addr), f"{prefix}jobs:fast", f"{prefix}jobs:think")
    f = front()
    r = connect(redis_addr)
    join = in_thread(play_jobs, r, prefix, 2, played)
    status, _, body = embed_post(f, {"model": MODEL_NAME + ":latest", "input": ["one", "three"],
                                     "truncate": True, "keep_alive": "5m",
                                     "options": {"num_ctx": 512}, "dimensions": 5},
                                 "/api/embed")
    jobs = join()
    assert status == 200, body
    assert set(body) == {"model", "embeddings", "total_duration", "load_duration",
                         "prompt_eval_count"}
    assert body["model"] == MODEL_NAME and body["load_duration"] == 0
    assert body["prompt_eval_count"] == 3 + 5
    assert isinstance(body["total_duration"], int) and body["total_duration"] > 0
    byprompt = {j["prompt"]: j for j in jobs}
    assert [[f32(x) for x in e] for e in body["embeddings"]] == \
        [played_vector(byprompt["one"]), played_vector(byprompt["three"])]
    assert all(j["dimensions"] == 5 and j["truncate"] is True for j in jobs)
    # a single string
    join = in_thread(play_jobs, r, prefix, 1, played)
    status, _, body = embed_post(f, {"model": MODEL_NAME, "input": "solo"}, "/api/embed")
    (job,) = join()
    assert status == 200 and len(body["embeddings"]) == 1
    assert [f32(x) for x in body["embeddings"][0]] == played_vector(job)
    # the legacy endpoint: {"embedding": [...]}
    join = in_thread(play_jobs, r, prefix, 1, played)
    status, _, body = embed_post(f, {"model": MODEL_NAME, "prompt": "legacy"}, "/api/embeddings")
    (job,) = join()
    assert status == 200 and set(body) == {"embedding"}
    assert [f32(x) for x in body["embedding"]] == played_vector(job)
    # no input: the empty answer at once, no job queued
    before = len(pool_jobs(r, prefix))
    status, _, body = embed_post(f, {"model": MODEL_NAME}, "/api/embed")
    assert status == 200 and body == {"model": MODEL_NAME, "embeddings": []}
    status, _, body = embed_post(f, {"model": MODEL_NAME, "prompt": ""}, "/api/embeddings")
    assert status == 200 and body == {"embedding": []}
    time.sleep(0.3)
    assert len(pool_jobs(r, prefix)) == before


def test_refusals(front, redis_addr, prefix):  # noqa: F811
    tap(connect(redis_addr), f"{prefix}jobs:fast", f"{prefix}jobs:think")
    f = front("--http-unknown-fields", "refuse")
    r = connect(redis_addr)
    cases = [
        ({"input": ""}, 400, "BAD_VALUE", "input"),
        ({"input": []}, 400, "BAD_VALUE", "input"),
        ({"input": ["a", ""]}, 400, "BAD_VALUE", "input"),
        ({"input": ["x"] * 2049}, 400, "OUT_OF_RANGE", "input"),
        ({"input": [1, "a"]}, 400, "BAD_TYPE", "input"),
        ({"input": [-5]}, 400, "OUT_OF_RANGE", "input"),
        ({}, 400, "MISSING_FIELD", "input"),
        ({"input": "a", "encoding_format": "int8"}, 400, "BAD_VALUE", "encoding_format"),
        ({"input": "a", "dimensions": 0}, 400, "OUT_OF_RANGE", "dimensions"),
        ({"input": "a", "dimensions": 20000}, 400, "OUT_OF_RANGE", "dimensions"),
        ({"input": "a", "frobnicate": 1}, 400, "UNKNOWN_FIELD", "frobnicate"),
        ({"input": "a", "model": "gpt-nothing"}, 404, "model_not_found", "model"),
    ]
    for body, st, code, param in cases:
        body = {"model": MODEL_NAME, **body}
        status, _, out = embed_post(f, body)
        assert (status, out["error"]["code"], out["error"]["param"]) == (st, code, param), body
    status, _, out = embed_post(f, {"model": MODEL_NAME, "input": ["a", 2]}, "/api/embed")
    assert status == 400 and "input" in out["error"]
    status, _, out = embed_post(f, {"model": MODEL_NAME, "prompt": 5}, "/api/embeddings")
    assert status == 400 and "prompt" in out["error"]
    status, _, out = embed_post(f, {"model": MODEL_NAME, "input": "a"}, "/api/embeddings")
    assert status == 400 and "input" in out["error"]  # refused: the legacy API has prompt
    # GET: 405; nothing was queued
    status, h, _ = f.request("GET", "/v1/embeddings")
    assert status == 405 and h["Allow"] == "POST"
    time.sleep(0.3)
    assert pool_jobs(r, prefix) == {}
    # ignore (the default): the unknown member is named, the answer given
    g = front()
    join = in_thread(play_jobs, r, prefix, 1, played)
    status, h, out = embed_post(g, {"model": MODEL_NAME, "input": "a", "frobnicate": 1})
    join()
    assert status == 200 and h["X-Redlm-Ignored-Fields"] == "frobnicate"


# ---- a real worker on the tiny model ----

def embeddings(f, inputs, **kw):
    status, _, body = embed_post(f, {"model": MODEL_NAME, "input": inputs, **kw})
    assert status == 200, body
    out = []
    for i, d in enumerate(body["data"]):
        assert d["index"] == i and d["object"] == "embedding"
        e = d["embedding"]
        out.append(floats_of(e) if isinstance(e, str) else [f32(x) for x in e])
    return out, body


def test_real_worker(front, workers, redis_addr, prefix):  # noqa: F811
    workers("w1")
    f = front()
    texts = ["The cat sat on the mat.", "A completely different sentence about rockets."]
    (full,), body = embeddings(f, texts[0])
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    assert len(full) == 128  # the tiny model's hidden size
    assert abs(norm(full) - 1) < 1e-5
    # base64 and float agree bit for bit
    (b64,), _ = embeddings(f, texts[0], encoding_format="base64")
    assert b64 == full
    # the same text twice: the same vector; two texts differ
    (again,), _ = embeddings(f, [texts[0]])
    assert again == full
    (other,), _ = embeddings(f, texts[1])
    assert other != full and abs(norm(other) - 1) < 1e-5
    # dimensions: a unit vector, the renormalised prefix of the full one
    for d in (1, 16, 64):
        (small,), _ = embeddings(f, texts[0], dimensions=d)
        assert len(small) == d and abs(norm(small) - 1) < 1e-5
        want = unit(full[:d])
        assert max(abs(a - b) for a, b in zip(small, want)) < 1e-5
    # a batch: in input order, each the vector that input alone gets
    batch = texts + ["third", texts[0]]
    vecs, body = embeddings(f, batch)
    assert len(vecs) == 4
    assert vecs[0] == full and vecs[1] == other and vecs[3] == full
    (third,), _ = embeddings(f, "third")
    assert vecs[2] == third
    singles = [embeddings(f, t)[1]["usage"]["prompt_tokens"] for t in batch]
    assert body["usage"]["prompt_tokens"] == sum(singles)
    # the most inputs one request takes (2048), in order (about 1.5 s on the tiny model)
    many = [f"text number {i}" for i in range(2048)]
    vecs, body = embeddings(f, many, encoding_format="base64")
    assert len(vecs) == 2048 and all(abs(norm(v) - 1) < 1e-5 for v in vecs)
    for i in (0, 5, 2047):
        assert vecs[i] == embeddings(f, many[i])[0][0]
    # token ids: one input, or a list of them
    (ids,), _ = embeddings(f, [1, 2, 3, 4])
    assert len(ids) == 128 and abs(norm(ids) - 1) < 1e-5
    two, _ = embeddings(f, [[1, 2, 3, 4], [5, 6]])
    assert two[0] == ids and two[1] != ids
    # a token past the vocabulary: the worker's 400, named input
    status, _, out = embed_post(f, {"model": MODEL_NAME, "input": [[1], [100000]]})
    assert status == 400 and out["error"]["param"] == "input", out
    # more dimensions than the model has: the worker's 400, named dimensions
    status, _, out = embed_post(f, {"model": MODEL_NAME, "input": "a", "dimensions": 129})
    assert status == 400 and out["error"]["param"] == "dimensions", out


def test_real_worker_ollama(front, workers, redis_addr, prefix):  # noqa: F811
    workers("w1")
    f = front()
    (full,), _ = embeddings(f, "Why is the sky blue?")
    status, _, body = embed_post(f, {"model": MODEL_NAME, "input": ["Why is the sky blue?",
                                                                   "Why is grass green?"]},
                                 "/api/embed")
    assert status == 200, body
    assert [f32(x) for x in body["embeddings"][0]] == full
    assert len(body["embeddings"][1]) == 128
    assert body["prompt_eval_count"] > 0 and body["total_duration"] > 0
    status, _, body = embed_post(f, {"model": MODEL_NAME, "input": "Why is the sky blue?",
                                     "dimensions": 32}, "/api/embed")
    assert status == 200
    small = [f32(x) for x in body["embeddings"][0]]
    assert max(abs(a - b) for a, b in zip(small, unit(full[:32]))) < 1e-5
    # the legacy /api/embeddings gives the vector as the model computes it,
    # as Ollama's does (its clients normalize it themselves): not unit
    # length, the same direction; vLLM's normalize false on /v1 the same
    status, _, body = embed_post(f, {"model": MODEL_NAME, "prompt": "Why is the sky blue?"},
                                 "/api/embeddings")
    assert status == 200
    raw = [f32(x) for x in body["embedding"]]
    assert abs(norm(raw) - 1.0) > 1e-3, norm(raw)
    assert max(abs(a - b) for a, b in zip(unit(raw), full)) < 1e-5
    (raw_v1,), _ = embeddings(f, "Why is the sky blue?", normalize=False)
    assert raw_v1 == raw
    (unit_v1,), _ = embeddings(f, "Why is the sky blue?", normalize=True)
    assert unit_v1 == full
    status, _, body = embed_post(f, {"model": MODEL_NAME, "input": "x", "normalize": "no"})
    assert status == 400 and body["error"]["param"] == "normalize"


def test_node_clients(front, workers, redis_addr, prefix, tmp_path):  # noqa: F811
    d = node_clients()
    workers("w1")
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY} acme\n")
    f = front("--api-keys-file", str(keys))
    out = subprocess.run(["node", str(d / "embeddings.mjs"), f"http://127.0.0.1:{f.port}/v1",
                          MODEL_NAME], capture_output=True, text=True, timeout=180, cwd=d)
    assert out.returncode == 0, out.stderr[-4000:]
    res = json.loads(out.stdout.strip().split("\n")[-1])
    auth = {"Authorization": f"Bearer {KEY}"}
    texts = ["The cat sat on the mat.", "A dog barked.", "Rain again today."]
    want = []
    for t in texts:
        status, _, body = embed_post(f, {"model": MODEL_NAME, "input": t}, headers=auth)
        assert status == 200, body
        want.append([f32(x) for x in body["data"][0]["embedding"]])
    # the AI SDK (floats on the wire): each vector as the front door gives it
    assert [[f32(x) for x in v] for v in res["aisdk"]["embeddings"]] == want
    assert res["aisdk"]["usage"]["tokens"] > 0
    assert [f32(x) for x in res["aisdkOne"]["embedding"]] == want[1]
    small = [f32(x) for x in res["aisdkDims"]]
    assert len(small) == 16 and abs(norm(small) - 1) < 1e-5
    # LangChain (base64 on the wire, decoded by the openai client): the same
    # float32 values
    assert [[f32(x) for x in v] for v in res["langchain"]["documents"]] == want
    assert [f32(x) for x in res["langchain"]["query"]] == want[2]
    assert [f32(x) for x in res["langchainDims"]] == small
    # an empty input is the server's 400, as the client reports it
    assert res["emptyError"] and res["emptyError"]["status"] == 400


def test_too_long(front, workers, redis_addr, prefix):  # noqa: F811
    """A text past the worker's context: OpenAI's API answers 400 naming the
    limit (as OpenAI does); Ollama's truncate by default (the job's
    truncate: the first tokens and the last), and /api/embed with
    truncate false is the 400."""
    w = workers("wt", "--kv-budget-mb", "1")  # 2 KiB a token: a 512-token pool
    ctx = int(re.search(r"max_context (\d+)", w.text()).group(1))
    f = front()
    text = " ".join(f"w{i} x{i * 7 % 13}" for i in range(ctx * 2))
    status, _, out = embed_post(f, {"model": MODEL_NAME, "input": text})
    assert status == 400, out
    assert out["error"]["code"] == "context_length_exceeded" and out["error"]["param"] == "input"
    assert str(ctx) in out["error"]["message"]
    status, _, out = embed_post(f, {"model": MODEL_NAME, "input": [text], "truncate": False},
                                "/api/embed")
    assert status == 400 and str(ctx) in out["error"], out
    status, _, out = embed_post(f, {"model": MODEL_NAME, "input": ["short", text]}, "/api/embed")
    assert status == 200, out
    long_vec = [f32(x) for x in out["embeddings"][1]]
    assert len(long_vec) == 128 and abs(norm(long_vec) - 1) < 1e-5
    (short,), body = embeddings(f, "short")
    assert [f32(x) for x in out["embeddings"][0]] == short
    # what ran: the short one's tokens and the cut one's (the context less one)
    assert out["prompt_eval_count"] == body["usage"]["prompt_tokens"] + ctx - 1
    status, _, leg = embed_post(f, {"model": MODEL_NAME, "prompt": text}, "/api/embeddings")
    assert status == 200  # truncated too; not unit length (test_real_worker_ollama)
    assert max(abs(a - b) for a, b in zip(unit([f32(x) for x in leg["embedding"]]),
                                          long_vec)) < 1e-5


def test_workers_models(front, workers, redis_addr, prefix):  # noqa: F811
    """Without served_model_name the request's model picks one the live
    workers serve (their directory's name here) and is echoed; another is
    404 model_not_found naming what is served, as on chat."""
    workers("w1")
    f = front("--served-model-name", "")
    served = "tiny-qwen3-a"
    deadline = time.time() + 20
    while time.time() < deadline:  # the dispatcher learns the models from heartbeats
        status, _, out = embed_post(f, {"model": served, "input": "hello"})
        if status != 404:
            break
        time.sleep(0.2)
    assert status == 200, out
    assert out["model"] == served and len(out["data"][0]["embedding"]) == 128
    status, _, out = embed_post(f, {"model": "nope", "input": "hello"})
    assert status == 404 and out["error"]["code"] == "model_not_found", out
    assert served in out["error"]["message"]
    status, _, out = embed_post(f, {"model": "nope", "input": "hello"}, "/api/embed")
    assert status == 404 and served in out["error"], out
