import Anthropic from "@anthropic-ai/sdk";
const client = new Anthropic({ baseURL: "http://127.0.0.1:19600", apiKey: "sk-x", maxRetries: 0 });
const tools = [{ name: "get_weather", description: "w", input_schema: { type: "object", properties: { city: { type: "string" } } } }];
const s = client.messages.stream({ model: "claude-sonnet-4-5", max_tokens: 100, tools, messages: [{ role: "user", content: "QUIRK" }] });
const f = await s.finalMessage(); console.log(JSON.stringify(f.content), f.stop_reason);
