"""Hostile input and start-up order (issue 14), against real processes and a
real redis-server:

  - a job id with \\u0000 in it ("req-42\\u0000zz") is BAD_ID at the worker
    and at the dispatcher: it gets a dead letter, is logged, and never
    writes into the stream of the id it would be cut to ("req-42"), whose
    own job runs untouched; through the HTTP front door (which makes its
    own ids) a NUL in message content is a 400 BAD_VALUE, never a cut
    prompt, and nothing reaches the queue;
  - dead letters of jobs with invalid UTF-8, raw NUL bytes or 10 MB of
    text are valid UTF-8 JSON (a strict decoder and parser read them),
    schema-valid, and bounded, with the size received noted;
  - the worker and the dispatcher tell systemd READY=1 (and log "ready:")
    only once Redis has answered: not while it is unreachable, and at once
    when it comes up.
"""
import json
import os
import subprocess
import time

import pytest
import redis

from conftest import (DISPATCHER, MODEL, ROOT, WORKER, Client, check_stream, connect,
                      free_port)

NUL_ID = '{"id":"req-42\\u0000zz","prompt_ids":[9,8,7],"max_tokens":3,"temperature":0,' \
         '"ignore_eos":true,"cache":false}'
GOOD = {"id": "req-42", "prompt_ids": [1, 2, 3], "max_tokens": 6, "temperature": 0,
        "ignore_eos": True, "cache": False}
NUL_CONTENT = '{"id":"nulc","messages":[{"role":"user","content":"hi\\u0000there"}],' \
              '"max_tokens":3}'


def strict_json(raw: bytes):
    """Decodes as strict UTF-8 and parses as strict RFC 8259 JSON (no NaN,
    no Infinity, no duplicate keys)."""
    text = raw.decode("utf-8", errors="strict")

    def no_dups(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), keys
        return dict(pairs)

    def no_const(c):
        raise ValueError(f"not JSON: {c}")

    return json.loads(text, object_pairs_hook=no_dups, parse_constant=no_const)


def dead_letters(addr, prefix, n, timeout=20):
    """The first n dead letters as (raw bytes, parsed)."""
    rb = redis.Redis(host=addr.rsplit(":", 1)[0], port=int(addr.rsplit(":", 1)[1]))
    deadline = time.time() + timeout
    while rb.xlen(f"{prefix}dead") < n:
        assert time.time() < deadline, rb.xlen(f"{prefix}dead")
        time.sleep(0.02)
    return [(f[b"dead"], strict_json(f[b"dead"])) for _, f in rb.xrange(f"{prefix}dead")]


def test_nul_id_at_the_worker(workers, client, redis_addr, prefix, event_validator,
                              dead_validator):
    w = workers("w1")
    client.submit(None, raw=NUL_ID)
    client.submit(None, raw=NUL_CONTENT)
    client.submit(GOOD)
    tokens, done = check_stream(client.events("req-42", timeout=20), event_validator)
    assert len(tokens) == 6 and done["finish_reason"] == "length"
    evs = client.events("nulc", timeout=20)
    check_stream(evs, event_validator)
    assert evs[0][1]["type"] == "error" and evs[0][1]["code"] == "BAD_VALUE"
    assert "NUL" in evs[0][1]["message"]
    dls = {d["code"]: d for _, d in dead_letters(redis_addr, prefix, 2)}
    for d in dls.values():
        dead_validator.validate(d)
    assert dls["BAD_ID"]["id"] == "" and "NUL" in dls["BAD_ID"]["message"]
    assert dls["BAD_ID"]["job"] == NUL_ID  # the escape is text: kept whole
    assert dls["BAD_VALUE"]["id"] == "nulc"
    assert "BAD_ID" in w.text()
    # the stream of req-42 holds req-42's job and nothing else
    assert client.r.xlen(f"{prefix}out:req-42") == len(client.events("req-42", timeout=5))


def test_nul_id_at_the_dispatcher(dispatchers, redis_addr, prefix, event_validator,
                                  dead_validator):
    d = dispatchers("d1")
    r = connect(redis_addr)
    r.xadd(f"{prefix}requests", {"job": NUL_ID})
    r.xadd(f"{prefix}requests", {"job": NUL_CONTENT})
    r.xadd(f"{prefix}requests", {"job": json.dumps(GOOD)})
    dls = {dl["code"]: dl for _, dl in dead_letters(redis_addr, prefix, 2)}
    for dl in dls.values():
        dead_validator.validate(dl)
    assert dls["BAD_ID"]["id"] == "" and dls["BAD_ID"]["worker"] == "d1"
    assert dls["BAD_VALUE"]["id"] == "nulc"
    deadline = time.time() + 10
    while r.xlen(f"{prefix}jobs:fast") + r.xlen(f"{prefix}jobs:think") < 1:
        assert time.time() < deadline
        time.sleep(0.02)
    time.sleep(0.3)
    # only the good job went on, and nothing was written under req-42
    forwarded = [json.loads(f["job"])["id"] for pool in ("fast", "think")
                 for _, f in r.xrange(f"{prefix}jobs:{pool}")]
    assert forwarded == ["req-42"]
    assert r.xlen(f"{prefix}out:req-42") == 0
    evs = Client(redis_addr, prefix).events("nulc", timeout=5)
    assert evs[0][1]["code"] == "BAD_VALUE"
    assert "BAD_ID" in d.text()


def test_nul_in_http_content_is_refused_not_cut(built, redis_addr, prefix, tmp_path):
    from test_http import MODEL_NAME, Front
    if not DISPATCHER.exists():
        pytest.skip(f"{DISPATCHER} is not built (run make)")
    f = Front(redis_addr, prefix, tmp_path)
    try:
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi\x00there"}]}
        st, _, data = f.request("POST", "/v1/chat/completions", body)
        err = json.loads(data)["error"]
        assert st == 400 and err["code"] == "BAD_VALUE" and "NUL" in err["message"], data
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}],
                "stop": ["a\x00b"]}
        st, _, data = f.request("POST", "/v1/chat/completions", body)
        assert st == 400 and json.loads(data)["error"]["code"] == "BAD_VALUE", data
        assert connect(redis_addr).xlen(f"{prefix}requests") == 0
    finally:
        f.stop()


def hostile_jobs():
    big = b'{"prompt":"' + b"x" * (10 << 20) + b'"}'
    return [
        (b'{"prompt":"caf\xe9 \xff\xfe","id":"u1"}', "BAD_UTF8"),
        (b'{"prompt":"a\x00b"}', "INVALID_JSON"),
        (b'{"prompt":"\xed\xa0\x80 surrogate"}', "BAD_UTF8"),
        (big, "JOB_TOO_LARGE"),
    ]


def send_hostile(addr, key):
    """XADDs every hostile job, as raw bytes, to the stream at key; returns
    (entry id, job bytes, code) of each."""
    rb = redis.Redis(host=addr.rsplit(":", 1)[0], port=int(addr.rsplit(":", 1)[1]))
    return [(rb.xadd(key, {"job": job}), job, code) for job, code in hostile_jobs()]


def check_hostile_dead_letters(addr, prefix, dead_validator, sent):
    """sent: (entry id, job bytes, code) of each hostile job."""
    got = {dl["entry_id"]: (raw, dl) for raw, dl in dead_letters(addr, prefix, len(sent))}
    assert len(got) == len(sent)
    for eid, job, code in sent:
        raw_dl, dl = got[eid.decode()]
        dead_validator.validate(dl)
        assert dl["code"] == code
        assert len(raw_dl) < 20000, len(raw_dl)  # a 10 MB job: a small letter
        dirty = not job.isascii() or b"\x00" in job
        assert dl["job_bytes"] == len(job)
        assert dl["job_truncated"] == (len(job) >= 16384)
        assert (dl["job_replaced_bytes"] > 0) == dirty
        if not dl["job_truncated"]:
            assert len(dl["job"].encode()) == len(job) + 2 * dl["job_replaced_bytes"]
        assert "\ufffd" in dl["job"] or not dirty


def test_dead_letters_of_bad_bytes_are_strict_json_worker(workers, redis_addr, prefix,
                                                          dead_validator):
    workers("w1")
    check_hostile_dead_letters(redis_addr, prefix, dead_validator,
                               send_hostile(redis_addr, f"{prefix}jobs:fast"))


def test_dead_letters_of_bad_bytes_are_strict_json_dispatcher(dispatchers, redis_addr, prefix,
                                                              dead_validator):
    dispatchers("d1")
    check_hostile_dead_letters(redis_addr, prefix, dead_validator,
                               send_hostile(redis_addr, f"{prefix}requests"))


def notify_socket(tmp_path):
    from test_systemd import Notify
    return Notify(tmp_path / "notify.sock")


def test_ready_only_after_redis_answers(built, prefix, tmp_path):
    port = free_port()
    addr = f"127.0.0.1:{port}"
    notify = notify_socket(tmp_path)
    env = dict(os.environ, NOTIFY_SOCKET=notify.path)
    env.pop("WATCHDOG_USEC", None)
    wlog = tmp_path / "worker.log"
    dlog = tmp_path / "dispatcher.log"
    procs, srv = [], None
    try:
        procs.append(subprocess.Popen(
            [str(WORKER), "--redis", addr, "--model", str(MODEL), "--pools", "fast",
             "--name", "r1", "--threads", "1", "--prefix", prefix, "--http-port", "0"],
            stdout=open(wlog, "w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT))
        if DISPATCHER.exists():
            procs.append(subprocess.Popen(
                [str(DISPATCHER), "--redis", addr, "--prefix", prefix, "--name", "rd",
                 "--http-port", "0"],
                stdout=open(dlog, "w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT))
        deadline = time.time() + 20
        while "not ready until it answers" not in wlog.read_text():
            assert time.time() < deadline, wlog.read_text()
            time.sleep(0.05)
        time.sleep(1.0)
        assert notify.seen("READY=1") == [], notify.msgs
        assert "ready:" not in wlog.read_text()
        if DISPATCHER.exists():
            assert "ready:" not in dlog.read_text() and "unreachable" in dlog.read_text()
        t_up = time.monotonic()
        srv = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        want = len(procs)
        deadline = time.time() + 20
        while len(notify.seen("READY=1")) < want:
            assert time.time() < deadline, notify.msgs
            time.sleep(0.02)
        assert all(t > t_up for t in notify.seen("READY=1"))
        wtext = wlog.read_text()
        assert "answered" in wtext[wtext.index("ready:"):].splitlines()[0]
        assert wtext.index("not ready until it answers") < wtext.index("ready:")
        if DISPATCHER.exists():
            dtext = dlog.read_text()
            assert "answered" in dtext[dtext.index("ready:"):].splitlines()[0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
        if srv:
            srv.terminate()
            srv.wait(10)
        notify.close()
