package translate

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/relay"
)

// memStore is a Store in memory.
type memStore struct {
	mu sync.Mutex
	m  map[string]StoredResponse
}

func (s *memStore) PutResponse(_ context.Context, r StoredResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]StoredResponse{}
	}
	s.m[r.ID] = r
	return nil
}

func (s *memStore) DeleteResponse(_ context.Context, id, member string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.m[id]; !ok || r.Member != member {
		return ErrNotFound
	}
	delete(s.m, id)
	return nil
}

func (s *memStore) Response(_ context.Context, id, member string) (StoredResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.m[id]
	if !ok || r.Member != member {
		return StoredResponse{}, ErrNotFound
	}
	return r, nil
}

// sameJSON compares two JSON texts as values.
func sameJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("got is not JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want is not JSON: %v", err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

func TestFromResponses(t *testing.T) {
	ctx := context.Background()
	store := &memStore{}
	store.PutResponse(ctx, StoredResponse{ID: "resp_old", Member: "ana", Messages: []byte(`[{"role":"user","content":"my name is Ana"},{"role":"assistant","content":"Hello Ana"}]`)})
	tests := []struct {
		name, body, want string
	}{
		{"a string input with instructions and parameters",
			`{"model":"m","instructions":"Be brief.","input":"Hi <there> & you","max_output_tokens":50,"temperature":0.5,"top_p":0.9,"user":"u1"}`,
			`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi <there> & you"}],"max_completion_tokens":50,"temperature":0.5,"top_p":0.9,"user":"u1"}`},
		{"items: messages with parts, a function call round, function tools, a schema, a stream",
			`{"model":"m","stream":true,"input":[{"role":"user","content":[{"type":"input_text","text":"weather?"},{"type":"input_image","image_url":"https://x/y.png","detail":"low"}]},
			{"type":"function_call","call_id":"call_1","name":"weather","arguments":"{\"city\":\"Rome\"}"},{"type":"function_call","call_id":"call_2","name":"weather","arguments":"{}"},
			{"type":"function_call_output","call_id":"call_1","output":"sunny"},{"type":"reasoning","summary":[]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"It is sunny."}]}],
			"tools":[{"type":"function","name":"weather","description":"d","parameters":{"type":"object"},"strict":true}],"tool_choice":{"type":"function","name":"weather"},"parallel_tool_calls":false,
			"text":{"format":{"type":"json_schema","name":"w","schema":{"type":"object"},"strict":true}}}`,
			`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[
			{"role":"user","content":[{"type":"text","text":"weather?"},{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}}]},
			{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Rome\"}"}},{"id":"call_2","type":"function","function":{"name":"weather","arguments":"{}"}}]},
			{"role":"tool","tool_call_id":"call_1","content":"sunny"},{"role":"assistant","content":"It is sunny."}],
			"tools":[{"type":"function","function":{"name":"weather","description":"d","parameters":{"type":"object"},"strict":true}}],"tool_choice":{"type":"function","function":{"name":"weather"}},"parallel_tool_calls":false,
			"response_format":{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object"},"strict":true}}}`},
		{"previous_response_id puts the stored conversation before the input, after the new instructions",
			`{"model":"m","previous_response_id":"resp_old","instructions":"Be kind.","input":"what is my name?"}`,
			`{"model":"m","messages":[{"role":"system","content":"Be kind."},{"role":"user","content":"my name is Ana"},{"role":"assistant","content":"Hello Ana"},{"role":"user","content":"what is my name?"}]}`},
		{"reasoning.effort becomes reasoning_effort; a summary asks for nothing",
			`{"model":"m","input":"think","reasoning":{"effort":"low","summary":"auto"}}`,
			`{"model":"m","messages":[{"role":"user","content":"think"}],"reasoning_effort":"low"}`},
		{"a null reasoning is none",
			`{"model":"m","input":"x","reasoning":{"effort":null}}`,
			`{"model":"m","messages":[{"role":"user","content":"x"}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chat, tr, aerr := FromResponses(ctx, []byte(tt.body), store, "ana")
			if aerr != nil {
				t.Fatal(aerr)
			}
			sameJSON(t, chat, tt.want)
			if tr.Model != "m" || !strings.HasPrefix(tr.ResponseID(), "resp_") || tr.StoredConversation != strings.Contains(tt.body, "previous_response_id") {
				t.Fatalf("translation %+v", tr)
			}
			if !bytes.Contains(chat, []byte("<there> & you")) && strings.Contains(tt.body, "<there>") {
				t.Fatal("the text was escaped: the classified bytes differ from the client's")
			}
		})
	}
	refusals := []struct {
		name, body, param string
		status            int
	}{
		{"a hosted tool", `{"model":"m","input":"x","tools":[{"type":"web_search"}]}`, "tools[0].type", 400},
		{"an item reference", `{"model":"m","input":[{"type":"item_reference","id":"x"}]}`, "input[0].type", 400},
		{"an image by file id", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","file_id":"f"}]}]}`, "input[0].content[0].image_url", 400},
		{"background mode", `{"model":"m","input":"x","background":true}`, "background", 400},
		{"no input", `{"model":"m"}`, "input", 400},
		{"no model", `{"input":"x"}`, "model", 400},
		{"another member's response", `{"model":"m","input":"x","previous_response_id":"resp_old"}`, "previous_response_id", 404},
		{"an unknown response", `{"model":"m","input":"x","previous_response_id":"resp_nope"}`, "previous_response_id", 404},
		{"a repeated key", `{"model":"m","input":"x","input":"y"}`, "", 400},
		{"an unknown reasoning effort", `{"model":"m","input":"x","reasoning":{"effort":"extreme"}}`, "reasoning.effort", 400},
		{"a reasoning effort of the wrong type", `{"model":"m","input":"x","reasoning":{"effort":1}}`, "reasoning.effort", 400},
		{"an unknown reasoning summary", `{"model":"m","input":"x","reasoning":{"summary":"long"}}`, "reasoning.summary", 400},
		{"a reasoning that is not an object", `{"model":"m","input":"x","reasoning":"low"}`, "reasoning", 400},
		// Types of CreateResponse: a string is not a boolean, an object not an array.
		{"a string stream", `{"model":"m","input":"x","stream":"true"}`, "stream", 400},
		{"a numeric store", `{"model":"m","input":"x","store":0}`, "store", 400},
		{"tools as an object", `{"model":"m","input":"x","tools":{}}`, "tools", 400},
		{"a string parallel_tool_calls", `{"model":"m","input":"x","parallel_tool_calls":"no"}`, "parallel_tool_calls", 400},
		{"a string metadata", `{"model":"m","input":"x","metadata":"x"}`, "metadata", 400},
		// Parameters read or echoed, of the wrong type or outside their enum
		// (CreateResponse): refused, not dropped.
		{"a string top_logprobs", `{"model":"m","input":"x","top_logprobs":"5"}`, "top_logprobs", 400},
		{"a boolean top_logprobs", `{"model":"m","input":"x","top_logprobs":true}`, "top_logprobs", 400},
		{"a numeric user", `{"model":"m","input":"x","user":5}`, "user", 400},
		{"a string text", `{"model":"m","input":"x","text":"json"}`, "text", 400},
		{"a string text.format", `{"model":"m","input":"x","text":{"format":"json_object"}}`, "text.format", 400},
		{"a text.format without a type", `{"model":"m","input":"x","text":{"format":{}}}`, "text.format.type", 400},
		{"an unknown truncation", `{"model":"m","input":"x","truncation":"middle"}`, "truncation", 400},
		{"a numeric truncation", `{"model":"m","input":"x","truncation":1}`, "truncation", 400},
		{"a fractional max_tool_calls", `{"model":"m","input":"x","max_tool_calls":1.5}`, "max_tool_calls", 400},
		{"a string stream_options", `{"model":"m","input":"x","stream":true,"stream_options":"x"}`, "stream_options", 400},
		{"a numeric service_tier", `{"model":"m","input":"x","service_tier":1}`, "service_tier", 400},
		{"an unknown include", `{"model":"m","input":"x","include":["message.output_text.logprob"]}`, "include[0]", 400},
		{"a numeric include", `{"model":"m","input":"x","include":["reasoning.encrypted_content",1]}`, "include[1]", 400},
		{"an unknown tool_choice mode", `{"model":"m","input":"x","tool_choice":"x"}`, "tool_choice", 400},
		{"a function tool_choice without a name", `{"model":"m","input":"x","tool_choice":{"type":"function"}}`, "tool_choice.name", 400},
		{"a numeric input_text", `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":5}]}]}`, "input[0].content[0].text", 400},
		{"a function_call without a name", `{"model":"m","input":[{"role":"user","content":"x"},{"type":"function_call","call_id":"c","arguments":"{}"}]}`, "input[1].name", 400},
		{"a function_call with object arguments", `{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":{}}]}`, "input[0].arguments", 400},
		{"a function_call_output without call_id", `{"model":"m","input":[{"type":"function_call_output","output":"ok"}]}`, "input[0].call_id", 400},
		{"a numeric function_call_output", `{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":5}]}`, "input[1].output", 400},
		// OpenAI: "No tool call found for function call output with call_id d."
		{"a function_call_output answering no call", `{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"d","output":"x"}]}`, "input", 400},
	}
	for _, tt := range refusals {
		t.Run("refuses "+tt.name, func(t *testing.T) {
			member := "ana"
			if strings.Contains(tt.name, "another member") {
				member = "bo"
			}
			_, _, aerr := FromResponses(ctx, []byte(tt.body), store, member)
			if aerr == nil || aerr.Status != tt.status || aerr.Param != tt.param {
				t.Fatalf("error %+v, want %d param %q", aerr, tt.status, tt.param)
			}
		})
	}
}

// serve runs a Writer over an httptest recorder: write is what the
// pipeline would write.
func serve(t *testing.T, api API, tr *Translation, write func(w http.ResponseWriter)) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	w := NewWriter(rec, context.Background(), api)
	if tr != nil {
		w.Bind(tr)
	}
	write(w)
	w.Finish()
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	return rec
}

func writeJSON(status int, body string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "1")
		w.Header().Set(HeaderDecisionID, "dec-1")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}
}

func writeSSE(chunks ...string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for _, c := range chunks {
			_, _ = w.Write(relay.AppendData(nil, []byte(c)))
			w.(http.Flusher).Flush()
		}
	}
}

// events decodes an SSE body with the one decoder.
func events(t *testing.T, body []byte) []relay.Event {
	t.Helper()
	d := relay.NewDecoder(bytes.NewReader(body))
	var out []relay.Event
	for {
		ev, err := d.Next()
		if err != nil {
			return out
		}
		out = append(out, ev)
	}
}

const chatAnswer = `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"finish_reason":"tool_calls","logprobs":null,
	"message":{"role":"assistant","content":"Checking.","refusal":null,"tool_calls":[{"id":"call_9","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Oslo\"}"}}]}}],
	"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}`

var chatStream = []string{
	`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Check"},"finish_reason":null}]}`,
	`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"content":"ing."},"finish_reason":null}]}`,
	`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_9","type":"function","function":{"name":"weather","arguments":"{\"city\":"}}]},"finish_reason":null}]}`,
	`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Oslo\"}"}}]},"finish_reason":null}]}`,
	`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
	`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}`,
	`[DONE]`,
}

func TestResponsesAnswersAreSpecValid(t *testing.T) {
	spec := openapitest.Load(t)
	ctx := context.Background()
	body := `{"model":"m","input":"weather in Oslo?","tools":[{"type":"function","name":"weather","parameters":{"type":"object"}}]}`
	t.Run("a whole answer becomes a Response and is stored", func(t *testing.T) {
		store := &memStore{}
		_, tr, _ := FromResponses(ctx, []byte(body), store, "ana")
		rec := serve(t, APIResponses, tr, writeJSON(200, chatAnswer))
		spec.Validate(t, "Response", rec.Body.Bytes())
		r := gjson.ParseBytes(rec.Body.Bytes())
		if r.Get("id").Str != tr.ResponseID() || r.Get("status").Str != "completed" || r.Get("output.0.content.0.text").Str != "Checking." ||
			r.Get("output.1.type").Str != "function_call" || r.Get("output.1.call_id").Str != "call_9" || r.Get("usage.total_tokens").Int() != 19 {
			t.Fatalf("response %s", rec.Body)
		}
		if rec.Header().Get("Content-Length") != strconv.Itoa(rec.Body.Len()) {
			t.Fatalf("Content-Length %q for %d bytes", rec.Header().Get("Content-Length"), rec.Body.Len())
		}
		s, err := store.Response(ctx, tr.ResponseID(), "ana")
		if err != nil || s.DecisionID != "dec-1" {
			t.Fatalf("stored %+v, %v", s, err)
		}
		sameJSON(t, s.Messages, `[{"role":"user","content":"weather in Oslo?"},{"role":"assistant","content":"Checking.","tool_calls":[{"id":"call_9","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Oslo\"}"}}]}]`)
	})
	t.Run("store false keeps nothing", func(t *testing.T) {
		store := &memStore{}
		_, tr, _ := FromResponses(ctx, []byte(`{"model":"m","input":"x","store":false}`), store, "ana")
		rec := serve(t, APIResponses, tr, writeJSON(200, chatAnswer))
		if len(store.m) != 0 || gjson.GetBytes(rec.Body.Bytes(), "store").Bool() {
			t.Fatalf("stored %d: %s", len(store.m), rec.Body)
		}
	})
	t.Run("errors stay OpenAI's", func(t *testing.T) {
		err := `{"error":{"message":"no","type":"invalid_request_error","param":null,"code":"x"}}`
		rec := serve(t, APIResponses, nil, writeJSON(400, err))
		if rec.Code != 400 || rec.Body.String() != err {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	})
	t.Run("a stream becomes the Responses events", func(t *testing.T) {
		store := &memStore{}
		_, tr, _ := FromResponses(ctx, []byte(`{"model":"m","stream":true,"input":"weather in Oslo?"}`), store, "ana")
		rec := serve(t, APIResponses, tr, writeSSE(chatStream...))
		evs := events(t, rec.Body.Bytes())
		var types []string
		for i, ev := range evs {
			spec.Validate(t, "ResponseStreamEvent", ev.Data)
			if got := gjson.GetBytes(ev.Data, "type").Str; got != ev.Type {
				t.Fatalf("event %q carries type %q", ev.Type, got)
			}
			if n := gjson.GetBytes(ev.Data, "sequence_number").Int(); n != int64(i) {
				t.Fatalf("event %d has sequence_number %d", i, n)
			}
			types = append(types, ev.Type)
		}
		want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
			"response.output_text.delta", "response.output_text.delta", "response.output_text.done", "response.content_part.done",
			"response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
			"response.function_call_arguments.done", "response.output_item.done", "response.completed"}
		if !reflect.DeepEqual(types, want) {
			t.Fatalf("events\n%v\nwant\n%v", types, want)
		}
		done := gjson.GetBytes(evs[len(evs)-1].Data, "response")
		spec.Validate(t, "Response", []byte(done.Raw))
		if done.Get("output.1.arguments").Str != `{"city":"Oslo"}` || done.Get("usage.output_tokens").Int() != 7 || done.Get("output.0.content.0.text").Str != "Checking." {
			t.Fatalf("completed %s", done.Raw)
		}
		if _, err := store.Response(ctx, tr.ResponseID(), "ana"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("an answer cut by max_output_tokens is incomplete, and so is its item", func(t *testing.T) {
		cut := `{"id":"chatcmpl-2","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"finish_reason":"length","logprobs":null,
	"message":{"role":"assistant","content":"Once upon a","refusal":null}}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`
		_, tr, _ := FromResponses(ctx, []byte(`{"model":"m","input":"a story","max_output_tokens":16}`), nil, "ana")
		rec := serve(t, APIResponses, tr, writeJSON(200, cut))
		spec.Validate(t, "Response", rec.Body.Bytes())
		r := gjson.ParseBytes(rec.Body.Bytes())
		if r.Get("status").Str != "incomplete" || r.Get("incomplete_details.reason").Str != "max_output_tokens" ||
			r.Get("output.0.status").Str != "incomplete" || r.Get("output.0.content.0.text").Str != "Once upon a" || r.Get("completed_at").Exists() {
			t.Fatalf("response %s", rec.Body)
		}
		_, tr, _ = FromResponses(ctx, []byte(`{"model":"m","stream":true,"input":"a story","max_output_tokens":16}`), nil, "ana")
		rec = serve(t, APIResponses, tr, writeSSE(
			`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Once upon a"},"finish_reason":null}]}`,
			`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`,
			`[DONE]`))
		evs := events(t, rec.Body.Bytes())
		var itemDone gjson.Result
		for _, ev := range evs {
			spec.Validate(t, "ResponseStreamEvent", ev.Data)
			if ev.Type == "response.output_item.done" {
				itemDone = gjson.GetBytes(ev.Data, "item")
			}
		}
		last := evs[len(evs)-1]
		done := gjson.GetBytes(last.Data, "response")
		if last.Type != "response.incomplete" || done.Get("status").Str != "incomplete" || done.Get("incomplete_details.reason").Str != "max_output_tokens" ||
			done.Get("output.0.status").Str != "incomplete" || itemDone.Get("status").Str != "incomplete" {
			t.Fatalf("last event %s %s; item %s", last.Type, last.Data, itemDone.Raw)
		}
		// A call cut after a whole message: only the call is incomplete.
		_, tr, _ = FromResponses(ctx, []byte(body), nil, "ana")
		rec = serve(t, APIResponses, tr, writeJSON(200, strings.Replace(chatAnswer, `"finish_reason":"tool_calls"`, `"finish_reason":"length"`, 1)))
		spec.Validate(t, "Response", rec.Body.Bytes())
		if r := gjson.ParseBytes(rec.Body.Bytes()); r.Get("output.0.status").Str != "completed" || r.Get("output.1.status").Str != "incomplete" || r.Get("status").Str != "incomplete" {
			t.Fatalf("response %s", rec.Body)
		}
	})
	t.Run("include message.output_text.logprobs returns the tokens' logprobs, whole and streamed", func(t *testing.T) {
		lp := `{"token":"Hi","logprob":-0.25,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.25,"bytes":[72,105]},{"token":"Yo","logprob":-1.5,"bytes":[89,111]}]}`
		lp2 := `{"token":"!","logprob":-0.5,"bytes":[33],"top_logprobs":[{"token":"!","logprob":-0.5,"bytes":[33]}]}`
		req := `{"model":"m","input":"hi","top_logprobs":2,"include":["message.output_text.logprobs"]}`
		chat, tr, aerr := FromResponses(ctx, []byte(req), nil, "ana")
		if aerr != nil || !gjson.GetBytes(chat, "logprobs").Bool() || gjson.GetBytes(chat, "top_logprobs").Int() != 2 {
			t.Fatalf("chat request %s, %v", chat, aerr)
		}
		answer := `{"id":"c","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"finish_reason":"stop",
	"logprobs":{"content":[` + lp + `,` + lp2 + `],"refusal":null},"message":{"role":"assistant","content":"Hi!","refusal":null}}],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}`
		rec := serve(t, APIResponses, tr, writeJSON(200, answer))
		spec.Validate(t, "Response", rec.Body.Bytes())
		sameJSON(t, []byte(gjson.GetBytes(rec.Body.Bytes(), "output.0.content.0.logprobs").Raw), `[`+lp+`,`+lp2+`]`)

		_, tr, _ = FromResponses(ctx, []byte(strings.Replace(req, `"input"`, `"stream":true,"input"`, 1)), nil, "ana")
		rec = serve(t, APIResponses, tr, writeSSE(
			`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"logprobs":{"content":[`+lp+`],"refusal":null},"finish_reason":null}]}`,
			`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"content":"!"},"logprobs":{"content":[`+lp2+`],"refusal":null},"finish_reason":null}]}`,
			// A chunk whose logprobs hold no content tokens ("content": null) adds none.
			`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{},"logprobs":{"content":null,"refusal":null},"finish_reason":"stop"}]}`,
			`[DONE]`))
		var deltas []string
		for _, ev := range events(t, rec.Body.Bytes()) {
			spec.Validate(t, "ResponseStreamEvent", ev.Data)
			switch ev.Type {
			case "response.output_text.delta":
				deltas = append(deltas, gjson.GetBytes(ev.Data, "logprobs.0.token").Str)
			case "response.output_text.done":
				sameJSON(t, []byte(gjson.GetBytes(ev.Data, "logprobs").Raw), `[`+lp+`,`+lp2+`]`)
			case "response.completed":
				sameJSON(t, []byte(gjson.GetBytes(ev.Data, "response.output.0.content.0.logprobs").Raw), `[`+lp+`,`+lp2+`]`)
			}
		}
		if !reflect.DeepEqual(deltas, []string{"Hi", "!"}) {
			t.Fatalf("delta logprobs %v", deltas)
		}
		// An answer whose logprobs hold no content tokens ("content": null)
		// has an empty list, not a null token.
		_, tr, _ = FromResponses(ctx, []byte(req), nil, "ana")
		rec = serve(t, APIResponses, tr, writeJSON(200, strings.Replace(answer, `"content":[`+lp+`,`+lp2+`]`, `"content":null`, 1)))
		spec.Validate(t, "Response", rec.Body.Bytes())
		if got := gjson.GetBytes(rec.Body.Bytes(), "output.0.content.0.logprobs").Raw; got != "[]" {
			t.Fatalf("logprobs of content null: %s", got)
		}
		// Without include, none (OpenAI's include is what asks for them).
		_, tr, _ = FromResponses(ctx, []byte(`{"model":"m","input":"hi","top_logprobs":2}`), nil, "ana")
		rec = serve(t, APIResponses, tr, writeJSON(200, answer))
		if got := gjson.GetBytes(rec.Body.Bytes(), "output.0.content.0.logprobs").Raw; got != "[]" {
			t.Fatalf("logprobs without include: %s", got)
		}
	})
	t.Run("a stream cut short ends with an error event and response.failed", func(t *testing.T) {
		_, tr, _ := FromResponses(ctx, []byte(`{"model":"m","stream":true,"input":"x"}`), nil, "ana")
		rec := serve(t, APIResponses, tr, writeSSE(chatStream[0], `{"error":{"message":"cut","type":"upstream_error","param":null,"code":"stream_truncated"}}`))
		evs := events(t, rec.Body.Bytes())
		errEv, last := evs[len(evs)-2], evs[len(evs)-1]
		spec.Validate(t, "ResponseStreamEvent", errEv.Data)
		spec.Validate(t, "ResponseStreamEvent", last.Data)
		if errEv.Type != "error" || gjson.GetBytes(errEv.Data, "code").Str != "stream_truncated" {
			t.Fatalf("error event %s %s", errEv.Type, errEv.Data)
		}
		if last.Type != "response.failed" || gjson.GetBytes(last.Data, "response.status").Str != "failed" ||
			gjson.GetBytes(last.Data, "response.error.code").Str != "server_error" {
			t.Fatalf("last event %s %s", last.Type, last.Data)
		}
	})
}

// TestMessagesStreamUsage: a Messages stream's usage is the upstream's
// count wherever the upstream has given it — message_start when the first
// chunk carries usage (servers that report it on every chunk), and always
// message_delta; the classifier's estimate only where nothing else is known.
func TestMessagesStreamUsage(t *testing.T) {
	_, tr, aerr := FromMessages([]byte(`{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"Hello"}]}`))
	if aerr != nil {
		t.Fatal(aerr)
	}
	tr.PromptEstimate = 8
	chunk := func(delta, finish, usage string) string {
		return `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}],"usage":` + usage + `}`
	}
	usageOf := func(t *testing.T, chunks ...string) (start, deltaIn, deltaOut gjson.Result) {
		t.Helper()
		evs := events(t, serve(t, APIMessages, tr, writeSSE(chunks...)).Body.Bytes())
		if len(evs) < 3 || evs[0].Type != "message_start" || evs[len(evs)-2].Type != "message_delta" {
			t.Fatalf("events %v", evs)
		}
		d := evs[len(evs)-2].Data
		return gjson.GetBytes(evs[0].Data, "message.usage.input_tokens"), gjson.GetBytes(d, "usage.input_tokens"), gjson.GetBytes(d, "usage.output_tokens")
	}
	for _, c := range []struct {
		name                     string
		chunks                   []string
		start, deltaIn, deltaOut int64
	}{
		{"usage last (include_usage)", []string{chunk(`{"role":"assistant","content":"Hi"}`, "null", "null"), chunk(`{}`, `"length"`, "null"),
			`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":25,"completion_tokens":2,"total_tokens":27}}`, `[DONE]`}, 8, 25, 2},
		{"usage on every chunk", []string{chunk(`{"role":"assistant","content":"Hi"}`, "null", `{"prompt_tokens":25,"completion_tokens":1,"total_tokens":26}`),
			chunk(`{"content":"!"}`, `"length"`, `{"prompt_tokens":25,"completion_tokens":2,"total_tokens":27}`), `[DONE]`}, 25, 25, 2},
		{"no usage at all", []string{chunk(`{"role":"assistant","content":"Hi"}`, `"stop"`, "null"), `[DONE]`}, 8, 8, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			start, in, out := usageOf(t, c.chunks...)
			if start.Int() != c.start || in.Int() != c.deltaIn || out.Int() != c.deltaOut || in.Type != gjson.Number {
				t.Fatalf("message_start input_tokens %s, message_delta input_tokens %s output_tokens %s; want %d, %d, %d",
					start.Raw, in.Raw, out.Raw, c.start, c.deltaIn, c.deltaOut)
			}
		})
	}
}

// TestInvalidUTF8IsRefusedBeforeTranslation: a Responses or Messages body
// with a string that is not UTF-8 gets the 400 a chat body gets
// (openai.ParseRequest's), not a translation with U+FFFD in its place.
func TestInvalidUTF8IsRefusedBeforeTranslation(t *testing.T) {
	_, chatErr := openai.ParseRequest(openai.EndpointChat, []byte("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\xffb\"}]}"))
	if chatErr == nil {
		t.Fatal("the chat body was accepted")
	}
	for name, translate := range map[string]func() ([]byte, *openai.Error){
		"responses": func() ([]byte, *openai.Error) {
			chat, _, err := FromResponses(context.Background(), []byte("{\"model\":\"m\",\"input\":\"a\xffb\"}"), nil, "ana")
			return chat, err
		},
		"messages": func() ([]byte, *openai.Error) {
			chat, _, err := FromMessages([]byte("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\xffb\"}]}]}"))
			return chat, err
		},
	} {
		chat, err := translate()
		if err == nil || err.Status != chatErr.Status || err.Type != chatErr.Type || err.Message != chatErr.Message || chat != nil {
			t.Errorf("%s: error %v, chat %q; want %v", name, err, chat, chatErr)
		}
	}
}

// TestResponsesReasoning: the request's reasoning is echoed in the
// Response, and the chat answer's reasoning_content becomes a reasoning
// item before the message (whole, or streamed as reasoning_text events),
// with its tokens in output_tokens_details, spec-valid throughout.
func TestResponsesReasoning(t *testing.T) {
	spec := openapitest.Load(t)
	ctx := context.Background()
	usage := `{"prompt_tokens":9,"completion_tokens":14,"total_tokens":23,"completion_tokens_details":{"reasoning_tokens":11}}`
	answer := `{"id":"chatcmpl-3","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"finish_reason":"stop","logprobs":null,
	"message":{"role":"assistant","content":"Four.","reasoning_content":"Two plus two is four.","refusal":null}}],"usage":` + usage + `}`
	check := func(t *testing.T, r gjson.Result) {
		t.Helper()
		spec.Validate(t, "Response", []byte(r.Raw))
		if r.Get("reasoning.effort").Str != "low" || r.Get("reasoning.summary").Type != gjson.Null ||
			r.Get("output.#").Int() != 2 || r.Get("output.0.type").Str != "reasoning" || !strings.HasPrefix(r.Get("output.0.id").Str, "rs_") ||
			r.Get("output.0.content.0.type").Str != "reasoning_text" || r.Get("output.0.content.0.text").Str != "Two plus two is four." ||
			r.Get("output.0.status").Str != "completed" || r.Get("output.1.content.0.text").Str != "Four." ||
			r.Get("usage.output_tokens_details.reasoning_tokens").Int() != 11 || r.Get("usage.output_tokens").Int() != 14 {
			t.Fatalf("response %s", r.Raw)
		}
	}
	t.Run("a whole answer", func(t *testing.T) {
		store := &memStore{}
		_, tr, aerr := FromResponses(ctx, []byte(`{"model":"m","input":"2+2?","reasoning":{"effort":"low"}}`), store, "ana")
		if aerr != nil {
			t.Fatal(aerr)
		}
		rec := serve(t, APIResponses, tr, writeJSON(200, answer))
		check(t, gjson.ParseBytes(rec.Body.Bytes()))
		s, err := store.Response(ctx, tr.ResponseID(), "ana")
		if err != nil {
			t.Fatal(err)
		}
		// Chat completions has no place for reasoning: the next turn gets the answer only.
		sameJSON(t, s.Messages, `[{"role":"user","content":"2+2?"},{"role":"assistant","content":"Four."}]`)
	})
	t.Run("no reasoning asked: the echo is null", func(t *testing.T) {
		_, tr, _ := FromResponses(ctx, []byte(`{"model":"m","input":"x"}`), nil, "ana")
		r := gjson.ParseBytes(serve(t, APIResponses, tr, writeJSON(200, chatAnswer)).Body.Bytes())
		if e := r.Get("reasoning.effort"); !e.Exists() || e.Type != gjson.Null || r.Get("output.0.type").Str != "message" {
			t.Fatalf("response %s", r.Raw)
		}
	})
	t.Run("a stream", func(t *testing.T) {
		_, tr, _ := FromResponses(ctx, []byte(`{"model":"m","stream":true,"input":"2+2?","reasoning":{"effort":"low"}}`), nil, "ana")
		chunk := func(delta, finish string) string {
			return `{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}`
		}
		rec := serve(t, APIResponses, tr, writeSSE(chunk(`{"role":"assistant","content":""}`, "null"),
			chunk(`{"reasoning_content":"Two plus "}`, "null"), chunk(`{"reasoning_content":"two is four."}`, "null"),
			chunk(`{"content":"Four."}`, "null"), chunk(`{}`, `"stop"`),
			`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[],"usage":`+usage+`}`, `[DONE]`))
		evs := events(t, rec.Body.Bytes())
		var types []string
		var deltas strings.Builder
		for i, ev := range evs {
			spec.Validate(t, "ResponseStreamEvent", ev.Data)
			if n := gjson.GetBytes(ev.Data, "sequence_number").Int(); n != int64(i) {
				t.Fatalf("event %d has sequence_number %d", i, n)
			}
			if ev.Type == "response.reasoning_text.delta" {
				deltas.WriteString(gjson.GetBytes(ev.Data, "delta").Str)
			}
			types = append(types, ev.Type)
		}
		want := []string{"response.created", "response.in_progress",
			"response.output_item.added", "response.content_part.added", "response.reasoning_text.delta", "response.reasoning_text.delta",
			"response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
			"response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.done",
			"response.content_part.done", "response.output_item.done", "response.completed"}
		if !reflect.DeepEqual(types, want) {
			t.Fatalf("events\n%v\nwant\n%v", types, want)
		}
		if deltas.String() != "Two plus two is four." || gjson.GetBytes(evs[6].Data, "text").Str != deltas.String() ||
			gjson.GetBytes(evs[2].Data, "item.type").Str != "reasoning" || gjson.GetBytes(evs[9].Data, "output_index").Int() != 1 {
			t.Fatalf("reasoning deltas %q; events %s %s", deltas.String(), evs[2].Data, evs[6].Data)
		}
		created := gjson.GetBytes(evs[0].Data, "response")
		if created.Get("reasoning.effort").Str != "low" {
			t.Fatalf("response.created %s", created.Raw)
		}
		check(t, gjson.GetBytes(evs[len(evs)-1].Data, "response"))
	})
	t.Run("a stream cut while reasoning: the reasoning item is incomplete", func(t *testing.T) {
		_, tr, _ := FromResponses(ctx, []byte(`{"model":"m","stream":true,"input":"2+2?","reasoning":{"effort":"high"},"max_output_tokens":16}`), nil, "ana")
		rec := serve(t, APIResponses, tr, writeSSE(
			`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"Two"},"finish_reason":null}]}`,
			`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`, `[DONE]`))
		evs := events(t, rec.Body.Bytes())
		for _, ev := range evs {
			spec.Validate(t, "ResponseStreamEvent", ev.Data)
		}
		done := gjson.GetBytes(evs[len(evs)-1].Data, "response")
		if done.Get("status").Str != "incomplete" || done.Get("output.#").Int() != 1 || done.Get("output.0.status").Str != "incomplete" ||
			done.Get("output.0.content.0.text").Str != "Two" || done.Get("reasoning.effort").Str != "high" {
			t.Fatalf("last event %s", evs[len(evs)-1].Data)
		}
	})
}

// collapseTypes drops consecutive repeats.
func collapseTypes(ts []string) []string {
	var out []string
	for _, s := range ts {
		if n := len(out); n == 0 || out[n-1] != s {
			out = append(out, s)
		}
	}
	return out
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/anthropic/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// shape is a JSON value's shape: objects as their sorted member names
// with each member's shape, arrays as the shapes of their elements, other
// values as their JSON type. Values are ignored.
func shape(v gjson.Result) any {
	switch {
	case v.IsObject():
		m := map[string]any{}
		v.ForEach(func(k, e gjson.Result) bool {
			m[k.Str] = shape(e)
			if k.Str == "input" && e.IsObject() {
				m[k.Str] = "a tool's input object" // its members are the tool's, not the API's
			}
			return true
		})
		return m
	case v.IsArray():
		var out []any
		for _, e := range v.Array() {
			out = append(out, shape(e))
		}
		return out
	}
	return v.Type.String()
}

func TestFromMessagesTranslatesTheRecordedRequest(t *testing.T) {
	chat, tr, aerr := FromMessages(readFile(t, "tool_use_request.json"))
	if aerr != nil {
		t.Fatal(aerr)
	}
	if tr.API != APIMessages || tr.Model != "claude-sonnet-4-5" || tr.Stream {
		t.Fatalf("translation %+v", tr)
	}
	sameJSON(t, chat, `{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[
		{"role":"system","content":"You are a weather assistant."},
		{"role":"user","content":"What is the weather like in San Francisco?"},
		{"role":"assistant","content":"I'll check the current weather in San Francisco for you.","tool_calls":[{"id":"toolu_01A09q90qw90lq917835lq9","type":"function","function":{"name":"get_weather","arguments":"{\"location\": \"San Francisco, CA\"}"}}]},
		{"role":"tool","tool_call_id":"toolu_01A09q90qw90lq917835lq9","content":"15 degrees"},
		{"role":"user","content":[{"type":"text","text":"And in Celsius?"}]}],
		"tools":[{"type":"function","function":{"name":"get_weather","description":"Get the current weather in a given location","parameters":{"type":"object","properties":{"location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"}},"required":["location"]}}}],
		"tool_choice":"auto","parallel_tool_calls":false,"stop":["END"],"temperature":0.2,"user":"user-7"}`)
	for _, tt := range []struct{ name, body, param string }{
		{"no max_tokens", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{"a server tool", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, "tools.0"},
		{"a document block", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`, "messages.0.content.0.type"},
		{"a system role in messages", `{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, "messages.0.role"},
		// Anthropic's types and ranges (Messages API reference): stream a
		// boolean, tools an array, tool_choice an object, stop_sequences
		// strings, metadata an object, temperature 0 to 1.
		{"a string stream", `{"model":"m","max_tokens":5,"stream":"true","messages":[{"role":"user","content":"x"}]}`, "stream"},
		{"a numeric stream", `{"model":"m","max_tokens":5,"stream":1,"messages":[{"role":"user","content":"x"}]}`, "stream"},
		{"tools as an object", `{"model":"m","max_tokens":5,"tools":{},"messages":[{"role":"user","content":"x"}]}`, "tools"},
		{"a string tool_choice", `{"model":"m","max_tokens":5,"tool_choice":"auto","messages":[{"role":"user","content":"x"}]}`, "tool_choice"},
		{"a string stop_sequences", `{"model":"m","max_tokens":5,"stop_sequences":"END","messages":[{"role":"user","content":"x"}]}`, "stop_sequences"},
		{"a numeric stop sequence", `{"model":"m","max_tokens":5,"stop_sequences":["END",1],"messages":[{"role":"user","content":"x"}]}`, "stop_sequences.1"},
		{"a string metadata", `{"model":"m","max_tokens":5,"metadata":"u","messages":[{"role":"user","content":"x"}]}`, "metadata"},
		{"a temperature above 1", `{"model":"m","max_tokens":5,"temperature":1.5,"messages":[{"role":"user","content":"x"}]}`, "temperature"},
		// top_k an integer >= 0, service_tier a string, system blocks text
		// blocks, tool_choice an object with a type (and a name for type tool).
		{"a string top_k", `{"model":"m","max_tokens":5,"top_k":"5","messages":[{"role":"user","content":"x"}]}`, "top_k"},
		{"a fractional top_k", `{"model":"m","max_tokens":5,"top_k":1.5,"messages":[{"role":"user","content":"x"}]}`, "top_k"},
		{"a negative top_k", `{"model":"m","max_tokens":5,"top_k":-1,"messages":[{"role":"user","content":"x"}]}`, "top_k"},
		{"a numeric service_tier", `{"model":"m","max_tokens":5,"service_tier":1,"messages":[{"role":"user","content":"x"}]}`, "service_tier"},
		{"a numeric system block", `{"model":"m","max_tokens":5,"system":[{"type":"text","text":"a"},1],"messages":[{"role":"user","content":"x"}]}`, "system.1"},
		{"a system block without text", `{"model":"m","max_tokens":5,"system":[{"type":"text"}],"messages":[{"role":"user","content":"x"}]}`, "system.0"},
		{"a tool_choice without a type", `{"model":"m","max_tokens":5,"tool_choice":{},"messages":[{"role":"user","content":"x"}]}`, "tool_choice.type"},
		{"a tool_choice with an empty type", `{"model":"m","max_tokens":5,"tool_choice":{"type":""},"messages":[{"role":"user","content":"x"}]}`, "tool_choice.type"},
		{"a tool tool_choice without a name", `{"model":"m","max_tokens":5,"tool_choice":{"type":"tool"},"messages":[{"role":"user","content":"x"}]}`, "tool_choice.name"},
		// A text block's text is a string (not read as "").
		{"a numeric text block", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`, "messages.0.content.0.text"},
		{"a tool_result text block without text", `{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text"}]}]}]}`, "messages.1.content.0.content.0.text"},
		// Anthropic: a tool_result answers a tool_use before it.
		{"a tool_result answering no tool_use", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]}]}`, "messages.0.content.0"},
	} {
		if _, _, aerr := FromMessages([]byte(tt.body)); aerr == nil || aerr.Status != 400 || aerr.Param != tt.param {
			t.Fatalf("%s: %+v, want 400 param %q", tt.name, aerr, tt.param)
		}
	}
}

func TestMessagesAnswersHaveTheRecordedShapes(t *testing.T) {
	_, tr, _ := FromMessages(readFile(t, "tool_use_request.json"))
	t.Run("a whole answer", func(t *testing.T) {
		rec := serve(t, APIMessages, tr, writeJSON(200, chatAnswer))
		got, want := gjson.ParseBytes(rec.Body.Bytes()), gjson.ParseBytes(readFile(t, "tool_use_response.json"))
		if !reflect.DeepEqual(shape(got), shape(want)) {
			t.Fatalf("shape\n%v\nwant\n%v", shape(got), shape(want))
		}
		if got.Get("stop_reason").Str != "tool_use" || got.Get("content.1.input.city").Str != "Oslo" || got.Get("usage.input_tokens").Int() != 12 ||
			got.Get("model").Str != "claude-sonnet-4-5" {
			t.Fatalf("message %s", rec.Body)
		}
	})
	t.Run("an error", func(t *testing.T) {
		rec := serve(t, APIMessages, tr, writeJSON(400, `{"error":{"message":"max_tokens: Field required","type":"invalid_request_error","param":"max_tokens","code":null}}`))
		if rec.Code != 400 || !reflect.DeepEqual(shape(gjson.ParseBytes(rec.Body.Bytes())), shape(gjson.ParseBytes(readFile(t, "error.json")))) ||
			gjson.GetBytes(rec.Body.Bytes(), "error.type").Str != "invalid_request_error" {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	})
	t.Run("streams", func(t *testing.T) {
		stream := *tr
		stream.Stream = true
		stream.PromptEstimate = 10
		rec := serve(t, APIMessages, &stream, writeSSE(chatStream...))
		got := events(t, rec.Body.Bytes())
		// The recorded tool use stream has a text block then a tool_use
		// block, as this answer does: the same events, with the same shapes.
		want := events(t, readFile(t, "tool_use_stream.txt"))
		// Deltas come in as many events as the text came in chunks:
		// consecutive events of one type and block are compared as one.
		collapse := func(evs []relay.Event) []relay.Event {
			var out []relay.Event
			for _, ev := range evs {
				if n := len(out); n > 0 && ev.Type == "content_block_delta" && out[n-1].Type == ev.Type &&
					gjson.GetBytes(out[n-1].Data, "index").Int() == gjson.GetBytes(ev.Data, "index").Int() {
					continue
				}
				out = append(out, ev)
			}
			return out
		}
		g, w := collapse(got), collapse(want)
		var gotTypes, wantTypes []string
		for _, ev := range g {
			gotTypes = append(gotTypes, ev.Type)
		}
		for _, ev := range w {
			wantTypes = append(wantTypes, ev.Type)
		}
		if !reflect.DeepEqual(gotTypes, wantTypes) {
			t.Fatalf("events\n%v\nwant\n%v", gotTypes, wantTypes)
		}
		for i := range g {
			gs, ws := shape(gjson.ParseBytes(g[i].Data)), shape(gjson.ParseBytes(w[i].Data))
			if g[i].Type == "message_delta" {
				// Molly also reports input_tokens there, as the API's newer
				// versions do: the recorded example has output_tokens only.
				delete(gs.(map[string]any)["usage"].(map[string]any), "input_tokens")
			}
			if !reflect.DeepEqual(gs, ws) {
				t.Fatalf("event %d (%s)\n%v\nwant\n%v", i, g[i].Type, gs, ws)
			}
		}
		var args strings.Builder
		for _, ev := range got {
			args.WriteString(gjson.GetBytes(ev.Data, "delta.partial_json").Str)
		}
		// message_start has only the estimate (10: the first chunk carries
		// no usage); message_delta, the whole message's usage that the SDKs
		// keep, has the upstream's count from its usage chunk (12).
		if in := gjson.GetBytes(got[0].Data, "message.usage.input_tokens"); got[0].Type != "message_start" || in.Int() != 10 ||
			gjson.GetBytes(got[len(got)-2].Data, "usage.input_tokens").Int() != 12 {
			t.Fatalf("message_start %s, message_delta %s", got[0].Data, got[len(got)-2].Data)
		}
		if args.String() != `{"city":"Oslo"}` || gjson.GetBytes(got[len(got)-2].Data, "usage.output_tokens").Int() != 7 {
			t.Fatalf("arguments %q, message_delta %s", args.String(), got[len(got)-2].Data)
		}
		// The text-only recorded stream's event types, without its ping.
		text := events(t, readFile(t, "text_stream.txt"))
		var textTypes []string
		for _, ev := range text {
			if ev.Type != "ping" {
				textTypes = append(textTypes, ev.Type)
			}
		}
		rec = serve(t, APIMessages, &stream, writeSSE(chatStream[0], chatStream[1], `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, `[DONE]`))
		var plain []string
		for _, ev := range events(t, rec.Body.Bytes()) {
			plain = append(plain, ev.Type)
		}
		if !reflect.DeepEqual(collapseTypes(plain), collapseTypes(textTypes)) {
			t.Fatalf("text stream events %v, want %v", plain, textTypes)
		}
	})
}

func TestRetrieveIsTheMembersOwn(t *testing.T) {
	ctx := context.Background()
	store := &memStore{}
	_, tr, _ := FromResponses(ctx, []byte(`{"model":"m","input":"x"}`), store, "ana")
	rec := serve(t, APIResponses, tr, writeJSON(200, chatAnswer))
	got, err := Retrieve(ctx, store, tr.ResponseID(), "ana")
	if err != nil || string(got) != rec.Body.String() {
		t.Fatalf("ana's own: %v\n%s\nsent\n%s", err, got, rec.Body)
	}
	for _, c := range []struct {
		store      Store
		id, member string
	}{{store, tr.ResponseID(), "bo"}, {store, "resp_nope", "ana"}, {nil, tr.ResponseID(), "ana"}} {
		if _, err := Retrieve(ctx, c.store, c.id, c.member); err == nil || err.Status != 404 {
			t.Fatalf("%s of %s: %v", c.id, c.member, err)
		}
	}
}

// TestMessagesToolUseCutByMaxTokens: a chat answer whose call was cut by
// max_tokens (tool_calls with partial arguments, finish "length", as the
// engine and OpenAI answer it) is a tool_use block with stop_reason
// max_tokens, whole and streamed; never a text block.
func TestMessagesToolUseCutByMaxTokens(t *testing.T) {
	_, tr, _ := FromMessages([]byte(`{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"weather?"}]}`))
	cut := `{"id":"c","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"finish_reason":"length","logprobs":null,
	"message":{"role":"assistant","content":null,"refusal":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Os"}}]}}],
	"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}`
	rec := serve(t, APIMessages, tr, writeJSON(200, cut))
	m := gjson.ParseBytes(rec.Body.Bytes())
	if m.Get("stop_reason").Str != "max_tokens" || m.Get("content.#").Int() != 1 || m.Get("content.0.type").Str != "tool_use" ||
		m.Get("content.0.name").Str != "weather" || !m.Get("content.0.input").IsObject() {
		t.Fatalf("message %s", rec.Body)
	}
	stream := *tr
	stream.Stream = true
	rec = serve(t, APIMessages, &stream, writeSSE(
		`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Os"}}]},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`,
		`[DONE]`))
	var blocks []string
	var stop, partial string
	for _, ev := range events(t, rec.Body.Bytes()) {
		switch ev.Type {
		case "content_block_start":
			blocks = append(blocks, gjson.GetBytes(ev.Data, "content_block.type").Str)
		case "content_block_delta":
			partial += gjson.GetBytes(ev.Data, "delta.partial_json").Str
		case "message_delta":
			stop = gjson.GetBytes(ev.Data, "delta.stop_reason").Str
		}
	}
	if !reflect.DeepEqual(blocks, []string{"tool_use"}) || stop != "max_tokens" || partial != `{"city":"Os` {
		t.Fatalf("blocks %v stop %q partial %q\n%s", blocks, stop, partial, rec.Body)
	}
}

// TestMessagesStopSequence: a choice whose stop_reason (vLLM's, Molly's
// engine's) names one of the request's stop_sequences is Anthropic's
// stop_reason "stop_sequence" with stop_sequence set, whole and streamed;
// a stop token's id, or a string the request did not list, is end_turn.
func TestMessagesStopSequence(t *testing.T) {
	_, tr, _ := FromMessages([]byte(`{"model":"m","max_tokens":9,"stop_sequences":["NEVER","END"],"messages":[{"role":"user","content":"count"}]}`))
	whole := func(stopReason string) string {
		return `{"id":"c","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"finish_reason":"stop","stop_reason":` + stopReason + `,"logprobs":null,
	"message":{"role":"assistant","content":"1 2 3","refusal":null}}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`
	}
	for _, c := range []struct{ stopReason, reason, seq string }{
		{`"END"`, "stop_sequence", `"END"`}, {`151645`, "end_turn", "null"}, {`"OTHER"`, "end_turn", "null"}, {`null`, "end_turn", "null"},
	} {
		m := gjson.ParseBytes(serve(t, APIMessages, tr, writeJSON(200, whole(c.stopReason))).Body.Bytes())
		if m.Get("stop_reason").Str != c.reason || m.Get("stop_sequence").Raw != c.seq {
			t.Errorf("stop_reason %s: %s %s", c.stopReason, m.Get("stop_reason").Raw, m.Get("stop_sequence").Raw)
		}
	}
	stream := *tr
	stream.Stream = true
	rec := serve(t, APIMessages, &stream, writeSSE(
		`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"1 2 3"},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop","stop_reason":"END"}]}`,
		`[DONE]`))
	var delta gjson.Result
	for _, ev := range events(t, rec.Body.Bytes()) {
		if ev.Type == "message_delta" {
			delta = gjson.GetBytes(ev.Data, "delta")
		}
	}
	if delta.Get("stop_reason").Str != "stop_sequence" || delta.Get("stop_sequence").Str != "END" {
		t.Fatalf("message_delta %s", delta.Raw)
	}
}

// TestMessagesSystemBlocksStayApart: system text blocks are separate texts;
// joined, they are one per line, not glued into one word.
func TestMessagesSystemBlocksStayApart(t *testing.T) {
	chat, _, aerr := FromMessages([]byte(`{"model":"m","max_tokens":9,"system":[{"type":"text","text":"You are terse."},{"type":"text","text":"Answer in Italian.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}]}`))
	if aerr != nil {
		t.Fatal(aerr)
	}
	if got := gjson.GetBytes(chat, "messages.0.content").Str; got != "You are terse.\nAnswer in Italian." {
		t.Fatalf("system %q", got)
	}
}

// TestMessagesToolResultBlocks: a tool_result's text blocks become the
// tool message (one per line), its images image_url parts of the user turn
// after the tool messages; another block kind is a 400 naming it.
func TestMessagesToolResultBlocks(t *testing.T) {
	req := `{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"shot?"},
	{"role":"assistant","content":[{"type":"tool_use","id":"tu_1","name":"screenshot","input":{}}]},
	{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu_1","content":[{"type":"text","text":"Here it is."},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"text","text":"1024x768"}]},{"type":"text","text":"What do you see?"}]}]}`
	chat, _, aerr := FromMessages([]byte(req))
	if aerr != nil {
		t.Fatal(aerr)
	}
	ms := gjson.GetBytes(chat, "messages")
	if tool := ms.Get("2"); tool.Get("role").Str != "tool" || tool.Get("tool_call_id").Str != "tu_1" || tool.Get("content").Str != "Here it is.\n1024x768" {
		t.Fatalf("tool message %s", tool.Raw)
	}
	user := ms.Get("3")
	if user.Get("role").Str != "user" || user.Get("content.0.image_url.url").Str != "data:image/png;base64,iVBORw0KGgo=" || user.Get("content.1.text").Str != "What do you see?" {
		t.Fatalf("user turn %s", user.Raw)
	}
	_, _, aerr = FromMessages([]byte(strings.Replace(req, `{"type":"text","text":"1024x768"}`, `{"type":"document","source":{"type":"text","data":"x"}}`, 1)))
	if aerr == nil || aerr.Param != "messages.2.content.0.content.2.type" {
		t.Fatalf("a document block in a tool_result: %+v", aerr)
	}
}

// TestResponsesErrorsNameTheResponsesParameter: an error about the chat
// request a Responses request became names the parameter the client sent.
func TestResponsesErrorsNameTheResponsesParameter(t *testing.T) {
	for _, c := range []struct{ chat, want string }{
		{"response_format.json_schema.schema", "text.format.schema"},
		{"response_format.json_schema.name", "text.format.name"},
		{"response_format", "text.format"},
		{"max_completion_tokens", "max_output_tokens"},
		{"reasoning_effort", "reasoning.effort"},
		{"messages[2].content", "input"},
		{"temperature", "temperature"},
		{"response_formatting", "response_formatting"},
		{"tools[3].function.name", "tools[3].name"},
		{"tools[0].function", "tools[0]"},
		{"tools[0].type", "tools[0].type"},
		{"tool_choice.function.name", "tool_choice.name"},
		{"tool_choice.allowed_tools.tools[1].function.name", "tool_choice.tools[1].name"},
		{"tool_choice.allowed_tools.mode", "tool_choice.mode"},
		{"verbosity", "text.verbosity"},
	} {
		body := []byte(`{"error":{"message":"m","type":"invalid_request_error","param":"` + c.chat + `","code":null}}`)
		if got := gjson.GetBytes(responsesParam(body), "error.param").Str; got != c.want {
			t.Errorf("param %q became %q, want %q", c.chat, got, c.want)
		}
	}
	// The message quotes the Responses name too.
	body := []byte(`{"error":{"message":"Invalid 'tools[0].function.name': string does not match pattern.","type":"invalid_request_error","param":"tools[0].function.name","code":"invalid_value"}}`)
	if got := gjson.GetBytes(responsesParam(body), "error.message").Str; got != "Invalid 'tools[0].name': string does not match pattern." {
		t.Errorf("message %q", got)
	}
	for _, body := range []string{`not json`, `{"error":{"param":null}}`} {
		if got := string(responsesParam([]byte(body))); got != body {
			t.Errorf("%s became %s", body, got)
		}
	}
}

// An error about a chat tool on /v1/messages names the client's path
// (tools.0.name for chat's tools[0].function.name), in the message too.
func TestMessagesErrorsNameTheMessagesToolPath(t *testing.T) {
	for _, c := range []struct{ chat, want string }{
		{"tools[0].function.name", "tools.0.name: Invalid 'tools.0.name': bad."},
		{"tools[2].function.parameters", "tools.2.input_schema: Invalid 'tools.2.input_schema': bad."},
		{"tool_choice.function.name", "tool_choice.name: Invalid 'tool_choice.name': bad."},
		{"messages[3].content", "messages: Invalid 'messages': bad."},
	} {
		body := []byte(`{"error":{"message":"Invalid '` + c.chat + `': bad.","type":"invalid_request_error","param":"` + c.chat + `","code":"invalid_value"}}`)
		if got := gjson.GetBytes(messageError(400, body, true, ""), "error.message").Str; got != c.want {
			t.Errorf("%s: %q, want %q", c.chat, got, c.want)
		}
	}
}

// With thinking enabled, the answer's reasoning comes first as a thinking
// block — whole (type, thinking, signature) and streamed in the event
// sequence of Anthropic's extended-thinking streaming reference
// (content_block_start of a thinking block, thinking_delta events, one
// signature_delta, content_block_stop, then the text block). Without it,
// the reasoning is not returned; a thinking of the wrong type is a 400.
func TestMessagesThinking(t *testing.T) {
	const answer = `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","reasoning_content":"Two and two.","content":"Four."}}],"usage":{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}}`
	for _, enabled := range []bool{true, false} {
		req := `{"model":"m","max_tokens":2048,"messages":[{"role":"user","content":"2+2?"}]`
		if enabled {
			req += `,"thinking":{"type":"enabled","budget_tokens":1024}`
		} else {
			req += `,"thinking":{"type":"disabled"}`
		}
		_, tr, aerr := FromMessages([]byte(req + `}`))
		if aerr != nil {
			t.Fatal(aerr)
		}
		got := gjson.ParseBytes(serve(t, APIMessages, tr, writeJSON(200, answer)).Body.Bytes())
		if enabled {
			if got.Get("content.#").Int() != 2 || got.Get("content.0.type").Str != "thinking" || got.Get("content.0.thinking").Str != "Two and two." ||
				got.Get("content.0.signature").Type != gjson.String || got.Get("content.1.type").Str != "text" || got.Get("content.1.text").Str != "Four." {
				t.Fatalf("thinking enabled: %s", got.Raw)
			}
		} else if got.Get("content.#").Int() != 1 || got.Get("content.0.text").Str != "Four." {
			t.Fatalf("thinking disabled: %s", got.Raw)
		}
	}

	_, tr, aerr := FromMessages([]byte(`{"model":"m","max_tokens":2048,"stream":true,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"2+2?"}]}`))
	if aerr != nil {
		t.Fatal(aerr)
	}
	chunk := func(delta, finish string) string {
		return `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}`
	}
	evs := events(t, serve(t, APIMessages, tr, writeSSE(chunk(`{"role":"assistant","reasoning_content":"Two "}`, "null"),
		chunk(`{"reasoning_content":"and two."}`, "null"), chunk(`{"content":"Four."}`, "null"), chunk(`{}`, `"stop"`), `[DONE]`)).Body.Bytes())
	var seq []string
	thinking := ""
	for _, ev := range evs {
		d := gjson.ParseBytes(ev.Data)
		step := ev.Type
		switch ev.Type {
		case "content_block_start":
			step += ":" + d.Get("content_block.type").Str + ":" + d.Get("index").Raw
		case "content_block_delta":
			step += ":" + d.Get("delta.type").Str + ":" + d.Get("index").Raw
			thinking += d.Get("delta.thinking").Str
		case "content_block_stop":
			step += ":" + d.Get("index").Raw
		}
		if n := len(seq); n > 0 && seq[n-1] == step {
			continue // deltas of one kind in a row are one step
		}
		seq = append(seq, step)
	}
	want := []string{"message_start", "content_block_start:thinking:0", "content_block_delta:thinking_delta:0", "content_block_delta:signature_delta:0",
		"content_block_stop:0", "content_block_start:text:1", "content_block_delta:text_delta:1", "content_block_stop:1", "message_delta", "message_stop"}
	if !reflect.DeepEqual(seq, want) || thinking != "Two and two." {
		t.Fatalf("events %v (thinking %q)\nwant   %v", seq, thinking, want)
	}

	if _, _, aerr := FromMessages([]byte(`{"model":"m","max_tokens":5,"thinking":"yes","messages":[{"role":"user","content":"hi"}]}`)); aerr == nil || aerr.Param != "thinking" {
		t.Fatalf("a string thinking: %v", aerr)
	}
}
