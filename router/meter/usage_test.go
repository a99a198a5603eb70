package meter

import (
	"context"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/capability"
	"github.com/molly-gateway/molly/router/route"
)

// ledger records usage and whether the context it got was still live.
type ledger struct {
	got  []Usage
	live []bool
}

func (l *ledger) Record(ctx context.Context, u Usage) error {
	l.got = append(l.got, u)
	l.live = append(l.live, ctx.Err() == nil)
	return nil
}

// newMeter is a meter for target "t" (1 and 2 USD per 1M tokens) with a
// prompt estimate of 8 tokens.
func newMeter(ctx context.Context, strip bool) (*Meter, *ledger) {
	l := &ledger{}
	m := New(ctx, Options{Ledger: l, Target: &route.Target{Name: "t", PriceIn: 1, PriceOut: 2},
		PromptEstimate: 8, StripUsage: strip, Base: Usage{DecisionID: "d", Model: "m", Target: "t", Tier: "T1"}})
	return m, l
}

func TestMeterWholeAnswers(t *testing.T) {
	t.Run("the upstream's usage is recorded once, priced, to the ledger", func(t *testing.T) {
		m, l := newMeter(context.Background(), false)
		m.Body([]byte(`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":7}}`))
		m.Body([]byte(`{"usage":{"prompt_tokens":50,"completion_tokens":70}}`))
		u := m.Final()
		// 5·1 + 7·2 = 19 µUSD.
		if len(l.got) != 1 || u.PromptTokens != 5 || u.CompletionTokens != 7 || u.Estimated || u.CostUSD != 19e-6 ||
			u.Member != "anonymous" || u.DecisionID != "d" || u.Time.IsZero() || !m.Recorded() {
			t.Fatalf("recorded %+v (%d in the ledger)", u, len(l.got))
		}
	})
	t.Run("without usage Molly counts: the prompt estimate and the answer's text", func(t *testing.T) {
		m, _ := newMeter(context.Background(), false)
		// "hello world!" 3 tokens, the tool call's name and arguments "f{\"a\":1}" 2.
		m.Body([]byte(`{"choices":[{"message":{"content":"hello world!","tool_calls":[{"function":{"name":"f","arguments":"{\"a\":1}"}}]}}]}`))
		if u := m.Final(); u.PromptTokens != 8 || u.CompletionTokens != 3+2 || !u.Estimated || u.CostUSD != (8+10)/1e6 {
			t.Fatalf("recorded %+v", u)
		}
	})
	t.Run("a client that went away does not stop the record", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		m, l := newMeter(ctx, false)
		cancel()
		m.Abandoned()
		if u := m.Final(); len(l.got) != 1 || !l.live[0] || u.PromptTokens != 8 || u.CompletionTokens != 0 || !u.Estimated || u.CostUSD != 8e-6 {
			t.Fatalf("recorded %+v, live context %v", u, l.live)
		}
	})
	t.Run("an answer that reached a model is never free of tokens", func(t *testing.T) {
		l := &ledger{}
		m := New(context.Background(), Options{Ledger: l, Target: &route.Target{PriceIn: 1}})
		m.Body([]byte(`{"choices":[]}`))
		if u := m.Final(); u.PromptTokens != 1 || u.CompletionTokens != 0 || !u.Estimated || u.CostUSD != 1e-6 {
			t.Fatalf("recorded %+v", u)
		}
	})
	t.Run("a nil meter does nothing", func(t *testing.T) {
		var m *Meter
		m.Body([]byte(`{}`))
		m.StreamEnd()
		m.Abandoned()
		if m.Final() != nil || m.Recorded() || m.Reported() != nil {
			t.Fatal("a nil meter recorded")
		}
	})
}

func TestMeterStreams(t *testing.T) {
	chunk := func(content string) []byte {
		return []byte(`{"choices":[{"index":0,"delta":{"content":"` + content + `"}}]}`)
	}
	t.Run("usage chunks are merged, each count keeping its largest report", func(t *testing.T) {
		m, l := newMeter(context.Background(), false)
		for _, ev := range [][]byte{[]byte(`{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":5,"completion_tokens":0}}`),
			chunk("b"), []byte(`{"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":9}}`)} {
			if out, drop := m.Event(ev); drop || string(out) != string(ev) {
				t.Fatalf("Event changed %s to %s (drop %v) for a client that asked for usage", ev, out, drop)
			}
		}
		m.StreamEnd()
		m.StreamEnd()
		if u := m.Final(); len(l.got) != 1 || u.PromptTokens != 5 || u.CompletionTokens != 9 || u.Estimated {
			t.Fatalf("recorded %+v", u)
		}
	})
	t.Run("completion tokens alone: the prompt is estimated", func(t *testing.T) {
		m, _ := newMeter(context.Background(), false)
		m.Event([]byte(`{"choices":[],"usage":{"completion_tokens":4}}`))
		m.StreamEnd()
		if u := m.Final(); u.PromptTokens != 8 || u.CompletionTokens != 4 || !u.Estimated {
			t.Fatalf("recorded %+v", u)
		}
	})
	t.Run("no usage chunk: the streamed text is counted", func(t *testing.T) {
		m, _ := newMeter(context.Background(), false)
		m.Event(chunk("hello "))
		m.Event(chunk("world!"))
		m.StreamEnd()
		if u := m.Final(); u.PromptTokens != 8 || u.CompletionTokens != 3 || !u.Estimated {
			t.Fatalf("recorded %+v", u)
		}
	})
	t.Run("no usage chunk: each streamed piece of text is at least a token", func(t *testing.T) {
		// Forty Chinese characters, one a chunk as upstreams stream them:
		// the estimate of the text is well under forty tokens.
		m, _ := newMeter(context.Background(), false)
		text := strings.Repeat("请联系客服", 8)
		for _, r := range text {
			m.Event(chunk(string(r)))
		}
		m.Event([]byte(`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`)) // no text: no piece
		m.Abandoned()
		u := m.Final()
		if est := capability.EstimateTokens(text); est >= 40 || u.CompletionTokens != 40 || !u.Estimated {
			t.Fatalf("recorded %+v; the text's estimate is %d", u, est)
		}
	})
	t.Run("usage a client did not ask for is hidden from it", func(t *testing.T) {
		m, _ := newMeter(context.Background(), true)
		if out, drop := m.Event([]byte(`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}`)); !drop || out != nil {
			t.Fatalf("a usage-only chunk was kept: %s", out)
		}
		out, drop := m.Event([]byte(`{"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":5,"completion_tokens":3}}`))
		if drop || gjson.GetBytes(out, "usage").Exists() || gjson.GetBytes(out, "choices.0.delta.content").String() != "x" {
			t.Fatalf("chunk %s (drop %v), want its usage removed", out, drop)
		}
		// Strip hides without counting again (events held before the relay).
		if out, drop := m.Strip([]byte(`{"choices":[],"usage":{"prompt_tokens":99}}`)); !drop || out != nil {
			t.Fatalf("Strip kept %s", out)
		}
		m.StreamEnd()
		if u := m.Final(); u.PromptTokens != 5 || u.CompletionTokens != 3 {
			t.Fatalf("recorded %+v, want the Event reports only", u)
		}
	})
}

func TestReportedUsageAndAnswerText(t *testing.T) {
	for _, tc := range []struct {
		raw      string
		p, c     int
		reported bool
	}{
		{`{"prompt_tokens":5,"completion_tokens":2}`, 5, 2, true},
		{`{"prompt_tokens":0,"completion_tokens":0}`, 0, 0, false},
		{`null`, 0, 0, false},
		{``, 0, 0, false},
		{`{"prompt_tokens":7}`, 7, 0, true},
		{`{"prompt_tokens":7,"completion_tokens":null}`, 7, 0, true},
		// Not a report to bill by: the caller estimates instead.
		{`{"prompt_tokens":5,"completion_tokens":-1000000}`, 0, 0, false},
		{`{"prompt_tokens":-5,"completion_tokens":2}`, 0, 0, false},
		{`{"prompt_tokens":1e30,"completion_tokens":2}`, 0, 0, false},
		{`{"prompt_tokens":9223372036854775807,"completion_tokens":2}`, 0, 0, false},
		{`{"prompt_tokens":2147483648,"completion_tokens":2}`, 0, 0, false},
		{`{"prompt_tokens":2147483647,"completion_tokens":2}`, 2147483647, 2, true},
		{`{"prompt_tokens":1.5,"completion_tokens":2}`, 0, 0, false},
		{`{"prompt_tokens":"7","completion_tokens":2}`, 0, 0, false},
	} {
		if p, c, ok := ReportedUsage(gjson.Parse(tc.raw)); p != tc.p || c != tc.c || ok != tc.reported {
			t.Errorf("ReportedUsage(%s) = %d, %d, %v", tc.raw, p, c, ok)
		}
	}
	var b strings.Builder
	AnswerText(&b, gjson.Parse(`{"choices":[{"message":{"content":"a","refusal":"b"}},{"delta":{"content":"c","tool_calls":[{"function":{"name":"d","arguments":"e"}}]}},{"text":"f"}]}`))
	if b.String() != "abcdef" {
		t.Fatalf("AnswerText = %q", b.String())
	}
}

// TestMeterHoldsTheCompletionCap: with a CompletionCap, Over tells a stream
// that ran past it — more text deltas than the cap, a usage report over it,
// an estimate over twice the cap and 8 — and not one at it; a completion
// Molly counts is billed at most the cap, a reported one as reported.
func TestMeterHoldsTheCompletionCap(t *testing.T) {
	capped := func(limit int) (*Meter, *ledger) {
		l := &ledger{}
		return New(context.Background(), Options{Ledger: l, Target: &route.Target{Name: "t", PriceIn: 1, PriceOut: 2}, PromptEstimate: 8,
			CompletionCap: limit, Base: Usage{DecisionID: "d", Model: "m", Target: "t", Tier: "T1"}}), l
	}
	delta := func(text string) []byte {
		return []byte(`{"choices":[{"index":0,"delta":{"content":"` + text + `"}}]}`)
	}
	t.Run("a delta past the cap is over it", func(t *testing.T) {
		m, _ := capped(3)
		for i := range 4 {
			if m.Over() {
				t.Fatalf("over after %d deltas of a cap of 3", i)
			}
			m.Event(delta("a"))
		}
		if !m.Over() {
			t.Fatal("4 deltas are not over a cap of 3")
		}
		m.Cut()
		m.StreamEnd()
		if u := m.Final(); u.CompletionTokens != 3 || !u.Estimated {
			t.Fatalf("billed %+v, want the cap", u)
		}
	})
	t.Run("long tokens at the cap are not over it; their estimate is billed at the cap", func(t *testing.T) {
		m, _ := capped(4)
		for range 4 {
			m.Event(delta(" language")) // one token of 9 runes, over twice the rule's 4: an estimate of 9 for the 4
		}
		if m.Over() {
			t.Fatal("4 deltas estimated at 9 tokens are over a cap of 4 (the estimate's margin is 2·4+8)")
		}
		m.StreamEnd()
		if u := m.Final(); u.CompletionTokens != 4 || !u.Estimated {
			t.Fatalf("billed %+v, want the cap", u)
		}
	})
	t.Run("an estimate past the margin is over the cap", func(t *testing.T) {
		m, _ := capped(4)
		m.Event(delta(strings.Repeat("x", 4*(2*4+8)+1))) // one delta estimated at 17 tokens
		if !m.Over() {
			t.Fatal("an estimate of 17 tokens is not over a cap of 4")
		}
	})
	t.Run("a usage report past the cap is over it and billed as reported", func(t *testing.T) {
		m, _ := capped(4)
		m.Event([]byte(`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}`))
		if m.Over() {
			t.Fatal("a report at the cap is over it")
		}
		m.Event([]byte(`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}`))
		if !m.Over() {
			t.Fatal("a report of 5 is not over a cap of 4")
		}
		m.StreamEnd()
		if u := m.Final(); u.CompletionTokens != 5 || u.Estimated || u.CostUSD != (3+10)/1e6 {
			t.Fatalf("billed %+v, want the 5 reported", u)
		}
	})
	t.Run("a whole answer is billed at most the cap when counted, as reported otherwise", func(t *testing.T) {
		m, _ := capped(2)
		m.Body([]byte(`{"choices":[{"message":{"content":"` + strings.Repeat("word ", 100) + `"}}]}`))
		if u := m.Final(); u.CompletionTokens != 2 || !u.Estimated {
			t.Fatalf("billed %+v, want the cap of 2", u)
		}
		m, _ = capped(2)
		m.Body([]byte(`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":90}}`))
		if u := m.Final(); u.CompletionTokens != 90 || u.Estimated {
			t.Fatalf("billed %+v, want the 90 reported", u)
		}
	})
	t.Run("no cap, no limit", func(t *testing.T) {
		m, _ := capped(0)
		for range 1000 {
			m.Event(delta("word "))
		}
		m.StreamEnd()
		if u := m.Final(); m.Over() || u.CompletionTokens != 1250 {
			t.Fatalf("over %v, billed %+v", m.Over(), u)
		}
	})
}
