"""The rerank and score endpoints of the front door (dispatcher/rerank.c),
end to end through a real redis-server and dispatcher:

  - with the test playing the worker (so the scores are known exactly):
    POST /v1/rerank (and /rerank, /v2/rerank) queues one rerank job per
    document (ids <id>-<i>, task rerank, the query, the document and the
    instruction as given, mode no_think) and answers the results by
    relevance_score, highest first, ties in document order, cut to top_n,
    with their documents unless return_documents is false, usage summed;
    POST /v1/score (and /score) pairs text_1 with text_2 (one query for
    all, or one per document) and answers in input order; a worker's error
    is the status and param of OpenAI's error object, naming the document;
    a done without a score is a 502;
  - refusals before anything is queued: an empty query, no documents, a
    document neither a string nor {"text"}, too many, a bad top_n,
    mismatched text_1 and text_2, a model nobody serves, unknown members
    under http_unknown_fields = refuse (named in X-Redlm-Ignored-Fields
    under ignore);
  - with a real worker on a small random model with Qwen3's real vocabulary
    (the tiny model's has no "yes" and "no" tokens; tests/integration/
    test_rerank_jobs.py makes the same): scores in [0, 1], results sorted,
    the same pair twice gives the same score, the score endpoint agrees with
    rerank on the same pairs, usage summed over the documents, the done
    event's score passed on as it is; the tiny model, which cannot rerank,
    is the worker's 400 naming model. These skip, saying so, while the
    worker refuses task rerank (a worker from before rerank jobs).
"""
import json
import subprocess
import time

import pytest

from conftest import CLI, ROOT, connect, job_events, tap
from test_embeddings import in_thread, play_jobs, pool_jobs
from test_http import MODEL_NAME, front  # noqa: F401 (front is a fixture)


# ---- helpers ----

def post(f, body, path="/v1/rerank", headers=None):
    status, h, data = f.request("POST", path, body, headers)
    return status, h, json.loads(data) if data.strip() else None


def done_event(score, prompt_tokens, seq=0):
    return {"seq": seq, "type": "done", "finish_reason": "stop",
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0,
                      "reasoning_tokens": 0, "cached_prompt_tokens": 0},
            "cached": False, "timings": {"queue_ms": 0, "ttft_ms": 1, "total_ms": 1},
            "tool_calls": [], "score": score}


# the played worker's scores: chosen per document, with a tie (0.5) and
# values that need all their digits
SCORES = {"alpha": 0.25, "beta": 0.5, "gamma": 0.8125, "delta": 0.5, "epsilon": 0.0,
          "zeta": 0.1234567890123}


def played_tokens(job):
    return len(job["query"]) + len(job["document"])


def played(job):
    return [done_event(SCORES.get(job["document"], 0.75), played_tokens(job))]


# ---- the test playing the worker ----

def test_rerank_played(front, redis_addr, prefix):  # noqa: F811
    tap(connect(redis_addr), f"{prefix}jobs:fast", f"{prefix}jobs:think")
    f = front()
    r = connect(redis_addr)
    docs = ["alpha", {"text": "beta"}, "gamma", "delta", "epsilon"]
    texts = ["alpha", "beta", "gamma", "delta", "epsilon"]
    order = [2, 1, 3, 0, 4]  # by score; beta and delta tie: the lower index first
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        join = in_thread(play_jobs, r, prefix, len(docs), played)
        status, h, body = post(f, {"model": MODEL_NAME, "query": "which letter?",
                                   "documents": docs, "instruction": "Find Greek letters."},
                               path)
        jobs = join()
        assert status == 200, body
        assert h["Content-Type"] == "application/json"
        rid = h["X-Request-Id"]
        assert rid.startswith("rerank-")
        assert set(body) == {"id", "model", "usage", "results"}
        assert body["id"] == rid and body["model"] == MODEL_NAME
        assert body["usage"] == {"total_tokens": sum(map(played_tokens, jobs))}
        assert [x["index"] for x in body["results"]] == order
        for x in body["results"]:
            assert x["relevance_score"] == SCORES[texts[x["index"]]]
            assert x["document"] == {"text": texts[x["index"]]}
        byid = {j["id"]: j for j in jobs}
        for i, t in enumerate(texts):
            job = byid[f"{rid}-{i}"]
            # the rerank job's members only (job_parse refuses others)
            assert set(job) <= {"id", "task", "query", "document", "instruction", "mode",
                                "deadline_ms", "client_lease_ms", "model"}, job
            assert {k: job[k] for k in ("task", "query", "document", "instruction", "mode")} == \
                {"task": "rerank", "query": "which letter?", "document": t,
                 "instruction": "Find Greek letters.", "mode": "no_think"}

    # top_n and return_documents false; no instruction: none in the jobs
    join = in_thread(play_jobs, r, prefix, len(docs), played)
    status, _, body = post(f, {"model": MODEL_NAME, "query": "q", "documents": docs,
                               "top_n": 2, "return_documents": False})
    jobs = join()
    assert status == 200, body
    assert body["results"] == [{"index": 2, "relevance_score": 0.8125},
                               {"index": 1, "relevance_score": 0.5}]
    assert all("instruction" not in j for j in jobs)
    # top_n past the count: all of them; one document: one job under the id
    join = in_thread(play_jobs, r, prefix, 1, played)
    status, h, body = post(f, {"model": MODEL_NAME, "query": "q", "documents": ["zeta"],
                               "top_n": 10})
    (job,) = join()
    assert status == 200, body
    assert job["id"] == h["X-Request-Id"]
    assert body["results"] == [{"index": 0, "relevance_score": 0.1234567890123,
                                "document": {"text": "zeta"}}]


def test_node_clients(front, redis_addr, prefix):  # noqa: F811
    """The AI SDK's rerank() with @ai-sdk/cohere and Cohere's own TypeScript
    SDK against /v2/rerank (node-clients/rerank.mjs): each parses the answer
    with its own schema and ranks the documents as the played scores say."""
    from test_clients import node_clients
    d = node_clients()
    tap(connect(redis_addr), f"{prefix}jobs:fast", f"{prefix}jobs:think")
    f = front()
    r = connect(redis_addr)
    join = in_thread(play_jobs, r, prefix, 15, played)  # three requests of five documents
    out = subprocess.run(["node", str(d / "rerank.mjs"), f"http://127.0.0.1:{f.port}", MODEL_NAME],
                         capture_output=True, text=True, timeout=180, cwd=d)
    join()
    assert out.returncode == 0, out.stderr[-4000:]
    res = json.loads(out.stdout.strip().split("\n")[-1])
    texts = ["alpha", "beta", "gamma", "delta", "epsilon"]
    order = [2, 1, 3, 0, 4]  # by score; beta and delta tie: the lower index first
    assert [x["index"] for x in res["aisdk"]] == order[:3]
    for x in res["aisdk"]:
        assert x["score"] == SCORES[texts[x["index"]]] and x["document"] == texts[x["index"]]
    assert res["aisdkAll"] == order
    assert res["cohere"]["id"].startswith("rerank-")
    assert res["cohere"]["results"] == [{"index": i, "score": SCORES[texts[i]]} for i in order[:3]]
    # no documents: the server's 400, as the client reports it
    assert res["emptyError"] and res["emptyError"]["status"] == 400


def test_score_played(front, redis_addr, prefix):  # noqa: F811
    tap(connect(redis_addr), f"{prefix}jobs:fast", f"{prefix}jobs:think")
    f = front()
    r = connect(redis_addr)

    def pair_score(job):  # a function of the pair, so the pairing shows
        return [done_event(round(0.01 * len(job["query"]) + 0.1 * len(job["document"]), 6),
                           played_tokens(job))]

    def want(q, d):
        return round(0.01 * len(q) + 0.1 * len(d), 6)

    # N:N, pair i is text_1[i] with text_2[i]; in input order, not by score
    t1, t2 = ["a", "bbbbb", "cc"], ["xxxx", "y", "zzzzzzz"]
    join = in_thread(play_jobs, r, prefix, 3, pair_score)
    status, h, body = post(f, {"model": MODEL_NAME, "text_1": t1, "text_2": t2}, "/v1/score")
    jobs = join()
    assert status == 200, body
    rid = h["X-Request-Id"]
    assert rid.startswith("score-")
    assert set(body) == {"id", "object", "created", "model", "data", "usage"}
    assert body["id"] == rid and body["object"] == "list" and body["model"] == MODEL_NAME
    assert abs(body["created"] - time.time()) < 60
    assert body["data"] == [{"index": i, "object": "score", "score": want(q, d)}
                            for i, (q, d) in enumerate(zip(t1, t2))]
    n = sum(map(played_tokens, jobs))
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
    byid = {j["id"]: j for j in jobs}
    for i in range(3):
        job = byid[f"{rid}-{i}"]
        assert (job["task"], job["query"], job["document"]) == ("rerank", t1[i], t2[i])
    # 1:N, a string or a list of one; and 1:1 on /score
    for q in ("qq", ["qq"]):
        join = in_thread(play_jobs, r, prefix, 2, pair_score)
        status, _, body = post(f, {"model": MODEL_NAME, "text_1": q, "text_2": ["a", "bbb"],
                                   "instruction": "Judge."}, "/score")
        jobs = join()
        assert status == 200, body
        assert [d["score"] for d in body["data"]] == [want("qq", "a"), want("qq", "bbb")]
        assert all(j["query"] == "qq" and j["instruction"] == "Judge." for j in jobs)
    join = in_thread(play_jobs, r, prefix, 1, pair_score)
    status, _, body = post(f, {"model": MODEL_NAME, "text_1": "q", "text_2": "dd"}, "/score")
    join()
    assert status == 200 and body["data"] == [{"index": 0, "object": "score",
                                               "score": want("q", "dd")}]


def test_errors_played(front, redis_addr, prefix):  # noqa: F811
    f = front()
    r = connect(redis_addr)
    too_long = [{"seq": 0, "type": "error", "code": "PROMPT_TOO_LONG",
                 "message": "prompt has 50000 tokens; the model's context is 40960"},
                {"seq": 1, "type": "done", "finish_reason": "error",
                 "usage": {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0,
                           "cached_prompt_tokens": 0}, "cached": False,
                 "timings": {"queue_ms": 0, "ttft_ms": 0, "total_ms": 0}, "tool_calls": []}]
    # the second of three documents fails: the request fails, naming it
    join = in_thread(play_jobs, r, prefix, 3,
                     lambda job: too_long if job["id"].endswith("-1") else played(job))
    status, _, body = post(f, {"model": MODEL_NAME, "query": "q",
                               "documents": ["alpha", "x" * 20, "gamma"]})
    join()
    assert status == 400, body
    assert body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["param"] == "documents"
    assert body["error"]["message"].startswith("documents[1]: ")
    assert "40960" in body["error"]["message"]
    # the same on the score API: text_2
    join = in_thread(play_jobs, r, prefix, 1, lambda job: too_long)
    status, _, body = post(f, {"model": MODEL_NAME, "text_1": "q", "text_2": "d"}, "/v1/score")
    join()
    assert status == 400 and body["error"]["param"] == "text_2", body
    # a done without a score (a worker from before rerank jobs): 502
    no_score = [{k: v for k, v in done_event(0.5, 1).items() if k != "score"}]
    join = in_thread(play_jobs, r, prefix, 1, lambda job: no_score)
    status, _, body = post(f, {"model": MODEL_NAME, "query": "q", "documents": ["a"]})
    join()
    assert status == 502 and body["error"]["code"] == "BAD_EVENT", body
    # a score out of [0, 1]: 502 as well
    join = in_thread(play_jobs, r, prefix, 1, lambda job: [done_event(1.5, 1)])
    status, _, body = post(f, {"model": MODEL_NAME, "text_1": "q", "text_2": "d"}, "/v1/score")
    join()
    assert status == 502 and body["error"]["code"] == "BAD_EVENT", body


def test_refusals(front, redis_addr, prefix):  # noqa: F811
    tap(connect(redis_addr), f"{prefix}jobs:fast", f"{prefix}jobs:think")
    f = front("--http-unknown-fields", "refuse")
    r = connect(redis_addr)
    rerank_cases = [
        ({"query": "", "documents": ["d"]}, 400, "BAD_VALUE", "query"),
        ({"documents": ["d"]}, 400, "MISSING_FIELD", "query"),
        ({"query": 3, "documents": ["d"]}, 400, "BAD_TYPE", "query"),
        ({"query": "q"}, 400, "MISSING_FIELD", "documents"),
        ({"query": "q", "documents": []}, 400, "BAD_VALUE", "documents"),
        ({"query": "q", "documents": "d"}, 400, "BAD_TYPE", "documents"),
        ({"query": "q", "documents": ["a", 5]}, 400, "BAD_TYPE", "documents"),
        ({"query": "q", "documents": ["a", {"image": "x.png"}]}, 400, "MISSING_FIELD",
         "documents"),
        ({"query": "q", "documents": ["a", ""]}, 400, "BAD_VALUE", "documents"),
        ({"query": "q", "documents": ["d"] * 1025}, 400, "OUT_OF_RANGE", "documents"),
        ({"query": "q", "documents": ["d"], "top_n": 0}, 400, "OUT_OF_RANGE", "top_n"),
        ({"query": "q", "documents": ["d"], "top_n": "2"}, 400, "BAD_TYPE", "top_n"),
        ({"query": "q", "documents": ["d"], "return_documents": "no"}, 400, "BAD_TYPE",
         "return_documents"),
        ({"query": "q", "documents": ["d"], "instruction": 1}, 400, "BAD_TYPE", "instruction"),
        ({"query": "q", "documents": ["d"], "rank_fields": ["text"]}, 400, "UNKNOWN_FIELD",
         "rank_fields"),
        ({"query": "q", "documents": [{"text": "a", "id": 1}]}, 400, "UNKNOWN_FIELD",
         "documents[0].id"),
        ({"query": "q", "documents": ["d"], "model": "gpt-nothing"}, 404, "model_not_found",
         "model"),
    ]
    for body, st, code, param in rerank_cases:
        body = {"model": MODEL_NAME, **body}
        status, _, out = post(f, body)
        assert (status, out["error"]["code"], out["error"]["param"]) == (st, code, param), body
    score_cases = [
        ({"text_2": "d"}, 400, "MISSING_FIELD", "text_1"),
        ({"text_1": "", "text_2": "d"}, 400, "BAD_VALUE", "text_1"),
        ({"text_1": "q", "text_2": []}, 400, "BAD_VALUE", "text_2"),
        ({"text_1": ["a", "b"], "text_2": ["x", "y", "z"]}, 400, "BAD_VALUE", "text_1"),
        ({"text_1": ["a", "b"], "text_2": "x"}, 400, "BAD_VALUE", "text_1"),
        ({"text_1": "q", "text_2": ["x", 2]}, 400, "BAD_TYPE", "text_2"),
        ({"text_1": "q", "text_2": ["x"] * 1025}, 400, "OUT_OF_RANGE", "text_2"),
        ({"text_1": "q", "text_2": "d", "model": "gpt-nothing"}, 404, "model_not_found",
         "model"),
    ]
    for body, st, code, param in score_cases:
        body = {"model": MODEL_NAME, **body}
        status, _, out = post(f, body, "/v1/score")
        assert (status, out["error"]["code"], out["error"]["param"]) == (st, code, param), body
    # GET: 405 on every path
    for path in ("/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/score"):
        status, h, _ = f.request("GET", path)
        assert status == 405 and h["Allow"] == "POST", path
    time.sleep(0.3)
    assert pool_jobs(r, prefix) == {}
    # ignore (the default): the unknown members are named, the answer given
    g = front()
    join = in_thread(play_jobs, r, prefix, 1, played)
    status, h, out = post(g, {"model": MODEL_NAME, "query": "q", "max_tokens_per_doc": 512,
                              "documents": [{"text": "alpha", "title": "A"}]})
    join()
    assert status == 200, out
    assert h["X-Redlm-Ignored-Fields"] == "max_tokens_per_doc, documents[0].title"
    assert out["results"][0]["document"] == {"text": "alpha"}


# ---- a real worker ----

RERANKER = "tiny-reranker"  # the model's directory: the name its workers serve


@pytest.fixture(scope="module")
def vocab_model(tmp_path_factory):
    """A small random model with Qwen3's real tokenizer, whose vocabulary
    has the single "yes" and "no" tokens a rerank job reads."""
    out = tmp_path_factory.mktemp("rerank") / RERANKER
    subprocess.run([str(CLI), "mkmodel", "--shape", "tiny", "--hidden", "64", "--intermediate",
                    "128", "--heads", "2", "--kv-heads", "1", "--head-dim", "32", "--layers", "2",
                    "--vocab", "151936", "--tokenizer",
                    str(ROOT / "engine" / "tokenizers" / "qwen3"), "--out", str(out)],
                   check=True, capture_output=True)
    return out


def rerank_or_skip(f, body, path="/v1/rerank"):
    """The answer to body; skips the test while the worker (or this build's
    job codec) refuses task rerank: a worker from before rerank jobs answers
    BAD_VALUE naming task."""
    status, _, out = post(f, body, path)
    if status != 200 and "task" in out.get("error", {}).get("message", "") and \
            out["error"]["code"] in ("BAD_VALUE", "INTERNAL"):
        pytest.skip(f"the worker refuses task rerank (a worker from before rerank jobs): "
                    f"{out['error']['code']}: {out['error']['message']}")
    assert status == 200, out
    return out


def test_real_worker(front, workers, redis_addr, prefix, vocab_model):  # noqa: F811
    workers("w1", "--model", str(vocab_model))
    f = front()
    r = connect(redis_addr)
    query = "What is the capital of France?"
    docs = ["Paris is the capital and largest city of France.",
            "The mitochondria is the powerhouse of the cell.",
            "France's capital city is Paris.",
            "Bananas are yellow."]
    out = rerank_or_skip(f, {"model": MODEL_NAME, "query": query, "documents": docs})
    res = out["results"]
    assert sorted(x["index"] for x in res) == [0, 1, 2, 3]
    scores = [x["relevance_score"] for x in res]
    assert all(0 <= s <= 1 for s in scores), scores
    assert scores == sorted(scores, reverse=True)
    for a, b in zip(res, res[1:]):  # ties in document order
        assert a["relevance_score"] > b["relevance_score"] or a["index"] < b["index"]
    assert all(x["document"] == {"text": docs[x["index"]]} for x in res)
    by_index = {x["index"]: x["relevance_score"] for x in res}
    # one by one: the same score for the same pair, and usage summed
    singles = []
    for i, d in enumerate(docs):
        one = rerank_or_skip(f, {"model": MODEL_NAME, "query": query, "documents": [d]})
        assert one["results"][0]["relevance_score"] == by_index[i]
        singles.append(one["usage"]["total_tokens"])
    assert all(n > 0 for n in singles)
    assert out["usage"]["total_tokens"] == sum(singles)
    # the same pair twice in one request: the same score
    twice = rerank_or_skip(f, {"model": MODEL_NAME, "query": query,
                               "documents": [docs[1], docs[1]], "return_documents": False})
    a, b = twice["results"]
    assert a["relevance_score"] == b["relevance_score"] == by_index[1]
    assert [a["index"], b["index"]] == [0, 1] and "document" not in a
    # the done event carries the score the answer gives
    status, h, one = post(f, {"model": MODEL_NAME, "query": query, "documents": [docs[3]]})
    assert status == 200
    ev = job_events(r, prefix, h["X-Request-Id"])[-1]
    assert ev["type"] == "done" and ev["score"] == one["results"][0]["relevance_score"]
    # the score API agrees with rerank on the same pairs, in input order
    sc = rerank_or_skip(f, {"model": MODEL_NAME, "text_1": query, "text_2": docs}, "/v1/score")
    assert [d["score"] for d in sc["data"]] == [by_index[i] for i in range(4)]
    assert sc["usage"]["prompt_tokens"] == sc["usage"]["total_tokens"] == sum(singles)
    pairs = rerank_or_skip(f, {"model": MODEL_NAME, "text_1": [query, "Which fruit is yellow?"],
                               "text_2": [docs[0], docs[3]]}, "/score")
    assert pairs["data"][0]["score"] == by_index[0]
    assert 0 <= pairs["data"][1]["score"] <= 1
    # an instruction of one's own: a score still, in range
    ins = rerank_or_skip(f, {"model": MODEL_NAME, "query": query, "documents": docs[:2],
                             "instruction": "Judge whether the passage names a city."})
    assert all(0 <= x["relevance_score"] <= 1 for x in ins["results"])


def test_model_cannot_rerank(front, workers, redis_addr, prefix):  # noqa: F811
    """The tiny model's vocabulary has no "yes" and "no": the worker's
    BAD_PARAM, a 400 naming model, on both APIs."""
    workers("w1")
    f = front()
    for path, body in (("/v1/rerank", {"query": "q", "documents": ["a", "b"]}),
                       ("/v1/score", {"text_1": "q", "text_2": "d"})):
        status, _, out = post(f, {"model": MODEL_NAME, **body}, path)
        if status != 400 or out["error"]["code"] != "BAD_PARAM":
            rerank_or_skip(f, {"model": MODEL_NAME, **body}, path)
        assert status == 400 and out["error"]["code"] == "BAD_PARAM", out
        assert out["error"]["param"] == "model" and "yes" in out["error"]["message"], out


def test_workers_models(front, workers, redis_addr, prefix, vocab_model):  # noqa: F811
    """Without served_model_name the request's model picks one the live
    workers serve and is echoed; another is 404 model_not_found naming
    what is served, as on the other endpoints."""
    workers("w1", "--model", str(vocab_model))
    f = front("--served-model-name", "")
    served = RERANKER
    deadline = time.time() + 20
    while time.time() < deadline:  # the dispatcher learns the models from heartbeats
        status, _, out = post(f, {"model": served, "query": "q", "documents": ["d"]})
        if status != 404:
            break
        time.sleep(0.2)
    if status != 200:
        rerank_or_skip(f, {"model": served, "query": "q", "documents": ["d"]})
    assert status == 200, out
    assert out["model"] == served
    status, _, out = post(f, {"model": "nope", "query": "q", "documents": ["d"]})
    assert status == 404 and out["error"]["code"] == "model_not_found", out
    assert served in out["error"]["message"]
    status, _, out = post(f, {"model": "nope", "text_1": "q", "text_2": "d"}, "/v1/score")
    assert status == 404 and out["error"]["code"] == "model_not_found", out
