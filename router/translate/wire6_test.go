package translate

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/tidwall/gjson"
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
