package relay

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/molly-gateway/molly/redaction"
)

// StreamRestore restores placeholders in an SSE stream of chat or text
// completion chunks. A placeholder may be split across any number of
// chunks, so each text stream (a choice's text, every string of its delta
// but identifiers: content, refusal, reasoning_content and the like, and
// each tool call's arguments) goes through its own redaction.StreamRestorer,
// which holds back only a tail that could still start a placeholder. The
// held-back text is released on the choice's finish_reason chunk, or in one
// extra chunk before [DONE].
//
// With a guard, each restored text stream then goes through its own
// redaction.StreamGuard: entity types the model wrote are masked (or the
// stream is refused, Err) as the policy's output rule says, holding back
// only as much as the longest pattern needs. The chunks' logprobs are then
// held too (each chunk goes on with "logprobs": null) and come with the
// choice's finish_reason chunk, unless the guard masked its content or
// refusal: their tokens would spell the value, so they are dropped. A
// stream that ends without a finish_reason drops them.
type StreamRestore struct {
	vault *redaction.Vault // nil: nothing to restore
	guard *redaction.Guard // nil: answers are not guarded
	rs    map[string]*textStage
	order []string // keys in first-seen order, for a stable final flush
	tmpl  []byte   // id, object, created, model of the first chunk, for the final flush
	err   error    // the guard blocked the answer
	// lp holds, with a guard, each choice's logprobs entries (raw JSON of
	// logprobs.content items) until its finish_reason: their tokens spell
	// the text the guard holds back and may mask.
	lp map[int64][]string
}

// textStage is one text stream's restorer then guard.
type textStage struct {
	r *redaction.StreamRestorer
	g *redaction.StreamGuard
}

// NewStreamRestore returns the restorer of one stream answered under v
// (nil: nothing to restore), guarded by g (nil: no guard).
func NewStreamRestore(v *redaction.Vault, g *redaction.Guard) *StreamRestore {
	return &StreamRestore{vault: v, guard: g, rs: map[string]*textStage{}}
}

// Err is the guard's refusal (a *redaction.BlockedError), once a text
// stream held a value the policy blocks; the caller ends the stream.
func (s *StreamRestore) Err() error { return s.err }

func (s *StreamRestore) stage(key string) *textStage {
	st, ok := s.rs[key]
	if !ok {
		st = &textStage{}
		if s.vault != nil {
			st.r = s.vault.NewStreamRestorer()
			if strings.Contains(key, "/tool/") || strings.HasSuffix(key, "arguments") {
				// Tool arguments are JSON text: values go in JSON-escaped.
				st.r = s.vault.NewJSONStreamRestorer()
			}
		}
		if s.guard != nil {
			st.g = s.guard.NewStream()
		}
		s.rs[key] = st
		s.order = append(s.order, key)
	}
	return st
}

func (s *StreamRestore) write(key, text string) string {
	st := s.stage(key)
	if st.r != nil {
		text = st.r.Write(text)
	}
	if st.g != nil {
		out, err := st.g.Write(text)
		if err != nil && s.err == nil {
			s.err = err
		}
		text = out
	}
	return text
}

func (s *StreamRestore) flush(key string) string {
	st := s.rs[key]
	var text string
	if st.r != nil {
		text = st.r.Flush()
	}
	if st.g != nil {
		a, err := st.g.Write(text)
		b, ferr := st.g.Flush()
		if err == nil {
			err = ferr
		}
		if err != nil && s.err == nil {
			s.err = err
		}
		text = a + b
	}
	return text
}

// Event rewrites one chunk's JSON data.
func (s *StreamRestore) Event(data []byte) []byte {
	if s.tmpl == nil {
		s.tmpl = []byte(`{}`)
		for _, f := range []string{"id", "object", "created", "model", "system_fingerprint"} {
			if v := gjson.GetBytes(data, f); v.Exists() {
				s.tmpl, _ = sjson.SetRawBytes(s.tmpl, f, []byte(v.Raw))
			}
		}
	}
	out := data
	gjson.GetBytes(data, "choices").ForEach(func(pos, ch gjson.Result) bool {
		base := "choices." + pos.String()
		idx := ch.Get("index").Int()
		set := func(path, key string, v gjson.Result) {
			if v.Type != gjson.String {
				return
			}
			if b, err := sjson.SetBytes(out, path, s.write(key, v.Str)); err == nil {
				out = b
			}
		}
		set(base+".text", fmt.Sprintf("%d/text", idx), ch.Get("text"))
		// Every text of the delta (content, refusal, reasoning_content,
		// reasoning, function_call.arguments, ...) is a stream of its
		// own, keyed by its path in the delta; tool calls by their index.
		var walk func(sub, key string, v gjson.Result)
		walk = func(sub, key string, v gjson.Result) {
			switch {
			case v.Type == gjson.String:
				if !streamSkipKeys[key] {
					set(base+".delta."+sub, fmt.Sprintf("%d/d/%s", idx, sub), v)
				}
			case v.IsObject():
				v.ForEach(func(k, e gjson.Result) bool {
					name := k.String()
					if (sub == "" && name == "tool_calls") || (key == "audio" && name == "data") {
						return true
					}
					p := EscapeKey(name)
					if sub != "" {
						p = sub + "." + p
					}
					walk(p, name, e)
					return true
				})
			case v.IsArray() && sub != "":
				v.ForEach(func(k, e gjson.Result) bool {
					walk(sub+"."+k.String(), key, e)
					return true
				})
			}
		}
		walk("", "", ch.Get("delta"))
		ch.Get("delta.tool_calls").ForEach(func(k, tc gjson.Result) bool {
			set(base+".delta.tool_calls."+k.String()+".function.arguments",
				fmt.Sprintf("%d/tool/%d", idx, tc.Get("index").Int()), tc.Get("function.arguments"))
			return true
		})
		if s.guard != nil {
			if lp := ch.Get("logprobs"); lp.Exists() && lp.Type != gjson.Null {
				if s.lp == nil {
					s.lp = map[int64][]string{}
				}
				for _, e := range lp.Get("content").Array() {
					s.lp[idx] = append(s.lp[idx], e.Raw)
				}
				out, _ = sjson.SetRawBytes(out, base+".logprobs", []byte("null"))
			}
		}
		if fr := ch.Get("finish_reason"); fr.Exists() && fr.Type != gjson.Null {
			out = s.flushChoice(out, base, idx)
			out = s.releaseLogprobs(out, base, idx)
		}
		return true
	})
	// Other text-bearing fields are restored where whole.
	if s.vault == nil {
		return out
	}
	return s.vault.RestoreJSON(out)
}

// streamSkipKeys name the strings of a delta that are identifiers, not
// text the model wrote.
var streamSkipKeys = map[string]bool{"role": true, "id": true, "type": true, "name": true}

// EscapeKey escapes an object member name so that it is one segment of a
// gjson/sjson path that names exactly that member: a backslash before every
// byte but ASCII letters, digits, '_', '-', bytes below '!' and above '~'
// (gjson.Escape), and before ':' (a path starting with ':' is sjson's
// "force" flag). A name left unescaped is read as path syntax — '.', '*',
// '?', '#', '@', '!', '|', and '[' or '{' (a multipath: "[0]" would select
// nothing, and sjson would add a new member beside the one it was meant to
// replace).
func EscapeKey(key string) string {
	esc := gjson.Escape(key)
	if !strings.Contains(esc, ":") {
		return esc
	}
	var b strings.Builder
	for i := 0; i < len(esc); i++ {
		if esc[i] == '\\' && i+1 < len(esc) {
			b.WriteString(esc[i : i+2])
			i++
			continue
		}
		if esc[i] == ':' {
			b.WriteByte('\\')
		}
		b.WriteByte(esc[i])
	}
	return b.String()
}

// releaseLogprobs puts the logprobs held for choice idx into the chunk at
// base, unless the guard masked something of the choice's content or
// refusal.
func (s *StreamRestore) releaseLogprobs(out []byte, base string, idx int64) []byte {
	held, ok := s.lp[idx]
	if !ok {
		return out
	}
	delete(s.lp, idx)
	prefix := strconv.FormatInt(idx, 10) + "/d/"
	for _, key := range []string{prefix + "content", prefix + "refusal"} {
		if st := s.rs[key]; st != nil && st.g != nil && len(st.g.Findings()) > 0 {
			return out
		}
	}
	raw := `{"content":[` + strings.Join(held, ",") + `],"refusal":null}`
	if b, err := sjson.SetRawBytes(out, base+".logprobs", []byte(raw)); err == nil {
		out = b
	}
	return out
}

// flushChoice appends the held-back text of choice idx to the chunk at base.
func (s *StreamRestore) flushChoice(out []byte, base string, idx int64) []byte {
	prefix := strconv.FormatInt(idx, 10) + "/"
	for _, key := range s.order {
		if len(key) < len(prefix) || key[:len(prefix)] != prefix {
			continue
		}
		rest := s.flush(key)
		if rest == "" {
			continue
		}
		var path string
		switch kind := key[len(prefix):]; {
		case kind == "text":
			path = base + ".text"
		case strings.HasPrefix(kind, "d/"):
			path = base + ".delta." + kind[len("d/"):]
		default: // tool/<k>: an extra tool_calls delta carrying the rest
			var k int
			fmt.Sscanf(kind, "tool/%d", &k)
			n := gjson.GetBytes(out, base+".delta.tool_calls.#").Int()
			p := base + ".delta.tool_calls." + strconv.FormatInt(n, 10)
			out, _ = sjson.SetBytes(out, p, map[string]any{"index": k, "function": map[string]any{"arguments": rest}})
			continue
		}
		prev := gjson.GetBytes(out, path).Str
		if b, err := sjson.SetBytes(out, path, prev+rest); err == nil {
			out = b
		}
	}
	return out
}

// Final returns one extra chunk with whatever is still held back, or nil.
func (s *StreamRestore) Final() []byte {
	if s.tmpl == nil {
		return nil
	}
	chunk := append([]byte(nil), s.tmpl...)
	n := 0
	for _, key := range s.order {
		i, kind, _ := strings.Cut(key, "/")
		idx, _ := strconv.ParseInt(i, 10, 64)
		rest := s.flush(key)
		if rest == "" {
			continue
		}
		base := "choices." + strconv.Itoa(n)
		n++
		chunk, _ = sjson.SetBytes(chunk, base+".index", idx)
		chunk, _ = sjson.SetRawBytes(chunk, base+".finish_reason", []byte("null"))
		switch {
		case kind == "text":
			chunk, _ = sjson.SetBytes(chunk, base+".text", rest)
		case strings.HasPrefix(kind, "d/"):
			chunk, _ = sjson.SetBytes(chunk, base+".delta."+kind[len("d/"):], rest)
		default:
			var k int
			fmt.Sscanf(kind, "tool/%d", &k)
			chunk, _ = sjson.SetBytes(chunk, base+".delta.tool_calls.0", map[string]any{"index": k, "function": map[string]any{"arguments": rest}})
		}
	}
	if n == 0 {
		return nil
	}
	return chunk
}

// RestoreBody restores placeholders in a whole (non-streamed) JSON answer.
// Tool-call arguments are JSON inside a JSON string, so their values are
// escaped for the inner document first, then the string is re-encoded.
func RestoreBody(v *redaction.Vault, body []byte) []byte {
	out := body
	gjson.GetBytes(body, "choices").ForEach(func(i, ch gjson.Result) bool {
		ch.Get("message.tool_calls").ForEach(func(k, tc gjson.Result) bool {
			args := tc.Get("function.arguments")
			if args.Type != gjson.String {
				return true
			}
			restored := string(v.RestoreJSON([]byte(args.Str)))
			if restored != args.Str {
				path := "choices." + i.String() + ".message.tool_calls." + k.String() + ".function.arguments"
				if b, err := sjson.SetBytes(out, path, restored); err == nil {
					out = b
				}
			}
			return true
		})
		return true
	})
	return v.RestoreJSON(out)
}

// StripLogprobs sets every choice's logprobs to null (logprobs a cascade
// asked for, not the client).
func StripLogprobs(body []byte) []byte {
	n := int(gjson.GetBytes(body, "choices.#").Int())
	for i := range n {
		path := "choices." + strconv.Itoa(i) + ".logprobs"
		if v := gjson.GetBytes(body, path); !v.Exists() || v.Type == gjson.Null {
			continue
		}
		if out, err := sjson.SetRawBytes(body, path, []byte("null")); err == nil {
			body = out
		}
	}
	return body
}
