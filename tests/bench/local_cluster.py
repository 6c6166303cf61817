"""A real local Redis Cluster on loopback ports, for the benchmarks and the
integration tests alike (issue 19): tests/bench/bench_cluster.py and
bench_fleet.py --cluster import it, and tests/integration/conftest.py takes
its `redis_cluster` fixture's class from here, so there is one copy of how
a cluster is started, watched and stopped.

RedisCluster starts n_masters masters with one replica each
(redis-server --cluster-enabled yes on free ports whose bus port, +10000, is
free too), joins them with redis-cli --cluster create, and stop() kills
every node it started by pid. It also answers what a fault schedule and a
CPU account need: which master serves a key's slot, the replica of a
master, every node's role and INFO. Plain redis-py, no pytest, so a bench
script can import it without the test fixtures.
"""
import random
import signal
import socket
import subprocess
import pathlib
import time

import redis


def _ephemeral_low():
    """The first port of the kernel's ephemeral range (outgoing connections
    take their local port from it)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


_handed_out = set()  # ports this process gave already, bus ports included: no two callers
                     # get the same, and no node's port is another node's bus port


def wait_or_kill(p, timeout):
    """Waits up to timeout seconds for process p (a Popen) to end, then
    SIGKILLs and reaps it."""
    try:
        p.wait(max(timeout, 0.1))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def stop_process(p, timeout=15, sig=signal.SIGTERM):
    """Sends sig to process p if it still runs, then wait_or_kill: how the
    benchmarks stop what they started (a worker drains on SIGTERM)."""
    if p.poll() is None:
        p.send_signal(sig)
        wait_or_kill(p, timeout)


def stop_processes(procs, timeout=30, sig=signal.SIGTERM):
    """stop_process for several at once: sig to every one still running,
    then one deadline for them all (workers drain side by side), then
    SIGKILL for what is left."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
    deadline = time.time() + timeout
    for p in procs:
        wait_or_kill(p, deadline - time.time())


def free_port(also=0):
    """A free loopback port (and port + also free too, when also is given: a
    cluster node's bus port) below the kernel's ephemeral range. A port the
    kernel hands out (bind to 0) can be taken, between this check and the
    server's bind, as the local port of any outgoing connection — a client
    connecting to the node started just before, or that node's cluster bus —
    and the server then dies on "Address already in use". Below the range no
    connection takes it."""
    low = _ephemeral_low()
    top = low - also
    rnd = random.Random()

    def kernels():  # an unusual range: what the kernel picks, as before
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        return p

    pick = kernels if top - 10000 < 1000 else lambda: rnd.randrange(10000, top)
    for _ in range(1000):
        p = pick()
        # the nodes are picked first and started after: a node on 12001
        # (bus 22001) started before one picked for 22001 takes its port
        want = {p, p + also} if also else {p}
        if not want & _handed_out and all(_free(x) for x in want):
            _handed_out.update(want)
            return p
    raise RuntimeError(f"no free port (below {low}) with port + {also} free too")


def wait_ping(port, what="redis-server", username=None, password=None, proc=None, log=None):
    """Until the server on port answers PING (10 s at most: a loaded machine), as username
    when given (a server whose default user is off). proc: the server's process, whose
    exit ends the wait at once, with the end of its log file (log) in the error."""
    r = redis.Redis(port=port, username=username, password=password)
    for _ in range(500):
        if proc is not None and proc.poll() is not None:
            tail = pathlib.Path(log).read_text()[-600:] if log and pathlib.Path(log).exists() else ""
            raise RuntimeError(f"{what} exited ({proc.returncode}): {tail}")
        try:
            if r.ping():
                return
        except redis.exceptions.RedisError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{what} did not start")


def start_redis(logdir):
    """A private redis-server on a free loopback port, no persistence, its
    log in logdir/redis.log, answering PING: (process, "127.0.0.1:port",
    a decoding client). The caller stops the process (stop_process)."""
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--logfile",
                             str(pathlib.Path(logdir) / "redis.log")])
    wait_ping(port, proc=proc, log=pathlib.Path(logdir) / "redis.log")
    return proc, f"127.0.0.1:{port}", redis.Redis(host="127.0.0.1", port=port,
                                                  decode_responses=True)


class RedisCluster:
    """A real local Redis Cluster: n_masters masters with one replica each
    (redis-server --cluster-enabled yes on free loopback ports, joined by
    redis-cli --cluster create), in dir. stop() kills every node.

    node_timeout_ms is the nodes' cluster-node-timeout: the tests keep it
    short (2 s) so a failover is quick; a soak that SIGSTOPs a master for
    2 s gives it more, so the pause stays a pause and does not turn into an
    automatic failover (a separate fault there).

    aclfile: every node loads it (`--aclfile`), and auth = (user, password)
    of a user in it with every right is how this class itself talks to the
    nodes: redis-cli --cluster create, node(), client(), and the replicas'
    masteruser/masterauth (their replication link is an ordinary client
    connection, so an ACL whose default user is off would refuse it; the
    cluster bus is not). Without them, no ACL: the default user does all.

    cpus: when given, every node runs under `taskset -c cpus` (bench_fleet
    --pin: the nodes on core 0, the fleet on the others)."""

    def __init__(self, dir, n_masters=3, node_timeout_ms=2000, aclfile=None, auth=None,
                 cpus=None):
        self.dir = pathlib.Path(dir)
        self.cpus = cpus  # taskset -c cpus for every node (a benchmark's pinning)
        self.node_timeout_ms = node_timeout_ms
        self.aclfile, self.auth = aclfile, auth
        self.procs, self.ports = {}, []
        while len(self.ports) < 2 * n_masters:
            self.ports.append(free_port(also=10000))  # and its bus port
        try:
            for p in self.ports:
                self.start_node(p)
            login = ["--user", auth[0], "--pass", auth[1], "--no-auth-warning"] if auth else []
            out = subprocess.run(["redis-cli", *login, "--cluster", "create",
                                  *[f"127.0.0.1:{p}" for p in self.ports],
                                  "--cluster-replicas", "1", "--cluster-yes"],
                                 capture_output=True, text=True, timeout=60)
            if out.returncode:
                raise RuntimeError(f"redis-cli --cluster create: {out.stdout}{out.stderr}")
            self.wait_ok()
        except Exception:
            self.stop()
            raise

    def start_node(self, port):
        d = self.dir / str(port)
        d.mkdir(parents=True, exist_ok=True)
        pin = ["taskset", "-c", self.cpus] if self.cpus else []
        self.procs[port] = subprocess.Popen(
            [*pin, "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(self.node_timeout_ms), "--save", "",
             "--appendonly", "no", "--logfile", str(d / "redis.log"), *self._acl_args()],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ping(port, f"cluster node {port}", *(self.auth or (None, None)),
                  proc=self.procs[port], log=d / "redis.log")

    def _acl_args(self):
        if not self.aclfile:
            return []
        return ["--aclfile", str(self.aclfile), "--masteruser", self.auth[0],
                "--masterauth", self.auth[1]]

    def login(self):
        """redis-py's username/password keywords of this class's user."""
        return dict(zip(("username", "password"), self.auth)) if self.auth else {}

    def node(self, port):
        return redis.Redis(port=port, decode_responses=True, **self.login())

    def wait_ok(self, timeout=30):
        """Every running node says cluster_state:ok and agrees on 3 masters."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if all("cluster_state:ok" in self.node(p).execute_command("CLUSTER", "INFO")
                       for p in self.running()):
                    return
            except redis.exceptions.RedisError:
                pass
            time.sleep(0.1)
        raise RuntimeError("cluster did not reach cluster_state:ok")

    def running(self):
        return [p for p, pr in self.procs.items() if pr.poll() is None]

    def roles(self):
        """{port: "master" | "slave"} of the running nodes."""
        return {p: self.node(p).execute_command("ROLE")[0] for p in self.running()}

    def replica_of(self, master_port):
        """The port of a replica of master_port."""
        for p in self.running():
            info = self.node(p).info("replication")
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == master_port:
                return p
        raise RuntimeError(f"no replica of {master_port}")

    def master_of(self, key):
        """The port of the master that serves key's slot, as the first
        running node's CLUSTER SLOTS says (after a failover the news takes a
        moment to spread: callers that need the new map poll)."""
        n = self.node(self.running()[0])
        slot = n.execute_command("CLUSTER", "KEYSLOT", key)
        for lo, hi, master, *_ in n.execute_command("CLUSTER", "SLOTS"):
            if lo <= slot <= hi:
                return int(master[1])
        raise RuntimeError(f"no master for slot {slot}")

    def failover(self, master_port, timeout=30):
        """CLUSTER FAILOVER on a replica of master_port (the manual, lossless
        kind: WAIT first, so the replica holds every write so far), until the
        replica says it is a master and every node is ok again. Returns the
        new master's port."""
        new = self.replica_of(master_port)
        self.node(master_port).execute_command("WAIT", 1, 2000)
        self.node(new).execute_command("CLUSTER", "FAILOVER")
        deadline = time.time() + timeout
        while self.roles().get(new) != "master":
            if time.time() > deadline:
                raise RuntimeError(f"failover of {master_port} to {new} did not happen")
            time.sleep(0.05)
        self.wait_ok()
        return new

    def proc(self, port):
        """The redis-server process of port (to signal it)."""
        return self.procs[port]

    def client(self, username=None, password=None):
        """A cluster-aware redis-py client (every key read from its master),
        as username when given, else as this class's user."""
        from redis.cluster import ClusterNode, RedisCluster as RC
        login = dict(username=username, password=password) if username else self.login()
        return RC(startup_nodes=[ClusterNode("127.0.0.1", p) for p in self.ports],
                  decode_responses=True, **login)

    @property
    def seeds(self):
        """The --redis seed list: every node."""
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def stop(self):
        for pr in self.procs.values():
            if pr.poll() is None:
                pr.kill()
                pr.wait(10)
