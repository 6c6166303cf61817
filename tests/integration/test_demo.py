"""examples/demo.sh, the `make demo` entry: it brings the whole system up on
one machine and takes it down cleanly.

- smoke mode: Redis, a worker, the dispatcher when built, the web backend;
  one chat message goes through the web backend and its streamed answer is
  printed; the script exits 0 and leaves no process and no temp dir behind;
- interactive mode: the chat page answers on the printed URL, and a Ctrl-C
  (SIGINT to the whole foreground process group, as a terminal sends it)
  stops every child, removes the temp dir, and exits 0.

Both use the demo's own private redis-server (not the test session's), on
free loopback ports.
"""
import json
import os
import pathlib
import re
import signal
import subprocess
import time
import urllib.request

import pytest

from conftest import BUILD, CLI, ROOT, WORKER

DEMO = ROOT / "examples" / "demo.sh"


@pytest.fixture
def demo_env():
    if not CLI.exists() or not WORKER.exists():
        pytest.skip(f"{CLI} or {WORKER} not built (run make)")
    env = dict(os.environ, DEMO_PORT="0", DEMO_THREADS="1", BUILD=str(BUILD))
    env.pop("DEMO_SMOKE", None)
    return env


def started(out):
    """The pids and temp dir the demo printed."""
    pids = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", re.search(r"demo: pids(.*)", out)[1])}
    tmp = pathlib.Path(re.search(r"demo: temp dir (\S+)", out)[1])
    return pids, tmp


def alive(pid):
    """True for a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def group_members(pgid):
    out = []
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(d.name))
    return out


def test_demo_smoke_answers_and_cleans_up(demo_env):
    res = subprocess.run(["bash", str(DEMO), "--smoke", "Hello, who are you?"], env=demo_env,
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    pids, tmp = started(out)
    assert set(pids) >= {"redis", "worker", "web"}
    if (BUILD / "redlm-dispatcher").exists():
        assert "dispatcher" in pids
    assert "smoke test passed" in out
    assert "did not stop" not in out, out
    m = re.search(r"\[done: length, (\d+) tokens\]", out)
    assert m and int(m[1]) == 32, out  # a random model never says EOS in 32 tokens
    # the answer itself is on stdout, between the job line and done
    assert res.stdout.split('asking "Hello, who are you?"\n', 1)[1].strip()
    assert not [n for n, p in pids.items() if alive(p)]
    assert not tmp.exists()


def test_demo_stops_cleanly_on_ctrl_c(demo_env):
    proc = subprocess.Popen(["bash", str(DEMO)], env=demo_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            start_new_session=True)  # its own group, like a terminal's job
    out = ""
    try:
        deadline = time.time() + 300
        while "Press Ctrl-C" not in out:
            line = proc.stdout.readline()
            assert line, f"the demo exited early:\n{out}"
            assert time.time() < deadline, out
            out += line
        pids, tmp = started(out)
        url = re.search(r"chat page\s+(\S+)", out)[1]
        with urllib.request.urlopen(url, timeout=10) as f:
            assert b"redlm chat" in f.read()
        with urllib.request.urlopen(url + "api/health", timeout=10) as f:
            assert json.load(f)["ok"] is True
        assert all(alive(p) for p in pids.values()), pids
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does
        rest, _ = proc.communicate(timeout=60)
        out += rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    assert "demo: stopped" in out
    assert "did not stop" not in out, out  # SIGTERM was enough for every child
    assert not [n for n, p in pids.items() if alive(p)], out
    assert group_members(proc.pid) == [], "processes left in the demo's group"
    assert not tmp.exists()
