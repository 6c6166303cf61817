// tests/bench/llama/bench.mjs - llama.cpp's speed on this machine, for the
// ratios issue 28 asks (redlm against the engine inside Ollama), through
// node-llama-cpp's prebuilt CPU build (pinned in package.json): the same
// GGUF file redlm reads, the same threads, the same shape.
//   node bench.mjs FILE.gguf [--threads 2] [--batch 16] [--prompt 512] [--gen 64]
// Prints one JSON line: prefill tok/s (every prompt but its last token, the
// sequences side by side) and decode tok/s (then G tokens a sequence from
// its last prompt token, all sequences together), greedy.
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
const context = await model.createContext({ sequences: B, contextSize: P + G + 8, batchSize: 512,
                                            threads });
const vocab = model.tokens?.vocabularySize ?? 151936;
let seed = 7;
const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
const prompts = Array.from({ length: B }, () => Array.from({ length: P }, () => 16 + Math.floor(rnd() * 5000)));

// prefill: every prompt but its last token, the sequences side by side
// (node-llama-cpp batches what they evaluate at the same time)
const seqs = prompts.map(() => context.getSequence());
const t0 = performance.now();
await Promise.all(seqs.map((seq, i) => seq.evaluateWithoutGeneratingNewTokens(prompts[i].slice(0, P - 1))));
const t1 = performance.now();
// decode: from each prompt's last token, G tokens each, greedy
let generated = 0;
await Promise.all(seqs.map(async (seq, i) => {
  let n = 0;
  for await (const tok of seq.evaluate([prompts[i][P - 1]], { temperature: 0 })) {
    generated++;
    if (++n >= G) break;
  }
}));
const t2 = performance.now();
console.log(JSON.stringify({
  engine: "llama.cpp (node-llama-cpp " + (llama.buildType ?? "") + ")", llama_cpp: llama.llamaCppRelease?.release,
  file, threads, batch: B, prompt: P, gen: G,
  prefill_tok_s: (B * (P - 1)) / ((t1 - t0) / 1000),
  decode_tok_s: generated / ((t2 - t1) / 1000),
  vocab,
}));
await context.dispose();
await model.dispose();
