package pipeline

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/tidwall/gjson"

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
