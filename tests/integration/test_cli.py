"""The `redlm` client commands against a real redis-server and a real worker
on the tiny model: enqueue (flags, file, stdin; bad jobs refused with the
worker's own code), tail (the text the events hold, reasoning apart), chat
and top driven through a pseudo-terminal (two turns with /no_think, Ctrl-C
cancelling an answer, q restoring the terminal), stats --json against what
was done, the progress line of model loading, tokenize / detokenize / template with
each of their flags on the real Qwen3 tokenizer, and `run --batch`'s error
lines.

Run with Debian's interpreter: /usr/bin/python3 -m pytest tests/integration/test_cli.py
"""
import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import termios
import time

import pytest

from conftest import CLI, MODEL, QWEN3_TOKENIZER, check_stream, free_port, tap


def cli(redis_addr, prefix, *args, input=None, timeout=60):
    return subprocess.run([str(CLI), args[0], "--redis", redis_addr, "--prefix", prefix, *args[1:]],
                          capture_output=True, text=True, input=input, timeout=timeout)


def render(events):
    """What `redlm tail` prints for events when stdout is not a terminal:
    content as is, reasoning between [reasoning] / [/reasoning] lines, and a
    final newline."""
    out = ""
    inr = False

    def nl():
        nonlocal out
        if out and not out.endswith("\n"):
            out += "\n"

    for ev in events:
        if ev["type"] == "delta":
            r = ev["delta"].get("reasoning_content", "")
            c = ev["delta"].get("content", "")
            if r:
                if not inr:
                    nl()
                    out += "[reasoning]\n"
                    inr = True
                out += r
            if c:
                if inr:
                    nl()
                    out += "[/reasoning]\n"
                    inr = False
                out += c
        elif ev["type"] in ("done", "error"):
            if inr:
                nl()
                out += "[/reasoning]\n"
                inr = False
            nl()
    return out


def jobs_in(r, key):
    return [json.loads(f["job"]) for _, f in r.xrange(key)]


class Pty:
    """A command on a pseudo-terminal: what a user at a terminal sees and types."""

    def __init__(self, args, rows=40, cols=160):
        # a HOME of its own: chat keeps its line history in $HOME
        self.home = tempfile.mkdtemp(prefix="redlm-pty-home-")
        env = dict(os.environ, HOME=self.home)
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: size its terminal, then exec at once
            try:
                # here, not in the parent after fork: a command that reads
                # the size at start must never see the pty's default
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
                os.execve(args[0], args, env)
            finally:
                os._exit(127)
        self.buf = b""
        self.status = None

    def read_until(self, pattern, timeout=30):
        """Reads until pattern (bytes regex) matches what came after the last
        match; returns the text up to and including it."""
        deadline = time.time() + timeout
        while True:
            m = re.search(pattern, self.buf, re.S)
            if m:
                got, self.buf = self.buf[:m.end()], self.buf[m.end():]
                return got
            left = deadline - time.time()
            assert left > 0, f"no {pattern!r} within {timeout}s; got {self.buf[-2000:]!r}"
            rl, _, _ = select.select([self.fd], [], [], min(left, 0.2))
            if rl:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:  # EIO: the child is gone
                    data = b""
                if not data:
                    assert re.search(pattern, self.buf, re.S), \
                        f"exited before {pattern!r}; got {self.buf[-2000:]!r}"
                self.buf += data

    def send(self, data):
        os.write(self.fd, data if isinstance(data, bytes) else data.encode())

    def wait(self, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:  # drain, or a child blocked on a full pty never exits
                while select.select([self.fd], [], [], 0)[0]:
                    data = os.read(self.fd, 65536)
                    if not data:
                        break
                    self.buf += data
            except OSError:
                pass
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
                return self.status
            time.sleep(0.05)
        raise AssertionError(f"still running after {timeout}s; output {self.buf[-2000:]!r}")

    def close(self):
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self.fd)
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture
def ptys():
    started = []

    def start(*args):
        p = Pty([str(CLI), *args])
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()


# ---- enqueue and tail ----

def test_enqueue_flags_then_tail_shows_the_events(workers, client, redis_addr, prefix):
    # keeps the entry to read below: the worker deletes it with its XACK,
    # and 9 tokens of the tiny model can be done before the read (CI,
    # 2026-12-06: the read found the stream empty)
    tap(client.r, f"{prefix}jobs:fast")
    workers("w1")
    out = cli(redis_addr, prefix, "enqueue", "--pool", "fast", "--id", "e1", "--system", "be brief",
              "--message", "hello", "--max-tokens", "9", "--temperature", "0", "--seed", "5",
              "--stop", "xyz", "--ignore-eos", "--priority", "3", "--no-cache",
              "--metadata", '{"k": 1}')
    assert out.returncode == 0, out.stderr
    assert out.stdout == "e1\n"
    [job] = jobs_in(client.r, f"{prefix}jobs:fast")
    assert job == {"id": "e1", "messages": [{"role": "system", "content": "be brief"},
                                            {"role": "user", "content": "hello"}],
                   "max_tokens": 9, "temperature": 0, "seed": 5, "stop": ["xyz"],
                   "ignore_eos": True, "priority": 3, "cache": False, "metadata": {"k": 1}}
    events = [e for _, e in client.events("e1")]
    tail = cli(redis_addr, prefix, "tail", "e1")
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout == render(events)
    text = "".join(e["delta"].get("content", "") for e in events if e["type"] == "delta")
    assert text and tail.stdout == text + ("" if text.endswith("\n") else "\n")
    done = events[-1]
    assert (f"[done] finish_reason={done['finish_reason']} prompt_tokens="
            f"{done['usage']['prompt_tokens']} completion_tokens=9 ") in tail.stderr
    # --json: the events themselves, one per line
    raw = cli(redis_addr, prefix, "tail", "e1", "--json")
    assert [json.loads(l) for l in raw.stdout.splitlines()] == events


def test_tail_keeps_reasoning_apart(workers, client, redis_addr, prefix):
    workers("w1")
    # a raw prompt ending in <think> starts the output inside the reasoning
    out = cli(redis_addr, prefix, "enqueue", "--pool", "fast", "--prompt", "why<think>",
              "--max-tokens", "24", "--ignore-eos", "--temperature", "0")
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    events = [e for _, e in client.events(job_id)]
    reasoning = "".join(e["delta"].get("reasoning_content", "") for e in events if e["type"] == "delta")
    assert reasoning and events[-1]["usage"]["reasoning_tokens"] > 0
    tail = cli(redis_addr, prefix, "tail", job_id)
    assert tail.stdout == render(events)
    assert tail.stdout.startswith("[reasoning]\n" + reasoning)
    hidden = cli(redis_addr, prefix, "tail", job_id, "--no-reasoning")
    assert "[reasoning]" not in hidden.stdout and reasoning not in hidden.stdout

    # both parts, in a stream written by hand: markers on their own lines,
    # the text byte for byte (newlines, multi-byte characters)
    key = f"{prefix}out:handmade"
    evs = [{"seq": 0, "type": "delta", "delta": {"reasoning_content": "think é"}, "token_ids": [1]},
           {"seq": 1, "type": "delta", "delta": {"reasoning_content": "\nmore\n"}, "token_ids": [2]},
           {"seq": 2, "type": "delta", "delta": {"content": "answer ∑"}, "token_ids": [3]},
           {"seq": 3, "type": "delta", "delta": {"content": " done"}, "token_ids": [4]},
           {"seq": 4, "type": "done", "finish_reason": "stop", "cached": False, "tool_calls": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "reasoning_tokens": 2,
                      "cached_prompt_tokens": 0},
            "timings": {"queue_ms": 1, "ttft_ms": 2, "total_ms": 3}}]
    for e in evs:
        client.r.xadd(key, {"event": json.dumps(e, ensure_ascii=False)}, id=f"0-{e['seq'] + 1}")
    tail = cli(redis_addr, prefix, "tail", "handmade")
    assert tail.stdout == "[reasoning]\nthink é\nmore\n[/reasoning]\nanswer ∑ done\n"
    assert tail.stdout == render(evs)
    assert "finish_reason=stop prompt_tokens=3 completion_tokens=4 reasoning_tokens=2" in tail.stderr
    colored = cli(redis_addr, prefix, "tail", "handmade", "--color", "always")
    assert colored.stdout == "\033[2mthink é\nmore\n\033[0manswer ∑ done\n"


def test_tail_of_an_error_exits_non_zero(workers, client, redis_addr, prefix):
    workers("w1")
    client.submit({"id": "bad1", "prompt_ids": [1, 99999]})
    tail = cli(redis_addr, prefix, "tail", "bad1", "--timeout", "30")
    assert tail.returncode == 1
    assert "[error] INVALID_TOKEN:" in tail.stderr
    # nothing ever comes for an unknown id: --timeout gives up
    t = cli(redis_addr, prefix, "tail", "nobody", "--timeout", "1")
    assert t.returncode == 1 and "no event for nobody within 1 s" in t.stderr


def test_enqueue_from_file_and_stdin(workers, client, redis_addr, prefix, tmp_path):
    # the jobs are read off the pool before a worker starts: a worker
    # deletes each entry with its XACK (bounded storage, issue 26)
    f = tmp_path / "job.json"
    f.write_text(json.dumps({"prompt_ids": [5, 6, 7], "max_tokens": 4, "temperature": 0}))
    out = cli(redis_addr, prefix, "enqueue", "--pool", "think", "--file", str(f))
    assert out.returncode == 0, out.stderr
    gen_id = out.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", gen_id)  # generated, and sent with the job
    [job] = jobs_in(client.r, f"{prefix}jobs:think")
    assert job == {"prompt_ids": [5, 6, 7], "max_tokens": 4, "temperature": 0, "id": gen_id}

    # stdin, with flags on top of the file's fields
    out = cli(redis_addr, prefix, "enqueue", "--pool", "think", "--file", "-", "--max-tokens", "2",
              "--id", "s1", input='{"prompt": "hi", "max_tokens": 50}')
    assert out.returncode == 0, out.stderr
    assert out.stdout == "s1\n"
    job = jobs_in(client.r, f"{prefix}jobs:think")[1]
    assert job == {"prompt": "hi", "max_tokens": 2, "id": "s1"}
    workers("w1")
    _, done = check_stream(client.events(gen_id), __import__("conftest").validator("event.schema.json"))
    assert done["usage"]["prompt_tokens"] == 3
    assert client.events("s1")[-1][1]["usage"]["completion_tokens"] <= 2


INVALID = [
    ('{"prompt": "x", "temperatur": 0.5}', "UNKNOWN_FIELD"),
    ('{"prompt": "x", "temperature": 5}', "OUT_OF_RANGE"),
    ('{"prompt": "x", "max_tokens": "9"}', "BAD_TYPE"),
    ('{"prompt": "x", "mode": "fast"}', "BAD_VALUE"),
    ('{"prompt": "x", "id": "a b"}', "BAD_ID"),
    ('{"max_tokens": 3}', "MISSING_PROMPT"),
    ('{"prompt": "x", "prompt_ids": [1]}', "CONFLICTING_PROMPT"),
    ('{"prompt": "x",', "INVALID_JSON"),
    ('[1, 2]', "NOT_OBJECT"),
    ('{"prompt": "x", "prompt": "y"}', "DUPLICATE_FIELD"),
]


def test_invalid_jobs_are_refused_with_the_workers_code(workers, client, redis_addr, prefix, tmp_path):
    workers("w1")
    for i, (raw, code) in enumerate(INVALID):
        f = tmp_path / f"bad{i}.json"
        f.write_text(raw)
        out = cli(redis_addr, prefix, "enqueue", "--pool", "fast", "--file", str(f))
        assert out.returncode == 3, (raw, out.stderr)
        assert out.stderr.startswith(f"redlm enqueue: {code}: "), (raw, out.stderr)
        assert out.stdout == ""
    assert client.r.xlen(f"{prefix}jobs:fast") == 0  # nothing was sent
    # the worker, given the same jobs directly, answers with the same codes
    for i, (raw, code) in enumerate(INVALID[:7]):
        job = json.loads(raw)
        job["id"] = f"direct{i}" if code != "BAD_ID" else job["id"]
        if code == "BAD_ID":
            continue
        client.submit(None, raw=json.dumps(job))
        ev = [e for _, e in client.events(f"direct{i}") if e["type"] == "error"]
        assert ev and ev[0]["code"] == code
    # flags build jobs through the same check
    out = cli(redis_addr, prefix, "enqueue", "--pool", "fast", "--prompt", "x", "--temperature", "3")
    assert out.returncode == 3 and "OUT_OF_RANGE: temperature: 3 is out of range" in out.stderr
    # mode auto, straight to a pool: the CLI agrees with the worker, whichever
    # way this build's job codec reads it (the dispatcher branch adds auto)
    out = cli(redis_addr, prefix, "enqueue", "--pool", "fast", "--prompt", "x", "--mode", "auto",
              "--max-tokens", "1", "--id", "auto1")
    client.submit({"id": "auto2", "prompt": "x", "mode": "auto", "max_tokens": 1})
    worker_err = [e["code"] for _, e in client.events("auto2") if e["type"] == "error"]
    if worker_err:
        assert out.returncode == 3 and out.stderr.startswith(f"redlm enqueue: {worker_err[0]}: ")
    else:
        assert out.returncode == 0 and out.stdout == "auto1\n"
    # a flag that does not exist is a usage error, not a job error
    out = cli(redis_addr, prefix, "enqueue", "--prompt", "x", "--temperatur", "3")
    assert out.returncode == 2 and "--temperatur" in out.stderr


def test_enqueue_defaults_to_the_dispatcher_stream(redis_addr, prefix, built):
    r = __import__("conftest").connect(redis_addr)
    out = cli(redis_addr, prefix, "enqueue", "--message", "hi", "--mode", "auto", "--id", "d1")
    assert out.returncode == 0, out.stderr
    out = cli(redis_addr, prefix, "enqueue", "--message", "hi", "--mode", "no_think", "--id", "d2")
    assert out.returncode == 0, out.stderr
    jobs = jobs_in(r, f"{prefix}requests")
    assert [j["id"] for j in jobs] == ["d1", "d2"]
    assert [j["mode"] for j in jobs] == ["auto", "no_think"]
    assert r.keys(f"{prefix}jobs:*") == []


def test_a_job_nobody_reads_says_why(redis_addr, prefix, built):
    """Issue 29 (first contact): with no dispatcher and no worker running, a
    followed job used to wait forever in silence. After 3 s without an event
    the client names what is missing and the way out."""
    p = subprocess.Popen([str(CLI), "enqueue", "--redis", redis_addr, "--prefix", prefix, "--message", "hi",
                          "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = ""
        deadline = time.monotonic() + 30
        # raw reads from the fd: a buffered readline() could take both hint
        # lines from the pipe at once and leave the second where select()
        # never sees it
        fd = p.stderr.fileno()
        while "no worker is running" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                seen += chunk.decode()
        assert f"no dispatcher is running (no {prefix}dispatcher:* heartbeat)" in seen, seen
        assert "--pool fast" in seen, seen
        assert f"no worker is running (no {prefix}worker:* heartbeat)" in seen, seen
        assert p.poll() is None  # still waiting: the job is not lost, only unread
    finally:
        p.kill()
        p.wait()


def test_unreachable_redis_is_a_clear_error(built):
    addr = f"127.0.0.1:{free_port()}"
    for args in (["enqueue", "--message", "hi"], ["tail", "x"], ["stats"], ["top"], ["chat"],
                 ["cancel", "x"]):
        out = subprocess.run([str(CLI), *args, "--redis", addr], capture_output=True, text=True,
                             timeout=20, stdin=subprocess.DEVNULL)
        assert out.returncode == 1, (args, out.stderr)
        assert f"cannot reach Redis at {addr}: " in out.stderr, (args, out.stderr)


def test_acl_user_and_password_file(built, tmp_path):
    from conftest import RedisServer, connect
    srv = RedisServer(tmp_path / "acl")
    try:
        r = connect(srv.addr)
        r.execute_command("ACL", "SETUSER", "ops", "on", ">s3cret", "~*", "&*", "+@all")
        r.execute_command("ACL", "SETUSER", "default", "off")
        good = tmp_path / "pw"
        good.write_text("s3cret\n")
        bad = tmp_path / "bad"
        bad.write_text("nope\n")
        base = [str(CLI), "stats", "--json", "--redis", srv.addr, "--prefix", "acl:", "--user", "ops"]
        out = subprocess.run(base + ["--password-file", str(good)], capture_output=True, text=True,
                             timeout=20)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["prefix"] == "acl:"
        out = subprocess.run(base + ["--password-file", str(bad)], capture_output=True, text=True,
                             timeout=20)
        assert out.returncode == 1
        assert f"cannot reach Redis at {srv.addr}: " in out.stderr and "WRONGPASS" in out.stderr
        # without credentials the default user is off
        out = subprocess.run([str(CLI), "enqueue", "--redis", srv.addr, "--prompt", "x"],
                             capture_output=True, text=True, timeout=20)
        assert out.returncode == 1 and "redlm enqueue: " in out.stderr
    finally:
        srv.stop()


# ---- chat ----

def chat_turn(p, text):
    """Sends one line to `redlm chat` in pty p and waits for its answer's
    [done] line and the next prompt; returns what came up to [done]."""
    p.send(text + "\n")
    out = p.read_until(rb"\[done\][^\n]*\n")
    p.read_until(rb"> ")
    return out


def test_chat_two_turns_with_no_think(workers, client, redis_addr, prefix, ptys):
    tap(client.r, f"{prefix}jobs:fast")  # keeps what chat sent, to read below
    workers("w1")
    p = ptys("chat", "--redis", redis_addr, "--prefix", prefix, "--pool", "fast",
             "--max-tokens", "6", "--temperature", "0")
    p.read_until(rb"> ")
    first = chat_turn(p, "hello")
    p.send("/no_think\n")
    p.read_until(rb"\[mode no_think\]")
    p.read_until(rb"> ")
    chat_turn(p, "and again")
    p.send("/exit\n")
    assert p.wait() == 0

    jobs = jobs_in(client.r, f"{prefix}jobs:fast")
    assert len(jobs) == 2
    j1, j2 = jobs
    assert j1["messages"] == [{"role": "user", "content": "hello"}]
    assert "mode" not in j1 and j1["max_tokens"] == 6 and j1["temperature"] == 0
    answer = "".join(e["delta"].get("content", "") for _, e in client.events(j1["id"])
                     if e["type"] == "delta")
    # the conversation so far goes with the second turn, and the mode changed
    assert j2["messages"] == [{"role": "user", "content": "hello"},
                              {"role": "assistant", "content": answer},
                              {"role": "user", "content": "and again"}]
    assert j2["mode"] == "no_think"
    assert client.events(j2["id"])[-1][1]["finish_reason"] in ("stop", "length")
    # the answer streamed to the terminal (the pty turns \n into \r\n)
    if answer.strip():
        assert answer.strip().replace("\n", "\r\n").encode() in first


def test_chat_through_the_dispatcher(dispatchers, workers, client, redis_addr, prefix, ptys):
    """The default target: chat's jobs go to redlm:requests and the
    dispatcher routes them by mode; /think sends the next turn to the think
    pool. stats sees the dispatcher and the requests stream."""
    tap(client.r, f"{prefix}requests", f"{prefix}jobs:fast", f"{prefix}jobs:think")
    workers("w1")
    dispatchers("d1", "--think-ratio", "0")
    p = ptys("chat", "--redis", redis_addr, "--prefix", prefix, "--max-tokens", "4",
             "--temperature", "0")
    p.read_until(rb"> ")
    chat_turn(p, "hi")
    p.send("/think\n")
    p.read_until(rb"\[mode think\]")
    chat_turn(p, "why")
    p.send("/exit\n")
    assert p.wait() == 0
    requests = jobs_in(client.r, f"{prefix}requests")
    assert len(requests) == 2 and "mode" not in requests[0] and requests[1]["mode"] == "think"
    [fast] = jobs_in(client.r, f"{prefix}jobs:fast")
    [think] = jobs_in(client.r, f"{prefix}jobs:think")
    assert fast["id"] == requests[0]["id"] and think["id"] == requests[1]["id"]
    assert [m["role"] for m in think["messages"]] == ["user", "assistant", "user"]

    deadline = time.time() + 10
    while True:
        s = stats(redis_addr, prefix)
        if s["dispatchers"] and sum(s["dispatchers"][0]["routed"].values()) == 2:
            break
        assert time.time() < deadline, s
        time.sleep(0.1)
    assert s["dispatchers"][0]["name"] == "d1"
    assert s["dispatchers"][0]["routed"] == {"fast": 1, "think": 1}
    assert s["requests"]["length"] == 2 and s["requests"]["group"] is True
    assert s["requests"]["waiting"] == 0 and s["requests"]["pending"] == 0


class Tmux:
    """A command in a detached tmux session on a private server socket: the
    test types with send-keys (named keys: Left, Home, Up, C-a ...) and reads
    the screen with capture-pane, as a user sees it."""

    def __init__(self, args, tmp_path, env=None):
        self.exe = shutil.which("tmux")
        if not self.exe:
            pytest.skip("tmux not installed (apt-get install tmux, or make deps)")
        self.sock = str(tmp_path / "tmux.sock")
        cmd = " ".join(f"'{a}'" for a in args)
        envs = " ".join(f"{k}='{v}'" for k, v in (env or {}).items())
        self.tmux("new-session", "-d", "-s", "t", "-x", "150", "-y", "40",
                  f"env {envs} {cmd}; echo EXITED:$?; sleep 60")

    def tmux(self, *a):
        out = subprocess.run([self.exe, "-S", self.sock, "-f", "/dev/null", *a],
                             capture_output=True, text=True, timeout=20)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def keys(self, *keys, literal=False):
        self.tmux("send-keys", "-t", "t", *(["-l"] if literal else []), *keys)

    def screen(self):
        """The visible screen; tmux trims trailing blanks, so the empty
        prompt "> " reads as ">"."""
        return self.tmux("capture-pane", "-p", "-t", "t")

    def wait_screen(self, pattern, timeout=30):
        deadline = time.time() + timeout
        while True:
            text = self.screen()
            if re.search(pattern, text, re.M):
                return text
            assert time.time() < deadline, f"no {pattern!r} on screen:\n{text}"
            time.sleep(0.05)

    def close(self):
        subprocess.run([self.exe, "-S", self.sock, "kill-server"], capture_output=True, timeout=20)


def test_chat_line_editing_history_and_multiline_in_tmux(workers, client, redis_addr, prefix,
                                                         tmp_path):
    """In a real terminal (tmux), redlm chat edits the line (cursor keys,
    Home/End, Ctrl-A, Ctrl-W, backspace), recalls earlier lines with Up,
    keeps them in its history file across sessions (Ctrl-R finds them), and sends multi-line
    messages (a trailing backslash, and a \"\"\" block)."""
    tap(client.r, f"{prefix}jobs:fast")
    workers("w1")
    home = tmp_path / "home"
    home.mkdir()
    args = [str(CLI), "chat", "--redis", redis_addr, "--prefix", prefix, "--pool", "fast",
            "--max-tokens", "3", "--temperature", "0", "--color", "never"]
    t = Tmux(args, tmp_path, env={"HOME": str(home)})
    try:
        t.wait_screen(r"^>$")
        # typo fixed with the cursor: "helo wrld" -> "hello world"
        t.keys("helo wrldx", literal=True)
        t.keys("BSpace")
        t.keys("Left", "Left", "Left")
        t.keys("o", literal=True)
        t.keys("Home")
        t.keys("Right", "Right", "Right")
        t.keys("l", literal=True)
        t.keys("End")
        t.keys("!", literal=True)
        t.wait_screen(r"^> hello world!$")
        t.keys("Enter")
        t.wait_screen(r"\[done\]")
        t.wait_screen(r"^>$")
        # Up recalls it; Ctrl-A then text in front; Ctrl-W drops a word
        t.keys("Up")
        t.wait_screen(r"^> hello world!$")
        t.keys("C-a")
        t.keys("again: ", literal=True)
        t.keys("End")
        t.keys("C-w")
        t.keys("there", literal=True)
        t.wait_screen(r"^> again: hello there$")
        t.keys("Enter")
        t.wait_screen(r"(?s)\[done\].*\[done\]")
        # multi-line: a trailing backslash continues, with the "... " prompt
        t.keys("first line\\", literal=True)
        t.keys("Enter")
        t.wait_screen(r"^\.\.\.$")
        t.keys("second line", literal=True)
        t.keys("Enter")
        t.wait_screen(r"(?s)(\[done\].*){3}")
        t.keys('"""', literal=True)
        t.keys("Enter")
        t.keys("a block", literal=True)
        t.keys("Enter")
        t.keys("  indented", literal=True)
        t.keys("Enter")
        t.keys('end"""', literal=True)
        t.keys("Enter")
        t.wait_screen(r"(?s)(\[done\].*){4}")
        t.wait_screen(r"^>$")
        # Ctrl-C at the prompt drops the line and keeps the session
        t.keys("never sent", literal=True)
        t.keys("C-c")
        t.wait_screen(r"\(/exit or Ctrl-D to leave\)\n>$")
        t.keys("C-d")
        t.wait_screen(r"EXITED:0")
    finally:
        screen = t.screen()
        t.close()
    jobs = jobs_in(client.r, f"{prefix}jobs:fast")
    users = [[m["content"] for m in j["messages"] if m["role"] == "user"][-1] for j in jobs]
    assert users == ["hello world!", "again: hello there", "first line\nsecond line",
                     "a block\n  indented\nend"], screen
    # the history file outlives the session: a new one recalls the last line
    assert (home / ".redlm_chat_history").exists()
    t = Tmux(args, home, env={"HOME": str(home)})
    try:
        t.wait_screen(r"^>$")
        t.keys("Up")
        t.wait_screen(r'^> end"""$')
        t.keys("Up", "Up", "Up", "Up")
        t.wait_screen(r"^> second line$")
        # Ctrl-R searches back through the history, as in readline
        t.keys("C-u")
        t.keys("C-r")
        t.keys("hello", literal=True)
        t.wait_screen(r"^> again: hello there\nbck:hello")
    finally:
        t.close()


def test_chat_ctrl_c_cancels_the_answer(workers, client, redis_addr, prefix, ptys):
    workers("w1")
    p = ptys("chat", "--redis", redis_addr, "--prefix", prefix, "--pool", "fast",
             "--max-tokens", "30000", "--ignore-eos", "--temperature", "0.7")
    p.read_until(rb"> ")
    p.send("tell me everything\n")
    # wait until the answer is streaming
    deadline = time.time() + 30
    while not client.r.keys(f"{prefix}out:*") or \
            client.r.xlen(client.r.keys(f"{prefix}out:*")[0]) < 5:
        assert time.time() < deadline, "the answer did not start"
        time.sleep(0.05)
    [job] = jobs_in(client.r, f"{prefix}jobs:fast")
    p.send(b"\x03")  # Ctrl-C, as the terminal's line discipline delivers it
    p.read_until(rb"\[cancelled\]")
    p.read_until(rb"> ")
    assert client.r.exists(f"{prefix}cancel:{job['id']}")
    done = client.events(job["id"])[-1][1]
    assert done["type"] == "done" and done["finish_reason"] == "cancelled"
    assert done["usage"]["completion_tokens"] < 30000
    # the cancelled turn is not part of the conversation any more
    p.send("/exit\n")
    assert p.wait() == 0


# ---- stats and top ----

def stats(redis_addr, prefix):
    out = cli(redis_addr, prefix, "stats", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_stats_json_matches_what_was_done(workers, client, redis_addr, prefix):
    tap(client.r, f"{prefix}jobs:fast", f"{prefix}jobs:think")  # lengths stay countable
    workers("w1")
    r = client.r
    # 5 jobs run, one of them again (a result-cache hit), 2 bad ones (dead letters)
    ids = []
    for i in range(5):
        out = cli(redis_addr, prefix, "enqueue", "--pool", "fast" if i % 2 else "think",
                  "--prompt-ids", f"{i + 1},{i + 2}", "--max-tokens", "3", "--temperature", "0",
                  "--ignore-eos")
        assert out.returncode == 0, out.stderr
        ids.append(out.stdout.strip())
    for i in ids:
        client.events(i)
    time.sleep(0.3)  # the cache entry is written in the same flush as the last done
    client.submit({"id": "again", "prompt_ids": [1, 2], "max_tokens": 3, "temperature": 0,
                   "ignore_eos": True}, pool="think")
    assert client.events("again")[-1][1]["cached"] is True
    client.submit(None, pool="fast", raw='{"id": "bad1", "prompt": 1}')
    client.submit(None, pool="fast", raw="not json")
    client.events("bad1")
    # a pool nobody serves: 3 waiting
    for i in range(3):
        r.xadd(f"{prefix}jobs:idle", {"job": json.dumps({"prompt_ids": [1]})})
    # a pool whose consumer took 2 jobs and died: 2 pending, 1 waiting
    r.xgroup_create(f"{prefix}jobs:held", "workers", id="0", mkstream=True)
    for i in range(3):
        r.xadd(f"{prefix}jobs:held", {"job": json.dumps({"prompt_ids": [1]})})
    r.xreadgroup("workers", "ghost", {f"{prefix}jobs:held": ">"}, count=2)
    time.sleep(0.05)

    deadline = time.time() + 15
    while True:  # the heartbeat lags by up to one interval
        s = stats(redis_addr, prefix)
        if s["totals"]["jobs_done"] == 5 and s["totals"]["cache_hits"] == 1 \
                and s["dead"]["count"] == 2:
            break
        assert time.time() < deadline, s
        time.sleep(0.2)
    [w] = s["workers"]
    assert w["name"] == "w1" and w["pools"] == ["fast", "think"] and w["jobs_done"] == 5
    assert w["tokens_out"] == 15 and s["totals"]["tokens_out"] == 15
    assert w["cache_misses"] == 5 and s["totals"]["cache_hit_rate"] == pytest.approx(1 / 6)
    assert w["age_ms"] < 5000 and w["compiling"] == 0
    pools = {p["name"]: p for p in s["pools"]}
    assert set(pools) == {"fast", "think", "idle", "held"}
    assert pools["fast"]["length"] == 4 and pools["think"]["length"] == 4
    for name in ("fast", "think"):
        assert pools[name]["waiting"] == 0 and pools[name]["pending"] == 0
        assert pools[name]["workers"] == 1 and pools[name]["consumers"] == 1
    assert pools["idle"]["waiting"] == 3 and pools["idle"]["pending"] == 0
    assert pools["idle"]["group"] is False and pools["idle"]["workers"] == 0
    assert pools["idle"]["oldest_wait_ms"] >= 50
    assert pools["held"]["waiting"] == 1 and pools["held"]["pending"] == 2
    assert pools["held"]["oldest_pending_ms"] >= 50
    assert s["totals"]["waiting"] == 4 and s["totals"]["pending"] == 2
    assert s["dead"]["count"] == 2 and s["dead"]["last"]["code"] == "INVALID_JSON"
    assert s["dispatchers"] == [] and s["requests"]["length"] == 0

    # a dispatcher heartbeat is listed as it is
    hb = {"name": "d1", "pid": 1, "time_ms": s["time_ms"], "uptime_s": 3, "routed": {"fast": 7},
          "cache_hits": 2, "cache_misses": 2, "requests_per_s": 1.5}
    r.set(f"{prefix}dispatcher:d1", json.dumps(hb), ex=30)
    s = stats(redis_addr, prefix)
    assert s["dispatchers"][0]["routed"] == {"fast": 7}
    assert s["totals"]["dispatcher_cache_hit_rate"] == 0.5

    # the table says the same
    table = cli(redis_addr, prefix, "stats").stdout
    assert re.search(r"jobs done 5 ", table)
    assert re.search(r"^jobs:held +3 +1 +\S+ +2 ", table, re.M)
    assert "DEAD LETTERS 2" in table and "WORKERS 1" in table and "DISPATCHERS 1" in table
    # run, wait, comp(iling) of the idle worker, its held count, its KV column
    assert re.search(r"^w1 +fast,think +0 +0 +0 +\d+ +\d+/\d+ ", table, re.M), table


def test_top_draws_and_q_restores_the_terminal(workers, redis_addr, prefix, ptys):
    workers("w1")
    p = ptys("top", "--redis", redis_addr, "--prefix", prefix, "--interval", "200")
    screen = p.read_until(rb"q quits")
    assert screen.startswith(b"\033[?1049h")  # the alternate screen
    # redrawn from the top until the worker's first heartbeat shows
    screen = p.read_until(rb"\033\[H(?:(?!\033\[H).)*WORKERS 1.*?q quits", timeout=15)
    assert b"w1" in screen and b"jobs:fast" in screen
    attrs = termios.tcgetattr(p.fd)
    assert not attrs[3] & termios.ECHO  # no echo while it runs
    p.send("q")
    assert p.wait() == 0
    assert p.buf.endswith(b"\033[?25h\033[?1049l")  # cursor and screen back
    attrs = termios.tcgetattr(p.fd)
    assert attrs[3] & termios.ECHO and attrs[3] & termios.ICANON


def test_top_fits_a_small_terminal_and_quits_on_ctrl_c(built, redis_addr, prefix, ptys):
    p = Pty([str(CLI), "top", "--redis", redis_addr, "--prefix", prefix], rows=8, cols=50)
    try:
        screen = p.read_until(rb"q quits")
        lines = re.sub(rb"\033\[[0-9;?]*[A-Za-z]", b"", screen).split(b"\r\n")
        assert len(lines) <= 8  # the last row is the hint
        assert max(len(l.decode()) for l in lines) <= 50, lines  # clipped, never wrapped
        p.send(b"\x03")
        assert p.wait() == 0
        assert termios.tcgetattr(p.fd)[3] & termios.ECHO
    finally:
        p.close()


def test_top_quits_on_ctrl_c(built, redis_addr, prefix, ptys):
    p = ptys("top", "--redis", redis_addr, "--prefix", prefix)
    p.read_until(rb"q quits")
    p.send(b"\x03")
    assert p.wait() == 0
    assert termios.tcgetattr(p.fd)[3] & termios.ECHO


# ---- load progress ----

def test_progress_lines_when_loading(workers, built, tmp_path):
    out = subprocess.run([str(CLI), "run", "-m", str(MODEL), "--tokens", "1,2", "-n", "2",
                          "--threads", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # not a terminal: one final line
    assert re.fullmatch(rf"loading {re.escape(str(MODEL))}: 3\.5/3\.5 MB  100%  [\d.]+ s\n", out.stderr)
    json.loads(out.stdout)
    # a terminal: redrawn in place
    p = Pty([str(CLI), "run", "-m", str(MODEL), "--tokens", "1,2", "-n", "2", "--threads", "1"])
    try:
        got = p.read_until(rb"100%  [\d.]+ s")
        assert b"\r\033[Kloading " in got
        assert p.wait(60) == 0
    finally:
        p.close()
    # the batching engine path too
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"prompt_ids": [1, 2], "max_tokens": 2}\n')
    out = subprocess.run([str(CLI), "run", "-m", str(MODEL), "--batch", str(jobs), "--threads", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "MB  100%" in out.stderr
    # the worker logs it at info level
    w = workers("w1")
    log = w.log_path.read_text()
    assert re.search(rf" I loaded {re.escape(str(MODEL))}: 3\.5 MB in [\d.]+ s\n", log)


def test_tokenize_detokenize_template_flags(built, tmp_path):
    """Every flag of the three tokenizer commands does what its help says,
    --help exits 0 and a flag without its value or an unknown one is a
    usage error (2)."""
    tok = str(QWEN3_TOKENIZER)

    def run(*args):
        return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=60)

    def out(*args):
        p = run(*args)
        assert p.returncode == 0, p.stderr
        return p.stdout

    text = "Hello <|im_end|>"
    ids = json.loads(out("tokenize", "--tokenizer", tok, "--text", text))["ids"]
    assert ids == [9707, 220, 151645]  # <|im_end|> is one special token
    src = tmp_path / "text.txt"
    src.write_text(text)
    assert json.loads(out("tokenize", "--file", str(src), "--tokenizer", tok))["ids"] == ids
    plain = json.loads(out("tokenize", "--tokenizer", tok, "--text", text, "--no-special"))["ids"]
    assert 151645 not in plain and len(plain) > len(ids)
    id_list = ",".join(map(str, ids))
    assert json.loads(out("detokenize", "--tokenizer", tok, "--ids", id_list))["text"] == text
    assert json.loads(out("detokenize", "--ids", id_list, "--tokenizer", tok,
                          "--skip-special"))["text"] == "Hello "

    msgs = tmp_path / "m.json"
    msgs.write_text(json.dumps([{"role": "user", "content": "Hi"}]))
    base = ["template", "--tokenizer", tok, "--messages", str(msgs)]
    user = "<|im_start|>user\nHi<|im_end|>\n"
    assert out(*base) == user + "<|im_start|>assistant\n"
    assert out(*base, "--no-think") == user + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert out(*base, "--no-generation-prompt") == user

    for cmd in ("tokenize", "detokenize", "template"):
        h = run(cmd, "--help")
        assert h.returncode == 0 and h.stdout.startswith(f"usage: redlm {cmd} --tokenizer DIR")
        assert run(cmd, "--tokenizer", tok, "--bogus").returncode == 2
        assert run(cmd, "--tokenizer").returncode == 2


def test_run_batch_error_lines_carry_the_code_beside_the_message(built, tmp_path):
    """`redlm run --batch`: a line it cannot read and a request the engine
    refuses each print {"error": {"code", "message"}} in place, with the
    engine's protocol code (rl_err.code) as the code and a sentence that
    does not repeat it; the good lines around them still run."""
    lines = [
        ({"prompt_ids": [1, 2], "max_tokens": 2, "temperature": 0}, None),
        ("not json", "BAD_JSON"),
        ({"prompt_ids": []}, "BAD_FIELD"),
        ({"prompt_ids": [1], "stop": [3]}, "BAD_FIELD"),
        ({"prompt_ids": [999999], "max_tokens": 2}, "INVALID_TOKEN"),
        ({"prompt_ids": [1, 2], "max_tokens": 1048576}, "PROMPT_TOO_LONG"),
        ({"prompt_ids": [1, 2], "top_p": 7}, "OUT_OF_RANGE"),
        ({"prompt_ids": [3], "max_tokens": 3, "temperature": 0}, None),
    ]
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n"
                            for l, _ in lines))
    p = subprocess.run([str(CLI), "run", "-m", str(MODEL), "--batch", str(path), "--threads", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = [json.loads(l) for l in p.stdout.splitlines()]
    assert len(out) == len(lines)
    for (job, code), got in zip(lines, out):
        if code is None:
            assert got["finish_reason"] == "length" and len(got["tokens"]) == job["max_tokens"]
        else:
            assert set(got) == {"error"} and got["error"]["code"] == code, got
            msg = got["error"]["message"]
            assert msg and not msg.startswith(code), got
