import OpenAI from "openai";
const client = new OpenAI({ baseURL: "http://127.0.0.1:19600/v1", apiKey: "sk-x", maxRetries: 0 });
const M = "gpt-4o-mini";
const cases = {
  chatNew: () => client.chat.completions.create({ model: M, messages: [{ role: "user", content: "hi" }], verbosity: "low", prompt_cache_key: "k1", safety_identifier: "s1", service_tier: "flex", max_completion_tokens: 50, seed: 3, stop: ["x"], presence_penalty: 0.1, frequency_penalty: 0.1, logit_bias: { "50256": -100 }, user: "u", modalities: ["text"], prediction: { type: "content", content: "Hello" }, store: false, reasoning_effort: "minimal" }),
  chatAudioParts: () => client.chat.completions.create({ model: M, messages: [{ role: "user", content: [{ type: "text", text: "hi" }, { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0KGgo=", detail: "low" } }] }] }),
  chatToolsCustom: () => client.chat.completions.create({ model: M, messages: [{ role: "user", content: "hi" }], tools: [{ type: "custom", custom: { name: "grammar", description: "x" } }] }),
  chatAllowed: () => client.chat.completions.create({ model: M, messages: [{ role: "user", content: "hi" }], tools: [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: {} } } }], tool_choice: { type: "allowed_tools", allowed_tools: { mode: "auto", tools: [{ type: "function", function: { name: "get_weather" } }] } } }),
  respNew: () => client.responses.create({ model: M, input: "hi", prompt_cache_key: "k1", safety_identifier: "s1", max_tool_calls: 3, text: { verbosity: "low" }, stream_options: undefined, service_tier: "flex" }),
  respStreamOpts: async () => { const s = await client.responses.create({ model: M, input: "hi", stream: true, stream_options: { include_obfuscation: false } }); const ev = []; for await (const e of s) ev.push(e.type); return ev; },
  respInputImage: () => client.responses.create({ model: M, input: [{ role: "user", content: [{ type: "input_text", text: "hi" }, { type: "input_image", image_url: "data:image/png;base64,iVBORw0KGgo=", detail: "auto" }] }] }),
  respDeveloper: () => client.responses.create({ model: M, input: [{ role: "developer", content: "be terse" }, { type: "message", role: "user", content: "hi" }, { type: "message", role: "assistant", content: [{ type: "output_text", text: "yo", annotations: [] }] }, { role: "user", content: "again" }] }),
  respToolChoiceAllowed: () => client.responses.create({ model: M, input: "hi", tools: [{ type: "function", name: "get_weather", parameters: { type: "object", properties: {} }, strict: false }], tool_choice: { type: "allowed_tools", mode: "auto", tools: [{ type: "function", name: "get_weather" }] } }),
  respReasoningSummary: () => client.responses.create({ model: M, input: "REASON", reasoning: { effort: "low", summary: "auto" } }),
  respConv: () => client.responses.create({ model: M, input: "hi", include: ["reasoning.encrypted_content"], store: false }),
};
for (const n of (process.argv[2] ? process.argv[2].split(",") : Object.keys(cases))) {
  try { const r = await cases[n](); const o = JSON.stringify(r); console.log("== " + n + " OK " + o.slice(0, +process.env.LIM || 400)); }
  catch (e) { console.log("== " + n + " ERR " + e.constructor.name + " status=" + e.status + " code=" + e.code + " param=" + e.param + " msg=" + e.message); }
}
