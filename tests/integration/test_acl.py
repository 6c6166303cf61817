"""Least-privilege Redis ACLs (config/redis-acl.conf): a redis-server of our
own loads the file the way the comment header says (comments stripped, as
`aclfile`; or as is, through `include`), with test passwords added the
documented way (" #<sha256 of the password>" appended to a user's line).

What is proved: the worker does a whole job life as ACL user `worker`
(cache fill and hit, cancel key, dead letter, heartbeat, pub/sub, lease
renewal, and a takeover after SIGKILL: XAUTOCLAIM, XPENDING, XRANGE) and
Redis's ACL LOG holds no denial for it; a `client` can enqueue, read its
out stream, cancel and subscribe, and everything else it tries is NOPERM;
`default` can do nothing; users shipped without a password cannot log in.
"""
import contextlib
import hashlib
import json
import pathlib
import signal
import subprocess
import time

import pytest
import redis

from conftest import CLI, MODEL, ROOT, Worker, free_port, job_events, wait_for

ACL_SRC = ROOT / "config" / "redis-acl.conf"
USERS = ("admin", "worker", "dispatcher", "client", "client2", "monitor")
PW = {u: f"test-{u}-pw" for u in USERS}


def acl_lines():
    """The file without its comment header: what goes into `aclfile`."""
    return [l for l in ACL_SRC.read_text().splitlines() if l.strip() and not l.startswith("#")]


def with_passwords(lines):
    out = []
    for l in lines:
        name = l.split()[1]
        if name in PW:
            l += " #" + hashlib.sha256(PW[name].encode()).hexdigest()
        out.append(l)
    return out


class AclRedis:
    """redis-server on a free loopback port with `aclfile` (or `include`)."""

    def __init__(self, dir, lines, mode="aclfile"):
        self.dir = pathlib.Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        args = ["redis-server"]
        if mode == "include":
            conf = self.dir / "redis.conf"
            conf.write_text(f"include {ACL_SRC}\n")
            args.append(str(conf))
        else:
            acl = self.dir / "users.acl"
            acl.write_text("\n".join(lines) + "\n")
            args += ["--aclfile", str(acl)]
        args += ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                 "--save", "", "--appendonly", "no", "--logfile", str(self.dir / "redis.log")]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                redis.Redis(port=self.port).ping()
            except redis.exceptions.AuthenticationError:
                return  # up, and refusing the unauthenticated default user
            except redis.exceptions.ResponseError:
                return
            except redis.exceptions.ConnectionError:
                if self.proc.poll() is not None:
                    raise RuntimeError((self.dir / "redis.log").read_text())
                time.sleep(0.02)
            else:
                raise AssertionError("the default user can PING without AUTH")
        raise RuntimeError("redis-server did not start")

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def as_user(self, user, password=None):
        return redis.Redis(port=self.port, username=user,
                           password=password if password is not None else PW[user],
                           decode_responses=True)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def acl_redis(tmp_path):
    srv = AclRedis(tmp_path / "redis", with_passwords(acl_lines()))
    yield srv
    srv.stop()


def cannot_log_in(r):
    with pytest.raises((redis.exceptions.AuthenticationError, redis.exceptions.ResponseError),
                       match="WRONGPASS"):
        r.ping()


def noperm(fn, *args, **kw):
    with pytest.raises(redis.exceptions.NoPermissionError):
        fn(*args, **kw)


def cli_as(tmp_path, addr):
    """cli(user, *args): the redlm command against addr as an ACL user."""
    def cli(user, *args):
        pwf = tmp_path / f"{user}.password"
        pwf.write_text(PW[user])
        return subprocess.run([str(CLI), *args, "--redis", addr, "--user", user,
                               "--password-file", str(pwf)],
                              capture_output=True, text=True, timeout=60)
    return cli


def client_and_monitor_cli(cli, admin, cancel_key):
    """The redlm command as `client` (enqueue a job already answered once,
    so its replay is cached; tail; cancel) and as `monitor` (stats, after
    one dead letter). Returns the stats."""
    out = cli("client", "enqueue", "--tenant", "client", "--prompt-ids", "9,8,7",
              "--max-tokens", "6", "--temperature", "0", "--ignore-eos")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("client:")
    tail = cli("client", "tail", out.stdout.strip(), "--json")
    assert tail.returncode == 0 and '"cached":true' in tail.stdout.replace(" ", ""), tail
    assert cli("client", "cancel", "client:some-id").returncode == 0
    assert admin.exists(cancel_key)
    st = cli("monitor", "stats", "--json")
    assert st.returncode == 0, st.stderr
    s = json.loads(st.stdout)
    assert s["dead"]["count"] == 1, s
    return s


def test_acl_file_loads_as_aclfile_and_as_include(acl_redis, tmp_path):
    admin = acl_redis.as_user("admin")
    assert set(admin.acl_users()) == {"default", *USERS}
    assert "off" in admin.acl_getuser("default")["flags"]
    inc = AclRedis(tmp_path / "inc", None, mode="include")
    try:
        # shipped as is: no passwords, so nobody can log in, not even admin
        for u in USERS:
            cannot_log_in(inc.as_user(u, "anything"))
            cannot_log_in(inc.as_user(u, ""))
        cannot_log_in(inc.as_user("default", ""))
    finally:
        inc.stop()


def test_default_user_can_do_nothing(acl_redis):
    r = redis.Redis(port=acl_redis.port)
    with pytest.raises(redis.exceptions.AuthenticationError, match="Authentication required"):
        r.get("redlm:requests")
    cannot_log_in(acl_redis.as_user("default", ""))
    cannot_log_in(acl_redis.as_user("worker", PW["client"]))


def test_client_may_enqueue_read_cancel_and_nothing_else(acl_redis):
    admin = acl_redis.as_user("admin")
    admin.xadd("redlm:out:client:c1", {"event": '{"seq":0}'}, id="0-1")
    admin.xadd("redlm:out:client2:c1", {"event": '{"seq":0}'}, id="0-1")
    admin.xadd("redlm:out:c1", {"event": '{"seq":0}'}, id="0-1")
    admin.xadd("redlm:jobs:fast", {"job": "{}"})
    admin.set("redlm:cache:" + "0" * 64, "[]")
    admin.xadd("redlm:dead", {"dead": "{}"})
    admin.set("redlm:worker:w1", "{}")
    admin.set("redlm:dispatcher:d1", "{}")
    c = acl_redis.as_user("client")
    # allowed: enqueue on its own intake, read its namespace's out streams,
    # cancel and subscribe there (tenant "client": ids "client:<id>")
    assert c.xadd("redlm:requests:client", {"job": '{"id":"c1","prompt":"hi"}'})
    assert c.xrange("redlm:out:client:c1") == [("0-1", {"event": '{"seq":0}'})]
    assert c.xread({"redlm:out:client:c1": "0-0"}, count=10)[0][1][0][0] == "0-1"
    assert c.set("redlm:cancel:client:c1", "1", ex=600)
    p = c.pubsub()
    p.subscribe("redlm:tok:client:c1")
    assert p.get_message(timeout=2)["type"] == "subscribe"
    p.close()
    c.ping()
    # denied: the shared intake and another tenant's, ids outside its
    # namespace (another tenant's, or the shared one)
    noperm(c.xadd, "redlm:requests", {"job": "{}"})
    noperm(c.xadd, "redlm:requests:client2", {"job": "{}"})
    for other in ("redlm:out:client2:c1", "redlm:out:c1"):
        noperm(c.xrange, other)
        noperm(c.xread, {other: "0-0"})
    noperm(c.set, "redlm:cancel:client2:c1", "1")
    noperm(c.set, "redlm:cancel:c1", "1")
    p = c.pubsub()
    with pytest.raises(redis.exceptions.NoPermissionError):
        p.subscribe("redlm:tok:client2:c1")
        p.get_message(timeout=2)
    p.close()
    # denied: the jobs streams (read, consume, or write around the dispatcher)
    noperm(c.xrange, "redlm:jobs:fast")
    noperm(c.xadd, "redlm:jobs:fast", {"job": "{}"})
    noperm(c.xreadgroup, "workers", "x", {"redlm:jobs:fast": ">"})
    noperm(c.xlen, "redlm:requests")
    noperm(c.xrange, "redlm:requests")
    noperm(c.xrange, "redlm:requests:client")  # write-only: it cannot read its own queue
    noperm(c.xtrim, "redlm:requests:client", 0)
    # the cache, dead letters, heartbeats
    noperm(c.get, "redlm:cache:" + "0" * 64)
    noperm(c.xrange, "redlm:dead")
    noperm(c.get, "redlm:worker:w1")
    noperm(c.get, "redlm:dispatcher:d1")
    # writing events, on the stream or the channel
    noperm(c.xadd, "redlm:out:client:c1", {"event": "{}"}, id="0-2")
    noperm(c.publish, "redlm:tok:client:c1", "{}")
    # SET only as the cancel: not on other keys, not reading back with GET
    noperm(c.set, "redlm:requests:client", "x")
    noperm(c.set, "redlm:out:client:c1", "x")
    noperm(c.execute_command, "SET", "redlm:cancel:client:c1", "1", "GET")
    noperm(c.delete, "redlm:cancel:client:c1")
    # the key space, the server
    noperm(c.keys, "*")
    noperm(c.scan)
    noperm(c.flushall)
    noperm(c.config_get, "*")
    noperm(c.get, "unrelated")
    assert admin.xlen("redlm:out:client:c1") == 1
    assert admin.type("redlm:requests:client") == "stream"
    assert not admin.exists("redlm:requests")


def test_worker_user_cannot_step_outside(acl_redis):
    w = acl_redis.as_user("worker")
    noperm(w.xadd, "redlm:requests", {"job": "{}"})
    noperm(w.xrange, "redlm:requests")
    noperm(w.set, "redlm:cancel:x", "1")
    noperm(w.get, "redlm:dispatcher:d1")  # reads workers' heartbeats only
    w.get("redlm:worker:w1")  # and the registry: its home shard (issue 27)
    w.mget(["redlm:worker:w1", "redlm:worker:w2"])
    w.zrange("redlm:workers", 0, -1)
    noperm(w.zrem, "redlm:workers", "w1")
    noperm(w.set, "redlm:dispatcher:d1", "{}")
    noperm(w.keys, "*")
    noperm(w.flushall)
    noperm(w.set, "redlm:jobs:fast", "x")  # streams only, with stream commands


def daemon_passwords(tmp_path):
    """Skips without a built dispatcher; else {user: password file} for the
    users worker and dispatcher."""
    from conftest import DISPATCHER
    if not DISPATCHER.exists():
        pytest.skip(f"{DISPATCHER} not built (run make)")
    pw = {}
    for u in ("worker", "dispatcher"):
        pw[u] = tmp_path / f"{u}.password"
        pw[u].write_text(PW[u] + "\n")
    return pw


def out_events(r, job_id, timeout=60):
    return job_events(r, "redlm:", job_id, timeout)


FAST = ["--claim-idle-ms", "1000", "--claim-interval-ms", "200", "--lease-renew-ms", "200"]


def test_worker_job_life_as_acl_user(built, acl_redis, tmp_path):
    pwf = tmp_path / "worker.password"
    pwf.write_text(PW["worker"] + "\n")
    auth = ["--redis-user", "worker", "--redis-password-file", str(pwf), "--publish-channel",
            "--max-batch", "4", *FAST]
    admin = acl_redis.as_user("admin")
    client = acl_redis.as_user("client")
    a = Worker(acl_redis.addr, "redlm:", "acl-a", tmp_path, auth, pools="fast")
    b = None
    try:
        def job(i, n=6, **kw):
            return {"id": i, "prompt_ids": [1, 2, 3, i.__len__()], "max_tokens": n,
                    "temperature": 0, "ignore_eos": True, **kw}

        # the dispatcher user is the one that writes jobs:<pool>; the ids
        # are in tenant client's namespace, which it may read
        disp = acl_redis.as_user("dispatcher")
        disp.xadd("redlm:jobs:fast", {"job": json.dumps(job("client:j1"))})
        first = out_events(client, "client:j1")
        assert first[-1]["finish_reason"] == "length" and not first[-1]["cached"]
        # same prompt and parameters: answered from redlm:cache:* (written
        # with the XACK, just after the done event)
        deadline = time.time() + 10
        while time.time() < deadline and not admin.keys("redlm:cache:*"):
            time.sleep(0.02)
        again = dict(job("client:j1"), id="client:j1b")
        disp.xadd("redlm:jobs:fast", {"job": json.dumps(again)})
        assert out_events(client, "client:j1b")[-1]["cached"] is True
        # cancel key set by the client before the worker admits the job
        client.set("redlm:cancel:client:jc", "1", ex=600)
        disp.xadd("redlm:jobs:fast", {"job": json.dumps(job("client:jc", n=50))})
        assert out_events(client, "client:jc")[-1]["finish_reason"] == "cancelled"
        # a malformed job goes to the dead letters
        disp.xadd("redlm:jobs:fast", {"job": "not json"})
        deadline = time.time() + 20
        while time.time() < deadline and admin.xlen("redlm:dead") == 0:
            time.sleep(0.05)
        assert admin.xlen("redlm:dead") == 1
        assert json.loads(admin.get("redlm:worker:acl-a"))["name"] == "acl-a"
        # a long job, its worker killed mid-way: another takes it over
        n_long = 3000
        disp.xadd("redlm:jobs:fast", {"job": json.dumps(job("client:jl", n=n_long))})
        deadline = time.time() + 30
        while time.time() < deadline and admin.xlen("redlm:out:client:jl") < 20:
            time.sleep(0.005)
        time.sleep(0.3)  # at least one lease renewal (XCLAIM JUSTID)
        a.kill(signal.SIGKILL)
        a.wait(10)
        assert admin.xlen("redlm:out:client:jl") < n_long + 1, "the job ended before the kill"
        b = Worker(acl_redis.addr, "redlm:", "acl-b", tmp_path, auth, pools="fast")
        evs = out_events(client, "client:jl", timeout=120)
        assert [e["seq"] for e in evs] == list(range(len(evs)))
        assert evs[-1]["usage"]["completion_tokens"] == n_long
        assert "resuming" in b.log_path.read_text()
        # acknowledged just after the done event
        deadline = time.time() + 10
        while time.time() < deadline and admin.xpending("redlm:jobs:fast", "workers")["pending"]:
            time.sleep(0.02)
        assert admin.xpending("redlm:jobs:fast", "workers")["pending"] == 0
        denied = [e for e in admin.acl_log(count=100) if e["username"] == "worker"]
        assert denied == [], denied
    finally:
        a.stop()
        if b:
            b.stop()


def test_dispatcher_and_worker_as_acl_users(built, acl_redis, tmp_path):
    """The whole path with least privilege on every hop: a client (tenant
    `client`) enqueues on redlm:requests:client, the dispatcher (user `dispatcher`) routes it, the
    worker (user `worker`) answers, the client reads the answer; then a
    cache replay by the dispatcher alone, a malformed request, and a clean
    stop (XGROUP DELCONSUMER). No ACL denial for either daemon."""
    from conftest import Dispatcher
    pw = daemon_passwords(tmp_path)
    admin = acl_redis.as_user("admin")
    client = acl_redis.as_user("client")
    d = Dispatcher(acl_redis.addr, "redlm:", "acl-d", tmp_path,
                   ["--redis-user", "dispatcher", "--redis-password-file", str(pw["dispatcher"]),
                    "--model", str(MODEL), "--think-ratio", "0", "--tenants", "client,client2"])
    w = Worker(acl_redis.addr, "redlm:", "acl-w", tmp_path,
               ["--redis-user", "worker", "--redis-password-file", str(pw["worker"])])
    try:
        job = {"prompt_ids": [9, 8, 7], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        client.xadd("redlm:requests:client", {"job": json.dumps({**job, "id": "r1"})})
        first = out_events(client, "client:r1")
        assert first[-1]["finish_reason"] == "length" and first[-1]["cached"] is False
        deadline = time.time() + 10
        while time.time() < deadline and not admin.keys("redlm:cache:*"):
            time.sleep(0.02)
        # the dispatcher answers the same job from the cache by itself
        w.stop()
        client.xadd("redlm:requests:client", {"job": json.dumps({**job, "id": "r2"})})
        assert out_events(client, "client:r2", timeout=20)[-1]["cached"] is True
        # malformed: error events to the client, a dead letter
        client.xadd("redlm:requests:client", {"job": '{"id":"bad","prompt_ids":"x"}'})
        evs = out_events(client, "client:bad", timeout=20)
        assert evs[0]["type"] == "error" and evs[-1]["finish_reason"] == "error"
        assert admin.xlen("redlm:dead") == 1
        deadline = time.time() + 10
        while time.time() < deadline and not admin.exists("redlm:dispatcher:acl-d"):
            time.sleep(0.05)
        assert json.loads(admin.get("redlm:dispatcher:acl-d"))["name"] == "acl-d"
        # the redlm command as `client` (enqueue, tail, cancel) and as
        # `monitor` (stats)
        cli = cli_as(tmp_path, acl_redis.addr)
        s = client_and_monitor_cli(cli, admin, "redlm:cancel:client:some-id")
        denied = [e for e in admin.acl_log(count=100)
                  if e["username"] in ("worker", "dispatcher", "monitor")]
        assert denied == [], denied
        # and neither can do the other's part
        assert cli("monitor", "enqueue", "--prompt-ids", "1").returncode != 0
        assert cli("client", "stats", "--json").returncode != 0
        d.signal(signal.SIGTERM)
        assert d.wait(30) == 0
        consumers = admin.xinfo_consumers("redlm:requests", "dispatchers")
        assert "acl-d" not in [c["name"] for c in consumers]
        denied = [e for e in admin.acl_log(count=100)
                  if e["username"] in ("worker", "dispatcher")]
        assert denied == [], denied
    finally:
        w.stop()
        d.stop()


def test_http_front_door_as_dispatcher_user(built, acl_redis, tmp_path):
    """The HTTP front door inside redlm-dispatcher works with the
    `dispatcher` user's rights alone: a request (XADD requests, XREAD of
    its out stream), a streamed one, per-tenant request and token limits
    (MULTI/INCR/EXPIRE/GET/EXEC, INCRBY), a client that disconnects (SET
    cancel), /healthz (PING). No ACL denial for it or the worker."""
    pw = daemon_passwords(tmp_path)
    from test_http import MODEL_NAME, Front, stream_and_hang_up
    keys = tmp_path / "api-keys"
    keys.write_text("sk-acl-00000001 team-a 100 100000\n")
    admin = acl_redis.as_user("admin")
    f = Front(acl_redis.addr, "redlm:", tmp_path,
              ["--redis-user", "dispatcher", "--redis-password-file", str(pw["dispatcher"]),
               "--api-keys-file", str(keys)])
    w = Worker(acl_redis.addr, "redlm:", "acl-hw", tmp_path,
               ["--redis-user", "worker", "--redis-password-file", str(pw["worker"])])
    auth = {"Authorization": "Bearer sk-acl-00000001"}
    try:
        msgs = [{"role": "user", "content": "Hello"}]
        status, _, data = f.request("POST", "/v1/chat/completions",
                                    {"model": MODEL_NAME, "messages": msgs, "max_tokens": 5,
                                     "ignore_eos": True}, auth)
        assert status == 200, data
        assert json.loads(data)["usage"]["completion_tokens"] == 5
        status, _, data = f.request("POST", "/v1/chat/completions",
                                    {"model": MODEL_NAME, "messages": msgs, "max_tokens": 5,
                                     "ignore_eos": True, "stream": True}, auth)
        assert status == 200 and data.rstrip().endswith(b"data: [DONE]"), data
        assert admin.keys("redlm:ratelimit:team-a:*")  # the counters were written
        # a client that goes away mid-stream: its job is cancelled
        job_id = stream_and_hang_up(f.port, msgs, "Authorization: Bearer sk-acl-00000001\r\n")
        done = out_events(admin, job_id)[-1]
        assert done["finish_reason"] == "cancelled"
        assert f.request("GET", "/healthz")[0] == 200
        # a stored response (SET EX), continued twice (GETEX of the record and
        # its chain; SET of the next with EXPIRE of its chain), read, and
        # deleted (SET KEEPTTL XX: a tombstone the next one still reads)
        body = {"model": MODEL_NAME, "input": "Hello", "max_output_tokens": 3,
                "reasoning": {"effort": "low"}}
        status, _, data = f.request("POST", "/v1/responses", body, auth)
        assert status == 200 and json.loads(data)["store"] is True, data
        rid = json.loads(data)["id"]
        chained = rid
        for _ in range(2):
            status, _, data = f.request("POST", "/v1/responses",
                                        {**body, "previous_response_id": chained}, auth)
            assert status == 200 and json.loads(data)["store"] is True, data
            chained = json.loads(data)["id"]
        assert json.loads(admin.get(f"redlm:response:{chained}"))["chain"][0] == rid
        assert f.request("GET", f"/v1/responses/{rid}", None, auth)[0] == 200
        assert f.request("DELETE", f"/v1/responses/{rid}", None, auth)[0] == 200
        assert json.loads(admin.get(f"redlm:response:{rid}"))["deleted"] is True
        assert f.request("GET", f"/v1/responses/{rid}", None, auth)[0] == 404
        status, _, data = f.request("POST", "/v1/responses",
                                    {**body, "previous_response_id": chained}, auth)
        assert status == 200, data
        # a background one, polled from its job's events (XREVRANGE, XRANGE)
        status, _, data = f.request("POST", "/v1/responses", {**body, "background": True}, auth)
        assert status == 200 and json.loads(data)["status"] == "queued", data
        bid = json.loads(data)["id"]

        def ended():
            s, _, d = f.request("GET", f"/v1/responses/{bid}", None, auth)
            assert s == 200, d
            return json.loads(d)["status"] not in ("queued", "in_progress")
        wait_for(ended, "the background response ended", timeout=60)
        # the events came through the shared reader, as the dispatcher user,
        # blocked on the bell the worker rang
        assert [c["user"] for c in admin.client_list()
                if c["name"] == "redlm-http-xmux"] == ["dispatcher"]
        assert admin.xlen("redlm:bell") > 0
        assert "not on the bell" not in f.log_path.read_text()
        assert "not ringing" not in w.text()
        denied = [e for e in admin.acl_log(count=100)
                  if e["username"] in ("worker", "dispatcher")]
        assert denied == [], denied
    finally:
        w.stop()
        f.stop()


@contextlib.contextmanager
def served_with_an_older_acl(tmp_path, lines, name, worker_args=()):
    """A redis-server with these ACL lines, a front door and a worker (with
    worker_args) as their users, and a plain and a streamed request through
    them (each checked served): yields (front door, worker, the admin's
    connection)."""
    assert lines != acl_lines()
    srv = AclRedis(tmp_path / "redis-old", with_passwords(lines))
    pw = daemon_passwords(tmp_path)
    from test_http import MODEL_NAME, Front
    f = Front(srv.addr, "redlm:", tmp_path,
              ["--redis-user", "dispatcher", "--redis-password-file", str(pw["dispatcher"])])
    w = Worker(srv.addr, "redlm:", name, tmp_path,
               ["--redis-user", "worker", "--redis-password-file", str(pw["worker"]),
                *worker_args])
    try:
        for stream in (False, True):
            status, _, data = f.request("POST", "/v1/chat/completions",
                                        {"model": MODEL_NAME, "stream": stream, "max_tokens": 5,
                                         "ignore_eos": True,
                                         "messages": [{"role": "user", "content": "Hello"}]})
            assert status == 200, data
        assert data.rstrip().endswith(b"data: [DONE]"), data
        yield f, w, srv.as_user("admin")
    finally:
        w.stop()
        f.stop()
        srv.stop()


def test_runtime_lora_as_acl_users(built, acl_redis, tmp_path):
    """A runtime LoRA load and unload through the front door (common/
    lorafleet.c) with the `dispatcher` user's rights (HSETNX, HGET, HEXISTS,
    HDEL, the withdrawal script on loras:*) and the worker following it with
    the `worker` user's (HGETALL with its heartbeat): both answer, and
    neither daemon meets a denial."""
    pw = daemon_passwords(tmp_path)
    from test_http import Front
    root = tmp_path / "adapters"
    p = subprocess.run([str(CLI), "mkmodel", "--lora-of", str(MODEL), "--lora-rank", "4",
                        "--out", str(root / "a")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    admin = acl_redis.as_user("admin")
    f = Front(acl_redis.addr, "redlm:", tmp_path,
              ["--redis-user", "dispatcher", "--redis-password-file", str(pw["dispatcher"]),
               "--runtime-lora"])
    w = Worker(acl_redis.addr, "redlm:", "acl-lw", tmp_path,
               ["--redis-user", "worker", "--redis-password-file", str(pw["worker"]),
                "--lora-dirs", str(root), "--heartbeat-interval-ms", "300"])
    try:
        wait_for(lambda: admin.get("redlm:worker:acl-lw"), "the worker's heartbeat", 10)
        status, _, data = f.request("POST", "/v1/load_lora_adapter",
                                    {"lora_name": "a", "lora_path": "a"})
        assert status == 200 and data.startswith(b"Success:"), data
        hb = json.loads(admin.get("redlm:worker:acl-lw"))
        assert [x["name"] for x in hb["lora_adapters"]] == ["a"], hb
        # a load nobody can follow is withdrawn by the script
        status, _, data = f.request("POST", "/v1/load_lora_adapter",
                                    {"lora_name": "b", "lora_path": "nowhere"})
        assert status == 400 and b"no such directory" in data, data
        assert admin.hkeys(f"redlm:loras:{hb['model']}") == ["a"]
        status, _, data = f.request("POST", "/v1/unload_lora_adapter", {"lora_name": "a"})
        assert status == 200 and data.startswith(b"Success:"), data
        assert not admin.exists(f"redlm:loras:{hb['model']}")
        denied = [e for e in admin.acl_log(count=100)
                  if e["username"] in ("worker", "dispatcher")]
        assert denied == [], denied
    finally:
        w.stop()
        f.stop()


def test_http_front_door_with_an_acl_from_before_the_shared_reader(built, tmp_path):
    """An ACL written before the front door read every stream with one XREAD
    (its dispatcher user lacks client|id and client|unblock): the front door
    says so once and each request reads its own stream, as before."""
    lines = [l.replace(" +client|id +client|unblock", "") if l.split()[1] == "dispatcher" else l
             for l in acl_lines()]
    with served_with_an_older_acl(tmp_path, lines, "acl-old") as (f, _, admin):
        log = f.log_path.read_text()
        assert "every request reads its own event stream: CLIENT ID: NOPERM" in log, log
        names = [c["name"] for c in admin.client_list()]
        assert "redlm-http-xmux" not in names, names


def test_an_acl_from_before_the_bell(built, tmp_path):
    """An ACL written before the bell (no ~redlm:bell for the worker or the
    dispatcher): the worker says once that it does not ring, the front door
    that its shared reader blocks on every stream, and requests are served
    as before; nothing but their one probe each is refused."""
    lines = [l.replace(" ~redlm:bell", "") for l in acl_lines()]
    with served_with_an_older_acl(tmp_path, lines, "acl-nobell") as (f, w, admin):
        log = f.log_path.read_text()
        assert "the shared reader blocks on every stream, not on the bell" in log, log
        assert w.text().count("not ringing redlm:bell") == 1, w.text()
        names = [c["name"] for c in admin.client_list()]
        assert "redlm-http-xmux" in names, names
        assert not admin.exists("redlm:bell")
        denied = [e for e in admin.acl_log(count=100) if e["username"] in ("worker", "dispatcher")]
        assert denied and all(e["object"] in ("redlm:bell", "xadd", "xread", "eval")
                              for e in denied), denied


def test_an_acl_from_before_stored_responses(built, tmp_path):
    """An ACL written before stored responses (no ~redlm:response:* for the
    dispatcher): a Responses request is still answered in full; that it was
    not kept is said in the log and counted, and chaining on it is a clear
    503 naming Redis's refusal, not a hang or a crash."""
    lines = [l.replace(" (~redlm:response:* +set +getex +del +expire)", "") for l in acl_lines()]
    assert lines != acl_lines()
    from test_http import MODEL_NAME
    with served_with_an_older_acl(tmp_path, lines, "acl-nostore") as (f, _, admin):
        body = {"model": MODEL_NAME, "input": "Hello", "max_output_tokens": 4,
                "reasoning": {"effort": "low"}}
        status, _, data = f.request("POST", "/v1/responses", body)
        assert status == 200 and json.loads(data)["usage"]["output_tokens"] == 4, data
        rid = json.loads(data)["id"]
        assert not admin.exists(f"redlm:response:{rid}")
        log = f.log_path.read_text()
        assert f"http: {rid}: the response is not stored" in log and "NOPERM" in log, log
        status, _, data = f.request("GET", "/metrics")
        assert b"redlm_http_responses_store_failures_total 1" in data, data
        status, _, data = f.request("POST", "/v1/responses",
                                    {**body, "previous_response_id": rid})
        assert status == 503 and b"could not be read" in data, data


def test_an_acl_without_xautoclaim_still_reads_jobs_after_memory_pressure(built, tmp_path):
    """After memory pressure a worker claims the jobs handed back before it
    reads new ones (worker/resume.c w_reclaim_first). With an ACL that does
    not let it claim (no XAUTOCLAIM), waiting for that would stop it reading
    jobs for ever: it says so once and reads new jobs again. A moment of
    Redis refusing writes while job A runs in the worker's one slot (so no
    read of its is out to bring B early), then job B must still run."""
    lines = [l.replace(" +xautoclaim", "") if l.split()[1] == "worker" else l
             for l in acl_lines()]
    with served_with_an_older_acl(tmp_path, lines, "acl-noclaim",
                                  ("--max-batch", "1")) as (f, w, admin):
        def job(jid, n):
            return {"job": json.dumps({"id": jid, "prompt_ids": [5, 9, 2], "max_tokens": n,
                                       "temperature": 0, "ignore_eos": True})}

        admin.xadd("redlm:jobs:fast", job("noclaim-a", 400))
        wait_for(lambda: admin.xlen("redlm:out:noclaim-a") >= 3, "A's first events")
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", str(admin.info("memory")["used_memory"] - 100 * 1024))
        wait_for(lambda: "is out of memory" in w.text(), "an OOM refusal")
        admin.config_set("maxmemory", "0")
        wait_for(lambda: "stores again" in w.text(), "the end of the refusals")
        admin.xadd("redlm:jobs:fast", job("noclaim-b", 5))
        for jid, n in (("noclaim-a", 400), ("noclaim-b", 5)):
            evs = job_events(admin, "redlm:", jid, timeout=60)
            assert evs[-1]["type"] == "done", (jid, evs[-1])
            assert evs[-1]["usage"]["completion_tokens"] == n, (jid, evs[-1])
        assert w.text().count("cannot claim the jobs handed back first") == 1, w.text()


# --- the same file on a Redis Cluster (issue 19) -----------------------------
# Every node of a 3-master + 3-replica cluster loads the ACL (conftest's
# RedisCluster with aclfile=); the fixture itself logs in as admin. The
# queue keys carry the prefix as hash tag ({redlm:}requests, {redlm:}jobs:*,
# {redlm:}dead), the per-request ones the id (redlm:out:{id}, cancel:{id},
# tok:{id}, own:{id}): the one file's patterns name both layouts.

@pytest.fixture
def acl_cluster(tmp_path):
    from conftest import RedisCluster
    acl = tmp_path / "users.acl"
    acl.write_text("\n".join(with_passwords(acl_lines())) + "\n")
    c = RedisCluster(tmp_path / "cluster", aclfile=acl, auth=("admin", PW["admin"]))
    yield c
    c.stop()


def cluster_denials(cluster, users):
    """ACL LOG entries of users on every running node."""
    return [dict(e, node=p) for p in cluster.running()
            for e in cluster.node(p).acl_log(count=100) if e["username"] in users]


def on_slot(cluster, user, key):
    """A plain connection as user to the master that serves key: what a
    role's own cluster client would reach, so a refusal is the ACL's, not
    a MOVED."""
    n = cluster.node(cluster.ports[0])
    slot = n.execute_command("CLUSTER", "KEYSLOT", key)
    for lo, hi, master, *_ in n.execute_command("CLUSTER", "SLOTS"):
        if lo <= slot <= hi:
            return redis.Redis(port=int(master[1]), username=user, password=PW[user],
                               decode_responses=True)
    raise AssertionError(f"no master for slot {slot}")


def cluster_events(cluster, user, job_id, timeout=60):
    """The events of job_id read as user from out:{job_id}'s master."""
    from conftest import stream_events
    key = f"redlm:out:{{{job_id}}}"
    return [ev for _, ev in stream_events(on_slot(cluster, user, key), key, timeout)]


def test_an_acl_with_the_single_bell_on_cluster(built, tmp_path):
    """An ACL that grants the single instance's bell alone (`~redlm:bell`,
    before the cluster's per-slot bells): on a cluster the worker and the
    dispatcher find that they may not ring a slot's bell and say so once;
    their scripts then name no bell (an EVALSHA naming a key the ACL refuses
    would be refused whole), and jobs are served."""
    from conftest import Dispatcher, RedisCluster
    lines = [l.replace("~redlm:bell*", "~redlm:bell") for l in acl_lines()]
    assert lines != acl_lines()
    acl = tmp_path / "users.acl"
    acl.write_text("\n".join(with_passwords(lines)) + "\n")
    c = RedisCluster(tmp_path / "cluster", aclfile=acl, auth=("admin", PW["admin"]))
    pw = daemon_passwords(tmp_path)
    d = w = None
    try:
        d = Dispatcher(c.seeds, "redlm:", "acl-bd", tmp_path,
                       ["--redis-user", "dispatcher", "--redis-password-file", str(pw["dispatcher"]),
                        "--model", str(MODEL), "--think-ratio", "0", "--tenants", "client"])
        w = Worker(c.seeds, "redlm:", "acl-bw", tmp_path,
                   ["--redis-user", "worker", "--redis-password-file", str(pw["worker"]), *FAST])
        client = on_slot(c, "client", "{redlm:}requests:client")
        job = {"prompt_ids": [9, 8, 7], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        for jid in ("b1", "b2"):
            client.xadd("{redlm:}requests:client", {"job": json.dumps({**job, "id": jid})})
            evs = cluster_events(c, "client", f"client:{jid}")
            assert [e["seq"] for e in evs] == list(range(len(evs)))
            assert evs[-1]["finish_reason"] == "length", evs[-1]
        assert w.text().count("not ringing redlm:bell{") == 1, w.text()
        assert d.text().count("not ringing redlm:bell{") == 1, d.text()
        denied = cluster_denials(c, ("worker", "dispatcher"))
        assert denied and all(e["object"].startswith("redlm:bell{") for e in denied), denied
    finally:
        for p in (w, d):
            if p:
                p.stop()
        c.stop()


def test_an_acl_from_before_aged_looks_on_cluster(built, tmp_path):
    """An ACL from before a busy worker's looks at other shards took only
    jobs that waited steal_ms (the worker without TIME and without XRANGE on
    the pool keys): its first look is refused, it says so once and looks as
    before, so a job waiting in another shard is still taken; nothing but
    those two commands is refused."""
    from conftest import RedisCluster, pool_shards
    lines = [l.replace(" +script|load +time", " +script|load").replace(
        " +xgroup|create +xrange)", " +xgroup|create)") if l.split()[1] == "worker" else l
        for l in acl_lines()]
    assert lines != acl_lines()
    acl = tmp_path / "users.acl"
    acl.write_text("\n".join(with_passwords(lines)) + "\n")
    c = RedisCluster(tmp_path / "cluster", aclfile=acl, auth=("admin", PW["admin"]))
    pw = daemon_passwords(tmp_path)
    w = None
    try:
        w = Worker(c.seeds, "redlm:", "acl-aw", tmp_path,
                   ["--redis-user", "worker", "--redis-password-file", str(pw["worker"]),
                    "--home-shard", "0", "--max-batch", "4", "--steal-ms", "50"])
        admin = c.client()
        keys = pool_shards("redlm:", "fast", 3)
        long = {"id": "client:L", "prompt_ids": [3, 1, 4], "max_tokens": 40000,
                "temperature": 0, "ignore_eos": True}
        admin.xadd(keys[0], {"job": json.dumps(long)})  # its home: it runs it, with room left
        deadline = time.time() + 60
        while not admin.hget("redlm:own:{client:L}", "holder"):
            assert time.time() < deadline, "the worker did not take its home shard's job"
            time.sleep(0.02)
        # its reads on the other shards, sent while it was idle, end with
        # their BLOCK; then it looks, and the first look is refused
        while not cluster_denials(c, ("worker",)):
            assert time.time() < deadline, "the busy worker never looked at another shard"
            time.sleep(0.02)
        job = {"id": "client:x", "prompt_ids": [9, 8, 7], "max_tokens": 6, "temperature": 0,
               "ignore_eos": True}
        admin.xadd(keys[1], {"job": json.dumps(job)})  # another shard's, no worker of its own
        evs = cluster_events(c, "client", "client:x")
        assert [e["seq"] for e in evs] == list(range(len(evs)))
        assert evs[-1]["finish_reason"] == "length", evs[-1]
        admin.set("redlm:cancel:{client:L}", "1", ex=600)
        assert cluster_events(c, "client", "client:L")[-1]["finish_reason"] == "cancelled"
        assert w.text().count("looks at other shards take any waiting job from now on") == 1, \
            w.text()
        denied = cluster_denials(c, ("worker",))
        assert denied and all(e["object"] in ("time", "xrange") for e in denied), denied
    finally:
        if w:
            w.stop()
        c.stop()


def test_acl_users_serve_jobs_on_cluster(built, acl_cluster, tmp_path):
    """The whole path on a cluster with least privilege on every hop: a web
    backend (user `client`, on the master of each key it touches) enqueues on
    {redlm:}requests:client, the dispatcher routes it, the worker
    answers on out:{id}; a direct pool job, a cancel, a cache replay, a
    malformed request, a worker killed mid-job and its job taken over, the
    redlm command as client and monitor. No ACL denial on any node."""
    from conftest import Dispatcher
    pw = daemon_passwords(tmp_path)
    seeds = acl_cluster.seeds
    admin = acl_cluster.client()
    client = on_slot(acl_cluster, "client", "{redlm:}requests:client")
    disp = ["--redis-user", "dispatcher", "--redis-password-file", str(pw["dispatcher"])]
    wauth = ["--redis-user", "worker", "--redis-password-file", str(pw["worker"]), *FAST,
             "--publish-channel"]
    d = Dispatcher(seeds, "redlm:", "acl-cd", tmp_path,
                   [*disp, "--model", str(MODEL), "--think-ratio", "0", "--tenants", "client,client2"])
    a = Worker(seeds, "redlm:", "acl-ca", tmp_path, wauth)
    b = None
    try:
        job = {"prompt_ids": [9, 8, 7], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        client.xadd("{redlm:}requests:client", {"job": json.dumps({**job, "id": "r1"})})
        first = cluster_events(acl_cluster, "client", "client:r1")
        assert first[-1]["finish_reason"] == "length" and first[-1]["cached"] is False
        assert not admin.exists("redlm:out:client:r1")  # the tagged layout, not the single one
        # straight to a pool, as the dispatcher user (a deployment that feeds pools)
        on_slot(acl_cluster, "dispatcher", "{redlm:}jobs:fast").xadd(
            "{redlm:}jobs:fast", {"job": json.dumps({**job, "prompt_ids": [5, 4], "id": "client:p1"})})
        assert cluster_events(acl_cluster, "client", "client:p1")[-1]["finish_reason"] == "length"
        # the client's cancel lands in the slot the worker checks
        on_slot(acl_cluster, "client", "redlm:cancel:{client:jc}").set("redlm:cancel:{client:jc}", "1",
                                                                    ex=600)
        client.xadd("{redlm:}requests:client",
                    {"job": json.dumps({**job, "id": "jc", "max_tokens": 50, "cache": False})})
        assert cluster_events(acl_cluster, "client", "client:jc")[-1]["finish_reason"] == "cancelled"
        # token pub/sub on tok:{id}
        p = on_slot(acl_cluster, "client", "redlm:tok:{client:js}").pubsub()
        p.subscribe("redlm:tok:{client:js}")
        assert p.get_message(timeout=2)["type"] == "subscribe"
        client.xadd("{redlm:}requests:client",
                    {"job": json.dumps({**job, "id": "js", "prompt_ids": [3, 3], "cache": False})})
        assert cluster_events(acl_cluster, "client", "client:js")[-1]["finish_reason"] == "length"
        deadline, got = time.time() + 10, None
        while got is None and time.time() < deadline:
            got = p.get_message(timeout=0.2, ignore_subscribe_messages=True)
        assert got and got["channel"] == "redlm:tok:{client:js}", got
        p.close()
        # a long job, its worker killed mid-way: another takes it over
        n_long = 3000
        client.xadd("{redlm:}requests:client", {"job": json.dumps(
            {**job, "id": "jl", "max_tokens": n_long, "cache": False})})
        deadline = time.time() + 30
        while time.time() < deadline and admin.xlen("redlm:out:{client:jl}") < 20:
            time.sleep(0.005)
        time.sleep(0.3)  # at least one lease renewal
        a.kill(signal.SIGKILL)
        a.wait(10)
        assert admin.xlen("redlm:out:{client:jl}") < n_long + 1, "the job ended before the kill"
        b = Worker(seeds, "redlm:", "acl-cb", tmp_path, wauth)
        evs = cluster_events(acl_cluster, "client", "client:jl", timeout=120)
        assert [e["seq"] for e in evs] == list(range(len(evs)))
        assert evs[-1]["usage"]["completion_tokens"] == n_long
        assert "resuming" in b.log_path.read_text()
        # the dispatcher answers r1's twin from the cache by itself
        deadline = time.time() + 10
        while not list(admin.scan_iter(match="redlm:cache:*", target_nodes="primaries")):
            assert time.time() < deadline, "no cache entry written"
            time.sleep(0.05)
        b.stop()
        client.xadd("{redlm:}requests:client", {"job": json.dumps({**job, "id": "r2"})})
        assert cluster_events(acl_cluster, "client", "client:r2", timeout=20)[-1]["cached"] is True
        # malformed: error events to the client, a dead letter
        client.xadd("{redlm:}requests:client", {"job": '{"id":"bad","prompt_ids":"x"}'})
        evs = cluster_events(acl_cluster, "client", "client:bad", timeout=20)
        assert evs[0]["type"] == "error" and evs[-1]["finish_reason"] == "error"
        assert admin.xlen("{redlm:}dead") == 1

        cli = cli_as(tmp_path, seeds)
        s = client_and_monitor_cli(cli, admin, "redlm:cancel:{client:some-id}")
        pools = {p["name"]: p for p in s["pools"]}
        assert pools["fast"]["key"] == "{redlm:}jobs:fast", s
        assert {w["name"] for w in s["workers"]} >= {"acl-cb"}, s
        d.signal(signal.SIGTERM)
        assert d.wait(30) == 0
        consumers = admin.xinfo_consumers("{redlm:}requests", "dispatchers")
        assert "acl-cd" not in [c["name"] for c in consumers]
        denied = cluster_denials(acl_cluster, ("worker", "dispatcher", "client", "monitor"))
        assert denied == [], denied
    finally:
        a.stop()
        if b:
            b.stop()
        d.stop()


def test_roles_refused_on_cluster(acl_cluster):
    """Each role, on the master of the key it reaches for, is still refused
    what is not its part; the default user can do nothing on any node."""
    for p in acl_cluster.running():
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=p).get("{redlm:}requests")
    admin = acl_cluster.client()
    admin.xadd("{redlm:}jobs:fast", {"job": "{}"})
    admin.set("redlm:worker:w1", "{}")

    def no(user, key, fn, *args, **kw):
        r = on_slot(acl_cluster, user, key)
        noperm(getattr(r, fn), key, *args, **kw)

    # client: around the dispatcher, the cache, the dead letters, writing events
    no("client", "{redlm:}jobs:fast", "xadd", {"job": "{}"})
    no("client", "{redlm:}jobs:fast", "xrange")
    no("client", "{redlm:}dead", "xrange")
    no("client", "redlm:cache:" + "0" * 64, "get")
    no("client", "redlm:out:{c1}", "xadd", {"event": "{}"})
    no("client", "{redlm:}requests", "set", "x")
    noperm(on_slot(acl_cluster, "client", "redlm:cancel:{c1}").execute_command,
           "SET", "redlm:cancel:{c1}", "1", "GET")
    # worker: requests, cancels, dispatchers' heartbeats (workers' it reads,
    # for its home shard); its scripts reach only its keys, and what a
    # script calls is checked like a direct call
    no("worker", "{redlm:}requests", "xadd", {"job": "{}"})
    no("worker", "redlm:cancel:{x}", "set", "1")
    no("worker", "redlm:dispatcher:d1", "get")
    no("worker", "redlm:own:{x}", "set", "1")
    w = on_slot(acl_cluster, "worker", "{redlm:}requests")
    noperm(w.eval, "return 1", 1, "{redlm:}requests")
    wo = on_slot(acl_cluster, "worker", "redlm:own:{x}")
    with pytest.raises(redis.exceptions.ResponseError, match="can't run this command"):
        wo.eval("return redis.call('DEL', KEYS[1])", 1, "redlm:own:{x}")
    assert wo.eval("return redis.call('HSET', KEYS[1], 'holder', 'w')", 1, "redlm:own:{x}") == 1
    # dispatcher: consuming jobs, writing the cache, reading cancels, scripts
    noperm(on_slot(acl_cluster, "dispatcher", "{redlm:}jobs:fast").xreadgroup,
           "workers", "x", {"{redlm:}jobs:fast": ">"})
    no("dispatcher", "redlm:cache:" + "0" * 64, "set", "[]")
    no("dispatcher", "redlm:cancel:{x}", "get")
    # its sweep of offer streams (issue 27) runs scripts on jobs:*, but a
    # script of its can neither consume jobs nor delete a stream
    dj = on_slot(acl_cluster, "dispatcher", "{redlm:}jobs:fast")
    with pytest.raises(redis.exceptions.ResponseError, match="can't (run this command|access)"):
        dj.eval("return redis.call('XREADGROUP', 'GROUP', 'workers', 'x', 'STREAMS', KEYS[1], '>')",
                1, "{redlm:}jobs:fast")
    with pytest.raises(redis.exceptions.ResponseError, match="can't (run this command|access)"):
        dj.eval("return redis.call('DEL', KEYS[1])", 1, "{redlm:}jobs:fast")
    # client: another tenant's intake and namespace
    no("client", "{redlm:}requests:client2", "xadd", {"job": "{}"})
    no("client", "{redlm:}requests", "xadd", {"job": "{}"})
    no("client", "redlm:out:{client2:x}", "xrange")
    no("client", "redlm:out:{x}", "xrange")
    no("client", "redlm:cancel:{client2:x}", "set", "1")
    # monitor: read-only, and no out:*, cache:* or cancel:*
    no("monitor", "{redlm:}jobs:fast", "xadd", {"job": "{}"})
    no("monitor", "redlm:out:{x}", "xrange")
    no("monitor", "redlm:cancel:{x}", "get")
    no("monitor", "redlm:worker:w1", "set", "{}")
    # nobody but admin reconfigures the cluster
    for u in ("worker", "dispatcher", "client", "monitor"):
        r = on_slot(acl_cluster, u, "x")
        noperm(r.execute_command, "CLUSTER", "FAILOVER")
        noperm(r.execute_command, "CLUSTER", "NODES")
        noperm(r.flushall)
