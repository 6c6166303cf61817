// tests/integration/node-clients/embeddings.mjs - the embedding calls of the
// AI SDK (embed, embedMany with @ai-sdk/openai's embedding model: encoding_format
// "float") and of LangChain (OpenAIEmbeddings: the openai client underneath asks
// for base64 and decodes it), against the front door's POST /v1/embeddings, as
// their users write them (tests/integration/test_embeddings.py checks).
//   node embeddings.mjs BASE_URL MODEL
// Prints one JSON object: the vectors each call returned.
import { embed, embedMany } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { OpenAIEmbeddings } from "@langchain/openai";

const [baseURL, modelName] = process.argv.slice(2);
const apiKey = "sk-test-0123456789";
const texts = ["The cat sat on the mat.", "A dog barked.", "Rain again today."];
const out = {};

const openai = createOpenAI({ baseURL, apiKey });
const model = openai.embedding(modelName);
const many = await embedMany({ model, values: texts, maxRetries: 0 });
out.aisdk = { embeddings: many.embeddings, usage: many.usage };
const one = await embed({ model, value: texts[1], maxRetries: 0 });
out.aisdkOne = { embedding: one.embedding, usage: one.usage };
const small = await embed({ model, value: texts[0], maxRetries: 0,
                            providerOptions: { openai: { dimensions: 16 } } });
out.aisdkDims = small.embedding;

const lc = new OpenAIEmbeddings({ model: modelName, apiKey, configuration: { baseURL }, maxRetries: 0 });
out.langchain = {
  documents: await lc.embedDocuments(texts),
  query: await lc.embedQuery(texts[2]),
};
const lcSmall = new OpenAIEmbeddings({ model: modelName, apiKey, configuration: { baseURL },
                                       dimensions: 16, maxRetries: 0 });
out.langchainDims = await lcSmall.embedQuery(texts[0]);
// an error the server gives is the client's error, with its status
try {
  await embedMany({ model, values: [""], maxRetries: 0 });
  out.emptyError = null;
} catch (e) {
  out.emptyError = { status: e.statusCode ?? e.status ?? null, message: String(e.message) };
}
console.log(JSON.stringify(out));
