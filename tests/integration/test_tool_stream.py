"""Tool-call arguments streamed as the model writes them (issue 29, point 4):
end to end through a real redis-server, dispatcher and worker on the model
with the real Qwen3 vocabulary (test_structured.py's fixture, so the JSON
takes many tokens), with the pinned `openai` npm client:

  - chat.completions streamed with tool_choice "required": the call opens
    with one chunk (index, id, type, function.name, arguments ""), then
    comes in >= 2 non-empty argument fragments whose concatenation equals
    the arguments of the job's done event in Redis, parses, and is valid
    for the tool's schema; the worker's delta events carry the same
    fragments (delta.tool_calls) and every event is valid against
    schemas/event.schema.json; the non-streamed answer is unchanged;
  - responses.create({stream: true}) with the same forced tool:
    response.function_call_arguments.delta events (>= 2) concatenate to
    .done's arguments and to the output item's.
"""
import json

import jsonschema

from conftest import connect, job_events, validator
from test_compat_api import node
from test_http import front  # noqa: F401
from test_structured import TOOLS, vocab_model, worker  # noqa: F401

SCRIPT = r"""
const OpenAI = require('openai');
const [base, model, tools] = [process.argv[2], process.argv[3], JSON.parse(process.argv[4])];
const client = new OpenAI({baseURL: base + '/v1', apiKey: 'sk-none', maxRetries: 0});
const req = {model, messages: [{role: 'user', content: 'Weather in Paris?'}], max_tokens: 400,
             temperature: 1.0, seed: 12, tool_choice: 'required', tools,
             chat_template_kwargs: {enable_thinking: false}};
(async () => {
  const out = {chunks: []};
  for await (const c of await client.chat.completions.create({...req, stream: true}))
    out.chunks.push(c);
  out.plain = await client.chat.completions.create(req);
  out.events = [];
  const s = await client.responses.create({input: 'Weather in Paris?', max_output_tokens: 400,
    temperature: 1.0, seed: 12, reasoning: {effort: 'none'}, tool_choice: 'required', stream: true,
    tools: tools.map(x => ({type: 'function', ...x.function}))});
  for await (const e of s)
    out.events.push(e);
  console.log(JSON.stringify(out));
})().catch(e => { console.error(String(e)); process.exit(1); });
"""


def test_tool_arguments_streamed(front, worker, redis_addr, prefix, tmp_path):  # noqa: F811
    f = front()
    schema = TOOLS[0]["function"]["parameters"]
    res = node(f, tmp_path, SCRIPT, json.dumps(TOOLS[:1]), timeout=600)

    # chat completions: the opening chunk, then the fragments
    entries = [t for c in res["chunks"] if c["choices"]
               for t in (c["choices"][0]["delta"].get("tool_calls") or [])]
    assert entries, res["chunks"]
    first = entries[0]
    assert first["index"] == 0 and first["type"] == "function"
    assert first["id"].startswith("call_") and first["function"]["name"] == "get_weather"
    assert first["function"]["arguments"] == ""
    assert all(t["index"] == 0 and "id" not in t and "name" not in t["function"]
               for t in entries[1:])
    frags = [t["function"]["arguments"] for t in entries[1:]]
    assert len([x for x in frags if x]) >= 2, frags
    assert res["chunks"][-1]["choices"][0]["finish_reason"] == "tool_calls"
    args = "".join(frags)
    events = job_events(connect(redis_addr), prefix, res["chunks"][0]["id"])
    v = validator("event.schema.json")
    for e in events:
        v.validate(e)
    (done,) = [e for e in events if e["type"] == "done"]
    assert args == done["tool_calls"][0]["function"]["arguments"]
    jsonschema.validate(json.loads(args), schema)
    # the worker's own fragments, in its delta events, say the same
    wfr = [t for e in events if e["type"] == "delta" for t in e["delta"].get("tool_calls", [])]
    assert len(wfr) >= 2 and wfr[0]["function"]["name"] == "get_weather"
    assert "".join(t["function"]["arguments"] for t in wfr) == args

    # not streamed: one message with the complete call, as before
    (call,) = res["plain"]["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), schema)

    # the Responses API: function_call_arguments.delta per fragment
    evs = res["events"]
    added = [e for e in evs if e["type"] == "response.output_item.added"
             and e["item"]["type"] == "function_call"]
    assert len(added) == 1 and added[0]["item"]["arguments"] == ""
    deltas = [e["delta"] for e in evs if e["type"] == "response.function_call_arguments.delta"]
    assert len([d for d in deltas if d]) >= 2, deltas
    (fin,) = [e for e in evs if e["type"] == "response.function_call_arguments.done"]
    assert "".join(deltas) == fin["arguments"]
    (item,) = [e["item"] for e in evs if e["type"] == "response.output_item.done"
               and e["item"]["type"] == "function_call"]
    assert item["arguments"] == fin["arguments"] and item["name"] == "get_weather"
    jsonschema.validate(json.loads(fin["arguments"]), schema)
    assert evs[-1]["type"] == "response.completed"
