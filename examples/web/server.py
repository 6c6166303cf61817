#!/usr/bin/python3
"""redlm example web backend: a chat page and one streaming endpoint.

What it does. POST /api/chat takes {"messages": [...], "think": bool,
"max_tokens": n} from the browser, turns it into a redlm job and XADDs it
(field `job`) to redlm:requests, where the dispatcher routes it to a pool;
with --pool NAME it goes straight to redlm:jobs:NAME instead (no
dispatcher). It then reads the request's event stream redlm:out:<id> with
XREAD BLOCK from 0-0 and writes every event to the browser as one
server-sent event, flushed at once: `id:` is the stream entry id (0-<seq+1>),
`event:` the event type (delta, done, error), `data:` the event JSON exactly
as the worker wrote it. The response ends after `done` (or after an `error`
that no `done` follows: a job rejected before it ran).

Why no buffering anywhere: the page shows tokens as they are made, so each
event goes out in its own write on an unbuffered socket (http.server's
wfile is unbuffered), and the headers tell proxies not to hold the body
(Cache-Control: no-transform, X-Accel-Buffering: no).

Disconnects. A browser that goes away (tab closed, Stop pressed) must not
leave a worker generating for nobody, so the handler watches its socket
between reads: when the peer has closed it, or a write fails, it sets
redlm:cancel:<id> (EX 600), which the worker checks every step.

Threads: ThreadingHTTPServer gives each request its own thread; they share
one redis-py connection pool (thread safe) for their XADD and cancel. Their
events come from one shared reader (SharedReader): a thread that reads every
stream being followed with one blocking XREAD on a connection of its own,
and hands each request its entries. Redis then pays one read per worker
flush instead of one per token and request (BENCHMARKS.md, "one shared
reader": 1.6x less Redis CPU per token); a new request cuts the read short
with CLIENT UNBLOCK, so its first event is never held back.

Run:  /usr/bin/python3 examples/web/server.py --redis 127.0.0.1:6379 [--listen 127.0.0.1:8080]
It listens on loopback only unless told otherwise.
"""
import argparse
import json
import os
import pathlib
import re
import select
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import redis

STATIC = pathlib.Path(__file__).resolve().parent / "static"
TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}
ROLES = ("system", "user", "assistant")
MAX_BODY = 1 << 20  # a chat page never needs more; larger bodies are refused


class SharedReader:
    """One blocking XREAD over every followed stream (the front door's
    common/xmux.c, in Python). follow(key) -> Follow; Follow.get(timeout)
    returns the new entries [(id, fields), ...], [] on timeout, or raises
    the reader's Redis error; Follow.close() ends it."""

    BLOCK_MS = 1000

    def __init__(self, host, port):
        self.r = redis.Redis(host=host, port=port, decode_responses=True,
                             single_connection_client=True, client_name="redlm-web-xmux")
        # CLIENT UNBLOCK comes from any request thread: a pooled client (one
        # connection per thread at a time), never a shared single connection
        self.ctl = redis.Redis(host=host, port=port, decode_responses=True)
        self.cv = threading.Condition()
        self.follows = []
        self.gen = self.read_gen = 0
        self.in_read, self.stopping, self.cid, self.error = False, False, None, None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while True:
            with self.cv:
                while not self.follows and not self.stopping:
                    self.cv.wait()
                if self.stopping:
                    return
                batch = list(self.follows)
                self.read_gen, self.in_read = self.gen, True
            try:
                if self.cid is None:
                    self.cid = self.r.client_id()
                cursors = {}  # one key followed twice: from the earlier place
                for f in batch:
                    if f.key not in cursors or ids_after(cursors[f.key], f.last):
                        cursors[f.key] = f.last
                res = self.r.xread(cursors, block=self.BLOCK_MS, count=256)
                err = None
            except redis.exceptions.RedisError as e:
                res, err, self.cid = None, e, None  # a new connection has a new id
            with self.cv:
                self.in_read, self.error = False, err
                by_key = {}
                for f in batch:
                    by_key.setdefault(f.key, []).append(f)
                for key, entries in res or []:
                    for f in by_key.get(key, []):
                        new = [e for e in entries if ids_after(e[0], f.last)]
                        if new:
                            f.held.extend(new)
                            f.last = new[-1][0]
                self.cv.notify_all()
            if err:
                time.sleep(0.05)

    def follow(self, key):
        f = Follow(self, key)
        with self.cv:
            self.follows.append(f)
            self.gen += 1
            want = self.gen
            self.cv.notify_all()
        # cut a read made without us short; UNBLOCK answers 0 until the
        # read has reached Redis, so try again a moment later
        for _ in range(2000):
            with self.cv:
                if not (self.in_read and self.read_gen < want and self.cid is not None):
                    break
                cid = self.cid
            try:
                if self.ctl.client_unblock(cid):
                    break
            except redis.exceptions.RedisError:
                break
            time.sleep(0.0001)
        return f

    def stop(self):
        with self.cv:
            self.stopping = True
            self.cv.notify_all()


def ids_after(a, b):
    """Stream entry id a comes after b ("ms-seq")."""
    am, _, asq = a.partition("-")
    bm, _, bsq = b.partition("-")
    return (int(am), int(asq or 0)) > (int(bm), int(bsq or 0))


class Follow:
    def __init__(self, reader, key):
        self.reader, self.key, self.last, self.held = reader, key, "0-0", []

    def get(self, timeout):
        rd = self.reader
        with rd.cv:
            rd.cv.wait_for(lambda: self.held or rd.error or rd.stopping, timeout)
            got, self.held = self.held, []
            if not got and rd.error:
                raise rd.error
            return got

    def close(self):
        with self.reader.cv:
            if self in self.reader.follows:
                self.reader.follows.remove(self)


class BadRequest(Exception):
    """Input the backend refuses: a code and a sentence, as the workers do."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def make_job(body, opts):
    """The job JSON for one browser request, or BadRequest naming the field."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("BAD_MESSAGES", "messages must be a non-empty array")
    if len(msgs) > 256:
        raise BadRequest("BAD_MESSAGES", "at most 256 messages")
    clean = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest("BAD_MESSAGES", f"messages[{i}].role must be one of {', '.join(ROLES)}")
        if not isinstance(m.get("content"), str):
            raise BadRequest("BAD_MESSAGES", f"messages[{i}].content must be a string")
        clean.append({"role": m["role"], "content": m["content"]})
    if clean[-1]["role"] != "user":
        raise BadRequest("BAD_MESSAGES", "the last message must be the user's")
    think = body.get("think", False)
    if not isinstance(think, bool):
        raise BadRequest("BAD_FIELD", "think must be true or false")
    max_tokens = body.get("max_tokens", opts.max_tokens)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or \
            not 1 <= max_tokens <= opts.max_tokens_limit:
        raise BadRequest("BAD_FIELD", f"max_tokens must be an integer in 1..{opts.max_tokens_limit}")
    job = {"id": "web-" + uuid.uuid4().hex, "messages": clean,
           "mode": "think" if think else "no_think", "max_tokens": max_tokens}
    if opts.model:  # the served model, when one Redis serves several
        job["model"] = opts.model
    for k in ("temperature", "seed"):  # optional sampling knobs, checked by the worker
        if k in body:
            job[k] = body[k]
    return job


class Handler(BaseHTTPRequestHandler):
    server_version = "redlm-example/1"
    # HTTP/1.0: the streamed body ends when the connection closes, so no
    # chunked encoding or Content-Length is needed for server-sent events
    protocol_version = "HTTP/1.0"

    def log_message(self, fmt, *args):
        if self.server.opts.verbose:
            sys.stderr.write("web: %s %s\n" % (self.address_string(), fmt % args))

    # ---- plain responses ----

    def send_json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/api/health":
            try:
                self.server.redis.ping()
                return self.send_json(200, {"ok": True, "redis": self.server.opts.redis,
                                            "target": self.server.target})
            except redis.exceptions.RedisError as e:
                return self.send_json(503, {"ok": False, "code": "REDIS_DOWN", "message": str(e)})
        name = "index.html" if path == "/" else path.lstrip("/")
        # only plain names inside static/: no traversal
        if not re.fullmatch(r"[A-Za-z0-9_-]+\.[a-z]+", name) or not (STATIC / name).is_file():
            return self.send_json(404, {"code": "NOT_FOUND", "message": f"no such page: {path}"})
        data = (STATIC / name).read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", TYPES.get(pathlib.Path(name).suffix, "application/octet-stream"))
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        if self.path != "/api/chat":
            return self.send_json(404, {"code": "NOT_FOUND", "message": f"no such endpoint: {self.path}"})
        try:
            n = int(self.headers.get("Content-Length") or -1)
        except ValueError:
            n = -1
        if n < 0 or n > MAX_BODY:
            return self.send_json(400, {"code": "BAD_REQUEST",
                                        "message": f"need a Content-Length of at most {MAX_BODY} bytes"})
        try:
            body = json.loads(self.rfile.read(n) or b"null")
            if not isinstance(body, dict):
                raise BadRequest("BAD_JSON", "the body must be a JSON object")
            job = make_job(body, self.server.opts)
        except ValueError as e:
            return self.send_json(400, {"code": "BAD_JSON", "message": f"the body is not JSON: {e}"})
        except BadRequest as e:
            return self.send_json(400, {"code": e.code, "message": e.message})
        try:
            self.server.redis.xadd(self.server.target, {"job": json.dumps(job)})
        except redis.exceptions.RedisError as e:
            return self.send_json(503, {"code": "REDIS_DOWN", "message": f"cannot enqueue the job: {e}"})
        self.stream(job["id"])

    # ---- the event stream ----

    def peer_closed(self):
        """True when the browser has closed its end (readable with no data)."""
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if not r:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def send_event(self, name, data, eid=None):
        chunk = ""
        if eid:
            chunk += f"id: {eid}\n"
        chunk += f"event: {name}\ndata: {data}\n\n"
        self.wfile.write(chunk.encode())  # unbuffered: one write, on the wire now
        self.wfile.flush()

    def stream(self, job_id):
        follow = self.server.reader.follow(f"{self.server.opts.prefix}out:{job_id}")
        try:
            self.follow_events(job_id, follow)
        finally:
            follow.close()

    def follow_events(self, job_id, follow):
        opts = self.server.opts
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache, no-transform")
        self.send_header("X-Accel-Buffering", "no")
        self.end_headers()
        key = follow.key
        started, got_any, error_at = time.monotonic(), False, None
        try:
            self.send_event("job", json.dumps({"id": job_id, "stream": key}))
            while not self.server.stopping.is_set():
                entries = follow.get(opts.poll_ms / 1000)
                if not entries:
                    if self.peer_closed():
                        raise BrokenPipeError("browser closed the connection")
                    now = time.monotonic()
                    if error_at is not None and now - error_at > 2:
                        return  # an error with no done after it: rejected before it ran
                    if not got_any and now - started > opts.first_event_timeout_s:
                        self.send_event("error", json.dumps({
                            "type": "error", "code": "NO_WORKER",
                            "message": f"no worker answered within {opts.first_event_timeout_s:g} s"}))
                        self.cancel(job_id)
                        return
                    self.wfile.write(b": keep-alive\n\n")  # also detects a dead peer
                    continue
                for eid, fields in entries:
                    got_any = True
                    text = fields.get("event", "")
                    try:
                        kind = json.loads(text).get("type", "delta")
                    except (ValueError, AttributeError):
                        kind = "error"
                        text = json.dumps({"type": "error", "code": "BAD_EVENT",
                                           "message": f"unreadable event {eid} in {key}"})
                    self.send_event(kind, text, eid)
                    if kind == "done":
                        return
                    if kind == "error":
                        error_at = time.monotonic()
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError):
            self.cancel(job_id)
        except redis.exceptions.RedisError as e:
            try:
                self.send_event("error", json.dumps({"type": "error", "code": "REDIS_DOWN",
                                                     "message": f"lost Redis while streaming: {e}"}))
            except OSError:
                pass

    def cancel(self, job_id):
        try:
            self.server.redis.set(f"{self.server.opts.prefix}cancel:{job_id}", "1", ex=600)
            self.log_message("cancelled %s (browser went away)", job_id)
        except redis.exceptions.RedisError:
            pass


def parse_args(argv):
    p = argparse.ArgumentParser(description="redlm example web backend and chat page")
    p.add_argument("--redis", default="127.0.0.1:6379", help="host:port of Redis (default %(default)s)")
    p.add_argument("--listen", default="127.0.0.1:8080",
                   help="address:port to serve on; port 0 picks a free one (default %(default)s)")
    p.add_argument("--prefix", default="redlm:", help="key prefix (default %(default)s)")
    p.add_argument("--pool", default=None,
                   help="send jobs straight to <prefix>jobs:POOL instead of <prefix>requests "
                        "(for running without a dispatcher)")
    p.add_argument("--model", default=None,
                   help="the served model the jobs name (needed when several are served)")
    p.add_argument("--max-tokens", type=int, default=512, help="default max_tokens (default %(default)s)")
    p.add_argument("--max-tokens-limit", type=int, default=8192,
                   help="largest max_tokens a browser may ask for (default %(default)s)")
    p.add_argument("--first-event-timeout-s", type=float, default=300,
                   help="give up (NO_WORKER) when nothing arrives for this long (default %(default)s)")
    p.add_argument("--poll-ms", type=int, default=500,
                   help="how long a request waits for events between disconnect checks (default %(default)s)")
    p.add_argument("-v", "--verbose", action="store_true", help="log every request to stderr")
    return p.parse_args(argv)


def main(argv=None):
    opts = parse_args(argv)
    host, _, port = opts.listen.rpartition(":")
    rhost, _, rport = opts.redis.rpartition(":")
    try:
        srv = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
    except (OSError, ValueError) as e:
        print(f"web: cannot listen on {opts.listen}: {e}", file=sys.stderr)
        return 1
    srv.daemon_threads = True
    srv.opts = opts
    srv.redis = redis.Redis(host=rhost or "127.0.0.1", port=int(rport), decode_responses=True,
                            health_check_interval=30, client_name="redlm-web")
    srv.target = f"{opts.prefix}jobs:{opts.pool}" if opts.pool else f"{opts.prefix}requests"
    srv.reader = SharedReader(rhost or "127.0.0.1", int(rport))
    srv.stopping = threading.Event()

    def stop(signum, frame):
        srv.stopping.set()
        # shutdown() waits for serve_forever, so it cannot run on its thread
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    addr = srv.server_address
    # one parseable line: the demo and the tests wait for it
    print(f"web: listening on http://{addr[0]}:{addr[1]}/ (jobs to {srv.target})", flush=True)
    srv.serve_forever(poll_interval=0.2)
    srv.server_close()
    srv.reader.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
