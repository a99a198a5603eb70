package openapitest

import (
	"testing"
	"time"
)

func TestProbe(t *testing.T) {
	start := time.Now()
	s := Load(t)
	t.Logf("load %v", time.Since(start))
	for _, n := range []string{"CreateChatCompletionResponse", "CreateChatCompletionStreamResponse", "CreateCompletionResponse", "CreateEmbeddingResponse", "ListModelsResponse", "Model", "ErrorResponse", "Response", "ResponseStreamEvent"} {
		st := time.Now()
		if _, err := s.schema(n); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s %v", n, time.Since(st))
	}
	t.Log(s.Check("CreateChatCompletionResponse", []byte(`{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"hi","refusal":null}}],"system_fingerprint":null}`)))
	t.Log(s.Check("CreateChatCompletionStreamResponse", []byte(`{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"finish_reason":null,"delta":{"content":"hi"}}]}`)))
	t.Log(s.Check("ErrorResponse", []byte(`{"error":{"message":"m","type":"t","param":null,"code":null,"reasons":["a"]}}`)))
}
