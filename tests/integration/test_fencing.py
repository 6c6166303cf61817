"""One writer per job (worker/fence.h).

A worker that stops answering for longer than claim_idle_ms (starved of
CPU, paused, cut off) has its job reclaimed, but it is not dead: when it
wakes it still holds the job in memory. It must write nothing more to that
job's stream, renew no lease on it and never acknowledge it, or the client
reads a stream no single run produced (with coalescing, two writers' deltas
interleave at the same seqs; an error event from one lands among the
other's tokens). And a job that moves on every delivery is not poison:
max_deliveries counts deliveries that published nothing.

SIGSTOP stands in for the starved worker: it is the same thing, made
deterministic.
"""
import signal

from conftest import check_stream, greedy_jobs, reference, wait_for, wait_no_pending

# coalescing on (the case that broke), and max_deliveries 1: any second
# delivery would be refused under the old count
FAST = ["--claim-idle-ms", "1000", "--claim-interval-ms", "100", "--lease-renew-ms", "200",
        "--coalesce-ms", "40", "--max-deliveries", "1", "--max-batch", "4"]


def owner(r, key, entry):
    pend = r.xpending_range(key, "workers", entry, entry, 1)
    return pend[0]["consumer"] if pend else None


def let_go(by_name):
    """How often a worker has stopped a job another worker took over."""
    return sum(w.log_path.read_text().count("another worker holds it now")
               for w in by_name.values())


def test_woken_worker_writes_nothing_after_takeover(workers, client, event_validator,
                                                     tmp_path):
    by_name = {"wa": workers("wa", *FAST), "wb": workers("wb", *FAST)}
    # long enough that neither round can see it end: each round lets the new
    # holder write 3 coalesced events (a few hundred tokens on a fast CPU;
    # at 1200 tokens a quiet machine finished the job inside round 0)
    job = greedy_jobs(1, seed=5, max_tokens=(4000, 4000), prompt_len=(8, 8), tag="fence")[0]
    want = reference([job], tmp_path)[0]
    r = client.r
    key = f"{client.prefix}jobs:fast"
    out = f"{client.prefix}out:{job['id']}"
    entry = client.submit(job)
    # Two takeovers, each moment picked from what the workers wrote, never
    # from time: the holder is stopped mid-generation, the other worker takes
    # the job over and writes on; then that one is stopped in its turn
    # before the first wakes, so the job cannot end while the woken worker
    # lets go (a running job of 1200 tokens could, and round 1 would find it
    # done); the first takes it back from the stopped second, which wakes.
    held_by = wait_for(lambda: owner(r, key, entry) if r.xlen(out) >= 3 else None,
                       "the job under way")
    first = by_name[held_by]
    second = by_name["wb" if held_by == "wa" else "wa"]
    for rnd, (sleeper, taker) in enumerate(((first, second), (second, first))):
        if rnd == 0:
            sleeper.signal(signal.SIGSTOP)
        # (round 1: the sleeper was stopped at the end of round 0)
        try:
            n_stop = r.xlen(out)
            wait_for(lambda: owner(r, key, entry) == taker.name, f"round {rnd}: the takeover")
            wait_for(lambda: r.xlen(out) >= n_stop + 3, f"round {rnd}: the new holder writing")
            if rnd == 0:
                taker.signal(signal.SIGSTOP)  # frozen: the job waits for round 1
        finally:
            sleeper.signal(signal.SIGCONT)
        wait_for(lambda: let_go(by_name) == rnd + 1, f"round {rnd}: the woken worker letting go")
    evs = client.events(job["id"], timeout=60)
    tokens, done = check_stream(evs, event_validator)
    assert [e for _, e in evs if e["type"] == "error"] == []
    assert done["finish_reason"] == "length"
    assert done["usage"]["completion_tokens"] == job["max_tokens"]
    assert tokens == want  # token-exact across both takeovers
    wait_no_pending(r, client.prefix)
    # delivered three times, each delivery published something: no
    # TOO_MANY_DELIVERIES though max_deliveries is 1
    assert not r.exists(f"{client.prefix}dead")
    assert let_go(by_name) == 2
