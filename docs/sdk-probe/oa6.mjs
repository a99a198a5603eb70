import OpenAI from "openai";
const client = new OpenAI({ baseURL: "http://127.0.0.1:19600/v1", apiKey: "sk-x", maxRetries: 0 });
const M = "gpt-4o-mini";
const tools = [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }];
for (const [n, content, extra] of [["quirk", "QUIRK", { tools }], ["quirk2", "QUIRK2", { n: 2 }]]) {
  try { const s = client.chat.completions.stream({ model: M, messages: [{ role: "user", content }], ...extra }); const f = await s.finalChatCompletion(); console.log(n, JSON.stringify(f.choices)); } catch (e) { console.log(n, "ERR", e.message); }
  try { const s = await client.chat.completions.create({ model: M, stream: true, messages: [{ role: "user", content }], ...extra }); for await (const c of s) console.log("  ", JSON.stringify(c.choices)); } catch (e) { console.log(n, "ERR", e.message); }
}
try { const s = client.responses.stream({ model: M, input: "QUIRK", tools: [{ type: "function", name: "get_weather", parameters: tools[0].function.parameters, strict: false }] }); const f = await s.finalResponse(); console.log("resp", JSON.stringify(f.output)); } catch (e) { console.log("resp ERR", e.message); }
