// tests/integration/node-clients/agents.mjs - the OpenAI Agents SDK with its
// default API (Responses) against the front door, as its quick start
// writes it, pointed at redlm with setDefaultOpenAIClient.
//   node agents.mjs BASE_URL MODEL
// The agents answer in typed outputs (outputType): the random test model
// never ends free text by itself, and an answer cut at max_output_tokens is
// "response.incomplete", which the SDK rightly treats as a failed run.
import OpenAI from "openai";
import { Agent, run, setDefaultOpenAIClient, setTracingDisabled, tool } from "@openai/agents";
import { z } from "zod";

const [baseURL, model] = process.argv.slice(2);
setDefaultOpenAIClient(new OpenAI({ baseURL, apiKey: "sk-test-0123456789" }));
setTracingDisabled(true); // traces go to api.openai.com otherwise

const out = {};
const Answer = z.object({ answer: z.string().max(30) });
const agent = new Agent({ name: "Assistant", instructions: "You are a helpful assistant.", model,
                          outputType: Answer, modelSettings: { maxTokens: 200 } });
const r1 = await run(agent, "Say hello.");
out.run = { output: r1.finalOutput, id: r1.rawResponses?.[0]?.responseId, usage: r1.rawResponses?.[0]?.usage };

// the next turn chained on the stored response, as the SDK's docs show it:
// only the new input is sent
const r2 = await run(agent, "Say it again.", { previousResponseId: r1.lastResponseId });
out.chained = { output: r2.finalOutput, id: r2.lastResponseId, previous: r1.lastResponseId };

const streamed = await run(agent, "Count to five.", { stream: true });
let text = "", deltas = 0;
for await (const ev of streamed) {
  if (ev.type === "raw_model_stream_event" && ev.data?.type === "output_text_delta") {
    text += ev.data.delta;
    deltas++;
  }
}
await streamed.completed;
out.stream = { text, deltas, output: streamed.finalOutput, id: streamed.rawResponses?.[0]?.responseId };

const calls = [];
const weather = tool({
  name: "weather", description: "The weather in a city",
  parameters: z.object({ city: z.string().max(20), days: z.number().int().min(1).max(7) }),
  execute: async (args) => { calls.push(args); return "sunny"; },
});
const toolAgent = new Agent({ name: "Forecaster", instructions: "Answer with the weather tool.", model,
                              tools: [weather], modelSettings: { toolChoice: "required", maxTokens: 120 },
                              toolUseBehavior: "stop_on_first_tool" });
const r3 = await run(toolAgent, "What is the weather in Paris?");
out.tools = { calls, final: r3.finalOutput };

const Person = z.object({ name: z.string().max(20), age: z.number().int().positive().max(150),
                          role: z.enum(["admin", "user", "guest"]), tags: z.array(z.string().max(8)).max(3) });
const typed = new Agent({ name: "Inventor", instructions: "Invent a person.", model, outputType: Person,
                          modelSettings: { maxTokens: 200 } });
out.structured = (await run(typed, "Invent a person.")).finalOutput;
console.log(JSON.stringify(out));
