"""The clients users really drive an OpenAI-compatible server with, against
the front door (issue 29): the AI SDK (`ai` with @ai-sdk/openai-compatible
and @ai-sdk/openai's default provider), LangChain's ChatOpenAI, the OpenAI
Agents SDK. Each runs as the vendor documents it, from
tests/integration/node-clients (versions pinned by its package-lock.json,
installed by make deps), through a real dispatcher and a real worker on the
tiny model; its answers are checked against what the worker wrote to Redis,
and structured outputs against their zod schemas' rules. Skipped only when
node is absent."""
import json
import os
import pathlib
import shutil
import subprocess

import pytest

from conftest import connect, job_events, tap
from test_http import MODEL_NAME, deltas, front  # noqa: F401 (front is a fixture)

CLIENTS = pathlib.Path(__file__).resolve().parent / "node-clients"


def node_clients():
    if not shutil.which("node"):
        pytest.skip("node is not installed (make deps installs nodejs)")
    deps = json.loads((CLIENTS / "package.json").read_text())["dependencies"]
    if not all((CLIENTS / "node_modules" / name).exists() for name in deps):
        assert shutil.which("npm"), "node is installed but npm is not: run make deps"
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=CLIENTS,
                       capture_output=True, timeout=600, check=True)
    return CLIENTS


def run_client(front, workers, tmp_path, script, *args, timeout=180):
    d = node_clients()
    workers("w1")
    keys = tmp_path / "keys"
    keys.write_text("sk-test-0123456789 acme\n")
    # no_think by default: the random tiny model, thinking, would spend every
    # token of a structured answer before its JSON began (thinking itself is
    # test_http.py's)
    f = front("--api-keys-file", str(keys), "--http-default-mode", "no_think")
    out = subprocess.run(["node", str(d / script), f"http://127.0.0.1:{f.port}/v1", MODEL_NAME, *args],
                         capture_output=True, text=True, timeout=timeout, cwd=d)
    assert out.returncode == 0, out.stderr[-4000:]
    # the last line by "\n" alone: str.splitlines() also splits at U+2028,
    # U+0085 and the like, which JSON.stringify leaves raw and the tiny
    # model's random text sometimes holds (a CI run failed on one)
    return json.loads(out.stdout.strip().split("\n")[-1])


def check_person(p):
    """The zod schema of aisdk.mjs / langchain.mjs, as zod itself would."""
    assert set(p) <= {"name", "age", "role", "tags", "email"}, p
    assert isinstance(p["name"], str) and len(p["name"]) <= 20
    assert isinstance(p["age"], int) and 0 < p["age"] <= 150
    assert p["role"] in ("admin", "user", "guest")
    assert isinstance(p["tags"], list) and len(p["tags"]) <= 3 and all(len(t) <= 8 for t in p["tags"])


def check_weather(args):
    assert set(args) == {"city", "days"}, args
    assert isinstance(args["city"], str) and len(args["city"]) <= 20
    assert isinstance(args["days"], int) and 1 <= args["days"] <= 7


def request_id(r, prefix, resp_id):
    """The job id behind an OpenAI response id: a chat completion's id is the
    job's own; a Responses API id may carry the resp_ prefix before it."""
    for cand in (resp_id, resp_id[len("resp_"):] if resp_id.startswith("resp_") else None):
        if cand and r.exists(f"{prefix}out:{cand}"):
            return cand
    return resp_id


@pytest.mark.parametrize("provider", ["compatible", "openai"])
def test_ai_sdk(front, workers, redis_addr, prefix, tmp_path, provider):  # noqa: F811
    res = run_client(front, workers, tmp_path, "aisdk.mjs", provider)
    r = connect(redis_addr)
    for call in ("generateText", "streamText"):
        got = res[call]
        assert got["finishReason"] == "length", got
        assert (got.get("usage") or {}).get("outputTokens") == 12, got
        events = job_events(r, prefix, request_id(r, prefix, got["id"]))
        assert got["text"] == deltas(events, "content"), (call, got)
    assert res["streamText"]["parts"] >= 2  # streamed, not one final chunk
    check_person(res["generateObject"]["object"])
    t = res["tools"]
    assert t["toolCalls"] and t["toolCalls"][0]["name"] == "weather", t
    check_weather(t["toolCalls"][0]["input"])
    assert t["calls"] == [c["input"] for c in t["toolCalls"]]  # the SDK ran the tool with those arguments


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_langchain_chat_openai(front, workers, redis_addr, prefix, tmp_path, api):  # noqa: F811
    res = run_client(front, workers, tmp_path, "langchain.mjs", api)
    r = connect(redis_addr)
    inv = res["invoke"]
    assert inv["usage"]["output_tokens"] == 12, inv
    assert inv["text"] == deltas(job_events(r, prefix, request_id(r, prefix, inv["id"])), "content")
    st = res["stream"]
    assert st["chunks"] >= 2, st
    assert st["text"] == deltas(job_events(r, prefix, request_id(r, prefix, st["id"])), "content")
    check_person(res["structured"])
    calls = res["tools"]
    if api == "responses" and not calls:
        # LangChain 1.6's Responses path drops tool_choice from the request
        # (bindTools' option, a call option or withConfig alike: a probe
        # server sees no tool_choice), so nothing forces the random model to
        # call; its text answer must then be the job's
        assert res["toolsText"] == deltas(job_events(r, prefix, request_id(r, prefix, res["toolsId"])),
                                          "content")
        return
    assert calls and calls[0]["name"] == "weather", calls
    check_weather(calls[0]["args"])
    assert len({c["id"] for c in calls}) == len(calls)


def test_openai_agents_sdk(front, workers, redis_addr, prefix, tmp_path):  # noqa: F811
    """The Agents SDK's default API is the Responses API; its
    previousResponseId continues a stored response."""
    r = connect(redis_addr)
    tap(r, f"{prefix}jobs:fast", f"{prefix}jobs:think")  # jobs stay readable
    res = run_client(front, workers, tmp_path, "agents.mjs")
    ch = res["chained"]
    assert ch["previous"] == res["run"]["id"] and set(ch["output"]) == {"answer"}, ch
    job = next(json.loads(x["job"]) for p in ("fast", "think")
               for _, x in r.xrange(f"{prefix}jobs:{p}") if json.loads(x["job"])["id"] == ch["id"])
    first = deltas(job_events(r, prefix, request_id(r, prefix, res["run"]["id"])), "content")
    assert [(m["role"], m["content"]) for m in job["messages"]] == [
        ("system", "You are a helpful assistant."), ("user", "Say hello."), ("assistant", first),
        ("user", "Say it again.")]
    for key in ("run", "stream"):
        got = res[key]
        assert set(got["output"]) == {"answer"} and len(got["output"]["answer"]) <= 30, got
        text = deltas(job_events(r, prefix, request_id(r, prefix, got["id"])), "content")
        assert json.loads(text) == got["output"], (text, got)
    st = res["stream"]
    assert st["deltas"] >= 2 and json.loads(st["text"]) == st["output"], st
    assert res["tools"]["calls"], res["tools"]
    check_weather(res["tools"]["calls"][0])
    check_person(res["structured"])


def test_conversations_with_openai_and_agents_sdk(front, workers, redis_addr, prefix,  # noqa: F811
                                                  tmp_path):
    """The Conversations API as the openai npm client drives it (with its
    auto-pagination), a Responses request in a conversation, the Agents
    SDK's conversationId and its OpenAIConversationsSession."""
    r = connect(redis_addr)
    tap(r, f"{prefix}jobs:fast", f"{prefix}jobs:think")  # jobs stay readable
    res = run_client(front, workers, tmp_path, "conversations.mjs")
    conv = res["created"]
    cid = conv["id"]
    assert conv["object"] == "conversation" and conv["metadata"] == {"topic": "names"}
    assert res["retrieved"] == conv and res["updated"]["metadata"] == {"topic": "ada"}
    assert len(res["paged"]) == 3 and res["paged"][1:] == res["added"]  # three pages of one
    assert res["item"]["id"] == res["added"][0] and res["afterItemDelete"]["id"] == cid
    resp = res["response"]
    assert resp["conversation"] == {"id": cid}
    items = res["items"]  # Ada, note two, Hi, the answer
    assert [i["role"] for i in items] == ["user", "user", "user", "assistant"], items
    assert items[-1]["id"] == resp["output"][-1]
    jobs = {json.loads(x["job"])["id"]: json.loads(x["job"]) for p in ("fast", "think")
            for _, x in r.xrange(f"{prefix}jobs:{p}")}
    assert [m["content"] for m in jobs[resp["id"]]["messages"]] == [
        "My name is Ada.", "Note two.", "Hi"]
    # the agent's run in it: the conversation first, its turn added
    run_job = jobs[res["agentRun"]["id"]]
    assert [m["role"] for m in run_job["messages"]][:5] == [
        "system", "user", "user", "user", "assistant"], run_job["messages"]
    assert set(res["agentRun"]["output"]) == {"answer"}
    assert res["itemsAfterRun"] == 6
    # the session: its second run saw the first (the history the SDK read
    # back from the conversation's items), then it was cleared
    s = res["session"]
    assert s["id"].startswith("conv_") and s["id"] != cid
    second = [m["role"] for m in jobs[s["second"]]["messages"]]
    assert second.count("user") == 2 and "assistant" in second, second
    assert s["items"] == len(s["stored"]) >= 4 and s["stored"][0] == {"type": "message",
                                                                       "role": "user"}
    assert set(s["output"]) == {"answer"}
    assert s["cleared"] == 404
    assert res["deleted"] == {"id": cid, "object": "conversation.deleted", "deleted": True}
    assert not r.exists(f"{prefix}conversation:{cid}")
