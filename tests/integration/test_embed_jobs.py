"""Embedding jobs (task "embed") through a real worker on the tiny model and
a real redis-server: the one done event and its vector, dimensions, the
result cache, and the refusals (schemas/README.md, "Embeddings").

Run with Debian's interpreter: /usr/bin/python3 -m pytest tests/integration
"""
import base64
import json
import math
import re
import struct
import subprocess

from conftest import CLI, MODEL, check_stream, wait_for

HIDDEN = 128  # tests/data/models/tiny-qwen3-a's hidden_size


def vector(done):
    raw = base64.b64decode(done["embedding"])
    assert len(raw) == 4 * done["dimensions"]
    return list(struct.unpack(f"<{done['dimensions']}f", raw))


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def embed(client, validator, job_id, **fields):
    client.submit({"id": job_id, "task": "embed", **fields})
    evs = client.events(job_id)
    tokens, done = check_stream(evs, validator)
    assert tokens == [] and len(evs) == 1, "an embedding is one done event"
    return done


def test_embedding_job(workers, client, event_validator):
    workers("w1")
    done = embed(client, event_validator, "e1", prompt="The capital of China is Beijing.",
                 metadata={"doc": 3})
    assert done["finish_reason"] == "stop"
    assert done["dimensions"] == HIDDEN
    assert done["metadata"] == {"doc": 3}
    assert done["usage"]["completion_tokens"] == 0
    v = vector(done)
    assert abs(norm(v) - 1) < 1e-5
    # text gets <|endoftext|> appended (Qwen3-Embedding's pooling token): the
    # same ids with it spelt out embed the same
    n = done["usage"]["prompt_tokens"]
    with_eot = embed(client, event_validator, "e1t",
                     prompt="The capital of China is Beijing.<|endoftext|>", cache=False)
    assert with_eot["usage"]["prompt_tokens"] == n + 1
    other = embed(client, event_validator, "e2", prompt="Gravity makes things fall.")
    assert vector(other) != v
    # dimensions: the first values, normalised again
    cut = embed(client, event_validator, "e3", prompt="The capital of China is Beijing.",
                dimensions=32)
    assert cut["dimensions"] == 32
    head = v[:32]
    k = norm(head)
    assert all(abs(a - b / k) < 1e-6 for a, b in zip(vector(cut), head))
    # prompt_ids embed as given (no token appended)
    ids = embed(client, event_validator, "e4", prompt_ids=[5, 11, 17])
    assert ids["usage"]["prompt_tokens"] == 3
    assert abs(norm(vector(ids)) - 1) < 1e-5


def test_embedding_cache_is_its_own(workers, client, event_validator):
    """The same prompt as a greedy generating job, then as an embedding: the
    embedding is computed, never the generation's cached tokens; asked again
    it is replayed from the cache, the same bytes."""
    workers("w1")
    client.submit({"id": "g1", "prompt": "Once upon a time", "max_tokens": 4,
                   "temperature": 0})
    tokens, gen = check_stream(client.events("g1"), event_validator)
    assert len(tokens) == 4 and "embedding" not in gen
    first = embed(client, event_validator, "m1", prompt="Once upon a time")
    assert first["cached"] is False and "embedding" in first
    again = embed(client, event_validator, "m2", prompt="Once upon a time")
    assert again["cached"] is True
    assert again["embedding"] == first["embedding"]
    shorter = embed(client, event_validator, "m3", prompt="Once upon a time", dimensions=16)
    assert shorter["cached"] is False and shorter["dimensions"] == 16
    # and the generation is still its own
    client.submit({"id": "g2", "prompt": "Once upon a time", "max_tokens": 4,
                   "temperature": 0})
    tokens2, gen2 = check_stream(client.events("g2"), event_validator)
    assert tokens2 == tokens and gen2["cached"] is True and "embedding" not in gen2


def test_embedding_refusals(workers, client, event_validator):
    workers("w1")
    cases = {
        "r1": ({"prompt": "x", "max_tokens": 5}, "BAD_VALUE"),
        "r2": ({"prompt": "x", "dimensions": HIDDEN + 1}, "BAD_VALUE"),
        "r3": ({"messages": [{"role": "user", "content": "x"}]}, "CONFLICTING_PROMPT"),
        "r4": ({"prompt_ids": [1, 10 ** 6]}, "INVALID_TOKEN"),
    }
    for job_id, (fields, _) in cases.items():
        client.submit({"id": job_id, "task": "embed", **fields})
    for job_id, (_, code) in cases.items():
        evs = client.events(job_id)
        check_stream(evs, event_validator)
        err = [e for _, e in evs if e["type"] == "error"]
        assert err and err[0]["code"] == code, (job_id, evs)
        assert evs[-1][1]["finish_reason"] == "error"
    # the worker goes on: an embedding after the refusals
    assert "embedding" in embed(client, event_validator, "ok", prompt="fine")


def test_embedding_only_checkpoint(workers, client, event_validator, tmp_path):
    """A checkpoint in Qwen3-Embedding-8B's layout (bare names, untied, no
    lm_head.weight), made by the model maker: the worker serves its
    embeddings and refuses to generate, by code."""
    out = tmp_path / "emb-only"
    subprocess.run([str(CLI), "mkmodel", "--out", str(out), "--embedding", "--untied",
                    "--dtype", "f32", "--tokenizer", str(MODEL)], check=True,
                   capture_output=True)
    w = workers("we", "--model", str(out))
    done = embed(client, event_validator, "o1", prompt="a document")
    assert done["dimensions"] == HIDDEN and abs(norm(vector(done)) - 1) < 1e-5
    client.submit({"id": "o2", "prompt": "a document", "max_tokens": 3})
    evs = client.events("o2")
    check_stream(evs, event_validator)
    assert evs[0][1]["type"] == "error" and evs[0][1]["code"] == "BAD_PARAM"
    assert "embed" in evs[0][1]["message"]
    assert "serves embedding jobs" in w.text()


def test_embedding_through_the_dispatcher(dispatchers, workers, client, event_validator):
    """Through redlm:requests: routed like any job, and the second time
    answered by the dispatcher's cache fast path (no worker running)."""
    r = client.r
    dispatchers("d1", "--model", str(MODEL), "--think-ratio", "0")
    w = workers("w1")
    job = {"task": "embed", "prompt": "a repeated document", "dimensions": 64}
    r.xadd(f"{client.prefix}requests", {"job": json.dumps({**job, "id": "d1"})})
    first = client.events("d1")
    _, done = check_stream(first, event_validator)
    assert done["cached"] is False and done["dimensions"] == 64
    wait_for(lambda: r.keys(f"{client.prefix}cache:*"), "the cache entry")
    w.stop()
    r.xadd(f"{client.prefix}requests", {"job": json.dumps({**job, "id": "d2"})})
    second = client.events("d2", timeout=10)
    _, again = check_stream(second, event_validator)
    assert again["cached"] is True and again["embedding"] == done["embedding"]


def test_embedding_truncate(workers, client, event_validator):
    """A prompt past the worker's context: PROMPT_TOO_LONG, or with
    truncate its first tokens and its last one, counted as they ran."""
    w = workers("wt", "--kv-budget-mb", "1")  # 2 KiB a token: a 512-token pool
    ctx = int(re.search(r"max_context (\d+)", w.text()).group(1))
    ids = [5 + i % 700 for i in range(ctx + 40)]
    client.submit({"id": "long", "task": "embed", "prompt_ids": ids})
    evs = client.events("long")
    check_stream(evs, event_validator)
    assert evs[0][1]["code"] == "PROMPT_TOO_LONG"
    cut = embed(client, event_validator, "cut", prompt_ids=ids, truncate=True)
    assert cut["usage"]["prompt_tokens"] == ctx - 1
    same = embed(client, event_validator, "same", prompt_ids=ids[:ctx - 2] + ids[-1:])
    assert same["embedding"] == cut["embedding"]
