import OpenAI from "openai";
import { zodResponseFormat, zodTextFormat } from "openai/helpers/zod";
import { z } from "zod";
const client = new OpenAI({ baseURL: "http://127.0.0.1:19600/v1", apiKey: "sk-x", maxRetries: 0 });
const M = "gpt-4o-mini";
const P = z.object({ name: z.string(), age: z.number() });
const cases = {
  parseRefuse: async () => (await client.chat.completions.parse({ model: M, messages: [{ role: "user", content: "REFUSE" }], response_format: zodResponseFormat(P, "p") })).choices[0].message,
  streamParseRefuse: async () => { const s = client.chat.completions.stream({ model: M, messages: [{ role: "user", content: "REFUSE" }], response_format: zodResponseFormat(P, "p") }); const ev = []; s.on("refusal.done", e => ev.push(e)); const f = await s.finalChatCompletion(); return [ev, f.choices[0].message]; },
  respParseZod: async () => { const r = await client.responses.parse({ model: M, input: "person", text: { format: zodTextFormat(P, "p") } }); return r.output_parsed; },
  respStreamParse: async () => { const s = client.responses.stream({ model: M, input: "person", text: { format: zodTextFormat(P, "p") } }); const f = await s.finalResponse(); return f.output_parsed; },
  streamContentEvents: async () => { const s = client.chat.completions.stream({ model: M, messages: [{ role: "user", content: "hi" }], logprobs: true }); const ev = []; for (const n of ["content.delta", "content.done", "logprobs.content.delta", "logprobs.content.done", "chunk"]) s.on(n, () => ev.push(n)); await s.finalChatCompletion(); return ev.join(","); },
  streamToolEvents: async () => { const s = client.chat.completions.stream({ model: M, tools: [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"], additionalProperties: false }, strict: true } }], messages: [{ role: "user", content: "PARALLEL" }] }); const ev = []; s.on("tool_calls.function.arguments.done", e => ev.push([e.index, e.name, e.parsed_arguments])); await s.finalChatCompletion(); return ev; },
};
for (const n of (process.argv[2] ? process.argv[2].split(",") : Object.keys(cases))) {
  try { const r = await cases[n](); const o = JSON.stringify(r); console.log("== " + n + " OK " + o.slice(0, +process.env.LIM || 700)); }
  catch (e) { console.log("== " + n + " ERR " + e.constructor.name + " status=" + e.status + " msg=" + e.message); }
}
