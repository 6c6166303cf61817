"""The example web backend (examples/web/server.py) and its chat page,
end to end: a real redis-server, the backend, a real worker, and the page in
headless Chromium driven over the DevTools protocol (cdp_browser.py).

What the browser tests prove:
- a real worker's answer streams into the page: the answer element takes
  at least two partial values before the request is done, and ends equal
  to the concatenated content deltas of redlm:out:<id>;
- nothing buffers on the way: with the test playing the worker, each event
  is written only after the page shows the one before it;
- with Thinking on the job has mode think, reasoning_content lands in the
  collapsible Reasoning block and not in the answer;
- the conversation is kept (the second job carries the first answer), an
  error event is shown as an alert with its code, and Stop cancels the job
  (redlm:cancel:<id> is set by the backend when the browser goes away);
- Stop with a draft in the box sends nothing (no second message, no job),
  Enter while streaming keeps the draft and shows why, an empty Send asks
  for text without the browser's validation bubble;
- answers render as Markdown (headings, nested lists, a code fence open
  while streaming then closed, its Copy button filling the clipboard,
  inline code, bold/italic, an https link; a javascript: link and HTML are
  text and nothing runs); reasoning, meta and the Thinking switch survive a
  reload; Regenerate sends the conversation without the old answer; a
  second conversation is listed, both survive a reload, switch, delete.
Screenshots go to build/test-artifacts/.

The HTTP tests (no browser) check bad input is a 400 with a code, the
job's shape against schemas/job.schema.json, and cancel on disconnect.
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from conftest import BUILD, CLI, QWEN3_TOKENIZER, ROOT, WORKER, connect, validator
import cdp_browser

SERVER = ROOT / "examples" / "web" / "server.py"
ARTIFACTS = ROOT / "build" / "test-artifacts"


@pytest.fixture(scope="session")
def vocab_model(tmp_path_factory):
    """A small random checkpoint with the real Qwen3 vocabulary, so the
    page shows words (random ones); made once per session."""
    tok = QWEN3_TOKENIZER
    if not CLI.exists() or not WORKER.exists():
        pytest.skip(f"{CLI} or {WORKER} not built (run make)")
    if not (tok / "tokenizer.json").exists():
        pytest.skip(f"Qwen3 tokenizer missing at {tok}")
    out = tmp_path_factory.mktemp("model") / "qwen3-web"
    subprocess.run([str(CLI), "mkmodel", "--shape", "tiny", "--hidden", "64", "--intermediate", "128",
                    "--heads", "2", "--kv-heads", "1", "--head-dim", "32", "--layers", "2",
                    "--vocab", "151936", "--dtype", "bf16", "--tokenizer", str(tok), "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    return out


class Web:
    """The example backend on a free loopback port."""

    def __init__(self, redis_addr, prefix, logdir, *extra):
        self.log_path = logdir / "web.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", str(SERVER), "--redis", redis_addr, "--prefix", prefix,
             "--listen", "127.0.0.1:0", "--poll-ms", "100", "-v", *extra],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"web backend did not start: {line!r} {self.log_path.read_text()}")
        self.url = line.split("listening on ", 1)[1].split()[0]

    def post(self, body, raw=None):
        data = raw if raw is not None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + "api/chat", data=data,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as f:
                return f.status, f.headers, f.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.log.close()


@pytest.fixture
def web_factory(redis_addr, prefix, tmp_path):
    started = []

    def start(*extra):
        w = Web(redis_addr, prefix, tmp_path, *extra)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()
    # every backend exits cleanly on SIGTERM
    assert all(w.proc.returncode == 0 for w in started), [w.proc.returncode for w in started]


@pytest.fixture
def browser():
    why = cdp_browser.missing()
    if why:
        pytest.skip(why)
    b = cdp_browser.Browser()
    yield b
    b.close()


@pytest.fixture
def real_worker(vocab_model, redis_addr, prefix, tmp_path):
    log_path = tmp_path / "worker.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([str(WORKER), "--redis", redis_addr, "--model", str(vocab_model),
                             "--pools", "fast,think", "--name", "web-w1", "--threads", "1",
                             "--prefix", prefix, "--block-ms", "100", "--http-port", "0"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.time() + 60
    while "ready:" not in log_path.read_text():
        assert proc.poll() is None, log_path.read_text()
        assert time.time() < deadline, "worker did not get ready"
        time.sleep(0.05)
    yield proc
    proc.terminate()
    proc.wait(15)
    log.close()


def sse_events(text):
    """[(event, data dict, id)] of a text/event-stream body."""
    out = []
    for block in text.split("\n\n"):
        ev, data, eid = "message", None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
            elif line.startswith("id: "):
                eid = line[4:]
        if data is not None:
            out.append((ev, data, eid))
    return out


# Records every value the newest answer / reasoning element takes, even
# when several updates land in one task: each record's added text node
# carries the value it was set to.
RECORDER = """
(() => {
  window.__answers = []; window.__reasonings = [];
  new MutationObserver((recs) => {
    for (const r of recs) {
      const t = r.target;
      const list = t.classList.contains('answer') ? window.__answers
                 : t.classList.contains('reasoning-text') ? window.__reasonings : null;
      if (!list) continue;
      const m = t.closest('.msg');
      // an answer's update adds one .md wrapper carrying its Markdown source
      for (const n of r.addedNodes)
        list.push({text: n.dataset?.md ?? (n.data || n.textContent), state: m.dataset.state});
    }
  }).observe(document.getElementById('log'), {childList: true, subtree: true});
  return true;
})()
"""

LAST = "document.querySelector('#log .msg.assistant:last-of-type')"


def send_message(b, text):
    n = b.eval("document.querySelectorAll('#log .msg.assistant').length")
    b.type("#input", text)
    b.click("#send")
    b.wait(f"document.querySelectorAll('#log .msg.assistant').length === {n + 1}", 10,
           "the assistant bubble")
    return b.wait(f"{LAST}.dataset.jobId", 10, "the job id")


def read_job(r, key, timeout=10):
    """The next job XADDed to key (the test plays the worker)."""
    res = r.xread({key: "0-0"}, block=timeout * 1000, count=1)
    assert res, f"no job on {key}"
    eid, fields = res[0][1][0]
    r.xdel(key, eid)
    return json.loads(fields["job"])


def put(r, prefix, job_id, seq, ev):
    ev = {"seq": seq, **ev}
    r.xadd(f"{prefix}out:{job_id}", {"event": json.dumps(ev)}, id=f"0-{seq + 1}")


DONE = {"type": "done", "finish_reason": "stop", "cached": False, "tool_calls": [],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "reasoning_tokens": 2,
                  "cached_prompt_tokens": 0},
        "timings": {"queue_ms": 1, "ttft_ms": 2, "total_ms": 3}}


# ---------------------------------------------------------------- browser

def test_chat_page_streams_a_real_workers_answer(browser, real_worker, web_factory, redis_addr,
                                                  prefix):
    web = web_factory("--pool", "fast", "--max-tokens", "24")
    b = browser
    b.goto(web.url)
    assert b.eval("document.title") == "redlm chat"
    assert b.eval("document.getElementById('think').checked") is False
    b.eval(RECORDER)
    job_id = send_message(b, "Tell me about Redis streams.")
    b.wait(f"{LAST}.dataset.state !== 'streaming'", 120, "the answer to complete")
    assert b.eval(f"{LAST}.dataset.state") == "done", b.eval(f"{LAST}.innerText")

    r = connect(redis_addr)
    entries = r.xrange(f"{prefix}out:{job_id}")
    events = [json.loads(f["event"]) for _, f in entries]
    ev_check = validator("event.schema.json")
    for ev in events:
        ev_check.validate(ev)
    assert events[-1]["type"] == "done" and events[-1]["finish_reason"] == "length"
    content = "".join(e["delta"].get("content", "") for e in events if e["type"] == "delta")
    assert content.strip(), "the model produced no text"
    # the answer shown is the content rendered as Markdown; its source is kept
    assert b.eval(f"{LAST}.querySelector('.answer').dataset.md") == content
    # no thinking: no reasoning block shown
    assert b.eval(f"{LAST}.querySelector('.reasoning').hidden") is True
    # streamed: the answer took several partial values while still streaming
    partial = [u["text"] for u in b.eval("window.__answers")
               if u["state"] == "streaming" and u["text"] != content]
    assert len(set(partial)) >= 2, partial
    assert all(content.startswith(p) for p in partial), partial
    assert "24 tokens" in b.eval(f"{LAST}.querySelector('.meta').textContent")
    b.screenshot(ARTIFACTS / "web-chat.png")


def test_chat_page_thinking_history_errors_and_stop(browser, web_factory, redis_addr, prefix):
    """The test plays the worker, so it controls when each event exists."""
    r = connect(redis_addr)
    web = web_factory("--pool", "think")
    pool = f"{prefix}jobs:think"
    b = browser
    b.goto(web.url)
    b.eval(RECORDER)
    b.click(".switch .slider")  # the visible switch, as a user clicks it
    assert b.eval("document.getElementById('think').checked") is True

    job_id = send_message(b, "Why is the sky blue?")
    job = read_job(r, pool)
    validator("job.schema.json").validate(job)
    assert job["id"] == job_id and job["mode"] == "think"
    assert job["messages"] == [{"role": "user", "content": "Why is the sky blue?"}]

    # each event is written only once the page shows the one before: no buffering
    steps = [({"reasoning_content": "Light scatters"}, "reasoning-text", "Light scatters"),
             ({"reasoning_content": " off air molecules."}, "reasoning-text",
              "Light scatters off air molecules."),
             ({"content": "Rayleigh"}, "answer", "Rayleigh"),
             ({"content": " scattering."}, "answer", "Rayleigh scattering.")]
    for seq, (delta, cls, shown) in enumerate(steps):
        put(r, prefix, job_id, seq, {"type": "delta", "delta": delta, "token_ids": [1]})
        b.wait(f"{LAST}.querySelector('.{cls}').textContent === {json.dumps(shown)}", 10,
               f"the page to show {shown!r}")
        assert b.eval(f"{LAST}.dataset.state") == "streaming"
    assert b.eval(f"{LAST}.querySelector('.reasoning').hidden") is False
    put(r, prefix, job_id, 4, DONE)
    b.wait(f"{LAST}.dataset.state === 'done'", 10)
    # reasoning and answer are apart
    assert b.eval(f"{LAST}.querySelector('.answer').textContent") == "Rayleigh scattering."
    assert b.eval(f"{LAST}.querySelector('.reasoning-text').textContent") == \
        "Light scatters off air molecules."
    b.screenshot(ARTIFACTS / "web-chat-thinking.png")
    # the reasoning block collapses
    assert b.eval(f"{LAST}.querySelector('.reasoning').open") is True
    b.click("#log .msg.assistant:last-of-type .reasoning summary")
    assert b.eval(f"{LAST}.querySelector('.reasoning').open") is False
    assert b.eval(f"{LAST}.querySelector('.reasoning-text').checkVisibility()") is False

    # second turn: the conversation is kept; the worker answers with an error
    job2_id = send_message(b, "And at sunset?")
    job2 = read_job(r, pool)
    assert job2["id"] == job2_id
    assert job2["messages"] == [{"role": "user", "content": "Why is the sky blue?"},
                                {"role": "assistant", "content": "Rayleigh scattering."},
                                {"role": "user", "content": "And at sunset?"}]
    put(r, prefix, job2_id, 0, {"type": "error", "code": "CONTEXT_TOO_LONG",
                                "message": "prompt has 40961 tokens; the model's context is 40960"})
    put(r, prefix, job2_id, 1, {**DONE, "finish_reason": "error"})
    b.wait(f"{LAST}.dataset.state === 'error'", 10, "the error to show")
    alert = b.eval(f"{LAST}.querySelector('[role=alert]').textContent")
    assert "CONTEXT_TOO_LONG" in alert and "40960" in alert
    b.screenshot(ARTIFACTS / "web-chat-error.png")

    # third turn: Stop closes the stream; the backend cancels the job. The
    # failed turn is not part of the conversation.
    job3_id = send_message(b, "Tell me more.")
    job3 = read_job(r, pool)
    assert [m["content"] for m in job3["messages"]] == \
        ["Why is the sky blue?", "Rayleigh scattering.", "Tell me more."]
    put(r, prefix, job3_id, 0, {"type": "delta", "delta": {"content": "Well"}, "token_ids": [1]})
    b.wait(f"{LAST}.querySelector('.answer').textContent === 'Well'", 10)
    assert b.eval("document.getElementById('send').textContent") == "Stop"
    b.click("#send")
    b.wait(f"{LAST}.dataset.state === 'cancelled'", 10)
    deadline = time.time() + 10
    while r.get(f"{prefix}cancel:{job3_id}") != "1":
        assert time.time() < deadline, "the backend did not set the cancel key"
        time.sleep(0.05)
    assert r.ttl(f"{prefix}cancel:{job3_id}") > 0

    # the conversation survives a reload
    b.goto(web.url)
    texts = b.eval("[...document.querySelectorAll('#log .msg .text, #log .msg .answer')]"
                   ".map(e => e.textContent)")
    assert texts == ["Why is the sky blue?", "Rayleigh scattering.", "Tell me more.", "Well"]


def test_chat_page_shows_backend_errors(browser, web_factory, redis_addr, prefix):
    """No worker and a short timeout: the page says so instead of hanging."""
    web = web_factory("--pool", "nobody", "--first-event-timeout-s", "0.5")
    b = browser
    b.goto(web.url)
    send_message(b, "Anyone there?")
    b.wait(f"{LAST}.dataset.state === 'error'", 20)
    assert "NO_WORKER" in b.eval(f"{LAST}.querySelector('[role=alert]').textContent")


def test_chat_page_stop_with_a_draft_and_enter_while_streaming(browser, web_factory, redis_addr,
                                                                prefix):
    """Stop while a draft is in the box stops the answer and sends nothing
    (the button turned back into submit before the click's default action
    used to send the draft); Enter while streaming keeps the draft and says
    why nothing was sent; Send on an empty box asks for text instead of the
    browser's "Please fill out this field"."""
    r = connect(redis_addr)
    web = web_factory("--pool", "fast")
    pool = f"{prefix}jobs:fast"
    b = browser
    b.goto(web.url)
    job_id = send_message(b, "First question")
    read_job(r, pool)
    put(r, prefix, job_id, 0, {"type": "delta", "delta": {"content": "Part"}, "token_ids": [1]})
    b.wait(f"{LAST}.querySelector('.answer').textContent === 'Part'", 10)
    b.type("#input", "my draft")
    b.enter()
    hint = b.wait("!document.getElementById('hint').hidden && document.getElementById('hint').textContent",
                  5, "the hint")
    assert "still streaming" in hint
    assert b.eval("document.getElementById('input').value") == "my draft"
    assert b.eval("document.querySelectorAll('#log .msg.user').length") == 1
    b.screenshot(ARTIFACTS / "web-chat-enter-while-streaming.png")
    b.click("#send")  # Stop, with the draft still in the box
    b.wait(f"{LAST}.dataset.state === 'cancelled'", 10)
    time.sleep(0.5)  # a wrongly sent draft would be XADDed by now
    assert r.xlen(pool) == 0, [json.loads(f["job"]) for _, f in r.xrange(pool)]
    assert b.eval("document.querySelectorAll('#log .msg.user').length") == 1
    assert b.eval("document.querySelectorAll('#log .msg.assistant').length") == 1
    assert b.eval("document.getElementById('input').value") == "my draft"
    assert b.eval("document.getElementById('send').textContent") == "Send"
    # an empty box: our hint, no browser validation, nothing sent
    b.eval("document.getElementById('input').value = ''")
    b.click("#send")
    assert "Type a message" in b.wait("document.getElementById('hint').textContent", 5)
    assert b.eval("document.getElementById('input').validationMessage") == ""
    assert r.xlen(pool) == 0
    # and a message, once idle, goes with Enter
    b.type("#input", "Second question")
    b.enter()
    job2 = read_job(r, pool)
    assert [m["content"] for m in job2["messages"]] == ["First question", "Part", "Second question"]


MARKDOWN = (
    "## Steps\n\nRun `make -j2` first:\n\n"
    "1. build\n2. **test** the *change*\n   - nested item\n\n"
    "```sh\nmake test <all>\necho \"done\"\n```\n\n"
    "See [the docs](https://redis.io/docs/) or [this](javascript:alert(1)).\n\n"
    "<img src=x onerror=\"window.__xss=1\"> <script>window.__xss=2</script>\n"
)


def test_chat_page_markdown_reload_regenerate_and_conversations(browser, web_factory, redis_addr,
                                                                prefix):
    """Markdown renders safely (headings, lists, code fences with a working
    copy button, inline code, links; HTML shown as text), reasoning and meta
    survive a reload, Regenerate asks again without the old answer, and
    conversations are listed and switched from local storage."""
    r = connect(redis_addr)
    web = web_factory("--pool", "think")
    pool = f"{prefix}jobs:think"
    b = browser
    b.goto(web.url)
    b.grant_clipboard(web.url.rstrip("/"))
    b.click(".switch .slider")
    job_id = send_message(b, "How do I build it?")
    read_job(r, pool)
    put(r, prefix, job_id, 0, {"type": "delta", "delta": {"reasoning_content": "They want steps."},
                               "token_ids": [1]})
    # the Markdown arrives in pieces, an open code fence included
    half = MARKDOWN.index("echo")
    put(r, prefix, job_id, 1, {"type": "delta", "delta": {"content": MARKDOWN[:half]}, "token_ids": [2]})
    b.wait(f"!!{LAST}.querySelector('.code-block.open')", 10, "the open code block while streaming")
    put(r, prefix, job_id, 2, {"type": "delta", "delta": {"content": MARKDOWN[half:]}, "token_ids": [3]})
    put(r, prefix, job_id, 3, DONE)
    b.wait(f"{LAST}.dataset.state === 'done'", 10)
    ans = f"{LAST}.querySelector('.answer')"
    assert b.eval(f"{ans}.querySelector('h2').textContent") == "Steps"
    assert b.eval(f"[...{ans}.querySelectorAll('ol > li')].length") == 2
    assert b.eval(f"{ans}.querySelector('ol li strong').textContent") == "test"
    assert b.eval(f"{ans}.querySelector('ol li em').textContent") == "change"
    assert b.eval(f"{ans}.querySelector('ol li ul li').textContent") == "nested item"
    assert b.eval(f"{ans}.querySelector('p code').textContent") == "make -j2"
    assert b.eval(f"{ans}.querySelector('pre code').textContent") == 'make test <all>\necho "done"'
    assert b.eval(f"{ans}.querySelector('pre code').className") == "language-sh"
    assert b.eval(f"{ans}.querySelector('.code-block.open')") is None
    links = b.eval(f"[...{ans}.querySelectorAll('a')].map(a => [a.href, a.rel, a.textContent])")
    assert links == [["https://redis.io/docs/", "noopener noreferrer", "the docs"]]
    # HTML in the text is text: no element made, nothing ran
    assert b.eval(f"{ans}.querySelectorAll('img, script').length") == 0
    assert b.eval("window.__xss === undefined")
    assert '<img src=x onerror="window.__xss=1">' in b.eval(f"{ans}.textContent")
    assert "[this](javascript:alert(1))" in b.eval(f"{ans}.textContent")
    b.click("#log .msg.assistant:last-of-type .copy")
    b.wait(f"{LAST}.querySelector('.copy').textContent === 'Copied'", 5, "the copy confirmation")
    assert b.eval("navigator.clipboard.readText()") == 'make test <all>\necho "done"'
    b.screenshot(ARTIFACTS / "web-chat-markdown.png")

    # reload: reasoning and meta are still there, the answer rendered again
    meta = b.eval(f"{LAST}.querySelector('.meta').textContent")
    assert "4 tokens (2 reasoning)" in meta
    b.goto(web.url)
    assert b.eval(f"{LAST}.querySelector('.reasoning-text').textContent") == "They want steps."
    assert b.eval(f"{LAST}.querySelector('.reasoning').hidden") is False
    assert b.eval(f"{LAST}.querySelector('.meta').textContent") == meta
    assert b.eval(f"{ans}.querySelector('pre code').textContent") == 'make test <all>\necho "done"'
    assert b.eval("document.getElementById('think').checked") is True
    b.screenshot(ARTIFACTS / "web-chat-reloaded.png")

    # regenerate: the same conversation without the old answer, a new job
    b.click("#log .msg.assistant:last-of-type .regenerate")
    job2 = read_job(r, pool)
    assert job2["id"] != job_id and job2["mode"] == "think"
    assert job2["messages"] == [{"role": "user", "content": "How do I build it?"}]
    assert b.eval("document.querySelectorAll('#log .msg.assistant').length") == 1
    put(r, prefix, job2["id"], 0, {"type": "delta", "delta": {"content": "Just `make`."}, "token_ids": [1]})
    put(r, prefix, job2["id"], 1, DONE)
    b.wait(f"{LAST}.dataset.state === 'done'", 10)
    assert b.eval(f"{ans}.textContent") == "Just make."

    # a second conversation; both listed, each keeps its own turns
    b.click("#new-chat")
    assert b.eval("document.querySelectorAll('#log .msg').length") == 0
    job3_id = send_message(b, "Another topic")
    read_job(r, pool)
    put(r, prefix, job3_id, 0, {"type": "delta", "delta": {"content": "Sure."}, "token_ids": [1]})
    put(r, prefix, job3_id, 1, DONE)
    b.wait(f"{LAST}.dataset.state === 'done'", 10)
    titles = b.eval("[...document.querySelectorAll('#chats .chat .open')].map(e => e.textContent)")
    assert titles == ["Another topic", "How do I build it?"]
    b.goto(web.url)  # the list and the current conversation survive a reload
    assert b.eval("document.querySelector('#chats .chat.current .open').textContent") == "Another topic"
    b.click("#chats .chat:last-child .open")
    texts = b.eval("[...document.querySelectorAll('#log .msg .text, #log .msg .answer')]"
                   ".map(e => e.textContent)")
    assert texts == ["How do I build it?", "Just make."]
    b.screenshot(ARTIFACTS / "web-chat-conversations.png")
    b.click("#chats .chat.current .delete")
    titles = b.eval("[...document.querySelectorAll('#chats .chat .open')].map(e => e.textContent)")
    assert titles == ["Another topic"]


# Markdown.render (static/markdown.js): input -> exact HTML. HTML in the
# text, unsafe link targets and quotes that would break out of an attribute
# all come out as text.
MD_CASES = [
    ("plain", "<p>plain</p>"),
    ("", ""),
    ("a\nb\n\nc", "<p>a<br>b</p><p>c</p>"),
    ("# Title", "<h1>Title</h1>"),
    ("### three ###", "<h3>three</h3>"),
    ("#no space", "<p>#no space</p>"),
    ("- a\n- b", "<ul><li>a</li><li>b</li></ul>"),
    ("3. c\n4. d", '<ol start="3"><li>c</li><li>d</li></ol>'),
    ("- a\n  - a1\n- b", "<ul><li>a<ul><li>a1</li></ul></li><li>b</li></ul>"),
    ("use `x<y>`", "<p>use <code>x&lt;y&gt;</code></p>"),
    ("``a`b``", "<p><code>a`b</code></p>"),
    ("**b** and *i*", "<p><strong>b</strong> and <em>i</em></p>"),
    ("2 * 3 * 4", "<p>2 * 3 * 4</p>"),
    ("[r](https://redis.io/)",
     '<p><a href="https://redis.io/" target="_blank" rel="noopener noreferrer">r</a></p>'),
    ("[m](mailto:a@b.c)",
     '<p><a href="mailto:a@b.c" target="_blank" rel="noopener noreferrer">m</a></p>'),
    ("[x](javascript:alert(1))", "<p>[x](javascript:alert(1))</p>"),
    ("[x](data:text/html,hi)", "<p>[x](data:text/html,hi)</p>"),
    ('[x](https://a/"onmouseover="alert(1))',
     '<p><a href="https://a/&quot;onmouseover=&quot;alert(1" target="_blank" '
     'rel="noopener noreferrer">x</a>)</p>'),
    ("<script>alert(1)</script>", "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>"),
    ("<img src=x onerror=alert(1)>", "<p>&lt;img src=x onerror=alert(1)&gt;</p>"),
    ("**<b>x</b>**", "<p><strong>&lt;b&gt;x&lt;/b&gt;</strong></p>"),
    ("```py\nif a < b:\n    pass\n```",
     '<div class="code-block"><div class="code-head"><span class="lang">py</span>'
     '<button type="button" class="copy" title="Copy the code">Copy</button></div>'
     '<pre><code class="language-py">if a &lt; b:\n    pass</code></pre></div>'),
    ("```\nopen",
     '<div class="code-block open"><div class="code-head"><span class="lang">code</span>'
     '<button type="button" class="copy" title="Copy the code">Copy</button></div>'
     "<pre><code>open</code></pre></div>"),
    ('```x" onclick="y\nz\n```', '<p>```x&quot; onclick=&quot;y<br>z</p><div class="code-block open">'
     '<div class="code-head"><span class="lang">code</span><button type="button" class="copy" '
     'title="Copy the code">Copy</button></div><pre><code></code></pre></div>'),
]


def test_markdown_renderer_cases(browser, web_factory):
    web = web_factory()
    b = browser
    b.goto(web.url)
    got = b.eval("JSON.stringify(%s.map(s => Markdown.render(s)))" % json.dumps([c[0] for c in MD_CASES]))
    got = json.loads(got)
    assert len(got) == len(MD_CASES)
    for (src, want), html in zip(MD_CASES, got):
        assert html == want, (src, html)


# ---------------------------------------------------------------- HTTP

def test_backend_streams_events_with_sse_headers(web_factory, redis_addr, prefix):
    """The default target is the dispatcher's redlm:requests; the response is
    the events as written, one SSE event each, in order."""
    r = connect(redis_addr)
    web = web_factory()
    import threading
    got = {}
    t = threading.Thread(target=lambda: got.update(
        zip(("status", "headers", "body"),
            web.post({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}))))
    t.start()
    job = read_job(r, f"{prefix}requests")
    validator("job.schema.json").validate(job)
    assert job["max_tokens"] == 7 and job["mode"] == "no_think"
    put(r, prefix, job["id"], 0, {"type": "delta", "delta": {"content": "a"}, "token_ids": [5]})
    put(r, prefix, job["id"], 1, {**DONE})
    t.join(30)
    assert got["status"] == 200
    h = got["headers"]
    assert h["Content-Type"].startswith("text/event-stream")
    assert "no-cache" in h["Cache-Control"] and h["X-Accel-Buffering"] == "no"
    evs = sse_events(got["body"])
    assert [e[0] for e in evs] == ["job", "delta", "done"]
    assert evs[0][1]["id"] == job["id"]
    assert [e[2] for e in evs[1:]] == ["0-1", "0-2"]
    assert evs[1][1]["delta"] == {"content": "a"}


def test_backend_reads_every_stream_with_one_xread(web_factory, redis_addr, prefix):
    """Several requests at once: each gets exactly its own job's events, in
    order, while the backend's only XREAD is its shared reader's (the
    request threads never read a stream themselves)."""
    r = connect(redis_addr)
    web = web_factory("--pool", "fast")
    import threading
    got, ts = {}, []
    for i in range(4):
        body = {"messages": [{"role": "user", "content": f"hi {i}"}]}
        ts.append(threading.Thread(target=lambda i=i, b=body: got.__setitem__(i, web.post(b))))
        ts[-1].start()
    jobs = [read_job(r, f"{prefix}jobs:fast") for _ in range(4)]
    for seq in range(3):  # interleaved, as a worker's batch writes them
        for j in jobs:
            put(r, prefix, j["id"], seq, {"type": "delta", "delta": {"content": f"{j['id']}/{seq}"},
                                          "token_ids": [seq]})
    for j in jobs:
        put(r, prefix, j["id"], 3, {**DONE})
    for t in ts:
        t.join(30)
    for i in range(4):
        status, _, body = got[i]
        assert status == 200
        evs = sse_events(body)
        jid = evs[0][1]["id"]
        assert [e[0] for e in evs] == ["job", "delta", "delta", "delta", "done"]
        assert [e[1]["delta"]["content"] for e in evs[1:4]] == [f"{jid}/{s}" for s in range(3)]
    # an earlier test's backend may still be leaving (its connections are
    # listed until Redis has seen them close): wait for ours alone
    from conftest import wait_for

    def mine():
        return [c for c in r.client_list() if c["name"].startswith("redlm-web")]
    wait_for(lambda: sum(c["name"] == "redlm-web-xmux" for c in mine()) == 1, "one shared reader")
    assert [c["name"] for c in mine() if c["cmd"] == "xread"] == ["redlm-web-xmux"], mine()


@pytest.mark.parametrize("body,code", [
    ({}, "BAD_MESSAGES"),
    ({"messages": []}, "BAD_MESSAGES"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "BAD_MESSAGES"),
    ({"messages": [{"role": "user", "content": 5}]}, "BAD_MESSAGES"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
     "BAD_MESSAGES"),
    ({"messages": [{"role": "user", "content": "x"}], "think": "yes"}, "BAD_FIELD"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "BAD_FIELD"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10 ** 9}, "BAD_FIELD"),
    ([1, 2], "BAD_JSON"),
    (b"{not json", "BAD_JSON"),
])
def test_backend_rejects_bad_input(web_factory, redis_addr, prefix, body, code):
    web = web_factory("--pool", "fast")
    raw = body if isinstance(body, bytes) else None
    status, _, text = web.post(body, raw=raw)
    assert status == 400
    assert json.loads(text)["code"] == code
    assert connect(redis_addr).xlen(f"{prefix}jobs:fast") == 0  # nothing enqueued


def test_backend_cancels_when_the_client_disconnects(web_factory, redis_addr, prefix):
    r = connect(redis_addr)
    web = web_factory("--pool", "fast")
    host, port = web.url.split("//")[1].rstrip("/").split(":")
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    job = read_job(r, f"{prefix}jobs:fast")
    s.recv(4096)  # headers and the job event
    assert r.get(f"{prefix}cancel:{job['id']}") is None
    s.close()
    deadline = time.time() + 10
    while r.get(f"{prefix}cancel:{job['id']}") != "1":
        assert time.time() < deadline, "no cancel after the client went away"
        time.sleep(0.05)


def test_backend_serves_the_page_and_nothing_else(web_factory):
    web = web_factory()
    for path, ctype in (("", "text/html"), ("app.js", "text/javascript"), ("markdown.js", "text/javascript"),
                        ("style.css", "text/css")):
        with urllib.request.urlopen(web.url + path, timeout=10) as f:
            assert f.headers["Content-Type"].startswith(ctype)
            body = f.read().decode()
            assert "http://" not in body and "https://" not in body  # no CDN
    for path in ("../server.py", "%2e%2e/server.py", "nope.html", "api/chat"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(web.url + path, timeout=10)
        assert e.value.code == 404
    with urllib.request.urlopen(web.url + "api/health", timeout=10) as f:
        assert json.load(f)["ok"] is True


def test_chat_page_narrow_screen_reaches_the_conversations(browser, web_factory, tmp_path):
    """Issue 29 (first contact): below 700 px the conversation list was hidden
    with no way to reach it. Now the header's Chats button opens it over the
    chat, and opening a conversation closes it. At a phone's 400 px, with a
    screenshot of the open list (kept in the test's tmp dir)."""
    web = web_factory()
    b = browser
    b.call("Emulation.setDeviceMetricsOverride", width=400, height=760, deviceScaleFactor=1, mobile=True)
    try:
        b.goto(web.url)
        shown = "getComputedStyle(document.getElementById(%s)).display !== 'none'"
        b.wait(shown % '"show-chats"', what="the Chats button on a narrow screen")
        assert b.eval(shown % '"sidebar"') is False
        b.click("#show-chats")
        b.wait(shown % '"sidebar"', what="the conversation list after Chats")
        assert b.eval("document.getElementById('show-chats').getAttribute('aria-expanded')") == "true"
        b.wait("document.querySelectorAll('#chats .open').length > 0", what="a conversation in the list")
        # the list lies within the 400 px and over the chat, not off screen
        box = json.loads(b.eval("JSON.stringify(document.getElementById('sidebar').getBoundingClientRect())"))
        assert box["left"] >= 0 and 0 < box["right"] <= 400, box
        shot = b.call("Page.captureScreenshot", format="png")
        png = __import__("base64").b64decode(shot["data"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        (tmp_path / "chat-400px-list-open.png").write_bytes(png)
        b.click("#chats .open")
        b.wait("!(%s)" % (shown % '"sidebar"'), what="the list closed after opening a conversation")
    finally:
        b.call("Emulation.clearDeviceMetricsOverride")
    # wide again: the list is part of the row, the button gone
    b.goto(web.url)
    b.wait(shown % '"sidebar"', what="the list on a wide screen")
    assert b.eval(shown % '"show-chats"') is False
