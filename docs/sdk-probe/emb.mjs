import OpenAI from "openai";
const o = new OpenAI({ baseURL: "http://127.0.0.1:19600/v1", apiKey: "sk-x", maxRetries: 0 });
for (const input of ["plain", "FLOATS"]) {
  try { const r = await o.embeddings.create({ model: "text-embedding-3-small", input }); console.log(input, JSON.stringify(r.data[0].embedding)); } catch (e) { console.log(input, "ERR", e.message); }
}
