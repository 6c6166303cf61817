"""Prefix-affine pulling (issue 27): a real redis-server, a real dispatcher
(with --model, so it can render and hash prompts) and two real CPU workers
on the tiny model.

- a conversation's turns land on the worker holding its history: every
  turn after the first is offered to that worker (the dispatcher's offer
  counter) and served from its prefix cache (cached_prompt_tokens covers
  the whole earlier prompt), while the other worker never sees it;
- a killed affine worker's offers (taken and not yet taken) are moved to
  the pool and finished by the other worker, nothing lost, nothing twice;
- with affinity off nothing is offered and jobs go to the pools as before.

Waits are on observable state: worker and dispatcher heartbeats, events.
"""
import json
import time

import pytest

from conftest import MODEL, connect, job_events, read_heartbeat, wait_for, wait_no_pending

SYSTEM = ("You are a careful assistant for the redlm project. Answer briefly, cite the "
          "module you mean, and never invent an option that the documentation does not "
          "name. " * 3)

WFLAGS = ("--claim-idle-ms", "1500", "--lease-renew-ms", "300", "--claim-interval-ms", "300",
          "--heartbeat-ttl-s", "2")


def hb(r, prefix, kind, name):
    return read_heartbeat(r, prefix, kind, name)


def dispatcher_saw(r, prefix, dname, t_ms):
    """Waits for a dispatcher heartbeat written after t_ms: it re-read the
    workers' filters (da_refresh) just before writing it."""
    wait_for(lambda: (hb(r, prefix, "dispatcher", dname) or {}).get("time_ms", 0) > t_ms,
             "a dispatcher heartbeat", timeout=30)


def filters_settled(r, prefix, names):
    """Waits until each worker's heartbeat is newer than the moment its
    filter last changed could matter: two heartbeats in a row with the
    same filter after now."""
    t0 = time.time() * 1000
    for n in names:
        wait_for(lambda: (hb(r, prefix, "worker", n) or {}).get("time_ms", 0) > t0 + 150,
                 f"worker {n}'s heartbeat", timeout=30)
    return time.time() * 1000


def send(r, prefix, job):
    r.xadd(f"{prefix}requests", {"job": json.dumps(job)})


def done_of(r, prefix, job_id, timeout=60):
    evs = job_events(r, prefix, job_id, timeout)
    assert evs[-1]["type"] == "done", evs[-3:]
    return evs


def reply_text(evs):
    return "".join(e.get("delta", {}).get("content", "") or "" for e in evs if e["type"] == "delta")


def usage(evs):
    return evs[-1]["usage"]


def conversation_turns(r, prefix, tag, n_turns, dname):
    """Runs one conversation turn after turn; returns the done usages."""
    msgs = [{"role": "system", "content": SYSTEM}]
    out = []
    for t in range(n_turns):
        msgs.append({"role": "user", "content": f"Turn {t} of {tag}: which module renders prompts? "
                                                f"Say it in {t + 3} words."})
        jid = f"{tag}-t{t}"
        settled = filters_settled(r, prefix, ["wa", "wb"])
        dispatcher_saw(r, prefix, dname, settled)
        send(r, prefix, {"id": jid, "messages": msgs, "max_tokens": 6, "temperature": 0,
                         "mode": "no_think"})
        evs = done_of(r, prefix, jid)
        out.append(usage(evs))
        msgs.append({"role": "assistant", "content": reply_text(evs)})
    return out


def test_turns_land_on_the_worker_holding_the_history(workers, dispatchers, redis_addr, prefix):
    r = connect(redis_addr)
    wa = workers("wa", *WFLAGS)
    wb = workers("wb", *WFLAGS)
    # a generous wait: a starved machine must not turn an offer into a fallback
    d = dispatchers("d1", "--model", str(MODEL), "--affinity-refresh-ms", "20",
                    "--affinity-wait-ms", "5000")
    turns = conversation_turns(r, prefix, "conv", 6, d.name)
    # turn 0 went to whichever worker pulled it; every later turn was
    # offered to that one and served its earlier prompt from cache
    for i, u in enumerate(turns[1:], 1):
        assert u["cached_prompt_tokens"] >= turns[i - 1]["prompt_tokens"] - 32, (i, turns)
    settled = filters_settled(r, prefix, ["wa", "wb"])  # counters after the last turn
    dispatcher_saw(r, prefix, d.name, settled)
    dh = hb(r, prefix, "dispatcher", d.name)
    assert dh["affinity"]["offers"] >= 5, dh["affinity"]
    assert dh["affinity"]["fallbacks"] == 0, dh["affinity"]
    ha, hb_ = hb(r, prefix, "worker", "wa"), hb(r, prefix, "worker", "wb")
    taken = sorted([ha["affinity_taken"], hb_["affinity_taken"]])
    assert taken[0] == 0 and taken[1] >= 5, (ha, hb_)
    # the other worker never ran the conversation: all 6 jobs on one worker
    assert sorted([ha["jobs_done"], hb_["jobs_done"]]) == [0, 6], (ha, hb_)
    wait_no_pending(r, prefix)


def test_killed_affine_worker_loses_nothing(workers, dispatchers, redis_addr, prefix):
    r = connect(redis_addr)
    wa = workers("wa", *WFLAGS)
    wb = workers("wb", *WFLAGS)
    # a long wait keeps offers with their worker until it is known gone
    d = dispatchers("d1", "--model", str(MODEL), "--affinity-refresh-ms", "20",
                    "--affinity-wait-ms", "60000", "--claim-idle-ms", "1500")
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Which module renders prompts?"}]
    send(r, prefix, {"id": "seed", "messages": msgs, "max_tokens": 4, "temperature": 0,
                     "mode": "no_think"})
    done_of(r, prefix, "seed")
    settled = filters_settled(r, prefix, ["wa", "wb"])
    dispatcher_saw(r, prefix, d.name, settled)
    holder = wa if (hb(r, prefix, "worker", "wa") or {}).get("jobs_done") else wb
    other = wb if holder is wa else wa
    # the holder is stopped (SIGSTOP: it holds what it read, publishes
    # nothing), then jobs for its prefix come: some it took, the rest wait
    # in its offer stream
    jobs = []
    for i in range(6):
        m = msgs + [{"role": "assistant", "content": "engine/prompt.c"},
                    {"role": "user", "content": f"Follow-up {i}: and the tokenizer?"}]
        jobs.append({"id": f"f{i}", "messages": m, "max_tokens": 5, "temperature": 0,
                     "mode": "no_think"})
    jobs[0].update(max_tokens=3000, ignore_eos=True)  # still running when the holder stops
    send(r, prefix, jobs[0])
    offer = f"{prefix}jobs:fast:w:{holder.name}"
    # the first is taken by the holder: pending in its offer stream, streaming
    wait_for(lambda: r.xlen(f"{prefix}out:f0") >= 3, "f0 streaming", timeout=30)
    holder.signal(19)  # SIGSTOP
    assert r.xpending(offer, "workers")["pending"] == 1
    for j in jobs[1:]:
        send(r, prefix, j)
    wait_for(lambda: (hb(r, prefix, "dispatcher", d.name) or {}).get("affinity", {})
             .get("offers", 0) >= 2, "offers to the stopped worker", timeout=30)
    holder.kill()
    holder.wait()
    # every job finishes, once, on the other worker
    for j in jobs:
        evs = done_of(r, prefix, j["id"], timeout=90)
        assert evs[-1]["finish_reason"] in ("stop", "length"), evs[-1]
        seqs = [e["seq"] for e in evs]
        assert seqs == list(range(len(seqs))), seqs
        # resumed where the stopped worker left off: every token once
        n_tok = sum(len(e.get("token_ids") or e.get("delta", {}).get("token_ids") or [])
                    for e in evs if e["type"] == "delta")
        assert evs[-1]["usage"]["completion_tokens"] == j["max_tokens"] or \
            evs[-1]["finish_reason"] == "stop", evs[-1]
        if n_tok:
            assert n_tok == evs[-1]["usage"]["completion_tokens"], (n_tok, evs[-1])
    # the taken job is moved once idle for claim_idle_ms (a takeover), the
    # waiting ones once the worker's heartbeat is gone (fallbacks): two
    # sweeps, in either order, so wait for both to be counted
    wait_for(lambda: (lambda a: a["takeovers"] >= 1 and a["fallbacks"] + a["takeovers"] >= 2)(
        (hb(r, prefix, "dispatcher", d.name) or {}).get("affinity") or
        {"takeovers": 0, "fallbacks": 0}), "the takeover and the moved offers counted", timeout=30)
    assert r.xlen(offer) == 0 or r.xpending(offer, "workers")["pending"] == 0
    wait_no_pending(r, prefix, timeout=20)


def test_busy_holder_falls_back_within_the_wait(workers, dispatchers, redis_addr, prefix):
    """The holder has no room (one batch slot, busy with a long job): an
    offer for its prefix is moved to the pool after affinity_wait_ms and
    the other worker runs it meanwhile."""
    r = connect(redis_addr)
    workers("wa", *WFLAGS, "--max-batch", "1")
    workers("wb", *WFLAGS, "--max-batch", "1")
    d = dispatchers("d1", "--model", str(MODEL), "--affinity-refresh-ms", "20",
                    "--affinity-wait-ms", "200")
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Which module renders prompts?"}]
    send(r, prefix, {"id": "seed", "messages": msgs, "max_tokens": 4, "temperature": 0,
                     "mode": "no_think"})
    done_of(r, prefix, "seed")
    settled = filters_settled(r, prefix, ["wa", "wb"])
    dispatcher_saw(r, prefix, d.name, settled)
    long_msgs = msgs + [{"role": "assistant", "content": "engine/prompt.c"},
                        {"role": "user", "content": "Now explain all of it at length."}]
    send(r, prefix, {"id": "long", "messages": long_msgs, "max_tokens": 3000, "ignore_eos": True,
                     "temperature": 0, "mode": "no_think"})
    wait_for(lambda: r.xlen(f"{prefix}out:long") >= 3, "the long job streaming", timeout=30)
    short = msgs + [{"role": "assistant", "content": "engine/prompt.c"},
                    {"role": "user", "content": "And the tokenizer?"}]
    send(r, prefix, {"id": "short", "messages": short, "max_tokens": 4, "temperature": 0,
                     "mode": "no_think"})
    done_of(r, prefix, "short")
    dh = wait_for(lambda: (lambda h: h if h["affinity"]["fallbacks"] >= 1 else None)(
        hb(r, prefix, "dispatcher", d.name)), "the fallback counted", timeout=30)
    assert dh["affinity"]["offers"] >= 2, dh["affinity"]
    evs = done_of(r, prefix, "long", timeout=120)
    assert evs[-1]["usage"]["completion_tokens"] == 3000
    wait_no_pending(r, prefix, timeout=20)


def test_affinity_off_uses_the_pools(workers, dispatchers, redis_addr, prefix):
    r = connect(redis_addr)
    wa = workers("wa", *WFLAGS, "--no-affinity")
    wb = workers("wb", *WFLAGS, "--no-affinity")
    d = dispatchers("d1", "--model", str(MODEL), "--no-affinity")
    msgs = [{"role": "system", "content": SYSTEM}]
    for t in range(3):
        msgs.append({"role": "user", "content": f"Turn {t}: which module renders prompts?"})
        send(r, prefix, {"id": f"off-t{t}", "messages": msgs, "max_tokens": 4, "temperature": 0,
                         "mode": "no_think"})
        evs = done_of(r, prefix, f"off-t{t}")
        msgs.append({"role": "assistant", "content": reply_text(evs)})
    for n in ("wa", "wb"):
        h = wait_for(lambda: hb(r, prefix, "worker", n), "heartbeat", timeout=30)
        assert "affinity" not in h and h["affinity_taken"] == 0
        assert not r.exists(f"{prefix}jobs:fast:w:{n}")
    dh = wait_for(lambda: hb(r, prefix, "dispatcher", d.name), "dispatcher heartbeat", timeout=30)
    assert dh["affinity"]["offers"] == 0
    wait_no_pending(r, prefix)
