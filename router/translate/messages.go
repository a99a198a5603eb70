package translate

import (
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/relay"
)

// FromMessages translates an Anthropic Messages API request into a chat
// completions request:
//
//   - system (a string or text blocks, joined one per line) becomes the
//     system message; each message's text blocks become text parts, image
//     blocks (base64 or URL sources) image_url parts, an assistant's tool_use blocks its
//     tool_calls (the input as JSON arguments), a user's tool_result blocks
//     tool messages (before the rest of that user turn; their text blocks
//     one per line, their images image_url parts of that user turn),
//     is_error results prefixed "Error: "; thinking blocks of earlier turns
//     are skipped;
//   - thinking {"type": "enabled"} (or "adaptive") returns the answer's
//     reasoning (a chat answer's reasoning_content) as a thinking block,
//     first, with an empty signature; budget_tokens (required with
//     "enabled", at least 1024, as Anthropic's API requires) becomes
//     Molly's max_reasoning_tokens, the T0 engine's reasoning budget
//     (egress removes it for other targets, whose own reasoning defaults
//     apply: chat completions has no budget, and reasoning_effort is
//     refused by models without reasoning);
//   - output_config.effort (low, medium, high, xhigh, max: the same words
//     as OpenAI's ReasoningEffort) becomes reasoning_effort, which every
//     target is sent (the T0 engine's reasoning budget per effort, a
//     remote's own reasoning effort); another value is a 400 naming it;
//   - tools (name, description, input_schema) become function tools;
//     tool_choice auto, any, tool and none become auto, required, the named
//     function and none (sent only with tools, as OpenAI requires),
//     disable_parallel_tool_use parallel_tool_calls
//     false; max_tokens, stop_sequences (as stop), temperature, top_p and
//     metadata.user_id (as user) map to their chat parameters (top_k has
//     no chat equivalent and is dropped); output_config.format (or the
//     beta's output_format), a JSON schema, becomes a strict json_schema
//     response_format; a stream asks for the usage chunk;
//   - the answer's stop_reason is stop_sequence, with stop_sequence naming
//     it, when the choice's "stop_reason" (vLLM's and Molly's engine's
//     report of the stop string that matched) is one of stop_sequences;
//   - stream, tools, tool_choice, stop_sequences (strings) and metadata of
//     the wrong JSON type, and a temperature or top_p above 1 (Anthropic's
//     range), are a 400 naming the parameter;
//   - max_tokens is required, as in Anthropic's API; server tools (no
//     input_schema) and document blocks are a 400 naming the parameter.
func FromMessages(body []byte) ([]byte, *Translation, *openai.Error) {
	root, aerr := object(body)
	if aerr != nil {
		return nil, nil, aerr
	}
	if aerr := checkKinds(root, [2]string{"stream", "a boolean"}, [2]string{"tools", "an array"}, [2]string{"tool_choice", "an object"},
		[2]string{"stop_sequences", "an array"}, [2]string{"metadata", "an object"}, [2]string{"top_k", "an integer"},
		[2]string{"service_tier", "a string"}); aerr != nil {
		return nil, nil, aerr
	}
	if k := root.Get("top_k"); k.Type == gjson.Number && k.Int() < 0 {
		return nil, nil, openai.InvalidRequest("top_k", "top_k: Input should be greater than or equal to 0, got %s.", k.Raw)
	}
	t := &Translation{API: APIMessages, Model: root.Get("model").Str, Stream: root.Get("stream").Bool(), req: root, MaxToolCalls: -1}
	switch th := root.Get("thinking"); {
	case !th.Exists() || th.Type == gjson.Null:
	case !th.IsObject() || th.Get("type").Type != gjson.String:
		return nil, nil, openai.WrongType("thinking", `an object with a type ("enabled" or "disabled")`, th)
	default:
		t.thinking = th.Get("type").Str == "enabled" || th.Get("type").Str == "adaptive"
	}
	chat := map[string]any{"model": t.Model}
	mt := root.Get("max_tokens")
	if n, err := strconv.Atoi(mt.Raw); mt.Type != gjson.Number || err != nil || n < 1 {
		return nil, nil, openai.InvalidRequest("max_tokens", "max_tokens: Field required (a positive integer).")
	}
	chat["max_tokens"] = json.RawMessage(mt.Raw)
	if th := root.Get("thinking"); th.Get("type").Str == "enabled" {
		// Anthropic's budget: required with "enabled", at least 1024.
		b := th.Get("budget_tokens")
		if n, err := strconv.Atoi(b.Raw); b.Type != gjson.Number || err != nil || n < 1024 {
			return nil, nil, openai.InvalidRequest("thinking.budget_tokens", "thinking.budget_tokens: Input should be an integer greater than or equal to 1024.")
		}
		chat["max_reasoning_tokens"] = json.RawMessage(b.Raw)
	}
	var msgs []any
	switch sys := root.Get("system"); {
	case !sys.Exists() || sys.Type == gjson.Null:
	case sys.Type == gjson.String:
		msgs = append(msgs, map[string]any{"role": "system", "content": sys.Str})
	case sys.IsArray():
		for i, b := range sys.Array() {
			if b.Get("type").Str != "text" || b.Get("text").Type != gjson.String {
				return nil, nil, openai.WrongType("system."+strconv.Itoa(i), `a text block ({"type": "text", "text": "..."})`, b)
			}
		}
		// Blocks are separate texts (Claude Code sends its identity and its
		// instructions as two): joined one per line, never glued together.
		var parts []string
		sys.ForEach(func(_, b gjson.Result) bool {
			if t := b.Get("text"); t.Str != "" {
				parts = append(parts, t.Str)
			}
			return true
		})
		msgs = append(msgs, map[string]any{"role": "system", "content": strings.Join(parts, "\n")})
	default:
		return nil, nil, openai.WrongType("system", "a string or an array of text blocks", sys)
	}
	ms := root.Get("messages")
	if !ms.IsArray() || len(ms.Array()) == 0 {
		return nil, nil, openai.InvalidRequest("messages", "messages: Field required (a non-empty array).")
	}
	var bad *openai.Error
	i := 0
	known := map[string]bool{} // the tool_use ids of the messages so far
	ms.ForEach(func(_, m gjson.Result) bool {
		param := "messages." + strconv.Itoa(i)
		i++
		out, err := anthropicMessage(param, m, known)
		if err != nil {
			bad = err
			return false
		}
		msgs = append(msgs, out...)
		return true
	})
	if bad != nil {
		return nil, nil, bad
	}
	chat["messages"] = msgs
	if aerr := anthropicTools(root, chat); aerr != nil {
		return nil, nil, aerr
	}
	for _, p := range []string{"temperature", "top_p"} {
		if aerr := copyNumber(chat, p, root, p); aerr != nil {
			return nil, nil, aerr
		}
		// Anthropic's temperature ranges from 0 to 1 (chat's to 2).
		if v := root.Get(p); v.Type == gjson.Number && v.Float() > 1 {
			return nil, nil, openai.InvalidRequest(p, "%s: Input should be less than or equal to 1, got %s.", p, v.Raw)
		}
	}
	st := root.Get("stop_sequences")
	for i, s := range st.Array() {
		if s.Type != gjson.String {
			return nil, nil, openai.WrongType("stop_sequences."+strconv.Itoa(i), "a string", s)
		}
	}
	if st.IsArray() && len(st.Array()) > 0 {
		chat["stop"] = json.RawMessage(st.Raw)
	}
	if u := root.Get("metadata.user_id"); u.Type == gjson.String {
		chat["user"] = u.Str
	}
	if aerr := outputFormat(root, chat); aerr != nil {
		return nil, nil, aerr
	}
	switch e := root.Get("output_config.effort"); {
	case !e.Exists() || e.Type == gjson.Null:
	case e.Type != gjson.String:
		return nil, nil, openai.WrongType("output_config.effort", "a string", e)
	case !slices.Contains(efforts, e.Str):
		return nil, nil, openai.InvalidValue("output_config.effort", "output_config.effort: Input should be '%s'.", strings.Join(efforts, "', '"))
	default:
		// Anthropic's effort words are OpenAI's ReasoningEffort's.
		chat["reasoning_effort"] = e.Str
	}
	if t.Stream {
		chat["stream"] = true
		chat["stream_options"] = map[string]any{"include_usage": true}
	}
	return marshal(chat), t, nil
}

// efforts are the values of Anthropic's output_config.effort, each one of
// OpenAI's ReasoningEffort values too.
var efforts = []string{"low", "medium", "high", "xhigh", "max"}

// outputFormat translates Anthropic's structured output request —
// output_config.format, or output_format as the structured outputs beta
// named it: {"type": "json_schema", "schema": {...}} — into chat's
// response_format {"type": "json_schema", "json_schema": {"name":
// "output", "schema", "strict": true}} (Anthropic's structured outputs are
// always constrained to the schema). An output_config that is not an
// object, a format of another type or without an object schema is a 400
// naming it.
func outputFormat(root gjson.Result, chat map[string]any) *openai.Error {
	param := "output_config.format"
	oc := root.Get("output_config")
	if oc.Exists() && oc.Type != gjson.Null && !oc.IsObject() {
		return openai.WrongType("output_config", "an object", oc)
	}
	f := oc.Get("format")
	if !f.Exists() || f.Type == gjson.Null {
		param, f = "output_format", root.Get("output_format")
	}
	if !f.Exists() || f.Type == gjson.Null {
		return nil
	}
	if !f.IsObject() || f.Get("type").Str != "json_schema" {
		return openai.InvalidRequest(param+".type", "%s.type: Input should be 'json_schema'.", param)
	}
	if sc := f.Get("schema"); !sc.IsObject() {
		return openai.WrongType(param+".schema", "an object", sc)
	}
	chat["response_format"] = map[string]any{"type": "json_schema", "json_schema": map[string]any{
		"name": "output", "schema": json.RawMessage(f.Get("schema").Raw), "strict": true}}
	return nil
}

// anthropicMessage translates one message into chat messages.
//
// known holds the tool_use ids of the earlier messages (this message's
// are added): a tool_result whose tool_use_id is none of them is a 400,
// as Anthropic answers it.
func anthropicMessage(param string, m gjson.Result, known map[string]bool) ([]any, *openai.Error) {
	role := m.Get("role").Str
	if role != "user" && role != "assistant" {
		return nil, openai.InvalidRequest(param+".role", "%s.role: Input should be 'user' or 'assistant'.", param)
	}
	c := m.Get("content")
	if c.Type == gjson.String {
		return []any{map[string]any{"role": role, "content": c.Str}}, nil
	}
	if !c.IsArray() {
		return nil, openai.WrongType(param+".content", "a string or an array of content blocks", c)
	}
	var out, parts, calls []any
	var text strings.Builder
	var bad *openai.Error
	j := 0
	c.ForEach(func(_, b gjson.Result) bool {
		bp := param + ".content." + strconv.Itoa(j)
		j++
		switch typ := b.Get("type").Str; typ {
		case "text":
			if t := b.Get("text"); t.Type != gjson.String {
				bad = openai.WrongType(bp+".text", "a string", t)
				return false
			}
			if role == "assistant" {
				text.WriteString(b.Get("text").Str)
			} else {
				parts = append(parts, map[string]any{"type": "text", "text": b.Get("text").Str})
			}
		case "image":
			part, err := imagePart(bp, b)
			if err != nil {
				bad = err
				return false
			}
			parts = append(parts, part)
		case "tool_use":
			if role != "assistant" {
				bad = openai.InvalidRequest(bp+".type", "%s: tool_use blocks belong to assistant messages.", bp)
				return false
			}
			args := b.Get("input").Raw
			if args == "" {
				args = "{}"
			}
			known[b.Get("id").Str] = true
			calls = append(calls, map[string]any{"id": b.Get("id").Str, "type": "function",
				"function": map[string]any{"name": b.Get("name").Str, "arguments": args}})
		case "tool_result":
			if id := b.Get("tool_use_id").Str; !known[id] {
				bad = openai.InvalidRequest(bp, "%s: unexpected `tool_use_id` found in `tool_result` blocks: %s. Each `tool_result` block must have a corresponding `tool_use` block in the previous message.", bp, id)
				return false
			}
			rc := b.Get("content")
			result := rc.Str
			if rc.IsArray() {
				// A chat tool message holds text only: the result's text
				// blocks, one per line, and its images in the user turn that
				// follows the tool messages (never dropped).
				var texts []string
				k := 0
				rc.ForEach(func(_, rb gjson.Result) bool {
					rp := bp + ".content." + strconv.Itoa(k)
					k++
					switch rb.Get("type").Str {
					case "text":
						if t := rb.Get("text"); t.Type != gjson.String {
							bad = openai.WrongType(rp+".text", "a string", t)
							return false
						}
						texts = append(texts, rb.Get("text").Str)
					case "image":
						part, err := imagePart(rp, rb)
						if err != nil {
							bad = err
							return false
						}
						parts = append(parts, part)
					default:
						bad = openai.InvalidRequest(rp+".type", "%s.type: '%s' blocks in a tool_result are not supported by this gateway; use text and image.", rp, rb.Get("type").Str)
						return false
					}
					return true
				})
				if bad != nil {
					return false
				}
				result = strings.Join(texts, "\n")
			}
			if b.Get("is_error").Bool() {
				result = "Error: " + result
			}
			out = append(out, map[string]any{"role": "tool", "tool_call_id": b.Get("tool_use_id").Str, "content": result})
		case "thinking", "redacted_thinking":
			// Reasoning of earlier turns: chat completions has no place for it.
		default:
			bad = openai.InvalidRequest(bp+".type", "%s.type: '%s' blocks are not supported by this gateway; use text, image, tool_use and tool_result.", bp, typ)
			return false
		}
		return true
	})
	if bad != nil {
		return nil, bad
	}
	if role == "assistant" {
		msg := map[string]any{"role": "assistant", "content": nil}
		if text.Len() > 0 || len(calls) == 0 {
			// An assistant turn of thinking blocks only (or none) is an
			// empty text: OpenAI refuses an assistant message whose content
			// is null without tool_calls.
			msg["content"] = text.String()
		}
		if len(calls) > 0 {
			msg["tool_calls"] = calls
		}
		return append(out, msg), nil
	}
	if len(parts) > 0 {
		out = append(out, map[string]any{"role": "user", "content": parts})
	}
	return out, nil
}

// imagePart is an image block (at param bp) as a chat image_url part: a
// base64 source as a data URL, a url source as it is.
func imagePart(bp string, b gjson.Result) (map[string]any, *openai.Error) {
	src := b.Get("source")
	var url string
	switch src.Get("type").Str {
	case "base64":
		url = "data:" + src.Get("media_type").Str + ";base64," + src.Get("data").Str
	case "url":
		url = src.Get("url").Str
	default:
		return nil, openai.InvalidRequest(bp+".source.type", "%s.source.type: this gateway accepts base64 and url image sources.", bp)
	}
	return map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}}, nil
}

// anthropicTools translates tools and tool_choice.
func anthropicTools(root gjson.Result, chat map[string]any) *openai.Error {
	var tools []any
	var bad *openai.Error
	i := 0
	root.Get("tools").ForEach(func(_, tl gjson.Result) bool {
		param := "tools." + strconv.Itoa(i)
		i++
		schema := tl.Get("input_schema")
		if !schema.IsObject() {
			bad = openai.InvalidRequest(param, "%s: server tools (type %q) are not supported by this gateway; declare client tools with an input_schema.", param, tl.Get("type").Str)
			return false
		}
		fn := map[string]any{"name": tl.Get("name").Str, "parameters": json.RawMessage(schema.Raw)}
		if d := tl.Get("description"); d.Type == gjson.String {
			fn["description"] = d.Str
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
	tc := root.Get("tool_choice")
	if tc.IsObject() && tc.Get("type").Type != gjson.String {
		return openai.WrongType("tool_choice.type", "a string ('auto', 'any', 'tool' or 'none')", tc.Get("type"))
	}
	if tc.Get("type").Str == "tool" && tc.Get("name").Type != gjson.String {
		return openai.WrongType("tool_choice.name", "a string", tc.Get("name"))
	}
	switch tc.Get("type").Str {
	case "":
		if tc.IsObject() {
			return openai.InvalidRequest("tool_choice.type", "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'.")
		}
	case "auto":
		chat["tool_choice"] = "auto"
	case "any":
		chat["tool_choice"] = "required"
	case "none":
		chat["tool_choice"] = "none"
	case "tool":
		chat["tool_choice"] = map[string]any{"type": "function", "function": map[string]any{"name": tc.Get("name").Str}}
	default:
		return openai.InvalidRequest("tool_choice.type", "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'.")
	}
	if len(tools) == 0 {
		// OpenAI refuses a tool_choice without tools ("'tool_choice' is
		// only allowed when 'tools' are specified"): with none, there is
		// nothing to choose.
		delete(chat, "tool_choice")
	}
	if tc.Get("disable_parallel_tool_use").Bool() && len(tools) > 0 {
		chat["parallel_tool_calls"] = false
	}
	return nil
}

// stopReason maps a chat finish reason to Anthropic's stop_reason.
func stopReason(finish string) string {
	switch finish {
	case "length":
		return "max_tokens"
	case "tool_calls", "function_call":
		return "tool_use"
	case "content_filter":
		return "refusal"
	}
	return "end_turn"
}

// matchedStop is the stop sequence of the request that ended choice ch,
// "" for none: chat completions does not say which stop string matched,
// but vLLM (and Molly's engine) name it in the choice's "stop_reason",
// which Anthropic's stop_sequence is when it is one of the request's
// stop_sequences (vLLM also puts a stop token's id there, a number).
func (t *Translation) matchedStop(ch gjson.Result) string {
	sr := ch.Get("stop_reason")
	if sr.Type != gjson.String || sr.Str == "" || ch.Get("finish_reason").Str != "stop" {
		return ""
	}
	for _, s := range t.req.Get("stop_sequences").Array() {
		if s.Str == sr.Str {
			return sr.Str
		}
	}
	return ""
}

// stopFields are a Message's stop_reason and stop_sequence for a chat
// choice's finish reason, matched stop sequence, and whether it called
// tools: an answer with tool calls that finished "stop" (OpenAI's finish
// for a forced tool_choice; Ollama's and some vLLM tool parsers' for any
// call) stopped to use them, as Anthropic's stop_reason says; one that
// carried a refusal was a refusal.
func stopFields(finish, matched string, calls, refused bool) (string, any) {
	if matched != "" {
		return "stop_sequence", matched
	}
	if refused && finish == "stop" {
		// A chat refusal (the model declined: OpenAI's message.refusal) is
		// Anthropic's stop_reason refusal.
		return "refusal", nil
	}
	if calls && finish == "stop" {
		return "tool_use", nil
	}
	return stopReason(finish), nil
}

// toolInput is a tool call's arguments as the tool_use block's input
// object; arguments that are not a JSON object become {}.
func toolInput(args string) json.RawMessage {
	if v := gjson.Parse(args); gjson.Valid(args) && v.IsObject() {
		return json.RawMessage(v.Raw)
	}
	return json.RawMessage(`{}`)
}

// messageFromChat translates a chat completion into a Message.
func (t *Translation) messageFromChat(chat []byte) []byte {
	root := gjson.ParseBytes(chat)
	ch := root.Get("choices.0")
	msg := ch.Get("message")
	content := []any{}
	if r := reasoningOf(msg); t.thinking && r != "" {
		// Molly cannot sign it as Anthropic does: the signature is empty
		// (a thinking block sent back in a later turn is skipped anyway).
		content = append(content, map[string]any{"type": "thinking", "thinking": r, "signature": ""})
	}
	if c := msg.Get("content"); c.Type == gjson.String && c.Str != "" {
		content = append(content, map[string]any{"type": "text", "text": c.Str})
	}
	if r := msg.Get("refusal"); r.Type == gjson.String && r.Str != "" {
		content = append(content, map[string]any{"type": "text", "text": r.Str})
	}
	msg.Get("tool_calls").ForEach(func(_, tc gjson.Result) bool {
		content = append(content, map[string]any{"type": "tool_use", "id": tc.Get("id").Str, "name": tc.Get("function.name").Str,
			"input": toolInput(tc.Get("function.arguments").Str)})
		return true
	})
	reason, seq := stopFields(ch.Get("finish_reason").Str, t.matchedStop(ch), msg.Get("tool_calls.#").Int() > 0, msg.Get("refusal").String() != "")
	return marshal(map[string]any{
		"id": relay.NewID("msg_"), "type": "message", "role": "assistant", "model": t.Model, "content": content,
		"stop_reason": reason, "stop_sequence": seq,
		"usage": messageUsage(root.Get("usage"), root.Get("usage.prompt_tokens").Int(), root.Get("usage.completion_tokens").Int()),
	})
}

// messageUsage is a Message's usage for a chat usage object u, the prompt's
// size in tokens (in) and the completion's (out). Anthropic counts a
// prompt's cached tokens apart: its input_tokens are those not read from
// the cache, cache_read_input_tokens those read, and the three input counts
// add up to the whole prompt. So when the upstream reports
// prompt_tokens_details.cached_tokens (OpenAI, vLLM, DeepSeek's OpenAI
// API), input_tokens is in less those, cache_read_input_tokens is them and
// cache_creation_input_tokens 0 (chat completions reports no cache
// writes); without it, input_tokens is in and neither cache count is sent.
func messageUsage(u gjson.Result, in, out int64) map[string]any {
	usage := map[string]any{"input_tokens": in, "output_tokens": out}
	if c := u.Get("prompt_tokens_details.cached_tokens"); c.Type == gjson.Number {
		read := min(max(c.Int(), 0), in)
		usage["input_tokens"] = in - read
		usage["cache_read_input_tokens"] = read
		usage["cache_creation_input_tokens"] = 0
	}
	return usage
}

// reasoningOf is a chat message's or delta's reasoning text: its
// reasoning_content (Molly's engine, DeepSeek, vLLM before 0.10) or, when
// that is absent or "", reasoning (vLLM since 0.10, Ollama, OpenRouter);
// "" for none.
func reasoningOf(m gjson.Result) string {
	if r := m.Get("reasoning_content"); r.Type == gjson.String && r.Str != "" {
		return r.Str
	}
	if r := m.Get("reasoning"); r.Type == gjson.String {
		return r.Str
	}
	return ""
}

// messagesParams maps the chat request's parameters to the Messages
// request's they were translated from, for an error's message, where the
// names differ.
var messagesParams = []struct{ chat, messages string }{
	{"stop", "stop_sequences"},
	{"max_completion_tokens", "max_tokens"},
	{"max_reasoning_tokens", "thinking.budget_tokens"},
	{"min_reasoning_tokens", "thinking"},
	{"reasoning_effort", "output_config.effort"},
	{"parallel_tool_calls", "tool_choice.disable_parallel_tool_use"},
	{"user", "metadata.user_id"},
	{"response_format.json_schema.schema", "output_config.format.schema"},
	{"response_format", "output_config.format"},
}

// messagesParam is the Messages request's name for the chat request's
// parameter param, with its sub-path; ok is false where the two are one.
func messagesParam(param string) (name string, ok bool) {
	for _, m := range messagesToolPaths {
		if m.chat.MatchString(param) {
			return m.chat.ReplaceAllString(param, m.to), true
		}
	}
	for _, m := range messagesParams {
		if rest, cut := strings.CutPrefix(param, m.chat); cut && (rest == "" || rest[0] == '.' || rest[0] == '[') {
			return m.messages + rest, true
		}
	}
	return param, false
}

// messagesToolPaths map a chat tool's path to the Messages tool's
// (tools[0].function.name is tools.0.name, its parameters input_schema);
// chat's messages are not the client's (system is one of them), so a
// message's path is messages alone.
var messagesToolPaths = []struct {
	chat *regexp.Regexp
	to   string
}{
	{regexp.MustCompile(`^tools\[(\d+)\]\.function\.name`), "tools.$1.name"},
	{regexp.MustCompile(`^tools\[(\d+)\]\.function\.parameters`), "tools.$1.input_schema"},
	{regexp.MustCompile(`^tools\[(\d+)\](\.function)?`), "tools.$1"},
	{regexp.MustCompile(`^tool_choice\.function\.name`), "tool_choice.name"},
	{regexp.MustCompile(`^messages\[\d+\].*`), "messages"},
}

// IsMessagesPath reports a path of Anthropic's Messages API,
// .../messages or .../messages/count_tokens (a trailing slash allowed),
// whose errors are answered in Anthropic's shape whatever the method.
func IsMessagesPath(path string) bool {
	path = strings.TrimSuffix(path, "/")
	return strings.HasSuffix(path, "/messages") || strings.HasSuffix(path, "/messages/count_tokens")
}

// MessagesError is e as the Messages API answers it: Anthropic's status
// (529 for a 503, any other as it is) and error body,
// {"type":"error","error":{"type","message"}}, typed by the status. For
// answering a /v1/messages request outside the pipeline (the Envoy policy
// point); headers (Retry-After, x-should-retry) are the caller's to send.
func MessagesError(e *openai.Error) (status int, body []byte) {
	return messagesStatus(e.Status), messageError(e.Status, e.Body(), false, "")
}

// messageError is Anthropic's error body for an OpenAI error answer. With
// chat set (the error answers the translated chat request), an error
// naming a chat parameter that the client sent under another name
// (error.param; messagesParams) says, as Anthropic's messages do, which
// parameter of the client's request it is about: "stop_sequences: ..."
// for chat's stop. A non-empty requestID is the body's request_id, as
// Anthropic's error bodies carry the request's id beside the error. A
// wrong-type error (code invalid_type, openai.WrongType) is worded as
// Anthropic's validation words it: "top_k: Input should be an integer,
// got a string.".
// wrongTypeMessage matches openai.WrongType's message: the parameter, the
// kind it wants, the kind it got.
var wrongTypeMessage = regexp.MustCompile(`^Invalid type for '([^']*)': expected (.*), but got (.*)\.$`)

func messageError(status int, body []byte, chat bool, requestID string) []byte {
	msg := gjson.GetBytes(body, "error.message").Str
	if msg == "" {
		msg = strings.TrimSpace(string(body))
	}
	if msg == "" {
		msg = "HTTP " + strconv.Itoa(status)
	}
	if m := wrongTypeMessage.FindStringSubmatch(msg); m != nil && gjson.GetBytes(body, "error.code").Str == openai.CodeInvalidType {
		// openai.WrongType's sentence, in Anthropic's words ("top_k: Input
		// should be a valid integer"): the parameter first, as its
		// validation errors name it.
		name := m[1]
		if n, ok := messagesParam(name); chat && ok {
			name = n
		}
		msg = name + ": Input should be " + m[2] + ", got " + m[3] + "."
	}
	if p := gjson.GetBytes(body, "error.param"); chat && p.Type == gjson.String {
		if name, ok := messagesParam(p.Str); ok && !strings.HasPrefix(msg, name+":") {
			msg = strings.ReplaceAll(msg, "'"+p.Str+"'", "'"+name+"'") // the message quotes the client's name too
			msg = name + ": " + msg
		}
	}
	out := map[string]any{"type": "error", "error": map[string]any{"type": statusType(status), "message": msg}}
	if requestID != "" {
		out["request_id"] = requestID
	}
	return marshal(out)
}

// messagesStream turns a chat completion stream into Anthropic's:
// message_start, then per content block content_block_start,
// content_block_delta (thinking_delta and a closing signature_delta,
// text_delta, input_json_delta)… and content_block_stop, then
// message_delta (stop_reason and the usage) and message_stop.
//
// Usage follows Anthropic's streaming reference: message_start carries a
// Message whose usage is what is known when it is sent, and message_delta's
// usage is cumulative for the whole message — Anthropic's SDKs overwrite
// the snapshot's input_tokens and output_tokens with it, so it is what
// finalMessage() reports. The chat request asks for the usage chunk
// (stream_options.include_usage), which OpenAI-compatible servers send
// last; message_start is held until the first chunk and takes its
// prompt_tokens when that chunk carries usage, else the classifier's
// estimate (Translation.PromptEstimate). message_delta carries the
// upstream's prompt_tokens and completion_tokens, the counts the
// non-streamed answer and the ledger report; the estimate only when the
// upstream sent no usage.
type messagesStream struct {
	t       *Translation
	started bool
	ended   bool
	id      string
	block   int    // the open block's index, -1 for none
	next    int    // the next block index
	kind    string // "thinking", "text" or "tool_use": the open block
	// calls are the chat tool calls by their (normalised) index; live is
	// the one streamed as the open tool_use block. Anthropic's content
	// blocks cannot interleave, but an OpenAI-style upstream may stream
	// parallel calls' argument fragments interleaved (index 0, 1, 0, 1):
	// a call that begins while another is open is held whole and sent as
	// a block of its own at the end, so that no call loses the fragments
	// that come after another began; text and reasoning that come after
	// a call began are held too (the open call may still grow) and sent
	// after the calls.
	calls    map[int64]*streamCall
	order    []int64 // held calls, in the order they began
	live     int64   // the live call's index, -1 for none
	lateText strings.Builder
	lateRsn  strings.Builder
	finish   string
	refused  bool   // a refusal delta came
	stopSeq  string // the stop sequence that ended the answer (matchedStop)
	usage    gjson.Result
}

// streamCall is one tool call of a Messages stream (see messagesStream).
type streamCall struct {
	id, name string
	args     strings.Builder // held calls only
}

func newMessagesStream(t *Translation) *messagesStream {
	return &messagesStream{t: t, block: -1, live: -1, calls: map[int64]*streamCall{}, id: relay.NewID("msg_")}
}

func (s *messagesStream) emit(out []byte, typ string, ev map[string]any) []byte {
	ev["type"] = typ
	return relay.AppendEvent(out, relay.Event{Type: typ, Data: marshal(ev)}, false)
}

func (s *messagesStream) start(out []byte) []byte {
	s.started = true
	return s.emit(out, "message_start", map[string]any{"message": map[string]any{
		"id": s.id, "type": "message", "role": "assistant", "model": s.t.Model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": messageUsage(s.usage, s.inputTokens(), 0)}})
}

// inputTokens is the prompt's size in tokens as best known now: the
// upstream's usage.prompt_tokens once a chunk carried it, else the
// classifier's estimate.
func (s *messagesStream) inputTokens() int64 {
	if n := s.usage.Get("prompt_tokens"); n.Type == gjson.Number {
		return n.Int()
	}
	return int64(s.t.PromptEstimate)
}

func (s *messagesStream) stopBlock(out []byte) []byte {
	if s.block < 0 {
		return out
	}
	if s.kind == "thinking" {
		// A thinking block ends with its signature (empty: see messageFromChat).
		out = s.emit(out, "content_block_delta", map[string]any{"index": s.block, "delta": map[string]any{"type": "signature_delta", "signature": ""}})
	}
	out = s.emit(out, "content_block_stop", map[string]any{"index": s.block})
	s.block, s.kind = -1, ""
	return out
}

// thinkingDelta appends reasoning text r to the open thinking block,
// opening one when the open block is another.
func (s *messagesStream) thinkingDelta(out []byte, r string) []byte {
	if s.kind != "thinking" {
		out = s.stopBlock(out)
		s.block, s.kind = s.next, "thinking"
		s.next++
		out = s.emit(out, "content_block_start", map[string]any{"index": s.block, "content_block": map[string]any{"type": "thinking", "thinking": "", "signature": ""}})
	}
	return s.emit(out, "content_block_delta", map[string]any{"index": s.block, "delta": map[string]any{"type": "thinking_delta", "thinking": r}})
}

// textDelta appends text to the open text block, opening one when the
// open block is another.
func (s *messagesStream) textDelta(out []byte, text string) []byte {
	if s.kind != "text" {
		out = s.stopBlock(out)
		s.block, s.kind = s.next, "text"
		s.next++
		out = s.emit(out, "content_block_start", map[string]any{"index": s.block, "content_block": map[string]any{"type": "text", "text": ""}})
	}
	return s.emit(out, "content_block_delta", map[string]any{"index": s.block, "delta": map[string]any{"type": "text_delta", "text": text}})
}

// flushHeld closes the open block and sends what was held (see
// messagesStream): each held tool call as a whole tool_use block, then
// the reasoning and text that came after the first call.
func (s *messagesStream) flushHeld(out []byte) []byte {
	out = s.stopBlock(out)
	s.live = -1
	for _, idx := range s.order {
		c := s.calls[idx]
		b := s.next
		s.next++
		out = s.emit(out, "content_block_start", map[string]any{"index": b, "content_block": map[string]any{
			"type": "tool_use", "id": c.id, "name": c.name, "input": map[string]any{}}})
		if c.args.Len() > 0 {
			out = s.emit(out, "content_block_delta", map[string]any{"index": b, "delta": map[string]any{"type": "input_json_delta", "partial_json": c.args.String()}})
		}
		out = s.emit(out, "content_block_stop", map[string]any{"index": b})
	}
	s.order = nil
	if s.lateRsn.Len() > 0 {
		out = s.thinkingDelta(out, s.lateRsn.String())
		s.lateRsn.Reset()
	}
	if s.lateText.Len() > 0 {
		out = s.textDelta(out, s.lateText.String())
		s.lateText.Reset()
	}
	return s.stopBlock(out)
}

// event translates one event of the chat stream.
func (s *messagesStream) event(out []byte, ev relay.Event) []byte {
	if s.ended {
		return out
	}
	if ev.IsDone() {
		return s.end(out)
	}
	root := gjson.ParseBytes(ev.Data)
	if e := root.Get("error"); e.Exists() {
		s.ended = true
		// Anthropic's error event (messages-streaming, "Error events"),
		// typed by the error's cause as a whole answer is by its status.
		return s.emit(out, "error", map[string]any{"error": map[string]any{"type": eventType(e), "message": e.Get("message").Str}})
	}
	if u := root.Get("usage"); u.IsObject() {
		s.usage = u
	}
	if !s.started {
		out = s.start(out)
	}
	ch := root.Get("choices.0")
	d := ch.Get("delta")
	if r := reasoningOf(d); s.t.thinking && r != "" {
		if len(s.calls) > 0 {
			s.lateRsn.WriteString(r)
		} else {
			out = s.thinkingDelta(out, r)
		}
	}
	for _, f := range []string{"content", "refusal"} {
		if c := d.Get(f); c.Type == gjson.String && c.Str != "" {
			s.refused = s.refused || f == "refusal"
			if len(s.calls) > 0 {
				s.lateText.WriteString(c.Str)
			} else {
				out = s.textDelta(out, c.Str)
			}
		}
	}
	d.Get("tool_calls").ForEach(func(_, tc gjson.Result) bool {
		idx := tc.Get("index").Int()
		a := tc.Get("function.arguments").Str
		c, ok := s.calls[idx]
		if !ok {
			c = &streamCall{id: tc.Get("id").Str, name: tc.Get("function.name").Str}
			s.calls[idx] = c
			if s.live < 0 && len(s.order) == 0 && c.name != "" {
				// The first call streams as it comes (once it has its name:
				// a call whose name comes in a later delta is held).
				out = s.stopBlock(out)
				s.live, s.block, s.kind = idx, s.next, "tool_use"
				s.next++
				out = s.emit(out, "content_block_start", map[string]any{"index": s.block, "content_block": map[string]any{
					"type": "tool_use", "id": c.id, "name": c.name, "input": map[string]any{}}})
			} else {
				s.order = append(s.order, idx)
			}
		}
		switch {
		case a == "":
		case idx == s.live:
			out = s.emit(out, "content_block_delta", map[string]any{"index": s.block, "delta": map[string]any{"type": "input_json_delta", "partial_json": a}})
		default:
			c.args.WriteString(a)
		}
		if c.name == "" {
			c.name = tc.Get("function.name").Str
		}
		return true
	})
	if fr := ch.Get("finish_reason"); fr.Type == gjson.String {
		s.finish = fr.Str
		s.stopSeq = s.t.matchedStop(ch)
	}
	return out
}

func (s *messagesStream) end(out []byte) []byte {
	if s.ended {
		return out
	}
	s.ended = true
	if !s.started {
		out = s.start(out)
	}
	out = s.flushHeld(out)
	// The whole message's usage, as the upstream counted it (see
	// messagesStream): what the SDKs' final message reports.
	usage := messageUsage(s.usage, s.inputTokens(), s.usage.Get("completion_tokens").Int())
	reason, seq := stopFields(s.finish, s.stopSeq, len(s.calls) > 0, s.refused)
	out = s.emit(out, "message_delta", map[string]any{"delta": map[string]any{"stop_reason": reason, "stop_sequence": seq}, "usage": usage})
	return s.emit(out, "message_stop", map[string]any{})
}
