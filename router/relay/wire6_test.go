package relay

import (
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
	oai "github.com/molly-gateway/molly/router/openai"
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

// TestEmbeddingsInTheEncodingAskedFor: an embeddings answer comes in the
// encoding_format the request asked for (CreateEmbeddingRequest: "float"
// or "base64", float by default), whatever the upstream sent — servers
// that ignore the parameter answer floats to a base64 request, and
// openai-node asks for base64 by default and decodes every embedding as a
// base64 string (floats became an empty embedding). base64 is the
// little-endian float32 of each value (0.1, 0.2, 0.3: zczMPc3MTD6amZk+);
// decoded floats are the float32 values' shortest decimals. An embedding
// already in the asked encoding is left as it is.
func TestEmbeddingsInTheEncodingAskedFor(t *testing.T) {
	spec := openapitest.Load(t)
	answer := func(emb string) []byte {
		return []byte(`{"object":"list","model":"e","data":[{"object":"embedding","index":0,"embedding":` + emb + `}],"usage":{"prompt_tokens":2,"total_tokens":2}}`)
	}
	ans := func(format string) Answer {
		return Answer{Endpoint: oai.EndpointEmbeddings, Model: "e", EncodingFormat: format, Created: created}
	}
	for _, c := range []struct {
		format, upstream, want string
	}{
		{"base64", `[0.1,0.2,0.3]`, `"zczMPc3MTD6amZk+"`},
		{"base64", `[1.5,-2]`, `"AADAPwAAAMA="`},
		{"base64", `"zczMPc3MTD6amZk+"`, `"zczMPc3MTD6amZk+"`},
		{"", `"zczMPc3MTD6amZk+"`, `[0.1,0.2,0.3]`},
		{"float", `"AADAPwAAAMA="`, `[1.5,-2]`},
		{"float", `[0.125,0.5]`, `[0.125,0.5]`},
	} {
		got := NormaliseBody(ans(c.format), answer(c.upstream))
		if c.want[0] == '[' {
			// The description's Embedding has the float form only.
			spec.Validate(t, "CreateEmbeddingResponse", got)
		}
		if e := gjson.GetBytes(got, "data.0.embedding").Raw; e != c.want {
			t.Errorf("encoding_format %q, upstream %s: embedding %s, want %s", c.format, c.upstream, e, c.want)
		}
	}
}
