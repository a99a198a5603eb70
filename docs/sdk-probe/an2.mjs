import Anthropic from "@anthropic-ai/sdk";
const client = new Anthropic({ baseURL: "http://127.0.0.1:19600", apiKey: "sk-x", maxRetries: 0 });
const all = []; for await (const m of client.models.list({ limit: 2 })) all.push(m);
console.log(JSON.stringify(all));
console.log(JSON.stringify(await client.models.retrieve("gpt-4o")));
try { await client.models.retrieve("nope"); } catch (e) { console.log(e.constructor.name, e.status, e.requestID, JSON.stringify(e.error)); }
const m = await client.messages.create({ model: "claude-sonnet-4-5", max_tokens: 10, messages: [{ role: "user", content: "CACHED" }] });
console.log(m._request_id, JSON.stringify(m.usage));
const s = client.messages.stream({ model: "claude-sonnet-4-5", max_tokens: 10, messages: [{ role: "user", content: "CACHED" }] });
const f = await s.finalMessage(); console.log(s.request_id, JSON.stringify(f.usage));
try { await client.messages.create({ model: "nope", max_tokens: 5, messages: [{ role: "user", content: "x" }] }); } catch (e) { console.log(e.constructor.name, e.status, e.requestID, JSON.stringify(e.error)); }
