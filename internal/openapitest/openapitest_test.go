package openapitest

import (
	"strings"
	"testing"
)

func TestTheDocumentValidatesWhatTheSpecSays(t *testing.T) {
	s := Load(t)
	tests := []struct {
		name, schema, body string
		valid              bool
	}{
		{"a chat answer as the spec shows it", "CreateChatCompletionResponse",
			`{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"hi","refusal":null}}]}`, true},
		{"system_fingerprint null is not a string", "CreateChatCompletionResponse",
			`{"id":"x","object":"chat.completion","created":1,"model":"m","system_fingerprint":null,"choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"hi","refusal":null}}]}`, false},
		{"a message needs refusal (resolved through its $ref)", "CreateChatCompletionResponse",
			`{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"hi"}}]}`, false},
		{"a chunk's finish_reason may be null (nullable: true rewritten)", "CreateChatCompletionStreamResponse",
			`{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"finish_reason":null,"delta":{"content":"hi"}}]}`, true},
		{"a chunk's finish_reason is still an enum", "CreateChatCompletionStreamResponse",
			`{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"finish_reason":"eos","delta":{}}]}`, false},
		{"a completion chunk's finish_reason may be null", CompletionChunk,
			`{"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":null,"text":"a","logprobs":null}]}`, true},
		{"an error with every member", "ErrorResponse", `{"error":{"message":"m","type":"t","param":null,"code":null}}`, true},
		{"an error needs code and param", "ErrorResponse", `{"error":{"message":"m","type":"t"}}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.Check(tt.schema, []byte(tt.body))
			if (err == nil) != tt.valid {
				t.Fatalf("valid = %v, want %v: %v", err == nil, tt.valid, err)
			}
		})
	}
	// The self-referencing filter schemas compile ($recursiveRef rewritten).
	if err := s.Check("CompoundFilter", []byte(`{"type":"and","filters":[{"type":"or","filters":[]}]}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.Check("Response", []byte(`{}`)); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("an empty Response validated: %v", err)
	}
}
