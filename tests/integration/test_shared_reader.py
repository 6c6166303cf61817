"""The front door reads every request's events with one shared XREAD
(common/xmux.h; issue 27 point 3): Redis pays a read per worker flush, not
one per token and stream.

- concurrent streamed requests through a real dispatcher and CPU worker:
  each client gets exactly its own job's tokens (what out:<id> holds), and
  none of the front door's request connections ever sent an XREAD; the one
  that reads is the shared reader (CLIENT LIST: name redlm-http-xmux);
- with http_shared_reader off, the same requests are read by the request
  connections themselves (so the check above can fail), with the same
  result;
- a request whose client hangs up mid-stream on the shared reader is
  cancelled, and the ones beside it run to their end.
"""
import json
import threading

from conftest import MODEL, connect, stream_events
from test_http import MODEL_NAME, chat_stream, front, stream_and_hang_up  # noqa: F401 (fixture)

PROMPTS = [f"Count to {n} and then name {n} animals." for n in range(3, 11)]


def stream_all(f, max_tokens=24, prompts=PROMPTS):
    """Streams every prompt at once; {prompt: (job id, content)}."""
    out, errors = {}, []

    def one(p):
        try:
            _, chunks = chat_stream(f, {"model": MODEL_NAME, "stream": True, "temperature": 0,
                                        "max_tokens": max_tokens, "ignore_eos": True,
                                        "messages": [{"role": "user", "content": p}]})
            assert chunks[-1] == "[DONE]", chunks[-3:]
            body = [c for c in chunks if c != "[DONE]"]
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in body if c["choices"])
            out[p] = (body[0]["id"], text)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(f"{p}: {e!r}")

    ts = [threading.Thread(target=one, args=(p,)) for p in prompts]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors
    assert sorted(out) == sorted(prompts)
    return out


def own_content(r, prefix, job_id):
    """The content of job_id's own out stream, as its worker wrote it."""
    text = ""
    for _, f in r.xrange(f"{prefix}out:{job_id}"):
        ev = json.loads(f["event"])
        if ev["type"] == "delta":
            text += ev["delta"].get("content") or ""
    return text


def http_clients(r):
    """The front door's connections: {name: [last command, ...]}."""
    seen = {}
    for c in r.client_list():
        if c["name"].startswith("redlm-http"):
            seen.setdefault(c["name"], []).append(c["cmd"])
    return seen


def test_one_xread_reads_every_stream(front, workers, redis_addr, prefix):
    workers("w1", "--max-batch", "16")
    r = connect(redis_addr)
    f = front()
    got = stream_all(f)
    for p, (jid, text) in got.items():
        assert text and text == own_content(r, prefix, jid), p  # its own job's tokens, all of them
    assert len({jid for jid, _ in got.values()}) == len(PROMPTS)
    conns = http_clients(r)
    assert conns.get("redlm-http-xmux") == ["xread"], conns
    assert "xread" not in conns.get("redlm-http", []), conns
    f.stop()

    # switched off: each request reads its own stream, on its own connection
    f = front("--http-shared-reader", "false")
    got = stream_all(f)
    for p, (jid, text) in got.items():
        assert text and text == own_content(r, prefix, jid), p
    conns = http_clients(r)
    assert "redlm-http-xmux" not in conns, conns
    assert "xread" in conns.get("redlm-http", []), conns


def test_a_client_gone_on_the_shared_reader(front, workers, redis_addr, prefix):
    workers("w1", "--max-batch", "16")
    r = connect(redis_addr)
    f = front()
    msgs = [{"role": "user", "content": "Tell me a long story."}]
    gone = stream_and_hang_up(f.port, msgs)  # 4000 tokens wanted; its job is cancelled
    last = [e for _, e in stream_events(r, f"{prefix}out:{gone}", 60)][-1]
    assert last["type"] == "done" and last["finish_reason"] == "cancelled", last
    got = stream_all(f, max_tokens=16)
    for p, (jid, text) in got.items():
        assert text and text == own_content(r, prefix, jid), p
    assert http_clients(r).get("redlm-http-xmux") == ["xread"]


def test_the_shared_reader_blocks_on_the_bell(front, workers, redis_addr, prefix, tmp_path):
    """The workers' emits and the dispatcher's answers ring <prefix>bell
    (one entry naming the streams written, in the same script), so the
    shared reader names only the streams with news (MONITOR): following
    more than 24 streams it blocks on the bell alone and then reads what it
    names; with fewer it blocks on the streams themselves, as without a bell
    (a one-stream flush then costs one read). A cached answer (the dispatcher's answer
    script) rings too: the reader never finds news it was not told of,
    which would make it give the bell up (said in the log)."""
    from test_redis_budget import Monitor
    workers("w1", "--max-batch", "16")
    r = connect(redis_addr)
    f = front("--model", str(MODEL))  # with its model: the result cache's fast path
    many = [f"Count to {n} and then name {n} birds." for n in range(3, 33)]
    stream_all(f, max_tokens=4)  # the reader is up
    (xmux,) = [c["addr"] for c in r.client_list() if c["name"] == "redlm-http-xmux"]
    mon = Monitor(redis_addr, tmp_path / "monitor.txt")
    try:
        # 30 at once, long enough to be open together: the bell alone
        got = stream_all(f, max_tokens=160, prompts=many)
        again = stream_all(f, max_tokens=160, prompts=many)  # the same: cached answers
        cmds = mon.sync(r)
    finally:
        mon.stop()
    assert {p: t for p, (_, t) in got.items()} == {p: t for p, (_, t) in again.items()}
    bell = f"{prefix}bell"
    reads = [a for _, src, a in cmds if src == xmux and a and a[0].upper() == "XREAD"]
    named = []
    for a in reads:
        keys = a[a.index("STREAMS") + 1:]
        keys = keys[:len(keys) // 2]
        if keys[0] == bell:  # on the bell: blocked on it alone, or a read without BLOCK
            assert keys == [bell] if "BLOCK" in a else len(keys) - 1 <= len(many), a
        else:  # few streams: blocked on them, the bell not needed
            assert "BLOCK" in a and bell not in keys and len(keys) <= 24, a
        named.append(keys)
    assert [bell] in named  # blocked on the bell alone
    assert any(k[0] == bell and len(k) > 2 for k in named)  # and read what it named
    assert any(k[0] != bell for k in named)  # and, at the end, on the last few streams
    rung = {k for _, fields in r.xrange(bell) for k in fields}
    for jid, _ in list(got.values()) + list(again.values()):
        assert f"{prefix}out:{jid}" in rung, jid
    hits = [e for jid, _ in again.values() for _, e in stream_events(r, f"{prefix}out:{jid}")
            if e["type"] == "done" and e.get("cached")]
    assert len(hits) == len(many)  # answered by the dispatcher, from the cache
    assert "without ringing" not in f.text(), f.text()[-2000:]
