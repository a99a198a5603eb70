// Drives Molly's POST /v1/messages with Anthropic's official TypeScript
// SDK (@anthropic-ai/sdk, installed by `make sdk`): one message, one
// streamed message through the SDK's stream helper, one error. Prints one
// JSON object with what the SDK made of them; the Go test checks it.
// Usage: node anthropic_sdk.cjs <gateway base URL, without /v1>
const Anthropic = require("@anthropic-ai/sdk");

async function main() {
  const client = new Anthropic({ baseURL: process.argv[2], apiKey: "sk-not-a-molly-key", maxRetries: 0 });
  const out = {};
  const msg = await client.messages.create({
    model: "chat",
    max_tokens: 64,
    system: "You are terse.",
    messages: [{ role: "user", content: [{ type: "text", text: "Reply to anna@example.org please" }] }],
  });
  out.message = { type: msg.type, role: msg.role, model: msg.model, stop_reason: msg.stop_reason, text: msg.content[0].text, usage: msg.usage };
  const stream = client.messages.stream({
    model: "chat",
    max_tokens: 64,
    messages: [{ role: "user", content: "Stream a haiku about tea" }],
  });
  let deltas = "";
  stream.on("text", (t) => { deltas += t; });
  const final = await stream.finalMessage();
  out.stream = { deltas, text: final.content[0].text, stop_reason: final.stop_reason, usage: final.usage };
  try {
    await client.messages.create({ model: "no-such-model", max_tokens: 5, messages: [{ role: "user", content: "hi" }] });
    out.error = null;
  } catch (e) {
    out.error = { status: e.status, type: e.error && e.error.error && e.error.error.type, name: e.constructor.name };
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => { process.stderr.write(String(e && e.stack || e)); process.exit(1); });
