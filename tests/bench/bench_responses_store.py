"""Stored responses (dispatcher/rstore.h): what keeping a response costs a
request, and a conversation chained by previous_response_id against the
same conversation sent whole.

    /usr/bin/python3 tests/bench/bench_responses_store.py [--model DIR]
        [--requests 60] [--turns 12] [--conversations 4] [--tokens 8]
        [--history-items 400]

Starts its own redis-server on a free loopback port, one worker (the tiny
test model unless --model) and one dispatcher with its HTTP front door.
Two measurements, each alternating its two arms request by request so
that the machine's drift falls on both:
  - "store": POST /v1/responses, one turn, --tokens output tokens, with
    store (the default) and with store false: the median latency of each
    and their ratio (what the SET of the record before the last byte
    costs);
  - "poll": GET /v1/responses/{id} of a background response still running
    whose job has written 16 or 2048 events (the record and the events
    written here, as the front door and a worker write them): the median
    latency of each, so that a poll is seen to cost the same whatever the
    stream's length; then one whose record holds a short and a long
    conversation (--history-items items of ~650 bytes), 16 events each: what
    a poll pays for the record it reads;
  - "chain": --conversations conversations of --turns turns each, driven
    as a client of previous_response_id does (the new user message only),
    as one in a conversation of the Conversations API (the new message,
    store false: the conversation keeps the turns) and as one that resends
    every turn (store false); the median latency
    per turn, the bytes the client sent in all, and Redis's memory for the
    chained conversation's last record and for all its records (MEMORY
    USAGE, medians over the conversations).
Prints one JSON line per measurement. The result cache is off, greedy
decoding, so that every request runs on the worker.
"""
import argparse
import http.client
import json
import pathlib
import statistics
import sys
import tempfile
import time

import redis

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "integration"))
from conftest import MODEL, WORKER, Daemon, RedisServer  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_embed_front import BenchFront  # noqa: E402

PREFIX = "rs:"


class BenchWorker(Daemon):
    kind = "worker"

    def __init__(self, addr, model, logdir):
        self.start([str(WORKER), "--redis", addr, "--model", str(model), "--pools", "fast,think",
                    "--name", "rsw", "--threads", "2", "--prefix", PREFIX, "--block-ms", "100",
                    "--http-port", "0", "--result-cache", "false"],
                   pathlib.Path(logdir) / "worker.log", self.logged_ready, timeout=120)


class Front(BenchFront):
    """bench_embed_front.py's front door (served name "m"), on our prefix."""

    def __init__(self, addr, logdir):
        super().__init__(addr, logdir, PREFIX)

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        t0 = time.monotonic()
        c.request("GET", path)
        r = c.getresponse()
        obj = json.loads(r.read())
        secs = time.monotonic() - t0
        c.close()
        assert r.status == 200, obj
        return secs, obj

    def post(self, body, path="/v1/responses"):
        """(seconds, response object, bytes sent) of one POST (/v1/responses)."""
        data = json.dumps(body)
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        t0 = time.monotonic()
        c.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        obj = json.loads(r.read())
        secs = time.monotonic() - t0
        c.close()
        assert r.status == 200, obj
        return secs, obj, len(data)


def text_of(resp):
    return "".join(p["text"] for o in resp["output"] if o["type"] == "message"
                   for p in o["content"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--history-items", type=int, default=400)
    a = ap.parse_args()
    base = {"model": "m", "max_output_tokens": a.tokens, "reasoning": {"effort": "low"},
            "temperature": 0}
    with tempfile.TemporaryDirectory(prefix="bench-rstore-") as tmp:
        srv = RedisServer(pathlib.Path(tmp) / "redis")
        addr = f"127.0.0.1:{srv.port}"
        w = BenchWorker(addr, a.model, tmp)
        f = Front(addr, tmp)
        r = redis.Redis(host="127.0.0.1", port=srv.port)
        try:
            f.post({**base, "input": "warm up"})
            # one turn, store on and off by turns
            lat = {True: [], False: []}
            for i in range(2 * a.requests):
                store = i % 2 == 0
                s, obj, _ = f.post({**base, "input": f"Question number {i}.", "store": store})
                assert obj["store"] is store
                lat[store].append(s)
            on, off = statistics.median(lat[True]), statistics.median(lat[False])
            print(json.dumps({"bench": "responses_store", "requests": a.requests,
                              "tokens": a.tokens, "store_ms": round(on * 1e3, 2),
                              "no_store_ms": round(off * 1e3, 2),
                              "store_over_no_store": round(on / off, 3)}))
            # polls of a running background response, a short and a long stream
            q = f.post({**base, "input": "queued", "background": True})[1]
            rec = json.loads(r.get(f"{PREFIX}response:{q['id']}"))
            polls = {}
            for n in (16, 2048):
                rid = f"resp_poll{n}"
                rec["response"]["id"] = rid
                r.set(f"{PREFIX}response:{rid}", json.dumps(rec), ex=600)
                pipe = r.pipeline()
                for k in range(n):
                    pipe.xadd(f"{PREFIX}out:{rid}", {"event": json.dumps(
                        {"seq": k, "type": "delta", "delta": {"content": "x"},
                         "token_ids": [k]})}, id=f"0-{k + 1}")
                pipe.execute()
                polls[n] = []
            for i in range(2 * a.requests):
                n = (16, 2048)[i % 2]
                s, obj = f.get(f"/v1/responses/resp_poll{n}")
                assert obj["status"] == "in_progress"
                polls[n].append(s)
            p16, p2k = statistics.median(polls[16]), statistics.median(polls[2048])
            print(json.dumps({"bench": "responses_poll", "polls": a.requests,
                              "events_16_ms": round(p16 * 1e3, 3),
                              "events_2048_ms": round(p2k * 1e3, 3),
                              "2048_over_16": round(p2k / p16, 3)}))
            # polls of a running background response that continues a long
            # conversation: its record holds the whole history, which a poll
            # parses; 16 events each
            hist = [{"type": "message", "role": ("user", "assistant")[k % 2],
                     "content": f"Turn {k} of a long conversation: " + "words " * 100}
                    for k in range(a.history_items)]
            sizes = {}
            for name, items in (("short", []), ("long", hist)):
                rid = f"resp_poll_{name}"
                big = {**rec, "input": items, "response": {**rec["response"], "id": rid}}
                text = json.dumps(big)
                sizes[name] = len(text)
                r.set(f"{PREFIX}response:{rid}", text, ex=600)
                pipe = r.pipeline()
                for k in range(16):
                    pipe.xadd(f"{PREFIX}out:{rid}", {"event": json.dumps(
                        {"seq": k, "type": "delta", "delta": {"content": "x"},
                         "token_ids": [k]})}, id=f"0-{k + 1}")
                pipe.execute()
                polls[name] = []
            for i in range(2 * a.requests):
                name = ("short", "long")[i % 2]
                s, obj = f.get(f"/v1/responses/resp_poll_{name}")
                assert obj["status"] == "in_progress"
                polls[name].append(s)
            ps, pl = statistics.median(polls["short"]), statistics.median(polls["long"])
            print(json.dumps({"bench": "responses_poll_record", "polls": a.requests,
                              "short_record_bytes": sizes["short"],
                              "long_record_bytes": sizes["long"],
                              "short_ms": round(ps * 1e3, 3), "long_ms": round(pl * 1e3, 3),
                              "long_over_short": round(pl / ps, 3)}))
            # conversations: chained vs sent whole, turn by turn
            per = {"chained": [], "conversation": [], "whole": []}
            sent = {"chained": 0, "conversation": 0, "whole": 0}
            conv_bytes_list = []
            record_bytes, conv_bytes = [], []
            for c in range(a.conversations):
                prev, history, kept = None, [], []
                conv = f.post({}, "/v1/conversations")[1]["id"]
                for t in range(a.turns):
                    # each arm its own words: neither finds the other's prompt
                    # in the worker's prefix cache, each finds its own turns
                    msg = {"role": "user", "content": f"Conversation {c}, turn {t}: go on."}
                    other = {"role": "user", "content": f"Dialogue {c}, turn {t}: go on."}
                    body = {**base, "input": [msg]}
                    if prev:
                        body["previous_response_id"] = prev
                    s, obj, n = f.post(body)
                    per["chained"].append(s)
                    sent["chained"] += n
                    prev = obj["id"]
                    kept.append(prev)
                    # the same turn in a conversation (words of its own)
                    third = {"role": "user", "content": f"Exchange {c}, turn {t}: go on."}
                    s, obj, n = f.post({**base, "store": False, "input": [third],
                                        "conversation": conv})
                    per["conversation"].append(s)
                    sent["conversation"] += n
                    s, obj, n = f.post({**base, "store": False, "input": history + [other]})
                    per["whole"].append(s)
                    sent["whole"] += n
                    history += [other, {"role": "assistant", "content": text_of(obj)}]
                record_bytes.append(r.memory_usage(f"{PREFIX}response:{prev}"))
                conv_bytes.append(sum(r.memory_usage(f"{PREFIX}response:{k}") for k in kept))
                conv_bytes_list.append(r.memory_usage(f"{PREFIX}conversation:{conv}"))
            ch, wh = statistics.median(per["chained"]), statistics.median(per["whole"])
            cv = statistics.median(per["conversation"])
            print(json.dumps({"bench": "responses_chain", "conversations": a.conversations,
                              "turns": a.turns, "tokens": a.tokens,
                              "chained_ms": round(ch * 1e3, 2), "whole_ms": round(wh * 1e3, 2),
                              "chained_over_whole": round(ch / wh, 3),
                              "conversation_ms": round(cv * 1e3, 2),
                              "conversation_over_whole": round(cv / wh, 3),
                              "client_bytes_conversation": sent["conversation"],
                              "conversation_key_bytes": int(statistics.median(conv_bytes_list)),
                              "client_bytes_chained": sent["chained"],
                              "client_bytes_whole": sent["whole"],
                              "last_record_bytes": int(statistics.median(record_bytes)),
                              "conversation_bytes": int(statistics.median(conv_bytes))}))
        finally:
            f.stop()
            w.stop()
            srv.stop()


if __name__ == "__main__":
    main()
