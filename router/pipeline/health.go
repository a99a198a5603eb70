package pipeline

import (
	"github.com/molly-gateway/molly/router/egress"
	"github.com/molly-gateway/molly/router/health"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// failEjected: the target's circuit opened between the plan and the
// attempt (or its half-open probe is taken); nothing was sent, so the
// strategy falls back at once.
const failEjected failure = "ejected"

// attempt is one attempt under the target's circuit (p.Health): an open
// circuit refuses it before anything is sent, and the outcome feeds the
// target's outlier detection.
func (p *Pipeline) attempt(rq *request, c route.Candidate, disp *egress.Dispatch, prompt, hold int) outcome {
	disp = bounded(rq, disp)
	if p.Health == nil {
		return p.upstream(rq, c, disp, prompt, hold)
	}
	at, ok, why := p.Health.Begin(c.Target.Name)
	if !ok {
		return outcome{cand: c, disp: disp, kind: failEjected, failure: why}
	}
	o := p.upstream(rq, c, disp, prompt, hold)
	at.End(healthResult(o.kind), string(o.kind))
	return o
}

// bounded caps the completion of a request that set no max_tokens at
// route.DefaultCompletionTokens, what its admission reserved, when the
// caller has a budget or a TPM to keep: otherwise an upstream could answer
// at any length and spend past the reservation.
func bounded(rq *request, disp *egress.Dispatch) *egress.Dispatch {
	if rq.id == nil || !(rq.id.Budgeted || rq.id.TPM > 0) || rq.a.MaxTokens() > 0 || disp.Added("max_tokens") ||
		(rq.a.Endpoint() != openai.EndpointChat && rq.a.Endpoint() != openai.EndpointCompletions) {
		return disp
	}
	if capped, err := disp.WithMaxTokens(route.DefaultCompletionTokens); err == nil {
		return capped
	}
	return disp
}

// completionCap is the completion tokens disp asks the upstream for at
// most and rq's reservation holds for its answer
// (route.CompletionTokens): set when the client's request sets max_tokens
// or max_completion_tokens, or bounded added it; 0 (no cap) otherwise.
func completionCap(rq *request, disp *egress.Dispatch) int {
	if rq.a.MaxTokens() > 0 || disp.Added("max_tokens") {
		return route.CompletionTokens(rq.a)
	}
	return 0
}

// healthResult is how outlier detection counts an attempt's failure kind:
// 5xx, a refused API key (401) and failures of local origin are failures; a client that went away,
// a refused dispatch, a 429 (capacity) and an oversized answer say nothing
// about the target's health.
func healthResult(k failure) health.Result {
	switch k {
	case failNone:
		return health.Success
	case failConnect, failTimeout, failServer, failRead, failBadAnswer, failEmptyStream, failUpstreamAuth:
		return health.Failure
	}
	return health.Neutral
}
