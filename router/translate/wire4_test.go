package translate

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"
)

// messagesServer serves POST /v1/messages by the translation and a Writer,
// the chat answer being what upstream writes (the pipeline's part).
func messagesServer(t *testing.T, upstream func(w http.ResponseWriter)) anthropic.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_, tr, aerr := FromMessages(body)
		w := NewWriter(rw, r.Context(), APIMessages)
		if aerr != nil {
			aerr.Write(w)
			w.Finish()
			return
		}
		w.Bind(tr)
		upstream(w)
		w.Finish()
	}))
	t.Cleanup(srv.Close)
	return anthropic.NewClient(aoption.WithBaseURL(srv.URL), aoption.WithAPIKey("sk-ant-unused"), aoption.WithMaxRetries(0))
}

// An OpenAI-style upstream that streams two parallel tool calls with their
// argument fragments interleaved (index 0, 1, 0, 1, as some servers
// write them) gives the Anthropic SDK's accumulator two tool_use blocks,
// each with its whole input: the first call's fragments that come after
// the second began are not lost (Anthropic's content blocks cannot
// interleave). Text that comes after the calls began is kept too.
func TestMessagesInterleavedToolCallsKeepEveryFragment(t *testing.T) {
	chunk := func(delta, finish string) string {
		return `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}`
	}
	call := func(i int, head, args string) string {
		return chunk(`{"tool_calls":[{"index":`+string(rune('0'+i))+head+`,"function":{`+args+`}}]}`, "null")
	}
	c := messagesServer(t, writeSSE(
		chunk(`{"role":"assistant","content":"Both."}`, "null"),
		call(0, `,"id":"call_a","type":"function"`, `"name":"weather","arguments":"{\"ci"`),
		call(1, `,"id":"call_b","type":"function"`, `"name":"time","arguments":"{\"zo"`),
		call(0, ``, `"arguments":"ty\":\"Ro"`),
		call(1, ``, `"arguments":"ne\":\"CET\"}"`),
		call(0, ``, `"arguments":"me\"}"`),
		chunk(`{"content":" Done."}`, "null"),
		chunk(`{}`, `"tool_calls"`),
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}`,
		`[DONE]`))
	stream := c.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{Model: "m", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("weather and time?"))}})
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	type want struct{ typ, text, id, name, key, value string }
	wants := []want{{typ: "text", text: "Both."}, {typ: "tool_use", id: "call_a", name: "weather", key: "city", value: "Rome"},
		{typ: "tool_use", id: "call_b", name: "time", key: "zone", value: "CET"}, {typ: "text", text: " Done."}}
	if len(acc.Content) != len(wants) || acc.StopReason != anthropic.StopReasonToolUse || acc.Usage.OutputTokens != 9 {
		t.Fatalf("stop %q content %s", acc.StopReason, acc.RawJSON())
	}
	for i, w := range wants {
		b := acc.Content[i]
		if b.Type != w.typ {
			t.Fatalf("block %d: %s", i, b.RawJSON())
		}
		if w.typ == "text" {
			if b.Text != w.text {
				t.Fatalf("block %d: %s", i, b.RawJSON())
			}
			continue
		}
		var in map[string]string
		if err := json.Unmarshal(b.Input, &in); err != nil || b.ID != w.id || b.Name != w.name || len(in) != 1 || in[w.key] != w.value {
			t.Fatalf("block %d: %s (%v)", i, b.RawJSON(), err)
		}
	}
}
