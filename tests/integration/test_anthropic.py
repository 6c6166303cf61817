"""Anthropic's Messages API on the front door (POST /v1/messages,
/v1/messages/count_tokens; dispatcher/anthropic.c), end to end through a
real redis-server, dispatcher and worker:

  - with the test playing the worker: the stream's events in Anthropic's
    order (message_start, a thinking block, a text block, a tool_use block
    with its input_json_delta, message_delta with stop_reason tool_use and
    the usage, message_stop), the message object with the same blocks,
    usage in Anthropic's sums (input_tokens without the cached ones), an
    error before the first byte as a status with Anthropic's error object
    and after it as an `event: error`;
  - the job a Messages body becomes: system, text blocks, tool_use and
    tool_result turns, stop_sequences, thinking's mode and budget, tools
    and tool_choice in chat's shape; what cannot be served (images, server
    tools, a prefill under a forced tool, no max_tokens) is a 400 naming the
    member; a prefill (a last assistant message) is continued, as vLLM's
    continue_final_message on chat completions;
    the key as x-api-key;
  - count_tokens counts what the worker's usage says the prompt had;
  - Anthropic's TypeScript SDK and the AI SDK's Anthropic provider, pinned
    in tests/integration/node-clients, against a real worker: the models
    list (Anthropic's shape when anthropic-version is sent), create,
    stream (the SDK's accumulator), a forced tool and its result sent back,
    a streamed tool call, errors as the SDK's error classes; the texts equal
    the job's events in Redis.
"""
import json
import threading

from conftest import MODEL, connect, job_events, tap
from test_clients import run_client
from test_compat_api import DONE, PLAYED
from test_http import MODEL_NAME, front, play_worker_error  # noqa: F401 (front is a fixture)

KEY = "sk-test-0123456789"


def messages_sse(f, body, headers=None):
    """(status, [(event name, data)]) of a streamed POST /v1/messages."""
    c = f.conn()
    c.request("POST", "/v1/messages", body=json.dumps(body),
              headers={"Content-Type": "application/json", **(headers or {})})
    resp = c.getresponse()
    if resp.status != 200:
        data = resp.read()
        c.close()
        return resp.status, json.loads(data)
    assert resp.getheader("Content-Type").startswith("text/event-stream")
    out, buf = [], b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            lines = dict(line.split(b": ", 1) for line in ev.split(b"\n") if b": " in line)
            data = json.loads(lines[b"data"])
            assert data["type"] == lines[b"event"].decode()  # the name is the data's type
            out.append(data)
    c.close()
    return 200, out


def job_of(r, prefix, pool="think"):
    return json.loads(r.xrange(f"{prefix}jobs:{pool}")[-1][1]["job"])


BODY = {"model": MODEL_NAME, "max_tokens": 64, "system": "Be brief.",
        "thinking": {"type": "enabled", "budget_tokens": 16},
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"name": "get_weather", "description": "The weather",
                   "input_schema": {"type": "object",
                                    "properties": {"city": {"type": "string"}}}}]}


def test_messages_events_played(front, redis_addr, prefix):  # noqa: F811
    f = front()
    r = connect(redis_addr)
    cached = {**DONE, "usage": {**DONE["usage"], "cached_prompt_tokens": 16}}
    played = PLAYED[:-1] + [cached]
    t = threading.Thread(target=play_worker_error, args=(r, prefix, played))
    t.start()
    status, evs = messages_sse(f, {**BODY, "stream": True})
    t.join()
    assert status == 200, evs
    assert [e["type"] for e in evs] == [
        "message_start",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop"]
    start = evs[0]["message"]
    assert start["id"].startswith("msg_") and start["role"] == "assistant"
    assert start["content"] == [] and start["stop_reason"] is None
    assert [e["index"] for e in evs if e["type"].startswith("content_block")] == \
        [0] * 4 + [1] * 3 + [2] * 3
    assert evs[1]["content_block"]["type"] == "thinking"
    assert [e["delta"] for e in evs[2:4]] == [{"type": "thinking_delta", "thinking": "Let me"},
                                              {"type": "thinking_delta", "thinking": " think."}]
    assert evs[6]["delta"] == {"type": "text_delta", "text": "Checking."}
    use = evs[8]["content_block"]
    assert use["type"] == "tool_use" and use["name"] == "get_weather" and use["input"] == {}
    assert use["id"].startswith("call_") and use["id"] != "call_1"  # unique per request
    assert evs[9]["delta"]["type"] == "input_json_delta"
    assert json.loads(evs[9]["delta"]["partial_json"]) == {"city": "Paris"}
    md = evs[11]
    assert md["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    # Anthropic's sums: input_tokens + cache_read_input_tokens = the prompt
    assert md["usage"]["input_tokens"] == 14 and md["usage"]["cache_read_input_tokens"] == 16
    assert md["usage"]["output_tokens"] == 12
    # the job: system first, thinking with its budget, tools in chat's shape
    job = job_of(r, prefix)
    assert job["messages"][0] == {"role": "system", "content": "Be brief."}
    assert job["mode"] == "think" and job["max_thinking_tokens"] == 16
    assert job["tools"][0]["function"]["name"] == "get_weather"
    assert job["tools"][0]["function"]["parameters"]["properties"] == {"city": {"type": "string"}}

    # not streamed: the same blocks in the message object
    t = threading.Thread(target=play_worker_error, args=(r, prefix, played))
    t.start()
    status, _, data = f.request("POST", "/v1/messages", BODY)
    t.join()
    assert status == 200, data
    msg = json.loads(data)
    assert msg["type"] == "message" and msg["stop_reason"] == "tool_use"
    assert [b["type"] for b in msg["content"]] == ["thinking", "text", "tool_use"]
    assert msg["content"][0]["thinking"] == "Let me think."
    assert msg["content"][1]["text"] == "Checking."
    assert msg["content"][2]["input"] == {"city": "Paris"}
    assert msg["usage"]["input_tokens"] + msg["usage"]["cache_read_input_tokens"] == 30

    # thinking.display omitted: the block is there, its text is not
    t = threading.Thread(target=play_worker_error, args=(r, prefix, played))
    t.start()
    status, _, data = f.request("POST", "/v1/messages",
                                {**BODY, "thinking": {"type": "enabled", "budget_tokens": 16,
                                                      "display": "omitted"}})
    t.join()
    assert json.loads(data)["content"][0] == {"type": "thinking", "thinking": "", "signature": ""}

    # an error before any byte is a status with Anthropic's error object
    overloaded = [{"seq": 0, "type": "error", "code": "OVERLOADED", "message": "busy",
                   "retry_after_ms": 2000}]
    t = threading.Thread(target=play_worker_error, args=(r, prefix, overloaded))
    t.start()
    status, headers, data = f.request("POST", "/v1/messages", {**BODY, "stream": True})
    t.join()
    assert status == 503 and headers["Retry-After"] == "2"
    assert json.loads(data) == {"type": "error", "error": {"type": "overloaded_error",
                                                           "message": "busy"}}
    # ... and after the first byte an `event: error`
    late = PLAYED[:1] + [{"seq": 1, "type": "error", "code": "ENGINE_ERROR",
                          "message": "the backend failed"}]
    t = threading.Thread(target=play_worker_error, args=(r, prefix, late))
    t.start()
    status, evs = messages_sse(f, {**BODY, "stream": True})
    t.join()
    assert evs[0]["type"] == "message_start"
    assert evs[-1] == {"type": "error", "error": {"type": "api_error",
                                                  "message": "the backend failed"}}


def test_messages_become_the_job(front, redis_addr, prefix, tmp_path):  # noqa: F811
    """A tool turn as Claude's clients send it (to /v1/messages?beta=true,
    with beta headers) becomes chat's messages; what cannot be served is a
    400 with Anthropic's error object naming the member; the key is taken
    as x-api-key."""
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY} acme\n")
    f = front("--api-keys-file", str(keys))
    r = connect(redis_addr)
    xkey = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    body = {"model": MODEL_NAME, "max_tokens": 5, "stop_sequences": ["END"],
            "thinking": {"type": "disabled"}, "temperature": 0.5, "top_k": 20,
            "metadata": {"user_id": "u-1"}, "tool_choice": {"type": "any"},
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "tools": BODY["tools"],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                     "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1",
                     "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "And tomorrow?"}]}]}
    t = threading.Thread(target=play_worker_error,
                         args=(r, prefix, [{**DONE, "seq": 0, "tool_calls": []}]))
    t.start()
    # Claude Code's path: ?beta=true, beta headers
    status, _, data = f.request("POST", "/v1/messages?beta=true", body,
                                headers={**xkey, "anthropic-beta": "interleaved-thinking-2025-05-14"})
    t.join()
    assert status == 200, data
    assert json.loads(data)["stop_reason"] == "end_turn"
    job = job_of(r, prefix, "fast")
    assert job["mode"] == "no_think" and job["stop"] == ["END"]
    assert job["temperature"] == 0.5 and job["top_k"] == 20
    assert job["tool_choice"] == "required"
    m = job["messages"]
    assert [x["role"] for x in m] == ["system", "user", "assistant", "tool", "user"]
    assert m[0]["content"] == [{"type": "text", "text": "Be brief."}]
    assert m[2]["content"] == [{"type": "text", "text": "Let me look."}]
    assert m[2]["reasoning_content"] == "Use the tool."
    call = m[2]["tool_calls"][0]
    assert call["id"] == "toolu_1" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert m[3] == {"role": "tool", "content": [{"type": "text", "text": "sunny"}],
                    "tool_call_id": "toolu_1"}
    assert m[4]["content"] == [{"type": "text", "text": "And tomorrow?"}]

    # refusals, each a 400 invalid_request_error naming what was refused
    ask = [{"role": "user", "content": "Hi"}]
    for bad, where in [
        ({"messages": ask}, "max_tokens"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}]}]},
         "messages[0].content[0].type"),
        ({"max_tokens": 4, "messages": ask, "tools": [{"type": "web_search_20250305",
                                                       "name": "web_search"}]},
         "tools[0].type"),
        ({"max_tokens": 4, "messages": ask + [{"role": "assistant", "content": "{"}],
          "tools": BODY["tools"], "tool_choice": {"type": "any"}}, "messages"),
        ({"max_tokens": 4, "messages": ask, "thinking": {"type": "enabled"}},
         "thinking.budget_tokens"),
        ({"max_tokens": 4, "messages": ask, "stop_sequences": "END"}, "stop_sequences"),
    ]:
        status, _, data = f.request("POST", "/v1/messages", {"model": MODEL_NAME, **bad},
                                    headers=xkey)
        err = json.loads(data)
        assert status == 400 and err["type"] == "error", (bad, data)
        assert err["error"]["type"] == "invalid_request_error", data
        assert err["error"]["message"].startswith(where + ":"), (where, data)
    # a wrong key: 401 authentication_error; an unknown model: 404 not_found_error
    status, _, data = f.request("POST", "/v1/messages", {"model": MODEL_NAME, "max_tokens": 4,
                                                         "messages": ask},
                                headers={"x-api-key": "sk-wrong-000000000"})
    assert status == 401 and json.loads(data)["error"]["type"] == "authentication_error"
    status, _, data = f.request("POST", "/v1/messages", {"model": "nope", "max_tokens": 4,
                                                         "messages": ask}, headers=xkey)
    assert status == 404 and json.loads(data)["error"]["type"] == "not_found_error"


def test_count_tokens(front, workers, redis_addr, prefix):  # noqa: F811
    """count_tokens with the dispatcher's tokenizer: the count the worker's
    usage gives the same prompt, for each mode."""
    workers("w1")
    f = front("--model", str(MODEL))
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Hi there"}]}]
    for thinking in ({"type": "enabled", "budget_tokens": 8}, {"type": "disabled"}):
        body = {"model": MODEL_NAME, "system": "Be brief.", "messages": msgs, "thinking": thinking}
        status, _, data = f.request("POST", "/v1/messages/count_tokens", body)
        assert status == 200, data
        n = json.loads(data)["input_tokens"]
        status, _, data = f.request("POST", "/v1/messages", {**body, "max_tokens": 2})
        assert status == 200, data
        u = json.loads(data)["usage"]
        assert u["input_tokens"] + u["cache_read_input_tokens"] == n > 5, (thinking, data)
    status, _, data = f.request("POST", "/v1/messages/count_tokens",
                                {"model": MODEL_NAME, "messages": [{"role": "user",
                                                                    "content": 3}]})
    assert status == 400 and json.loads(data)["error"]["type"] == "invalid_request_error"


def msg_job(r, prefix, msg_id):
    """The job behind a message id (the id itself, or without msg_)."""
    for cand in (msg_id, msg_id[len("msg_"):] if msg_id.startswith("msg_") else None):
        if cand and r.exists(f"{prefix}out:{cand}"):
            return cand
    return msg_id


QUEUES = ("jobs:fast", "jobs:think", "jobs:fast:w:w1", "jobs:think:w:w1")  # pools, offers to w1


def test_anthropic_sdks(front, workers, redis_addr, prefix, tmp_path):  # noqa: F811
    r = connect(redis_addr)
    tap(r, *(prefix + q for q in QUEUES))  # read below
    res = run_client(front, workers, tmp_path, "anthropic.mjs")
    jobs = {}
    for q in QUEUES:
        for _, x in r.xrange(prefix + q):
            j = json.loads(x["job"])
            jobs[j["id"]] = j

    def content_of(msg_id):
        ev = job_events(r, prefix, msg_job(r, prefix, msg_id))
        c = "".join(e["delta"].get("content", "") for e in ev if e["type"] == "delta")
        t = "".join(e["delta"].get("reasoning_content", "") for e in ev if e["type"] == "delta")
        return c, t, ev[-1]

    assert res["models"] == [{"id": MODEL_NAME, "type": "model", "name": MODEL_NAME}]
    c = res["create"]
    assert c["type"] == "message" and c["stop_reason"] == "max_tokens"
    assert c["usage"]["output_tokens"] == 8
    text, _, done = content_of(c["id"])
    assert [b["text"] for b in c["content"] if b["type"] == "text"] == ([text] if text else [])
    assert c["usage"]["input_tokens"] + c["usage"]["cache_read_input_tokens"] == \
        done["usage"]["prompt_tokens"]

    s = res["stream"]
    text, thinking, done = content_of(s["id"])
    assert res["streamedText"] == text and res["streamedThinking"] == thinking
    # thinking on with its budget reached the job (a random model need not think)
    sjob = jobs[msg_job(r, prefix, s["id"])]
    assert sjob["mode"] == "think" and sjob["max_thinking_tokens"] == 4
    assert sjob["messages"][0]["content"] == [{"type": "text", "text": "Hi"},
                                              {"type": "text", "text": " there"}]
    assert res["events"][0] == "message_start" and res["events"][-1] == "message_stop"
    assert ("thinking" in [b["type"] for b in s["content"]]) == bool(thinking)
    assert s["usage"]["output_tokens"] == done["usage"]["completion_tokens"]

    use = [b for b in res["tool"]["content"] if b["type"] == "tool_use"]
    assert res["tool"]["stop_reason"] == "tool_use" and len(use) >= 1, res["tool"]
    assert set(use[0]["input"]) == {"city"} and isinstance(use[0]["input"]["city"], str)
    assert res["toolResult"]["type"] == "message"
    job = jobs[msg_job(r, prefix, res["toolResult"]["id"])]  # the tool_result turn
    assert [m["role"] for m in job["messages"]] == ["user", "assistant", "tool"]
    assert job["messages"][1]["tool_calls"][0]["id"] == use[0]["id"]
    assert job["messages"][-1] == {"role": "tool", "content": "sunny", "tool_call_id": use[0]["id"]}

    tuse = [b for b in res["toolStream"]["content"] if b["type"] == "tool_use"]
    assert res["toolStream"]["stop_reason"] == "tool_use" and tuse, res["toolStream"]
    assert json.loads(res["inputJson"]) == tuse[0]["input"]  # the fragments are the input

    assert res["image"]["status"] == 400 and res["image"]["type"] == "invalid_request_error"
    assert res["image"]["cls"] == "BadRequestError", res["image"]
    assert "image" in res["image"]["message"]
    assert res["server_tool"]["status"] == 400 and "server tool" in res["server_tool"]["message"]
    assert res["model"]["status"] == 404 and res["model"]["cls"] == "NotFoundError"

    for call in ("generateText", "streamText"):
        got = res[call]
        assert got["finishReason"] == "length", got
        assert got["usage"]["outputTokens"] == 12, got
        text, _, _ = content_of(got["id"])
        assert got["text"] == text, (call, got)
    assert res["streamText"]["parts"] >= 2  # streamed, not one final chunk
    t = res["aiTools"]
    assert t["toolCalls"] and t["toolCalls"][0]["name"] == "weather", t
    args = t["toolCalls"][0]["input"]
    assert set(args) == {"city", "days"} and 1 <= args["days"] <= 7, args
    assert t["calls"] == [x["input"] for x in t["toolCalls"]]


def test_stop_sequence(front, workers, redis_addr, prefix):  # noqa: F811
    """A stop string that ends the answer is named: Anthropic's stop_reason
    stop_sequence with the string, chat completions' stop_reason (vLLM's),
    the done event's matched_stop; an answer that ends otherwise names none."""
    workers("w1")
    f = front()
    r = connect(redis_addr)
    body = {"model": MODEL_NAME, "max_tokens": 24, "temperature": 0,
            "thinking": {"type": "disabled"},
            "messages": [{"role": "user", "content": "Tell me a story about a cat."}]}
    status, _, data = f.request("POST", "/v1/messages", body)
    assert status == 200, data
    msg = json.loads(data)
    assert msg["stop_reason"] == "max_tokens" and msg["stop_sequence"] is None
    text = "".join(b["text"] for b in msg["content"] if b["type"] == "text")
    # a printable piece of the greedy answer, at its first occurrence
    at = next((i for i in range(2, len(text) - 2)
               if text[i:i + 2].isascii() and text[i:i + 2].isprintable()
               and text.find(text[i:i + 2]) == i), None)
    assert at is not None, text
    stop = text[at:at + 2]
    status, _, data = f.request("POST", "/v1/messages",
                                {**body, "stop_sequences": ["never said", stop]})
    assert status == 200, data
    cut = json.loads(data)
    assert cut["stop_reason"] == "stop_sequence" and cut["stop_sequence"] == stop, cut
    assert "".join(b["text"] for b in cut["content"] if b["type"] == "text") == text[:at]
    done = job_events(r, prefix, msg_job(r, prefix, cut["id"]))[-1]
    assert done["finish_reason"] == "stop" and done["matched_stop"] == stop
    # the same on chat completions, as vLLM's stop_reason
    chat = {"model": MODEL_NAME, "max_tokens": 24, "temperature": 0, "mode": "no_think",
            "messages": body["messages"], "stop": [stop]}
    status, _, data = f.request("POST", "/v1/chat/completions", chat)
    ch = json.loads(data)["choices"][0]
    assert ch["finish_reason"] == "stop" and ch["stop_reason"] == stop, ch
    status, _, data = f.request("POST", "/v1/chat/completions", {**chat, "stop": ["never said"]})
    ch = json.loads(data)["choices"][0]
    assert ch["finish_reason"] == "length" and ch["stop_reason"] is None, ch


def test_prefill(front, workers, redis_addr, prefix):  # noqa: F811
    """A last assistant message is continued, not answered: the prompt
    ends with its text (no end of turn, no new assistant turn), on the
    Messages API and as vLLM's continue_final_message on chat completions;
    the worker's prompt is the one the dispatcher renders and counts."""
    workers("w1")
    f = front("--model", str(MODEL))
    r = connect(redis_addr)
    tap(r, *(prefix + q for q in QUEUES))
    msgs = [{"role": "user", "content": "Give me JSON."},
            {"role": "assistant", "content": '{"answer": '}]
    chat = {"model": MODEL_NAME, "messages": msgs, "mode": "no_think",
            "continue_final_message": True, "add_generation_prompt": False}
    status, _, data = f.request("POST", "/tokenize", chat)
    assert status == 200, data
    tk = json.loads(data)
    status, _, data = f.request("POST", "/detokenize", {"tokens": tk["tokens"]})
    text = json.loads(data)["prompt"]
    assert text.endswith('<|im_start|>assistant\n<think>\n\n</think>\n\n{"answer": '), text
    assert text.count("<|im_start|>assistant") == 1  # no second, empty turn
    body = {"model": MODEL_NAME, "max_tokens": 6, "thinking": {"type": "disabled"},
            "messages": msgs}
    status, _, data = f.request("POST", "/v1/messages/count_tokens", body)
    assert json.loads(data)["input_tokens"] == tk["count"]
    status, _, data = f.request("POST", "/v1/messages", body)
    assert status == 200, data
    msg = json.loads(data)
    u = msg["usage"]
    assert u["input_tokens"] + u["cache_read_input_tokens"] == tk["count"]
    jobs = {}
    for q in QUEUES:
        for _, x in r.xrange(prefix + q):
            j = json.loads(x["job"])
            jobs[j["id"]] = j
    assert jobs[msg_job(r, prefix, msg["id"])]["continue_final_message"] is True
    status, _, data = f.request("POST", "/v1/chat/completions", {**chat, "max_tokens": 6})
    assert status == 200, data
    assert json.loads(data)["usage"]["prompt_tokens"] == tk["count"]
    # a chat whose last message is the user's has nothing to continue
    status, _, data = f.request("POST", "/v1/chat/completions",
                                {**chat, "messages": msgs[:1], "max_tokens": 6})
    assert status == 400 and json.loads(data)["error"]["param"] == "continue_final_message"
