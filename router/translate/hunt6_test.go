package translate

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strconv"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
)

// TestMessagesUsageCountsCachedTokensApart: Anthropic's usage counts a
// prompt's cached tokens apart from input_tokens ("total input tokens =
// input_tokens + cache_read_input_tokens + cache_creation_input_tokens",
// Anthropic's prompt caching guide). A chat answer whose usage says 20 of
// its 30 prompt tokens were cached (prompt_tokens_details.cached_tokens) is
// a Message with input_tokens 10, cache_read_input_tokens 20 and
// cache_creation_input_tokens 0, whole and in a stream's message_delta (the
// usage Anthropic's SDKs keep as the final message's).
func TestMessagesUsageCountsCachedTokensApart(t *testing.T) {
	want := map[string]any{"input_tokens": 10.0, "cache_read_input_tokens": 20.0, "cache_creation_input_tokens": 0.0, "output_tokens": 5.0}
	usage := `{"prompt_tokens":30,"completion_tokens":5,"total_tokens":35,"prompt_tokens_details":{"cached_tokens":20}}`
	decode := func(t *testing.T, raw string) map[string]any {
		t.Helper()
		var m map[string]any
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatalf("usage %q: %v", raw, err)
		}
		return m
	}
	t.Run("whole", func(t *testing.T) {
		_, tr, aerr := FromMessages([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"Hello"}]}`))
		if aerr != nil {
			t.Fatal(aerr)
		}
		rec := serve(t, APIMessages, tr, writeJSON(200, `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":`+usage+`}`))
		if got := decode(t, gjson.GetBytes(rec.Body.Bytes(), "usage").Raw); !reflect.DeepEqual(got, want) {
			t.Fatalf("usage %v, want %v", got, want)
		}
	})
	t.Run("streamed", func(t *testing.T) {
		_, tr, aerr := FromMessages([]byte(`{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"Hello"}]}`))
		if aerr != nil {
			t.Fatal(aerr)
		}
		tr.PromptEstimate = 8
		evs := events(t, serve(t, APIMessages, tr, writeSSE(
			`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}`,
			`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
			`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":`+usage+`}`, `[DONE]`)).Body.Bytes())
		if len(evs) < 2 || evs[len(evs)-2].Type != "message_delta" {
			t.Fatalf("events %v", evs)
		}
		if got := decode(t, gjson.GetBytes(evs[len(evs)-2].Data, "usage").Raw); !reflect.DeepEqual(got, want) {
			t.Fatalf("message_delta usage %v, want %v", got, want)
		}
	})
}

// TestMessagesAnswersCarryAnthropicsRequestID: every Anthropic API
// response has a request-id header, and an error body has the same id as
// request_id beside its error (Anthropic's errors reference); Anthropic's
// SDKs read a message's _request_id and an error's requestID from the
// header. A Messages answer — whole, streamed, an error — carries the
// request's id (X-Request-Id, which Molly sets first) under that name too.
func TestMessagesAnswersCarryAnthropicsRequestID(t *testing.T) {
	run := func(t *testing.T, stream bool, write func(w http.ResponseWriter)) *httptest.ResponseRecorder {
		t.Helper()
		body := `{"model":"m","max_tokens":5,"stream":` + strconv.FormatBool(stream) + `,"messages":[{"role":"user","content":"Hello"}]}`
		_, tr, aerr := FromMessages([]byte(body))
		if aerr != nil {
			t.Fatal(aerr)
		}
		rec := httptest.NewRecorder()
		rec.Header().Set("X-Request-Id", "req_0123abc")
		w := NewWriter(rec, context.Background(), APIMessages)
		w.Bind(tr)
		write(w)
		w.Finish()
		if got := rec.Result().Header.Get("request-id"); got != "req_0123abc" {
			t.Fatalf("request-id header %q, want req_0123abc (status %d)", got, rec.Code)
		}
		return rec
	}
	t.Run("whole", func(t *testing.T) {
		run(t, false, writeJSON(200, `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`))
	})
	t.Run("streamed", func(t *testing.T) {
		run(t, true, writeSSE(chatStream...))
	})
	t.Run("error", func(t *testing.T) {
		rec := run(t, false, writeJSON(429, `{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}`))
		var got map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		want := map[string]any{"type": "error", "error": map[string]any{"type": "rate_limit_error", "message": "slow down"}, "request_id": "req_0123abc"}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("error body %v, want %v", got, want)
		}
	})
}

// TestAnthropicModelsShapes: an Anthropic client's GET /v1/models gets
// Anthropic's list ({"data": [ModelInfo…], "has_more", "first_id",
// "last_id"}, a ModelInfo being {"type": "model", "id", "display_name",
// "created_at"} with an RFC 3339 time; Anthropic's Models API reference),
// paged by limit, after_id and before_id; GET /v1/models/{id} one
// ModelInfo; a 404 Anthropic's not_found_error body; a limit out of 1 to
// 1000 a 400 invalid_request_error.
func TestAnthropicModelsShapes(t *testing.T) {
	list := `{"object":"list","data":[{"id":"a","object":"model","created":0,"owned_by":"molly"},{"id":"b","object":"model","created":0,"owned_by":"molly"},{"id":"c","object":"model","created":1700000000,"owned_by":"molly"}]}`
	info := func(id, at string) map[string]any {
		return map[string]any{"type": "model", "id": id, "display_name": id, "created_at": at}
	}
	epoch := "1970-01-01T00:00:00Z"
	get := func(t *testing.T, query string, status int, body string) (int, map[string]any) {
		t.Helper()
		q, err := url.ParseQuery(query)
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		rec.Header().Set("X-Request-Id", "req_m")
		w := NewModelsWriter(rec, q)
		writeJSON(status, body)(w)
		w.Finish()
		var got map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("%s: %v", rec.Body, err)
		}
		if rec.Header().Get("Request-Id") != "req_m" || rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("headers %v", rec.Header())
		}
		return rec.Code, got
	}
	for _, c := range []struct {
		query string
		want  map[string]any
	}{
		{"", map[string]any{"data": []any{info("a", epoch), info("b", epoch), info("c", "2023-11-14T22:13:20Z")}, "has_more": false, "first_id": "a", "last_id": "c"}},
		{"limit=2", map[string]any{"data": []any{info("a", epoch), info("b", epoch)}, "has_more": true, "first_id": "a", "last_id": "b"}},
		{"limit=2&after_id=b", map[string]any{"data": []any{info("c", "2023-11-14T22:13:20Z")}, "has_more": false, "first_id": "c", "last_id": "c"}},
		{"limit=1&before_id=c", map[string]any{"data": []any{info("b", epoch)}, "has_more": true, "first_id": "b", "last_id": "b"}},
		{"after_id=c", map[string]any{"data": []any{}, "has_more": false, "first_id": nil, "last_id": nil}},
	} {
		code, got := get(t, c.query, 200, list)
		want := map[string]any{}
		_ = json.Unmarshal(marshal(c.want), &want)
		if code != 200 || !reflect.DeepEqual(got, want) {
			t.Errorf("%q: %d %v\nwant %v", c.query, code, got, want)
		}
	}
	if code, got := get(t, "", 200, `{"id":"b","object":"model","created":0,"owned_by":"molly"}`); code != 200 || !reflect.DeepEqual(got, info("b", epoch)) {
		t.Errorf("one model: %d %v", code, got)
	}
	code, got := get(t, "", 404, `{"error":{"message":"The model `+"`x`"+` does not exist or you do not have access to it.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`)
	if want := map[string]any{"type": "error", "error": map[string]any{"type": "not_found_error", "message": "The model `x` does not exist or you do not have access to it."}, "request_id": "req_m"}; code != 404 || !reflect.DeepEqual(got, want) {
		t.Errorf("404: %d %v", code, got)
	}
	for _, q := range []string{"limit=0", "limit=1001", "limit=x"} {
		if code, got := get(t, q, 200, list); code != 400 || got["type"] != "error" || got["error"].(map[string]any)["type"] != "invalid_request_error" {
			t.Errorf("%s: %d %v", q, code, got)
		}
	}
}

// TestResponsesTextVerbosity: the Responses API's text.verbosity (low,
// medium or high: Verbosity in OpenAI's API description) is chat's
// verbosity, and the Response echoes it (medium, the description's
// default, when the request set none), with top_logprobs (0 unless set),
// safety_identifier and prompt_cache_key as the request gave them; another
// verbosity is a 400 naming text.verbosity.
func TestResponsesTextVerbosity(t *testing.T) {
	spec := openapitest.Load(t)
	ctx := context.Background()
	chat, tr, aerr := FromResponses(ctx, []byte(`{"model":"m","input":"hi","text":{"verbosity":"low"},"top_logprobs":2,"safety_identifier":"s1","prompt_cache_key":"k1"}`), nil, "ana")
	if aerr != nil {
		t.Fatal(aerr)
	}
	if v := gjson.GetBytes(chat, "verbosity"); v.Str != "low" {
		t.Fatalf("chat verbosity %s in %s", v.Raw, chat)
	}
	body := serve(t, APIResponses, tr, writeJSON(200, chatAnswer)).Body.Bytes()
	spec.Validate(t, "Response", body)
	for path, want := range map[string]string{"text.verbosity": `"low"`, "text.format": `{"type":"text"}`, "top_logprobs": "2",
		"safety_identifier": `"s1"`, "prompt_cache_key": `"k1"`} {
		if got := gjson.GetBytes(body, path).Raw; got != want {
			t.Errorf("%s %s, want %s", path, got, want)
		}
	}
	_, tr, _ = FromResponses(ctx, []byte(`{"model":"m","input":"hi"}`), nil, "ana")
	body = serve(t, APIResponses, tr, writeJSON(200, chatAnswer)).Body.Bytes()
	if v, n := gjson.GetBytes(body, "text.verbosity").Raw, gjson.GetBytes(body, "top_logprobs").Raw; v != `"medium"` || n != "0" {
		t.Errorf("defaults: text.verbosity %s, top_logprobs %s", v, n)
	}
	for _, bad := range []string{`"loud"`, `3`} {
		_, _, aerr := FromResponses(ctx, []byte(`{"model":"m","input":"hi","text":{"verbosity":`+bad+`}}`), nil, "ana")
		if aerr == nil || aerr.Status != 400 || aerr.Param != "text.verbosity" {
			t.Errorf("verbosity %s: %v", bad, aerr)
		}
	}
}

// TestResponsesAllowedToolsChoice: a Responses tool_choice of type
// allowed_tools (ToolChoiceAllowed: mode and tools of {"type": "function",
// "name"}) is chat's allowed_tools tool_choice (ChatCompletionAllowedTools:
// mode and tools of {"type": "function", "function": {"name"}}), and the
// Response echoes it as sent; a bad mode or a hosted tool in it is a 400
// naming the member.
func TestResponsesAllowedToolsChoice(t *testing.T) {
	spec := openapitest.Load(t)
	ctx := context.Background()
	choice := `{"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"get_weather"},{"type":"function","name":"get_time"}]}`
	req := `{"model":"m","input":"hi","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{}},"strict":false},{"type":"function","name":"get_time","parameters":{"type":"object","properties":{}},"strict":false}],"tool_choice":` + choice + `}`
	spec.Validate(t, "CreateResponse", []byte(req))
	chat, tr, aerr := FromResponses(ctx, []byte(req), nil, "ana")
	if aerr != nil {
		t.Fatal(aerr)
	}
	want := `{"allowed_tools":{"mode":"required","tools":[{"function":{"name":"get_weather"},"type":"function"},{"function":{"name":"get_time"},"type":"function"}]},"type":"allowed_tools"}`
	if got := gjson.GetBytes(chat, "tool_choice").Raw; got != want {
		t.Fatalf("chat tool_choice %s, want %s", got, want)
	}
	spec.Validate(t, "CreateChatCompletionRequest", chat)
	body := serve(t, APIResponses, tr, writeJSON(200, chatAnswer)).Body.Bytes()
	spec.Validate(t, "Response", body)
	if got := gjson.GetBytes(body, "tool_choice").Raw; got != choice {
		t.Fatalf("echoed tool_choice %s, want %s", got, choice)
	}
	for bad, param := range map[string]string{
		`{"type":"allowed_tools","mode":"any","tools":[]}`:                                   "tool_choice.mode",
		`{"type":"allowed_tools","mode":"auto","tools":[{"type":"mcp","server_label":"x"}]}`: "tool_choice.tools[0].type",
		`{"type":"allowed_tools","mode":"auto","tools":[{"type":"function"}]}`:               "tool_choice.tools[0].name",
		`{"type":"allowed_tools","mode":"auto"}`:                                             "tool_choice.tools",
	} {
		_, _, aerr := FromResponses(ctx, []byte(`{"model":"m","input":"hi","tool_choice":`+bad+`}`), nil, "ana")
		if aerr == nil || aerr.Status != 400 || aerr.Param != param {
			t.Errorf("%s: %v, want a 400 naming %s", bad, aerr, param)
		}
	}
}

// TestMessagesStructuredOutput: Anthropic's structured outputs
// (output_config.format, and output_format as the beta named it: {"type":
// "json_schema", "schema"}) reach the chat request as a strict json_schema
// response_format with that schema — they were dropped, and the answer
// was free text; a format of another type, or without an object schema, is
// a 400 naming it.
func TestMessagesStructuredOutput(t *testing.T) {
	spec := openapitest.Load(t)
	schema := `{"type":"object","properties":{"name":{"type":"string"}},"required":["name"],"additionalProperties":false}`
	want := `{"json_schema":{"name":"output","schema":` + schema + `,"strict":true},"type":"json_schema"}`
	for _, field := range []string{`"output_config":{"format":{"type":"json_schema","schema":` + schema + `}}`, `"output_format":{"type":"json_schema","schema":` + schema + `}`} {
		chat, _, aerr := FromMessages([]byte(`{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"a person"}],` + field + `}`))
		if aerr != nil {
			t.Fatalf("%s: %v", field, aerr)
		}
		if got := gjson.GetBytes(chat, "response_format").Raw; got != want {
			t.Fatalf("%s: response_format %s, want %s", field, got, want)
		}
		spec.Validate(t, "CreateChatCompletionRequest", chat)
	}
	for field, param := range map[string]string{
		`"output_config":{"format":{"type":"text"}}`:        "output_config.format.type",
		`"output_config":{"format":{"type":"json_schema"}}`: "output_config.format.schema",
		`"output_format":{"type":"json_schema","schema":1}`: "output_format.schema",
		`"output_config":"json"`:                            "output_config",
	} {
		_, _, aerr := FromMessages([]byte(`{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"x"}],` + field + `}`))
		if aerr == nil || aerr.Status != 400 || aerr.Param != param {
			t.Errorf("%s: %v, want a 400 naming %s", field, aerr, param)
		}
	}
}

// TestResponsesParallelCallsStreamOneAtATime: OpenAI's Responses streams
// send one output item at a time — its output_item.added, deltas,
// function_call_arguments.done and output_item.done before the next
// item's added. Parallel tool calls of a chat stream, sent one after the
// other or with their fragments interleaved (index 0, 1, 0, 1), keep to
// that: output_index 0 is done before 1 is added, each call's deltas add
// up to its arguments, and every event is spec-valid.
func TestResponsesParallelCallsStreamOneAtATime(t *testing.T) {
	spec := openapitest.Load(t)
	chunk := func(delta string) string {
		return `{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":null}]}`
	}
	call := func(i int, id, name, args string) string {
		head := ""
		if id != "" {
			head = `"id":"` + id + `","type":"function",`
		}
		fn := `"arguments":` + strconv.Quote(args)
		if name != "" {
			fn = `"name":"` + name + `",` + fn
		}
		return chunk(`{"tool_calls":[{"index":` + strconv.Itoa(i) + `,` + head + `"function":{` + fn + `}}]}`)
	}
	tail := []string{`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":8,"total_tokens":17}}`, `[DONE]`}
	for name, chunks := range map[string][]string{
		"one after the other": {chunk(`{"role":"assistant","content":null}`), call(0, "call_a", "weather", ""), call(0, "", "", `{"city":`), call(0, "", "", `"Rome"}`),
			call(1, "call_b", "weather", ""), call(1, "", "", `{"city":"Paris"}`)},
		"interleaved": {chunk(`{"role":"assistant","content":null}`), call(0, "call_a", "weather", `{"city":`), call(1, "call_b", "weather", `{"city":`),
			call(0, "", "", `"Rome"}`), call(1, "", "", `"Paris"}`)},
	} {
		t.Run(name, func(t *testing.T) {
			_, tr, aerr := FromResponses(context.Background(), []byte(`{"model":"m","input":"weather?","stream":true}`), nil, "ana")
			if aerr != nil {
				t.Fatal(aerr)
			}
			evs := events(t, serve(t, APIResponses, tr, writeSSE(append(chunks, tail...)...)).Body.Bytes())
			open := -1 // the output_index whose item is open
			args := map[int64]string{}
			var seq []string
			for _, ev := range evs {
				spec.Validate(t, "ResponseStreamEvent", ev.Data)
				d := gjson.ParseBytes(ev.Data)
				i := d.Get("output_index").Int()
				switch ev.Type {
				case "response.output_item.added":
					if open >= 0 {
						t.Fatalf("item %d added while item %d is open: %s", i, open, ev.Data)
					}
					open = int(i)
				case "response.function_call_arguments.delta", "response.function_call_arguments.done":
					if int(i) != open {
						t.Fatalf("%s of item %d while item %d is open", ev.Type, i, open)
					}
					if ev.Type == "response.function_call_arguments.delta" {
						args[i] += d.Get("delta").Str
					}
				case "response.output_item.done":
					if int(i) != open {
						t.Fatalf("item %d done while item %d is open", i, open)
					}
					open = -1
					seq = append(seq, d.Get("item.call_id").Str+" "+d.Get("item.arguments").Str)
				}
			}
			if want := []string{`call_a {"city":"Rome"}`, `call_b {"city":"Paris"}`}; !reflect.DeepEqual(seq, want) || args[0] != `{"city":"Rome"}` || args[1] != `{"city":"Paris"}` {
				t.Fatalf("items %q, deltas %v; want %q", seq, args, want)
			}
			if last := evs[len(evs)-1]; last.Type != "response.completed" || gjson.GetBytes(last.Data, "response.output.1.call_id").Str != "call_b" {
				t.Fatalf("last event %s %s", last.Type, last.Data)
			}
		})
	}
}
