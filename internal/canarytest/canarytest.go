// Package canarytest generates the residency canary corpus and
// holds its oracle, for every test that checks the residency invariant:
// canary values — a user-defined pattern type (Pattern) and a known test
// card number (Card) — planted at random positions and in random shapes of
// valid OpenAI chat bodies (Generate), and an oracle (Leaked) that does not
// use Molly's detectors: it decodes a received JSON body with
// encoding/json, decodes base64 and percent-encoding itself, and searches
// the alphanumeric skeleton of every string, key and number for the
// canary's. router/pipeline runs the corpus through the in-process
// pipeline under every strategy, envoy through the ext_proc policy point.
package canarytest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
)

// Card is the Visa test card number issuers publish for testing.
const Card = "4111111111111111"

// Pattern is the custom pattern type (RE2) the classifier under test must
// be given as type CANARY.
const Pattern = `MOLLY-CANARY-[0-9A-F]{8}`

// Case is one generated request.
type Case struct {
	// Strategy is the pipeline strategy the case is meant for: one of Strategies.
	Strategy string
	// Body is a valid chat completion request body (model "m") with one canary planted.
	Body []byte
	// Canary is what must never reach T3: the planted value's alphanumeric skeleton.
	Canary string
	// Tool is the governed tool's result, for the tools strategy (it may carry the canary).
	Tool string
}

// Strategies are the pipeline strategies cases are generated for.
var Strategies = []string{"single", "fallback", "cascade", "mixture", "tools"}

// Generate builds a valid chat body from r with one canary planted, at one
// of 20 positions (message text, parts, names, metadata keys and values,
// stop sequences, schemas, tool arguments and ids, vendor fields, numbers,
// data URLs, split across messages, tool descriptions, a tool result).
func Generate(r *rand.Rand) Case {
	c := Case{Strategy: Strategies[r.IntN(len(Strategies))]}
	var value string
	if r.IntN(2) == 0 {
		value = fmt.Sprintf("MOLLY-CANARY-%08X", r.Uint32())
	} else {
		value = []string{Card, "4111 1111 1111 1111", "4111-1111-1111-1111"}[r.IntN(3)]
	}
	c.Canary = Skeleton(value)
	wrap := func(s string) string { // the canary inside some text
		return []string{s, "my value is " + s + ".", "ref:" + s, s + " thanks", "a\n" + s + "\nb"}[r.IntN(5)]
	}
	msgs := []any{map[string]any{"role": "user", "content": "hello there"}}
	body := map[string]any{"model": "m", "messages": msgs, "max_tokens": 16}
	stream := r.IntN(3) == 0 && c.Strategy != "mixture" && c.Strategy != "tools"
	if stream {
		body["stream"] = true
	}
	user := func(content any) { msgs = append(msgs, map[string]any{"role": "user", "content": content}) }
	switch pos := r.IntN(20); pos {
	case 0:
		user(wrap(value))
	case 1:
		user([]any{map[string]any{"type": "text", "text": wrap(value)}})
	case 2:
		msgs = append([]any{map[string]any{"role": "system", "content": wrap(value)}}, msgs...)
	case 3:
		msgs = append(msgs, map[string]any{"role": "assistant", "content": wrap(value)}, map[string]any{"role": "user", "content": "and?"})
	case 4:
		msgs = append(msgs, map[string]any{"role": "user", "name": strings.ReplaceAll(value, " ", "_"), "content": "hi"})
	case 5:
		body["metadata"] = map[string]any{"ref": wrap(value)}
	case 6:
		body["metadata"] = map[string]any{value: "x"}
	case 7:
		body["user"] = wrap(value)
	case 8:
		body["stop"] = []any{"END", wrap(value)}
	case 9:
		body["response_format"] = map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "out", "description": wrap(value),
			"schema": map[string]any{"type": "object", "properties": map[string]any{value: map[string]any{"type": "string"}}}}}
	case 10:
		args, _ := json.Marshal(map[string]any{"note": wrap(value)})
		msgs = append(msgs, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_9", "type": "function",
			"function": map[string]any{"name": "f", "arguments": string(args)}}}}, map[string]any{"role": "tool", "tool_call_id": "call_9", "content": "done"})
	case 11:
		id := "call_" + strings.ReplaceAll(value, " ", "")
		msgs = append(msgs, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": id, "type": "function",
			"function": map[string]any{"name": "f", "arguments": "{}"}}}}, map[string]any{"role": "tool", "tool_call_id": id, "content": wrap(value)})
	case 12:
		body["x_vendor"] = map[string]any{"deep": []any{map[string]any{"deeper": wrap(value)}}}
	case 13:
		if v := strings.ReplaceAll(value, " ", ""); !strings.Contains(v, "-") {
			body["seed"] = json.Number(v) // a number, not a string
		} else {
			body["seed_note"] = v
		}
	case 14:
		enc := base64.StdEncoding.EncodeToString([]byte("note: " + value))
		user([]any{map[string]any{"type": "text", "text": "see"}, map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:text/plain;base64," + enc}}})
	case 15:
		png := append([]byte("\x89PNG\r\n\x1a\n"), []byte(value)...)
		user([]any{map[string]any{"type": "text", "text": "look"}, map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64," + base64.StdEncoding.EncodeToString(png)}}})
	case 16:
		body["tool_choice"] = value // not one of the enum's values: content
	case 17:
		cut := len(value) / 2
		user(value[:cut])
		user(value[cut:])
	case 18:
		body["tools"] = []any{map[string]any{"type": "function", "function": map[string]any{"name": "g", "description": wrap(value), "parameters": map[string]any{"type": "object"}}}}
	case 19:
		c.Tool = wrap(value)
		c.Strategy = "tools"
	}
	if c.Strategy == "tools" && c.Tool == "" {
		c.Tool = "nothing to see"
	}
	body["messages"] = msgs
	c.Body, _ = json.Marshal(body)
	return c
}

// Skeleton is s's letters and digits, upper-cased: the oracle's canonical form.
func Skeleton(s string) string {
	var b strings.Builder
	for _, r := range strings.ToUpper(s) {
		if r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Leaked reports whether body (as an upstream received it) carries the
// canary (a Skeleton): in any string, key or number, raw, percent-decoded or
// base64-decoded (a data: URL's payload or any base64 run).
func Leaked(body []byte, canary string) bool {
	if strings.Contains(Skeleton(string(body)), canary) {
		// fast path on the raw bytes; JSON escapes are handled below
		return true
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		return false
	}
	var texts []string
	var walk func(any)
	walk = func(x any) {
		switch t := x.(type) {
		case map[string]any:
			for k, e := range t {
				texts = append(texts, k)
				walk(e)
			}
		case []any:
			for _, e := range t {
				walk(e)
			}
		case string:
			texts = append(texts, t)
		case json.Number:
			texts = append(texts, string(t))
		}
	}
	walk(v)
	for _, s := range texts {
		forms := []string{s}
		if u, err := url.PathUnescape(s); err == nil {
			forms = append(forms, u)
		}
		if _, payload, ok := strings.Cut(s, ";base64,"); ok {
			if d, err := base64.StdEncoding.DecodeString(payload); err == nil {
				forms = append(forms, string(d))
			}
		}
		if d, err := base64.StdEncoding.DecodeString(s); err == nil {
			forms = append(forms, string(d))
		}
		for _, f := range forms {
			if strings.Contains(Skeleton(f), canary) {
				return true
			}
		}
	}
	return false
}
