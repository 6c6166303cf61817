"""Structured output (issue 17) through a real worker and redis-server, on a
random-weight checkpoint with the real Qwen3 vocabulary: every output of a
corpus of JSON Schemas (tests/data/schemas/, our own) x seeds and
temperatures parses with json and validates with Debian's jsonschema
(Draft 2020-12), the independent validator; json_object, a raw grammar,
tool_choice required and named, thinking mode (free reasoning, the
constraint after </think>), max_tokens mid-document ("length"), and the
refusals (BAD_PARAM: error event + dead letter, and the worker serves the
next job)."""
import json
import pathlib
import re
import subprocess
import time

import jsonschema
import pytest

from conftest import CLI, DATA, QWEN3_TOKENIZER, WORKER, Daemon, check_stream, free_port, wait_for
from test_http import front  # noqa: F401
from test_memory import metrics
from test_redis_budget import Monitor

SCHEMAS = sorted((DATA / "schemas").glob("*.json"))
# (seed, temperature): greedy, the card's and hotter sampling
SETTINGS = [(1, 0.0), (7, 0.7), (23, 1.0)]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": json.loads(
        (DATA / "schemas" / "68-tool-weather.json").read_text())}},
    {"type": "function", "function": {"name": "book_hotel", "parameters": json.loads(
        (DATA / "schemas" / "59-tool-booking.json").read_text())}},
]


@pytest.fixture(scope="module")
def vocab_model(tmp_path_factory):
    if not CLI.exists() or not WORKER.exists():
        pytest.skip(f"{CLI} or {WORKER} not built (run make)")
    out = tmp_path_factory.mktemp("model") / "qwen3-structured"
    subprocess.run([str(CLI), "mkmodel", "--shape", "tiny", "--hidden", "64", "--intermediate",
                    "128", "--heads", "2", "--kv-heads", "1", "--head-dim", "32", "--layers", "2",
                    "--vocab", "151936", "--dtype", "bf16", "--tokenizer", str(QWEN3_TOKENIZER),
                    "--out", str(out)], check=True, capture_output=True, timeout=300)
    return out


class VocabWorker(Daemon):
    kind = "worker"

    def __init__(self, addr, prefix, model, logdir, *extra):
        self.start([str(WORKER), "--redis", addr, "--model", str(model), "--pools", "fast,think",
                    "--name", "sw", "--threads", "2", "--prefix", prefix, "--block-ms", "100",
                    "--heartbeat-interval-ms", "500", "--http-port", "0", *extra],
                   pathlib.Path(logdir) / "worker-structured.log", self.logged_ready)


@pytest.fixture
def worker(vocab_model, redis_addr, prefix, tmp_path):
    w = VocabWorker(redis_addr, prefix, vocab_model, tmp_path)
    yield w
    w.stop()


def run(client, validator, jobs, pool="fast", timeout=600):
    for j in jobs:
        client.submit(j, pool=pool)
    out = {}
    for j in jobs:
        evs = client.events(j["id"], timeout=timeout)
        check_stream(evs, validator)
        content = "".join(e["delta"].get("content", "") for _, e in evs if e["type"] == "delta")
        reasoning = "".join(e["delta"].get("reasoning_content", "") for _, e in evs
                            if e["type"] == "delta")
        out[j["id"]] = (content, reasoning, evs)
    return out


def schema_job(i, path, seed, temp, **extra):
    return {"id": f"s{i}-{seed}", "messages": [{"role": "user", "content": "Answer in JSON."}],
            "max_tokens": 600, "seed": seed, "temperature": temp,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": path.stem.replace(".", "_")[:64], "strict": True,
                "schema": json.loads(path.read_text())}}, **extra}


def test_corpus_outputs_validate(worker, client, event_validator):
    assert len(SCHEMAS) >= 60
    jobs, want = [], {}
    for i, path in enumerate(SCHEMAS):
        for seed, temp in SETTINGS:
            j = schema_job(i, path, seed, temp)
            jobs.append(j)
            want[j["id"]] = (path, json.loads(path.read_text()))
    res = run(client, event_validator, jobs)
    bad = []
    for jid, (content, _, evs) in res.items():
        path, schema = want[jid]
        done = evs[-1][1]
        try:
            assert done["finish_reason"] == "stop", done["finish_reason"]
            doc = json.loads(content)
            jsonschema.Draft202012Validator(
                schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
            ).validate(doc)
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            bad.append(f"{path.name} {jid}: {str(e)[:200]} in {content[:200]!r}")
    assert not bad, f"{len(bad)} of {len(res)} outputs fail:\n" + "\n".join(bad[:20])


def test_same_seed_same_document(worker, client, event_validator):
    """A seeded constrained job is reproducible (the mask does not touch the
    RNG stream), and a different seed gives a different draw."""
    path = SCHEMAS[0]
    jobs = [dict(schema_job(0, path, 5, 1.0), id="rep-a", cache=False),
            dict(schema_job(0, path, 5, 1.0), id="rep-b", cache=False)]
    res = run(client, event_validator, jobs)
    ta = [t for _, e in res["rep-a"][2] if e["type"] == "delta" for t in e["token_ids"]]
    tb = [t for _, e in res["rep-b"][2] if e["type"] == "delta" for t in e["token_ids"]]
    assert ta == tb and ta


def test_json_object_and_grammar(worker, client, event_validator):
    # "any object" lets a random model write one string forever at high
    # temperature; these settings end (a schema bounds its strings instead)
    jobs = [{"id": f"jo{s}", "prompt": p, "max_tokens": 400, "temperature": 0,
             "response_format": {"type": "json_object"}}
            for s, p in enumerate(["JSON:", "An object please", "Reply with data."])]
    jobs += [{"id": f"g{s}", "prompt": "Yes or no?", "max_tokens": 50, "seed": s,
              "temperature": 1.0, "grammar": 'root ::= ("yes" | "no") " " [0-9]{1,3}'}
             for s in range(4)]
    res = run(client, event_validator, jobs)
    for s in range(3):
        content, _, evs = res[f"jo{s}"]
        assert evs[-1][1]["finish_reason"] == "stop"
        assert isinstance(json.loads(content), dict), content
    for s in range(4):
        content, _, evs = res[f"g{s}"]
        assert evs[-1][1]["finish_reason"] == "stop"
        assert re.fullmatch(r"(yes|no) [0-9]{1,3}", content), content


def test_tool_choice_required_and_named(worker, client, event_validator):
    base = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
            "max_tokens": 600, "temperature": 1.0}
    jobs = [dict(base, id=f"tr{s}", seed=s, tool_choice="required") for s in range(3)]
    jobs += [dict(base, id=f"tn{s}", seed=s, tool_choice={"type": "function", "function": {
        "name": "book_hotel"}}) for s in range(3)]
    res = run(client, event_validator, jobs)
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for jid, (content, _, evs) in res.items():
        done = evs[-1][1]
        assert done["finish_reason"] == "stop", (jid, content)
        calls = done.get("tool_calls") or []
        assert len(calls) == 1, (jid, content, done)
        fn = calls[0]["function"]
        if jid.startswith("tn"):
            assert fn["name"] == "book_hotel"
        args = fn["arguments"]
        args = json.loads(args) if isinstance(args, str) else args
        jsonschema.Draft202012Validator(params[fn["name"]]).validate(args)


def test_thinking_mode_constraint_after_think(worker, client, event_validator):
    """Think pool: the reasoning is free and the document comes after
    </think>; the thinking budget still ends the reasoning."""
    path = next(p for p in SCHEMAS if "person.json" in p.name)
    jobs = [dict(schema_job(900, path, s, 0.8), id=f"th{s}", max_thinking_tokens=12)
            for s in range(3)]
    res = run(client, event_validator, jobs, pool="think")
    schema = json.loads(path.read_text())
    for jid, (content, reasoning, evs) in res.items():
        done = evs[-1][1]
        assert done["finish_reason"] == "stop", (jid, content)
        assert done["usage"]["reasoning_tokens"] >= 12
        assert reasoning.strip(), jid
        jsonschema.validate(json.loads(content), schema)


def test_max_tokens_mid_document_is_length(worker, client, event_validator):
    path = next(p for p in SCHEMAS if "extract-invoice" in p.name)
    res = run(client, event_validator, [dict(schema_job(901, path, 3, 0.7), id="short",
                                             max_tokens=5)])
    content, _, evs = res["short"]
    assert evs[-1][1]["finish_reason"] == "length"
    assert content.startswith("{")
    with pytest.raises(ValueError):
        json.loads(content)


def nested(depth):
    """A schema nested depth objects deep, as text (json.dumps recurses)."""
    return ('{"type": "object", "properties": {"a": ' * depth + '{"type": "integer"}' +
            '}, "required": ["a"]}' * depth)


REFUSALS = [
    ("unsupported", {"type": "object", "properties": {"n": {"type": "number",
                                                             "not": {"const": 0}}}},
     "/properties/n/not"),
    ("unsatisfiable", {"type": "integer", "minimum": 5, "maximum": 1}, "no integer"),
    ("huge", {"type": "object", "properties": {f"p{i:06d}": {"type": "string",
                                                             "description": "x" * 60}
                                               for i in range(12000)}}, "limit"),
    ("depth", nested(1000), "deeper"),
]


@pytest.mark.parametrize("name,schema,words", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusals(worker, client, event_validator, dead_validator, name, schema, words):
    text = schema if isinstance(schema, str) else json.dumps(schema)
    if name == "huge":
        assert len(text) > 1_000_000
    raw = ('{"id": "bad-%s", "prompt": "x", "max_tokens": 4, "response_format": {"type": '
           '"json_schema", "json_schema": {"name": "n", "schema": %s}}}' % (name, text))
    refused(client, event_validator, dead_validator, {"id": f"bad-{name}"}, words, raw)


def test_compile_does_not_stall_running_jobs(worker, client, event_validator, redis_addr,
                                             tmp_path):
    """A schema near the compiler's limit takes a few hundred milliseconds to
    compile. It compiles on one of the engine's compile threads: a job already
    running goes on producing tokens meanwhile, and the schema job then
    runs. Counted in Redis's own order of commands (MONITOR): the running
    job's events stored after the schema job's XADD and before that job's
    first event. Compiled on the worker's own thread, as before, the
    running job stood still for the whole compile (an event or two at most
    in that window)."""
    mon = Monitor(redis_addr, tmp_path / "monitor.txt")
    try:
        client.submit({"id": "runner", "prompt": "x", "max_tokens": 16000, "ignore_eos": True,
                       "temperature": 0, "cache": False})
        wait_for(lambda: len(client.events("runner", partial=True, timeout=0.2)) >= 2,
                 "the running job's tokens")
        heavy = {"id": "heavy", "prompt": "x", "max_tokens": 4, "cache": False,
                 "response_format": {"type": "json_schema", "json_schema": {
                     "name": "near_limit", "schema": {
                         "type": "array",
                         "prefixItems": [{"type": "string", "maxLength": 2000}]}}}}
        client.submit(heavy)
        evs = client.events("heavy", timeout=120)
        check_stream(evs, event_validator)
        assert evs[-1][1]["finish_reason"] in ("stop", "length"), evs[-1][1]
        cmds = mon.sync(client.r)
    finally:
        mon.stop()
    client.r.set(f"{client.prefix}cancel:runner", 1, ex=600)
    runner = client.events("runner", timeout=120)
    check_stream(runner, event_validator)
    assert runner[-1][1]["finish_reason"] == "cancelled"
    jobs_key, out_runner, out_heavy = (f"{client.prefix}jobs:fast", f"{client.prefix}out:runner",
                                       f"{client.prefix}out:heavy")
    at = next(i for i, (_, src, a) in enumerate(cmds)
              if src != "lua" and a[:2] == ["XADD", jobs_key] and "heavy" in a[-1])
    end = next(i for i, (_, src, a) in enumerate(cmds)
               if i > at and src == "lua" and a[:2] == ["XADD", out_heavy])
    during = sum(1 for _, src, a in cmds[at:end] if src == "lua" and a[:2] == ["XADD", out_runner])
    assert during >= 10, f"{during} events of the running job while the schema compiled"


def near_limit_job(job_id, length):
    """A job whose schema takes a few hundred milliseconds to compile; each
    length is a different text, so a different compile."""
    return {"id": job_id, "prompt": "x", "max_tokens": 4, "cache": False,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "near_limit", "schema": {
                    "type": "array", "prefixItems": [{"type": "string", "maxLength": length}]}}}}


def all_finish(client, event_validator, ids):
    """Each job's whole stream is valid and ends with a document (stop) or
    max_tokens (length)."""
    for job_id in ids:
        evs = client.events(job_id, timeout=120)
        check_stream(evs, event_validator)
        assert evs[-1][1]["finish_reason"] in ("stop", "length"), (job_id, evs[-1][1])


def test_compiling_jobs_hold_no_batch_slot(vocab_model, redis_addr, prefix, client,
                                           event_validator, tmp_path):
    """A job waiting for its schema's compile holds no batch slot: a worker
    of one slot, given three new near-limit schemas and then a plain job,
    finishes the plain job while the schemas still compile (one compile
    thread: they take their turns, a few hundred ms each). Held in a slot,
    as before, the plain job waited for all three schema jobs to finish."""
    w = VocabWorker(redis_addr, prefix, vocab_model, tmp_path, "--max-batch", "1",
                    "--max-compiling", "4", "--grammar-compile-threads", "1")
    try:
        for i, length in enumerate((2000, 1999, 1998)):
            client.submit(near_limit_job(f"h{i}", length))
        client.submit({"id": "plain", "prompt": "x", "max_tokens": 4, "ignore_eos": True,
                       "temperature": 0, "cache": False})
        evs = client.events("plain", timeout=120)
        check_stream(evs, event_validator)
        assert evs[-1][1]["finish_reason"] == "length"
        # the moment the plain job is done: the last schema job has not begun
        assert client.r.xlen(f"{client.prefix}out:h2") == 0
        all_finish(client, event_validator, ["h0", "h1", "h2"])
    finally:
        w.stop()


def test_max_compiling_bounds_the_jobs_held(vocab_model, redis_addr, prefix, client,
                                            event_validator, tmp_path):
    """max_compiling bounds the jobs a worker holds while they compile, even
    when one read could take several: three new schemas queued at once,
    a worker of four slots and max_compiling 1 has read at most two of them
    (the first, now running, and the second, compiling) when the first one's
    first event is stored; the third stays in the pool for other workers.
    Unbounded, one read took all three."""
    w = VocabWorker(redis_addr, prefix, vocab_model, tmp_path, "--max-batch", "4",
                    "--max-compiling", "1", "--grammar-compile-threads", "1")
    try:
        pool = f"{client.prefix}jobs:fast"
        wait_for(lambda: client.r.exists(pool) and any(
            g["name"] == "workers" for g in client.r.xinfo_groups(pool)),
                 "the worker's consumer group")
        with client.r.pipeline(transaction=True) as p:
            for i, length in enumerate((2000, 1999, 1998)):
                p.xadd(pool, {"job": json.dumps(near_limit_job(f"b{i}", length))})
            p.execute()
        wait_for(lambda: client.r.xlen(f"{client.prefix}out:b0") > 0, "b0's first event",
                 timeout=120, every=0.005)
        group = next(g for g in client.r.xinfo_groups(pool) if g["name"] == "workers")
        assert group["entries-read"] is not None and group["entries-read"] <= 2, group
        all_finish(client, event_validator, ["b0", "b1", "b2"])
    finally:
        w.stop()


def test_grammar_cache_bounded_in_bytes(vocab_model, redis_addr, prefix, client,
                                        event_validator, tmp_path):
    """A near-limit schema compiles to about 50 MB. With grammar_cache_mb
    64 the worker's cache keeps one of two such schemas, not both: its gauge
    redlm_grammar_cache_bytes stays within the bound (with the default 512 it
    would hold both, over 100 MB)."""
    port = free_port()
    w = VocabWorker(redis_addr, prefix, vocab_model, tmp_path, "--grammar-cache-mb", "64",
                    "--http-port", str(port))
    try:
        for i, length in enumerate((2000, 1999)):
            client.submit(near_limit_job(f"c{i}", length))
            all_finish(client, event_validator, [f"c{i}"])
        # the gauge is refreshed with the worker's loop
        held = wait_for(lambda: metrics(port).get("redlm_grammar_cache_bytes"), "the gauge")
        assert 30 << 20 < held <= 64 << 20, held
    finally:
        w.stop()


def test_bad_grammar_refused(worker, client, event_validator, dead_validator):
    refused(client, event_validator, dead_validator,
            {"id": "bad-grammar", "prompt": "x", "max_tokens": 4, "grammar": 'root ::= "a" (b'},
            "1:")


def refused(client, event_validator, dead_validator, job, words, raw=None):
    n_dead = client.r.xlen(f"{client.prefix}dead")
    client.submit(job, raw=raw)
    evs = client.events(job["id"], timeout=60)
    check_stream(evs, event_validator)
    err = evs[0][1]
    assert err["type"] == "error" and err["code"] == "BAD_PARAM", err
    assert words in err["message"], err["message"]
    assert evs[-1][1]["finish_reason"] == "error"
    deadline = time.time() + 10
    while client.r.xlen(f"{client.prefix}dead") == n_dead and time.time() < deadline:
        time.sleep(0.05)
    d = json.loads(client.r.xrange(f"{client.prefix}dead")[-1][1]["dead"])
    dead_validator.validate(d)
    assert d["code"] == "BAD_PARAM"
    # the worker goes on serving
    ok = {"id": job["id"] + "-next", "prompt": "x", "max_tokens": 3,
          "response_format": {"type": "json_object"}}
    client.submit(ok)
    evs = client.events(ok["id"], timeout=60)
    assert evs[-1][1]["type"] == "done" and evs[-1][1]["finish_reason"] in ("stop", "length")


# ---- the HTTP front door ----

PERSON = json.loads((DATA / "schemas" / "48-person.json").read_text())
WEATHER_TOOLS = TOOLS[:1]


def post(f, body):
    status, _, data = f.request("POST", "/v1/chat/completions", body, timeout=120)
    return status, json.loads(data)


def test_front_door_structured(front, worker):
    f = front()
    msgs = [{"role": "user", "content": "Who are you? Answer in JSON."}]
    for seed in (1, 2, 3):
        status, r = post(f, {"messages": msgs, "max_tokens": 300, "seed": seed,
                             "temperature": 0.8, "mode": "no_think",
                             "response_format": {"type": "json_schema", "json_schema": {
                                 "name": "person", "strict": True, "schema": PERSON}}})
        assert status == 200, r
        assert r["choices"][0]["finish_reason"] == "stop"
        jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), PERSON)
    status, r = post(f, {"messages": msgs, "max_tokens": 400, "seed": 4, "temperature": 1.0,
                         "mode": "no_think", "tools": WEATHER_TOOLS, "tool_choice": "required"})
    assert status == 200, r
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    call = ch["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather"
    jsonschema.validate(json.loads(call["arguments"]),
                        WEATHER_TOOLS[0]["function"]["parameters"])
    # refusals are 400s: from the dispatcher's job_parse, and from the worker's compiler
    status, r = post(f, {"messages": msgs, "response_format": {"type": "yaml"}})
    assert status == 400 and r["error"]["code"] == "BAD_PARAM", r
    assert r["error"]["param"] == "response_format.type"
    status, r = post(f, {"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "minLength": 4, "maxLength": 2}}}})
    assert status == 400 and r["error"]["code"] == "BAD_PARAM", r
    assert r["error"]["param"] == "response_format"
    status, r = post(f, {"messages": msgs, "tools": WEATHER_TOOLS,
                         "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert status == 400 and r["error"]["code"] == "BAD_PARAM", r


NODE_SCRIPT = r"""
const OpenAI = require('openai');
const [base, schema, tools] = [process.argv[2], JSON.parse(process.argv[3]), JSON.parse(process.argv[4])];
const client = new OpenAI({baseURL: base, apiKey: 'sk-none', maxRetries: 0});
(async () => {
  const out = {};
  const r = await client.chat.completions.create({
    messages: [{role: 'user', content: 'Who are you?'}], max_tokens: 300, seed: 11, temperature: 0.8,
    mode: 'no_think',
    response_format: {type: 'json_schema', json_schema: {name: 'person', strict: true, schema}}});
  out.parsed = JSON.parse(r.choices[0].message.content);
  const t = await client.chat.completions.create({
    messages: [{role: 'user', content: 'Weather?'}], max_tokens: 400, seed: 12, temperature: 1.0,
    mode: 'no_think', tools, tool_choice: 'required'});
  const call = t.choices[0].message.tool_calls[0];
  out.finish = t.choices[0].finish_reason;
  out.tool = {name: call.function.name, args: JSON.parse(call.function.arguments)};
  try {
    await client.chat.completions.create({messages: [{role: 'user', content: 'x'}],
      response_format: {type: 'json_schema', json_schema: {name: 'n', schema: {type: 'integer', minimum: 3, maximum: 1}}}});
  } catch (e) { out.error = {status: e.status, code: e.code}; }
  console.log(JSON.stringify(out));
})().catch(e => { console.error(String(e)); process.exit(1); });
"""


def test_openai_npm_client_structured(front, worker, tmp_path):
    from test_http import npm_openai
    d = npm_openai()
    if d is None:
        pytest.skip("node is not installed (make deps installs nodejs): cannot run the `openai` npm client")
    f = front()
    script = tmp_path / "structured.js"
    script.write_text(NODE_SCRIPT)
    out = subprocess.run(["node", str(script), f"http://127.0.0.1:{f.port}/v1", json.dumps(PERSON),
                          json.dumps(WEATHER_TOOLS)], capture_output=True, text=True, timeout=180,
                         env={"PATH": "/usr/bin:/bin", "NODE_PATH": str(d / "node_modules")})
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    jsonschema.validate(res["parsed"], PERSON)
    assert res["finish"] == "tool_calls" and res["tool"]["name"] == "get_weather"
    jsonschema.validate(res["tool"]["args"], WEATHER_TOOLS[0]["function"]["parameters"])
    assert res["error"] == {"status": 400, "code": "BAD_PARAM"}
