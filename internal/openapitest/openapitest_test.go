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
		{"a chat chunk's usage may be null (include_usage, every chunk but the last)", "CreateChatCompletionStreamResponse",
			`{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","usage":null,"choices":[{"index":0,"finish_reason":null,"delta":{"content":"hi"}}]}`, true},
		{"a chat chunk's usage is still CompletionUsage when not null", "CreateChatCompletionStreamResponse",
			`{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","usage":{"prompt_tokens":"1"},"choices":[]}`, false},
		{"a completion chunk's usage may be null", CompletionChunk,
			`{"id":"x","object":"text_completion","created":1,"model":"m","usage":null,"choices":[{"index":0,"finish_reason":null,"text":"a","logprobs":null}]}`, true},
		{"a completion chunk's usage is still CompletionUsage when not null", CompletionChunk,
			`{"id":"x","object":"text_completion","created":1,"model":"m","usage":{"prompt_tokens":"1"},"choices":[]}`, false},
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
