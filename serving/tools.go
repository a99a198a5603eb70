package serving

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/serving/llama"
)

// Structured output and tool calls on the engine, by grammar-constrained
// sampling (llama.cpp's grammar sampler, serving/llama.Grammar):
//
//   - response_format json_object: the output is any JSON object
//     (JSONObjectGBNF); json_schema: it matches the schema (SchemaToGBNF).
//   - tools with tool_choice auto (the default), required or a named
//     function: the output is constrained to the JSON of llama.cpp's
//     "generic" tool-call format (common/chat.cpp,
//     common_chat_params_init_generic): {"tool_calls": [{"name", "arguments"}]}
//     (or {"tool_call": {...}} when parallel_tool_calls is false), and for
//     auto also {"response": "..."}; the tools and the format are described
//     to the model in a system message, as llama.cpp does. The engine decodes
//     that JSON into OpenAI tool_calls (finish_reason "tool_calls") or into
//     content. tool_choice none: the tools are not shown, the output is free.
//
// Earlier assistant tool_calls in the conversation are rendered back in the
// same JSON, tool results as role "tool" messages with their content.

// plan is how a chat request's output is constrained and decoded.
type plan struct {
	grammar  string          // GBNF ("": free text)
	param    string          // the parameter the grammar was made from: response_format or tools
	tools    bool            // output is the generic tool-call JSON
	parallel bool            // {"tool_calls": [...]} rather than {"tool_call": {...}}
	response json.RawMessage // auto: the response value's schema
}

// planFor reads response_format, tools, tool_choice and parallel_tool_calls
// from a chat body (already validated by openai.ParseRequest) and returns the
// plan and the system message to add ("" none). Errors: 400 naming the
// parameter (unsupported schema keywords, a length or item bound over
// MaxSchemaRepetition, an unknown forced function, a parallel_tool_calls
// that is not a boolean).
func planFor(body []byte) (*plan, string, error) {
	rf := gjson.GetBytes(body, "response_format")
	var respSchema string // the schema of the content, "" free text
	switch rf.Get("type").Str {
	case "", "text":
	case "json_object":
		respSchema = `{"type":"object"}`
	case "json_schema":
		s := rf.Get("json_schema.schema")
		if !s.Exists() {
			s = gjson.Parse(`{}`)
		}
		respSchema = s.Raw
	default:
		return nil, "", unsupported("response_format.type", "response_format type %q is not supported by this engine", rf.Get("type").Str)
	}
	tools := gjson.GetBytes(body, "tools").Array()
	choice := gjson.GetBytes(body, "tool_choice")
	mode := "auto"
	forced := ""
	switch {
	case !choice.Exists() || choice.Type == gjson.Null:
	case choice.Type == gjson.String:
		mode = choice.Str
	case choice.Get("type").Str == "function":
		mode, forced = "function", choice.Get("function.name").Str
	default:
		return nil, "", unsupported("tool_choice", "tool_choice type %q is not supported by this engine", choice.Get("type").Str)
	}
	if len(tools) == 0 || mode == "none" {
		if mode == "required" || mode == "function" {
			return nil, "", badRequest("tool_choice", "tool_choice %q needs tools", mode)
		}
		if respSchema == "" {
			return &plan{}, "", nil
		}
		g, err := grammarFor(respSchema, "response_format.json_schema.schema")
		return &plan{grammar: g, param: "response_format"}, "", err
	}
	ptc := gjson.GetBytes(body, "parallel_tool_calls")
	if ptc.Exists() && ptc.Type != gjson.True && ptc.Type != gjson.False && ptc.Type != gjson.Null {
		return nil, "", badRequest("parallel_tool_calls", "parallel_tool_calls must be a boolean")
	}
	p := &plan{tools: true, param: "tools", parallel: ptc.Type != gjson.False}
	var calls []string
	var desc strings.Builder
	found := false
	for i, t := range tools {
		if t.Get("type").Str != "function" {
			return nil, "", unsupported(fmt.Sprintf("tools[%d].type", i), "tool type %q is not supported by this engine", t.Get("type").Str)
		}
		name := t.Get("function.name").Str
		params := t.Get("function.parameters")
		if !params.Exists() {
			params = gjson.Parse(`{"type":"object","properties":{}}`)
		}
		// Each schema on its own first, so that an error names its tool
		// rather than a pointer into the combined schema below.
		if _, err := grammarFor(params.Raw, fmt.Sprintf("tools[%d].function.parameters", i)); err != nil {
			return nil, "", err
		}
		fmt.Fprintf(&desc, "- %s: %s parameters %s\n", name, t.Get("function.description").Str, params.Raw)
		if mode == "function" && name != forced {
			continue
		}
		found = found || name == forced
		nameJSON, _ := json.Marshal(name)
		calls = append(calls, fmt.Sprintf(`{"type":"object","properties":{"name":{"const":%s},"arguments":%s},"required":["name","arguments"]}`, nameJSON, asResource(params.Raw, fmt.Sprintf("molly:tools/%d", i))))
	}
	if mode == "function" && !found {
		return nil, "", badRequest("tool_choice", "tool_choice names the function %q, which is not in tools", forced)
	}
	call := `{"anyOf":[` + strings.Join(calls, ",") + `]}`
	var schema string
	if p.parallel {
		schema = `{"type":"object","properties":{"tool_calls":{"type":"array","items":` + call + `,"minItems":1}},"required":["tool_calls"]}`
	} else {
		schema = `{"type":"object","properties":{"tool_call":` + call + `},"required":["tool_call"]}`
	}
	format := "tool_calls"
	if !p.parallel {
		format = "tool_call"
	}
	sys := "You can call these tools:\n" + desc.String() + "Respond in JSON format with `" + format + "` (a request to call tools)"
	if mode == "auto" {
		if respSchema == "" {
			respSchema = `{"type":"string"}`
		} else if _, err := grammarFor(respSchema, "response_format.json_schema.schema"); err != nil {
			return nil, "", err
		}
		p.response = json.RawMessage(respSchema)
		schema = `{"anyOf":[` + schema + `,{"type":"object","properties":{"response":` + asResource(respSchema, "molly:response") + `},"required":["response"]}]}`
		sys += " or with `response` (your reply to the user)"
	}
	sys += ". The JSON must match this schema: " + schema
	g, err := grammarFor(schema, "tools")
	p.grammar = g
	return p, sys, err
}

// asResource is the schema raw (JSON text) to embed in a larger schema: as
// written, or, when it holds a $ref and has no $id, with "$id": id added
// first, so that its local $refs ("#/$defs/…") keep resolving in it
// (SchemaToGBNF resolves them in the nearest schema with an $id).
func asResource(raw, id string) string {
	v := gjson.Parse(raw)
	if !v.IsObject() || !strings.Contains(raw, `"$ref"`) || v.Get("$id").Exists() {
		return raw
	}
	idJSON, _ := json.Marshal(id)
	rest := strings.TrimSpace(strings.TrimSpace(raw)[1:])
	if rest != "}" {
		rest = "," + rest
	}
	return `{"$id":` + string(idJSON) + rest
}

func grammarFor(schema, param string) (string, error) {
	g, err := SchemaToGBNF([]byte(schema))
	if err != nil {
		return "", badRequest(param, "%v", err)
	}
	return g, nil
}

// withPlan adds the plan's system message to msgs and renders assistant
// tool_calls of the conversation in the generic JSON; msgs and raw are the
// body's messages, index for index.
func withPlan(msgs []llama.ChatMessage, raw []chatMessage, body []byte, sys string) []llama.ChatMessage {
	gjson.GetBytes(body, "messages").ForEach(func(k, m gjson.Result) bool {
		i := int(k.Int())
		if tc := m.Get("tool_calls"); m.Get("role").Str == "assistant" && tc.IsArray() && i < len(msgs) {
			var calls []string
			for _, c := range tc.Array() {
				args := c.Get("function.arguments").Str
				if !gjson.Valid(args) {
					b, _ := json.Marshal(args)
					args = string(b)
				}
				name, _ := json.Marshal(c.Get("function.name").Str)
				calls = append(calls, `{"name":`+string(name)+`,"arguments":`+args+`}`)
			}
			msgs[i].Content += `{"tool_calls":[` + strings.Join(calls, ",") + `]}`
		}
		return true
	})
	if sys == "" {
		return msgs
	}
	if len(msgs) > 0 && msgs[0].Role == "system" {
		msgs[0].Content += "\n\n" + sys
		return msgs
	}
	return append([]llama.ChatMessage{{Role: "system", Content: sys}}, msgs...)
}

// toolCall is one OpenAI tool call (ChatCompletionMessageToolCall).
type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// decodeTools reads the generic tool-call JSON of one choice: the calls, or
// the content of a response, and the finish reason. A choice cut before its
// JSON ended (finish "length" at max_tokens, or a stop sequence) is decoded
// as far as it goes by decodePartialTools and keeps its finish reason, as
// OpenAI answers a tool call cut by max_tokens: tool_calls with the partial
// arguments, finish_reason "length". The engine's JSON is never content.
func decodeTools(text, finish string) ([]toolCall, *string, string) {
	if finish != "stop" || !gjson.Valid(text) {
		calls, content := decodePartialTools(text)
		return calls, content, finish
	}
	v := gjson.Parse(text)
	var raw []gjson.Result
	if tc := v.Get("tool_calls"); tc.IsArray() {
		raw = tc.Array()
	} else if tc := v.Get("tool_call"); tc.IsObject() {
		raw = []gjson.Result{tc}
	}
	if len(raw) == 0 {
		r := v.Get("response")
		s := r.Raw
		if r.Type == gjson.String {
			s = r.Str
		} else {
			var b bytes.Buffer
			if json.Compact(&b, []byte(r.Raw)) == nil {
				s = b.String()
			}
		}
		return nil, &s, "stop"
	}
	calls := make([]toolCall, len(raw))
	for i, c := range raw {
		calls[i] = newToolCall(c.Get("name").Str, c.Get("arguments").Raw)
	}
	return calls, nil, "tool_calls"
}

// newToolCall is a call of name with the JSON text args, compacted when it
// is whole.
func newToolCall(name, args string) toolCall {
	var c toolCall
	c.ID, c.Type, c.Function.Name = newID("call_"), "function", name
	var b bytes.Buffer
	if json.Compact(&b, []byte(args)) != nil {
		b.Reset()
		b.WriteString(args)
	}
	c.Function.Arguments = b.String()
	return c
}

// decodePartialTools decodes a prefix of the generic tool-call JSON (what
// the grammar allows, cut anywhere): {"tool_calls":[call…, {"tool_call":call
// or {"response":value. Each whole call is decoded as decodeTools does; the
// call being written when the text stopped is a call once its name's string
// is whole, its arguments the JSON text written so far (as OpenAI returns a
// call cut by max_tokens); before that it is dropped, since a call without
// a name names no tool. A cut
// response is its string decoded so far (or the raw JSON written of a
// non-string response). Text that stops before it is known to be a call
// (before the first member name is whole, or before the first call's
// name is whole) is neither: no calls and empty content.
func decodePartialTools(text string) ([]toolCall, *string) {
	empty := ""
	i := skipWS(text, 0)
	if i >= len(text) || text[i] != '{' {
		return nil, &empty
	}
	key, i, ok := partialKey(text, i+1)
	if !ok {
		return nil, &empty
	}
	switch key {
	case "response":
		if i < len(text) && text[i] == '"' {
			s := partialString(text[i:])
			return nil, &s
		}
		s := strings.TrimSpace(text[i:])
		if e, whole := valueEnd(text, i); whole {
			s = text[i:e]
		}
		return nil, &s
	case "tool_call":
		if c, ok := partialCall(text, i); ok && c.Function.Name != "" {
			return []toolCall{c}, nil
		}
		return nil, &empty
	case "tool_calls":
		if i >= len(text) || text[i] != '[' {
			return nil, &empty
		}
		var calls []toolCall
		for i = skipWS(text, i+1); i < len(text) && text[i] == '{'; {
			c, ok := partialCall(text, i)
			if !ok {
				break
			}
			if c.Function.Name != "" {
				calls = append(calls, c)
			}
			e, whole := valueEnd(text, i)
			if !whole {
				break
			}
			if i = skipWS(text, e); i < len(text) && text[i] == ',' {
				i = skipWS(text, i+1)
			}
		}
		if len(calls) == 0 {
			return nil, &empty
		}
		return calls, nil
	}
	return nil, &empty
}

// partialCall decodes the call object starting at text[i] ('{'), whole or
// cut (its name "" until the name's string is whole); ok is false when
// text[i] is not '{'.
func partialCall(text string, i int) (toolCall, bool) {
	if i >= len(text) || text[i] != '{' {
		return toolCall{}, false
	}
	if e, whole := valueEnd(text, i); whole {
		v := gjson.Parse(text[i:e])
		return newToolCall(v.Get("name").Str, v.Get("arguments").Raw), true
	}
	var name, args string
	for j := i + 1; ; {
		key, k, ok := partialKey(text, j)
		if !ok {
			break
		}
		e, whole := valueEnd(text, k)
		switch key {
		case "name":
			if whole {
				name = gjson.Parse(text[k:e]).Str
			}
		case "arguments":
			args = strings.TrimRight(text[k:e], " \t\n\r")
		}
		if !whole {
			break
		}
		if j = skipWS(text, e); j >= len(text) || text[j] != ',' {
			break
		}
		j++
	}
	c := newToolCall(name, "")
	c.Function.Arguments = args
	return c, true
}

// partialKey reads an object member name from text[i:] (after '{' or ','):
// the name and where its value starts (after the ':'); ok is false when
// the text ends first.
func partialKey(text string, i int) (string, int, bool) {
	i = skipWS(text, i)
	if i >= len(text) || text[i] != '"' {
		return "", 0, false
	}
	e, whole := valueEnd(text, i)
	if !whole {
		return "", 0, false
	}
	key := gjson.Parse(text[i:e]).Str
	i = skipWS(text, e)
	if i >= len(text) || text[i] != ':' {
		return "", 0, false
	}
	return key, skipWS(text, i+1), true
}

// valueEnd is where the JSON value starting at text[i] ends; whole is
// false when the text ends first (then end is len(text)). The text is a
// prefix of valid JSON (the grammar's), so only strings and nesting are
// tracked.
func valueEnd(text string, i int) (end int, whole bool) {
	depth := 0
	for j := i; j < len(text); j++ {
		switch c := text[j]; c {
		case '"':
			for j++; j < len(text) && text[j] != '"'; j++ {
				if text[j] == '\\' {
					j++
				}
			}
			if j >= len(text) {
				return len(text), false
			}
			if depth == 0 {
				return j + 1, true
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 { // the end of a number or literal
				return j, true
			}
			if depth--; depth == 0 {
				return j + 1, true
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 { // the end of a number or literal
				return j, true
			}
		}
	}
	return len(text), false
}

// partialString decodes the JSON string raw (its opening quote first), cut
// anywhere: an escape cut in the middle is dropped.
func partialString(raw string) string {
	if e, whole := valueEnd(raw, 0); whole {
		return gjson.Parse(raw[:e]).Str
	}
	for cut := len(raw); cut > 0 && cut >= len(raw)-6; cut-- {
		if s := raw[:cut] + `"`; gjson.Valid(s) {
			return gjson.Parse(s).Str
		}
	}
	return ""
}

func skipWS(text string, i int) int {
	for i < len(text) && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r') {
		i++
	}
	return i
}

// serveTools answers a chat request whose plan has tools, streaming or not.
// The tool-call JSON is decoded once a choice has finished, so a stream
// sends the role first and each choice's calls (or content) when it ends.
func (e *Engine) serveTools(w http.ResponseWriter, ctx context.Context, cr *completionRequest, req Request, id string, created int64) {
	texts := make([]strings.Builder, req.N)
	var fingerprint string
	includeUsage := cr.StreamOptions != nil && cr.StreamOptions.IncludeUsage
	var send func(v any) error
	chunk := func(choice map[string]any) map[string]any {
		m := map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": cr.Model, "choices": []any{choice}}
		if fingerprint != "" {
			m["system_fingerprint"] = fingerprint
		}
		if includeUsage {
			m["usage"] = nil
		}
		return m
	}
	if cr.Stream {
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		send = func(v any) error {
			b, err := json.Marshal(v)
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
				return err
			}
			_ = rc.Flush()
			return nil
		}
		for i := range req.N {
			if err := send(chunk(map[string]any{"index": i, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil})); err != nil {
				return
			}
		}
	}
	type result struct {
		calls   []toolCall
		content *string
		finish  string
	}
	results := make([]result, req.N)
	usage, err := e.Generate(ctx, req, func(ev Event) error {
		if ev.Version != "" {
			fingerprint = ev.Version
		}
		texts[ev.Index].WriteString(ev.Text)
		if ev.Finish == "" {
			return nil
		}
		calls, content, finish := decodeTools(texts[ev.Index].String(), ev.Finish)
		results[ev.Index] = result{calls, content, finish}
		if send == nil {
			return nil
		}
		if len(calls) > 0 {
			deltas := make([]map[string]any, len(calls))
			for i, c := range calls {
				deltas[i] = map[string]any{"index": i, "id": c.ID, "type": c.Type, "function": c.Function}
			}
			if err := send(chunk(map[string]any{"index": ev.Index, "delta": map[string]any{"tool_calls": deltas}, "logprobs": nil, "finish_reason": nil})); err != nil {
				return err
			}
		} else if content != nil && *content != "" {
			if err := send(chunk(map[string]any{"index": ev.Index, "delta": map[string]any{"content": *content}, "logprobs": nil, "finish_reason": nil})); err != nil {
				return err
			}
		}
		return send(chunk(map[string]any{"index": ev.Index, "delta": map[string]any{}, "logprobs": nil, "finish_reason": finish}))
	})
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		ae := classify(err)
		if send != nil {
			_ = send(errorBody(ae.typ, ae.param, ae.code, ae.msg))
		} else {
			writeError(w, ae.status, ae.typ, ae.param, ae.code, ae.msg)
		}
		return
	}
	if send != nil {
		if includeUsage {
			m := map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": cr.Model, "choices": []any{}, "usage": usage}
			if fingerprint != "" {
				m["system_fingerprint"] = fingerprint
			}
			_ = send(m)
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
		return
	}
	choices := make([]map[string]any, req.N)
	for i, r := range results {
		msg := map[string]any{"role": "assistant", "content": r.content, "refusal": nil}
		if len(r.calls) > 0 {
			msg["tool_calls"] = r.calls
		}
		choices[i] = map[string]any{"index": i, "finish_reason": r.finish, "logprobs": nil, "message": msg}
	}
	resp := map[string]any{"id": id, "object": "chat.completion", "created": created, "model": cr.Model, "choices": choices, "usage": usage}
	if fingerprint != "" {
		resp["system_fingerprint"] = fingerprint
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}
