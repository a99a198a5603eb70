package relay

import (
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
)

// TestStreamParallelCallsOnePerChunkAtIndexZero: Gemini's OpenAI-compatible
// API (and proxies of it) streams parallel tool calls one per chunk, each
// whole, each with index 0 and no id — sometimes naming the function
// again, sometimes with an empty name. A chat client joins deltas of one
// index, so the calls became one with arguments `{"city":"Rome"}{"city":
// "Paris"}` that no client can parse, and the choice was finished with
// "length" as if it had been cut off. Each whole call is a call of its own:
// index 1 for the second, a made-up id, the function named (the first
// call's function where the delta names none), and finish_reason
// tool_calls stays. Every chunk is spec-valid.
func TestStreamParallelCallsOnePerChunkAtIndexZero(t *testing.T) {
	spec := openapitest.Load(t)
	head := `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":`
	for name, second := range map[string]string{
		"named again": `{"tool_calls":[{"index":0,"function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}`,
		"name empty":  `{"tool_calls":[{"index":0,"function":{"name":"","arguments":"{\"city\":\"Paris\"}"}}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			out := runStream(t, NewStream(chatAnswer(false)), []string{
				head + `{"role":"assistant","tool_calls":[{"index":0,"type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]},"finish_reason":null}]}`,
				head + second + `,"finish_reason":null}]}`,
				head + `{},"finish_reason":"tool_calls"}]}`,
			})
			if len(out) != 3 {
				t.Fatalf("%d chunks", len(out))
			}
			type call struct{ id, name, args string }
			calls := map[int64]*call{}
			for _, c := range out {
				spec.Validate(t, "CreateChatCompletionStreamResponse", c)
				gjson.GetBytes(c, "choices.0.delta.tool_calls").ForEach(func(_, tc gjson.Result) bool {
					i := tc.Get("index").Int()
					if calls[i] == nil {
						calls[i] = &call{}
					}
					calls[i].id += tc.Get("id").Str
					calls[i].name += tc.Get("function.name").Str
					calls[i].args += tc.Get("function.arguments").Str
					return true
				})
			}
			if len(calls) != 2 || calls[0] == nil || calls[1] == nil {
				t.Fatalf("calls %v", calls)
			}
			for i, want := range []string{`{"city":"Rome"}`, `{"city":"Paris"}`} {
				c := calls[int64(i)]
				if c.args != want || c.name != "get_weather" || c.id == "" {
					t.Errorf("call %d: %+v, want get_weather %s with an id", i, *c, want)
				}
			}
			if calls[0].id == calls[1].id {
				t.Errorf("both calls have id %s", calls[0].id)
			}
			if fr := gjson.GetBytes(out[2], "choices.0.finish_reason").Str; fr != "tool_calls" {
				t.Errorf("finish_reason %q, want tool_calls", fr)
			}
		})
	}
}
