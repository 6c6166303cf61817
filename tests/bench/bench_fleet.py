#!/usr/bin/python3
"""The fleet soak (issue 19 part 2; `make bench-fleet`): one private
redis-server, 2 dispatchers and N sim workers (engine/sim/: a modelled H200
serving Qwen3-14B; real scheduler, KV cache, sampler, worker and protocol,
no weights), loaded open-loop by `redlm bench` at rising rates with think and
no_think requests, output lengths drawn from a range and repeated prompts.

The sweep runs twice with one --seed, so both runs send the same jobs (each
sampled one with its own seed): first calm, then under faults: a quarter of
the workers killed with SIGKILL and restarted, one dispatcher restarted, and
Redis stopped (SIGSTOP) for 2 s, at fixed fractions of the faulted sweep's
length (levels x duration; for 3 levels 0.5, 1.3 and 2.2 durations in). Then (--coalesce-ms) the workers restart with coalesce_ms and the
calm sweep runs a third time, coalesced. The calm and coalesced sweeps run the
workers at the daemons' default claim, lease and heartbeat intervals (Redis's
cost per token is stated at defaults); the faulted one restarts them with short
ones (claims after 1 s idle, renewals every 200 ms), so that a killed worker's
jobs move within the sweep (--calm-intervals soak: short ones throughout). Afterwards every job's redlm:out:<id> stream is read back: jobs lost
(no done), duplicated events (a seq twice), out-of-order events (seq i not at
entry 0-(i+1)), and jobs whose token ids differ from the calm run's.

Per level it reports delivered output tokens/s, Redis CPU per delivered
token (us, from INFO cpu), Redis CPU utilisation, events per token (from the
client's counts), dispatcher CPU per request (us, /proc), TTFT and
inter-token time p50/p99, and the CPU a sim worker costs. From the largest
calm level it extrapolates the rate at which Redis's one thread saturates
(1 s of CPU per s / CPU per token) and how many real H200s (at the sim's
modelled batch-64 rate) that serves. Output: a table on stdout and
$OUT/fleet.json. Everything it starts it stops, by pid.

With --cluster (`make bench-fleet-cluster`) the fleet runs on a local
3-master + 3-replica Redis Cluster (tests/bench/local_cluster.py, the one copy
bench_cluster.py and the tests use; node timeout 5 s so the 2 s pause stays a
pause): workers, dispatchers and `redlm bench` get the seed list; the faults
add a CLUSTER FAILOVER of the master that holds the queue slot
({prefix}requests and {prefix}jobs:*, which every job passes), and the 2 s
SIGSTOP hits that slot's master (after the failover: the former replica).
Redis CPU per token sums INFO cpu over the masters; the busiest master's
share is reported too, and sets the saturation estimate (it saturates first).
Streams are read back with a cluster client: each key from its master.
--against-single runs the soak on one redis-server first, then on the
cluster, and prints the cluster/single saturation ratio of that one run:
estimated from CPU per token, and with --redis-cpu-pct measured, every
redis-server capped at that share of a core (tests/bench/cpucap.py) so that
one instance and the cluster's busiest master both saturate within this
host's reach (the table gains busiest_util and busiest_throttled, the
share of CFS periods the cap bit in: near 1 when saturated). This host's
speed drifts by 2x within minutes, and one soak's two halves are minutes
apart: --alternate K keeps both fleets up and runs their calm sweeps in
turn (S C S ... C S), each cluster sweep against the one-instance sweeps
beside it, and prints the median ratio (no fault sweep; every sweep is
checked against its fleet's first).
Before and after the soak tests/bench/redis_probe.py measures this
machine's Redis speed (us a call of the soak's own commands, busy and
paced), printed with the figures: on a shared host they drift by 2-3x
within an hour, and a run is read against its own.

  /usr/bin/python3 tests/bench/bench_fleet.py --workers 64 --rates 4,8,16 --duration 20
  /usr/bin/python3 tests/bench/bench_fleet.py --cluster --against-single --workers 8 --rates 4,8 --duration 10
  /usr/bin/python3 tests/bench/bench_fleet.py --cluster --against-single --single-replica --workers 6 \
      --rates 160 --duration 10 --pin --coalesce-ms 0 --clients 256 --redis-cpu-pct 10 \
      [--alternate 5]   # root
  /usr/bin/python3 tests/bench/bench_fleet.py --cluster --against-single --single-replica --pin \
      --own-cores --alternate 3 --workers 16 --model qwen3-1.7b --rates 2500 --clients 1024 \
      --duration 8 --coalesce-ms 0   # 16+ cores: each redis-server on a core of its own
"""
import argparse
import json
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import redis

from cpucap import CpuCap, CpuCapError
from local_cluster import RedisCluster, free_port, stop_process, stop_processes
from redis_probe import cpu_set, probe as redis_probe

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "engine/tokenizers/qwen3"
TICK = os.sysconf("SC_CLK_TCK")
# redis-py's cluster client logs a traceback for every MOVED it follows
# after the failover; it follows them, so they are noise, not errors
logging.getLogger("redis.cluster").setLevel(logging.CRITICAL)


def cores(a, who, i=0):
    """--pin: the CPUs (a taskset -c list) of a process: who is "fleet"
    (workers, dispatchers, the load generator), "master" or "replica" (the
    redis-server of master i; one instance is master 0). By default every
    redis-server on the first CPU (a replica there or with the fleet, per
    --replicas-on) and the fleet on the others. --own-cores: each
    redis-server on a CPU of its own, master i on the i-th and its replica
    on the (3 + i)-th, the fleet on the rest: Redis on real cores, as a
    deployment runs it (needs 7; on fewer they wrap around, which makes the
    figures meaningless: a dry run). CPUs are those this process may use
    (a container's cpuset need not start at 0)."""
    cpus = sorted(os.sched_getaffinity(0))
    n = len(cpus)
    if a.own_cores:
        if who == "fleet":
            return ",".join(map(str, cpus[6:] if n > 6 else cpus))
        return str(cpus[((3 if who == "replica" else 0) + i) % n])
    if who == "replica" and a.replicas_on == "fleet":
        who = "fleet"
    return ",".join(map(str, cpus[1:] if n > 1 else cpus)) if who == "fleet" else str(cpus[0])


def cpu_s(pid):
    """utime + stime of pid in seconds (0 once it is gone)."""
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK
    except (OSError, IndexError):
        return 0.0


class Fleet:
    def __init__(self, a):
        self.a = a
        self.out = pathlib.Path(a.out).resolve()
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.prefix = "fl:"
        self.cluster = None       # --cluster: the local RedisCluster (addr = its seed list)
        self.procs = []           # every process started, stopped at the end by pid
        self.dead_cpu = {"worker": 0.0, "dispatcher": 0.0}  # CPU of processes since killed
        self.redis = None
        self.workers = {}
        self.dispatchers = {}
        self.coalesce_ms = 0      # the workers' --coalesce-ms
        # the claim, lease and heartbeat intervals: the daemons' defaults, or
        # (fault sweep) short ones, so that a killed worker's jobs are taken
        # over within a second rather than claim_idle_ms's 30 s
        self.fast_claims = a.calm_intervals == "soak"
        # --redis-cpu-pct: every redis-server in a cgroup capped at that
        # share of a core (cpucap.py), so that saturation is in reach
        self.cap = CpuCap(a.redis_cpu_pct) if a.redis_cpu_pct else None

    def spawn(self, args, log, who="fleet"):
        """--pin: Redis on cores of its own, everything else on the others,
        so Redis's CPU per token is its own (issue 27 point 3; cores())."""
        if self.a.pin:
            args = ["taskset", "-c", cores(self.a, who), *args]
        p = subprocess.Popen(args, stdout=open(self.out / "logs" / log, "w"),
                             stderr=subprocess.STDOUT, cwd=ROOT)
        self.procs.append(p)
        return p

    def key(self, rest, job_id=None):
        """A key as the fleet writes it (schemas/README.md): on a cluster the
        queue keys carry {prefix} and a request's keys {id} as hash tag."""
        if not self.cluster:
            return f"{self.prefix}{rest}{job_id or ''}"
        return f"{self.prefix}{rest}{{{job_id}}}" if job_id else f"{{{self.prefix}}}{rest}"

    def start_redis(self):
        if self.a.cluster:
            d = self.out / "logs" / "cluster"
            shutil.rmtree(d, ignore_errors=True)  # a stale nodes.conf would not join
            # a node timeout past the 2 s SIGSTOP: the pause stays a pause
            self.cluster = RedisCluster(d, node_timeout_ms=5000,
                                        cpus=cores(self.a, "master") if self.a.pin else None)
            self.addr = self.cluster.seeds
            self.r = self.cluster.client()
            if self.a.pin:  # each node where cores() puts it: master i, its replica
                roles = self.cluster.roles()
                for i, m in enumerate(sorted(p for p, r in roles.items() if r == "master")):
                    for port, who in ((m, "master"), (self.cluster.replica_of(m), "replica")):
                        os.sched_setaffinity(self.cluster.proc(port).pid,
                                             cpu_set(cores(self.a, who, i)))
            if self.cap:
                for p in self.cluster.running():
                    self.cap.add(self.cluster.proc(p).pid, str(p))
            return
        self.redis = self.spawn(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no", "--dir", str(self.out / "logs")],
                                "redis.log", who="master")
        if self.cap:
            self.cap.add(self.redis.pid, str(self.port))
        self.r = redis.Redis(port=self.port, decode_responses=True)
        for _ in range(200):
            try:
                if self.r.ping():
                    break
            except redis.exceptions.RedisError:
                time.sleep(0.02)
        else:
            sys.exit("redis-server did not start")
        if self.a.single_replica:
            # like for like with the cluster, whose masters each feed a
            # replica: the instance feeds one too (it runs with the rest)
            rport = free_port()
            rp = self.spawn(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(self.out / "logs"),
                             "--replicaof", "127.0.0.1", str(self.port)], "replica.log",
                            # --pin: where a cluster's replica of master 0 runs
                            who="replica")
            if self.cap:
                self.cap.add(rp.pid, str(rport))
            rr = redis.Redis(port=rport, decode_responses=True)
            for _ in range(500):
                try:
                    if rr.info("replication").get("master_link_status") == "up":
                        return
                except redis.exceptions.RedisError:
                    pass
                time.sleep(0.02)
            sys.exit("the replica did not sync")

    def start_dispatcher(self, name):
        self.dispatchers[name] = self.spawn(
            [str(ROOT / self.a.build / "redlm-dispatcher"), "--redis", self.addr, "--prefix",
             self.prefix, "--name", name, "--pools", "fast,think", "--http-port", "0",
             *self.shard_args()],
            f"dispatcher-{name}.log")

    def shard_args(self):
        """pool_shards (issue 27; the cluster only): the daemons' default unless given."""
        return ["--pool-shards", str(self.a.pool_shards)] if self.a.pool_shards else []

    def start_worker(self, name):
        self.workers[name] = self.spawn(
            [str(ROOT / self.a.build / "redlm-worker"), "--redis", self.addr, "--prefix", self.prefix,
             "--model", self.a.tokenizer, "--backend", "sim", "--sim-profile", self.a.profile,
             "--sim-model", self.a.model, "--pools", "fast,think", "--name", name, "--threads", "1",
             "--http-port", "0", "--no-result-cache", "--max-batch", str(self.a.max_batch),
             *(["--claim-idle-ms", "1000", "--claim-interval-ms", "200", "--lease-renew-ms", "200",
                "--heartbeat-interval-ms", "500"] if self.fast_claims else []),
             "--coalesce-ms", str(self.coalesce_ms),
             *self.shard_args(),
             *([] if int(self.a.foreign_room_pct) < 0 else
               ["--foreign-room-pct", str(self.a.foreign_room_pct)]),
             *self.a.worker_arg],
            f"worker-{name}.log")

    def wait_ready(self, names, kind):
        deadline = time.time() + 300
        for n in names:
            log = self.out / "logs" / f"{kind}-{n}.log"
            while "ready:" not in log.read_text():
                procs = self.workers if kind == "worker" else self.dispatchers
                if procs[n].poll() is not None or time.time() > deadline:
                    sys.exit(f"{kind} {n} did not get ready:\n{log.read_text()[-2000:]}")
                time.sleep(0.05)

    def kill(self, kind, name, sig):
        procs = self.workers if kind == "worker" else self.dispatchers
        p = procs[name]
        self.dead_cpu[kind] += cpu_s(p.pid)  # read before it is reaped
        p.send_signal(sig)
        p.wait(30)

    def redis_nodes(self):
        """{port: plain client} of every Redis serving: the one instance, or
        each running cluster node."""
        if not self.cluster:
            return {self.port: self.r}
        return {p: self.cluster.node(p) for p in self.cluster.running()}

    def snap(self):
        nodes = {}
        for port, r in self.redis_nodes().items():
            info = r.info("cpu")
            stats = r.info("commandstats")
            # every command Redis ran: calls and CPU (the breakdown per
            # token and per worker-second)
            n = {}
            for k, v in stats.items():
                if k.startswith("cmdstat_"):
                    n[f"us_{k[8:]}"] = v.get("usec", 0) / 1e6
                    n[f"calls_{k[8:]}"] = v.get("calls", 0)
            n["redis_cpu"] = info["used_cpu_sys"] + info["used_cpu_user"]
            # read events (a client's socket readable: about one per round
            # trip, whatever the pipeline holds) and commands: what the CPU
            # outside the commands goes with (issue 27 point 3)
            st = r.info("stats")
            n["reads"] = st.get("total_reads_processed", 0)
            n["cmds"] = st.get("total_commands_processed", 0)
            n["xadd"] = stats.get("cmdstat_xadd", {}).get("calls", 0)
            n["master"] = r.info("replication")["role"] == "master"
            if self.cap:
                n.update(self.cap.stat(str(port)))
            nodes[port] = n
        return {"t": time.time(), "nodes": nodes,
                "disp_cpu": self.dead_cpu["dispatcher"] + sum(
                    cpu_s(p.pid) for p in self.dispatchers.values() if p.poll() is None),
                "worker_cpu": self.dead_cpu["worker"] + sum(
                    cpu_s(p.pid) for p in self.workers.values() if p.poll() is None),
                "hb": self.heartbeats()}

    HB_COUNTERS = ("jobs_done", "tokens_out", "foreign_taken", "foreign_looks")

    def heartbeats(self):
        """{worker: its counters} from the workers' heartbeats (as of each
        one's last, every heartbeat_interval_ms): on a cluster, how many
        jobs a worker took from a shard not its home one."""
        out = {}
        for n in self.workers:
            try:
                hb = json.loads(self.r.get(f"{self.prefix}worker:{n}") or "{}")  # as publish.c names it
            except (redis.exceptions.RedisError, ValueError):
                continue
            out[n] = {k: hb.get(k, 0) for k in self.HB_COUNTERS}
        return out

    def stop_all(self):
        """Everything this fleet started: the workers and dispatchers first,
        while Redis still answers (a draining worker's last flush needs it;
        with Redis gone it would wait out drain_timeout_s), then Redis. One
        deadline for them all, then SIGKILL."""
        if self.cluster:
            for p in self.cluster.running():
                self.cluster.proc(p).send_signal(signal.SIGCONT)  # none left stopped
        if self.redis and self.redis.poll() is None:
            self.redis.send_signal(signal.SIGCONT)
        stop_processes([p for p in self.procs if p is not self.redis], 20)
        if self.cluster:
            self.cluster.stop()
        if self.redis:
            stop_process(self.redis, 20)
        if self.cap:
            for d in self.cap.close():
                print(f"warning: cgroup {d} left behind", file=sys.stderr)


def hb_delta(before, after):
    """The fleet's heartbeat counters over a level, summed over workers (a
    worker restarted meanwhile counts from its restart)."""
    tot = dict.fromkeys(Fleet.HB_COUNTERS, 0)
    for n, a in after.items():
        b = before.get(n, {})
        for k in tot:
            tot[k] += a[k] - b.get(k, 0) if a[k] >= b.get(k, 0) else a[k]
    return tot


def faults(fleet, log):
    """The fault schedule of the faulted sweep, at fixed fractions of its
    length L = levels x duration (for 3 levels: 0.5, 1.3 and 2.2 durations
    in). On a cluster the Redis pause stops ONE master: the one serving the
    queue slot ({prefix}requests, {prefix}jobs:*: every job passes it), and
    before it, as a separate step, that master is failed over to its replica
    (CLUSTER FAILOVER: the pool streams and their groups change node)."""
    a = fleet.a
    span = len(a.rates) * a.duration
    t0 = time.time()

    def at(frac):
        d = t0 + frac * span - time.time()
        if d > 0:
            time.sleep(d)

    def note(what):
        log.append((round(time.time() - t0, 1), what))

    victims = sorted(fleet.workers)[:max(1, a.workers // 4)]
    at(0.5 / 3)
    for n in victims:
        fleet.kill("worker", n, signal.SIGKILL)
    note(f"kill -9 {len(victims)} workers")
    time.sleep(2)
    for n in victims:
        fleet.start_worker(n)
    fleet.wait_ready(victims, "worker")
    note(f"{len(victims)} workers restarted and ready")
    at(1.3 / 3)
    fleet.kill("dispatcher", "d1", signal.SIGTERM)
    fleet.start_dispatcher("d1")
    fleet.wait_ready(["d1"], "dispatcher")
    note("dispatcher d1 restarted")
    if fleet.cluster:
        at(1.75 / 3)
        old = fleet.cluster.master_of(fleet.key("jobs:fast"))
        new = fleet.cluster.failover(old)
        note(f"CLUSTER FAILOVER of master :{old} (the queue slot) to its replica :{new}")
    at(2.2 / 3)
    if fleet.cluster:
        port = fleet.cluster.master_of(fleet.key("jobs:fast"))
        proc, what = fleet.cluster.proc(port), f"master :{port} (the queue slot {fleet.key('jobs:*')})"
    else:
        proc, what = fleet.redis, "Redis"
    proc.send_signal(signal.SIGSTOP)
    time.sleep(2)
    proc.send_signal(signal.SIGCONT)
    note(f"{what} stopped 2 s (SIGSTOP/SIGCONT)")


def redis_delta(before, after):
    """Redis's work in one level from two snap()s: CPU and command figures
    summed over the masters (a node counts if it was a master at either end:
    a failover moves the role mid-level), and the busiest master's CPU (on a
    cluster it saturates first; on one instance it is the instance)."""
    out = {"redis_cpu": 0.0, "xadd": 0, "busiest_cpu": 0.0, "busiest_port": None,
           "busiest_throttled": None}
    for port, a in after["nodes"].items():
        b = before["nodes"].get(port)
        if b is None or not (a["master"] or b["master"]):
            continue
        for k, v in a.items():
            if k != "master":
                out[k] = out.get(k, 0) + v - b.get(k, 0)  # a command new in this level: from 0
        if a["redis_cpu"] - b["redis_cpu"] > out["busiest_cpu"]:
            out["busiest_cpu"], out["busiest_port"] = a["redis_cpu"] - b["redis_cpu"], port
            if "periods" in a:  # --redis-cpu-pct: the share of periods its cap bit in
                out["busiest_throttled"] = round((a["throttled"] - b["throttled"]) /
                                                 max(a["periods"] - b["periods"], 1), 3)
    return out


def sweep(fleet, tag, read=None):
    a = fleet.a
    read = read or a.read
    levels = []
    for rate in a.rates:
        res = fleet.out / f"{tag}-r{rate:g}" / "result.json"
        before = fleet.snap()
        cmd = [str(ROOT / a.build / "redlm"), "bench", "--redis", fleet.addr, "--prefix",
               fleet.prefix, "--target", "dispatcher", "--rate", f"{rate:g}", "--clients",
               str(a.clients), "--duration", str(a.duration), "--requests", "100000",
               "--prompt-len", a.prompt_len, "--output-len", a.output_len, "--think", "0.3",
               "--repeat", "0.2", "--hot", "4", "--seed", "19", "--timeout", "120",
               "--read", read, *(["--ids", a.ids] if a.ids != "slots" else []), "--no-plots", "--label", f"{tag} {rate:g}/s", "--out", str(res)]
        if a.pin:
            cmd = ["taskset", "-c", cores(a, "fleet"), *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                       stderr=open(fleet.out / "logs" / f"bench-{tag}-{rate:g}.log", "w"))
        after = fleet.snap()
        lv = json.loads(res.read_text())["levels"][0]
        cpu = {k: after[k] - before[k] for k in ("t", "disp_cpu", "worker_cpu")}
        cpu["hb"] = hb_delta(before["hb"], after["hb"])
        levels.append({"rate": rate, "level": lv, "workers": len(fleet.workers),
                       "cpu": {**cpu, **redis_delta(before, after)}})
    return levels, " ".join(cmd)


def read_tokens(r, key):
    """(tokens, lost, dup, out of order, finish reason) of one job's stream
    (on a cluster r reads the key from the master of its slot)."""
    evs = r.xrange(key)
    seqs, tokens, order = [], [], 0
    for i, (eid, f) in enumerate(evs):
        ev = json.loads(f["event"])
        seqs.append(ev["seq"])
        order += ev["seq"] != i or eid != f"0-{i + 1}"
        if ev["type"] == "delta":
            tokens += ev["token_ids"]
    last = json.loads(evs[-1][1]["event"]) if evs else {}
    done = last.get("type") == "done"
    return tokens, int(not done), len(seqs) - len(set(seqs)), order, last.get("finish_reason")


def check(fleet, calm, faulted):
    """lost / dup / out of order over both runs, token mismatches of the
    faulted run against the calm one (requests matched by level and number):
    a job that ran to its length must have the calm run's tokens; one cut
    short (the client's --timeout cancelled it on an overloaded host) must
    have a prefix of them, and is counted as cut."""
    tot = {"jobs": 0, "lost": 0, "dup": 0, "out_of_order": 0, "mismatch": 0, "compared": 0,
           "cut": 0, "mismatched": []}
    for c, f in zip(calm, faulted):
        want = {}
        for run, lv in (("calm", c), ("fault", f)):
            for q in lv["level"]["requests"]:
                toks, lost, dup, order, fin = read_tokens(fleet.r, fleet.key("out:", q["id"]))
                tot["jobs"] += 1
                tot["lost"] += lost
                tot["dup"] += dup
                tot["out_of_order"] += order
                num = q["id"].rsplit("-", 1)[1]
                if run == "calm":
                    want[num] = toks if fin == "length" else None
                elif want.get(num) is not None:
                    tot["compared"] += 1
                    if fin == "length":
                        bad = toks != want[num]
                        tot["mismatch"] += bad
                        if bad and len(tot["mismatched"]) < 50:  # what kind of job, where
                            k = next(i for i, (a, b) in enumerate(zip(toks + [None], want[num] + [None])) if a != b)
                            tot["mismatched"].append({"id": q["id"], "mode": q["mode"],
                                                      "repeated": q["repeated"],
                                                      "max_tokens": q["max_tokens"], "first_diff": k})
                    else:
                        tot["cut"] += 1
                        tot["mismatch"] += toks != want[num][:len(toks)]
    return tot


def row(lv):
    L, c = lv["level"], lv["cpu"]
    reqs = L["requests"]
    toks = sum(q["completion_tokens"] for q in reqs)
    evs = sum(q["events"] for q in reqs)
    wall = L["window_s"] or 1
    return {"rate": lv["rate"], "issued": L["issued"], "completed": L["completed"],
            "errors": L["n_errors"], "tok_s": round(L["output_tokens_per_s"]),
            "redis_us_per_tok": round(c["redis_cpu"] / max(toks, 1) * 1e6, 2),
            "redis_util": round(c["redis_cpu"] / c["t"], 3),
            "busiest_us_per_tok": round(c["busiest_cpu"] / max(toks, 1) * 1e6, 2),
            "busiest_share": round(c["busiest_cpu"] / max(c["redis_cpu"], 1e-9), 3),
            "busiest_port": c["busiest_port"],
            "busiest_util": round(c["busiest_cpu"] / c["t"], 3),
            "busiest_throttled": c["busiest_throttled"],
            "events_per_tok": round(evs / max(toks, 1), 3),
            "xadd_per_tok": round(c["xadd"] / max(toks, 1), 3),
            "reads_per_tok": round(c.get("reads", 0) / max(toks, 1), 3),
            "read": L.get("read"), "streams_per_read": round(L.get("streams_per_read", 0), 1),
            "cmds_per_tok": round(c.get("cmds", 0) / max(toks, 1), 3),
            "disp_us_per_req": round(c["disp_cpu"] / max(len(reqs), 1) * 1e6),
            "worker_cpu_util": round(c["worker_cpu"] / c["t"], 3),
            # on a cluster: the share of jobs a worker took away from home
            # (heartbeat counters: a heartbeat interval's lag at either end)
            "foreign_share": round(c["hb"]["foreign_taken"] / max(c["hb"]["jobs_done"], 1), 3)
            if "hb" in c else None,
            "ttft_p50": round(L["ttft_ms"]["p50"], 1), "ttft_p99": round(L["ttft_ms"]["p99"], 1),
            "itl_p50": round(L["tpot_ms"]["p50"], 2), "itl_p99": round(L["tpot_ms"]["p99"], 2),
            "wall_s": wall,
            # Redis CPU per delivered token by command (us): what is per token
            # (XADD, XREAD, EXISTS) against what is per worker (XAUTOCLAIM ...)
            "redis_us_per_tok_by_cmd": {k[3:]: round(v / max(toks, 1) * 1e6, 2)
                                        for k, v in c.items() if k.startswith("us_")},
            # the INFO commandstats breakdown: per command, calls and CPU per
            # delivered token, calls per worker-second (what grows with the
            # fleet, not the load), CPU per call
            "commands": sorted(({"cmd": k[6:], "calls_per_tok": round(v / max(toks, 1), 4),
                                 "us_per_tok": round(c.get("us_" + k[6:], 0) / max(toks, 1) * 1e6, 3),
                                 "calls_per_worker_s": round(v / max(c["t"] * lv.get("workers", 1), 1e-9), 3),
                                 "us_per_call": round(c.get("us_" + k[6:], 0) / max(v, 1) * 1e6, 2)}
                                for k, v in c.items() if k.startswith("calls_") and v > 0),
                               key=lambda x: -x["us_per_tok"])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--rates", default="4,8,16")
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--clients", type=int, default=512)
    ap.add_argument("--prompt-len", default="16..128")
    ap.add_argument("--output-len", default="64..256")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--tokenizer", default=str(TOKENIZER),
                    help="the sim workers' tokenizer folder (default: the repo's Qwen3 one)")
    ap.add_argument("--model", default="qwen3-14b")
    ap.add_argument("--gpu-tok-s", type=float, default=3780,
                    help="one real GPU's tokens/s at full batch: redlm's CUDA backend measured on an H200, "
                         "Qwen3-14B BF16, batch 64, 1k context (BENCHMARKS.md, issue 25; the sim's fitted "
                         "model gives 3,660; before the fit it assumed 6,285)")
    ap.add_argument("--coalesce-ms", type=int, default=50,
                    help="then restart the workers with this coalesce_ms and run the calm sweep "
                         "once more (0 = skip)")
    ap.add_argument("--cluster", action="store_true",
                    help="run on a local 3-master + 3-replica Redis Cluster (tests/bench/local_cluster.py)"
                         " instead of one redis-server; the faults add a CLUSTER FAILOVER")
    ap.add_argument("--pool-shards", type=int, default=0,
                    help="pool_shards for workers and dispatchers (a cluster's pool streams are "
                         "split over this many hash tags, issue 27); 0 = their default (3)")
    ap.add_argument("--foreign-room-pct", default="-1",
                    help="the workers' foreign_room_pct (home shards on a cluster, issue 27 "
                         "point 4; 0 = every shard read alike, as before); -1 = their default; "
                         "with --against-single a comma-separated list runs the cluster soak "
                         "once for each, in one run (an A/B)")
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--pin", action="store_true",
                    help="redis-server alone on the first CPU (taskset), everything else on the others: "
                         "Redis's CPU per token without the fleet's noise in it (with --cluster "
                         "every node there, with --single-replica the replica too)")
    ap.add_argument("--own-cores", action="store_true",
                    help="with --pin, every redis-server on a core of its own (master i on core i, "
                         "its replica on core 3 + i; one instance as master 0) and the fleet on the "
                         "rest: saturation on real cores, no cap (7 CPUs or more; on fewer they "
                         "wrap around: a dry run)")
    ap.add_argument("--replicas-on", choices=("redis", "fleet"), default="redis",
                    help="with --pin, where the replicas run: on core 0 with the masters (redis: "
                         "six time-sliced redis-servers on one core for a cluster, two for one "
                         "instance), or on the fleet's cores (fleet: the masters alone on core 0, "
                         "as a replica runs on another host than its master)")
    ap.add_argument("--single-replica", action="store_true",
                    help="give the one redis-server a replica, as each cluster master has one "
                         "(a like-for-like --against-single)")
    ap.add_argument("--read", choices=("shared", "all", "own"), default="shared",
                    help="how the load generator reads the requests' streams: one shared XREAD "
                         "per process blocked on the bell the workers ring, as the front door "
                         "does (default); one shared XREAD blocked on every stream (all: the "
                         "shared reader before the bell); or one per request")
    ap.add_argument("--calm-intervals", choices=("defaults", "soak"), default="defaults",
                    help="the workers' claim, lease and heartbeat intervals in the calm and "
                         "coalesced sweeps: the daemons' defaults (5 s lease renewals, 2 s "
                         "heartbeats: what Redis's cost per token is stated at), or the fault "
                         "sweep's short ones throughout (200 ms, 500 ms: the soak before "
                         "2026-12-05)")
    ap.add_argument("--ids", choices=("slots", "own"), default="slots",
                    help="on a cluster, the load generator's ids: on the request slots, one per "
                         "master, as redlm's front door chooses them (default: a worker writes "
                         "and a reader reads the requests of one master in one call), or one "
                         "slot each, as a client that makes up its own ids")
    ap.add_argument("--compare-reads", nargs="?", const="own", default="",
                    help="after the calm sweep, the same sweep with each of these --read modes "
                         "(comma-separated; alone: own unless --read own, then shared): the "
                         "clients' share of Redis's work, measured in one run")
    ap.add_argument("--redis-cpu-pct", type=float, default=0,
                    help="cap every redis-server at this %% of a core (a cgroup each, "
                         "tests/bench/cpucap.py; root): saturation within this host's reach, "
                         "so that --against-single measures the ratio of delivered tokens at "
                         "saturation instead of estimating it (0 = no cap)")
    ap.add_argument("--alternate", type=int, default=0,
                    help="with --cluster --against-single and --redis-cpu-pct or --own-cores: both "
                         "fleets up at once "
                         "and their calm sweeps in turn, this many of the cluster's between one "
                         "instance's (no fault sweep), the workers at --coalesce-ms throughout: "
                         "each cluster sweep against the one-instance sweeps beside it, and the "
                         "median ratio")
    ap.add_argument("--worker-arg", action="append", default=[],
                    help="one more argument for every worker (repeat it: --worker-arg=--steal-ms "
                         "--worker-arg=1000), for an A/B of a worker setting")
    ap.add_argument("--out", default=None)
    ap.add_argument("--against-single", action="store_true",
                    help="with --cluster: first run the same soak on one redis-server, then on "
                         "the cluster, and report the cluster/single saturation ratio of this run")
    a = ap.parse_args()
    # SIGTERM (a timeout, a CI stop) unwinds like an exception: every
    # fleet's finally stops what it started, nothing is left running
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    a.rates = [float(x) for x in a.rates.split(",")]
    if "," in a.foreign_room_pct and not (a.cluster and a.against_single):
        ap.error("--foreign-room-pct: a list only with --cluster --against-single")
    a.out = a.out or str(ROOT / a.build / ("bench-fleet-cluster" if a.cluster else "bench-fleet"))
    if a.redis_cpu_pct:
        try:
            CpuCap(a.redis_cpu_pct)
        except CpuCapError as e:
            ap.error(f"--redis-cpu-pct: {e}")
    if a.own_cores and not a.pin:
        ap.error("--own-cores: with --pin")
    if a.alternate and not (a.cluster and a.against_single and (a.redis_cpu_pct or a.own_cores)):
        ap.error("--alternate: with --cluster --against-single, and --redis-cpu-pct or --own-cores")
    if not (a.cluster and a.against_single):
        return soak(a)[1]
    if a.alternate:
        return alternate(a)
    # the same soak twice in one run, one instance first: a ratio from one run
    res = {}
    pcts = [int(x) for x in str(a.foreign_room_pct).split(",")]
    runs = [(False, pcts[0])] + [(True, p) for p in pcts]
    for cluster, pct in runs:
        sub = ("cluster" if len(pcts) == 1 else f"cluster-frp{pct}") if cluster else "single"
        b = argparse.Namespace(**{**vars(a), "cluster": cluster, "foreign_room_pct": pct,
                                  "out": str(pathlib.Path(a.out) / sub)})
        print(f"\n## {'3-master cluster' if cluster else 'one instance'}"
              + (f", foreign_room_pct {pct if pct >= 0 else 'default'}" if cluster else ""))
        res[(cluster, pct)] = soak(b)
    single = res[(False, pcts[0])][0]
    cmp = []
    for pct in pcts:
        cl = res[(True, pct)][0]
        ratio = cl["redis_saturation_tok_s"] / single["redis_saturation_tok_s"]
        margin = cl["redis_saturation_margin_tok_s"] / single["redis_saturation_margin_tok_s"]
        print(f"\nsaturation: one instance ~{single['redis_saturation_tok_s']} tok/s, cluster (busiest "
              f"master{'' if len(pcts) == 1 else f', foreign_room_pct {pct}'}) "
              f"~{cl['redis_saturation_tok_s']} tok/s: {ratio:.2f}x; idle floors apart: "
              f"~{single['redis_saturation_margin_tok_s']} and "
              f"~{cl['redis_saturation_margin_tok_s']} tok/s: {margin:.2f}x")
        cmp.append({"foreign_room_pct": pct, "single_tok_s": single["redis_saturation_tok_s"],
                    "cluster_tok_s": cl["redis_saturation_tok_s"], "ratio": round(ratio, 3),
                    "single_margin_tok_s": single["redis_saturation_margin_tok_s"],
                    "cluster_margin_tok_s": cl["redis_saturation_margin_tok_s"],
                    "ratio_margin": round(margin, 3), **equal_node_load(single, cl),
                    **measured_at_cap(a, single, cl)})
    (pathlib.Path(a.out) / "compare.json").write_text(
        json.dumps(cmp[0] if len(cmp) == 1 else cmp, indent=1))
    return max(r[1] for r in res.values())


def measured_at_cap(a, single, cl):
    """--redis-cpu-pct: delivered tokens/s of the cluster against one
    instance at the top calm rate, every node capped alike. A measured ratio
    at saturation when one instance is saturated there (its CPU at the cap,
    throttled in most periods): then the cluster's figure is at most its
    own capacity, and the ratio at least what it would show saturated too
    (unless the cluster also sits at its cap, then it is the ratio)."""
    if not a.redis_cpu_pct:
        return {}
    s, c = single["rows"]["calm"][-1], cl["rows"]["calm"][-1]
    cap = a.redis_cpu_pct / 100
    ratio = c["tok_s"] / max(s["tok_s"], 1)
    print(f"measured, every node capped at {a.redis_cpu_pct:g} % of a core, at {s['rate']:g} jobs/s: "
          f"one instance {s['tok_s']} tok/s (its CPU {s['busiest_util'] / cap:.0%} of the cap, "
          f"throttled in {s['busiest_throttled']:.0%} of periods), the cluster {c['tok_s']} tok/s "
          f"(busiest master {c['busiest_util'] / cap:.0%} of the cap, throttled in "
          f"{c['busiest_throttled']:.0%}): {ratio:.2f}x")
    return {"cap_pct": a.redis_cpu_pct, "capped_single_tok_s": s["tok_s"],
            "capped_cluster_tok_s": c["tok_s"], "capped_ratio": round(ratio, 3),
            "capped_single_util_of_cap": round(s["busiest_util"] / cap, 3),
            "capped_single_throttled": s["busiest_throttled"],
            "capped_cluster_busiest_util_of_cap": round(c["busiest_util"] / cap, 3),
            "capped_cluster_busiest_throttled": c["busiest_throttled"]}


def equal_node_load(single, cl, masters=3):
    """The cluster at its top rate against one instance at a third of it,
    when the sweep has that rate (e.g. --rates 43,128): each master then
    carries about what the one instance does. Redis's price a token falls
    as its load grows (fewer, fuller wakes and calls; warmer caches), so
    the ratio above, both measured at one fleet load, sets one instance at
    full load against masters at a third of it each. At equal load a node
    the two cost `cost_ratio` (cluster / one instance, Redis CPU a token);
    were that so at saturation, where each master is as busy as one
    instance at its own, the cluster would carry 1 / (busiest share x
    cost_ratio) times one instance's tokens: an estimate, which this
    machine cannot saturate to check. {} when the rate is not in the sweep."""
    top = cl["rows"]["calm"][-1]
    third = [r for r in single["rows"]["calm"]
             if abs(r["rate"] * masters - top["rate"]) <= 0.05 * top["rate"]]
    if not third:
        return {}
    cost = top["redis_us_per_tok"] / max(third[0]["redis_us_per_tok"], 1e-9)
    est = 1 / max(top["busiest_share"] * cost, 1e-9)
    print(f"equal load a node: the cluster at {top['rate']:g}/s {top['redis_us_per_tok']} us/token, "
          f"one instance at {third[0]['rate']:g}/s {third[0]['redis_us_per_tok']}: {cost:.2f}x; "
          f"with the busiest master's {top['busiest_share']:.0%}: ~{est:.2f}x one instance at "
          f"saturation (an estimate)")
    return {"equal_load_single_rate": third[0]["rate"],
            "equal_load_single_us_per_tok": third[0]["redis_us_per_tok"],
            "equal_load_cost_ratio": round(cost, 3), "equal_load_estimate": round(est, 3)}


def start_fleet(a, holder, coalesce_ms=0):
    """Redis, 2 dispatchers and a.workers workers, all ready: (fleet, the
    workers' names, seconds the workers took to get ready). The fleet is
    the caller's to stop (stop_all), also when this raises."""
    fleet = Fleet(a)
    fleet.coalesce_ms = coalesce_ms
    holder.append(fleet)
    fleet.start_redis()
    for d in ("d1", "d2"):
        fleet.start_dispatcher(d)
    fleet.wait_ready(["d1", "d2"], "dispatcher")
    names = [f"w{i}" for i in range(a.workers)]
    t = time.time()
    for n in names:
        fleet.start_worker(n)
    fleet.wait_ready(names, "worker")
    return fleet, names, time.time() - t


def alternate(a):
    """--alternate K: one instance's fleet and the cluster's up at once,
    every redis-server capped alike (--redis-cpu-pct), and their calm
    sweeps in turn, one instance first and last (S C S C ... C S). This
    host's speed drifts by 2x within minutes (BENCHMARKS.md), more than the
    gap between one soak's two halves can hide; each cluster sweep is read
    against the mean of the one-instance sweeps just before and after it,
    and the median of the K ratios is the figure. Every sweep of a fleet
    sends the same jobs (one --seed), so each is checked against that
    fleet's first: 0 lost / duplicated / out of order / mismatched. The
    workers run with --coalesce-ms throughout (0: uncoalesced)."""
    pin = (cores(a, "master"), cores(a, "fleet")) if a.pin else (None, None)
    speed = {"before": redis_probe(2.0, *pin)}
    fleets, started = {}, []
    try:
        for cluster in (False, True):
            b = argparse.Namespace(**{**vars(a), "cluster": cluster, "out": str(
                pathlib.Path(a.out) / ("cluster" if cluster else "single"))})
            fleets[cluster] = start_fleet(b, started, a.coalesce_ms)[0]
        # each node's idle floor (the fleet up, no load: blocked reads,
        # heartbeats, on a cluster the bus), a cost per second that a cap
        # magnifies: at 10 % of a core a floor of 0.5 % of one is 5 % of
        # the node, at a whole core 0.5 %
        s0 = {c: f.snap() for c, f in fleets.items()}
        time.sleep(5)  # a measured idle window
        s1 = {c: f.snap() for c, f in fleets.items()}
        floor = {c: {p: (s1[c]["nodes"][p]["redis_cpu"] - s0[c]["nodes"][p]["redis_cpu"]) /
                     (s1[c]["t"] - s0[c]["t"]) for p in s1[c]["nodes"] if p in s0[c]["nodes"]}
                 for c in fleets}
        runs = {False: [], True: []}
        for i in range(2 * a.alternate + 1):
            cluster = i % 2 == 1
            runs[cluster].append(sweep(fleets[cluster], f"calm{i // 2}")[0])
        checks = {c: [check(fleets[c], runs[c][0], r) for r in runs[c][1:]] for c in runs}
    finally:
        for f in started:
            f.stop_all()
    speed["after"] = redis_probe(2.0, *pin)
    rows = {c: [row(r[0]) for r in runs[c]] for c in runs}
    cap = a.redis_cpu_pct / 100 or 1.0  # --own-cores: a whole core each
    print(f"| sweep | redis | tok_s | redis_us_per_tok | busiest CPU / {'cap' if a.redis_cpu_pct else 'core'} | "
          f"busiest throttled | reads_per_tok | foreign_share | ttft_p50 | itl_p50 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    order = [(i % 2 == 1, i // 2) for i in range(2 * a.alternate + 1)]
    for c, k in order:
        r = rows[c][k]
        print(f"| {k} | {'cluster' if c else 'one instance'} | {r['tok_s']} | {r['redis_us_per_tok']} | "
              f"{r['busiest_util'] / cap:.2f} | {'-' if r['busiest_throttled'] is None else r['busiest_throttled']} | {r['reads_per_tok']} | "
              f"{r['foreign_share'] if c else '-'} | "
              f"{r['ttft_p50']} | {r['itl_p50']} |")
    def beside(fc, fs):
        """each cluster sweep's fc against the mean fs of the one-instance
        sweeps before and after it"""
        return [fc(rows[True][k]) / max((fs(rows[False][k]) + fs(rows[False][k + 1])) / 2, 1e-9)
                for k in range(a.alternate)]

    def median(xs):
        xs = sorted(xs)
        return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2

    def net(c):
        """tokens/s a saturated node carries per core of CPU above its
        idle floor: the busiest node's (u - floor) is what its tokens cost"""
        return lambda r: r["tok_s"] / max(r["busiest_util"] - floor[c].get(r["busiest_port"], 0), 1e-9)
    ratios = beside(lambda r: r["tok_s"], lambda r: r["tok_s"])
    nets = beside(net(True), net(False))
    med = median(ratios)
    how = (f"every node capped at {a.redis_cpu_pct:g} % of a core" if a.redis_cpu_pct
           else "every redis-server on a core of its own")
    print(f"\nmeasured, {how}, at {a.rates[-1]:g} jobs/s"
          f"{f', coalesce_ms {a.coalesce_ms}' if a.coalesce_ms else ''}: "
          f"cluster / one instance beside it {', '.join(f'{x:.2f}' for x in ratios)}: median {med:.2f}x")
    print(f"idle floors (a core's share, the fleet up and no load): one instance "
          f"{max(floor[False].values()):.4f}, the cluster's busiest master {max(floor[True].values()):.4f}; "
          f"tokens per CPU above the floor, cluster / one instance: "
          f"{', '.join(f'{x:.2f}' for x in nets)}: median {median(nets):.2f}x (floors are paid per "
          f"second{': at a whole core each they weigh a tenth of what they do here' if a.redis_cpu_pct else ''})")
    bad = 0
    for c in (False, True):
        tot = {k: sum(t[k] for t in checks[c]) for k in ("jobs", "lost", "dup", "out_of_order",
                                                          "mismatch", "compared", "cut")}
        bad += tot["lost"] + tot["dup"] + tot["out_of_order"] + tot["mismatch"]
        print(f"check, {'cluster' if c else 'one instance'}, every sweep against its first: {tot}")
    for when, sp in speed.items():
        print(f"  Redis speed {when}: hot XADD {sp['hot']['xadd']}; busy XADD {sp['soak_shaped']['xadd']}")
    (pathlib.Path(a.out) / "alternate.json").write_text(json.dumps(
        {"options": vars(a), "rows": {"single": rows[False], "cluster": rows[True]},
         "ratios": [round(x, 3) for x in ratios], "median": round(med, 3),
         "idle_floor": {"single": floor[False], "cluster": floor[True]},
         "ratios_above_floor": [round(x, 3) for x in nets], "median_above_floor": round(median(nets), 3),
         "checks": {"single": checks[False], "cluster": checks[True]}, "redis_probe": speed},
        indent=1))
    return 1 if bad else 0


def restart_workers(fleet, names, fast_claims):
    for n in names:
        fleet.kill("worker", n, signal.SIGTERM)
    fleet.fast_claims = fast_claims
    for n in names:
        fleet.start_worker(n)
    fleet.wait_ready(names, "worker")


def soak(a):
    """One whole soak on the backend a names; (result, exit status: 1 when
    anything was lost, duplicated, out of order or mismatched)."""
    # this machine's Redis speed now, before and after (redis_probe.py): a
    # shared host's per-call costs drift by 2-3x within an hour, and the
    # soak's figures are read against them
    pin = (cores(a, "master"), cores(a, "fleet")) if a.pin else (None, None)
    speed = {"before": redis_probe(2.0, *pin)}
    started = []
    try:
        fleet, names, start_s = start_fleet(a, started)
        s0 = fleet.snap()
        time.sleep(5)
        s1 = fleet.snap()
        idle = (s1["worker_cpu"] - s0["worker_cpu"]) / (s1["t"] - s0["t"]) / a.workers
        # Redis's own floor with the fleet up and no load (the workers'
        # BLOCKing reads, heartbeats, claims, its cron): a cost per second,
        # which the per-token figures of a light load carry too
        idle_node = {p: (s1["nodes"][p]["redis_cpu"] - s0["nodes"][p]["redis_cpu"]) /
                     (s1["t"] - s0["t"]) for p in s1["nodes"] if p in s0["nodes"]}
        idle_redis = sum(idle_node.values())
        calm, cmd = sweep(fleet, "calm")
        others = [m for m in a.compare_reads.split(",") if m] if a.compare_reads else []
        if others == ["own"] and a.read == "own":
            others = ["shared"]
        calm_other = {m: sweep(fleet, f"calm-{m}", m)[0] for m in others}
        if not fleet.fast_claims:  # the faults need short claim intervals
            restart_workers(fleet, names, fast_claims=True)
        flog = []
        th = threading.Thread(target=faults, args=(fleet, flog))
        th.start()
        faulted, _ = sweep(fleet, "fault")
        th.join()
        tot = check(fleet, calm, faulted)
        tot_other = {m: check(fleet, calm, lvs) for m, lvs in calm_other.items()}
        coal, tot_coal = [], None
        if a.coalesce_ms:
            fleet.coalesce_ms = a.coalesce_ms
            restart_workers(fleet, names, fast_claims=a.calm_intervals == "soak")
            coal, _ = sweep(fleet, "coalesced")
            tot_coal = check(fleet, calm, coal)
    finally:
        for f in started:
            f.stop_all()
    speed["after"] = redis_probe(2.0, *pin)
    rows = {"calm": [row(lv) for lv in calm],
            **{f"calm, {m} reads": [row(lv) for lv in lvs] for m, lvs in calm_other.items()},
            "fault": [row(lv) for lv in faulted],
            f"coalesce {a.coalesce_ms} ms": [row(lv) for lv in coal]}
    top = rows["calm"][-1]
    # the busiest master saturates first (on one instance: the instance)
    sat_tok_s = 1e6 / top["busiest_us_per_tok"]
    # the same without the idle floor in the per-token cost: a cost per
    # second (a cluster's bus and replica pings, the workers' blocked reads)
    # that a light load's tokens carry in full and a saturating load shares
    # out: busiest util = floor + tok/s x margin, saturated at util 1
    floor = idle_node.get(top["busiest_port"], 0.0)
    margin_us = top["busiest_us_per_tok"] - floor * 1e6 / max(top["tok_s"], 1)
    sat_margin = (1 - floor) * 1e6 / margin_us if margin_us > 0 else sat_tok_s
    result = {"options": {k: v for k, v in vars(a).items()}, "bench_command": cmd,
              "workers_start_s": round(start_s, 1), "idle_cpu_per_worker": round(idle, 4),
              "idle_redis_util": round(idle_redis, 4),
              "busy_cpu_per_worker": round(top["worker_cpu_util"] / a.workers, 4),
              "faults": flog, "check": tot, "check_coalesced": tot_coal,
              "check_other_reads": tot_other, "rows": rows,
              "redis": "cluster 3+3" if a.cluster else "one instance",
              "redis_saturation_tok_s": round(sat_tok_s),
              "busiest_idle_util": round(floor, 4), "busiest_margin_us_per_tok": round(margin_us, 2),
              "redis_saturation_margin_tok_s": round(sat_margin),
              "gpus_per_redis": round(sat_tok_s / a.gpu_tok_s, 1), "redis_probe": speed}
    (fleet.out / "fleet.json").write_text(json.dumps(result, indent=1))
    cols = ["rate", "issued", "errors", "tok_s", "redis_us_per_tok", "redis_util",
            *(["busiest_us_per_tok", "busiest_share"] if a.cluster else []),
            *(["busiest_util", "busiest_throttled"] if a.redis_cpu_pct else []), "events_per_tok",
            "xadd_per_tok", "reads_per_tok", "streams_per_read", "disp_us_per_req", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99"]
    print("| run | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for run in rows:
        for r in rows[run]:
            print(f"| {run} | " + " | ".join(str(r[c]) for c in cols) + " |")
    # the INFO commandstats breakdown of the calm and coalesced runs' top levels
    for run in ("calm", f"coalesce {a.coalesce_ms} ms"):
        top_lv = rows[run][-1] if rows.get(run) else None
        if not top_lv:
            continue
        print(f"\nRedis commands, {run} run at {top_lv['rate']}/s ({a.workers} workers"
              f"{', Redis pinned to core 0' if a.pin else ''}):")
        print("| command | calls/token | us/token | calls/worker-s | us/call |")
        print("|---|---:|---:|---:|---:|")
        for cmd in top_lv["commands"][:14]:
            print(f"| {cmd['cmd']} | {cmd['calls_per_tok']} | {cmd['us_per_tok']} | "
                  f"{cmd['calls_per_worker_s']} | {cmd['us_per_call']} |")
    print("\nThis machine's Redis now (tests/bench/redis_probe.py, us a call: hot cache; the emit "
          "script's commands over 1,024 jobs' keys, busy; the same paced, ~10 % busy like the soak's):")
    for when, sp in speed.items():
        print(f"  {when}: hot XADD {sp['hot']['xadd']}; busy XADD {sp['soak_shaped']['xadd']}, "
              f"HMGET {sp['soak_shaped']['hmget']}; paced XADD {sp['paced']['xadd']}, "
              f"HMGET {sp['paced']['hmget']}, a script call {sp['paced']['evalsha']}")
    print(f"\nfaults: {flog}")
    print(f"check: {tot}")
    if tot_coal:
        print(f"check, coalesced against calm: {tot_coal}")
    print(f"sim worker CPU: idle {idle:.4f}, busy {result['busy_cpu_per_worker']:.4f} cores each; "
          f"{a.workers} workers ready in {start_s:.1f} s")
    print(f"Redis with the fleet up and no load: {idle_redis:.4f} of a core "
          f"({idle_redis * 1e6 / max(top['tok_s'], 1):.1f} us per token at the top rate's "
          f"{top['tok_s']} tok/s)")
    who = (f"The busiest master (:{top['busiest_port']}, {top['busiest_share']:.0%} of the masters' "
           f"{top['redis_us_per_tok']} us/token)" if a.cluster else "Redis")
    print(f"{who} saturates at ~{sat_tok_s:.0f} delivered tokens/s "
          f"(1e6 us / {top['busiest_us_per_tok']} us per token) = "
          f"{result['gpus_per_redis']} GPUs at {a.gpu_tok_s:.0f} tok/s each")
    print(f"Without its idle floor ({floor:.4f} of a core, paid per second): {margin_us:.2f} us "
          f"per token at the margin, saturating at ~{sat_margin:.0f} tokens/s "
          f"((1 - floor) / margin)")
    for m, t in tot_other.items():
        print(f"check, {m} reads against calm: {t}")
    bad = sum(t["lost"] + t["dup"] + t["out_of_order"] + t["mismatch"]
              for t in (tot, tot_coal, *tot_other.values()) if t)
    return result, 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
