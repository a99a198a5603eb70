package pipeline

import (
	"time"

	"github.com/molly-gateway/molly/router/route"
)

// Outcome is what one request came to, recorded at one place once the
// pipeline is done with it: the decision, the plan, every attempt and the
// answer (or why there was none). Recorders (metrics beyond the built-in
// ones, the console, traces for the specialisation loop, tracing) read it;
// it carries no request or answer text.
type Outcome struct {
	DecisionID  string
	Revision    string // policy revision of the decision
	Member      string
	Endpoint    string // "chat.completions", ...
	Model       string // the client's model name
	Task        string
	Difficulty  float64
	Sensitivity string // the class the policy routed by
	Tiers       []string
	Stream      bool
	Plan        route.Plan
	Attempts    []Attempt
	// Answered is the index in Attempts of the answer delivered, -1 for none.
	Answered int
	// Label is how the request ended: routed, fallback, escalated, mixture,
	// upstream_error, truncated, output_blocked, client_closed, failed,
	// no_target, model_not_found, bad_request, denied.
	Label    string
	Status   int // HTTP status sent to the client (0 when none was)
	Redacted int // values replaced in what was sent, the answered attempt's
	// RedactedTypes are the entity types found in the request that the
	// decision redacted for the answered attempt's tier.
	RedactedTypes []string
	// Findings counts the entity types the classifier found (no values).
	Findings map[string]int
	// Reasons are the decision's reasons; Code its denial code ("" when allowed).
	Reasons  []string
	Code     string
	Start    time.Time
	Duration time.Duration
	// Text is the answered attempt's request and answer text, set only
	// for a request consented to trace capture (Pipeline.Capture); nil
	// otherwise. It prints as a placeholder (TraceText).
	Text *TraceText
}

// Attempt is one try of an Outcome.
type Attempt struct {
	Target           string
	Tier             string
	Model            string
	Adapter          string
	Failure          string // "" when it answered; else the failure kind (attempt.go)
	Error            string // what went wrong, for failures
	Status           int
	TTFB, Total      time.Duration
	PromptTokens     int
	CompletionTokens int
	CostUSD          float64
	// Score is the answer's mean token log-probability (or self-check
	// score), ScoreKind "logprob", "selfcheck" or "none".
	Score     float64
	ScoreKind string
	Delivered bool
}

// Recorder receives every Outcome. Record must not block the request: a
// slow recorder hands the value to its own goroutine.
type Recorder interface {
	Record(Outcome)
}

// attemptOf is the record of outcome o.
func attemptOf(o *outcome, delivered bool) Attempt {
	a := Attempt{Target: o.cand.Target.Name, Tier: o.cand.Target.Tier, Model: o.cand.Model, Adapter: o.cand.Adapter(),
		Failure: string(o.kind), Error: o.failure, Status: o.status, TTFB: o.ttfb, Total: o.total,
		Score: o.logprob, ScoreKind: o.scoreName(), Delivered: delivered}
	if u := o.usage(); u != nil {
		a.PromptTokens, a.CompletionTokens, a.CostUSD = u.PromptTokens, u.CompletionTokens, u.CostUSD
	}
	return a
}

// track adds o's record to the request's outcome.
func (rq *request) track(o *outcome, delivered bool) {
	rq.outcome.Attempts = append(rq.outcome.Attempts, attemptOf(o, delivered))
	if delivered {
		rq.outcome.Answered = len(rq.outcome.Attempts) - 1
		if o.disp != nil {
			rq.outcome.Redacted = o.disp.Redacted()
		}
		rq.outcome.RedactedTypes = nil
		for _, t := range rq.dec.Redact(o.cand.Target.Tier) {
			if rq.outcome.Findings[t] > 0 {
				rq.outcome.RedactedTypes = append(rq.outcome.RedactedTypes, t)
			}
		}
	}
}

// finish completes the outcome and hands it to every recorder.
func (p *Pipeline) finish(rq *request, label string, status int) {
	out := &rq.outcome
	if out.Label == "" {
		out.Label = label
	}
	if out.Status == 0 {
		out.Status = status
	}
	out.Plan = rq.plan
	out.Duration = time.Since(rq.begin)
	for _, r := range p.Recorders {
		r.Record(*out)
	}
}
