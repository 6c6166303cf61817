"""The Conversations API (dispatcher/convo.h) end to end through a real
redis-server, dispatcher and worker:

  - POST /v1/conversations with items and metadata; GET; POST (metadata);
    items listed in both orders, paged by limit and after; items added
    (ids given), read and deleted one by one; DELETE; each conversation one
    Redis list with its TTL, element 0 its record;
  - bad bodies are 400s naming the field; unknown ids 404; another
    tenant's conversation is not found on every route, nor in a Responses
    request;
  - a Responses request naming a conversation (a string or {"id"}) runs its
    items before the input, echoes it, and adds its input and output items
    to it before the answer's last byte, streamed or not, store or not;
    with previous_response_id, in the background, or unknown: 400s; a
    response made in a conversation keeps only its own turn, and naming
    it in previous_response_id is a 400 that says which conversation;
  - conversation_ttl_s = 0 keeps none and says so.
The openai npm client and the Agents SDK (conversationId and
OpenAIConversationsSession) are test_clients.py's.
"""
import json
import threading

from conftest import connect, job_events, tap
from test_compat_api import responses_sse
from test_http import MODEL_NAME, front  # noqa: F401 (front is a fixture)
from test_responses_store import get, jobs_by_id, text_of

KEY = "sk-test-0123456789"
OTHER = "sk-other-0123456789"


def call(f, method, path, body=None, key=None):
    h = {"Authorization": f"Bearer {key}"} if key else {}
    status, _, data = f.request(method, path, body, headers=h)
    return status, json.loads(data)


def test_conversation_crud(front, workers, redis_addr, prefix):  # noqa: F811
    r = connect(redis_addr)
    f = front()
    status, conv = call(f, "POST", "/v1/conversations", {
        "items": [{"type": "message", "role": "user", "content": "My name is Ada."},
                  {"role": "assistant", "content": [{"type": "output_text", "text": "Hello Ada."}]}],
        "metadata": {"topic": "names"}})
    assert status == 200, conv
    cid = conv["id"]
    assert cid.startswith("conv_") and conv["object"] == "conversation"
    assert conv["metadata"] == {"topic": "names"} and conv["created_at"] > 1.7e9
    key = f"{prefix}conversation:{cid}"
    assert r.type(key) == "list" and r.llen(key) == 3 and 0 < r.ttl(key) <= 2592000
    assert json.loads(r.lindex(key, 0))["owner"] == ""
    assert call(f, "GET", f"/v1/conversations/{cid}") == (200, conv)
    status, upd = call(f, "POST", f"/v1/conversations/{cid}", {"metadata": {"topic": "ada"}})
    assert status == 200 and upd == {**conv, "metadata": {"topic": "ada"}}
    # items: as the API lists them (a type, content parts, an id), newest first
    status, page = call(f, "GET", f"/v1/conversations/{cid}/items")
    assert status == 200 and page["object"] == "list" and page["has_more"] is False
    first, second = page["data"][::-1]
    assert first["type"] == "message" and first["role"] == "user"
    assert first["content"] == [{"type": "input_text", "text": "My name is Ada."}]
    assert second["content"] == [{"type": "output_text", "text": "Hello Ada."}]
    assert first["id"].startswith("msg_") and first["id"] != second["id"]
    # added: their ids in the answer, then paged in order
    status, added = call(f, "POST", f"/v1/conversations/{cid}/items", {"items": [
        {"type": "message", "role": "user", "content": f"Note {i}."} for i in range(3)]})
    assert status == 200 and len(added["data"]) == 3 and added["has_more"] is False
    ids = [first["id"], second["id"]] + [i["id"] for i in added["data"]]
    status, page = call(f, "GET", f"/v1/conversations/{cid}/items?order=asc&limit=2")
    assert [i["id"] for i in page["data"]] == ids[:2] and page["has_more"] is True
    assert page["first_id"] == ids[0] and page["last_id"] == ids[1]
    status, page = call(f, "GET",
                        f"/v1/conversations/{cid}/items?order=asc&limit=2&after={ids[1]}")
    assert [i["id"] for i in page["data"]] == ids[2:4] and page["has_more"] is True
    for q, param in (("limit=0", "limit"), ("order=up", "order"), ("after=nope", "after")):
        status, err = call(f, "GET", f"/v1/conversations/{cid}/items?{q}")
        assert status == 400 and err["error"]["param"] == param, err
    # one item: read, deleted (the answer is the conversation), gone
    assert call(f, "GET", f"/v1/conversations/{cid}/items/{ids[2]}") == (200, added["data"][0])
    status, c = call(f, "DELETE", f"/v1/conversations/{cid}/items/{ids[2]}")
    assert status == 200 and c["id"] == cid and c["object"] == "conversation"
    status, err = call(f, "GET", f"/v1/conversations/{cid}/items/{ids[2]}")
    assert status == 404 and err["error"]["param"] == "item_id"
    assert r.llen(key) == 5
    # bad bodies: 400 naming what is wrong
    for body, param in (({"items": "x"}, "items"), ({"items": [{"role": 1, "content": "x"}]},
                                                     "items[0]"),
                        ({"items": [{"type": "message", "content": "x"}]}, "items[0]"),
                        ({"items": [{"role": "user", "content": "x"}] * 21}, "items"),
                        ({"metadata": {"a": 1}}, "metadata")):
        status, err = call(f, "POST", "/v1/conversations", body)
        assert status == 400 and err["error"]["param"] == param, (body, err)
    status, err = call(f, "POST", f"/v1/conversations/{cid}", {"metadata": "x"})
    assert status == 400 and err["error"]["param"] == "metadata"
    # the paths and methods the API has, and no others
    assert call(f, "PUT", f"/v1/conversations/{cid}")[0] == 405
    assert call(f, "GET", "/v1/conversations")[0] == 405
    assert call(f, "GET", f"/v1/conversations/{cid}/other")[0] == 404
    assert call(f, "GET", f"/v1/conversations/{cid}/items/a/b")[0] == 404
    assert call(f, "GET", "/v1/conversations/" + "x" * 300)[0] == 404
    # deleted: gone from Redis, then 404 everywhere
    status, d = call(f, "DELETE", f"/v1/conversations/{cid}")
    assert status == 200 and d == {"id": cid, "object": "conversation.deleted", "deleted": True}
    assert not r.exists(key)
    for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/items"),
                         ("GET", f"/items/{ids[0]}")):
        status, err = call(f, method, f"/v1/conversations/{cid}{path}")
        assert status == 404, (method, path, err)
    status, err = call(f, "POST", f"/v1/conversations/{cid}/items",
                       {"items": [{"role": "user", "content": "late"}]})
    assert status == 404 and not r.exists(key)  # not made again by the add


def test_conversations_belong_to_their_tenant(front, workers, redis_addr, prefix,  # noqa: F811
                                              tmp_path):
    workers("w1")
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY} acme\n{OTHER} beta\n")
    f = front("--api-keys-file", str(keys))
    status, conv = call(f, "POST", "/v1/conversations",
                        {"items": [{"role": "user", "content": "secret"}]}, key=KEY)
    assert status == 200, conv
    cid = conv["id"]
    status, page = call(f, "GET", f"/v1/conversations/{cid}/items", key=KEY)
    item = page["data"][0]["id"]
    for method, path, body in (("GET", "", None), ("POST", "", {"metadata": {}}),
                               ("DELETE", "", None), ("GET", "/items", None),
                               ("POST", "/items", {"items": [{"role": "user", "content": "x"}]}),
                               ("GET", f"/items/{item}", None), ("DELETE", f"/items/{item}", None)):
        status, err = call(f, method, f"/v1/conversations/{cid}{path}", body, key=OTHER)
        assert status == 404, (method, path, err)
    status, err = call(f, "POST", "/v1/responses", {"model": MODEL_NAME, "input": "x",
                                                   "conversation": cid}, key=OTHER)
    assert status == 400 and err["error"]["param"] == "conversation", err
    assert call(f, "GET", f"/v1/conversations/{cid}")[0] == 401
    status, page = call(f, "GET", f"/v1/conversations/{cid}/items", key=KEY)
    assert status == 200 and len(page["data"]) == 1  # untouched


def test_responses_in_a_conversation(front, workers, redis_addr, prefix):  # noqa: F811
    r = connect(redis_addr)
    tap(r, f"{prefix}jobs:fast", f"{prefix}jobs:think")  # jobs stay readable
    workers("w1")
    f = front()
    fast = {"model": MODEL_NAME, "max_output_tokens": 5, "reasoning": {"effort": "low"}}
    status, conv = call(f, "POST", "/v1/conversations",
                        {"items": [{"role": "user", "content": "My name is Ada."}]})
    cid = conv["id"]
    # a turn: the conversation's items, then the input; the answer says where
    status, r1 = call(f, "POST", "/v1/responses", {**fast, "input": "Hi", "conversation": cid})
    assert status == 200, r1
    assert r1["conversation"] == {"id": cid}
    assert jobs_by_id(r, prefix)[r1["id"]]["messages"] == [
        {"role": "user", "content": "My name is Ada."}, {"role": "user", "content": "Hi"}]
    status, page = call(f, "GET", f"/v1/conversations/{cid}/items?order=asc")
    data = page["data"]
    assert [(i["type"], i["role"]) for i in data] == [("message", "user")] * 2 + [
        ("message", "assistant")]
    assert data[1]["content"] == [{"type": "input_text", "text": "Hi"}]
    assert data[2]["id"] == r1["output"][0]["id"]  # the response's own output item
    # streamed, by {"id"}: the first turn is in its job; added before the end
    evs = responses_sse(f, {**fast, "input": [{"role": "user", "content": "Again."}],
                            "conversation": {"id": cid}, "stream": True})
    r2 = evs[-1]["response"]
    assert r2["conversation"] == {"id": cid}
    assert [m["content"] for m in jobs_by_id(r, prefix)[r2["id"]]["messages"]] == [
        "My name is Ada.", "Hi", text_of(r1), "Again."]
    # store false: kept nowhere as a response, but the conversation has it
    status, r3 = call(f, "POST", "/v1/responses", {**fast, "input": "Third.",
                                                   "conversation": cid, "store": False})
    assert status == 200 and r3["store"] is False
    assert not r.exists(f"{prefix}response:{r3['id']}")
    status, page = call(f, "GET", f"/v1/conversations/{cid}/items?order=asc&limit=100")
    assert len(page["data"]) == 7 and page["data"][-1]["id"] == r3["output"][0]["id"]
    # its stored response keeps its own turn, and names the conversation
    rec = json.loads(r.get(f"{prefix}response:{r1['id']}"))
    assert rec["conversation"] == cid and len(rec["turn"]) == 1 and "input" not in rec
    # named as a previous_response_id: the conversation as it was then (its
    # first item), then its turn, then the new input; that record whole
    status, r4 = call(f, "POST", "/v1/responses", {**fast, "input": "x",
                                                  "previous_response_id": r1["id"]})
    assert status == 200 and r4["previous_response_id"] == r1["id"], r4
    assert [m["content"] for m in jobs_by_id(r, prefix)[r4["id"]]["messages"]] == [
        "My name is Ada.", "Hi", text_of(r1), "x"]
    rec4 = json.loads(r.get(f"{prefix}response:{r4['id']}"))
    assert len(rec4["input"]) == 4 and "chain" not in rec4 and "conversation" not in rec4
    status, items = get(f, f"/v1/responses/{r1['id']}/input_items")
    assert status == 200 and len(items["data"]) == 1  # its own input; the rest is cid's
    # what a conversation cannot be given with
    for extra, param in (({"previous_response_id": r1["id"]}, "conversation"),
                         ({"conversation": "conv_nope"}, "conversation"),
                         ({"conversation": 7}, "conversation")):
        status, err = call(f, "POST", "/v1/responses",
                           {**fast, "input": "x", "conversation": cid, **extra})
        assert status == 400 and err["error"]["param"] == param, (extra, err)
    status, err = call(f, "POST", "/v1/responses", {**fast, "input": "x",
                                                   "conversation": "conv_nope"})
    assert err["error"]["message"] == "Conversation with id 'conv_nope' not found."
    assert r.llen(f"{prefix}conversation:{cid}") == 8  # nothing added by the refusals
    # the conversation gone: its responses have nothing to continue, said by name
    assert call(f, "DELETE", f"/v1/conversations/{cid}")[0] == 200
    status, err = call(f, "POST", "/v1/responses", {**fast, "input": "x",
                                                   "previous_response_id": r1["id"]})
    assert status == 400 and err["error"]["code"] == "previous_response_not_found", err
    assert cid in err["error"]["message"]


def test_a_background_response_in_a_conversation(front, workers, redis_addr,  # noqa: F811
                                                  prefix):
    """Its turn is added once, by the read that finds it ended and finishes
    its record, however many reads find it so at once."""
    r = connect(redis_addr)
    workers("w1")
    f = front()
    status, conv = call(f, "POST", "/v1/conversations",
                        {"items": [{"role": "user", "content": "My name is Ada."}]})
    cid = conv["id"]
    status, q = call(f, "POST", "/v1/responses", {
        "model": MODEL_NAME, "input": "Tell me a story.", "conversation": cid,
        "background": True, "max_output_tokens": 12, "ignore_eos": True,
        "reasoning": {"effort": "low"}})
    assert status == 200 and q["status"] == "queued" and q["conversation"] == {"id": cid}, q
    job_events(r, prefix, q["id"], timeout=120)  # ended, as Redis says; nobody read it yet
    assert r.llen(f"{prefix}conversation:{cid}") == 2  # not before a read finishes it
    # many reads at once, each on a connection of its own opened before,
    # sent together: several find the record running and finish it; the
    # turn must be added once all the same
    got, start = [], threading.Barrier(12)

    def read():
        c = f.conn()
        c.connect()
        start.wait()
        c.request("GET", f"/v1/responses/{q['id']}")
        resp = c.getresponse()
        got.append((resp.status, json.loads(resp.read())))
        c.close()
    threads = [threading.Thread(target=read) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(s == 200 and o["status"] == "incomplete" for s, o in got), got
    status, page = call(f, "GET", f"/v1/conversations/{cid}/items?order=asc")
    data = page["data"]
    assert [i["role"] for i in data] == ["user", "user", "assistant"], data
    assert data[1]["content"] == [{"type": "input_text", "text": "Tell me a story."}]
    assert data[2]["id"] == got[0][1]["output"][-1]["id"]
    call(f, "GET", f"/v1/responses/{q['id']}")
    assert r.llen(f"{prefix}conversation:{cid}") == 4  # once


def test_no_conversations_kept(front, workers, redis_addr, prefix):  # noqa: F811
    f = front("--conversation-ttl-s", "0")
    status, err = call(f, "POST", "/v1/conversations", {})
    assert status == 404 and "conversation_ttl_s = 0" in err["error"]["message"], err
    status, err = call(f, "POST", "/v1/responses", {"model": MODEL_NAME, "input": "x",
                                                   "conversation": "conv_x"})
    assert status == 400 and "conversation_ttl_s = 0" in err["error"]["message"], err


def test_conversation_bounds(front, workers, redis_addr, prefix, tmp_path):  # noqa: F811
    """What one client can put into Redis: a request adds at most
    responses_store_max_kb, a conversation holds at most 16 times that, and
    writes count against the tenant's requests per minute."""
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY} acme 1000 100000\n{OTHER} beta 3 100000\n")
    f = front("--api-keys-file", str(keys), "--responses-store-max-kb", "1")
    status, conv = call(f, "POST", "/v1/conversations", {}, key=KEY)
    cid = conv["id"]
    note = {"role": "user", "content": "x" * 800}  # ~0.9 KiB with its id
    status, err = call(f, "POST", f"/v1/conversations/{cid}/items", {"items": [note, note]},
                       key=KEY)
    assert status == 400 and "responses_store_max_kb" in err["error"]["message"], err
    added = 0
    while True:
        status, got = call(f, "POST", f"/v1/conversations/{cid}/items", {"items": [note]},
                           key=KEY)
        if status != 200:
            break
        added += 1
        assert added < 30, "no bound on the conversation"
    assert status == 400 and "may hold 16 KiB" in got["error"]["message"], got
    assert 15 <= added <= 18, added
    assert connect(redis_addr).llen(f"{prefix}conversation:{cid}") == added + 1
    # beta's writes count against its 3 requests a minute; its reads do not
    codes = [call(f, "POST", "/v1/conversations", {}, key=OTHER)[0] for _ in range(4)]
    assert codes == [200, 200, 200, 429], codes
