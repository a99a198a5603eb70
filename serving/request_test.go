package serving

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/tidwall/sjson"
)

// wrongValues are JSON values of every type but kind's, plus numbers a Go
// field of that kind cannot hold.
func wrongValues(t reflect.Type) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int64:
		return []string{`"abc"`, `2.5`, `1e30`, `-1e30`, `99999999999999999999`, `true`, `[]`, `{}`}
	case reflect.Float64:
		return []string{`"abc"`, `true`, `[]`, `{}`, `1e400`}
	case reflect.Bool:
		return []string{`"abc"`, `1`, `[]`, `{}`}
	case reflect.String:
		return []string{`1`, `true`, `[]`, `{}`}
	case reflect.Struct:
		return []string{`"abc"`, `1`, `true`, `[]`}
	case reflect.Slice:
		return []string{`"abc"`, `1`, `true`, `{}`}
	}
	return nil
}

// requestFields lists completionRequest's JSON fields (path, Go type),
// recursing into pointers to structs (stream_options.include_usage);
// json.RawMessage fields are left to the table of
// TestRequestTypeErrorsName400TheParameter.
func requestFields(t reflect.Type, prefix string) (paths []string, types []reflect.Type) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "" || tag == "-" || f.Type == reflect.TypeFor[json.RawMessage]() {
			continue
		}
		path := prefix + tag
		if f.Type.Kind() == reflect.Pointer && f.Type.Elem().Kind() == reflect.Struct {
			paths, types = append(paths, path), append(types, f.Type)
			p, ty := requestFields(f.Type.Elem(), path+".")
			paths, types = append(paths, p...), append(types, ty...)
			continue
		}
		paths, types = append(paths, path), append(types, f.Type)
	}
	return paths, types
}

// TestRequestTypeErrorsName400TheParameter: every field of the engine's
// request, given a value of another JSON type or a number its Go type
// cannot hold, is a 400 invalid_request_error whose param is the field's
// path and whose message names it, on both completion endpoints; no
// message leaks Go's decoder or calls the (valid) JSON invalid.
func TestRequestTypeErrorsName400TheParameter(t *testing.T) {
	e := newEngine(t, nil)
	paths, types := requestFields(reflect.TypeFor[completionRequest](), "")
	if len(paths) < 12 {
		t.Fatalf("only %d fields found: %v", len(paths), paths)
	}
	type tc struct{ path, value string }
	var cases []tc
	for i, p := range paths {
		for _, v := range wrongValues(types[i]) {
			cases = append(cases, tc{p, v})
		}
	}
	// The json.RawMessage fields, validated by the engine's own code.
	cases = append(cases, tc{"stop", `5`}, tc{"stop", `[1]`}, tc{"stop", `{}`}, tc{"logprobs", `"x"`}, tc{"logprobs", `{}`})
	bases := map[string]string{
		"/v1/chat/completions": `{"model":"molly-demo","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`,
		"/v1/completions":      `{"model":"molly-demo","prompt":"hi","max_tokens":1}`,
	}
	for path, base := range bases {
		for _, c := range cases {
			body, err := sjson.SetRaw(base, c.path, c.value)
			if err != nil {
				t.Fatal(err)
			}
			w := call(t, e, context.Background(), http.MethodPost, path, body)
			var r chatResponse
			if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil || r.Error == nil {
				t.Errorf("%s %s=%s: %d %s, want an OpenAI error", path, c.path, c.value, w.Code, w.Body.String())
				continue
			}
			param := ""
			if r.Error.Param != nil {
				param = *r.Error.Param
			}
			msg := r.Error.Message
			leak := strings.Contains(msg, "json:") || strings.Contains(msg, "Go ") || strings.Contains(msg, "unmarshal") ||
				strings.Contains(msg, "completionRequest") || strings.Contains(msg, "not valid JSON")
			if w.Code != http.StatusBadRequest || r.Error.Type != "invalid_request_error" || param != c.path || !strings.Contains(msg, c.path) || leak {
				t.Errorf("%s %s=%s: %d %s param %q %q; want 400 invalid_request_error, param %q named in the message, no Go internals",
					path, c.path, c.value, w.Code, r.Error.Type, param, msg, c.path)
			}
		}
	}
	// Some messages word for word.
	for _, c := range []struct{ path, body, param, want string }{
		{"/v1/completions", `{"model":"molly-demo","prompt":"hi","messages":5}`, "messages", "messages must be an array, got a number"},
		{"/v1/chat/completions", `{"model":"molly-demo","messages":[{"role":"user","content":"hi"}],"seed":"abc"}`, "seed", "Invalid type for 'seed': expected an integer, but got a string."},
		{"/v1/chat/completions", `{"model":"molly-demo","messages":[{"role":"user","content":"hi"}],"seed":1e30}`, "seed", "seed must be an integer between -9223372036854775808 and 9223372036854775807, got 1e30"},
		{"/v1/chat/completions", `{"model":"molly-demo","messages":[{"role":"user","content":"hi"}],"top_k":2.5}`, "top_k", "top_k must be an integer, got 2.5"},
		{"/v1/chat/completions", `{"model":"molly-demo","messages":[{"role":"user","content":"hi"}],"top_k":4.0}`, "top_k", "top_k must be an integer written without a fraction or exponent, got 4.0"},
		{"/v1/chat/completions", `{"model":"molly-demo","messages":[{"role":"user","content":"hi"}],"seed":1e400}`, "seed", "seed must be an integer between -9223372036854775808 and 9223372036854775807, got 1e400"},
		{"/v1/chat/completions", `{"model":"molly-demo","messages":[{"role":"user","content":"hi"}],"echo":"yes"}`, "echo", "echo must be a boolean, got a string"},
		{"/v1/completions", `{"model":"molly-demo","prompt":"hi","suffix":"the end"}`, "suffix", "suffix (insertion) is not supported"},
		{"/v1/completions", `{"model":"molly-demo","prompt":"hi","best_of":3}`, "best_of", "best_of above 1 is not supported"},
	} {
		w := call(t, e, context.Background(), http.MethodPost, c.path, c.body)
		var r chatResponse
		if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil || r.Error == nil || r.Error.Param == nil {
			t.Errorf("%s: %d %s", c.body, w.Code, w.Body.String())
			continue
		}
		if w.Code != http.StatusBadRequest || *r.Error.Param != c.param || !strings.HasPrefix(r.Error.Message, c.want) {
			t.Errorf("%s: %d param %q %q, want 400 param %q %q", c.body, w.Code, *r.Error.Param, r.Error.Message, c.param, c.want)
		}
	}
}

// TestTopPZeroKeepsTheMostLikelyToken: top_p 0, which the OpenAPI
// description allows (0..1), keeps only the most likely token, so a sampled
// choice at any temperature and seed is the greedy one (temperature 0, the
// oracle); top_p outside 0..1 stays 400.
func TestTopPZeroKeepsTheMostLikelyToken(t *testing.T) {
	e := newEngine(t, nil)
	want, _ := mustText(t, e, greedy("molly-demo", "tell me a story", 24))
	for seed := range 3 {
		b := greedy("molly-demo", "tell me a story", 24)
		b["temperature"], b["top_p"], b["seed"] = 1.5, 0, seed
		if got, _ := mustText(t, e, b); got != want {
			t.Errorf("seed %d: top_p 0 gave %q, want the greedy %q", seed, got, want)
		}
	}
	for _, v := range []float64{-0.1, 1.1} {
		b := greedy("molly-demo", "x", 1)
		b["top_p"] = v
		if code, r := chat(t, e, b); code != http.StatusBadRequest || r.Error == nil || r.Error.Param == nil || *r.Error.Param != "top_p" {
			t.Errorf("top_p %v: status %d error %+v, want 400 on top_p", v, code, r.Error)
		}
	}
}

// TestAssistantRefusalPartsAreItsText: an assistant message's refusal
// content parts (OpenAI's ChatCompletionRequestAssistantMessageContentPart)
// are rendered as the assistant's text: the prompt is the chat template's
// with the refusal string as the assistant turn (the oracle: the template's
// text tokenized), the same as for that text as a string; a refusal part
// in a user message stays 400.
func TestAssistantRefusalPartsAreItsText(t *testing.T) {
	e := newEngine(t, nil)
	msgs := func(assistant any) map[string]any {
		return map[string]any{"model": "molly-demo", "max_tokens": 1, "temperature": 0, "messages": []map[string]any{
			{"role": "user", "content": "hi"}, {"role": "assistant", "content": assistant}, {"role": "user", "content": "ok"}}}
	}
	tmpl, err := e.Tokenize("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nno, never<|im_end|>\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n")
	if err != nil {
		t.Fatal(err)
	}
	for _, content := range []any{
		"no, never",
		[]map[string]any{{"type": "refusal", "refusal": "no, never"}},
		[]map[string]any{{"type": "text", "text": "no, "}, {"type": "refusal", "refusal": "never"}},
	} {
		_, req, err := e.parse(mustJSON(t, msgs(content)), true)
		if err != nil {
			t.Fatalf("%v: %v", content, err)
		}
		if !reflect.DeepEqual(req.Prompt, tmpl) {
			t.Errorf("%v: prompt %v, want the template's %v", content, req.Prompt, tmpl)
		}
		if code, r := chat(t, e, msgs(content)); code != http.StatusOK || r.Usage == nil || r.Usage.PromptTokens != len(tmpl) {
			t.Errorf("%v: status %d %+v, want 200 with %d prompt tokens", content, code, r, len(tmpl))
		}
	}
	b := msgs("x")
	b["messages"] = []map[string]any{{"role": "user", "content": []map[string]any{{"type": "refusal", "refusal": "no"}}}}
	if code, r := chat(t, e, b); code != http.StatusBadRequest || r.Error == nil {
		t.Errorf("a user refusal part: status %d %+v, want 400", code, r)
	}
}
