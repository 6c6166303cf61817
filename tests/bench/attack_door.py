#!/usr/bin/python3
"""The front door's attacks (issue 26, points 5 and 6), in one go, against
real processes this script starts and stops: a redlm-worker on the tiny
model, redlm-dispatcher front doors, and (for the restart) a redis-server of
its own. Honest clients keep sending requests all along; every honest
answer is checked against the job it asked for.

  /usr/bin/python3 tests/bench/attack_door.py [--redis HOST:PORT] [--build build]

run(redis_addr, build, workdir) -> dict is what tests/bench/attacks.py
calls; the counters it returns:
  jobs_lost        honest requests answered 200 whose answer never ended
                   (no done / no [DONE]), or that got no answer at all
  gaps             honest jobs whose event stream skips or repeats a seq
  mixed_streams    honest jobs whose stream holds more than one run (two
                   done events, events after done, a seq written twice)
  wrong_submitter  honest answers that are not for the request sent (its
                   job, found by the answer's id, lacks the request's nonce,
                   or the text differs from that job's events)
  honest_refused   honest requests refused (not 200, or no connection)
                   while Redis was up
and extras: the slow-header flood's /health and request p99 (ms), wrong
keys answered 401 / 429, framing attacks refused, half-closed clients
answered, orphans cancelled, how long after kill -9 and the most events one
of them wrote, the Redis restart's
first request and next 40.

The attacks:
  1. slow-header flood: 300 connections from 16 loopback addresses sending
     a header byte every 0.5 s, each reopened as soon as it is closed (12 s);
  2. wrong API keys: 200 guesses from one address, then its right key;
  3. framing: 20 requests with two disagreeing Content-Length headers (a
     pipelined request behind each), 10 with Content-Length beside
     Transfer-Encoding;
  4. half-close: 10 requests whose client shuts down its sending side;
  5. kill -9 of a second front door with 10 streams open;
  6. Redis (AOF) killed and restarted under a front door of its own.
"""
import argparse
import http.client
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import redis

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))
from local_cluster import free_port, stop_process, wait_ping  # noqa: E402
from slow_flood import SlowFlood  # noqa: E402

MODEL = ROOT / "tests" / "data" / "models" / "tiny-qwen3-a"
NAME = "tiny-qwen3"
KEY = "sk-honest-0123456789"


class Proc:
    """A process of ours, its output in a log file; stop() by pid."""

    def __init__(self, args, log, ready, timeout=30):
        self.log = pathlib.Path(log)
        self.f = open(self.log, "w")
        self.p = subprocess.Popen(args, stdout=self.f, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"{args[0]} exited: {self.text()[-2000:]}")
            if ready(self):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{args[0]} did not get ready: {self.text()[-2000:]}")

    def text(self):
        return self.log.read_text()

    def kill9(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait(10)

    def stop(self):
        stop_process(self.p, 15)
        self.f.close()


def listening(port):
    def ready(_):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False
    return ready


def front(build, addr, prefix, workdir, keys, *extra):
    port = free_port()
    p = Proc([str(pathlib.Path(build) / "redlm-dispatcher"), "--redis", addr, "--prefix", prefix,
              "--http", str(port), "--served-model-name", NAME, "--http-port", "0",
              "--api-keys-file", str(keys), "--block-ms", "100", "--heartbeat-interval-ms", "300",
              "--claim-idle-ms", "2000", "--claim-interval-ms", "200", *extra],
             pathlib.Path(workdir) / f"front-{port}.log", listening(port))
    p.port = port
    return p


def worker(build, addr, prefix, workdir, name):
    return Proc([str(pathlib.Path(build) / "redlm-worker"), "--redis", addr, "--prefix", prefix,
                 "--model", str(MODEL), "--pools", "fast,think", "--name", name, "--threads", "1",
                 "--http-port", "0", "--block-ms", "100", "--max-batch", "16",
                 "--claim-idle-ms", "3000", "--claim-interval-ms", "200", "--lease-renew-ms", "500"],
                pathlib.Path(workdir) / f"worker-{name}.log", lambda p: "ready:" in p.text())


def start_redis(workdir):
    port = free_port()
    d = pathlib.Path(workdir) / f"redis-{port}"
    d.mkdir(parents=True, exist_ok=True)
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
            "--save", "", "--appendonly", "yes", "--appendfsync", "always",
            "--logfile", str(d / "redis.log")]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ping(port)
    return p, port, args


# --- honest clients -------------------------------------------------------------

class Honest:
    """Honest clients on 127.0.0.1 with the right key, one request after the
    other, streamed and not in turn, each with a nonce in its prompt. refused
    counts only while `counting` is set (Redis up)."""

    def __init__(self, port, n_threads=2):
        self.port, self.results = port, []
        self.counting = threading.Event()
        self.counting.set()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ts = [threading.Thread(target=self.run, args=(k,), daemon=True)
                   for k in range(n_threads)]
        for t in self.ts:
            t.start()

    def one(self, stream):
        nonce = uuid.uuid4().hex[:12]
        body = {"model": NAME, "messages": [{"role": "user", "content": f"Say {nonce}."}],
                "max_tokens": 6, "temperature": 0, "stream": stream,
                "chat_template_kwargs": {"enable_thinking": False}}
        res = {"nonce": nonce, "stream": stream, "counted": self.counting.is_set()}
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            c.request("POST", "/v1/chat/completions", body=json.dumps(body),
                      headers={"Content-Type": "application/json",
                               "Authorization": f"Bearer {KEY}"})
            r = c.getresponse()
            res["status"] = r.status
            res["id"] = r.getheader("X-Request-Id")
            data = r.read().decode()
            if r.status == 200 and stream:
                chunks = [l[6:] for l in data.split("\n") if l.startswith("data: ")]
                res["complete"] = bool(chunks) and chunks[-1] == "[DONE]"
                res["text"] = "".join(
                    (json.loads(x)["choices"][0]["delta"].get("content") or "")
                    for x in chunks[:-1] if json.loads(x).get("choices"))
            elif r.status == 200:
                o = json.loads(data)
                res["complete"] = o["choices"][0]["finish_reason"] is not None
                res["text"] = o["choices"][0]["message"]["content"] or ""
        except (OSError, http.client.HTTPException, ValueError) as e:
            res["status"], res["error"] = None, repr(e)
        finally:
            c.close()
        res["counted"] = res["counted"] and self.counting.is_set()
        return res

    def run(self, k):
        i = k
        while not self.stop.is_set():
            r = self.one(stream=i % 2 == 0)
            with self.lock:
                self.results.append(r)
            i += 1

    def close(self):
        self.stop.set()
        for t in self.ts:
            t.join(90)
        return self.results


def check_honest(results, r, prefix, counters):
    """Adds what the honest results show to counters."""
    jobs = {}
    for pool in ("fast", "think"):
        for _, f in r.xrange(f"{prefix}jobs:{pool}"):
            j = json.loads(f["job"])
            jobs.setdefault(j["id"], []).append(j)
    for res in results:
        if res.get("status") != 200:
            if res["counted"]:
                counters["honest_refused"] += 1
            continue
        if not res.get("complete"):
            counters["jobs_lost"] += 1
            continue
        evs = [json.loads(f["event"]) for _, f in r.xrange(f"{prefix}out:{res['id']}")]
        seqs = [e["seq"] for e in evs]
        dones = [i for i, e in enumerate(evs) if e["type"] == "done"]
        if not dones:
            counters["jobs_lost"] += 1
        if len(dones) > 1 or (dones and dones[0] != len(evs) - 1) or len(set(seqs)) != len(seqs):
            counters["mixed_streams"] += 1
        elif seqs != list(range(len(seqs))):
            counters["gaps"] += 1
        text = "".join(e["delta"].get("content", "") for e in evs if e["type"] == "delta")
        mine = [j for j in jobs.get(res["id"], []) if res["nonce"] in json.dumps(j["messages"])]
        if len(jobs.get(res["id"], [])) != 1 or not mine or text != res["text"]:
            counters["wrong_submitter"] += 1


# --- the attacks -------------------------------------------------------------------

def timed_get(port, path, headers=None, body=None):
    t = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request("POST" if body else "GET", path, body=body, headers=headers or {})
        ok = c.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        ok = False
    finally:
        c.close()
    return time.time() - t if ok else float("inf")


def p99_ms(xs):
    xs = sorted(xs)
    v = xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else float("inf")
    return round(v * 1000, 1) if v != float("inf") else None


def attack_flood(f, out):
    health, reqs = [], []
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    body = json.dumps({"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2})
    sources = ["127.0.0.2"] * 5 + [f"127.0.0.{10 + k}" for k in range(15)]
    with SlowFlood(f.port, 300, sources) as flood:
        t0 = time.time()
        while time.time() - t0 < 12:
            health.append(timed_get(f.port, "/health"))
            reqs.append(timed_get(f.port, "/v1/chat/completions", auth, body))
    out["flood_health_p99_ms"] = p99_ms(health)
    out["flood_request_p99_ms"] = p99_ms(reqs)
    out["flood_probes_failed"] = sum(x == float("inf") for x in health + reqs)
    out["flood_reopened"] = flood.reopened
    out["flood_warn_lines"] = sum(1 for l in f.text().splitlines()
                                  if " W " in l and "http:" in l)


def attack_keys(f, out):
    c = http.client.HTTPConnection("127.0.0.1", f.port, timeout=10,
                                   source_address=("127.0.0.3", 0))
    st = []
    for i in range(200):
        c.request("POST", "/v1/chat/completions", body="{}",
                  headers={"Authorization": f"Bearer sk-guess-{i:010d}",
                           "Content-Type": "application/json"})
        resp = c.getresponse()
        resp.read()
        st.append(resp.status)
    c.request("POST", "/v1/chat/completions", body="{}",
              headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    resp = c.getresponse()
    resp.read()
    c.close()
    out["wrong_keys_401"] = st.count(401)
    out["wrong_keys_429"] = st.count(429)
    out["right_key_while_throttled"] = resp.status


def raw(port, data, half_close=False):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            k = s.recv(65536)
            if not k:
                return got
            got += k
    except OSError:
        return got
    finally:
        s.close()


def attack_framing(f, r, prefix, out):
    nonce = uuid.uuid4().hex
    body = json.dumps({"model": NAME, "messages": [{"role": "user", "content": nonce}]}).encode()
    n = len(body)
    refused = accepted = 0
    for k in range(30):
        hdrs = (f"Content-Length: {n}\r\nContent-Length: {n + 9}\r\n" if k < 20 else
                f"Content-Length: {n}\r\nTransfer-Encoding: chunked\r\n")
        got = raw(f.port, f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                          f"Authorization: Bearer {KEY}\r\n{hdrs}\r\n".encode() + body +
                  b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        if got.startswith(b"HTTP/1.1 400") and got.count(b"HTTP/1.1 ") == 1:
            refused += 1
        else:
            accepted += 1
    queued = sum(nonce in f2["job"] for _, f2 in r.xrange(f"{prefix}requests"))
    out["framing_refused"] = refused
    out["framing_accepted"] = accepted + queued


def attack_half_close(f, out):
    ok = 0
    for k in range(10):
        stream = k % 2 == 0
        body = json.dumps({"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 4, "stream": stream})
        got = raw(f.port, (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                           f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(body)}\r\n\r\n{body}").encode(), half_close=True)
        ok += got.startswith(b"HTTP/1.1 200") and (b"[DONE]" in got if stream
                                                   else b"chat.completion" in got)
    out["half_close_answered"] = f"{ok}/10"


def attack_kill(build, addr, prefix, workdir, keys, r, out):
    doomed = front(build, addr, prefix, workdir, keys)
    ids, conns = [], []
    for _ in range(10):
        c = http.client.HTTPConnection("127.0.0.1", doomed.port, timeout=60)
        c.request("POST", "/v1/chat/completions", body=json.dumps(
            {"model": NAME, "messages": [{"role": "user", "content": "Tell a long story."}],
             "stream": True, "max_tokens": 30000, "ignore_eos": True}),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        resp = c.getresponse()
        ids.append(resp.getheader("X-Request-Id"))
        conns.append(c)
    deadline = time.time() + 60
    while time.time() < deadline and not all(r.xlen(f"{prefix}out:{i}") >= 5 for i in ids):
        time.sleep(0.05)
    doomed.kill9()
    t_kill = time.time()
    done, took, tokens = 0, None, []
    deadline = t_kill + 60
    while time.time() < deadline and done < len(ids):
        done = 0
        for i in ids:
            last = r.xrevrange(f"{prefix}out:{i}", count=1)
            ev = json.loads(last[0][1]["event"]) if last else {}
            if ev.get("type") == "done" and ev["finish_reason"] == "cancelled":
                done += 1
        took = time.time() - t_kill
        time.sleep(0.1)
    for i in ids:  # events written in all (one per token: no coalescing)
        tokens.append(r.xlen(f"{prefix}out:{i}"))
    for c in conns:
        c.close()
    doomed.stop()
    out["orphans_cancelled"] = f"{done}/{len(ids)}"
    out["orphan_cancel_s"] = round(took, 1) if done == len(ids) else None
    out["orphan_events_max"] = max(tokens)


def attack_restart(build, workdir, keys, out):
    """Redis (AOF) killed -9 and restarted under a front door of its own."""
    rp, port, args = start_redis(workdir)
    prefix = f"ra{uuid.uuid4().hex[:6]}:"
    addr = f"127.0.0.1:{port}"
    procs = []
    try:
        procs.append(worker(build, addr, prefix, workdir, "wr"))
        f = front(build, addr, prefix, workdir, keys, "--redis-backoff-max-ms", "200")
        procs.append(f)
        auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        body = json.dumps({"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 2})
        res = []
        ts = [threading.Thread(target=lambda: res.append(
            timed_get(f.port, "/v1/chat/completions", auth, body))) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        n_up = f.text().count(": connected")
        rp.send_signal(signal.SIGKILL)
        rp.wait(10)
        away = [timed_get(f.port, "/health") for _ in range(5)]
        rp = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ping(port)
        deadline = time.time() + 30
        while time.time() < deadline and f.text().count(": connected") <= n_up:
            time.sleep(0.05)
        out["restart_health_while_away_503"] = all(x == float("inf") for x in away)
        out["restart_first_health_ok"] = timed_get(f.port, "/health") != float("inf")
        out["restart_first_request_ok"] = timed_get(f.port, "/v1/chat/completions", auth,
                                                    body) != float("inf")
        nxt = [timed_get(f.port, "/v1/chat/completions", auth, body) for _ in range(40)]
        out["restart_next_40_ok"] = sum(x != float("inf") for x in nxt)
    finally:
        for p in reversed(procs):
            p.stop()
        rp.terminate()
        rp.wait(10)


def run(redis_addr, build, workdir):
    """Runs every attack with honest clients alongside; returns the counters
    (module docstring) and extras."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    keys = workdir / "api-keys"
    keys.write_text(f"{KEY} honest\n")
    prefix = f"ad{uuid.uuid4().hex[:6]}:"
    counters = {"jobs_lost": 0, "gaps": 0, "mixed_streams": 0, "wrong_submitter": 0,
                "honest_refused": 0}
    extras = {}
    r = redis.Redis(host=redis_addr.rsplit(":", 1)[0], port=int(redis_addr.rsplit(":", 1)[1]),
                    decode_responses=True)
    procs = []
    honest = None
    # a consumer group "tap" on the queue streams keeps what was sent there
    # for check_honest and the framing count: handled entries are deleted
    # once every group has acknowledged them (common/qack.h, issue 26)
    for key in ("jobs:fast", "jobs:think", "requests"):
        try:
            r.xgroup_create(f"{prefix}{key}", "tap", id="0", mkstream=True)
        except redis.exceptions.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
    try:
        procs.append(worker(build, redis_addr, prefix, workdir, "w1"))
        f = front(build, redis_addr, prefix, workdir, keys)
        procs.append(f)
        honest = Honest(f.port)
        attack_flood(f, extras)
        attack_keys(f, extras)
        attack_framing(f, r, prefix, extras)
        attack_half_close(f, extras)
        attack_kill(build, redis_addr, prefix, workdir, keys, r, extras)
        results = honest.close()
        honest = None
        extras["honest_requests"] = len(results)
        check_honest(results, r, prefix, counters)
        attack_restart(build, workdir, keys, extras)
    finally:
        if honest:
            honest.close()
        for p in reversed(procs):
            p.stop()
    return {**counters, **extras}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis", help="HOST:PORT of a redis-server to use (default: one of ours)")
    ap.add_argument("--build", default=str(ROOT / os.environ.get("BUILD", "build")))
    args = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="attack-door-"))
    own = None
    try:
        addr = args.redis
        if not addr:
            own, port, _ = start_redis(work)
            addr = f"127.0.0.1:{port}"
        res = run(addr, args.build, work)
        width = max(len(k) for k in res)
        for k, v in res.items():
            print(f"{k:<{width}}  {v}")
    finally:
        if own:
            own.terminate()
            own.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
