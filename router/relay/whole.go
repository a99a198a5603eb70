package relay

import (
	"bytes"
	"strconv"
	"strings"

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
	head := headOf(root, object)
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

// AnswerOfStream is the whole answer that the event stream body says, for
// an upstream that streamed its answer to a request that did not ask for
// a stream (servers that always stream): a chat completion (or text
// completion) whose choices join their deltas — content, refusal and
// reasoning text concatenated, tool calls by their index with their
// argument fragments joined, the last finish_reason and logprobs entries
// in order — with the first chunk's id, created, model and
// system_fingerprint and the last usage. Events that are not JSON objects
// are skipped. It returns nil for a body with no chunk carrying choices.
func AnswerOfStream(ep openai.Endpoint, body []byte) []byte {
	if ep != openai.EndpointChat && ep != openai.EndpointCompletions {
		return nil
	}
	chat := ep == openai.EndpointChat
	type call struct {
		id, typ, name string
		args          strings.Builder
	}
	type choice struct {
		text, refusal, reasoning strings.Builder
		hasText, hasRefusal      bool
		calls                    []*call
		byIndex                  map[int64]*call
		finish                   string
		logprobs                 []string // raw logprob entries (chat content)
	}
	var head, usage gjson.Result
	choices := map[int64]*choice{}
	var order []int64
	d := NewDecoder(bytes.NewReader(body))
	for {
		ev, err := d.Next()
		if err != nil {
			break
		}
		if ev.IsDone() || !gjson.ValidBytes(ev.Data) {
			continue
		}
		root := gjson.ParseBytes(ev.Data)
		if !root.IsObject() || root.Get("error").Exists() {
			continue
		}
		if u := root.Get("usage"); u.IsObject() {
			usage = u
		}
		cs := root.Get("choices")
		if !cs.IsArray() || cs.Get("#").Int() == 0 {
			continue
		}
		if !head.Exists() {
			head = root
		}
		pos := int64(0)
		cs.ForEach(func(_, ch gjson.Result) bool {
			idx := pos
			pos++
			if i := ch.Get("index"); i.Type == gjson.Number {
				idx = i.Int()
			}
			c := choices[idx]
			if c == nil {
				c = &choice{byIndex: map[int64]*call{}}
				choices[idx] = c
				order = append(order, idx)
			}
			if fr := ch.Get("finish_reason"); fr.Type == gjson.String && fr.Str != "" {
				c.finish = fr.Str
			}
			ch.Get("logprobs.content").ForEach(func(_, e gjson.Result) bool {
				c.logprobs = append(c.logprobs, e.Raw)
				return true
			})
			if !chat {
				if t := ch.Get("text"); t.Type == gjson.String {
					c.text.WriteString(t.Str)
					c.hasText = true
				}
				return true
			}
			delta := ch.Get("delta")
			if t := delta.Get("content"); t.Type == gjson.String {
				c.text.WriteString(t.Str)
				c.hasText = true
			}
			if t := delta.Get("refusal"); t.Type == gjson.String {
				c.refusal.WriteString(t.Str)
				c.hasRefusal = true
			}
			for _, f := range []string{"reasoning_content", "reasoning"} {
				if t := delta.Get(f); t.Type == gjson.String {
					c.reasoning.WriteString(t.Str)
					break
				}
			}
			if tcs := delta.Get("tool_calls"); tcs.IsArray() {
				k := int64(0)
				tcs.ForEach(func(_, tc gjson.Result) bool {
					ti := k
					k++
					if i := tc.Get("index"); i.Type == gjson.Number {
						ti = i.Int()
					}
					cl := c.byIndex[ti]
					if cl == nil {
						cl = &call{typ: "function"}
						c.byIndex[ti] = cl
						c.calls = append(c.calls, cl)
					}
					if v := tc.Get("id").Str; v != "" && cl.id == "" {
						cl.id = v
					}
					if v := tc.Get("function.name").Str; v != "" && cl.name == "" {
						cl.name = v
					}
					switch a := tc.Get("function.arguments"); {
					case a.Type == gjson.String:
						cl.args.WriteString(a.Str)
					case a.IsObject() || a.IsArray():
						cl.args.WriteString(argsText(a)) // Ollama's arguments object
					}
					return true
				})
			}
			return true
		})
	}
	if !head.Exists() {
		return nil
	}
	object := "text_completion"
	if chat {
		object = "chat.completion"
	}
	out := headOf(head, object)
	out.raw("choices", "[]")
	for k, idx := range order {
		c := choices[idx]
		ch := &edit{b: []byte(`{}`)}
		ch.set("index", idx)
		if chat {
			msg := &edit{b: []byte(`{"role":"assistant","content":null}`)}
			if c.hasText {
				msg.set("content", c.text.String())
			}
			if c.hasRefusal {
				msg.set("refusal", c.refusal.String())
			}
			if c.reasoning.Len() > 0 {
				msg.set("reasoning_content", c.reasoning.String())
			}
			for j, cl := range c.calls {
				p := "tool_calls." + strconv.Itoa(j)
				msg.set(p+".id", cl.id)
				msg.set(p+".type", cl.typ)
				msg.set(p+".function.name", cl.name)
				msg.set(p+".function.arguments", cl.args.String())
			}
			ch.raw("message", string(msg.b))
			if len(c.logprobs) > 0 {
				ch.raw("logprobs", `{"content":[`+strings.Join(c.logprobs, ",")+`],"refusal":null}`)
			}
		} else {
			ch.set("text", c.text.String())
		}
		if c.finish != "" {
			ch.set("finish_reason", c.finish)
		}
		out.raw("choices."+strconv.Itoa(k), string(ch.b))
	}
	if usage.Exists() {
		out.raw("usage", usage.Raw)
	}
	return out.b
}

// headOf is a new answer object with src's id, created, model,
// system_fingerprint and service_tier (those it has) and the given object.
func headOf(src gjson.Result, object string) *edit {
	e := &edit{b: []byte(`{}`)}
	for _, f := range []string{"id", "created", "model", "system_fingerprint", "service_tier"} {
		if v := src.Get(f); v.Exists() {
			e.raw(f, v.Raw)
		}
	}
	e.set("object", object)
	return e
}
