// tests/bench/llama/bench.mjs - llama.cpp's speed on this machine, for the
// ratios issue 28 asks (redlm against the engine inside Ollama), through
// node-llama-cpp's prebuilt CPU build (pinned in package.json): the same
// GGUF file redlm reads, the same threads, the same shape.
//   node bench.mjs FILE.gguf [--threads 2] [--batch 16] [--prompt 512] [--gen 64]
// Prints one JSON line: prefill tok/s (all sequences' prompts, in parallel)
// and decode tok/s (every sequence's generated tokens after its first,
// over the time from the last first token to the end), greedy.
import { getLlama } from "node-llama-cpp";

const args = process.argv.slice(2);
const file = args[0];
const opt = (name, dflt) => {
  const i = args.indexOf("--" + name);
  return i >= 0 ? Number(args[i + 1]) : dflt;
};
const threads = opt("threads", 2), B = opt("batch", 16), P = opt("prompt", 512), G = opt("gen", 64);

const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath: file });
const context = await model.createContext({ sequences: B, contextSize: B * (P + G + 8), batchSize: 512,
                                            threads });
const vocab = model.tokens?.vocabularySize ?? 151936;
let seed = 7;
const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
const prompts = Array.from({ length: B }, () => Array.from({ length: P }, () => 16 + Math.floor(rnd() * 5000)));

const t0 = performance.now();
const firsts = [];
let generated = 0;
await Promise.all(prompts.map(async (p) => {
  const seq = context.getSequence();
  let n = 0;
  for await (const tok of seq.evaluate(p, { temperature: 0 })) {
    if (n === 0) firsts.push(performance.now());
    n++;
    generated++;
    if (n >= G) break;
  }
}));
const t1 = performance.now();
const tFirst = Math.max(...firsts);
console.log(JSON.stringify({
  engine: "llama.cpp (node-llama-cpp " + (llama.buildType ?? "") + ")", llama_cpp: llama.llamaCppRelease?.release,
  file, threads, batch: B, prompt: P, gen: G,
  prefill_tok_s: (B * P) / ((tFirst - t0) / 1000),
  decode_tok_s: (generated - B) / ((t1 - tFirst) / 1000),
  vocab,
}));
await context.dispose();
await model.dispose();
