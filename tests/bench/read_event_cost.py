"""What one read event costs Redis, against what a command costs (issue 27
point 4): why the cluster's figures are read in read events a token.

INFO commandstats times a command's execution only; what Redis pays to be
woken for a client's write (epoll, read(2), parsing, the reply's write(2)
through the loopback TCP stack) is in its process CPU but in no command's
usec. This measures Redis's own CPU (INFO cpu: used_cpu_user + sys, which
counts both) per call, on a redis-server of its own, for:
- PING one at a time: a read event and next to no command;
- PING pipelined 64 deep: the command's share alone, one event per 64;
- XREADGROUP of nothing new (no BLOCK): a busy worker's old plain look;
- the aged look's script (common/rconn.c aged_read_lua, read from the
  source) on a drained shard: what a look costs now.

  /usr/bin/python3 tests/bench/read_event_cost.py [--calls 20000] [--pin]
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys

import redis

from local_cluster import free_port, wait_ping

ROOT = pathlib.Path(__file__).resolve().parents[2]


def aged_look_script():
    """The aged look's Lua, from its C string literal in common/rconn.c."""
    src = (ROOT / "common" / "rconn.c").read_text()
    m = re.search(r"static const char aged_read_lua\[\] =\n(.*?);\n", src, re.S)
    return "".join(bytes(s, "utf-8").decode("unicode_escape")
                   for s in re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))


def cpu_us(r):
    i = r.info("cpu")
    return (i["used_cpu_user"] + i["used_cpu_sys"]) * 1e6


def measure(r, calls, fn, per=1):
    """Redis CPU (us) a call: fn makes `per` calls each time."""
    c0 = cpu_us(r)
    for _ in range(calls // per):
        fn()
    return round((cpu_us(r) - c0) / (calls // per * per), 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--pin", action="store_true",
                    help="redis-server on core 0, this client on the others")
    a = ap.parse_args()
    port = free_port()
    pin = ["taskset", "-c", "0"] if a.pin else []
    proc = subprocess.Popen([*pin, "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if a.pin:
            os.sched_setaffinity(0, set(range(1, os.cpu_count())))
        wait_ping(port, "the probe's redis-server", proc=proc)
        r = redis.Redis(port=port)
        # a shard as a busy worker sees another: its jobs delivered, nothing new
        for s in ("a", "b"):
            r.xgroup_create(f"jobs:{s}", "workers", id="0", mkstream=True)
            for _ in range(20):
                r.xadd(f"jobs:{s}", {"job": "x" * 300})
            r.xreadgroup("workers", "w0", {f"jobs:{s}": ">"}, count=20)
        sha = r.script_load(aged_look_script())

        def pipelined_pings():
            p = r.pipeline(transaction=False)
            for _ in range(64):
                p.ping()
            p.execute()
        out = {
            "ping": measure(r, a.calls, r.ping),
            "ping_pipelined_64": measure(r, a.calls * 8, pipelined_pings, per=64),
            "xreadgroup_nothing_new": measure(
                r, a.calls, lambda: r.xreadgroup("workers", "w1", {"jobs:a": ">", "jobs:b": ">"},
                                                 count=4)),
            "aged_look_drained": measure(
                r, a.calls, lambda: r.evalsha(sha, 2, "jobs:a", "jobs:b", "workers", "w1", 4, 50)),
        }
        out["read_event"] = round(out["ping"] - out["ping_pipelined_64"], 2)
        print(json.dumps({"redis_cpu_us_per_call": out, "calls": a.calls, "pin": a.pin}))
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
