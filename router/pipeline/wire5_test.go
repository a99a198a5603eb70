package pipeline

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/route"
)

// Groq reports a stream's usage under x_groq.usage on its last chunk, not
// in a usage chunk: the ledger bills those counts (not an estimate), and a
// client that asked for stream_options.include_usage gets them in the
// spec's usage chunk (openai-go's stream, its last chunk with no choices).
func TestGroqStreamUsageIsBilledAndSent(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"id":"chatcmpl-g","object":"chat.completion.chunk","created":1700000000,"model":"llama","x_groq":{"id":"req_1"},"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}`+"\n\n")
		fmt.Fprint(w, `data: {"id":"chatcmpl-g","object":"chat.completion.chunk","created":1700000000,"model":"llama","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"x_groq":{"id":"req_1","usage":{"queue_time":0.02,"prompt_tokens":41,"prompt_time":0.002,"completion_tokens":23,"completion_time":0.01,"total_tokens":64}}}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	ledger := &memLedger{}
	gw, _ := startGateway(t, setup{targets: []*route.Target{{Name: "groq", Tier: "T1", Endpoint: up.URL + "/v1", Models: []string{"m"}}},
		id: &identity.Identity{Member: "ann", Ledger: ledger}})
	c := openai.NewClient(option.WithBaseURL(gw.URL+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	for _, include := range []bool{true, false} {
		params := openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
		if include {
			params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		}
		s := c.Chat.Completions.NewStreaming(context.Background(), params)
		var last openai.ChatCompletionChunk
		var text string
		for s.Next() {
			last = s.Current()
			if len(last.Choices) > 0 {
				text += last.Choices[0].Delta.Content
			}
		}
		if err := s.Err(); err != nil || text != "Hi" {
			t.Fatalf("include_usage %v: %q, %v", include, text, err)
		}
		gotUsage := len(last.Choices) == 0 && gjson.Get(last.RawJSON(), "usage").IsObject()
		if gotUsage != include || include && (last.Usage.PromptTokens != 41 || last.Usage.CompletionTokens != 23 || last.Usage.TotalTokens != 64) {
			t.Fatalf("include_usage %v: last chunk %s", include, last.RawJSON())
		}
		if rec := ledger.take(); len(rec) != 1 || rec[0].PromptTokens != 41 || rec[0].CompletionTokens != 23 || rec[0].Estimated {
			t.Fatalf("include_usage %v: billed %+v", include, rec)
		}
	}
}

// A fallback after a billed failed attempt (a stream that reported its
// usage, then broke before any content) is admitted with a reservation of
// its own: what the ledger bills for the request — the upstream's own
// reports, counted here by the upstream — never exceeds what it reserved.
// Before, the second attempt ran on the first one's reservation, and the
// member's budget could be overshot by a whole answer.
func TestAFallbackAfterABilledAttemptReservesAgain(t *testing.T) {
	var mu sync.Mutex
	calls, served := 0, 0 // served: the tokens the upstream reported, its own count
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi there"}]}`
	bound := len(body) + classify.BoundPerRequest + classify.BoundPerMessage
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		if first { // the whole reservation's worth reported, then the stream breaks
			mu.Lock()
			served += bound + route.DefaultCompletionTokens
			mu.Unlock()
			fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"up","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`+"\n\n", bound, route.DefaultCompletionTokens)
			return
		}
		mu.Lock()
		served += 10
		mu.Unlock()
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"up","choices":[{"index":0,"delta":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":8,"completion_tokens":2}}`+"\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	ledger := &reservingLedger{released: make(chan int, 4)}
	gw, _ := startGateway(t, setup{targets: []*route.Target{
		{Name: "a", Tier: "T2", Endpoint: up.URL + "/v1", Models: []string{"m"}, PriceIn: 1000, PriceOut: 1000},
		{Name: "b", Tier: "T2", Endpoint: up.URL + "/v1", Models: []string{"m"}, PriceIn: 1000, PriceOut: 1000},
	}, id: &identity.Identity{Member: "ann", Ledger: ledger}})
	r := post(t, gw.URL+"/v1/chat/completions", body, "X-Molly-Sensitivity", "internal")
	if r.status != 200 || sseContent(t, r.body) != "ok" {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	rec := ledger.take()
	billed := 0
	for _, u := range rec {
		billed += u.PromptTokens + u.CompletionTokens
	}
	ledger.mu.Lock()
	reserved := 0
	for _, n := range ledger.tokens {
		reserved += n
	}
	ledger.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 || len(rec) != 2 || billed != served || billed > reserved {
		t.Fatalf("%d calls, billed %d tokens in %d records (the upstream served %d), reserved %d", calls, billed, len(rec), served, reserved)
	}
}
