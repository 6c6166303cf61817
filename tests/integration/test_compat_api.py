"""The other APIs of the front door (dispatcher/compat.c, issue 29), end to
end through a real redis-server, dispatcher and worker:

  - POST /v1/responses with the pinned `openai` npm client: responses.create
    with text and message input (instructions, a function_call turn and its
    output), responses.stream and create({stream: true}) with the Responses
    API's event names; the text equals the job's events in Redis;
    previous_response_id is a clear 400; on the real-vocabulary model
    text.format json_schema and a forced function tool give valid JSON;
    with the test playing the worker, reasoning, message and function_call
    items come in the right order with their events;
  - Ollama's API with the pinned `ollama` npm client: chat and generate,
    streamed (NDJSON) and not, greedy streams equal to the plain answers,
    options mapped into the job, think, keep_alive accepted, structured
    `format` (a schema and "json"), /api/tags, /api/ps, /api/show,
    /api/version, and errors as {"error": "..."}.
"""
import json
import os
import subprocess
import threading

import jsonschema
import pytest

from conftest import MODEL, connect, job_events, tap
from test_http import MODEL_NAME, front, npm_openai, play_worker_error, sse_events  # noqa: F401
from test_structured import TOOLS, vocab_model, worker  # noqa: F401

KEY = "sk-test-0123456789"


def node(f, tmp_path, script, *args, timeout=180):
    """Runs a node script with the pinned npm clients; argv: the front
    door's base URL (no /v1), the model name, then args. Returns its JSON."""
    d = npm_openai()
    if d is None:
        pytest.skip("node is not installed (make deps installs nodejs)")
    path = tmp_path / "client.js"
    path.write_text(script)
    out = subprocess.run(["node", str(path), f"http://127.0.0.1:{f.port}", MODEL_NAME, *args],
                         capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "NODE_PATH": str(d / "node_modules")})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def safetensors_params(path):
    """Elements of every tensor a safetensors file holds (its header)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    total = 0
    for name, t in header.items():
        if name != "__metadata__":
            k = 1
            for dim in t["shape"]:
                k *= dim
            total += k
    return total


def keyed_front(front, tmp_path, *flags):  # noqa: F811
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY} acme\n")
    return front("--api-keys-file", str(keys), *flags)


def texts(events):
    c = "".join(e["delta"].get("content", "") for e in events if e["type"] == "delta")
    r = "".join(e["delta"].get("reasoning_content", "") for e in events if e["type"] == "delta")
    return c, r


# ---- the Responses API ----

RESPONSES_SCRIPT = r"""
const OpenAI = require('openai');
const [base, model] = [process.argv[2], process.argv[3]];
const client = new OpenAI({baseURL: base + '/v1', apiKey: 'sk-test-0123456789', maxRetries: 0});
(async () => {
  const out = {};
  out.text = await client.responses.create({model, input: 'Tell me a story about a cat.',
    instructions: 'Be brief.', max_output_tokens: 8, reasoning: {effort: 'low'}});
  out.text_output = out.text.output_text;
  out.items = await client.responses.create({model, max_output_tokens: 6, reasoning: {effort: 'low'},
    tools: [{type: 'function', name: 'get_time', parameters: {type: 'object', properties: {}}}],
    input: [{role: 'developer', content: 'Be brief.'},
            {role: 'user', content: [{type: 'input_text', text: 'What time is it?'}]},
            {type: 'function_call', call_id: 'c1', name: 'get_time', arguments: '{}'},
            {type: 'function_call_output', call_id: 'c1', output: '12:00'},
            {role: 'assistant', content: [{type: 'output_text', text: 'Noon.'}]},
            {role: 'user', content: 'Thanks'}]});
  const s = client.responses.stream({model, input: 'Hi', max_output_tokens: 8, reasoning: {effort: 'low'}});
  out.events = [];
  out.deltas = '';
  s.on('event', ev => out.events.push(ev.type));
  s.on('response.output_text.delta', ev => { out.deltas += ev.delta; });
  out.final = await s.finalResponse();
  const it = await client.responses.create({model, input: 'Hello', max_output_tokens: 5,
    reasoning: {effort: 'low'}, stream: true});
  out.seq = [];
  for await (const ev of it) { out.seq.push([ev.type, ev.sequence_number]); out.last = ev; }
  try {
    await client.responses.create({model, input: 'x', previous_response_id: 'resp_123'});
  } catch (e) { out.prev = {status: e.status, code: e.code, param: e.param}; }
  try {
    await client.responses.create({model, input: [{type: 'web_search_call'}]});
  } catch (e) { out.bad = {status: e.status, param: e.param}; }
  console.log(JSON.stringify(out));
})().catch(e => { console.error(String(e)); process.exit(1); });
"""


def test_responses_npm_client(front, workers, redis_addr, prefix, tmp_path):  # noqa: F811
    tap(connect(redis_addr), f"{prefix}jobs:fast", f"{prefix}jobs:think")  # jobs stay readable
    workers("w1")
    f = keyed_front(front, tmp_path)
    res = node(f, tmp_path, RESPONSES_SCRIPT)
    r = connect(redis_addr)
    t = res["text"]
    assert t["object"] == "response" and t["id"].startswith("resp_")
    assert t["status"] == "incomplete" and t["incomplete_details"] == {"reason": "max_output_tokens"}
    assert t["instructions"] == "Be brief." and t["usage"]["output_tokens"] == 8
    content, _ = texts(job_events(r, prefix, t["id"]))
    assert res["text_output"] == content
    assert [i["type"] for i in t["output"]] == ["message"]
    # the job: instructions as the system turn, no thinking (effort low)
    jobs = {json.loads(x["job"])["id"]: json.loads(x["job"])
            for p in ("fast", "think") for _, x in r.xrange(f"{prefix}jobs:{p}")}
    job = jobs[t["id"]]
    assert job["messages"][0] == {"role": "system", "content": "Be brief."}
    assert job["mode"] == "no_think" and job["max_tokens"] == 8
    # message input with a function call and its output, as chat turns
    msgs = jobs[res["items"]["id"]]["messages"]
    assert [m["role"] for m in msgs] == ["developer", "user", "assistant", "tool", "assistant",
                                         "user"]
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": "{}"}
    assert msgs[3]["tool_call_id"] == "c1" and msgs[3]["content"] == "12:00"
    assert jobs[res["items"]["id"]]["tools"][0]["function"]["name"] == "get_time"
    # responses.stream: the Responses API's events, the text of the job's events
    final = res["final"]
    content, _ = texts(job_events(r, prefix, final["id"]))
    assert res["deltas"] == content == final["output"][0]["content"][0]["text"]
    ev = res["events"]
    assert ev[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                      "response.content_part.added"]
    assert ev[-4:] == ["response.output_text.done", "response.content_part.done",
                       "response.output_item.done", "response.incomplete"]
    # (this client keeps its snapshot's usage only from response.completed;
    # a response cut by max_output_tokens ends with response.incomplete, as OpenAI's)
    assert res["last"]["type"] == "response.incomplete"
    assert res["last"]["response"]["usage"]["output_tokens"] == 5
    assert [s for _, s in res["seq"]] == list(range(len(res["seq"])))
    assert res["seq"][0][0] == "response.created"
    assert res["prev"] == {"status": 400, "code": "previous_response_not_found",
                           "param": "previous_response_id"}
    assert res["bad"] == {"status": 400, "param": "input[0].type"}


def responses_sse(f, body):
    c = f.conn()
    c.request("POST", "/v1/responses", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    resp = c.getresponse()
    assert resp.status == 200, resp.read()
    assert resp.getheader("Content-Type").startswith("text/event-stream")
    out = [json.loads(d) for d in sse_events(resp)]
    c.close()
    return out


DONE = {"seq": 3, "type": "done", "finish_reason": "stop",
        "usage": {"prompt_tokens": 30, "completion_tokens": 12, "reasoning_tokens": 4,
                  "cached_prompt_tokens": 0},
        "cached": False, "timings": {"queue_ms": 0, "ttft_ms": 5, "total_ms": 20},
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}
PLAYED = [{"seq": 0, "type": "delta", "delta": {"reasoning_content": "Let me"}, "token_ids": [1]},
          {"seq": 1, "type": "delta", "delta": {"reasoning_content": " think."}, "token_ids": [2]},
          {"seq": 2, "type": "delta", "delta": {"content": "Checking."}, "token_ids": [3]},
          DONE]


def test_responses_items_and_events(front, redis_addr, prefix):  # noqa: F811
    """The test plays the worker: reasoning, then text, then a tool call.
    The stream has a reasoning item, a message item and a function_call
    item, each with its events, numbered in order; the object the same
    items; tool-call ids are unique per request."""
    f = front()
    r = connect(redis_addr)
    body = {"model": MODEL_NAME, "input": "Weather in Paris?", "reasoning": {"effort": "high"},
            "tools": [{"type": "function", "name": "get_weather",
                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]}
    t = threading.Thread(target=play_worker_error, args=(r, prefix, PLAYED))
    t.start()
    evs = responses_sse(f, {**body, "stream": True})
    t.join()
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    assert [e["type"] for e in evs] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    final = evs[-1]["response"]
    assert final["status"] == "completed"
    out = final["output"]
    assert [o["type"] for o in out] == ["reasoning", "message", "function_call"]
    assert out[0]["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    assert out[1]["content"][0]["text"] == "Checking."
    fc = out[2]
    assert fc["name"] == "get_weather" and json.loads(fc["arguments"]) == {"city": "Paris"}
    assert fc["call_id"].startswith("call_") and fc["call_id"] != "call_1"
    assert final["usage"] == {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 0},
                              "output_tokens": 12, "output_tokens_details": {"reasoning_tokens": 4},
                              "total_tokens": 42}
    # the job thinks (effort high) and carries the tools in chat's shape
    job = json.loads(r.xrange(f"{prefix}jobs:think")[-1][1]["job"])
    assert job["mode"] == "think" and job["tools"][0]["function"]["name"] == "get_weather"
    # not streamed: the same items
    t = threading.Thread(target=play_worker_error, args=(r, prefix, PLAYED))
    t.start()
    status, _, data = f.request("POST", "/v1/responses", body)
    t.join()
    assert status == 200, data
    obj = json.loads(data)
    assert [o["type"] for o in obj["output"]] == ["reasoning", "message", "function_call"]
    assert obj["output"][2]["call_id"] != fc["call_id"]  # unique per request
    # an error before any byte is a status; after one an `error` event
    late = PLAYED[:1] + [{"seq": 1, "type": "error", "code": "ENGINE_ERROR",
                          "message": "the backend failed"}]
    t = threading.Thread(target=play_worker_error, args=(r, prefix, late))
    t.start()
    evs = responses_sse(f, {**body, "stream": True})
    t.join()
    assert evs[-1]["type"] == "error" and evs[-1]["code"] == "ENGINE_ERROR"
    overloaded = [{"seq": 0, "type": "error", "code": "OVERLOADED", "message": "busy",
                   "retry_after_ms": 2000}]
    t = threading.Thread(target=play_worker_error, args=(r, prefix, overloaded))
    t.start()
    status, headers, data = f.request("POST", "/v1/responses", {**body, "stream": True})
    t.join()
    assert status == 503 and headers["Retry-After"] == "2"
    assert json.loads(data)["error"]["code"] == "OVERLOADED"


STRUCTURED_SCRIPT = r"""
const OpenAI = require('openai');
const [base, schema, tools] = [process.argv[2], JSON.parse(process.argv[4]), JSON.parse(process.argv[5])];
const client = new OpenAI({baseURL: base + '/v1', apiKey: 'sk-none', maxRetries: 0});
(async () => {
  const out = {};
  const r = await client.responses.create({input: 'Who are you?', max_output_tokens: 300,
    temperature: 0.8, seed: 11, reasoning: {effort: 'none'},
    text: {format: {type: 'json_schema', name: 'person', strict: true, schema}}});
  out.status = r.status;
  out.parsed = JSON.parse(r.output_text);
  const t = await client.responses.create({input: 'Weather?', max_output_tokens: 400,
    temperature: 1.0, seed: 12, reasoning: {effort: 'none'}, tool_choice: 'required',
    tools: tools.map(x => ({type: 'function', ...x.function}))});
  out.calls = t.output.filter(o => o.type === 'function_call');
  console.log(JSON.stringify(out));
})().catch(e => { console.error(String(e)); process.exit(1); });
"""


def test_responses_structured_npm(front, worker, tmp_path):  # noqa: F811
    """text.format json_schema and a forced function tool on the model with
    the real Qwen3 vocabulary: the JSON validates."""
    from test_structured import PERSON
    f = front()
    res = node(f, tmp_path, STRUCTURED_SCRIPT, json.dumps(PERSON), json.dumps(TOOLS[:1]),
               timeout=300)
    assert res["status"] == "completed"
    jsonschema.validate(res["parsed"], PERSON)
    (call,) = res["calls"]
    assert call["name"] == "get_weather" and call["call_id"].startswith("call_")
    jsonschema.validate(json.loads(call["arguments"]), TOOLS[0]["function"]["parameters"])


# ---- Ollama ----

OLLAMA_SCRIPT = r"""
const { Ollama } = require('ollama');
const [base, model] = [process.argv[2], process.argv[3]];
const o = new Ollama({host: base, headers: {Authorization: 'Bearer sk-test-0123456789'}});
const msgs = [{role: 'user', content: 'Tell me a story about a cat.'}];
const opts = {num_predict: 6, temperature: 0, repeat_penalty: 1.1, num_ctx: 4096, top_k: 5};
(async () => {
  const out = {};
  out.version = await o.version();
  out.list = await o.list();
  out.ps = await o.ps();
  out.show = await o.show({model});
  out.chat = await o.chat({model: model + ':latest', messages: msgs, options: opts, think: false,
                           keep_alive: '5m'});
  out.chat_parts = [];
  for await (const p of await o.chat({model, messages: msgs, options: opts, think: false, stream: true}))
    out.chat_parts.push(p);
  out.gen = await o.generate({model, prompt: 'Hello', system: 'Be brief.', options: opts, think: false});
  out.gen_parts = [];
  for await (const p of await o.generate({model, prompt: 'Hello', system: 'Be brief.', options: opts,
                                           think: false, stream: true}))
    out.gen_parts.push(p);
  out.think = await o.chat({model, messages: msgs, options: {num_predict: 3}, think: true});
  try { await o.chat({model: 'nope', messages: msgs}); }
  catch (e) { out.missing = {name: e.name, status: e.status_code, error: e.error}; }
  try { await o.chat({model, messages: [{role: 'user', content: 'x', images: ['aGk=']}]}); }
  catch (e) { out.images = {status: e.status_code, error: e.error}; }
  console.log(JSON.stringify(out));
})().catch(e => { console.error(String(e)); process.exit(1); });
"""


def test_ollama_npm_client(front, workers, redis_addr, prefix, tmp_path):  # noqa: F811
    tap(connect(redis_addr), f"{prefix}jobs:fast", f"{prefix}jobs:think")  # jobs stay readable
    workers("w1")
    f = keyed_front(front, tmp_path)
    res = node(f, tmp_path, OLLAMA_SCRIPT)
    r = connect(redis_addr)
    assert res["version"]["version"]
    assert [m["name"] for m in res["list"]["models"]] == [MODEL_NAME]
    assert [m["name"] for m in res["ps"]["models"]] == [MODEL_NAME]
    assert "tools" in res["show"]["capabilities"]
    # the details Ollama's clients show, from the worker's heartbeat: the
    # tiny checkpoint's format, dtype and parameter count (its safetensors
    # header's element counts, read here)
    want = {"format": "safetensors", "quantization_level": "F32",
            "parameter_size": "%.2fK" % (safetensors_params(MODEL / "model.safetensors") / 1e3)}
    for d in (res["show"]["details"], res["list"]["models"][0]["details"]):
        assert {k: d[k] for k in want} == want and d["family"] == "qwen3"
    chat = res["chat"]
    assert chat["done"] is True and chat["done_reason"] == "length" and chat["eval_count"] == 6
    assert chat["message"]["role"] == "assistant" and chat["model"] == MODEL_NAME
    # greedy: the stream carries the same text, ending with the counts
    parts = res["chat_parts"]
    assert all(not p["done"] for p in parts[:-1]) and parts[-1]["done"] is True
    assert "".join(p["message"]["content"] for p in parts) == chat["message"]["content"]
    assert parts[-1]["eval_count"] == 6 and parts[-1]["prompt_eval_count"] > 0
    gen = res["gen"]
    assert gen["done"] and "".join(p["response"] for p in res["gen_parts"]) == gen["response"]
    # the jobs: options mapped, think as the mode, the system prompt as a turn
    jobs = [json.loads(x["job"]) for p in ("fast", "think") for _, x in r.xrange(f"{prefix}jobs:{p}")]
    chat_job = next(j for j in jobs if j["messages"] == [{"role": "user",
                                                          "content": "Tell me a story about a cat."}]
                    and j.get("mode") == "no_think")
    assert chat_job["max_tokens"] == 6 and chat_job["temperature"] == 0
    assert chat_job["repetition_penalty"] == 1.1 and chat_job["top_k"] == 5
    assert chat_job["id"].startswith("ollama-")
    content, _ = texts(job_events(r, prefix, chat_job["id"]))
    assert content in (chat["message"]["content"],)
    gen_job = next(j for j in jobs if j["messages"][0] == {"role": "system", "content": "Be brief."})
    assert gen_job["messages"][1] == {"role": "user", "content": "Hello"}
    assert any(j.get("mode") == "think" and j["max_tokens"] == 3 for j in jobs)
    assert res["missing"]["name"] == "ResponseError" and res["missing"]["status"] == 404
    assert "nope" in res["missing"]["error"]
    assert res["images"]["status"] == 400 and "images" in res["images"]["error"]


OLLAMA_STRUCTURED = r"""
const { Ollama } = require('ollama');
const [base, schema] = [process.argv[2], JSON.parse(process.argv[4])];
const o = new Ollama({host: base});
(async () => {
  const out = {};
  const msgs = [{role: 'user', content: 'Who are you?'}];
  const r = await o.chat({messages: msgs, format: schema, think: false,
                          options: {num_predict: 300, seed: 11, temperature: 0.8}});
  out.done_reason = r.done_reason;
  out.parsed = JSON.parse(r.message.content);
  let text = '';
  for await (const p of await o.generate({prompt: 'Who are you?', format: 'json', think: false,
                                           stream: true, options: {num_predict: 300, seed: 3}}))
    text += p.response;
  out.json = JSON.parse(text);
  console.log(JSON.stringify(out));
})().catch(e => { console.error(String(e)); process.exit(1); });
"""


def test_ollama_structured_npm(front, worker, redis_addr, prefix, tmp_path):  # noqa: F811
    """format as a schema and as "json" on the real-vocabulary model."""
    from test_structured import PERSON
    f = front()
    res = node(f, tmp_path, OLLAMA_STRUCTURED, json.dumps(PERSON), timeout=300)
    assert res["done_reason"] == "stop"
    jsonschema.validate(res["parsed"], PERSON)
    assert isinstance(res["json"], dict)


def test_ollama_ndjson_played(front, redis_addr, prefix):  # noqa: F811
    """The test plays the worker: thinking and tool calls in Ollama's shape
    (arguments an object), NDJSON lines, errors as {"error": ...}."""
    f = front()
    r = connect(redis_addr)
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Weather?"}],
            "think": True}
    t = threading.Thread(target=play_worker_error, args=(r, prefix, PLAYED))
    t.start()
    c = f.conn()
    c.request("POST", "/api/chat", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = c.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "application/x-ndjson"
    lines = [json.loads(x) for x in resp.read().decode().splitlines() if x]
    c.close()
    t.join()
    assert [x["message"].get("thinking", "") for x in lines[:2]] == ["Let me", " think."]
    assert lines[2]["message"]["content"] == "Checking."
    last = lines[-1]
    assert last["done"] and last["done_reason"] == "stop"
    assert last["message"]["tool_calls"] == [{"function": {"name": "get_weather",
                                                           "arguments": {"city": "Paris"}}}]
    assert last["total_duration"] == 20_000_000 and last["eval_count"] == 12
    t = threading.Thread(target=play_worker_error, args=(r, prefix, PLAYED))
    t.start()
    status, _, data = f.request("POST", "/api/chat", {**body, "stream": False})
    t.join()
    one = json.loads(data)
    assert status == 200 and one["message"]["thinking"] == "Let me think."
    assert one["message"]["content"] == "Checking." and one["done"] is True
    # errors: {"error": "..."} with the status; malformed bodies too
    status, _, data = f.request("POST", "/api/chat", "{not json")
    assert status == 400 and set(json.loads(data)) == {"error"}
    status, _, data = f.request("POST", "/api/generate", {"model": MODEL_NAME, "prompt": "x",
                                                         "format": "yaml"})
    assert status == 400 and "format" in json.loads(data)["error"]
    status, _, data = f.request("POST", "/api/generate", {"model": MODEL_NAME})
    assert status == 200 and json.loads(data)["done_reason"] == "load"
    status, headers, _ = f.request("GET", "/api/chat")
    assert status == 405 and headers["Allow"] == "POST"


# ---- fields (issue 29 point 4) ----

def test_fields_vllm_sends(front, workers, redis_addr, prefix):  # noqa: F811
    """Unknown fields and values accepted but not applied: answered, named
    in X-Redlm-Ignored-Fields and in one log line per 10 s; refused with
    http_unknown_fields = refuse. The job's own fields over HTTP: priority
    (vLLM's lower first, the job's higher first), the thinking budget, the
    client's deadline_ms (past: finish_reason deadline); `reasoning` on an
    input message; `reasoning` emitted beside reasoning_content."""
    r = connect(redis_addr)
    tap(r, f"{prefix}jobs:fast", f"{prefix}jobs:think")
    workers("w1")
    f = front()
    msgs = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello", "reasoning": "They greet."},
            {"role": "user", "content": "Again"}]
    body = {"model": MODEL_NAME, "messages": msgs, "max_tokens": 4, "frobnicate": 1,
            "guided_regex": "[a-z]+", "min_tokens": 2, "stop_token_ids": [1],
            "skip_special_tokens": True, "chat_template_kwargs": {"enable_thinking": True,
                                                                  "custom": 1},
            "priority": 3, "max_thinking_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    c = f.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    resp = c.getresponse()
    assert resp.status == 200
    assert resp.getheader("X-Redlm-Ignored-Fields") == (
        "frobnicate, guided_regex, chat_template_kwargs.custom, "
        "stream_options.continuous_usage_stats")
    chunks = [json.loads(d) for d in sse_events(resp) if d != "[DONE]"]
    c.close()
    job_id = chunks[0]["id"]
    job = next(json.loads(x["job"]) for p in ("fast", "think")
               for _, x in r.xrange(f"{prefix}jobs:{p}") if json.loads(x["job"])["id"] == job_id)
    assert job["priority"] == -3 and job["max_thinking_tokens"] == 2 and job["mode"] == "think"
    assert job["messages"][1] == {"role": "assistant", "content": "Hello",
                                  "reasoning_content": "They greet."}
    assert not any(k in job for k in ("frobnicate", "guided_regex"))
    # vLLM's min_tokens and stop_token_ids are the job's own (test_fields.py runs them)
    assert job["min_tokens"] == 2 and job["stop_token_ids"] == [1]
    # reasoning beside reasoning_content, the same text
    for ch in chunks:
        d = ch["choices"][0]["delta"] if ch["choices"] else {}
        assert d.get("reasoning") == d.get("reasoning_content")
    # a deadline in the past: the worker ends the job at once
    status, headers, data = f.request("POST", "/v1/chat/completions",
                                      {"model": MODEL_NAME, "messages": msgs[:1], "max_tokens": 4,
                                       "deadline_ms": 1, "frobnicate": 2})
    assert status == 200 and json.loads(data)["choices"][0]["finish_reason"] == "deadline"
    assert headers["X-Redlm-Ignored-Fields"] == "frobnicate"
    # one log line for both requests (10 s apart at most one)
    assert f.text().count("fields accepted but not applied") == 1
    f.stop()
    f = front("--http-unknown-fields", "refuse")
    for extra, param in [({"frobnicate": 1}, "frobnicate"), ({"guided_regex": "x"}, "guided_regex"),
                         ({"chat_template_kwargs": {"custom": 1}}, "chat_template_kwargs.custom")]:
        status, _, data = f.request("POST", "/v1/chat/completions",
                                    {"model": MODEL_NAME, "messages": msgs, **extra})
        assert status == 400 and json.loads(data)["error"]["param"] == param, data
    # the same policy on the other APIs: Ollama's unknown fields are refused there too
    status, _, data = f.request("POST", "/api/chat", {"model": MODEL_NAME, "messages": msgs,
                                                      "frobnicate": 1})
    assert status == 400 and "frobnicate" in json.loads(data)["error"]


# ---- metrics and ops under vLLM's names (issue 29 point 6) ----

def metric(text, name, **labels):
    """The value of the sample name{labels} on a /metrics page."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        lab = dict(kv.split("=", 1) for kv in line[len(name) + 1:line.index("}")].split(","))
        if all(lab.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{labels} not on the page")


def test_vllm_metrics_and_ops(front, workers, redis_addr, prefix, tmp_path):  # noqa: F811
    """A request waiting for a worker is counted waiting; two requests
    (chat, Ollama generate) show in vLLM's families with the model's name;
    promtool accepts the page (but for the colon in vLLM's names); /ping
    and /version answer; the ops port serves the same page without a key."""
    import http.client
    import time
    from conftest import free_port, promtool_check
    ops = free_port()
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY} acme\n")
    f = front("--api-keys-file", str(keys), "--http-port", str(ops))
    auth = {"Authorization": f"Bearer {KEY}"}
    m = {"model_name": MODEL_NAME}

    def page():
        status, _, data = f.request("GET", "/metrics", headers=auth)
        assert status == 200
        return data.decode()

    got = {}

    def chat():
        got["chat"] = f.request("POST", "/v1/chat/completions",
                                {"model": MODEL_NAME, "max_tokens": 4, "mode": "no_think",
                                 "messages": [{"role": "user", "content": "Hi"}]}, headers=auth)
    t = threading.Thread(target=chat)
    t.start()
    deadline = time.time() + 20  # no worker yet: the job waits in its pool
    while f'vllm:num_requests_waiting{{model_name="{MODEL_NAME}"}} 1' not in page():
        assert time.time() < deadline, "the request never showed as waiting"
        time.sleep(0.05)
    workers("w1")
    t.join(60)
    status, _, data = got["chat"]
    assert status == 200, data
    usage = json.loads(data)["usage"]
    status, _, data = f.request("POST", "/api/generate", {"model": MODEL_NAME, "prompt": "Hi",
                                                         "stream": False, "think": False,
                                                         "options": {"num_predict": 3}},
                                headers=auth)
    assert status == 200, data
    gen = json.loads(data)
    # the latency histograms are the workers' sums (their heartbeats):
    # wait for the heartbeat after the second job
    deadline = time.time() + 30
    while True:
        text = page()
        if metric(text, "vllm:e2e_request_latency_seconds_count", **m) == 2:
            break
        assert time.time() < deadline, text
        time.sleep(0.05)
    promtool_check(text)
    assert metric(text, "vllm:time_to_first_token_seconds_count", **m) == 2
    assert metric(text, "vllm:e2e_request_latency_seconds_count", **m) == 2
    assert metric(text, "vllm:time_to_first_token_seconds_bucket", le="+Inf", **m) == 2
    assert metric(text, "vllm:prompt_tokens_total", **m) == \
        usage["prompt_tokens"] + gen["prompt_eval_count"]
    assert metric(text, "vllm:generation_tokens_total", **m) == \
        usage["completion_tokens"] + gen["eval_count"] == 7
    assert metric(text, "vllm:request_success_total", finished_reason="length", **m) == 2
    assert metric(text, "vllm:num_requests_running", **m) == 0
    assert metric(text, "vllm:num_requests_waiting", **m) == 0
    # the loopback ops port: the same families, no key
    c = http.client.HTTPConnection("127.0.0.1", ops, timeout=10)
    c.request("GET", "/metrics")
    r = c.getresponse()
    assert r.status == 200 and "vllm:e2e_request_latency_seconds_count" in r.read().decode()
    c.close()
    assert f.request("GET", "/ping")[0] == 200 and f.request("POST", "/ping")[0] == 200
    status, _, data = f.request("GET", "/version")
    assert status == 200 and json.loads(data)["version"]


def test_tokenize_detokenize(front, workers, redis_addr, prefix):  # noqa: F811
    """POST /tokenize and /detokenize with the dispatcher's tokenizer (its
    model option): text round-trips; a chat request's messages count as
    many tokens as the worker's usage says its prompt had; without a
    tokenizer, 404."""
    from conftest import MODEL
    r = connect(redis_addr)
    workers("w1")
    f = front("--model", str(MODEL))
    text = "Hello world, ünïcode <think> ok"
    status, _, data = f.request("POST", "/tokenize", {"model": MODEL_NAME, "prompt": text})
    assert status == 200, data
    tk = json.loads(data)
    assert tk["count"] == len(tk["tokens"]) > 3
    status, _, data = f.request("POST", "/detokenize", {"model": MODEL_NAME, "tokens": tk["tokens"]})
    assert status == 200 and json.loads(data)["prompt"] == text
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    for mode in ("think", "no_think"):
        status, _, data = f.request("POST", "/tokenize", {"model": MODEL_NAME, "messages": msgs,
                                                         "mode": mode})
        assert status == 200, data
        n = json.loads(data)["count"]
        status, _, data = f.request("POST", "/v1/chat/completions",
                                    {"model": MODEL_NAME, "messages": msgs, "mode": mode,
                                     "max_tokens": 2})
        assert status == 200 and json.loads(data)["usage"]["prompt_tokens"] == n, (mode, data)
    # max_model_len: the workers' context (their heartbeat), in /v1/models and /tokenize
    import time
    hb = json.loads(r.get(f"{prefix}worker:w1"))
    assert hb["max_model_len"] > 0
    deadline = time.time() + 20  # the dispatcher reads heartbeats every interval
    while "max_model_len" not in json.loads(f.request("GET", "/v1/models")[2])["data"][0]:
        assert time.time() < deadline, "no max_model_len in /v1/models"
        time.sleep(0.1)
    assert json.loads(f.request("GET", "/v1/models")[2])["data"][0]["max_model_len"] == \
        hb["max_model_len"]
    status, _, data = f.request("POST", "/tokenize", {"prompt": "x"})
    assert json.loads(data)["max_model_len"] == hb["max_model_len"]
    status, _, data = f.request("POST", "/detokenize", {"tokens": [-1]})
    assert status == 400 and json.loads(data)["error"]["param"] == "tokens"
    f.stop()
    f = front()
    status, _, data = f.request("POST", "/tokenize", {"prompt": "x"})
    assert status == 404 and "tokenizer" in json.loads(data)["error"]["message"]


def test_guided_decoding_vllm(front, worker):  # noqa: F811
    """vLLM's guided_json and guided_choice, on the real-vocabulary model:
    the answer validates against the schema / is one of the choices."""
    from test_structured import PERSON
    f = front()
    for seed in (1, 2):
        status, headers, data = f.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Who are you?"}], "max_tokens": 300,
            "seed": seed, "temperature": 0.8, "mode": "no_think", "guided_json": PERSON},
            timeout=120)
        assert status == 200 and "X-Redlm-Ignored-Fields" not in headers, data
        ch = json.loads(data)["choices"][0]
        assert ch["finish_reason"] == "stop"
        jsonschema.validate(json.loads(ch["message"]["content"]), PERSON)
        status, _, data = f.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Yes or no?"}], "max_tokens": 20,
            "seed": seed, "temperature": 1.0, "mode": "no_think",
            "guided_choice": ["yes", "no", "maybe \"so\""]}, timeout=120)
        assert status == 200, data
        assert json.loads(data)["choices"][0]["message"]["content"] in ("yes", "no", 'maybe "so"')
