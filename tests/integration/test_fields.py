"""The request fields of issue 29's "Fields" point, end to end through a real
redis-server, dispatcher (HTTP front door) and worker on the tiny model:

  - logit_bias (OpenAI's): -100 on the greedy token changes the output,
    +100 on another token forces it at every step;
  - stop_token_ids (vLLM's): the run stops at the first such token, with
    finish_reason "stop", the token counted but its text not output;
  - min_tokens (vLLM's): the stop ids cannot come before that many tokens;
  - /v1/completions' echo, batched prompts and the suffix refusal;
  - n > 1 on chat and completions (one job per choice, "<id>-<i>");
  - skip_special_tokens false: special tokens' text in the output.

The token ids are read from the job's events in Redis (delta token_ids),
so the checks do not depend on the tokenizer's text.
"""
import json

from conftest import connect, job_events
from test_http import MODEL_NAME, front, sse_events  # noqa: F401

PROMPT = "Tell me a story about a cat."


def complete(f, **body):
    status, headers, data = f.request("POST", "/v1/completions",
                                      {"model": MODEL_NAME, "prompt": PROMPT, "temperature": 0,
                                       "max_tokens": 6, **body})
    assert status == 200, data
    assert "X-Redlm-Ignored-Fields" not in headers, headers
    return json.loads(data)


def token_ids(r, prefix, job_id):
    return [t for ev in job_events(r, prefix, job_id) if ev["type"] == "delta"
            for t in ev["token_ids"]]


def test_logit_bias(front, workers, redis_addr, prefix):  # noqa: F811
    workers("w1")
    f = front()
    r = connect(redis_addr)
    base = complete(f)
    ids = token_ids(r, prefix, base["id"])
    assert len(ids) == base["usage"]["completion_tokens"] == 6
    # banning the greedy first token: it never comes, and the first differs
    banned = complete(f, logit_bias={str(ids[0]): -100})
    bids = token_ids(r, prefix, banned["id"])
    assert bids[0] != ids[0] and ids[0] not in bids
    assert banned["choices"][0]["text"] != base["choices"][0]["text"]
    # +100 forces a token the model would not choose, at every step
    forced_id = next(t for t in range(100, 200) if t not in ids)
    forced = complete(f, logit_bias={str(forced_id): 100})
    assert token_ids(r, prefix, forced["id"]) == [forced_id] * 6
    # the same on chat completions, streamed
    c = f.conn()
    c.request("POST", "/v1/chat/completions", headers={"Content-Type": "application/json"},
              body=json.dumps({"model": MODEL_NAME, "temperature": 0, "max_tokens": 4,
                               "mode": "no_think", "stream": True,
                               "messages": [{"role": "user", "content": PROMPT}],
                               "logit_bias": {str(forced_id): 100}}))
    resp = c.getresponse()
    assert resp.status == 200
    chunks = [json.loads(d) for d in sse_events(resp) if d != "[DONE]"]
    c.close()
    assert token_ids(r, prefix, chunks[0]["id"]) == [forced_id] * 4
    # bad biases are a 400 naming the entry
    for lb, param in [({"x": 1}, "logit_bias.x"), ({"5": 101}, "logit_bias.5"),
                      ([5], "logit_bias")]:
        status, _, data = f.request("POST", "/v1/completions",
                                    {"model": MODEL_NAME, "prompt": PROMPT, "logit_bias": lb})
        assert status == 400 and json.loads(data)["error"]["param"] == param, data
    # an id past the model's vocabulary: the worker's error, as a 400
    status, _, data = f.request("POST", "/v1/completions",
                                {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2,
                                 "logit_bias": {"2000000000": 5}})
    assert status == 400 and "logit_bias" in json.loads(data)["error"]["message"], data


def test_stop_token_ids_and_min_tokens(front, workers, redis_addr, prefix):  # noqa: F811
    workers("w1")
    f = front()
    r = connect(redis_addr)
    base = complete(f, max_tokens=8)
    ids = token_ids(r, prefix, base["id"])
    assert len(ids) == 8
    stop_id = ids[2]
    first = ids.index(stop_id)
    stopped = complete(f, max_tokens=8, stop_token_ids=[stop_id])
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["usage"]["completion_tokens"] == first + 1
    assert token_ids(r, prefix, stopped["id"]) == ids[:first + 1]
    # the stop token's text is not output: the text is the baseline's start
    # and is what the tokens before it say
    text = stopped["choices"][0]["text"]
    assert base["choices"][0]["text"].startswith(text)
    before = complete(f, max_tokens=first) if first else None
    assert text == (before["choices"][0]["text"] if before else "")
    # min_tokens: the stop id cannot come before min_tokens tokens
    mt = first + 2
    late = complete(f, max_tokens=8, stop_token_ids=[stop_id], min_tokens=mt)
    lids = token_ids(r, prefix, late["id"])
    assert len(lids) >= mt and stop_id not in lids[:mt]
    assert lids[:first] == ids[:first]
    # and the end of sequence: <|im_end|> (738, the tiny model's eos) forced
    # by logit_bias ends the run at once, but with min_tokens 3 only after
    # three other tokens (the ban beats the bias)
    eos = complete(f, max_tokens=8, logit_bias={"738": 100})
    assert eos["choices"][0]["finish_reason"] == "stop"
    assert eos["usage"]["completion_tokens"] == 1
    late = complete(f, max_tokens=8, logit_bias={"738": 100}, min_tokens=3)
    assert late["choices"][0]["finish_reason"] == "stop"
    assert late["usage"]["completion_tokens"] == 4
    lids = token_ids(r, prefix, late["id"])
    assert 738 not in lids[:3] and lids[3] == 738
    # a negative id is a 400 naming it
    status, _, data = f.request("POST", "/v1/completions",
                                {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2,
                                 "stop_token_ids": [-1]})
    assert status == 400 and json.loads(data)["error"]["param"] == "stop_token_ids[0]", data
    # a floor above the ceiling: refused, as vLLM refuses it
    status, _, data = f.request("POST", "/v1/completions",
                                {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2, "min_tokens": 3})
    assert status == 400 and json.loads(data)["error"]["param"] == "min_tokens", data


def test_echo_batched_prompts_suffix(front, workers, redis_addr, prefix):  # noqa: F811
    """/v1/completions: echo puts the prompt before the text; a list of
    prompts (strings or token-id lists) gives one choice per prompt, in
    order, each equal to that prompt alone; suffix is a clear 400."""
    workers("w1")
    f = front()
    a = complete(f, max_tokens=4)
    b = complete(f, max_tokens=4, prompt="Once upon a time")
    echoed = complete(f, max_tokens=4, echo=True)
    assert echoed["choices"][0]["text"] == PROMPT + a["choices"][0]["text"]
    assert echoed["usage"] == a["usage"]
    # streamed: the prompt comes first, the whole text is the same
    c = f.conn()
    c.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
              body=json.dumps({"model": MODEL_NAME, "prompt": PROMPT, "temperature": 0,
                               "max_tokens": 4, "echo": True, "stream": True}))
    resp = c.getresponse()
    assert resp.status == 200
    chunks = [json.loads(d) for d in sse_events(resp) if d != "[DONE]"]
    c.close()
    assert chunks[0]["choices"][0]["text"].startswith(PROMPT)
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == echoed["choices"][0]["text"]
    # batched prompts: strings, in order, each as alone; usage summed
    both = complete(f, max_tokens=4, prompt=[PROMPT, "Once upon a time"], echo=True)
    assert [ch["index"] for ch in both["choices"]] == [0, 1]
    assert both["choices"][0]["text"] == PROMPT + a["choices"][0]["text"]
    assert both["choices"][1]["text"] == "Once upon a time" + b["choices"][0]["text"]
    assert both["usage"]["prompt_tokens"] == a["usage"]["prompt_tokens"] + b["usage"]["prompt_tokens"]
    assert both["usage"]["completion_tokens"] == 8
    # token-id prompts: the ids of the two prompts give the same texts
    r = connect(redis_addr)
    ids_a = [t for ev in job_events(r, prefix, f"{both['id']}-0") if ev["type"] == "delta"
             for t in ev["token_ids"]]
    assert ids_a and token_ids(r, prefix, a["id"]) == ids_a
    # streamed batch: each choice's chunks carry its index, both finish
    c = f.conn()
    c.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
              body=json.dumps({"model": MODEL_NAME, "prompt": [PROMPT, "Once upon a time"],
                               "temperature": 0, "max_tokens": 4, "stream": True,
                               "stream_options": {"include_usage": True}}))
    resp = c.getresponse()
    assert resp.status == 200
    chunks = [json.loads(d) for d in sse_events(resp) if d != "[DONE]"]
    c.close()
    texts = ["", ""]
    finish = [None, None]
    for ch in chunks:
        for choice in ch["choices"]:
            texts[choice["index"]] += choice["text"]
            finish[choice["index"]] = choice["finish_reason"] or finish[choice["index"]]
    assert texts == [a["choices"][0]["text"], b["choices"][0]["text"]]
    assert finish == ["length", "length"]
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    # suffix: refused, saying why; echo with token ids too
    for extra, param in [({"suffix": "end"}, "suffix"), ({"prompt": [1, 2], "echo": True}, "echo")]:
        status, _, data = f.request("POST", "/v1/completions",
                                    {"model": MODEL_NAME, "prompt": PROMPT, **extra})
        assert status == 400 and json.loads(data)["error"]["param"] == param, data
    assert "fill-in-the-middle" in json.loads(f.request(
        "POST", "/v1/completions", {"model": MODEL_NAME, "prompt": "x", "suffix": "y"})[2])[
            "error"]["message"]


def test_n_choices(front, workers, redis_addr, prefix):  # noqa: F811
    """n > 1 on chat and completions: n jobs "<id>-<i>", choices 0..n-1, the
    prompt counted once; seeded samples differ (seed + i) and each equals
    the single request with that seed; streamed chunks carry the index."""
    workers("w1")
    f = front()
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 5, "mode": "no_think", "temperature": 1.0, "seed": 11}
    status, _, data = f.request("POST", "/v1/chat/completions", {**body, "n": 3})
    assert status == 200, data
    many = json.loads(data)
    assert [ch["index"] for ch in many["choices"]] == [0, 1, 2]
    one = []
    for i in range(3):
        status, _, data = f.request("POST", "/v1/chat/completions", {**body, "seed": 11 + i})
        one.append(json.loads(data))
    for i in range(3):
        assert many["choices"][i]["message"]["content"] == one[i]["choices"][0]["message"]["content"]
    assert many["usage"]["prompt_tokens"] == one[0]["usage"]["prompt_tokens"]
    assert many["usage"]["completion_tokens"] == sum(o["usage"]["completion_tokens"] for o in one)
    # the jobs in Redis
    r = connect(redis_addr)
    for i in range(3):
        assert job_events(r, prefix, f"{many['id']}-{i}")[-1]["type"] == "done"
    # streamed chat: each index's deltas make its text
    c = f.conn()
    c.request("POST", "/v1/chat/completions", headers={"Content-Type": "application/json"},
              body=json.dumps({**body, "n": 3, "stream": True}))
    resp = c.getresponse()
    assert resp.status == 200
    chunks = [json.loads(d) for d in sse_events(resp) if d != "[DONE]"]
    c.close()
    texts = ["", "", ""]
    for ch in chunks:
        for choice in ch["choices"]:
            texts[choice["index"]] += choice["delta"].get("content", "") or ""
    assert texts == [ch["message"]["content"] for ch in many["choices"]]
    # completions: n with a batch, index = prompt * n + sample
    out = complete(f, prompt=[PROMPT, "Once upon a time"], n=2, max_tokens=3)
    assert [ch["index"] for ch in out["choices"]] == [0, 1, 2, 3]
    # greedy: the n samples of a prompt are equal
    assert out["choices"][0]["text"] == out["choices"][1]["text"]
    assert out["choices"][2]["text"] == out["choices"][3]["text"]
    # the other APIs take one
    status, _, data = f.request("POST", "/v1/responses", {"model": MODEL_NAME, "input": "Hi", "n": 2})
    assert status == 400 and json.loads(data)["error"]["param"] == "n", data


def test_skip_special_tokens(front, workers, redis_addr, prefix):  # noqa: F811
    """skip_special_tokens false puts a special token's text in the output
    (vLLM's); the default leaves it out. <|im_start|> (737 in the tiny
    model's tokenizer: special, and no stop token) is forced by logit_bias."""
    workers("w1")
    f = front()
    r = connect(redis_addr)
    plain = complete(f, max_tokens=3, logit_bias={"737": 100})
    assert plain["choices"][0]["text"] == ""
    assert token_ids(r, prefix, plain["id"]) == [737] * 3
    kept = complete(f, max_tokens=3, logit_bias={"737": 100}, skip_special_tokens=False)
    assert kept["choices"][0]["text"] == "<|im_start|>" * 3
    status, _, data = f.request("POST", "/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT,
                                                            "skip_special_tokens": 0})
    assert status == 400 and json.loads(data)["error"]["param"] == "skip_special_tokens", data
