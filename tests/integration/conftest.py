"""Fixtures for the worker's integration tests: a real redis-server, worker
processes, a client that sends jobs and reads their event streams, schema
validation, and reference outputs from `redlm run --batch`.

Redis: CI exports REDLM_TEST_REDIS=127.0.0.1:PORT of a server it started;
without it a private redis-server is started on a free loopback port. Each
test uses its own key prefix (the worker's --prefix), so tests never see
each other's keys on a shared server. Tests that restart Redis start their
own server (RedisServer) in a temporary directory.

Everything a test reads lives in the repository: the tiny reference model
under tests/data/models, the real Qwen3 tokenizer in engine/tokenizers/qwen3.
Paths are absolute (from this file's place), so the suite runs from any
working directory and wherever the clone sits.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import uuid

import jsonschema
import pytest
import redis

ROOT = pathlib.Path(__file__).resolve().parents[2]
# one copy of the local cluster (and the port helpers) for tests and benches
sys.path.insert(0, str(ROOT / "tests" / "bench"))
from local_cluster import RedisCluster, free_port, wait_ping  # noqa: E402,F401
BUILD = ROOT / os.environ.get("BUILD", "build")
WORKER = BUILD / "redlm-worker"
CLI = BUILD / "redlm"
DATA = ROOT / "tests" / "data"  # fixtures; tests/data/README.md names their sources
MODEL = DATA / "models" / "tiny-qwen3-a"
QWEN3_TOKENIZER = ROOT / "engine" / "tokenizers" / "qwen3"
SCHEMAS = ROOT / "schemas"


def promtool_check(text):
    """Runs `promtool check metrics` (Debian's prometheus package) on a
    /metrics page; fails the test with promtool's complaints, skips when
    promtool is not installed (make deps installs it)."""
    import shutil
    exe = shutil.which("promtool")
    if not exe:
        pytest.skip("promtool not installed (apt-get install prometheus, or make deps)")
    out = subprocess.run([exe, "check", "metrics"], input=text, capture_output=True, text=True,
                         timeout=30)
    # vLLM's metric names hold a colon (vllm:time_to_first_token_seconds), which
    # promtool's lint frowns on; the front door serves them so that vLLM's
    # dashboards work unchanged (issue 29): that one complaint is allowed
    others = [ln for ln in (out.stdout + out.stderr).splitlines()
              if ln.strip() and not (ln.startswith("vllm:") and
                                     ln.endswith("metric names should not contain ':'"))]
    assert out.returncode == 0 or not others, f"promtool check metrics: {out.stdout}{out.stderr}"


class RedisServer:
    """A redis-server of our own, on a free loopback port, in dir."""

    def __init__(self, dir, aof=False):
        self.dir = pathlib.Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.aof = aof
        self.proc = None
        self.start()

    def start(self):
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), "--save", "", "--logfile", str(self.dir / "redis.log")]
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ping(self.port)

    def stop(self, kill=False):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            self.proc.wait(10)
        self.proc = None

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"


@pytest.fixture(scope="session")
def redis_addr(tmp_path_factory):
    addr = os.environ.get("REDLM_TEST_REDIS")
    if addr:
        yield addr
        return
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    yield srv.addr
    srv.stop()


def connect(addr):
    host, port = addr.rsplit(":", 1)
    return redis.Redis(host=host, port=int(port), decode_responses=True)


@pytest.fixture(scope="session")
def built():
    if not WORKER.exists() or not CLI.exists():
        pytest.skip(f"{WORKER} or {CLI} not built (run make)")
    if not (MODEL / "config.json").exists():
        pytest.skip(f"tiny model missing at {MODEL}")


@pytest.fixture
def prefix():
    return f"t{uuid.uuid4().hex[:8]}:"


def terminate(proc, timeout=15):
    """SIGTERM to proc, then SIGKILL if it is still there after timeout s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stopped_at_end(make):
    """The body of a fixture that yields start(*args, **kw) -> make(*args,
    **kw) and stops every process so started when the test ends."""
    started = []

    def start(*args, **kw):
        p = make(*args, **kw)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


class Daemon:
    """A redlm process a test started, its output in log_path. Subclasses
    build the command line and call start() with a readiness check."""

    kind = "process"

    def start(self, args, log_path, ready, timeout=30, env=None, cwd=ROOT):
        """Starts args (with env, None: ours) and waits until ready() is
        true; raises when the process exits first or timeout passes."""
        self.args = args
        self.log_path = pathlib.Path(log_path)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=cwd,
                                     env=env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited: {self.text()}")
            if ready():
                return
            time.sleep(0.02)
        raise RuntimeError(f"{self.kind} did not get ready: {self.text()}")

    def text(self):
        return self.log_path.read_text()

    def logged_ready(self):
        """The worker's and the dispatcher's "ready:" log line."""
        return "ready:" in self.text()

    # kill() comes before signal(): in the class body the method would
    # shadow the signal module in kill's default argument
    def kill(self, sig=signal.SIGKILL):
        self.signal(sig)

    def signal(self, sig):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout=30):
        return self.proc.wait(timeout)

    def stop(self):
        terminate(self.proc)
        self.log.close()


class Worker(Daemon):
    kind = "worker"

    def __init__(self, addr, prefix, name, logdir, extra=(), pools="fast,think"):
        self.name = name
        self.r = connect(addr)
        self.prefix = prefix
        args = [str(WORKER), "--redis", addr, "--model", str(MODEL), "--pools", pools,
                "--name", name, "--threads", "1", "--prefix", prefix,
                "--block-ms", "100", "--heartbeat-interval-ms", "500", "--http-port", "0", *extra]
        self.start(args, pathlib.Path(logdir) / f"worker-{name}.log", self.logged_ready)


@pytest.fixture
def workers(built, redis_addr, prefix, tmp_path):
    """start(name, *flags) -> Worker; every worker is stopped at the end."""
    def make(name="w1", *extra, addr=None, pools="fast,think"):
        return Worker(addr or redis_addr, prefix, name, tmp_path, extra, pools)

    yield from stopped_at_end(make)


def validator(name):
    schema = json.loads((SCHEMAS / name).read_text())
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=jsonschema.FormatChecker())


@pytest.fixture(scope="session")
def event_validator():
    return validator("event.schema.json")


@pytest.fixture(scope="session")
def dead_validator():
    return validator("dead-letter.schema.json")


class Client:
    """Sends jobs and reads redlm:out:<id> until done, riding out Redis
    restarts (connection errors are retried)."""

    def __init__(self, addr, prefix):
        self.addr = addr
        self.prefix = prefix
        self.r = connect(addr)

    def submit(self, job, pool="fast", raw=None):
        text = raw if raw is not None else json.dumps(job)
        for _ in range(500):
            try:
                return self.r.xadd(f"{self.prefix}jobs:{pool}", {"job": text})
            except redis.exceptions.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError("cannot submit")

    def events(self, job_id, timeout=60, r=None, partial=False):
        """Every event of job_id as (entry_id, dict), up to and including done
        (stream_events)."""
        return stream_events(r or connect(self.addr), f"{self.prefix}out:{job_id}", timeout,
                             partial)


def stream_events(r, key, timeout=60, partial=False):
    """Every event of the stream at key as (entry_id, dict), up to and
    including done, riding out Redis restarts (connection errors and
    timeouts are retried). Past timeout: an AssertionError, or with partial
    what came so far, so that a caller can count a lost job rather than
    raise."""
    out, last = [], "0-0"
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            res = r.xread({key: last}, block=200, count=1000)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                redis.exceptions.ClusterError, redis.exceptions.ClusterDownError):
            # a cluster's failover reads like a lost connection
            time.sleep(0.05)
            continue
        for _, entries in res or []:
            for eid, fields in entries:
                last = eid
                ev = json.loads(fields["event"])
                out.append((eid, ev))
                if ev["type"] == "done":
                    return out
    if partial:
        return out
    raise AssertionError(f"{key}: no done within {timeout}s; got {len(out)} events: "
                         f"{[ev for _, ev in out[-3:]]}")


def job_events(r, prefix, job_id, timeout=60):
    """The events of job_id on connection r, without their entry IDs."""
    return [ev for _, ev in stream_events(r, f"{prefix}out:{job_id}", timeout)]


def wait_for(cond, what, timeout=30, every=0.02):
    """cond()'s first true value within timeout, else an AssertionError."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def read_heartbeat(r, prefix, kind, name, timeout=0):
    """The last heartbeat of the worker or dispatcher `name` (the key
    <prefix><kind>:<name>, kind "worker" or "dispatcher"), decoded; None when
    there is none. With a timeout, waits up to that long for one (an
    AssertionError when none comes)."""
    key = f"{prefix}{kind}:{name}"

    def get():
        v = r.get(key)
        return json.loads(v) if v else None
    return wait_for(get, f"a heartbeat at {key}", timeout) if timeout else get()


def wait_no_pending(r, prefix, pools=("fast", "think"), timeout=10):
    """Waits up to timeout for every pool's group "workers" to have no
    pending entry, then asserts it (a job someone still holds, or one
    nobody acknowledged, fails the test)."""
    for pool in pools:
        deadline = time.time() + timeout
        while r.xpending(f"{prefix}jobs:{pool}", "workers")["pending"] and \
                time.time() < deadline:
            time.sleep(0.05)
        assert r.xpending(f"{prefix}jobs:{pool}", "workers")["pending"] == 0


@pytest.fixture
def client(redis_addr, prefix):
    return Client(redis_addr, prefix)


def check_stream(events, validator):
    """Schema-valid, seq gapless from 0, entry IDs 0-<seq+1>, ends with done.
    Returns (token ids, done event)."""
    tokens = []
    for i, (eid, ev) in enumerate(events):
        validator.validate(ev)
        assert ev["seq"] == i, f"seq {ev['seq']} at position {i}"
        assert eid == f"0-{i + 1}"
        if ev["type"] == "delta":
            tokens += ev["token_ids"]
    assert events[-1][1]["type"] == "done"
    return tokens, events[-1][1]


def reference(jobs, tmp_path):
    """Greedy outputs of `redlm run --batch` for jobs (prompt_ids, max_tokens,
    temperature 0, ignore_eos): a list of token lists in the same order."""
    path = tmp_path / f"ref-{uuid.uuid4().hex[:6]}.jsonl"
    with open(path, "w") as f:
        for j in jobs:
            f.write(json.dumps({"prompt_ids": j["prompt_ids"], "max_tokens": j["max_tokens"],
                                "temperature": 0, "ignore_eos": True}) + "\n")
    out = subprocess.run([str(CLI), "run", "-m", str(MODEL), "--batch", str(path),
                          "--threads", "1"], capture_output=True, text=True, check=True,
                         timeout=300)
    lines = [json.loads(l) for l in out.stdout.splitlines() if l.strip()]
    assert len(lines) == len(jobs)
    return [l["tokens"] for l in lines]


def greedy_jobs(n, seed, max_tokens=(4, 12), prompt_len=(2, 24), tag="j"):
    import random
    rnd = random.Random(seed)
    jobs = []
    for i in range(n):
        jobs.append({"id": f"{tag}{i}",
                     "prompt_ids": [rnd.randrange(0, 736) for _ in range(rnd.randint(*prompt_len))],
                     "max_tokens": rnd.randint(*max_tokens), "temperature": 0,
                     "ignore_eos": True, "cache": False})
    return jobs


def run_threads(fn, items, n_threads):
    """Runs fn(item) for every item on n_threads threads; re-raises the first failure."""
    errors, lock, it = [], threading.Lock(), iter(list(enumerate(items)))
    results = [None] * len(items)

    def loop():
        while True:
            with lock:
                try:
                    i, x = next(it)
                except StopIteration:
                    return
            try:
                results[i] = fn(x)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return

    ts = [threading.Thread(target=loop) for _ in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return results


# --- the dispatcher (branch disp) -------------------------------------------
DISPATCHER = BUILD / "redlm-dispatcher"


class Dispatcher(Daemon):
    """A redlm-dispatcher process on the test's prefix; ready once it logs
    "ready:" (connected, groups made)."""

    kind = "dispatcher"

    def __init__(self, addr, prefix, name, logdir, extra=()):
        self.name = name
        args = [str(DISPATCHER), "--redis", addr, "--prefix", prefix, "--name", name,
                "--http-port", "0", "--block-ms", "100", "--heartbeat-interval-ms", "200",
                *extra]
        self.start(args, pathlib.Path(logdir) / f"dispatcher-{name}.log", self.logged_ready)


@pytest.fixture
def dispatchers(redis_addr, prefix, tmp_path):
    """start(name, *flags) -> Dispatcher; every one is stopped at the end."""
    if not DISPATCHER.exists():
        pytest.skip(f"{DISPATCHER} not built (run make)")
    def make(name="d1", *extra, addr=None):
        return Dispatcher(addr or redis_addr, prefix, name, tmp_path, extra)

    yield from stopped_at_end(make)


# --- Redis Cluster (issue 19) -----------------------------------------------
@pytest.fixture
def redis_cluster(tmp_path):
    """A fresh 3-master + 3-replica cluster per test, always torn down."""
    c = RedisCluster(tmp_path / "cluster")
    yield c
    c.stop()


def kill_mid_generation(client, worker, jobs, consumer="wa", pool="fast", min_events=5,
                        min_jobs=2, timeout=20):
    """Waits (up to timeout) until the consumer holds pending entries on the
    pool and at least min_jobs of jobs have min_events events out, so that
    the kill lands with the consumer in the middle of its jobs; then kills
    worker with SIGKILL and reaps it. Returns the ids of the jobs that were
    mid-generation at the kill."""
    key = f"{client.prefix}jobs:{pool}"
    deadline = time.time() + timeout
    mid = []
    while time.time() < deadline:
        pend = client.r.xpending_range(key, "workers", "-", "+", 100, consumername=consumer)
        mid = [j["id"] for j in jobs
               if client.r.xlen(f"{client.prefix}out:{j['id']}") >= min_events]
        if pend and len(mid) >= min_jobs:
            break
        time.sleep(0.01)
    worker.kill(signal.SIGKILL)
    worker.wait(10)
    return mid


def held_mid_generation(r, keys, consumer, out_key, min_tokens=2, seen=None):
    """The jobs consumer holds (pending entries of the streams keys, read
    from Redis, not the clock) that have published at least min_tokens
    tokens, no done (nor error) and at least half their max_tokens still to
    go, so that a kill that follows at once lands in their middle however
    slow the machine is. out_key(job id) is a job's stream; seen (a dict),
    when given, gets (tokens, done) of every job held."""
    mid = []
    for key in keys:
        for p in r.xpending_range(key, "workers", "-", "+", 100, consumername=consumer):
            entry = r.xrange(key, p["message_id"], p["message_id"])
            if not entry:
                continue
            job = json.loads(entry[0][1]["job"])
            evs = [json.loads(f["event"]) for _, f in r.xrange(out_key(job["id"]))]
            n = sum(len(ev["token_ids"]) for ev in evs if ev["type"] == "delta")
            done = any(ev["type"] in ("done", "error") for ev in evs)
            if seen is not None:
                seen[job["id"]] = (n, done)
            if not done and min_tokens <= n <= job["max_tokens"] // 2:
                mid.append(job)
    return mid


def tap(r, *keys):
    """A consumer group "tap" on each queue stream, made before anything is
    sent: a handled entry leaves a queue stream only once every group has
    acknowledged it (common/qack.h, issue 26), so a test that reads what was
    sent there (XRANGE) finds it until the test ends."""
    for k in keys:
        try:
            r.xgroup_create(k, "tap", id="0", mkstream=True)
        except redis.exceptions.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise


def shard_key(key, s, k=3):
    """Shard s of k of a cluster queue key "{<prefix>}<rest>" (issue 27):
    common/rcluster.c's rcl_shard_key, written again from its contract, so
    the tests check the C names against an independent implementation."""
    from redis.crc import key_slot
    if s == 0:
        return key
    close = key.index("}")
    tag, rest = key[1:close], key[close + 1:]
    want = (key_slot(key.encode()) + (s * 16384 + k // 2) // k) % 16384
    n = 0
    while key_slot(f"{tag}{s}.{n}".encode()) != want:
        n += 1
    return f"{{{tag}{s}.{n}}}{rest}"


def pool_shards(prefix, pool="fast", k=3):
    """Every shard key of a pool on a cluster, shard 0 first (pool_shards = k)."""
    return [shard_key(f"{{{prefix}}}jobs:{pool}", s, k) for s in range(k)]
