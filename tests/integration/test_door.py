"""The front door under hostile and careless clients, and what its process
leaves behind (issue 26: points 5, 6 and 8), against a real redis-server and
real redlm-dispatcher / redlm-worker processes.

What the tests prove:
  - every pooled Redis connection survives a Redis restart: while Redis is
    away /health is 503 on both ports; once it is back the first /health
    and the first request succeed, and so do the next 40;
  - 300 slow-header connections, reopened as they close, do not take the
    API down: /health and authenticated requests keep being answered (all
    of them, p99 measured and bounded), and the warnings are a few summary lines,
    not one per connection;
  - wrong API keys are throttled per client address (429 with Retry-After,
    the key not even looked at), while another address is not;
  - conflicting Content-Length headers (and Content-Length beside
    Transfer-Encoding) are refused and the connection closed;
  - a client that half-closes after a full request gets its answer,
    streamed and not, while one that closes for good still cancels its job;
  - kill -9 of the dispatcher whose HTTP clients were streaming: the
    workers cancel those jobs within two lease periods (the front door's
    client lease), while a live front door's long job runs to its end;
  - ports: the worker and the dispatcher default to different ops ports
    (the README's by-hand steps start, in a network namespace of their
    own), a port already taken stops the start with a message naming it,
    and a second dispatcher cannot share a port (no SO_REUSEPORT);
  - a checkpoint with NaN weights gives an error event (and `redlm run`
    an error), never a token picked from NaN logits;
  - the dispatcher announces a served model once, not at every refresh.
"""
import http.client
import json
import os
import pathlib
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest
import redis

from conftest import (BUILD, CLI, MODEL, WORKER, Daemon, RedisServer, connect, free_port,
                      job_events, wait_for, wait_ping)
from slow_flood import SlowFlood  # tests/bench, on the path conftest sets
from test_http import DISPATCHER, MODEL_NAME, Front, sse_events

MSGS = [{"role": "user", "content": "Tell me a story about a cat."}]
KEY = "sk-door-0123456789"


class FakeWorker:
    """Plays the workers: answers every job that reaches a pool stream with
    one delta and a done, after `delay` seconds; rides out Redis restarts."""

    def __init__(self, addr, prefix, delay=0.0):
        self.addr, self.prefix, self.delay = addr, prefix, delay
        self.answered, self.stop = 0, threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        r = connect(self.addr)
        last = {f"{self.prefix}jobs:fast": "0-0", f"{self.prefix}jobs:think": "0-0"}
        while not self.stop.is_set():
            try:
                got = r.xread(last, block=100, count=100)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                    redis.exceptions.BusyLoadingError):
                time.sleep(0.05)
                continue
            for key, entries in got:
                for eid, fields in entries:
                    last[key] = eid
                    threading.Thread(target=self.answer, args=(json.loads(fields["job"]),),
                                     daemon=True).start()

    def answer(self, job):
        if self.delay:
            time.sleep(self.delay)
        r = connect(self.addr)
        out = f"{self.prefix}out:{job['id']}"
        evs = [{"seq": 0, "type": "delta", "delta": {"content": "ok"}, "token_ids": [1]},
               {"seq": 1, "type": "done", "finish_reason": "stop",
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "reasoning_tokens": 0,
                          "cached_prompt_tokens": 0},
                "cached": False, "timings": {"queue_ms": 0, "ttft_ms": 0, "total_ms": 0},
                "tool_calls": []}]
        for i, e in enumerate(evs):
            for _ in range(200):
                try:
                    r.xadd(out, {"event": json.dumps(e)}, id=f"0-{i + 1}")
                    break
                except redis.exceptions.ResponseError:
                    break  # written already
                except (redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError):
                    time.sleep(0.05)
        self.answered += 1

    def close(self):
        self.stop.set()
        self.t.join(5)


@pytest.fixture
def fake(redis_addr, prefix):
    made = []

    def start(addr=None, **kw):
        w = FakeWorker(addr or redis_addr, prefix, **kw)
        made.append(w)
        return w

    yield start
    for w in made:
        w.close()


@pytest.fixture
def door(built, redis_addr, prefix, tmp_path):
    """start(*flags, addr=None) -> Front; all stopped at the end."""
    if not DISPATCHER.exists():
        pytest.skip(f"{DISPATCHER} is not built (run make)")
    made = []

    def start(*extra, addr=None):
        f = Front(addr or redis_addr, prefix, tmp_path, extra)
        made.append(f)
        return f

    yield start
    for f in made:
        f.stop()


def get(port, path, headers=None, timeout=10, source=None):
    """(status, body) of GET path; source: the local address to bind."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout,
                                   source_address=(source, 0) if source else None)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def chat(port, body=None, headers=None, timeout=30, source=None):
    """(status, headers, body) of one POST /v1/chat/completions."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout,
                                   source_address=(source, 0) if source else None)
    try:
        c.request("POST", "/v1/chat/completions",
                  body=json.dumps(body or {"model": MODEL_NAME, "messages": MSGS}),
                  headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def metric(port, name, headers=None):
    status, body = get(port, "/metrics", headers)
    assert status == 200, body
    for line in body.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not on /metrics")


# --- Redis restarts ---------------------------------------------------------

def test_pooled_connections_reconnect_after_redis_restart(door, fake, prefix, tmp_path):
    srv = RedisServer(tmp_path / "redis", aof=True)
    try:
        ops = free_port()
        f = door("--http-port", str(ops), "--redis-backoff-max-ms", "100", addr=srv.addr)
        fake(addr=srv.addr)
        r = connect(srv.addr)
        # eight requests at once leave eight connections in the pool
        res = []
        ts = [threading.Thread(target=lambda: res.append(chat(f.port)[0])) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert res == [200] * 8
        assert get(f.port, "/health")[0] == 200 and get(ops, "/health")[0] == 200
        srv.stop(kill=True)
        # Redis away: unhealthy on both ports, every probe
        for _ in range(5):
            assert get(f.port, "/health")[0] == 503
            assert get(ops, "/health")[0] == 503
        n_up = f.text().count(": connected")
        srv.start()
        # back: once the dispatcher's own loop is (its log says so), the
        # first probe and the first request succeed
        wait_for(lambda: f.text().count(": connected") > n_up, "the dispatcher reconnected")
        assert get(f.port, "/health")[0] == 200
        assert get(ops, "/health")[0] == 200
        status, _, data = chat(f.port)
        assert status == 200, data
        statuses = [chat(f.port)[0] for _ in range(40)]
        assert statuses == [200] * 40, statuses
    finally:
        srv.stop()


# --- slow clients -------------------------------------------------------------

def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))]


def timed(fn):
    t = time.time()
    try:
        ok = fn()
    except OSError:
        ok = False
    return (time.time() - t) if ok else float("inf")


def test_slow_header_flood_leaves_the_api_up(door, fake, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY} acme\n")
    f = door("--api-keys-file", str(keys))
    fake()
    auth = {"Authorization": f"Bearer {KEY}"}
    assert chat(f.port, headers=auth)[0] == 200
    # 300 connections: 150 from one address, 150 from 15 more, reopened as
    # they are closed; health probes and requests come from 127.0.0.1
    sources = ["127.0.0.2"] * 15 + [f"127.0.0.{3 + k}" for k in range(15)]
    health, reqs = [], []
    t0 = time.time()
    with SlowFlood(f.port, 300, sources) as flood:
        wait_for(lambda: flood.opened >= 300, "the flood's connections")
        while time.time() - t0 < 12:
            health.append(timed(lambda: get(f.port, "/health", timeout=5)[0] == 200))
            reqs.append(timed(lambda: chat(f.port, headers=auth, timeout=5)[0] == 200))
        reopened = flood.reopened
    took = time.time() - t0
    h99, r99 = p99(health), p99(reqs)
    print(f"slow-header flood: {len(health)} probes p99 {h99 * 1000:.1f} ms, {len(reqs)} "
          f"requests p99 {r99 * 1000:.1f} ms, {reopened} flood connections reopened")
    assert all(x != float("inf") for x in health + reqs), "a probe or request failed"
    # the property is p99 <= 1 s (measured: tens of ms on an idle machine,
    # BENCHMARKS.md); the bound asserted is far from normal on a loaded one,
    # and far below what the flood did before (no answer at all)
    assert h99 <= 5.0 and r99 <= 5.0, (h99, r99)
    assert reopened > 0, "the caps closed no slow connection"
    assert metric(f.port, "redlm_http_slow_clients_closed_total", auth) > 0
    # warnings: one summary line per 10 s at most, not one per connection
    warns = [l for l in f.text().splitlines() if " W " in l and "http:" in l]
    assert len(warns) <= took / 10 + 2, warns[:5]


# --- API keys ---------------------------------------------------------------

def test_wrong_keys_are_throttled_per_address(door, fake, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY} acme\n")
    # 6 a minute: a burst of 6, then one more every 10 s, so the machine's
    # pace cannot blur the counts
    f = door("--api-keys-file", str(keys), "--http-auth-failures-per-min", "6")
    fake()
    bad = {"Authorization": "Bearer sk-guess-0000000000"}
    c = http.client.HTTPConnection("127.0.0.1", f.port, timeout=10,
                                   source_address=("127.0.0.2", 0))
    statuses, last = [], None
    t0 = time.time()
    for i in range(40):
        c.request("POST", "/v1/chat/completions", body=json.dumps({"messages": MSGS}),
                  headers={"Content-Type": "application/json", **bad})
        resp = c.getresponse()
        statuses.append(resp.status)
        last = (resp.status, dict(resp.getheaders()), resp.read())
    took = time.time() - t0
    c.close()
    n401 = statuses.count(401)
    assert statuses[:6] == [401] * 6, statuses
    assert n401 <= 6 + int(took / 10) + 1 and statuses.count(429) == 40 - n401, statuses
    status, headers, data = last
    assert status == 429, statuses
    err = json.loads(data)["error"]
    assert err["code"] == "too_many_auth_failures" and 1 <= int(headers["Retry-After"]) <= 10
    # the right key from that address is not looked at while it is throttled
    status, _, data = chat(f.port, headers={"Authorization": f"Bearer {KEY}"}, source="127.0.0.2")
    assert status == 429, data
    # another address is not affected
    auth = {"Authorization": f"Bearer {KEY}"}
    assert chat(f.port, headers=auth)[0] == 200
    assert metric(f.port, "redlm_http_auth_throttled_total", auth) == 40 - n401 + 1


# --- request framing ----------------------------------------------------------

def raw_exchange(port, data, half_close=False, timeout=15):
    """Sends data on a new connection (then shuts down its sending side
    when half_close) and reads until the server closes. Returns the bytes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return got
            got += chunk
    finally:
        s.close()


def test_conflicting_content_length_is_refused(door, fake, redis_addr, prefix):
    f = door()
    fake()
    r = connect(redis_addr)
    body = json.dumps({"model": MODEL_NAME, "messages": MSGS}).encode()
    n = len(body)
    cases = [
        f"Content-Length: {n}\r\nContent-Length: {n + 7}\r\n",
        f"Content-Length: {n + 7}\r\nContent-Length: {n}\r\n",
        f"Content-Length: {n}\r\nTransfer-Encoding: chunked\r\n",
    ]
    for hdrs in cases:
        # a second request pipelined behind: the connection must close, so
        # its bytes are never taken for a request
        data = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{hdrs}\r\n").encode() + \
            body + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        got = raw_exchange(f.port, data)
        assert got.startswith(b"HTTP/1.1 400"), (hdrs, got[:200])
        assert b"ambiguous_framing" in got and got.count(b"HTTP/1.1 ") == 1, got
    assert r.xlen(f"{prefix}requests") == 0
    # the same length twice is one length (RFC 9112 allows it)
    got = raw_exchange(f.port, (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                f"Content-Length: {n}\r\nContent-Length: {n}\r\n"
                                f"Connection: close\r\n\r\n").encode() + body)
    assert got.startswith(b"HTTP/1.1 200"), got[:300]


# --- half-close ---------------------------------------------------------------

def dechunk(data):
    """The body of a chunked HTTP response (after the headers)."""
    head, rest = data.split(b"\r\n\r\n", 1)
    if b"chunked" not in head.lower():
        return rest
    out = b""
    while rest:
        size, rest = rest.split(b"\r\n", 1)
        k = int(size, 16)
        if k == 0:
            break
        out, rest = out + rest[:k], rest[k + 2:]
    return out


def test_half_closed_client_is_answered(door, fake, redis_addr, prefix):
    """The answer comes 2.5 s after the request (longer than the probe
    interval): the client that sent FIN after its request reads it whole."""
    f = door()
    fw = fake(delay=2.5)
    for stream in (False, True):
        body = json.dumps({"model": MODEL_NAME, "messages": MSGS, "stream": stream})
        got = raw_exchange(f.port, (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                    f"Content-Type: application/json\r\n"
                                    f"Content-Length: {len(body)}\r\n\r\n{body}").encode(),
                           half_close=True)
        assert got.startswith(b"HTTP/1.1 200"), got[:300]
        payload = dechunk(got).decode()
        if stream:
            data = [l[6:] for l in payload.split("\n") if l.startswith("data: ")]
            assert data[-1] == "[DONE]"
            assert json.loads(data[0])["choices"][0]["delta"]["content"] == "ok"
        else:
            res = json.loads(payload)  # leading whitespace (the probes) is JSON's
            assert res["choices"][0]["message"]["content"] == "ok", res
    # a client that closes for good before its answer still cancels its job
    # (no worker now: nothing but the cancel can end it)
    fw.close()
    r = connect(redis_addr)
    for stream in (False, True):
        s = socket.create_connection(("127.0.0.1", f.port))
        body = json.dumps({"model": MODEL_NAME, "messages": MSGS, "stream": stream})
        n = len(list(r.scan_iter(f"{prefix}cancel:*")))
        m = sum(r.xlen(f"{prefix}jobs:{p}") for p in ("fast", "think"))
        s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        wait_for(lambda: sum(r.xlen(f"{prefix}jobs:{p}") for p in ("fast", "think")) > m,
                 "the job routed")
        s.close()
        wait_for(lambda: len(list(r.scan_iter(f"{prefix}cancel:*"))) > n,
                 f"the job cancelled (stream {stream})", timeout=10)


# --- orphans ------------------------------------------------------------------

def test_dispatcher_kill_cancels_its_clients_jobs(built, redis_addr, prefix, tmp_path, workers):
    """Ten streams open through one dispatcher; kill -9 of it: the worker
    cancels all ten within two lease periods (http_client_lease_ms, 5 s)
    and some slack, instead of generating to max_tokens. A job of a live
    front door that runs for lease periods is not touched."""
    workers("w1", "--max-batch", "16")
    lease = 5000
    live = Front(redis_addr, prefix, tmp_path)
    doomed = Front(redis_addr, prefix, tmp_path)
    r = connect(redis_addr)
    ids, conns = [], []
    try:
        # the live front door's job: long enough to outlive several leases
        c = live.conn(timeout=120)
        c.request("POST", "/v1/chat/completions", body=json.dumps(
            {"model": MODEL_NAME, "messages": MSGS, "stream": True, "max_tokens": 3000,
             "ignore_eos": True, "temperature": 0}), headers={"Content-Type": "application/json"})
        live_resp = c.getresponse()
        live_id = live_resp.getheader("X-Request-Id")
        for _ in range(10):
            k = doomed.conn(timeout=60)
            k.request("POST", "/v1/chat/completions", body=json.dumps(
                {"model": MODEL_NAME, "messages": MSGS, "stream": True, "max_tokens": 30000,
                 "ignore_eos": True}), headers={"Content-Type": "application/json"})
            resp = k.getresponse()
            assert resp.status == 200
            ids.append(resp.getheader("X-Request-Id"))
            conns.append(k)
        wait_for(lambda: all(r.xlen(f"{prefix}out:{i}") >= 5 for i in ids), "all ten streaming")
        doomed.kill(signal.SIGKILL)
        doomed.wait(10)
        t_kill = time.time()
        lens = {}
        for i in ids:
            done = job_events(r, prefix, i, timeout=30)[-1]
            lens[i] = (done["finish_reason"], done["usage"]["completion_tokens"])
        took = time.time() - t_kill
        print(f"orphans: all 10 cancelled {took:.1f} s after kill -9; tokens {sorted(v[1] for v in lens.values())}")
        assert all(v[0] == "cancelled" and v[1] < 30000 for v in lens.values()), lens
        assert took < 2 * lease / 1000 + 8, took
        # the live front door's job ran to its end
        chunks = [d for d in sse_events(live_resp)]
        assert chunks[-1] == "[DONE]"
        done = job_events(r, prefix, live_id)[-1]
        assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 3000
    finally:
        for k in conns:
            k.close()
        live.stop()
        doomed.stop()


# --- ports --------------------------------------------------------------------

def hold_port():
    """A listening socket on a free loopback port: (socket, port)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, s.getsockname()[1]


def run_until_exit(args, timeout=20):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def test_taken_port_is_an_error_naming_it(built, redis_addr, prefix, tmp_path):
    s, port = hold_port()
    try:
        base = [str(DISPATCHER), "--redis", redis_addr, "--prefix", prefix]
        for args, what in [(base + ["--http-port", str(port)], "http_port"),
                           (base + ["--http-port", "0", "--http", str(port)], "http")]:
            rc, out = run_until_exit(args)
            assert rc != 0, out
            assert f"port {port} ({what})" in out and "Address already in use" in out, out
        # the worker keeps serving jobs without /metrics ("a busy port costs
        # the metrics, not the jobs"), and says which port it could not have
        w = Daemon()
        w.kind = "worker"
        w.start([str(WORKER), "--redis", redis_addr, "--prefix", prefix, "--model", str(MODEL),
                 "--threads", "1", "--http-port", str(port)], tmp_path / "w.log",
                lambda: "running without /metrics" in w.text())
        w.stop()
        assert f"port {port} (http_port): Address already in use" in w.text(), w.text()
    finally:
        s.close()


def test_two_dispatchers_cannot_share_a_port(door, built, redis_addr, prefix):
    f = door()
    rc, out = run_until_exit([str(DISPATCHER), "--redis", redis_addr, "--prefix", prefix,
                              "--http-port", "0", "--http", str(f.port)])
    assert rc != 0 and f"port {f.port} (http)" in out, out
    assert get(f.port, "/healthz")[0] in (200, 503)  # the first one still has it


BY_HAND = r"""
D= W=
trap 'kill -9 $D $W 2>/dev/null; wait $D $W 2>/dev/null; redis-cli -p 6379 shutdown nosave >/dev/null 2>&1' EXIT
ip link set lo up || exit 1
redis-server --port 6379 --save '' --appendonly no --daemonize yes --logfile "$T/redis.log"
for i in $(seq 100); do redis-cli -p 6379 ping >/dev/null 2>&1 && break; sleep 0.05; done
"$B/redlm-worker" --redis 127.0.0.1:6379 --model "$M" --pools fast,think --name w0 \
    --threads 1 >"$T/worker.log" 2>&1 &
W=$!
"$B/redlm-dispatcher" --redis 127.0.0.1:6379 --think-ratio 0.3 --http 8000 \
    >"$T/dispatcher.log" 2>&1 &
D=$!
ok=0
for i in $(seq 80); do
    if curl -sf http://127.0.0.1:9464/metrics >/dev/null && \
       curl -sf http://127.0.0.1:9465/healthz >/dev/null && \
       curl -sf http://127.0.0.1:8000/healthz >/dev/null; then ok=1; break; fi
    kill -0 $D 2>/dev/null || break
    kill -0 $W 2>/dev/null || break
    sleep 0.1
done
kill -0 $D 2>/dev/null && echo dispatcher-alive
kill -0 $W 2>/dev/null && echo worker-alive
echo "ports-ok=$ok"
"""


def test_default_ports_differ_by_hand_steps_start(built, tmp_path):
    """The README's steps with every port left at its default, in a network
    namespace of the test's own (so fixed ports cannot meet another test's)."""
    if not shutil.which("unshare") or subprocess.run(
            ["unshare", "-rn", "true"], capture_output=True).returncode:
        pytest.skip("no network namespace (unshare -rn) for the default ports")
    if not shutil.which("curl"):
        pytest.skip("curl not installed")
    env = {**os.environ, "B": str(BUILD), "M": str(MODEL), "T": str(tmp_path)}
    p = subprocess.run(["unshare", "-rn", "bash", "-c", BY_HAND], capture_output=True, text=True,
                       timeout=90, env=env)
    logs = "".join((tmp_path / n).read_text() for n in ("worker.log", "dispatcher.log")
                   if (tmp_path / n).exists())
    assert "ports-ok=1" in p.stdout and "dispatcher-alive" in p.stdout, \
        p.stdout + p.stderr + logs
    assert "worker-alive" in p.stdout
    # and each program says its own default
    for prog, port in ((DISPATCHER, "9465"), (WORKER, "9464")):
        out = subprocess.run([str(prog), "--help"], capture_output=True, text=True).stdout
        assert f"--http-port (default: {port})" in out, out


# --- NaN weights --------------------------------------------------------------

def nan_copy(dst, rows=None):
    """A copy of the tiny model whose weights are all NaN (rows: only those
    rows of the embedding, so that only some logits are NaN)."""
    shutil.copytree(MODEL, dst)
    path = pathlib.Path(dst) / "model.safetensors"
    b = bytearray(path.read_bytes())
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    nan = struct.pack("<f", float("nan"))
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32"
        s, e = t["data_offsets"]
        if rows is None:
            b[8 + n + s:8 + n + e] = nan * ((e - s) // 4)
        elif name == "model.embed_tokens.weight":
            width = t["shape"][1] * 4
            for row in rows:
                b[8 + n + s + row * width:8 + n + s + (row + 1) * width] = nan * (width // 4)
    path.write_bytes(bytes(b))
    return dst


def test_nan_weights_are_an_error(built, redis_addr, prefix, tmp_path, client):
    whole = nan_copy(tmp_path / "nan-all")
    some = nan_copy(tmp_path / "nan-rows", rows=[5])
    out = subprocess.run([str(CLI), "run", "-m", str(whole), "--tokens", "1,2,3", "-n", "4",
                          "--threads", "1"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "not finite" in out.stderr and "NaN" in out.stderr, out
    for model, name in ((whole, "all"), (some, "rows")):
        w = Daemon()
        w.kind = "worker"
        pools = f"nan{name}"
        w.start([str(WORKER), "--redis", redis_addr, "--prefix", prefix, "--model", str(model),
                 "--pools", pools, "--name", f"wn-{name}", "--threads", "1", "--http-port", "0",
                 "--block-ms", "100"], tmp_path / f"w-{name}.log", w.logged_ready)
        try:
            for k, extra in enumerate(({"temperature": 0}, {"temperature": 0.8, "seed": 3})):
                jid = f"nan-{name}-{k}"
                client.submit({"id": jid, "prompt_ids": [1, 2, 3], "max_tokens": 4, **extra},
                              pool=pools)
                evs = job_events(client.r, prefix, jid)
                assert not [e for e in evs if e["type"] == "delta"], (name, evs)
                err = [e for e in evs if e["type"] == "error"]
                assert err and "NaN" in err[0]["message"], (name, evs)
                assert evs[-1]["finish_reason"] == "error"
        finally:
            w.stop()


# --- the model table ------------------------------------------------------------

def test_served_model_is_announced_once(built, redis_addr, prefix, tmp_path, dispatchers,
                                        workers):
    w = workers("w1", "--heartbeat-ttl-s", "2")
    d = dispatchers("d1")
    r = connect(redis_addr)
    wait_for(lambda: "model tiny-qwen3-a served" in d.text(), "the model announced")
    seen = set()

    def refreshes():  # the table is refreshed right before each heartbeat
        v = r.get(f"{prefix}dispatcher:d1")
        if v:
            seen.add(json.loads(v)["time_ms"])
        return len(seen) >= 10

    wait_for(refreshes, "ten refreshes")
    assert d.text().count("model tiny-qwen3-a served") == 1, d.text()
    w.stop()
    wait_for(lambda: "model tiny-qwen3-a no longer served" in d.text(), "the model gone",
             timeout=15)
    seen.clear()
    wait_for(refreshes, "ten refreshes more")
    assert d.text().count("no longer served") == 1
