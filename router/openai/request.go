package openai

import (
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// MaxJSONDepth bounds the nesting of request bodies: OpenAI requests nest a
// handful of levels (tool schemas a few more); deeper bodies are refused
// before any walk over them.
const MaxJSONDepth = 64

// MaxModelName is the longest model name accepted, in bytes.
const MaxModelName = 256

// Request is the validated view of an OpenAI request body: what routing,
// admission and the T0 engine need to know about it besides its text. It
// is made by ParseRequest; the body itself is not copied.
type Request struct {
	Endpoint Endpoint
	// Model is the client's "model" field (for GET /v1/models/{model}, the
	// path's model; "" for the listing).
	Model string
	// Stream is "stream": true; IncludeUsage "stream_options.include_usage": true.
	Stream, IncludeUsage bool
	// MaxTokens is the larger of max_completion_tokens and max_tokens (an
	// upstream may read either: Ollama's OpenAI API reads max_tokens alone);
	// 0 when neither is set.
	MaxTokens int
	// N is the number of choices asked for ("n"), 1 when unset.
	N int
	// BestOf is the completions endpoint's "best_of" (candidates generated
	// server-side, at least N); 0 when unset.
	BestOf int
	// Prompts is how many prompts a completions request (or inputs an
	// embeddings request) holds: the length of an array of strings or of
	// token-id arrays, 1 for a string or one array of token ids. Each prompt
	// gets its own max(N, BestOf) completions (OpenAI's API, vLLM).
	Prompts int
	// Logprobs: chat "logprobs": true, or completions "logprobs" ≥ 0.
	Logprobs bool
	// Tools lists the function names the request declares
	// (tools[].function.name and the legacy functions[].name), in order.
	Tools []string
	// ToolTurns reports tool or function messages, or assistant tool_calls,
	// in the conversation.
	ToolTurns bool
	// ResponseFormat is response_format.type ("text", "json_object",
	// "json_schema"); "" when unset.
	ResponseFormat string
	// ToolChoice is tool_choice as a word: "none", "auto", "required", or
	// the type of an object choice ("function", "allowed_tools",
	// "custom"); "" when unset.
	ToolChoice string
	// Messages is the number of chat messages.
	Messages int
	// TokenPrompts reports prompts or inputs given as token ids (arrays of
	// integers), which no detector can read.
	TokenPrompts bool
	// AudioOut reports a chat request whose "modalities" lists "audio":
	// it asks for a spoken answer, which only a target with audio serves.
	AudioOut bool
}

// Choices is how many completions the request makes the model generate:
// max(N, BestOf), at least 1, for each of a completions request's Prompts.
// Admission multiplies the completion budget by it.
func (r *Request) Choices() int {
	c := max(r.N, r.BestOf, 1)
	if r.Endpoint == EndpointCompletions {
		c *= max(r.Prompts, 1)
	}
	return c
}

// ParseRequest validates body as a request for ep (chat completions,
// completions or embeddings) and returns its view; see Parse, which it
// calls on a copy of body.
func ParseRequest(ep Endpoint, body []byte) (*Request, *Error) {
	r, _, err := Parse(ep, string(body))
	return r, err
}

// Parse validates body as a request for ep (chat completions, completions
// or embeddings) and returns its view and its Doc. It reads the body once:
// the JSON grammar, the UTF-8 of every string, the depth and repeated
// member names are checked in the pass that records the Doc, and the
// parameters are then read from the Doc. Errors are 400
// invalid_request_error naming the parameter, in this order: an empty body,
// not JSON, not UTF-8 (RFC 8259 §8.1), nesting deeper than MaxJSONDepth or
// a key repeated in one object (whichever comes first in the body; gjson
// reads the first of two equal names, Go and Python parsers keep the last:
// a body could be classified on one value and answered on the other), a
// root that is not an object, then a missing or mistyped parameter.
func Parse(ep Endpoint, body string) (*Request, *Doc, *Error) {
	if err := sizeError(body); err != nil {
		return nil, nil, err
	}
	d, pr, key := parse(body)
	if err := problemError(pr, key); err != nil {
		return nil, nil, err
	}
	if d.Kind(0) != KindObject {
		return nil, nil, InvalidRequest("", "The JSON body of your request must be an object, got %s.", kindOf(d, 0))
	}
	var f rootMembers
	f.read(d)
	r := &Request{Endpoint: ep, N: 1}
	if f.model < 0 || d.Kind(f.model) == KindNull {
		return nil, nil, InvalidRequest("model", "You must provide a model parameter.")
	}
	if d.Kind(f.model) != KindString || d.Str(f.model) == "" {
		return nil, nil, wrongType("model", "a non-empty string", d, f.model)
	}
	r.Model = d.Str(f.model)
	if len(r.Model) > MaxModelName {
		return nil, nil, InvalidRequest("model", "Invalid 'model': longer than %d bytes.", MaxModelName)
	}
	var err *Error
	if r.Stream, err = optBool(d, f.stream, "stream"); err != nil {
		return nil, nil, err
	}
	if r.IncludeUsage, err = optBool(d, d.Member(f.streamOptions, "include_usage"), "stream_options.include_usage"); err != nil {
		return nil, nil, err
	}
	for _, p := range []struct {
		i    int
		name string
	}{{f.maxCompletionTokens, "max_completion_tokens"}, {f.maxTokens, "max_tokens"}} {
		n, set, err := optPositive(d, p.i, p.name)
		if err != nil {
			return nil, nil, err
		}
		if set {
			r.MaxTokens = max(r.MaxTokens, n)
		}
	}
	// The ranges are the OpenAPI description's (CreateChatCompletionRequest,
	// CreateCompletionRequest).
	for _, p := range []struct {
		i        int
		name     string
		min, max float64
	}{{f.temperature, "temperature", 0, 2}, {f.topP, "top_p", 0, 1}, {f.presencePenalty, "presence_penalty", -2, 2}, {f.frequencyPenalty, "frequency_penalty", -2, 2}} {
		if p.i < 0 || d.Kind(p.i) == KindNull {
			continue
		}
		if d.Kind(p.i) != KindNumber {
			return nil, nil, wrongType(p.name, "a number", d, p.i)
		}
		if err := inRange(p.name, d.Raw(p.i), p.min, p.max); err != nil {
			return nil, nil, err
		}
	}
	if err := logitBias(d, f.logitBias); err != nil {
		return nil, nil, err
	}
	if u := f.user; u >= 0 && d.Kind(u) != KindNull && d.Kind(u) != KindString {
		return nil, nil, wrongType("user", "a string", d, u)
	}
	if so := f.streamOptions; so >= 0 && d.Kind(so) != KindNull && !r.Stream {
		return nil, nil, InvalidRequest("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
	}
	if n, set, err := optPositive(d, f.n, "n"); err != nil {
		return nil, nil, err
	} else if set {
		if err := intRange("n", n, 1, 128); err != nil {
			return nil, nil, err
		}
		r.N = n
	}
	if v := f.responseFormat; v >= 0 && d.Kind(v) != KindNull {
		if d.Kind(v) != KindObject {
			return nil, nil, wrongType("response_format", "an object", d, v)
		}
		t := d.Member(v, "type")
		if t < 0 || d.Kind(t) != KindString {
			return nil, nil, wrongType("response_format.type", "a string", d, t)
		}
		r.ResponseFormat = d.Str(t)
		if r.ResponseFormat == "json_schema" && ep == EndpointChat {
			js := d.Member(v, "json_schema")
			if js < 0 || d.Kind(js) == KindNull {
				return nil, nil, MissingParameter("response_format.json_schema", "Missing required parameter: 'response_format.json_schema'.")
			}
			if d.Kind(js) != KindObject {
				return nil, nil, wrongType("response_format.json_schema", "an object", d, js)
			}
			if n := d.Member(js, "name"); n < 0 || d.Kind(n) != KindString {
				return nil, nil, wrongType("response_format.json_schema.name", "a string", d, n)
			} else if !FunctionName(d.Str(n)) {
				return nil, nil, withCode(CodeInvalidValue, InvalidRequest("response_format.json_schema.name", "Invalid 'response_format.json_schema.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]{1,64}$'."))
			}
		}
	}
	switch ep {
	case EndpointChat:
		err = r.chat(d, &f)
	case EndpointCompletions:
		if n, set, e := optPositive(d, f.bestOf, "best_of"); e != nil {
			return nil, nil, e
		} else if set {
			if err := intRange("best_of", n, 0, 20); err != nil {
				return nil, nil, err
			}
			r.BestOf = n
		}
		if v := f.logprobs; v >= 0 && d.Kind(v) != KindNull {
			k, err := strconv.Atoi(d.Raw(v))
			if d.Kind(v) != KindNumber || err != nil {
				return nil, nil, wrongType("logprobs", "an integer", d, v)
			}
			if err := intRange("logprobs", k, 0, 5); err != nil {
				return nil, nil, err
			}
			r.Logprobs = true
		}
		err = r.prompts(d, f.prompt, "prompt")
	case EndpointEmbeddings:
		if err = r.prompts(d, f.input, "input"); err == nil {
			err = embeddingOptions(d, &f)
		}
	default:
		err = InvalidRequest("", "The %s endpoint is translated to chat completions before validation.", ep)
	}
	if err != nil {
		return nil, nil, err
	}
	return r, d, nil
}

// rootMembers are the indices of the root's members ParseRequest reads; -1
// when absent.
type rootMembers struct {
	model, stream, streamOptions, maxCompletionTokens, maxTokens            int
	temperature, topP, presencePenalty, frequencyPenalty, n, responseFormat int
	bestOf, logprobs, prompt, input, messages, tools, functions             int
	toolChoice, logitBias, user, topLogprobs, modalities                    int
	encodingFormat, dimensions                                              int
	// typed: the chat parameters only type-checked (chatTyped), by index.
	typed [len(chatTyped)]int
}

// read finds the members in one walk over the root's members.
func (f *rootMembers) read(d *Doc) {
	*f = rootMembers{-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, [len(chatTyped)]int{}}
	for i := range f.typed {
		f.typed[i] = -1
	}
	for c, end := 1, d.Next(0); c < end; c = d.Next(c) {
		k, _ := d.Key(c)
		var at *int
		switch k {
		case "model":
			at = &f.model
		case "stream":
			at = &f.stream
		case "stream_options":
			at = &f.streamOptions
		case "max_completion_tokens":
			at = &f.maxCompletionTokens
		case "max_tokens":
			at = &f.maxTokens
		case "temperature":
			at = &f.temperature
		case "top_p":
			at = &f.topP
		case "presence_penalty":
			at = &f.presencePenalty
		case "frequency_penalty":
			at = &f.frequencyPenalty
		case "n":
			at = &f.n
		case "response_format":
			at = &f.responseFormat
		case "best_of":
			at = &f.bestOf
		case "logprobs":
			at = &f.logprobs
		case "top_logprobs":
			at = &f.topLogprobs
		case "modalities":
			at = &f.modalities
		case "prompt":
			at = &f.prompt
		case "input":
			at = &f.input
		case "messages":
			at = &f.messages
		case "tools":
			at = &f.tools
		case "functions":
			at = &f.functions
		case "tool_choice":
			at = &f.toolChoice
		case "logit_bias":
			at = &f.logitBias
		case "user":
			at = &f.user
		case "encoding_format":
			at = &f.encodingFormat
		case "dimensions":
			at = &f.dimensions
		default:
			i := slices.IndexFunc(chatTyped[:], func(t typedParam) bool { return t.name == k })
			if i < 0 {
				continue
			}
			at = &f.typed[i]
		}
		*at = c
	}
}

// ChatRoles are the roles a chat message may have.
var ChatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true}

// ContentPartTypes are the types a chat content part may have.
var ContentPartTypes = map[string]bool{"text": true, "image_url": true, "input_audio": true, "refusal": true, "file": true}

// typedParam is a chat parameter Molly checks the JSON type of only (its
// values are the backend's business): want names the kinds it takes.
type typedParam struct {
	name, want string
	ok         func(d *Doc, i int) bool
}

// chatTyped are the chat parameters (CreateChatCompletionRequest) whose
// JSON type is checked and nothing more, in this order: stop (a string or
// an array of strings), seed (a number), metadata (an object),
// store and parallel_tool_calls (booleans), service_tier,
// reasoning_effort and verbosity (strings: the backend knows its values).
// A value of another type is WrongType's 400 (code invalid_type) rather
// than sent on, where a backend could read "false" as true or drop it.
var chatTyped = [...]typedParam{
	{"stop", "a string or an array of strings", func(d *Doc, i int) bool {
		if d.Kind(i) == KindString {
			return true
		}
		if d.Kind(i) != KindArray {
			return false
		}
		for c, end := i+1, d.Next(i); c < end; c = d.Next(c) {
			if d.Kind(c) != KindString {
				return false
			}
		}
		return true
	}},
	// seed: a number (whether it is an integer in int64's range is the
	// backend's to say; the T0 engine's message names the range).
	{"seed", "an integer", func(d *Doc, i int) bool { return d.Kind(i) == KindNumber }},
	{"metadata", "an object", func(d *Doc, i int) bool { return d.Kind(i) == KindObject }},
	{"store", "a boolean", isBool},
	{"parallel_tool_calls", "a boolean", isBool},
	{"service_tier", "a string", isString},
	{"reasoning_effort", "a string", isString},
	{"verbosity", "a string", isString},
}

func isBool(d *Doc, i int) bool   { return d.Kind(i) == KindTrue || d.Kind(i) == KindFalse }
func isString(d *Doc, i int) bool { return d.Kind(i) == KindString }

func (r *Request) chat(d *Doc, f *rootMembers) *Error {
	msgs := f.messages
	if msgs < 0 {
		return MissingParameter("messages", "Missing required parameter: 'messages'.")
	}
	if d.Kind(msgs) != KindArray {
		return wrongType("messages", "an array", d, msgs)
	}
	for i, t := range chatTyped {
		if v := f.typed[i]; v >= 0 && d.Kind(v) != KindNull && !t.ok(d, v) {
			return wrongType(t.name, t.want, d, v)
		}
	}
	if v := f.logprobs; v >= 0 && d.Kind(v) != KindNull {
		if d.Kind(v) != KindTrue && d.Kind(v) != KindFalse {
			return wrongType("logprobs", "a boolean", d, v)
		}
		r.Logprobs = d.Kind(v) == KindTrue
	}
	if v := f.modalities; v >= 0 && d.Kind(v) != KindNull {
		// ResponseModalities: an array of "text" and "audio"; routing reads
		// it (a spoken answer needs an audio target).
		if d.Kind(v) != KindArray {
			return wrongType("modalities", "an array", d, v)
		}
		for c, end := v+1, d.Next(v); c < end; c = d.Next(c) {
			if d.Kind(c) != KindString || d.Str(c) != "text" && d.Str(c) != "audio" {
				p := "modalities[" + strconv.Itoa(d.Index(c)) + "]"
				return InvalidValue(p, "Invalid value for '%s': %s. Supported values are: 'text' and 'audio'.", p, d.Raw(c))
			}
			if d.Str(c) == "audio" {
				r.AudioOut = true
			}
		}
	}
	if v := f.topLogprobs; v >= 0 && d.Kind(v) != KindNull {
		k, err := strconv.Atoi(d.Raw(v))
		if d.Kind(v) != KindNumber || err != nil {
			return wrongType("top_logprobs", "an integer", d, v)
		}
		if err := intRange("top_logprobs", k, 0, 20); err != nil {
			return err
		}
	}
	if err := r.toolChoice(d, f.toolChoice); err != nil {
		return err
	}
	for _, list := range []struct {
		at         int
		path, name string
		nested     bool // the name is at function.name
	}{{f.tools, "tools", "function.name", true}, {f.functions, "functions", "name", false}} {
		t := list.at
		if t < 0 || d.Kind(t) == KindNull {
			continue
		}
		if d.Kind(t) != KindArray {
			return wrongType(list.path, "an array", d, t)
		}
		for c, end := t+1, d.Next(t); c < end; c = d.Next(c) {
			n, name := c, list.name
			if list.nested {
				// A custom tool (type "custom") has its name at custom.name.
				if ty := d.Member(c, "type"); ty >= 0 && d.Kind(ty) == KindString && d.Str(ty) == "custom" {
					n, name = d.Member(n, "custom"), "custom.name"
				} else {
					n = d.Member(n, "function")
				}
			}
			n = d.Member(n, "name")
			if n < 0 || d.Kind(n) != KindString {
				return wrongType(list.path+"["+strconv.Itoa(d.Index(c))+"]."+name, "a string", d, n)
			}
			if !FunctionName(d.Str(n)) {
				p := list.path + "[" + strconv.Itoa(d.Index(c)) + "]." + name
				return withCode(CodeInvalidValue, InvalidRequest(p, "Invalid '%s': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]{1,64}$'.", p))
			}
			r.Tools = append(r.Tools, d.Str(n))
		}
	}
	i := 0
	var callIDs []string // the assistant tool call ids so far
	for c, end := msgs+1, d.Next(msgs); c < end; c = d.Next(c) {
		if err := r.message(d, i, c, &callIDs); err != nil {
			return err
		}
		i++
	}
	if i == 0 {
		return withCode(CodeEmptyArray, InvalidRequest("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1."))
	}
	r.Messages = i
	return nil
}

// toolChoice checks tool_choice (member tc, -1 when absent) against the
// OpenAPI description's ChatCompletionToolChoiceOption and sets
// r.ToolChoice: one of the modes none, auto and required, or an object of
// type function (with function.name), custom (with custom.name) or
// allowed_tools (with an allowed_tools object). Errors are 400s naming the
// member at fault: routing reads the choice (none needs no tool-capable
// target), so a value no upstream would read the same way is refused here.
func (r *Request) toolChoice(d *Doc, tc int) *Error {
	switch {
	case tc < 0 || d.Kind(tc) == KindNull:
		return nil
	case d.Kind(tc) == KindString:
		switch m := d.Str(tc); m {
		case "none", "auto", "required":
			r.ToolChoice = m
			return nil
		}
		return InvalidValue("tool_choice", "Invalid value for 'tool_choice': '%s'. Supported values are: 'none', 'auto' and 'required'.", d.Str(tc))
	case d.Kind(tc) != KindObject:
		return wrongType("tool_choice", "a string or an object", d, tc)
	}
	ty := d.Member(tc, "type")
	if ty < 0 || d.Kind(ty) != KindString {
		return wrongType("tool_choice.type", "a string", d, ty)
	}
	switch t := d.Str(ty); t {
	case "function", "custom":
		obj := d.Member(tc, t)
		if obj < 0 || d.Kind(obj) != KindObject {
			return wrongType("tool_choice."+t, "an object", d, obj)
		}
		if n := d.Member(obj, "name"); n < 0 || d.Kind(n) != KindString {
			return wrongType("tool_choice."+t+".name", "a string", d, n)
		}
	case "allowed_tools":
		if a := d.Member(tc, t); a < 0 || d.Kind(a) != KindObject {
			return wrongType("tool_choice.allowed_tools", "an object", d, a)
		}
	default:
		return InvalidValue("tool_choice.type", "Invalid value for 'tool_choice.type': '%s'. Supported values are: 'function', 'custom' and 'allowed_tools'.", t)
	}
	r.ToolChoice = d.Str(ty)
	return nil
}

// message checks messages[i] (value m); callIDs are the assistant tool
// call ids of the messages before it, this one's added: a tool message
// whose tool_call_id is none of them is a 400, in OpenAI's words.
func (r *Request) message(d *Doc, i, m int, callIDs *[]string) *Error {
	param := func() string { return "messages[" + strconv.Itoa(i) + "]" }
	if d.Kind(m) != KindObject {
		return wrongType(param(), "an object", d, m)
	}
	// The members read, in one walk over the message's members.
	role, name, content, toolCalls, functionCall, toolCallID := -1, -1, -1, -1, -1, -1
	for c, end := m+1, d.Next(m); c < end; c = d.Next(c) {
		switch k, _ := d.Key(c); k {
		case "role":
			role = c
		case "name":
			name = c
		case "content":
			content = c
		case "tool_calls":
			toolCalls = c
		case "function_call":
			functionCall = c
		case "tool_call_id":
			toolCallID = c
		}
	}
	if role < 0 || d.Kind(role) != KindString {
		return wrongType(param()+".role", "a string", d, role)
	}
	rs := d.Str(role)
	if !ChatRoles[rs] {
		p := param()
		return InvalidValue(p+".role", "Invalid value for '%s.role': '%s'. Supported values are: 'system', 'developer', 'user', 'assistant', 'tool' and 'function'.", p, rs)
	}
	if rs == "tool" || rs == "function" {
		r.ToolTurns = true
	}
	if rs == "tool" && (toolCallID < 0 || d.Kind(toolCallID) != KindString) {
		if toolCallID < 0 || d.Kind(toolCallID) == KindNull {
			return InvalidRequest(param()+".tool_call_id", "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'.")
		}
		return wrongType(param()+".tool_call_id", "a string", d, toolCallID)
	}
	if rs == "tool" && !slices.Contains(*callIDs, d.Str(toolCallID)) {
		// OpenAI's words and param (messages.[i].…) for a tool message
		// answering no assistant tool call before it.
		p := "messages.[" + strconv.Itoa(i) + "]"
		if len(*callIDs) == 0 {
			return InvalidRequest(p+".role", "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.")
		}
		return InvalidRequest(p+".tool_call_id", "Invalid parameter: 'tool_call_id' of '%s' not found in 'tool_calls' of previous message.", d.Str(toolCallID))
	}
	if name >= 0 && d.Kind(name) != KindNull && d.Kind(name) != KindString {
		return wrongType(param()+".name", "a string", d, name)
	}
	switch {
	case content < 0 || d.Kind(content) == KindNull:
		if rs != "assistant" {
			p := param()
			return InvalidValue(p+".content", "Invalid value for '%s.content': expected a string or an array of content parts, got null.", p)
		}
	case d.Kind(content) == KindString:
	case d.Kind(content) == KindArray:
		for part, end := content+1, d.Next(content); part < end; part = d.Next(part) {
			pparam := func() string { return param() + ".content[" + strconv.Itoa(d.Index(part)) + "]" }
			if d.Kind(part) != KindObject {
				return wrongType(pparam(), "an object", d, part)
			}
			t := ""
			if ti := d.Member(part, "type"); ti >= 0 {
				if d.Kind(ti) == KindString {
					t = d.Str(ti)
				} else {
					t = d.result(ti).String() // a number, literal or JSON text, as gjson prints it
				}
			}
			switch {
			case !ContentPartTypes[t]:
				pp := pparam()
				return InvalidValue(pp+".type", "Invalid value for '%s.type': '%s'. Supported values are: 'text', 'image_url', 'input_audio', 'refusal' and 'file'.", pp, t)
			case t == "text":
				if txt := d.Member(part, "text"); txt < 0 || d.Kind(txt) != KindString {
					return wrongType(pparam()+".text", "a string", d, txt)
				}
			}
		}
	default:
		return wrongType(param()+".content", "a string or an array of content parts", d, content)
	}
	if toolCalls >= 0 && d.Kind(toolCalls) != KindNull {
		if d.Kind(toolCalls) != KindArray {
			return wrongType(param()+".tool_calls", "an array", d, toolCalls)
		}
		for c, end := toolCalls+1, d.Next(toolCalls); c < end; c = d.Next(c) {
			p := param() + ".tool_calls[" + strconv.Itoa(d.Index(c)) + "]"
			if d.Kind(c) != KindObject {
				return wrongType(p, "an object", d, c)
			}
			// A function call has function.name and function.arguments, a
			// custom tool's call custom.name and custom.input (strings).
			obj, args := "function", "arguments"
			if ty := d.Member(c, "type"); ty >= 0 && d.Kind(ty) == KindString && d.Str(ty) == "custom" {
				obj, args = "custom", "input"
			}
			fn := d.Member(c, obj)
			if fn < 0 || d.Kind(fn) != KindObject {
				return wrongType(p+"."+obj, "an object", d, fn)
			}
			if n := d.Member(fn, "name"); n < 0 || d.Kind(n) != KindString {
				return wrongType(p+"."+obj+".name", "a string", d, n)
			}
			if a := d.Member(fn, args); a < 0 || d.Kind(a) != KindString {
				return wrongType(p+"."+obj+"."+args, "a string", d, a)
			}
			if id := d.Member(c, "id"); id >= 0 && d.Kind(id) == KindString {
				*callIDs = append(*callIDs, d.Str(id))
			}
		}
		r.ToolTurns = true
	}
	if functionCall >= 0 {
		r.ToolTurns = true
	}
	return nil
}

// prompts checks the "prompt" (completions) or "input" (embeddings) field
// (value v, -1 when absent): a string, an array of strings, or token ids.
func (r *Request) prompts(d *Doc, v int, field string) *Error {
	if v < 0 || d.Kind(v) == KindNull {
		return MissingParameter(field, "Missing required parameter: '%s'.", field)
	}
	r.Prompts = 1
	switch d.Kind(v) {
	case KindString:
	case KindArray:
		n, ids := 0, false
		for e, end := v+1, d.Next(v); e < end; e = d.Next(e) {
			n++
			switch d.Kind(e) {
			case KindString:
			case KindNumber:
				ids = true // one prompt of token ids
				r.TokenPrompts = true
			case KindArray:
				r.TokenPrompts = true
			default:
				return wrongType(field+"["+strconv.Itoa(d.Index(e))+"]", "a string or token ids", d, e)
			}
		}
		if !ids && n > 0 {
			r.Prompts = n
		}
		if err := embeddingInputLength(field, n); err != nil {
			return err
		}
	default:
		return wrongType(field, "a string or an array", d, v)
	}
	if d.Kind(v) == KindString && d.Str(v) == "" && field == "input" {
		return InvalidValue("input", "Invalid value for 'input': an empty string cannot be embedded.")
	}
	return nil
}

// MaxEmbeddingInputs is the most inputs one embeddings request may carry
// (CreateEmbeddingRequest's input arrays: minItems 1, maxItems 2048).
const MaxEmbeddingInputs = 2048

// embeddingInputLength checks the length n of the embeddings input array
// (field "input"; the completions prompt has no such bound): 1 to
// MaxEmbeddingInputs items.
func embeddingInputLength(field string, n int) *Error {
	switch {
	case field != "input":
	case n == 0:
		return withCode(CodeEmptyArray, InvalidRequest("input", "Invalid 'input': empty array. Expected an array with minimum length 1, but got an empty array instead."))
	case n > MaxEmbeddingInputs:
		return withCode("array_above_max_length", InvalidRequest("input", "Invalid 'input': array too long. Expected an array with maximum length %d, but got an array with length %d instead.", MaxEmbeddingInputs, n))
	}
	return nil
}

// embeddingOptions checks an embeddings request's encoding_format ("float"
// or "base64") and dimensions (a positive integer), as
// CreateEmbeddingRequest describes them: a value no upstream reads the
// same way (the engine read a numeric encoding_format as float) is a 400
// naming it.
func embeddingOptions(d *Doc, f *rootMembers) *Error {
	if v := f.encodingFormat; v >= 0 && d.Kind(v) != KindNull {
		if d.Kind(v) != KindString || d.Str(v) != "float" && d.Str(v) != "base64" {
			return InvalidValue("encoding_format", "Invalid value for 'encoding_format': %s. Supported values are: 'float' and 'base64'.", d.Raw(v))
		}
	}
	_, _, err := optPositive(d, f.dimensions, "dimensions")
	return err
}

// FunctionName reports whether s is a valid function (or schema) name:
// ^[a-zA-Z0-9_-]{1,64}$, as OpenAI's API requires.
func FunctionName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// inRange checks the JSON number raw of parameter p against [min, max].
func inRange(p, raw string, min, max float64) *Error {
	x, err := strconv.ParseFloat(raw, 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange):
		return InvalidRequest(p, "Invalid '%s': expected a number, but got %s.", p, raw)
	case x > max:
		return withCode(CodeAboveMax, InvalidRequest(p, "Invalid '%s': decimal above maximum value. Expected a value <= %g, but got %s instead.", p, max, raw))
	case x < min:
		return withCode(CodeBelowMin, InvalidRequest(p, "Invalid '%s': decimal below minimum value. Expected a value >= %g, but got %s instead.", p, min, raw))
	}
	return nil
}

// withCode sets e's code.
func withCode(code string, e *Error) *Error {
	e.Code = code
	return e
}

// intRange checks the integer n of parameter p against [min, max].
func intRange(p string, n, min, max int) *Error {
	switch {
	case n > max:
		return withCode(CodeIntegerAboveMax, InvalidRequest(p, "Invalid '%s': integer above maximum value. Expected a value <= %d, but got %d instead.", p, max, n))
	case n < min:
		return withCode(CodeIntegerBelowMin, InvalidRequest(p, "Invalid '%s': integer below minimum value. Expected a value >= %d, but got %d instead.", p, min, n))
	}
	return nil
}

// logitBias checks logit_bias (value v, -1 when absent): an object from
// token ids (integers, as strings) to biases in [-100, 100].
func logitBias(d *Doc, v int) *Error {
	if v < 0 || d.Kind(v) == KindNull {
		return nil
	}
	if d.Kind(v) != KindObject {
		return wrongType("logit_bias", "an object", d, v)
	}
	for c, end := v+1, d.Next(v); c < end; c = d.Next(c) {
		k, _ := d.Key(c)
		if id, err := strconv.ParseUint(k, 10, 31); err != nil || strconv.FormatUint(id, 10) != k {
			return InvalidRequest("logit_bias", "Invalid key in 'logit_bias': %q is not a token id (a non-negative integer).", k)
		}
		p := "logit_bias." + k
		if d.Kind(c) != KindNumber {
			return wrongType(p, "a number", d, c)
		}
		if err := inRange(p, d.Raw(c), -100, 100); err != nil {
			return err
		}
	}
	return nil
}

// optBool reads the optional boolean value v (-1 when absent) of parameter p.
func optBool(d *Doc, v int, p string) (bool, *Error) {
	if v < 0 || d.Kind(v) == KindNull {
		return false, nil
	}
	if d.Kind(v) != KindTrue && d.Kind(v) != KindFalse {
		return false, wrongType(p, "a boolean", d, v)
	}
	return d.Kind(v) == KindTrue, nil
}

// optPositive reads the optional positive integer value v (-1 when absent)
// of parameter p.
func optPositive(d *Doc, v int, p string) (n int, set bool, err *Error) {
	if v < 0 || d.Kind(v) == KindNull {
		return 0, false, nil
	}
	raw := d.Raw(v)
	n, perr := strconv.Atoi(raw)
	if d.Kind(v) != KindNumber || perr != nil || n < 1 {
		code := CodeIntegerBelowMin
		if d.Kind(v) != KindNumber || perr != nil {
			code = CodeInvalidType // not an integer (a string, 1.5, one past int's range)
		}
		return 0, false, withCode(code, InvalidRequest(p, "Invalid '%s': expected a positive integer, but got %s.", p, raw))
	}
	return n, true, nil
}

// kindOf names value i's type for error messages, as Kind does; "nothing"
// for a negative i (a value that does not exist).
func kindOf(d *Doc, i int) string {
	if i < 0 {
		return "nothing"
	}
	switch d.Kind(i) {
	case KindNull:
		return "null"
	case KindString:
		return "a string"
	case KindNumber:
		return "a number"
	case KindTrue, KindFalse:
		return "a boolean"
	case KindArray:
		return "an array"
	}
	return "an object"
}

// wrongType is WrongType for value i of d (-1: absent).
func wrongType(param, want string, d *Doc, i int) *Error {
	e := InvalidRequest(param, "Invalid type for '%s': expected %s, but got %s.", param, want, kindOf(d, i))
	e.Code = CodeInvalidType
	return e
}

// Kind names a JSON value's type for error messages.
func Kind(v gjson.Result) string {
	switch {
	case !v.Exists():
		return "nothing"
	case v.Type == gjson.Null:
		return "null"
	case v.Type == gjson.String:
		return "a string"
	case v.Type == gjson.Number:
		return "a number"
	case v.Type == gjson.True, v.Type == gjson.False:
		return "a boolean"
	case v.IsArray():
		return "an array"
	default:
		return "an object"
	}
}

// WrongType is the 400 for param holding a value of the wrong type: type
// invalid_request_error, code invalid_type (CodeInvalidType), param the
// parameter's path, as OpenAI's own validation answers.
func WrongType(param, want string, got gjson.Result) *Error {
	e := InvalidRequest(param, "Invalid type for '%s': expected %s, but got %s.", param, want, Kind(got))
	e.Code = CodeInvalidType
	return e
}

// sizeError is the 400 of an empty body or one of 2 GiB or more, nil
// otherwise.
func sizeError(body string) *Error {
	if len(body) == 0 {
		return InvalidRequest("", "The request body is empty; send a JSON object.")
	}
	if len(body) >= math.MaxInt32 {
		return InvalidRequest("", "We could not parse the JSON body of your request: it is 2 GiB or more.")
	}
	return nil
}

// problemError is the 400 of what parse found wrong (nil for problemNone);
// key is the repeated member name of problemDup.
func problemError(pr problem, key string) *Error {
	switch pr {
	case problemSyntax:
		return InvalidRequest("", "We could not parse the JSON body of your request: it is not valid JSON.")
	case problemUTF8:
		return InvalidRequest("", "We could not parse the JSON body of your request: it is not valid UTF-8.")
	case problemDeep:
		return InvalidRequest("", "We could not parse the JSON body of your request: it nests deeper than %d levels.", MaxJSONDepth)
	case problemDup:
		return InvalidRequest("", "We could not parse the JSON body of your request: the key %q appears twice in one object.", key)
	}
	return nil
}

// CheckBody makes the checks Parse makes of every body before it reads a
// parameter, with the same 400 invalid_request_error in the same order: an
// empty body, not JSON, a string that is not valid UTF-8 (RFC 8259 §8.1),
// nesting deeper than MaxJSONDepth or a key repeated in one object. It is
// for the bodies of other APIs (router/translate) that are translated into
// a chat request: a string decoded from invalid UTF-8 would otherwise reach
// the upstream with U+FFFD in place of the client's bytes. nil: body is
// one JSON value fit for reading.
func CheckBody(body []byte) *Error {
	s := string(body)
	if err := sizeError(s); err != nil {
		return err
	}
	p, ok := parseAll(s)
	switch {
	case !ok:
		return problemError(problemSyntax, "")
	case p.badUTF8:
		return problemError(problemUTF8, "")
	}
	return problemError(p.problem, p.dupKey)
}

// CheckStructure reads the valid JSON text b once and reports its first
// structural problem, as Parse finds it: an object member name (decoded)
// that occurs twice in one object (dup, with the name), or nesting deeper
// than MaxJSONDepth (deep). No recursion, so deeply nested bodies cost no
// stack.
func CheckStructure(b []byte) (key string, dup, deep bool) {
	p, _ := parseAll(string(b))
	return p.dupKey, p.problem == problemDup, p.problem == problemDeep
}

// CheckJSON reads b once: valid reports whether b is one JSON value (RFC
// 8259, the grammar of gjson.Valid; the UTF-8 of strings is not checked),
// and for a valid b dup and deep are CheckStructure's, with the repeated
// member name key. b is read in place (not copied) and not kept. It stands
// for gjson.ValidBytes followed by CheckStructure, which read b twice.
func CheckJSON(b []byte) (valid bool, key string, dup, deep bool) {
	_, valid, key, dup, deep = ReadJSON(b)
	return valid, key, dup, deep
}

// ReadJSON is CheckJSON keeping what it read, for a caller that then
// looks at b's values (an upstream's answer: checked, then read by
// several stages) without parsing it again: when b is valid and neither
// dup nor deep, d holds every value of b as Parse's Doc does (the UTF-8
// of strings unchecked); otherwise d is empty (Len 0). d reads b in place:
// b must not change while d is used.
func ReadJSON(b []byte) (d Doc, valid bool, key string, dup, deep bool) {
	s := unsafe.String(unsafe.SliceData(b), len(b))
	p, ok := parseAll(s)
	if !ok {
		return Doc{}, false, "", false, false
	}
	if p.problem == problemNone {
		d = Doc{body: s, nodes: p.nodes}
	}
	return d, true, strings.Clone(p.dupKey), p.problem == problemDup, p.problem == problemDeep
}
