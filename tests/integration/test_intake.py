"""Intake no client can break (issue 26): the max-ID attack, and tenants.

`XADD <requests> 18446744073709551615-18446744073709551615 job ...` leaves a
stream on which every later XADD * fails ("exhausted the last possible
ID"). Two defences, both tested against real processes:
- the dispatcher repairs such a stream by itself (dispatcher/loop.c,
  repair_intake): an honest request sent after the attack, on the same
  stream, is answered within 2 s, with no admin step;
- with the shipped ACL file, a tenant writes only its own intake stream
  (requests:<tenant>) and its own id namespace: its attack, huge entries,
  MAXLEN 0 trims, and ids it shares with another tenant touch only its
  own; the other tenant's requests go on being answered, and neither can
  pre-empt, read or cancel the other's ids.
The 2 s is a bound asserted on observable state (the done event), not a
sleep.
"""
import hashlib
import json
import time

import pytest
import redis

from conftest import Dispatcher, Worker, connect, stream_events
from test_acl import AclRedis, acl_lines, daemon_passwords, noperm, with_passwords

MAX_ID = "18446744073709551615-18446744073709551615"


def job(jid, prompt=(1, 2, 3), n=2):
    return json.dumps({"id": jid, "prompt_ids": list(prompt), "max_tokens": n, "temperature": 0,
                       "ignore_eos": True, "cache": False})


def submit_retrying(r, stream, text, t0, bound):
    """XADD, retried while the stream is exhausted (the instant between an
    attack and its repair); refusals of any other kind fail the test."""
    while True:
        try:
            return r.xadd(stream, {"job": text})
        except redis.exceptions.ResponseError as e:
            assert "exhausted" in str(e), e
            assert time.time() - t0 < bound, f"{stream}: XADD still refused after {bound} s"


def last_id_ms(r, stream):
    return int(r.xinfo_stream(stream)["last-generated-id"].split("-")[0])


def test_max_id_attack_repaired_without_admin(dispatchers, workers, redis_addr, prefix):
    r = connect(redis_addr)
    dispatchers("d1", "--think-ratio", "0")
    workers("w1")
    req = f"{prefix}requests"
    r.xadd(req, {"job": job("warm")})
    stream_events(r, f"{prefix}out:warm")
    for attack in range(3):  # again and again: each one repaired
        r.execute_command("XADD", req, MAX_ID, "job", job(f"evil{attack}"))
        t0 = time.time()
        jid = f"honest{attack}"
        submit_retrying(r, req, job(jid), t0, 2.0)
        evs = stream_events(r, f"{prefix}out:{jid}", timeout=2.0)
        assert evs[-1][1]["finish_reason"] == "length"
        assert time.time() - t0 <= 2.0
    assert last_id_ms(r, req) <= time.time() * 1000 + 3600_000
    # the attacker's jobs were served like any other (only their IDs were hostile)
    assert stream_events(r, f"{prefix}out:evil2")[-1][1]["type"] == "done"


@pytest.fixture
def tenants(built, tmp_path):
    """The shipped ACL file on a redis-server of our own; a dispatcher (user
    dispatcher, tenants client and client2) and a worker (user worker)."""
    srv = AclRedis(tmp_path / "redis", with_passwords(acl_lines()))
    pw = daemon_passwords(tmp_path)
    d = Dispatcher(srv.addr, "redlm:", "td", tmp_path,
                   ["--redis-user", "dispatcher", "--redis-password-file", str(pw["dispatcher"]),
                    "--think-ratio", "0", "--tenants", "client,client2"])
    w = Worker(srv.addr, "redlm:", "tw", tmp_path,
               ["--redis-user", "worker", "--redis-password-file", str(pw["worker"])])
    yield srv
    w.stop()
    d.stop()
    srv.stop()


def test_tenant_attacks_stop_only_that_tenant(tenants):
    a, b = tenants.as_user("client"), tenants.as_user("client2")
    admin = tenants.as_user("admin")
    b.xadd("redlm:requests:client2", {"job": job("warm")})
    assert stream_events(b, "redlm:out:client2:warm")[-1][1]["type"] == "done"
    # tenant client: the max-ID attack on the only intake it may write;
    # tenant client2 is served throughout: each request answered within 2 s
    # (stream_events' bound), none refused
    a.execute_command("XADD", "redlm:requests:client", MAX_ID, "job", job("evil"))
    for i in range(5):
        b.xadd("redlm:requests:client2", {"job": job(f"h{i}")})
        evs = stream_events(b, f"redlm:out:client2:h{i}", timeout=2.0)
        assert evs[-1][1]["finish_reason"] == "length"
    # and tenant client's own intake is repaired too, without an admin
    t1 = time.time()
    submit_retrying(a, "redlm:requests:client", job("mine"), t1, 2.0)
    assert stream_events(a, "redlm:out:client:mine", timeout=2.0)[-1][1]["type"] == "done"
    assert last_id_ms(admin, "redlm:requests:client") <= time.time() * 1000 + 3600_000
    # a MAXLEN 0 trim and a 50 MB entry: they reach only tenant client's
    # own queue; client2 is still answered, and nothing of them stays
    a.execute_command("XADD", "redlm:requests:client", "MAXLEN", "0", "*", "job", job("trim"))
    big = tenants.as_user("client")  # a connection of its own, closed after
    big.xadd("redlm:requests:client", {"job": "x" * (50 << 20)})
    big.close()
    b.xadd("redlm:requests:client2", {"job": job("after")})
    assert stream_events(b, "redlm:out:client2:after")[-1][1]["finish_reason"] == "length"
    deadline = time.time() + 60
    while admin.xlen("redlm:requests:client") and time.time() < deadline:
        time.sleep(0.05)
    assert admin.xlen("redlm:requests:client") == 0
    denied = [e for e in admin.acl_log(count=100) if e["username"] in ("worker", "dispatcher")]
    assert denied == [], denied


def test_tenants_cannot_preempt_read_or_cancel_each_other(tenants):
    a, b = tenants.as_user("client"), tenants.as_user("client2")
    # the same id, first by client, then by client2: each gets its own answer
    ta, tb = job("victim", (5, 6)), job("victim", (7, 8, 9))
    ea = a.xadd("redlm:requests:client", {"job": ta})
    eb = b.xadd("redlm:requests:client2", {"job": tb})
    ra = stream_events(a, "redlm:out:client:victim")
    rb = stream_events(b, "redlm:out:client2:victim")
    assert ra[0][1]["request"] == {"entry": ea, "job_sha256": hashlib.sha256(ta.encode()).hexdigest()}
    assert rb[0][1]["request"] == {"entry": eb, "job_sha256": hashlib.sha256(tb.encode()).hexdigest()}
    assert rb[-1][1]["finish_reason"] == "length"
    # an id spelt in the other's namespace still lands in one's own
    tc = job("client2:x", (1, 1))
    a.xadd("redlm:requests:client", {"job": tc})
    assert stream_events(a, "redlm:out:client:client2:x")[-1][1]["type"] == "done"
    assert not tenants.as_user("admin").exists("redlm:out:client2:x")
    # neither reads, cancels, subscribes to or writes the other's
    noperm(a.xrange, "redlm:out:client2:victim")
    noperm(a.xread, {"redlm:out:client2:victim": "0-0"})
    noperm(a.set, "redlm:cancel:client2:victim", eb)
    noperm(a.xadd, "redlm:requests:client2", {"job": tb})
    noperm(b.xrange, "redlm:out:client:victim")
    noperm(b.xadd, "redlm:requests", {"job": tb})


def test_tenants_share_no_cache(tenants):
    """Neither cache tells one tenant what another sent: the prefix cache
    (cached_prompt_tokens, and the time it saves) and the result cache
    (cached: true) are per tenant; within a tenant both still work."""
    a, b = tenants.as_user("client"), tenants.as_user("client2")
    prompt = list(range(100, 164))  # four KV blocks and more

    def ask(r, user, jid, cache):
        text = json.dumps({"id": jid, "prompt_ids": prompt, "max_tokens": 2, "temperature": 0,
                           "ignore_eos": True, "cache": cache})
        r.xadd(f"redlm:requests:{user}", {"job": text})
        return stream_events(r, f"redlm:out:{user}:{jid}")[-1][1]

    first = ask(a, "client", "p1", False)
    assert first["usage"]["cached_prompt_tokens"] == 0
    # the same prompt from the other tenant: nothing reused
    assert ask(b, "client2", "p1", False)["usage"]["cached_prompt_tokens"] == 0
    # from the same tenant: its own prefix cache serves it
    assert ask(a, "client", "p2", False)["usage"]["cached_prompt_tokens"] >= 48
    # the result cache: filled by client, not answering client2
    assert ask(a, "client", "r1", True)["cached"] is False
    admin = tenants.as_user("admin")
    deadline = time.time() + 10
    while not admin.keys("redlm:cache:*") and time.time() < deadline:
        time.sleep(0.02)
    assert ask(b, "client2", "r1", True)["cached"] is False
    assert ask(a, "client", "r2", True)["cached"] is True
