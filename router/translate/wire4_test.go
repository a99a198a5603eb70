package translate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
	"github.com/molly-gateway/molly/serving"
)

// messagesServer serves POST /v1/messages by the translation and a Writer,
// the chat answer being what upstream writes (the pipeline's part).
func messagesServer(t *testing.T, upstream func(w http.ResponseWriter)) anthropic.Client {
	t.Helper()
	return messagesTo(t, func(w http.ResponseWriter, _ *http.Request) { upstream(w) })
}

// messagesTo is messagesServer whose upstream is a handler of the
// translated chat request (the T0 engine).
func messagesTo(t *testing.T, upstream func(w http.ResponseWriter, r *http.Request)) anthropic.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		chat, tr, aerr := FromMessages(body)
		w := NewWriter(rw, r.Context(), APIMessages)
		if aerr != nil {
			aerr.Write(w)
			w.Finish()
			return
		}
		w.Bind(tr)
		upstream(w, httptest.NewRequestWithContext(r.Context(), http.MethodPost, "/v1/chat/completions", bytes.NewReader(chat)))
		w.Finish()
	}))
	t.Cleanup(srv.Close)
	return anthropic.NewClient(aoption.WithBaseURL(srv.URL), aoption.WithAPIKey("sk-ant-unused"), aoption.WithMaxRetries(0))
}

// An OpenAI-style upstream that streams two parallel tool calls with their
// argument fragments interleaved (index 0, 1, 0, 1, as some servers
// write them) gives the Anthropic SDK's accumulator two tool_use blocks,
// each with its whole input: the first call's fragments that come after
// the second began are not lost (Anthropic's content blocks cannot
// interleave). Text that comes after the calls began is kept too.
func TestMessagesInterleavedToolCallsKeepEveryFragment(t *testing.T) {
	chunk := func(delta, finish string) string {
		return `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}`
	}
	call := func(i int, head, args string) string {
		return chunk(`{"tool_calls":[{"index":`+string(rune('0'+i))+head+`,"function":{`+args+`}}]}`, "null")
	}
	c := messagesServer(t, writeSSE(
		chunk(`{"role":"assistant","content":"Both."}`, "null"),
		call(0, `,"id":"call_a","type":"function"`, `"name":"weather","arguments":"{\"ci"`),
		call(1, `,"id":"call_b","type":"function"`, `"name":"time","arguments":"{\"zo"`),
		call(0, ``, `"arguments":"ty\":\"Ro"`),
		call(1, ``, `"arguments":"ne\":\"CET\"}"`),
		call(0, ``, `"arguments":"me\"}"`),
		chunk(`{"content":" Done."}`, "null"),
		chunk(`{}`, `"tool_calls"`),
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}`,
		`[DONE]`))
	stream := c.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{Model: "m", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("weather and time?"))}})
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	type want struct{ typ, text, id, name, key, value string }
	wants := []want{{typ: "text", text: "Both."}, {typ: "tool_use", id: "call_a", name: "weather", key: "city", value: "Rome"},
		{typ: "tool_use", id: "call_b", name: "time", key: "zone", value: "CET"}, {typ: "text", text: " Done."}}
	if len(acc.Content) != len(wants) || acc.StopReason != anthropic.StopReasonToolUse || acc.Usage.OutputTokens != 9 {
		t.Fatalf("stop %q content %s", acc.StopReason, acc.RawJSON())
	}
	for i, w := range wants {
		b := acc.Content[i]
		if b.Type != w.typ {
			t.Fatalf("block %d: %s", i, b.RawJSON())
		}
		if w.typ == "text" {
			if b.Text != w.text {
				t.Fatalf("block %d: %s", i, b.RawJSON())
			}
			continue
		}
		var in map[string]string
		if err := json.Unmarshal(b.Input, &in); err != nil || b.ID != w.id || b.Name != w.name || len(in) != 1 || in[w.key] != w.value {
			t.Fatalf("block %d: %s (%v)", i, b.RawJSON(), err)
		}
	}
}

// demoEngine is the real T0 engine on the generated demo model, with
// reasoning delimiters and a default (medium) reasoning budget of 5 tokens.
func demoEngine(t *testing.T) *serving.Engine {
	t.Helper()
	dir := t.TempDir()
	if err := serving.WriteDemo(dir, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	cfg := serving.DemoConfig(dir)
	cfg.NSeqMax, cfg.NCtx, cfg.Threads = 2, 2048, 1
	cfg.Reasoning = serving.ReasoningConfig{Start: "[plan]", End: "[/plan]", Medium: 5}
	e, err := serving.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// Through the real T0 engine, with Anthropic's SDK: thinking's
// budget_tokens is the engine's reasoning budget (the engine's default
// is 5 tokens; the thinking block of a 1024-token budget is longer than
// 5 tokens could spell), a budget under Anthropic's minimum of 1024 is a
// 400 naming thinking.budget_tokens, and more stop_sequences than the
// engine takes is a 400 whose message names stop_sequences (the
// parameter the client sent), not chat's stop.
func TestMessagesThinkingBudgetAndStopSequencesOnTheEngine(t *testing.T) {
	eng := demoEngine(t)
	c := messagesTo(t, eng.ServeHTTP)
	ctx := context.Background()
	user := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("plan it"))}

	m, err := c.Messages.New(ctx, anthropic.MessageNewParams{Model: "molly-demo", MaxTokens: 1100, Messages: user,
		Thinking: anthropic.ThinkingConfigParamOfEnabled(1024)}, aoption.WithJSONSet("temperature", 0)) // SDK v2's params have no temperature field

	if err != nil {
		t.Fatal(err)
	}
	if len(m.Content) == 0 || m.Content[0].Type != "thinking" || len(m.Content[0].Thinking) < 256 {
		t.Fatalf("content %s", m.RawJSON())
	}

	for _, tc := range []struct {
		name   string
		params anthropic.MessageNewParams
		want   string
	}{
		{"a budget under 1024", anthropic.MessageNewParams{Model: "molly-demo", MaxTokens: 2000, Messages: user, Thinking: anthropic.ThinkingConfigParamOfEnabled(1000)}, "thinking.budget_tokens:"},
		{"five stop sequences", anthropic.MessageNewParams{Model: "molly-demo", MaxTokens: 5, Messages: user, StopSequences: []string{"a", "b", "c", "d", "e"}}, "stop_sequences:"},
	} {
		_, err := c.Messages.New(ctx, tc.params)
		var aerr *anthropic.Error
		if !errors.As(err, &aerr) || aerr.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if msg := gjson.Get(aerr.RawJSON(), "error.message").Str; !strings.HasPrefix(msg, tc.want) || gjson.Get(aerr.RawJSON(), "type").Str != "error" {
			t.Fatalf("%s: %s", tc.name, aerr.RawJSON())
		}
	}
}

// A reasoning upstream that names its reasoning "reasoning" (vLLM since
// 0.10, Ollama, OpenRouter), some with "reasoning_content": "" beside it,
// gives the Responses API its reasoning item, whole and streamed, and
// the Messages API its thinking block: the reasoning was dropped.
func TestReasoningUnderItsOtherName(t *testing.T) {
	spec := openapitest.Load(t)
	ctx := context.Background()
	const answer = `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","logprobs":null,
		"message":{"role":"assistant","content":"Four.","reasoning_content":"","reasoning":"Two and two.","refusal":null}}],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`
	chunk := func(delta, finish string) string {
		return `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}`
	}
	stream := writeSSE(chunk(`{"role":"assistant","reasoning":"Two "}`, "null"), chunk(`{"reasoning_content":"","reasoning":"and two."}`, "null"),
		chunk(`{"content":"Four."}`, "null"), chunk(`{}`, `"stop"`), `[DONE]`)

	_, tr, _ := FromResponses(ctx, []byte(`{"model":"m","input":"2+2?"}`), nil, "ana")
	r := gjson.ParseBytes(serve(t, APIResponses, tr, writeJSON(200, answer)).Body.Bytes())
	spec.Validate(t, "Response", []byte(r.Raw))
	if r.Get("output.0.type").Str != "reasoning" || r.Get("output.0.content.0.text").Str != "Two and two." || r.Get("output.1.content.0.text").Str != "Four." {
		t.Fatalf("response %s", r.Raw)
	}
	_, tr, _ = FromResponses(ctx, []byte(`{"model":"m","stream":true,"input":"2+2?"}`), nil, "ana")
	evs := events(t, serve(t, APIResponses, tr, stream).Body.Bytes())
	final := gjson.ParseBytes(evs[len(evs)-1].Data).Get("response")
	if final.Get("output.0.type").Str != "reasoning" || final.Get("output.0.content.0.text").Str != "Two and two." || final.Get("output.1.content.0.text").Str != "Four." {
		t.Fatalf("final response %s", final.Raw)
	}

	c := messagesServer(t, stream)
	st := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: "m", MaxTokens: 2048, Thinking: anthropic.ThinkingConfigParamOfEnabled(1024),
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("2+2?"))}})
	var acc anthropic.Message
	for st.Next() {
		if err := acc.Accumulate(st.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Err(); err != nil || len(acc.Content) != 2 || acc.Content[0].Thinking != "Two and two." || acc.Content[1].Text != "Four." {
		t.Fatalf("message %s (%v)", acc.RawJSON(), err)
	}
}

// A tool call whose name comes in a delta after its id (some servers send
// the id and type first) is a tool_use block with that name, not "", and
// a Responses function_call item with it.
func TestMessagesToolNameInALaterDelta(t *testing.T) {
	chunk := func(delta, finish string) string {
		return `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}`
	}
	stream := writeSSE(
		chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"arguments":""}}]}`, "null"),
		chunk(`{"tool_calls":[{"index":0,"function":{"name":"weather"}}]}`, "null"),
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":\"Oslo\"}"}}]}`, "null"),
		chunk(`{}`, `"tool_calls"`), `[DONE]`)
	_, tr, _ := FromResponses(context.Background(), []byte(`{"model":"m","stream":true,"input":"weather?"}`), nil, "ana")
	evs := events(t, serve(t, APIResponses, tr, stream).Body.Bytes())
	if final := gjson.ParseBytes(evs[len(evs)-1].Data).Get("response.output.0"); final.Get("name").Str != "weather" || final.Get("call_id").Str != "call_a" {
		t.Fatalf("function_call item %s", final.Raw)
	}
	c := messagesServer(t, stream)
	st := c.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{Model: "m", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("weather?"))}})
	var acc anthropic.Message
	for st.Next() {
		if err := acc.Accumulate(st.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Err(); err != nil || len(acc.Content) != 1 || acc.Content[0].Name != "weather" || acc.Content[0].ID != "call_a" || string(acc.Content[0].Input) != `{"city":"Oslo"}` {
		t.Fatalf("message %s (%v)", acc.RawJSON(), err)
	}
}

// The chat requests the translations make carry what the client said in
// chat completions' own terms: a Responses request's service_tier,
// safety_identifier and prompt_cache_key (chat has all three; they were
// dropped), and a Messages assistant turn of thinking blocks only is an
// empty text, not a null content without tool_calls (which OpenAI
// refuses), and a tool_choice without tools is left out (OpenAI refuses
// it too); each is a valid CreateChatCompletionRequest.
func TestTranslatedRequestsKeepTheirParameters(t *testing.T) {
	spec := openapitest.Load(t)
	chat, _, aerr := FromResponses(context.Background(), []byte(`{"model":"m","input":"hi","service_tier":"flex","safety_identifier":"s-1","prompt_cache_key":"k-1"}`), nil, "ana")
	if aerr != nil {
		t.Fatal(aerr)
	}
	spec.Validate(t, "CreateChatCompletionRequest", chat)
	if c := gjson.ParseBytes(chat); c.Get("service_tier").Str != "flex" || c.Get("safety_identifier").Str != "s-1" || c.Get("prompt_cache_key").Str != "k-1" {
		t.Fatalf("chat %s", chat)
	}
	chat, _, aerr = FromMessages([]byte(`{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"x","signature":"s"}]},{"role":"user","content":"again"}]}`))
	if aerr != nil {
		t.Fatal(aerr)
	}
	spec.Validate(t, "CreateChatCompletionRequest", chat)
	if m := gjson.GetBytes(chat, "messages.1"); m.Get("role").Str != "assistant" || m.Get("content").Type != gjson.String || m.Get("tool_calls").Exists() {
		t.Fatalf("chat %s", chat)
	}
	// A tool_choice without tools is not sent (OpenAI refuses it).
	chat, _, aerr = FromMessages([]byte(`{"model":"m","max_tokens":9,"tool_choice":{"type":"auto"},"messages":[{"role":"user","content":"hi"}]}`))
	if aerr != nil || gjson.GetBytes(chat, "tool_choice").Exists() {
		t.Fatalf("chat %s (%v)", chat, aerr)
	}
}

// An answer with tool calls that finished "stop" (OpenAI's finish for a
// forced tool_choice, Ollama's for any call) is stop_reason tool_use,
// whole and streamed, as Anthropic's API says of a turn that called tools.
func TestMessagesToolCallsThatFinishedStopAreToolUse(t *testing.T) {
	const answer = `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":null,
		"tool_calls":[{"id":"call_a","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Oslo\"}"}}]}}],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`
	ctx := context.Background()
	params := anthropic.MessageNewParams{Model: "m", MaxTokens: 64, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("weather?"))}}
	whole := messagesServer(t, writeJSON(200, answer))
	m, err := whole.Messages.New(ctx, params)
	if err != nil || m.StopReason != anthropic.StopReasonToolUse {
		t.Fatalf("message %v (%v)", m, err)
	}
	streamed := messagesServer(t, writeSSE(
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"weather","arguments":"{}"}}]},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, `[DONE]`))
	st := streamed.Messages.NewStreaming(ctx, params)
	var acc anthropic.Message
	for st.Next() {
		if err := acc.Accumulate(st.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Err(); err != nil || acc.StopReason != anthropic.StopReasonToolUse {
		t.Fatalf("streamed %s (%v)", acc.RawJSON(), err)
	}
}

// A chat refusal (message.refusal, streamed or whole) is Anthropic's
// stop_reason refusal, the refusal text its text block.
func TestMessagesRefusalIsStopReasonRefusal(t *testing.T) {
	const answer = `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":null,"refusal":"I can't help with that."}}],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`
	ctx := context.Background()
	params := anthropic.MessageNewParams{Model: "m", MaxTokens: 64, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("x"))}}
	whole := messagesServer(t, writeJSON(200, answer))
	m, err := whole.Messages.New(ctx, params)
	if err != nil || m.StopReason != anthropic.StopReasonRefusal || len(m.Content) != 1 || m.Content[0].Text != "I can't help with that." {
		t.Fatalf("message %s (%v)", m.RawJSON(), err)
	}
	streamed := messagesServer(t, writeSSE(
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","refusal":"I can't "},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"refusal":"help with that."},"finish_reason":"stop"}]}`, `[DONE]`))
	st := streamed.Messages.NewStreaming(ctx, params)
	var acc anthropic.Message
	for st.Next() {
		if err := acc.Accumulate(st.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Err(); err != nil || acc.StopReason != anthropic.StopReasonRefusal || len(acc.Content) != 1 || acc.Content[0].Text != "I can't help with that." {
		t.Fatalf("streamed %s (%v)", acc.RawJSON(), err)
	}
}
