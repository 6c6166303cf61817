"""A CPU cap per process for the benchmarks (issue 27 point 4): each
redis-server in a cgroup of its own with a CFS quota of pct % of one core.

Why: the cluster's promise is a ratio at saturation (a 3-master cluster
carries >= 2.5x one instance's tokens). Saturating one redis-server takes a
core of load generator and workers for its one; saturating three masters,
three times that: more than a 2-core host has. Capped at a small share of a
core each, every node saturates at a load the rest of the host can drive,
and "one instance" and "three masters" stay like for like: the same CPU a
node. What a cap does not keep is the absolute figure (tokens/s at a cap are
not a core's tokens/s), nor the cost of Redis's one thread waiting out its
quota, which both sides pay alike.

cgroup v1 (`/sys/fs/cgroup/cpu`) or v2 (a cgroup with the cpu controller);
needs root. A period of 20 ms keeps the stalls short (the quota's minimum is
1 ms, so pct >= 5). Everything created is removed by close().
"""
import os
import pathlib

V1 = pathlib.Path("/sys/fs/cgroup/cpu")
V2 = pathlib.Path("/sys/fs/cgroup")
PERIOD_US = 20000


class CpuCapError(RuntimeError):
    pass


class CpuCap:
    def __init__(self, pct, tag="redlm-bench"):
        if not 5 <= pct <= 100:
            raise CpuCapError(f"a CPU cap of {pct} %: between 5 and 100 (the kernel's quota is >= 1 ms "
                              f"of a {PERIOD_US // 1000} ms period)")
        self.pct = pct
        self.quota = int(PERIOD_US * pct / 100)
        self.tag = f"{tag}-{os.getpid()}"
        self.groups = {}  # name -> (cgroup dir, v2?)
        ctl = V2 / "cgroup.controllers"
        if (V1 / "cpu.cfs_quota_us").exists():
            self.v2 = False
        elif ctl.exists() and "cpu" in ctl.read_text().split():
            self.v2 = True
        else:
            raise CpuCapError("no cgroup CPU controller here (neither /sys/fs/cgroup/cpu nor "
                              "cgroup v2 with cpu): cannot cap Redis's CPU")

    def add(self, pid, name):
        """Move pid (every thread: cgroup.procs) into a cgroup of its own
        with the cap. Raises CpuCapError with the reason (not root, ...)."""
        d = (V2 if self.v2 else V1) / f"{self.tag}-{name}"
        try:
            d.mkdir(exist_ok=True)
            if self.v2:
                (d / "cpu.max").write_text(f"{self.quota} {PERIOD_US}\n")
            else:
                (d / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
                (d / "cpu.cfs_quota_us").write_text(f"{self.quota}\n")
            (d / "cgroup.procs").write_text(f"{pid}\n")
        except OSError as e:
            raise CpuCapError(f"capping {name} (pid {pid}) in {d}: {e} (root needed)") from e
        self.groups[name] = d

    def stat(self, name):
        """{'periods', 'throttled'} of one capped group so far: periods in
        which it ran, and those in which it used its quota up and waited (a
        saturated node is throttled in most of them)."""
        st = dict(line.split()[:2] for line in (self.groups[name] / "cpu.stat").read_text().splitlines())
        return {"periods": int(st.get("nr_periods", 0)), "throttled": int(st.get("nr_throttled", 0))}

    def close(self):
        """Remove the groups (their processes must have exited: a cgroup
        with members cannot be removed; a leftover is reported, not fatal)."""
        left = []
        for name, d in self.groups.items():
            try:
                d.rmdir()
            except OSError:
                left.append(str(d))
        self.groups = {}
        return left
