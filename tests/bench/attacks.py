"""Every attack of issue 26 in one go, against real processes, and the
promises they must not break (`make bench-attacks`; BENCHMARKS.md,
"Attacks on the queue contract").

This script runs the identity and intake attacks itself (tenant `client`,
the attacker, against tenant `client2`, the honest one) on:
  an AOF redis-server (appendfsync always) with config/redis-acl.conf
  loaded (passwords added the documented way), one redlm-dispatcher as
  user `dispatcher` with tenants client and client2, two redlm-workers as
  user `worker`.
Honest traffic (client2) runs the whole time on threads: every request
gets a unique id and is checked when its done comes. The attacker:
  - the max-ID attack (XADD requests:client 18446744073709551615-...),
    again and again; a MAXLEN 0 trim of its own stream; a 50 MB entry;
    XADD on the shared stream and on client2's (NOPERM);
  - a finished job's id reused with another job, and with the same job;
  - two different live jobs under one id, at once (two workers);
  - ids of client2's honest requests, sent first (pre-emption);
  - reads, cancels and subscriptions of client2's ids (NOPERM);
  - jobs Python's json.dumps writes with NaN, Infinity and a lone surrogate;
  - one worker killed with SIGKILL in the middle, its jobs resumed.

Then it imports every tests/bench/attack_*.py beside it (other issues'
attacks: the front door, memory pressure); each exposes
    run(redis_addr: str, build: str, workdir: str) -> dict
returning at least the five counters below (plus any extra keys to print),
and starts and stops what it needs. Each module gets a fresh AOF
redis-server of its own, without ACL, at redis_addr.

Printed, per part and in total, each of which must be 0:
  jobs_lost        requests with no done (or refusal) where their client looks
  gaps             streams whose seqs skip or repeat, or whose done's usage
                   differs from the tokens delivered
  mixed_streams    streams holding events of two jobs
  wrong_submitter  answers that name (or carry) a job their reader did not send
  honest_refused   honest requests refused (an XADD error, or an error event)
Exit status 1 when any is not 0.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time

import redis

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from local_cluster import free_port, stop_process, wait_ping  # noqa: E402

MODEL = ROOT / "tests" / "data" / "models" / "tiny-qwen3-a"
MAX_ID = "18446744073709551615-18446744073709551615"
COUNTERS = ("jobs_lost", "gaps", "mixed_streams", "wrong_submitter", "honest_refused")
USERS = ("admin", "worker", "dispatcher", "client", "client2")


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


class Proc:
    def __init__(self, args, log, env=None):
        self.log = open(log, "w")
        self.path = log
        self.p = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_line(self, text, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.path}: exited: {open(self.path).read()[-2000:]}")
            if text in open(self.path).read():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.path}: no {text!r} within {timeout} s")

    def stop(self, sig=signal.SIGTERM):
        stop_process(self.p, 30, sig)
        self.log.close()


def redis_server(workdir, acl_lines=None):
    """An AOF redis-server on a free port in workdir; with acl_lines, those
    users as its aclfile. Returns (Proc, port)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
            "--save", "", "--appendonly", "yes", "--appendfsync", "always"]
    if acl_lines is not None:
        (workdir / "users.acl").write_text("\n".join(acl_lines) + "\n")
        args += ["--aclfile", str(workdir / "users.acl")]
    p = Proc(args, workdir / "redis.log")
    if acl_lines is not None:
        wait_ping(port, username="admin", password=PW["admin"])
    else:
        wait_ping(port)
    return p, port


PW = {u: f"attack-{u}-{os.getpid()}" for u in USERS}


def shipped_acl():
    out = []
    for l in (ROOT / "config" / "redis-acl.conf").read_text().splitlines():
        if not l.strip() or l.startswith("#"):
            continue
        name = l.split()[1]
        if name in PW:
            l += " #" + sha(PW[name])
        out.append(l)
    return out


def read_stream(r, key, timeout):
    """(events, complete): every event of key until done, or what came
    within timeout."""
    evs, last = [], "0-0"
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            res = r.xread({key: last}, block=200, count=1000)
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
            continue
        for _, entries in res or []:
            for eid, f in entries:
                last = eid
                ev = json.loads(f["event"])
                evs.append(ev)
                if ev["type"] == "done":
                    return evs, True
    return evs, False


class Tally:
    def __init__(self):
        self.c = {k: 0 for k in COUNTERS}
        self.extra = {"honest_answered": 0, "attacks_sent": 0, "attacks_refused_by_acl": 0}
        self.mu = threading.Lock()
        self.notes = []

    def add(self, k, n=1, note=None):
        with self.mu:
            if k in self.c:
                self.c[k] += n
            else:
                self.extra[k] = self.extra.get(k, 0) + n
            if note and n:
                self.notes.append(f"{k}: {note}")


def check_gapless(t, evs, what):
    """seq 0..n-1, and the done's usage equals the tokens delivered."""
    if [e["seq"] for e in evs] != list(range(len(evs))):
        t.add("gaps", 1, f"{what}: seqs {[e['seq'] for e in evs][:20]}")
        return
    done = evs[-1]
    n_tok = sum(len(e.get("token_ids", [])) for e in evs if e["type"] == "delta")
    if done.get("finish_reason") in ("stop", "length") and \
            done["usage"]["completion_tokens"] != n_tok:
        t.add("gaps", 1, f"{what}: usage {done['usage']['completion_tokens']}, delivered {n_tok}")


def tokens(evs):
    return [x for e in evs if e["type"] == "delta" for x in e["token_ids"]]


def greedy(jid, prompt, n=8):
    return json.dumps({"id": jid, "prompt_ids": prompt, "max_tokens": n, "temperature": 0,
                       "ignore_eos": True, "cache": False, "stream_ttl_s": 600})


def honest_request(t, r, jid, prompt, n=8, timeout=300, expect=None):
    """One honest request of tenant client2, checked end to end. Returns its
    events (or None)."""
    text = greedy(jid, prompt, n)
    try:
        entry = r.xadd("redlm:requests:client2", {"job": text})
    except redis.exceptions.RedisError as e:
        t.add("honest_refused", 1, f"{jid}: XADD {e}")
        return None
    evs, complete = read_stream(r, f"redlm:out:client2:{jid}", timeout)
    if not complete:
        t.add("jobs_lost", 1, f"client2:{jid}: {len(evs)} events, no done")
        return None
    ident = evs[0].get("request", {})
    if ident != {"entry": entry, "job_sha256": sha(text)}:
        t.add("wrong_submitter", 1, f"client2:{jid}: answer names {ident}, sent {entry}")
    if evs[0]["type"] == "error" or evs[-1].get("finish_reason") == "error":
        t.add("honest_refused", 1, f"client2:{jid}: {evs[0]}")
    check_gapless(t, evs, f"client2:{jid}")
    if expect is not None and tokens(evs) != expect:
        t.add("mixed_streams", 1, f"client2:{jid}: tokens differ from its reference")
    t.add("honest_answered")
    return evs


def honest_traffic(t, port, stop, n_threads=3):
    def loop(k):
        r = redis.Redis(port=port, username="client2", password=PW["client2"],
                        decode_responses=True)
        i = 0
        while not stop.is_set():
            honest_request(t, r, f"bg{k}-{i}", [1 + (i % 40), 2 + k, 3], n=6 + i % 5)
            i += 1
    ths = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(n_threads)]
    for th in ths:
        th.start()
    return ths


def denied(t, fn, *a, **kw):
    t.add("attacks_sent")
    try:
        fn(*a, **kw)
    except redis.exceptions.NoPermissionError:
        t.add("attacks_refused_by_acl")
        return
    t.add("wrong_submitter", 1, f"{getattr(fn, '__name__', fn)}{a[:1]}: allowed")


def answer_of(t, a, jid, entry, text, timeout=180):
    """The attacker's own request: answered on its id (its identity first)
    or refused with ID_CONFLICT on out:<id>@<entry>; never silent."""
    key = f"redlm:out:client:{jid}"
    evs, complete = read_stream(a, key, timeout)
    if complete and evs[0].get("request", {}).get("entry") == entry:
        check_gapless(t, evs, key)
        return "answered", evs
    if complete and evs[0].get("request", {}).get("job_sha256") == sha(text):
        return "duplicate", evs  # the same text, answered once
    alt, ok = read_stream(a, f"{key}@{entry}", timeout)
    if ok and alt[0].get("code") == "ID_CONFLICT":
        check_gapless(t, alt, f"{key}@{entry}")
        return "conflict", alt
    t.add("jobs_lost", 1, f"client:{jid} ({entry}): neither answered nor refused")
    return "lost", None


def wait_xadd(t, a, key, text, timeout=120):
    """The attacker's own next XADD, retried while its stream is exhausted:
    how long the dispatcher took to repair it is recorded (repair_ms_max)."""
    t0 = time.time()
    while True:
        try:
            entry = a.xadd(key, {"job": text})
            ms = int((time.time() - t0) * 1000)
            t.extra["repair_ms_max"] = max(t.extra.get("repair_ms_max", 0), ms)
            return entry
        except redis.exceptions.ResponseError as e:
            if "exhausted" not in str(e) or time.time() - t0 > timeout:
                raise


def own_attacks(build, workdir, rounds):
    t = Tally()
    srv, port = redis_server(workdir / "redis", shipped_acl())
    addr = f"127.0.0.1:{port}"
    procs, stop = [], None
    for u in ("worker", "dispatcher"):
        (workdir / f"{u}.pw").write_text(PW[u] + "\n")
    try:
        d = Proc([str(build / "redlm-dispatcher"), "--redis", addr, "--name", "ad",
                  "--redis-user", "dispatcher", "--redis-password-file", str(workdir / "dispatcher.pw"),
                  "--tenants", "client,client2", "--think-ratio", "0", "--http-port", "0",
                  "--block-ms", "100"], workdir / "dispatcher.log")
        procs.append(d)
        ws = []
        for name in ("aw1", "aw2"):
            w = Proc([str(build / "redlm-worker"), "--redis", addr, "--model", str(MODEL),
                      "--name", name, "--threads", "1", "--pools", "fast,think",
                      "--redis-user", "worker", "--redis-password-file", str(workdir / "worker.pw"),
                      "--http-port", "0", "--block-ms", "100", "--claim-idle-ms", "2000",
                      "--claim-interval-ms", "300", "--lease-renew-ms", "300"],
                     workdir / f"worker-{name}.log")
            procs.append(w)
            ws.append(w)
        for p in procs:
            p.wait_line("ready:")
        a = redis.Redis(port=port, username="client", password=PW["client"],
                        decode_responses=True)
        b = redis.Redis(port=port, username="client2", password=PW["client2"],
                        decode_responses=True)
        admin = redis.Redis(port=port, username="admin", password=PW["admin"],
                            decode_responses=True)
        stop = threading.Event()
        ths = honest_traffic(t, port, stop)
        killed = False
        for rnd in range(rounds):
            # the max-ID attack, a MAXLEN 0 trim, around the dispatcher
            t.add("attacks_sent", 2)
            a.execute_command("XADD", "redlm:requests:client", MAX_ID, "job", greedy(f"evil{rnd}", [9]))
            wait_xadd(t, a, "redlm:requests:client", greedy(f"trim{rnd}", [8]))
            a.execute_command("XADD", "redlm:requests:client", "MAXLEN", "0", "*", "job",
                              greedy(f"trim{rnd}b", [8]))
            denied(t, a.xadd, "redlm:requests", {"job": greedy("x", [1])})
            denied(t, a.xadd, "redlm:requests:client2", {"job": greedy(f"h{rnd}", [1])})
            denied(t, a.xadd, "redlm:jobs:fast", {"job": greedy("x", [1])})
            # pre-emption: the id client2 is about to use, sent first by client
            va, vb = greedy(f"victim{rnd}", [7, 7]), [5, 5, rnd % 30]
            a.xadd("redlm:requests:client", {"job": va})
            t.add("attacks_sent")
            honest_request(t, b, f"victim{rnd}", vb)
            # reads, cancels and subscriptions of client2's ids
            denied(t, a.xrange, f"redlm:out:client2:victim{rnd}")
            denied(t, a.set, f"redlm:cancel:client2:bg0-{rnd}", "1")
            ps = a.pubsub()
            t.add("attacks_sent")
            try:
                ps.subscribe(f"redlm:tok:client2:bg1-{rnd}")
                ps.get_message(timeout=1)
                t.add("wrong_submitter", 1, "client subscribed to client2's tokens")
            except redis.exceptions.NoPermissionError:
                t.add("attacks_refused_by_acl")
            ps.close()
            # a finished job's id reused: another job (conflict), the same (one answer)
            ja = greedy(f"re{rnd}", [4, 4, 4])
            e1 = a.xadd("redlm:requests:client", {"job": ja})
            st, first = answer_of(t, a, f"re{rnd}", e1, ja)
            jb = greedy(f"re{rnd}", [6, 6, 6])
            e2 = a.xadd("redlm:requests:client", {"job": jb})
            e3 = a.xadd("redlm:requests:client", {"job": ja})
            t.add("attacks_sent", 2)
            if answer_of(t, a, f"re{rnd}", e2, jb)[0] != "conflict":
                t.add("wrong_submitter", 1, f"re{rnd}: a different job under a taken id was not refused")
            after, _ = read_stream(a, f"redlm:out:client:re{rnd}", 10)
            if first and after != first:
                t.add("mixed_streams", 1, f"re{rnd}: the first stream changed")
            del e3
            # two different live jobs, one id, at once (two workers), each
            # with a reference run alone under an id of its own
            pa, pb = [3, 1, 4, 1, 5], [2, 7, 1, 8]
            refs = {}
            for tag, p in (("A", pa), ("B", pb)):
                tx = greedy(f"ref{tag}{rnd}", p, 24)
                ex = a.xadd("redlm:requests:client", {"job": tx})
                _, evr = answer_of(t, a, f"ref{tag}{rnd}", ex, tx)
                refs[sha(greedy(f"live{rnd}", p, 24))] = tokens(evr or [])
            ta, tb = greedy(f"live{rnd}", pa, 24), greedy(f"live{rnd}", pb, 24)
            ea = a.xadd("redlm:requests:client", {"job": ta})
            eb = a.xadd("redlm:requests:client", {"job": tb})
            t.add("attacks_sent", 2)
            evs, ok = read_stream(a, f"redlm:out:client:live{rnd}", 60)
            if not ok:
                t.add("jobs_lost", 1, f"live{rnd}: no done")
            else:
                check_gapless(t, evs, f"live{rnd}")
                owner = evs[0].get("request", {})
                if tokens(evs) != refs.get(owner.get("job_sha256")):
                    t.add("mixed_streams", 1, f"live{rnd}: tokens of neither job alone")
                loser = eb if owner.get("entry") == ea else ea
                alt, ok2 = read_stream(a, f"redlm:out:client:live{rnd}@{loser}", 30)
                if not ok2 or alt[0].get("code") != "ID_CONFLICT":
                    t.add("jobs_lost", 1, f"live{rnd}: the other job got no ID_CONFLICT")
            # Python's json.dumps defaults: answered on their own ids
            for k, doc in enumerate(({"prompt_ids": [1], "temperature": float("nan")},
                                     {"prompt_ids": [1], "metadata": {"x": float("inf")}},
                                     {"prompt": "a\ud800"})):
                jid = f"py{rnd}-{k}"
                a.xadd("redlm:requests:client", {"job": json.dumps({"id": jid, **doc})})
                t.add("attacks_sent")
                evs, ok = read_stream(a, f"redlm:out:client:{jid}", 30)
                if not ok or evs[0].get("code") != "INVALID_JSON":
                    t.add("jobs_lost", 1, f"{jid}: no INVALID_JSON on its own stream")
            # a 50 MB entry, once
            if rnd == 0:
                big = redis.Redis(port=port, username="client", password=PW["client"])
                big.xadd("redlm:requests:client", {"job": "x" * (50 << 20)})
                big.close()
                t.add("attacks_sent")
            # one worker killed mid-way, once: its jobs are resumed by the other
            if rnd == rounds // 2 and not killed:
                long_text = greedy(f"long{rnd}", [2, 2], 400)
                el = a.xadd("redlm:requests:client", {"job": long_text})
                deadline = time.time() + 30
                while admin.xlen(f"redlm:out:client:long{rnd}") < 5 and time.time() < deadline:
                    time.sleep(0.01)
                holder = admin.hget(f"redlm:own:client:long{rnd}", "holder") or "aw1/"
                victim = ws[0] if holder.startswith("aw1/") else ws[1]
                victim.stop(signal.SIGKILL)
                killed = True
                answer_of(t, a, f"long{rnd}", el, long_text, timeout=120)
        stop.set()
        for th in ths:
            th.join()
        # what the queue holds once it is all handled: nothing
        deadline = time.time() + 60
        keys = ["redlm:requests:client", "redlm:requests:client2", "redlm:jobs:fast",
                "redlm:jobs:think"]
        while time.time() < deadline and any(admin.xlen(k) for k in keys):
            time.sleep(0.1)
        t.extra["queue_entries_left"] = sum(admin.xlen(k) for k in keys)
        t.extra["acl_denials_of_daemons"] = len([e for e in admin.acl_log(count=1000)
                                                 if e["username"] in ("worker", "dispatcher")])
    finally:
        if stop is not None:
            stop.set()
        for p in procs:
            p.stop()
        srv.stop()
    return t


def module_attacks(build, workdir):
    """Every tests/bench/attack_*.py: (name, dict) each."""
    out = []
    for path in sorted(HERE.glob("attack_*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        wd = workdir / path.stem
        srv, port = redis_server(wd / "redis")
        try:
            res = mod.run(f"127.0.0.1:{port}", str(build), str(wd))
        except Exception as e:  # noqa: BLE001 - a part that fails is reported, not hidden
            res = {"error": f"{type(e).__name__}: {e}", **{k: 1 for k in COUNTERS}}
        finally:
            srv.stop()
        out.append((path.stem, res))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="rounds of the identity/intake attacks")
    ap.add_argument("--workdir", default=None, help="logs and Redis files (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the table as JSON here")
    args = ap.parse_args()
    build = (ROOT / os.environ.get("BUILD", "build")).resolve()
    wd = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="redlm-attacks-"))
    t0 = time.time()
    mine = own_attacks(build, wd / "identity_intake", args.rounds)
    parts = [("identity_intake", {**mine.c, **mine.extra})]
    parts += module_attacks(build, wd)
    total = {k: sum(int(p.get(k, 0)) for _, p in parts) for k in COUNTERS}
    print(f"attacks on the queue contract ({time.time() - t0:.0f} s; logs in {wd})")
    w = max(len(n) for n, _ in parts + [("total", {})])
    print(f"{'part':<{w}}  " + "  ".join(f"{k:>15}" for k in COUNTERS))
    for name, p in parts + [("total", total)]:
        print(f"{name:<{w}}  " + "  ".join(f"{int(p.get(k, 0)):>15}" for k in COUNTERS))
    for name, p in parts:
        extra = {k: v for k, v in p.items() if k not in COUNTERS}
        if extra:
            print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in extra.items()))
    for n in mine.notes[:50]:
        print("  " + n)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"parts": dict(parts), "total": total},
                                                      indent=2))
    return 1 if any(total.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
