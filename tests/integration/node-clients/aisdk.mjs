// tests/integration/node-clients/aisdk.mjs - the AI SDK (`ai`) against the
// front door, the way its users write it (tests/integration/test_clients.py
// runs it and checks the answers against Redis).
//   node aisdk.mjs BASE_URL MODEL PROVIDER
// PROVIDER: "compatible" = @ai-sdk/openai-compatible (Chat Completions), or
// "openai" = @ai-sdk/openai's default, which speaks the Responses API.
// Prints one JSON object: what each call returned.
import { generateObject, generateText, streamText, tool, stepCountIs } from "ai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { createOpenAI } from "@ai-sdk/openai";
import { z } from "zod";

const [baseURL, modelName, provider] = process.argv.slice(2);
const apiKey = "sk-test-0123456789";
const model = provider === "openai"
  ? createOpenAI({ baseURL, apiKey })(modelName)                 // openai(model): the Responses API
  : createOpenAICompatible({ name: "redlm", baseURL, apiKey, supportsStructuredOutputs: true, includeUsage: true })(modelName);

const out = {};
const text = await generateText({ model, prompt: "Say hello.", maxOutputTokens: 12 });
out.generateText = { text: text.text, finishReason: text.finishReason, usage: text.usage,
                     id: text.response?.id };

const st = streamText({ model, prompt: "Count to five.", maxOutputTokens: 12 });
let streamed = "", parts = 0;
for await (const delta of st.textStream) { streamed += delta; parts++; }
out.streamText = { text: streamed, parts, finishReason: await st.finishReason, usage: await st.usage,
                   id: (await st.response)?.id };

// zod 4 schemas with what the SDK's users put in them: .int() (+-2^53-1
// bounds), .positive() (exclusiveMinimum), enums, optional, arrays
const Person = z.object({
  name: z.string().max(20),
  age: z.number().int().positive().max(150),
  role: z.enum(["admin", "user", "guest"]),
  tags: z.array(z.string().max(8)).max(3),
  email: z.string().email().optional(),
});
const obj = await generateObject({ model, schema: Person, prompt: "Invent a person.", maxOutputTokens: 200 });
out.generateObject = { object: obj.object, finishReason: obj.finishReason };

const calls = [];
const tools = {
  weather: tool({
    description: "The weather in a city",
    inputSchema: z.object({ city: z.string().max(20), days: z.number().int().min(1).max(7) }),
    execute: async (args) => { calls.push(args); return { forecast: "sunny" }; },
  }),
};
const withTool = await generateText({ model, tools, toolChoice: "required", stopWhen: stepCountIs(1),
                                      prompt: "What is the weather in Paris?", maxOutputTokens: 120 });
out.tools = { calls, toolCalls: withTool.toolCalls.map((c) => ({ name: c.toolName, input: c.input })),
              finishReason: withTool.finishReason };
console.log(JSON.stringify(out));
