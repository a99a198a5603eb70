package meter

import (
	"context"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/router/capability"
	"github.com/molly-gateway/molly/router/route"
)

// Usage is what one answer consumed, as it is written to the caller's Ledger.
type Usage struct {
	Member     string
	DecisionID string
	Model      string // the client's model name
	Target     string // the target that answered
	Tier       string // its tier, "T0".."T3"
	// PromptTokens and CompletionTokens come from the upstream's "usage"
	// object (the answer's, or the usage chunks of a stream, merged); when
	// it gives none, Molly counts them (Estimated): the annotation's prompt
	// estimate and capability.EstimateTokens over the answer text. Never
	// both zero.
	PromptTokens     int
	CompletionTokens int
	Estimated        bool
	// CostUSD is PromptTokens × PriceIn + CompletionTokens × PriceOut of the
	// target, prices being USD per 1M tokens.
	CostUSD float64
	Time    time.Time
}

// Ledger is where usage is recorded (the registry, through the Caddy glue,
// which keeps the router free of storage code).
type Ledger interface {
	// Record stores u durably — it survives a crash of the process once
	// Record returns (the registry appends it to its usage journal and
	// commits it in the ledger a moment later) — and the pipeline
	// acknowledges the request (the body, or the stream's [DONE]) only
	// afterwards.
	Record(ctx context.Context, u Usage) error
}

// Reserver is optionally implemented by a Ledger that admits requests
// against the member's budget and token rate limit while they run: the
// pipeline calls Reserve once the plan is known, with the plan's worst case
// (route.Reservation: every answer the strategy may obtain at its full
// completion budget on the costliest candidates), and calls release once
// the request is over. A refusal is an *openai.Error (429
// insufficient_quota or rate_limit_exceeded) returned unwritten.
type Reserver interface {
	Reserve(ctx context.Context, tokens int, expectedUSD float64) (release func(), err error)
}

// Meter follows one answer and records its usage once.
type Meter struct {
	ctx    context.Context // the request's, without its cancellation: a client that went still used tokens
	ledger Ledger
	log    *zap.Logger
	base   Usage // member, decision, model, target, tier
	target *route.Target
	prompt int // the annotation's prompt estimate, for when the upstream reports none
	cap    int // completion tokens reserved and sent upstream as max_tokens; 0: none
	// metrics counts answers over cap (nil: none).
	metrics *Metrics

	// Streams only.
	strip    bool            // the client did not ask for usage: drop it from the stream
	reported *Usage          // merged from the upstream's usage chunks
	text     strings.Builder // streamed answer text, for the estimate
	pieces   int             // choice deltas with text: each is at least a token
	runes    int             // runes in text, kept as it grows (Over)
	cut      bool            // the relay ended the stream at the cap (Cut)
	recorded bool

	final *Usage
}

// Options are what a Meter needs besides the answer.
type Options struct {
	Ledger Ledger // nil: no ledger (Final is still set)
	Log    *zap.Logger
	// Base is the record's member, decision id, client model, target and tier.
	Base   Usage
	Target *route.Target
	// PromptEstimate is the annotation's prompt estimate.
	PromptEstimate int
	// StripUsage: a stream whose client did not ask for usage (Molly always
	// asks upstreams for it); its usage chunk is hidden from the client.
	StripUsage bool
	// CompletionCap is the completion tokens the request's reservation
	// holds for this answer (route.CompletionTokens: max_tokens, or
	// route.DefaultCompletionTokens, times the choices), which Molly also
	// sent upstream as its max_tokens; 0: no cap. A completion Molly
	// counts itself (no usage reported) is billed at most CompletionCap; a
	// reported one as reported, and over the cap it is logged and counted
	// (Metrics.OverCap). Over tells the relay when to end a stream.
	CompletionCap int
	// Metrics counts answers over CompletionCap; nil: none.
	Metrics *Metrics
}

// New returns the meter of one answer.
func New(ctx context.Context, o Options) *Meter {
	log := o.Log
	if log == nil {
		log = zap.NewNop()
	}
	if o.Base.Member == "" {
		o.Base.Member = "anonymous"
	}
	return &Meter{ctx: context.WithoutCancel(ctx), ledger: o.Ledger, log: log, base: o.Base,
		target: o.Target, prompt: o.PromptEstimate, strip: o.StripUsage, cap: max(o.CompletionCap, 0), metrics: o.Metrics}
}

// Final is the usage as recorded (reported or estimated, with its cost);
// nil until the answer is complete.
func (m *Meter) Final() *Usage {
	if m == nil {
		return nil
	}
	return m.final
}

// Recorded reports whether the usage was recorded.
func (m *Meter) Recorded() bool { return m != nil && m.recorded }

// Reported is the usage the upstream reported in a stream, nil when none.
func (m *Meter) Reported() *Usage {
	if m == nil {
		return nil
	}
	return m.reported
}

// MaxReportedTokens is the largest token count of one usage report that
// is believed (2^31 − 1, far above any context window times any n): a
// larger count, priced, would overflow the ledger's integer nano-USD.
const MaxReportedTokens = 1<<31 - 1

// ReportedUsage reads an OpenAI "usage" object; ok is false when absent or
// all zero, and when it is not a report to bill by: prompt_tokens or
// completion_tokens present but not a JSON integer from 0 to
// MaxReportedTokens (a negative count would credit the member's budget, a
// huge one overflow the ledger). The answer is then counted as one without
// usage is (the caller's estimate).
func ReportedUsage(u gjson.Result) (prompt, completion int, ok bool) {
	if !u.IsObject() {
		return 0, 0, false
	}
	var n [2]int
	for i, f := range [2]string{"prompt_tokens", "completion_tokens"} {
		v := u.Get(f)
		if !v.Exists() || v.Type == gjson.Null {
			continue
		}
		k, err := strconv.ParseInt(v.Raw, 10, 64)
		if v.Type != gjson.Number || err != nil || k < 0 || k > MaxReportedTokens {
			return 0, 0, false
		}
		n[i] = int(k)
	}
	return n[0], n[1], n[0] > 0 || n[1] > 0
}

// ChunkUsage is the usage object of one stream chunk: its "usage", or,
// when it has none, Groq's "x_groq.usage" (Groq reports a stream's usage
// there, on its last chunk, instead of in a usage chunk). The result does
// not exist when the chunk carries neither.
func ChunkUsage(root gjson.Result) gjson.Result {
	if u := root.Get("usage"); u.IsObject() {
		return u
	}
	return root.Get("x_groq.usage")
}

// AnswerText collects the text of an answer or of one stream chunk:
// message or delta content, refusal, tool call names and arguments,
// completion text.
func AnswerText(b *strings.Builder, v gjson.Result) {
	v.Get("choices").ForEach(func(_, ch gjson.Result) bool {
		choiceText(b, ch)
		return true
	})
}

// choiceText appends the text of one choice (see AnswerText).
func choiceText(b *strings.Builder, ch gjson.Result) {
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
}

// Body records the usage of a whole (non-streamed) 2xx answer before it is
// written to the client.
func (m *Meter) Body(body []byte) {
	if m == nil || m.recorded {
		return
	}
	m.BodyUsage(body, gjson.GetBytes(body, "usage"))
}

// BodyUsage is Body for a caller that has read the answer already: usage
// is body's "usage" member, as gjson.GetBytes(body, "usage") finds it (it
// does not exist when body has none); body is read again only when usage
// is no report to bill by (ReportedUsage), for Molly's count of its text.
func (m *Meter) BodyUsage(body []byte, usage gjson.Result) {
	if m == nil || m.recorded {
		return
	}
	u := m.base
	reported := false
	if p, c, ok := ReportedUsage(usage); ok {
		u.PromptTokens, u.CompletionTokens, reported = p, c, true
	} else {
		var b strings.Builder
		AnswerText(&b, gjson.ParseBytes(body))
		u.PromptTokens, u.CompletionTokens, u.Estimated = m.prompt, capability.EstimateTokens(b.String()), true
	}
	m.record(u, reported)
}

// Event looks at one SSE data payload of a stream (not [DONE]): it merges
// the usage when the chunk carries one (a provider may put prompt tokens on
// the first chunk and completion tokens on the last: each count keeps its
// largest report) and counts the text otherwise. When the client did not
// ask for usage, a usage-only chunk is dropped (drop) and a usage field on
// a chunk with choices is removed (out).
func (m *Meter) Event(data []byte) (out []byte, drop bool) {
	if m == nil || !gjson.ValidBytes(data) {
		return data, false
	}
	root := gjson.ParseBytes(data)
	before := m.text.Len()
	root.Get("choices").ForEach(func(_, ch gjson.Result) bool {
		choiceText(&m.text, ch)
		if m.text.Len() > before {
			m.pieces++
			m.runes += utf8.RuneCountInString(m.text.String()[before:])
		}
		before = m.text.Len()
		return true
	})
	if p, c, ok := ReportedUsage(ChunkUsage(root)); ok {
		if m.reported == nil {
			m.reported = &Usage{}
		}
		m.reported.PromptTokens = max(m.reported.PromptTokens, p)
		m.reported.CompletionTokens = max(m.reported.CompletionTokens, c)
	}
	return m.strip1(root, data)
}

// Strip is Event without counting: for events already counted (a stream
// held before it was relayed), it only hides the usage the client did not
// ask for.
func (m *Meter) Strip(data []byte) (out []byte, drop bool) {
	if m == nil || !m.strip || !gjson.ValidBytes(data) {
		return data, false
	}
	return m.strip1(gjson.ParseBytes(data), data)
}

func (m *Meter) strip1(root gjson.Result, data []byte) ([]byte, bool) {
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

// overMargin is the estimate of streamed text (capability.EstimateTokens)
// past which an answer capped at limit completion tokens has run over its
// cap: twice the cap and 8 tokens more, because the estimate is a rule of
// thumb (a token is about 4 characters) that an honest answer at its cap
// may pass by a fraction — long words, indentation — and must not be cut
// for.
func overMargin(limit int) int { return 2*limit + 8 }

// Over reports whether the stream followed so far has run past the
// completion cap (Options.CompletionCap; never without one), counted as
// the meter bills it: the upstream's reported completion tokens over the
// cap, more text deltas than the cap (each is at least one token), or an
// estimate of the text over overMargin. The relay then ends the stream
// (Cut) instead of relaying more.
func (m *Meter) Over() bool {
	if m == nil || m.cap <= 0 {
		return false
	}
	if m.reported != nil && m.reported.CompletionTokens > m.cap {
		return true
	}
	return m.pieces > m.cap || (m.runes+3)/4 > overMargin(m.cap)
}

// Cut notes that the relay ended the stream at the cap (Over): logged and
// counted (reason "cut"); StreamEnd bills it as any stream, its counted
// completion at most the cap.
func (m *Meter) Cut() {
	if m == nil || m.cut {
		return
	}
	m.cut = true
	m.log.Warn("the upstream ran past the max_tokens it was sent: the stream was ended at the reserved cap",
		zap.String("target", m.base.Target), zap.String("decision_id", m.base.DecisionID), zap.Int("cap", m.cap), zap.Int("text_deltas", m.pieces))
	m.metrics.OverCap(m.base.Target, "cut")
}

// StreamEnd records a stream's usage: the upstream's usage chunks when
// there were any, else a count over the streamed text (the estimate of the
// text, or the number of choice deltas that carried text if that is
// more). Called before [DONE] is written, and again (a no-op) when the
// relay returns however it ends.
func (m *Meter) StreamEnd() {
	if m == nil || m.recorded {
		return
	}
	u := m.base
	reported := m.reported != nil
	if reported {
		u.PromptTokens, u.CompletionTokens = m.reported.PromptTokens, m.reported.CompletionTokens
		if u.PromptTokens == 0 { // completion tokens only: the prompt is ours to estimate
			u.PromptTokens, u.Estimated = m.prompt, true
		}
	} else {
		// Every piece of text an upstream streams is at least a token (most
		// stream one a chunk), which the estimate of the text falls short
		// of for Chinese, emoji or code.
		u.PromptTokens, u.CompletionTokens, u.Estimated = m.prompt, max(capability.EstimateTokens(m.text.String()), m.pieces), true
	}
	m.record(u, reported)
}

// Abandoned records the usage of a request that reached the upstream but
// whose client went away before the answer: what a stream had reported or
// streamed so far when it had, else the prompt estimate with no completion
// tokens (unknown), Estimated; priced like any other, so never free on a
// target with a price_in.
func (m *Meter) Abandoned() {
	if m == nil || m.recorded {
		return
	}
	if m.reported != nil || m.text.Len() > 0 {
		m.StreamEnd()
		return
	}
	u := m.base
	u.PromptTokens, u.Estimated = m.prompt, true
	m.record(u, false)
}

// record writes u, whose completion tokens the upstream reported when
// reported, else Molly counted: a counted completion over the cap is
// billed at the cap (the upstream was asked for no more, and the count is
// an estimate; a stream running clearly past it was cut), a reported one
// as reported — it is what the upstream bills — and logged and counted.
func (m *Meter) record(u Usage, reported bool) {
	m.recorded = true
	if m.cap > 0 && u.CompletionTokens > m.cap {
		switch {
		case reported:
			m.log.Warn("the upstream reports more completion tokens than the max_tokens it was sent: billed as reported, past the reservation",
				zap.String("target", u.Target), zap.String("decision_id", u.DecisionID), zap.Int("cap", m.cap), zap.Int("completion_tokens", u.CompletionTokens))
			m.metrics.OverCap(u.Target, "reported")
		default:
			if !m.cut && u.CompletionTokens > overMargin(m.cap) {
				m.log.Warn("the upstream's answer is well over the max_tokens it was sent and reports no usage: billed at the cap",
					zap.String("target", u.Target), zap.String("decision_id", u.DecisionID), zap.Int("cap", m.cap), zap.Int("estimated_tokens", u.CompletionTokens))
				m.metrics.OverCap(u.Target, "estimated")
			}
			u.CompletionTokens = m.cap
		}
	}
	if u.PromptTokens <= 0 && u.CompletionTokens <= 0 {
		u.PromptTokens, u.Estimated = 1, true // a request that reached a model is never free of tokens
	}
	u.CostUSD = m.target.Cost(u.PromptTokens, u.CompletionTokens)
	u.Time = time.Now()
	m.final = &u
	if m.ledger == nil {
		return
	}
	if err := m.ledger.Record(m.ctx, u); err != nil {
		m.log.Error("recording usage failed", zap.String("member", u.Member), zap.String("decision_id", u.DecisionID), zap.Error(err))
	}
}
