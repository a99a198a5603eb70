import OpenAI from "openai";
const client = new OpenAI({ baseURL: "http://127.0.0.1:19600/v1", apiKey: "sk-x", maxRetries: 0 });
const M = "gpt-4o-mini";
const tools = [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }];
const cases = {
  streamN2Tools: async () => { const s = client.chat.completions.stream({ model: M, n: 2, tools, stream_options: { include_usage: true }, messages: [{ role: "user", content: "PARALLEL" }] }); const f = await s.finalChatCompletion(); return f.choices.map(c => [c.index, c.finish_reason, c.message.tool_calls.map(t => t.id + t.function.arguments)]).concat([f.usage.total_tokens]); },
  runToolsParallelStream: async () => { const r = client.chat.completions.runTools({ model: M, stream: true, messages: [{ role: "user", content: "PARALLEL" }], tools: [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } }, function: (a) => ({ t: 20, a }), parse: JSON.parse } }] }); return [await r.finalContent(), r.messages.map(m => m.role)]; },
  completions: () => client.completions.create({ model: M, prompt: "Say", max_tokens: 5 }),
  completionsStream: async () => { const s = await client.completions.create({ model: M, prompt: "Say", max_tokens: 5, stream: true }); const o = []; for await (const c of s) o.push(c); return o; },
  withResponse: async () => { const { data, response, request_id } = await client.chat.completions.create({ model: M, messages: [{ role: "user", content: "hi" }] }).withResponse(); return [request_id, response.headers.get("content-type")]; },
  respWithResp: async () => { const { data, request_id } = await client.responses.create({ model: M, input: "hi" }).withResponse(); return [request_id, data._request_id]; },
  embedDims: () => client.embeddings.create({ model: "text-embedding-3-small", input: [[1, 2, 3]], dimensions: 3, encoding_format: "float" }),
  respInputTokens: () => client.responses.inputTokens.count({ model: M, input: "hi" }),
};
for (const n of (process.argv[2] ? process.argv[2].split(",") : Object.keys(cases))) {
  try { const r = await cases[n](); const o = JSON.stringify(r); console.log("== " + n + " OK " + o.slice(0, +process.env.LIM || 600)); }
  catch (e) { console.log("== " + n + " ERR " + e.constructor.name + " status=" + e.status + " code=" + e.code + " param=" + e.param + " msg=" + e.message); }
}
