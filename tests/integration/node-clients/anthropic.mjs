// tests/integration/node-clients/anthropic.mjs - Anthropic's TypeScript SDK
// and the AI SDK's Anthropic provider against the front door's Messages API
// (POST /v1/messages), the way their users point them at a local server
// (ANTHROPIC_BASE_URL). tests/integration/test_anthropic.py runs it and
// checks the answers against Redis.
//   node anthropic.mjs BASE_URL MODEL     (BASE_URL ends in /v1)
// Prints one JSON object: what each call returned.
import Anthropic from "@anthropic-ai/sdk";
import { createAnthropic } from "@ai-sdk/anthropic";
import { generateText, streamText, tool, stepCountIs } from "ai";
import { z } from "zod";

const [baseURL, model] = process.argv.slice(2);
const apiKey = "sk-test-0123456789";
// Anthropic's SDK adds /v1/messages to its base; the AI SDK's provider
// adds /messages to a base that ends in /v1
const client = new Anthropic({ baseURL: baseURL.replace(/\/v1$/, ""), apiKey, maxRetries: 0 });
const out = {};

// the models the SDK pages through (GET /v1/models, Anthropic's shape)
out.models = [];
for await (const m of client.models.list()) out.models.push({ id: m.id, type: m.type, name: m.display_name });

out.create = await client.messages.create({
  model, max_tokens: 8, system: "Be brief.", thinking: { type: "disabled" },
  messages: [{ role: "user", content: "Tell me a story about a cat." }],
});

// a stream with thinking on and a budget: the SDK's own accumulator
const s = client.messages.stream({
  model, max_tokens: 10, thinking: { type: "enabled", budget_tokens: 4 },
  messages: [{ role: "user", content: [{ type: "text", text: "Hi" }, { type: "text", text: " there" }] }],
});
out.events = [];
out.streamedText = "";
out.streamedThinking = "";
s.on("streamEvent", (ev) => out.events.push(ev.type));
s.on("text", (t) => { out.streamedText += t; });
s.on("thinking", (t) => { out.streamedThinking += t; });
out.stream = await s.finalMessage();

// a forced tool, then the tool's result sent back as Claude's clients do
const tools = [{
  name: "get_weather", description: "The weather in a city",
  input_schema: { type: "object", properties: { city: { type: "string", maxLength: 20 } },
                  required: ["city"], additionalProperties: false },
}];
const ask = { role: "user", content: "What is the weather in Paris?" };
out.tool = await client.messages.create({
  model, max_tokens: 120, tools, tool_choice: { type: "tool", name: "get_weather" },
  thinking: { type: "disabled" }, messages: [ask],
});
const use = out.tool.content.find((b) => b.type === "tool_use");
out.toolResult = await client.messages.create({
  model, max_tokens: 6, tools, thinking: { type: "disabled" },
  messages: [ask, { role: "assistant", content: out.tool.content },
             { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "sunny" }] }],
});
// the same forced tool, streamed: input_json_delta fragments
const ts = client.messages.stream({
  model, max_tokens: 120, tools, tool_choice: { type: "any" },
  thinking: { type: "disabled" }, messages: [ask],
});
out.inputJson = "";
ts.on("inputJson", (frag) => { out.inputJson += frag; });
out.toolStream = await ts.finalMessage();

for (const [name, body] of [
  ["image", { model, max_tokens: 4, messages: [{ role: "user", content: [
    { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } }] }] }],
  ["server_tool", { model, max_tokens: 4, messages: [ask],
    tools: [{ type: "web_search_20250305", name: "web_search" }] }],
  ["model", { model: "no-such-model", max_tokens: 4, messages: [ask] }],
]) {
  try {
    await client.messages.create(body);
    out[name] = "accepted";
  } catch (e) {
    out[name] = { status: e.status, type: e.error?.error?.type, message: e.error?.error?.message,
                  cls: e.constructor.name };
  }
}

// the AI SDK's Anthropic provider
const provider = createAnthropic({ baseURL, apiKey });
const gt = await generateText({ model: provider(model), prompt: "Say hello.", maxOutputTokens: 12 });
out.generateText = { text: gt.text, finishReason: gt.finishReason, usage: gt.usage,
                     id: gt.response?.id };
const st = streamText({ model: provider(model), prompt: "Count to five.", maxOutputTokens: 12 });
let streamed = "", parts = 0;
for await (const d of st.textStream) { streamed += d; parts++; }
out.streamText = { text: streamed, parts, finishReason: await st.finishReason, usage: await st.usage,
                   id: (await st.response)?.id };
const calls = [];
const withTool = await generateText({
  model: provider(model), toolChoice: "required", stopWhen: stepCountIs(1),
  prompt: "What is the weather in Paris?", maxOutputTokens: 120,
  tools: {
    weather: tool({
      description: "The weather in a city",
      inputSchema: z.object({ city: z.string().max(20), days: z.number().int().min(1).max(7) }),
      execute: async (args) => { calls.push(args); return { forecast: "sunny" }; },
    }),
  },
});
out.aiTools = { calls, toolCalls: withTool.toolCalls.map((c) => ({ name: c.toolName, input: c.input })),
                finishReason: withTool.finishReason };
console.log(JSON.stringify(out));
