package openai

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// parseSeeds are bodies for the differential tests: valid requests of every
// endpoint, each refusal of TestParseRequestRejectsBadBodies, and shapes
// near the parser's edges (escapes, UTF-8, numbers, depth, many members).
func parseSeeds() []string {
	seeds := []string{
		`{"model":"m","messages":[],"stop":[1]}`,
		`{"model":"m","input":""}`,
		`{"model":"m","input":[]}`,
		`{"model":"m","input":[""]}`,
		`{"model":"m","prompt":""}`,
		`{"model":"m","prompt":[]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stop":"x","seed":7,"metadata":{"a":"b"},"store":false,"parallel_tool_calls":true,"service_tier":"flex","reasoning_effort":"low","verbosity":"high"}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a",null]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"seed":1.5}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"seed":"1"}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"metadata":{"a":1}}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"metadata":"x","store":"yes"}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"parallel_tool_calls":"no"}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"service_tier":5,"verbosity":false}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":["high"],"stop":null,"seed":null}`,
		`{"model":"m","prompt":"x","stop":[1],"seed":"s"}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"n":1.5}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}`,
		`{"model":"gpt-x","messages":[{"role":"user","content":"hello there"}]}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":100,"max_completion_tokens":50,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"functions":[{"name":"g"}],"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"},{"role":"assistant","content":null,"function_call":{"name":"f","arguments":"{}"}}]}`,
		`{"model":"m","logprobs":true,"n":3,"response_format":{"type":"json_object"},"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null}]}`,
		`{"model":"m","prompt":"x","best_of":4,"n":2,"logprobs":0}`,
		`{"model":"m","prompt":["a",[1,2]]}`,
		`{"model":"m","input":[5,6]}`,
		`{"model":"m","input":"text"}`,
		` {"model" : "m" , "messages" : [ {"role":"user","content":[{"type":"text","text":"a\nb \u00e9 \ud83d\ude00"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]} ] } `,
		`{"mod\u0065l":"m","messages":[{"r\u006fle":"us\u0065r","content":"esc\"aped\\ \/ \b\f\r\t"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"lone \ud800x \udc00 \ud800\u0041 \ud800\udbff \uDBFF\uDFFF \u0000 \uABCD\\u"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"é ü 日本語 🙂"}],"temperature":-1.5e-3,"top_p":0,"seed":-0}`,
		"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"bad \xff utf8\"}]}",
		"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"surrogate \xed\xa0\x80\"}]}",
		"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"ctrl \x01\"}]}",
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"messages":[]}`,
		`{"model":"m","x":{"k":1,"j":2,"k":3},"messages":[{"role":"user","content":"hi"}]}`,
		`{"\u0061":1,"a":2}`, `{"a\"b":1,"a\"b":2}`, `[{"x":1},{"y":1,"y":2}]`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":5}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":1.50}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":{"a":1}}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":null}]}]}`,
		`{"model":"m","tools":[[{"function":{"name":"f"}}]],"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","tools":["f"],"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","stream_options":[true],"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":1e3,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":{"a":[1,2]},"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":99999999999999999999,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","n":-1,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":null,"messages":[]}`, `{"model":true}`, `{}`, `[]`, `"x"`, `12`, `-0.5e+7`, `null`, `true`, `false`,
		``, ` `, `{`, `}`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[01]`, `[1.]`, `[.5]`, `[1e]`, `[-]`, `[+1]`, `{"a":1}x`,
		`{"a":tru}`, `{"a":nul}`, `{"a":"\x"}`, `{"a":"\u12"}`, `{"a":"\u12g4"}`, `"unterminated`, `{"a":"b"`, `[1 2]`,
		`{"a" 1}`, `{1:2}`, "\t\n\r{\"a\":[]}\r\n", `{"a":[[],{},[{}]],"b":{"c":{"d":[null,true,false]}}}`,
		`{"model":"` + strings.Repeat("m", MaxModelName+1) + `","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","x":` + strings.Repeat("[", MaxJSONDepth) + strings.Repeat("]", MaxJSONDepth) + `,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","x":` + strings.Repeat("[", MaxJSONDepth-1) + strings.Repeat("]", MaxJSONDepth-1) + `,"messages":[{"role":"user","content":"hi"}]}`,
		strings.Repeat("[", MaxJSONDepth+1) + strings.Repeat("]", MaxJSONDepth),
		strings.Repeat("[", 200) + `{"a":1,"a":2}` + strings.Repeat("]", 200),
		`{"a":1,"a":2,"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`,
		`{"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `,"a":1,"a":2}`,
		`{"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + "\xff}",
		"{\"x\":\"\xff\",\"a\":1,\"a\":2}",
	}
	// Objects with many members: repeated names found by the map.
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[{"role":"user","content":"hi"}]`)
	for i := range 40 {
		b.WriteString(`,"k` + strconv.Itoa(i) + `":` + strconv.Itoa(i))
	}
	seeds = append(seeds, b.String()+"}", b.String()+`,"k\u0031\u0037":0}`, b.String()+`,"k40":0}`)
	for _, tt := range badBodies {
		seeds = append(seeds, tt.body)
	}
	return seeds
}

var endpoints = []Endpoint{EndpointChat, EndpointCompletions, EndpointEmbeddings}

// sameOutcome fails t unless ParseRequest and the reference (the gjson
// passes it replaced) agree on body for ep: the same view, or the same error.
func sameOutcome(t *testing.T, ep Endpoint, body string) {
	t.Helper()
	got, gerr := ParseRequest(ep, []byte(body))
	want, werr := refParseRequest(ep, []byte(body))
	if !reflect.DeepEqual(gerr, werr) {
		t.Fatalf("%s %q:\nerror %+v\nwant  %+v", ep, body, gerr, werr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s %q:\nview %+v\nwant %+v", ep, body, got, want)
	}
}

func TestParseAgreesWithTheGjsonPasses(t *testing.T) {
	for _, body := range parseSeeds() {
		for _, ep := range endpoints {
			sameOutcome(t, ep, body)
		}
		if gjson.Valid(body) {
			k, dup, deep := CheckStructure([]byte(body))
			rk, rdup, rdeep := refCheckStructure([]byte(body))
			if k != rk || dup != rdup || deep != rdeep {
				t.Fatalf("CheckStructure(%q) = %q, %v, %v; the reference says %q, %v, %v", body, k, dup, deep, rk, rdup, rdeep)
			}
		}
	}
}

// FuzzParse checks ParseRequest against the gjson passes it replaced, and
// the Doc against a gjson walk of the same body.
func FuzzParse(f *testing.F) {
	for _, s := range parseSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		for _, ep := range endpoints {
			sameOutcome(t, ep, body)
		}
		if gjson.Valid(body) {
			k, dup, deep := CheckStructure([]byte(body))
			rk, rdup, rdeep := refCheckStructure([]byte(body))
			if k != rk || dup != rdup || deep != rdeep {
				t.Fatalf("CheckStructure(%q) = %q, %v, %v; the reference says %q, %v, %v", body, k, dup, deep, rk, rdup, rdeep)
			}
		}
		if d, pr, _ := parse(body); pr == problemNone {
			sameTree(t, d, body)
		}
	})
}

func TestDocMatchesAGjsonWalk(t *testing.T) {
	for _, body := range parseSeeds() {
		if d, pr, _ := parse(body); pr == problemNone {
			sameTree(t, d, body)
		}
	}
}

// sameTree walks body with gjson (the oracle) and d in step: every value's
// kind, raw text, decoded string, member name, parent, index and subtree.
func sameTree(t *testing.T, d *Doc, body string) {
	t.Helper()
	i := 0
	var walk func(v gjson.Result, parent, index int, key *gjson.Result)
	walk = func(v gjson.Result, parent, index int, key *gjson.Result) {
		me := i
		if me >= d.Len() {
			t.Fatalf("%q: the Doc has %d values, gjson more", body, d.Len())
		}
		i++
		want := map[gjson.Type]ValueKind{gjson.Null: KindNull, gjson.False: KindFalse, gjson.True: KindTrue, gjson.Number: KindNumber, gjson.String: KindString}[v.Type]
		if v.IsObject() {
			want = KindObject
		} else if v.IsArray() {
			want = KindArray
		}
		raw := v.Raw
		if parent < 0 {
			raw = strings.TrimRight(raw, " \t\r\n") // gjson.Parse keeps what follows the root
		}
		if d.Kind(me) != want || d.Raw(me) != raw || d.Parent(me) != parent || d.Index(me) != index {
			t.Fatalf("%q value %d: kind %d raw %q parent %d index %d; gjson: kind %d raw %q parent %d index %d",
				body, me, d.Kind(me), d.Raw(me), d.Parent(me), d.Index(me), want, v.Raw, parent, index)
		}
		if d.Offset(me) != v.Index || v.Type == gjson.String && d.Str(me) != v.Str {
			t.Fatalf("%q value %d: offset %d str %q; gjson: %d %q", body, me, d.Offset(me), d.Str(me), v.Index, v.Str)
		}
		if k, ok := d.Key(me); ok != (key != nil) || key != nil && k != key.Str {
			t.Fatalf("%q value %d: key %q, %v; gjson %v", body, me, k, ok, key)
		}
		n := 0
		if v.IsObject() || v.IsArray() {
			v.ForEach(func(k, e gjson.Result) bool {
				if v.IsObject() {
					walk(e, me, n, &k)
					if d.Member(me, k.Str) < 0 {
						t.Fatalf("%q: Member(%d, %q) = -1", body, me, k.Str)
					}
				} else {
					walk(e, me, n, nil)
				}
				n++
				return true
			})
		}
		if d.Next(me) != i {
			t.Fatalf("%q value %d: next %d, want %d", body, me, d.Next(me), i)
		}
	}
	walk(gjson.Parse(body), -1, 0, nil)
	if i != d.Len() {
		t.Fatalf("%q: the Doc has %d values, gjson %d", body, d.Len(), i)
	}
}

// chatOf is a chat body of about size bytes: a system message and user
// turns of prose with escapes, as clients send them.
func chatOf(size int) string {
	var b strings.Builder
	b.WriteString(`{"model":"chat","stream":false,"max_tokens":256,"temperature":0.2,"messages":[{"role":"system","content":"You are a helpful assistant."}`)
	turn := `,{"role":"user","content":"Hello team, we have been using the gateway for three weeks now.\nMost answers are good, but some replies about invoices arrive late and a few mention the wrong contract dates. Could you check the routing rules and tell us whether the \"latency targets\" are realistic?"}`
	for b.Len() < size-len(turn) {
		b.WriteString(turn)
	}
	b.WriteString(`]}`)
	return b.String()
}

// BenchmarkParseRequest measures ParseRequest on chat bodies of 2, 32 and
// 256 KB; baseline/* is the previous implementation's passes (gjson
// validity, UTF-8, CheckStructure, gjson Gets) on the same bodies.
func BenchmarkParseRequest(b *testing.B) {
	for _, kb := range []int{2, 32, 256} {
		body := []byte(chatOf(kb << 10))
		for _, impl := range []struct {
			name  string
			parse func(Endpoint, []byte) (*Request, *Error)
		}{{"baseline", refParseRequest}, {"one-pass", ParseRequest}} {
			b.Run(impl.name+"/"+strconv.Itoa(kb)+"KB", func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := impl.parse(EndpointChat, body); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
