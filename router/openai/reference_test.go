package openai

import (
	"errors"
	"regexp"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// ParseRequest validates body as a request for ep (chat completions,
// completions or embeddings) and returns its view. It reads the body in a
// few linear passes and builds no document tree. Errors are 400
// invalid_request_error naming the parameter: not JSON, not UTF-8 (RFC 8259
// §8.1), nesting deeper than MaxJSONDepth, a key repeated in one object
// (gjson reads the first of two equal names, Go and Python parsers keep the
// last: a body could be classified on one value and answered on the other),
// a root that is not an object, a missing or mistyped parameter.
func refParseRequest(ep Endpoint, body []byte) (*Request, *Error) {
	if len(body) == 0 {
		return nil, InvalidRequest("", "The request body is empty; send a JSON object.")
	}
	if !gjson.ValidBytes(body) {
		return nil, InvalidRequest("", "We could not parse the JSON body of your request: it is not valid JSON.")
	}
	if !utf8.Valid(body) {
		return nil, InvalidRequest("", "We could not parse the JSON body of your request: it is not valid UTF-8.")
	}
	k, dup, deep := refCheckStructure(body)
	if deep {
		return nil, InvalidRequest("", "We could not parse the JSON body of your request: it nests deeper than %d levels.", MaxJSONDepth)
	}
	if dup {
		return nil, InvalidRequest("", "We could not parse the JSON body of your request: the key %q appears twice in one object.", k)
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return nil, InvalidRequest("", "The JSON body of your request must be an object, got %s.", Kind(root))
	}
	r := &Request{Endpoint: ep, N: 1}
	model := root.Get("model")
	if !model.Exists() || model.Type == gjson.Null {
		return nil, InvalidRequest("model", "You must provide a model parameter.")
	}
	if model.Type != gjson.String || model.Str == "" {
		return nil, WrongType("model", "a non-empty string", model)
	}
	if len(model.Str) > MaxModelName {
		return nil, InvalidRequest("model", "Invalid 'model': longer than %d bytes.", MaxModelName)
	}
	r.Model = model.Str
	var err *Error
	if r.Stream, err = refOptBool(root, "stream"); err != nil {
		return nil, err
	}
	if r.IncludeUsage, err = refOptBool(root, "stream_options.include_usage"); err != nil {
		return nil, err
	}
	for _, p := range []string{"max_completion_tokens", "max_tokens"} {
		n, set, err := refOptPositive(root, p)
		if err != nil {
			return nil, err
		}
		if set {
			r.MaxTokens = max(r.MaxTokens, n)
		}
	}
	for _, p := range []struct {
		name     string
		min, max float64
	}{{"temperature", 0, 2}, {"top_p", 0, 1}, {"presence_penalty", -2, 2}, {"frequency_penalty", -2, 2}} {
		v := root.Get(p.name)
		if !v.Exists() || v.Type == gjson.Null {
			continue
		}
		if v.Type != gjson.Number {
			return nil, WrongType(p.name, "a number", v)
		}
		if err := refRange(p.name, v.Raw, p.min, p.max); err != nil {
			return nil, err
		}
	}
	if lb := root.Get("logit_bias"); lb.Exists() && lb.Type != gjson.Null {
		if !lb.IsObject() {
			return nil, WrongType("logit_bias", "an object", lb)
		}
		var bad *Error
		lb.ForEach(func(k, v gjson.Result) bool {
			if id, err := strconv.Atoi(k.Str); err != nil || id < 0 || id > 1<<31-1 || strconv.Itoa(id) != k.Str {
				bad = InvalidRequest("logit_bias", "Invalid key in 'logit_bias': %q is not a token id (a non-negative integer).", k.Str)
			} else if v.Type != gjson.Number {
				bad = WrongType("logit_bias."+k.Str, "a number", v)
			} else {
				bad = refRange("logit_bias."+k.Str, v.Raw, -100, 100)
			}
			return bad == nil
		})
		if bad != nil {
			return nil, bad
		}
	}
	if u := root.Get("user"); u.Exists() && u.Type != gjson.Null && u.Type != gjson.String {
		return nil, WrongType("user", "a string", u)
	}
	if so := root.Get("stream_options"); so.Exists() && so.Type != gjson.Null && !r.Stream {
		return nil, InvalidRequest("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
	}
	if n, set, err := refOptPositive(root, "n"); err != nil {
		return nil, err
	} else if set {
		if n > 128 {
			return nil, withCode(CodeIntegerAboveMax, InvalidRequest("n", "Invalid 'n': integer above maximum value. Expected a value <= 128, but got %d instead.", n))
		}
		r.N = n
	}
	if v := root.Get("response_format"); v.Exists() && v.Type != gjson.Null {
		if !v.IsObject() {
			return nil, WrongType("response_format", "an object", v)
		}
		t := v.Get("type")
		if t.Type != gjson.String {
			return nil, WrongType("response_format.type", "a string", t)
		}
		r.ResponseFormat = t.Str
		if t.Str == "json_schema" && ep == EndpointChat {
			js := v.Get("json_schema")
			switch n := js.Get("name"); {
			case !js.Exists() || js.Type == gjson.Null:
				return nil, MissingParameter("response_format.json_schema", "Missing required parameter: 'response_format.json_schema'.")
			case !js.IsObject():
				return nil, WrongType("response_format.json_schema", "an object", js)
			case n.Type != gjson.String:
				return nil, WrongType("response_format.json_schema.name", "a string", n)
			case !refName(n.Str):
				return nil, withCode(CodeInvalidValue, InvalidRequest("response_format.json_schema.name", "Invalid 'response_format.json_schema.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]{1,64}$'."))
			}
		}
	}
	switch ep {
	case EndpointChat:
		err = refChat(r, root)
	case EndpointCompletions:
		if n, set, e := refOptPositive(root, "best_of"); e != nil {
			return nil, e
		} else if set {
			if n > 20 {
				return nil, withCode(CodeIntegerAboveMax, InvalidRequest("best_of", "Invalid 'best_of': integer above maximum value. Expected a value <= 20, but got %d instead.", n))
			}
			r.BestOf = n
		}
		if v := root.Get("logprobs"); v.Exists() && v.Type != gjson.Null {
			if err := refIntIn(v, "logprobs", 0, 5); err != nil {
				return nil, err
			}
			r.Logprobs = true
		}
		err = refPrompts(r, root, "prompt")
	case EndpointEmbeddings:
		if err = refPrompts(r, root, "input"); err == nil {
			if v := root.Get("encoding_format"); v.Exists() && v.Type != gjson.Null && (v.Type != gjson.String || v.Str != "float" && v.Str != "base64") {
				err = InvalidValue("encoding_format", "Invalid value for 'encoding_format': %s. Supported values are: 'float' and 'base64'.", v.Raw)
			} else if _, _, e := refOptPositive(root, "dimensions"); e != nil {
				err = e
			}
		}
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

func refChat(r *Request, root gjson.Result) *Error {
	msgs := root.Get("messages")
	if !msgs.Exists() {
		return MissingParameter("messages", "Missing required parameter: 'messages'.")
	}
	if !msgs.IsArray() {
		return WrongType("messages", "an array", msgs)
	}
	allStrings := func(v gjson.Result) bool {
		ok := true
		v.ForEach(func(_, x gjson.Result) bool { ok = x.Type == gjson.String; return ok })
		return ok
	}
	for _, c := range []struct {
		name, want string
		ok         func(v gjson.Result) bool
	}{
		{"stop", "a string or an array of strings", func(v gjson.Result) bool { return v.Type == gjson.String || v.IsArray() && allStrings(v) }},
		{"seed", "an integer", func(v gjson.Result) bool { return v.Type == gjson.Number }},
		{"metadata", "an object", func(v gjson.Result) bool { return v.IsObject() }},
		{"store", "a boolean", func(v gjson.Result) bool { return v.IsBool() }},
		{"parallel_tool_calls", "a boolean", func(v gjson.Result) bool { return v.IsBool() }},
		{"service_tier", "a string", func(v gjson.Result) bool { return v.Type == gjson.String }},
		{"reasoning_effort", "a string", func(v gjson.Result) bool { return v.Type == gjson.String }},
		{"verbosity", "a string", func(v gjson.Result) bool { return v.Type == gjson.String }},
	} {
		if v := root.Get(c.name); v.Exists() && v.Type != gjson.Null && !c.ok(v) {
			return WrongType(c.name, c.want, v)
		}
	}
	if v := root.Get("logprobs"); v.Exists() && v.Type != gjson.Null {
		if v.Type != gjson.True && v.Type != gjson.False {
			return WrongType("logprobs", "a boolean", v)
		}
		r.Logprobs = v.Bool()
	}
	if m := root.Get("modalities"); m.Exists() && m.Type != gjson.Null {
		if !m.IsArray() {
			return WrongType("modalities", "an array", m)
		}
		for i, x := range m.Array() {
			if x.Type != gjson.String || x.Str != "text" && x.Str != "audio" {
				p := "modalities[" + strconv.Itoa(i) + "]"
				return InvalidValue(p, "Invalid value for '%s': %s. Supported values are: 'text' and 'audio'.", p, x.Raw)
			}
			if x.Str == "audio" {
				r.AudioOut = true
			}
		}
	}
	if v := root.Get("top_logprobs"); v.Exists() && v.Type != gjson.Null {
		if err := refIntIn(v, "top_logprobs", 0, 20); err != nil {
			return err
		}
	}
	if tc := root.Get("tool_choice"); tc.Exists() && tc.Type != gjson.Null {
		switch {
		case tc.Type == gjson.String:
			if tc.Str != "none" && tc.Str != "auto" && tc.Str != "required" {
				return InvalidValue("tool_choice", "Invalid value for 'tool_choice': '%s'. Supported values are: 'none', 'auto' and 'required'.", tc.Str)
			}
			r.ToolChoice = tc.Str
		case !tc.IsObject():
			return WrongType("tool_choice", "a string or an object", tc)
		case tc.Get("type").Type != gjson.String:
			return WrongType("tool_choice.type", "a string", tc.Get("type"))
		default:
			ty := tc.Get("type").Str
			switch ty {
			case "function", "custom":
				if o := tc.Get(ty); !o.IsObject() {
					return WrongType("tool_choice."+ty, "an object", o)
				} else if o.Get("name").Type != gjson.String {
					return WrongType("tool_choice."+ty+".name", "a string", o.Get("name"))
				}
			case "allowed_tools":
				if o := tc.Get(ty); !o.IsObject() {
					return WrongType("tool_choice.allowed_tools", "an object", o)
				}
			default:
				return InvalidValue("tool_choice.type", "Invalid value for 'tool_choice.type': '%s'. Supported values are: 'function', 'custom' and 'allowed_tools'.", ty)
			}
			r.ToolChoice = ty
		}
	}
	for _, list := range []struct{ path, name string }{{"tools", "function.name"}, {"functions", "name"}} {
		t := root.Get(list.path)
		if !t.Exists() || t.Type == gjson.Null {
			continue
		}
		if !t.IsArray() {
			return WrongType(list.path, "an array", t)
		}
		var bad *Error
		i := 0
		t.ForEach(func(_, tool gjson.Result) bool {
			name := list.name
			if list.path == "tools" && tool.Get("type").Str == "custom" {
				name = "custom.name"
			}
			n := tool.Get(name)
			if n.Type != gjson.String {
				bad = WrongType(list.path+"["+strconv.Itoa(i)+"]."+name, "a string", n)
				return false
			}
			if !refName(n.Str) {
				p := list.path + "[" + strconv.Itoa(i) + "]." + name
				bad = withCode(CodeInvalidValue, InvalidRequest(p, "Invalid '%s': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]{1,64}$'.", p))
				return false
			}
			r.Tools = append(r.Tools, n.Str)
			i++
			return true
		})
		if bad != nil {
			return bad
		}
	}
	var bad *Error
	var callIDs []string
	i := 0
	msgs.ForEach(func(_, m gjson.Result) bool {
		bad = refMessage(r, i, m, &callIDs)
		i++
		return bad == nil
	})
	if bad != nil {
		return bad
	}
	if i == 0 {
		return withCode(CodeEmptyArray, InvalidRequest("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1."))
	}
	r.Messages = i
	return nil
}

func refMessage(r *Request, i int, m gjson.Result, callIDs *[]string) *Error {
	param := "messages[" + strconv.Itoa(i) + "]"
	if !m.IsObject() {
		return WrongType(param, "an object", m)
	}
	role := m.Get("role")
	if role.Type != gjson.String {
		return WrongType(param+".role", "a string", role)
	}
	if !ChatRoles[role.Str] {
		return InvalidValue(param+".role", "Invalid value for '%s.role': '%s'. Supported values are: 'system', 'developer', 'user', 'assistant', 'tool' and 'function'.", param, role.Str)
	}
	if role.Str == "tool" || role.Str == "function" {
		r.ToolTurns = true
	}
	if id := m.Get("tool_call_id"); role.Str == "tool" && id.Type != gjson.String {
		if !id.Exists() || id.Type == gjson.Null {
			return InvalidRequest(param+".tool_call_id", "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'.")
		}
		return WrongType(param+".tool_call_id", "a string", id)
	}
	if id := m.Get("tool_call_id").Str; role.Str == "tool" && !slices.Contains(*callIDs, id) {
		p := "messages.[" + strconv.Itoa(i) + "]"
		if len(*callIDs) == 0 {
			return InvalidRequest(p+".role", "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.")
		}
		return InvalidRequest(p+".tool_call_id", "Invalid parameter: 'tool_call_id' of '%s' not found in 'tool_calls' of previous message.", id)
	}
	if n := m.Get("name"); n.Exists() && n.Type != gjson.Null && n.Type != gjson.String {
		return WrongType(param+".name", "a string", n)
	}
	content := m.Get("content")
	switch {
	case !content.Exists() || content.Type == gjson.Null:
		if role.Str != "assistant" {
			return InvalidValue(param+".content", "Invalid value for '%s.content': expected a string or an array of content parts, got null.", param)
		}
	case content.Type == gjson.String:
	case content.IsArray():
		var bad *Error
		j := 0
		content.ForEach(func(_, part gjson.Result) bool {
			pparam := param + ".content[" + strconv.Itoa(j) + "]"
			j++
			if !part.IsObject() {
				bad = WrongType(pparam, "an object", part)
				return false
			}
			t := part.Get("type").String()
			switch {
			case !ContentPartTypes[t]:
				bad = InvalidValue(pparam+".type", "Invalid value for '%s.type': '%s'. Supported values are: 'text', 'image_url', 'input_audio', 'refusal' and 'file'.", pparam, t)
			case t == "text":
				if txt := part.Get("text"); txt.Type != gjson.String {
					bad = WrongType(pparam+".text", "a string", txt)
				}
			}
			return bad == nil
		})
		if bad != nil {
			return bad
		}
	default:
		return WrongType(param+".content", "a string or an array of content parts", content)
	}
	if tcs := m.Get("tool_calls"); tcs.Exists() && tcs.Type != gjson.Null {
		if !tcs.IsArray() {
			return WrongType(param+".tool_calls", "an array", tcs)
		}
		var bad *Error
		j := 0
		tcs.ForEach(func(_, tc gjson.Result) bool {
			p := param + ".tool_calls[" + strconv.Itoa(j) + "]"
			j++
			obj, args := "function", "arguments"
			if tc.Get("type").Str == "custom" {
				obj, args = "custom", "input"
			}
			fn := tc.Get(obj)
			switch {
			case !tc.IsObject():
				bad = WrongType(p, "an object", tc)
			case !fn.IsObject():
				bad = WrongType(p+"."+obj, "an object", fn)
			case fn.Get("name").Type != gjson.String:
				bad = WrongType(p+"."+obj+".name", "a string", fn.Get("name"))
			case fn.Get(args).Type != gjson.String:
				bad = WrongType(p+"."+obj+"."+args, "a string", fn.Get(args))
			case tc.Get("id").Type == gjson.String:
				*callIDs = append(*callIDs, tc.Get("id").Str)
			}
			return bad == nil
		})
		if bad != nil {
			return bad
		}
		r.ToolTurns = true
	}
	if m.Get("function_call").Exists() {
		r.ToolTurns = true
	}
	return nil
}

// prompts checks the "prompt" (completions) or "input" (embeddings) field:
// a string, an array of strings, or token ids.
func refPrompts(r *Request, root gjson.Result, field string) *Error {
	v := root.Get(field)
	if !v.Exists() || v.Type == gjson.Null {
		return MissingParameter(field, "Missing required parameter: '%s'.", field)
	}
	r.Prompts = 1
	switch {
	case v.Type == gjson.String:
	case v.IsArray():
		var bad *Error
		i, ids := 0, false
		v.ForEach(func(_, e gjson.Result) bool {
			switch {
			case e.Type == gjson.String:
			case e.Type == gjson.Number:
				r.TokenPrompts, ids = true, true
			case e.IsArray():
				r.TokenPrompts = true
			default:
				bad = WrongType(field+"["+strconv.Itoa(i)+"]", "a string or token ids", e)
			}
			i++
			return bad == nil
		})
		if bad == nil && !ids && i > 0 {
			r.Prompts = i
		}
		if bad == nil && field == "input" && i == 0 {
			bad = withCode(CodeEmptyArray, InvalidRequest("input", "Invalid 'input': empty array. Expected an array with minimum length 1, but got an empty array instead."))
		}
		if bad == nil && field == "input" && i > 2048 {
			bad = withCode("array_above_max_length", InvalidRequest("input", "Invalid 'input': array too long. Expected an array with maximum length 2048, but got an array with length %d instead.", i))
		}
		return bad
	default:
		return WrongType(field, "a string or an array", v)
	}
	if field == "input" && v.Str == "" {
		return InvalidValue("input", "Invalid value for 'input': an empty string cannot be embedded.")
	}
	return nil
}

// refRange checks a number against [min, max], with ParseFloat's reading.
func refRange(p, raw string, min, max float64) *Error {
	x, err := strconv.ParseFloat(raw, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return InvalidRequest(p, "Invalid '%s': expected a number, but got %s.", p, raw)
	}
	if x > max {
		return withCode(CodeAboveMax, InvalidRequest(p, "Invalid '%s': decimal above maximum value. Expected a value <= %g, but got %s instead.", p, max, raw))
	}
	if x < min {
		return withCode(CodeBelowMin, InvalidRequest(p, "Invalid '%s': decimal below minimum value. Expected a value >= %g, but got %s instead.", p, min, raw))
	}
	return nil
}

// refIntIn checks that v is an integer in [min, max].
func refIntIn(v gjson.Result, p string, min, max int64) *Error {
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	if v.Type != gjson.Number || err != nil || strconv.IntSize == 32 && int64(int32(n)) != n {
		return WrongType(p, "an integer", v)
	}
	if n > max {
		return withCode(CodeIntegerAboveMax, InvalidRequest(p, "Invalid '%s': integer above maximum value. Expected a value <= %d, but got %d instead.", p, max, n))
	}
	if n < min {
		return withCode(CodeIntegerBelowMin, InvalidRequest(p, "Invalid '%s': integer below minimum value. Expected a value >= %d, but got %d instead.", p, min, n))
	}
	return nil
}

// refName is ^[a-zA-Z0-9_-]{1,64}$ as a regular expression.
var refNameRe = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

func refName(s string) bool { return refNameRe.MatchString(s) }

func refOptBool(root gjson.Result, p string) (bool, *Error) {
	v := root.Get(p)
	if !v.Exists() || v.Type == gjson.Null {
		return false, nil
	}
	if v.Type != gjson.True && v.Type != gjson.False {
		return false, WrongType(p, "a boolean", v)
	}
	return v.Bool(), nil
}

func refOptPositive(root gjson.Result, p string) (n int, set bool, err *Error) {
	v := root.Get(p)
	if !v.Exists() || v.Type == gjson.Null {
		return 0, false, nil
	}
	n, perr := strconv.Atoi(v.Raw)
	if v.Type != gjson.Number || perr != nil {
		return 0, false, withCode(CodeInvalidType, InvalidRequest(p, "Invalid '%s': expected a positive integer, but got %s.", p, v.Raw))
	}
	if n < 1 {
		return 0, false, withCode(CodeIntegerBelowMin, InvalidRequest(p, "Invalid '%s': expected a positive integer, but got %s.", p, v.Raw))
	}
	return n, true, nil
}

// refCheckStructure is CheckStructure as it was before the one-pass parser.
// It walks the valid JSON text b once and stops at the first
// problem: an object member name (unescaped) that occurs twice in one
// object (dup), or nesting deeper than MaxJSONDepth (deep). No recursion,
// so deeply nested bodies cost no stack; a map is made only for objects
// with more than two members.
func refCheckStructure(b []byte) (key string, dup, deep bool) {
	type frame struct {
		object bool
		first  string              // the first member name
		keys   map[string]struct{} // the names, from the second member on
		n      int                 // members seen
	}
	var stack []frame
	expectKey := false
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '{', '[':
			if len(stack) == MaxJSONDepth {
				return "", false, true
			}
			stack = append(stack, frame{object: b[i] == '{'})
			expectKey = b[i] == '{'
		case '}', ']':
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			expectKey = false
		case ',':
			expectKey = len(stack) > 0 && stack[len(stack)-1].object
		case '"':
			j, esc := i+1, false
			for ; j < len(b) && b[j] != '"'; j++ {
				if b[j] == '\\' {
					j++
					esc = true
				}
			}
			if expectKey && len(stack) > 0 {
				var k string
				if esc {
					k = gjson.ParseBytes(b[i : j+1]).Str
				} else {
					k = string(b[i+1 : j])
				}
				f := &stack[len(stack)-1]
				switch f.n {
				case 0:
					f.first = k
				case 1:
					if k == f.first {
						return k, true, false
					}
					f.keys = map[string]struct{}{f.first: {}, k: {}}
				default:
					if _, seen := f.keys[k]; seen {
						return k, true, false
					}
					f.keys[k] = struct{}{}
				}
				f.n++
				expectKey = false
			}
			i = j
		}
	}
	return "", false, false
}
