package translate

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/relay"
)

// minOutputTokens is the least max_output_tokens OpenAI's API description
// allows (CreateResponse: minimum 16); a smaller one is a 400.
const minOutputTokens = 16

// FromResponses translates a Responses API request (CreateResponse) into a
// chat completions request:
//
//   - instructions become the system message; previous_response_id puts the
//     stored conversation it names (store must have it, for member) after
//     it — the earlier instructions are not carried over, as in OpenAI's
//     API; input (a string, or message, function_call and
//     function_call_output items; reasoning items are skipped) follows as
//     chat messages, consecutive function calls in one assistant message;
//   - function tools and tool_choice (an allowed_tools one of function
//     tools too), parallel_tool_calls (these two sent only with tools, as
//     OpenAI's chat completions requires),
//     max_output_tokens (as max_completion_tokens), temperature, top_p,
//     top_logprobs, user, service_tier, safety_identifier,
//     prompt_cache_key, text.format (as response_format), text.verbosity
//     (as verbosity) and
//     reasoning.effort (as reasoning_effort) map to their chat parameters;
//     reasoning.summary is echoed but asks for nothing (chat completions
//     has no summaries); a stream asks for the usage chunk; include
//     message.output_text.logprobs asks for logprobs, returned in each
//     output_text part and text delta (the chat logprobs' items, which
//     have LogProb's members);
//   - what chat completions cannot express is a 400 naming the parameter:
//     hosted tools (web search, file search, …), item references, files by
//     id, background mode, prompt templates; so is stream, store, tools,
//     parallel_tool_calls or metadata of the wrong JSON type.
//
// The answer is stored when the request does not set store: false (and
// store is not nil). Errors are *openai.Error: 400 for a bad request, 404
// for an unknown previous_response_id.
func FromResponses(ctx context.Context, body []byte, store Store, member string) ([]byte, *Translation, *openai.Error) {
	root, aerr := object(body)
	if aerr != nil {
		return nil, nil, aerr
	}
	if aerr := checkKinds(root, [2]string{"stream", "a boolean"}, [2]string{"store", "a boolean"}, [2]string{"tools", "an array"},
		[2]string{"parallel_tool_calls", "a boolean"}, [2]string{"metadata", "an object"}, [2]string{"include", "an array"},
		[2]string{"top_logprobs", "an integer"}, [2]string{"user", "a string"}, [2]string{"text", "an object"}, [2]string{"text.format", "an object"},
		[2]string{"truncation", "a string"}, [2]string{"max_tool_calls", "an integer"}, [2]string{"stream_options", "an object"},
		[2]string{"service_tier", "a string"}, [2]string{"safety_identifier", "a string"}, [2]string{"prompt_cache_key", "a string"}); aerr != nil {
		return nil, nil, aerr
	}
	if v := root.Get("max_tool_calls"); v.Type == gjson.Number && v.Int() < 0 {
		e := openai.InvalidRequest("max_tool_calls", "Invalid 'max_tool_calls': integer below minimum value. Expected a value >= 0, but got %s instead.", v.Raw)
		e.Code = openai.CodeIntegerBelowMin
		return nil, nil, e
	}
	if v := root.Get("truncation"); v.Type == gjson.String && v.Str != "auto" && v.Str != "disabled" {
		return nil, nil, openai.InvalidValue("truncation", "Invalid value for 'truncation': '%s'. Supported values are: 'auto' and 'disabled'.", v.Str)
	}
	for i, v := range root.Get("include").Array() {
		if v.Type != gjson.String || !slices.Contains(includables, v.Str) {
			return nil, nil, openai.InvalidValue("include["+strconv.Itoa(i)+"]", "Invalid value for 'include[%d]': %s. Supported values are: '%s'.", i, v.Raw, strings.Join(includables, "', '"))
		}
	}
	if v := root.Get("text.format"); v.IsObject() && v.Get("type").Type != gjson.String {
		return nil, nil, openai.WrongType("text.format.type", "a string", v.Get("type"))
	}
	t := &Translation{API: APIResponses, Model: root.Get("model").Str, Stream: root.Get("stream").Bool(), req: root,
		id: relay.NewID("resp_"), member: member, MaxToolCalls: -1}
	if v := root.Get("max_tool_calls"); v.Type == gjson.Number {
		t.MaxToolCalls = int(v.Int())
	}
	if root.Get("store").Type != gjson.False {
		t.store = store
	}
	for _, p := range []string{"background", "prompt", "conversation"} {
		if v := root.Get(p); v.Exists() && v.Type != gjson.Null && v.Type != gjson.False {
			return nil, nil, openai.Unsupported(p, "'%s' is not supported by this gateway.", p)
		}
	}
	chat := map[string]any{"model": t.Model}
	var msgs []json.RawMessage
	switch ins := root.Get("instructions"); {
	case !ins.Exists() || ins.Type == gjson.Null:
	case ins.Type == gjson.String:
		if ins.Str != "" {
			msgs = append(msgs, marshal(map[string]any{"role": "system", "content": ins.Str}))
		}
	default:
		return nil, nil, openai.WrongType("instructions", "a string", ins)
	}
	if prev := root.Get("previous_response_id"); prev.Exists() && prev.Type != gjson.Null {
		if prev.Type != gjson.String || prev.Str == "" {
			return nil, nil, openai.WrongType("previous_response_id", "a response id", prev)
		}
		if store == nil {
			return nil, nil, openai.Unsupported("previous_response_id", "This gateway stores no responses, so previous_response_id cannot be used.")
		}
		s, err := store.Response(ctx, prev.Str, member)
		if errors.Is(err, ErrNotFound) {
			return nil, nil, &openai.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "previous_response_id",
				Code: "previous_response_not_found", Message: "Previous response with id '" + prev.Str + "' not found."}
		}
		if err != nil {
			return nil, nil, &openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Message: "Reading the previous response failed; try again."}
		}
		gjson.ParseBytes(s.Messages).ForEach(func(_, m gjson.Result) bool {
			t.history = append(t.history, json.RawMessage(m.Raw))
			return true
		})
		t.StoredConversation = true
	}
	known := map[string]bool{} // the tool call ids of the stored conversation
	for _, m := range t.history {
		gjson.GetBytes(m, "tool_calls.#.id").ForEach(func(_, id gjson.Result) bool {
			known[id.Str] = true
			return true
		})
	}
	in, aerr := inputMessages(root.Get("input"), known)
	if aerr != nil {
		return nil, nil, aerr
	}
	t.history = append(t.history, in...)
	msgs = append(msgs, t.history...)
	if len(msgs) == 0 {
		return nil, nil, openai.MissingParameter("input", "Missing required parameter: 'input'.")
	}
	chat["messages"] = msgs
	if aerr := responsesTools(root, chat); aerr != nil {
		return nil, nil, aerr
	}
	if v := root.Get("parallel_tool_calls"); (v.Type == gjson.True || v.Type == gjson.False) && chat["tools"] != nil {
		// Only with tools: OpenAI refuses parallel_tool_calls without them.
		chat["parallel_tool_calls"] = v.Bool()
	}
	if v := root.Get("max_output_tokens"); v.Exists() && v.Type != gjson.Null {
		n, err := strconv.Atoi(v.Raw)
		if v.Type != gjson.Number || err != nil || n < 1 {
			e := openai.InvalidRequest("max_output_tokens", "Invalid 'max_output_tokens': expected a positive integer, but got %s.", v.Raw)
			e.Code = openai.CodeIntegerBelowMin
			if v.Type != gjson.Number || err != nil {
				e.Code = openai.CodeInvalidType
			}
			return nil, nil, e
		}
		if n < minOutputTokens {
			e := openai.InvalidRequest("max_output_tokens", "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= %d, but got %d instead.", minOutputTokens, n)
			e.Code = openai.CodeIntegerBelowMin
			return nil, nil, e
		}
		chat["max_completion_tokens"] = json.RawMessage(v.Raw)
	}
	for _, p := range []string{"temperature", "top_p"} {
		if aerr := copyNumber(chat, p, root, p); aerr != nil {
			return nil, nil, aerr
		}
	}
	if v := root.Get("top_logprobs"); v.Type == gjson.Number {
		chat["logprobs"], chat["top_logprobs"] = true, json.RawMessage(v.Raw)
	}
	for _, v := range root.Get("include").Array() {
		if v.Str == "message.output_text.logprobs" {
			t.logprobs, chat["logprobs"] = true, true
		}
	}
	// Parameters chat completions has under the same name and meaning.
	for _, p := range []string{"user", "service_tier", "safety_identifier", "prompt_cache_key"} {
		if v := root.Get(p); v.Type == gjson.String {
			chat[p] = v.Str
		}
	}
	switch v := root.Get("text.verbosity"); {
	case !v.Exists() || v.Type == gjson.Null:
	case v.Type == gjson.String && slices.Contains(verbosities, v.Str):
		chat["verbosity"] = v.Str
	default:
		return nil, nil, openai.InvalidValue("text.verbosity", "Invalid value for 'text.verbosity': %s. Supported values are: '%s'.", v.Raw, strings.Join(verbosities, "', '"))
	}
	switch f := root.Get("text.format"); f.Get("type").Str {
	case "", "text":
	case "json_object":
		chat["response_format"] = map[string]any{"type": "json_object"}
	case "json_schema":
		js := map[string]any{"name": f.Get("name").Str}
		for _, k := range []string{"schema", "strict", "description"} {
			if v := f.Get(k); v.Exists() {
				js[k] = json.RawMessage(v.Raw)
			}
		}
		chat["response_format"] = map[string]any{"type": "json_schema", "json_schema": js}
	default:
		return nil, nil, openai.InvalidValue("text.format.type", "Invalid value for 'text.format.type': '%s'. Supported values are: 'text', 'json_object' and 'json_schema'.", f.Get("type").Str)
	}
	if aerr := reasoningParams(root.Get("reasoning"), chat); aerr != nil {
		return nil, nil, aerr
	}
	if t.Stream {
		chat["stream"] = true
		chat["stream_options"] = map[string]any{"include_usage": true}
	}
	return marshal(chat), t, nil
}

// includables are the values of include (IncludeEnum in OpenAI's API
// description). Only message.output_text.logprobs asks for something here
// (chat completions has none of the others' tools or encrypted reasoning);
// the others are accepted and return nothing more.
var includables = []string{"file_search_call.results", "web_search_call.results", "web_search_call.action.sources", "message.input_image.image_url",
	"computer_call_output.output.image_url", "code_interpreter_call.outputs", "reasoning.encrypted_content", "message.output_text.logprobs"}

// verbosities are the values of text.verbosity (Verbosity in OpenAI's API
// description), chat's verbosity.
var verbosities = []string{"low", "medium", "high"}

// reasoningEfforts and reasoningSummaries are the values of the Reasoning
// object's effort (ReasoningEffort) and summary in OpenAI's API description.
var (
	reasoningEfforts   = []string{"none", "minimal", "low", "medium", "high", "xhigh", "max"}
	reasoningSummaries = []string{"auto", "concise", "detailed"}
)

// reasoningParams checks the request's reasoning object and sets the chat
// request's reasoning_effort from its effort. Errors are 400s naming the
// parameter: a reasoning that is not an object, an effort or summary that
// is not one of the API's values.
func reasoningParams(r gjson.Result, chat map[string]any) *openai.Error {
	if !r.Exists() || r.Type == gjson.Null {
		return nil
	}
	if !r.IsObject() {
		return openai.WrongType("reasoning", "an object", r)
	}
	for _, f := range []struct {
		name   string
		values []string
	}{{"effort", reasoningEfforts}, {"summary", reasoningSummaries}, {"generate_summary", reasoningSummaries}} {
		v := r.Get(f.name)
		if !v.Exists() || v.Type == gjson.Null {
			continue
		}
		if v.Type != gjson.String || !slices.Contains(f.values, v.Str) {
			return openai.InvalidValue("reasoning."+f.name, "Invalid value for 'reasoning.%s': %s. Supported values are: '%s'.",
				f.name, v.Raw, strings.Join(f.values, "', '"))
		}
		if f.name == "effort" {
			chat["reasoning_effort"] = v.Str
		}
	}
	return nil
}

// inputMessages translates the input (a string or items) into chat
// messages. known holds the call ids of the stored conversation (the
// input's function_call items are added): a function_call_output whose
// call_id is none of them is a 400 (param "input"), as OpenAI answers it.
func inputMessages(input gjson.Result, known map[string]bool) ([]json.RawMessage, *openai.Error) {
	switch {
	case !input.Exists() || input.Type == gjson.Null:
		return nil, nil
	case input.Type == gjson.String:
		return []json.RawMessage{marshal(map[string]any{"role": "user", "content": input.Str})}, nil
	case !input.IsArray():
		return nil, openai.WrongType("input", "a string or an array of input items", input)
	}
	var out []map[string]any
	var bad *openai.Error
	i := 0
	input.ForEach(func(_, item gjson.Result) bool {
		param := "input[" + strconv.Itoa(i) + "]"
		i++
		if !item.IsObject() {
			bad = openai.WrongType(param, "an object", item)
			return false
		}
		typ := item.Get("type").Str
		if typ == "" && item.Get("role").Exists() {
			typ = "message"
		}
		switch typ {
		case "message":
			m, err := inputMessage(param, item)
			if err != nil {
				bad = err
				return false
			}
			out = append(out, m)
		case "function_call":
			for _, f := range []string{"call_id", "name", "arguments"} {
				if v := item.Get(f); v.Type != gjson.String {
					bad = openai.WrongType(param+"."+f, "a string", v)
					return false
				}
			}
			known[item.Get("call_id").Str] = true
			call := map[string]any{"id": item.Get("call_id").Str, "type": "function",
				"function": map[string]any{"name": item.Get("name").Str, "arguments": item.Get("arguments").Str}}
			if n := len(out); n > 0 && out[n-1]["role"] == "assistant" {
				calls, _ := out[n-1]["tool_calls"].([]any)
				out[n-1]["tool_calls"] = append(calls, call)
			} else {
				out = append(out, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{call}})
			}
		case "function_call_output":
			if v := item.Get("call_id"); v.Type != gjson.String {
				bad = openai.WrongType(param+".call_id", "a string", v)
				return false
			}
			if id := item.Get("call_id").Str; !known[id] {
				bad = openai.InvalidRequest("input", "No tool call found for function call output with call_id %s.", id)
				return false
			}
			o := item.Get("output")
			if o.Type != gjson.String && !o.IsArray() {
				bad = openai.WrongType(param+".output", "a string or an array of content parts", o)
				return false
			}
			text := o.Str
			if o.IsArray() {
				text = joinText(o, "text")
			}
			out = append(out, map[string]any{"role": "tool", "tool_call_id": item.Get("call_id").Str, "content": text})
		case "reasoning":
			// Reasoning items of earlier turns: chat completions has no place for them.
		default:
			bad = openai.InvalidValue(param+".type", "Invalid value for '%s.type': '%s'. This gateway supports message, function_call, function_call_output and reasoning items.", param, typ)
			return false
		}
		return true
	})
	if bad != nil {
		return nil, bad
	}
	msgs := make([]json.RawMessage, len(out))
	for i, m := range out {
		msgs[i] = marshal(m)
	}
	return msgs, nil
}

// inputMessage translates one message item.
func inputMessage(param string, item gjson.Result) (map[string]any, *openai.Error) {
	role := item.Get("role").Str
	switch role {
	case "user", "assistant", "system", "developer":
	default:
		return nil, openai.InvalidValue(param+".role", "Invalid value for '%s.role': '%s'. Supported values are: 'user', 'assistant', 'system' and 'developer'.", param, role)
	}
	c := item.Get("content")
	if c.Type == gjson.String {
		return map[string]any{"role": role, "content": c.Str}, nil
	}
	if !c.IsArray() {
		return nil, openai.WrongType(param+".content", "a string or an array of content parts", c)
	}
	if role == "assistant" { // chat assistant content: text (and refusal)
		m := map[string]any{"role": "assistant", "content": joinText(c, "text")}
		if r := joinText(c, "refusal"); r != "" {
			m["refusal"] = r
		}
		return m, nil
	}
	var parts []any
	var bad *openai.Error
	j := 0
	c.ForEach(func(_, p gjson.Result) bool {
		pp := param + ".content[" + strconv.Itoa(j) + "]"
		j++
		switch p.Get("type").Str {
		case "input_text", "output_text", "text":
			if v := p.Get("text"); v.Type != gjson.String {
				bad = openai.WrongType(pp+".text", "a string", v)
				return false
			}
			parts = append(parts, map[string]any{"type": "text", "text": p.Get("text").Str})
		case "input_image":
			url := p.Get("image_url").Str
			if url == "" {
				bad = openai.Unsupported(pp+".image_url", "'%s.image_url' is required: this gateway has no file store for file_id.", pp)
				return false
			}
			img := map[string]any{"url": url}
			if d := p.Get("detail"); d.Type == gjson.String {
				img["detail"] = d.Str
			}
			parts = append(parts, map[string]any{"type": "image_url", "image_url": img})
		case "input_file":
			if p.Get("file_data").Type != gjson.String {
				bad = openai.Unsupported(pp+".file_data", "'%s.file_data' is required: this gateway has no file store for file_id or file_url.", pp)
				return false
			}
			parts = append(parts, map[string]any{"type": "file", "file": map[string]any{"file_data": p.Get("file_data").Str, "filename": p.Get("filename").Str}})
		case "input_audio":
			parts = append(parts, map[string]any{"type": "input_audio", "input_audio": map[string]any{
				"data": p.Get("input_audio.data").Str, "format": p.Get("input_audio.format").Str}})
		default:
			bad = openai.InvalidValue(pp+".type", "Invalid value for '%s.type': '%s'. Supported values are: 'input_text', 'input_image', 'input_file' and 'input_audio'.", pp, p.Get("type").Str)
			return false
		}
		return true
	})
	if bad != nil {
		return nil, bad
	}
	return map[string]any{"role": role, "content": parts}, nil
}

// joinText joins the field of the parts of array a that have it.
func joinText(a gjson.Result, field string) string {
	var b strings.Builder
	a.ForEach(func(_, p gjson.Result) bool {
		b.WriteString(p.Get(field).Str)
		return true
	})
	return b.String()
}

// allowedTools translates an allowed_tools tool_choice (ToolChoiceAllowed:
// {"type": "allowed_tools", "mode": "auto"|"required", "tools": [{"type":
// "function", "name"}…]}) into chat's ({"type": "allowed_tools",
// "allowed_tools": {"mode", "tools": [{"type": "function", "function":
// {"name"}}…]}}). A mode of another value, tools that are not an array, an
// entry without a string name, or a tool that is not a function (hosted
// tools chat completions cannot call) is a 400 naming it.
func allowedTools(tc gjson.Result, chat map[string]any) *openai.Error {
	mode := tc.Get("mode")
	if mode.Str != "auto" && mode.Str != "required" || mode.Type != gjson.String {
		return openai.InvalidValue("tool_choice.mode", "Invalid value for 'tool_choice.mode': %s. Supported values are: 'auto' and 'required'.", mode.Raw)
	}
	list := tc.Get("tools")
	if !list.IsArray() {
		return openai.WrongType("tool_choice.tools", "an array", list)
	}
	tools := []any{}
	for i, tl := range list.Array() {
		param := "tool_choice.tools[" + strconv.Itoa(i) + "]"
		if tl.Get("type").Str != "function" {
			return openai.Unsupported(param+".type", "Tools of type '%s' are not supported by this gateway; only function tools are.", tl.Get("type").Str)
		}
		if n := tl.Get("name"); n.Type != gjson.String {
			return openai.WrongType(param+".name", "a string", n)
		}
		tools = append(tools, map[string]any{"type": "function", "function": map[string]any{"name": tl.Get("name").Str}})
	}
	chat["tool_choice"] = map[string]any{"type": "allowed_tools", "allowed_tools": map[string]any{"mode": mode.Str, "tools": tools}}
	return nil
}

// responsesTools translates tools and tool_choice.
func responsesTools(root gjson.Result, chat map[string]any) *openai.Error {
	var tools []any
	var bad *openai.Error
	i := 0
	root.Get("tools").ForEach(func(_, tl gjson.Result) bool {
		param := "tools[" + strconv.Itoa(i) + "]"
		i++
		if tl.Get("type").Str != "function" {
			bad = openai.Unsupported(param+".type", "Tools of type '%s' are not supported by this gateway; only function tools are.", tl.Get("type").Str)
			return false
		}
		fn := map[string]any{"name": tl.Get("name").Str}
		for _, k := range []string{"description", "parameters", "strict"} {
			if v := tl.Get(k); v.Exists() && v.Type != gjson.Null {
				fn[k] = json.RawMessage(v.Raw)
			}
		}
		tools = append(tools, map[string]any{"type": "function", "function": fn})
		return true
	})
	if bad != nil {
		return bad
	}
	if len(tools) > 0 {
		chat["tools"] = tools
	}
	switch tc := root.Get("tool_choice"); {
	case !tc.Exists() || tc.Type == gjson.Null:
	case tc.Type == gjson.String:
		if tc.Str != "none" && tc.Str != "auto" && tc.Str != "required" {
			return openai.InvalidValue("tool_choice", "Invalid value for 'tool_choice': '%s'. Supported values are: 'none', 'auto' and 'required'.", tc.Str)
		}
		chat["tool_choice"] = tc.Str
	case tc.Get("type").Str == "function":
		if n := tc.Get("name"); n.Type != gjson.String {
			return openai.WrongType("tool_choice.name", "a string", n)
		}
		chat["tool_choice"] = map[string]any{"type": "function", "function": map[string]any{"name": tc.Get("name").Str}}
	case tc.Get("type").Str == "allowed_tools":
		if err := allowedTools(tc, chat); err != nil {
			return err
		}
	default:
		return openai.Unsupported("tool_choice", "tool_choice of type '%s' is not supported by this gateway.", tc.Get("type").Str)
	}
	if len(tools) == 0 {
		// OpenAI refuses a chat tool_choice without tools ("'tool_choice' is
		// only allowed when 'tools' are specified"), which the Responses
		// API takes (its default is auto with no tools): with none, there
		// is nothing to choose.
		delete(chat, "tool_choice")
	}
	return nil
}

// baseResponse is the Response object without output and usage: the
// request's parameters echoed, with OpenAI's defaults where it set none.
// service_tier is the request's (auto when it set none); the finished
// Response carries the tier used instead (usedTier).
func (t *Translation) baseResponse(created int64, status string) map[string]any {
	r := t.req
	or := func(path string, def any) any {
		if v := r.Get(path); v.Exists() && v.Type != gjson.Null {
			return json.RawMessage(v.Raw)
		}
		return def
	}
	tools := []any{}
	r.Get("tools").ForEach(func(_, tl gjson.Result) bool {
		tools = append(tools, map[string]any{"type": "function", "name": tl.Get("name").Str,
			"description": or0(tl.Get("description")), "parameters": or0(tl.Get("parameters")), "strict": or0(tl.Get("strict"))})
		return true
	})
	format := any(map[string]any{"type": "text"})
	if f := r.Get("text.format"); f.IsObject() {
		format = json.RawMessage(f.Raw)
	}
	resp := map[string]any{
		"id": t.id, "object": "response", "created_at": created, "status": status,
		"error": nil, "incomplete_details": nil,
		"instructions":         or("instructions", nil),
		"max_output_tokens":    or("max_output_tokens", nil),
		"model":                t.Model,
		"output":               []any{},
		"parallel_tool_calls":  or("parallel_tool_calls", true),
		"previous_response_id": or("previous_response_id", nil),
		"reasoning":            map[string]any{"effort": or("reasoning.effort", nil), "summary": or("reasoning.summary", nil)},
		"store":                t.store != nil,
		"temperature":          or("temperature", 1),
		"text":                 map[string]any{"format": format, "verbosity": or("text.verbosity", "medium")},
		"top_logprobs":         or("top_logprobs", 0),
		"tool_choice":          or("tool_choice", "auto"),
		"tools":                tools,
		"top_p":                or("top_p", 1),
		"truncation":           "disabled",
		"metadata":             or("metadata", map[string]any{}),
		"max_tool_calls":       or("max_tool_calls", nil),
		"service_tier":         or("service_tier", "auto"),
	}
	for _, p := range []string{"user", "safety_identifier", "prompt_cache_key"} {
		if v := r.Get(p); v.Type == gjson.String {
			resp[p] = v.Str
		}
	}
	return resp
}

// usedTier is the service tier a finished Response reports: the one the
// upstream's chat answer names (OpenAI's ServiceTier: "the response body
// will include the service_tier value based on the processing mode
// actually used to serve the request"), else "default" — an upstream that
// names none (a self-hosted server, the T0 engine) served it the one way
// it has.
func usedTier(reported gjson.Result) string {
	if reported.Type == gjson.String && reported.Str != "" {
		return reported.Str
	}
	return "default"
}

// or0 is v's raw JSON, or null.
func or0(v gjson.Result) any {
	if v.Exists() {
		return json.RawMessage(v.Raw)
	}
	return nil
}

// responseUsage is the ResponseUsage of a chat usage object.
func responseUsage(u gjson.Result) map[string]any {
	in, out := u.Get("prompt_tokens").Int(), u.Get("completion_tokens").Int()
	return map[string]any{
		"input_tokens": in, "input_tokens_details": map[string]any{"cached_tokens": u.Get("prompt_tokens_details.cached_tokens").Int(), "cache_write_tokens": 0},
		"output_tokens": out, "output_tokens_details": map[string]any{"reasoning_tokens": u.Get("completion_tokens_details.reasoning_tokens").Int()},
		"total_tokens": in + out,
	}
}

// statusOf maps a chat finish reason to the Response's status and
// incomplete_details.
func statusOf(finish string) (string, any) {
	switch finish {
	case "length":
		return "incomplete", map[string]any{"reason": "max_output_tokens"}
	case "content_filter":
		return "incomplete", map[string]any{"reason": "content_filter"}
	}
	return "completed", nil
}

// outputText is an output_text content part; lps are its tokens'
// logprobs (LogProb items: the chat answer's logprobs.content, whose items
// have the same members), none when nil.
func outputText(text string, lps []any) map[string]any {
	if lps == nil {
		lps = []any{}
	}
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": lps}
}

// chatLogprobs are the token logprobs of a chat choice (or chunk choice)
// ch, as raw items, when t's request included them; nil otherwise.
func (t *Translation) chatLogprobs(ch gjson.Result) []any {
	if !t.logprobs {
		return nil
	}
	var lps []any
	content := ch.Get("logprobs.content")
	if !content.IsArray() {
		return nil // null: no tokens (gjson's ForEach would call back once with the null)
	}
	content.ForEach(func(_, l gjson.Result) bool {
		lps = append(lps, json.RawMessage(l.Raw))
		return true
	})
	return lps
}

// reasoningItem is a reasoning output item (ReasoningItem) holding the
// reasoning text as one reasoning_text content part, without summary.
func reasoningItem(id, text, status string) map[string]any {
	content := []any{}
	if text != "" {
		content = append(content, reasoningText(text))
	}
	return map[string]any{"type": "reasoning", "id": id, "summary": []any{}, "content": content, "status": status}
}

// reasoningText is a reasoning_text content part.
func reasoningText(text string) map[string]any {
	return map[string]any{"type": "reasoning_text", "text": text}
}

// responseFromChat translates a chat completion into a Response, and
// returns the answer as a chat message, for storing. The message's
// reasoning_content (the reasoning of the T0 engine, llama.cpp's server,
// DeepSeek) or reasoning (vLLM's name since 0.10, Ollama's, OpenRouter's;
// reasoningOf) becomes a reasoning item before the message; its tokens
// are usage.output_tokens_details.reasoning_tokens (responseUsage).
func (t *Translation) responseFromChat(chat []byte) (resp []byte, assistant map[string]any) {
	root := gjson.ParseBytes(chat)
	ch := root.Get("choices.0")
	msg := ch.Get("message")
	status, incomplete := statusOf(ch.Get("finish_reason").Str)
	r := t.baseResponse(root.Get("created").Int(), status)
	r["incomplete_details"] = incomplete
	r["service_tier"] = usedTier(root.Get("service_tier"))
	var output []any
	assistant = map[string]any{"role": "assistant", "content": nil}
	if rc := reasoningOf(msg); rc != "" {
		output = append(output, reasoningItem(relay.NewID("rs_"), rc, "completed"))
	}
	if c := msg.Get("content"); c.Type == gjson.String && c.Str != "" {
		output = append(output, map[string]any{"type": "message", "id": relay.NewID("msg_"), "status": "completed", "role": "assistant",
			"content": []any{outputText(c.Str, t.chatLogprobs(ch))}})
		assistant["content"] = c.Str
	}
	if rf := msg.Get("refusal"); rf.Type == gjson.String && rf.Str != "" {
		output = append(output, map[string]any{"type": "message", "id": relay.NewID("msg_"), "status": "completed", "role": "assistant",
			"content": []any{map[string]any{"type": "refusal", "refusal": rf.Str}}})
		assistant["refusal"] = rf.Str
	}
	var calls []any
	msg.Get("tool_calls").ForEach(func(_, tc gjson.Result) bool {
		output = append(output, map[string]any{"type": "function_call", "id": relay.NewID("fc_"), "call_id": tc.Get("id").Str,
			"name": tc.Get("function.name").Str, "arguments": tc.Get("function.arguments").Str, "status": "completed"})
		calls = append(calls, json.RawMessage(tc.Raw))
		return true
	})
	if len(calls) > 0 {
		assistant["tool_calls"] = calls
	}
	if output == nil {
		output = []any{}
	}
	if status == "incomplete" && len(output) > 0 {
		// The item the answer stopped in (the last) is incomplete too.
		output[len(output)-1].(map[string]any)["status"] = "incomplete"
	}
	r["output"] = output
	if status == "completed" {
		r["completed_at"] = time.Now().Unix()
	}
	if u := root.Get("usage"); u.IsObject() {
		r["usage"] = responseUsage(u)
	}
	return marshal(r), assistant
}

// save stores the finished response: the conversation sent, then the
// answer. A failure is returned (and the answer is still sent: the
// client's turn succeeded; only continuing it will fail).
func (t *Translation) save(ctx context.Context, resp []byte, assistant map[string]any, decisionID string) error {
	if t.store == nil {
		return nil
	}
	msgs := append(append([]json.RawMessage(nil), t.history...), marshal(assistant))
	return t.store.PutResponse(context.WithoutCancel(ctx), StoredResponse{ID: t.id, Member: t.member, Model: t.Model, DecisionID: decisionID,
		Messages: marshal(msgs), Response: resp})
}

// Delete is DELETE /v1/responses/{id}: it deletes the Response stored for
// member (a later previous_response_id naming it is a 404) and answers
// {"id", "object": "response", "deleted": true}. Errors as Retrieve's.
func Delete(ctx context.Context, store Store, id, member string) ([]byte, *openai.Error) {
	notFound := &openai.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "response_id",
		Message: "Response with id '" + id + "' not found."}
	if store == nil {
		return nil, notFound
	}
	err := store.DeleteResponse(ctx, id, member)
	if errors.Is(err, ErrNotFound) {
		return nil, notFound
	}
	if err != nil {
		return nil, &openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Message: "Deleting the response failed; try again."}
	}
	return marshal(map[string]any{"id": id, "object": "response", "deleted": true}), nil
}

// Retrieve is GET /v1/responses/{id}: the Response object stored for
// member, as it was sent. Errors (OpenAI's): 404 when store is nil, or the
// response is unknown, expired or another member's (not told apart); 500
// when the store fails.
func Retrieve(ctx context.Context, store Store, id, member string) ([]byte, *openai.Error) {
	notFound := &openai.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "response_id",
		Message: "Response with id '" + id + "' not found."}
	if store == nil {
		return nil, notFound
	}
	s, err := store.Response(ctx, id, member)
	if errors.Is(err, ErrNotFound) || (err == nil && len(s.Response) == 0) {
		return nil, notFound
	}
	if err != nil {
		return nil, &openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Message: "Reading the response failed; try again."}
	}
	return s.Response, nil
}
