package serving

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/molly-gateway/molly/internal/openapitest"
	"github.com/molly-gateway/molly/serving/llama"
)

// compileSchema compiles a JSON Schema with an independent validator
// (santhosh-tekuri/jsonschema, draft 2020-12): the oracle for the outputs.
func compileSchema(t testing.TB, schema string) *jsonschema.Schema {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("mem:///s.json", v); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("mem:///s.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func validateJSON(t testing.TB, s *jsonschema.Schema, text string) {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Errorf("output is not JSON: %v\n%q", err, text)
		return
	}
	if err := s.Validate(v); err != nil {
		t.Errorf("output does not match the schema: %v\n%q", err, text)
	}
}

// Bounded schemas (string lengths, array sizes) so that a random model
// ends within max_tokens; the grammar makes every output valid whatever
// the weights.
const personSchema = `{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer"},
    "role": {"enum": ["admin", "user", null, 3]},
    "active": {"type": "boolean"},
    "scores": {"type": "array", "items": {"type": "number"}, "maxItems": 3},
    "kind": {"const": "person"},
    "nick": {"type": ["string", "null"], "maxLength": 4},
    "address": {"type": "object", "properties": {"zip": {"type": "string", "minLength": 2, "maxLength": 5}, "flag": {"type": "null"}}, "required": ["zip"], "additionalProperties": false},
    "tag": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]}
  },
  "required": ["name", "age", "role", "kind"],
  "additionalProperties": false
}`

func TestSchemaGrammarsParseInLlamaCpp(t *testing.T) {
	m, err := llama.LoadModel(demoDir + "/" + DemoModelFile)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, s := range []string{personSchema, `{}`, `true`, `{"type":"array"}`, `{"type":"object"}`,
		`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"},"c":{"type":"string"}}}`,
		`{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":4}`, `{"type":"string","minLength":3}`,
		`{"type":"object","properties":{"we ird/key\"":{"const":"a\\b\n\"c\""}},"required":["we ird/key\""]}`,
		pydanticSchema, keywordSchema, `{"type":"object","properties":{"next":{"$ref":"#"}}}`,
		// Definitions named as the primitive and start rules, escaped names.
		`{"$defs":{"string":{"type":"integer"},"root":{"$ref":"#/$defs/string"},"space":{"type":"array","items":{"$ref":"#/$defs/root"}}},"$ref":"#/$defs/space"}`,
		`{"type":"array","items":{"anyOf":[{"$ref":"#/$defs/a~1b"},{"$ref":"#/$defs/a%20c"}]},"$defs":{"a/b":{"type":"integer"},"a c":{"type":"null"}}}`} {
		g, err := SchemaToGBNF([]byte(s))
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		gr, err := llama.NewGrammar(m, g)
		if err != nil {
			t.Fatalf("%s: llama.cpp refused\n%s", s, g)
		}
		gr.Close()
	}
	if _, err := llama.NewGrammar(m, `root ::= "a" undefined-rule`); !errors.Is(err, llama.ErrGrammar) {
		t.Fatalf("a bad grammar: %v, want ErrGrammar", err)
	}
	g, _ := llama.NewGrammar(m, JSONObjectGBNF())
	g.Close()
}

func TestUnsupportedSchemaKeywordIs400(t *testing.T) {
	e := newEngine(t, nil)
	for kw, schema := range map[string]string{
		"pattern":           `{"type":"object","properties":{"a":{"type":"string","pattern":"^x(?!y)"}}}`,
		"$ref":              `{"type":"object","properties":{"a":{"$ref":"https://example.com/a.json"}}}`,
		"minimum":           `{"type":"number","minimum":0.5}`,
		"type":              `{"$ref":"#/$defs/a","type":"string","$defs":{"a":{"type":"string"}}}`,
		"#/$defs/b":         `{"$ref":"#/$defs/b","$defs":{"a":{"type":"string"}}}`,
		"patternProperties": `{"type":"object","properties":{"a":{"type":"string"}},"patternProperties":{"^b":{}}}`,
		"uniqueItems":       `{"type":"array","uniqueItems":true}`,
	} {
		body := map[string]any{"model": "molly-demo", "messages": []map[string]any{{"role": "user", "content": "hi"}},
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "schema": json.RawMessage(schema)}}}
		code, r := chat(t, e, body)
		if code != http.StatusBadRequest || r.Error == nil || !strings.Contains(r.Error.Message, fmt.Sprintf("%q", kw)) {
			t.Errorf("%s: status %d, error %+v; want 400 naming the keyword", kw, code, r.Error)
		}
	}
}

func chatRaw(t testing.TB, e *Engine, body map[string]any) (int, []byte) {
	t.Helper()
	w := call(t, e, context.Background(), http.MethodPost, "/v1/chat/completions", body)
	return w.Code, w.Body.Bytes()
}

func bigEngine(t testing.TB) *Engine {
	return newEngine(t, func(c *Config) { c.NSeqMax = 4; c.NCtx = 4 * 2048 })
}

func TestJSONSchemaOutputMatchesSchemaFor20Seeds(t *testing.T) {
	spec := openapitest.Load(t)
	e := bigEngine(t)
	oracle := compileSchema(t, personSchema)
	for seed := range 20 {
		code, body := chatRaw(t, e, map[string]any{
			"model": "molly-demo", "seed": seed, "max_tokens": 1500,
			"messages":        []map[string]any{{"role": "user", "content": "describe someone"}},
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "person", "strict": true, "schema": json.RawMessage(personSchema)}},
		})
		if code != http.StatusOK {
			t.Fatalf("seed %d: %d %s", seed, code, body)
		}
		spec.Validate(t, "CreateChatCompletionResponse", body)
		var r chatResponse
		_ = json.Unmarshal(body, &r)
		if r.Choices[0].FinishReason != "stop" {
			t.Fatalf("seed %d: finish %q after %d tokens", seed, r.Choices[0].FinishReason, r.Usage.CompletionTokens)
		}
		validateJSON(t, oracle, r.Choices[0].Message.Content)
	}
}

// pydanticSchema is shaped as pydantic writes a model with nested models:
// the nested types in $defs (and, as pydantic v1 wrote them, definitions)
// referenced by $ref, Optional as anyOf with null, a $ref beside a default,
// a recursive model, and format annotations.
const pydanticSchema = `{
  "$defs": {
    "Address": {"title": "Address", "type": "object",
      "properties": {"street": {"title": "Street", "type": "string", "maxLength": 6}, "zip": {"title": "Zip", "type": "string", "format": "postal-code", "maxLength": 5}},
      "required": ["street", "zip"]},
    "Color": {"title": "Color", "enum": ["red", "green"], "type": "string"}
  },
  "definitions": {
    "Node": {"title": "Node", "type": "object",
      "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/definitions/Node"}, "maxItems": 1}},
      "required": ["v"]}
  },
  "title": "Person", "type": "object",
  "properties": {
    "name": {"title": "Name", "type": "string", "maxLength": 6},
    "home": {"$ref": "#/$defs/Address"},
    "work": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}], "default": null},
    "color": {"$ref": "#/$defs/Color", "default": "red"},
    "born": {"title": "Born", "type": "string", "format": "date-time", "maxLength": 4},
    "tree": {"$ref": "#/definitions/Node"}
  },
  "required": ["name", "home", "color", "tree"]
}`

// TestRefsToDefinitionsAndFormatAnnotations: a pydantic-shaped schema
// ($defs, definitions, $ref, a recursive model, format) constrains
// response_format json_schema output and a tool's arguments so that they
// validate against it (the independent validator is the oracle; format is
// an annotation in 2020-12, as for the converter).
func TestRefsToDefinitionsAndFormatAnnotations(t *testing.T) {
	// The schema is in the tool prompt twice, a byte-level token each.
	e := newEngine(t, func(c *Config) { c.NSeqMax = 2; c.NCtx = 2 * 4096 })
	oracle := compileSchema(t, pydanticSchema)
	stopped := 0
	check := func(what, finish, text string) {
		t.Helper()
		if finish == "stop" || finish == "tool_calls" {
			stopped++
			validateJSON(t, oracle, text)
		} else if first, ok := jsonPrefix(text); !ok || first != json.Delim('{') {
			t.Errorf("%s: finish %q and %q is not the start of an object", what, finish, text)
		}
	}
	for seed := range 6 {
		code, body := chatRaw(t, e, map[string]any{
			"model": "molly-demo", "seed": seed, "max_tokens": 1500,
			"messages":        []map[string]any{{"role": "user", "content": "describe someone"}},
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "person", "schema": json.RawMessage(pydanticSchema)}},
		})
		if code != http.StatusOK {
			t.Fatalf("seed %d: %d %s", seed, code, body)
		}
		var r chatResponse
		_ = json.Unmarshal(body, &r)
		check(fmt.Sprintf("response_format seed %d", seed), r.Choices[0].FinishReason, r.Choices[0].Message.Content)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(pydanticSchema)); err != nil {
		t.Fatal(err)
	}
	tools := append([]map[string]any{{"type": "function", "function": map[string]any{"name": "save_person", "parameters": json.RawMessage(compact.Bytes())}}}, weatherTools...)
	for seed := range 6 {
		code, body := chatRaw(t, e, map[string]any{
			"model": "molly-demo", "seed": seed, "max_tokens": 1500, "tools": tools, "parallel_tool_calls": false,
			"tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "save_person"}},
			"messages":    []map[string]any{{"role": "user", "content": "save someone"}},
		})
		if code != http.StatusOK {
			t.Fatalf("tool seed %d: %d %s", seed, code, body)
		}
		var r toolResponse
		_ = json.Unmarshal(body, &r)
		ch := r.Choices[0]
		if len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Name != "save_person" {
			t.Fatalf("tool seed %d: %s", seed, body)
		}
		check(fmt.Sprintf("tool seed %d", seed), ch.FinishReason, ch.Message.ToolCalls[0].Function.Arguments)
	}
	t.Logf("%d of 12 ended", stopped)
	if stopped < 8 {
		t.Fatalf("only %d of 12 outputs ended before max_tokens: too few checked against the schema", stopped)
	}
}

// jsonPrefix reports whether text is JSON or a prefix of JSON (what a
// choice cut by max_tokens holds), by encoding/json's tokenizer: it ends with
// an unexpected EOF, never a syntax error; first is its first token.
func jsonPrefix(text string) (first json.Token, ok bool) {
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber() // syntax only: 4e37379 is valid JSON, if not a float64
	for i := 0; ; i++ {
		tok, err := d.Token()
		if err != nil {
			var se *json.SyntaxError
			return first, !errors.As(err, &se) && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF))
		}
		if i == 0 {
			first = tok
		}
	}
}

func TestJSONObjectOutputIsAnObject(t *testing.T) {
	e := bigEngine(t)
	for seed := range 20 {
		code, r := chat(t, e, map[string]any{
			"model": "molly-demo", "seed": seed, "max_tokens": 100,
			"messages":        []map[string]any{{"role": "user", "content": "json please"}},
			"response_format": map[string]any{"type": "json_object"},
		})
		if code != http.StatusOK {
			t.Fatalf("seed %d: %d %+v", seed, code, r.Error)
		}
		c := r.Choices[0].Message.Content
		if r.Choices[0].FinishReason == "stop" {
			var v map[string]any
			if err := json.Unmarshal([]byte(c), &v); err != nil {
				t.Errorf("seed %d: %v in %q", seed, err, c)
			}
			continue
		}
		// Unbounded strings rarely end on random weights: a cut output
		// must still be the start of an object.
		if first, ok := jsonPrefix(c); !ok || first != json.Delim('{') {
			t.Errorf("seed %d: %q is not the start of a JSON object", seed, c)
		}
	}
	if first, ok := jsonPrefix(`{"a": [1, tru`); !ok || first != json.Delim('{') {
		t.Fatal("jsonPrefix refuses a prefix")
	}
	if _, ok := jsonPrefix(`{"a" 1`); ok {
		t.Fatal("jsonPrefix accepts a syntax error")
	}
}

var weatherTools = []map[string]any{
	{"type": "function", "function": map[string]any{"name": "get_weather", "description": "weather for a city",
		"parameters": json.RawMessage(`{"type":"object","properties":{"city":{"type":"string","maxLength":8},"unit":{"enum":["c","f"]}},"required":["city"],"additionalProperties":false}`)}},
	{"type": "function", "function": map[string]any{"name": "get_time", "description": "time in a zone",
		"parameters": json.RawMessage(`{"type":"object","properties":{"zone":{"type":"integer"}},"required":["zone"]}`)}},
}

type toolResponse struct {
	Choices []struct {
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Content   *string    `json:"content"`
			ToolCalls []toolCall `json:"tool_calls"`
		} `json:"message"`
	} `json:"choices"`
}

func checkCalls(t *testing.T, calls []toolCall, want string) {
	t.Helper()
	oracles := map[string]*jsonschema.Schema{}
	for _, tl := range weatherTools {
		f := tl["function"].(map[string]any)
		oracles[f["name"].(string)] = compileSchema(t, string(f["parameters"].(json.RawMessage)))
	}
	ids := map[string]bool{}
	for _, c := range calls {
		if c.Type != "function" || !strings.HasPrefix(c.ID, "call_") || ids[c.ID] {
			t.Errorf("call %+v: want type function and a fresh call_ id", c)
		}
		ids[c.ID] = true
		o, ok := oracles[c.Function.Name]
		if !ok || (want != "" && c.Function.Name != want) {
			t.Errorf("call of %q, want %q", c.Function.Name, want)
			continue
		}
		validateJSON(t, o, c.Function.Arguments)
	}
}

func TestToolChoiceRequiredAndForcedForSeeds(t *testing.T) {
	spec := openapitest.Load(t)
	e := bigEngine(t)
	for _, tc := range []struct {
		choice   any
		want     string
		parallel bool
	}{{"required", "", true}, {"required", "", false}, {map[string]any{"type": "function", "function": map[string]any{"name": "get_time"}}, "get_time", true}} {
		for seed := range 6 {
			code, body := chatRaw(t, e, map[string]any{
				"model": "molly-demo", "seed": seed, "max_tokens": 1500, "tools": weatherTools, "tool_choice": tc.choice,
				"parallel_tool_calls": tc.parallel,
				"messages":            []map[string]any{{"role": "user", "content": "weather in Paris?"}},
			})
			if code != http.StatusOK {
				t.Fatalf("%v seed %d: %d %s", tc.choice, seed, code, body)
			}
			spec.Validate(t, "CreateChatCompletionResponse", body)
			var r toolResponse
			_ = json.Unmarshal(body, &r)
			ch := r.Choices[0]
			if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) == 0 || ch.Message.Content != nil {
				t.Fatalf("%v seed %d: %s", tc.choice, seed, body)
			}
			if !tc.parallel && len(ch.Message.ToolCalls) != 1 {
				t.Errorf("parallel_tool_calls false: %d calls", len(ch.Message.ToolCalls))
			}
			checkCalls(t, ch.Message.ToolCalls, tc.want)
		}
	}
}

func TestToolChoiceAutoAndNone(t *testing.T) {
	spec := openapitest.Load(t)
	e := bigEngine(t)
	calls, texts := 0, 0
	for seed := range 12 {
		code, body := chatRaw(t, e, map[string]any{
			"model": "molly-demo", "seed": seed, "max_tokens": 300, "tools": weatherTools,
			"messages": []map[string]any{{"role": "user", "content": "weather in Paris?"}},
		})
		if code != http.StatusOK {
			t.Fatalf("seed %d: %d %s", seed, code, body)
		}
		spec.Validate(t, "CreateChatCompletionResponse", body)
		var r toolResponse
		_ = json.Unmarshal(body, &r)
		switch ch := r.Choices[0]; ch.FinishReason {
		case "tool_calls":
			calls++
			checkCalls(t, ch.Message.ToolCalls, "")
		case "stop":
			texts++
			if ch.Message.Content == nil || len(ch.Message.ToolCalls) > 0 {
				t.Errorf("seed %d: a response needs content and no calls: %s", seed, body)
			}
		case "length":
			// Cut by max_tokens: a free-text response (an unbounded string)
			// is its text so far, a call its calls so far; never the
			// engine's JSON as content.
			if len(ch.Message.ToolCalls) > 0 {
				calls++
				if ch.Message.Content != nil {
					t.Errorf("seed %d: a cut call has content: %s", seed, body)
				}
				continue
			}
			texts++
			if ch.Message.Content == nil || strings.HasPrefix(strings.Join(strings.Fields(*ch.Message.Content), ""), `{"response":`) {
				t.Errorf("seed %d: cut answer: %s", seed, body)
			}
		default:
			t.Errorf("seed %d: finish %q: %s", seed, ch.FinishReason, body)
		}
	}
	t.Logf("auto: %d tool calls, %d responses", calls, texts)
	if calls == 0 || texts == 0 {
		t.Errorf("auto chose only one branch over 12 seeds: %d calls, %d responses", calls, texts)
	}
	// none: free text, no calls, whatever the tools.
	code, body := chatRaw(t, e, map[string]any{"model": "molly-demo", "seed": 1, "max_tokens": 8, "tools": weatherTools, "tool_choice": "none",
		"messages": []map[string]any{{"role": "user", "content": "hi"}}})
	var r toolResponse
	_ = json.Unmarshal(body, &r)
	if code != http.StatusOK || len(r.Choices[0].Message.ToolCalls) > 0 || r.Choices[0].FinishReason == "tool_calls" {
		t.Fatalf("none: %d %s", code, body)
	}
	// A forced function that is not declared.
	code, body = chatRaw(t, e, map[string]any{"model": "molly-demo", "tools": weatherTools,
		"tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "nope"}},
		"messages":    []map[string]any{{"role": "user", "content": "hi"}}})
	if code != http.StatusBadRequest || !strings.Contains(string(body), "nope") {
		t.Fatalf("unknown forced function: %d %s", code, body)
	}
}

func TestToolCallsStream(t *testing.T) {
	spec := openapitest.Load(t)
	e := bigEngine(t)
	w := call(t, e, context.Background(), http.MethodPost, "/v1/chat/completions", map[string]any{
		"model": "molly-demo", "seed": 3, "max_tokens": 1500, "tools": weatherTools, "tool_choice": "required", "stream": true,
		"stream_options": map[string]any{"include_usage": true},
		"messages":       []map[string]any{{"role": "user", "content": "weather in Paris and the time?"}},
	})
	if w.Code != http.StatusOK {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	sc := bufio.NewScanner(w.Body)
	sc.Buffer(nil, 1<<20)
	byIndex := map[int]*toolCall{}
	var finish string
	done, usage := false, false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			continue
		}
		spec.Validate(t, "CreateChatCompletionStreamResponse", []byte(line))
		var c struct {
			Choices []struct {
				Delta struct {
					ToolCalls []struct {
						Index    int    `json:"index"`
						ID       string `json:"id"`
						Type     string `json:"type"`
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *Usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatal(err)
		}
		if c.Usage != nil {
			usage = c.Usage.CompletionTokens > 0
		}
		for _, ch := range c.Choices {
			for _, d := range ch.Delta.ToolCalls {
				tc := byIndex[d.Index]
				if tc == nil {
					tc = &toolCall{}
					byIndex[d.Index] = tc
				}
				tc.ID += d.ID
				tc.Type += d.Type
				tc.Function.Name += d.Function.Name
				tc.Function.Arguments += d.Function.Arguments
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	if !done || !usage || finish != "tool_calls" || len(byIndex) == 0 {
		t.Fatalf("done %v usage %v finish %q calls %d", done, usage, finish, len(byIndex))
	}
	var calls []toolCall
	for i := range len(byIndex) {
		if byIndex[i] == nil {
			t.Fatalf("tool call indexes are not 0..%d", len(byIndex)-1)
		}
		calls = append(calls, *byIndex[i])
	}
	checkCalls(t, calls, "")
}

// TestPartialToolCallsDecode decodes hand-written prefixes of the generic
// tool-call JSON, as a choice cut by max_tokens holds them, against the
// values OpenAI answers for a cut call (tool_calls with the arguments
// written so far, no content).
func TestPartialToolCallsDecode(t *testing.T) {
	type call struct{ name, args string }
	for _, c := range []struct {
		text    string
		calls   []call
		content string // when no calls
	}{
		{``, nil, ""},
		{`{"tool_`, nil, ""},
		{`{"tool_calls":[`, nil, ""},
		{`{"tool_calls":[{"na`, nil, ""},
		{`{"tool_calls":[{"name":"get_wea`, nil, ""},
		{`{"tool_call":{"name":"get_wea`, nil, ""},
		{`{"tool_calls":[{"arguments":{"city":"Paris"},"name":"get_wea`, nil, ""},
		{`{"tool_calls":[{"name":"get_weather"`, []call{{"get_weather", ""}}, ""},
		{`{"tool_calls":[{"name":"get_weather","arguments":{"city":"Par`, []call{{"get_weather", `{"city":"Par`}}, ""},
		{`{"tool_calls": [{"name": "get_time", "arguments": {"zone": 12`, []call{{"get_time", `{"zone": 12`}}, ""},
		{`{"tool_calls":[{"name":"get_time","arguments":{"zone":1}},{"name":"get_weather","arguments":{"ci`,
			[]call{{"get_time", `{"zone":1}`}, {"get_weather", `{"ci`}}, ""},
		{`{"tool_calls":[{"name":"get_time","arguments":{"zone":1}}, {"na`, []call{{"get_time", `{"zone":1}`}}, ""},
		{`{"tool_calls":[{"name":"get_time","arguments":{"zone":1}}`, []call{{"get_time", `{"zone":1}`}}, ""},
		{`{"tool_call":{"name":"w","arguments":{"a":"x\"y`, []call{{"w", `{"a":"x\"y`}}, ""},
		{`{"response":"Hello, wor`, nil, "Hello, wor"},
		{`{"response":"line\nnext\u00e9 \u00`, nil, "line\nnext\u00e9 "},
		{`{"response":"tab\`, nil, "tab"},
		{"{\n  \"response\": {\"a\": [1, 2", nil, `{"a": [1, 2`},
	} {
		calls, content, finish := decodeTools(c.text, "length")
		if finish != "length" {
			t.Errorf("%q: finish %q", c.text, finish)
		}
		if len(calls) != len(c.calls) {
			t.Errorf("%q: %d calls %+v, want %d", c.text, len(calls), calls, len(c.calls))
			continue
		}
		for i, w := range c.calls {
			if calls[i].Function.Name != w.name || calls[i].Function.Arguments != w.args || calls[i].Type != "function" || !strings.HasPrefix(calls[i].ID, "call_") {
				t.Errorf("%q: call %d is %+v, want %+v", c.text, i, calls[i], w)
			}
		}
		switch {
		case len(c.calls) > 0 && content != nil:
			t.Errorf("%q: calls and content %q", c.text, *content)
		case len(c.calls) == 0 && (content == nil || *content != c.content):
			t.Errorf("%q: content %v, want %q", c.text, content, c.content)
		}
	}
}

// TestToolCallCutByMaxTokens: a forced call cut by max_tokens is answered
// as OpenAI answers it, tool_calls and finish_reason "length", not as
// content, whole and streamed (the OpenAPI document is the oracle for the
// shapes).
func TestToolCallCutByMaxTokens(t *testing.T) {
	spec := openapitest.Load(t)
	e := bigEngine(t)
	req := func(stream bool) map[string]any {
		return map[string]any{"model": "molly-demo", "seed": 2, "max_tokens": 60, "tools": weatherTools, "stream": stream,
			"tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}},
			"messages":    []map[string]any{{"role": "user", "content": "weather in Paris?"}}}
	}
	code, body := chatRaw(t, e, req(false))
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	spec.Validate(t, "CreateChatCompletionResponse", body)
	var r toolResponse
	_ = json.Unmarshal(body, &r)
	ch := r.Choices[0]
	if ch.FinishReason != "length" || ch.Message.Content != nil || len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Name != "get_weather" ||
		strings.Contains(string(body), `\"tool_calls\"`) {
		t.Fatalf("a cut call: %s", body)
	}
	if a := ch.Message.ToolCalls[0].Function.Arguments; a != "" && !strings.HasPrefix(a, "{") {
		t.Fatalf("arguments %q are not the start of an object", a)
	}
	w := call(t, e, context.Background(), http.MethodPost, "/v1/chat/completions", req(true))
	var finish, name, content string
	for _, line := range strings.Split(w.Body.String(), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		spec.Validate(t, "CreateChatCompletionStreamResponse", []byte(data))
		var c struct {
			Choices []struct {
				Delta struct {
					Content   string     `json:"content"`
					ToolCalls []toolCall `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		_ = json.Unmarshal([]byte(data), &c)
		for _, ch := range c.Choices {
			content += ch.Delta.Content
			for _, tc := range ch.Delta.ToolCalls {
				name += tc.Function.Name
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	if finish != "length" || name != "get_weather" || content != "" {
		t.Fatalf("streamed: finish %q name %q content %q\n%s", finish, name, content, w.Body)
	}
}

// TestToolCallCutInItsNameIsDropped: with tool_choice "required" and two
// tools, a choice cut by max_tokens while a call's name is being written
// answers finish_reason "length" with only the calls whose names are whole
// (no call with an empty name), whole and streamed. The oracle is the raw
// text the engine generates for the same seed (Generate, one event per
// token): at each cut, the calls whose "name" string is whole in it.
func TestToolCallCutInItsNameIsDropped(t *testing.T) {
	spec := openapitest.Load(t)
	e := bigEngine(t)
	body := func(maxTokens int, stream bool) map[string]any {
		return map[string]any{"model": "molly-demo", "seed": 4, "max_tokens": maxTokens, "tools": weatherTools, "tool_choice": "required",
			"stream": stream, "messages": []map[string]any{{"role": "user", "content": "weather in Paris and the time?"}}}
	}
	_, req, err := e.parse(mustJSON(t, body(1500, false)), true)
	if err != nil {
		t.Fatal(err)
	}
	var pieces []string
	usage, err := e.Generate(context.Background(), req, func(ev Event) error {
		if ev.Text != "" {
			pieces = append(pieces, ev.Text)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pieces) != usage.CompletionTokens {
		t.Fatalf("%d text events for %d tokens: the oracle needs one per token", len(pieces), usage.CompletionTokens)
	}
	callStart := regexp.MustCompile(`[\[,]\s*\{`)
	wholeName := regexp.MustCompile(`"name"\s*:\s*"[^"]*"`)
	// Four cuts in each call's name: the first call's, and a later one's
	// when the model writes more than one.
	cuts, perCall := 0, map[int]int{}
	for k := 1; k < len(pieces); k++ {
		prefix := strings.Join(pieces[:k], "")
		if !strings.Contains(prefix, `"tool_calls"`) {
			continue
		}
		opened, named := len(callStart.FindAllString(prefix, -1)), len(wholeName.FindAllString(prefix, -1))
		if opened == named || perCall[opened] == 4 {
			continue
		}
		cuts++
		perCall[opened]++
		code, raw := chatRaw(t, e, body(k, false))
		if code != http.StatusOK {
			t.Fatalf("max_tokens %d: %d %s", k, code, raw)
		}
		spec.Validate(t, "CreateChatCompletionResponse", raw)
		var r toolResponse
		_ = json.Unmarshal(raw, &r)
		ch := r.Choices[0]
		if ch.FinishReason != "length" || len(ch.Message.ToolCalls) != named {
			t.Errorf("max_tokens %d (cut %q): finish %q, %d calls, want length and the %d named", k, prefix, ch.FinishReason, len(ch.Message.ToolCalls), named)
		}
		for _, c := range ch.Message.ToolCalls {
			if c.Function.Name == "" {
				t.Errorf("max_tokens %d: a call without a name: %s", k, raw)
			}
		}
		w := call(t, e, context.Background(), http.MethodPost, "/v1/chat/completions", body(k, true))
		var finish string
		streamed := 0
		for _, line := range strings.Split(w.Body.String(), "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			spec.Validate(t, "CreateChatCompletionStreamResponse", []byte(data))
			var c struct {
				Choices []struct {
					Delta struct {
						ToolCalls []toolCall `json:"tool_calls"`
					} `json:"delta"`
					FinishReason *string `json:"finish_reason"`
				} `json:"choices"`
			}
			_ = json.Unmarshal([]byte(data), &c)
			for _, ch := range c.Choices {
				for _, tc := range ch.Delta.ToolCalls {
					streamed++
					if tc.Function.Name == "" {
						t.Errorf("max_tokens %d streamed: a call without a name: %s", k, data)
					}
				}
				if ch.FinishReason != nil {
					finish = *ch.FinishReason
				}
			}
		}
		if finish != "length" || streamed != named {
			t.Errorf("max_tokens %d streamed: finish %q, %d calls, want length and %d", k, finish, streamed, named)
		}
	}
	if cuts == 0 {
		t.Fatalf("no cut falls in a call's name: %q", strings.Join(pieces, ""))
	}
	t.Logf("%d cuts in the names of %d calls of %q", cuts, len(perCall), strings.Join(pieces, ""))
}

// TestJSONOutputEndsWithItsValue: a choice constrained to a JSON object
// ends with finish "stop" at the object's closing brace, not after the
// whitespace the grammar allows behind it (the oracle: encoding/json reads
// the content as one object and nothing follows it).
func TestJSONOutputEndsWithItsValue(t *testing.T) {
	e := bigEngine(t)
	schema := `{"type":"object","properties":{"ok":{"type":"boolean"},"n":{"enum":[1,2]}},"required":["ok","n"],"additionalProperties":false}`
	for seed := range 12 {
		code, r := chat(t, e, map[string]any{
			"model": "molly-demo", "seed": seed, "max_tokens": 200,
			"messages":        []map[string]any{{"role": "user", "content": "json please"}},
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "schema": json.RawMessage(schema)}},
		})
		if code != http.StatusOK {
			t.Fatalf("seed %d: %d %+v", seed, code, r.Error)
		}
		c := r.Choices[0].Message.Content
		var v struct {
			OK *bool `json:"ok"`
			N  int   `json:"n"`
		}
		if r.Choices[0].FinishReason != "stop" || json.Unmarshal([]byte(c), &v) != nil || v.OK == nil || (v.N != 1 && v.N != 2) ||
			!strings.HasSuffix(c, "}") || strings.TrimSpace(c) != c {
			t.Errorf("seed %d: finish %q after %d tokens: %q", seed, r.Choices[0].FinishReason, r.Usage.CompletionTokens, c)
		}
	}
}

func TestJSONEndOffsets(t *testing.T) {
	for _, c := range []struct {
		pieces []string
		piece  int // the piece the value ends in, -1 never
		end    int
	}{
		{[]string{`{"a":`, `"}"`, `}  `}, 2, 1},
		{[]string{"\n ", `{"a":[1,{}]`, `,"b":"x\"}"`, "}\n\n"}, 3, 1},
		{[]string{`"str\`, `"`, `" `}, 2, 1},
		{[]string{`"str\\`, `"`, `" `}, 1, 1},
		{[]string{`[]`}, 0, 2},
		{[]string{`12`, ` `}, -1, 0},
		{[]string{`{"a":"`, `\`, `"`, `"}`}, 3, 2},
	} {
		var j jsonEnd
		got, end := -1, 0
		for i, p := range c.pieces {
			if e, ok := j.feed([]byte(p)); ok {
				got, end = i, e
				break
			}
		}
		if got != c.piece || end != c.end {
			t.Errorf("%q: ends in piece %d at %d, want %d at %d", c.pieces, got, end, c.piece, c.end)
		}
	}
}

// TestSchemaRepetitionBoundsAtLlamaCppsLimit: llama.cpp's grammar parser
// takes a repetition bound of MaxSchemaRepetition and refuses one more (the
// oracle: llama.cpp itself on a one-rule grammar). Each bounding keyword
// at the limit makes a grammar llama.cpp initialises and a request that is
// served; one over it (and the values clients sent, 5000 and 1e30) is a 400
// naming the keyword and the limit, for response_format and for a tool's
// parameters.
func TestSchemaRepetitionBoundsAtLlamaCppsLimit(t *testing.T) {
	e := newEngine(t, nil)
	for _, g := range []struct {
		gbnf string
		ok   bool
	}{
		{fmt.Sprintf(`root ::= "a"{%d}`, MaxSchemaRepetition), true},
		{fmt.Sprintf(`root ::= "a"{0,%d}`, MaxSchemaRepetition), true},
		{fmt.Sprintf(`root ::= "a"{%d}`, MaxSchemaRepetition+1), false},
		{fmt.Sprintf(`root ::= "a"{0,%d}`, MaxSchemaRepetition+1), false},
	} {
		gr, err := llama.NewGrammar(e.model, g.gbnf)
		if (err == nil) != g.ok {
			t.Fatalf("llama.cpp on %s: %v, want ok=%v", g.gbnf, err, g.ok)
		}
		if gr != nil {
			gr.Close()
		}
	}
	schemas := map[string]string{
		"minLength": `{"type":"string","minLength":%s}`,
		"maxLength": `{"type":"string","maxLength":%s}`,
		"minItems":  `{"type":"array","items":{"type":"integer"},"minItems":%s}`,
		"maxItems":  `{"type":"array","items":{"type":"integer"},"maxItems":%s}`,
	}
	limit := fmt.Sprint(MaxSchemaRepetition)
	for kw, tmpl := range schemas {
		at := fmt.Sprintf(tmpl, limit)
		g, err := SchemaToGBNF([]byte(at))
		if err != nil {
			t.Fatalf("%s at the limit: %v", kw, err)
		}
		gr, err := llama.NewGrammar(e.model, g)
		if err != nil {
			t.Fatalf("%s at the limit: llama.cpp refused the grammar", kw)
		}
		gr.Close()
		body := map[string]any{"model": "molly-demo", "max_tokens": 3, "messages": []map[string]any{{"role": "user", "content": "hi"}},
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "r", "schema": json.RawMessage(at)}}}
		if code, r := chat(t, e, body); code != http.StatusOK {
			t.Fatalf("%s at the limit: %d %+v", kw, code, r.Error)
		}
		for _, v := range []string{fmt.Sprint(MaxSchemaRepetition + 1), "5000", "1e30"} {
			over := fmt.Sprintf(tmpl, v)
			var le *SchemaLimitError
			if _, err := SchemaToGBNF([]byte(over)); !errors.As(err, &le) || le.Keyword != kw || le.Limit != MaxSchemaRepetition || le.Value != v || le.Pointer != "/"+kw {
				t.Fatalf("%s: %v, want a SchemaLimitError", over, err)
			}
			for param, body := range map[string]map[string]any{
				"response_format.json_schema.schema": {"model": "molly-demo", "messages": []map[string]any{{"role": "user", "content": "hi"}},
					"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "r", "schema": json.RawMessage(over)}}},
				"tools[1].function.parameters": {"model": "molly-demo", "messages": []map[string]any{{"role": "user", "content": "hi"}},
					"tools": []map[string]any{
						{"type": "function", "function": map[string]any{"name": "ok"}},
						{"type": "function", "function": map[string]any{"name": "f", "parameters": json.RawMessage(`{"type":"object","properties":{"a":` + over + `}}`)}}}},
			} {
				code, r := chat(t, e, body)
				if code != http.StatusBadRequest || r.Error == nil || r.Error.Type != "invalid_request_error" || r.Error.Param == nil || *r.Error.Param != param ||
					!strings.Contains(r.Error.Message, fmt.Sprintf("%q", kw)) || !strings.Contains(r.Error.Message, "at most "+limit) {
					t.Errorf("%s in %s: %d %+v, want 400 naming %s and %s", over, param, code, r.Error, kw, limit)
				}
			}
		}
	}
}

// TestAGrammarLlamaCppRefusesIs400: whatever grammar llama.cpp cannot
// initialise is the request's fault, a 400 invalid_request_error naming
// the parameter the grammar was made from, never a server error.
func TestAGrammarLlamaCppRefusesIs400(t *testing.T) {
	e := newEngine(t, nil)
	for _, param := range []string{"response_format", "tools"} {
		for _, g := range []string{fmt.Sprintf(`root ::= "a"{%d}`, MaxSchemaRepetition+1), `root ::= "a" undefined-rule`, `root ::= [`} {
			err := e.checkGrammar(&plan{grammar: g, param: param})
			ae := classify(err)
			if err == nil || ae.status != http.StatusBadRequest || ae.typ != "invalid_request_error" || ae.param != param || !strings.Contains(ae.msg, param) {
				t.Errorf("%s from %s: %v (%+v), want a 400 naming %s", g, param, err, ae, param)
			}
		}
	}
	if err := e.checkGrammar(&plan{grammar: JSONObjectGBNF(), param: "response_format"}); err != nil {
		t.Fatalf("json_object's grammar: %v", err)
	}
}
