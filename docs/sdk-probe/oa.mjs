import OpenAI from "openai";
import { zodResponseFormat, zodFunction } from "openai/helpers/zod";
import { z } from "zod";
const client = new OpenAI({ baseURL: "http://127.0.0.1:19600/v1", apiKey: "sk-x", maxRetries: 2 });
const M = "gpt-4o-mini";
const only = process.argv[2];
const tools = [{ type: "function", function: { name: "get_weather", description: "w", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"], additionalProperties: false }, strict: true } }];
const cases = {
  async whole() { return await client.chat.completions.create({ model: M, messages: [{ role: "user", content: "hi" }] }); },
  async n2() { const r = await client.chat.completions.create({ model: M, n: 2, messages: [{ role: "user", content: "hi" }] }); return r.choices.map(c => [c.index, c.message.content]); },
  async streamUsage() { const s = await client.chat.completions.create({ model: M, stream: true, stream_options: { include_usage: true }, messages: [{ role: "user", content: "hi" }] }); const out = []; for await (const c of s) out.push(c); return out; },
  async streamN2() { const s = await client.chat.completions.create({ model: M, n: 2, stream: true, messages: [{ role: "user", content: "hi" }] }); const out = []; for await (const c of s) out.push(JSON.stringify(c.choices)); return out; },
  async tools() { return await client.chat.completions.create({ model: M, tools, tool_choice: { type: "function", function: { name: "get_weather" } }, messages: [{ role: "user", content: "weather?" }] }); },
  async parallel() { return await client.chat.completions.create({ model: M, tools, parallel_tool_calls: true, messages: [{ role: "user", content: "PARALLEL" }] }); },
  async jsonSchema() { return await client.chat.completions.create({ model: M, response_format: { type: "json_schema", json_schema: { name: "p", strict: true, schema: { type: "object", properties: { name: { type: "string" }, age: { type: "integer" } }, required: ["name", "age"], additionalProperties: false } } }, messages: [{ role: "user", content: "person" }] }); },
  async logprobs() { return await client.chat.completions.create({ model: M, logprobs: true, top_logprobs: 2, messages: [{ role: "user", content: "hi" }] }); },
  async streamHelper() { const s = client.chat.completions.stream({ model: M, stream_options: { include_usage: true }, messages: [{ role: "user", content: "hi" }] }); return await s.finalChatCompletion(); },
  async streamHelperTools() { const s = client.chat.completions.stream({ model: M, tools, messages: [{ role: "user", content: "PARALLEL" }] }); return await s.finalChatCompletion(); },
  async streamHelperLogprobs() { const s = client.chat.completions.stream({ model: M, logprobs: true, top_logprobs: 2, messages: [{ role: "user", content: "hi" }] }); return await s.finalChatCompletion(); },
  async streamHelperN2() { const s = client.chat.completions.stream({ model: M, n: 2, messages: [{ role: "user", content: "hi" }] }); return await s.finalChatCompletion(); },
  async streamHelperRefusal() { const s = client.chat.completions.stream({ model: M, messages: [{ role: "user", content: "REFUSE" }] }); return await s.finalChatCompletion(); },
  async streamHelperReason() { const s = client.chat.completions.stream({ model: M, messages: [{ role: "user", content: "REASON" }] }); return await s.finalChatCompletion(); },
  async runTools() { const r = client.chat.completions.runTools({ model: M, messages: [{ role: "user", content: "TOOL" }], tools: [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } }, function: (a) => ({ t: 20, a }), parse: JSON.parse } }] }); return [await r.finalContent(), r.messages.length]; },
  async runToolsStream() { const r = client.chat.completions.runTools({ model: M, stream: true, messages: [{ role: "user", content: "TOOL" }], tools: [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } }, function: (a) => ({ t: 20, a }), parse: JSON.parse } }] }); return [await r.finalContent(), r.messages.length]; },
  async parse() { const r = await client.chat.completions.parse({ model: M, messages: [{ role: "user", content: "person" }], response_format: zodResponseFormat(z.object({ name: z.string(), age: z.number() }), "person") }); return r.choices[0].message; },
  async parseTool() { const r = await client.chat.completions.parse({ model: M, messages: [{ role: "user", content: "TOOL" }], tools: [zodFunction({ name: "get_weather", parameters: z.object({ city: z.string() }) })] }); return r.choices[0].message; },
  async parseStream() { const s = client.chat.completions.stream({ model: M, messages: [{ role: "user", content: "person" }], response_format: zodResponseFormat(z.object({ name: z.string(), age: z.number() }), "person") }); const f = await s.finalChatCompletion(); return f.choices[0].message; },
  async embeddings() { const r = await client.embeddings.create({ model: "text-embedding-3-small", input: ["a", "b"] }); return r; },
  async embeddingsB64() { const r = await client.embeddings.create({ model: "text-embedding-3-small", input: "a" }); return r; },
  async models() { const l = await client.models.list(); const ids = []; for await (const m of l) ids.push(m.id); const r = await client.models.retrieve("gpt-4o"); return [ids, r]; },
  async modelMissing() { return await client.models.retrieve("nope"); },
  async err400() { return await client.chat.completions.create({ model: M, messages: [{ role: "user", content: "ERR400" }] }); },
  async err429() { return await client.chat.completions.create({ model: M, messages: [{ role: "user", content: "ERR429" }] }); },
  async err500once() { return await client.chat.completions.create({ model: M, messages: [{ role: "user", content: "ERR500ONCE " + Math.random() }] }); },
  async errModel() { return await client.chat.completions.create({ model: "nope", messages: [{ role: "user", content: "hi" }] }); },
  async errBad() { return await client.chat.completions.create({ model: M, messages: "x" }); },
  async errStream429() { const s = await client.chat.completions.create({ model: M, stream: true, messages: [{ role: "user", content: "ERR429" }] }); for await (const c of s); },
  async resp() { return await client.responses.create({ model: M, input: "hi" }); },
  async respTools() { return await client.responses.create({ model: M, input: "PARALLEL", tools: [{ type: "function", name: "get_weather", parameters: tools[0].function.parameters, strict: true }] }); },
  async respStream() { const s = await client.responses.create({ model: M, input: "hi", stream: true }); const ev = []; for await (const e of s) ev.push(e); return ev; },
  async respStreamHelper() { const s = client.responses.stream({ model: M, input: "hi" }); const ev = []; s.on("event", e => ev.push(e.type + ":" + e.sequence_number)); const f = await s.finalResponse(); return [ev, f]; },
  async respStreamTools() { const s = client.responses.stream({ model: M, input: "PARALLEL", tools: [{ type: "function", name: "get_weather", parameters: tools[0].function.parameters, strict: true }] }); const ev = []; s.on("event", e => ev.push(e)); const f = await s.finalResponse(); return [ev.map(e=>e.type+":"+e.sequence_number+":"+e.output_index), f.output]; },
  async respStreamReason() { const s = client.responses.stream({ model: M, input: "REASON", reasoning: { effort: "low" } }); const ev = []; s.on("event", e => ev.push(e)); const f = await s.finalResponse(); return [ev, f]; },
  async respStreamLogprobs() { const s = client.responses.stream({ model: M, input: "hi", top_logprobs: 2, include: ["message.output_text.logprobs"] }); const ev = []; s.on("event", e => ev.push(e)); const f = await s.finalResponse(); return [ev, f]; },
  async respParse() { const r = await client.responses.parse({ model: M, input: "person", text: { format: { type: "json_schema", name: "person", strict: true, schema: { type: "object", properties: { name: { type: "string" }, age: { type: "integer" } }, required: ["name", "age"], additionalProperties: false } } } }); return [r.output_parsed, r.output_text]; },
  async respRefusal() { return await client.responses.create({ model: M, input: "REFUSE" }); },
  async respStreamRefusal() { const s = client.responses.stream({ model: M, input: "REFUSE" }); const ev = []; s.on("event", e => ev.push(e)); const f = await s.finalResponse(); return [ev, f]; },
  async respErr() { return await client.responses.create({ model: M, input: "ERR400" }); },
  async respGet() { const r = await client.responses.create({ model: M, input: "hi" }); const g = await client.responses.retrieve(r.id); const d = await client.responses.delete(r.id); return [g, d]; },
};
const names = only ? only.split(",") : Object.keys(cases);
for (const n of names) {
  try { const r = await cases[n](); console.log("== " + n + " OK\n" + JSON.stringify(r, null, 1).slice(0, +process.env.LIM || 6000)); }
  catch (e) { console.log("== " + n + " ERR " + e.constructor.name + " status=" + e.status + " code=" + e.code + " param=" + e.param + " type=" + e.type + " msg=" + e.message + (e.headers ? " reqid=" + (e.headers.get ? e.headers.get("x-request-id") : "") : "") + "\n" + (e.status ? "" : e.stack)); }
}
const more = {
  async midErr() { const s = await client.chat.completions.create({ model: M, stream: true, messages: [{ role: "user", content: "MIDERR" }] }); const out = []; for await (const c of s) out.push(c); return out; },
  async midErrResp() { const s = client.responses.stream({ model: M, input: "MIDERR" }); const ev = []; s.on("event", e => ev.push(e.type)); try { await s.finalResponse(); } catch (e) { return [ev, String(e)]; } return ev; },
  async cached() { return (await client.chat.completions.create({ model: M, messages: [{ role: "user", content: "CACHED" }] })).usage; },
  async cachedResp() { return (await client.responses.create({ model: M, input: "CACHED" })).usage; },
  async filterResp() { const r = await client.responses.create({ model: M, input: "FILTER" }); return [r.status, r.incomplete_details, r.output]; },
  async longResp() { const r = await client.responses.create({ model: M, input: "LONG", max_output_tokens: 20 }); return [r.status, r.incomplete_details, r.output]; },
  async longRespStream() { const s = client.responses.stream({ model: M, input: "LONG", max_output_tokens: 20 }); const ev = []; s.on("event", e => ev.push(e.type)); const f = await s.finalResponse(); return [ev, f.status, f.incomplete_details]; },
  async mixed() { const s = client.chat.completions.stream({ model: M, tools, messages: [{ role: "user", content: "MIXED" }] }); return (await s.finalChatCompletion()).choices; },
  async mixedResp() { const s = client.responses.stream({ model: M, input: "MIXED", tools: [{ type: "function", name: "get_weather", parameters: tools[0].function.parameters, strict: true }] }); const ev = []; s.on("event", e => ev.push(e.type + ":" + e.output_index)); const f = await s.finalResponse(); return [ev, f.output]; },
};
for (const n of (process.argv[3] || "").split(",").filter(Boolean)) {
  try { const r = await more[n](); console.log("== " + n + " OK\n" + JSON.stringify(r, null, 1).slice(0, +process.env.LIM || 6000)); }
  catch (e) { console.log("== " + n + " ERR " + e.constructor.name + " status=" + e.status + " code=" + e.code + " param=" + e.param + " type=" + e.type + " msg=" + e.message + "\n" + (e.status ? "" : e.stack)); }
}
const more2 = {
  async echo() { const r = await client.responses.create({ model: M, input: "hi", instructions: "Be terse.", metadata: { a: "1" }, temperature: 0.2, top_p: 0.9, max_output_tokens: 50, tool_choice: { type: "function", name: "get_weather" }, tools: [{ type: "function", name: "get_weather", parameters: tools[0].function.parameters, strict: true }], text: { format: { type: "json_schema", name: "p", strict: true, schema: { type: "object", properties: { name: { type: "string" } }, required: ["name"], additionalProperties: false } } }, parallel_tool_calls: false, user: "u1", service_tier: "auto", store: false, top_logprobs: 1, reasoning: { effort: "low" } }); delete r.output; return r; },
  async loop() { const tl = [{ type: "function", name: "get_weather", parameters: tools[0].function.parameters, strict: true }]; const r1 = await client.responses.create({ model: M, input: "TOOL", tools: tl }); const fc = r1.output.find(o => o.type === "function_call"); const r2 = await client.responses.create({ model: M, previous_response_id: r1.id, tools: tl, input: [{ type: "function_call_output", call_id: fc.call_id, output: "20C" }] }); return [r2.output_text, r2.previous_response_id]; },
  async loopInline() { const tl = [{ type: "function", name: "get_weather", parameters: tools[0].function.parameters, strict: true }]; const r1 = await client.responses.create({ model: M, input: "TOOL", tools: tl, store: false }); const r2 = await client.responses.create({ model: M, tools: tl, store: false, input: [{ role: "user", content: "TOOL" }, ...r1.output, { type: "function_call_output", call_id: r1.output[0].call_id, output: "20C" }] }); return [r2.output_text]; },
  async reasonLoop() { const r1 = await client.responses.create({ model: M, input: "REASON", store: false }); const r2 = await client.responses.create({ model: M, store: false, input: [{ role: "user", content: "REASON" }, ...r1.output, { role: "user", content: "again" }] }); return [r2.output_text]; },
  async chatStore() { return await client.chat.completions.create({ model: M, store: true, metadata: { k: "v" }, messages: [{ role: "developer", content: "x" }, { role: "user", content: "hi" }] }); },
  async chatRetrieve() { return await client.chat.completions.retrieve("chatcmpl-up123"); },
  async inputItems() { const r = await client.responses.create({ model: M, input: "hi" }); const l = await client.responses.inputItems.list(r.id); return l.data; },
};
for (const n of (process.argv[4] || "").split(",").filter(Boolean)) {
  try { const r = await more2[n](); console.log("== " + n + " OK\n" + JSON.stringify(r, null, 1).slice(0, +process.env.LIM || 6000)); }
  catch (e) { console.log("== " + n + " ERR " + e.constructor.name + " status=" + e.status + " code=" + e.code + " param=" + e.param + " type=" + e.type + " msg=" + e.message + "\n" + (e.status ? "" : e.stack)); }
}
