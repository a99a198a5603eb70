package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// nullsProvider plays OpenAI-compatible servers that write every optional
// member, null when unset (LiteLLM's proxy, vLLM, Groq): a message's
// "function_call": null and "tool_calls": null, usage details null, a
// service_tier outside OpenAI's enum, logprob entries without "bytes" or
// "top_logprobs", and in streams deltas with "content": null,
// "function_call": null, "tool_calls": null and tool-call continuations
// with "id": null, "type": null and "function": {"name": null}. A prompt
// holding EMPTY is streamed as one such chunk of nulls, then [DONE]. A stream
// asked for n 2 interleaves its two choices, the second's first delta
// without a role. A prompt holding STOPAT answers as vLLM does when a stop
// string matched: finish_reason "stop" with "stop_reason" naming it.
type nullsProvider struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies [][]byte
}

func startNullsProvider(t *testing.T) *nullsProvider {
	p := &nullsProvider{}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *nullsProvider) URL() string { return p.srv.URL + "/v1" }

func (p *nullsProvider) last() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bodies[len(p.bodies)-1]
}

const nullsUsage = `{"prompt_tokens":11,"completion_tokens":4,"total_tokens":15,"prompt_tokens_details":null,"completion_tokens_details":null}`

func (p *nullsProvider) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	p.bodies = append(p.bodies, body)
	p.mu.Unlock()
	if r.URL.Path == "/v1/models" {
		_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
		return
	}
	tools := gjson.GetBytes(body, "tools").Exists()
	logprobs := gjson.GetBytes(body, "logprobs").Bool()
	stopAt := bytes.Contains(body, []byte("STOPAT"))
	lp := "null"
	if logprobs {
		lp = `{"content":[{"token":"Hi","logprob":-0.5}]}`
	}
	if !gjson.GetBytes(body, "stream").Bool() {
		msg := `{"role":"assistant","content":"Hi","tool_calls":null,"function_call":null,"audio":null}`
		finish, extra := "stop", ""
		if tools {
			msg = `{"role":"assistant","content":null,"function_call":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Rome\"}"}}]}`
			finish = "tool_calls"
		}
		if stopAt {
			extra = `,"stop_reason":"END"`
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-n1","object":"chat.completion","created":1700000000,"model":"up","service_tier":"on_demand","system_fingerprint":"fp_up","choices":[{"index":0,"message":%s,"logprobs":%s,"finish_reason":%q%s}],"usage":%s}`,
			msg, lp, finish, extra, nullsUsage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	if bytes.Contains(body, []byte("EMPTY")) {
		// A stream that ends before its first token, its one chunk all nulls.
		_, _ = io.WriteString(w, "data: "+`{"id":"chatcmpl-e","object":"chat.completion.chunk","created":1700000000,"model":"up","choices":[{"index":0,"delta":{"role":"assistant","content":null,"function_call":null,"tool_calls":null},"logprobs":null,"finish_reason":null}]}`+"\n\ndata: [DONE]\n\n")
		return
	}
	chunk := func(choices string) string {
		return "data: " + `{"id":"chatcmpl-s1","object":"chat.completion.chunk","created":1700000000,"model":"up","service_tier":"on_demand","system_fingerprint":"fp_up","choices":` + choices + "}\n\n"
	}
	var frames []string
	n := max(1, int(gjson.GetBytes(body, "n").Int()))
	for c := 0; c < n; c++ {
		role := `"role":"assistant",`
		if c > 0 {
			role = ""
		}
		frames = append(frames, chunk(fmt.Sprintf(`[{"index":%d,"delta":{%s"content":null,"function_call":null,"tool_calls":null},"logprobs":null,"finish_reason":null}]`, c, role)))
	}
	for c := 0; c < n; c++ {
		if tools {
			frames = append(frames,
				chunk(fmt.Sprintf(`[{"index":%d,"delta":{"content":null,"function_call":null,"tool_calls":[{"index":0,"id":"call_%da","type":"function","function":{"name":"weather","arguments":""}}]},"logprobs":null,"finish_reason":null}]`, c, c)),
				chunk(fmt.Sprintf(`[{"index":%d,"delta":{"content":null,"function_call":null,"tool_calls":[{"index":0,"id":null,"type":null,"function":{"name":null,"arguments":"{\"city\":\"Rome\"}"}}]},"logprobs":null,"finish_reason":null}]`, c)),
				chunk(fmt.Sprintf(`[{"index":%d,"delta":{"content":null,"function_call":null,"tool_calls":[{"index":1,"id":"call_%db","type":"function","function":{"name":"weather","arguments":""}}]},"logprobs":null,"finish_reason":null}]`, c, c)),
				chunk(fmt.Sprintf(`[{"index":%d,"delta":{"content":null,"function_call":null,"tool_calls":[{"index":1,"id":null,"type":null,"function":{"name":null,"arguments":"{\"city\":\"Oslo\"}"}}]},"logprobs":null,"finish_reason":null}]`, c)))
			continue
		}
		frames = append(frames, chunk(fmt.Sprintf(`[{"index":%d,"delta":{"content":"Hi","function_call":null,"tool_calls":null},"logprobs":%s,"finish_reason":null}]`, c, lp)))
	}
	for c := 0; c < n; c++ {
		finish, extra := "stop", ""
		if tools {
			finish = "tool_calls"
		}
		if stopAt {
			extra = `,"stop_reason":"END"`
		}
		frames = append(frames, chunk(fmt.Sprintf(`[{"index":%d,"delta":{"content":null,"function_call":null,"tool_calls":null},"logprobs":null,"finish_reason":%q%s}]`, c, finish, extra)))
	}
	frames = append(frames, "data: "+`{"id":"chatcmpl-s1","object":"chat.completion.chunk","created":1700000000,"model":"up","choices":[],"usage":`+nullsUsage+"}\n\n", "data: [DONE]\n\n")
	rc := http.NewResponseController(w)
	for _, f := range frames {
		_, _ = io.WriteString(w, f)
		_ = rc.Flush()
	}
}

func nullsCaddyfile(p *nullsProvider) string {
	return `{
	admin off
	auto_https off
	persist_config off
	molly {
		target lan {
			tier T1
			endpoint ` + p.URL() + `
			models chat=up claude=up meta-llama/Llama-3.1-8B=up
			modalities text image
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_policy
	molly_route
}
`
}

// TestWireNullMembersOfCompatibleServers sends the shapes of servers that
// write optional members as null through Molly and checks each body and
// chunk against OpenAI's spec and the SDK's accumulator.
func TestWireNullMembersOfCompatibleServers(t *testing.T) {
	spec := openapitest.Load(t)
	p := startNullsProvider(t)
	g := startMolly(t, nullsCaddyfile(p))
	const tools = `"tools":[{"type":"function","function":{"name":"weather","parameters":{"type":"object"}}}]`

	t.Run("whole answers", func(t *testing.T) {
		for _, body := range []string{
			`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"chat","logprobs":true,"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"chat",` + tools + `,"messages":[{"role":"user","content":"weather?"}]}`,
		} {
			resp, b := do(t, g, "POST", "/v1/chat/completions", body)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			spec.Validate(t, "CreateChatCompletionResponse", b)
		}
	})
	t.Run("streams, n 2, parallel calls, logprobs and usage", func(t *testing.T) {
		for _, body := range []string{
			`{"model":"chat","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"chat","stream":true,"n":2,"logprobs":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"chat","stream":true,"n":2,"stream_options":{"include_usage":true},` + tools + `,"messages":[{"role":"user","content":"weather?"}]}`,
		} {
			resp, b := do(t, g, "POST", "/v1/chat/completions", body)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			validateChatStream(t, spec, b)
		}
	})
	t.Run("json_schema, seed, stop, service_tier and n reach the upstream as the SDK sent them", func(t *testing.T) {
		c := client(g)
		params := openai.ChatCompletionNewParams{Model: "chat", Seed: openai.Int(7), N: openai.Int(2), ServiceTier: openai.ChatCompletionNewParamsServiceTierFlex,
			Stop:     openai.ChatCompletionNewParamsStopUnion{OfStringArray: []string{"END", "STOP"}},
			Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("a city as JSON")},
			ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &openai.ResponseFormatJSONSchemaParam{JSONSchema: openai.ResponseFormatJSONSchemaJSONSchemaParam{
				Name: "city", Strict: openai.Bool(true), Schema: map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string"}}, "required": []string{"name"}, "additionalProperties": false}}}}}
		r, err := c.Chat.Completions.New(context.Background(), params)
		if err != nil {
			t.Fatal(err)
		}
		sent := gjson.ParseBytes(p.last())
		if sent.Get("seed").Int() != 7 || sent.Get("n").Int() != 2 || sent.Get("service_tier").Str != "flex" || sent.Get("stop").Raw != `["END","STOP"]` ||
			sent.Get("response_format.type").Str != "json_schema" || sent.Get("response_format.json_schema.name").Str != "city" || !sent.Get("response_format.json_schema.strict").Bool() ||
			sent.Get("response_format.json_schema.schema.additionalProperties").Raw != "false" || sent.Get("model").Str != "up" {
			t.Fatalf("sent upstream: %s", sent.Raw)
		}
		if r.SystemFingerprint != "fp_up" || r.Model != "chat" || r.ServiceTier != "" {
			t.Fatalf("answer %s", r.RawJSON())
		}
	})
	t.Run("the SDK's accumulator: two choices, each with its two calls", func(t *testing.T) {
		c := client(g)
		stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "chat", N: openai.Int(2),
			Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("weather?")},
			Tools:         []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "weather"})},
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			if !acc.AddChunk(stream.Current()) {
				t.Fatalf("the accumulator refused a chunk: %s", stream.Current().RawJSON())
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Choices) != 2 {
			t.Fatalf("%d choices", len(acc.Choices))
		}
		for i, ch := range acc.Choices {
			calls := ch.Message.ToolCalls
			if ch.Message.Role != "assistant" || ch.FinishReason != "tool_calls" || len(calls) != 2 ||
				calls[0].ID != fmt.Sprintf("call_%da", i) || calls[0].Function.Name != "weather" || calls[0].Function.Arguments != `{"city":"Rome"}` ||
				calls[1].ID != fmt.Sprintf("call_%db", i) || calls[1].Function.Name != "weather" || calls[1].Function.Arguments != `{"city":"Oslo"}` {
				t.Fatalf("choice %d: %+v", i, ch)
			}
		}
		if acc.Usage.TotalTokens != 15 || acc.SystemFingerprint != "fp_up" {
			t.Fatalf("usage %+v fingerprint %q", acc.Usage, acc.SystemFingerprint)
		}
	})
}

// anthropicClient is Anthropic's Go SDK pointed at the gateway.
func anthropicClient(g *gateway) anthropic.Client {
	return anthropic.NewClient(aoption.WithBaseURL(strings.TrimSuffix(g.URL, "/v1")), aoption.WithAPIKey("sk-ant-unused"), aoption.WithMaxRetries(0))
}

// TestWireMessagesWithAnthropicsSDK checks /v1/messages with Anthropic's
// own Go SDK: its stream accumulator, stop_sequence, system blocks and
// image blocks as sent on, count_tokens.
func TestWireMessagesWithAnthropicsSDK(t *testing.T) {
	p := startNullsProvider(t)
	g := startMolly(t, nullsCaddyfile(p))
	c := anthropicClient(g)
	ctx := context.Background()
	weather := anthropic.ToolUnionParam{OfTool: &anthropic.ToolParam{Name: "weather", InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"city": map[string]any{"type": "string"}}}}}

	t.Run("a streamed answer with two tool_use blocks accumulates to the whole answer", func(t *testing.T) {
		params := anthropic.MessageNewParams{Model: "claude", MaxTokens: 64, Tools: []anthropic.ToolUnionParam{weather},
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("weather?"))}}
		whole, err := c.Messages.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		stream := c.Messages.NewStreaming(ctx, params)
		var acc anthropic.Message
		var types []string
		for stream.Next() {
			ev := stream.Current()
			types = append(types, ev.Type)
			if err := acc.Accumulate(ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if types[0] != "message_start" || types[len(types)-1] != "message_stop" || types[len(types)-2] != "message_delta" {
			t.Fatalf("event order %v", types)
		}
		if acc.StopReason != anthropic.StopReasonToolUse || len(acc.Content) != 2 {
			t.Fatalf("stop %q content %s", acc.StopReason, acc.RawJSON())
		}
		for i, city := range []string{"Rome", "Oslo"} {
			tu := acc.Content[i].AsToolUse()
			var in map[string]string
			if err := json.Unmarshal(tu.Input, &in); err != nil || tu.Name != "weather" || in["city"] != city || tu.ID != fmt.Sprintf("call_0%c", 'a'+i) {
				t.Fatalf("block %d: %s (%v)", i, acc.Content[i].RawJSON(), err)
			}
		}
		if whole.StopReason != anthropic.StopReasonToolUse || whole.Usage.InputTokens != 11 || acc.Usage.OutputTokens != whole.Usage.OutputTokens {
			t.Fatalf("whole %s; streamed usage %+v", whole.RawJSON(), acc.Usage)
		}
	})
	t.Run("a stop sequence that ended the answer is stop_reason stop_sequence, naming it", func(t *testing.T) {
		params := anthropic.MessageNewParams{Model: "claude", MaxTokens: 64, StopSequences: []string{"NEVER", "END"},
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("count then STOPAT"))}}
		m, err := c.Messages.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if m.StopReason != anthropic.StopReasonStopSequence || m.StopSequence != "END" {
			t.Fatalf("whole: stop_reason %q stop_sequence %q", m.StopReason, m.StopSequence)
		}
		stream := c.Messages.NewStreaming(ctx, params)
		var acc anthropic.Message
		for stream.Next() {
			if err := acc.Accumulate(stream.Current()); err != nil {
				t.Fatal(err)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if acc.StopReason != anthropic.StopReasonStopSequence || acc.StopSequence != "END" {
			t.Fatalf("streamed: stop_reason %q stop_sequence %q", acc.StopReason, acc.StopSequence)
		}
		// Without a stop string named, an ordinary stop is end_turn.
		m, err = c.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude", MaxTokens: 64,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
		if err != nil {
			t.Fatal(err)
		}
		if m.StopReason != anthropic.StopReasonEndTurn || m.StopSequence != "" {
			t.Fatalf("stop_reason %q stop_sequence %q", m.StopReason, m.StopSequence)
		}
	})
	t.Run("system blocks stay apart, an image block is sent as an image part", func(t *testing.T) {
		_, err := c.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude", MaxTokens: 16,
			System: []anthropic.TextBlockParam{{Text: "You are terse."}, {Text: "Answer in Italian."}},
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("what is this?"),
				anthropic.NewImageBlockBase64("image/png", "iVBORw0KGgo="))}})
		if err != nil {
			t.Fatal(err)
		}
		sent := gjson.ParseBytes(p.last())
		sys := sent.Get("messages.0")
		if sys.Get("role").Str != "system" || !strings.Contains(sys.Get("content").String(), "You are terse.") ||
			strings.Contains(sys.Get("content").String(), "terse.Answer") {
			t.Fatalf("system message sent: %s", sys.Raw)
		}
		if u := sent.Get("messages.1.content.1"); u.Get("type").Str != "image_url" || u.Get("image_url.url").Str != "data:image/png;base64,iVBORw0KGgo=" {
			t.Fatalf("user message sent: %s", sent.Get("messages.1").Raw)
		}
	})
	t.Run("count_tokens", func(t *testing.T) {
		n, err := c.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: "claude",
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello there"))}})
		if err != nil {
			t.Fatal(err)
		}
		if n.InputTokens <= 0 {
			t.Fatalf("input_tokens %d", n.InputTokens)
		}
	})
	t.Run("errors are Anthropic's, the SDK reads their type", func(t *testing.T) {
		_, err := c.Messages.New(ctx, anthropic.MessageNewParams{Model: "nope", MaxTokens: 16,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
		var e *anthropic.Error
		if !errors.As(err, &e) || e.StatusCode != 404 || gjson.Get(e.RawJSON(), "error.type").Str != "not_found_error" {
			t.Fatalf("%v", err)
		}
	})
}

// TestWireResponsesStreamOfParallelCalls streams a Responses answer made of
// two function calls from a server writing nulls, every event checked
// against the spec, the SDK's completed Response holding both calls.
func TestWireResponsesStreamOfParallelCalls(t *testing.T) {
	spec := openapitest.Load(t)
	p := startNullsProvider(t)
	g := startMolly(t, nullsCaddyfile(p))
	c := client(g)
	stream := c.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{Model: "chat",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("weather?")},
		Tools: []responses.ToolUnionParam{{OfFunction: &responses.FunctionToolParam{Name: "weather", Parameters: map[string]any{"type": "object"}}}}})
	var done *responses.Response
	for stream.Next() {
		ev := stream.Current()
		spec.Validate(t, "ResponseStreamEvent", []byte(ev.RawJSON()))
		if ev.Type == "response.completed" {
			r := ev.Response
			done = &r
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if done == nil {
		t.Fatal("no response.completed")
	}
	spec.Validate(t, "Response", []byte(done.RawJSON()))
	var calls []string
	for _, o := range done.Output {
		if o.Type == "function_call" {
			calls = append(calls, o.CallID+" "+o.Arguments.OfString)
		}
	}
	if strings.Join(calls, ", ") != `call_0a {"city":"Rome"}, call_0b {"city":"Oslo"}` {
		t.Fatalf("calls %q in %s", calls, done.RawJSON())
	}
}

// TestWireEngineStreamsOfSeveralChoices: the T0 engine's streams with n 2,
// logprobs and top_logprobs, chat and legacy completions, every chunk
// valid, the SDK's accumulator seeing both choices.
func TestWireEngineStreamsOfSeveralChoices(t *testing.T) {
	spec := openapitest.Load(t)
	g := startEngineMolly(t, "tiny", 1024, "")
	_, b := do(t, g, "POST", "/v1/chat/completions", `{"model":"chat","n":2,"stream":true,"logprobs":true,"top_logprobs":2,"max_tokens":3,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	validateChatStream(t, spec, b)
	_, b = do(t, g, "POST", "/v1/completions", `{"model":"chat","n":2,"stream":true,"logprobs":2,"max_tokens":3,"prompt":"once"}`)
	for _, ev := range sseEvents(t, b) {
		if !ev.IsDone() {
			spec.ValidateCompletionChunk(t, ev.Data)
		}
	}
	c := client(g)
	stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "chat", N: openai.Int(2), MaxTokens: openai.Int(3),
		Logprobs: openai.Bool(true), TopLogprobs: openai.Int(2), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("the accumulator refused %s", stream.Current().RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 2 {
		t.Fatalf("%d choices", len(acc.Choices))
	}
	for i, ch := range acc.Choices {
		if ch.FinishReason != "length" || len(ch.Logprobs.Content) != 3 || len(ch.Logprobs.Content[0].TopLogprobs) != 2 {
			t.Fatalf("choice %d: finish %q, %d logprobs", i, ch.FinishReason, len(ch.Logprobs.Content))
		}
	}
}

// TestWireEngineRefusesParametersItDoesNotServe: through the gateway, the
// T0 engine's refusal of a parameter of the API it does not serve (echo
// and suffix on completions, shortened embeddings) reaches the official
// SDK as OpenAI's 400 invalid_request_error with param naming it and code
// unsupported_parameter, a valid ErrorResponse.
func TestWireEngineRefusesParametersItDoesNotServe(t *testing.T) {
	spec := openapitest.Load(t)
	g := startEngineMolly(t, "tiny", 1024, "")
	c := client(g)
	ctx := context.Background()
	prompt := openai.CompletionNewParamsPromptUnion{OfString: openai.String("once")}
	for param, err := range map[string]error{
		"echo": func() error {
			_, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "chat", Prompt: prompt, Echo: openai.Bool(true), MaxTokens: openai.Int(2)})
			return err
		}(),
		"suffix": func() error {
			_, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "chat", Prompt: prompt, Suffix: openai.String("the end"), MaxTokens: openai.Int(2)})
			return err
		}(),
		"dimensions": func() error {
			_, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "chat", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}, Dimensions: openai.Int(1)})
			return err
		}(),
	} {
		var ae *openai.Error
		if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest || ae.Type != "invalid_request_error" || ae.Param != param || ae.Code != "unsupported_parameter" {
			t.Errorf("%s: %v, want 400 invalid_request_error param %s code unsupported_parameter", param, err, param)
			continue
		}
		spec.Validate(t, "ErrorResponse", []byte(`{"error":`+ae.RawJSON()+`}`))
	}
}

// TestWireStreamOfNullsIsNotContent: a stream whose only chunk is a role
// and nulls ("tool_calls": null) ended before its first token, so the next
// candidate answers, as for any empty stream.
func TestWireStreamOfNullsIsNotContent(t *testing.T) {
	p := startNullsProvider(t)
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	cfg := strings.Replace(nullsCaddyfile(p), "\t\t\tmodalities text image\n", "\t\t\tmodalities text image\n\t\t\tquality 0.9\n\t\t}\n\t\ttarget second {\n\t\t\ttier T1\n\t\t\tendpoint "+lan.URL()+"\n\t\t\tmodels chat=small\n\t\t\tquality 0.1\n", 1)
	g := startMolly(t, cfg)
	resp, b := do(t, g, "POST", "/v1/chat/completions", `{"model":"chat","stream":true,"messages":[{"role":"user","content":"EMPTY please"}]}`)
	var text string
	for _, ev := range sseEvents(t, b) {
		if !ev.IsDone() {
			text += gjson.GetBytes(ev.Data, "choices.0.delta.content").Str
		}
	}
	if resp.StatusCode != 200 || text != "lan says: EMPTY please" || !strings.HasPrefix(resp.Header.Get("X-Molly-Target"), "second") {
		t.Fatalf("%d target %q route %q text %q\n%s", resp.StatusCode, resp.Header.Get("X-Molly-Target"), resp.Header.Get("X-Molly-Route"), text, b)
	}
}

// TestWireModelNamedWithASlash: a model named as Hugging Face names them
// ("org/model") is listed by /v1/models and retrieved by the SDK's
// Models.Get, escaped or not; an unknown one is the 404 model_not_found.
func TestWireModelNamedWithASlash(t *testing.T) {
	spec := openapitest.Load(t)
	p := startNullsProvider(t)
	g := startMolly(t, nullsCaddyfile(p))
	c := client(g)
	m, err := c.Models.Get(context.Background(), "meta-llama/Llama-3.1-8B")
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != "meta-llama/Llama-3.1-8B" {
		t.Fatalf("model %s", m.RawJSON())
	}
	for _, path := range []string{"/v1/models/meta-llama/Llama-3.1-8B", "/v1/models/meta-llama%2FLlama-3.1-8B"} {
		resp, b := do(t, g, "GET", path, ``)
		if resp.StatusCode != 200 || gjson.GetBytes(b, "id").Str != "meta-llama/Llama-3.1-8B" {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		spec.Validate(t, "Model", b)
	}
	resp, b := do(t, g, "GET", "/v1/models/meta-llama/nope", ``)
	if resp.StatusCode != 404 || gjson.GetBytes(b, "error.code").Str != "model_not_found" {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	spec.Validate(t, "ErrorResponse", b)
}

// TestWireMessagesStopSequenceOnTheEngine: the T0 engine names the stop
// string that ended its answer, so a Messages answer that a stop sequence
// ended says stop_sequence and which, whole and streamed (Anthropic's Go
// SDK reading both). The oracle is the engine's own greedy answer without
// stop sequences, cut at the sequence.
func TestWireMessagesStopSequenceOnTheEngine(t *testing.T) {
	g := startEngineMolly(t, "tiny", 1024, "")
	c := anthropicClient(g)
	ctx := context.Background()
	params := anthropic.MessageNewParams{Model: "chat", MaxTokens: 24,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("stop test"))}}
	// Greedy: SDK v2's params have no temperature field; the API still takes it.
	greedy := aoption.WithJSONSet("temperature", 0)
	full, err := c.Messages.New(ctx, params, greedy)
	if err != nil {
		t.Fatal(err)
	}
	text := full.Content[0].AsText().Text
	if len(text) < 8 {
		t.Fatalf("greedy answer too short: %q", text)
	}
	stop := text[4:7]
	params.StopSequences = []string{"\x00never", stop}
	m, err := c.Messages.New(ctx, params, greedy)
	if err != nil {
		t.Fatal(err)
	}
	want := text[:strings.Index(text, stop)]
	if m.StopReason != anthropic.StopReasonStopSequence || m.StopSequence != stop || (want != "" && m.Content[0].AsText().Text != want) {
		t.Fatalf("stop_reason %q stop_sequence %q text %q, want stop_sequence %q text %q", m.StopReason, m.StopSequence, m.RawJSON(), stop, want)
	}
	stream := c.Messages.NewStreaming(ctx, params, greedy)
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.StopReason != anthropic.StopReasonStopSequence || acc.StopSequence != stop {
		t.Fatalf("streamed: stop_reason %q stop_sequence %q", acc.StopReason, acc.StopSequence)
	}
}
