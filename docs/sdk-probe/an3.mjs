import Anthropic from "@anthropic-ai/sdk";
const client = new Anthropic({ baseURL: "http://127.0.0.1:19600", apiKey: "sk-x", maxRetries: 0 });
const M = "claude-sonnet-4-5";
const tools = [{ name: "get_weather", description: "w", input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }];
const cases = {
  none: () => client.messages.create({ model: M, max_tokens: 100, tools, tool_choice: { type: "none" }, messages: [{ role: "user", content: "hi" }] }),
  image: () => client.messages.create({ model: M, max_tokens: 100, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } }, { type: "text", text: "what" }] }] }),
  doc: () => client.messages.create({ model: M, max_tokens: 100, messages: [{ role: "user", content: [{ type: "document", source: { type: "text", media_type: "text/plain", data: "hello doc" } }, { type: "text", text: "summarise" }] }] }),
  serviceTier: () => client.messages.create({ model: M, max_tokens: 100, service_tier: "auto", messages: [{ role: "user", content: "hi" }] }),
  thinkTool: async () => { const s = client.messages.stream({ model: M, max_tokens: 2000, thinking: { type: "enabled", budget_tokens: 1024 }, tools, messages: [{ role: "user", content: "REASON TOOL" }] }); const f = await s.finalMessage(); return f; },
  adaptive: () => client.messages.create({ model: M, max_tokens: 2000, thinking: { type: "adaptive" }, messages: [{ role: "user", content: "REASON" }] }),
  disabled: () => client.messages.create({ model: M, max_tokens: 2000, thinking: { type: "disabled" }, messages: [{ role: "user", content: "hi" }] }),
  outputFormat: () => client.messages.create({ model: M, max_tokens: 200, output_format: { type: "json_schema", schema: { type: "object", properties: { name: { type: "string" } }, required: ["name"], additionalProperties: false } }, messages: [{ role: "user", content: "person" }] }),
  outputConfig: () => client.messages.create({ model: M, max_tokens: 200, output_config: { format: { type: "json_schema", schema: { type: "object", properties: { name: { type: "string" } }, required: ["name"], additionalProperties: false } } }, messages: [{ role: "user", content: "person" }] }),
  assistantPrefill: () => client.messages.create({ model: M, max_tokens: 100, messages: [{ role: "user", content: "hi" }, { role: "assistant", content: "Hello" }] }),
  countTools: () => client.messages.countTokens({ model: M, tools, system: "s", messages: [{ role: "user", content: "hello world" }] }),
};
for (const n of (process.argv[2] ? process.argv[2].split(",") : Object.keys(cases))) {
  try { const r = await cases[n](); const o = JSON.stringify(r); console.log("== " + n + " OK " + o.slice(0, +process.env.LIM || 500)); }
  catch (e) { console.log("== " + n + " ERR " + e.constructor.name + " status=" + e.status + " " + JSON.stringify(e.error)); }
}
