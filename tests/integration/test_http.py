"""The OpenAI-compatible HTTP front door (dispatcher/http.c), end to end:
HTTP client -> front door -> redlm:requests -> dispatcher -> redlm:jobs:<pool>
-> worker (tiny model) -> redlm:out:<id> -> front door -> client.

What the tests prove:
  - streamed and non-streamed completions carry exactly the text of the
    job's events (the SSE chunks' deltas concatenated equal the events'
    deltas, content and reasoning apart), in the OpenAI chunk format, with
    finish_reason, the usage chunk and [DONE];
  - each event is written to the client as soon as it is in Redis: with the
    test playing the worker, event k+1 is only written after the client has
    read event k's chunk;
  - the wire format of the official SDKs: curl with the exact headers the
    `openai` Python SDK sends, and the `openai` npm package itself (pinned
    in tests/integration/node; skipped only when node is absent);
  - a client that disconnects cancels its job (redlm:cancel:<id>, and the
    worker's done says cancelled);
  - bad or missing keys get 401, tenants over their requests or tokens per
    minute get 429 with Retry-After; the counters are in Redis;
  - malformed bodies get 400 with the field named, oversized ones 413;
  - queue errors before the first byte become statuses (OVERLOADED -> 503
    with Retry-After), after it an error chunk;
  - /v1/models, /healthz, /metrics (the front door's counters and the
    dispatcher's).
The front door runs inside redlm-dispatcher (--http PORT).
"""
import http.client
import json
import os
import pathlib
import shutil
import socket
import subprocess
import threading
import time

import pytest

from conftest import (BUILD, Daemon, connect, tap, free_port, job_events, promtool_check,
                      stopped_at_end)

DISPATCHER = BUILD / "redlm-dispatcher"
MODEL_NAME = "tiny-qwen3"


class Front(Daemon):
    """The front door on a free port; .request() speaks HTTP to it."""

    kind = "front door"

    def __init__(self, addr, prefix, tmp, extra=()):
        self.port = free_port()
        self.addr = addr
        self.prefix = prefix
        args = [str(DISPATCHER), "--redis", addr, "--prefix", prefix, "--http", str(self.port),
                "--served-model-name", MODEL_NAME, "--log-level", "debug", "--http-port", "0",
                "--block-ms", "100", "--heartbeat-interval-ms", "500", *extra]
        self.start(args, pathlib.Path(tmp) / f"front-{self.port}.log", self.listening, timeout=20)

    def listening(self):
        """Listening, and its routing loop has reached Redis ("ready:"):
        /health is 503 until then, which a loaded machine makes long."""
        if "ready:" not in self.text():
            return False
        try:
            socket.create_connection(("127.0.0.1", self.port), 0.2).close()
            return True
        except OSError:
            return False

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=60):
        c = self.conn(timeout)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data


@pytest.fixture
def front(built, redis_addr, prefix, tmp_path):
    if not DISPATCHER.exists():
        pytest.skip(f"{DISPATCHER} is not built (run make)")
    yield from stopped_at_end(lambda *extra: Front(redis_addr, prefix, tmp_path, extra))


def sse_events(resp):
    """The data: payloads of an SSE response, as they arrive."""
    buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if line.startswith(b"data: "):
                    yield line[6:].decode()


def chat_stream(front, body, headers=None):
    c = front.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    assert r.status == 200, r.read()
    assert r.getheader("Content-Type").startswith("text/event-stream")
    chunks = []
    for data in sse_events(r):
        chunks.append(data if data == "[DONE]" else json.loads(data))
    c.close()
    return r, chunks


def deltas(events, field):
    return "".join(e["delta"].get(field, "") for e in events if e["type"] == "delta")


MSGS = [{"role": "user", "content": "Tell me a story about a cat."}]


@pytest.mark.parametrize("mode", ["no_think", "think"])
def test_stream_matches_events(front, workers, redis_addr, prefix, event_validator, mode):
    tap(connect(redis_addr), f"{prefix}jobs:fast", f"{prefix}jobs:think")  # read below
    workers("w1")
    f = front()
    body = {"model": MODEL_NAME, "messages": MSGS, "stream": True, "max_tokens": 24,
            "temperature": 0, "chat_template_kwargs": {"enable_thinking": mode == "think"},
            "stream_options": {"include_usage": True}}
    resp, chunks = chat_stream(f, body)
    assert chunks[-1] == "[DONE]"
    usage_chunk, final = chunks[-2], chunks[-3]
    deltas_ = chunks[:-3]
    job_id = resp.getheader("X-Request-Id")
    assert job_id.startswith("chatcmpl-")
    for c in chunks[:-1]:
        assert c["id"] == job_id and c["object"] == "chat.completion.chunk"
        assert c["model"] == MODEL_NAME and isinstance(c["created"], int)
        assert "usage" in c
    for c in deltas_:
        assert len(c["choices"]) == 1 and c["choices"][0]["index"] == 0
        assert c["choices"][0]["finish_reason"] is None and c["usage"] is None
    assert deltas_[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in deltas_[1:])
    events = job_events(connect(redis_addr), prefix, job_id)
    for e in events:
        event_validator.validate(e)
    done = events[-1]
    got_content = "".join(c["choices"][0]["delta"].get("content") or "" for c in deltas_)
    got_reason = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in deltas_)
    assert got_content == deltas(events, "content")
    assert got_reason == deltas(events, "reasoning_content")
    assert got_content + got_reason, "the model produced no text at all"
    # one chunk per event that carried text, in order
    texts = [e["delta"] for e in events if e["type"] == "delta" and any(e["delta"].values())]
    assert len(deltas_) == len(texts)
    assert final["choices"][0]["finish_reason"] == done["finish_reason"]
    assert usage_chunk["choices"] == []
    u = usage_chunk["usage"]
    assert u["prompt_tokens"] == done["usage"]["prompt_tokens"]
    assert u["completion_tokens"] == done["usage"]["completion_tokens"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["completion_tokens_details"]["reasoning_tokens"] == done["usage"]["reasoning_tokens"]
    # the thinking switch reached the job (a random model need not think)
    r = connect(redis_addr)
    jobs = [json.loads(f["job"]) for pool in ("fast", "think")
            for _, f in r.xrange(f"{prefix}jobs:{pool}")]
    assert [j["mode"] for j in jobs if j["id"] == job_id] == [mode]


def test_non_stream_matches_events(front, workers, redis_addr, prefix):
    workers("w1")
    f = front()
    status, headers, data = f.request("POST", "/v1/chat/completions", {
        "model": MODEL_NAME, "messages": MSGS, "max_completion_tokens": 16, "temperature": 0,
        "seed": 7, "mode": "think"})
    assert status == 200, data
    c = json.loads(data)
    assert c["object"] == "chat.completion" and c["id"] == headers["X-Request-Id"]
    events = job_events(connect(redis_addr), prefix, c["id"])
    done = events[-1]
    m = c["choices"][0]["message"]
    assert m["role"] == "assistant"
    assert (m["content"] or "") == deltas(events, "content")
    assert m.get("reasoning_content", "") == deltas(events, "reasoning_content")
    assert c["choices"][0]["finish_reason"] == done["finish_reason"]
    assert c["usage"]["completion_tokens"] == done["usage"]["completion_tokens"] <= 16
    assert c["usage"]["prompt_tokens"] == done["usage"]["prompt_tokens"]


def routed_job(r, prefix, timeout=10):
    """The (last) job the dispatcher put in pool fast or think, waiting up
    to timeout for one; None when none came."""
    job = None
    deadline = time.time() + timeout
    while job is None and time.time() < deadline:
        for pool in ("fast", "think"):
            for _, fields in r.xrange(f"{prefix}jobs:{pool}"):
                job = json.loads(fields["job"])
        time.sleep(0.02)
    return job


def test_each_event_is_sent_at_once(front, redis_addr, prefix):
    """The test plays the worker: it writes event k+1 only after the client
    has read event k's chunk, so any buffering on the way would hang."""
    f = front()
    r = connect(redis_addr)
    c = f.conn(timeout=10)
    c.request("POST", "/v1/chat/completions",
              body=json.dumps({"model": MODEL_NAME, "messages": MSGS, "stream": True}),
              headers={"Content-Type": "application/json"})
    # the dispatcher routes the job to a pool stream
    job = routed_job(r, prefix)
    assert job, "the job never reached a pool"
    out = f"{prefix}out:{job['id']}"
    words = ["Once", " upon", " a", " time", ", a", " cat", "."]
    r.xadd(out, {"event": json.dumps({"seq": 0, "type": "delta", "delta": {"content": words[0]},
                                      "token_ids": [1]})}, id="0-1")
    resp = c.getresponse()
    assert resp.status == 200
    it = sse_events(resp)
    for k, w in enumerate(words):
        chunk = json.loads(next(it))
        assert chunk["choices"][0]["delta"]["content"] == w
        nxt = ({"seq": k + 1, "type": "delta", "delta": {"content": words[k + 1]},
                "token_ids": [k + 2]} if k + 1 < len(words) else
               {"seq": k + 1, "type": "done", "finish_reason": "stop",
                "usage": {"prompt_tokens": 3, "completion_tokens": len(words),
                          "reasoning_tokens": 0, "cached_prompt_tokens": 0},
                "cached": False, "timings": {"queue_ms": 0, "ttft_ms": 0, "total_ms": 0},
                "tool_calls": []})
        r.xadd(out, {"event": json.dumps(nxt)}, id=f"0-{k + 2}")
    final = json.loads(next(it))
    assert final["choices"][0]["finish_reason"] == "stop"
    assert next(it) == "[DONE]"
    c.close()


def play_worker_error(r, prefix, events, timeout=10):
    """Waits for the next job in a pool and writes events (dicts) for it."""
    deadline = time.time() + timeout
    seen = set()
    while time.time() < deadline:
        for pool in ("fast", "think"):
            for _, fields in r.xrange(f"{prefix}jobs:{pool}"):
                job = json.loads(fields["job"])
                if job["id"] in seen:
                    continue
                if r.exists(f"{prefix}out:{job['id']}"):
                    seen.add(job["id"])
                    continue
                for i, e in enumerate(events):
                    r.xadd(f"{prefix}out:{job['id']}", {"event": json.dumps(e)}, id=f"0-{i + 1}")
                return job["id"]
        time.sleep(0.02)
    raise AssertionError("no job came")


def test_queue_errors_map_to_statuses(front, redis_addr, prefix):
    f = front()
    r = connect(redis_addr)
    overloaded = [{"seq": 0, "type": "error", "code": "OVERLOADED",
                   "message": "pool fast has 1000 jobs waiting", "retry_after_ms": 2500}]
    t = threading.Thread(target=play_worker_error, args=(r, prefix, overloaded))
    t.start()
    status, headers, data = f.request("POST", "/v1/chat/completions",
                                      {"model": MODEL_NAME, "messages": MSGS})
    t.join()
    assert status == 503 and headers["Retry-After"] == "3"
    err = json.loads(data)["error"]
    assert err["code"] == "OVERLOADED" and err["message"] == "pool fast has 1000 jobs waiting"
    # streamed: the status too, since no byte was sent yet
    t = threading.Thread(target=play_worker_error, args=(r, prefix, overloaded))
    t.start()
    status, headers, data = f.request("POST", "/v1/chat/completions",
                                      {"model": MODEL_NAME, "messages": MSGS, "stream": True})
    t.join()
    assert status == 503 and headers["Retry-After"] == "3"
    # after a delta: an error chunk, then [DONE]
    late = [{"seq": 0, "type": "delta", "delta": {"content": "Hi"}, "token_ids": [1]},
            {"seq": 1, "type": "error", "code": "ENGINE_ERROR", "message": "the backend failed"}]
    t = threading.Thread(target=play_worker_error, args=(r, prefix, late))
    t.start()
    resp, chunks = chat_stream(f, {"model": MODEL_NAME, "messages": MSGS, "stream": True})
    t.join()
    assert chunks[0]["choices"][0]["delta"]["content"] == "Hi"
    assert chunks[1] == {"error": {"message": "the backend failed", "type": "server_error",
                                   "param": None, "code": "ENGINE_ERROR"}}
    assert chunks[2] == "[DONE]"


# The headers the official `openai` Python SDK (1.x) sends with every request.
SDK_HEADERS = [
    "Accept: application/json",
    "Content-Type: application/json",
    "User-Agent: OpenAI/Python 1.54.4",
    "X-Stainless-Lang: python",
    "X-Stainless-Package-Version: 1.54.4",
    "X-Stainless-OS: Linux",
    "X-Stainless-Arch: x64",
    "X-Stainless-Runtime: CPython",
    "X-Stainless-Runtime-Version: 3.11.2",
    "X-Stainless-Async: false",
    "x-stainless-retry-count: 0",
    "Accept-Encoding: gzip, deflate",
    "Connection: keep-alive",
]


def curl(front, body, key=None, path="/v1/chat/completions"):
    args = ["curl", "-sS", "-N", "-i", f"http://127.0.0.1:{front.port}{path}"]
    for h in SDK_HEADERS + ([f"Authorization: Bearer {key}"] if key else []):
        args += ["-H", h]
    if body is not None:
        args += ["--data-binary", json.dumps(body, separators=(",", ":"))]
    out = subprocess.run(args, capture_output=True, timeout=60, check=True).stdout.decode()
    head, _, payload = out.partition("\r\n\r\n")
    return int(head.split()[1]), head, payload


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_sdk_wire_format_curl(front, workers, redis_addr, prefix, tmp_path):
    workers("w1")
    keys = tmp_path / "keys"
    keys.write_text("sk-test-0123456789 acme\n")
    f = front("--api-keys-file", str(keys))
    status, head, payload = curl(f, {"messages": MSGS, "model": MODEL_NAME, "stream": True,
                                     "max_tokens": 8}, key="sk-test-0123456789")
    assert status == 200 and "text/event-stream" in head
    lines = [l[6:] for l in payload.split("\n") if l.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(l) for l in lines[:-1]]
    job_id = chunks[0]["id"]
    events = job_events(connect(redis_addr), prefix, job_id)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == deltas(events, "content")
    status, head, payload = curl(f, {"messages": MSGS, "model": MODEL_NAME, "max_tokens": 8},
                                 key="sk-test-0123456789")
    assert status == 200 and "application/json" in head
    assert json.loads(payload)["object"] == "chat.completion"
    status, head, payload = curl(f, None, key="sk-test-0123456789", path="/v1/models")
    assert status == 200 and json.loads(payload)["data"][0]["id"] == MODEL_NAME


NODE_SCRIPT = r"""
const OpenAI = require('openai');
const client = new OpenAI({baseURL: process.argv[2], apiKey: 'sk-test-0123456789', maxRetries: 0});
(async () => {
  const out = {};
  const models = await client.models.list();
  out.models = models.data.map(m => m.id);
  const stream = await client.chat.completions.create({
    model: process.argv[3], messages: [{role: 'user', content: 'Tell me a story about a cat.'}],
    max_tokens: 10, stream: true, stream_options: {include_usage: true}});
  out.chunks = [];
  for await (const chunk of stream) out.chunks.push(chunk);
  out.plain = await client.chat.completions.create({
    model: process.argv[3], messages: [{role: 'user', content: 'Hi'}], max_tokens: 6});
  try {
    await client.chat.completions.create({model: process.argv[3], messages: [], max_tokens: 6});
  } catch (e) { out.error = {status: e.status, code: e.code, param: e.param}; }
  console.log(JSON.stringify(out));
})().catch(e => { console.error(String(e)); process.exit(1); });
"""


NODE_DIR = pathlib.Path(__file__).resolve().parent / "node"


def npm_openai():
    """tests/integration/node with the `openai` version its package-lock.json
    pins (make deps runs npm ci there; done here if it has not been). None
    when node is absent."""
    if not shutil.which("node"):
        return None
    if not (NODE_DIR / "node_modules" / "openai").exists():
        assert shutil.which("npm"), "node is installed but npm is not: run make deps"
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR,
                       capture_output=True, timeout=300, check=True)
    return NODE_DIR


def run_node_client(front, workers, tmp_path, script, front_flags=(), args=(), timeout=120):
    """Runs the JavaScript script with node and the pinned `openai` npm
    package against a front door (tenant key sk-test-0123456789, then
    front_flags) with one worker behind it; its argv: the base URL, the
    model name, then args. Skips without node. Returns the JSON it prints."""
    d = npm_openai()
    if d is None:
        pytest.skip("node is not installed (make deps installs nodejs): cannot run the `openai` npm client")
    workers("w1")
    keys = tmp_path / "keys"
    keys.write_text("sk-test-0123456789 acme\n")
    f = front("--api-keys-file", str(keys), *front_flags)
    path = tmp_path / "client.js"
    path.write_text(script)
    out = subprocess.run(["node", str(path), f"http://127.0.0.1:{f.port}/v1", MODEL_NAME, *args],
                         capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "NODE_PATH": str(d / "node_modules")})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_openai_npm_client(front, workers, redis_addr, prefix, tmp_path):
    res = run_node_client(front, workers, tmp_path, NODE_SCRIPT)
    assert res["models"] == [MODEL_NAME]
    chunks = res["chunks"]
    assert chunks[-1]["usage"]["completion_tokens"] >= 1
    events = job_events(connect(redis_addr), prefix, chunks[0]["id"])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == deltas(events, "content")
    plain = res["plain"]
    pe = job_events(connect(redis_addr), prefix, plain["id"])
    assert (plain["choices"][0]["message"]["content"] or "") == deltas(pe, "content")
    assert res["error"]["status"] == 400 and res["error"]["param"] == "messages"


def post_and_hang_up(port, path, body, until, headers=""):
    """POSTs body (a dict) to path on a raw socket, reads until the bytes
    until have come, then closes the connection: a client that goes away
    mid-stream. headers: extra header lines, each ending in CRLF. Returns
    the request's id (X-Request-Id)."""
    s = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body)
    s.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}"
               f"Content-Type: application/json\r\n"
               f"Content-Length: {len(data)}\r\n\r\n{data}").encode())
    got = b""
    while until not in got:
        got += s.recv(65536)
    job_id = [l.split(":", 1)[1].strip() for l in got.decode().split("\r\n")
              if l.lower().startswith("x-request-id:")][0]
    s.close()
    return job_id


def stream_and_hang_up(port, messages, headers=""):
    """A streamed chat completion of messages (4000 tokens wanted), left
    after its first data: line. Returns the job id."""
    return post_and_hang_up(port, "/v1/chat/completions",
                            {"model": MODEL_NAME, "messages": messages, "stream": True,
                             "max_tokens": 4000, "ignore_eos": True}, b"data: ", headers)


def test_disconnect_cancels(front, workers, redis_addr, prefix):
    workers("w1")
    f = front()
    r = connect(redis_addr)
    job_id = stream_and_hang_up(f.port, MSGS)
    deadline = time.time() + 10
    while time.time() < deadline and not r.exists(f"{prefix}cancel:{job_id}"):
        time.sleep(0.02)
    assert r.get(f"{prefix}cancel:{job_id}") == "1"
    assert 0 < r.ttl(f"{prefix}cancel:{job_id}") <= 600
    done = job_events(r, prefix, job_id)[-1]
    assert done["finish_reason"] == "cancelled"
    assert done["usage"]["completion_tokens"] < 4000


def test_auth_and_rate_limits(front, workers, redis_addr, prefix, tmp_path):
    workers("w1")
    keys = tmp_path / "keys"
    keys.write_text("# key tenant rpm tpm\n"
                    "sk-aaaa-00000001 team-a 2\n"
                    "sk-bbbb-00000002 team-b 0 5\n"
                    "sk-cccc-00000003 team-c\n")
    f = front("--api-keys-file", str(keys))
    body = {"model": MODEL_NAME, "messages": MSGS, "max_tokens": 4}
    # no key, a wrong key, a malformed header
    for h in ({}, {"Authorization": "Bearer sk-nope-00000000"}, {"Authorization": "sk-aaaa-00000001"}):
        status, headers, data = f.request("POST", "/v1/chat/completions", body, h)
        assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
        assert json.loads(data)["error"]["code"] == "invalid_api_key"
    status, _, _ = f.request("GET", "/v1/models")
    assert status == 401
    # requests per minute: 2 pass, the 3rd is refused (all in one minute
    # window: start early enough in it)
    a = {"Authorization": "Bearer sk-aaaa-00000001"}
    r = connect(redis_addr)
    if time.time() % 60 > 45:
        time.sleep(60.5 - time.time() % 60)
    minute = int(time.time() // 60)
    statuses = [f.request("POST", "/v1/chat/completions", body, a) for _ in range(3)]
    assert int(time.time() // 60) == minute
    assert [s[0] for s in statuses[:2]] == [200, 200]
    status, headers, data = statuses[2]
    assert status == 429, data
    assert 1 <= int(headers["Retry-After"]) <= 60
    err = json.loads(data)["error"]
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "requests"
    key = f"{prefix}ratelimit:team-a:rpm:{minute}"
    assert int(r.get(key)) == 3 and 0 < r.ttl(key) <= 120
    # tokens per minute: the first request uses more than 5, the next is refused
    b = {"Authorization": "Bearer sk-bbbb-00000002"}
    if time.time() % 60 > 45:
        time.sleep(60.5 - time.time() % 60)
    minute = int(time.time() // 60)
    status, _, data = f.request("POST", "/v1/chat/completions", body, b)
    assert status == 200, data
    used = json.loads(data)["usage"]["total_tokens"]
    assert used > 5
    assert int(r.get(f"{prefix}ratelimit:team-b:tpm:{minute}")) == used
    status, headers, data = f.request("POST", "/v1/chat/completions", body, b)
    assert int(time.time() // 60) == minute
    assert status == 429 and json.loads(data)["error"]["type"] == "tokens"
    assert 1 <= int(headers["Retry-After"]) <= 60
    # no limits
    c = {"Authorization": "Bearer sk-cccc-00000003"}
    for _ in range(3):
        status, _, _ = f.request("POST", "/v1/chat/completions", body, c)
        assert status == 200
    status, _, data = f.request("GET", "/v1/models", None, c)
    assert status == 200 and json.loads(data)["data"][0]["id"] == MODEL_NAME
    # the file is re-read when it changes (looked at once a second)
    keys.write_text("sk-dddd-00000004 team-d\n")
    deadline = time.time() + 30  # its next look, however late a loaded machine makes it
    while f.request("GET", "/v1/models", None, c)[0] != 401:
        assert time.time() < deadline, "the changed keys file was not re-read"
        time.sleep(0.05)
    status, _, _ = f.request("GET", "/v1/models", None, {"Authorization": "Bearer sk-dddd-00000004"})
    assert status == 200
    # a broken file keeps the keys in force (and says so in the log)
    keys.write_text("sk-eeee-00000005\n")
    deadline = time.time() + 30  # a request looks at the file, at most once a second
    while "keeping the old API keys" not in f.log_path.read_text():
        status, _, _ = f.request("GET", "/v1/models", None,
                                 {"Authorization": "Bearer sk-dddd-00000004"})
        assert status == 200
        assert time.time() < deadline, "the broken keys file was not looked at"
        time.sleep(0.05)
    status, _, _ = f.request("GET", "/v1/models", None, {"Authorization": "Bearer sk-dddd-00000004"})
    assert status == 200


BAD = [
    ("{", 400, "INVALID_JSON", None),
    ("[1]", 400, "NOT_OBJECT", None),
    ({"model": MODEL_NAME}, 400, "MISSING_FIELD", "messages"),
    ({"model": "gpt-4o", "messages": MSGS}, 404, "model_not_found", "model"),
    ({"model": MODEL_NAME, "messages": MSGS, "temperature": 3}, 400, "OUT_OF_RANGE", "temperature"),
    ({"model": MODEL_NAME, "messages": MSGS, "n": 65}, 400, "OUT_OF_RANGE", "n"),  # 1..64 (issue 29)
    ({"model": MODEL_NAME, "messages": MSGS, "max_tokens": 100000}, 400, "OUT_OF_RANGE", "max_tokens"),
    ({"model": MODEL_NAME, "messages": MSGS, "frobnicate": 1}, 400, "UNKNOWN_FIELD", "frobnicate"),
    ({"model": MODEL_NAME, "messages": [{"role": "user"}]}, 400, "MISSING_FIELD", "messages[0].content"),
    ({"model": MODEL_NAME, "messages": MSGS * 9}, 400, "OUT_OF_RANGE", "messages"),
]


def test_malformed_requests(front, redis_addr, prefix):
    f = front("--max-body-kb", "1", "--max-messages", "8", "--http-max-tokens", "4096",
              "--http-unknown-fields", "refuse")
    for body, status, code, param in BAD:
        st, headers, data = f.request("POST", "/v1/chat/completions", body)
        err = json.loads(data)["error"]
        assert (st, err["code"], err["param"]) == (status, code, param), (body, data)
        assert err["message"] and err["type"] == "invalid_request_error"
        assert headers["Content-Type"] == "application/json"
    st, _, data = f.request("POST", "/v1/chat/completions",
                            {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x" * 2000}]})
    assert st == 413 and json.loads(data)["error"]["code"] == "JOB_TOO_LARGE"
    st, headers, _ = f.request("GET", "/v1/chat/completions")
    assert st == 405 and headers["Allow"] == "POST"
    st, _, _ = f.request("GET", "/v1/nothing")
    assert st == 404
    # nothing reached the queue
    assert connect(redis_addr).xlen(f"{prefix}requests") == 0


def test_models_healthz_metrics(front, workers, prefix):
    workers("w1")
    f = front()
    st, _, data = f.request("GET", "/v1/models")
    assert st == 200
    m = json.loads(data)
    assert m["object"] == "list" and [x["id"] for x in m["data"]] == [MODEL_NAME]
    st, _, data = f.request("GET", f"/v1/models/{MODEL_NAME}")
    assert st == 200 and json.loads(data)["id"] == MODEL_NAME
    deadline = time.time() + 10
    while True:
        st, _, data = f.request("GET", "/healthz")
        if st == 200 or time.time() > deadline:
            break
        time.sleep(0.1)
    assert st == 200 and data == b"ok\n"
    st, _, _ = f.request("POST", "/v1/chat/completions",
                         {"model": MODEL_NAME, "messages": MSGS, "max_tokens": 2})
    assert st == 200
    st, _, data = f.request("GET", "/metrics")
    text = data.decode()
    assert st == 200
    assert 'redlm_http_requests_total{code="200"}' in text
    assert 'redlm_http_chat_requests_total{stream="false"} 1' in text
    assert "redlm_http_first_event_seconds_count 1" in text
    # the dispatcher's own metrics come through the hook
    assert "redlm_dispatcher_" in text
    # HELP and TYPE on every family, base units: promtool is satisfied
    promtool_check(text)
    assert "redlm_dispatcher_pool_wait_seconds{" in text and "_ms" not in text


def test_slow_events_outlive_idle_timeout(front, redis_addr, prefix):
    """http_idle_timeout_s closes idle keep-alive connections, never a
    request that is waiting for its job's events."""
    f = front("--http-idle-timeout-s", "1")
    r = connect(redis_addr)
    delta = {"seq": 0, "type": "delta", "delta": {"content": "late"}, "token_ids": [1]}
    done = {"seq": 1, "type": "done", "finish_reason": "stop",
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "reasoning_tokens": 0,
                      "cached_prompt_tokens": 0},
            "cached": False, "timings": {"queue_ms": 0, "ttft_ms": 0, "total_ms": 0},
            "tool_calls": []}

    def slow_worker():
        time.sleep(2.5)
        jid = play_worker_error(r, prefix, [delta])
        time.sleep(2.5)
        r.xadd(f"{prefix}out:{jid}", {"event": json.dumps(done)}, id="0-2")

    t = threading.Thread(target=slow_worker)
    t.start()
    resp, chunks = chat_stream(f, {"model": MODEL_NAME, "messages": MSGS, "stream": True})
    t.join()
    assert chunks[0]["choices"][0]["delta"]["content"] == "late"
    assert chunks[1]["choices"][0]["finish_reason"] == "stop" and chunks[2] == "[DONE]"
    # and an idle keep-alive connection is closed after a request ended
    s = socket.create_connection(("127.0.0.1", f.port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    s.settimeout(10)
    got = s.recv(65536)
    assert got.startswith(b"HTTP/1.1 400")
    time.sleep(2.5)
    assert s.recv(65536) == b"", "the idle connection was kept open"
    s.close()


def test_dispatcher_backpressure_is_503(front, redis_addr, prefix):
    """The real dispatcher's OVERLOADED (max_waiting) comes back as 503 with
    the Retry-After it asked for; no worker runs, so jobs pile up."""
    f = front("--max-waiting", "1", "--retry-after-ms", "2000")
    held = []
    body = json.dumps({"model": MODEL_NAME, "messages": MSGS})
    for _ in range(2):
        s = socket.create_connection(("127.0.0.1", f.port))
        s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        held.append(s)
    r = connect(redis_addr)
    deadline = time.time() + 10
    while time.time() < deadline and sum(r.xlen(f"{prefix}jobs:{p}") for p in ("fast", "think")) < 2:
        time.sleep(0.02)
    status, headers, data = f.request("POST", "/v1/chat/completions", body)
    assert status == 503, data
    assert headers["Retry-After"] == "2"
    assert json.loads(data)["error"]["code"] == "OVERLOADED"
    for s in held:
        s.close()


def test_timeout_is_504_and_cancels(front, redis_addr, prefix):
    """No worker: after http_timeout_s (plus the 5 s the worker gets to
    report its deadline) the client gets 504 and the job is cancelled; the
    job carried the deadline too."""
    f = front("--http-timeout-s", "1")
    t0 = time.time()
    status, headers, data = f.request("POST", "/v1/chat/completions",
                                      {"model": MODEL_NAME, "messages": MSGS})
    assert status == 504 and json.loads(data)["error"]["code"] == "DEADLINE_EXCEEDED"
    assert 5.5 <= time.time() - t0 < 15
    r = connect(redis_addr)
    job_id = headers["X-Request-Id"]
    assert r.get(f"{prefix}cancel:{job_id}") == "1"
    jobs = [json.loads(x["job"]) for p in ("fast", "think") for _, x in r.xrange(f"{prefix}jobs:{p}")]
    (job,) = [j for j in jobs if j["id"] == job_id]
    assert 0 < job["deadline_ms"] - t0 * 1000 < 3000


def test_tool_calls_reach_the_client(front, redis_addr, prefix):
    """A done event with tool calls (the worker's chat parser found them):
    streamed as a tool_calls delta with indices and finish_reason
    tool_calls; not streamed as message.tool_calls with content null."""
    f = front()
    r = connect(redis_addr)
    calls = [{"id": "call_0", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]
    done = {"seq": 0, "type": "done", "finish_reason": "stop",
            "usage": {"prompt_tokens": 30, "completion_tokens": 12, "reasoning_tokens": 0,
                      "cached_prompt_tokens": 0},
            "cached": False, "timings": {"queue_ms": 0, "ttft_ms": 0, "total_ms": 0},
            "tool_calls": calls}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    body = {"model": MODEL_NAME, "messages": MSGS, "tools": tools}
    t = threading.Thread(target=play_worker_error, args=(r, prefix, [done]))
    t.start()
    status, _, data = f.request("POST", "/v1/chat/completions", body)
    t.join()
    assert status == 200, data
    ch = json.loads(data)["choices"][0]
    assert ch["finish_reason"] == "tool_calls"
    got = ch["message"]["tool_calls"]
    # the front door gives each call an id unique to its request (issue 29)
    assert got[0]["id"].startswith("call_") and got[0]["id"] != calls[0]["id"]
    assert ch["message"]["content"] is None and got == [{**calls[0], "id": got[0]["id"]}]
    t = threading.Thread(target=play_worker_error, args=(r, prefix, [done]))
    t.start()
    resp, chunks = chat_stream(f, {**body, "stream": True})
    t.join()
    delta = chunks[0]["choices"][0]["delta"]
    assert delta["role"] == "assistant"
    sid = delta["tool_calls"][0]["id"]
    assert sid.startswith("call_") and sid != got[0]["id"]
    assert delta["tool_calls"] == [{**calls[0], "id": sid, "index": 0}]
    assert chunks[1]["choices"][0]["finish_reason"] == "tool_calls" and chunks[2] == "[DONE]"
    # the tools went into the job
    jobs = [json.loads(x["job"]) for p in ("fast", "think") for _, x in r.xrange(f"{prefix}jobs:{p}")]
    assert all(j["tools"] == tools for j in jobs)


def test_disconnect_before_first_event_cancels(front, redis_addr, prefix):
    """The client leaves while the job still waits in its pool (no worker):
    the front door notices within its poll interval and cancels."""
    f = front()
    r = connect(redis_addr)
    s = socket.create_connection(("127.0.0.1", f.port))
    body = json.dumps({"model": MODEL_NAME, "messages": MSGS, "stream": True})
    s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    job = routed_job(r, prefix)
    assert job
    s.close()
    deadline = time.time() + 5
    while time.time() < deadline and not r.exists(f"{prefix}cancel:{job['id']}"):
        time.sleep(0.02)
    assert r.get(f"{prefix}cancel:{job['id']}") == "1"
    st, _, data = f.request("GET", "/metrics")
    assert "redlm_http_client_cancels_total 1" in data.decode()
