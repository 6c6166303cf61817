"""Job identity (issue 26, schemas/README.md "Job identity"): whatever ids
clients send, no job reads or writes another job's events.

- The first event of every stream names the request it answers (the entry
  ID its client's XADD returned and the SHA-256 of the job text it sent).
- The same job text under a taken id, while the stream exists, is one run
  and one answer; a different text is refused with ID_CONFLICT on
  out:<id>@<entry>, and nothing is written to the first job's stream:
  after a finished job, beside a live one on one worker or on two, through
  the dispatcher (forwarded or answered by it), and for jobs XADDed to
  jobs:<pool> directly.
- A cancel key that names an entry cancels that request only.
- The README's Python snippet, run twice, reads two answers.
"""
import hashlib
import json
import re
import subprocess
import sys

from conftest import (ROOT, check_stream, connect, reference, stream_events, wait_for,
                     wait_no_pending)


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def greedy(jid, prompt, n, **kw):
    return json.dumps({"id": jid, "prompt_ids": prompt, "max_tokens": n, "temperature": 0,
                       "ignore_eos": True, "cache": False, **kw})


def tokens_of(events):
    return [t for _, e in events if e["type"] == "delta" for t in e["token_ids"]]


def conflict_answer(r, key, entry, text, validator):
    """out:<id>@<entry>: ID_CONFLICT and done(error), stamped with its own request."""
    evs = stream_events(r, f"{key}@{entry}", timeout=20)
    check_stream(evs, validator)
    err = evs[0][1]
    assert err["type"] == "error" and err["code"] == "ID_CONFLICT", evs
    assert err["request"] == {"entry": entry, "job_sha256": sha(text)}
    assert evs[-1][1]["finish_reason"] == "error"
    return evs


def test_reused_id_new_job_refused_on_its_own_stream(workers, client, prefix, event_validator):
    workers("w1")
    a = greedy("same", [1, 2, 3], 4)
    e1 = client.submit(None, raw=a)
    first = client.events("same")
    check_stream(first, event_validator)
    assert first[0][1]["request"] == {"entry": e1, "job_sha256": sha(a)}
    assert all("request" not in e for _, e in first[1:])
    # another job under the finished one's id, while its stream lives
    b = greedy("same", [4, 5, 6], 4)
    e2 = client.submit(None, raw=b)
    conflict_answer(client.r, f"{prefix}out:same", e2, b, event_validator)
    assert stream_events(client.r, f"{prefix}out:same") == first  # nothing written there
    dead = [json.loads(f["dead"]) for _, f in client.r.xrange(f"{prefix}dead")]
    assert [d["code"] for d in dead] == ["ID_CONFLICT"]
    wait_no_pending(client.r, prefix)
    assert client.r.xlen(f"{prefix}jobs:fast") == 0  # acknowledged and deleted


def test_same_job_again_is_one_run_one_answer(workers, client, prefix, event_validator):
    w = workers("w1")
    a = greedy("twice", [7, 8, 9], 5)
    e1 = client.submit(None, raw=a)
    first = client.events("twice")
    check_stream(first, event_validator)
    e2 = client.submit(None, raw=a)
    wait_for(lambda: "acknowledged without running" in w.text(), "the duplicate's ack", timeout=20)
    wait_no_pending(client.r, prefix)
    again = stream_events(client.r, f"{prefix}out:twice")
    assert again == first  # not one event more: one run, one answer
    assert again[0][1]["request"]["entry"] == e1
    assert not client.r.exists(f"{prefix}out:twice@{e2}")
    assert client.r.xlen(f"{prefix}dead") == 0


def two_live_jobs(client, prefix, tmp_path, event_validator, n=40):
    """Two different jobs under one id, sent back to back: the stream holds
    exactly the one its first event names, token for token; the other is
    refused on its own stream."""
    ja = {"prompt_ids": [11, 12, 13], "max_tokens": n}
    jb = {"prompt_ids": [21, 22, 23, 24], "max_tokens": n}
    ta, tb = greedy("live", ja["prompt_ids"], n), greedy("live", jb["prompt_ids"], n)
    ea = client.submit(None, raw=ta)
    eb = client.submit(None, raw=tb)
    evs = client.events("live")
    check_stream(evs, event_validator)
    ref_a, ref_b = reference([ja, jb], tmp_path)
    # (a stream without the identity would be the first job's or a mix)
    owner = evs[0][1].get("request", {"entry": ea, "job_sha256": sha(ta)})
    if owner["entry"] == ea:
        assert owner["job_sha256"] == sha(ta)
        assert tokens_of(evs) == ref_a
        conflict_answer(client.r, f"{prefix}out:live", eb, tb, event_validator)
    else:
        assert owner == {"entry": eb, "job_sha256": sha(tb)}
        assert tokens_of(evs) == ref_b
        conflict_answer(client.r, f"{prefix}out:live", ea, ta, event_validator)
    assert evs[-1][1]["usage"]["completion_tokens"] == n
    wait_no_pending(client.r, prefix)


def test_two_live_jobs_one_id_one_worker(workers, client, prefix, tmp_path, event_validator):
    workers("w1", "--max-batch", "4")
    two_live_jobs(client, prefix, tmp_path, event_validator)


def test_two_live_jobs_one_id_two_workers(workers, client, prefix, tmp_path, event_validator):
    workers("w1", "--max-batch", "1")
    workers("w2", "--max-batch", "1")
    two_live_jobs(client, prefix, tmp_path, event_validator)


def test_cancel_key_cancels_one_request(workers, client, prefix):
    workers("w1")
    # a long job, cancelled by a key naming its entry
    e1 = client.submit(None, raw=greedy("cx", [5, 6], 3000, stream_ttl_s=1))
    wait_for(lambda: client.r.xlen(f"{prefix}out:cx") >= 2, "cx's first tokens", timeout=20)
    client.r.set(f"{prefix}cancel:cx", e1, ex=600)
    assert client.events("cx")[-1][1]["finish_reason"] == "cancelled"
    # its stream (and holder record) expire; the id is free again, and the
    # cancel key, still there, is not the new request's
    wait_for(lambda: not client.r.exists(f"{prefix}out:cx", f"{prefix}own:cx"),
             "cx's stream to expire", timeout=30)
    assert client.r.get(f"{prefix}cancel:cx") == e1
    e2 = client.submit(None, raw=greedy("cx", [5, 6], 6))
    evs = client.events("cx")
    assert evs[0][1]["request"]["entry"] == e2
    assert evs[-1][1]["finish_reason"] == "length"
    # a key naming the new request's entry cancels it (set before admission)
    client.r.set(f"{prefix}cancel:cy", "0-1", ex=600)  # no such request: ignored
    e3 = client.submit(None, raw=greedy("cy", [5, 7], 3000))
    client.r.set(f"{prefix}cancel:cy", e3, ex=600)
    assert client.events("cy")[-1][1]["finish_reason"] == "cancelled"


def test_identity_through_the_dispatcher(dispatchers, workers, redis_addr, prefix,
                                         event_validator):
    r = connect(redis_addr)
    dispatchers("d1", "--think-ratio", "0")
    w = workers("w1")
    req = f"{prefix}requests"
    a = greedy("dj", [3, 1, 4], 5)
    e1 = r.xadd(req, {"job": a})
    first = stream_events(r, f"{prefix}out:dj")
    check_stream(first, event_validator)
    assert first[0][1]["request"] == {"entry": e1, "job_sha256": sha(a)}
    # the same text again: forwarded, acknowledged by the worker unrun
    r.xadd(req, {"job": a})
    wait_for(lambda: "acknowledged without running" in w.text(), "the duplicate's ack", timeout=20)
    # a different job: refused on its own stream
    b = greedy("dj", [2, 7, 1], 5)
    e3 = r.xadd(req, {"job": b})
    conflict_answer(r, f"{prefix}out:dj", e3, b, event_validator)
    # a job the dispatcher itself refuses (invalid) under the taken id: its
    # error does not land in the first job's stream either
    bad = '{"id":"dj","prompt_ids":"x"}'
    e4 = r.xadd(req, {"job": bad})
    conflict_answer(r, f"{prefix}out:dj", e4, bad, event_validator)
    assert stream_events(r, f"{prefix}out:dj") == first
    # an invalid job under a free id: answered on it, and stamped
    e5 = r.xadd(req, {"job": '{"id":"dk","prompt_ids":"x"}'})
    evs = stream_events(r, f"{prefix}out:dk", timeout=20)
    assert evs[0][1]["code"] == "BAD_TYPE" and evs[0][1]["request"]["entry"] == e5
    # handled entries leave the intake and pool streams
    wait_for(lambda: r.xlen(req) == 0, "the requests stream to empty", timeout=20)
    wait_no_pending(r, prefix)
    assert r.xlen(f"{prefix}jobs:fast") == 0


def readme_snippet():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"From Python, a web backend needs only Redis:\s*```python\n(.*?)```", text,
                  re.S)
    assert m, "README.md: the Python snippet is missing"
    return m.group(1)


def test_readme_python_snippet_twice_reads_two_answers(dispatchers, workers, redis_addr,
                                                       prefix):
    """The README's snippet as written (only the server and the key prefix
    changed), run twice: two requests, two streams, each answering its own."""
    dispatchers("d1", "--think-ratio", "0")
    workers("w1")
    host, port = redis_addr.rsplit(":", 1)
    code = readme_snippet().replace("redis.Redis(decode_responses=True)",
                                    f"redis.Redis(host={host!r}, port={port}, "
                                    "decode_responses=True)").replace("redlm:", prefix)
    assert prefix in code and "redis.Redis(host=" in code
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
    r = connect(redis_addr)
    outs = [k for k in r.scan_iter(match=f"{prefix}out:*")]
    assert len(outs) == 2, outs
    entries = {json.loads(r.xrange(k, count=1)[0][1]["event"])["request"]["entry"] for k in outs}
    assert len(entries) == 2


def test_cached_job_under_a_running_jobs_id_writes_nothing(workers, client, prefix, tmp_path,
                                                           event_validator):
    """One worker, one id: job A runs; job B, another text, is a result-cache
    hit, so at admission it already holds its whole answer. Its FENCE_TAKE
    is refused, and its events, sent in the same flush, must be refused too
    (the holder record names A's entry, not only this worker): A's stream
    stays A's, token for token."""
    workers("w1")
    # B's whole answer (801 events) outruns what A has published when B
    # comes, so any of B's events let through would land in A's stream
    cached = {"prompt_ids": [31, 41, 59], "max_tokens": 800, "temperature": 0,
              "ignore_eos": True}
    client.submit({"id": "fill", **cached})
    client.events("fill")
    wait_for(lambda: client.r.keys(f"{prefix}cache:*"), "the cache entry", timeout=20)
    ja = {"prompt_ids": [2, 7, 18], "max_tokens": 2500}
    ta = greedy("mix", ja["prompt_ids"], ja["max_tokens"])
    ea = client.submit(None, raw=ta)
    wait_for(lambda: client.r.xlen(f"{prefix}out:mix") >= 2, "A's first events", timeout=20)
    tb = json.dumps({"id": "mix", **cached})
    eb = client.submit(None, raw=tb)
    conflict_answer(client.r, f"{prefix}out:mix", eb, tb, event_validator)
    evs = client.events("mix", timeout=120)
    check_stream(evs, event_validator)
    assert evs[0][1]["request"]["entry"] == ea
    assert not any(e.get("cached") for _, e in evs)
    assert tokens_of(evs) == reference([ja], tmp_path)[0]


def test_redlm_cancel_names_the_request(workers, client, redis_addr, prefix):
    """`redlm cancel ID` sets the key to the entry the id's stream names, so
    it cancels that request and no later one under the id; before a stream
    exists it can only say "1" (whichever request runs)."""
    from conftest import CLI
    workers("w1")
    e1 = client.submit(None, raw=greedy("cc", [9, 9], 3000))
    wait_for(lambda: client.r.xlen(f"{prefix}out:cc") >= 1, "cc's first event", timeout=20)
    out = subprocess.run([str(CLI), "cancel", "cc", "--redis", redis_addr, "--prefix", prefix],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert client.r.get(f"{prefix}cancel:cc") == e1
    assert client.events("cc")[-1][1]["finish_reason"] == "cancelled"
    out = subprocess.run([str(CLI), "cancel", "nothing-yet", "--redis", redis_addr, "--prefix",
                          prefix], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and client.r.get(f"{prefix}cancel:nothing-yet") == "1"
