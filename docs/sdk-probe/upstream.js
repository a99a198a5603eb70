// A small OpenAI-compatible upstream, behaviour keyed on the last user message.
const http = require("http");
const fs = require("fs");
const PORT = +process.argv[2] || 19601;
const log = fs.createWriteStream("upstream.log", { flags: "a" });
let counts = {};
function lastUser(msgs) {
  for (let i = msgs.length - 1; i >= 0; i--) if (msgs[i].role === "user") {
    const c = msgs[i].content; return typeof c === "string" ? c : c.map(p => p.text || "").join("");
  }
  return "";
}
function lp(tokens) {
  return { content: tokens.map(t => ({ token: t, logprob: -0.5, bytes: [...Buffer.from(t)], top_logprobs: [{ token: t, logprob: -0.5, bytes: [...Buffer.from(t)] }, { token: "x", logprob: -2, bytes: [120] }] })), refusal: null };
}
function plan(body) {
  const u = lastUser(body.messages || []);
  const hasToolResult = (body.messages || []).some(m => m.role === "tool");
  if (u.includes("RTOOL") && !hasToolResult) return { reasoning: "I should call the tool.", content: "Checking.", tool_calls: [
    { id: "call_r1", type: "function", function: { name: "get_weather", arguments: '{"city":"Rome"}' } }] };
  if (u.includes("PARALLEL") && !hasToolResult) return { tool_calls: [
    { id: "call_a1", type: "function", function: { name: "get_weather", arguments: '{"city":"Rome"}' } },
    { id: "call_b2", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] };
  if ((u.includes("TOOL") || (body.tools && body.tool_choice && body.tool_choice !== "auto" && body.tool_choice !== "none")) && !hasToolResult) return { tool_calls: [
    { id: "call_t1", type: "function", function: { name: (body.tool_choice && body.tool_choice.function && body.tool_choice.function.name) || (body.tools ? body.tools[0].function.name : "get_weather"), arguments: '{"city":"Rome"}' } }] };
  if (hasToolResult) return { content: "It is sunny in Rome." };
  if (body.response_format && body.response_format.type === "json_schema") return { content: '{"name":"Ada","age":36}' };
  if (u.includes("REFUSE")) return { refusal: "I can't help with that." };
  if (u.includes("REASON")) return { reasoning: "Let me think.", content: "42." };
  if (u.includes("FILTER")) return { content: "Hello", finish: "content_filter" };
  if (u.includes("MIXED") && !hasToolResult) return { content: "Let me check.", tool_calls: [{ id: "call_m1", type: "function", function: { name: "get_weather", arguments: '{"city":"Rome"}' } }] };
  if (u.includes("LONG")) return { content: "Hello there, friend.", finish: "length" };
  return { content: "Hello there, friend." };
}
function send(res, status, obj, headers = {}) {
  res.writeHead(status, { "content-type": "application/json", ...headers }); res.end(JSON.stringify(obj));
}
function chat(body, res, req) {
  const u = lastUser(body.messages || []);
  counts[u] = (counts[u] || 0) + 1;
  if (u.includes("ERR429")) return send(res, 429, { error: { message: "Rate limit reached for requests", type: "requests", param: null, code: "rate_limit_exceeded" } }, { "retry-after": "0" });
  if (u.includes("ERR500ONCE") && counts[u] === 1) return send(res, 500, { error: { message: "The server had an error", type: "server_error", param: null, code: null } });
  for (const st of [401, 403, 404, 413, 422, 502, 529]) if (u.includes("ERR" + st)) return send(res, st, { error: { message: "upstream says " + st, type: st == 401 ? "invalid_request_error" : "x", param: null, code: st == 404 ? "model_not_found" : "c" + st } });
  if (u.includes("ERR400")) return send(res, 400, { error: { message: "Invalid value for 'temperature'", type: "invalid_request_error", param: "temperature", code: "invalid_value" } });
  const id = "chatcmpl-up123", created = 1700000000, model = body.model;
  if (u.includes("QUIRK") && !u.includes("QUIRK2") && body.stream) {
    res.writeHead(200, { "content-type": "text/event-stream" });
    const w = (o) => res.write("data: " + JSON.stringify({ id, object: "chat.completion.chunk", created, model, ...o }) + "\n\n");
    w({ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { name: "get_weather" } }] } }] });
    w({ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '{"city":"Rome"}' } }] } }] });
    w({ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { name: "get_weather", arguments: '{"city":"Oslo"}' } }] } }] });
    w({ choices: [{ index: 0, delta: {}, finish_reason: "tool_calls" }], usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 } });
    return res.end("data: [DONE]\n\n");
  }
  if (u.includes("QUIRK2") && body.stream) {
    res.writeHead(200, { "content-type": "text/event-stream" });
    const w = (o) => res.write("data: " + JSON.stringify({ id, object: "chat.completion.chunk", created, model, ...o }) + "\n\n");
    w({ choices: [{ index: 0, delta: { content: "Hi" } }, { index: 1, delta: { content: "Yo" } }] });
    w({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }] });
    return res.end("data: [DONE]\n\n");
  }
  const p = plan(body);
  const n = body.n || 1;
  const toks = p.content ? p.content.split(/(?<= )/) : [];
  const usage = { prompt_tokens: 11, completion_tokens: 7, total_tokens: 18, prompt_tokens_details: { cached_tokens: 0, audio_tokens: 0 }, completion_tokens_details: { reasoning_tokens: p.reasoning ? 3 : 0, audio_tokens: 0, accepted_prediction_tokens: 0, rejected_prediction_tokens: 0 } };
  if (u.includes("CACHED")) { usage.prompt_tokens_details.cached_tokens = 5; }
  const finish = p.finish || (p.tool_calls ? "tool_calls" : "stop");
  if (!body.stream) {
    const choices = [];
    for (let i = 0; i < n; i++) {
      const message = { role: "assistant", content: p.content ?? null, refusal: p.refusal ?? null, annotations: [] };
      if (p.tool_calls) message.tool_calls = p.tool_calls;
      if (p.reasoning) message.reasoning_content = p.reasoning;
      choices.push({ index: i, message, logprobs: body.logprobs ? lp(toks) : null, finish_reason: finish });
    }
    return send(res, 200, { id, object: "chat.completion", created, model, choices, usage, service_tier: "default", system_fingerprint: "fp_up" });
  }
  res.writeHead(200, { "content-type": "text/event-stream" });
  const inc = body.stream_options && body.stream_options.include_usage;
  const chunk = (choices, extra = {}) => res.write("data: " + JSON.stringify({ id, object: "chat.completion.chunk", created, model, system_fingerprint: "fp_up", service_tier: "default", choices, ...(inc ? { usage: null } : {}), ...extra }) + "\n\n");
  for (let i = 0; i < n; i++) {
    chunk([{ index: i, delta: { role: "assistant", content: p.content !== undefined || p.tool_calls ? "" : null, refusal: null }, logprobs: null, finish_reason: null }]);
    if (p.reasoning) chunk([{ index: i, delta: { reasoning_content: p.reasoning }, logprobs: null, finish_reason: null }]);
    if (u.includes("MIDERR")) { chunk([{ index: i, delta: { content: "Hel" }, logprobs: null, finish_reason: null }]); res.write('data: {"error":{"message":"upstream overloaded mid-stream","type":"server_error","param":null,"code":"overloaded"}}\n\n'); return res.end(); }
    for (const t of toks) chunk([{ index: i, delta: { content: t }, logprobs: body.logprobs ? lp([t]) : null, finish_reason: null }]);
    if (p.refusal) chunk([{ index: i, delta: { refusal: p.refusal }, logprobs: null, finish_reason: null }]);
    if (p.tool_calls) p.tool_calls.forEach((tc, k) => {
      chunk([{ index: i, delta: { tool_calls: [{ index: k, id: tc.id, type: "function", function: { name: tc.function.name, arguments: "" } }] }, logprobs: null, finish_reason: null }]);
      const a = tc.function.arguments, h = a.length >> 1;
      chunk([{ index: i, delta: { tool_calls: [{ index: k, function: { arguments: a.slice(0, h) } }] }, logprobs: null, finish_reason: null }]);
      chunk([{ index: i, delta: { tool_calls: [{ index: k, function: { arguments: a.slice(h) } }] }, logprobs: null, finish_reason: null }]);
    });
    chunk([{ index: i, delta: {}, logprobs: null, finish_reason: finish }]);
  }
  if (inc) res.write("data: " + JSON.stringify({ id, object: "chat.completion.chunk", created, model, system_fingerprint: "fp_up", service_tier: "default", choices: [], usage }) + "\n\n");
  res.end("data: [DONE]\n\n");
}
http.createServer((req, res) => {
  let data = "";
  req.on("data", d => data += d);
  req.on("end", () => {
    let body = {};
    try { body = data ? JSON.parse(data) : {}; } catch { }
    log.write(JSON.stringify({ t: Date.now(), method: req.method, url: req.url, body }) + "\n");
    if (req.url.endsWith("/models") && req.method === "GET") return send(res, 200, { object: "list", data: [{ id: "up-model", object: "model", created: 1, owned_by: "up" }] });
    if (req.url.endsWith("/chat/completions")) return chat(body, res, req);
    if (req.url.endsWith("/embeddings")) {
      const inputs = Array.isArray(body.input) ? body.input : [body.input];
      return send(res, 200, { object: "list", model: body.model, data: inputs.map((_, i) => ({ object: "embedding", index: i, embedding: body.encoding_format === "base64" && !JSON.stringify(body.input).includes("FLOATS") ? Buffer.from(new Float32Array([0.1, 0.2, 0.3]).buffer).toString("base64") : [0.1, 0.2, 0.3] })), usage: { prompt_tokens: 4, total_tokens: 4 } });
    }
    send(res, 404, { error: { message: "no route " + req.url, type: "invalid_request_error", param: null, code: null } });
  });
}).listen(PORT, "127.0.0.1");
