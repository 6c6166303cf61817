// tests/integration/node-clients/langchain.mjs - LangChain's ChatOpenAI
// against the front door, as its users write it (test_clients.py checks).
//   node langchain.mjs BASE_URL MODEL [responses]
// "responses": useResponsesApi (the Responses API), else Chat Completions.
import { ChatOpenAI } from "@langchain/openai";
import { tool } from "@langchain/core/tools";
import { z } from "zod";

const [baseURL, model, api] = process.argv.slice(2);
const llm = new ChatOpenAI({ model, apiKey: "sk-test-0123456789", configuration: { baseURL },
                             maxTokens: 12, useResponsesApi: api === "responses" });
const out = {};
console.error("langchain: invoke");
const msg = await llm.invoke("Say hello.");
out.invoke = { text: msg.text, id: msg.id, usage: msg.usage_metadata,
               finish: msg.response_metadata?.finish_reason ?? msg.response_metadata?.status };

console.error("langchain: stream");
let streamed = "", chunks = 0, sid = null;
for await (const c of await llm.stream("Count to five.")) {
  streamed += c.text;
  chunks++;
  sid = sid || c.id;
}
out.stream = { text: streamed, chunks, id: sid };

const Person = z.object({
  name: z.string().max(20),
  age: z.number().int().positive().max(150),
  role: z.enum(["admin", "user", "guest"]),
  tags: z.array(z.string().max(8)).max(3),
});
const structured = new ChatOpenAI({ model, apiKey: "sk-test-0123456789", configuration: { baseURL },
                                    maxTokens: 200, useResponsesApi: api === "responses" })
  .withStructuredOutput(Person, { name: "person" });
console.error("langchain: withStructuredOutput");
out.structured = await structured.invoke("Invent a person.");

const weather = tool(async ({ city, days }) => `sunny in ${city} for ${days} days`, {
  name: "weather", description: "The weather in a city",
  schema: z.object({ city: z.string().max(20), days: z.number().int().min(1).max(7) }),
});
const withTools = new ChatOpenAI({ model, apiKey: "sk-test-0123456789", configuration: { baseURL },
                                   maxTokens: 120, useResponsesApi: api === "responses" })
  .bindTools([weather], { tool_choice: "required" });
console.error("langchain: bindTools");
const tc = await withTools.invoke("What is the weather in Paris?");
out.tools = tc.tool_calls.map((c) => ({ name: c.name, args: c.args, id: c.id }));
out.toolsText = tc.text;
out.toolsId = tc.id;
console.log(JSON.stringify(out));
