"""Ids that share a slot on a Redis Cluster (issue 27 point 4): a real local
3-master + 3-replica cluster (the redis_cluster fixture), real workers, the
real front door and `redlm bench`.

On a cluster a request's keys carry its id as hash tag, so every request
sat in a slot of its own: a worker wrote each job's events with a script
call of its own a step, and a client read each stream with a read of its
own. Ids chosen on the "request slots" (the lowest slot of each master,
common/rcluster.h) share one slot per master; then, on real processes:

  - a worker writes the events of all its jobs of one slot with one
    FENCE_EMIT a step (counted by the master's INFO commandstats), and
    still one per job when the ids sit in a slot each; tokens exact;
  - `redlm bench` chooses its ids there, reads them with one shared reader
    per master, each blocked on its master's bell, and the workers ring
    exactly those bells (one bell key per master, in the request slot);
  - the front door answers with ids on the request slots, streamed and
    not streamed, read by its shared readers, and never finds a stream
    written without a ring; a chained Responses conversation's records lie
    on several masters and are read back as one conversation;
  - its readers (each sending its stream read and its next blocking bell
    read together, to its master) follow a CLUSTER FAILOVER of a master
    whose requests are mid-stream: every streamed answer comes whole.

Run with Debian's interpreter: /usr/bin/python3 -m pytest tests/integration
"""
import itertools
import json
import subprocess
import threading
from collections import Counter

from redis.crc import key_slot

from conftest import CLI, check_stream, greedy_jobs, reference, stream_events, wait_for
from test_http import MODEL_NAME, Front


def out_key(prefix, jid):
    return f"{prefix}out:{{{jid}}}"


def masters_slots(cluster):
    """{master port: [(lo, hi), ...]} from CLUSTER SLOTS."""
    n = cluster.node(cluster.running()[0])
    ranges = {}
    for lo, hi, master, *_ in n.execute_command("CLUSTER", "SLOTS"):
        ranges.setdefault(int(master[1]), []).append((lo, hi))
    return ranges


def request_slots(cluster):
    """{master port: its request slot}: the lowest slot each master serves,
    rcl_map_request_slots' rule written again from its contract."""
    return {p: min(lo for lo, _ in r) for p, r in masters_slots(cluster).items()}


def id_in_slot(tag, slot):
    """An id whose slot is slot, found by trying (the C code solves for it:
    rcl_slot_fill), so that the test does not lean on the code it tests."""
    for n in itertools.count():
        jid = f"{tag}-{n}"
        if key_slot(jid.encode()) == slot:
            return jid


def script_calls(cluster, port):
    st = cluster.node(port).info("commandstats")
    return sum(int(st.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def test_one_emit_per_slot_a_step(redis_cluster, workers, prefix, tmp_path, event_validator):
    """Six jobs decoding together: with their ids in six slots of one master
    the worker makes about one script call there per job a step; with the
    ids in one slot, one call a step for all six."""
    rc = redis_cluster.client()
    pool = f"{{{prefix}}}jobs:fast"  # shard 0, where jobs XADDed directly land
    qport = redis_cluster.master_of(pool)
    ranges = masters_slots(redis_cluster)
    port = next(p for p in ranges if p != qport)  # no lease or ack calls of shard 0 there
    lo, hi = ranges[port][0]
    workers("ws", "--max-batch", "8", addr=redis_cluster.seeds)
    wait_for(lambda: rc.exists(pool) and any(g["name"] == "workers" for g in rc.xinfo_groups(pool)),
             "the worker's group", timeout=60)
    node = redis_cluster.node(qport)
    for phase, seed in (("apart", 41), ("together", 43)):
        jobs = greedy_jobs(6, seed=seed, max_tokens=(24, 24), prompt_len=(2, 6), tag=phase[0])
        for i, j in enumerate(jobs):
            j["id"] = id_in_slot(f"{phase}{i}", lo + 1 + 97 * i if phase == "apart" else lo)
        assert len({key_slot(j["id"].encode()) for j in jobs}) == (6 if phase == "apart" else 1)
        assert all(lo <= key_slot(j["id"].encode()) <= hi for j in jobs)
        ref = reference(jobs, tmp_path)
        before = script_calls(redis_cluster, port)
        with node.pipeline(transaction=True) as p:  # one read takes all six: they run together
            for j in jobs:
                p.xadd(pool, {"job": json.dumps(j)})
            p.execute()
        n_events = 0
        for j, want in zip(jobs, ref):
            evs = stream_events(rc, out_key(prefix, j["id"]), 120)
            toks, _ = check_stream(evs, event_validator)
            assert toks == want, j["id"]
            n_events += len(evs)
        # the takes (one a job) and a ring probe at most ride along
        emits = script_calls(redis_cluster, port) - before - len(jobs) - 1
        print(f"{phase}: {emits} emit calls for {n_events} events")
        if phase == "apart":
            assert emits >= 0.6 * n_events, f"{emits} emit calls for {n_events} events, ids apart"
            apart = emits / n_events
        else:
            # against the apart phase of the same run, not a fixed share:
            # how steps and flushes fall moves the one-slot count (29-40 of
            # 150 events in four runs here, 54 in one CI run, which a fixed
            # 0.35 failed); one call per job a step would be the apart
            # phase's share again (143-145 of 150)
            assert emits <= 0.5 * apart * n_events, \
                f"{emits} emit calls for {n_events} events, one slot ({apart:.2f} a event apart)"


def test_bench_and_front_door_ids_on_request_slots(redis_cluster, workers, prefix, tmp_path,
                                                   event_validator):
    seeds = redis_cluster.seeds
    slots = request_slots(redis_cluster)
    workers("w1", addr=seeds)
    out = tmp_path / "res" / "result.json"
    p = subprocess.run([str(CLI), "bench", "--redis", seeds, "--prefix", prefix, "--target",
                        "pool:fast", "--clients", "6", "--requests", "18", "--output-len", "4..12",
                        "--prompt-len", "3..12", "--seed", "5", "--timeout", "60", "--no-plots",
                        "--out", str(out)], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    (lv,) = json.loads(out.read_text())["levels"]
    assert lv["completed"] == 18 and lv["read"] == "shared" and lv["shared_reads"] > 0, lv
    got = {key_slot(q["id"].encode()) for q in lv["requests"]}
    assert got == set(slots.values()), (got, slots)
    # the workers rang each master's bell, in its request slot, and no other
    for port, slot in slots.items():
        bells = list(redis_cluster.node(port).scan_iter(match=f"{prefix}bell{{*", count=1000))
        assert len(bells) == 1, (port, bells)
        assert key_slot(bells[0].encode()) == slot
        assert redis_cluster.node(port).xlen(bells[0]) > 0

    # the front door: its ids on the request slots, answers read by its readers
    f = Front(seeds, prefix, tmp_path)
    try:
        rc = redis_cluster.client()
        for stream in (False, True, False):
            body = {"model": MODEL_NAME, "max_tokens": 8, "stream": stream,
                    "messages": [{"role": "user", "content": "Hi"}]}
            c = f.conn()
            c.request("POST", "/v1/chat/completions", body=json.dumps(body),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read().decode()
            c.close()
            assert r.status == 200, data
            if stream:
                chunks = [json.loads(line[6:]) for line in data.split("\n")
                          if line.startswith("data: ") and line != "data: [DONE]"]
                jid = chunks[0]["id"]
                text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks
                               if ch.get("choices"))
            else:
                reply = json.loads(data)
                jid, text = reply["id"], reply["choices"][0]["message"]["content"]
            assert key_slot(jid.encode()) in slots.values(), jid
            evs = stream_events(rc, out_key(prefix, jid), 60)
            check_stream(evs, event_validator)
            assert text == "".join(e["delta"].get("content", "") for _, e in evs
                                   if e["type"] == "delta"), jid
        assert "without ringing" not in f.text() and "not on the bell" not in f.text()
        # a chained Responses conversation: its records on several masters,
        # read back in one pipeline across them (dispatcher/rstore.h). Ids
        # pick a master at random: six turns all landed on one master once
        # in a few hundred runs, so turns go on (20 at most) until the
        # records span two
        prev, ids, homes = None, [], set()
        while len(ids) < 6 or (len(homes) < 2 and len(ids) < 20):
            t = len(ids)
            body = {"model": MODEL_NAME, "max_output_tokens": 4, "input": f"turn {t}",
                    "reasoning": {"effort": "low"}}
            if prev:
                body["previous_response_id"] = prev
            status, _, data = f.request("POST", "/v1/responses", body)
            assert status == 200, data
            prev = json.loads(data)["id"]
            ids.append(prev)
            homes.add(redis_cluster.master_of(f"{prefix}response:{prev}"))
        assert json.loads(rc.get(f"{prefix}response:{prev}"))["chain"] == ids[:-1]
        assert len(homes) >= 2, homes
        status, _, data = f.request("GET", f"/v1/responses/{prev}/input_items?order=asc")
        assert status == 200, data
        said = [i["content"][0]["text"] for i in json.loads(data)["data"] if i["role"] == "user"]
        assert said == [f"turn {t}" for t in range(len(ids))], said
    finally:
        f.stop()


def test_front_door_reads_through_a_failover(redis_cluster, workers, prefix, tmp_path,
                                             event_validator):
    """81 streamed answers through the front door, ~27 on each request slot
    (more than a reader blocks on directly: each reader is on its bell,
    sending its stream read and its next blocking bell read together);
    once each has come part-way, the master of the request slot with the
    most of them fails over to its replica (CLUSTER FAILOVER) while the
    workers write (each answer takes tens of seconds at this batch, so
    they are mid-stream, and the workers' steady writes keep every reader
    in the blocking half of its pair between rings). That reader's blocked
    read is answered UNBLOCKED; it reads the map again and follows the
    streams on the new master. Every answer comes whole (finish_reason
    length), equal to its Redis stream."""
    seeds = redis_cluster.seeds
    slots = request_slots(redis_cluster)
    ws = [workers(f"w{i}", "--max-batch", "48", addr=seeds) for i in range(2)]
    f = Front(seeds, prefix, tmp_path)
    n = 81
    got, ids, seen = [None] * n, [None] * n, [0] * n

    def one(i):
        body = {"model": MODEL_NAME, "max_tokens": 1500, "stream": True, "ignore_eos": True,
                "temperature": 0, "messages": [{"role": "user", "content": f"story {i}"}]}
        c = f.conn(timeout=180)
        c.request("POST", "/v1/chat/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        text, fin = [], None
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ch = json.loads(line[6:])
            ids[i] = ch["id"]
            for choice in ch.get("choices") or []:
                text.append(choice["delta"].get("content") or "")
                fin = choice.get("finish_reason") or fin
            seen[i] += 1
        c.close()
        got[i] = (r.status, "".join(text), fin)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: all(k >= 5 for k in seen), "every answer under way", timeout=120)
        slot = Counter(key_slot(i.encode()) for i in ids).most_common(1)[0][0]
        old = next(p for p, s in slots.items() if s == slot)
        new = redis_cluster.failover(old)
        mid = [i for i in range(n) if key_slot(ids[i].encode()) == slot and got[i] is None]
        assert mid, "the answers on that slot ended before the failover"
        for t in threads:
            t.join(240)
        assert not any(t.is_alive() for t in threads), "an answer never ended"
        rc = redis_cluster.client()
        for i in range(n):
            status, text, fin = got[i]
            assert status == 200 and fin == "length", (ids[i], status, fin)
            evs = stream_events(rc, out_key(prefix, ids[i]), 60)
            check_stream(evs, event_validator)
            assert text == "".join(e["delta"].get("content", "") for _, e in evs
                                   if e["type"] == "delta"), ids[i]
        assert redis_cluster.roles()[new] == "master"
        # the failover cut that reader's read: mostly the blocking half of
        # a pair (rconn_collect names it "XREAD (paired)"), but a bell read
        # sent alone, with no stream to read beside it, is cut the same way
        # ("XREAD: UNBLOCKED"; seen in a CI run, 2026-12-08: the workers'
        # writes pause while a manual failover runs, so the reader may have
        # nothing else to ask for); and when the switch lands as the reader
        # sends its next pair, the pair's first half is redirected instead
        # (MOVED from the old master). Either way the reader read the map
        # again and followed (above).
        t = f.text()
        cut = ("XREAD (paired): UNBLOCKED", ": XREAD: UNBLOCKED", ": XREAD: redirected (MOVED")
        assert any(c in t for c in cut), \
            "the failover cut no read of the front door's: " + \
            " | ".join(ln for ln in t.splitlines() if "reading events" in ln)[-2000:]
    finally:
        f.stop()
