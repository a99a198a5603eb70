package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// wire7Upstream is an OpenAI-compatible upstream steered by the last user
// message: it records each body, reports service_tier "scale" (what an
// upstream says it used, whatever was asked), and for a stream holding
// CUT sends two content chunks and drops the connection, for one holding
// ERRLIMIT or ERRBOOM two chunks and then an error event (a rate limit,
// an overload).
type wire7Upstream struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies []gjson.Result
}

func startWire7Upstream(t *testing.T) *wire7Upstream {
	u := &wire7Upstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		body := gjson.ParseBytes(b)
		u.mu.Lock()
		u.bodies = append(u.bodies, body)
		u.mu.Unlock()
		prompt := body.Get("messages.@reverse.0.content").String()
		chunk := func(delta string) string {
			return `data: {"id":"c7","object":"chat.completion.chunk","created":1700000000,"model":"up","service_tier":"scale","choices":[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":null}]}` + "\n\n"
		}
		if !body.Get("stream").Bool() {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"c7","object":"chat.completion","created":1700000000,"model":"up","service_tier":"scale","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"fine","refusal":null}}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		_, _ = io.WriteString(w, chunk(`{"role":"assistant","content":"Hel"}`)+chunk(`{"content":"lo"}`))
		_ = rc.Flush()
		switch {
		case strings.Contains(prompt, "CUT"):
			panic(http.ErrAbortHandler) // the connection drops mid-stream
		case strings.Contains(prompt, "ERRLIMIT"):
			_, _ = io.WriteString(w, `data: {"error":{"message":"too many requests for this model","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}`+"\n\n")
			return
		case strings.Contains(prompt, "ERRBOOM"):
			_, _ = io.WriteString(w, `data: {"error":{"message":"the model crashed","type":"server_error","param":null,"code":null}}`+"\n\n")
			return
		}
		_, _ = io.WriteString(w, `data: {"id":"c7","object":"chat.completion.chunk","created":1700000000,"model":"up","service_tier":"scale","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`+"\n\n")
		_, _ = io.WriteString(w, `data: {"id":"c7","object":"chat.completion.chunk","created":1700000000,"model":"up","service_tier":"scale","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`+"\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(u.srv.Close)
	return u
}

// last is the last body the upstream received.
func (u *wire7Upstream) last(t *testing.T) gjson.Result {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.bodies) == 0 {
		t.Fatal("the upstream received nothing")
	}
	return u.bodies[len(u.bodies)-1]
}

// wire7Molly serves model chat on the T2 target remote (the upstream u),
// with the molly app (the Responses API's store).
func wire7Molly(t *testing.T, u *wire7Upstream) *gateway {
	return startMolly(t, `{
	admin off
	auto_https off
	persist_config off
	molly {
		target remote {
			tier T2
			endpoint `+u.srv.URL+`/v1
			models chat=up
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_policy
	molly_route
}
`)
}

// Anthropic's output_config.effort ("low" … "max", the same words as
// OpenAI's ReasoningEffort) reaches an OpenAI-shaped upstream as
// reasoning_effort, as a chat client's reasoning_effort and a Responses
// client's reasoning.effort do; a value outside Anthropic's list is a 400
// in Anthropic's shape.
func TestReasoningEffortReachesARemoteUpstream(t *testing.T) {
	u := startWire7Upstream(t)
	g := wire7Molly(t, u)
	ac := anthropic.NewClient(aopt.WithBaseURL(strings.TrimSuffix(g.URL, "/v1")), aopt.WithAPIKey("x"), aopt.WithMaxRetries(0))
	msg := anthropic.MessageNewParams{Model: "chat", MaxTokens: 2048,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("think hard"))}}

	for _, effort := range []anthropic.OutputConfigEffort{anthropic.OutputConfigEffortLow, anthropic.OutputConfigEffortHigh, anthropic.OutputConfigEffortMax} {
		p := msg
		p.OutputConfig = anthropic.OutputConfigParam{Effort: effort}
		if _, err := ac.Messages.New(t.Context(), p); err != nil {
			t.Fatal(err)
		}
		if got := u.last(t).Get("reasoning_effort"); got.Str != string(effort) {
			t.Fatalf("output_config.effort %q reached the upstream as reasoning_effort %s", effort, got.Raw)
		}
	}
	// With thinking enabled too: the effort goes, the engine-only budget
	// (max_reasoning_tokens) does not.
	p := msg
	p.Thinking = anthropic.ThinkingConfigParamOfEnabled(1024)
	p.OutputConfig = anthropic.OutputConfigParam{Effort: anthropic.OutputConfigEffortMedium}
	s := ac.Messages.NewStreaming(t.Context(), p)
	for s.Next() {
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if b := u.last(t); b.Get("reasoning_effort").Str != "medium" || b.Get("max_reasoning_tokens").Exists() {
		t.Fatalf("thinking with effort medium sent %s", b.Raw)
	}
	// Without an effort, none is made up.
	if _, err := ac.Messages.New(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
	if b := u.last(t); b.Get("reasoning_effort").Exists() {
		t.Fatalf("no effort asked, but sent %s", b.Raw)
	}
	// An effort Anthropic does not list.
	_, err := ac.Messages.New(t.Context(), msg, aopt.WithJSONSet("output_config", map[string]any{"effort": "extreme"}))
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Type() != "invalid_request_error" || !strings.Contains(ae.Message, "output_config.effort") {
		t.Fatalf("effort extreme: %v", err)
	}

	// OpenAI's clients, to the same remote.
	c := client(g)
	cp := chat("think")
	cp.ReasoningEffort = "high"
	if _, err := c.Chat.Completions.New(t.Context(), cp); err != nil {
		t.Fatal(err)
	}
	if got := u.last(t).Get("reasoning_effort").Str; got != "high" {
		t.Fatalf("chat reasoning_effort high reached the upstream as %q", got)
	}
	if _, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: "chat",
		Input:     responses.ResponseNewParamsInputUnion{OfString: openai.String("think")},
		Reasoning: openai.ReasoningParam{Effort: "xhigh"}}); err != nil {
		t.Fatal(err)
	}
	if got := u.last(t).Get("reasoning_effort").Str; got != "xhigh" {
		t.Fatalf("responses reasoning.effort xhigh reached the upstream as %q", got)
	}
}

// The Response object carries the service tier the upstream reports it
// used (OpenAI's ServiceTier: "the response body will include the
// service_tier value based on the processing mode actually used"), whole
// and streamed, and echoes max_tool_calls.
func TestResponsesReportServiceTierAndMaxToolCalls(t *testing.T) {
	spec := openapitest.Load(t)
	u := startWire7Upstream(t)
	g := wire7Molly(t, u)
	c := client(g)
	params := responses.ResponseNewParams{Model: "chat", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
		ServiceTier: responses.ResponseNewParamsServiceTierPriority, MaxToolCalls: openai.Int(3)}
	r, err := c.Responses.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	spec.Validate(t, "Response", []byte(r.RawJSON()))
	if r.ServiceTier != "scale" || r.MaxToolCalls != 3 {
		t.Fatalf("service_tier %q max_tool_calls %d, want the upstream's scale and 3: %s", r.ServiceTier, r.MaxToolCalls, r.RawJSON())
	}
	if u.last(t).Get("service_tier").Str != "priority" {
		t.Fatalf("the upstream was sent %s", u.last(t).Raw)
	}
	s := c.Responses.NewStreaming(t.Context(), params)
	var done responses.Response
	for s.Next() {
		ev := s.Current()
		if ev.Type == "response.completed" {
			done = ev.Response
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if done.ServiceTier != "scale" || done.MaxToolCalls != 3 {
		t.Fatalf("streamed: service_tier %q max_tool_calls %d: %s", done.ServiceTier, done.MaxToolCalls, done.RawJSON())
	}
	// A negative max_tool_calls is refused, naming it.
	params.MaxToolCalls = openai.Int(-1)
	_, err = c.Responses.New(t.Context(), params)
	if e := apiError(t, err); e.StatusCode != 400 || e.Param != "max_tool_calls" {
		t.Fatalf("max_tool_calls -1: %s", e.RawJSON())
	}
}

// max_tool_calls bounds the calls of the gateway's own (built-in) tools a
// response processes: the model asks for the payments tool twice in one
// turn and again after; with max_tool_calls 1 only the first call runs,
// the second is answered as ignored, and the next round offers the model
// no built-in tool, so it answers.
func TestResponsesMaxToolCallsBoundsBuiltInTools(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "payments")
	if out, err := exec.Command("go", "build", "-o", bin, "../../plugins/payments").CombinedOutput(); err != nil {
		t.Fatalf("building the payments plugin: %v\n%s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	lan := upstreamtest.Start("t1")
	t.Cleanup(lan.Close)
	lan.ToolCalls = func(body []byte) []upstreamtest.ToolCall {
		if !strings.Contains(gjson.GetBytes(body, "tools.#.function.name").Raw, `"payments"`) {
			return nil // no tool offered: answer
		}
		return []upstreamtest.ToolCall{
			{ID: "call_1", Name: "payments", Arguments: `{"op":"create_intent","amount":500,"currency":"EUR","customer":"cust_1"}`},
			{ID: "call_2", Name: "payments", Arguments: `{"op":"create_intent","amount":700,"currency":"EUR","customer":"cust_2"}`}}
	}
	g := startMolly(t, `{
	admin off
	auto_https off
	persist_config off
	molly {
		tool payments {
			path `+bin+`
			sha256 `+hex.EncodeToString(sum[:])+`
			env MOLLY_PAYMENTS_DB `+filepath.Join(dir, "ledger.db")+`
		}
		tool_steps 4
		target lan {
			tier T1
			endpoint `+lan.URL()+`
			models chat=small-lan
			price 0 0
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_policy
	molly_route
}
`)
	r, err := client(g).Responses.New(t.Context(), responses.ResponseNewParams{Model: "chat", MaxToolCalls: openai.Int(1),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Charge both customers")}})
	if err != nil {
		t.Fatal(err)
	}
	if r.OutputText() == "" || r.Status != "completed" {
		t.Fatalf("no answer: %s", r.RawJSON())
	}
	bodies := lan.Received()
	if len(bodies) != 2 {
		t.Fatalf("the upstream was asked %d times, want 2 (one tool round, then the answer)", len(bodies))
	}
	second := gjson.ParseBytes(bodies[1])
	results := second.Get(`messages.#(role=="tool")#`).Array()
	if len(results) != 2 || strings.Contains(results[0].Get("content").Str, "error") ||
		results[1].Get("tool_call_id").Str != "call_2" || !strings.Contains(results[1].Get("content").Str, "max_tool_calls") {
		t.Fatalf("tool results sent: %s", second.Get("messages").Raw)
	}
	if strings.Contains(second.Get("tools").Raw, "payments") {
		t.Fatalf("the spent tool was offered again: %s", second.Get("tools").Raw)
	}
}

// A field of the wrong JSON type is a 400 with OpenAI's code invalid_type
// and the field's path as param, on chat completions and the Responses
// API (nested fields too); on the Messages API Anthropic's error names it.
func TestWrongTypesAreInvalidTypeWithTheirPath(t *testing.T) {
	u := startWire7Upstream(t)
	g := wire7Molly(t, u)
	c := client(g)
	chatWith := func(key string, v any) func() error {
		return func() error {
			_, err := c.Chat.Completions.New(t.Context(), chat("x"), option.WithJSONSet(key, v))
			return err
		}
	}
	respWith := func(key string, v any) func() error {
		return func() error {
			_, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: "chat", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}},
				option.WithJSONSet(key, v))
			return err
		}
	}
	for _, tc := range []struct {
		name, param string
		call        func() error
	}{
		// Chat parameters Molly only type-checks: sent on, a backend could
		// read "no" as true or drop it.
		{"chat stop of numbers", "stop", chatWith("stop", []any{1})},
		{"chat seed as a string", "seed", chatWith("seed", "1")},
		{"chat metadata as a string", "metadata", chatWith("metadata", "a")},
		{"chat store as a string", "store", chatWith("store", "yes")},
		{"chat parallel_tool_calls as a string", "parallel_tool_calls", chatWith("parallel_tool_calls", "no")},
		{"chat service_tier as a number", "service_tier", chatWith("service_tier", 1)},
		{"chat reasoning_effort as an array", "reasoning_effort", chatWith("reasoning_effort", []any{"high"})},
		{"chat max_completion_tokens as a string", "max_completion_tokens", chatWith("max_completion_tokens", "5")},
		{"responses max_output_tokens as a string", "max_output_tokens", respWith("max_output_tokens", "5")},
		{"chat temperature", "temperature", func() error {
			_, err := c.Chat.Completions.New(t.Context(), chat("x"), option.WithJSONSet("temperature", "hot"))
			return err
		}},
		{"chat message content", "messages[0].content", func() error {
			_, err := c.Chat.Completions.New(t.Context(), chat("x"), option.WithJSONSet("messages.0.content", 5))
			return err
		}},
		{"chat stream", "stream", func() error {
			_, err := c.Chat.Completions.New(t.Context(), chat("x"), option.WithJSONSet("stream", "yes"))
			return err
		}},
		{"responses store", "store", func() error {
			_, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: "chat", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}},
				option.WithJSONSet("store", "yes"))
			return err
		}},
		{"responses temperature", "temperature", func() error {
			_, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: "chat", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}},
				option.WithJSONSet("temperature", "hot"))
			return err
		}},
		{"responses input item content", "input[0].content", func() error {
			_, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: "chat"},
				option.WithJSONSet("input", []any{map[string]any{"role": "user", "content": 5}}))
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := apiError(t, tc.call())
			if e.StatusCode != 400 || e.Type != "invalid_request_error" || e.Code != "invalid_type" || e.Param != tc.param {
				t.Fatalf("%d type %q code %q param %q, want 400 invalid_request_error invalid_type %q: %s", e.StatusCode, e.Type, e.Code, e.Param, tc.param, e.RawJSON())
			}
		})
	}
	// Out of range is not a type error: its own code; nor is what this
	// gateway does not serve.
	for _, tc := range []struct {
		name, param, code string
		call              func() error
	}{
		{"chat n of 0", "n", "integer_below_min_value", chatWith("n", 0)},
		{"chat temperature of 3", "temperature", "decimal_above_max_value", chatWith("temperature", 3)},
		{"chat tool_choice of another word", "tool_choice", "invalid_value", chatWith("tool_choice", "sometimes")},
		{"responses max_output_tokens of 0", "max_output_tokens", "integer_below_min_value", respWith("max_output_tokens", 0)},
		// A Responses tool's name is tools[0].name, not chat's tools[0].function.name.
		{"responses tool name out of pattern", "tools[0].name", "invalid_value",
			respWith("tools", []any{map[string]any{"type": "function", "name": "a b", "parameters": map[string]any{"type": "object"}}})},
		// The API's, not this gateway's.
		{"responses background mode", "background", "unsupported_parameter", respWith("background", true)},
		{"responses hosted tools", "tools[0].type", "unsupported_parameter", respWith("tools", []any{map[string]any{"type": "web_search"}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := apiError(t, tc.call())
			if e.StatusCode != 400 || e.Code != tc.code || e.Param != tc.param || strings.Contains(e.Message, ".function.") {
				t.Fatalf("%d code %q param %q, want 400 %q %q: %s", e.StatusCode, e.Code, e.Param, tc.code, tc.param, e.RawJSON())
			}
		})
	}
	ac := anthropic.NewClient(aopt.WithBaseURL(strings.TrimSuffix(g.URL, "/v1")), aopt.WithAPIKey("x"), aopt.WithMaxRetries(0))
	_, err := ac.Messages.New(t.Context(), anthropic.MessageNewParams{Model: "chat", MaxTokens: 8,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("x"))}}, aopt.WithJSONSet("top_k", "many"))
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Type() != "invalid_request_error" || !strings.HasPrefix(ae.Message, "top_k") ||
		gjson.Get(ae.RawJSON(), "error.code").Exists() {
		t.Fatalf("top_k of the wrong type on /v1/messages: %v", err)
	}
	// Errors found on the translated chat request name the client's paths.
	for _, mc := range []struct{ set, prefix string }{
		{`[{"name":"a b","input_schema":{"type":"object"}}]`, "tools.0.name: "},
	} {
		_, err := ac.Messages.New(t.Context(), anthropic.MessageNewParams{Model: "chat", MaxTokens: 8,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("x"))}}, aopt.WithJSONSet("tools", json.RawMessage(mc.set)))
		if !errors.As(err, &ae) || ae.StatusCode != 400 || !strings.HasPrefix(ae.Message, mc.prefix) || strings.Contains(ae.Message, "function") {
			t.Fatalf("tools %s: %v", mc.set, err)
		}
	}
	_, err = ac.Messages.New(t.Context(), anthropic.MessageNewParams{Model: "chat", MaxTokens: 8,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("x"))}}, aopt.WithJSONSet("messages.0.content.0.text", 5))
	if !errors.As(err, &ae) || ae.StatusCode != 400 || !strings.HasPrefix(ae.Message, "messages.0.content.0.text: ") {
		t.Fatalf("a numeric text block: %v", err)
	}
}

// strictSSE reads a raw SSE body into its events, failing on anything
// that is not an event line, a comment or a blank line (the WHATWG
// event-stream format).
func strictSSE(t *testing.T, body io.Reader) (events []struct{ typ, data string }) {
	t.Helper()
	sc := bufio.NewScanner(body)
	sc.Buffer(nil, 1<<20)
	var typ, data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data != "" {
				events = append(events, struct{ typ, data string }{typ, data})
			}
			typ, data = "", ""
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event: "):
			typ = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data += strings.TrimPrefix(line, "data: ")
		default:
			t.Fatalf("not an SSE line: %q", line)
		}
	}
	if data != "" {
		t.Fatalf("an event without its blank line at the end: %q", data)
	}
	return events
}

// A stream that fails after it began — the upstream's connection drops, or
// it sends an error event — reaches openai-go's iterator as the chunks
// sent so far and then stream.Err(), a *ssestream.StreamError naming the
// cause; on the Responses API as the events so far, an error event and
// the terminal response.failed whose Response has status failed and an
// error of ResponseErrorCode's values. Every event before is valid SSE and
// valid against the spec.
func TestStreamsThatFailMidwayThroughOpenAIGo(t *testing.T) {
	spec := openapitest.Load(t)
	u := startWire7Upstream(t)
	g := wire7Molly(t, u)
	c := client(g)
	for _, tc := range []struct{ prompt, cause, code string }{
		{"CUT", "stream_truncated", "server_error"},
		{"ERRLIMIT", "too many requests", "rate_limit_exceeded"},
		{"ERRBOOM", "the model crashed", "server_error"},
	} {
		t.Run("chat "+tc.prompt, func(t *testing.T) {
			s := c.Chat.Completions.NewStreaming(t.Context(), chat(tc.prompt))
			text := ""
			for s.Next() {
				ch := s.Current()
				spec.Validate(t, "CreateChatCompletionStreamResponse", []byte(ch.RawJSON()))
				for _, choice := range ch.Choices {
					text += choice.Delta.Content
					if choice.FinishReason != "" {
						t.Fatalf("a made-up finish_reason %q", choice.FinishReason)
					}
				}
			}
			var se *ssestream.StreamError
			if !errors.As(s.Err(), &se) || !strings.Contains(se.Message, tc.cause) || text != "Hello" {
				t.Fatalf("after %q: %v, want a stream error naming %q", text, s.Err(), tc.cause)
			}
			if e := gjson.GetBytes(se.Event.Data, "error"); e.Get("message").Str == "" || e.Get("type").Str == "" || !e.Get("param").Exists() || !e.Get("code").Exists() {
				t.Fatalf("the error event is not OpenAI's error object: %s", se.Event.Data)
			}
			// Raw: valid SSE, chunks then one error event, no [DONE].
			resp, err := http.Post(g.URL+"/chat/completions", "application/json",
				strings.NewReader(`{"model":"chat","stream":true,"messages":[{"role":"user","content":"`+tc.prompt+`"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			evs := strictSSE(t, resp.Body)
			resp.Body.Close()
			for i, ev := range evs {
				if i < len(evs)-1 && (ev.typ != "" || !gjson.Valid(ev.data) || gjson.Get(ev.data, "error").Exists()) {
					t.Fatalf("event %d: %q %s", i, ev.typ, ev.data)
				}
			}
			if last := evs[len(evs)-1]; len(evs) < 2 || !gjson.Get(last.data, "error").IsObject() {
				t.Fatalf("the stream did not end with an error event: %v", evs)
			}
		})
		t.Run("responses "+tc.prompt, func(t *testing.T) {
			s := c.Responses.NewStreaming(t.Context(), responses.ResponseNewParams{Model: "chat",
				Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(tc.prompt)}})
			var types []string
			var text, errMsg, errCode string
			var failed responses.Response
			seq := int64(-1)
			for s.Next() {
				ev := s.Current()
				spec.Validate(t, "ResponseStreamEvent", []byte(ev.RawJSON()))
				if ev.SequenceNumber != seq+1 {
					t.Fatalf("sequence_number %d after %d", ev.SequenceNumber, seq)
				}
				seq = ev.SequenceNumber
				types = append(types, ev.Type)
				switch ev.Type {
				case "response.output_text.delta":
					text += ev.Delta
				case "error":
					errMsg, errCode = ev.Message, ev.Code
				case "response.failed":
					failed = ev.Response
				}
			}
			if err := s.Err(); err != nil {
				t.Fatalf("the iterator failed: %v", err)
			}
			if n := len(types); n < 2 || types[n-2] != "error" || types[n-1] != "response.failed" || !strings.Contains(errMsg+" "+errCode, tc.cause) || text != "Hello" {
				t.Fatalf("events %v, error %q (code %q), text %q", types, errMsg, errCode, text)
			}
			if failed.Status != "failed" || string(failed.Error.Code) != tc.code || failed.Error.Message != errMsg ||
				len(failed.Output) != 1 || failed.Output[0].Status != "incomplete" || failed.Output[0].Content[0].Text != "Hello" {
				t.Fatalf("response.failed carries %s", failed.RawJSON())
			}
		})
	}
}

// The Responses API takes tool_choice and parallel_tool_calls without
// tools (its defaults are auto and true with tools []), which OpenAI's
// chat completions refuses ("'tool_choice' is only allowed when 'tools'
// are specified", and the same for parallel_tool_calls): the chat request
// sent upstream carries them only with tools.
func TestResponsesToolChoiceWithoutToolsIsNotSent(t *testing.T) {
	u := startWire7Upstream(t)
	g := wire7Molly(t, u)
	c := client(g)
	r, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: "chat", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")},
		ToolChoice:        responses.ResponseNewParamsToolChoiceUnion{OfToolChoiceMode: openai.Opt(responses.ToolChoiceOptionsNone)},
		ParallelToolCalls: openai.Bool(false)})
	if err != nil {
		t.Fatal(err)
	}
	if b := u.last(t); b.Get("tool_choice").Exists() || b.Get("parallel_tool_calls").Exists() {
		t.Fatalf("sent without tools: %s", b.Raw)
	}
	if r.ToolChoice.OfToolChoiceMode != "none" || r.ParallelToolCalls {
		t.Fatalf("not echoed: %s", r.RawJSON())
	}
	// With tools both go.
	_, err = c.Responses.New(t.Context(), responses.ResponseNewParams{Model: "chat", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")},
		Tools:             []responses.ToolUnionParam{responses.ToolParamOfFunction("f", map[string]any{"type": "object"}, false)},
		ToolChoice:        responses.ResponseNewParamsToolChoiceUnion{OfToolChoiceMode: openai.Opt(responses.ToolChoiceOptionsRequired)},
		ParallelToolCalls: openai.Bool(false)})
	if err != nil {
		t.Fatal(err)
	}
	if b := u.last(t); b.Get("tool_choice").Str != "required" || b.Get("parallel_tool_calls").Type != gjson.False {
		t.Fatalf("sent with tools: %s", b.Raw)
	}
}

// An embeddings input that is an empty string or array is a 400 naming
// input (CreateEmbeddingRequest: the input "cannot be an empty string",
// its arrays have minItems 1), not sent to the upstream.
func TestEmbeddingsRefuseAnEmptyInput(t *testing.T) {
	u := startWire7Upstream(t)
	g := wire7Molly(t, u)
	c := client(g)
	for _, tc := range []struct {
		name  string
		input any
		code  string
	}{{"an empty string", "", "invalid_value"}, {"an empty array", []any{}, "empty_array"}} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Embeddings.New(t.Context(), openai.EmbeddingNewParams{Model: "chat",
				Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}}, option.WithJSONSet("input", tc.input))
			if e := apiError(t, err); e.StatusCode != 400 || e.Param != "input" || e.Code != tc.code {
				t.Fatalf("%d param %q code %q, want 400 input %s: %s", e.StatusCode, e.Param, e.Code, tc.code, e.RawJSON())
			}
		})
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.bodies) != 0 {
		t.Fatalf("the upstream was sent %d requests", len(u.bodies))
	}
}
