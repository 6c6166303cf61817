"""Publishing off the critical path (issue 27 point 5): the worker writes
the last step's events and reads Redis's replies while the engine computes
the next step (worker/loop.c, publish.c w_flush_start / w_flush_finish).
Here only correctness, with Redis behind 1 ms of added latency each way (a
loopback proxy of our own, tests/bench/latency_proxy.py): a sim worker at
batch 64, every stream gapless and in order, done last with usage equal
to the tokens delivered, every job acknowledged. The step period it keeps
is measured by tests/bench/bench_overlap.py (BENCHMARKS.md)."""
import json

from conftest import QWEN3_TOKENIZER, check_stream, greedy_jobs, run_threads, wait_no_pending
from latency_proxy import LatencyProxy

SIM = ["--backend", "sim", "--sim-profile", "h200", "--sim-model", "qwen3-14b",
       "--model", str(QWEN3_TOKENIZER), "--no-result-cache", "--max-batch", "64"]


def test_overlapped_publishing_behind_latency(workers, client, redis_addr, event_validator):
    host, port = redis_addr.rsplit(":", 1)
    proxy = LatencyProxy((host, int(port)), 0.001)
    try:
        workers("o1", *SIM, addr=f"127.0.0.1:{proxy.port}")
        jobs = greedy_jobs(128, seed=27, max_tokens=(40, 120), tag="o")
        for j in jobs:
            client.submit(j)
        streams = run_threads(lambda j: client.events(j["id"], timeout=120), jobs, 16)
        for job, evs in zip(jobs, streams):
            tokens, done = check_stream(evs, event_validator)  # gapless, ordered, done last
            assert len(tokens) == job["max_tokens"], job["id"]
            assert done["usage"]["completion_tokens"] == len(tokens)
        wait_no_pending(client.r, client.prefix, timeout=30)  # every job acknowledged
    finally:
        proxy.close()
