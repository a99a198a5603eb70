package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/router/relay"
	"github.com/molly-gateway/molly/serving"
)

// provider plays an OpenAI-compatible server with the quirks seen in the
// field that OpenAI's spec does not allow: no created, system_fingerprint
// null, no refusal or logprobs, its own model name, no role on the first
// delta, two parallel tool calls streamed both with index 0, prompt tokens
// reported on the first chunk and completion tokens on the finish chunk,
// keep-alive event frames, id:/retry: lines, CRLF line ends and a frame
// that is not JSON. A prompt holding RATE is answered 429 with
// Retry-After: 7; one holding SLOW waits until the caller gives up; one
// holding FAILIN200 is answered 200 with an error object.
type provider struct {
	srv   *httptest.Server
	mu    sync.Mutex
	heads []http.Header
}

func startProvider(t *testing.T) *provider {
	p := &provider{}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *provider) URL() string { return p.srv.URL + "/v1" }

func (p *provider) headers() []http.Header {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]http.Header(nil), p.heads...)
}

func (p *provider) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	p.heads = append(p.heads, r.Header.Clone())
	p.mu.Unlock()
	switch {
	case bytes.Contains(body, []byte("RATE")):
		w.Header().Set("Retry-After", "7")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}`)
		return
	case bytes.Contains(body, []byte("FAILIN200")):
		// A router relaying a provider's failure with HTTP 200.
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"error":{"message":"provider returned error","code":502}}`)
		return
	case bytes.Contains(body, []byte("SLOW")):
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return
	}
	tools := gjson.GetBytes(body, "tools").Exists()
	if !gjson.GetBytes(body, "stream").Bool() {
		msg := `{"role":"assistant","content":"Let me check."}`
		finish := "stop"
		if tools {
			msg = `{"role":"assistant","content":null,"tool_calls":[{"id":"call_a","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Rome\"}"}}]}`
			finish = "tool_calls"
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"gen-1","object":"chat.completion","model":"up-model","system_fingerprint":null,"choices":[{"index":0,"finish_reason":%q,"message":%s}],"usage":{"prompt_tokens":9,"completion_tokens":3}}`, finish, msg)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	chunk := func(choices, extra string) string {
		return `{"id":"gen-2","object":"chat.completion.chunk","created":42,"model":"up-model","system_fingerprint":null,"choices":` + choices + extra + `}`
	}
	frames := []string{
		": OPENROUTER PROCESSING\n\n",
		"event: ping\ndata: {\"type\":\"ping\"}\n\n",
		"id: 1\r\nretry: 3000\r\ndata: " + chunk(`[{"index":0,"delta":{"content":"Let me check."},"finish_reason":null}]`, `,"usage":{"prompt_tokens":7,"completion_tokens":0}`) + "\r\n\r\n",
		"data: {not json\n\n",
	}
	if tools {
		frames = append(frames,
			"data: "+chunk(`[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"weather","arguments":"{\"city\":"}}]},"finish_reason":null}]`, "")+"\n\n",
			"data: "+chunk(`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Rome\"}"}}]},"finish_reason":null}]`, "")+"\n\n",
			"data: "+chunk(`[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_b","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Oslo\"}"}}]},"finish_reason":null}]`, "")+"\n\n",
		)
	}
	frames = append(frames,
		"event: keep-alive\ndata: {}\n\n",
		"data: "+chunk(`[{"index":0,"delta":{},"finish_reason":"`+map[bool]string{true: "tool_calls", false: "stop"}[tools]+`"}]`, `,"usage":{"prompt_tokens":0,"completion_tokens":5}`)+"\n\n",
		"data: [DONE]\n\n")
	rc := http.NewResponseController(w)
	for _, f := range frames {
		_, _ = io.WriteString(w, f)
		_ = rc.Flush()
	}
}

// wireCaddyfile has the provider as T3 ("chat"), upstreamtest as T1
// ("lan-chat", embeddings), a target lacking tools ("notools"), a target
// with a short timeout ("slow"), and optionally the engine as T0 ("local").
func wireCaddyfile(p *provider, lan *upstreamtest.Upstream, engine string) string {
	return `{
	admin off
	auto_https off
	persist_config off
	molly {
		` + engine + `
		target provider {
			tier T3
			endpoint ` + p.URL() + `
			models chat=up-model slow=up-model
			price 0.15 0.6
			quality 0.9
		}
		target lan {
			tier T1
			endpoint ` + lan.URL() + `
			models lan-chat=small text-embedding-3-small
			quality 0.6
		}
		target basic {
			tier T1
			endpoint ` + lan.URL() + `
			models notools=small
			capabilities logprobs
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_health
	molly_classify
	molly_policy
	molly_route
}
`
}

// do posts body to path under the gateway and returns the answer.
func do(t *testing.T, g *gateway, method, path, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, strings.TrimSuffix(g.URL, "/v1")+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// sseEvents decodes a stream with Molly's one decoder.
func sseEvents(t *testing.T, body []byte) []relay.Event {
	t.Helper()
	d := relay.NewDecoder(bytes.NewReader(body))
	var out []relay.Event
	for {
		ev, err := d.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("decoding the stream: %v\n%s", err, body)
		}
		out = append(out, ev)
	}
}

// validateChatStream checks every chunk of a chat stream against the spec
// and that no event:, id: or retry: line reached the client; it returns
// the chunks (without [DONE]).
func validateChatStream(t *testing.T, spec *openapitest.Spec, body []byte) []string {
	t.Helper()
	for _, line := range strings.Split(string(body), "\n") {
		for _, f := range []string{"event:", "id:", "retry:"} {
			if strings.HasPrefix(line, f) {
				t.Fatalf("an upstream %q line reached the client: %q", f, line)
			}
		}
	}
	var chunks []string
	done := false
	for _, ev := range sseEvents(t, body) {
		if ev.IsDone() {
			done = true
			continue
		}
		spec.Validate(t, "CreateChatCompletionStreamResponse", ev.Data)
		chunks = append(chunks, string(ev.Data))
	}
	if !done {
		t.Fatalf("no [DONE]: %s", body)
	}
	return chunks
}

func TestWireEveryAnswerIsSpecValid(t *testing.T) {
	spec := openapitest.Load(t)
	p := startProvider(t)
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	models := t.TempDir()
	if err := serving.WriteDemo(models, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	engine := `engine {
			model ` + filepath.Join(models, serving.DemoModelFile) + `
			n_seq_max 2
			n_ctx 1024
			threads 1
		}
		target device {
			tier T0
			kind engine
			models local=molly-demo
		}`
	g := startMolly(t, wireCaddyfile(p, lan, engine))
	const tools = `"tools":[{"type":"function","function":{"name":"weather","parameters":{"type":"object"}}}]`

	t.Run("a relayed answer the provider left short", func(t *testing.T) {
		resp, b := do(t, g, "POST", "/v1/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`)
		spec.Validate(t, "CreateChatCompletionResponse", b)
		if resp.StatusCode != 200 || gjson.GetBytes(b, "model").Str != "chat" || gjson.GetBytes(b, "usage.total_tokens").Int() != 12 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	})
	t.Run("a relayed stream with every quirk, and usage asked for", func(t *testing.T) {
		resp, b := do(t, g, "POST", "/v1/chat/completions", `{"model":"chat","stream":true,"stream_options":{"include_usage":true},`+tools+`,"messages":[{"role":"user","content":"weather?"}]}`)
		chunks := validateChatStream(t, spec, b)
		// The provider sends no Cache-Control; an event stream must not be
		// cached or buffered on the way (the engine's streams say so too).
		if cc := resp.Header.Get("Cache-Control"); cc != "no-cache" {
			t.Fatalf("a relayed stream with Cache-Control %q, want no-cache", cc)
		}
		if !strings.HasPrefix(string(b), ": OPENROUTER PROCESSING\n") {
			t.Fatalf("the provider's comment did not pass: %q", b[:min(len(b), 80)])
		}
		first, last := gjson.Parse(chunks[0]), gjson.Parse(chunks[len(chunks)-1])
		if first.Get("choices.0.delta.role").Str != "assistant" || first.Get("model").Str != "chat" {
			t.Fatalf("first chunk %s", chunks[0])
		}
		if last.Get("choices.#").Int() != 0 || last.Get("usage.prompt_tokens").Int() != 7 || last.Get("usage.completion_tokens").Int() != 5 || last.Get("usage.total_tokens").Int() != 12 {
			t.Fatalf("last chunk %s", chunks[len(chunks)-1])
		}
		for _, c := range chunks[:len(chunks)-1] {
			if u := gjson.Get(c, "usage"); u.Raw != "null" {
				t.Fatalf("usage %q outside the last chunk, want null (OpenAI's include_usage): %s", u.Raw, c)
			}
		}
		if !g.waitLogs(regexp.MustCompile(`dropping a malformed stream event.*"reason":"not_json"`)) {
			t.Fatal("the frame that is not JSON was not logged")
		}
	})
	t.Run("the SDK's stream accumulator sees both parallel calls and the merged usage", func(t *testing.T) {
		c := client(g)
		stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "chat",
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
		calls := acc.Choices[0].Message.ToolCalls
		if len(calls) != 2 || calls[0].Function.Arguments != `{"city":"Rome"}` || calls[1].ID != "call_b" || calls[1].Function.Arguments != `{"city":"Oslo"}` {
			t.Fatalf("tool calls %+v", calls)
		}
		if acc.Usage.PromptTokens != 7 || acc.Usage.CompletionTokens != 5 || acc.Model != "chat" {
			t.Fatalf("usage %+v model %q", acc.Usage, acc.Model)
		}
	})
	t.Run("without include_usage no chunk carries usage", func(t *testing.T) {
		_, b := do(t, g, "POST", "/v1/chat/completions", `{"model":"chat","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
		for _, c := range validateChatStream(t, spec, b) {
			if gjson.Get(c, "usage").Exists() || gjson.Get(c, "choices.#").Int() == 0 {
				t.Fatalf("chunk %s", c)
			}
		}
	})
	t.Run("completions, embeddings and models", func(t *testing.T) {
		_, b := do(t, g, "POST", "/v1/completions", `{"model":"lan-chat","prompt":"say hi"}`)
		spec.Validate(t, "CreateCompletionResponse", b)
		_, b = do(t, g, "POST", "/v1/embeddings", `{"model":"text-embedding-3-small","input":"embed me"}`)
		spec.Validate(t, "CreateEmbeddingResponse", b)
		_, b = do(t, g, "GET", "/v1/models", ``)
		spec.Validate(t, "ListModelsResponse", b)
		_, b = do(t, g, "GET", "/v1/models/chat", ``)
		spec.Validate(t, "Model", b)
	})
	t.Run("the T0 engine's answers, whole and streamed", func(t *testing.T) {
		_, b := do(t, g, "POST", "/v1/chat/completions", `{"model":"local","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
		spec.Validate(t, "CreateChatCompletionResponse", b)
		_, b = do(t, g, "POST", "/v1/chat/completions", `{"model":"local","max_tokens":4,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
		chunks := validateChatStream(t, spec, b)
		if u := gjson.Get(chunks[len(chunks)-1], "usage.completion_tokens").Int(); u != 4 {
			t.Fatalf("the engine's usage: %d completion tokens", u)
		}
		for _, c := range chunks[:len(chunks)-1] {
			if u := gjson.Get(c, "usage"); u.Raw != "null" {
				t.Fatalf("the engine's chunk has usage %q, want null before the usage chunk: %s", u.Raw, c)
			}
		}
		_, b = do(t, g, "POST", "/v1/completions", `{"model":"local","max_tokens":3,"prompt":"once upon"}`)
		spec.Validate(t, "CreateCompletionResponse", b)
		// Tools and embeddings on the engine (its Capabilities).
		toolsReq := `{"model":"local","max_tokens":200,"tool_choice":"required",` + tools + `,"messages":[{"role":"user","content":"weather?"}]`
		_, b = do(t, g, "POST", "/v1/chat/completions", toolsReq+`}`)
		spec.Validate(t, "CreateChatCompletionResponse", b)
		if f := gjson.GetBytes(b, "choices.0.finish_reason").Str; f != "tool_calls" && f != "length" {
			t.Fatalf("tool_choice required on the engine: %s", b)
		}
		_, b = do(t, g, "POST", "/v1/chat/completions", toolsReq+`,"stream":true}`)
		validateChatStream(t, spec, b)
		_, b = do(t, g, "POST", "/v1/embeddings", `{"model":"local","input":["x","y"]}`)
		spec.Validate(t, "CreateEmbeddingResponse", b)
		_, b = do(t, g, "POST", "/v1/completions", `{"model":"local","max_tokens":3,"stream":true,"prompt":"once upon"}`)
		for _, ev := range sseEvents(t, b) {
			if !ev.IsDone() {
				spec.ValidateCompletionChunk(t, ev.Data)
				if gjson.GetBytes(ev.Data, "usage").Exists() {
					t.Fatalf("usage on a completion chunk without include_usage: %s", ev.Data)
				}
			}
		}
		_, b = do(t, g, "POST", "/v1/completions", `{"model":"local","max_tokens":3,"stream":true,"stream_options":{"include_usage":true},"prompt":"once upon"}`)
		evs := sseEvents(t, b)
		for i, ev := range evs {
			if ev.IsDone() {
				continue
			}
			spec.ValidateCompletionChunk(t, ev.Data)
			u := gjson.GetBytes(ev.Data, "usage")
			if usageChunk := i == len(evs)-2; usageChunk != u.IsObject() || !usageChunk && u.Raw != "null" {
				t.Fatalf("completion chunk %d of %d has usage %q: want null, an object on the last before [DONE]", i, len(evs), u.Raw)
			}
		}
	})
	t.Run("errors", func(t *testing.T) {
		for _, c := range []struct{ method, path, body string }{
			{"POST", "/v1/chat/completions", `{"model":`},
			{"POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`},
			{"POST", "/v1/chat/completions", `{"model":"local","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`},
			{"POST", "/v1/chat/completions", `{"model":"local","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"array","uniqueItems":true}}}}`},
			{"GET", "/v1/models/nope", ``},
			{"POST", "/v1/nothing", `{}`},
		} {
			resp, b := do(t, g, c.method, c.path, c.body)
			if resp.StatusCode < 400 {
				t.Fatalf("%s %s: %d", c.method, c.path, resp.StatusCode)
			}
			spec.Validate(t, "ErrorResponse", b)
		}
	})
}

func TestWireErrorsClientsCanActOn(t *testing.T) {
	p := startProvider(t)
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	cfg := strings.Replace(wireCaddyfile(p, lan, ""), "models chat=up-model slow=up-model", "models chat=up-model slow=up-model\n\t\t\ttimeout 300ms", 1)
	g := startMolly(t, cfg)
	c := client(g)
	ctx := context.Background()
	apiErr := func(err error) *openai.Error {
		t.Helper()
		var e *openai.Error
		if !errors.As(err, &e) {
			t.Fatalf("want an API error, got %v", err)
		}
		return e
	}

	t.Run("an upstream 429 is a 429 with its Retry-After", func(t *testing.T) {
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("RATE me")}})
		e := apiErr(err)
		if e.StatusCode != 429 || e.Code != "rate_limit_exceeded" || e.Response.Header.Get("Retry-After") != "7" {
			t.Fatalf("%d %s Retry-After %q", e.StatusCode, e.RawJSON(), e.Response.Header.Get("Retry-After"))
		}
	})
	t.Run("an error object in a 200 is a failed attempt, not an answer", func(t *testing.T) {
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("FAILIN200")}})
		if e := apiErr(err); e.StatusCode != 503 || e.Code != "no_target_available" {
			t.Fatalf("%d %s", e.StatusCode, e.RawJSON())
		}
		resp, b := do(t, g, "POST", "/v1/messages", `{"model":"chat","max_tokens":5,"messages":[{"role":"user","content":"FAILIN200"}]}`)
		if resp.StatusCode != 529 || gjson.GetBytes(b, "type").Str != "error" || gjson.GetBytes(b, "error.type").Str != "overloaded_error" {
			t.Fatalf("messages: %d %s", resp.StatusCode, b)
		}
	})
	t.Run("an upstream that does not answer in time is a 504", func(t *testing.T) {
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "slow", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("SLOW please")}})
		if e := apiErr(err); e.StatusCode != 504 || e.Code != "upstream_timeout" || e.Response.Header.Get("Retry-After") != "" {
			t.Fatalf("%d %s", e.StatusCode, e.RawJSON())
		}
	})
	t.Run("a capability no target has is a 400 naming the target, with the reason in X-Molly-Route", func(t *testing.T) {
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "notools", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
			Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "f"})}})
		e := apiErr(err)
		if e.StatusCode != 400 || e.Code != "unsupported_parameter" || e.Param != "tools" || !strings.Contains(e.Message, "basic: does not support tools") {
			t.Fatalf("%d %s", e.StatusCode, e.RawJSON())
		}
		if h := e.Response.Header; h.Get("X-Molly-Route") != "none; excluded basic: does not support tools (the request uses tools)" || len(h.Get("X-Molly-Decision-Id")) != 36 {
			t.Fatalf("route %q decision %q", h.Get("X-Molly-Route"), h.Get("X-Molly-Decision-Id"))
		}
		// Without tools the same target serves.
		if _, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "notools", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("audio output goes only to a target with audio, else a 400 naming modalities", func(t *testing.T) {
		params := func(model string) openai.ChatCompletionNewParams {
			return openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("say hi")},
				Modalities: []string{"text", "audio"}, Audio: openai.ChatCompletionAudioParam{Voice: openai.ChatCompletionAudioParamVoiceUnion{OfString: openai.String("alloy")}, Format: "wav"}}
		}
		_, err := c.Chat.Completions.New(ctx, params("notools"))
		e := apiErr(err)
		if e.StatusCode != 400 || e.Code != "unsupported_parameter" || e.Param != "modalities" || !strings.Contains(e.Message, "basic: does not support audio") {
			t.Fatalf("%d %s", e.StatusCode, e.RawJSON())
		}
		// A target declaring no capabilities has them all: it is asked.
		if _, err := c.Chat.Completions.New(ctx, params("chat")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("x-request-id: the client's, else Molly's, on every answer and upstream with traceparent", func(t *testing.T) {
		const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		resp, _ := do(t, g, "POST", "/v1/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`, "X-Request-Id", "client-req-1", "Traceparent", tp)
		if resp.Header.Get("X-Request-Id") != "client-req-1" {
			t.Fatalf("x-request-id %q", resp.Header.Get("X-Request-Id"))
		}
		hs := p.headers()
		if last := hs[len(hs)-1]; last.Get("X-Request-Id") != "client-req-1" || last.Get("Traceparent") != tp {
			t.Fatalf("upstream got x-request-id %q traceparent %q", last.Get("X-Request-Id"), last.Get("Traceparent"))
		}
		resp, _ = do(t, g, "POST", "/v1/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`)
		id := resp.Header.Get("X-Request-Id")
		hs = p.headers()
		if !regexp.MustCompile(`^req_[0-9a-f]{32}$`).MatchString(id) || hs[len(hs)-1].Get("X-Request-Id") != id {
			t.Fatalf("Molly's id %q, upstream got %q", id, hs[len(hs)-1].Get("X-Request-Id"))
		}
		for _, c := range []struct{ method, path, body string }{
			{"POST", "/v1/chat/completions", `{"model":`},
			{"POST", "/v1/nothing", `{}`},
			{"POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`},
			{"GET", "/healthz", ``},
		} {
			if resp, _ := do(t, g, c.method, c.path, c.body); !strings.HasPrefix(resp.Header.Get("X-Request-Id"), "req_") {
				t.Fatalf("%s %s: no x-request-id (%d)", c.method, c.path, resp.StatusCode)
			}
		}
		// The SDK reads it as the request's id.
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "nope", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}},
			option.WithHeader("X-Request-Id", "sdk-7"))
		if e := apiErr(err); e.StatusCode != 404 || e.Response.Header.Get("X-Request-Id") != "sdk-7" || len(e.Response.Header.Get("X-Molly-Decision-Id")) != 36 {
			t.Fatalf("404: request id %q, decision %q", e.Response.Header.Get("X-Request-Id"), e.Response.Header.Get("X-Molly-Decision-Id"))
		}
	})
	t.Run("a client that goes away is logged and counted as 499", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		go func() { // cancel once the upstream has the request (polling that condition, with a deadline)
			defer cancel()
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				if hs := p.headers(); len(hs) > 0 && hs[len(hs)-1].Get("X-Request-Id") == "gone-1" {
					return
				}
			}
		}()
		_, err := c.Chat.Completions.New(cctx, openai.ChatCompletionNewParams{Model: "chat", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("SLOW and then gone")}},
			option.WithHeader("X-Request-Id", "gone-1"))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("want the client's cancellation, got %v", err)
		}
		if !g.waitLogs(regexp.MustCompile(`"msg":"client went away"`)) {
			t.Fatal("no client-went-away line")
		}
	})
}

func TestWireHealthAndVersion(t *testing.T) {
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	p := startProvider(t)
	g := startMolly(t, wireCaddyfile(p, lan, ""))
	resp, b := do(t, g, "GET", "/healthz", ``)
	if resp.StatusCode != 200 || string(b) != `{"status":"alive"}` {
		t.Fatalf("healthz %d %s", resp.StatusCode, b)
	}
	resp, b = do(t, g, "GET", "/readyz", ``)
	if resp.StatusCode != 200 || gjson.GetBytes(b, "status").Str != "ready" || !gjson.GetBytes(b, "policies.ok").Bool() ||
		gjson.GetBytes(b, "targets.#(target==\"lan\").ok").Bool() != true || len(gjson.GetBytes(b, "policies.revision").Str) != 64 {
		t.Fatalf("readyz %d %s", resp.StatusCode, b)
	}
	if resp, _ := do(t, g, "POST", "/readyz", ``); resp.StatusCode != 405 {
		t.Fatalf("POST /readyz: %d", resp.StatusCode)
	}

	// Every target down: not ready, each one saying why.
	dead := upstreamtest.Start("dead")
	dead.Close()
	cfg := strings.NewReplacer(p.URL(), dead.URL(), lan.URL(), dead.URL()).Replace(wireCaddyfile(p, lan, ""))
	g2 := startMolly(t, cfg)
	resp, b = do(t, g2, "GET", "/readyz", ``)
	if resp.StatusCode != 503 || gjson.GetBytes(b, "status").Str != "not_ready" || !strings.Contains(gjson.GetBytes(b, "targets.0.error").Str, "refused") {
		t.Fatalf("readyz with every target down: %d %s", resp.StatusCode, b)
	}
	if resp, _ := do(t, g2, "GET", "/healthz", ``); resp.StatusCode != 200 {
		t.Fatalf("healthz while not ready: %d", resp.StatusCode)
	}

	// molly version: Molly's version, then Caddy's (the one go.mod requires).
	out, err := exec.Command(mollyBin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	want, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/caddyserver/caddy/v2").Output()
	if err != nil {
		t.Fatal(err)
	}
	if v := string(out); !strings.HasPrefix(v, "Molly ") || !strings.Contains(v, "; Caddy "+strings.TrimSpace(string(want))) {
		t.Fatalf("molly version = %q, want Molly's version then Caddy %s", v, want)
	}
}

// TestWireMethodsFollowHTTP checks the methods of every API path against
// RFC 9110: a 405 carries Allow (§15.5.6), every method Allow lists is
// served (is not itself a 405), and HEAD on a GET resource is GET without
// the body, with the same status, Content-Type and Content-Length (§9.3.2).
func TestWireMethodsFollowHTTP(t *testing.T) {
	spec := openapitest.Load(t)
	p := startProvider(t)
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	g := startMolly(t, wireCaddyfile(p, lan, ""))
	paths := []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages",
		"/v1/messages/count_tokens", "/v1/models", "/v1/models/chat", "/v1/responses/resp_0123", "/healthz"}
	for _, path := range paths {
		for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
			resp, b := do(t, g, m, path, `{}`)
			if resp.StatusCode != http.StatusMethodNotAllowed {
				continue
			}
			if strings.HasPrefix(path, "/v1/messages") {
				if gjson.GetBytes(b, "type").Str != "error" || gjson.GetBytes(b, "error.type").Str != "invalid_request_error" {
					t.Errorf("%s %s: not Anthropic's error: %s", m, path, b)
				}
			} else {
				spec.Validate(t, "ErrorResponse", b)
			}
			allow := resp.Header.Get("Allow")
			if allow == "" {
				t.Errorf("%s %s: 405 without Allow", m, path)
				continue
			}
			for _, a := range strings.Split(allow, ",") {
				a = strings.TrimSpace(a)
				if a == m {
					t.Errorf("%s %s: 405, yet Allow %q lists it", m, path, allow)
				}
				if r, _ := do(t, g, a, path, `{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`); r.StatusCode == http.StatusMethodNotAllowed {
					t.Errorf("%s %s: Allow %q lists %s, which is a 405 too", m, path, allow, a)
				}
			}
		}
	}
	for _, path := range []string{"/v1/models", "/v1/models/chat", "/healthz"} {
		get, body := do(t, g, "GET", path, ``)
		head, hb := do(t, g, "HEAD", path, ``)
		if get.StatusCode != 200 || head.StatusCode != get.StatusCode || len(hb) != 0 ||
			head.Header.Get("Content-Type") != get.Header.Get("Content-Type") || head.ContentLength != int64(len(body)) {
			t.Errorf("HEAD %s: %d %q length %d body %q; GET: %d %q length %d", path, head.StatusCode, head.Header.Get("Content-Type"),
				head.ContentLength, hb, get.StatusCode, get.Header.Get("Content-Type"), len(body))
		}
	}
}
