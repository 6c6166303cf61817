// tests/integration/node-clients/rerank.mjs - reranking as its users call it,
// against the front door's POST /v2/rerank (Cohere's API as vLLM serves it):
// the AI SDK's rerank() with @ai-sdk/cohere's reranking model (baseURL .../v2:
// it posts to .../v2/rerank and checks the answer with its zod schema), and
// Cohere's own TypeScript SDK (CohereClientV2.rerank, baseUrl the front door:
// its fern serializers check the answer). tests/integration/test_rerank.py
// checks what they return.
//   node rerank.mjs BASE_URL MODEL
// Prints one JSON object: each client's ranking.
import { rerank } from "ai";
import { createCohere } from "@ai-sdk/cohere";
import { CohereClientV2 } from "cohere-ai";

const [baseURL, modelName] = process.argv.slice(2);
const apiKey = "sk-test-0123456789";
const documents = ["alpha", "beta", "gamma", "delta", "epsilon"];
const query = "which letter?";
const out = {};

const cohere = createCohere({ baseURL: `${baseURL}/v2`, apiKey });
const r = await rerank({ model: cohere.reranking(modelName), query, documents, topN: 3,
                         maxRetries: 0 });
out.aisdk = r.ranking.map((x) => ({ index: x.originalIndex, score: x.score, document: x.document }));
out.aisdkAll = (await rerank({ model: cohere.reranking(modelName), query, documents,
                               maxRetries: 0 })).ranking.map((x) => x.originalIndex);

const client = new CohereClientV2({ token: apiKey, baseUrl: baseURL });
const c = await client.rerank({ model: modelName, query, documents, topN: 3 });
out.cohere = { id: c.id, results: c.results.map((x) => ({ index: x.index, score: x.relevanceScore })) };
// an error the server gives is the client's error, with its status
try {
  await client.rerank({ model: modelName, query, documents: [] });
  out.emptyError = null;
} catch (e) {
  out.emptyError = { status: e.statusCode ?? e.status ?? null, message: String(e.message) };
}
console.log(JSON.stringify(out));
