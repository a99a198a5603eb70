package relay

import "testing"

// BenchmarkStreamChunk measures normalising one typical stream chunk
// against the baseline every relayed chunk pays anyway in the same run:
// validating its JSON and encoding it as an SSE event. The "openai" chunk
// is already in the spec's shape but names the upstream's model; the
// "quirky" one also has a null system_fingerprint and no role.
func BenchmarkStreamChunk(b *testing.B) {
	chunks := map[string][]byte{
		"openai": []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null}]}`),
		"quirky": []byte(`{"id":"gen-1","object":"chat.completion.chunk","created":1767225600,"model":"up-model","system_fingerprint":null,"choices":[{"index":0,"delta":{"content":" the"},"finish_reason":null}]}`),
	}
	for name, c := range chunks {
		b.Run(name+"/baseline", func(b *testing.B) {
			var buf []byte
			for b.Loop() {
				if !validJSON(c) {
					b.Fatal("not JSON")
				}
				buf = AppendData(buf[:0], c)
			}
		})
		b.Run(name+"/normalised", func(b *testing.B) {
			var buf []byte
			s := NewStream(chatAnswer(true))
			s.Chunk(c) // the first chunk sets the stream's id and role
			for b.Loop() {
				if !validJSON(c) {
					b.Fatal("not JSON")
				}
				buf = AppendData(buf[:0], s.Chunk(c))
			}
		})
	}
}

// BenchmarkNormaliseBody measures normalising one whole chat completion
// already in the spec's shape but naming the upstream's model (the case of
// every answer of an OpenAI-compatible upstream), against validating its
// JSON in the same run.
func BenchmarkNormaliseBody(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1767225600,"model":"up-model",` +
		`"choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant",` +
		`"content":"Thank you for the details. We will check the routing rules and the latency targets and reply by Friday.","refusal":null}}],` +
		`"usage":{"prompt_tokens":512,"completion_tokens":24,"total_tokens":536}}`)
	ans := chatAnswer(false)
	b.Run("baseline", func(b *testing.B) {
		for b.Loop() {
			if !validJSON(body) {
				b.Fatal("not JSON")
			}
		}
	})
	b.Run("normalised", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if out := NormaliseBody(ans, body); len(out) == 0 {
				b.Fatal("empty")
			}
		}
	})
	// As the pipeline calls it: with the usage the ledger recorded.
	recorded := ans
	recorded.Usage = &Counts{Prompt: 512, Completion: 24}
	b.Run("recorded", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if out := NormaliseBody(recorded, body); len(out) == 0 {
				b.Fatal("empty")
			}
		}
	})
}
