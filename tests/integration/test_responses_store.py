"""Stored responses (dispatcher/rstore.h): the Responses API's `store` and
`previous_response_id`, GET / DELETE /v1/responses/{id} and its
input_items, end to end through a real redis-server, dispatcher and worker
(or the test playing the worker where the exact output matters):

  - a response is kept in Redis with its TTL before its last byte goes out;
    the next request naming it continues its conversation (the job's
    messages are the stored turns, then the new input; instructions are not
    carried), streamed or not; a tool loop keeps the assistant's thinking
    and its calls as one turn;
  - a record keeps its own turn and the chain of the records before it,
    so a conversation is kept once, a turn bounded, not the whole;
  - GET returns the object the client got; input_items lists the
    conversation in both orders, paged; DELETE removes it, and naming it
    afterwards is 400 previous_response_not_found, as OpenAI answers,
    while what continued it still reads its items;
  - another tenant's id is not found (404 / 400), never its answer;
  - store false keeps nothing; responses_store_ttl_s = 0 keeps nothing and
    says so;
  - background responses: the POST answers "queued" at once, GET reads the
    answer as it stands (queued, in_progress, then completed / failed /
    cancelled) from the job's events and keeps it once ended, so it
    outlives the event stream; cancel stops the job; a streamed one whose
    client leaves runs on; the output budget is charged up front;
  - the pinned `openai` npm client (responses.create with
    previous_response_id, retrieve, inputItems.list, delete, background
    with retrieve and cancel) and the OpenAI Agents SDK's
    previousResponseId.
"""
import json
import threading
import time

from conftest import connect, tap, wait_for
from test_compat_api import PLAYED, keyed_front, node, responses_sse, texts  # noqa: F401
from test_http import (MODEL_NAME, front, play_worker_error, post_and_hang_up,  # noqa: F401
                       sse_events)
from conftest import job_events

KEY = "sk-test-0123456789"
OTHER = "sk-other-0123456789"


def jobs_by_id(r, prefix):
    return {json.loads(x["job"])["id"]: json.loads(x["job"])
            for p in ("fast", "think") for _, x in r.xrange(f"{prefix}jobs:{p}")}


def post(f, body, key=None):
    h = {"Authorization": f"Bearer {key}"} if key else {}
    status, _, data = f.request("POST", "/v1/responses", body, headers=h)
    return status, json.loads(data)


def get(f, path, key=None, method="GET"):
    h = {"Authorization": f"Bearer {key}"} if key else {}
    status, _, data = f.request(method, path, headers=h)
    return status, json.loads(data)


def text_of(resp):
    return "".join(p["text"] for o in resp["output"] if o["type"] == "message"
                   for p in o["content"])


def test_previous_response_id_continues_the_conversation(front, workers, redis_addr,  # noqa: F811
                                                         prefix):
    r = connect(redis_addr)
    tap(r, f"{prefix}jobs:fast", f"{prefix}jobs:think")  # jobs stay readable
    workers("w1")
    f = front()
    fast = {"model": MODEL_NAME, "max_output_tokens": 6, "reasoning": {"effort": "low"}}
    status, r1 = post(f, {**fast, "input": "Hello there", "instructions": "Be brief."})
    assert status == 200, r1
    assert r1["store"] is True and r1["previous_response_id"] is None
    key = f"{prefix}response:{r1['id']}"
    assert 0 < r.ttl(key) <= 3600  # kept, and not forever
    # the next turn names it: the job is the stored conversation, then the new input
    status, r2 = post(f, {**fast, "input": "And again?", "previous_response_id": r1["id"]})
    assert status == 200, r2
    assert r2["previous_response_id"] == r1["id"] and r2["instructions"] is None
    jobs = jobs_by_id(r, prefix)
    assert jobs[r1["id"]]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert jobs[r2["id"]]["messages"] == [
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": text_of(r1)},
        {"role": "user", "content": "And again?"}]
    # streamed: the same, and the completed object says what it follows
    evs = responses_sse(f, {**fast, "input": [{"role": "user", "content": "Third."}],
                            "previous_response_id": r2["id"], "stream": True})
    r3 = evs[-1]["response"]
    assert r3["previous_response_id"] == r2["id"] and r3["store"] is True
    assert [m["content"] for m in jobs_by_id(r, prefix)[r3["id"]]["messages"]] == [
        "Hello there", text_of(r1), "And again?", text_of(r2), "Third."]
    content, _ = texts(job_events(r, prefix, r3["id"]))
    assert text_of(r3) == content
    # GET: the object the client got
    status, got = get(f, f"/v1/responses/{r1['id']}")
    assert status == 200 and got == r1
    status, got = get(f, f"/v1/responses/{r3['id']}")
    assert status == 200 and got == r3
    # input_items: the conversation up to r2, newest first by default, paged
    status, items = get(f, f"/v1/responses/{r2['id']}/input_items?order=asc")
    assert status == 200 and items["object"] == "list" and items["has_more"] is False
    data = items["data"]
    assert [(i["type"], i.get("role")) for i in data] == [
        ("message", "user"), ("message", "assistant"), ("message", "user")]
    assert data[1]["id"] == r1["output"][0]["id"]  # r1's own message item
    assert data[2]["content"] == [{"type": "input_text", "text": "And again?"}]
    ids = [i["id"] for i in data]
    assert len(set(ids)) == 3 and items["first_id"] == ids[0] and items["last_id"] == ids[2]
    status, desc = get(f, f"/v1/responses/{r2['id']}/input_items")
    assert status == 200 and [i["id"] for i in desc["data"]] == ids[::-1]
    status, page = get(f, f"/v1/responses/{r2['id']}/input_items?order=asc&limit=2")
    assert [i["id"] for i in page["data"]] == ids[:2] and page["has_more"] is True
    status, page = get(f, f"/v1/responses/{r2['id']}/input_items?order=asc&after={ids[1]}")
    assert [i["id"] for i in page["data"]] == ids[2:] and page["has_more"] is False
    for q, param in (("limit=0", "limit"), ("order=up", "order"), ("after=nope", "after")):
        status, err = get(f, f"/v1/responses/{r2['id']}/input_items?{q}")
        assert status == 400 and err["error"]["param"] == param, err
    # the records: r1 whole (the first of its conversation), r2 and r3 only
    # their own turn and the chain of what they continue
    recs = {x["id"]: json.loads(r.get(f"{prefix}response:{x['id']}")) for x in (r1, r2, r3)}
    assert "chain" not in recs[r1["id"]] and len(recs[r1["id"]]["input"]) == 1
    assert recs[r2["id"]]["chain"] == [r1["id"]] and "input" not in recs[r2["id"]]
    said = lambda c: c if isinstance(c, str) else c[0]["text"]  # noqa: E731
    assert [said(i["content"]) for i in recs[r2["id"]]["turn"]] == ["And again?"]
    assert recs[r3["id"]]["chain"] == [r1["id"], r2["id"]]
    assert [said(i["content"]) for i in recs[r3["id"]]["turn"]] == ["Third."]
    # DELETE: gone, and naming it is OpenAI's 400; what chained on it still works
    # (a tombstone keeps only what they read, until it expires)
    status, d = get(f, f"/v1/responses/{r1['id']}", method="DELETE")
    assert status == 200 and d == {"id": r1["id"], "object": "response", "deleted": True}
    stone = json.loads(r.get(key))
    assert stone["deleted"] is True and set(stone) == {"owner", "deleted", "input", "response"}
    assert stone["response"] == {"output": r1["output"]} and 0 < r.ttl(key) <= 3600
    status, err = get(f, f"/v1/responses/{r1['id']}")
    assert status == 404 and err["error"]["param"] == "response_id"
    status, err = get(f, f"/v1/responses/{r1['id']}", method="DELETE")
    assert status == 404
    status, err = post(f, {**fast, "input": "x", "previous_response_id": r1["id"]})
    assert status == 400 and err["error"]["code"] == "previous_response_not_found"
    assert err["error"]["param"] == "previous_response_id"
    assert err["error"]["message"] == f"Previous response with id '{r1['id']}' not found."
    status, r4 = post(f, {**fast, "input": "Still here?", "previous_response_id": r2["id"]})
    assert status == 200 and len(jobs_by_id(r, prefix)[r4["id"]]["messages"]) == 5
    # store false: kept nowhere
    status, r5 = post(f, {**fast, "input": "Forget this.", "store": False})
    assert status == 200 and r5["store"] is False
    assert not r.exists(f"{prefix}response:{r5['id']}")
    assert get(f, f"/v1/responses/{r5['id']}")[0] == 404
    status, err = get(f, f"/v1/responses/{r2['id']}?stream=true")
    assert status == 400 and "only a background response" in err["error"]["message"], err
    # what is not a stored response's path
    assert get(f, "/v1/responses/" + "x" * 300)[0] == 404
    assert get(f, f"/v1/responses/{r2['id']}/other")[0] == 404
    status, err = get(f, f"/v1/responses/{r2['id']}/cancel", method="POST")
    assert status == 400 and "background" in err["error"]["message"]
    status, _, _ = f.request("PUT", f"/v1/responses/{r2['id']}")
    assert status == 405
    status, err = post(f, {**fast, "input": "x", "previous_response_id": 7})
    assert status == 400 and err["error"]["param"] == "previous_response_id"
    status, err = post(f, {**fast, "input": "x", "store": "yes"})
    assert status == 400 and err["error"]["param"] == "store"


def test_a_tool_loop_keeps_its_thinking_and_calls(front, redis_addr, prefix):  # noqa: F811
    """The test plays the worker: an answer that thinks, says a word and
    calls a tool. The call's output, sent with previous_response_id, makes
    a job whose assistant turn has that thinking, that text and that call
    (one turn, as the model produced it)."""
    f = front()
    r = connect(redis_addr)
    tools = [{"type": "function", "name": "get_weather",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    body = {"model": MODEL_NAME, "input": "Weather in Paris?", "reasoning": {"effort": "high"},
            "tools": tools}
    t = threading.Thread(target=play_worker_error, args=(r, prefix, PLAYED))
    t.start()
    status, r1 = post(f, body)
    t.join()
    assert status == 200, r1
    call = r1["output"][2]
    assert call["type"] == "function_call"
    done = {"seq": 0, "type": "done", "finish_reason": "stop",
            "usage": {"prompt_tokens": 40, "completion_tokens": 1}}
    holder = {}
    t = threading.Thread(target=lambda: holder.update(id=play_worker_error(r, prefix, [done])))
    t.start()
    status, r2 = post(f, {"model": MODEL_NAME, "tools": tools, "previous_response_id": r1["id"],
                          "input": [{"type": "function_call_output", "call_id": call["call_id"],
                                     "output": "sunny"}]})
    t.join()
    assert status == 200, r2
    job = jobs_by_id(r, prefix)[holder["id"]]
    assert job["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Let me think.",
         "tool_calls": [{"id": call["call_id"], "type": "function",
                         "function": {"name": "get_weather", "arguments": call["arguments"]}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": call["call_id"]}]


def test_stored_responses_belong_to_their_tenant(front, workers, redis_addr, prefix,  # noqa: F811
                                                 tmp_path):
    workers("w1")
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY} acme\n{OTHER} beta\n")
    f = front("--api-keys-file", str(keys))
    fast = {"model": MODEL_NAME, "max_output_tokens": 4, "reasoning": {"effort": "low"}}
    status, mine = post(f, {**fast, "input": "secret"}, key=KEY)
    assert status == 200, mine
    path = f"/v1/responses/{mine['id']}"
    # the other tenant: not found, whatever it tries
    assert get(f, path, key=OTHER)[0] == 404
    assert get(f, path + "/input_items", key=OTHER)[0] == 404
    assert get(f, path, key=OTHER, method="DELETE")[0] == 404
    status, err = post(f, {**fast, "input": "x", "previous_response_id": mine["id"]}, key=OTHER)
    assert status == 400 and err["error"]["code"] == "previous_response_not_found"
    assert get(f, path)[0] == 401  # no key: no answer at all
    # its own tenant: all of it, and it is still there
    status, got = get(f, path, key=KEY)
    assert status == 200 and got == mine
    status, _ = post(f, {**fast, "input": "x", "previous_response_id": mine["id"]}, key=KEY)
    assert status == 200
    assert connect(redis_addr).exists(f"{prefix}response:{mine['id']}")


def test_no_store(front, workers, redis_addr, prefix):  # noqa: F811
    workers("w1")
    f = front("--responses-store-ttl-s", "0")
    status, r1 = post(f, {"model": MODEL_NAME, "input": "Hi", "max_output_tokens": 3,
                          "reasoning": {"effort": "low"}})
    assert status == 200 and r1["store"] is False
    assert not connect(redis_addr).exists(f"{prefix}response:{r1['id']}")
    status, err = get(f, f"/v1/responses/{r1['id']}")
    assert status == 404 and "keeps no responses" in err["error"]["message"]
    status, err = post(f, {"model": MODEL_NAME, "input": "x", "previous_response_id": r1["id"]})
    assert status == 400 and err["error"]["code"] == "previous_response_not_found"
    assert "responses_store_ttl_s = 0" in err["error"]["message"]


def test_a_conversation_too_long_to_keep(front, workers, redis_addr, prefix):  # noqa: F811
    """responses_store_max_kb: a longer conversation is answered and not
    kept (the response says store false); a background one, which could
    not be read back, is refused."""
    workers("w1")
    f = front("--responses-store-max-kb", "1")
    big = "word " * 300  # 1.5 KiB
    body = {"model": MODEL_NAME, "input": big, "max_output_tokens": 3,
            "reasoning": {"effort": "low"}}
    status, r1 = post(f, body)
    assert status == 200 and r1["store"] is False, r1
    assert not connect(redis_addr).exists(f"{prefix}response:{r1['id']}")
    status, err = post(f, {**body, "background": True})
    assert status == 400 and err["error"]["param"] == "background", err
    assert "responses_store_max_kb" in err["error"]["message"]
    status, small = post(f, {**body, "input": "short"})
    assert status == 200 and small["store"] is True


SDK_SCRIPT = r"""
const OpenAI = require('openai');
const [base, model] = [process.argv[2], process.argv[3]];
const client = new OpenAI({baseURL: base + '/v1', apiKey: 'sk-test-0123456789', maxRetries: 0});
(async () => {
  const out = {};
  const opts = {model, max_output_tokens: 5, reasoning: {effort: 'low'}};
  out.r1 = await client.responses.create({...opts, input: 'Name a colour.'});
  out.r2 = await client.responses.create({...opts, input: 'Another one.',
                                          previous_response_id: out.r1.id});
  const s = await client.responses.create({...opts, input: 'And a third.', stream: true,
                                           previous_response_id: out.r2.id});
  for await (const ev of s) out.r3 = ev.response || out.r3;
  out.retrieved = await client.responses.retrieve(out.r2.id);
  out.items = [];
  for await (const it of client.responses.inputItems.list(out.r3.id, {order: 'asc', limit: 2}))
    out.items.push(it);
  out.deleted = await client.responses.del(out.r1.id);  // delete() from openai 5 on
  try { await client.responses.retrieve(out.r1.id); } catch (e) { out.gone = e.status; }
  // background: queued at once, polled until it ends; another cancelled
  let bg = await client.responses.create({...opts, input: 'In the background.', background: true});
  out.bg_first = bg.status;
  while (bg.status === 'queued' || bg.status === 'in_progress') {
    await new Promise(r => setTimeout(r, 50));
    bg = await client.responses.retrieve(bg.id);
  }
  out.bg = bg;
  out.again = [];  // its stream again, after the SDK's starting_after
  for await (const ev of await client.responses.retrieve(bg.id, {stream: true, starting_after: 2}))
    out.again.push([ev.type, ev.sequence_number]);
  const long = await client.responses.create({...opts, max_output_tokens: 4000, ignore_eos: true,
                                              input: 'Go on forever.', background: true});
  out.cancelled = await client.responses.cancel(long.id);
  console.log(JSON.stringify(out));
})().catch(e => { console.error(String(e)); process.exit(1); });
"""


def test_a_long_conversation_is_kept_once(front, workers, redis_addr, prefix):  # noqa: F811
    """A record keeps its own turn and names the records before it (its
    chain): responses_store_max_kb bounds a turn, not the conversation;
    continuing a response starts its chain's TTLs again; a record of the
    chain that expired leaves nothing to continue, said by name."""
    r = connect(redis_addr)
    tap(r, f"{prefix}jobs:fast", f"{prefix}jobs:think")
    workers("w1")
    f = front("--responses-store-max-kb", "1")
    fast = {"model": MODEL_NAME, "max_output_tokens": 3, "reasoning": {"effort": "low"}}
    prev, ids = None, []
    for t in range(4):  # 0.6 KiB a turn: the whole passes 1 KiB at the second
        body = {**fast, "input": f"turn {t} " + "word " * 120}
        if prev:
            body["previous_response_id"] = prev
        status, resp = post(f, body)
        assert status == 200 and resp["store"] is True, (t, resp)
        prev = resp["id"]
        ids.append(prev)
    recs = [json.loads(r.get(f"{prefix}response:{i}")) for i in ids]
    assert [x.get("chain", []) for x in recs] == [ids[:k] for k in range(4)]
    # a turn each, not the history (which grows ~1.4 KB a turn here)
    sizes = [len(json.dumps(x)) for x in recs]
    assert max(sizes) < sizes[0] + 300, sizes
    msgs = jobs_by_id(r, prefix)[ids[3]]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant"] * 3 + ["user"]
    assert [m["content"].split()[:2] for m in msgs[::2]] == [["turn", str(t)] for t in range(4)]
    status, items = get(f, f"/v1/responses/{ids[3]}/input_items?order=asc&limit=100")
    assert status == 200 and len(items["data"]) == 7
    # continuing starts the chain's TTLs again
    r.expire(f"{prefix}response:{ids[0]}", 50)
    status, r5 = post(f, {**fast, "input": "and?", "previous_response_id": ids[3]})
    assert status == 200 and r5["store"] is True
    assert r.ttl(f"{prefix}response:{ids[0]}") > 3000
    assert json.loads(r.get(f"{prefix}response:{r5['id']}"))["chain"] == ids
    # one of the chain gone (as if expired): nothing to continue, said by name
    r.delete(f"{prefix}response:{ids[1]}")
    status, err = post(f, {**fast, "input": "x", "previous_response_id": ids[3]})
    assert status == 400 and err["error"]["code"] == "previous_response_not_found", err
    assert ids[1] in err["error"]["message"]
    status, err = get(f, f"/v1/responses/{ids[3]}/input_items")
    assert status == 404 and ids[1] in err["error"]["message"], err
    assert get(f, f"/v1/responses/{ids[3]}")[0] == 200  # the response itself is there


def test_a_chain_at_its_bound_is_written_whole(front, workers, redis_addr, prefix):  # noqa: F811
    """Past RST_CHAIN_MAX (256) records, the next record is written whole
    (its input the whole conversation, no chain), so a chain's pipeline
    stays bounded; the conversation is the same. The 256 records are
    written here as the front door writes them (an empty turn each)."""
    r = connect(redis_addr)
    tap(r, f"{prefix}jobs:fast", f"{prefix}jobs:think")
    workers("w1")
    f = front()
    empty = {"owner": "", "input": [], "response": {"output": []}}
    ids = [f"resp_bound{i:03d}" for i in range(256)]
    pipe = r.pipeline()
    for i in ids:
        pipe.set(f"{prefix}response:{i}", json.dumps(empty), ex=600)
    said = {"type": "message", "role": "user", "id": "msg_said",
            "content": [{"type": "input_text", "text": "Remember 7."}]}
    answer = {"type": "message", "role": "assistant", "id": "msg_answer", "status": "completed",
              "content": [{"type": "output_text", "text": "Noted.", "annotations": []}]}
    head = {"owner": "", "chain": ids, "turn": [said],
            "response": {"id": "resp_boundhead", "object": "response", "output": [answer]}}
    pipe.set(f"{prefix}response:resp_boundhead", json.dumps(head), ex=600)
    pipe.execute()
    status, nxt = post(f, {"model": MODEL_NAME, "max_output_tokens": 3, "input": "Which?",
                           "reasoning": {"effort": "low"},
                           "previous_response_id": "resp_boundhead"})
    assert status == 200 and nxt["store"] is True, nxt
    assert [m["content"] for m in jobs_by_id(r, prefix)[nxt["id"]]["messages"]] == [
        "Remember 7.", "Noted.", "Which?"]
    rec = json.loads(r.get(f"{prefix}response:{nxt['id']}"))
    assert "chain" not in rec and [i["id"] for i in rec["input"][:2]] == ["msg_said",
                                                                          "msg_answer"]
    assert len(rec["input"]) == 3
    # the chain's records were read and kept on (GETEX of all 256)
    assert r.ttl(f"{prefix}response:{ids[0]}") > 600


def test_openai_npm_client_chains_responses(front, workers, redis_addr, prefix,  # noqa: F811
                                            tmp_path):
    r = connect(redis_addr)
    tap(r, f"{prefix}jobs:fast", f"{prefix}jobs:think")
    workers("w1")
    f = keyed_front(front, tmp_path)
    res = node(f, tmp_path, SDK_SCRIPT)
    r1, r2, r3 = res["r1"], res["r2"], res["r3"]
    assert r2["previous_response_id"] == r1["id"] and r3["previous_response_id"] == r2["id"]
    jobs = jobs_by_id(r, prefix)
    assert [m["content"] for m in jobs[r3["id"]]["messages"]] == [
        "Name a colour.", text_of(r1), "Another one.", text_of(r2), "And a third."]
    # (create's answer has the SDK's own output_text added)
    assert res["retrieved"] == {k: v for k, v in r2.items() if k != "output_text"}
    # the SDK pages by after= through the five items of r3's conversation
    items = res["items"]
    assert [(i["type"], i["role"]) for i in items] == [("message", r) for r in (
        "user", "assistant", "user", "assistant", "user")]
    assert items[1]["id"] == r1["output"][0]["id"] and items[3]["id"] == r2["output"][0]["id"]
    assert res["deleted"] == {"id": r1["id"], "object": "response", "deleted": True}
    assert res["gone"] == 404
    bg = res["bg"]
    assert res["bg_first"] == "queued" and bg["background"] is True
    assert bg["status"] == "incomplete" and bg["usage"]["output_tokens"] == 5, bg
    content, _ = texts(job_events(r, prefix, bg["id"]))
    assert text_of(bg) == content
    again = res["again"]
    assert again[0][1] == 3 and [n for _, n in again] == list(range(3, 3 + len(again)))
    assert again[-1][0] == "response.incomplete"
    cancelled = res["cancelled"]
    assert cancelled["status"] == "cancelled" and r.get(f"{prefix}cancel:{cancelled['id']}") == "1"
    done = job_events(r, prefix, cancelled["id"], timeout=120)[-1]
    assert done["finish_reason"] == "cancelled", done  # the worker stopped it


def test_background_responses(front, redis_addr, prefix):  # noqa: F811
    """The test plays the worker, so that each state is seen: queued (no
    event yet), in_progress, completed with the played text and usage;
    the record is then finished and outlives the job's events. A chain on
    a running one is refused; one that fails says so with its error; a
    cancelled one sets the job's cancel key and says cancelled."""
    f = front()
    r = connect(redis_addr)
    body = {"model": MODEL_NAME, "input": "Write a poem.", "background": True,
            "max_output_tokens": 50, "reasoning": {"effort": "low"}}
    status, q = post(f, body)
    assert status == 200 and q["status"] == "queued" and q["background"] is True, q
    rid = q["id"]
    rec = json.loads(r.get(f"{prefix}response:{rid}"))
    assert "running" in rec and rec["response"]["status"] == "queued"
    status, got = get(f, f"/v1/responses/{rid}")
    assert status == 200 and got["status"] == "queued"
    status, err = post(f, {**body, "background": False, "previous_response_id": rid})
    assert status == 400 and "has not finished" in err["error"]["message"], err
    # the worker starts: in_progress; it ends: completed
    job = json.loads(wait_for(lambda: next((x["job"] for _, x in r.xrange(f"{prefix}jobs:fast")
                                            if json.loads(x["job"])["id"] == rid), None),
                              "the background job queued"))
    assert "client_lease_ms" not in job and "deadline_ms" not in job  # nobody waits for it
    out = f"{prefix}out:{rid}"
    r.xadd(out, {"event": json.dumps({"seq": 0, "type": "delta", "delta": {"content": "Roses "},
                                      "token_ids": [1]})}, id="0-1")
    assert get(f, f"/v1/responses/{rid}")[1]["status"] == "in_progress"
    # its stream, again: whole, and resumed after event 3, both read while it runs
    streams = {}

    def read_stream(name, query):
        c = f.conn()
        c.request("GET", f"/v1/responses/{rid}?stream=true{query}")
        resp = c.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type").startswith(
            "text/event-stream")
        streams[name] = [json.loads(d) for d in sse_events(resp)]
        c.close()
    readers = [threading.Thread(target=read_stream, args=a)
               for a in (("whole", ""), ("resumed", "&starting_after=3"))]
    for t in readers:
        t.start()
    r.xadd(out, {"event": json.dumps({"seq": 1, "type": "delta", "delta": {"content": "are red."},
                                      "token_ids": [2]})}, id="0-2")
    r.xadd(out, {"event": json.dumps({"seq": 2, "type": "done", "finish_reason": "stop",
                                      "usage": {"prompt_tokens": 12, "completion_tokens": 2}})},
           id="0-3")
    for t in readers:
        t.join()
    whole, resumed = streams["whole"], streams["resumed"]
    assert [e["sequence_number"] for e in whole] == list(range(len(whole)))
    assert whole[0]["type"] == "response.created" and whole[-1]["type"] == "response.completed"
    assert "".join(e["delta"] for e in whole if e["type"] == "response.output_text.delta") == \
        "Roses are red."
    assert resumed == whole[4:]  # the same events, numbered the same
    status, done = get(f, f"/v1/responses/{rid}")
    assert status == 200 and done["status"] == "completed", done
    assert whole[-1]["response"] == done
    assert text_of(done) == "Roses are red." and done["usage"]["output_tokens"] == 2
    assert done["id"] == rid and done["background"] is True
    rec = json.loads(r.get(f"{prefix}response:{rid}"))
    assert "running" not in rec and rec["response"] == done  # kept finished
    # finished, it is a conversation to continue
    fin = {"seq": 0, "type": "done", "finish_reason": "stop",
           "usage": {"prompt_tokens": 20, "completion_tokens": 0}}
    holder = {}
    t = threading.Thread(target=lambda: holder.update(id=play_worker_error(r, prefix, [fin])))
    t.start()
    status, nxt = post(f, {**body, "background": False, "input": "Again.",
                           "previous_response_id": rid})
    t.join()
    assert status == 200 and nxt["previous_response_id"] == rid, nxt
    assert [m["content"] for m in jobs_by_id(r, prefix)[holder["id"]]["messages"]] == [
        "Write a poem.", "Roses are red.", "Again."]
    r.delete(out)  # the event stream expires: the answer stays
    assert get(f, f"/v1/responses/{rid}")[1] == done
    status, err = get(f, f"/v1/responses/{rid}?stream=true")
    assert status == 400 and "expired" in err["error"]["message"], err
    status, err = get(f, f"/v1/responses/{rid}?stream=true&starting_after=x")
    assert status == 400 and err["error"]["param"] == "starting_after", err
    # one that fails
    status, q = post(f, {**body, "input": "Fail."})
    r.xadd(f"{prefix}out:{q['id']}", {"event": json.dumps(
        {"seq": 0, "type": "error", "code": "PROMPT_TOO_LONG", "message": "prompt: too long"})},
        id="0-1")
    status, failed = get(f, f"/v1/responses/{q['id']}")
    # (the error as OpenAI names it, as on every route)
    assert failed["status"] == "failed" and failed["error"]["code"] == "context_length_exceeded", \
        failed
    # one cancelled before it ends: the job's cancel key, and the answer says so
    status, q = post(f, {**body, "input": "Stop me."})
    status, c = get(f, f"/v1/responses/{q['id']}/cancel", method="POST")
    assert status == 200 and c["status"] == "cancelled", c
    assert r.get(f"{prefix}cancel:{q['id']}") == "1"
    assert get(f, f"/v1/responses/{q['id']}")[1]["status"] == "cancelled"
    r.xadd(f"{prefix}out:{q['id']}", {"event": json.dumps(
        {"seq": 0, "type": "done", "finish_reason": "cancelled",
         "usage": {"prompt_tokens": 3, "completion_tokens": 0}})}, id="0-1")
    status, c = get(f, f"/v1/responses/{q['id']}")
    assert c["status"] == "cancelled" and "running" not in json.loads(
        r.get(f"{prefix}response:{q['id']}"))
    status, err = get(f, f"/v1/responses/{q['id']}/cancel", method="POST")
    assert status == 400  # finished: nothing to cancel
    # deleting a running one cancels its job too
    status, q = post(f, {**body, "input": "Delete me."})
    assert get(f, f"/v1/responses/{q['id']}", method="DELETE")[0] == 200
    assert r.get(f"{prefix}cancel:{q['id']}") == "1"
    # what background needs
    status, err = post(f, {**body, "store": False})
    assert status == 400 and err["error"]["param"] == "background", err
    status, err = post(f, {**body, "background": "yes"})
    assert status == 400 and err["error"]["param"] == "background", err


def test_background_with_a_worker(front, workers, redis_addr, prefix, tmp_path):  # noqa: F811
    """A real worker: the background answer read by polling equals the
    job's events; a streamed background response whose client leaves runs
    to its end (no cancel key), read back afterwards; a tenant's tokens per
    minute are charged the output budget when it is queued."""
    workers("w1")
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY} acme 1000 100000\n")
    # records kept longer than the events of other jobs (stream_ttl_s 3600)
    f = front("--api-keys-file", str(keys), "--responses-store-ttl-s", "7200")
    r = connect(redis_addr)
    body = {"model": MODEL_NAME, "input": "Tell me a story.", "background": True,
            "max_output_tokens": 30, "ignore_eos": True, "reasoning": {"effort": "low"}}
    status, q = post(f, body, key=KEY)
    assert status == 200, q
    tpm = [k for k in r.keys(f"{prefix}ratelimit:acme:tpm:*")]
    assert tpm and int(r.get(tpm[0])) == 30  # the budget, up front
    done = wait_for(lambda: (lambda g: g if g["status"] != "queued" and g["status"] !=
                             "in_progress" else None)(get(f, f"/v1/responses/{q['id']}", KEY)[1]),
                    "the background response ended", timeout=120)
    assert done["status"] == "incomplete" and done["usage"]["output_tokens"] == 30, done
    from test_compat_api import texts as job_texts
    content, _ = job_texts(job_events(r, prefix, q["id"]))
    assert text_of(done) == content
    assert int(r.get(tpm[0])) == 30  # charged once
    # its events live as long as its record: it is read back from them
    assert 3600 < r.ttl(f"{prefix}out:{q['id']}") <= 7200
    # streamed, and the client leaves after the first event: it runs on
    rid = post_and_hang_up(f.port, "/v1/responses", {**body, "stream": True,
                                                     "max_output_tokens": 200},
                           b"response.created", f"Authorization: Bearer {KEY}\r\n")
    evs = job_events(r, prefix, rid, timeout=120)
    assert evs[-1]["type"] == "done" and evs[-1]["finish_reason"] == "length", evs[-1]
    assert not r.exists(f"{prefix}cancel:{rid}")
    status, back = get(f, f"/v1/responses/{rid}", KEY)
    assert back["status"] == "incomplete" and back["usage"]["output_tokens"] == 200, back
