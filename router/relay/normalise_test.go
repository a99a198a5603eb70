package relay

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
	oai "github.com/molly-gateway/molly/router/openai"
)

const created = 1767225600 // 2026-01-01T00:00:00Z

func chatAnswer(includeUsage bool) Answer {
	return Answer{Endpoint: oai.EndpointChat, Model: "alias", IncludeUsage: includeUsage, Created: created}
}

func TestNormaliseBodyMakesSpecValidAnswers(t *testing.T) {
	spec := openapitest.Load(t)
	tests := []struct {
		name   string
		ep     oai.Endpoint
		schema string
		body   string
		check  map[string]string // gjson path → raw JSON expected after normalising
	}{
		{"a llama.cpp-style chat answer: null fingerprint, no refusal, no created, the upstream's model", oai.EndpointChat, "CreateChatCompletionResponse",
			`{"id":"chatcmpl-1","object":"chat.completion","model":"molly-demo","system_fingerprint":null,"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`,
			map[string]string{"model": `"alias"`, "created": "1767225600", "choices.0.message.refusal": "null", "choices.0.logprobs": "null",
				"usage.total_tokens": "4", "system_fingerprint": ""}},
		{"finish reasons outside the enum are mapped", oai.EndpointChat, "CreateChatCompletionResponse",
			`{"id":"x","object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"finish_reason":"eos","logprobs":null,"message":{"role":"assistant","content":"a","refusal":null}},{"index":1,"finish_reason":"max_tokens","logprobs":null,"message":{"role":"assistant","content":"b","refusal":null}}]}`,
			map[string]string{"choices.0.finish_reason": `"stop"`, "choices.1.finish_reason": `"length"`, "created": "5"}},
		{"a tool call cut by max_tokens finishes with length", oai.EndpointChat, "CreateChatCompletionResponse",
			`{"id":"x","object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_a","function":{"name":"f","arguments":"{\"city\": \"Par"}}]}}]}`,
			map[string]string{"choices.0.finish_reason": `"length"`, "choices.0.message.tool_calls.0.type": `"function"`}},
		{"tool-call arguments sent as an object (Ollama-style) become its JSON text, not an empty object", oai.EndpointChat, "CreateChatCompletionResponse",
			`{"id":"x","object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"finish_reason":"tool_calls","logprobs":null,"message":{"role":"assistant","content":null,"refusal":null,"tool_calls":[{"id":"call_a","type":"function","function":{"name":"f","arguments":{"city": "Rome", "days": 2}}}]}}]}`,
			map[string]string{"choices.0.message.tool_calls.0.function.arguments": `"{\"city\":\"Rome\",\"days\":2}"`, "choices.0.finish_reason": `"tool_calls"`}},
		{"a logprobs object gets its refusal member", oai.EndpointChat, "CreateChatCompletionResponse",
			`{"id":"x","object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"a"},"logprobs":{"content":[{"token":"a","logprob":-0.1,"bytes":[97],"top_logprobs":[]}]}}]}`,
			map[string]string{"choices.0.logprobs.refusal": "null"}},
		{"LiteLLM/vLLM/Groq nulls: function_call, tool_calls, usage details, an unknown service_tier, logprob entries without bytes or top_logprobs", oai.EndpointChat, "CreateChatCompletionResponse",
			`{"id":"x","object":"chat.completion","created":5,"model":"m","service_tier":"on_demand","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"a","refusal":null,"function_call":null,"tool_calls":null},"logprobs":{"content":[{"token":"a","logprob":-0.1,"top_logprobs":[{"token":"a","logprob":-0.1}]},{"token":"b","logprob":-0.2}],"refusal":null}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4,"prompt_tokens_details":null,"completion_tokens_details":null}}`,
			map[string]string{"service_tier": "", "choices.0.message.function_call": "", "choices.0.message.tool_calls": "", "choices.0.finish_reason": `"stop"`,
				"choices.0.logprobs.content.0.bytes": "null", "choices.0.logprobs.content.0.top_logprobs.0.bytes": "null", "choices.0.logprobs.content.1.top_logprobs": "[]",
				"usage.prompt_tokens_details": "", "usage.completion_tokens_details": ""}},
		{"a text completion", oai.EndpointCompletions, "CreateCompletionResponse",
			`{"id":"cmpl-1","model":"up","choices":[{"text":"hi","finish_reason":null}],"system_fingerprint":null}`,
			map[string]string{"object": `"text_completion"`, "choices.0.index": "0", "choices.0.logprobs": "null", "choices.0.finish_reason": `"stop"`, "model": `"alias"`}},
		{"an embeddings answer whose data is null is an empty list, not made-up embeddings", oai.EndpointEmbeddings, "CreateEmbeddingResponse",
			`{"object":"list","model":"up","data":null,"usage":{"prompt_tokens":2,"total_tokens":2}}`,
			map[string]string{"data": "[]", "model": `"alias"`}},
		{"an embeddings list", oai.EndpointEmbeddings, "CreateEmbeddingResponse",
			`{"model":"up","data":[{"embedding":[0.1,0.2]}],"usage":{"prompt_tokens":2}}`,
			map[string]string{"object": `"list"`, "data.0.object": `"embedding"`, "data.0.index": "0", "usage.total_tokens": "2", "model": `"alias"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if spec.Check(tt.schema, []byte(tt.body)) == nil {
				t.Fatalf("the validator accepts the upstream's body as it is; the case proves nothing")
			}
			out := NormaliseBody(Answer{Endpoint: tt.ep, Model: "alias", Created: created}, []byte(tt.body))
			spec.Validate(t, tt.schema, out)
			for path, want := range tt.check {
				got := gjson.GetBytes(out, path)
				if want == "" {
					if got.Exists() {
						t.Errorf("%s = %s, want it absent", path, got.Raw)
					}
					continue
				}
				if got.Raw != want {
					t.Errorf("%s = %s, want %s\n%s", path, got.Raw, want, out)
				}
			}
		})
	}
}

func TestNormaliseErrorMakesErrorResponses(t *testing.T) {
	spec := openapitest.Load(t)
	for _, body := range []string{
		`{"error":{"message":"bad"}}`,
		`{"error":"model overloaded"}`,
		`{"error":{"message":"x","type":"invalid_request_error","code":400}}`,
		`<html>502 Bad Gateway</html>`,
		``,
		`{"object":"error","message":"flat","type":"BadRequestError","param":null,"code":400}`,
	} {
		out := NormaliseError(502, []byte(body))
		spec.Validate(t, "ErrorResponse", out)
	}
	if got := gjson.GetBytes(NormaliseError(400, []byte(`{"error":"model overloaded"}`)), "error.message").Str; got != "model overloaded" {
		t.Fatalf("message %q", got)
	}
	// vLLM's and FastChat's flat error (their ErrorResponse: object "error",
	// message, type, param, code as an integer) keeps its message and type.
	flat := NormaliseError(400, []byte(`{"object":"error","message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","param":"messages","code":400}`))
	if e := gjson.GetBytes(flat, "error"); e.Get("message").Str != "This model's maximum context length is 4096 tokens." ||
		e.Get("type").Str != "BadRequestError" || e.Get("param").Str != "messages" || e.Get("code").Raw != `"400"` {
		t.Fatalf("flat error became %s", flat)
	}
}

// providerStream is a stream as some OpenAI-compatible servers send it:
// no role on the first delta, a null system_fingerprint, prompt tokens on
// the first chunk and completion tokens on the last one's usage, two
// parallel tool calls both streamed with index 0, the usage on the finish
// chunk, and the upstream's own model name.
var providerStream = []string{
	`{"id":"gen-1","object":"chat.completion.chunk","created":42,"model":"up-model","system_fingerprint":null,"choices":[{"index":0,"delta":{"content":"Let me check."},"finish_reason":null}],"usage":{"prompt_tokens":7,"completion_tokens":0}}`,
	`{"id":"gen-1","object":"chat.completion.chunk","created":42,"model":"up-model","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"weather","arguments":""}}]},"finish_reason":null}]}`,
	`{"id":"gen-1","object":"chat.completion.chunk","created":42,"model":"up-model","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":\"Rome\"}"}}]},"finish_reason":null}]}`,
	`{"id":"gen-1","object":"chat.completion.chunk","created":42,"model":"up-model","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_b","function":{"name":"weather","arguments":"{\"city\":"}}]},"finish_reason":null}]}`,
	`{"id":"gen-1","object":"chat.completion.chunk","created":42,"model":"up-model","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Oslo\"}"}}]},"finish_reason":null}]}`,
	`{"id":"gen-1","object":"chat.completion.chunk","created":42,"model":"up-model","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":0,"completion_tokens":5}}`,
}

func runStream(t *testing.T, s *Stream, chunks []string) [][]byte {
	t.Helper()
	var out [][]byte
	for _, c := range chunks {
		if b := s.Chunk([]byte(c)); b != nil {
			out = append(out, b)
		}
	}
	if fin := s.Final(0, 0); fin != nil {
		out = append(out, fin)
	}
	return out
}

func TestStreamNormalisesChunkByChunk(t *testing.T) {
	spec := openapitest.Load(t)
	if spec.Check("CreateChatCompletionStreamResponse", []byte(providerStream[0])) == nil {
		t.Fatal("the validator accepts a chunk with a null system_fingerprint; the test proves nothing")
	}
	out := runStream(t, NewStream(chatAnswer(true)), providerStream)
	for _, c := range out {
		spec.Validate(t, "CreateChatCompletionStreamResponse", c)
		if gjson.GetBytes(c, "model").Str != "alias" || gjson.GetBytes(c, "id").Str != "gen-1" || gjson.GetBytes(c, "created").Int() != 42 {
			t.Errorf("chunk header: %s", c)
		}
	}
	if got := gjson.GetBytes(out[0], "choices.0.delta.role").Str; got != "assistant" {
		t.Errorf("first delta role %q", got)
	}
	// The usage is on one last chunk with no choices, merged: 7 prompt
	// tokens from the first report, 5 completion tokens from the last.
	last := out[len(out)-1]
	if gjson.GetBytes(last, "choices.#").Int() != 0 || gjson.GetBytes(last, "usage.prompt_tokens").Int() != 7 ||
		gjson.GetBytes(last, "usage.completion_tokens").Int() != 5 || gjson.GetBytes(last, "usage.total_tokens").Int() != 12 {
		t.Fatalf("last chunk %s", last)
	}
	// Every other chunk has "usage": null, as OpenAI sends them with
	// include_usage (whether the upstream sent a usage object, null or
	// nothing on it).
	for _, c := range out[:len(out)-1] {
		if u := gjson.GetBytes(c, "usage"); u.Raw != "null" {
			t.Fatalf("usage %q on a chunk with choices, want null: %s", u.Raw, c)
		}
	}
	// The SDK's own accumulator (an oracle outside Molly) sees two calls.
	var acc openai.ChatCompletionAccumulator
	for _, c := range out {
		var chunk openai.ChatCompletionChunk
		if err := json.Unmarshal(c, &chunk); err != nil {
			t.Fatal(err)
		}
		if !acc.AddChunk(chunk) {
			t.Fatalf("the accumulator refused %s", c)
		}
	}
	calls := acc.Choices[0].Message.ToolCalls
	if len(calls) != 2 || calls[0].ID != "call_a" || calls[0].Function.Arguments != `{"city":"Rome"}` ||
		calls[1].ID != "call_b" || calls[1].Function.Arguments != `{"city":"Oslo"}` {
		t.Fatalf("accumulated tool calls %+v", calls)
	}
	if acc.Choices[0].FinishReason != "tool_calls" || acc.Usage.PromptTokens != 7 || acc.Usage.CompletionTokens != 5 {
		t.Fatalf("finish %q usage %+v", acc.Choices[0].FinishReason, acc.Usage)
	}
}

func TestStreamWithoutIncludeUsageCarriesNoUsage(t *testing.T) {
	out := runStream(t, NewStream(chatAnswer(false)), providerStream)
	for _, c := range out {
		if gjson.GetBytes(c, "usage").Exists() || gjson.GetBytes(c, "choices.#").Int() == 0 {
			t.Fatalf("chunk %s", c)
		}
	}
	if len(out) != len(providerStream) {
		t.Fatalf("%d chunks, want %d", len(out), len(providerStream))
	}
}

func TestStreamUsageFallsBackToTheCount(t *testing.T) {
	s := NewStream(chatAnswer(true))
	s.Chunk([]byte(`{"id":"a","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}`))
	fin := s.Final(11, 3)
	if gjson.GetBytes(fin, "usage.prompt_tokens").Int() != 11 || gjson.GetBytes(fin, "usage.total_tokens").Int() != 14 {
		t.Fatalf("final %s", fin)
	}
}

func TestStreamToolCallCutByMaxTokensFinishesWithLength(t *testing.T) {
	s := NewStream(chatAnswer(false))
	s.Chunk([]byte(`{"id":"a","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":"{\"q\": \"lon"}}]},"finish_reason":null}]}`))
	fin := s.Chunk([]byte(`{"id":"a","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`))
	if got := gjson.GetBytes(fin, "choices.0.finish_reason").Str; got != "length" {
		t.Fatalf("finish_reason %q: %s", got, fin)
	}
}

// Azure OpenAI opens a stream with a chunk of prompt_filter_results, no
// choices, "id": "" and "created": 0; the client's chunks carry the id and
// timestamp of the answer's own chunks, as the spec's "each chunk has the
// same ID / timestamp" means, not those placeholders.
func TestStreamSkipsAzuresPromptFilterChunkHeader(t *testing.T) {
	spec := openapitest.Load(t)
	in := []string{
		`{"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}]}`,
		`{"id":"chatcmpl-az","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o","system_fingerprint":"fp_az","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null,"logprobs":null,"content_filter_results":{}}]}`,
		`{"id":"chatcmpl-az","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o","system_fingerprint":"fp_az","choices":[{"index":0,"delta":{},"finish_reason":"stop","logprobs":null}]}`,
		`{"id":"chatcmpl-az","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o","system_fingerprint":"fp_az","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`,
	}
	out := runStream(t, NewStream(chatAnswer(true)), in)
	if len(out) != 3 {
		t.Fatalf("%d chunks, want the two with choices and the usage chunk", len(out))
	}
	for _, c := range out {
		spec.Validate(t, "CreateChatCompletionStreamResponse", c)
		if gjson.GetBytes(c, "id").Str != "chatcmpl-az" || gjson.GetBytes(c, "created").Int() != 1700000000 || gjson.GetBytes(c, "system_fingerprint").Str != "fp_az" {
			t.Errorf("chunk header: %s", c)
		}
	}
}

// A stream whose tool call carries its arguments as an object (as Ollama
// sends them) gives the SDK's accumulator the object's JSON text.
func TestStreamToolCallArgumentsAsAnObject(t *testing.T) {
	spec := openapitest.Load(t)
	in := []string{
		`{"id":"a","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":{"city": "Rome"}}}]},"finish_reason":null}]}`,
		`{"id":"a","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
	}
	var acc openai.ChatCompletionAccumulator
	for _, c := range runStream(t, NewStream(chatAnswer(false)), in) {
		spec.Validate(t, "CreateChatCompletionStreamResponse", c)
		var chunk openai.ChatCompletionChunk
		if err := json.Unmarshal(c, &chunk); err != nil {
			t.Fatal(err)
		}
		acc.AddChunk(chunk)
	}
	if calls := acc.Choices[0].Message.ToolCalls; len(calls) != 1 || calls[0].Function.Arguments != `{"city":"Rome"}` || acc.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("accumulated %+v, finish %q", calls, acc.Choices[0].FinishReason)
	}
}

func TestStreamCompletionChunks(t *testing.T) {
	spec := openapitest.Load(t)
	s := NewStream(Answer{Endpoint: oai.EndpointCompletions, Model: "alias", IncludeUsage: true, Created: created})
	out := runStream(t, s, []string{
		`{"id":"c","object":"text_completion","created":1,"model":"up","choices":[{"text":"he","index":0,"logprobs":null,"finish_reason":null}]}`,
		`{"id":"c","object":"text_completion","created":1,"model":"up","choices":[{"text":"y","index":0,"finish_reason":"eos"}]}`,
		`{"id":"c","object":"text_completion","created":1,"model":"up","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}`,
	})
	if len(out) != 3 {
		t.Fatalf("%d chunks", len(out))
	}
	for _, c := range out {
		spec.ValidateCompletionChunk(t, c)
	}
	if gjson.GetBytes(out[1], "choices.0.finish_reason").Str != "stop" || gjson.GetBytes(out[2], "usage.total_tokens").Int() != 4 {
		t.Fatalf("chunks %s", out)
	}
}

// NormaliseBody looks members up in one pass per object: the first of a
// duplicated member is the one read (as gjson's Get reads it), a null
// tool_calls is dropped, and an answer already in shape comes back byte
// for byte but for the model name.
func TestNormaliseBodyOnePassLookups(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"an answer in shape: only the model changes",
			`{"id":"c","object":"chat.completion","created":5,"model":"up","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"hi","refusal":null}}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`,
			`{"id":"c","object":"chat.completion","created":5,"model":"alias","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"hi","refusal":null}}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`},
		{"a null tool_calls is dropped",
			`{"id":"c","object":"chat.completion","created":5,"model":"alias","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"hi","refusal":null,"tool_calls":null}}]}`,
			`{"id":"c","object":"chat.completion","created":5,"model":"alias","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"hi","refusal":null}}]}`},
		{"the first of a duplicated member is read: its finish reason is mapped",
			`{"id":"c","object":"chat.completion","created":5,"model":"alias","choices":[{"index":0,"finish_reason":"eos","finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"hi","refusal":null}}]}`,
			`{"id":"c","object":"chat.completion","created":5,"model":"alias","choices":[{"index":0,"finish_reason":"stop","finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"hi","refusal":null}}]}`},
		{"usage members after the choices: total_tokens added",
			`{"usage":{"completion_tokens":2,"prompt_tokens":1},"id":"c","object":"chat.completion","created":5,"model":"alias","choices":[]}`,
			`{"usage":{"completion_tokens":2,"prompt_tokens":1,"total_tokens":3},"id":"c","object":"chat.completion","created":5,"model":"alias","choices":[]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(NormaliseBody(chatAnswer(false), []byte(tt.body))); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestStreamDropsNullMembers: LiteLLM's proxy writes "tool_calls": null and
// "function_call": null on every delta and "id"/"type"/"function.name":
// null on tool-call continuations; a null tool_calls must not become a
// call (gjson's ForEach calls back once with a scalar), and no null is
// left where the spec has none; a later "role": null is dropped and a
// finish_reason "" is null (not finished), not "stop".
func TestStreamDropsNullMembers(t *testing.T) {
	spec := openapitest.Load(t)
	s := NewStream(chatAnswer(true))
	var acc openai.ChatCompletionAccumulator
	for i, c := range []string{
		`{"id":"c","object":"chat.completion.chunk","created":5,"model":"m","service_tier":"on_demand","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi","function_call":null,"tool_calls":null},"logprobs":{"content":[{"token":"Hi","logprob":-0.5}]},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"role":null,"content":null,"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":""}}]},"logprobs":null,"finish_reason":""}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"id":null,"type":null,"function":{"name":null,"arguments":"{}"}}]},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"content":null,"function_call":null,"tool_calls":null},"logprobs":null,"finish_reason":"tool_calls"}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":5,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":null,"completion_tokens_details":null}}`,
	} {
		out := s.Chunk([]byte(c))
		if out == nil {
			continue
		}
		spec.Validate(t, "CreateChatCompletionStreamResponse", out)
		if i == 1 && (gjson.GetBytes(out, "choices.0.finish_reason").Raw != "null" || gjson.GetBytes(out, "choices.0.delta.role").Exists()) {
			t.Fatalf(`finish_reason "" or role null kept: %s`, out)
		}
		var chunk openai.ChatCompletionChunk
		if err := json.Unmarshal(out, &chunk); err != nil || !acc.AddChunk(chunk) {
			t.Fatalf("the accumulator refused %s (%v)", out, err)
		}
	}
	final := s.Final(0, 0)
	spec.Validate(t, "CreateChatCompletionStreamResponse", final)
	calls := acc.Choices[0].Message.ToolCalls
	if len(calls) != 1 || calls[0].ID != "call_a" || calls[0].Function.Name != "f" || calls[0].Function.Arguments != "{}" || acc.Choices[0].Message.Content != "Hi" {
		t.Fatalf("accumulated %+v", acc.Choices[0].Message)
	}
}

// TestStreamUsageChunkKeepsTheServiceTier: OpenAI's usage chunk carries the
// service_tier and system_fingerprint of the other chunks; openai-go's
// accumulator keeps the last chunk's, so Final must carry them too.
func TestStreamUsageChunkKeepsTheServiceTier(t *testing.T) {
	s := NewStream(chatAnswer(true))
	var acc openai.ChatCompletionAccumulator
	add := func(b []byte) {
		var chunk openai.ChatCompletionChunk
		if err := json.Unmarshal(b, &chunk); err != nil || !acc.AddChunk(chunk) {
			t.Fatalf("the accumulator refused %s (%v)", b, err)
		}
	}
	for _, c := range []string{
		`{"id":"c","object":"chat.completion.chunk","created":5,"model":"m","service_tier":"default","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":5,"model":"m","service_tier":"default","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":5,"model":"m","service_tier":"default","system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`,
	} {
		if out := s.Chunk([]byte(c)); out != nil {
			add(out)
		}
	}
	add(s.Final(0, 0))
	if acc.ServiceTier != "default" || acc.SystemFingerprint != "fp_1" || acc.Usage.TotalTokens != 4 {
		t.Fatalf("service_tier %q fingerprint %q usage %+v", acc.ServiceTier, acc.SystemFingerprint, acc.Usage)
	}
}

// TestToolCallsWithoutIDsGetOne: servers that send tool calls without an id
// (or with "") get one made up per call, whole and streamed, so that
// parallel calls stay apart (the Messages API matches tool_result to
// tool_use by id).
func TestToolCallsWithoutIDsGetOne(t *testing.T) {
	body := NormaliseBody(chatAnswer(false), []byte(`{"id":"x","object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"finish_reason":"tool_calls","logprobs":null,"message":{"role":"assistant","content":null,"refusal":null,"tool_calls":[{"id":"","type":"function","function":{"name":"f","arguments":"{}"}},{"type":"function","function":{"name":"g","arguments":"{}"}}]}}]}`))
	a, b := gjson.GetBytes(body, "choices.0.message.tool_calls.0.id").Str, gjson.GetBytes(body, "choices.0.message.tool_calls.1.id").Str
	if a == "" || b == "" || a == b {
		t.Fatalf("ids %q %q: %s", a, b, body)
	}
	s := NewStream(chatAnswer(false))
	var acc openai.ChatCompletionAccumulator
	for _, c := range []string{
		`{"id":"c","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"","function":{"name":"f","arguments":"{\"a\":"}}]},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"name":"g","arguments":"{}"}}]},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
	} {
		var chunk openai.ChatCompletionChunk
		if out := s.Chunk([]byte(c)); json.Unmarshal(out, &chunk) != nil || !acc.AddChunk(chunk) {
			t.Fatalf("the accumulator refused %s", out)
		}
	}
	calls := acc.Choices[0].Message.ToolCalls
	if len(calls) != 2 || calls[0].ID == "" || calls[1].ID == "" || calls[0].ID == calls[1].ID || calls[0].Function.Arguments != `{"a":1}` || calls[1].Function.Name != "g" {
		t.Fatalf("calls %+v", calls)
	}
}

func TestCutFinishesTheOpenChoicesWithLength(t *testing.T) {
	spec := openapitest.Load(t)
	s := NewStream(chatAnswer(true))
	s.Chunk([]byte(`{"id":"up","created":7,"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}}]}`))
	s.Chunk([]byte(`{"id":"up","created":7,"choices":[{"index":1,"delta":{},"finish_reason":"stop"}]}`))
	b := s.Cut()
	spec.Validate(t, "CreateChatCompletionStreamResponse", b)
	cut := gjson.ParseBytes(b)
	if cut.Get("id").Str != "up" || cut.Get("object").Str != "chat.completion.chunk" || cut.Get("created").Int() != 7 || cut.Get("model").Str != "alias" ||
		cut.Get("choices.#").Int() != 1 || cut.Get("choices.0.index").Int() != 0 || cut.Get("choices.0.finish_reason").Str != "length" ||
		cut.Get("choices.0.delta").Raw != "{}" || cut.Get("usage").Raw != "null" {
		t.Fatalf("cut chunk %s: want choice 0 (1 finished) ending with length in the stream's id", cut.Raw)
	}
	if again := s.Cut(); again != nil {
		t.Fatalf("a second cut %s; every choice has finished", again)
	}
	s.Settle(3, 4)
	if u := gjson.GetBytes(s.Final(0, 0), "usage"); u.Get("prompt_tokens").Int() != 3 || u.Get("completion_tokens").Int() != 4 || u.Get("total_tokens").Int() != 7 {
		t.Fatalf("usage chunk %s, want the settled 3 + 4", u.Raw)
	}

	c := NewStream(Answer{Endpoint: oai.EndpointCompletions, Model: "alias", Created: created})
	b = c.Cut() // nothing came: choice 0
	spec.Validate(t, "CreateCompletionResponse", b)
	cut = gjson.ParseBytes(b)
	if cut.Get("object").Str != "text_completion" || cut.Get("choices.0.text").Raw != `""` || cut.Get("choices.0.finish_reason").Str != "length" ||
		!strings.HasPrefix(cut.Get("id").Str, "cmpl-") || cut.Get("usage").Exists() {
		t.Fatalf("cut chunk of a completions stream %s", cut.Raw)
	}
}
