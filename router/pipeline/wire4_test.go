package pipeline

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/relay"
	"github.com/molly-gateway/molly/router/route"
)

// sseChunks decodes an SSE body that ends with [DONE] into its data
// payloads (each validated against schema), failing the test otherwise.
func sseChunks(t *testing.T, spec *openapitest.Spec, schema, body string) [][]byte {
	t.Helper()
	d := relay.NewDecoder(bytes.NewReader([]byte(body)))
	var out [][]byte
	done := false
	for {
		ev, err := d.Next()
		if err != nil {
			break
		}
		if ev.IsDone() {
			done = true
			continue
		}
		spec.Validate(t, schema, ev.Data)
		out = append(out, ev.Data)
	}
	if !done {
		t.Fatalf("stream without [DONE]: %s", body)
	}
	return out
}

// An upstream that answers a streamed request with one whole JSON answer
// (a server that does not stream, or not this request) is not a 502: the
// client gets the stream that says the same — spec-valid chunks that
// openai-go's accumulator turns into the answer, two choices and a tool
// call included, the usage chunk only when stream_options.include_usage
// asked for it — and the ledger bills the upstream's usage. Text
// completions too, and an event stream labelled text/plain is relayed as
// one.
func TestAWholeAnswerToAStreamIsStreamed(t *testing.T) {
	spec := openapitest.Load(t)
	const chat = `{"id":"chatcmpl-w","object":"chat.completion","created":1700000000,"model":"up","choices":[
		{"index":0,"message":{"role":"assistant","content":"Oslo is cold.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Oslo\"}"}}]},"finish_reason":"tool_calls","logprobs":null},
		{"index":1,"message":{"role":"assistant","content":"Rome is warm."},"finish_reason":"stop","logprobs":null}],
		"usage":{"prompt_tokens":21,"completion_tokens":13,"total_tokens":34}}`
	const text = `{"id":"cmpl-w","object":"text_completion","created":1700000000,"model":"up","choices":[{"index":0,"text":"two three","finish_reason":"length","logprobs":null}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !gjson.GetBytes(body, "stream").Bool() {
			t.Errorf("the upstream was not asked to stream: %s", body)
		}
		switch {
		case r.URL.Path == "/v1/completions":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, text)
		case gjson.GetBytes(body, "messages.0.content").Str == "plain":
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"plain\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, chat)
		}
	}))
	t.Cleanup(up.Close)
	ledger := &memLedger{}
	gw, _ := startGateway(t, setup{targets: []*route.Target{{Name: "up", Tier: "T1", Endpoint: up.URL + "/v1", Models: []string{"m"}}},
		id: &identity.Identity{Member: "ann", Ledger: ledger}})

	for _, includeUsage := range []bool{true, false} {
		t.Run(fmt.Sprintf("chat, include_usage %v", includeUsage), func(t *testing.T) {
			body := `{"model":"m","stream":true,"n":2,"messages":[{"role":"user","content":"weather?"}]}`
			if includeUsage {
				body = `{"model":"m","stream":true,"n":2,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"weather?"}]}`
			}
			r := post(t, gw.URL+"/v1/chat/completions", body)
			if r.status != 200 || r.header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d %q: %s", r.status, r.header.Get("Content-Type"), r.body)
			}
			var acc openai.ChatCompletionAccumulator
			chunks := sseChunks(t, spec, "CreateChatCompletionStreamResponse", r.body)
			for _, c := range chunks {
				var chunk openai.ChatCompletionChunk
				if err := json.Unmarshal(c, &chunk); err != nil || !acc.AddChunk(chunk) {
					t.Fatalf("the accumulator refused %s (%v)", c, err)
				}
			}
			if len(acc.Choices) != 2 || acc.Choices[0].Message.Content != "Oslo is cold." || acc.Choices[1].Message.Content != "Rome is warm." ||
				acc.Choices[0].FinishReason != "tool_calls" || acc.Choices[1].FinishReason != "stop" || len(acc.Choices[0].Message.ToolCalls) != 1 ||
				acc.Choices[0].Message.ToolCalls[0].ID != "call_1" || acc.Choices[0].Message.ToolCalls[0].Function.Arguments != `{"city":"Oslo"}` || acc.Model != "m" {
				t.Fatalf("accumulated %s", acc.RawJSON())
			}
			last := gjson.ParseBytes(chunks[len(chunks)-1])
			if gotUsage := last.Get("choices.#").Int() == 0 && last.Get("usage.total_tokens").Int() == 34; gotUsage != includeUsage {
				t.Fatalf("include_usage %v: last chunk %s", includeUsage, last.Raw)
			}
			if rec := ledger.take(); len(rec) != 1 || rec[0].PromptTokens != 21 || rec[0].CompletionTokens != 13 || rec[0].Estimated {
				t.Fatalf("billed %+v", rec)
			}
		})
	}
	t.Run("text completions", func(t *testing.T) {
		r := post(t, gw.URL+"/v1/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"prompt":"one"}`)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		chunks := sseChunks(t, spec, openapitest.CompletionChunk, r.body)
		if len(chunks) != 2 || gjson.GetBytes(chunks[0], "choices.0.text").Str != "two three" || gjson.GetBytes(chunks[0], "choices.0.finish_reason").Str != "length" ||
			gjson.GetBytes(chunks[1], "usage.completion_tokens").Int() != 2 {
			t.Fatalf("chunks %q", chunks)
		}
		ledger.take()
	})
	t.Run("an event stream labelled text/plain", func(t *testing.T) {
		r := post(t, gw.URL+"/v1/chat/completions", streamBody("plain", false))
		if r.status != 200 || sseContent(t, r.body) != "plain" {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		ledger.take()
	})
}

// An upstream's usage that is no count of tokens (negative, fractional,
// over 2^31-1, a string) reaches no client: the answer's usage, whole or
// in the stream's usage chunk, is the one Molly billed (its estimate),
// spec-valid, with total_tokens their sum (a bad count among the details
// drops the details); an honest report, with Groq's
// timing members, is passed on as it came.
func TestAnUpstreamsAbsurdUsageReachesNoClient(t *testing.T) {
	spec := openapitest.Load(t)
	usage := map[string]string{
		"negative":   `{"prompt_tokens":5,"completion_tokens":-1000000,"total_tokens":-999995}`,
		"fractional": `{"prompt_tokens":5.5,"completion_tokens":2,"total_tokens":7.5}`,
		"huge":       `{"prompt_tokens":1e30,"completion_tokens":3,"total_tokens":1e30}`,
		"maxint":     `{"prompt_tokens":9223372036854775807,"completion_tokens":1,"total_tokens":1}`,
		"string":     `{"prompt_tokens":"7","completion_tokens":"-9","total_tokens":"0"}`,
		"details":    `{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":-4}}`,
		"honest":     `{"queue_time":0.037,"prompt_tokens":6,"prompt_time":0.001,"completion_tokens":3,"completion_time":0.01,"total_tokens":9}`,
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u := usage[gjson.GetBytes(b, "messages.0.content").Str]
		if gjson.GetBytes(b, "stream").Bool() {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"up","choices":[{"index":0,"delta":{"role":"assistant","content":"fine"},"finish_reason":"stop"}],"usage":`+u+"}\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion","created":1,"model":"up","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"fine","refusal":null}}],"usage":`+u+`}`)
	}))
	t.Cleanup(up.Close)
	ledger := &memLedger{}
	gw, _ := startGateway(t, setup{targets: []*route.Target{{Name: "up", Tier: "T1", Endpoint: up.URL + "/v1", Models: []string{"m"}}},
		id: &identity.Identity{Member: "ann", Ledger: ledger}})
	for name, raw := range usage {
		for _, stream := range []bool{false, true} {
			body := `{"model":"m","messages":[{"role":"user","content":"` + name + `"}]}`
			if stream {
				body = `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"` + name + `"}]}`
			}
			r := post(t, gw.URL+"/v1/chat/completions", body)
			if r.status != 200 {
				t.Fatalf("%s stream=%v: %d %s", name, stream, r.status, r.body)
			}
			var u gjson.Result
			if stream {
				chunks := sseChunks(t, spec, "CreateChatCompletionStreamResponse", r.body)
				u = gjson.GetBytes(chunks[len(chunks)-1], "usage")
			} else {
				spec.Validate(t, "CreateChatCompletionResponse", []byte(r.body))
				u = gjson.Get(r.body, "usage")
			}
			rec := ledger.take()
			if len(rec) != 1 {
				t.Fatalf("%s stream=%v: billed %+v", name, stream, rec)
			}
			if name == "honest" {
				if rec[0].Estimated || u.Get("prompt_tokens").Raw != "6" || u.Get("completion_tokens").Raw != "3" || u.Get("queue_time").Raw != "0.037" {
					t.Fatalf("honest stream=%v: usage %s, billed %+v", stream, u.Raw, rec[0])
				}
				continue
			}
			p, c := u.Get("prompt_tokens"), u.Get("completion_tokens")
			// A bad count in the details only: the ledger believed the
			// counts, the details are dropped.
			if rec[0].Estimated != (name != "details") || p.Raw != fmt.Sprint(rec[0].PromptTokens) || c.Raw != fmt.Sprint(rec[0].CompletionTokens) ||
				u.Get("total_tokens").Raw != fmt.Sprint(rec[0].PromptTokens+rec[0].CompletionTokens) || u.Get("prompt_tokens_details").Exists() {
				t.Fatalf("%s stream=%v: the upstream said %s; the client got %s, billed %+v", name, stream, raw, u.Raw, rec[0])
			}
		}
	}
}

// An upstream that sends a message's content as an array of parts (Mistral's
// reasoning models: a thinking part, then text parts) gives the client the
// spec's string content, the text parts joined, and the thinking as
// reasoning_content, whole and streamed (openai-go's accumulator reads
// the content).
func TestContentPartsBecomeTheSpecsString(t *testing.T) {
	spec := openapitest.Load(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if gjson.GetBytes(b, "stream").Bool() {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, d := range []string{`{"role":"assistant","content":[{"type":"thinking","thinking":[{"type":"text","text":"Two and two."}]}]}`,
				`{"content":[{"type":"text","text":"Fo"}]}`, `{"content":"ur."}`} {
				fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"up","choices":[{"index":0,"delta":`+d+`,"finish_reason":null}]}`+"\n\n")
			}
			fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"up","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion","created":1,"model":"up","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant",`+
			`"content":[{"type":"thinking","thinking":[{"type":"text","text":"Two and two."}]},{"type":"text","text":"Fo"},{"type":"text","text":"ur."}]}}],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`)
	}))
	t.Cleanup(up.Close)
	gw, _ := startGateway(t, setup{targets: []*route.Target{{Name: "up", Tier: "T1", Endpoint: up.URL + "/v1", Models: []string{"m"}}}})
	r := post(t, gw.URL+"/v1/chat/completions", chatBody("2+2?"))
	spec.Validate(t, "CreateChatCompletionResponse", []byte(r.body))
	if m := gjson.Get(r.body, "choices.0.message"); m.Get("content").Str != "Four." || m.Get("reasoning_content").Str != "Two and two." {
		t.Fatalf("answer %s", r.body)
	}
	r = post(t, gw.URL+"/v1/chat/completions", streamBody("2+2?", false))
	var acc openai.ChatCompletionAccumulator
	reasoning := ""
	for _, c := range sseChunks(t, spec, "CreateChatCompletionStreamResponse", r.body) {
		var chunk openai.ChatCompletionChunk
		if err := json.Unmarshal(c, &chunk); err != nil || !acc.AddChunk(chunk) {
			t.Fatalf("the accumulator refused %s (%v)", c, err)
		}
		reasoning += gjson.GetBytes(c, "choices.0.delta.reasoning_content").Str
	}
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != "Four." || reasoning != "Two and two." {
		t.Fatalf("accumulated %s, reasoning %q", acc.RawJSON(), reasoning)
	}
}

// An upstream that streams its answer to a request that asked for none (a
// server that always streams) gives the client the whole answer that
// stream says — two choices, a tool call whose arguments came in
// fragments, the usage — spec-valid, and the ledger bills its usage.
func TestAStreamToAWholeRequestIsJoined(t *testing.T) {
	spec := openapitest.Load(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range []string{
			`{"id":"s","object":"chat.completion.chunk","created":1,"model":"up","choices":[{"index":0,"delta":{"role":"assistant","content":"Os"},"finish_reason":null},{"index":1,"delta":{"role":"assistant","content":"Ro"},"finish_reason":null}]}`,
			`{"id":"s","object":"chat.completion.chunk","created":1,"model":"up","choices":[{"index":0,"delta":{"content":"lo.","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"ci"}}]},"finish_reason":null}]}`,
			`{"id":"s","object":"chat.completion.chunk","created":1,"model":"up","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ty\":\"Oslo\"}"}}]},"finish_reason":"tool_calls"},{"index":1,"delta":{"content":"me."},"finish_reason":"stop"}]}`,
			`{"id":"s","object":"chat.completion.chunk","created":1,"model":"up","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":6,"total_tokens":15}}`,
			`[DONE]`,
		} {
			fmt.Fprint(w, "data: "+c+"\n\n")
		}
	}))
	t.Cleanup(up.Close)
	ledger := &memLedger{}
	gw, _ := startGateway(t, setup{targets: []*route.Target{{Name: "up", Tier: "T1", Endpoint: up.URL + "/v1", Models: []string{"m"}}},
		id: &identity.Identity{Member: "ann", Ledger: ledger}})
	r := post(t, gw.URL+"/v1/chat/completions", `{"model":"m","n":2,"messages":[{"role":"user","content":"weather?"}]}`)
	if r.status != 200 || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d %q: %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	spec.Validate(t, "CreateChatCompletionResponse", []byte(r.body))
	var c openai.ChatCompletion
	if err := json.Unmarshal([]byte(r.body), &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Choices) != 2 || c.Choices[0].Message.Content != "Oslo." || c.Choices[1].Message.Content != "Rome." || c.Choices[0].FinishReason != "tool_calls" ||
		len(c.Choices[0].Message.ToolCalls) != 1 || c.Choices[0].Message.ToolCalls[0].Function.Arguments != `{"city":"Oslo"}` || c.Usage.TotalTokens != 15 || c.Model != "m" {
		t.Fatalf("answer %s", r.body)
	}
	if rec := ledger.take(); len(rec) != 1 || rec[0].PromptTokens != 9 || rec[0].CompletionTokens != 6 || rec[0].Estimated {
		t.Fatalf("billed %+v", rec)
	}
}
