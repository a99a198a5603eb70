package router

import (
	"context"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"go.uber.org/zap"
)

// Usage is what one answered request consumed, as the forwarder hands it
// to the identity's Ledger.
type Usage struct {
	Member     string
	DecisionID string
	Model      string // the client's model name
	Target     string // the target that answered
	Tier       string // its tier, "T0".."T3"
	// PromptTokens and CompletionTokens come from the upstream's "usage"
	// object (the answer's, or the usage chunk of a stream); when it gives
	// none, Molly counts them (Estimated): the annotation's prompt estimate
	// and EstimateTokens over the answer text. Never both zero.
	PromptTokens     int
	CompletionTokens int
	Estimated        bool
	// CostUSD is PromptTokens × PriceIn + CompletionTokens × PriceOut of the
	// target, prices being USD per 1M tokens.
	CostUSD float64
	Time    time.Time
}

// Cost returns the USD cost of the tokens at t's prices (USD per 1M tokens).
func (t *Target) Cost(prompt, completion int) float64 {
	return (float64(prompt)*t.PriceIn + float64(completion)*t.PriceOut) / 1e6
}

// usageMeter follows one answer to a request and records its usage once.
type usageMeter struct {
	ctx    context.Context // the request's, without its cancellation: a client that went still used tokens
	ledger Ledger
	sink   func(Usage) // Forwarder.UsageSink
	log    *zap.Logger
	base   Usage // member, decision, model, target, tier
	target *Target
	prompt int // the annotation's prompt estimate, for when the upstream reports none

	// Streams only.
	strip    bool            // the client did not ask for usage: drop it from the stream
	reported *Usage          // from the upstream's usage chunk
	text     strings.Builder // streamed answer text, for the estimate
	recorded bool

	// final is the usage as recorded (reported or estimated, with its
	// cost), also without a ledger; nil until the answer is complete.
	final *Usage
}

// newUsageMeter returns the meter of one answer from t. Every usage it
// records goes to f.UsageSink when set (member "anonymous" without an
// identity). Without an identity carrying a Ledger it writes no ledger
// (final is still set), but still strips from streams the usage the
// client did not ask for (NewDispatch always asks for it).
func (f *Forwarder) newUsageMeter(ctx context.Context, log *zap.Logger, a *Annotation, decisionID string, t *Target) *usageMeter {
	m := &usageMeter{ctx: context.WithoutCancel(ctx), log: log, target: t, prompt: a.PromptTokens,
		base:  Usage{DecisionID: decisionID, Model: a.Model, Target: t.Name, Tier: t.Tier},
		strip: a.Stream && !a.IncludeUsage,
	}
	if id := IdentityFrom(ctx); id != nil {
		m.ledger, m.base.Member = id.Ledger, id.Member
	}
	if f != nil {
		m.sink = f.UsageSink
	}
	return m
}

// reportedUsage reads an OpenAI "usage" object; ok is false when absent or all zero.
func reportedUsage(u gjson.Result) (prompt, completion int, ok bool) {
	if !u.IsObject() {
		return 0, 0, false
	}
	prompt, completion = int(u.Get("prompt_tokens").Int()), int(u.Get("completion_tokens").Int())
	return prompt, completion, prompt > 0 || completion > 0
}

// answerText collects the text of an answer or of one stream chunk:
// message or delta content, completion text, tool call arguments.
func answerText(b *strings.Builder, v gjson.Result) {
	v.Get("choices").ForEach(func(_, ch gjson.Result) bool {
		for _, m := range []string{"message", "delta"} {
			b.WriteString(ch.Get(m + ".content").String())
			b.WriteString(ch.Get(m + ".refusal").String())
			ch.Get(m + ".tool_calls").ForEach(func(_, tc gjson.Result) bool {
				b.WriteString(tc.Get("function.name").String())
				b.WriteString(tc.Get("function.arguments").String())
				return true
			})
		}
		b.WriteString(ch.Get("text").String())
		return true
	})
}

// body records the usage of a whole (non-streamed) 2xx answer before it is
// written to the client.
func (m *usageMeter) body(body []byte) {
	if m == nil {
		return
	}
	root := gjson.ParseBytes(body)
	u := m.base
	if p, c, ok := reportedUsage(root.Get("usage")); ok {
		u.PromptTokens, u.CompletionTokens = p, c
	} else {
		var b strings.Builder
		answerText(&b, root)
		u.PromptTokens, u.CompletionTokens, u.Estimated = m.prompt, EstimateTokens(b.String()), true
	}
	m.record(u)
}

// event looks at one SSE data payload of a stream (not [DONE]): it takes the
// usage when the chunk carries one and counts the text otherwise. When the
// client did not ask for usage, a usage-only chunk is dropped (drop) and a
// usage field on a chunk with choices is removed (out).
func (m *usageMeter) event(data []byte) (out []byte, drop bool) {
	if m == nil || !gjson.ValidBytes(data) {
		return data, false
	}
	root := gjson.ParseBytes(data)
	answerText(&m.text, root)
	if p, c, ok := reportedUsage(root.Get("usage")); ok {
		m.reported = &Usage{PromptTokens: p, CompletionTokens: c}
	}
	if !m.strip || !root.Get("usage").Exists() {
		return data, false
	}
	if n := root.Get("choices.#"); n.Int() == 0 {
		return nil, true
	}
	out, err := sjson.DeleteBytes(data, "usage")
	if err != nil {
		return data, false
	}
	return out, false
}

// streamEnd records a stream's usage: the upstream's usage chunk when there
// was one, else a count over the streamed text. Called before [DONE] is
// written, and again (a no-op) when the relay returns however it ends.
func (m *usageMeter) streamEnd() {
	if m == nil || m.recorded {
		return
	}
	u := m.base
	if m.reported != nil {
		u.PromptTokens, u.CompletionTokens = m.reported.PromptTokens, m.reported.CompletionTokens
	} else {
		u.PromptTokens, u.CompletionTokens, u.Estimated = m.prompt, EstimateTokens(m.text.String()), true
	}
	m.record(u)
}

func (m *usageMeter) record(u Usage) {
	m.recorded = true
	if u.PromptTokens <= 0 && u.CompletionTokens <= 0 {
		u.PromptTokens, u.Estimated = 1, true // a request that reached a model is never free of tokens
	}
	u.CostUSD = m.target.Cost(u.PromptTokens, u.CompletionTokens)
	u.Time = time.Now()
	m.final = &u
	if m.sink != nil {
		s := u
		if s.Member == "" {
			s.Member = "anonymous"
		}
		m.sink(s)
	}
	if m.ledger == nil {
		return
	}
	if err := m.ledger.Record(m.ctx, u); err != nil {
		m.log.Error("recording usage failed", zap.String("member", u.Member), zap.String("decision_id", u.DecisionID), zap.Error(err))
	}
}

// abandoned records the usage of a request that reached the upstream but
// whose client went away before the answer: the prompt estimate, no
// completion tokens (unknown), Estimated; priced like any other, so never
// free on a target with a price_in.
func (m *usageMeter) abandoned() {
	if m == nil || m.recorded {
		return
	}
	u := m.base
	u.PromptTokens, u.Estimated = m.prompt, true
	m.record(u)
}
