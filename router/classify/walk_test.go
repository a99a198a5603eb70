package classify

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/openai"
)

// walkSeeds are valid bodies of every endpoint with every shape the walker
// treats apart: several user turns, content parts, names, tool calls and
// their arguments, data URLs (text, binary, undecodable), audio and file
// data, keys that sjson paths must escape, escaped keys and values, enum
// values in and out of their positions, numbers, prompts and token ids.
var walkSeeds = []struct {
	ep   openai.Endpoint
	body string
}{
	{openai.EndpointChat, `{"model":"m","messages":[{"role":"user","content":"hello alice@example.com"}]}`},
	{openai.EndpointChat, `{"model":"m","temperature":0.5,"seed":42,"metadata":{"user.id":"u-1","a*b?c":"x","#tag":"y"},"messages":[` +
		`{"role":"system","content":"be brief"},{"role":"user","name":"bob_smith","content":"first"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"lookup","arguments":"{\"email\":\"x@y.io\",\"n\":[1,\"two\"]}"}}]},` +
		`{"role":"tool","tool_call_id":"call_1","content":"result 4111 1111 1111 1111"},` +
		`{"role":"user","content":[{"type":"text","text":"second part one"},{"type":"text","text":"part two"},{"type":"refusal","refusal":"no"},` +
		`{"type":"image_url","image_url":{"url":"https://example.com/a.png","detail":"high"}},` +
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}},` +
		`{"type":"file","file":{"file_data":"JVBERi0=","filename":"a.pdf"}},` +
		`{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}]},` +
		`{"role":"assistant","content":"ok","function_call":{"name":"f","arguments":"not json"}}],` +
		`"tools":[{"type":"function","function":{"name":"lookup","description":"find a user","parameters":{"type":"object","properties":{"email":{"type":"string","enum":["a","b"]}},"required":["email"]}}}],` +
		`"tool_choice":{"type":"function","function":{"name":"lookup"}},"response_format":{"type":"json_schema","json_schema":{"name":"out","schema":{"type":"object"}}},` +
		`"service_tier":"flex","reasoning_effort":"none-of-these","modalities":["text","audio"],"audio":{"voice":"alloy","format":"mp3"}}`},
	{openai.EndpointChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:text/plain;base64,bWFyaW9AZXhhbXBsZS5pdA=="}},` +
		`{"type":"image_url","image_url":{"url":"data:,hello%20there"}},{"type":"image_url","image_url":{"url":"data:text/plain;base64,@@@"}},` +
		`{"type":"image_url","image_url":{"url":"data:text/plain,%zz"}},{"type":"text","text":"data:no comma"}]}]}`},
	{openai.EndpointChat, `{"mod\u0065l":"m","messages":[{"r\u006fle":"us\u0065r","c\u006fntent":"esc\"aped \u00e9 \ud83d\ude00 line\nfeed"},{"role":"user","content":"user"}],"k\u0065y.with.dots":"v"}`},
	{openai.EndpointChat, `{"model":"m","messages":[{"role":"user","content":"u1"},{"role":"assistant","content":"a1"},{"role":"user","content":[]},{"role":"assistant","content":"a2"}]}`},
	{openai.EndpointChat, `{"model":"m","messages":[{"role":"developer","content":"dev"},{"role":"function","name":"f","content":"fn"}],"user":"end-user@example.com","stop":["\n\n","END"],"logit_bias":{"50256":-100}}`},
	{openai.EndpointCompletions, `{"model":"m","prompt":"complete this for carol@example.com","suffix":"tail","max_tokens":5}`},
	{openai.EndpointCompletions, `{"model":"m","prompt":["one","two",[1,2,3]],"echo":true}`},
	{openai.EndpointCompletions, `{"model":"m","prompt":[1,2,3],"messages":[{"role":"user","content":"stray"}]}`},
	{openai.EndpointEmbeddings, `{"model":"m","input":["a","b"],"encoding_format":"float","dimensions":256}`},
	{openai.EndpointEmbeddings, `{"model":"m","input":"just text","encoding_format":"base64"}`},
	{openai.EndpointEmbeddings, `{"model":"m","input":[[1,2],[3]]}`},
}

// sameWalk fails t unless Classify's fields, unscanned parts, modalities and
// estimator text for body are those of the reference walker (the gjson walk
// it replaced).
func sameWalk(t *testing.T, c *Classifier, ep openai.Endpoint, body string) {
	t.Helper()
	a, err := c.Classify(Input{Endpoint: ep, Body: []byte(body)})
	if err != nil {
		return // refused bodies are ParseRequest's, checked against its own reference
	}
	ref, w := refWalk(body)
	got := make([]refField, len(a.fields))
	for i, f := range a.fields {
		got[i] = refField{path: a.fieldPath(i), text: f.text, kind: f.kind, mediaType: f.mediaType}
	}
	if !reflect.DeepEqual(got, ref.fields) && (len(got) > 0 || len(ref.fields) > 0) {
		t.Fatalf("%s %q:\nfields %q\nwant   %q", ep, body, got, ref.fields)
	}
	un := a.unscanned
	if a.req.TokenPrompts {
		if len(un) == 0 || un[len(un)-1].Reason != "token ids" {
			t.Fatalf("%s %q: token ids not listed: %v", ep, body, un)
		}
		un = un[:len(un)-1]
	}
	if !reflect.DeepEqual(un, ref.unscanned) && (len(un) > 0 || len(ref.unscanned) > 0) {
		t.Fatalf("%s %q:\nunscanned %v\nwant      %v", ep, body, un, ref.unscanned)
	}
	if !reflect.DeepEqual(a.modal, ref.modal) {
		t.Fatalf("%s %q: modalities %v, want %v", ep, body, a.modal, ref.modal)
	}
	want := w.lastUser
	if ep != openai.EndpointChat {
		want = w.prompts.String()
	}
	if a.LastUserText() != want {
		t.Fatalf("%s %q: estimator text %q, want %q", ep, body, a.LastUserText(), want)
	}
}

func TestWalkAgreesWithTheGjsonWalk(t *testing.T) {
	c := testClassifier(t)
	for _, s := range walkSeeds {
		if _, err := c.Classify(Input{Endpoint: s.ep, Body: []byte(s.body)}); err != nil {
			t.Fatalf("seed %q: %v", s.body, err)
		}
		sameWalk(t, c, s.ep, s.body)
	}
}

// FuzzWalk checks the walk over the Doc against the gjson walk it replaced.
func FuzzWalk(f *testing.F) {
	eps := []openai.Endpoint{openai.EndpointChat, openai.EndpointCompletions, openai.EndpointEmbeddings}
	for _, s := range walkSeeds {
		for i, ep := range eps {
			if ep == s.ep {
				f.Add(uint8(i), s.body)
			}
		}
	}
	c := testClassifier(f)
	f.Fuzz(func(t *testing.T, ep uint8, body string) {
		sameWalk(t, c, eps[int(ep)%len(eps)], body)
	})
}

// benchProse is a chat body of about n bytes: a system message and one
// user turn of prose ending in an e-mail address, as the gateway table's.
func benchProse(n int) []byte {
	var sb strings.Builder
	sb.WriteString("Please draft a reply to the customer below. Keep it polite and short, and summarise what we will do next.\\n\\n")
	para := "Hello team, we have been using the gateway for our internal support assistant for three weeks now. " +
		"Most answers are good, but some replies about invoices arrive late and a few mention the wrong contract dates. " +
		"Could you check the configuration of the routing rules and tell us whether the latency targets are realistic? "
	for sb.Len() < n-330-len(para) {
		sb.WriteString(para)
	}
	sb.WriteString("\\nYou can reach me at giulia.bianchi@example.com or through the usual ticket queue.\\nBest regards, Giulia")
	return []byte(`{"model":"chat","stream":false,"max_tokens":256,"messages":[{"role":"system","content":"You are a helpful support assistant for a software company."},{"role":"user","content":"` + sb.String() + `"}]}`)
}

// benchChat is a chat body of about kb KB: a system message and user
// turns of prose with escapes.
func benchChat(kb int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"chat","max_tokens":256,"messages":[{"role":"system","content":"You are a helpful assistant."}`)
	turn := `,{"role":"user","content":"Hello team, we have been using the gateway for three weeks now.\nMost answers are good, but some replies about invoices arrive late. Could you check the \"routing rules\"?"}`
	for sb.Len() < kb<<10-len(turn) {
		sb.WriteString(turn)
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}

// BenchmarkClassify measures Classify on chat bodies of 2 and 32 KB with
// the detectors replaced by no-ops, so the figure is the parse, the walk,
// the estimator and the digest. walk/* compares the walk alone: over a
// parsed Doc, and baseline, the gjson walk it replaced (which parsed as it
// went, built a path string per leaf and looked up each message's role with
// a gjson.Get), on the same bodies.
func BenchmarkClassify(b *testing.B) {
	c := New(testScanner(b), nil)
	c.scan = func(string) ([]redaction.Finding, error) { return nil, nil }
	c.scanAcross = func([]string) ([]redaction.SegmentFinding, error) { return nil, nil }
	full := New(testScanner(b), nil)
	b.Run("full/2KB", func(b *testing.B) {
		// The gateway table's body (cmd/molly's benchBody): prose and one
		// e-mail address, every detector on.
		body := benchProse(2 << 10)
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := full.Classify(Input{Endpoint: openai.EndpointChat, Body: body}); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, kb := range []int{2, 32} {
		body := benchChat(kb)
		name := strconv.Itoa(kb) + "KB"
		b.Run("classify/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Classify(Input{Endpoint: openai.EndpointChat, Body: body}); err != nil {
					b.Fatal(err)
				}
			}
		})
		_, doc, perr := openai.Parse(openai.EndpointChat, string(body))
		if perr != nil {
			b.Fatal(perr)
		}
		b.Run("walk/one-pass/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				a := &Annotation{doc: doc, body: doc.Body(), modal: []string{"text"}}
				w := walker{a: a, d: doc}
				w.walk(0)
				_ = w.lastUserText()
			}
		})
		b.Run("walk/baseline/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				_, w := refWalk(doc.Body())
				_ = w.lastUser
			}
		})
	}
}
