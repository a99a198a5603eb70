package relay

import (
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/openai"
)

// StreamOfAnswer is the event stream that says what the whole 2xx answer
// body says, for an upstream that answered a streamed chat or text
// completion request with one JSON object (as some OpenAI-compatible
// servers do when they do not stream, or not for some requests): one
// chunk with every choice — a chat choice's message as its delta, each
// tool call with its "index", its logprobs and finish_reason — then, when
// the answer carries a usage object, a usage chunk ("choices": [], the
// shape of OpenAI's last chunk), then [DONE]. The id, created, model,
// system_fingerprint and service_tier are the answer's. Chunks are in the
// upstream's terms: the relay normalises them as it does any upstream's
// (Stream), and hides the usage chunk from a client that did not ask for
// it. It returns nil for a body that is not such an answer (not an object,
// or no choices array).
func StreamOfAnswer(ep openai.Endpoint, body []byte) []byte {
	root := gjson.ParseBytes(body)
	choices := root.Get("choices")
	if !root.IsObject() || !choices.IsArray() || (ep != openai.EndpointChat && ep != openai.EndpointCompletions) {
		return nil
	}
	object := "text_completion"
	if ep == openai.EndpointChat {
		object = "chat.completion.chunk"
	}
	head := &edit{b: []byte(`{}`)}
	for _, f := range []string{"id", "created", "model", "system_fingerprint", "service_tier"} {
		if v := root.Get(f); v.Exists() {
			head.raw(f, v.Raw)
		}
	}
	head.set("object", object)
	chunk := &edit{b: append([]byte(nil), head.b...)}
	chunk.raw("choices", "[]")
	choices.ForEach(func(k, ch gjson.Result) bool {
		p := "choices." + k.String()
		c := &edit{b: []byte(`{}`)}
		if !ch.IsObject() {
			chunk.raw(p, ch.Raw)
			return true
		}
		ch.ForEach(func(name, v gjson.Result) bool {
			switch name.Str {
			case "message":
				if ep == openai.EndpointChat {
					c.raw("delta", delta(v))
				}
			default:
				c.raw(name.Str, v.Raw)
			}
			return true
		})
		if ep == openai.EndpointChat && !ch.Get("message").Exists() {
			c.raw("delta", "{}")
		}
		chunk.raw(p, string(c.b))
		return true
	})
	out := AppendData(nil, chunk.b)
	if u := root.Get("usage"); u.IsObject() {
		uc := &edit{b: head.b}
		uc.raw("choices", "[]")
		uc.raw("usage", u.Raw)
		out = AppendData(out, uc.b)
	}
	return AppendData(out, []byte("[DONE]"))
}

// delta is a chat message as a stream delta: the same members, each tool
// call given its "index" (its position).
func delta(msg gjson.Result) string {
	if !msg.IsObject() {
		return "{}"
	}
	d := &edit{b: []byte(msg.Raw)}
	if tcs := msg.Get("tool_calls"); tcs.IsArray() {
		tcs.ForEach(func(k, _ gjson.Result) bool {
			d.set("tool_calls."+k.String()+".index", k.Int())
			return true
		})
	}
	return string(d.b)
}
