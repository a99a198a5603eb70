package relay

import (
	"encoding/json"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
	oai "github.com/molly-gateway/molly/router/openai"
)

// Parallel tool calls sent in one delta, all with index 0 and no id
// (Gemini's OpenAI-compatible API), are two calls for openai-go's
// accumulator, each with its own arguments and a made-up id; a later
// delta without an id continues the last of them.
func TestToolCallsOfOneDeltaAreDistinct(t *testing.T) {
	s := NewStream(Answer{Endpoint: oai.EndpointChat, Model: "m", Created: 1})
	var acc openaiAccumulator
	for _, c := range []string{
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"g","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[` +
			`{"index":0,"type":"function","function":{"name":"weather","arguments":"{\"city\":\"Rome\"}"}},` +
			`{"index":0,"type":"function","function":{"name":"time","arguments":"{\"zone\":"}}]},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"g","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"CET\"}"}}]},"finish_reason":"tool_calls"}]}`,
	} {
		acc.add(t, s.Chunk([]byte(c)))
	}
	calls := acc.Choices[0].Message.ToolCalls
	if len(calls) != 2 || calls[0].Function.Name != "weather" || calls[0].Function.Arguments != `{"city":"Rome"}` ||
		calls[1].Function.Name != "time" || calls[1].Function.Arguments != `{"zone":"CET"}` || calls[0].ID == "" || calls[1].ID == "" || calls[0].ID == calls[1].ID {
		t.Fatalf("accumulated tool calls %+v", calls)
	}
}

type openaiAccumulator struct {
	openai.ChatCompletionAccumulator
}

func (a *openaiAccumulator) add(t *testing.T, c []byte) {
	t.Helper()
	var chunk openai.ChatCompletionChunk
	if err := json.Unmarshal(c, &chunk); err != nil || !a.AddChunk(chunk) {
		t.Fatalf("the accumulator refused %s (%v)", c, err)
	}
}

// Required members some servers write as null — a choice's index, a
// completion's text, a usage's counts — are written as the spec has them
// (the position, "", 0 or the sum), whole and streamed.
func TestRequiredMembersWrittenAsNull(t *testing.T) {
	spec := openapitest.Load(t)
	chat := NormaliseBody(Answer{Endpoint: oai.EndpointChat, Model: "m", Created: 1},
		[]byte(`{"id":"x","object":"chat.completion","created":1,"model":"u","choices":[{"index":null,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"hi","refusal":null}}],"usage":{"prompt_tokens":3,"completion_tokens":null,"total_tokens":null}}`))
	spec.Validate(t, "CreateChatCompletionResponse", chat)
	if u := gjson.GetBytes(chat, "usage"); u.Get("completion_tokens").Raw != "0" || u.Get("total_tokens").Raw != "3" || gjson.GetBytes(chat, "choices.0.index").Raw != "0" {
		t.Fatalf("answer %s", chat)
	}
	text := NormaliseBody(Answer{Endpoint: oai.EndpointCompletions, Model: "m", Created: 1},
		[]byte(`{"id":"x","object":"text_completion","created":1,"model":"u","choices":[{"index":0,"text":null,"finish_reason":"length","logprobs":null}],"usage":{"prompt_tokens":null,"completion_tokens":2,"total_tokens":null}}`))
	spec.Validate(t, "CreateCompletionResponse", text)
	if gjson.GetBytes(text, "choices.0.text").Raw != `""` || gjson.GetBytes(text, "usage.total_tokens").Raw != "2" {
		t.Fatalf("answer %s", text)
	}
	s := NewStream(Answer{Endpoint: oai.EndpointCompletions, Model: "m", Created: 1})
	chunk := s.Chunk([]byte(`{"id":"x","object":"text_completion","created":1,"model":"u","choices":[{"index":0,"text":null,"finish_reason":null,"logprobs":null}]}`))
	spec.ValidateCompletionChunk(t, chunk)
	if gjson.GetBytes(chunk, "choices.0.text").Raw != `""` {
		t.Fatalf("chunk %s", chunk)
	}
}

// A text completion streamed in pieces joins into one spec-valid answer
// (NormaliseBody then gives it what the spec requires).
func TestAnswerOfAStreamedCompletion(t *testing.T) {
	spec := openapitest.Load(t)
	var sse []byte
	for _, c := range []string{
		`{"id":"t","object":"text_completion","created":1,"model":"u","choices":[{"index":0,"text":"two ","finish_reason":null,"logprobs":null}]}`,
		`{"id":"t","object":"text_completion","created":1,"model":"u","choices":[{"index":0,"text":"three","finish_reason":"length","logprobs":null}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`,
		`[DONE]`,
	} {
		sse = AppendData(sse, []byte(c))
	}
	whole := AnswerOfStream(oai.EndpointCompletions, sse)
	body := NormaliseBody(Answer{Endpoint: oai.EndpointCompletions, Model: "m", Created: 1}, whole)
	spec.Validate(t, "CreateCompletionResponse", body)
	if gjson.GetBytes(body, "choices.0.text").Str != "two three" || gjson.GetBytes(body, "choices.0.finish_reason").Str != "length" || gjson.GetBytes(body, "usage.total_tokens").Int() != 3 {
		t.Fatalf("answer %s", body)
	}
	// A tool call's arguments streamed as an object (Ollama) are its JSON text.
	chat := AnswerOfStream(oai.EndpointChat, AppendData(nil, []byte(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"u","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":{"a": 1}}}]},"finish_reason":"tool_calls"}]}`)))
	if a := gjson.GetBytes(chat, "choices.0.message.tool_calls.0.function.arguments"); a.Str != `{"a":1}` {
		t.Fatalf("answer %s", chat)
	}
	if AnswerOfStream(oai.EndpointCompletions, AppendData(nil, []byte("[DONE]"))) != nil {
		t.Fatal("an empty stream made an answer")
	}
}

// Finish reasons in another case (Gemini's and Vertex's STOP, MAX_TOKENS,
// SAFETY) map to the spec's words: MAX_TOKENS was "stop", hiding a cut.
func TestFinishReasonsInCapitals(t *testing.T) {
	for in, want := range map[string]string{"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter", "Length": "length", "TOOL_CALLS": "tool_calls", "OTHER": "stop"} {
		body := NormaliseBody(Answer{Endpoint: oai.EndpointChat, Model: "m", Created: 1},
			[]byte(`{"id":"x","object":"chat.completion","created":1,"model":"u","choices":[{"index":0,"finish_reason":"`+in+`","logprobs":null,"message":{"role":"assistant","content":"hi","refusal":null}}]}`))
		if got := gjson.GetBytes(body, "choices.0.finish_reason").Str; got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}
