package translate

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/molly-gateway/molly/internal/openapitest"
)

// A function call whose name comes in a later chunk than its id (some
// servers stream the id alone first) is announced only once its name is
// known: openai-go's stream gets a response.output_item.added whose item
// already has the name the completed Response carries, argument deltas
// after it that add up to the call's arguments, and output_index values in
// the order the items were added; a call that never gets a name is
// announced at the end. Every event is spec-valid.
func TestResponsesFunctionCallNameInALaterChunk(t *testing.T) {
	spec := openapitest.Load(t)
	chunk := func(delta string) string {
		return `{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":null}]}`
	}
	chunks := []string{
		chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"arguments":""}}]}`),
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}`),
		chunk(`{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"time","arguments":"{}"}}]}`),
		chunk(`{"tool_calls":[{"index":0,"function":{"name":"weather","arguments":"\"Oslo\"}"}}]}`),
		chunk(`{"tool_calls":[{"index":2,"id":"call_c","type":"function","function":{"arguments":"{\"x\":1}"}}]}`),
		`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":8,"total_tokens":17}}`,
		`[DONE]`,
	}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_, tr, err := FromResponses(r.Context(), body, nil, "ana")
		if err != nil {
			t.Errorf("FromResponses: %v", err)
			return
		}
		w := NewWriter(rw, r.Context(), APIResponses)
		w.Bind(tr)
		writeSSE(chunks...)(w)
		w.Finish()
	}))
	t.Cleanup(srv.Close)
	c := oai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	stream := c.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{Model: "m",
		Input: responses.ResponseNewParamsInputUnion{OfString: oai.String("weather and time?")}})
	added := map[string]string{}  // item id → name at output_item.added
	args := map[string]string{}   // item id → the argument deltas after it
	indexOf := map[string]int64{} // item id → output_index
	var done responses.Response
	next := int64(0)
	for stream.Next() {
		ev := stream.Current()
		spec.Validate(t, "ResponseStreamEvent", []byte(ev.RawJSON()))
		switch ev.Type {
		case "response.output_item.added":
			if ev.OutputIndex != next {
				t.Fatalf("added output_index %d, want %d: %s", ev.OutputIndex, next, ev.RawJSON())
			}
			next++
			added[ev.Item.ID], indexOf[ev.Item.ID] = ev.Item.Name, ev.OutputIndex
		case "response.function_call_arguments.delta":
			if _, ok := added[ev.ItemID]; !ok || indexOf[ev.ItemID] != ev.OutputIndex {
				t.Fatalf("a delta before its item was added, or at another index: %s", ev.RawJSON())
			}
			args[ev.ItemID] += ev.Delta
		case "response.completed":
			done = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string][2]string{"call_a": {"weather", `{"city":"Oslo"}`}, "call_b": {"time", "{}"}, "call_c": {"", `{"x":1}`}}
	if len(done.Output) != 3 || done.Usage.TotalTokens != 17 {
		t.Fatalf("completed %s", done.RawJSON())
	}
	for i, it := range done.Output {
		w, ok := want[it.CallID]
		if !ok || it.Type != "function_call" || it.Name != w[0] || it.Arguments.OfString != w[1] ||
			added[it.ID] != w[0] || args[it.ID] != w[1] || indexOf[it.ID] != int64(i) {
			t.Fatalf("output %d %s: added with name %q, deltas %q, index %d", i, it.RawJSON(), added[it.ID], args[it.ID], indexOf[it.ID])
		}
	}
	if got := fmt.Sprintln(done.Output[0].CallID, done.Output[1].CallID, done.Output[2].CallID); got != "call_b call_a call_c\n" {
		t.Fatalf("output order %s", got)
	}
}
