"""Embeddings end to end: documents through the front door, Redis and a worker.

    /usr/bin/python3 tests/bench/bench_embed_front.py [--model DIR] [--docs 64]
        [--words 60] [--rounds 3] [--threads 2] [--max-batch 16]

Starts its own redis-server on a free loopback port, one worker and one
dispatcher with its HTTP front door. The same --docs documents (about
--words words each, distinct per round so the result cache never answers)
are embedded three ways, alternating, --rounds times:
  - "list": one POST /v1/embeddings with every document in `input` (the
    front door queues one job per input, the worker batches them);
  - "serial": one POST per document, each after the last one's answer (a
    client embedding a list in a loop);
  - "parallel8": one POST per document, 8 at a time.
Prints one JSON line per way (median documents per second, prompt tokens
per second) and one with the ratios to "serial".
"""
import argparse
import concurrent.futures
import http.client
import json
import pathlib
import random
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "integration"))
from conftest import DISPATCHER, WORKER, Daemon, RedisServer, free_port  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORDS = ("river stone light paper garden window music market winter engine question "
         "harbor silver forest letter morning signal bridge castle planet").split()


class BenchWorker(Daemon):
    kind = "worker"

    def __init__(self, addr, model, logdir, a):
        self.start([str(WORKER), "--redis", addr, "--model", str(model), "--pools", "fast,think",
                    "--name", "ew", "--threads", str(a.threads), "--prefix", "e:",
                    "--block-ms", "100", "--http-port", "0", "--result-cache", "false",
                    "--max-batch", str(a.max_batch)],
                   pathlib.Path(logdir) / "worker.log", self.logged_ready, timeout=120)


class BenchFront(Daemon):
    kind = "front door"

    def __init__(self, addr, logdir, prefix="e:"):
        self.port = free_port()
        self.start([str(DISPATCHER), "--redis", addr, "--prefix", prefix, "--http", str(self.port),
                    "--served-model-name", "m", "--http-port", "0", "--block-ms", "100",
                    "--heartbeat-interval-ms", "500"],
                   pathlib.Path(logdir) / "front.log", self.listening, timeout=30)

    def listening(self):
        if "ready:" not in self.text():
            return False
        try:
            socket.create_connection(("127.0.0.1", self.port), 0.2).close()
            return True
        except OSError:
            return False

    def embed(self, inputs):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        c.request("POST", "/v1/embeddings", body=json.dumps({"model": "m", "input": inputs}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        body = json.loads(r.read())
        c.close()
        assert r.status == 200, body
        assert len(body["data"]) == len(inputs)
        return body["usage"]["prompt_tokens"]


def documents(n, words, rnd):
    return [" ".join(rnd.choice(WORDS) for _ in range(words)) + f" ({rnd.random():.9f})"
            for _ in range(n)]


def run(front, way, docs):
    t0 = time.monotonic()
    if way == "list":
        tokens = front.embed(docs)
    elif way == "serial":
        tokens = sum(front.embed([d]) for d in docs)
    else:
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            tokens = sum(ex.map(lambda d: front.embed([d]), docs))
    return time.monotonic() - t0, tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "build/models/tiny-256-vocab-tok"))
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--words", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=16)
    a = ap.parse_args()
    ways = ("list", "serial", "parallel8")
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
        srv = RedisServer(pathlib.Path(tmp) / "redis")
        addr = f"127.0.0.1:{srv.port}"
        w = BenchWorker(addr, a.model, tmp, a)
        f = BenchFront(addr, tmp)
        rnd = random.Random(7)
        try:
            run(f, "list", documents(8, a.words, rnd))  # warm-up
            secs = {k: [] for k in ways}
            toks = {k: [] for k in ways}
            for _ in range(a.rounds):
                for way in ways:
                    s, t = run(f, way, documents(a.docs, a.words, rnd))
                    secs[way].append(s)
                    toks[way].append(t)
        finally:
            f.stop()
            w.stop()
            srv.stop()
    med = {k: statistics.median(v) for k, v in secs.items()}
    for k in ways:
        print(json.dumps({"bench": "embed_front", "way": k, "docs": a.docs, "rounds": a.rounds,
                          "max_batch": a.max_batch, "docs_s": round(a.docs / med[k], 1),
                          "tok_s": round(statistics.median(toks[k]) / med[k], 1),
                          "s_per_round": [round(x, 3) for x in secs[k]]}))
    print(json.dumps({"bench": "embed_front", "list_over_serial": round(med["serial"] / med["list"], 2),
                      "parallel8_over_serial": round(med["serial"] / med["parallel8"], 2)}))


if __name__ == "__main__":
    main()
