import Anthropic from "@anthropic-ai/sdk";
const client = new Anthropic({ baseURL: "http://127.0.0.1:19600", apiKey: "sk-x", maxRetries: 2 });
const M = "claude-sonnet-4-5";
const tools = [{ name: "get_weather", description: "w", input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }];
const cases = {
  async whole() { return await client.messages.create({ model: M, max_tokens: 100, messages: [{ role: "user", content: "hi" }] }); },
  async stream() { const s = client.messages.stream({ model: M, max_tokens: 100, messages: [{ role: "user", content: "hi" }] }); const ev = []; s.on("streamEvent", e => ev.push(e)); const f = await s.finalMessage(); return [ev, f]; },
  async rawStream() { const s = await client.messages.create({ model: M, max_tokens: 100, stream: true, messages: [{ role: "user", content: "hi" }] }); const ev = []; for await (const e of s) ev.push(e); return ev; },
  async tool() { return await client.messages.create({ model: M, max_tokens: 100, tools, messages: [{ role: "user", content: "TOOL" }] }); },
  async toolParallelStream() { const s = client.messages.stream({ model: M, max_tokens: 100, tools, messages: [{ role: "user", content: "PARALLEL" }] }); const ev = []; s.on("streamEvent", e => ev.push(e)); const f = await s.finalMessage(); return [ev, f]; },
  async toolResult() { return await client.messages.create({ model: M, max_tokens: 100, tools, messages: [{ role: "user", content: "TOOL" }, { role: "assistant", content: [{ type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Rome" } }] }, { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "20C" }] }] }); },
  async toolChoiceTool() { return await client.messages.create({ model: M, max_tokens: 100, tools, tool_choice: { type: "tool", name: "get_weather" }, messages: [{ role: "user", content: "weather" }] }); },
  async thinking() { return await client.messages.create({ model: M, max_tokens: 2000, thinking: { type: "enabled", budget_tokens: 1024 }, messages: [{ role: "user", content: "REASON" }] }); },
  async thinkingStream() { const s = client.messages.stream({ model: M, max_tokens: 2000, thinking: { type: "enabled", budget_tokens: 1024 }, messages: [{ role: "user", content: "REASON" }] }); const ev = []; s.on("streamEvent", e => ev.push(e)); const f = await s.finalMessage(); return [ev, f]; },
  async maxTokens() { return await client.messages.create({ model: M, max_tokens: 100, messages: [{ role: "user", content: "LONG" }] }); },
  async refusal() { return await client.messages.create({ model: M, max_tokens: 100, messages: [{ role: "user", content: "REFUSE" }] }); },
  async refusalStream() { const s = client.messages.stream({ model: M, max_tokens: 100, messages: [{ role: "user", content: "REFUSE" }] }); const f = await s.finalMessage(); return f; },
  async err400() { return await client.messages.create({ model: M, max_tokens: 100, messages: [{ role: "user", content: "ERR400" }] }); },
  async err429() { return await client.messages.create({ model: M, max_tokens: 100, messages: [{ role: "user", content: "ERR429" }] }); },
  async errModel() { return await client.messages.create({ model: "nope", max_tokens: 100, messages: [{ role: "user", content: "hi" }] }); },
  async errBad() { return await client.messages.create({ model: M, messages: [{ role: "user", content: "hi" }] }); },
  async errStream() { const s = client.messages.stream({ model: M, max_tokens: 100, messages: [{ role: "user", content: "ERR429" }] }); return await s.finalMessage(); },
  async count() { return await client.messages.countTokens({ model: M, messages: [{ role: "user", content: "hello world" }] }); },
  async models() { const l = await client.models.list(); const ids = []; for await (const m of l) ids.push(m); return ids; },
  async stopSeq() { return await client.messages.create({ model: M, max_tokens: 100, stop_sequences: ["friend"], messages: [{ role: "user", content: "hi" }] }); },
};
const names = process.argv[2] ? process.argv[2].split(",") : Object.keys(cases);
for (const n of names) {
  try { const r = await cases[n](); console.log("== " + n + " OK\n" + JSON.stringify(r, null, 1).slice(0, +process.env.LIM || 4000)); }
  catch (e) { console.log("== " + n + " ERR " + e.constructor.name + " status=" + e.status + " type=" + (e.error && e.error.error && e.error.error.type) + " body=" + JSON.stringify(e.error) + " reqid=" + e.requestID + "\n" + (e.status ? "" : e.stack)); }
}
const more = {
  async midErr() { const s = client.messages.stream({ model: M, max_tokens: 100, messages: [{ role: "user", content: "MIDERR" }] }); const ev = []; s.on("streamEvent", e => ev.push(e.type)); try { await s.finalMessage(); } catch (e) { return [ev, e.constructor.name, e.status, JSON.stringify(e.error), e.message]; } return ev; },
  async mixedStream() { const s = client.messages.stream({ model: M, max_tokens: 100, tools, messages: [{ role: "user", content: "MIXED" }] }); const ev = []; s.on("streamEvent", e => ev.push(JSON.stringify(e).slice(0, 200))); const f = await s.finalMessage(); return [ev, f]; },
  async filter() { return await client.messages.create({ model: M, max_tokens: 100, messages: [{ role: "user", content: "FILTER" }] }); },
  async cached() { return await client.messages.create({ model: M, max_tokens: 100, messages: [{ role: "user", content: "CACHED" }] }); },
  async cachedStream() { const s = client.messages.stream({ model: M, max_tokens: 100, messages: [{ role: "user", content: "CACHED" }] }); return (await s.finalMessage()).usage; },
  async any() { return await client.messages.create({ model: M, max_tokens: 100, tools, tool_choice: { type: "any", disable_parallel_tool_use: true }, system: [{ type: "text", text: "sys", cache_control: { type: "ephemeral" } }], metadata: { user_id: "u" }, top_k: 5, messages: [{ role: "user", content: [{ type: "text", text: "weather", cache_control: { type: "ephemeral" } }] }] }); },
  async toolErr() { return await client.messages.create({ model: M, max_tokens: 100, tools, messages: [{ role: "user", content: "TOOL" }, { role: "assistant", content: [{ type: "text", text: "checking" }, { type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Rome" } }] }, { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", is_error: true, content: [{ type: "text", text: "boom" }] }, { type: "text", text: "try again" }] }] }); },
};
for (const n of (process.argv[3] || "").split(",").filter(Boolean)) {
  try { const r = await more[n](); console.log("== " + n + " OK\n" + JSON.stringify(r, null, 1).slice(0, +process.env.LIM || 4000)); }
  catch (e) { console.log("== " + n + " ERR " + e.constructor.name + " status=" + e.status + " body=" + JSON.stringify(e.error) + "\n" + (e.status ? "" : e.stack)); }
}
