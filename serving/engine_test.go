package serving

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/serving/gguf"
)

var demoDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "molly-serving-test-")
	if err != nil {
		panic(err)
	}
	if err := WriteDemo(dir, 1, "tiny"); err != nil {
		panic(err)
	}
	demoDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func newEngine(t testing.TB, mod func(*Config)) *Engine {
	t.Helper()
	cfg := DemoConfig(demoDir)
	cfg.NSeqMax = 8
	cfg.NCtx = 8 * 512
	cfg.NBatch = 256
	cfg.PrefillChunk = 64
	// One thread: ggml's worker barrier spins, and on a shared, oversubscribed
	// machine a descheduled worker stalls every step.
	cfg.Threads = 1
	if mod != nil {
		mod(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// tokenLogprob is one token of a chat answer's logprobs.content.
type tokenLogprob struct {
	Token       string  `json:"token"`
	Logprob     float64 `json:"logprob"`
	TopLogprobs []struct {
		Token   string  `json:"token"`
		Logprob float64 `json:"logprob"`
	} `json:"top_logprobs"`
}

type chatResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
		Logprobs     *struct {
			Content       []tokenLogprob `json:"content"`
			Tokens        []string       `json:"tokens"`
			TokenLogprobs []float64      `json:"token_logprobs"`
		} `json:"logprobs"`
	} `json:"choices"`
	Usage             *Usage `json:"usage"`
	SystemFingerprint string `json:"system_fingerprint"`
	Error             *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func call(t testing.TB, e *Engine, ctx context.Context, method, path string, body any) *httptest.ResponseRecorder {
	t.Helper()
	var rd *bytes.Reader
	switch b := body.(type) {
	case nil:
		rd = bytes.NewReader(nil)
	case string:
		rd = bytes.NewReader([]byte(b))
	default:
		js, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(js)
	}
	req := httptest.NewRequest(method, path, rd).WithContext(ctx)
	w := httptest.NewRecorder()
	e.ServeHTTP(w, req)
	return w
}

// chat posts a non-streaming chat completion and decodes the answer.
func chat(t testing.TB, e *Engine, body map[string]any) (int, chatResponse) {
	t.Helper()
	w := call(t, e, context.Background(), http.MethodPost, "/v1/chat/completions", body)
	var r chatResponse
	if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil {
		t.Fatalf("decoding %q: %v", w.Body.String(), err)
	}
	return w.Code, r
}

func greedy(model, prompt string, maxTokens int) map[string]any {
	return map[string]any{
		"model":       model,
		"messages":    []map[string]any{{"role": "user", "content": prompt}},
		"temperature": 0,
		"max_tokens":  maxTokens,
	}
}

// greedyLogprobs is greedy with each token's log probability and its
// two most likely alternatives.
func greedyLogprobs(model, prompt string, maxTokens int) map[string]any {
	body := greedy(model, prompt, maxTokens)
	body["logprobs"] = true
	body["top_logprobs"] = 2
	return body
}

// tieLogprob is how close (in nats) two tokens' log probabilities must be
// for greedy decoding to pick either: on the demo model a different KV
// cell layout or batch shape moves them by a few thousandths (0.0034
// seen between ':' and '~' of molly-demo on "question 2"), a wrong
// adapter by whole nats.
const tieLogprob = 1e-2

// nearTie reports whether two greedy answers of the same request (with
// logprobs) agree up to a token where both chose between two tokens
// whose log probabilities were within tieLogprob of each other, each
// run's token being the other's runner-up: the two runs differ by
// rounding there, and greedy decoding goes its own way after it.
func nearTie(a, b chatResponse) (string, bool) {
	if len(a.Choices) == 0 || len(b.Choices) == 0 || a.Choices[0].Logprobs == nil || b.Choices[0].Logprobs == nil {
		return "no logprobs", false
	}
	ta, tb := a.Choices[0].Logprobs.Content, b.Choices[0].Logprobs.Content
	for k := 0; k < len(ta) && k < len(tb); k++ {
		if ta[k].Token == tb[k].Token {
			continue
		}
		alt := func(c tokenLogprob, tok string) bool {
			for _, o := range c.TopLogprobs {
				if o.Token == tok && c.Logprob-o.Logprob <= tieLogprob {
					return true
				}
			}
			return false
		}
		if alt(ta[k], tb[k].Token) && alt(tb[k], ta[k].Token) {
			return fmt.Sprintf("token %d: %q and %q tie (%.6f, %.6f)", k, ta[k].Token, tb[k].Token, ta[k].Logprob, tb[k].Logprob), true
		}
		return fmt.Sprintf("token %d: %q against %q, no tie", k, ta[k].Token, tb[k].Token), false
	}
	return "the tokens agree but the texts differ", false
}

func mustText(t testing.TB, e *Engine, body map[string]any) (string, chatResponse) {
	t.Helper()
	code, r := chat(t, e, body)
	if code != http.StatusOK || len(r.Choices) == 0 {
		t.Fatalf("status %d, response %+v", code, r)
	}
	return r.Choices[0].Message.Content, r
}

func TestBatchInvarianceAcrossAdapters(t *testing.T) {
	e := newEngine(t, nil)
	models := []string{"molly-demo:support", "molly-demo:billing", "molly-demo:payments", "molly-demo"}
	prompts := []string{"Where is my parcel?", "Why was I charged twice?", "Refund my card", "Hello"}
	alone := make([]string, len(models))
	for i := range models {
		alone[i], _ = mustText(t, e, greedy(models[i], prompts[i], 32))
	}
	// Run them together, several rounds so that they overlap at different
	// phases (prefill beside decode).
	for round := range 3 {
		together := make([]string, len(models))
		var wg sync.WaitGroup
		for i := range models {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(i*round) * time.Millisecond)
				together[i], _ = mustText(t, e, greedy(models[i], prompts[i], 32))
			}()
		}
		wg.Wait()
		for i := range models {
			if together[i] != alone[i] {
				t.Errorf("round %d, %s: concurrent output %q differs from alone %q", round, models[i], together[i], alone[i])
			}
		}
	}
	if len(alone[0]) == 0 {
		t.Fatal("empty output")
	}
}

func TestAdaptersChangeTheOutput(t *testing.T) {
	e := newEngine(t, nil)
	outs := map[string]string{}
	for _, m := range []string{"molly-demo", "molly-demo:support", "molly-demo:billing"} {
		outs[m], _ = mustText(t, e, greedy(m, "same prompt for all", 24))
	}
	if outs["molly-demo"] == outs["molly-demo:support"] || outs["molly-demo:support"] == outs["molly-demo:billing"] {
		t.Errorf("adapters had no effect on greedy output: %q", outs)
	}
}

func TestCancellationFreesTheSequenceWithinAStep(t *testing.T) {
	e := newEngine(t, func(c *Config) { c.NSeqMax = 2; c.NCtx = 2 * 2048 })
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	var once sync.Once
	errc := make(chan error, 1)
	go func() {
		prompt, _ := e.Tokenize("go on forever")
		_, err := e.Generate(ctx, Request{Adapter: "support", Prompt: prompt, Params: SamplingParams{Temperature: 0}}, func(Event) error {
			once.Do(func() { close(started) })
			return nil
		})
		errc <- err
	}()
	<-started
	if s := e.Stats(); s.BusySequences != 1 {
		t.Fatalf("busy sequences while generating = %d, want 1", s.BusySequences)
	}
	steps := e.Stats().Steps
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Generate returned %v, want context.Canceled", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.Stats().BusySequences != 0 {
		if time.Now().After(deadline) {
			t.Fatal("sequence not freed after cancel")
		}
		time.Sleep(time.Millisecond)
	}
	if d := e.Stats().Steps - steps; d > 2 {
		t.Errorf("freed after %d steps, want at most 2 (the step in flight and the next)", d)
	}
	// Its KV cells are gone: every sequence is empty.
	if err := e.onScheduler(func() {
		for id := range 2 {
			if p := e.lctx.SeqPosMax(id); p != -1 {
				t.Errorf("sequence %d still holds cells up to position %d", id, p)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	// Both sequences are free again: a request with n=2 runs to completion.
	_, r := mustText(t, e, map[string]any{"model": "molly-demo", "messages": []map[string]any{{"role": "user", "content": "x"}}, "n": 2, "max_tokens": 4})
	if len(r.Choices) != 2 {
		t.Errorf("n=2 after cancel gave %d choices", len(r.Choices))
	}
}

func TestEvictionKeepsHotAndWarmWithinBudgetsAndKeepsTheCostlyAdapter(t *testing.T) {
	st, err := os.Stat(filepath.Join(demoDir, DemoAdapterDir, "support.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	size := st.Size()
	e := newEngine(t, func(c *Config) { c.HotBytes = 2 * size; c.WarmBytes = 3 * size })
	clock := time.Unix(1000, 0)
	e.adapters.mu.Lock()
	e.adapters.now = func() time.Time { return clock }
	e.adapters.mu.Unlock()
	run := func(adapter string) {
		mustText(t, e, greedy("molly-demo:"+adapter, "hi", 2))
		e.adapters.mu.Lock()
		hot, warm := e.adapters.hotBytes(), e.adapters.warmBytes()
		e.adapters.mu.Unlock()
		if hot > 2*size || warm > 3*size {
			t.Errorf("after %s: hot %d bytes (budget %d), warm %d bytes (budget %d)", adapter, hot, 2*size, warm, 3*size)
		}
	}
	for _, a := range []string{"support", "support", "support", "billing", "payments", "legal", "support"} {
		run(a)
	}
	states := map[string]AdapterState{}
	for _, a := range e.Adapters() {
		states[a.Name] = a.State
	}
	// support (used 4 times) must have survived every eviction; of the
	// adapters used once, only the latest is hot.
	want := map[string]AdapterState{"support": Hot, "legal": Hot}
	for name, s := range want {
		if states[name] != s {
			t.Errorf("%s is %s, want %s (all: %v)", name, states[name], s, states)
		}
	}
	hot := 0
	for _, s := range states {
		if s == Hot {
			hot++
		}
	}
	if hot != 2 {
		t.Errorf("%d hot adapters, want 2: %v", hot, states)
	}
	// Hits: support loads on its first use and is hot for its three
	// others; each of the others loads on its only use.
	wantUses := map[string][2]int{"support": {4, 3}, "billing": {1, 0}, "payments": {1, 0}, "legal": {1, 0}}
	for _, a := range e.Adapters() {
		if w, ok := wantUses[a.Name]; ok && (a.Uses != w[0] || a.Hits != w[1]) {
			t.Errorf("%s: %d uses, %d hits; want %d and %d", a.Name, a.Uses, a.Hits, w[0], w[1])
		}
	}
}

func TestMismatchedAdaptersAreRefused(t *testing.T) {
	e := newEngine(t, nil)
	base, _ := gguf.SizeConfig("tiny", 1)
	small, _ := gguf.SizeConfig("small", 1)
	otherSeed, _ := gguf.SizeConfig("tiny", 2)
	dir := t.TempDir()
	cases := []struct {
		name string
		make func(path string) error
		want string
	}{
		{"an adapter for another base checksum is refused", func(p string) error {
			return gguf.WriteAdapter(p, otherSeed, gguf.AdapterConfig{Name: "x", Seed: 9})
		}, "base checksum"},
		{"an adapter whose tensor shapes do not fit is refused", func(p string) error {
			return gguf.WriteAdapter(p, small, gguf.AdapterConfig{Name: "x", Seed: 9, BaseChecksum: base.Checksum()})
		}, "do not fit base shape"},
		{"an adapter for another architecture is refused", func(p string) error {
			return gguf.WriteAdapter(p, base, gguf.AdapterConfig{Name: "x", Seed: 9, Architecture: "qwen2"})
		}, `architecture "qwen2"`},
		{"a base model is not an adapter", func(p string) error {
			return gguf.WriteModel(p, base)
		}, `general.type is ""`},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, fmt.Sprintf("bad%d.gguf", i))
			if err := tc.make(p); err != nil {
				t.Fatal(err)
			}
			err := e.AddAdapter(fmt.Sprintf("bad%d", i), p)
			if !errors.Is(err, ErrAdapterRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("AddAdapter error = %v, want ErrAdapterRefused mentioning %q", err, tc.want)
			}
			for _, m := range e.Models() {
				if strings.HasSuffix(m, fmt.Sprintf(":bad%d", i)) {
					t.Errorf("refused adapter listed in models: %v", e.Models())
				}
			}
		})
	}
	// Refusal by name is reported as such over HTTP.
	code, r := chat(t, e, greedy("molly-demo:bad0", "hi", 2))
	if code != http.StatusBadRequest || r.Error == nil || r.Error.Code == nil || *r.Error.Code != "adapter_refused" {
		t.Errorf("request for a refused adapter: status %d, error %+v", code, r.Error)
	}
}

func TestSeveralChoicesShareOnePrefill(t *testing.T) {
	e := newEngine(t, nil)
	one, r1 := mustText(t, e, greedy("molly-demo:billing", "tell me", 12))
	body := greedy("molly-demo:billing", "tell me", 12)
	body["n"] = 3
	_, r3 := mustText(t, e, body)
	if len(r3.Choices) != 3 {
		t.Fatalf("got %d choices", len(r3.Choices))
	}
	for i, c := range r3.Choices {
		if c.Index != i || c.Message.Content != one {
			t.Errorf("choice %d = %q (index %d), want %q", i, c.Message.Content, c.Index, one)
		}
	}
	if r3.Usage.PromptTokens != r1.Usage.PromptTokens || r3.Usage.CompletionTokens != 3*r1.Usage.CompletionTokens {
		t.Errorf("usage n=3 %+v vs n=1 %+v", *r3.Usage, *r1.Usage)
	}
	// Sampled choices differ from each other but repeat with the same seed.
	sampled := greedy("molly-demo:billing", "tell me", 12)
	sampled["n"], sampled["temperature"], sampled["seed"] = 3, 1.0, 42
	_, a := mustText(t, e, sampled)
	_, b := mustText(t, e, sampled)
	for i := range 3 {
		if a.Choices[i].Message.Content != b.Choices[i].Message.Content {
			t.Errorf("seeded choice %d not reproducible: %q vs %q", i, a.Choices[i].Message.Content, b.Choices[i].Message.Content)
		}
	}
	if a.Choices[0].Message.Content == a.Choices[1].Message.Content && a.Choices[1].Message.Content == a.Choices[2].Message.Content {
		t.Errorf("three sampled choices are identical: %q", a.Choices[0].Message.Content)
	}
}

func TestStopStringsSplitAcrossTokensAreRemoved(t *testing.T) {
	e := newEngine(t, nil)
	full, _ := mustText(t, e, greedy("molly-demo:support", "stop test", 30))
	if len(full) < 12 {
		t.Fatalf("output too short: %q", full)
	}
	cases := []struct {
		name string
		stop any
		from int
	}{
		{"a three-byte stop string, one byte per token", full[6:9], 6},
		{"the earliest of several stop strings wins", []string{full[10:12], full[4:7]}, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var first string
			switch s := tc.stop.(type) {
			case string:
				first = s
			case []string:
				first = s[1]
			}
			want := full[:strings.Index(full, first)]
			for _, stream := range []bool{false, true} {
				body := greedy("molly-demo:support", "stop test", 30)
				body["stop"] = tc.stop
				var got, finish string
				if stream {
					body["stream"] = true
					chunks := streamChat(t, e, body)
					for _, c := range chunks {
						for _, ch := range c.Choices {
							got += ch.Delta.Content
							if ch.FinishReason != nil {
								finish = *ch.FinishReason
							}
							if strings.Contains(ch.Delta.Content, first[:1]) && strings.HasSuffix(got, first[:1]) && !strings.HasPrefix(want+"\x00", got) {
								t.Errorf("stream showed part of the stop string: %q", got)
							}
						}
					}
				} else {
					_, r := mustText(t, e, body)
					got, finish = r.Choices[0].Message.Content, r.Choices[0].FinishReason
				}
				if got != want || finish != "stop" {
					t.Errorf("stream=%v: got %q (%s), want %q (stop)", stream, got, finish, want)
				}
				// The choice names the stop string that matched, as vLLM's
				// stop_reason does (the Messages API's stop_sequence).
				w := call(t, e, context.Background(), http.MethodPost, "/v1/chat/completions", body)
				path := "choices.0.stop_reason"
				if stream {
					path = `..#(choices.0.finish_reason=="stop").choices.0.stop_reason`
				}
				raw := w.Body.String()
				if stream {
					raw = strings.ReplaceAll(strings.ReplaceAll(strings.TrimSuffix(strings.TrimSpace(raw), "data: [DONE]"), "data: ", ""), "\n\n", "\n")
				}
				if sr := gjson.Get(raw, path).Str; sr != first {
					t.Errorf("stream=%v: stop_reason %q, want %q\n%s", stream, sr, first, w.Body)
				}
			}
		})
	}
	// An answer that stopped without a stop string names none.
	_, r := mustText(t, e, greedy("molly-demo:support", "stop test", 3))
	w := call(t, e, context.Background(), http.MethodPost, "/v1/chat/completions", greedy("molly-demo:support", "stop test", 3))
	if gjson.Get(w.Body.String(), "choices.0.stop_reason").Exists() || r.Choices[0].FinishReason != "length" {
		t.Errorf("stop_reason without a stop string: %s", w.Body)
	}
}

type streamChunk struct {
	Object  string `json:"object"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *Usage `json:"usage"`
	Raw   map[string]json.RawMessage
}

// streamChat posts a streaming request and returns its chunks; it fails
// unless the stream ends with "data: [DONE]".
func streamChat(t testing.TB, e *Engine, body map[string]any) []streamChunk {
	t.Helper()
	path := "/v1/chat/completions"
	if _, ok := body["prompt"]; ok {
		path = "/v1/completions"
	}
	return parseSSE(t, call(t, e, context.Background(), http.MethodPost, path, body))
}

// parseSSE returns a recorded stream's chunks; it fails unless the answer
// is an event stream ending with "data: [DONE]".
func parseSSE(t testing.TB, w *httptest.ResponseRecorder) []streamChunk {
	t.Helper()
	if w.Code != http.StatusOK || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d %q: %s", w.Code, w.Header().Get("Content-Type"), w.Body.String())
	}
	var out []streamChunk
	sc := bufio.NewScanner(w.Body)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("bad SSE line %q", line)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		if done {
			t.Fatalf("data after [DONE]: %q", data)
		}
		var c streamChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatal(err)
		}
		_ = json.Unmarshal([]byte(data), &c.Raw)
		out = append(out, c)
	}
	if !done {
		t.Fatal("stream did not end with [DONE]")
	}
	return out
}

func TestStreamingReportsExactUsageLast(t *testing.T) {
	e := newEngine(t, nil)
	full, r := mustText(t, e, greedy("molly-demo:legal", "count", 16))
	for _, tc := range []struct {
		name         string
		includeUsage bool
	}{{"with include_usage the last chunk carries usage", true}, {"without include_usage no chunk carries usage", false}} {
		t.Run(tc.name, func(t *testing.T) {
			body := greedy("molly-demo:legal", "count", 16)
			body["stream"] = true
			body["stream_options"] = map[string]any{"include_usage": tc.includeUsage}
			chunks := streamChat(t, e, body)
			var text string
			var finish string
			for i, c := range chunks {
				_, hasUsage := c.Raw["usage"]
				last := i == len(chunks)-1
				if tc.includeUsage != hasUsage {
					t.Errorf("chunk %d has usage key = %v", i, hasUsage)
				}
				if tc.includeUsage && last {
					if len(c.Choices) != 0 || c.Usage == nil || *c.Usage != *r.Usage {
						t.Errorf("last chunk %+v, want no choices and usage %+v", c, *r.Usage)
					}
					continue
				}
				if c.Usage != nil {
					t.Errorf("chunk %d carries usage early", i)
				}
				if i == 0 && c.Choices[0].Delta.Role != "assistant" {
					t.Errorf("first chunk has role %q", c.Choices[0].Delta.Role)
				}
				text += c.Choices[0].Delta.Content
				if c.Choices[0].FinishReason != nil {
					finish = *c.Choices[0].FinishReason
				}
			}
			if text != full || finish != "length" {
				t.Errorf("streamed %q (%s), non-streamed %q (length)", text, finish, full)
			}
		})
	}
	if r.Usage.CompletionTokens != 16 || r.Usage.TotalTokens != r.Usage.PromptTokens+16 {
		t.Errorf("usage %+v, want 16 completion tokens", *r.Usage)
	}
	prompt, _ := e.Tokenize("<|im_start|>user\ncount<|im_end|>\n<|im_start|>assistant\n")
	if r.Usage.PromptTokens != len(prompt) {
		t.Errorf("prompt_tokens %d, want %d", r.Usage.PromptTokens, len(prompt))
	}
}

func TestLogprobsMatchTheGreedyChoice(t *testing.T) {
	e := newEngine(t, nil)
	body := greedy("molly-demo", "logprobs please", 5)
	body["logprobs"] = true
	body["top_logprobs"] = 3
	_, r := mustText(t, e, body)
	lp := r.Choices[0].Logprobs
	if lp == nil || len(lp.Content) != 5 {
		t.Fatalf("logprobs %+v, want 5 entries", lp)
	}
	var text string
	for _, c := range lp.Content {
		text += c.Token
		if len(c.TopLogprobs) != 3 || c.TopLogprobs[0].Token != c.Token || c.TopLogprobs[0].Logprob != c.Logprob {
			t.Errorf("greedy token %q (%g) is not the top alternative %+v", c.Token, c.Logprob, c.TopLogprobs)
		}
		if c.Logprob > 0 || c.TopLogprobs[1].Logprob > c.TopLogprobs[0].Logprob {
			t.Errorf("logprobs not ordered or positive: %+v", c)
		}
	}
	if text != r.Choices[0].Message.Content {
		t.Errorf("logprob tokens spell %q, content is %q", text, r.Choices[0].Message.Content)
	}
}

func TestCompletionsEndpoint(t *testing.T) {
	e := newEngine(t, nil)
	w := call(t, e, context.Background(), http.MethodPost, "/v1/completions", map[string]any{
		"model": "molly-demo:payments", "prompt": "Once upon", "max_tokens": 6, "temperature": 0, "logprobs": 2,
	})
	var r chatResponse
	if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil || w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body.String())
	}
	if r.Object != "text_completion" || len(r.Choices) != 1 || r.Choices[0].FinishReason != "length" || r.Usage.CompletionTokens != 6 {
		t.Fatalf("response %+v", r)
	}
	if lp := r.Choices[0].Logprobs; lp == nil || strings.Join(lp.Tokens, "") != r.Choices[0].Text || len(lp.TokenLogprobs) != 6 {
		t.Errorf("legacy logprobs %+v for text %q", lp, r.Choices[0].Text)
	}
	chunks := streamChat(t, e, map[string]any{"model": "molly-demo:payments", "prompt": "Once upon", "max_tokens": 6, "temperature": 0, "stream": true})
	var text string
	for _, c := range chunks {
		text += c.Choices[0].Text
	}
	if text != r.Choices[0].Text {
		t.Errorf("streamed %q, want %q", text, r.Choices[0].Text)
	}
}

func TestModelsListsBaseAndAdapters(t *testing.T) {
	e := newEngine(t, nil)
	w := call(t, e, context.Background(), http.MethodGet, "/v1/models", nil)
	var r struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range r.Data {
		ids = append(ids, d.ID)
	}
	want := "molly-demo molly-demo:billing molly-demo:legal molly-demo:payments molly-demo:support"
	if strings.Join(ids, " ") != want || r.Object != "list" {
		t.Errorf("models %v, want %s", ids, want)
	}
}

func TestErrorsUseOpenAIShapeAndStatus(t *testing.T) {
	e := newEngine(t, func(c *Config) { c.NCtx = 8 * 256 })
	long := strings.Repeat("a", 400)
	cases := []struct {
		name   string
		method string
		path   string
		body   any
		status int
		code   string
		param  string
	}{
		{"an unknown base model is 404 model_not_found", "POST", "/v1/chat/completions", greedy("gpt-9", "hi", 1), 404, "model_not_found", "model"},
		{"an unknown adapter is 404 model_not_found", "POST", "/v1/chat/completions", greedy("molly-demo:nope", "hi", 1), 404, "model_not_found", "model"},
		{"invalid JSON is 400", "POST", "/v1/chat/completions", "{", 400, "", ""},
		{"a prompt longer than the context is 400 context_length_exceeded", "POST", "/v1/chat/completions", greedy("molly-demo", long, 1), 400, "context_length_exceeded", "messages"},
		{"n beyond the sequences is 400", "POST", "/v1/chat/completions", map[string]any{"model": "molly-demo", "messages": []any{map[string]any{"role": "user", "content": "x"}}, "n": 99}, 400, "", "n"},
		{"temperature above 2 is 400", "POST", "/v1/chat/completions", map[string]any{"model": "molly-demo", "messages": []any{map[string]any{"role": "user", "content": "x"}}, "temperature": 3}, 400, "decimal_above_max_value", "temperature"},
		{"the deprecated functions are 400, not ignored", "POST", "/v1/chat/completions", map[string]any{"model": "molly-demo", "messages": []any{map[string]any{"role": "user", "content": "x"}}, "functions": []any{map[string]any{"name": "f", "parameters": map[string]any{"type": "object"}}}, "function_call": map[string]any{"name": "f"}}, 400, "unsupported_parameter", "functions"},
		{"audio output is 400", "POST", "/v1/chat/completions", map[string]any{"model": "molly-demo", "messages": []any{map[string]any{"role": "user", "content": "x"}}, "modalities": []string{"text", "audio"}, "audio": map[string]any{"voice": "alloy", "format": "wav"}}, 400, "unsupported_parameter", "modalities"},
		// A parameter of the API the engine does not serve is OpenAI's 400
		// unsupported_parameter, param naming it (the code the gateway's
		// openai.Unsupported gives), not a code-less 400.
		{"echo is 400 unsupported_parameter", "POST", "/v1/completions", map[string]any{"model": "molly-demo", "prompt": "x", "echo": true}, 400, "unsupported_parameter", "echo"},
		{"suffix is 400 unsupported_parameter", "POST", "/v1/completions", map[string]any{"model": "molly-demo", "prompt": "x", "suffix": "the end"}, 400, "unsupported_parameter", "suffix"},
		{"best_of above 1 is 400 unsupported_parameter", "POST", "/v1/completions", map[string]any{"model": "molly-demo", "prompt": "x", "best_of": 3}, 400, "unsupported_parameter", "best_of"},
		{"shortened dimensions are 400 unsupported_parameter", "POST", "/v1/embeddings", map[string]any{"model": "molly-demo", "input": "x", "dimensions": 1}, 400, "unsupported_parameter", "dimensions"},
		{"a custom tool is 400 unsupported_parameter", "POST", "/v1/chat/completions", map[string]any{"model": "molly-demo", "messages": []any{map[string]any{"role": "user", "content": "x"}}, "tools": []any{map[string]any{"type": "custom", "custom": map[string]any{"name": "c"}}}}, 400, "unsupported_parameter", "tools[0].type"},
		{"an allowed_tools tool_choice is 400 unsupported_parameter", "POST", "/v1/chat/completions", map[string]any{"model": "molly-demo", "messages": []any{map[string]any{"role": "user", "content": "x"}}, "tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}}, "tool_choice": map[string]any{"type": "allowed_tools", "allowed_tools": map[string]any{"mode": "auto", "tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}}}}}, 400, "unsupported_parameter", "tool_choice"},
		{"GET on completions is 405", "GET", "/v1/chat/completions", nil, 405, "method_not_allowed", ""},
		{"GET on embeddings is 405", "GET", "/v1/embeddings", nil, 405, "method_not_allowed", ""},
		{"an unknown path is 404", "POST", "/v1/audio/speech", nil, 404, "not_found", ""},
		{"embeddings without a body is 400", "POST", "/v1/embeddings", nil, 400, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := call(t, e, context.Background(), tc.method, tc.path, tc.body)
			var r chatResponse
			if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil || r.Error == nil {
				t.Fatalf("body %q is not an OpenAI error", w.Body.String())
			}
			code, param := "", ""
			if r.Error.Code != nil {
				code = *r.Error.Code
			}
			if r.Error.Param != nil {
				param = *r.Error.Param
			}
			if w.Code != tc.status || code != tc.code || param != tc.param || r.Error.Message == "" || r.Error.Type == "" {
				t.Errorf("status %d code %q param %q (%s), want %d %q %q", w.Code, code, param, r.Error.Message, tc.status, tc.code, tc.param)
			}
			// A 405 must list the methods the path serves (RFC 9110 §15.5.6).
			if allow := w.Header().Get("Allow"); tc.status == http.StatusMethodNotAllowed && allow != http.MethodPost {
				t.Errorf("405 with Allow %q, want POST", allow)
			}
		})
	}
}

func TestWriteDemoIsDeterministic(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	for _, d := range []string{a, b} {
		if err := WriteDemo(d, 3, "tiny"); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{DemoModelFile, filepath.Join(DemoAdapterDir, "legal.gguf")} {
		x, _ := os.ReadFile(filepath.Join(a, f))
		y, _ := os.ReadFile(filepath.Join(b, f))
		if len(x) == 0 || !bytes.Equal(x, y) {
			t.Errorf("%s differs between two runs with the same seed", f)
		}
	}
}

func TestAdaptersCanBeAddedAndRemovedAtRunTime(t *testing.T) {
	dir := t.TempDir()
	e := newEngine(t, func(c *Config) { c.AdapterDir = dir })
	base, _ := gguf.SizeConfig("tiny", 1)
	has := func(name string) bool {
		for _, m := range e.Models() {
			if m == "molly-demo:"+name {
				return true
			}
		}
		return false
	}
	steps := []struct {
		name  string
		do    func() error
		model string
		want  bool
	}{
		{"a file dropped into the directory is served after a rescan", func() error {
			if err := gguf.WriteAdapter(filepath.Join(dir, "fresh.gguf"), base, gguf.AdapterConfig{Name: "fresh", Seed: 5}); err != nil {
				return err
			}
			return e.Rescan()
		}, "fresh", true},
		{"a file deleted from the directory is no longer served", func() error {
			if err := os.Remove(filepath.Join(dir, "fresh.gguf")); err != nil {
				return err
			}
			return e.Rescan()
		}, "fresh", false},
		{"an adapter added through the API is served", func() error {
			return e.AddAdapter("api", filepath.Join(demoDir, DemoAdapterDir, "legal.gguf"))
		}, "api", true},
		{"an adapter removed through the API is no longer served", func() error {
			return e.RemoveAdapter("api")
		}, "api", false},
	}
	for _, name := range []string{".", "..", "", "a/b", "a:b", "a b"} {
		if err := e.AddAdapter(name, filepath.Join(demoDir, DemoAdapterDir, "legal.gguf")); err == nil {
			t.Errorf("AddAdapter(%q) accepted a name that cannot be addressed", name)
		}
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		code, _ := chat(t, e, greedy("molly-demo:"+st.model, "hi", 2))
		if has(st.model) != st.want || (code == http.StatusOK) != st.want {
			t.Errorf("%s: listed=%v status=%d", st.name, has(st.model), code)
		}
	}
}

func TestQueuedRequestsWaitForSequencesAndHotBudgetThenMatch(t *testing.T) {
	st, err := os.Stat(filepath.Join(demoDir, DemoAdapterDir, "support.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		mod  func(*Config)
	}{
		{"more requests than sequences queue and finish", func(c *Config) { c.NSeqMax = 3; c.NCtx = 3 * 512 }},
		{"a hot budget of one adapter serialises adapters without deadlock", func(c *Config) { c.HotBytes = st.Size() }},
	}
	models := []string{"molly-demo:support", "molly-demo:billing", "molly-demo", "molly-demo:legal", "molly-demo:support", "molly-demo:payments"}
	ref := newEngine(t, nil)
	want := make([]string, len(models))
	wantR := make([]chatResponse, len(models))
	for i, m := range models {
		want[i], wantR[i] = mustText(t, ref, greedyLogprobs(m, fmt.Sprint("question ", i), 16))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, tc.mod)
			got := make([]string, len(models))
			gotR := make([]chatResponse, len(models))
			var wg sync.WaitGroup
			for i, m := range models {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got[i], gotR[i] = mustText(t, e, greedyLogprobs(m, fmt.Sprint("question ", i), 16))
				}()
			}
			wg.Wait()
			for i := range models {
				if got[i] != want[i] {
					why, tie := nearTie(wantR[i], gotR[i])
					if tie {
						t.Logf("%s: %q, want %q: %s", models[i], got[i], want[i], why)
						continue
					}
					t.Errorf("%s: %q, want %q: %s", models[i], got[i], want[i], why)
				}
			}
			if s := e.Stats(); s.BusySequences != 0 || s.Queued != 0 {
				t.Errorf("stats after all finished: %+v", s)
			}
		})
	}
}

func TestGenerationStopsAtTheSequenceContext(t *testing.T) {
	e := newEngine(t, func(c *Config) { c.NSeqMax = 2; c.NCtx = 2 * 256 })
	_, _, _, perSeq := e.ModelInfo()
	body := map[string]any{"model": "molly-demo:support", "messages": []any{map[string]any{"role": "user", "content": strings.Repeat("x", 200)}}, "temperature": 0}
	_, r := mustText(t, e, body)
	c := r.Choices[0]
	if perSeq != 256 || c.FinishReason != "length" || r.Usage.TotalTokens != perSeq {
		t.Errorf("finish %q, usage %+v, context per sequence %d: want length and total = context", c.FinishReason, *r.Usage, perSeq)
	}
}

func TestRequestsSharingAnAdapterDecodeTogetherWithTheSameTokensAsAlone(t *testing.T) {
	e := newEngine(t, nil)
	prompts := []string{"a b c", "Why was I charged twice?", "Refund my card", "Hello", "x", "a longer prompt than the others"}
	alone := make([]string, len(prompts))
	for i := range prompts {
		alone[i], _ = mustText(t, e, greedy("molly-demo:support", prompts[i], 40))
	}
	together := make([]string, len(prompts))
	steps := e.Stats().Steps
	var wg sync.WaitGroup
	for i := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			together[i], _ = mustText(t, e, greedy("molly-demo:support", prompts[i], 40))
		}()
	}
	wg.Wait()
	for i := range prompts {
		if together[i] != alone[i] {
			t.Errorf("prompt %d: batched %q, alone %q", i, together[i], alone[i])
		}
	}
	// Sharing steps is the point: six 40-token requests alone take 240+
	// steps; together far fewer.
	if d := e.Stats().Steps - steps; d > 150 {
		t.Errorf("six concurrent requests took %d steps; they were not batched", d)
	}
}

func TestAQ8_0CopyOfTheBaseServesTheSameAdapters(t *testing.T) {
	dir := t.TempDir()
	if err := WriteDemo(dir, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	if err := QuantizeModel(filepath.Join(dir, DemoModelFile), "q8_0"); err != nil {
		t.Fatal(err)
	}
	cfg := DemoConfig(dir)
	cfg.Threads = 1
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if desc, _, _, _ := e.ModelInfo(); !strings.Contains(desc, "Q8_0") {
		t.Errorf("model description %q does not say Q8_0", desc)
	}
	if got := len(e.Adapters()); got != len(DemoAdapters) {
		t.Fatalf("%d adapters accepted on the quantized base, want %d", got, len(DemoAdapters))
	}
	base, _ := mustText(t, e, greedy("molly-demo", "quantized", 12))
	withAdapter, _ := mustText(t, e, greedy("molly-demo:support", "quantized", 12))
	if base == withAdapter {
		t.Errorf("adapter had no effect on the quantized base: %q", base)
	}
}

func TestPrefixCacheReusesWholeChunksOnTheSameAdapterWithoutChangingOutput(t *testing.T) {
	plain := newEngine(t, nil)
	cached := newEngine(t, func(c *Config) { c.PrefixCache = true; c.PrefillChunk = 16 })
	long := strings.Repeat("The customer writes about an order. ", 4)
	first := greedy("molly-demo:support", long+"First question?", 24)
	cases := []struct {
		name       string
		body       map[string]any
		wantCached bool
	}{
		{"a longer prompt with the same prefix on the same adapter reuses chunks", greedy("molly-demo:support", long+"Second, different question?", 24), true},
		{"the same prompt again reuses all chunks but the last", first, true},
		{"the same prefix on another adapter reuses nothing", greedy("molly-demo:billing", long+"First question?", 24), false},
		{"the same prefix on the base model reuses nothing", greedy("molly-demo", long+"First question?", 24), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mustText(t, cached, first) // fills the cache
			want, wr := mustText(t, plain, tc.body)
			got, gr := mustText(t, cached, tc.body)
			if got != want {
				t.Errorf("with prefix cache %q, without %q", got, want)
			}
			d := gr.Usage.PromptTokensDetails
			if d == nil || (d.CachedTokens > 0) != tc.wantCached || d.CachedTokens%16 != 0 || d.CachedTokens >= gr.Usage.PromptTokens {
				t.Errorf("prompt_tokens_details %+v for %d prompt tokens", d, gr.Usage.PromptTokens)
			}
			if gr.Usage.PromptTokens != wr.Usage.PromptTokens || gr.Usage.CompletionTokens != wr.Usage.CompletionTokens {
				t.Errorf("usage %+v, want %+v", *gr.Usage, *wr.Usage)
			}
		})
	}
}
