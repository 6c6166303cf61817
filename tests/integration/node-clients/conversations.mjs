// tests/integration/node-clients/conversations.mjs - the Conversations API
// as the openai npm client and the OpenAI Agents SDK drive it: the client's
// own calls (create, retrieve, update, items create / list with its
// auto-pagination / retrieve / delete, delete), a Responses request in a
// conversation, an agent run with conversationId, and an agent with
// OpenAIConversationsSession (two runs on one session, its items, clear).
//   node conversations.mjs BASE_URL MODEL
import OpenAI from "openai";
import { Agent, OpenAIConversationsSession, run, setDefaultOpenAIClient, setTracingDisabled }
  from "@openai/agents";
import { z } from "zod";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "sk-test-0123456789" });
setDefaultOpenAIClient(client);
setTracingDisabled(true); // traces go to api.openai.com otherwise

const out = {};
const ids = async (id, query) => {
  const all = [];
  for await (const it of client.conversations.items.list(id, query)) all.push(it);
  return all;
};
const conv = await client.conversations.create({
  items: [{ type: "message", role: "user", content: "My name is Ada." }],
  metadata: { topic: "names" },
});
out.created = conv;
out.retrieved = await client.conversations.retrieve(conv.id);
out.updated = await client.conversations.update(conv.id, { metadata: { topic: "ada" } });
const added = await client.conversations.items.create(conv.id, {
  items: [{ type: "message", role: "user", content: "Note one." },
          { type: "message", role: "user", content: "Note two." }],
});
out.added = added.data.map((i) => i.id);
// pages of one item: the client follows has_more and after by itself
out.paged = (await ids(conv.id, { order: "asc", limit: 1 })).map((i) => i.id);
out.item = await client.conversations.items.retrieve(added.data[0].id, { conversation_id: conv.id });
out.afterItemDelete = await client.conversations.items.delete(added.data[0].id,
                                                               { conversation_id: conv.id });
const r = await client.responses.create({ model, input: "Hi", conversation: conv.id,
                                          max_output_tokens: 5, reasoning: { effort: "low" } });
out.response = { id: r.id, conversation: r.conversation, output: r.output.map((i) => i.id) };
out.items = (await ids(conv.id, { order: "asc" })).map((i) => ({ id: i.id, type: i.type, role: i.role }));

// the Agents SDK: a run in the conversation by its id
const Answer = z.object({ answer: z.string().max(30) });
const agent = new Agent({ name: "Assistant", instructions: "You are a helpful assistant.", model,
                          outputType: Answer, modelSettings: { maxTokens: 200 } });
const a1 = await run(agent, "Say hello.", { conversationId: conv.id });
out.agentRun = { id: a1.lastResponseId, output: a1.finalOutput };
out.itemsAfterRun = (await ids(conv.id, { order: "asc" })).length;

// and with a session kept in a conversation of its own
const session = new OpenAIConversationsSession({ client });
const s1 = await run(agent, "Say hello.", { session });
const s2 = await run(agent, "Say it again.", { session });
const sid = await session.getSessionId();
out.session = { id: sid, first: s1.lastResponseId, second: s2.lastResponseId,
                output: s2.finalOutput, items: (await session.getItems()).length,
                stored: (await ids(sid, { order: "asc" })).map((i) => ({ type: i.type, role: i.role })) };
await session.clearSession();
out.session.cleared = await client.conversations.retrieve(sid).then(() => 200, (e) => e.status);
out.deleted = await client.conversations.delete(conv.id);
console.log(JSON.stringify(out));
