"""How fast this machine's Redis is right now, for the benchmarks that
report Redis CPU per token (issue 27 point 3): bench_fleet.py runs it before
and after its soak and prints it beside the figures, so that runs made hours
apart on a shared machine can be told apart from changes in our code.

Three probes against a redis-server of its own (pinned like the soak's:
Redis on `redis_cpus`, this client on `client_cpus`):
- hot: pipelined XADDs of one 200-byte event to one stream, and GETs of one
  key: the machine's speed with everything in cache;
- soak-shaped: the emit script's work (worker/fence.c FENCE_EMIT,
  reduced): per job an HMGET of its holder record, an XADD of a ~200-byte
  event at an explicit ID and a GET of its cancel key, 16 jobs a call by
  EVALSHA, over 1,024 jobs' keys (a stream dropped at 300 events, as a job
  ends): what the soak's commands cost when the working set outgrows the
  caches, which is where a shared host's neighbours show;
- paced: the same, a call every 2 ms (Redis ~10 % busy, idle between, as
  the soak's Redis runs): an idle core's caches and clock are not what a
  busy one's are, on a shared host least of all.

The answer is INFO commandstats' usec_per_call of each command (inside the
script for the soak-shaped probe): the same counter the soak's breakdown
reports, so the two compare directly.

  /usr/bin/python3 tests/bench/redis_probe.py [--seconds 2] [--pin]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import redis

from local_cluster import free_port, wait_ping

EMIT_SHAPED = """
for j = 1, #KEYS do
  redis.call('HMGET', 'own:' .. KEYS[j], 'holder', 'entry')
  redis.call('XADD', KEYS[j], ARGV[1] .. '-1', 'event', ARGV[2])
  if redis.call('XLEN', KEYS[j]) >= 300 then redis.call('DEL', KEYS[j]) end
  redis.call('GET', 'cancel:' .. KEYS[j])
end
return 1
"""
EVENT = ('{"seq":12,"type":"delta","delta":{"content":" the quick brown fox jumps"},'
         '"token_ids":[1234,5678,91011,1213],"token_bytes":[[32,116,104,101]]}')
JOBS, PER_CALL = 1024, 16
PACE_S = 0.002


def cpu_set(cpus):
    """taskset's list ("1", "1-3", "0,2-3") as a set of CPU numbers."""
    out = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _per_call(r, cmds):
    s = r.info("commandstats")
    return {c: s.get(f"cmdstat_{c}", {}).get("usec_per_call") for c in cmds}


def _emit_calls(r, sha, seconds, step, pace_s):
    """The emit-shaped script over every job's keys, PER_CALL jobs a call,
    for seconds, pace_s between calls; returns the next step."""
    t0 = time.time()
    while time.time() - t0 < seconds:
        for g in range(0, JOBS, PER_CALL):
            keys = [f"out:{i}" for i in range(g, g + PER_CALL)]
            r.evalsha(sha, len(keys), *keys, str(step), EVENT)
            if pace_s:
                time.sleep(pace_s)
        step += 1
    return step


def probe(seconds=2.0, redis_cpus=None, client_cpus=None):
    """{"hot": {xadd, get}, "soak_shaped" and "paced": {xadd, hmget, get,
    evalsha}}: us a call, measured now on a redis-server of the probe's own (pinned to
    redis_cpus when given; the caller runs on client_cpus, when given, for
    the probe's duration)."""
    port = free_port()
    pin = ["taskset", "-c", redis_cpus] if redis_cpus else []
    proc = subprocess.Popen([*pin, "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    mask = os.sched_getaffinity(0)
    try:
        if client_cpus:
            os.sched_setaffinity(0, cpu_set(client_cpus))
        wait_ping(port, "the probe's redis-server", proc=proc)
        r = redis.Redis(port=port)
        out = {}
        # hot: one stream, one key, pipelined 64 deep
        r.config_resetstat()
        t0 = time.time()
        while time.time() - t0 < seconds / 2:
            p = r.pipeline(transaction=False)
            for _ in range(64):
                p.xadd("hot", {"event": EVENT}, maxlen=1000, approximate=True)
                p.get("hotkey")
            p.execute()
        out["hot"] = _per_call(r, ("xadd", "get"))
        # soak-shaped: the emit script's commands over 1,024 jobs' keys
        r.flushall()
        p = r.pipeline(transaction=False)
        for i in range(JOBS):
            p.hset(f"own:out:{i}", mapping={"holder": "w0/1234/1733400000000", "entry": "1-1",
                                            "xlen": 0, "stalls": 0, "req": "0" * 64})
        p.execute()
        sha = r.script_load(EMIT_SHAPED)
        step = 1
        for name, pace_s in (("soak_shaped", 0), ("paced", PACE_S)):
            r.config_resetstat()
            step = _emit_calls(r, sha, seconds / 2, step, pace_s)
            out[name] = _per_call(r, ("xadd", "hmget", "get", "evalsha"))
        return out
    finally:
        os.sched_setaffinity(0, mask)
        proc.kill()
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--pin", action="store_true",
                    help="redis-server on core 0, this client on core 1 (bench_fleet --pin)")
    a = ap.parse_args()
    rest = f"1-{os.cpu_count() - 1}"
    print(json.dumps(probe(a.seconds, "0" if a.pin else None, rest if a.pin else None)))


if __name__ == "__main__":
    sys.exit(main())
